"""Callback hooks and the built-in callbacks, with the real Trainer where it matters."""

import csv
import math
import re

import brainstate
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.callbacks import (BackupAndRestore, Callback, CallbackList, CSVLogger, EarlyStopping, LambdaCallback,
                                  LearningRateScheduler, ModelCheckpoint, ReduceLROnPlateau, TerminateOnNaN)
from etrace_fit.datasets import rate_discrimination
from etrace_fit.errors import ConfigError

C, H, T = 4, 8, 12


@pytest.fixture(autouse=True)
def dt():
    with brainstate.environ.context(dt=1.0):
        yield


def _trainer(**kwargs):
    rng = np.random.default_rng(0)
    model = ef.Sequential(L.Linear(C, H, w_init=rng.normal(0, 1.5, (C, H)).astype(np.float32)), L.LIF(H),
                          L.LeakyRateReadout(H, 2, w_init=rng.normal(0, 0.3, (H, 2)).astype(np.float32)))
    return ef.Trainer(model, optimizer=optax.adam(1e-2), **kwargs)


def _data(n=24):
    return rate_discrimination(n, seq_len=T, num_channels=C, low_rate=0.05, high_rate=0.4, seed=0)


class Recorder(Callback):
    def __init__(self):
        self.calls = []

    def __getattribute__(self, name):
        if name.startswith("on_"):
            calls = object.__getattribute__(self, "calls")
            return lambda *args, **kwargs: calls.append((name, args[0] if args and not isinstance(args[0], dict) else None))
        return object.__getattribute__(self, name)


def test_a_user_subclass_sees_the_hooks_in_order():
    x, y = _data(24)
    recorder = Recorder()
    trainer = _trainer()
    trainer.fit(x[:16], y[:16], batch_size=8, epochs=2, validation_data=(x[16:], y[16:]), callbacks=[recorder],
                verbose=0)
    epoch = [("on_epoch_begin", 0), ("on_train_batch_begin", 0), ("on_train_batch_end", 0),
             ("on_train_batch_begin", 1), ("on_train_batch_end", 1), ("on_test_begin", None),
             ("on_test_batch_begin", 0), ("on_test_batch_end", 0), ("on_test_end", None), ("on_epoch_end", 0)]
    second = [(name, 1 if arg == 0 and name.startswith("on_epoch") else arg) for name, arg in epoch]
    assert recorder.calls == [("on_train_begin", None), *epoch, *second, ("on_train_end", None)]
    recorder.calls.clear()
    trainer.predict(x[:8], batch_size=8, callbacks=[recorder])
    assert [c[0] for c in recorder.calls] == ["on_predict_begin", "on_predict_batch_begin", "on_predict_batch_end",
                                              "on_predict_end"]


class FakeTrainer:
    def __init__(self):
        self.stop_training = False
        self.weights = 0

    def get_weights(self):
        return self.weights

    def set_weights(self, weights):
        self.weights = weights


def _watch(stopper, values):
    """Run ``stopper`` over epochs logging ``values`` as val_loss, on a fake trainer whose
    weights "after" epoch e are e; the epoch it stopped at (or the last)."""
    fake = FakeTrainer()
    stopper.set_model(fake)
    stopper.on_train_begin()
    for epoch, value in enumerate(values):
        fake.weights = epoch
        stopper.on_epoch_end(epoch, {"val_loss": value})
        if fake.stop_training:
            break
    return epoch


def test_early_stopping_stops_after_patience_and_restores_the_best_weights():
    stopper = EarlyStopping("val_loss", patience=2, restore_best_weights=True)
    epoch = _watch(stopper, [3.0, 2.0, 2.5, 2.6, 2.7])
    assert epoch == 3 and stopper.stopped_epoch == 3 and stopper.best_epoch == 1
    stopper.on_train_end()
    assert stopper.model.weights == 1


def test_early_stopping_never_stops_after_the_first_epoch_as_keras():
    """A NaN at epoch 0 (no improvement) with patience 1 stopped the run there; Keras
    waits for an epoch > 0."""
    stopper = EarlyStopping("val_loss", patience=1)
    assert _watch(stopper, [float("nan"), 2.0, 2.5]) == 2 and stopper.stopped_epoch == 2


def test_early_stopping_with_a_baseline_never_beaten_keeps_the_best_epochs_weights():
    """Keras 3: the best epoch is tracked (and restored) whether or not it beats the
    baseline; only the wait's restart needs that. The best started at the baseline
    here, so nothing was ever kept and the run ended on its last epoch's weights."""
    stopper = EarlyStopping("val_loss", patience=2, baseline=1.0, restore_best_weights=True)
    epoch = _watch(stopper, [3.0, 2.0, 2.5, 2.6, 2.7])
    # epoch 0 and 1 improve without beating 1.0 (wait 1, 2; an improving epoch never stops), epoch 2 does not
    assert epoch == 2 and stopper.best == 2.0 and stopper.best_epoch == 1
    stopper.on_train_end()
    assert stopper.model.weights == 1
    beaten = EarlyStopping("val_loss", patience=1, baseline=2.5)
    epoch = _watch(beaten, [3.0, 2.0, 2.2, 2.1])
    assert epoch == 2 and beaten.best_epoch == 1  # 2.0 beat the baseline: the wait started again there


def test_mode_auto_refuses_a_key_whose_direction_its_name_does_not_tell(tmp_path):
    """A metric of the user's (an F1) was taken as 'min' by mode='auto': save_best_only
    kept the worst epochs, silently. As in Keras 3 it is now an error before training,
    naming the fix; the names that tell their direction keep working."""
    from etrace_fit.callbacks import ModelCheckpoint, ReduceLROnPlateau

    x, y = _data(16)

    def f1(output, target):
        return (output.argmax(-1) == target).astype(output.dtype)

    make = [lambda: EarlyStopping("val_f1"), lambda: ReduceLROnPlateau("f1"),
            lambda: ModelCheckpoint(str(tmp_path / "m"), monitor="val_f1", save_best_only=True)]
    for callback in make:
        trainer = _trainer(metrics=[f1])
        with pytest.raises(ConfigError, match=r"cannot tell whether '(val_)?f1' should go up or down .* pass "
                                              r"mode='max'"):
            trainer.fit(x, y, batch_size=8, epochs=1, validation_split=0.25, callbacks=[callback()], verbose=0)
        assert trainer.history.epoch == []  # before the first epoch
    assert EarlyStopping("val_f1", mode="max").mode == "max"
    assert [EarlyStopping(k).mode for k in ("val_loss", "mse", "val_mae", "val_acc", "auc")] == \
        ["min", "min", "min", "max", "max"]
    _trainer(metrics=[f1]).fit(x, y, batch_size=8, epochs=1, verbose=0,  # no comparison: no mode needed
                               callbacks=[ModelCheckpoint(str(tmp_path / "m-{f1:.2f}"), monitor="f1")])


def test_batch_logs_are_the_epochs_running_means_as_in_keras():
    """Keras' batch logs are running means (the last batch's equal the epoch's); ours
    held each batch's own value. Checked against the batches' own values (``raw``),
    weighted by their sizes (the last batch of 20 in batches of 8 holds 4)."""
    x, y = _data(20)
    seen, tested = [], []
    record = LambdaCallback(on_train_batch_end=lambda batch, logs: seen.append((dict(logs), {
        k: float(v) for k, v in logs.raw.items()})))
    trainer = _trainer()
    history = trainer.fit(x, y, batch_size=8, epochs=1, shuffle=False, callbacks=[record], verbose=0)
    sizes = np.array([8, 8, 4])
    for key in ("loss", "accuracy"):
        own = np.array([raw[key] for _, raw in seen])
        running = np.cumsum(sizes * own) / np.cumsum(sizes)
        np.testing.assert_allclose([logs[key] for logs, _ in seen], running, rtol=1e-6)
        assert seen[-1][0][key] == pytest.approx(history.history[key][0], rel=1e-6)
    assert not np.allclose([raw["loss"] for _, raw in seen], [logs["loss"] for logs, _ in seen])
    record_test = LambdaCallback(on_test_batch_end=lambda batch, logs: tested.append(dict(logs)))
    result = trainer.evaluate(x, y, batch_size=8, callbacks=[record_test], verbose=0)
    assert tested[-1] == pytest.approx(result, rel=1e-6) and len(tested) == 3


def test_on_train_end_gets_the_last_epochs_logs():
    """Keras: on_train_end receives the last epoch's logs; with validation_freq=2 the
    third epoch did not validate, but it got epoch 2's val_loss as the final one."""
    x, y = _data(24)
    seen = {}
    keep = LambdaCallback(on_epoch_end=lambda epoch, logs: seen.setdefault("epoch", dict(logs)),
                          on_train_end=lambda logs: seen.update(end=logs))
    seen_epochs = LambdaCallback(on_epoch_end=lambda epoch, logs: seen.update(epoch=dict(logs)))
    _trainer().fit(x[:16], y[:16], batch_size=8, epochs=3, validation_data=(x[16:], y[16:]), validation_freq=2,
                   callbacks=[keep, seen_epochs], verbose=0)
    assert seen["end"] == seen["epoch"] and not any(k.startswith("val_") for k in seen["end"]), seen


def test_early_stopping_mode_min_delta_and_missing_monitor():
    stopper = EarlyStopping("val_accuracy", min_delta=0.05, patience=0)
    assert stopper.mode == "max"
    fake = FakeTrainer()
    stopper.set_model(fake)
    stopper.on_epoch_end(0, {"val_accuracy": 0.5})
    stopper.on_epoch_end(1, {"val_accuracy": 0.52})  # within min_delta: no improvement
    assert fake.stop_training
    missing = EarlyStopping("val_loss", patience=0)
    missing.set_model(FakeTrainer())
    with pytest.warns(RuntimeWarning, match="'val_loss' is not in the logs of epoch 1 \\(loss\\)"):
        missing.on_epoch_end(0, {"loss": 1.0})  # Keras: warned and skipped, not counted as a bad epoch
    assert missing.wait == 0 and not missing.model.stop_training
    with pytest.raises(ConfigError, match="mode"):
        EarlyStopping(mode="up")


def test_early_stopping_with_the_trainer_restores_the_best_epochs_weights():
    x, y = _data(16)
    trainer = _trainer()
    snapshots = []
    keep = LambdaCallback(on_epoch_end=lambda epoch, logs: snapshots.append((logs["loss"], trainer.get_weights())))
    # An impossible min_delta: no epoch after the first counts as better.
    stopper = EarlyStopping("loss", min_delta=1e9, patience=1, restore_best_weights=True)
    history = trainer.fit(x, y, batch_size=8, epochs=6, callbacks=[keep, stopper], verbose=0)
    assert len(history.history["loss"]) == 2  # stopped after one epoch without improvement
    best = snapshots[0][1]
    for path, value in trainer.get_weights().items():
        for a, b in zip(np.asarray(value["weight"] if isinstance(value, dict) else value).ravel(),
                        np.asarray(best[path]["weight"] if isinstance(value, dict) else best[path]).ravel()):
            assert a == b


def test_csv_logger_writes_one_row_per_epoch_with_the_logged_keys(tmp_path):
    x, y = _data(16)
    path = tmp_path / "log.csv"
    history = _trainer().fit(x, y, batch_size=8, epochs=3, validation_split=0.25, callbacks=[CSVLogger(path)],
                             verbose=0)
    rows = list(csv.DictReader(path.open()))
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2]
    assert set(rows[0]) == {"epoch", "loss", "accuracy", "val_loss", "val_accuracy"}
    np.testing.assert_allclose([float(r["loss"]) for r in rows], history.history["loss"], rtol=1e-6)


def test_terminate_on_nan_stops_training():
    fake = FakeTrainer()
    callback = TerminateOnNaN()
    callback.set_model(fake)
    callback.on_train_batch_end(0, {"loss": 1.0})
    assert not fake.stop_training
    callback.on_train_batch_end(1, {"loss": math.nan})
    assert fake.stop_training


def test_lambda_callback_rejects_unknown_hooks_and_callback_list_round_trips_state():
    with pytest.raises(ValueError, match="on_epoch_finish"):
        LambdaCallback(on_epoch_finish=print)
    stopper = EarlyStopping(patience=3)
    stopper.best, stopper.wait = 0.25, 2
    state = CallbackList([LambdaCallback(), stopper]).state_dict()
    fresh = EarlyStopping(patience=3)
    CallbackList([LambdaCallback(), fresh]).load_state_dict(state)
    assert (fresh.best, fresh.wait) == (0.25, 2)
    with pytest.raises(ConfigError, match=r"callbacks\[0\] must be an etrace_fit.callbacks.Callback instance"):
        CallbackList([print])


def test_learning_rate_scheduler_changes_the_rate_optax_uses_and_logs_it():
    import jax

    from etrace_fit.callbacks import LearningRateScheduler

    x, y = _data(16)
    rng = np.random.default_rng(0)
    model = ef.Sequential(L.Linear(C, H, w_init=rng.normal(0, 1.5, (C, H)).astype(np.float32)), L.LIF(H),
                          L.LeakyRateReadout(H, 2, w_init=rng.normal(0, 0.3, (H, 2)).astype(np.float32)))
    trainer = ef.Trainer(model, optimizer=optax.inject_hyperparams(optax.sgd)(learning_rate=0.1))
    snapshots = []
    keep = LambdaCallback(on_epoch_end=lambda epoch, logs: snapshots.append(trainer.get_weights()))
    rates = {0: 0.1, 1: 0.0, 2: 0.05}
    history = trainer.fit(x, y, batch_size=8, epochs=3, verbose=0,
                          callbacks=[LearningRateScheduler(lambda epoch, lr: rates[epoch]), keep])
    assert history.history["learning_rate"] == pytest.approx([0.1, 0.0, 0.05])
    same = jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), snapshots[0], snapshots[1])
    changed = jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), snapshots[1], snapshots[2])
    assert all(jax.tree.leaves(same))  # learning rate 0: optax really used it
    assert not all(jax.tree.leaves(changed))


def test_reduce_lr_on_plateau_lowers_the_rate_after_patience():
    from etrace_fit.callbacks import ReduceLROnPlateau

    class Fake(FakeTrainer):
        learning_rate = 1.0

    fake = Fake()
    callback = ReduceLROnPlateau("val_loss", factor=0.5, patience=2, min_lr=0.3)
    callback.set_model(fake)
    for epoch, value in enumerate([1.0, 1.0, 1.0, 1.0, 1.0, 1.0]):
        callback.on_epoch_end(epoch, {"val_loss": value})
    assert fake.learning_rate == 0.3  # 1.0 -> 0.5 -> 0.3 (floor)
    with pytest.raises(ConfigError, match="factor"):
        ReduceLROnPlateau(factor=1.5)


def test_reduce_lr_on_plateau_at_its_floor_says_nothing_of_a_float32_rate(capsys):
    """The rate read back as float32 (0.10000000149) stayed above min_lr=0.1 and was
    "reduced" to itself, with a message, at every later plateau (Keras compares at float32)."""
    from etrace_fit.callbacks import ReduceLROnPlateau

    class Fake(FakeTrainer):
        learning_rate = float(np.float32(0.1))

    fake = Fake()
    callback = ReduceLROnPlateau("val_loss", factor=0.5, patience=1, min_lr=0.1, verbose=1)
    callback.set_model(fake)
    for epoch in range(4):
        callback.on_epoch_end(epoch, {"val_loss": 1.0})
    assert "reducing" not in capsys.readouterr().out and fake.learning_rate == float(np.float32(0.1))


def test_changing_the_rate_of_a_plain_optimizer_is_a_config_error():
    x, y = _data(8)
    trainer = _trainer()
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert trainer.learning_rate is None
    with pytest.raises(ConfigError, match="inject_hyperparams"):
        trainer.learning_rate = 0.1


def test_progress_bar_shows_loss_and_throughput_while_running():
    import io

    x, y = _data(16)
    out = io.StringIO()
    _trainer().fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[ef.callbacks.ProgressBar(file=out, bar=True, ncols=300)])
    text = out.getvalue()
    assert "Epoch 1/1:" in text and "1/2" in text
    for key in ("loss=", "accuracy=", "seq/s=", "steps/s="):
        assert key in text


def test_the_epoch_line_shows_every_metric_uncut_with_validation(capsys):
    """The default bar (verbose="auto") ends each epoch with one line holding every
    logged value, validation included, however many there are (it used to be cut at
    the terminal's width before the validation metrics)."""
    x, y = _data(16)
    trainer = _trainer(metrics=["accuracy", "acc", "sparse_categorical_accuracy"])
    trainer.fit(x, y, batch_size=8, epochs=2, validation_data=(x[:8], y[:8]))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("Epoch ")]
    assert len(lines) == 2  # not a terminal: no bar, one line per epoch
    for key in ("loss", "accuracy", "acc", "sparse_categorical_accuracy", "val_loss", "val_accuracy", "val_acc",
                "val_sparse_categorical_accuracy"):
        assert f" - {key}: " in lines[-1]
    assert lines[-1].startswith("Epoch 2/2 - ")
    assert len(lines[-1]) > 120  # longer than any terminal it was cut to


def test_verbose_two_prints_one_keras_line_per_epoch_and_bad_verbose_fails_first(capsys):
    x, y = _data(8)
    trainer = _trainer()
    trainer.fit(x, y, batch_size=8, epochs=2, verbose=2)
    captured = capsys.readouterr()
    assert [line.split(" - ")[0] for line in captured.out.splitlines()] == ["Epoch 1/2", "Epoch 2/2"]
    assert "Epoch" not in captured.err
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert "Epoch" not in capsys.readouterr().err
    for bad in (3, "yes", "1", None):  # True and False are Keras' 1 and 0
        with pytest.raises(ConfigError, match=r"verbose must be 'auto', 0 .*, got"):
            trainer.fit(x, y, epochs=1, verbose=bad)


def test_keras_older_batch_hook_names_are_called():
    """A Keras callback overriding on_batch_begin / on_batch_end (Keras' Callback calls
    them from on_train_batch_*) was never called, silently; tf.keras' LambdaCallback
    names them too."""
    class Counting(Callback):
        def __init__(self):
            self.seen = []

        def on_batch_begin(self, batch, logs=None):
            self.seen.append(("begin", batch))

        def on_batch_end(self, batch, logs=None):
            self.seen.append(("end", batch, round(float(logs["loss"]), 6) > 0))

    x, y = _data(16)
    counting, lambdas = Counting(), []
    lambda_callback = LambdaCallback(on_batch_end=lambda batch, logs: lambdas.append(batch))
    _trainer().fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[counting, lambda_callback])
    assert counting.seen == [("begin", 0), ("end", 0, True), ("begin", 1), ("end", 1, True)]
    assert lambdas == [0, 1]
    with pytest.raises(ValueError, match="on_batch_end and on_train_batch_end are one hook"):
        LambdaCallback(on_batch_end=print, on_train_batch_end=print)


def test_a_one_argument_schedule_and_early_stoppings_warm_up():
    """Keras takes LearningRateScheduler(lambda epoch: ...) and EarlyStopping(start_from_epoch=);
    the first failed at the first epoch, the second was a TypeError."""
    from etrace_fit.callbacks import LearningRateScheduler

    x, y = _data(16)
    trainer = ef.Trainer(_trainer().model, optimizer="adam")
    history = trainer.fit(x, y, batch_size=8, epochs=3, verbose=0,
                          callbacks=[LearningRateScheduler(lambda epoch: 0.01 * 0.5 ** epoch)])
    assert history.history["learning_rate"] == pytest.approx([0.01, 0.005, 0.0025])
    # min_delta so large that nothing improves after the first watched epoch: it stops patience epochs later
    for start, stopped in ((0, 1), (2, 3)):
        stopping = EarlyStopping("loss", min_delta=100.0, patience=1, start_from_epoch=start)
        assert _trainer().fit(x, y, batch_size=8, epochs=6, verbose=0, callbacks=[stopping]).epoch == list(
            range(stopped + 1))
        assert stopping.best_epoch == start
    with pytest.raises(ConfigError, match=r"start_from_epoch must be an int >= 0, got -1"):
        EarlyStopping(start_from_epoch=-1)
    with pytest.raises(ConfigError, match="schedule must be a function"):
        LearningRateScheduler(0.01)


def test_verbose_two_with_a_progress_bar_in_the_callbacks_prints_each_epoch_once(capsys):
    """As Keras, fit adds no progress logger of its own when the callbacks hold one: each
    epoch's line came twice, once from fit (verbose=2) and once from the ProgressBar."""
    from etrace_fit.callbacks import ProgressBar

    x, y = _data(8)
    _trainer().fit(x, y, batch_size=8, epochs=2, verbose=2, callbacks=[ProgressBar()])
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if line.startswith("Epoch ")]
    assert [line.split(" - ")[0] for line in lines] == ["Epoch 1/2", "Epoch 2/2"]


@pytest.mark.parametrize("make, match", [
    (lambda: EarlyStopping("loss", patience="2"), r"EarlyStopping: patience must be an int >= 0, got '2' \(str\)"),
    (lambda: EarlyStopping("loss", patience=1.5), r"EarlyStopping: patience must be an int >= 0, got 1.5"),
    (lambda: EarlyStopping("loss", patience=True), r"EarlyStopping: patience must be an int >= 0, got True"),
    (lambda: EarlyStopping("loss", patience=-1), r"EarlyStopping: patience must be an int >= 0, got -1"),
    (lambda: EarlyStopping("loss", min_delta="0.1"), r"EarlyStopping: min_delta must be a number, got '0.1' \(str\)"),
    (lambda: EarlyStopping("loss", baseline="0.5"),
     r"EarlyStopping: baseline must be a number or None, got '0.5' \(str\)"),
    (lambda: EarlyStopping("loss", start_from_epoch="1"), r"EarlyStopping: start_from_epoch must be an int >= 0"),
    (lambda: EarlyStopping("loss", restore_best_weights="False"),
     r"EarlyStopping: restore_best_weights must be True or False, got 'False'"),
    (lambda: ReduceLROnPlateau("loss", patience="1"), r"ReduceLROnPlateau: patience must be an int >= 0, got '1'"),
    (lambda: ReduceLROnPlateau("loss", cooldown="x"), r"ReduceLROnPlateau: cooldown must be an int >= 0, got 'x'"),
    (lambda: ReduceLROnPlateau("loss", min_lr="0.0"), r"ReduceLROnPlateau: min_lr must be a number >= 0, got '0.0'"),
    (lambda: ReduceLROnPlateau("loss", min_lr=-1e-3), r"ReduceLROnPlateau: min_lr must be a number >= 0, got -0.001"),
    (lambda: ReduceLROnPlateau("loss", factor=1.0), r"ReduceLROnPlateau: factor must be a number in \(0, 1\), got 1.0"),
    (lambda: ReduceLROnPlateau("loss", factor="0.5"), r"ReduceLROnPlateau: factor must be a number in \(0, 1\)"),
    (lambda: ReduceLROnPlateau("loss", min_delta=None), r"ReduceLROnPlateau: min_delta must be a number, got None"),
    (lambda: ModelCheckpoint("a.ckpt", "loss", initial_value_threshold="0.3"),
     r"ModelCheckpoint: initial_value_threshold must be a number or None, got '0.3'"),
    (lambda: CSVLogger("log.csv", append="yes"), r"CSVLogger: append must be True or False, got 'yes'"),
    (lambda: CSVLogger("log.csv", separator=";;"), r"CSVLogger: separator must be one character, got ';;'"),
    (lambda: LearningRateScheduler(lambda epoch: 0.1, verbose="1"),
     r"LearningRateScheduler: verbose must be 0 or 1, got '1'"),
    (lambda: BackupAndRestore("backup", delete_on_finish="no"),
     r"BackupAndRestore: delete_on_finish must be True or False, got 'no'"),
], ids=["es-patience-str", "es-patience-float", "es-patience-bool", "es-patience-negative", "es-min_delta",
        "es-baseline", "es-start_from_epoch", "es-restore", "rlrop-patience", "rlrop-cooldown", "rlrop-min_lr",
        "rlrop-min_lr-negative", "rlrop-factor-1", "rlrop-factor-str", "rlrop-min_delta", "checkpoint-threshold",
        "csv-append", "csv-separator", "scheduler-verbose", "backup-delete"])
def test_callback_arguments_of_the_wrong_type_fail_in_the_constructor_naming_them(make, match):
    """Each was taken and failed with Python's TypeError ("'>' not supported between
    instances of 'int' and 'str'") epochs into training, at the first comparison."""
    with pytest.raises(ConfigError, match=match):
        make()


def test_callback_numbers_of_numpy_types_are_taken():
    stop = EarlyStopping("loss", min_delta=np.float32(0.1), patience=np.int64(2), baseline=np.float64(0.5))
    assert (stop.patience, stop.baseline) == (2, 0.5) and isinstance(stop.patience, int)
    plateau = ReduceLROnPlateau("loss", factor=np.float32(0.5), patience=np.int32(1), min_lr=0)
    assert (plateau.factor, plateau.patience, plateau.min_lr) == (0.5, 1, 0.0)


def test_csv_logger_appending_other_keys_rewrites_the_file_with_every_column(tmp_path):
    """Appended under the first fit's header, the second fit's rows (with val_* keys) had
    more fields than the header: a malformed file."""
    x, y = _data(16)
    path = tmp_path / "log.csv"
    trainer = _trainer()
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[CSVLogger(path)])
    with pytest.warns(UserWarning, match=rf"CSVLogger: {re.escape(repr(str(path)))} has no column for val_accuracy, "
                                         r"val_loss, which this run logs; the file is rewritten with them added \(its "
                                         r"1 earlier rows left empty there\)"):
        trainer.fit(x, y, batch_size=8, epochs=3, initial_epoch=1, verbose=0, validation_data=(x, y),
                    callbacks=[CSVLogger(path, append=True)])
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["epoch", "accuracy", "loss", "val_accuracy", "val_loss"]
    assert [len(row) for row in rows] == [5] * 4  # every row as wide as the header, no row lost
    assert [row[0] for row in rows[1:]] == ["0", "1", "2"]
    assert rows[1][3:] == ["", ""] and all(float(value) > 0 for row in rows[2:] for value in row[3:])
    assert not [p for p in tmp_path.iterdir() if p.name != "log.csv"]  # no temporary file left
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[CSVLogger(path, append=True)])  # fewer keys
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[-1][3:] == ["NA", "NA"] and [len(row) for row in rows] == [5] * 5  # Keras' NA, under the header

"""Monitored keys, logs and backups as Keras users expect them: a key the fit will never log
is an error before training, epochs without validation are skipped, the History records
what callbacks add, EarlyStopping's best weights survive a resume, and a finished run's
backups go."""

from __future__ import annotations

import csv
import os

import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit.callbacks import (BackupAndRestore, Callback, CSVLogger, EarlyStopping, LambdaCallback,
                                  LearningRateScheduler, ModelCheckpoint, ReduceLROnPlateau)
from etrace_fit.errors import ConfigError

from .test_callbacks import _data, _trainer, dt  # noqa: F401  (dt: the autouse fixture)


class Batches(Callback):
    """Counts the training batches that ran (and says it adds no log keys)."""

    adds_log_keys = False

    def __init__(self):
        self.count = 0

    def on_train_batch_end(self, batch, logs=None):
        self.count += 1


class Score(Callback):
    """Adds ``score`` (a made-up value, best at epoch 0 under mode="min") to each epoch's logs."""

    def on_epoch_end(self, epoch, logs=None):
        logs["score"] = float(epoch + 1)


@pytest.mark.parametrize("callback", [
    EarlyStopping(), ReduceLROnPlateau(), ModelCheckpoint("{tmp}/best.ckpt", save_best_only=True),
    ModelCheckpoint("{tmp}/{epoch}-{val_loss:.2f}.ckpt")], ids=["early", "plateau", "best", "template"])
def test_a_validation_key_without_validation_data_fails_before_training(callback, tmp_path):
    if isinstance(callback, ModelCheckpoint):
        callback.filepath = callback.filepath.replace("{tmp}", str(tmp_path))
    x, y = _data(16)
    batches = Batches()
    with pytest.raises(ConfigError, match="'val_loss' is a validation value, but this fit has no validation data; "
                                          "pass validation_data= or validation_split=, or monitor 'loss'"):
        _trainer().fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[batches, callback])
    assert batches.count == 0


def test_a_misspelt_monitor_fails_before_training_unless_a_callback_may_log_it():
    x, y = _data(16)
    batches = Batches()
    trainer = ef.Trainer(_trainer().model, optimizer="adam", metrics=["accuracy"])
    with pytest.raises(ConfigError, match=r"monitor 'val_acc' is not among the keys this fit logs \(loss, accuracy, "
                                          r"learning_rate, val_loss, val_accuracy\)"):
        trainer.fit(x, y, batch_size=8, epochs=2, verbose=0, validation_split=0.25,
                    callbacks=[batches, EarlyStopping("val_acc"), CSVLogger(os.devnull)])
    assert batches.count == 0
    # A user's callback may add the key: then it is looked for at each epoch's end.
    stopper = EarlyStopping("score", mode="min", patience=1)
    history = _trainer().fit(x, y, batch_size=8, epochs=5, verbose=0, callbacks=[Score(), stopper])
    assert history.history["score"] == [1.0, 2.0] and stopper.best_epoch == 0 and stopper.stopped_epoch == 1
    with pytest.warns(RuntimeWarning, match="monitor 'scor' is not in the logs of epoch 1"):
        history = _trainer().fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[Score(), EarlyStopping("scor")])
    assert len(history.epoch) == 2


def test_epochs_without_validation_are_skipped_by_the_monitors(tmp_path):
    """``validation_freq=2``: ``val_*`` exist on epochs 2 and 4 only; the monitors count
    those alone, and a checkpoint named by a validation value is written on them."""
    x, y = _data(24)
    seen = []
    stopper = EarlyStopping("val_loss", min_delta=1e9, patience=1)  # no later epoch can improve
    plateau = ReduceLROnPlateau("val_loss", factor=0.5, min_delta=1e9, patience=1)
    best = ModelCheckpoint(str(tmp_path / "best" / "{epoch}.ckpt"), save_best_only=True)
    named = ModelCheckpoint(str(tmp_path / "named" / "{epoch}-{val_loss:.3f}.ckpt"))
    watch = LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append((epoch, stopper.wait, plateau.wait)))
    trainer = ef.Trainer(_trainer().model, optimizer="adam")
    history = trainer.fit(x, y, batch_size=8, epochs=6, verbose=0, validation_split=0.25, validation_freq=2,
                          callbacks=[stopper, plateau, best, named, watch])
    assert history.epoch == [0, 1, 2, 3]  # epoch 4 validated without improving: stop
    assert stopper.best_epoch == 1 and stopper.stopped_epoch == 3
    assert [wait for _, wait, _ in seen] == [0, 0, 0, 1]
    assert trainer.learning_rate == pytest.approx(0.0005)  # halved once, after epoch 4
    improved = history.history["val_loss"][1] < history.history["val_loss"][0]
    assert sorted(os.listdir(tmp_path / "best")) == ["2.ckpt"] + ["4.ckpt"] * improved  # validated epochs only
    assert [name.split("-")[0] for name in sorted(os.listdir(tmp_path / "named"))] == ["2", "4"]


def test_a_best_epoch_without_the_validation_value_its_name_needs_is_not_taken_for_the_best(tmp_path):
    """``monitor="loss"`` with ``{val_loss}`` in the name and ``validation_freq=2``: an
    epoch that did not validate cannot be written, so it is not the best either (it was
    taken for the best, never written, and every later epoch compared against it)."""
    x, y = _data(24)
    trainer = ef.Trainer(_trainer().model, optimizer=optax.sgd(-0.5))  # gradient ascent: epoch 1 is the best
    best = ModelCheckpoint(str(tmp_path / "{epoch}-{val_loss:.3f}.ckpt"), monitor="loss", save_best_only=True)
    history = trainer.fit(x, y, batch_size=8, epochs=4, verbose=0, validation_split=0.25, validation_freq=2,
                          callbacks=[best])
    losses = history.history["loss"]
    assert losses == sorted(losses) and losses[0] < losses[1]  # every epoch worse than the one before
    assert [name.split("-")[0] for name in os.listdir(tmp_path)] == ["2"] and best.best == losses[1]


def test_a_folder_path_fails_before_training_even_when_the_folder_does_not_exist_yet(tmp_path):
    x, y = _data(16)
    batches = Batches()
    with pytest.raises(ConfigError, match=r"ModelCheckpoint: filepath '.*ckpt/' is a folder; give a file path in it"):
        _trainer().fit(x, y, batch_size=8, epochs=2, verbose=0,
                       callbacks=[batches, ModelCheckpoint(str(tmp_path / "ckpt") + "/")])
    assert batches.count == 0


@pytest.mark.parametrize("make", [lambda: ReduceLROnPlateau("loss"),
                                  lambda: LearningRateScheduler(lambda epoch, rate: rate * 0.5)],
                         ids=["plateau", "scheduler"])
def test_learning_rate_callbacks_need_a_settable_rate_before_training(make):
    x, y = _data(16)
    batches = Batches()
    with pytest.raises(ConfigError, match="build the optimizer with optax.inject_hyperparams"):
        ef.Trainer(_trainer().model, optimizer=optax.adam(1e-3)).fit(x, y, batch_size=8, epochs=2, verbose=0,
                                                                      callbacks=[batches, make()])
    assert batches.count == 0
    for optimizer in ("adam", optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)):
        ef.Trainer(_trainer().model, optimizer=optimizer).fit(x, y, batch_size=8, epochs=1, verbose=0,
                                                               callbacks=[make()])


def test_the_history_records_the_keys_callbacks_add_and_csv_has_every_validation_column(tmp_path):
    x, y = _data(24)
    path = tmp_path / "log.csv"
    history = _trainer().fit(x, y, batch_size=8, epochs=2, verbose=0, validation_split=0.25, validation_freq=2,
                             callbacks=[CSVLogger(str(path)), Score()])
    assert history.history["score"] == [1.0, 2.0]  # added after CSVLogger ran: recorded all the same
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert {"val_loss", "val_accuracy"} <= set(rows[0])  # the first epoch did not validate
    assert rows[0]["val_loss"] == "NA" and float(rows[1]["val_loss"]) == pytest.approx(history.history["val_loss"][0])


def test_the_history_records_a_value_a_callback_sets_anew_as_keras_history_does(tmp_path):
    """History kept the step's loss when a callback replaced it (later callbacks and the
    CSV saw the new one): Keras' History runs last and records the logs as left."""
    x, y = _data(16)
    path = tmp_path / "log.csv"

    def rescale(epoch, logs):
        logs["loss"] = 123.0 + epoch

    history = _trainer().fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[
        LambdaCallback(on_epoch_end=rescale), CSVLogger(str(path)), Score()])
    assert history.history["loss"] == [123.0, 124.0] and history.history["score"] == [1.0, 2.0]
    with open(path, newline="") as handle:
        assert [float(row["loss"]) for row in csv.DictReader(handle)] == [123.0, 124.0]


def test_early_stopping_best_weights_survive_a_resume(tmp_path):
    """An interrupted run resumed by BackupAndRestore restores the same best epoch's
    weights as a run that was never interrupted (they are kept in the backups)."""
    x, y = _data(16)

    class Interrupt(Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2:
                raise KeyboardInterrupt

    def run(folder, *extra):
        trainer = _trainer()
        callbacks = [Score(), EarlyStopping("score", mode="min", patience=10, restore_best_weights=True),
                     BackupAndRestore(str(folder)), *extra]
        trainer.fit(x, y, batch_size=8, epochs=4, verbose=0, shuffle=False, callbacks=callbacks)
        return trainer

    whole = run(tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "cut", Interrupt())
    resumed = run(tmp_path / "cut")
    assert resumed.history.history == whole.history.history
    for path, value in whole.get_weights().items():
        for key in value:
            np.testing.assert_array_equal(np.asarray(resumed.get_weights()[path][key]), np.asarray(value[key]))


def test_backups_go_after_early_stopping(tmp_path):
    """EarlyStopping ends a run: its backups go (a non-finite loss keeps them:
    test_reliability's TerminateOnNaN case)."""
    x, y = _data(16)
    folder = tmp_path / "backup"
    history = _trainer().fit(x, y, batch_size=8, epochs=6, verbose=0, callbacks=[
        EarlyStopping("loss", min_delta=1e9, patience=1), BackupAndRestore(str(folder))])
    assert len(history.epoch) == 2 and not os.listdir(folder)  # stopped early, and finished: nothing to resume
    again = _trainer().fit(x, y, batch_size=8, epochs=6, verbose=0, callbacks=[
        EarlyStopping("loss", min_delta=1e9, patience=1), BackupAndRestore(str(folder))])
    assert again.epoch == [0, 1]  # a new run, not the old one continued


def test_a_batchs_logs_take_the_dict_idioms_of_keras_callbacks():
    """``logs.copy()``, ``logs[key] = value`` and ``json.dumps(dict(logs))`` failed after
    the first batch had trained (a read-only mapping)."""
    import json

    x, y = _data(16)
    seen = []

    class Keep(Callback):
        def on_train_batch_end(self, batch, logs=None):
            logs["batch_index"] = float(batch)  # a later callback sees it
            copied = logs.copy()
            seen.append((type(copied), json.loads(json.dumps(dict(logs)))))

    class Later(Callback):
        def on_train_batch_end(self, batch, logs=None):
            assert logs["batch_index"] == batch
            del logs["batch_index"]
            assert "batch_index" not in logs and "loss" in logs

    _trainer().fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[Keep(), Later()])
    assert [kind for kind, _ in seen] == [dict, dict]
    assert [logs["batch_index"] for _, logs in seen] == [0.0, 1.0]
    assert all(isinstance(logs["loss"], float) for _, logs in seen)


def test_a_regularised_layers_rate_can_be_monitored():
    """``rate_<path>`` is logged once the model is compiled: not refused before training."""
    from etrace_fit.training import FiringRateRegularizer

    x, y = _data(16)
    stopper = EarlyStopping("rate_layers.1", mode="min", patience=5)
    trainer = ef.Trainer(_trainer().model, regularizers=[FiringRateRegularizer(target=0.1, strength=1.0)])
    history = trainer.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[stopper])
    assert stopper.best == min(history.history["rate_layers.1"])


def test_a_resumed_run_keeps_the_rows_an_earlier_fit_appended(tmp_path):
    """CSVLogger(append=True) + BackupAndRestore: the resume dropped every row whose epoch
    was at or after the resumed one, an earlier fit's rows too (8 rows became 6)."""
    x, y = _data(16)
    log = str(tmp_path / "log.csv")
    _trainer().fit(x, y, batch_size=8, epochs=4, verbose=0, callbacks=[CSVLogger(log)])

    class Crash(Callback):
        armed = True

        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2 and Crash.armed:
                Crash.armed = False
                raise KeyboardInterrupt

    def callbacks():
        return [CSVLogger(log, append=True), BackupAndRestore(str(tmp_path / "backup")), Crash()]

    with pytest.raises(KeyboardInterrupt):
        _trainer().fit(x, y, batch_size=8, epochs=4, verbose=0, callbacks=callbacks())
    _trainer().fit(x, y, batch_size=8, epochs=4, verbose=0, callbacks=callbacks())
    with open(log, newline="") as handle:
        assert [int(row["epoch"]) for row in csv.DictReader(handle)] == [0, 1, 2, 3, 0, 1, 2, 3]

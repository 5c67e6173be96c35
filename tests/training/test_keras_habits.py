"""Keras habits work, or fail in the constructor / before training with an error that
names the argument, what is allowed and what came (issue 12, "Why" items 2, 4, 5, 6).

Every gradient-carrying check compares two runs of our own Trainer that must be equal
by the algebra of the loss (a weight of 2 on every sample = a learning rate twice as
large under SGD), so no reference implementation is needed.
"""

import io
import warnings

import jax
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.callbacks import Callback, CSVLogger, TensorBoard
from etrace_fit.datasets import rate_discrimination
from etrace_fit.errors import ConfigError, ShapeError

C, H, T = 4, 8, 12


def _data(n=16, seed=0):
    return rate_discrimination(n, seq_len=T, num_channels=C, low_rate=0.05, high_rate=0.3, seed=seed)


def _model(readout=None):
    rng = np.random.default_rng(0)
    readout = readout or L.LeakyRateReadout(H, 2, w_init=rng.normal(0, 0.3, (H, 2)).astype(np.float32))
    return ef.Sequential(L.Linear(C, H, w_init=rng.normal(0, 1.5, (C, H)).astype(np.float32)), L.LIF(H), readout)


def _weights(trainer):
    return jax.tree.map(np.asarray, trainer.get_weights())


def _assert_trees_close(a, b, **kwargs):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(x, y, **kwargs)


# ------------------------------------------------------------------ names as strings
@pytest.mark.parametrize("name, rate", [("adam", 1e-3), ("Adam", 1e-3), ("sgd", 1e-2), ("rmsprop", 1e-3),
                                        ("adamw", 1e-3)])
def test_optimizer_by_keras_name_has_keras_default_rate_and_a_settable_learning_rate(name, rate):
    x, y = _data(8)
    trainer = ef.Trainer(_model(), optimizer=name, loss="sparse_categorical_crossentropy", metrics=["acc"])
    history = trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert set(history.history) == {"loss", "acc", "learning_rate"}
    assert trainer.learning_rate == pytest.approx(rate)
    trainer.learning_rate = 0.5 * rate
    assert trainer.learning_rate == pytest.approx(0.5 * rate)


def test_an_optimizer_name_is_saved_and_reloaded_by_name(tmp_path):
    x, y = _data(8)
    trainer = ef.Trainer(_model(), optimizer="sgd")
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    trainer.save(tmp_path / "run.ckpt")
    again = ef.Trainer.load(tmp_path / "run.ckpt", _model())
    assert again.config["optimizer"] == "sgd" and again.learning_rate == pytest.approx(1e-2)


@pytest.mark.parametrize("kwargs, message", [
    (dict(optimizer="adamm"), r"optimizer: unknown name 'adamm'; valid names: adam, .*sgd"),
    (dict(optimizer=3), r"optimizer must be a Keras name .* or an optax GradientTransformation, got int"),
    (dict(loss="hinge"), r"loss: unknown 'hinge'; valid names: cross_entropy"),
    (dict(metrics="accuracy"), r"metrics must be a list .* got the string 'accuracy'; write metrics=\['accuracy'\]"),
    (dict(metrics=["f1"]), r"metrics: unknown 'f1'"),
    (dict(grad_clip="1.0"), r"grad_clip must be a positive number or None, got '1.0'"),  # was a TypeError of '>'
    (dict(seed="0"), r"seed must be an int >= 0, got '0'"),  # was a TypeError at fit
])
def test_bad_names_fail_in_the_constructor_naming_the_argument(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ef.Trainer(_model(), **kwargs)


def test_a_model_that_is_not_a_module_is_named_in_the_constructor():
    with pytest.raises(ConfigError, match="model must be a brainstate module .* got function"):
        ef.Trainer(lambda x: x)  # was an AttributeError: 'function' object has no attribute 'states'


def test_tensorboard_update_freq_takes_keras_values_and_rejects_others_in_the_constructor(tmp_path):
    assert TensorBoard(str(tmp_path), update_freq="epoch").update_freq == 0
    assert TensorBoard(str(tmp_path), update_freq="batch").update_freq == 1
    assert TensorBoard(str(tmp_path), update_freq=5).update_freq == 5
    for bad in ("step", -1, 1.5):
        with pytest.raises(ConfigError, match=r"TensorBoard: update_freq must be 'epoch', 'batch' or an int >= 0"):
            TensorBoard(str(tmp_path), update_freq=bad)
    with pytest.raises(ConfigError, match="TensorBoard: histogram_freq must be an int >= 0"):
        TensorBoard(str(tmp_path), histogram_freq="epoch")


# ------------------------------------------------------------------ callbacks, History
def test_callbacks_see_the_trainer_as_self_model_and_the_fit_params():
    seen = {}

    class Probe(Callback):
        def on_train_begin(self, logs=None):
            seen["model"], seen["params"] = self.model, dict(self.params)

    x, y = _data(16)
    trainer = ef.Trainer(_model())
    trainer.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[Probe()])
    assert seen["model"] is trainer
    assert seen["params"] == {"verbose": 0, "epochs": 2, "steps": 2}
    probe = Probe()
    probe.set_model(trainer)
    with pytest.warns(DeprecationWarning, match="Callback.trainer is deprecated .* use self.model"):
        assert probe.trainer is trainer
    with pytest.warns(DeprecationWarning, match="set_trainer is deprecated"):
        probe.set_trainer(trainer)


def test_every_fit_returns_a_new_history_with_its_params():
    x, y = _data(16)
    trainer = ef.Trainer(_model())
    first = trainer.fit(x, y, batch_size=8, epochs=2, verbose=0)
    second = trainer.fit(x, y, batch_size=8, epochs=2, verbose=0, validation_data=(x, y))
    assert first is not second and trainer.history is second
    assert first.epoch == [0, 1] and second.epoch == [0, 1]  # was [0, 1, 0, 1]
    assert len(second.history["loss"]) == len(second.history["val_loss"]) == 2
    assert second.params == {"verbose": 0, "epochs": 2, "steps": 2} and second.model is trainer


def test_initial_epoch_continues_a_run_and_validation_freq_picks_the_epochs():
    x, y = _data(16)
    trainer = ef.Trainer(_model())
    history = trainer.fit(x, y, batch_size=8, epochs=5, initial_epoch=2, validation_data=(x, y),
                          validation_freq=2, verbose=0)
    assert history.epoch == [2, 3, 4]
    assert len(history.history["loss"]) == 3 and len(history.history["val_loss"]) == 1  # epoch 4 (1-based)
    history = trainer.fit(x, y, batch_size=8, epochs=3, validation_data=(x, y), validation_freq=[1, 3], verbose=0)
    assert len(history.history["val_loss"]) == 2
    for bad in (0, "often", 1.5):
        with pytest.raises(ConfigError, match="validation_freq must be an int >= 1 or a list of 1-based epochs"):
            trainer.fit(x, y, epochs=1, validation_data=(x, y), validation_freq=bad, verbose=0)
    with pytest.raises(ConfigError, match="initial_epoch must be an int >= 0"):
        trainer.fit(x, y, epochs=1, initial_epoch=-1, verbose=0)


# ------------------------------------------------------------------ weights on the loss
def _one_sgd_step(**fit_kwargs):
    x, y = _data(8)
    trainer = ef.Trainer(_model(), optimizer=optax.sgd(fit_kwargs.pop("lr", 0.5)), algo="bptt")
    history = trainer.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, **fit_kwargs)
    return _weights(trainer), history.history


def test_sample_weight_scales_the_loss_and_gradient_but_not_the_metrics():
    plain, plain_logs = _one_sgd_step()
    doubled, doubled_logs = _one_sgd_step(sample_weight=np.full(8, 2.0))
    faster, _ = _one_sgd_step(lr=1.0)
    _assert_trees_close(doubled, faster, rtol=1e-5, atol=1e-7)
    assert doubled_logs["loss"][0] == pytest.approx(2 * plain_logs["loss"][0], rel=1e-5)
    assert doubled_logs["accuracy"] == plain_logs["accuracy"]
    frozen, logs = _one_sgd_step(sample_weight=np.zeros(8))
    _assert_trees_close(frozen, _weights(ef.Trainer(_model())), atol=0)
    assert logs["loss"][0] == 0.0
    per_step = np.zeros((8, T))
    per_step[:, -1] = 2.0  # (N, T): loss_on="last" would read the last step's alone, so it is refused
    with pytest.raises(ConfigError, match=r"sample_weight has shape \(8, 12\), a weight per sequence and step, but "
                                          r"loss_on='last' ignores all but the last step's"):
        _one_sgd_step(sample_weight=per_step)
    with pytest.raises(ShapeError, match=r"sample_weight has 3 entries for 8 samples"):
        _one_sgd_step(sample_weight=np.ones(3))


def test_class_weight_scales_each_samples_loss_by_its_label():
    x, y = _data(8)
    weights = np.where(y == 0, 3.0, 1.0)
    by_class, _ = _one_sgd_step(class_weight={0: 3.0})
    by_sample, _ = _one_sgd_step(sample_weight=weights)
    _assert_trees_close(by_class, by_sample, rtol=1e-6, atol=1e-8)
    with pytest.raises(ConfigError, match=r"class_weight keys must be class indices"):
        _one_sgd_step(class_weight={"cat": 2.0})
    with pytest.raises(ConfigError, match=r"class_weight must be a non-empty dict"):
        _one_sgd_step(class_weight=[1.0, 2.0])


def test_shuffle_batch_shuffles_whole_batches_and_bad_values_fail():
    from etrace_fit.training.data import batches

    x = np.arange(10)[:, None, None].astype(np.float32) * np.ones((1, 2, 1), np.float32)
    got = [b.x[:, 0, 0].astype(int).tolist() for b in batches(x, batch_size=4, shuffle="batch", seed=3)]
    assert sorted(map(tuple, got)) == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9)]
    assert any([b.x[:, 0, 0].astype(int).tolist() for b in batches(x, batch_size=4, shuffle="batch", seed=s)]
               != [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] for s in range(5))
    xd, yd = _data(8)
    with pytest.raises(ConfigError, match=r"shuffle must be True, False or 'batch'"):
        ef.Trainer(_model()).fit(xd, yd, epochs=1, shuffle="sometimes", verbose=0)


# ------------------------------------------------------------------ layouts, shapes
def test_time_major_arrays_train_like_batch_major_ones_and_a_mixup_is_named():
    x, y = _data(16)
    batch_major = ef.Trainer(_model(), optimizer="sgd", algo="bptt")
    batch_major.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    time_major = ef.Trainer(_model(), optimizer="sgd", algo="bptt", time_major=True)
    time_major.fit(np.swapaxes(x, 0, 1), y, batch_size=8, epochs=1, shuffle=False, verbose=0,
                   validation_data=(np.swapaxes(x, 0, 1), y))
    _assert_trees_close(_weights(batch_major), _weights(time_major), rtol=1e-6, atol=1e-8)
    assert time_major.predict(np.swapaxes(x, 0, 1)).shape == (16, 2)
    assert time_major.evaluate(np.swapaxes(x, 0, 1), y).keys() == {"loss", "accuracy"}
    with pytest.raises(ShapeError, match=r"time_major=True reads x of shape \(16, 12, 4\) as \(time=16, batch=12.*"
                                         r"x looks batch-major: pass time_major=False"):
        time_major.fit(x, y, epochs=1, verbose=0)


def test_record_spikes_of_a_batch_says_to_pass_one_sequence():
    x, y = _data(8)
    trainer = ef.Trainer(_model())
    assert trainer.record_spikes(x[0])["layers.1"].shape == (T, H)
    with pytest.raises(ShapeError, match=r"record_spikes: x must be one sequence \(time, features\), got shape "
                                         r"\(2, 12, 4\); this looks like a batch of sequences: pass one, e.g. x\[0\]"):
        trainer.record_spikes(x[:2])


def test_csv_logger_creates_its_folder(tmp_path):
    x, y = _data(8)
    path = tmp_path / "runs" / "deep" / "log.csv"
    ef.Trainer(_model()).fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[CSVLogger(path)])
    assert path.read_text().count("\n") == 3


def test_summary_lists_layers_params_hidden_states_rules_and_trace_memory():
    x, y = _data(8)
    trainer = ef.Trainer(_model(), algo="d_rtrl")
    before = trainer.summary(print_fn=None)
    assert "layers.1 (LIF)" in before and "V (8,)" in before and "(at first batch)" in before
    out = io.StringIO()
    assert trainer.summary(x, print_fn=lambda s: out.write(s)) is None  # Keras: printed, not returned too
    text = out.getvalue()
    assert trainer.summary(print_fn=None) == text
    assert "layers.0 (Linear)" in text and "weight: d_rtrl" in text and "layers.2 (LeakyRateReadout)" in text
    assert f"Total params: {C * H + H + H * 2 + 2:,}" in text
    assert "Trace memory:" in text and "per sample" in text
    assert "Every weight gets its exact (BPTT) gradient" in text  # the readout's memory is followed
    spiking = ef.Trainer(_model(L.LeakySpikeReadout(H, 2)), algo="d_rtrl").summary(x, print_fn=None)
    assert "Approximate online gradients: layers.0.weight" in spiking  # a spiking readout's memory is not followed
    learned = ef.Trainer(_model(L.LeakyRateReadout(H, 2, learn_tau=True)), algo="d_rtrl").summary(x, print_fn=None)
    assert "Every weight gets its exact (BPTT) gradient" in learned  # one memory state per readout unit
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)  # the plan summary(x) made is the one fit uses
    assert trainer.rules == {"layers.0.weight": "d_rtrl", "layers.2.weight": "d_rtrl"}
    bptt = ef.Trainer(_model(), algo="bptt").summary(x, print_fn=None)
    assert "algo='bptt'" in bptt and "weight: " not in bptt


# ------------------------------------------------------------------ spiking readouts
def test_a_spiking_readout_with_the_loss_on_the_last_step_warns_with_the_fix():
    x, y = _data(8)
    model = _model(L.LeakySpikeReadout(H, 2))
    with pytest.warns(UserWarning, match=r"LeakySpikeReadout emits spikes.*loss_on='all' with "
                                         r"loss='spike_rate_cross_entropy'"):
        ef.Trainer(model).fit(x, y, batch_size=8, epochs=1, verbose=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.simplefilter("ignore", ef.ApproximationWarning)  # a user's filters hold inside fit now
        ef.Trainer(model, loss="spike_rate_cross_entropy", loss_on="all").fit(x, y, batch_size=8, epochs=1,
                                                                              verbose=0)


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["spike_rate_cross_entropy", "spike_rate_mse"])
def test_a_spiking_readout_learns_with_a_rate_loss_on_every_step(loss):
    x, y = _data(128, seed=1)
    rng = np.random.default_rng(0)
    model = ef.Sequential(L.Linear(C, 32, w_init=rng.normal(0, 1.0, (C, 32)).astype(np.float32)), L.LIF(32),
                          L.LeakySpikeReadout(32, 2, w_init=np.abs(rng.normal(0, 0.5, (32, 2))).astype(np.float32)))
    trainer = ef.Trainer(model, optimizer=optax.adam(1e-2), loss=loss, loss_on="all", metrics=[])

    def count_accuracy():  # the class is the readout neuron with the most spikes
        counts = trainer.predict(x, last_only=False).sum(axis=1)
        return float(np.mean(np.argmax(counts, axis=1) == y))

    before = count_accuracy()
    history = trainer.fit(x, y, batch_size=32, epochs=10, verbose=0)
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]
    assert before < 0.7 and count_accuracy() > 0.9


def test_keras_evaluation_forms_and_counts():
    """``evaluate(return_dict=False)``, ``metrics_names``, ``predict_on_batch``,
    ``count_params`` and ``batch_size=None`` (Keras' 32) work as in Keras."""
    x, y = _data(16)
    trainer = ef.Trainer(_model(), metrics=["accuracy"])
    trainer.fit(x, y, batch_size=None, epochs=1, verbose=0)
    assert trainer.history.params["steps"] == 1  # 16 sequences, batches of 32
    result = trainer.evaluate(x, y, verbose=0)
    assert trainer.metrics_names == ["loss", "accuracy"]
    assert trainer.evaluate(x, y, batch_size=None, verbose=0, return_dict=False) == [result[k] for k in
                                                                                     trainer.metrics_names]
    assert ef.Trainer(_model(), metrics=[]).evaluate(x, y, verbose=0, return_dict=False) == pytest.approx(
        ef.Trainer(_model(), metrics=[]).evaluate(x, y, verbose=0)["loss"])  # the loss alone, as Keras
    np.testing.assert_allclose(trainer.predict_on_batch(x[:5]), trainer.predict(x[:5], verbose=0), rtol=1e-6)
    assert trainer.count_params() == C * H + H + H * 2 + 2
    assert f"Total params: {trainer.count_params():,}" in trainer.summary(print_fn=None)
    with pytest.warns(UserWarning, match="steps_per_epoch=5, but 16 sequences give 2 batches of 8: each epoch runs 2"):
        ef.Trainer(_model()).fit(x, y, batch_size=8, steps_per_epoch=5, verbose=0)


def test_summary_counts_a_frozen_lora_base_as_non_trainable_as_keras_does():
    """``LoRALinear``'s base ``W`` (``train_base=False``) enters through stop_gradient and
    never changes; summary() called all 262 params trainable where 102 train."""
    x, y = _data(8)
    model = ef.Sequential(L.LoRALinear(C, H, rank=2), L.LIF(H), L.LeakyRateReadout(H, 2))
    trainer = ef.Trainer(model)
    base = trainer.get_weights()[("layers", 0, "weight")]["weight"]
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    np.testing.assert_array_equal(trainer.get_weights()[("layers", 0, "weight")]["weight"], base)  # as summary says
    total = C * H + H + 2 * (C + H) + H * 2 + 2
    assert trainer.count_params() == total  # Keras' count_params counts every weight
    text = trainer.summary(print_fn=None)
    assert (f"Total params: {total:,}\nTrainable params: {total - C * H:,}\nNon-trainable params: {C * H:,}"
            in text), text
    trained = ef.Trainer(ef.Sequential(L.LoRALinear(C, H, rank=2, train_base=True), L.LIF(H),
                                       L.LeakyRateReadout(H, 2))).summary(print_fn=None)
    assert f"Trainable params: {total:,}\nNon-trainable params: 0" in trained, trained


def test_iterations_count_the_batches_trained_across_fits_and_a_checkpoint(tmp_path):
    """Keras' ``optimizer.iterations``: TensorBoard's batch axis goes on from it."""
    x, y = _data(16)
    trainer = ef.Trainer(_model())
    trainer.fit(x, y, batch_size=8, epochs=2, verbose=0)
    trainer.train_on_batch(x[:8], y[:8])
    assert trainer.iterations == 5
    trainer.save(tmp_path / "run.ckpt")
    assert ef.Trainer.load(tmp_path / "run.ckpt", _model()).iterations == 5


def test_count_params_and_summary_count_running_statistics_as_keras_does():
    """Keras counts a BatchNormalization's moving mean and variance as non-trainable
    params (count_params() and summary's total); a dropout key is no param."""
    model = ef.Sequential(L.Linear(C, H), L.BatchNorm1d(H), L.LIF(H), L.Dropout(0.2), L.LeakyRateReadout(H, 2))
    trainer = ef.Trainer(model)
    trainable = C * H + H + 2 * H + H * 2 + 2
    assert trainer.count_params() == trainable + 2 * H
    text = trainer.summary(print_fn=None)
    assert (f"Total params: {trainable + 2 * H:,}\nTrainable params: {trainable:,}\nNon-trainable params: {2 * H:,}"
            in text), text


def test_on_batch_lists_follow_metrics_names_with_a_regulariser():
    """A regulariser's rate_<path> log made train_on_batch's list one longer than
    metrics_names (and a list, not the loss alone, without metrics); it stays in the
    dict form."""
    from etrace_fit.training import FiringRateRegularizer

    x, y = _data(16)
    for metrics in (["acc"], []):
        trainer = ef.Trainer(_model(), metrics=metrics, regularizers=[FiringRateRegularizer(target=0.1)])
        listed = trainer.train_on_batch(x[:8], y[:8])
        as_dict = trainer.train_on_batch(x[:8], y[:8], return_dict=True)
        tested = trainer.test_on_batch(x[:8], y[:8])
        if metrics:
            assert len(listed) == len(tested) == len(trainer.metrics_names) == 2
        else:
            assert isinstance(listed, float) and isinstance(tested, float)
        assert any(key.startswith("rate_") for key in as_dict), as_dict


def test_monitor_callbacks_take_keras_verbose_and_argument_order(tmp_path, capsys):
    from etrace_fit.callbacks import EarlyStopping, ModelCheckpoint, ReduceLROnPlateau

    x, y = _data(16)
    # Keras' positional order: (monitor, min_delta, patience, verbose, mode, ...)
    stop = EarlyStopping("loss", 1e9, 1, 1, "min", restore_best_weights=True)
    plateau = ReduceLROnPlateau("loss", 0.5, 1, 1, "min", min_delta=1e9)
    keep = ModelCheckpoint(str(tmp_path / "best.ckpt"), "loss", 1, True)
    ef.Trainer(_model(), optimizer="adam").fit(x, y, batch_size=8, epochs=5, verbose=0,
                                               callbacks=[stop, plateau, keep])
    printed = capsys.readouterr().out
    assert "Epoch 2: early stopping" in printed
    assert "Restoring model weights from the end of the best epoch: 1." in printed
    assert "Epoch 2: ReduceLROnPlateau reducing learning rate to 0.0005" in printed
    assert "Epoch 1: loss improved from inf to " in printed and f"saving model to {tmp_path / 'best.ckpt'}" in printed
    for make in (lambda: ModelCheckpoint("a.ckpt", "val_acc", "max"), lambda: EarlyStopping("loss", 0, 1, "min")):
        with pytest.raises(ConfigError, match=r"verbose must be 0 or 1, got '(max|min)' \(mode moved after it, as in "
                                              r"Keras: pass mode= by name\)"):
            make()


def test_evaluate_and_predict_report_as_keras_does_at_verbose_1_and_2(capsys):
    """verbose was checked and then ignored: evaluate and predict printed nothing at 1,
    2 or "auto" (Keras' default). Now one line at the end (stderr beside the bar at 1,
    stdout at 2, as fit's), the loss first; 0 is silent. Under pytest the output is no
    terminal, so no bar."""
    x, y = _data(20)
    trainer = ef.Trainer(_model(), algo="bptt", metrics=["acc"])
    result = trainer.evaluate(x, y, batch_size=8)
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("evaluate - 3 batches - ") and err.endswith(
        f" - loss: {result['loss']:.4f} - acc: {result['acc']:.4f}\n"), err
    trainer.evaluate(x, y, batch_size=8, verbose=2)
    out, err = capsys.readouterr()
    assert err == "" and out.startswith("evaluate - 3 batches - ") and "loss: " in out
    trainer.predict(x, batch_size=8, verbose=2, steps=2)
    assert capsys.readouterr().out.startswith("predict - 2 batches - ")
    trainer.predict(x, batch_size=8)
    assert capsys.readouterr().err.startswith("predict - 3 batches - ")
    trainer.evaluate(x, y, verbose=0)
    trainer.predict(x, verbose=0)
    assert capsys.readouterr() == ("", "")


def test_each_fit_shuffles_anew_as_keras_does():
    """Three fit(epochs=1) calls read the one order of seed + 0 three times (Keras shuffles
    at every fit); now they read what fit(epochs=3) reads, and a resume from
    initial_epoch reads its epochs' orders."""
    x, y = _data(24)

    def trainer():
        return ef.Trainer(_model(), algo="bptt", optimizer=optax.sgd(0.1), seed=3)

    thrice = trainer()
    for _ in range(3):
        thrice.fit(x, y, batch_size=8, epochs=1, verbose=0)
    once = trainer()
    once.fit(x, y, batch_size=8, epochs=3, verbose=0)
    _assert_trees_close(_weights(thrice), _weights(once), rtol=1e-6, atol=1e-7)
    resumed = trainer()
    resumed.fit(x, y, batch_size=8, epochs=1, verbose=0)
    resumed.fit(x, y, batch_size=8, epochs=3, initial_epoch=1, verbose=0)
    _assert_trees_close(_weights(resumed), _weights(once), rtol=1e-6, atol=1e-7)
    same = trainer()
    for _ in range(3):
        same.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    assert not np.allclose(jax.tree.leaves(_weights(same))[0], jax.tree.leaves(_weights(once))[0])


def test_a_users_filter_on_approximation_warnings_holds_inside_fit():
    """fit compiled under a "once" filter for every UserWarning put ahead of the user's:
    simplefilter("ignore" / "error", ApproximationWarning) did nothing inside fit."""
    import warnings

    x, y = _data(8)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        ef.Trainer(_model(), algo="esd_rtrl").fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert not [w for w in seen if issubclass(w.category, ef.ApproximationWarning)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ef.ApproximationWarning)
        trainer = ef.Trainer(_model(), algo="esd_rtrl")
        before = _weights(trainer)
        with pytest.raises(ef.ApproximationWarning, match="ES-D-RTRL factorises its trace"):
            trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    _assert_trees_close(_weights(trainer), before, rtol=0, atol=0)


def test_a_mask_trainer_takes_its_mask_on_batch_calls_and_measures_its_step():
    """With loss_on="mask" the errors said to give (x, y, mask) batches, which
    train_on_batch / test_on_batch refused, and neither took mask=; step_memory failed."""
    x, y = _data(8)
    mask = np.ones(x.shape[:2], bool)
    mask[:4, 10:] = False
    fitted = ef.Trainer(_model(), algo="bptt", optimizer=optax.sgd(0.1), loss_on="mask")
    fitted.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, mask=mask)
    by_batch = ef.Trainer(_model(), algo="bptt", optimizer=optax.sgd(0.1), loss_on="mask")
    before = by_batch.test_on_batch(x, y, mask=mask)
    by_batch.train_on_batch(x, y, mask=mask)
    _assert_trees_close(_weights(by_batch), _weights(fitted), rtol=1e-6, atol=1e-7)
    assert by_batch.test_on_batch(x, y, mask=mask) != before
    assert set(by_batch.step_memory(x, y, batch_size=8)) >= {"temp", "argument"}
    with pytest.raises(ConfigError, match=r"train_on_batch: loss_on='mask' places the loss on the steps a mask marks; "
                                          r"pass train_on_batch\(x, y, mask=mask\)"):
        by_batch.train_on_batch(x, y)
    with pytest.raises(ShapeError, match=r"test_on_batch: mask must have shape \(8, 12\)"):
        by_batch.test_on_batch(x, y, mask=mask[:, :5])
    with pytest.raises(ConfigError, match=r"a mask was given but loss_on='last' ignores it"):
        ef.Trainer(_model()).train_on_batch(x, y, mask=mask)


def test_a_keras_sequence_is_shuffled_per_epoch_and_told_each_epoch_end():
    """A Sequence / PyDataset (__len__, __getitem__) was read in one order whatever shuffle
    said, and its on_epoch_end() never ran; Keras does both. A list keeps its order."""
    x, y = _data(16)

    class Batches:
        def __init__(self):
            self.read, self.ends = [], 0

        def __len__(self):
            return 4

        def __getitem__(self, i):
            self.read.append(i)
            return x[4 * i:4 * i + 4], y[4 * i:4 * i + 4]

        def on_epoch_end(self):
            self.ends += 1

    shuffled, ordered = Batches(), Batches()
    ef.Trainer(_model()).fit(shuffled, epochs=3, verbose=0)
    ef.Trainer(_model()).fit(ordered, epochs=2, shuffle=False, verbose=0)
    epochs = [shuffled.read[i:i + 4] for i in range(0, 12, 4)]
    assert all(sorted(e) == [0, 1, 2, 3] for e in epochs) and epochs != [[0, 1, 2, 3]] * 3
    assert ordered.read == [0, 1, 2, 3] * 2 and (shuffled.ends, ordered.ends) == (3, 2)
    listed = [(x[i:i + 4], y[i:i + 4]) for i in range(0, 16, 4)]
    default, unshuffled = ef.Trainer(_model(), algo="bptt"), ef.Trainer(_model(), algo="bptt")
    default.fit(listed, epochs=1, verbose=0)
    unshuffled.fit(listed, epochs=1, verbose=0, shuffle=False)
    _assert_trees_close(_weights(default), _weights(unshuffled), rtol=0, atol=0)  # a list keeps its order


def test_python_lists_of_numbers_are_taken_as_arrays_as_keras_does():
    """y.tolist() raised "only integer scalar arrays can be converted to a scalar index"
    from inside the batching; a list of (x, y) batches stays one."""
    x, y = _data(16)
    xv, yv = _data(8, seed=1)
    arrays = ef.Trainer(_model(), optimizer="sgd", algo="bptt")
    arrays.fit(x, y, batch_size=8, shuffle=False, verbose=0, sample_weight=np.full(16, 0.5, np.float32),
               validation_data=(xv, yv))
    lists = ef.Trainer(_model(), optimizer="sgd", algo="bptt")
    history = lists.fit(x.tolist(), y.tolist(), batch_size=8, shuffle=False, verbose=0, sample_weight=[0.5] * 16,
                        validation_data=(xv.tolist(), yv.tolist()))
    _assert_trees_close(_weights(arrays), _weights(lists), rtol=1e-6, atol=1e-8)
    assert history.history["val_loss"] == arrays.history.history["val_loss"]
    assert lists.evaluate(xv.tolist(), yv.tolist(), verbose=0) == arrays.evaluate(xv, yv, verbose=0)
    np.testing.assert_array_equal(lists.predict(xv.tolist(), verbose=0), arrays.predict(xv, verbose=0))
    assert lists.train_on_batch(xv.tolist(), yv.tolist()) == arrays.train_on_batch(xv, yv)
    assert len(lists.fit([(x[:8], y[:8]), (x[8:], y[8:])], verbose=0).epoch) == 1  # a list of batches
    with pytest.raises(ShapeError, match=r"x is a nested Python list whose rows differ in length, so it is no one "
                                         r"array; give an array \(sequences of different lengths: pad them with "
                                         r"etrace_fit.datasets.pad_sequences\), or a list of \(x, y\) batches"):
        lists.fit([x[0].tolist(), x[1, :5].tolist()], [0, 1], verbose=0)


@pytest.mark.parametrize("flag, level", [(True, 1), (False, 0)])
def test_verbose_takes_a_bool_as_keras_does(flag, level, capsys):
    """verbose=True / False were refused ("verbose must be 'auto', 0, 1 or 2"); Keras reads them as 1 / 0."""
    from etrace_fit.callbacks import EarlyStopping, LearningRateScheduler, ReduceLROnPlateau

    x, y = _data(8)
    trainer = ef.Trainer(_model())
    history = trainer.fit(x, y, batch_size=8, epochs=1, verbose=flag)
    assert history.params["verbose"] == level
    assert ("Epoch 1/1" in capsys.readouterr().err) is flag
    trainer.evaluate(x, y, verbose=flag)
    trainer.predict(x, verbose=flag)
    assert EarlyStopping("loss", verbose=flag).verbose == level
    assert ReduceLROnPlateau("loss", verbose=flag).verbose == level
    assert LearningRateScheduler(lambda epoch: 1e-3, verbose=flag).verbose == level


def test_time_major_data_given_to_a_batch_major_trainer_gets_the_hint():
    """It said only "x has 12, y has 16" (the other direction named time_major)."""
    x, y = _data(16)
    with pytest.raises(ShapeError, match=r"x and y have different numbers of samples: x has 12, y has 16; x of shape "
                                         r"\(12, 16, 4\) looks time-major \(time=12, batch=16, ...\): pass "
                                         r"Trainer\(time_major=True\), or np.swapaxes\(x, 0, 1\)"):
        ef.Trainer(_model()).fit(np.swapaxes(x, 0, 1), y, batch_size=8, verbose=0)
    with pytest.raises(ShapeError, match=r"x has 12, y has 16; .*looks time-major"):
        ef.Trainer(_model()).evaluate(np.swapaxes(x, 0, 1), y, verbose=0)
    with pytest.raises(ShapeError, match=r"x and y have different numbers of samples: x has 16, y has 8$"):
        ef.Trainer(_model()).fit(x, y[:8], batch_size=8, verbose=0)  # no layout that fits: no hint

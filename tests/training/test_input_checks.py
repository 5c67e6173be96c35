"""Bad input fails before training, naming the argument (issue 13, "Silent acceptance" and
"Late or raw errors"). Each test gives one bad input the issue lists and checks the
exception type, the message, and that no training batch ran (or, for data that arrives
batch by batch, that the bad batch did not)."""

import itertools
import re
import subprocess
import sys
import warnings

import brainstate
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit.callbacks import LambdaCallback
from etrace_fit.errors import ConfigError, ShapeError

from ._helpers import C, T, lif_model as _model, rate_data as _data


def _fit_counting(trainer, *args, callbacks_extra=(), **kwargs):
    """``fit`` with a callback counting the batches that began; returns the count."""
    began = []
    counter = LambdaCallback(on_train_batch_begin=lambda b, logs: began.append(b))
    try:
        trainer.fit(*args, callbacks=[counter, *callbacks_extra], verbose=0, **kwargs)
    finally:
        _fit_counting.began = len(began)
    return len(began)


# ------------------------------------------------------------------ labels, everywhere
def test_a_label_out_of_range_in_the_last_sample_fails_before_the_first_batch():
    x, y = _data()
    y = y.copy()
    y[-1] = 5
    with pytest.raises(ShapeError, match=r"y: labels must lie in \[0, 2\).*from 0 to 5"):
        _fit_counting(ef.Trainer(_model()), x, y, batch_size=8)
    assert _fit_counting.began == 0


def test_labels_of_validation_data_and_of_evaluate_are_checked():
    x, y = _data()
    bad = y.copy()
    bad[3] = -1
    with pytest.raises(ShapeError, match=r"validation_data y: labels must lie in \[0, 2\).*from -1"):
        _fit_counting(ef.Trainer(_model()), x, y, batch_size=8, validation_data=(x, bad))
    assert _fit_counting.began == 0
    with pytest.raises(ShapeError, match=r"y: labels must lie in \[0, 2\)"):
        ef.Trainer(_model()).evaluate(x, bad, verbose=0)


def test_an_iterable_is_checked_batch_by_batch_before_each_step():
    x, y = _data(24)
    y = y.copy()
    y[20] = 7  # in the third batch of 8
    batches = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 24, 8)]
    trainer = ef.Trainer(_model(), optimizer=optax.sgd(0.1))
    with pytest.raises(ShapeError, match=r"y of batch 2: labels must lie in \[0, 2\)"):
        _fit_counting(trainer, batches)
    assert _fit_counting.began == 2


# ------------------------------------------------------------------ non-finite values
def test_nan_in_float_targets_fails_before_training():
    x, _ = _data()
    y = np.zeros((len(x), 2), np.float32)
    y[5, 1] = np.nan
    with pytest.raises(ShapeError, match=r"y contains NaN or inf \(first in sample 5\)"):
        _fit_counting(ef.Trainer(_model(), loss="mse", metrics=[]), x, y, batch_size=8)
    assert _fit_counting.began == 0


def test_nan_in_bfloat16_inputs_is_found():
    x, y = _data()
    x = x.astype(ml_dtypes.bfloat16)
    x[9, 3, 1] = np.nan
    with pytest.raises(ShapeError, match=r"x contains NaN or inf \(first in sample 9\)"):
        _fit_counting(ef.Trainer(_model()), x, y, batch_size=8)
    assert _fit_counting.began == 0


def test_training_stops_after_an_epoch_in_which_every_batch_was_non_finite():
    x, y = _data(32)
    trainer = ef.Trainer(_model(), optimizer=optax.sgd(1e30), loss="mse", metrics=[])
    targets = np.zeros((len(x), 2), np.float32)
    with pytest.warns(RuntimeWarning, match=r"every batch \(4\) had a non-finite loss.*training stops.*"
                                            r"lower the learning rate"):
        history = trainer.fit(x, targets, batch_size=8, epochs=6, verbose=0)
    assert len(history.epoch) < 6
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(trainer.get_weights()))
    going_on = ef.Trainer(_model(), optimizer=optax.sgd(1e30), loss="mse", metrics=[], stop_on_nonfinite=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert len(going_on.fit(x, targets, batch_size=8, epochs=4, verbose=0).epoch) == 4


# ------------------------------------------------------------------ losses and masks
def test_a_loss_that_returns_more_than_one_value_per_sample_fails_before_training():
    def column_loss(output, label):  # (B, 1): would broadcast against the (B,) weights
        return optax.softmax_cross_entropy_with_integer_labels(output, label)[:, None]

    x, y = _data()
    with pytest.raises(ConfigError, match=r"loss 'column_loss' returned shape \(8, 1\) for a batch of 8 samples; "
                                          r"a loss returns one value per sample, shape \(8,\)"):
        _fit_counting(ef.Trainer(_model(), loss=column_loss), x, y, batch_size=8)
    assert _fit_counting.began == 0


def test_a_mask_with_a_loss_on_that_ignores_it_is_an_error():
    x, y = _data()
    mask = np.ones((len(x), T), np.float32)
    with pytest.raises(ConfigError, match=r"a mask was given but loss_on='last' ignores it; pass loss_on='mask'"):
        _fit_counting(ef.Trainer(_model()), [(x[:8], y[:8], mask[:8])])
    assert _fit_counting.began == 0
    with pytest.raises(ConfigError, match=r"loss_on='all' ignores it"):
        ef.Trainer(_model(), loss_on="all").evaluate(x=[(x, y, mask)], verbose=0)


def test_sequence_grad_refuses_a_per_sample_loss():
    model = _model()
    brainstate.nn.init_all_states(model, batch_size=3)
    xs, ys = jnp.ones((5, 3, C)), jnp.zeros((5, 3, 2))
    with pytest.raises(ConfigError, match=r"step_loss 'per_sample' returned shape \(3,\); it must return one "
                                          r"scalar per step"):
        def per_sample(out, y):
            return jnp.sum((out - y) ** 2, axis=-1)

        ef.sequence_grad(model, xs, ys, per_sample, algo="d_rtrl")


def test_sequence_grad_with_a_new_lambda_per_call_warns_and_keeps_memory_bounded():
    from etrace_fit.algorithms.learner import MAX_PROGRAMS

    model = _model()
    brainstate.nn.init_all_states(model, batch_size=3)
    xs, ys = jnp.ones((4, 3, C)), jnp.zeros((4, 3, 2))
    learner = ef.compile(model, xs[0], algo="d_rtrl", warn=False)
    with pytest.warns(RuntimeWarning, match="new step_loss function with the same code") as caught:
        for _ in range(MAX_PROGRAMS + 4):
            ef.sequence_grad(learner, xs, ys, lambda out, y: jnp.sum((out - y) ** 2))
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1
    assert len(learner._compiled) <= MAX_PROGRAMS


# ------------------------------------------------------------------ arguments
@pytest.mark.parametrize("kwargs, error, match", [
    (dict(batch_size=0), ConfigError, r"batch_size must be a positive int, got 0"),
    (dict(batch_size=2.5), ConfigError, r"batch_size must be a positive int, got 2.5"),
    (dict(steps_per_epoch=0), ConfigError, r"steps_per_epoch must be a positive int, got 0"),
    (dict(validation_split="0.2"), ConfigError, r"validation_split must be a number in \(0, 1\), got '0.2'"),
    (dict(validation_split=1.5), ConfigError, r"validation_split must be a number in \(0, 1\), got 1.5"),
])
def test_bad_fit_arguments_fail_before_training(kwargs, error, match):
    x, y = _data()
    with pytest.raises(error, match=match):
        _fit_counting(ef.Trainer(_model()), x, y, **kwargs)
    assert _fit_counting.began == 0


def test_evaluate_and_predict_check_their_batch_size_and_inputs():
    x, y = _data()
    trainer = ef.Trainer(_model())
    with pytest.raises(ConfigError, match=r"batch_size must be a positive int, got 0"):
        trainer.evaluate(x, y, batch_size=0, verbose=0)
    with pytest.raises(ConfigError, match=r"batch_size must be a positive int, got -3"):
        trainer.predict(x, batch_size=-3, verbose=0)
    bad = x.astype(ml_dtypes.bfloat16)
    bad[2, 0, 0] = np.inf
    with pytest.raises(ShapeError, match=r"x contains NaN or inf \(first in sample 2\)"):
        trainer.predict(bad, verbose=0)


def test_sequences_without_time_steps_are_a_shape_error():
    x, y = _data()
    with pytest.raises(ShapeError, match=r"x has no time steps \(T = 0"):
        _fit_counting(ef.Trainer(_model()), x[:, :0], y, batch_size=8)
    assert _fit_counting.began == 0


@pytest.mark.parametrize("make, error, match", [
    (lambda x, y: (x[:0], y[:0]), ShapeError, r"validation_data: no samples \(x has shape \(0, "),
    (lambda x, y: {"x": x, "y": y}, ConfigError,
     r"validation_data must be arrays .*; got a dict with keys \['x', 'y'\]"),
    (lambda x, y: [(x[:8].tolist(), y[:8].tolist()), (x[8:].tolist(), y[8:].tolist())], ConfigError,
     r"got a list of Python lists: convert them to arrays"),  # batches of lists: no (x, y) to convert
    (lambda x, y: "val.npz", ConfigError, r"; got str 'val.npz'"),
    (lambda x, y: 5, ConfigError, r"; got int 5"),
    (lambda x, y: [], ConfigError, r"; got an empty list"),
], ids=["empty", "dict", "lists", "str", "int", "empty-list"])
def test_validation_data_that_cannot_be_batches_fails_before_training(make, error, match):
    """Each was taken as an iterable of batches and failed at the first validation, after
    the first epoch had trained (and before any backup of it)."""
    x, y = _data()
    with pytest.raises(error, match=match):
        _fit_counting(ef.Trainer(_model()), x, y, batch_size=8, validation_data=make(x, y))
    assert _fit_counting.began == 0


@pytest.mark.parametrize("freq", [[0], [-1], [1.7], "10", [True]])
def test_validation_freq_lists_of_what_is_not_an_epoch_are_refused(freq):
    """[0] or [-1] named no epoch, [1.7] was read as 1, the string "10" as epochs 1 and 0."""
    x, y = _data()
    with pytest.raises(ConfigError, match=r"validation_freq must be an int >= 1 or a list of 1-based epochs"):
        _fit_counting(ef.Trainer(_model()), x, y, batch_size=8, validation_data=(x, y), validation_freq=freq)
    assert _fit_counting.began == 0


def test_a_validation_freq_naming_no_epoch_of_the_fit_warns_and_a_monitor_on_it_fails_first():
    """[99] with epochs=3: EarlyStopping("val_loss") passed its check before training and
    never acted."""
    x, y = _data()
    with pytest.warns(UserWarning, match=r"validation_freq=\[99\]: no epoch of this fit \(1..2\) validates"):
        with pytest.raises(ConfigError, match=r"'val_loss' is a validation value, but this fit has no validation"):
            _fit_counting(ef.Trainer(_model()), x, y, batch_size=8, epochs=2, validation_data=(x, y),
                          validation_freq=[99], callbacks_extra=[ef.callbacks.EarlyStopping("val_loss")])
    assert _fit_counting.began == 0


def test_validation_data_as_a_list_works_like_a_tuple():
    x, y = _data()
    history = ef.Trainer(_model()).fit(x, y, batch_size=8, epochs=1, verbose=0, validation_data=[x, y])
    assert "val_loss" in history.history


@pytest.mark.parametrize("args, match", [
    (["--lr", "inf"], "--lr must be positive and finite, got inf"),
    (["--lr", "nan"], "--lr must be positive and finite, got nan"),
    (["--seed", "-1"], r"--seed must be an integer in \[0, 2\*\*32\), got -1"),
])
def test_the_command_line_refuses_bad_numbers_without_a_traceback(args, match):
    done = subprocess.run([sys.executable, "-m", "etrace_fit", "train", "--epochs", "1", "--logdir", "none", *args],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert re.search(match, done.stderr), done.stderr


# ------------------------------------------------------------------ targets: present, and shaped for the loss
def test_data_without_the_targets_a_loss_needs_fails_before_training():
    """Without ``y`` a built-in loss would have read zeros as the labels: evaluate(x)
    gave accuracy 1.0 where evaluate(x, y) gave 0.33, and validation_data=x_val logged
    made-up val_* values."""
    x, y = _data()
    needs = "loss 'sparse_categorical_crossentropy' needs targets"
    with pytest.raises(ConfigError, match=f"y: {needs}, got y=None; call fit\\(x, y\\)"):
        _fit_counting(ef.Trainer(_model()), x, batch_size=8)
    assert _fit_counting.began == 0
    for validation, given in ((x, "x alone"), ((x, None), "y None")):
        with pytest.raises(ConfigError, match=f"validation_data: {needs}, got {given}; give \\(x_val, y_val\\)"):
            _fit_counting(ef.Trainer(_model()), x, y, batch_size=8, validation_data=validation)
        assert _fit_counting.began == 0
    with pytest.raises(ConfigError, match=f"y: {needs}, got x alone; give evaluate\\(x, y\\)"):
        ef.Trainer(_model()).evaluate(x, verbose=0)
    unlabelled = [(np.swapaxes(x[i:i + 8], 0, 1),) for i in range(0, 16, 8)]  # time-major batches of x alone
    with pytest.raises(ConfigError, match=f"x: {needs}, but the data's batches carry none"):
        _fit_counting(ef.Trainer(_model(), time_major=True), unlabelled, batch_size=8)
    assert _fit_counting.began == 0
    assert ef.Trainer(_model()).predict(x, verbose=0).shape == (16, 2)  # predict needs none


def test_a_loss_of_yours_may_train_without_targets():
    x, _ = _data()
    quiet = ef.Trainer(_model(), loss=lambda out, target: jnp.mean(out ** 2, axis=-1), metrics=[])
    history = quiet.fit(x, batch_size=8, epochs=3, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_keras_label_and_target_shapes_train_alike():
    """Sparse labels of shape (N, 1) as (N,) (Keras takes both); a regression target (N,)
    for one output as (N, 1): broadcast, it paired every sample with every target."""
    x, y = _data()
    runs = [ef.Trainer(_model(), seed=0).fit(x, labels, batch_size=8, epochs=2, verbose=0, shuffle=False).history
            for labels in (y, y[:, None])]
    assert runs[0] == runs[1]
    target = y.astype(np.float32) * 2 - 1
    rng = np.random.default_rng(0)
    w_in, w_out = rng.normal(0, 1.5, (C, 8)).astype(np.float32), rng.normal(0, 0.3, (8, 1)).astype(np.float32)
    one = lambda: ef.Sequential(ef.layers.Linear(C, 8, w_init=w_in), ef.layers.LIF(8),  # noqa: E731
                                ef.layers.LeakyRateReadout(8, 1, w_init=w_out))
    losses = [ef.Trainer(one(), loss="mse", metrics=[]).evaluate(x, t, verbose=0)["loss"]
              for t in (target, target[:, None])]
    assert losses[0] == pytest.approx(losses[1])


@pytest.mark.parametrize("loss, labels, match", [
    ("sparse_categorical_crossentropy", "one_hot", r"y: loss 'sparse_categorical_crossentropy' takes one integer "
     r"class label per sample .* got targets of shape \(2,\) per sample \(one-hot targets\? use "
     r"loss='categorical_crossentropy'\)"),
    ("categorical_crossentropy", "integers", r"y: loss 'categorical_crossentropy' takes one-hot or probability "
     r"targets, shape \(2,\) per sample .*\(y of shape \(N, 2\), or \(N, T, 2\) per step\); got targets of shape \(\) "
     r"per sample \(integer labels\? use loss='sparse_categorical_crossentropy'\)"),
    ("mse", "integers", r"y: loss 'mse' compares targets with the model's output, shape \(2,\) per sample; got "
     r"targets of shape \(\) per sample \(give y of shape \(N, 2\), or \(N, T, 2\) per step\)"),
])
def test_targets_that_do_not_fit_the_loss_fail_before_training_with_the_fix(loss, labels, match):
    x, y = _data()
    targets = np.eye(2, dtype=np.float32)[y] if labels == "one_hot" else y.astype(np.float32 if loss == "mse" else int)
    with pytest.raises(ShapeError, match=match):
        _fit_counting(ef.Trainer(_model(), loss=loss, metrics=[]), x, targets, batch_size=8)
    assert _fit_counting.began == 0
    good = np.eye(2, dtype=np.float32)[y] if loss != "sparse_categorical_crossentropy" else y
    with pytest.raises(ShapeError, match="validation_data " + match):  # right for training, wrong for validation
        _fit_counting(ef.Trainer(_model(), loss=loss, metrics=[]), x, good, batch_size=8,
                      validation_data=(x, targets))
    assert _fit_counting.began == 0
    with pytest.raises(ShapeError, match=match):
        ef.Trainer(_model(), loss=loss, metrics=[]).evaluate(x, targets, verbose=0)


# ------------------------------------------------------------------ weights and masks
@pytest.mark.parametrize("bad, match", [
    (np.nan, r"sample_weight contains NaN or inf \(first in sample 5\)"),
    (-1.0, r"sample_weight must be >= 0, got -1 \(first in sample 5\); a negative weight would train away"),
])
def test_a_nan_or_negative_sample_weight_fails_before_training(bad, match):
    """A NaN weight made its batch skip as non-finite (the warning blamed the learning
    rate); a negative one trained by gradient ascent, silently."""
    x, y = _data()
    weights = np.ones(len(x), np.float32)
    weights[5] = bad
    with pytest.raises(ShapeError, match=match):
        _fit_counting(ef.Trainer(_model()), x, y, batch_size=8, sample_weight=weights)
    assert _fit_counting.began == 0


def test_a_mask_marks_steps_and_is_checked_before_training_wherever_it_comes():
    x, y = _data()
    ramp = np.tile(np.linspace(0.0, 1.0, T, dtype=np.float32), (len(x), 1))
    weighting = "marks the steps each sequence has with True / False \\(or 1 / 0\\), got values from 0 to 1; weight " \
                "steps with sample_weight \\(N, T\\) instead"
    with pytest.raises(ShapeError, match="mask " + weighting):
        _fit_counting(ef.Trainer(_model(), loss_on="mask"), x, y, batch_size=8, mask=ramp)
    assert _fit_counting.began == 0
    with pytest.raises(ShapeError, match="validation_data mask " + weighting):
        _fit_counting(ef.Trainer(_model(), loss_on="mask"), x, y, batch_size=8, mask=ramp > 0,
                      validation_data=(x, y, ramp))
    assert _fit_counting.began == 0
    with pytest.raises(ShapeError, match="mask " + weighting):
        ef.Trainer(_model(), loss_on="mask").evaluate(x, y, mask=ramp, verbose=0)
    keras = r"validation_data mask must have shape \(16, 12\) \(batch, time\) for x of shape \(16, 12, 4\), got " \
            r"\(16,\) \(Keras' third element of validation_data, sample weights, is not taken"
    with pytest.raises(ShapeError, match=keras):  # found before training, not at the first epoch's end
        _fit_counting(ef.Trainer(_model(), loss_on="mask"), x, y, batch_size=8, mask=ramp > 0,
                      validation_data=(x, y, np.ones(len(x), np.float32)))
    assert _fit_counting.began == 0
    ones = (ramp > 0).astype(np.int32)  # 1 / 0 is a mask as True / False is
    ef.Trainer(_model(), loss_on="mask").fit(x, y, batch_size=8, mask=ones, verbose=0)


def test_set_weights_refuses_what_get_weights_would_not_give_and_changes_nothing():
    """A wrong shape was taken (summary() counted other parameters) and failed at the
    next fit; a bare array or a NaN was taken too."""
    trainer = ef.Trainer(_model())
    before = trainer.get_weights()
    path, last = list(before)[0], list(before)[-1]
    wrong = {**before, path: {**before[path], "weight": np.zeros((C + 3, 8), np.float32)}}
    cases = [
        (wrong, ShapeError, r"set_weights: layers\.0\.weight\['weight'\] must have shape \(4, 8\), got \(7, 8\)"),
        ({path: np.zeros((C, 8))}, ConfigError, r"set_weights: layers\.0\.weight must be structured as get_weights "
                                                r"gives it \(a dict of 'bias', 'weight'\), got ndarray"),
        ({**before, last: {**before[last], "bias": np.full(2, np.nan, np.float32)}}, ShapeError,
         r"set_weights: layers\.2\.weight\['bias'\] contains NaN or inf"),  # checked before the first is set
        ({("layers", 7, "weight"): before[path]}, ConfigError, r"the model has no weight at \('layers', 7, 'weight'\)"),
        (list(before.values()), ConfigError, r"set_weights takes the dict get_weights returns \(\{path: value\}\), "
                                             r"got a list"),
    ]
    for weights, error, match in cases:
        with pytest.raises(error, match=match):
            trainer.set_weights(weights)
        for key, value in trainer.get_weights().items():  # all or nothing: the good paths were not set either
            for name in value:
                np.testing.assert_array_equal(np.asarray(value[name]), np.asarray(before[key][name]))
    halved = jax.tree.map(lambda w: np.asarray(w) / 2, before)
    trainer.set_weights(halved)
    np.testing.assert_allclose(np.asarray(trainer.get_weights()[path]["weight"]), halved[path]["weight"])


# ------------------------------------------------------------------ iterators read once
def test_an_iterator_over_more_epochs_than_it_lasts_fails_before_training_or_stops_as_keras():
    x, y = _data(24)

    def batches():
        for i in range(0, 24, 8):
            yield x[i:i + 8], y[i:i + 8]

    trainer = ef.Trainer(_model())
    with pytest.raises(ConfigError, match=r"x is an iterator \(a generator, say\): it is read once, so its batches "
                                          r"last one epoch, but epochs=2; .*or give steps_per_epoch"):
        _fit_counting(trainer, batches(), epochs=2)
    assert _fit_counting.began == 0
    with pytest.raises(ConfigError, match="validation_data is an iterator .* but this fit validates 2 times"):
        _fit_counting(ef.Trainer(_model()), x, y, batch_size=8, epochs=2, validation_data=batches())
    assert _fit_counting.began == 0
    # With steps_per_epoch an iterator is read across epochs; when it runs out, training
    # stops with a warning and fit returns the History of the epochs it ran (Keras).
    with pytest.warns(RuntimeWarning, match="x ran out of data after 1 epoch of 3 steps: training stops"):
        history = ef.Trainer(_model()).fit(batches(), epochs=3, steps_per_epoch=3, verbose=0)
    assert history.epoch == [0]
    listed = ef.Trainer(_model()).fit(list(batches()), epochs=2, verbose=0)  # starts over
    assert listed.epoch == [0, 1]
    # ran out inside an epoch: it logged a full epoch of 5 steps after 3, without a word
    seen = []
    with pytest.warns(RuntimeWarning, match=r"x ran out of data in epoch 1, after 3 of its 5 steps: training stops "
                                            r"after this epoch"):
        history = ef.Trainer(_model()).fit(batches(), epochs=2, steps_per_epoch=5, verbose=0, callbacks=[
            ef.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: seen.append(batch))])
    assert history.epoch == [0] and seen == [0, 1, 2]
    # a validation iterator read across validations that runs out: the epoch stays, unvalidated
    # (a bare NoBatches came after the epoch had trained, and the epoch was missing from History)
    with pytest.warns(RuntimeWarning, match=r"validation_data ran out of batches: epoch 3 is not validated"):
        history = ef.Trainer(_model()).fit(x, y, batch_size=8, epochs=3, verbose=0, validation_steps=1,
                                           validation_data=itertools.islice(batches(), 2))
    assert history.epoch == [0, 1, 2] and len(history.history["val_loss"]) == 2


def test_a_hidden_state_no_reset_state_writes_is_named_before_anything_runs():
    """A layer of yours that creates a hidden state in init_state but defines no
    reset_state: its state carried from one batch into the next (predict twice gave
    outputs 23.6 apart), silently."""
    class Leaky(brainstate.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.n = n

        def init_state(self, batch_size=None, **kwargs):
            self.acc = brainstate.HiddenState(jnp.zeros((batch_size, self.n)))

        def update(self, x):
            self.acc.value = 0.9 * self.acc.value + x
            return self.acc.value

    def model():
        return ef.Sequential(ef.layers.Linear(C, 8), Leaky(8), ef.layers.LeakyRateReadout(8, 2))

    x, y = _data()
    match = (r"hidden state layers\.1\.acc \(Leaky\) is not reset by reset_state, so it would carry from one batch "
             r"\(and one predict call\) into the next; define reset_state")
    with pytest.raises(ConfigError, match=match):
        _fit_counting(ef.Trainer(model()), x, y, batch_size=8)
    assert _fit_counting.began == 0
    for call in (lambda t: t.predict(x, verbose=0), lambda t: t.evaluate(x, y, verbose=0)):
        with pytest.raises(ConfigError, match=match):
            call(ef.Trainer(model()))

    class Reset(Leaky):
        def reset_state(self, batch_size=None, **kwargs):
            self.acc.value = jnp.zeros((batch_size, self.n))

    trainer = ef.Trainer(ef.Sequential(ef.layers.Linear(C, 8), Reset(8), ef.layers.LeakyRateReadout(8, 2)))
    np.testing.assert_array_equal(trainer.predict(x, verbose=0), trainer.predict(x, verbose=0))


# ------------------------------------------------------------------ the optimizer
@pytest.mark.parametrize("optimizer", [optax.adam("1e-2"), optax.sgd("0.1"),
                                       optax.chain(optax.clip(1.0), optax.adam("1e-3"))])
def test_an_optax_optimizer_that_fails_on_the_weights_is_named_in_the_constructor(optimizer):
    """optax takes a learning rate typed as a string; the first batch failed deep in the
    jitted step with "Only integer scalar arrays can be converted to a scalar index"."""
    with pytest.raises(ConfigError, match=r"optimizer: the optax optimizer fails on the model's weights before "
                                          r"training \(a hyperparameter is a string, such as a learning rate typed "
                                          r"\"1e-2\": pass a number"):
        ef.Trainer(_model(), optimizer=optimizer)
    with pytest.raises(ConfigError, match="the optax optimizer fails on the model's weights"):
        ef.Trainer(_model(), optimizer=optimizer, update_every=4)


def test_an_optimizer_whose_init_needs_concrete_values_is_still_taken():
    """An init with Python control flow on the values cannot be traced; optax allows it,
    so it is not probed, and it runs eagerly at the first batch."""
    adam = optax.adam(1e-2)

    def init(params):
        if float(sum(jnp.sum(jnp.abs(p)) for p in jax.tree.leaves(params))) < 0:  # concrete values only
            raise AssertionError
        return adam.init(params)

    x, y = _data(8)
    trainer = ef.Trainer(_model(), optimizer=optax.GradientTransformation(init, adam.update))
    assert np.isfinite(trainer.fit(x, y, batch_size=8, epochs=1, verbose=0).history["loss"][0])


# ------------------------------------------------------------------ another input dtype
@pytest.mark.parametrize("algo, dtype", [("hybrid", np.float16), ("d_rtrl", np.int32), ("esd_rtrl", np.bool_),
                                         ("eprop", np.int32)])
def test_a_later_fit_on_another_input_dtype_trains_as_on_the_same_values_in_float32(algo, dtype):
    """The plan was matched to the new step by equation index, and a cast equation more
    moved them all: every online rule failed with "other weights at this input shape"
    (after a float32 fit, on float16, int or bool spikes). The values are 0 / 1, exact in
    every dtype, so the second fit must equal one on the float32 copy."""
    x, y = _data(16)
    assert set(np.unique(x)) <= {0.0, 1.0}
    weights = []
    for second in (x.astype(dtype), x.astype(np.float32)):
        trainer = ef.Trainer(_model(), algo=algo, optimizer=optax.sgd(0.5))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ef.ApproximationWarning)
            trainer.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
            trainer.fit(second, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        weights.append(jax.tree.leaves(trainer.get_weights()))
    for a, b in zip(*weights):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def test_keras_multi_input_x_and_sample_weight_batches_are_named():
    """Both read as something else: a dict or tuple of arrays as an iterable of batches
    ("y must be None"), a (x, y, sample_weight) batch as (x, y, mask)."""
    x, y = _data(8)
    for given in ({"input": x}, (x,), [x, x]):
        with pytest.raises(ConfigError, match=rf"x is a {type(given).__name__} of arrays \(Keras' several or named "
                                              r"inputs\), which is not taken"):
            _fit_counting(ef.Trainer(_model()), given, y)
        assert _fit_counting.began == 0
    with pytest.raises(ConfigError, match=r"a batch's third item is read as the mask: \(x, y, mask\); Keras' \(x, y, "
                                          r"sample_weight\) batches are not taken"):
        _fit_counting(ef.Trainer(_model()), [(x, y, np.ones(8, np.float32))])


@pytest.mark.parametrize("make, match", [
    (lambda: ef.Trainer(_model(), metrics=3), r"metrics must be a list of metric names or functions, got 3"),
    (lambda: ef.Trainer(_model(), decay="x"), r"decay must be a number in \[0, 1\), got 'x'"),
    (lambda: ef.Trainer(_model()).fit(*_data(), callbacks=ef.callbacks.TerminateOnNaN(), verbose=0),
     r"fit: callbacks must be a list, got one TerminateOnNaN; pass callbacks=\[TerminateOnNaN\(...\)\]"),
    (lambda: ef.Trainer(_model()).evaluate(*_data(), callbacks=5, verbose=0),
     r"evaluate: callbacks must be a list of callbacks, got 5"),
    (lambda: ef.Trainer(_model()).predict(_data()[0], callbacks=ef.callbacks.TerminateOnNaN(), verbose=0),
     r"predict: callbacks must be a list, got one TerminateOnNaN"),
], ids=["metrics", "decay", "fit-callbacks", "evaluate-callbacks", "predict-callbacks"])
def test_arguments_of_the_wrong_kind_get_a_config_error_naming_them(make, match):
    """Each raised Python's "object is not iterable" or "could not convert string to
    float" (the decay at the first fit)."""
    with pytest.raises(ConfigError, match=match):
        make()


def test_negative_categorical_targets_and_a_mask_marking_no_step_are_refused():
    """One-hot minus one trained a loss falling to -23 over three epochs; an all-False
    mask logged a loss of 0 while nothing was learned."""
    x, y = _data()
    onehot = np.eye(2, dtype=np.float32)[y]
    with pytest.raises(ShapeError, match=r"y: categorical_crossentropy takes probabilities \(one-hot or soft labels, "
                                         r"each >= 0\), got values down to -1"):
        _fit_counting(ef.Trainer(_model(), loss="categorical_crossentropy"), x, onehot - 1, batch_size=8)
    assert _fit_counting.began == 0
    with pytest.raises(ShapeError, match=r"mask marks no step of any sequence as real \(all False\)"):
        _fit_counting(ef.Trainer(_model(), loss_on="mask"), x, y, batch_size=8, mask=np.zeros(x.shape[:2], bool))
    assert _fit_counting.began == 0
    with pytest.raises(ShapeError, match=r"mask marks no step"):
        ef.Trainer(_model(), loss_on="mask").evaluate(x, y, mask=np.zeros(x.shape[:2], bool), verbose=0)


@pytest.mark.parametrize("call, match", [
    (lambda t, x, y: t.fit(x, y, batch_size=5, drop_remainder="no", verbose=0),
     r"drop_remainder must be True or False"),
    (lambda t, x, y: t.predict(x, last_only="no", verbose=0), r"predict: last_only must be True or False"),
    (lambda t, x, y: t.evaluate(x, y, return_dict="yes", verbose=0), r"return_dict must be True or False"),
    (lambda t, x, y: ef.Trainer(_model(), time_major="yes"), r"time_major must be True or False"),
    (lambda t, x, y: ef.Trainer(_model(), update_every=True), r"update_every must be a positive int or None"),
], ids=["drop_remainder", "last_only", "return_dict", "time_major", "update_every"])
def test_a_string_or_bool_where_a_flag_or_count_goes_is_refused(call, match):
    """Truthy strings were read as True (drop_remainder="no" dropped the last batch) and
    update_every=True as 1."""
    x, y = _data()
    with pytest.raises(ConfigError, match=match):
        call(ef.Trainer(_model()), x, y)


def test_update_every_takes_a_numpy_int_as_epochs_do():
    assert ef.Trainer(_model(), algo="d_rtrl", update_every=np.int64(5)).update_every == 5


def test_a_mask_padded_in_front_warns_and_one_warm_up_for_all_does_not():
    """Keras' pad_sequences pads in front; the model runs through the padded steps, so
    what they hold moved the loss (0.624 with zeros, 0.679 with 3.0) without a word."""
    import warnings

    from etrace_fit.training.data import check_mask

    x = np.zeros((3, 6, 2))
    front = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]], bool)
    with pytest.warns(UserWarning, match=r"mask: every sequence's real steps run to the last step, from steps 0 to "
                                         r"2: padding in front\? .*padding='post'"):
        check_mask(front, x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_mask(front[:, ::-1], x)  # padded at the end
        check_mask(np.repeat(front[:1], 3, axis=0), x)  # the same warm-up for every sequence
        check_mask(front | np.array([1, 0, 0, 0, 0, 0], bool), x)  # a loss on chosen steps


# ------------------------------------------------------------------ integers without a feature axis
@pytest.mark.parametrize("call", ["fit", "validation_data", "batches", "evaluate", "predict", "train_on_batch",
                                  "test_on_batch", "predict_on_batch"])
def test_integer_x_without_a_feature_axis_is_no_token_ids_for_a_model_without_an_embedding(call):
    """An integer x (batch, time) was read as Embedding ids whatever the first layer was:
    with batch_size equal to Linear(4, 8)'s input size (4), each step's (4,) row went in
    as features and fit trained on it silently."""
    x, y = _data()
    ids = (x[..., 0] > 0).astype(np.int32)  # (16, 12): one channel's spikes, its feature axis squeezed away
    trainer = ef.Trainer(_model())
    calls = {
        "fit": lambda: _fit_counting(trainer, ids, y, batch_size=4),
        "validation_data": lambda: _fit_counting(trainer, x, y, batch_size=4, validation_data=(ids, y)),
        "batches": lambda: _fit_counting(trainer, [(ids[:4], y[:4])]),
        "evaluate": lambda: trainer.evaluate(ids, y, batch_size=4, verbose=0),
        "predict": lambda: trainer.predict(ids, batch_size=4, verbose=0),
        "train_on_batch": lambda: trainer.train_on_batch(ids[:4], y[:4]),
        "test_on_batch": lambda: trainer.test_on_batch(ids[:4], y[:4]),
        "predict_on_batch": lambda: trainer.predict_on_batch(ids[:4]),
    }
    name = "validation_data x" if call == "validation_data" else "x"
    with pytest.raises(ShapeError, match=rf"{name} of shape \((16|4), 12\) \(int32\) is \(batch, time\) without a "
                                         r"feature axis; .*the model's first layer, Sequential.layers\[0\] Linear\(4, "
                                         r"8\), expects \(batch, time, 4\)\. Add a trailing feature axis \(x\[\.\.\., "
                                         r"None\] for one feature\), or put an Embedding first for token ids"):
        calls[call]()
    if call in ("fit", "validation_data", "batches"):
        assert _fit_counting.began == 0
    assert _fit_counting(trainer, np.repeat(ids[..., None], C, axis=-1), y, batch_size=4) == 4  # with features


def test_a_first_layer_of_yours_may_still_read_integer_x_its_own_way():
    """Whether a module of yours takes ids cannot be told: its (batch, time) integers go
    in as before."""

    class OneHot(brainstate.nn.Module):
        def update(self, ids):
            return jax.nn.one_hot(ids, C)

    x, y = _data()
    ids = np.random.default_rng(0).integers(0, C, (len(x), T)).astype(np.int32)
    model = ef.Sequential(OneHot(), *_model().layers)
    assert _fit_counting(ef.Trainer(model), ids, y, batch_size=8) == 2


def test_token_ids_with_a_trailing_axis_of_one_name_the_fix():
    """Embedding ids (batch, time, 1) raised JAX's "Cannot concatenate arrays with
    different numbers of dimensions" from inside the model."""
    x, y = _data()
    ids = np.random.default_rng(0).integers(0, 10, (len(x), T)).astype(np.int32)
    trainer = ef.Trainer(ef.Sequential(ef.layers.Embedding(10, 4), ef.layers.GRUCell(4, 8), ef.layers.Linear(8, 2)))
    with pytest.raises(ShapeError, match=r"x of shape \(16, 12, 1\) \(int32\): the model's first layer, "
                                         r"Sequential.layers\[0\] Embedding\(10, 4\), takes token ids \(batch, time\) "
                                         r"as Keras' Embedding does, not \(batch, time, 1\); drop the trailing axis: "
                                         r"x\[\.\.\., 0\]"):
        _fit_counting(trainer, ids[..., None], y, batch_size=4)
    assert _fit_counting.began == 0
    with pytest.raises(ShapeError, match=r"drop the trailing axis"):
        trainer.predict(ids[..., None], verbose=0)
    assert _fit_counting(trainer, ids, y, batch_size=4) == 4  # (batch, time) ids train


# ------------------------------------------------------------------ validation batches in memory
@pytest.mark.parametrize("make, error, match", [
    (lambda xv, yv: [(xv, yv), (xv, yv + 7)], ShapeError,
     r"validation_data batch 1: y: labels must lie in \[0, 2\) for a model with 2 outputs, got values from 7 to 8"),
    (lambda xv, yv: [(np.full_like(xv, np.nan), yv)], ShapeError,
     r"validation_data batch 0: x contains NaN or inf \(first in sample 0\)"),
    (lambda xv, yv: [(xv[:, :, :3], yv)], ShapeError,
     r"validation_data batch 0: Sequential.layers\[0\] Linear\(4, 8\): expected input with 4 features on the last "
     r"axis, got x.shape=\(4, 3\)"),
    (lambda xv, yv: [(xv, yv.astype(np.float32))], ShapeError,
     r"validation_data batch 0: y: cross_entropy needs integer class labels, got dtype float32"),
    (lambda xv, yv: ((xv, yv), xv), ShapeError, r"validation_data batch 1 must be \(x, y\) or \(x, y, mask\), got "
                                                r"ndarray"),
    (lambda xv, yv: [(xv, yv[:3])], ShapeError,
     r"validation_data batch 0: x of shape \(4, 12, 4\) is read as \(batch, time, ...\): 4 sequences of 12 steps, "
     r"but y has shape \(3,\)"),
], ids=["labels", "nan", "features", "float-labels", "not-a-batch", "lengths"])
def test_a_list_of_validation_batches_is_checked_before_training_and_named(make, error, match):
    """A list (or tuple) of validation batches is in memory: it was checked only at the
    first validation, after an epoch had trained, and its errors read "x of batch 0" as
    if they were the training data's."""
    x, y = _data()
    xv, yv = _data(4, seed=1)
    with pytest.raises(error, match=match):
        _fit_counting(ef.Trainer(_model()), x, y, batch_size=4, epochs=2, validation_data=make(xv, yv))
    assert _fit_counting.began == 0


def test_a_validation_generator_is_checked_as_it_is_read_and_its_errors_name_validation_data():
    x, y = _data()
    xv, yv = _data(8, seed=1)
    bad = ((a, b) for a, b in [(xv[:4], yv[:4]), (xv[4:], yv[4:] + 7)])
    with pytest.raises(ShapeError, match=r"validation_data batch 1: y: labels must lie in \[0, 2\)"):
        _fit_counting(ef.Trainer(_model()), x, y, batch_size=4, validation_data=bad)
    assert _fit_counting.began == 4  # a generator is read when validation runs, after the epoch
    with pytest.raises(ShapeError, match=r"validation_data batch 0: x contains NaN"):
        _fit_counting(ef.Trainer(_model()), x, y, batch_size=4, validation_data=iter([(xv * np.nan, yv)]))
    with pytest.raises(ShapeError, match=r"^y of batch 0: labels must lie"):  # evaluate's own data: as it was
        ef.Trainer(_model()).evaluate(iter([(xv, yv + 7)]), verbose=0)


# ------------------------------------------------------------------ per-step weights, x and y in one tuple
def test_a_per_step_sample_weight_under_loss_on_last_is_refused_with_the_fixes():
    """Under loss_on="last" every column of an (N, T) sample_weight but the last was
    ignored without a word (a per-step mask there is refused alike)."""
    x, y = _data()
    weights = np.ones((len(x), T), np.float32)
    weights[:, -1] = 0.0
    fixes = (r"sample_weight has shape \(16, 12\), a weight per sequence and step, but loss_on='last' ignores all "
             r"but the last step's; give one weight per sequence, \(N,\), or use "
             r"Trainer\(loss_on='all'\) \(every step\) or Trainer\(loss_on='mask'\)")
    with pytest.raises(ConfigError, match=fixes):
        _fit_counting(ef.Trainer(_model()), x, y, batch_size=8, sample_weight=weights)
    assert _fit_counting.began == 0
    with pytest.raises(ConfigError, match=fixes):
        ef.Trainer(_model()).evaluate(x, y, sample_weight=weights, verbose=0)
    with pytest.raises(ConfigError, match=r"train_on_batch: sample_weight has shape \(8, 12\)"):
        ef.Trainer(_model()).train_on_batch(x[:8], y[:8], sample_weight=weights[:8])
    with pytest.raises(ConfigError, match=fixes):  # named whole, before the split
        _fit_counting(ef.Trainer(_model()), x, y, batch_size=8, sample_weight=weights, validation_split=0.25)
    assert _fit_counting(ef.Trainer(_model(), loss_on="all"), x, y, batch_size=8, sample_weight=weights) == 2
    assert _fit_counting(ef.Trainer(_model()), x, y, batch_size=8, sample_weight=weights[:, :1]) == 2  # Keras' (N, 1)


@pytest.mark.parametrize("call, fix", [
    ("fit", r"pass x and y separately: fit\(x, y\) \(a list of \(x, y\) batches is read batch by batch\)"),
    ("predict", r"pass x alone: predict\(x\) \(y is not read; a list of x batches is read batch by batch\)"),
])
def test_x_and_y_in_one_tuple_are_named_with_the_fix(call, fix):
    """fit((x, y)) and predict((x, y)) read the tuple as a list of two batches: "batch 0
    must be (x, y)", or "x must be (batch, time, features) ... got shape (16,)"."""
    x, y = _data()
    trainer = ef.Trainer(_model())
    run = (lambda data: _fit_counting(trainer, data)) if call == "fit" else (lambda data: trainer.predict(data,
                                                                                                         verbose=0))
    with pytest.raises(ConfigError, match=r"x is a tuple of arrays \(\(16, 12, 4\), \(16,\)\), which looks like "
                                          r"\(x, y\); " + fix):
        run((x, y))
    with pytest.raises(ConfigError, match=r"x is a list of arrays .*which looks like \(x, y, sample_weight\)"):
        run([x, y, np.ones(len(x), np.float32)])
    if call == "predict":  # a list of x batches is still taken
        assert trainer.predict([x[:8], x[8:]], verbose=0).shape == (16, 2)
    else:
        assert _fit_counting(trainer, [(x[:8], y[:8]), (x[8:], y[8:])]) == 2

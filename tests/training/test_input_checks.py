"""Bad input fails before training, naming the argument (issue 13, "Silent acceptance" and
"Late or raw errors"). Each test gives one bad input the issue lists and checks the
exception type, the message, and that no training batch ran (or, for data that arrives
batch by batch, that the bad batch did not)."""

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


def _fit_counting(trainer, *args, **kwargs):
    """``fit`` with a callback counting the batches that began; returns the count."""
    began = []
    counter = LambdaCallback(on_train_batch_begin=lambda b, logs: began.append(b))
    try:
        trainer.fit(*args, callbacks=[counter], verbose=0, **kwargs)
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
    with pytest.raises(ShapeError, match=r"validation y: labels must lie in \[0, 2\).*from -1"):
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

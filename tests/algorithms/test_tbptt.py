"""Truncated BPTT (``algo=TBPTT(k)`` / ``"tbptt:k"``), a sequence-level algorithm in the
registry beside BPTT: against a reference written here (each window's loss
differentiated by ``brainstate.transform.grad`` from the state the last window left,
float64), TBPTT(k >= T) against BPTT, memory flat in T, the Trainer, and its errors."""

from __future__ import annotations

import warnings

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.algorithms import TBPTT
from etrace_fit.errors import ConfigError

B = 3


def loss(out, y):
    return jnp.sum((out - y) ** 2)


def model():
    brainstate.random.seed(0)
    net = ef.Sequential(L.GRUCell(3, 6), L.Linear(6, 2))
    brainstate.nn.init_all_states(net, batch_size=B)
    return net


def data(steps, seed=0):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.normal(size=(steps, B, 3))), jnp.asarray(rng.normal(size=(steps, B, 2)))


def reference(net, xs, ys, window):
    """Σ over windows of the gradient of the window's loss, the window starting from the
    states the previous window ended in (no gradient through them)."""
    params = net.states(brainstate.ParamState)
    hidden = net.states(brainstate.HiddenState)
    brainstate.nn.reset_all_states(net, batch_size=B)
    total = None
    for start in range(0, xs.shape[0], window):
        piece_x, piece_y = xs[start:start + window], ys[start:start + window]
        saved = {path: state.value for path, state in hidden.items()}

        def window_loss():
            for path, state in hidden.items():
                state.value = saved[path]
            outs = brainstate.transform.for_loop(net, piece_x)
            return jax.vmap(loss)(outs, piece_y).sum()

        grads = brainstate.transform.grad(window_loss, grad_states=params)()
        for path, state in hidden.items():  # move the states on without a gradient
            state.value = saved[path]
        brainstate.transform.for_loop(net, piece_x)
        total = grads if total is None else jax.tree.map(jnp.add, total, grads)
    return total


def flat(grads):
    return np.concatenate([np.ravel(np.asarray(v)) for v in jax.tree.leaves(grads)])


@pytest.mark.parametrize("steps, window", [(24, 6), (23, 5), (20, 1)])
def test_truncated_bptt_equals_the_windowed_reference(steps, window):
    with brainstate.environ.context(precision=64, dt=1.0):
        net = model()
        xs, ys = data(steps)
        expected = reference(net, xs, ys, window)
        for algo in (TBPTT(window), f"tbptt:{window}"):
            brainstate.nn.reset_all_states(net, batch_size=B)  # every run starts from rest
            grads, losses = ef.sequence_grad(net, xs, ys, loss, algo=algo)
            np.testing.assert_allclose(flat(grads), flat(expected), rtol=1e-10, atol=1e-12)
            assert losses.shape == (steps,)
        brainstate.nn.reset_all_states(net, batch_size=B)
        full, _ = ef.sequence_grad(net, xs, ys, loss, algo="bptt")
        assert not np.allclose(flat(grads), flat(full))  # the truncation is real


def test_a_window_as_long_as_the_sequence_is_bptt():
    with brainstate.environ.context(precision=64, dt=1.0):
        net = model()
        xs, ys = data(16)
        expected = reference(net, xs, ys, 16)  # one window: the whole sequence
        for window in (16, 40):
            brainstate.nn.reset_all_states(net, batch_size=B)
            grads, _ = ef.sequence_grad(net, xs, ys, loss, algo=TBPTT(window))
            np.testing.assert_allclose(flat(grads), flat(expected), rtol=1e-10, atol=1e-12)


def test_memory_grows_with_the_window_not_with_the_sequence():
    net = model()
    temps = {}
    with brainstate.environ.context(dt=1.0):
        for algo in ("bptt", "tbptt:10"):
            learner = ef.compile(net, data(1)[0][0], loss, algo=algo)
            for steps in (100, 1000):
                xs, ys = data(steps)
                compiled = learner.compiled(xs, ys)
                args = (compiled.weight_leaves(), compiled.state_leaves(), [xs], ys)
                temps[algo, steps] = compiled.run.lower(*args).compile().memory_analysis().temp_size_in_bytes
    assert temps["bptt", 1000] > 5 * temps["bptt", 100]
    assert temps["tbptt:10", 1000] <= 1.05 * temps["tbptt:10", 100] + 64 * 1024


def test_the_trainer_trains_with_truncated_bptt_and_saves_it_by_name(tmp_path):
    x = np.random.default_rng(0).normal(size=(16, 12, 3)).astype(np.float32)
    y = np.arange(16) % 2
    with brainstate.environ.context(dt=1.0):
        trainer = ef.Trainer(ef.Sequential(L.GRUCell(3, 6), L.Linear(6, 2)), algo="tbptt:4",
                             optimizer=optax.adam(1e-2), loss_on="all")
        history = trainer.fit(x, y, batch_size=8, epochs=3, verbose=0)
        assert history.history["loss"][-1] < history.history["loss"][0]
        assert "tbptt:4" in trainer.summary(print_fn=None)
        assert "truncated every 4 steps" in trainer.report()
        trainer.save(tmp_path / "t.ckpt")
        loaded = ef.Trainer.load(tmp_path / "t.ckpt", ef.Sequential(L.GRUCell(3, 6), L.Linear(6, 2)),
                                 optimizer=optax.adam(1e-2))
        assert loaded.algo == "tbptt:4"


def test_bad_truncations_fail_with_the_fix():
    with pytest.raises(ConfigError, match="needs a window of steps: algo='tbptt:50'"):
        ef.Trainer(ef.Sequential(L.Linear(3, 2)), algo="tbptt")
    with pytest.raises(ConfigError, match="TBPTT: window must be a positive int"):
        TBPTT(0)
    with pytest.raises(ConfigError, match="update_every needs an online rule"):
        ef.Trainer(ef.Sequential(L.Linear(3, 2)), algo=TBPTT(5), update_every=5)
    with pytest.raises(ConfigError, match="'tbptt:<window>'"):
        ef.Trainer(ef.Sequential(L.Linear(3, 2)), algo="tbtpt")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a sequence-level algo plans nothing: no ApproximationWarning
        with brainstate.environ.context(dt=1.0):
            learner = ef.compile(model(), data(1)[0][0], loss, algo=TBPTT(5))
    assert learner.plan is None and learner.rules == {}

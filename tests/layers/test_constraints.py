"""Keras' constraints: a :class:`~etrace_fit.layers.Constrained` weight is projected back
after every optimizer update (the Trainer's step under every rule, ``update_every``
inside the sequence, ``ef.online_fit``), and a learned time constant is one: it stays
at or above ``TAU_MIN_STEPS · dt``. Before, a gradient step took a LIF's τ from 2 to
-7.9 (a decay of 1.13 a step), unwarned."""

from __future__ import annotations

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import saiunit as u

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.errors import ConfigError
from etrace_fit.layers.base import TAU_MIN_STEPS

from ._helpers import fit_inside_sequence

C, H, T, N = 3, 5, 6, 8
STEP = 100.0  # every update takes this much off every weight: each learned τ would go negative


def _down():
    """An optimizer whose every update is -STEP (a stand-in for an oversized step)."""
    return optax.GradientTransformation(lambda params: optax.EmptyState(),
                                        lambda g, state, params=None: (jax.tree.map(
                                            lambda x: jnp.full_like(x, -STEP), g), state))


def _data():
    rng = np.random.default_rng(0)
    return (rng.random((N, T, C)) < 0.4).astype(np.float32), rng.integers(0, 2, N)


def _model():
    return ef.Sequential(L.Linear(C, H), L.ALIF(H, tau=4.0, tau_a=20.0, learn_tau=True, learn_tau_a=True),
                         L.ExpSynapse(H, tau=3.0, learn_tau=True), L.LeakyRateReadout(H, 2, tau=5.0, learn_tau=True))


def _taus(model):
    return {name: np.asarray(value) for name, value in (
        ("alif.tau", model.layers[1].tau.value), ("alif.tau_a", model.layers[1].tau_a.value),
        ("synapse.tau", model.layers[2].tau.value), ("readout.tau", model.layers[3].tau.value))}


def _assert_floored(model, before_weight):
    for name, tau in _taus(model).items():
        np.testing.assert_allclose(tau, TAU_MIN_STEPS * 1.0, rtol=1e-6, err_msg=name)
    # an unconstrained weight took the whole step
    np.testing.assert_allclose(np.asarray(model.layers[0].weight.value["weight"]), before_weight - STEP, rtol=1e-5)


@pytest.mark.parametrize("algo", ["d_rtrl", "esd_rtrl", "hybrid", "bptt"])
def test_every_learned_time_constant_stays_positive_after_a_trainer_update(algo):
    x, y = _data()
    with brainstate.environ.context(dt=1.0):
        model = _model()
        weight = np.asarray(model.layers[0].weight.value["weight"])
        trainer = ef.Trainer(model, algo=algo, optimizer=_down(), loss_on="last")
        with np.errstate(all="ignore"):
            trainer.fit(x, y, batch_size=N, epochs=1, verbose=0, shuffle=False)
        assert all(isinstance(layer.tau, L.Constrained) for layer in model.layers[1:])
        _assert_floored(model, weight)


def test_update_every_and_online_fit_apply_the_constraint_inside_the_sequence():
    x, y = _data()
    with brainstate.environ.context(dt=1.0):
        fit_inside_sequence(_model, _down(), x, y, lambda model: np.asarray(model.layers[0].weight.value["weight"]),
                            _assert_floored)


def test_the_floor_is_in_the_time_constants_unit():
    """dt in ms and τ in ms: the floor is TAU_MIN_STEPS · dt, a quantity in τ's unit."""
    x, y = _data()
    with brainstate.environ.context(dt=0.5 * u.ms):
        model = ef.Sequential(L.Linear(C, H), L.LIF(H, tau=10.0 * u.ms, learn_tau=True), L.LeakyRateReadout(
            H, 2, tau=5.0 * u.ms))
        ef.Trainer(model, algo="d_rtrl", optimizer=_down(), loss_on="last").fit(x, y, batch_size=N, epochs=1,
                                                                               verbose=0)
        tau = model.layers[1].tau.value
    assert u.get_unit(tau) == u.ms
    np.testing.assert_allclose(np.asarray(u.get_mantissa(tau)), TAU_MIN_STEPS * 0.5, rtol=1e-6)


def test_a_time_constant_above_the_floor_is_left_alone():
    """The projection moves only what crossed the floor: a small step leaves every τ
    where the optimizer put it."""
    x, y = _data()
    with brainstate.environ.context(dt=1.0):
        model = _model()
        before = _taus(model)
        small = optax.GradientTransformation(lambda p: optax.EmptyState(), lambda g, s, p=None: (
            jax.tree.map(lambda v: jnp.full_like(v, -0.5), g), s))
        ef.Trainer(model, algo="d_rtrl", optimizer=small, loss_on="last").fit(x, y, batch_size=N, epochs=1,
                                                                              verbose=0)
    for name, tau in _taus(model).items():
        np.testing.assert_allclose(tau, before[name] - 0.5, rtol=1e-6, err_msg=name)


class Clipped(brainstate.nn.Module):
    """A user's layer holding a gain in [0, 1] as a Constrained weight."""

    def __init__(self, n):
        super().__init__()
        self.gain = L.Constrained(jnp.full((n,), 0.5), constraint=lambda g: jnp.clip(g, 0.0, 1.0))

    def update(self, x):
        return x * self.gain.value


def test_a_users_constrained_weight_is_projected_and_a_bad_constraint_refused():
    x, y = _data()
    with brainstate.environ.context(dt=1.0):
        model = ef.Sequential(L.Linear(C, H), Clipped(H), L.LIF(H), L.LeakyRateReadout(H, 2))
        ef.Trainer(model, algo="bptt", optimizer=_down(), loss_on="last").fit(x, y, batch_size=N, epochs=1,
                                                                              verbose=0)
        np.testing.assert_array_equal(np.asarray(model.layers[1].gain.value), np.zeros(H))
    with pytest.raises(ConfigError, match="Constrained: constraint must be callable"):
        L.Constrained(jnp.ones(2), constraint=0.5)

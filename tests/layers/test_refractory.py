"""Refractory periods of LIF / ALIF and their recurrent forms (etrace_fit/layers/spiking.py):
the forward pass against a plain-numpy reference, and every rule's gradient against BPTT."""

from __future__ import annotations


import brainstate
import jax.numpy as jnp
import numpy as np
import pytest

import etrace_fit as ef
from etrace_fit import layers as L

from ._helpers import sequence_grads

N, B, T, REF = 6, 3, 40, 3


def currents(seed=0):
    return np.random.default_rng(seed).standard_normal((T, B, N)) * 0.6 + 0.55


def reference(xs, *, tau, refractory, beta=None, tau_a=None, threshold=1.0):
    """Integrate, fire unless refractory, reset by subtraction at the next step; a spike
    at t silences the neuron for ``refractory`` steps (written independently)."""
    alpha = np.exp(-1.0 / tau)
    rho = None if tau_a is None else np.exp(-1.0 / tau_a)
    v, a, z, silent = (np.zeros((B, N)) for _ in range(4))
    out = []
    for x in xs:
        thr_prev = threshold + (0.0 if beta is None else beta * a)
        if rho is not None:
            a = rho * a + z
        v = alpha * (v - z * thr_prev) + x
        silent = np.where(z > 0, refractory, np.maximum(silent - 1, 0))
        thr = threshold + (0.0 if beta is None else beta * a)
        z = ((v > thr) & (silent == 0)).astype(np.float64)
        out.append(z)
    return np.stack(out)


def layer(kind, refractory=REF):
    if kind == "lif":
        return L.LIF(N, tau=6.0, refractory=refractory, surrogate="sigmoid"), {}
    return (L.ALIF(N, tau=6.0, tau_a=15.0, beta=0.3, refractory=refractory, surrogate="sigmoid"),
            dict(beta=0.3, tau_a=15.0))


@pytest.mark.parametrize("kind", ["lif", "alif"])
def test_spikes_follow_the_reference_and_keep_the_refractory_gap(kind):
    xs = currents()
    with brainstate.environ.context(precision=64, dt=1.0):
        neuron, extra = layer(kind)
        brainstate.nn.init_all_states(neuron, batch_size=B)
        spikes = np.asarray(brainstate.transform.for_loop(neuron, jnp.asarray(xs)))
        assert neuron.refractory_steps.value.dtype == jnp.int32
        np.testing.assert_array_equal(np.asarray(neuron.spikes()), spikes[-1])  # read off the stored state
        free, _ = layer(kind, refractory=0)
        brainstate.nn.init_all_states(free, batch_size=B)
        unlimited = np.asarray(brainstate.transform.for_loop(free, jnp.asarray(xs)))
    np.testing.assert_array_equal(spikes, reference(xs, tau=6.0, refractory=REF, **extra))
    np.testing.assert_array_equal(unlimited, reference(xs, tau=6.0, refractory=0, **extra))
    assert spikes.sum() < unlimited.sum() and spikes.mean() > 0.05
    for b in range(B):  # a spike at t allows the next one at t + REF + 1 at the earliest
        for n in range(N):
            times = np.flatnonzero(spikes[:, b, n])
            assert np.all(np.diff(times) > REF)
    assert not hasattr(free, "refractory_steps")  # no refractory period, no extra state


def _relative_error(got, ref):
    got, ref = np.ravel(np.asarray(got)), np.ravel(np.asarray(ref))
    return np.max(np.abs(got - ref)) / np.max(np.abs(ref))


def _cosine(got, ref):
    got, ref = np.ravel(np.asarray(got)), np.ravel(np.asarray(ref))
    return float(got @ ref / np.linalg.norm(got) / np.linalg.norm(ref))


@pytest.mark.parametrize("kind", ["lif", "alif"])
def test_every_rule_against_bptt_with_a_refractory_period(kind):
    """D-RTRL (and hybrid, which picks it) is exact: the recurrence stays per unit and
    the integer counter carries no gradient. ES-D-RTRL is the documented approximation
    (its trace assumes a constant decay); it must still point the same way."""
    rng = np.random.default_rng(5)
    with brainstate.environ.context(precision=64, dt=1.0):
        neuron, _ = layer(kind)
        model = ef.Sequential(L.Linear(4, N, w_init=rng.normal(0, 0.8, (4, N)), b_init=np.full(N, 0.4)), neuron,
                              L.Linear(N, 2, w_init=rng.normal(0, 1.0, (N, 2)), b_init=np.zeros(2)))
        brainstate.nn.init_all_states(model, batch_size=B)
        xs = jnp.asarray(rng.normal(0.4, 1.0, (T, B, 4)))
        ys = jnp.asarray(rng.normal(0, 1.0, (T, B, 2)))
        ref = sequence_grads(model, xs, ys, "reference")
        spikes, silent = brainstate.transform.for_loop(
            lambda x: (model(x), (neuron.spikes(), neuron.refractory_steps.value))[1], xs)
        got = {algo: sequence_grads(model, xs, ys, algo) for algo in ("d_rtrl", "hybrid", "esd_rtrl")}
    # The run spikes and its neurons spend steps refractory (else the test would not test it).
    assert float(jnp.mean(spikes)) > 0.05 and float(jnp.mean(silent > 0)) > 0.1
    for path in (("layers", 0, "weight"), ("layers", 2, "weight")):
        for key in ("weight", "bias"):
            assert np.max(np.abs(ref[path][key])) > 0
            for algo in ("d_rtrl", "hybrid"):
                assert _relative_error(got[algo][path][key], ref[path][key]) < 1e-8, (algo, path, key)
            assert _cosine(got["esd_rtrl"][path][key], ref[path][key]) > 0.95, (path, key)  # 0.98 measured


@pytest.mark.parametrize("cls", [L.RecurrentLIF, L.RecurrentALIF])
def test_recurrent_layers_take_a_refractory_period_and_stay_exact_without_recurrent_rows(cls):
    rng = np.random.default_rng(2)
    with brainstate.environ.context(precision=64, dt=1.0):
        w = rng.normal(0, 0.9, (4 + N, N))
        w[4:] = 0.0  # no recurrence: per unit only, where D-RTRL is exact
        rnn = cls(4, N, tau=6.0, refractory=2, w_init=w, b_init=np.full(N, 0.3), surrogate="sigmoid")
        model = ef.Sequential(rnn, L.Linear(N, 2, w_init=rng.normal(0, 1.0, (N, 2)), b_init=np.zeros(2)))
        brainstate.nn.init_all_states(model, batch_size=B)
        xs = jnp.asarray(rng.normal(0.5, 1.0, (T, B, 4)))
        ys = jnp.asarray(rng.normal(0, 1.0, (T, B, 2)))
        spikes = np.asarray(brainstate.transform.for_loop(lambda x: (model(x), rnn.spikes())[1], xs))
        ref, got = sequence_grads(model, xs, ys, "reference"), sequence_grads(model, xs, ys, "d_rtrl")
    assert spikes.mean() > 0.05
    for b in range(B):
        for n in range(N):
            assert np.all(np.diff(np.flatnonzero(spikes[:, b, n])) > 2)
    path = ("layers", 0, "W", "weight")
    assert np.max(np.abs(ref[path]["weight"][4:])) > 0  # the recurrent rows still learn
    for key in ("weight", "bias"):
        assert _relative_error(got[path][key], ref[path][key]) < 1e-8, key


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_a_bad_refractory_period_names_the_layer(bad):
    with pytest.raises(ef.ConfigError, match=r"LIF\(4\): refractory must be an int >= 0.*got"):
        L.LIF(4, refractory=bad)

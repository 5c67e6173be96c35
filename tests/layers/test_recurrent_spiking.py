"""RecurrentLIF and RecurrentALIF (etrace_fit/layers/spiking.py): the forward pass
against a plain-jnp reference, online gradients against BPTT, and their errors."""

from __future__ import annotations


import brainstate
import jax.numpy as jnp
import numpy as np
import pytest

import etrace_fit as ef
from etrace_fit import layers as L

from ._helpers import sequence_grads

I, N, B, T = 3, 5, 2, 25


def rand(seed, *shape, scale=1.0, shift=0.0):
    return np.random.default_rng(seed).standard_normal(shape) * scale + shift


def reference_spikes(w, b, xs, *, tau, beta=None, tau_a=None, threshold=1.0):
    """Plain-jnp e-prop dynamics (soft reset, reset applied at the next step)."""
    alpha = np.exp(-1.0 / tau)
    rho = None if tau_a is None else np.exp(-1.0 / tau_a)
    v = np.zeros((B, N))
    a = np.zeros((B, N))
    z_prev = np.zeros((B, N))
    out = []
    for x in xs:
        thr_prev = threshold + (0.0 if beta is None else beta * a)
        if rho is not None:
            a = rho * a + z_prev
        v = alpha * (v - z_prev * thr_prev) + np.concatenate([x, z_prev], axis=-1) @ w + b
        thr = threshold + (0.0 if beta is None else beta * a)
        z_prev = (v > thr).astype(np.float64)
        out.append(z_prev)
    return np.stack(out)


def build(kind):
    w, b = rand(0, I + N, N, scale=0.9), rand(1, N, scale=0.3, shift=0.2)
    if kind == "lif":
        return L.RecurrentLIF(I, N, tau=8.0, w_init=w, b_init=b, surrogate="sigmoid"), w, b, {}
    return (L.RecurrentALIF(I, N, tau=8.0, tau_a=20.0, beta=0.4, w_init=w, b_init=b, surrogate="sigmoid"), w, b,
            dict(beta=0.4, tau_a=20.0))


@pytest.mark.parametrize("kind", ["lif", "alif"])
def test_forward_matches_the_plain_reference(kind):
    with brainstate.environ.context(precision=64, dt=1.0):
        layer, w, b, extra = build(kind)
        brainstate.nn.init_all_states(layer, batch_size=B)
        xs = jnp.asarray(rand(2, T, B, I, scale=1.0, shift=0.3))
        spikes = np.asarray(brainstate.transform.for_loop(layer, xs))
    expected = reference_spikes(w, b, np.asarray(xs), tau=8.0, **extra)
    assert 0.05 < expected.mean() < 0.7
    np.testing.assert_array_equal(spikes, expected)


@pytest.mark.parametrize("kind", ["lif", "alif"])
def test_d_rtrl_is_exact_without_recurrent_rows_and_close_with_them(kind):
    with brainstate.environ.context(precision=64, dt=1.0):
        layer, _, _, _ = build(kind)
        model = ef.Sequential(layer, L.Linear(N, 2, w_init=rand(3, N, 2), b_init=np.zeros(2)))
        brainstate.nn.init_all_states(model, batch_size=B)
        xs = jnp.asarray(rand(2, T, B, I, shift=0.3))
        ys = jnp.asarray(rand(4, T, B, 2))
        path = ("layers", 0, "W", "weight")
        got, ref = sequence_grads(model, xs, ys, "d_rtrl")[path], sequence_grads(model, xs, ys, "reference")[path]
        cos = float(np.dot(np.ravel(got["weight"]), np.ravel(ref["weight"]))
                    / np.linalg.norm(got["weight"]) / np.linalg.norm(ref["weight"]))
        assert 0.5 < cos < 1 - 1e-6  # approximate: dense recurrence through z^{t-1}
        _, plan = ef.algorithms.plan_for(model, xs, ys, lambda o, y: jnp.sum(o), algo="d_rtrl")
        assert "dense recurrence" in plan.approximations()["layers.0.W.weight"][0]

        weights = dict(layer.W.weight.value)
        weights["weight"] = weights["weight"].at[I:].set(0.0)  # no recurrence: per-unit only
        layer.W.weight.value = weights
        got, ref = sequence_grads(model, xs, ys, "d_rtrl")[path], sequence_grads(model, xs, ys, "reference")[path]
    for key in ("weight", "bias"):
        scale = np.max(np.abs(ref[key]))
        assert scale > 0 and np.max(np.abs(np.asarray(got[key]) - np.asarray(ref[key]))) / scale < 1e-8, key
    assert np.max(np.abs(ref["weight"][I:])) > 0  # the recurrent rows still learn


@pytest.mark.parametrize("kind", ["lif", "alif"])
def test_without_self_connections_the_diagonal_is_cut_and_never_learns(kind):
    with brainstate.environ.context(precision=64, dt=1.0):
        w, b = rand(0, I + N, N, scale=0.9), rand(1, N, scale=0.3, shift=0.2)
        extra = {} if kind == "lif" else dict(beta=0.4, tau_a=20.0)
        cls = L.RecurrentLIF if kind == "lif" else L.RecurrentALIF
        layer = cls(I, N, tau=8.0, w_init=w, b_init=b, surrogate="sigmoid", self_connections=False, **extra)
        brainstate.nn.init_all_states(layer, batch_size=B)
        xs = jnp.asarray(rand(2, T, B, I, scale=1.0, shift=0.3))
        spikes = np.asarray(brainstate.transform.for_loop(layer, xs))
        cut = w.copy()
        cut[I:][np.diag_indices(N)] = 0.0
        expected = reference_spikes(cut, b, np.asarray(xs), tau=8.0, **extra)
        assert 0.05 < expected.mean() < 0.7
        np.testing.assert_array_equal(spikes, expected)
        assert not np.array_equal(expected, reference_spikes(w, b, np.asarray(xs), tau=8.0, **extra))
        assert "self_connections=False" in repr(layer)

        model = ef.Sequential(layer, L.Linear(N, 2, w_init=rand(3, N, 2), b_init=np.zeros(2)))
        ys = jnp.asarray(rand(4, T, B, 2))
        path = ("layers", 0, "W", "weight")
        reference = np.asarray(sequence_grads(model, xs, ys, "reference")[path]["weight"])
        assert np.all(reference[I:][np.diag_indices(N)] == 0.0) and np.max(np.abs(reference)) > 0
        for algo in ("d_rtrl", "esd_rtrl", "hybrid"):
            got = np.asarray(sequence_grads(model, xs, ys, algo)[path]["weight"])
            assert np.all(got[I:][np.diag_indices(N)] == 0.0), algo
            cos = np.dot(got.ravel(), reference.ravel()) / np.linalg.norm(got) / np.linalg.norm(reference)
            assert cos > 0.5, (algo, cos)


def test_errors_name_the_layer():
    with brainstate.environ.context(dt=1.0):
        with pytest.raises(ef.ConfigError, match=r"RecurrentALIF: self_connections must be True or False, got 0"):
            L.RecurrentALIF(3, 4, self_connections=0)
        with pytest.raises(ef.ConfigError, match=r"RecurrentLIF: size must be an int"):
            L.RecurrentLIF(3, (2, 2))
        layer = L.RecurrentALIF(3, 4)
        brainstate.nn.init_all_states(layer, batch_size=2)
        with pytest.raises(ef.ShapeError, match=r"RecurrentALIF\(3, 4\).*expected input with 3 features.*\(2, 5\)"):
            layer(jnp.ones((2, 5)))
    assert isinstance(layer, L.SpikingLayer) and layer.spikes().shape == (2, 4)

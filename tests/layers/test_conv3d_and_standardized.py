"""Conv3d (against a numpy loop written here) and weight-standardised weights; both
trained exactly by D-RTRL when they drive neurons directly (float64, against BPTT)."""

from __future__ import annotations

import itertools
import warnings

import brainstate
import jax.numpy as jnp
import numpy as np
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit import ops
from etrace_fit.errors import ShapeError

from ._helpers import check_grads_equal, sequence_grads


def _conv3d_valid(x, w, b):
    """``y[n, d, h, v, o] = Σ x[n, d+i, h+j, v+k, c] w[i, j, k, c, o] + b[o]`` by loops."""
    kd, kh, kw, _, c_out = w.shape
    n, d, h, v, _ = x.shape
    out = np.zeros((n, d - kd + 1, h - kh + 1, v - kw + 1, c_out))
    for a, bb, c in itertools.product(range(out.shape[1]), range(out.shape[2]), range(out.shape[3])):
        patch = x[:, a:a + kd, bb:bb + kh, c:c + kw, :]
        out[:, a, bb, c, :] = np.einsum("nijkc,ijkco->no", patch, w) + b
    return out


def test_conv3d_is_the_valid_correlation_channels_last(env64):
    rng = np.random.default_rng(0)
    w, b = rng.normal(size=(2, 3, 2, 3, 4)), rng.normal(size=(4,))
    layer = L.Conv3d(3, 4, kernel_size=(2, 3, 2), padding="VALID", w_init=w, b_init=b)
    x = rng.normal(size=(2, 4, 5, 3, 3))
    np.testing.assert_allclose(np.asarray(layer(jnp.asarray(x))), _conv3d_valid(x, w, b), rtol=1e-12, atol=1e-12)
    assert layer(jnp.asarray(x[0])).shape == (3, 3, 2, 4)  # unbatched


def test_conv3d_shapes_are_checked_naming_the_layer():
    with pytest.raises(ShapeError, match=r"Conv3d\(3, 4.*expected channels-last input \(B, D, H, W, C\)"):
        L.Conv3d(3, 4, kernel_size=2)(jnp.ones((2, 5, 3)))  # neither (B, D, H, W, C) nor (D, H, W, C)


def _exact_online(model, xs, ys, algo):
    reference = sequence_grads(model, xs, ys, "reference")
    brainstate.nn.reset_all_states(model, batch_size=xs.shape[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error", ef.ApproximationWarning)  # the compiler finds nothing approximate
        grads = ef.sequence_grad(model, xs, ys, lambda out, y: jnp.sum((out - y) ** 2), algo=algo)[0]
    check_grads_equal(grads, reference, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("algo", ["d_rtrl", "hybrid"])
def test_conv3d_driving_neurons_is_exact_online(env64, algo):
    rng = np.random.default_rng(1)
    model = ef.Sequential(L.Conv3d(2, 3, kernel_size=2, w_init=rng.normal(0, 0.8, (2, 2, 2, 2, 3))),
                          L.LIF((3, 3, 3, 3), tau=4.0, v_threshold=0.5), L.Flatten(), L.Linear(81, 2))
    brainstate.nn.init_all_states(model, batch_size=2)
    xs = jnp.asarray(rng.random((8, 2, 3, 3, 3, 2)))
    ys = jnp.asarray(rng.normal(size=(8, 2, 2)))
    _exact_online(model, xs, ys, algo)


def test_standardized_weights_have_zero_mean_and_unit_variance_per_output():
    w = np.random.default_rng(2).normal(3.0, 2.0, size=(3, 3, 4, 5))
    s = np.asarray(ops.Standardized(eps=0.0)(jnp.asarray(w)))
    np.testing.assert_allclose(s.mean(axis=(0, 1, 2)), 0.0, atol=1e-6)
    np.testing.assert_allclose(s.var(axis=(0, 1, 2)), 1.0, rtol=1e-5)


@pytest.mark.parametrize("algo", ["d_rtrl", "hybrid"])
def test_a_standardized_linear_driving_neurons_is_exact_online(env64, algo):
    """The gradient reaches the raw weight through the standardisation (every entry
    of a column moves its statistics): still exact, mapped back through the weight
    function."""
    rng = np.random.default_rng(3)
    model = ef.Sequential(L.Linear(4, 6, w_init=rng.normal(size=(4, 6)), weight_fn=ops.Standardized()),
                          L.LIF(6, tau=4.0, v_threshold=0.5), L.Linear(6, 2))
    brainstate.nn.init_all_states(model, batch_size=3)
    xs, ys = jnp.asarray(rng.random((10, 3, 4))), jnp.asarray(rng.normal(size=(10, 3, 2)))
    _exact_online(model, xs, ys, algo)

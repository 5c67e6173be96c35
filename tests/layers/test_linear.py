"""``Linear``, ``Conv1d``, ``Conv2d`` and ``Flatten`` (etrace_fit/layers/linear.py).

Outputs are compared with the docstring equations written in plain ``jax.numpy`` /
``jax.lax``; gradients through a 20-step loop with central finite differences.
"""

from __future__ import annotations

import re

import brainstate
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit import ops
from etrace_fit.errors import ConfigError, ShapeError

from ._helpers import assert_close, check_fd, layer_grads, rand_np, randn


# --------------------------------------------------------------------------- Linear


@pytest.mark.parametrize("x_shape", [(3, 4), (4,), (2, 3, 4)])
def test_linear_one_step_matches_reference(env64, x_shape):
    layer = L.Linear(4, 6, w_init=rand_np(0, 4, 6), b_init=rand_np(1, 6))
    params = layer.weight.value
    assert set(params) == {"weight", "bias"}
    assert params["weight"].shape == (4, 6) and params["bias"].shape == (6,)
    assert params["weight"].dtype == jnp.float64
    x = randn(1, *x_shape)
    y = layer(x)
    assert_close(y, x @ params["weight"] + params["bias"])
    assert y.shape == (*x_shape[:-1], 6)


def test_linear_initializer_arrays_and_no_bias(env64):
    w = randn(0, 3, 2)
    layer = L.Linear(3, 2, w_init=w, with_bias=False)
    assert set(layer.weight.value) == {"weight"}
    assert_close(layer.weight.value["weight"], w)
    x = randn(1, 5, 3)
    assert_close(layer(x), x @ w)


def test_linear_default_initialisation_and_float32(env):
    layer = L.Linear(3, 2)  # KaimingNormal weight, zero bias
    assert layer.weight.value["weight"].shape == (3, 2)
    assert float(jnp.std(layer.weight.value["weight"])) > 0
    assert_close(layer.weight.value["bias"], jnp.zeros(2))
    assert layer.weight.value["weight"].dtype == jnp.float32
    assert layer.weight.value["bias"].dtype == jnp.float32
    assert layer(jnp.ones((2, 3))).dtype == jnp.float32


def test_linear_mask_forward_and_zero_gradient(env64):
    mask = (np.random.default_rng(3).uniform(size=(4, 5)) > 0.5).astype(np.float64)
    mask[0, 0], mask[1, 1] = 0.0, 1.0  # at least one cut and one kept connection
    layer = L.Linear(4, 5, mask=mask, w_init=rand_np(0, 4, 5), b_init=rand_np(1, 5))
    params = layer.weight.value
    x = randn(1, 3, 4)
    assert_close(layer(x), x @ (params["weight"] * mask) + params["bias"])

    xs = randn(2, 20, 3, 4)
    states = layer.states(brainstate.ParamState)

    def loss():
        ys = brainstate.transform.for_loop(lambda x: jnp.tanh(layer(x)), xs)
        return jnp.sum(ys ** 2)

    grads = layer_grads(loss, states)
    gw = np.asarray(grads[("weight",)]["weight"])
    assert np.all(gw[mask == 0] == 0.0)
    assert np.all(gw[mask == 1] != 0.0)
    check_fd(loss, states, grads, entries=8)


def test_linear_weight_fn(env64):
    layer = L.Linear(4, 3, weight_fn=ops.Positive(), w_init=rand_np(0, 4, 3), b_init=rand_np(1, 3))
    w, b = layer.weight.value["weight"], layer.weight.value["bias"]
    assert bool(jnp.any(w < 0))  # so that |w| matters
    x = randn(1, 2, 4)
    assert_close(layer(x), x @ jnp.abs(w) + b)

    # a plain callable, chained after a mask (mask first)
    mask = np.ones((4, 3))
    mask[2] = 0.0
    layer2 = L.Linear(4, 3, mask=mask, weight_fn=lambda v: 2.0 * v + 1.0, w_init=rand_np(2, 4, 3), b_init=rand_np(3, 3))
    w2, b2 = layer2.weight.value["weight"], layer2.weight.value["bias"]
    assert_close(layer2(x), x @ (2.0 * (w2 * mask) + 1.0) + b2)


def test_linear_gradients_match_finite_differences(env64):
    layer = L.Linear(4, 5, w_init=rand_np(0, 4, 5), b_init=rand_np(1, 5), weight_fn=ops.Positive())
    xs = randn(4, 20, 3, 4)
    states = layer.states(brainstate.ParamState)

    def loss():
        ys = brainstate.transform.for_loop(lambda x: jnp.sin(layer(x)), xs)
        return jnp.sum(ys * jnp.arange(5.0))

    check_fd(loss, states, layer_grads(loss, states))


def test_linear_wrong_input_size_raises(env):
    layer = L.Linear(4, 6, w_init=np.zeros((4, 6)))
    with pytest.raises(ShapeError) as info:
        layer(jnp.ones((3, 5)))
    message = str(info.value)
    assert "Linear(4, 6)" in message and "(3, 5)" in message and "4" in message
    with pytest.raises(ShapeError, match=re.escape("Linear(4, 6)")):
        layer(jnp.ones(()))


def test_linear_config_errors(env):
    with pytest.raises(ConfigError, match="in_size"):
        L.Linear(0, 3)
    with pytest.raises(ConfigError, match="out_size"):
        L.Linear(3, 2.5)
    with pytest.raises(ShapeError, match="mask"):
        L.Linear(3, 2, w_init=np.zeros((3, 2)), mask=np.ones((4, 2)))
    with pytest.raises(ConfigError, match="weight_fn"):
        L.Linear(3, 2, w_init=np.zeros((3, 2)), weight_fn=3.0)


def test_linear_initializer_array_broadcasts(env64):
    layer = L.Linear(3, 2, w_init=jnp.ones((1, 2)), b_init=jnp.ones(()))
    assert_close(layer.weight.value["weight"], jnp.ones((3, 2)))
    assert_close(layer.weight.value["bias"], jnp.ones((2,)))


def test_linear_initializer_array_of_wrong_shape_raises_shape_error(env):
    # make_param promises a ShapeError naming the argument ("w_init must broadcast to
    # shape ..."), and every user error should be an EtraceError.
    with pytest.raises(ShapeError, match="w_init"):
        L.Linear(3, 2, w_init=jnp.ones((2, 3)))
    with pytest.raises(ShapeError, match="b_init"):
        L.Linear(3, 2, w_init=np.zeros((3, 2)), b_init=jnp.ones((3,)))


def test_linear_name_appears_in_errors(env):
    layer = L.Linear(4, 6, w_init=np.zeros((4, 6)), name="enc")
    with pytest.raises(ShapeError, match=re.escape("Linear(4, 6) 'enc'")):
        layer(jnp.ones((3, 5)))


# --------------------------------------------------------------------------- Conv


def _lax_conv(x, w, b, stride, padding, dilation, spec):
    unbatched = x.ndim == w.ndim - 1
    xb = x[None] if unbatched else x
    nsp = w.ndim - 2
    strides = (stride,) * nsp if isinstance(stride, int) else tuple(stride)
    dil = (dilation,) * nsp if isinstance(dilation, int) else tuple(dilation)
    if isinstance(padding, int):
        padding = [(padding, padding)] * nsp
    y = lax.conv_general_dilated(xb, w, window_strides=strides, padding=padding, rhs_dilation=dil,
                                 dimension_numbers=spec)
    y = y + b
    return y[0] if unbatched else y


CONV1D_CASES = [
    dict(stride=1, padding="SAME", dilation=1),
    dict(stride=2, padding="VALID", dilation=1),
    dict(stride=1, padding="SAME", dilation=2),
    dict(stride=2, padding=1, dilation=1),
    dict(stride=1, padding=[(2, 0)], dilation=1),
]


@pytest.mark.parametrize("geometry", CONV1D_CASES, ids=lambda g: "-".join(f"{k}={v}" for k, v in g.items()))
def test_conv1d_matches_lax(env64, geometry):
    layer = L.Conv1d(2, 3, kernel_size=3, w_init=rand_np(0, 3, 2, 3), b_init=rand_np(1, 3), **geometry)
    w, b = layer.weight.value["weight"], layer.weight.value["bias"]
    assert w.shape == (3, 2, 3) and b.shape == (3,) and w.dtype == jnp.float64
    x = randn(1, 2, 9, 2)
    expected = _lax_conv(x, w, b, geometry["stride"], geometry["padding"], geometry["dilation"], ("NWC", "WIO", "NWC"))
    assert_close(layer(x), expected)
    # unbatched input gives the same result without the batch axis
    assert_close(layer(x[1]), expected[1])


CONV2D_CASES = [
    dict(kernel_size=3, stride=1, padding="SAME", dilation=1),
    dict(kernel_size=(3, 2), stride=(2, 1), padding="VALID", dilation=1),
    dict(kernel_size=2, stride=1, padding=[(1, 0), (0, 1)], dilation=(2, 1)),
]


@pytest.mark.parametrize("geometry", CONV2D_CASES, ids=["same", "valid-strided", "pairs-dilated"])
def test_conv2d_matches_lax(env64, geometry):
    ks = geometry["kernel_size"]
    ks = (ks, ks) if isinstance(ks, int) else ks
    layer = L.Conv2d(2, 4, w_init=rand_np(0, *ks, 2, 4), b_init=rand_np(1, 4), **geometry)
    w, b = layer.weight.value["weight"], layer.weight.value["bias"]
    assert w.shape == (*ks, 2, 4) and b.shape == (4,)
    x = randn(1, 2, 6, 5, 2)
    expected = _lax_conv(x, w, b, geometry["stride"], geometry["padding"], geometry["dilation"],
                         ("NHWC", "HWIO", "NHWC"))
    assert_close(layer(x), expected)
    assert_close(layer(x[0]), expected[0])


def test_conv_mask_and_weight_fn(env64):
    mask = np.ones((3, 2, 3))
    mask[1] = 0.0
    layer = L.Conv1d(2, 3, kernel_size=3, mask=mask, weight_fn=ops.Positive(), w_init=rand_np(0, 3, 2, 3),
                      b_init=rand_np(1, 3))
    w, b = layer.weight.value["weight"], layer.weight.value["bias"]
    x = randn(0, 2, 7, 2)
    expected = _lax_conv(x, jnp.abs(w * mask), b, 1, "SAME", 1, ("NWC", "WIO", "NWC"))
    assert_close(layer(x), expected)


def test_conv1d_gradients_match_finite_differences(env64):
    layer = L.Conv1d(2, 3, kernel_size=3, stride=2, padding="SAME", w_init=rand_np(0, 3, 2, 3, scale=0.5),
                      b_init=rand_np(1, 3))
    xs = randn(5, 20, 2, 7, 2)
    states = layer.states(brainstate.ParamState)

    def loss():
        ys = brainstate.transform.for_loop(lambda x: jnp.tanh(layer(x)), xs)
        return jnp.sum(ys ** 2)

    check_fd(loss, states, layer_grads(loss, states))


def test_conv2d_gradients_match_finite_differences(env64):
    layer = L.Conv2d(2, 3, kernel_size=(2, 3), dilation=(1, 2), padding="SAME", w_init=rand_np(0, 2, 3, 2, 3, scale=0.4),
                      b_init=rand_np(1, 3))
    xs = randn(6, 20, 2, 5, 5, 2)
    states = layer.states(brainstate.ParamState)

    def loss():
        ys = brainstate.transform.for_loop(lambda x: jnp.tanh(layer(x)), xs)
        return jnp.sum(ys ** 2)

    check_fd(loss, states, layer_grads(loss, states))


def test_conv_shape_errors(env):
    conv1 = L.Conv1d(2, 3, kernel_size=3, w_init=np.zeros((3, 2, 3)))
    with pytest.raises(ShapeError) as info:
        conv1(jnp.ones((2, 7, 5)))
    assert "Conv1d(2, 3, kernel_size=3)" in str(info.value) and "(2, 7, 5)" in str(info.value)
    with pytest.raises(ShapeError, match=re.escape("x.shape=(2, 3, 7, 2)")):
        conv1(jnp.ones((2, 3, 7, 2)))
    conv2 = L.Conv2d(2, 3, kernel_size=3, w_init=np.zeros((3, 3, 2, 3)))
    with pytest.raises(ShapeError) as info:
        conv2(jnp.ones((2, 5, 5, 4)))
    assert "Conv2d(2, 3, kernel_size=(3, 3))" in str(info.value) and "(2, 5, 5, 4)" in str(info.value)
    with pytest.raises(ShapeError, match=re.escape("(5, 2)")):
        conv2(jnp.ones((5, 2)))


def test_conv_config_errors(env):
    with pytest.raises(ConfigError, match="kernel_size"):
        L.Conv2d(2, 3, kernel_size=(3, 3, 3))
    with pytest.raises(ConfigError, match="kernel_size"):
        L.Conv1d(2, 3, kernel_size=0)
    with pytest.raises(ConfigError, match="in_channels"):
        L.Conv1d(0, 3, kernel_size=3)


# --------------------------------------------------------------------------- Flatten


def test_flatten():
    x = jnp.arange(2 * 3 * 4 * 5, dtype=jnp.float32).reshape(2, 3, 4, 5)
    assert_close(L.Flatten()(x), x.reshape(2, 60))
    assert_close(L.Flatten(num_feature_axes=2)(x), x.reshape(2, 3, 20))
    assert_close(L.Flatten(num_feature_axes=3)(x[0]), x[0].reshape(60))  # unbatched
    assert_close(L.Flatten(num_feature_axes=1)(x), x)
    assert_close(L.Flatten()(jnp.ones((4, 3))), jnp.ones((4, 3)))


def test_flatten_errors():
    with pytest.raises(ShapeError, match=re.escape("x.shape=(5,)")):
        L.Flatten()(jnp.ones((5,)))
    with pytest.raises(ShapeError, match="Flatten"):
        L.Flatten(num_feature_axes=3)(jnp.ones((4, 5)))
    with pytest.raises(ConfigError, match="num_feature_axes"):
        L.Flatten(num_feature_axes=0)


def test_conv_flatten_linear_stack(env64):
    model = ef.Sequential(L.Conv2d(1, 2, kernel_size=3, stride=2, w_init=rand_np(0, 3, 3, 1, 2), b_init=rand_np(1, 2)),
                          L.Flatten(), L.Linear(2 * 3 * 3, 4, w_init=rand_np(2, 18, 4), b_init=rand_np(3, 4)))
    brainstate.nn.init_all_states(model, batch_size=2)
    x = randn(0, 2, 6, 6, 1)
    c, lin = model[0].weight.value, model[2].weight.value
    h = _lax_conv(x, c["weight"], c["bias"], 2, "SAME", 1, ("NHWC", "HWIO", "NHWC")).reshape(2, -1)
    assert_close(model(x), h @ lin["weight"] + lin["bias"])

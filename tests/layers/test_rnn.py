"""``VanillaRNNCell``, ``GRUCell`` and ``LSTMCell`` (etrace_fit/layers/rnn.py).

One step is compared with the docstring equations in plain ``jax.numpy`` from a
non-zero hidden state; gradients through 20 steps with central finite differences.
"""

from __future__ import annotations


import brainstate
import jax.numpy as jnp
import numpy as np
import pytest

from etrace_fit import layers as L
from etrace_fit.errors import ConfigError, ShapeError

from ._helpers import assert_close, check_fd, layer_grads, randn, randomize

I, H, B = 3, 4, 2


def _cell(cls, **kwargs):
    """A cell built cheaply (numpy initializer), then given distinct random weights per gate."""
    cell = cls(I, H, w_init=np.zeros((I + H, H)), **kwargs)
    return randomize(cell, seed=11)


def _lin(layer, v):
    p = layer.weight.value
    return v @ p["weight"] + p["bias"]


def _sig(v):
    return 1.0 / (1.0 + jnp.exp(-v))


ACTIVATIONS = {
    "tanh": jnp.tanh,
    "relu": lambda v: jnp.maximum(v, 0.0),
    "sigmoid": _sig,
    "identity": lambda v: v,
}


@pytest.mark.parametrize("activation", ["tanh", "relu", "sigmoid", "identity", "callable"])
@pytest.mark.parametrize("batch", [B, None])
def test_vanilla_rnn_one_step(env64, activation, batch):
    act = jnp.sin if activation == "callable" else ACTIVATIONS[activation]
    cell = _cell(L.VanillaRNNCell, activation=jnp.sin if activation == "callable" else activation)
    brainstate.nn.init_all_states(cell, batch_size=batch)
    lead = () if batch is None else (batch,)
    h0 = randn(1, *lead, H)
    cell.h.value = h0
    x = randn(2, *lead, I)
    expected = act(_lin(cell.W, jnp.concatenate([x, h0], -1)))
    out = cell(x)
    assert_close(out, expected)
    assert_close(cell.h.value, expected)
    # a second step uses the new state
    expected2 = act(_lin(cell.W, jnp.concatenate([x, expected], -1)))
    assert_close(cell(x), expected2)


def _gru_ref(cell, x, h):
    xh = jnp.concatenate([x, h], -1)
    z = _sig(_lin(cell.W_z, xh))
    r = _sig(_lin(cell.W_r, xh))
    n = jnp.tanh(_lin(cell.W_h, jnp.concatenate([x, r * h], -1)))
    return (1.0 - z) * h + z * n


@pytest.mark.parametrize("batch", [B, None])
def test_gru_one_step(env64, batch):
    cell = _cell(L.GRUCell)
    assert sorted(k[0] for k in cell.states(brainstate.ParamState)) == ["W_h", "W_r", "W_z"]
    brainstate.nn.init_all_states(cell, batch_size=batch)
    lead = () if batch is None else (batch,)
    h0 = randn(1, *lead, H)
    cell.h.value = h0
    x = randn(2, *lead, I)
    expected = _gru_ref(cell, x, h0)
    assert_close(cell(x), expected)
    assert_close(cell.h.value, expected)
    assert_close(cell(x), _gru_ref(cell, x, expected))


def _lstm_ref(cell, x, h, c):
    xh = jnp.concatenate([x, h], -1)
    i = _sig(_lin(cell.W_i, xh))
    f = _sig(_lin(cell.W_f, xh))
    g = jnp.tanh(_lin(cell.W_g, xh))
    o = _sig(_lin(cell.W_o, xh))
    c_new = f * c + i * g
    return o * jnp.tanh(c_new), c_new


@pytest.mark.parametrize("batch", [B, None])
def test_lstm_one_step(env64, batch):
    cell = _cell(L.LSTMCell)
    assert sorted(k[0] for k in cell.states(brainstate.ParamState)) == ["W_f", "W_g", "W_i", "W_o"]
    brainstate.nn.init_all_states(cell, batch_size=batch)
    lead = () if batch is None else (batch,)
    h0, c0 = randn(1, *lead, H), randn(3, *lead, H)
    cell.h.value, cell.c.value = h0, c0
    x = randn(2, *lead, I)
    h1, c1 = _lstm_ref(cell, x, h0, c0)
    assert_close(cell(x), h1)
    assert_close(cell.h.value, h1)
    assert_close(cell.c.value, c1)
    h2, c2 = _lstm_ref(cell, x, h1, c1)
    assert_close(cell(x), h2)
    assert_close(cell.c.value, c2)


def test_lstm_forget_bias(env64):
    cell = L.LSTMCell(I, H, w_init=np.zeros((I + H, H)))
    assert_close(cell.W_f.weight.value["bias"], jnp.ones(H))
    for gate in (cell.W_i, cell.W_g, cell.W_o):
        assert_close(gate.weight.value["bias"], jnp.zeros(H))
    cell = L.LSTMCell(I, H, w_init=np.zeros((I + H, H)), forget_bias=2.5)
    assert_close(cell.W_f.weight.value["bias"], jnp.full(H, 2.5))
    # b_init sets the other gates; the forget gate keeps forget_bias (Keras' unit_forget_bias:
    # b_init replaced it, forget_bias=2.0 beside b_init silently gave 0)
    cell = L.LSTMCell(I, H, w_init=np.zeros((I + H, H)), b_init=np.full(H, 0.3), forget_bias=2.0)
    assert_close(cell.W_f.weight.value["bias"], jnp.full(H, 2.0))
    assert_close(cell.W_i.weight.value["bias"], jnp.full(H, 0.3))
    cell = L.LSTMCell(I, H, w_init=np.zeros((I + H, H)), b_init=np.full(H, 0.3))
    assert_close(cell.W_f.weight.value["bias"], jnp.ones(H))
    cell = L.LSTMCell(I, H, w_init=np.zeros((I + H, H)), b_init=np.full(H, 0.3), forget_bias=None)
    assert_close(cell.W_f.weight.value["bias"], jnp.full(H, 0.3))
    cell = L.MinLSTMCell(I, H, w_init=np.zeros((I, H)), b_init=np.zeros(H), forget_bias=1.5)
    assert_close(cell.W_f.weight.value["bias"], jnp.full(H, 1.5))
    assert_close(cell.W_i.weight.value["bias"], jnp.zeros(H))
    for bad in ("1", float("nan"), True):
        with pytest.raises(ConfigError, match=r"LSTMCell\(3, 4\): forget_bias must be a finite number or None"):
            L.LSTMCell(I, H, forget_bias=bad)


def test_default_initialisation(env):
    cell = L.GRUCell(I, H)
    for gate in (cell.W_z, cell.W_r, cell.W_h):
        assert gate.weight.value["weight"].shape == (I + H, H)
        assert gate.weight.value["weight"].dtype == jnp.float32
    brainstate.nn.init_all_states(cell, batch_size=B)
    assert cell.h.value.dtype == jnp.float32
    assert_close(cell.h.value, jnp.zeros((B, H)))
    assert cell(jnp.ones((B, I))).shape == (B, H)


@pytest.mark.parametrize("cls,names", [(L.VanillaRNNCell, ["h"]), (L.GRUCell, ["h"]), (L.LSTMCell, ["c", "h"])])
@pytest.mark.parametrize("batch", [1, 7, None])
def test_state_shapes(env, cls, names, batch):
    cell = cls(I, H, w_init=np.zeros((I + H, H)))
    expected = (H,) if batch is None else (batch, H)
    brainstate.nn.init_all_states(cell, batch_size=batch)
    hidden = cell.states(brainstate.HiddenState)
    assert sorted(k for (k,) in hidden.keys()) == names
    assert all(s.value.shape == expected for s in hidden.values())
    x = jnp.ones((*expected[:-1], I))
    assert cell(x).shape == expected
    assert all(s.value.shape == expected for s in hidden.values())
    brainstate.nn.reset_all_states(cell, batch_size=batch)
    assert all(s.value.shape == expected for s in cell.states(brainstate.HiddenState).values())
    assert all(float(jnp.max(jnp.abs(s.value))) == 0.0 for s in hidden.values())


def test_state_init(env64):
    cell = L.LSTMCell(I, H, w_init=np.zeros((I + H, H)), state_init=brainstate.nn.init.Constant(0.5))
    brainstate.nn.init_all_states(cell, batch_size=B)
    assert_close(cell.h.value, jnp.full((B, H), 0.5))
    assert_close(cell.c.value, jnp.full((B, H), 0.5))


@pytest.mark.parametrize("cls", [L.VanillaRNNCell, L.GRUCell, L.LSTMCell])
def test_gradients_match_finite_differences(env64, cls):
    cell = _cell(cls)
    brainstate.nn.init_all_states(cell, batch_size=B)
    xs = randn(5, 20, B, I)
    target = randn(6, 20, B, H)
    params = cell.states(brainstate.ParamState)

    def loss():
        brainstate.nn.reset_all_states(cell, batch_size=B)
        ys = brainstate.transform.for_loop(lambda x: cell(x), xs)
        return jnp.sum((ys - target) ** 2)

    check_fd(loss, params, layer_grads(loss, params), entries=5)


@pytest.mark.parametrize("cls", [L.VanillaRNNCell, L.GRUCell, L.LSTMCell])
def test_wrong_input_size(env, cls):
    cell = cls(I, H, w_init=np.zeros((I + H, H)))
    brainstate.nn.init_all_states(cell, batch_size=B)
    with pytest.raises(ShapeError) as info:
        cell(jnp.ones((B, I + 1)))
    message = str(info.value)
    assert f"{cls.__name__}({I}, {H})" in message
    assert f"({B}, {I + 1})" in message


def test_unknown_activation():
    with pytest.raises(ConfigError) as info:
        L.VanillaRNNCell(I, H, activation="gelu", w_init=np.zeros((I + H, H)))
    message = str(info.value)
    assert "'gelu'" in message
    for name in ("tanh", "relu", "sigmoid", "identity"):
        assert name in message


@pytest.mark.parametrize("cls", [L.VanillaRNNCell, L.GRUCell, L.LSTMCell])
def test_invalid_sizes(cls):
    with pytest.raises(ConfigError, match="hidden_size"):
        cls(I, 0)
    with pytest.raises(ConfigError, match="in_size"):
        cls(True, H)

"""Helpers shared by the compiler tests (not a test module).

Models are built from numpy arrays (``w_init=...``) so construction is fast, and their
hidden states are given random non-zero values before compiling. The references here
are written in plain ``jax.numpy`` and do not use the library's layers or surrogates.
"""

from __future__ import annotations

import _shared_reference as _reference
import brainstate
import jax
import jax.numpy as jnp
import numpy as np

from etrace_fit import _compat
from etrace_fit import layers as L
from etrace_fit import ops

B, I, N, O = 2, 3, 4, 2


def rand(seed, *shape, scale=1.0):
    """A float64 numpy standard-normal array (a cheap initializer)."""
    return np.random.default_rng(seed).standard_normal(shape) * scale


triangle_d = _reference.triangle_d


def make_spike(deriv=triangle_d):
    """Heaviside ``v > 0`` whose derivative is ``deriv(v)``."""
    return _reference.spike_function(deriv)


SPIKE = make_spike()
sg = jax.lax.stop_gradient


# ----------------------------------------------------------------------- jaxpr helpers


def leaf_positions(module):
    """``{state path: index of its first leaf}`` in ``module.state_leaves()`` order."""
    positions, cursor = {}, 0
    for state in module.states:
        positions[state.path] = cursor
        cursor += len(state.in_vars)
    return positions


def eqn_outputs(module, state_leaves, input_leaves):
    """The first output of every equation of the step, by equation index."""
    seen = {}

    def override(index, eqn, invals):
        outs = _compat.eval_equation(eqn, invals)
        seen[index] = outs[0]
        return outs

    closed = module.closed_jaxpr
    _compat.interpret(closed.jaxpr, list(closed.consts), [*input_leaves, *state_leaves], override=override)
    return seen


def step_with_y(module, eqn_index, y, state_leaves, input_leaves):
    """All outputs of the step with equation ``eqn_index``'s output replaced by ``y``."""

    def override(index, eqn, invals):
        return [y] if index == eqn_index else None

    closed = module.closed_jaxpr
    return _compat.interpret(closed.jaxpr, list(closed.consts), [*input_leaves, *state_leaves], override=override)


def linear_params(linear):
    value = linear.weight.value
    return value["weight"], value.get("bias")


# ----------------------------------------------------------------------------- models


def linear(seed, i, o, **kwargs):
    w_init, b_init = rand(seed, i, o, scale=1.0 / np.sqrt(i)), rand(seed + 1, o, scale=0.3)
    return L.Linear(i, o, w_init=w_init, b_init=b_init, **kwargs)


def near_threshold(seed, threshold, shape):
    """A value within ±0.6 of ``threshold`` (where the triangle surrogate's derivative is
    non-zero): unit 0 is above (it spiked), unit 1 below, the rest random."""
    offset = np.random.default_rng(seed).uniform(-0.6, 0.6, size=shape)
    offset[..., 0] = 0.3
    offset[..., 1] = -0.3
    return jnp.asarray(np.asarray(threshold) + offset)


def lif_net(reset="soft", detach_reset=False, tau=None, v_threshold=1.0, v_reset=-0.2, readout="linear", seed=0):
    """``Linear(I, N) → LIF(N) → readout``; readout ``"linear"``, ``"rate"`` or None."""
    tau = np.array([5.0, 10.0, 20.0, 8.0]) if tau is None else tau
    layers = [linear(seed, I, N),
              L.LIF(N, tau=tau, reset=reset, detach_reset=detach_reset, v_threshold=v_threshold, v_reset=v_reset)]
    if readout == "linear":
        layers.append(linear(seed + 10, N, O))
    elif readout == "rate":
        layers.append(L.LeakyRateReadout(N, O, tau=7.0, w_init=rand(seed + 10, N, O), b_init=rand(seed + 11, O)))
    model = L.Sequential(*layers)
    brainstate.nn.init_all_states(model, batch_size=B)
    return model


def alif_net(reset="soft", learn_tau=True, readout=True, seed=0):
    tau, tau_a = np.array([5.0, 10.0, 20.0, 8.0]), np.array([50.0, 100.0, 30.0, 80.0])
    layers = [linear(seed, I, N),
              L.ALIF(N, tau=tau, tau_a=tau_a, beta=0.7, v_threshold=1.0, v_reset=-0.1, reset=reset,
                     learn_tau=learn_tau)]
    if readout:
        layers.append(linear(seed + 10, N, O))
    model = L.Sequential(*layers)
    brainstate.nn.init_all_states(model, batch_size=B)
    return model


def gru(seed=0):
    cell = L.GRUCell(I, N, w_init=rand(seed, I + N, N, scale=0.6), b_init=rand(seed + 1, N, scale=0.3))
    brainstate.nn.init_all_states(cell, batch_size=B)
    cell.h.value = jnp.asarray(rand(seed + 2, B, N))
    return cell


def lstm(seed=0):
    cell = L.LSTMCell(I, N, w_init=rand(seed, I + N, N, scale=0.6), b_init=rand(seed + 1, N, scale=0.3))
    brainstate.nn.init_all_states(cell, batch_size=B)
    cell.h.value = jnp.asarray(rand(seed + 2, B, N))
    cell.c.value = jnp.asarray(rand(seed + 3, B, N))
    return cell


class CopiesItsState(brainstate.nn.Module):
    """Keeps a copy of its new state in a second HiddenState (same jaxpr variable)."""

    def __init__(self):
        super().__init__()
        self.w = brainstate.ParamState(jnp.asarray(rand(0, I, N)))
        self.h = brainstate.HiddenState(jnp.asarray(rand(1, B, N)))
        self.last = brainstate.HiddenState(jnp.zeros((B, N)))

    def update(self, x):
        self.h.value = 0.9 * self.h.value + ops.matmul(x, self.w.value)
        self.last.value = self.h.value
        return jnp.tanh(self.h.value)


# ------------------------------------------------------------- hand-written references


def lif_ref(v, y, alpha, th_prev, th, v_reset, reset, detach_reset=False):
    """One LIF step with the potential stored before reset (layers/spiking.py):
    ``(V^t, z^t, z^{t-1})``."""
    z_prev = SPIKE(v - th_prev)
    zr = sg(z_prev) if detach_reset else z_prev
    if reset == "soft":
        v_r = v - zr * (th_prev - v_reset)
    else:
        v_r = v * (1.0 - zr) + v_reset * zr
    v_new = alpha * v_r + y
    return v_new, SPIKE(v_new - th), z_prev


def alif_ref(v, a, y, alpha, rho, th0, beta, v_reset, reset):
    """One ALIF step: ``(V^t, a^t, z^t)``."""
    th_prev = th0 + beta * a
    z_prev = SPIKE(v - th_prev)
    a_new = rho * a + z_prev
    v_r = v - z_prev * (th_prev - v_reset) if reset == "soft" else v * (1.0 - z_prev) + v_reset * z_prev
    v_new = alpha * v_r + y
    return v_new, a_new, SPIKE(v_new - (th0 + beta * a_new))


def gru_ref(cell, h, x, cut=True):
    """New ``h`` of a GRU cell; ``cut`` holds every gate's affine output constant."""
    c = sg if cut else (lambda v: v)
    (wz, bz), (wr, br), (wh, bh) = linear_params(cell.W_z), linear_params(cell.W_r), linear_params(cell.W_h)
    xh = jnp.concatenate([x, h], axis=-1)
    z = jax.nn.sigmoid(c(xh @ wz + bz))
    r = jax.nn.sigmoid(c(xh @ wr + br))
    n = jnp.tanh(c(jnp.concatenate([x, r * h], axis=-1) @ wh + bh))
    return (1.0 - z) * h + z * n


def lstm_ref(cell, h, cs, x, cut=True):
    """(h^t, c^t) of an LSTM cell; ``cut`` holds every gate's affine output constant."""
    c = sg if cut else (lambda v: v)
    xh = jnp.concatenate([x, h], axis=-1)
    gates = {}
    for name in "ifgo":
        w, b = linear_params(getattr(cell, f"W_{name}"))
        gates[name] = c(xh @ w + b)
    i, f, o = (jax.nn.sigmoid(gates[k]) for k in "ifo")
    g = jnp.tanh(gates["g"])
    c_new = f * cs + i * g
    return o * jnp.tanh(c_new), c_new


def tau_of(neuron, name="tau"):
    tau = getattr(neuron, name)
    return np.asarray(tau.value if isinstance(tau, brainstate.ParamState) else tau)


def prime_spiking(model, seed=5):
    """Give the spiking layer ``model.layers[1]`` (LIF or ALIF) a potential near its
    threshold (ALIF: also a random ``a > 0``), so the last spike's surrogate derivative
    is non-zero for most units, and a stateful readout a random state."""
    neuron = model.layers[1]
    shape = neuron.V.value.shape
    threshold = neuron.v_threshold
    if isinstance(neuron, L.ALIF):
        a = jnp.asarray(np.abs(rand(seed + 1, *shape)) * 0.5)
        neuron.a.value = a
        threshold = neuron.v_threshold + neuron.beta * np.asarray(a)
    neuron.V.value = near_threshold(seed, threshold, shape)
    if len(model.layers) > 2 and hasattr(model.layers[2], "r"):
        model.layers[2].r.value = jnp.asarray(rand(seed + 2, *model.layers[2].r.value.shape))
    return model

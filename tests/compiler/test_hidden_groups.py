"""Pass 2 — ``hidden_groups`` and ``group_jacobian`` (etrace_fit/compiler/hidden_groups.py).

Groups are checked on the layers whose docstrings say how their states couple. The
per-unit Jacobian ``D`` is compared with the diagonal blocks of ``jax.jacfwd`` of an
independent, hand-written ``jnp`` step (every trainable affine output held constant
with ``stop_gradient``), at random non-zero states placed near the spiking threshold so
that surrogate derivatives matter.
"""

from __future__ import annotations

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit import ops
from etrace_fit.compiler import DiagnosticKind, group_jacobian, hidden_groups, module_info
from etrace_fit.errors import CompilationError

from ._helpers import (B, I, N, alif_net, alif_ref, gru, gru_ref, leaf_positions, lif_net, lif_ref, linear,
                       linear_params, lstm, lstm_ref, prime_spiking, rand, sg, tau_of)


def _groups(model, x):
    module = module_info(model, x)
    groups, diagnostics = hidden_groups(module)
    return module, groups, diagnostics


# ------------------------------------------------------------------------ grouping


def test_alif_v_and_a_form_one_group_of_two_states(env64):
    model = alif_net()
    module, groups, diagnostics = _groups(model, jnp.ones((B, I)))
    assert len(groups) == 1
    (group,) = groups
    assert group.index == 0 and group.num_states == 2
    assert set(group.paths) == {("layers", 1, "V"), ("layers", 1, "a")}
    assert group.shape == (B, N) and group.dtype == jnp.float64
    assert diagnostics == ()


def test_two_stacked_linear_lif_blocks_form_two_groups(env64):
    model = L.Sequential(linear(0, I, N), L.LIF(N), linear(1, N, 5), L.LIF(5))
    brainstate.nn.init_all_states(model, batch_size=B)
    _, groups, diagnostics = _groups(model, jnp.ones((B, I)))
    assert [(g.index, g.paths, g.shape, g.num_states) for g in groups] == [
        (0, (("layers", 1, "V"),), (B, N), 1),
        (1, (("layers", 3, "V"),), (B, 5), 1),
    ]
    assert diagnostics == ()


def test_gru_h_forms_one_group(env64):
    _, groups, diagnostics = _groups(gru(), jnp.ones((B, I)))
    assert [(g.paths, g.num_states) for g in groups] == [((("h",),), 1)]
    assert diagnostics == ()  # h reaches h through concatenate only via the gate weights


def test_lstm_h_and_c_form_one_group_of_two_states(env64):
    _, groups, diagnostics = _groups(lstm(), jnp.ones((B, I)))
    assert len(groups) == 1 and groups[0].num_states == 2
    assert set(groups[0].paths) == {("h",), ("c",)}
    assert diagnostics == ()


class TwoShapes(brainstate.nn.Module):
    """h (B, N) reads g (N,) elementwise: one group, but they cannot be stacked."""

    def __init__(self):
        super().__init__()
        self.w = brainstate.ParamState(jnp.asarray(rand(0, I, N)))
        self.h = brainstate.HiddenState(jnp.zeros((B, N)))
        self.g = brainstate.HiddenState(jnp.ones((N,)))

    def update(self, x):
        self.g.value = 0.9 * self.g.value
        self.h.value = self.g.value * self.h.value + ops.matmul(x, self.w.value)
        return self.h.value


def test_states_of_one_group_with_different_shapes_are_refused(env64):
    module = module_info(TwoShapes(), jnp.ones((B, I)))
    with pytest.raises(CompilationError, match=r"cannot form one hidden group") as caught:
        hidden_groups(module)
    assert "delay line" not in str(caught.value)  # (N,) beside (B, N) is no buffer with an axis more


class GlobalInhibition(brainstate.nn.Module):
    """A population-wide inhibition ``(B, 1)`` driven by the units' spikes and read by
    every unit: the error said the states "update each other per unit" and offered a
    delay line's split, which does not apply (an audit's user neuron)."""

    def __init__(self):
        super().__init__()
        self.w = brainstate.ParamState(jnp.asarray(rand(0, I, N)))
        self.h = brainstate.HiddenState(jnp.zeros((B, N)))
        self.inhibition = brainstate.HiddenState(jnp.zeros((B, 1)))

    def update(self, x):
        self.inhibition.value = 0.8 * self.inhibition.value + jnp.mean(self.h.value, axis=1, keepdims=True)
        self.h.value = 0.9 * self.h.value + ops.matmul(x, self.w.value) - self.inhibition.value
        return self.h.value


def test_a_population_wide_state_is_refused_for_what_it_is(env64):
    module = module_info(GlobalInhibition(), jnp.ones((B, I)))
    with pytest.raises(CompilationError, match=r"cannot form one hidden group") as caught:
        hidden_groups(module)
    message = str(caught.value)
    assert f"h ({B}, {N}), inhibition ({B}, 1)" in message or f"inhibition ({B}, 1), h ({B}, {N})" in message, message
    assert "global inhibition of shape (batch, 1)" in message and "per unit but" not in message, message
    assert "delay line" not in message and "algo='bptt'" in message, message


# ---------------------------------------------------------------- the Jacobian D


def _reference_blocks(step, h_stack):
    """``(D_ref (B, N, S, S), J (B, N, S, B, N, S))`` of ``step: (B, N, S) -> (B, N, S)``."""
    jac = jax.jacfwd(step)(h_stack)
    bs, ns = np.arange(h_stack.shape[0])[:, None], np.arange(h_stack.shape[1])[None, :]
    return np.asarray(jac)[bs, ns, :, bs, ns, :], np.asarray(jac)


def _spiking_case(kind, reset="soft", detach_reset=False):
    x = jnp.asarray(rand(20, B, I))
    if kind == "alif":
        model = alif_net(reset=reset, learn_tau=True)
    else:
        model = lif_net(reset=reset, detach_reset=detach_reset)
    prime_spiking(model)
    w, b = linear_params(model.layers[0])
    y = x @ w + b
    neuron = model.layers[1]
    alpha = jnp.exp(-1.0 / tau_of(neuron))
    th0, vr = neuron.v_threshold, neuron.v_reset

    def step(states):
        if kind == "lif":
            v_new, _, _ = lif_ref(states["V"], sg(y), alpha, th0, th0, vr, reset, detach_reset)
            return {"V": v_new}
        rho = jnp.exp(-1.0 / tau_of(neuron, "tau_a"))
        v_new, a_new, _ = alif_ref(states["V"], states["a"], sg(y), alpha, rho, th0, neuron.beta, vr, reset)
        return {"V": v_new, "a": a_new}

    return model, x, step


def _gru_case():
    cell, x = gru(), jnp.asarray(rand(21, B, I))
    return cell, x, lambda s: {"h": gru_ref(cell, s["h"], x)}


def _lstm_case():
    cell, x = lstm(), jnp.asarray(rand(22, B, I))

    def step(s):
        h, c = lstm_ref(cell, s["h"], s["c"], x)
        return {"h": h, "c": c}

    return cell, x, step


CASES = {
    "alif_soft": lambda: _spiking_case("alif"),
    "alif_hard": lambda: _spiking_case("alif", reset="hard"),
    "lif_soft": lambda: _spiking_case("lif"),
    "lif_hard": lambda: _spiking_case("lif", reset="hard"),
    "lif_soft_detached": lambda: _spiking_case("lif", detach_reset=True),
    "gru": _gru_case,
    "lstm": _lstm_case,
}


@pytest.mark.parametrize("name", list(CASES))
def test_group_jacobian_equals_per_unit_blocks_of_a_hand_written_step(env64, name):
    model, x, ref_step = CASES[name]()
    module, groups, _ = _groups(model, x)
    (group,) = groups
    leaves = module.state_leaves()
    positions = leaf_positions(module)
    names = [path[-1] for path in group.paths]
    h_stack = jnp.stack([leaves[positions[path]] for path in group.paths], axis=-1)

    def stacked_step(h):
        new = ref_step({n: h[..., s] for s, n in enumerate(names)})
        return jnp.stack([new[n] for n in names], axis=-1)

    # the reference step reproduces the compiled step's new states (same model)
    _, new_leaves = module.evaluate(leaves, x)
    expected_new = jnp.stack([new_leaves[positions[path]] for path in group.paths], axis=-1)
    np.testing.assert_allclose(np.asarray(stacked_step(h_stack)), np.asarray(expected_new), rtol=1e-12, atol=1e-12)

    d_ref, jac = _reference_blocks(stacked_step, h_stack)
    d = group_jacobian(module, group, leaves, [x])
    assert d.shape == (B, N, group.num_states, group.num_states) and d.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(d), d_ref, rtol=1e-12, atol=1e-12)
    # units (and samples) do not feed each other: J is block diagonal
    same = np.eye(B, dtype=bool)[:, None, None, :, None, None] & np.eye(N, dtype=bool)[None, :, None, None, :, None]
    same = np.broadcast_to(same, jac.shape)
    assert np.all(jac[~same] == 0.0)
    assert np.any(d_ref != 0.0)


@pytest.mark.parametrize("name", ["lif_soft", "lif_hard", "alif_soft"])
def test_surrogate_derivative_enters_the_spiking_jacobian(env64, name):
    """The states above sit near threshold: D differs from the leak alone, so the
    comparison above exercises the surrogate path."""
    model, x, _ = CASES[name]()
    module, (group,), _ = _groups(model, x)
    d = np.asarray(group_jacobian(module, group, module.state_leaves(), [x]))
    alpha = np.exp(-1.0 / tau_of(model.layers[1]))
    v_index = group.paths.index(("layers", 1, "V"))
    assert not np.allclose(d[..., v_index, v_index], np.broadcast_to(alpha, (B, N)))


def test_lstm_jacobian_has_the_documented_structure(env64):
    """c^t = f c + i g, h^t = o tanh(c^t) with gates constant: ∂c/∂c = f, ∂h/∂c = o (1 − tanh² c^t) f,
    and nothing depends on h^{t-1} except through the gate weights."""
    cell, x, _ = _lstm_case()
    module, (group,), _ = _groups(cell, x)
    d = np.asarray(group_jacobian(module, group, module.state_leaves(), [x]))
    h_i, c_i = group.paths.index(("h",)), group.paths.index(("c",))
    xh = jnp.concatenate([x, cell.h.value], axis=-1)

    def gate(name):
        w, b = linear_params(getattr(cell, f"W_{name}"))
        return xh @ w + b

    f, i, o = jax.nn.sigmoid(gate("f")), jax.nn.sigmoid(gate("i")), jax.nn.sigmoid(gate("o"))
    c_new = f * cell.c.value + i * jnp.tanh(gate("g"))
    np.testing.assert_allclose(d[..., c_i, c_i], f, rtol=1e-12)
    np.testing.assert_allclose(d[..., h_i, c_i], o * (1 - jnp.tanh(c_new) ** 2) * f, rtol=1e-12)
    assert np.all(d[..., :, h_i] == 0.0)


# ------------------------------------------------------------ non-elementwise coupling

M_COUPLING = rand(30, N, N)


class Coupled(brainstate.nn.Module):
    """h^t = 0.9 h + h M + x W: M (a constant, not a trainable ETP op) mixes units."""

    def __init__(self):
        super().__init__()
        self.w = brainstate.ParamState(jnp.asarray(rand(31, I, N)))
        self.h = brainstate.HiddenState(jnp.asarray(rand(32, B, N)))

    def update(self, x):
        self.h.value = 0.9 * self.h.value + self.h.value @ M_COUPLING + ops.matmul(x, self.w.value)
        return self.h.value


def test_non_elementwise_coupling_is_reported(env64):
    _, groups, diagnostics = _groups(Coupled(), jnp.ones((B, I)))
    assert len(groups) == 1
    assert [(d.kind, d.hidden_paths) for d in diagnostics] == [
        (DiagnosticKind.NON_ELEMENTWISE_COUPLING, (("h",), ("h",))),
    ]
    assert "per-unit part only" in diagnostics[0].message


def test_coupled_group_jacobian_keeps_the_per_unit_part_only(env64):
    """The diagnostic promises that D keeps the per-unit part: D[b, n] = ∂h_n/∂h_n =
    0.9 + M[n, n]. (group_jacobian pushes an all-ones tangent through the step, which
    for a unit-mixing op yields 0.9 + Σ_j M[j, n] instead.)"""
    model = Coupled()
    module, (group,), _ = _groups(model, jnp.ones((B, I)))
    d = np.asarray(group_jacobian(module, group, module.state_leaves(), [jnp.ones((B, I))]))
    expected = np.broadcast_to(0.9 + np.diag(M_COUPLING), (B, N))
    np.testing.assert_allclose(d[..., 0, 0], expected, rtol=1e-12)


@jax.custom_jvp
def _mix(h):
    return h @ M_COUPLING


@_mix.defjvp
def _mix_jvp(primals, tangents):
    (h,), (dh,) = primals, tangents
    return _mix(h), dh @ M_COUPLING


class CustomJvpCoupled(brainstate.nn.Module):
    """Same coupling as :class:`Coupled`, written as a ``jax.custom_jvp`` function."""

    def __init__(self):
        super().__init__()
        self.w = brainstate.ParamState(jnp.asarray(rand(31, I, N)))
        self.h = brainstate.HiddenState(jnp.asarray(rand(32, B, N)))

    def update(self, x):
        self.h.value = 0.9 * self.h.value + _mix(self.h.value) + ops.matmul(x, self.w.value)
        return self.h.value


def test_unit_mixing_inside_a_custom_jvp_function_is_reported(env64):
    """``custom_jvp_call`` is listed as elementwise whatever its body does, so a
    unit-mixing custom_jvp function goes unreported."""
    _, _, diagnostics = _groups(CustomJvpCoupled(), jnp.ones((B, I)))
    assert DiagnosticKind.NON_ELEMENTWISE_COUPLING in [d.kind for d in diagnostics]


@jax.custom_jvp
def _spike_mixing_derivative(v):
    return jax.nn.sigmoid(4 * v)


@_spike_mixing_derivative.defjvp
def _spike_mixing_derivative_jvp(primals, tangents):  # an elementwise function, a JVP rule that mixes units
    (v,), (dv,) = primals, tangents
    s = jax.nn.sigmoid(4 * v)
    return s, 4 * s * (1 - s) * dv + 0.5 * jnp.mean(4 * s * (1 - s) * dv, -1, keepdims=True)


class ResetByMixedDerivative(brainstate.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = brainstate.ParamState(jnp.asarray(rand(33, I, N)))
        self.h = brainstate.HiddenState(jnp.asarray(rand(34, B, N)))

    def update(self, x):
        self.h.value = 0.8 * self.h.value * (1 - _spike_mixing_derivative(self.h.value - 1.0)) + \
            ops.matmul(x, self.w.value)
        return self.h.value


def test_a_custom_jvp_rule_that_mixes_units_is_reported_though_its_function_does_not(env64):
    """docs/neurons.md sends a unit-mixing ``custom_vjp`` to ``custom_jvp``; only the
    function was looked at, so D-RTRL was 0.1 off BPTT (relative), reported exact."""
    _, _, diagnostics = _groups(ResetByMixedDerivative(), jnp.ones((B, I)))
    assert DiagnosticKind.NON_ELEMENTWISE_COUPLING in [d.kind for d in diagnostics]
    for spike in (L.Triangle(), L.Sigmoid(), L.FastSigmoid()):  # the library's spikes: their rules do not mix
        model = L.Sequential(linear(0, I, N), L.LIF(N, surrogate=spike))
        brainstate.nn.init_all_states(model, batch_size=B)
        _, _, diagnostics = _groups(model, jnp.ones((B, I)))
        assert DiagnosticKind.NON_ELEMENTWISE_COUPLING not in [d.kind for d in diagnostics], spike


class _Counter(brainstate.nn.Module):
    """A float membrane next to an int32 refractory counter."""

    def init_state(self, batch_size=None, **kwargs):
        self.v = brainstate.HiddenState(jnp.zeros((batch_size, N)))
        self.count = brainstate.HiddenState(jnp.zeros((batch_size, N), jnp.int32))

    def update(self, x):
        free = self.count.value == 0
        self.v.value = jnp.where(free, 0.9 * self.v.value + x, 0.0)
        self.count.value = jnp.where(self.v.value > 1.0, 3, jnp.maximum(self.count.value - 1, 0))
        return self.v.value


def test_an_integer_hidden_state_is_carried_without_a_group(env64):
    model = _Counter()
    brainstate.nn.init_all_states(model, batch_size=B)
    graph = ef.compile_graph(model, jnp.ones((B, N)))
    assert [g.paths for g in graph.hidden_groups] == [(("v",),)]
    assert graph.module.state(("count",)).kind == "other"
    (record,) = [d for d in graph.diagnostics if d.kind is DiagnosticKind.CARRIED_WITHOUT_TRACE]
    assert record.hidden_paths == (("count",),) and "int32" in record.message


class _MixedFloats(brainstate.nn.Module):
    def init_state(self, batch_size=None, **kwargs):
        self.v = brainstate.HiddenState(jnp.zeros((batch_size, N), jnp.float64))
        self.a = brainstate.HiddenState(jnp.zeros((batch_size, N), jnp.float32))

    def update(self, x):
        self.a.value = (0.5 * self.a.value + self.v.value).astype(jnp.float32)
        self.v.value = 0.9 * self.v.value + x - self.a.value
        return self.v.value


def test_states_of_one_group_in_two_float_dtypes_are_an_error_that_says_dtype(env64):
    model = _MixedFloats()
    brainstate.nn.init_all_states(model, batch_size=B)
    with pytest.raises(ef.CompilationError, match=r"hidden states a float32, v float64 update each other per unit but differ in dtype"):
        ef.compile_graph(model, jnp.ones((B, N)))

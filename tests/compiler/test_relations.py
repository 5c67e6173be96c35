"""Pass 3 — ``relations`` (etrace_fit/compiler/relations.py).

Which weight drives which hidden group, on the models whose answer is known from
their equations; how operands are traced back to their ParamState; what is excluded
and why; and the transition jaxprs ``y → h``, checked against the step and against
hand-derived derivatives ``D_f = ∂h^t/∂y``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit import _compat
from etrace_fit import layers as L
from etrace_fit import ops
from etrace_fit.algorithms.hybrid import make_plan
from etrace_fit.algorithms.learner import _nonlinear_map
from etrace_fit.compiler import ALL_DIRECT, ALL_THROUGH_OTHER_ETP, MIXED, DiagnosticKind, Level

from ._helpers import (B, I, N, CopiesItsState, alif_net, eqn_outputs, gru, leaf_positions, lif_net, linear,
                       linear_params, lstm, prime_spiking, rand, tau_of)


def _kinds(graph, kind):
    return [d for d in graph.diagnostics if d.kind is kind]


def _relation(graph, weight_path):
    (relation,) = graph.relations_of(weight_path)
    return relation


# -------------------------------------------------------------- the models


def test_linear_lif_linear_relates_the_input_weight_and_excludes_the_readout(env64):
    model = lif_net(readout="linear")
    graph = ef.compile_graph(model, jnp.ones((B, I)))
    assert [r.weight_path for r in graph.relations] == [("layers", 0, "weight")]
    relation = graph.relations[0]
    assert relation.primitive == "etp_mm" and relation.op_kind == "dense"
    assert relation.hidden_groups == (0,) and relation.hidden_paths == (("layers", 1, "V"),)
    assert relation.paths == ((("layers", 1, "V"), ALL_DIRECT),)
    assert relation.classification == ALL_DIRECT
    assert [(o.key, o.path, o.leaf, o.chain) for o in relation.operands] == [
        ("weight", ("layers", 0, "weight"), "weight", ()),
        ("bias", ("layers", 0, "weight"), "bias", ()),
    ]
    assert relation.x_shape == (B, I) and relation.y_shape == (B, N)
    assert relation.trainable_shapes == (("weight", (I, N)), ("bias", (N,)))
    assert relation.size == I * N + N
    (readout,) = [d for d in graph.diagnostics if d.weight_path == ("layers", 2, "weight")]
    assert readout.kind is DiagnosticKind.EXCLUDED_NON_TEMPORAL
    assert readout.level is Level.INFO and readout.primitive == "etp_mm"


def test_gru_reset_gate_weight_is_weight_to_weight_and_the_others_relate_to_h(env64):
    graph = ef.compile_graph(gru(), jnp.ones((B, I)))
    assert [(r.weight_path, r.hidden_paths) for r in graph.relations] == [
        (("W_z", "weight"), (("h",),)),
        (("W_h", "weight"), (("h",),)),
    ]
    (excluded,) = graph.diagnostics_of("W_r.weight")
    assert excluded.kind is DiagnosticKind.EXCLUDED_WEIGHT_TO_WEIGHT
    assert excluded.level is Level.WARNING and excluded.hidden_paths == (("h",),)
    assert graph.relations_of("W_r.weight") == ()


def test_lstm_gate_weights_relate_to_the_h_c_group(env64):
    """i, f, g drive c^t and through it h^t; o only multiplies tanh(c^t) into h^t, so
    W_o relates to h alone (same group)."""
    cell = lstm()
    graph = ef.compile_graph(cell, jnp.ones((B, I)))
    (group,) = graph.hidden_groups
    assert set(group.paths) == {("h",), ("c",)}
    hidden = {r.weight_path: set(r.hidden_paths) for r in graph.relations}
    assert hidden == {
        ("W_i", "weight"): {("h",), ("c",)},
        ("W_f", "weight"): {("h",), ("c",)},
        ("W_g", "weight"): {("h",), ("c",)},
        ("W_o", "weight"): {("h",)},
    }
    assert all(r.hidden_groups == (0,) and r.classification == ALL_DIRECT for r in graph.relations)
    # that W_o reaches c not at all is what the transition says too: ∂c^t/∂y_o = 0
    module = graph.module
    x = jnp.asarray(rand(3, B, I))
    leaves = module.state_leaves()
    w_o = _relation(graph, "W_o.weight")
    y = eqn_outputs(module, leaves, [x])[w_o.eqn_index]
    fn = _compat.jaxpr_as_fun(w_o.transitions[0])
    _, d_f = jax.jvp(lambda v: fn(v, *leaves, x)[0], (y,), (jnp.ones_like(y),))
    c_index, h_index = group.paths.index(("c",)), group.paths.index(("h",))
    assert np.all(np.asarray(d_f[..., c_index]) == 0.0)
    assert np.all(np.asarray(d_f[..., h_index]) != 0.0)


def test_alif_with_learned_tau_has_one_group_and_relates_tau(env64):
    graph = ef.compile_graph(alif_net(learn_tau=True), jnp.ones((B, I)))
    (group,) = graph.hidden_groups
    assert group.num_states == 2
    tau = _relation(graph, "layers.1.tau")
    assert tau.primitive == "etp_elemwise" and tau.op_kind == "elementwise"
    assert tau.hidden_groups == (0,) and set(tau.hidden_paths) == {("layers", 1, "V")}
    assert tau.x_shape is None and tau.y_shape == (N,) and tau.size == N
    assert [(o.key, o.path, o.leaf) for o in tau.operands] == [("weight", ("layers", 1, "tau"), "")]
    weight = _relation(graph, "layers.0.weight")
    assert weight.hidden_groups == (0,)


def test_alif_learned_adaptation_tau_relates_to_a(env64):
    model = L.Sequential(linear(0, I, N), L.ALIF(N, learn_tau_a=True))
    brainstate.nn.init_all_states(model, batch_size=B)
    graph = ef.compile_graph(model, jnp.ones((B, I)))
    relation = _relation(graph, "layers.1.tau_a")
    # ρ enters a^t = ρ a + z^{t-1} only; V^t uses the previous threshold
    assert relation.hidden_paths == (("layers", 1, "a"),) and relation.hidden_groups == (0,)


def test_stacked_blocks_relate_each_input_weight_to_its_own_layer_only(env64):
    model = L.Sequential(linear(0, I, N), L.LIF(N), linear(1, N, 5), L.LIF(5))
    brainstate.nn.init_all_states(model, batch_size=B)
    graph = ef.compile_graph(model, jnp.ones((B, I)))
    first, second = (_relation(graph, f"layers.{i}.weight") for i in (0, 2))
    assert first.hidden_groups == (0,) and first.hidden_paths == (("layers", 1, "V"),)
    assert second.hidden_groups == (1,) and second.hidden_paths == (("layers", 3, "V"),)
    # the first weight also reaches the second layer, but only through its weight
    assert dict(first.paths) == {("layers", 1, "V"): ALL_DIRECT, ("layers", 3, "V"): ALL_THROUGH_OTHER_ETP}
    assert first.classification == ALL_DIRECT
    assert _kinds(graph, DiagnosticKind.PARTIAL_PATH) == []


def test_conv_kernel_relates_to_lif_neurons_on_the_conv_output(env64):
    conv = L.Conv2d(2, 3, 3, w_init=rand(0, 3, 3, 2, 3, scale=0.3), b_init=rand(1, 3, scale=0.1))
    model = L.Sequential(conv, L.LIF((4, 4, 3)))
    brainstate.nn.init_all_states(model, batch_size=B)
    graph = ef.compile_graph(model, jnp.ones((B, 4, 4, 2)))
    (group,) = graph.hidden_groups
    assert group.shape == (B, 4, 4, 3)
    relation = _relation(graph, "layers.0.weight")
    assert relation.primitive == "etp_conv" and relation.op_kind == "conv"
    assert relation.hidden_paths == (("layers", 1, "V"),) and relation.classification == ALL_DIRECT
    assert relation.x_shape == (B, 4, 4, 2) and relation.y_shape == (B, 4, 4, 3)
    assert relation.size == 3 * 3 * 2 * 3 + 3


# --------------------------------------------------------------- custom modules


class Leaky(brainstate.nn.Module):
    """``h = 0.9 h + drive(x, w)`` with the weight used as ``drive`` says."""

    def __init__(self, drive, w_shape=(I, N), h_shape=(B, N)):
        super().__init__()
        self.drive = drive
        self.w = brainstate.ParamState(jnp.asarray(rand(0, *w_shape)))
        self.h = brainstate.HiddenState(jnp.asarray(rand(1, *h_shape)))

    def update(self, x):
        self.h.value = 0.9 * self.h.value + self.drive(x, self.w.value)
        return self.h.value


MASK = (rand(5, I, N) > 0).astype(np.float64)


def test_a_weight_used_through_plain_matmul_is_not_traced(env64):
    graph = ef.compile_graph(Leaky(lambda x, w: jnp.matmul(x, w)), jnp.ones((B, I)))
    assert graph.relations == ()
    (record,) = graph.diagnostics_of("w")
    assert record.kind is DiagnosticKind.NOT_TRACED and record.level is Level.WARNING
    assert "plain jnp" in record.message


def test_a_weight_masked_outside_the_op_is_traced_back_through_the_multiply(env64):
    graph = ef.compile_graph(Leaky(lambda x, w: ops.matmul(x, w * MASK)), jnp.ones((B, I)))
    relation = _relation(graph, "w")
    assert [(o.key, o.path, o.chain) for o in relation.operands] == [("weight", ("w",), ("mul",))]
    assert relation.hidden_paths == (("h",),)


def test_a_chain_of_plain_ops_is_recorded_in_order(env64):
    graph = ef.compile_graph(Leaky(lambda x, w: ops.matmul(x, jnp.abs(w) * MASK)), jnp.ones((B, I)))
    assert _relation(graph, "w").operands[0].chain == ("abs", "mul")


@pytest.mark.parametrize("drive, chain, map_", [
    (lambda x, w: ops.matmul(x, w * w), ("mul(parameter x parameter)",), "mul(parameter x parameter)"),
    (lambda x, w: ops.matmul(x, w ** 2), ("integer_pow",), "integer_pow"),
    (lambda x, w: ops.matmul(x, 2 * w + w), ("mul", "add"), None),
], ids=["w*w", "w**2", "2w+w"])
def test_a_product_of_a_parameter_with_itself_is_marked_nonlinear(env64, drive, chain, map_):
    """``w * w`` is as nonlinear as ``w ** 2``, but its chain read ``("mul",)``, the chain of
    a product by a constant: with update_every its traces' error went unwarned. ``2 w +
    w`` stays linear."""
    model = Leaky(drive)
    graph = ef.compile_graph(model, jnp.ones((B, I)))
    assert _relation(graph, "w").operands[0].chain == chain
    plan = make_plan(graph, "d_rtrl", alpha=None, batch=B)
    assert _nonlinear_map(plan.pairs[0], graph) == map_
    xs = jnp.asarray(rand(8, 6, B, I))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ef.online_fit(model, xs, jnp.zeros((6, B, N)), lambda out, y: ((out - y) ** 2).sum(), optax.sgd(0.1),
                      update_every=3, algo="d_rtrl")
    named = [str(w.message) for w in caught if issubclass(w.category, ef.ApproximationWarning)]
    assert named == ([] if map_ is None else [
        f"the online gradients of w (through {map_}) are approximate with update_every=3: their traces follow the "
        "value the op reads, mapped back to the parameter through the function's derivative at the current "
        "parameter, and the updates change the parameter within the traces' memory (the error grows with the "
        "learning rate); one update per sequence keeps them exact"])


def test_a_weight_fn_appears_in_the_chain(env64):
    model = L.Sequential(linear(0, I, N, mask=MASK), L.LIF(N))
    brainstate.nn.init_all_states(model, batch_size=B)
    graph = ef.compile_graph(model, jnp.ones((B, I)))
    relation = _relation(graph, "layers.0.weight")
    chains = {o.key: o.chain for o in relation.operands}
    assert chains == {"weight": ("weight_fn:Masked",), "bias": ()}
    assert "via weight_fn:Masked" in graph.explain("layers.0.weight")


def test_a_weight_output_wider_than_the_state_is_excluded_as_shape_mismatch(env64):
    """W: (I, 2N) gives y: (B, 2N), sliced into two (B, N) halves that drive h (B, N)."""

    def drive(x, w):
        y = ops.matmul(x, w)
        return y[:, :N] * jax.nn.sigmoid(y[:, N:])

    graph = ef.compile_graph(Leaky(drive, w_shape=(I, 2 * N)), jnp.ones((B, I)))
    assert graph.relations == ()
    records = graph.diagnostics_of("w")
    assert records and all(d.kind is DiagnosticKind.EXCLUDED_SHAPE_MISMATCH for d in records)
    assert any("(2, 8)" in d.message and "(2, 4)" in d.message for d in records)


def test_one_dense_output_read_by_every_unit_is_said_to_be_broadcast(env64):
    """Population coding: ``Linear(I, 1)``'s ``(B, 1)`` output drives every unit of
    ``h (B, N)``. It does broadcast; the record said it "does not broadcast"."""
    graph = ef.compile_graph(Leaky(lambda x, w: ops.matmul(x, w), w_shape=(I, 1)), jnp.ones((B, I)))
    assert graph.relations == ()
    messages = " ".join(d.message for d in graph.diagnostics_of("w"))
    assert f"output ({B}, 1) is broadcast over h ({B}, {N})" in messages, messages
    assert "one output per unit" in messages and "does not broadcast" not in messages, messages


def test_a_path_both_direct_and_through_another_weight_is_mixed_with_a_partial_path_warning(env64):
    class TwoPaths(brainstate.nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = brainstate.ParamState(jnp.asarray(rand(0, I, N)))
            self.w2 = brainstate.ParamState(jnp.asarray(rand(1, N, N)))
            self.h = brainstate.HiddenState(jnp.asarray(rand(2, B, N)))

        def update(self, x):
            y = ops.matmul(x, self.w1.value)
            self.h.value = 0.9 * self.h.value + y + ops.matmul(jnp.tanh(y), self.w2.value)
            return self.h.value

    graph = ef.compile_graph(TwoPaths(), jnp.ones((B, I)))
    first = _relation(graph, "w1")
    assert first.classification == MIXED and first.paths == ((("h",), MIXED),)
    assert _relation(graph, "w2").classification == ALL_DIRECT
    (partial,) = _kinds(graph, DiagnosticKind.PARTIAL_PATH)
    assert partial.weight_path == ("w1",) and partial.level is Level.WARNING


# ---------------------------------------------------------------- control flow


def _in_scan(x, w):
    y, _ = jax.lax.scan(lambda c, _: (jnp.tanh(ops.matmul(c, w)), None), x, None, length=2)
    return y


def _in_cond(x, w):
    return jax.lax.cond(jnp.sum(x) > 0, lambda a, b: ops.matmul(a, b), lambda a, b: a @ b, x, w)


def _in_cond_in_scan(x, w):
    def body(c, _):
        return jax.lax.cond(jnp.sum(c) > 0, lambda a: ops.matmul(a, w), lambda a: a, c), None

    y, _ = jax.lax.scan(body, x, None, length=2)
    return y


@pytest.mark.parametrize("drive, control", [(_in_scan, "scan"), (_in_cond, "cond")])
def test_an_etp_op_inside_control_flow_is_reported_with_primitive_and_weight(env64, drive, control):
    shape = (N, N) if control == "scan" else (I, N)
    x = jnp.ones((B, N if control == "scan" else I))
    graph = ef.compile_graph(Leaky(drive, w_shape=shape), x)
    assert graph.relations == ()
    records = _kinds(graph, DiagnosticKind.IN_CONTROL_FLOW)
    assert records
    for record in records:
        assert record.primitive == "etp_mm" and record.weight_path == ("w",)
        assert dict(record.context) == {"control_flow": control}
        assert record.level is Level.WARNING
        assert "etp_mm" in record.message and " w " in record.message and control in record.message


def test_an_etp_op_nested_two_control_flow_levels_deep_is_reported(env64):
    """A ``cond`` inside a ``scan``: the op is as invisible to online rules as one
    level deep, but ``_control_flow_diagnostics`` only looks one level in."""
    graph = ef.compile_graph(Leaky(_in_cond_in_scan, w_shape=(N, N)), jnp.ones((B, N)))
    records = _kinds(graph, DiagnosticKind.IN_CONTROL_FLOW)
    assert [(d.primitive, d.weight_path) for d in records] == [("etp_mm", ("w",))]


# ------------------------------------------------------------------ transitions


def _spiking(kind):
    if kind == "lif":
        model = lif_net(readout="linear")
    elif kind == "lif_learn_tau":
        model = L.Sequential(linear(0, I, N), L.LIF(N, tau=np.array([5.0, 10.0, 20.0, 8.0]), learn_tau=True,
                                                      v_reset=-0.2))
        brainstate.nn.init_all_states(model, batch_size=B)
    elif kind == "alif":
        model = alif_net(learn_tau=True)
    else:
        model = L.Sequential(linear(0, I, N), L.ALIF(N, tau_a=np.array([50.0, 100.0, 30.0, 80.0]), learn_tau_a=True))
        brainstate.nn.init_all_states(model, batch_size=B)
    return prime_spiking(model)


def _stacked():
    model = L.Sequential(linear(0, I, N), L.LIF(N), linear(1, N, 5), L.ALIF(5))
    brainstate.nn.init_all_states(model, batch_size=B)
    model.layers[1].V.value = jnp.asarray(rand(2, B, N) + 0.8)
    model.layers[3].V.value = jnp.asarray(rand(3, B, 5) + 0.8)
    model.layers[3].a.value = jnp.asarray(np.abs(rand(4, B, 5)))
    return model


TRANSITION_MODELS = {
    "lif": lambda: _spiking("lif"),
    "alif_learn_tau": lambda: _spiking("alif"),
    "gru": gru,
    "lstm": lstm,
    "stacked": _stacked,
}


@pytest.mark.parametrize("name", list(TRANSITION_MODELS))
def test_transitions_at_the_ops_actual_output_reproduce_the_groups_new_states(env64, name):
    model = TRANSITION_MODELS[name]()
    x = jnp.asarray(rand(11, B, I))
    graph = ef.compile_graph(model, x)
    module = graph.module
    leaves = module.state_leaves()
    positions = leaf_positions(module)
    _, new_leaves = module.evaluate(leaves, x)
    ys = eqn_outputs(module, leaves, [x])
    assert graph.relations
    for relation in graph.relations:
        assert len(relation.transitions) == len(relation.hidden_groups)
        eqn = module.jaxpr.eqns[relation.eqn_index]
        assert eqn.primitive.name == relation.primitive
        y = ys[relation.eqn_index]
        assert tuple(y.shape) == relation.y_shape
        for g, transition in zip(relation.hidden_groups, relation.transitions):
            group = graph.hidden_groups[g]
            (h_new,) = _compat.jaxpr_as_fun(transition)(y, *leaves, x)
            expected = jnp.stack([new_leaves[positions[p]] for p in group.paths], axis=-1)
            assert h_new.shape == (*group.shape, group.num_states)
            assert np.array_equal(np.asarray(h_new), np.asarray(expected)), (relation.weight_path, group.name)
    # the first layer's y is the affine map of the input, computed by hand
    first = graph.relations[0]
    first_linear = model.layers[0] if isinstance(model, L.Sequential) else None
    if first_linear is not None:
        w, b = linear_params(first_linear)
        np.testing.assert_allclose(np.asarray(ys[first.eqn_index]), np.asarray(x @ w + b), rtol=1e-13)


def test_relations_are_in_equation_order(env64):
    graph = ef.compile_graph(_stacked(), jnp.ones((B, I)))
    indices = [r.eqn_index for r in graph.relations]
    assert indices == sorted(indices) and len(set(indices)) == len(indices)


def _d_f(graph, weight, y_of, leaves, x):
    relation = _relation(graph, weight)
    (transition,) = relation.transitions
    fn = _compat.jaxpr_as_fun(transition)
    y = y_of[relation.eqn_index]
    _, tangent = jax.jvp(lambda v: fn(v, *leaves, x)[0], (y,), (jnp.ones_like(y),))
    group = graph.hidden_groups[relation.hidden_groups[0]]
    return {path[-1]: np.asarray(tangent[..., s]) for s, path in enumerate(group.paths)}


@pytest.mark.parametrize("reset, detach", [("soft", False), ("soft", True), ("hard", False)])
def test_lif_transition_derivatives_match_the_hand_derived_ones(env64, reset, detach):
    """LIF stores V before reset: V^t = α V_r + y with V_r the reset previous potential.
    So ∂V^t/∂y = 1 for the input weight, and ∂V^t/∂α = V_r for a learned τ (its op's
    output is α = exp(−dt/τ), shape (N,))."""
    model = L.Sequential(linear(0, I, N), L.LIF(N, tau=np.array([5.0, 10.0, 20.0, 8.0]), learn_tau=True,
                                                  v_threshold=1.0, v_reset=-0.2, reset=reset, detach_reset=detach))
    brainstate.nn.init_all_states(model, batch_size=B)
    prime_spiking(model)
    x = jnp.asarray(rand(12, B, I))
    graph = ef.compile_graph(model, x)
    leaves = graph.module.state_leaves()
    ys = eqn_outputs(graph.module, leaves, [x])
    np.testing.assert_array_equal(_d_f(graph, "layers.0.weight", ys, leaves, x)["V"], np.ones((B, N)))
    v = np.asarray(model.layers[1].V.value)
    z_prev = (v > 1.0).astype(np.float64)
    assert 0 < z_prev.sum() < z_prev.size
    v_r = v - z_prev * 1.2 if reset == "soft" else v * (1 - z_prev) - 0.2 * z_prev
    alpha = _relation(graph, "layers.1.tau")
    np.testing.assert_allclose(np.asarray(ys[alpha.eqn_index]), np.exp(-1.0 / tau_of(model.layers[1])), rtol=1e-14)
    np.testing.assert_allclose(_d_f(graph, "layers.1.tau", ys, leaves, x)["V"], v_r, rtol=1e-13)


def test_alif_transition_derivatives_match_the_hand_derived_ones(env64):
    """ALIF: a^t = ρ a + z^{t−1} (independent of this step's input), V^t = α V_r + y.
    Input weight: ∂V/∂y = 1, ∂a/∂y = 0. Learned τ_a (op output ρ): ∂a/∂ρ = a^{t−1}, ∂V/∂ρ = 0."""
    model = _spiking("alif_learn_tau_a")
    x = jnp.asarray(rand(13, B, I))
    graph = ef.compile_graph(model, x)
    leaves = graph.module.state_leaves()
    ys = eqn_outputs(graph.module, leaves, [x])
    d_f = _d_f(graph, "layers.0.weight", ys, leaves, x)
    np.testing.assert_array_equal(d_f["V"], np.ones((B, N)))
    np.testing.assert_array_equal(d_f["a"], np.zeros((B, N)))
    d_f = _d_f(graph, "layers.1.tau_a", ys, leaves, x)
    np.testing.assert_allclose(d_f["a"], np.asarray(model.layers[1].a.value), rtol=1e-14)
    np.testing.assert_array_equal(d_f["V"], np.zeros((B, N)))


# ------------------------------------------------------------------ determinism

_SCRIPT = textwrap.dedent(
    """
    import brainstate, jax.numpy as jnp, numpy as np
    import etrace_fit as ef
    from etrace_fit import layers as L

    rng = np.random.default_rng(0)
    with brainstate.environ.context(precision=64, dt=1.0):
        models = [
            L.Sequential(L.Linear(3, 4, w_init=rng.standard_normal((3, 4))), L.ALIF(4, learn_tau=True),
                         L.Linear(4, 5, w_init=rng.standard_normal((4, 5))), L.LIF(5, learn_tau=True),
                         L.LeakyRateReadout(5, 2, w_init=rng.standard_normal((5, 2)), learn_tau=True)),
            L.LSTMCell(3, 4, w_init=rng.standard_normal((7, 4))),
            L.GRUCell(3, 4, w_init=rng.standard_normal((7, 4))),
        ]
        for model in models:
            brainstate.nn.init_all_states(model, batch_size=2)
            graph = ef.compile_graph(model, jnp.ones((2, 3)))
            print(graph.report())
            print([(r.primitive, r.weight_path) for r in graph.relations])
            print([(r.hidden_paths, r.paths, [(o.key, o.path, o.chain) for o in r.operands]) for r in graph.relations])
            print([g.paths for g in graph.hidden_groups])
            print([str(d) for d in graph.diagnostics])
    """
)


def test_compiling_in_two_processes_gives_identical_output():
    def launch(seed):
        env = dict(os.environ, PYTHONHASHSEED=str(seed), JAX_PLATFORMS="cpu")
        return subprocess.Popen([sys.executable, "-c", _SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

    processes = [launch(1), launch(12345)]
    outputs = []
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        outputs.append(out)
    assert outputs[0] == outputs[1]
    assert "layers.0.weight" in outputs[0] and "W_r.weight" in outputs[0]


def test_two_hidden_states_holding_the_same_value_are_both_related(env64):
    """w drives h^t directly, and last^t is the same array: both are reached.
    (relations() keys hidden outputs by jaxpr variable in a dict, so one is dropped.)"""
    graph = ef.compile_graph(CopiesItsState(), jnp.ones((B, I)))
    (group,) = graph.hidden_groups
    assert set(group.paths) == {("h",), ("last",)}
    assert set(_relation(graph, "w").hidden_paths) == {("h",), ("last",)}

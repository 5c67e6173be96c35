"""D-RTRL (etrace_fit/algorithms/d_rtrl.py) equals BPTT where it is exact.

D-RTRL is exact for the weights into a layer whose only recurrence is per unit, when a
stateless layer reads it out: LIF, ALIF (a group of S = 2 states), a leaky tanh rate
layer, learned time constants (elementwise op), and a convolution feeding LIF neurons on
its output grid; also through a mask and a weight function (the gradient is mapped back
through them) and for one weight feeding two LIF layers. The reference is
``brainstate.transform.grad`` over a ``for_loop`` (``_helpers.reference_bptt``), never
the library's own ``algo='bptt'`` (which is itself compared with the reference).

The readout (a stateless Linear) gets its gradient directly, so it is exact for every
rule. Tolerances: max|a − b| / max|b| per leaf < 1e-5 (float64) and < 1e-4 (float32).
"""

from __future__ import annotations

import brainstate
import jax.numpy as jnp
import numpy as np
import pytest

import etrace_fit as ef

from ._helpers import (B, C, CASE_IDS, CASES, CORE, LC, LOSS_RTOL, MODELS, SPIKING, TOL, I, N, O, T, Case,
                       assert_grads_match, assert_losses_match, get_case, leaves_by_name, rand)


def _readout_leaves(case):
    last = len(case.model.layers) - 1
    return [f"layers.{last}.weight"]


@pytest.mark.parametrize("name,precision", CASES, ids=CASE_IDS)
def test_case_is_not_degenerate(name, precision):
    """Neurons spike at moderate rates and every reference gradient is non-zero."""
    case = get_case(name, precision)
    if name in SPIKING and precision == 64:  # same spikes in float32
        spikes = case.forward(lambda x: case.model.layers[1](case.model.layers[0](x)))
        fraction = float(spikes.mean())
        assert set(np.unique(spikes)) <= {0.0, 1.0}
        assert 0.0 < fraction < 0.6, fraction
        # not the same few neurons all the time: most neurons spike at some point
        per_neuron = spikes.reshape(spikes.shape[0] * spikes.shape[1], -1).max(axis=0)
        assert per_neuron.mean() > 0.5
    for leaf_name, leaf in leaves_by_name(case.ref_grads).items():
        assert np.all(np.isfinite(leaf)), leaf_name
        assert np.max(np.abs(leaf)) > 0, leaf_name
    assert case.ref_losses.shape == (T,)


@pytest.mark.parametrize("name,precision", CASES, ids=CASE_IDS)
def test_d_rtrl_equals_bptt(name, precision):
    case = get_case(name, precision)
    grads, losses = case.run("d_rtrl")
    errors = assert_grads_match(grads, case.ref_grads, TOL[precision])
    assert len(errors) == len(leaves_by_name(case.ref_grads))
    assert_losses_match(losses, case.ref_losses, LOSS_RTOL[precision])
    assert all(np.asarray(leaf).dtype == np.dtype(f"float{precision}") for leaf in leaves_by_name(grads).values())


@pytest.mark.parametrize("algo", ["esd_rtrl", "hybrid"])
@pytest.mark.parametrize("name", CORE)
def test_readout_exact_for_every_rule(name, algo):
    case = get_case(name, 64)
    grads, losses = case.run(algo)
    assert_grads_match(grads, case.ref_grads, TOL[64], only=_readout_leaves(case))
    assert_losses_match(losses, case.ref_losses, LOSS_RTOL[64])


@pytest.mark.parametrize("name", CORE)
def test_hybrid_picks_d_rtrl_on_small_layers_and_is_exact(name):
    """At these sizes the D-RTRL trace is within 4x of ES-D-RTRL's, so hybrid = D-RTRL."""
    case = get_case(name, 64)
    with case.env():
        _, plan = ef.algorithms.plan_for(case.model, case.xs, case.ys, case.step_loss, algo="hybrid")
    assert [rule.name for rule in plan.rules] == ["d_rtrl"] * len(plan.pairs)
    grads, _ = case.run("hybrid")
    assert_grads_match(grads, case.ref_grads, TOL[64])


@pytest.mark.parametrize("name", ["lif", "conv1d_lif"])
def test_library_bptt_equals_brainstate_reference(name):
    case = get_case(name, 64)
    grads, losses = case.run("bptt")
    assert_grads_match(grads, case.ref_grads, 1e-12)
    assert_losses_match(losses, case.ref_losses, 1e-12)


def test_plan_of_learned_tau_has_an_elementwise_pair():
    built = Case(MODELS['lif_learn_tau'][0], (4, B, I), (4, B, O), 32)
    with built.env():
        _, plan = ef.algorithms.plan_for(built.model, built.xs, built.ys, built.step_loss, algo="d_rtrl")
    kinds = {pair.relation.weight_path: pair.kind for pair in plan.pairs}
    assert kinds == {("layers", 0, "weight"): "dense", ("layers", 1, "tau"): "elementwise"}
    assert plan.rule_of("layers.1.tau") == ("d_rtrl",)
    assert plan.rule_of(("layers", 1, "tau")) == ("d_rtrl",)
    assert plan.rule_of("layers.2.weight") == ()  # the readout is not traced: direct gradient


def test_d_rtrl_trace_shapes_and_bytes():
    """The trace is ``B·P·K·O·S`` (the docstring's formula), bias column included."""
    built = Case(MODELS['alif'][0], (4, B, I), (4, B, O), 32)
    with built.env():
        _, plan = ef.algorithms.plan_for(built.model, built.xs, built.ys, built.step_loss, algo="d_rtrl")
    (pair,) = plan.pairs
    assert (pair.positions, pair.patch, pair.outputs, pair.num_states) == (1, I + 1, N, 2)
    assert plan.trace_bytes() == (B * 1 * (I + 1) * N * 2 * 4,)
    trace = plan.rules[0].init_traces(pair, B, jnp.float32)
    assert trace.shape == (B, 1, 2, I + 1, N) and float(jnp.abs(trace).sum()) == 0.0  # units on the fast axis

    conv = Case(MODELS['conv1d_lif'][0], (4, B, LC, 2), (4, B, O), 32)
    with conv.env():
        _, plan = ef.algorithms.plan_for(conv.model, conv.xs, conv.ys, conv.step_loss, algo="d_rtrl")
    (pair,) = plan.pairs
    assert (pair.positions, pair.patch, pair.outputs, pair.num_states) == (LC, 3 * 2 + 1, C, 1)
    assert plan.trace_bytes() == (B * LC * 7 * C * 1 * 4,)


def test_d_rtrl_from_nonzero_initial_state():
    """The sequence starts from the model's current hidden states (not zeros)."""
    from ._helpers import reference_bptt, to_host

    with brainstate.environ.context(precision=64, dt=1.0):
        model = MODELS['alif'][0]()
        brainstate.nn.init_all_states(model, batch_size=B)
        xs = jnp.asarray(rand(20, 12, B, I, scale=0.8, shift=0.4))
        ys = jnp.asarray(rand(21, 12, B, O))
        hidden = model.states(brainstate.HiddenState)
        initial = {("layers", 1, "V"): jnp.asarray(rand(22, B, N, scale=0.6, shift=0.7)),
                   ("layers", 1, "a"): jnp.asarray(np.abs(rand(23, B, N)))}
        assert set(initial) == set(hidden.keys())
        ref_grads, ref_losses = reference_bptt(model, xs, ys, lambda o, y: jnp.sum((o - y) ** 2), B, initial=initial)
        zero_grads, _ = reference_bptt(model, xs, ys, lambda o, y: jnp.sum((o - y) ** 2), B)
        for path, value in initial.items():
            hidden[path].value = value
        grads, losses = ef.sequence_grad(model, xs, ys, lambda o, y: jnp.sum((o - y) ** 2), algo="d_rtrl")
        grads = to_host(grads)
    assert_grads_match(grads, ref_grads, 1e-5)
    assert_losses_match(losses, ref_losses, 1e-10)
    # the initial state matters (else the test would prove nothing)
    diff = leaves_by_name(zero_grads)["layers.0.weight['weight']"] - leaves_by_name(ref_grads)["layers.0.weight['weight']"]
    assert np.max(np.abs(diff)) > 1e-3


def test_shared_weight_has_one_pair_per_layer_it_drives():
    case = get_case("shared_weight", 64)
    with case.env():
        _, plan = ef.algorithms.plan_for(case.model, case.xs, case.ys, case.step_loss, algo="d_rtrl")
    assert plan.rule_of("inp.weight") == ("d_rtrl", "d_rtrl")
    assert sorted(pair.group.name for pair in plan.pairs) == ["(fast.V)", "(slow.V)"]

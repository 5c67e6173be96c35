"""The online step (DESIGN.md §5.6) and the scan over a sequence.

At every step (DESIGN.md §5.8): run the step forward as a function of the weights and
the previous hidden values ``h^{t-1}``; one pull-back of the step loss gives every
weight's exact one-step gradient ``∂L^t/∂θ|h^{t-1}`` and the learning signal
``∂L^t/∂h^{t-1}``, which each pair's rule contracts with its traces of step ``t-1``
(the history part) before advancing them. ``D`` and ``Df`` come from one linearisation
of the step with the related ops' outputs as inputs. Read ``sequence.py`` for the
public entry point.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from .. import _compat
from ..compiler import ETraceGraph, group_jacobian
from ..compiler._dataflow import cut_step
from ..ops import etp_op_info
from .base import PairSignals, Rule, TracedPair

__all__ = ["Collected", "OnlineProgram", "build_online"]


class Collected(NamedTuple):
    """What a run also returns with ``collect=True``: the model's ``outputs`` at every
    step (its output pytree, each leaf with a leading time axis) and each traced pair's
    final ``trace_norms`` per sample (``(B,)`` in ``pairs`` order; none for BPTT)."""

    outputs: Any
    trace_norms: list


@dataclasses.dataclass(frozen=True)
class OnlineProgram:
    """A pure function over one sequence and what it needs to map results back.

    ``run(weight_leaves, state_leaves, xs_leaves, targets, collect=False) -> (weight
    grads, losses, final state leaves[, Collected])``: ``weight_leaves`` in
    ``module.weights`` leaf order, ``state_leaves`` all states' leaves (the weights'
    among them are ignored), ``xs`` time-major. ``pairs`` names what the trace norms
    belong to.
    """

    run: Callable[..., Any]
    run_with_updates: Callable[..., Any] | None = None
    pairs: tuple = ()


def build_online(
    graph: ETraceGraph,
    pairs: tuple[TracedPair, ...],
    rules: tuple[Rule, ...],
    step_loss: Callable[[Any, Any], jax.Array],
    *,
    trace_dtype: Any = jnp.float32,
) -> OnlineProgram:
    """The online program for ``pairs`` trained by ``rules`` (one rule per pair)."""
    module = graph.module
    jaxpr, consts = module.closed_jaxpr.jaxpr, list(module.closed_jaxpr.consts)
    num_outputs = len(module.output_vars)
    weight_positions = module.weight_leaf_positions
    hidden = module.hidden

    # What to read off the forward pass for each pair: the op's x and y.
    eqns = module.jaxpr.eqns
    pair_eqns = [eqns[p.relation.eqn_index] for p in pairs]
    capture = {}
    for eqn in pair_eqns:
        capture[eqn.outvars[0]] = True
        if eqn.primitive.name != "etp_elemwise":
            capture[eqn.invars[0]] = True

    hidden_positions = [module.leaf_offsets[state.path] for state in hidden]
    # Dense and conv relations: their one-step gradient X^T δy is left to the rule (one
    # GEMM with the history part), so the pull-back stops at their trainable operands
    # and returns δy = ∂L^t/∂y instead. Elementwise parameters keep the weight pull-back.
    fused = list(dict.fromkeys(p.relation.eqn_index for p in pairs if p.kind != "elementwise"))
    fused_positions = {i: etp_op_info(eqns[i].primitive).trainable_positions(len(eqns[i].invars)).values()
                       for i in fused}

    def forward(weight_leaves, hidden_prev, y_perturbations, state_leaves, input_leaves, target):
        """One step as a function of the weights, the previous hidden values and a
        perturbation of each fused relation's output."""
        leaves = list(state_leaves)
        for n, position in enumerate(weight_positions):
            leaves[position] = weight_leaves[n]
        for position, value in zip(hidden_positions, hidden_prev):
            leaves[position] = value
        perturbation_of = dict(zip(fused, y_perturbations))
        captured = {}

        def override(index, eqn, invals):
            if index not in perturbation_of:
                return None
            invals = list(invals)
            for position in fused_positions[index]:
                invals[position] = lax.stop_gradient(invals[position])
            return [_compat.eval_equation(eqn, invals)[0] + perturbation_of[index]]

        def on_write(var, value):
            if var in capture:
                captured[var] = value
            return value

        outs = _compat.interpret(jaxpr, consts, [*input_leaves, *leaves], override=override, on_write=on_write)
        outputs = jax.tree.unflatten(module.output_treedef, outs[:num_outputs])
        loss = step_loss(outputs, target)
        return loss, (outs[num_outputs:], [captured[var] for var in capture], outputs)

    # D and Df from one linearisation of all groups' transitions at once: the step with
    # every related op's output y an input and other trainable ops held constant.
    groups = [g for g in graph.hidden_groups if any(p.group.index == g.index for p in pairs)]
    relation_eqns = list(dict.fromkeys(p.relation.eqn_index for p in pairs))
    state_position = module.leaf_offsets

    def transition_derivatives(leaves, input_leaves, captured):
        h_prev = [jnp.stack([leaves[state_position[path]] for path in g.paths], axis=-1) for g in groups]
        ys = [captured[eqns[i].outvars[0]] for i in relation_eqns]

        def transitions(h_groups, ys_):
            step_leaves = list(leaves)
            for group, h in zip(groups, h_groups):
                for s, path in enumerate(group.paths):
                    step_leaves[state_position[path]] = h[..., s]
            outs = cut_step(module, step_leaves, input_leaves, replace=dict(zip(relation_eqns, ys_)))
            return [jnp.stack([outs[num_outputs + state_position[path]] for path in g.paths], axis=-1) for g in groups]

        _, linear = jax.linearize(transitions, h_prev, ys)
        zero_h = [jnp.zeros_like(h) for h in h_prev]
        zero_y = [jnp.zeros_like(y) for y in ys]
        jacobians = {}
        for n, group in enumerate(groups):
            if not group.elementwise:  # units mix: the exact per-unit blocks, at a cost
                jacobians[group.index] = group_jacobian(module, group, leaves, input_leaves)
                continue
            columns = []
            for s in range(group.num_states):
                tangent = list(zero_h)
                tangent[n] = zero_h[n].at[..., s].set(1.0)
                columns.append(linear(tangent, zero_y)[n])
            jacobians[group.index] = jnp.stack(columns, axis=-1)
        sensitivities = {}
        for m, eqn_index in enumerate(relation_eqns):
            tangent = list(zero_y)
            tangent[m] = jnp.ones_like(ys[m])
            out = linear(zero_h, tangent)
            for pair in pairs:
                if pair.relation.eqn_index == eqn_index:
                    sensitivities[pair.index] = out[groups.index(pair.group)]
        return jacobians, sensitivities

    def step(weight_leaves, state_leaves, input_leaves, target, traces, t):
        hidden_prev = [state_leaves[position] for position in hidden_positions]
        y_zeros = [jnp.zeros(eqns[i].outvars[0].aval.shape, eqns[i].outvars[0].aval.dtype) for i in fused]
        loss, pullback, (new_leaves, captured_values, outputs) = jax.vjp(
            lambda w, h, p: forward(w, h, p, state_leaves, input_leaves, target), list(weight_leaves), hidden_prev,
            y_zeros, has_aux=True,
        )
        captured = dict(zip(capture, captured_values))
        # One pull-back with h^{t-1} as an input (DESIGN.md §5.8): the exact one-step
        # gradient ∂L^t/∂θ|h^{t-1} (for fused relations as δy = ∂L^t/∂y, which the rule
        # turns into X^T δy), and the learning signal ∂L^t/∂h^{t-1} that the rules
        # contract with the traces of the step before.
        weight_grads, signals, output_grads = pullback(jnp.ones_like(loss))
        output_grad_of = dict(zip(fused, output_grads))

        leaves = list(state_leaves)
        for n, position in enumerate(weight_positions):
            leaves[position] = weight_leaves[n]
        jacobians, sensitivities = transition_derivatives(leaves, list(input_leaves), captured)
        signal_of = {s.path: signals[k] for k, s in enumerate(hidden)}

        pair_grads, new_traces, one_step_taken = [], [], set()
        for pair, rule, eqn, trace in zip(pairs, rules, pair_eqns, traces):
            index = pair.relation.eqn_index
            dY = None
            if index in output_grad_of and index not in one_step_taken:  # once per relation
                one_step_taken.add(index)
                dY = pair.canonical_units(output_grad_of[index], 0).astype(trace_dtype)
            Df = sensitivities[pair.index]
            G = jnp.stack([signal_of[path] for path in pair.group.paths], axis=-1)
            batch = G.shape[0]
            x = None if eqn.primitive.name == "etp_elemwise" else captured[eqn.invars[0]]
            canonical = PairSignals(
                X=pair.canonical_x(x, eqn.params, batch, trace_dtype),
                D=pair.canonical_units(jacobians[pair.group.index], 2).astype(trace_dtype),
                Df=pair.canonical_units(Df, 1).astype(trace_dtype),
                G=pair.canonical_units(G, 1).astype(trace_dtype),
                dY=dY,
            )
            grad, trace = rule.step(trace, canonical, t)
            pair_grads.append(grad)
            new_traces.append(trace)
        return loss, outputs, new_leaves, list(weight_grads), pair_grads, new_traces

    batch = pairs[0].group.shape[0] if pairs else 1
    accumulate = jnp.promote_types(trace_dtype, jnp.float32)  # bfloat16 traces, float32 sums

    def zero_accumulators(weight_leaves):
        return ([jnp.zeros_like(w) for w in weight_leaves],
                [jnp.zeros((pair.patch, pair.outputs), accumulate) for pair in pairs])

    def weight_gradients(weight_leaves, weight_acc, pair_acc, state_leaves, input_leaves):
        """Accumulated gradients per weight leaf: the one-step / direct parts plus each
        pair's effective-weight gradient mapped back through the op's weight function
        and any chain (mask, ...) between the ParamState and the op."""
        if not pairs:
            return list(weight_acc)
        cotangents = _effective_cotangents(pairs, pair_acc)
        values, pull = jax.vjp(lambda w: _effective_values(module, w, state_leaves, input_leaves, weight_positions,
                                                           list(cotangents)), list(weight_leaves))
        mapped = pull({slot: cotangents[slot].astype(values[slot].dtype) for slot in values})[0]
        return [a + m.astype(a.dtype) for a, m in zip(weight_acc, mapped)]

    def scan_body(weight_leaves, carry, inputs):
        state_leaves, traces, weight_acc, pair_acc, t = carry
        input_leaves, target = inputs
        loss, outputs, new_leaves, weight_grads, pair_grads, traces = step(
            weight_leaves, state_leaves, input_leaves, target, traces, t)
        weight_acc = [a + g for a, g in zip(weight_acc, weight_grads)]
        pair_acc = [a + g.astype(a.dtype) for a, g in zip(pair_acc, pair_grads)]
        return (list(new_leaves), traces, weight_acc, pair_acc, t + 1), (loss, outputs)

    def initial_traces():
        return [rule.init_traces(pair, batch, trace_dtype) for pair, rule in zip(pairs, rules)]

    def trace_norms(traces, t):
        return [rule.trace_norm(trace, t) for rule, trace in zip(rules, traces)]

    def run(weight_leaves, state_leaves, xs_leaves, targets, collect=False):
        weight_leaves = list(weight_leaves)
        carry = (list(state_leaves), initial_traces(), *zero_accumulators(weight_leaves), jnp.zeros((), jnp.int32))
        (final_leaves, traces, weight_acc, pair_acc, t), (losses, outputs) = lax.scan(
            lambda c, i: scan_body(weight_leaves, c, i), carry, (list(xs_leaves), targets))
        grads = weight_gradients(weight_leaves, weight_acc, pair_acc, state_leaves, [x[0] for x in xs_leaves])
        if collect:
            return grads, losses, final_leaves, Collected(outputs, trace_norms(traces, t))
        return grads, losses, final_leaves

    def run_with_updates(weight_leaves, state_leaves, xs_leaves, targets, optimizer, opt_state, every, collect=False):
        """As ``run``, but applies ``optimizer`` every ``every`` steps inside the scan
        (traces carry on across updates: true online learning). Returns ``(weights,
        opt_state, losses, final state leaves)``, and a :class:`Collected` with
        ``collect``."""

        def apply(weights, opt_state, weight_acc, pair_acc, state_leaves, input_leaves):
            grads = weight_gradients(weights, weight_acc, pair_acc, state_leaves, input_leaves)
            updates, opt_state = optimizer.update(grads, opt_state, weights)
            return list(optax.apply_updates(weights, updates)), opt_state

        def body(carry, inputs):
            weights, opt_state, inner = carry
            inner, (loss, outputs) = scan_body(weights, inner, inputs)
            state_leaves, traces, weight_acc, pair_acc, t = inner
            weights, opt_state = lax.cond(
                t % every == 0,
                lambda: apply(weights, opt_state, weight_acc, pair_acc, state_leaves, inputs[0]),
                lambda: (weights, opt_state),
            )
            weight_acc, pair_acc = lax.cond(
                t % every == 0, lambda: zero_accumulators(weights), lambda: (weight_acc, pair_acc))
            return (weights, opt_state, (state_leaves, traces, weight_acc, pair_acc, t)), (loss, outputs)

        inner = (list(state_leaves), initial_traces(), *zero_accumulators(list(weight_leaves)), jnp.zeros((), jnp.int32))
        (weights, opt_state, inner), (losses, outputs) = lax.scan(
            body, (list(weight_leaves), opt_state, inner), (list(xs_leaves), targets))
        final_leaves, traces, weight_acc, pair_acc, t = inner
        # A last partial window still updates the weights.
        weights, opt_state = lax.cond(
            t % every != 0,
            lambda: apply(weights, opt_state, weight_acc, pair_acc, final_leaves, [x[-1] for x in xs_leaves]),
            lambda: (weights, opt_state),
        )
        if collect:
            return weights, opt_state, losses, final_leaves, Collected(outputs, trace_norms(traces, t))
        return weights, opt_state, losses, final_leaves

    return OnlineProgram(run=run, run_with_updates=run_with_updates, pairs=tuple(pairs))


def _effective_cotangents(pairs, pair_acc) -> dict:
    """Summed effective-operand gradients keyed by ``(equation index, operand key)``."""
    totals: dict = {}
    for pair, grad in zip(pairs, pair_acc):
        for key, value in pair.effective_grads(grad).items():
            slot = (pair.relation.eqn_index, key)
            totals[slot] = totals[slot] + value if slot in totals else value
    return totals


def _effective_values(module, weight_leaves, state_leaves, input_leaves, weight_positions, slots) -> dict:
    """The effective operands (after weight functions) of the pairs' ops as functions
    of the weight leaves, read off one evaluation of the step."""
    leaves = list(state_leaves)
    for n, position in enumerate(weight_positions):
        leaves[position] = weight_leaves[n]
    eqns = module.jaxpr.eqns
    wanted = {}
    for eqn_index, key in slots:
        eqn = eqns[eqn_index]
        _, trainables = etp_op_info(eqn.primitive).split_operands(list(eqn.invars))
        wanted[(eqn_index, key)] = (trainables[key], eqn)
    captured = {}
    variables = {var for var, _ in wanted.values() if not isinstance(var, _compat.Literal)}

    def on_write(var, value):
        if var in variables:
            captured[var] = value
        return value

    _compat.interpret(module.jaxpr, list(module.closed_jaxpr.consts), [*input_leaves, *leaves], on_write=on_write)
    values = {}
    for slot, (var, eqn) in wanted.items():
        operand = captured[var]
        if slot[1] == "weight":
            fn = eqn.params.get("fn") if eqn.primitive.name == "etp_elemwise" else eqn.params.get("weight_fn")
            operand = operand if fn is None else fn(operand)
        values[slot] = operand
    return values

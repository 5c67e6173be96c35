"""The online step (DESIGN.md §5.6) and the scan over a sequence.

At every step: run the step forward with each new hidden value cut from the weights
(``stop_gradient(ĥ) + p``), so that one VJP yields the learning signal ``g = ∂L/∂p`` and
the direct gradient of every weight (paths that avoid the hidden states); a second
pull-back of ``g`` through the uncut hidden values gives the one-step gradient of the
weights no rule traces. ``D`` and ``Df`` come from forward-mode JVPs of the compiler's
transitions; each pair's rule updates its traces and returns its gradient. Read
``sequence.py`` for the public entry point.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax

from .. import _compat
from ..compiler import ETraceGraph, group_jacobian, hidden_outputs
from ..ops import etp_op_info
from .base import PairSignals, Rule, TracedPair

__all__ = ["OnlineProgram", "build_online"]


@dataclasses.dataclass(frozen=True)
class OnlineProgram:
    """A pure function over one sequence and what it needs to map results back.

    ``run(weight_leaves, state_leaves, xs_leaves, targets) -> (weight grads, losses,
    final state leaves)``: ``weight_leaves`` in ``module.weights`` leaf order,
    ``state_leaves`` all states' leaves (the weights' among them are ignored), ``xs``
    time-major.
    """

    run: Callable[..., Any]


def _weight_positions(module) -> list[int]:
    positions, cursor = [], 0
    for state in module.states:
        if state.kind == "weight":
            positions.extend(range(cursor, cursor + len(state.in_vars)))
        cursor += len(state.in_vars)
    return positions


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
    weight_positions = _weight_positions(module)
    hidden = module.hidden
    at_production, at_output = hidden_outputs(module)
    leaf_index = {}
    cursor = 0
    for state in module.states:
        for var in state.in_vars:
            leaf_index[var] = cursor
            cursor += 1
    weight_vars = [v for s in module.weights for v in s.in_vars]

    # What to read off the forward pass for each pair: the op's x and y.
    eqns = module.jaxpr.eqns
    pair_eqns = [eqns[p.relation.eqn_index] for p in pairs]
    capture = {}
    for eqn in pair_eqns:
        capture[eqn.outvars[0]] = True
        if eqn.primitive.name != "etp_elemwise":
            capture[eqn.invars[0]] = True

    # Weight leaves a rule traces (through its relation's operands); the rest get the
    # one-step gradient (direct + pulled back through the new hidden values).
    traced_leaves = set()
    weight_leaf_number = {(s.path, leaf): n for n, (s, leaf) in enumerate(
        (s, leaf) for s in module.weights for leaf in s.leaf_names)}
    for pair in pairs:
        for operand in pair.relation.operands:
            traced_leaves.add(weight_leaf_number[(operand.path, operand.leaf)])
    one_step = [n for n in range(len(weight_vars)) if n not in traced_leaves]

    def forward(weight_leaves, perturbations, state_leaves, input_leaves, target):
        leaves = list(state_leaves)
        for n, position in enumerate(weight_positions):
            leaves[position] = weight_leaves[n]
        captured, uncut = {}, [None] * len(hidden)

        def on_write(var, value):
            if var in capture:
                captured[var] = value
            k = at_production.get(var)
            if k is None:
                return value
            uncut[k] = value
            return lax.stop_gradient(value) + perturbations[k]

        outs = _compat.interpret(jaxpr, consts, [*input_leaves, *leaves], on_write=on_write)
        for k, position in at_output.items():
            uncut[k] = outs[position]
            outs[position] = lax.stop_gradient(outs[position]) + perturbations[k]
        outputs = jax.tree.unflatten(module.output_treedef, outs[:num_outputs])
        loss = step_loss(outputs, target)
        return (loss, uncut), (outs[num_outputs:], [captured[var] for var in capture])

    def step(weight_leaves, state_leaves, input_leaves, target, traces, t):
        perturbations = [jnp.zeros(s.in_vars[0].aval.shape, s.in_vars[0].aval.dtype) for s in hidden]
        (loss, uncut), pullback, (new_leaves, captured_values) = jax.vjp(
            lambda w, p: forward(w, p, state_leaves, input_leaves, target), list(weight_leaves), perturbations,
            has_aux=True,
        )
        captured = dict(zip(capture, captured_values))
        direct, signals = pullback((jnp.ones_like(loss), [jnp.zeros_like(h) for h in uncut]))
        weight_grads = list(direct)
        if one_step:
            through, _ = pullback((jnp.zeros_like(loss), list(signals)))
            for n in one_step:
                weight_grads[n] = weight_grads[n] + through[n]
        for n in traced_leaves:
            weight_grads[n] = direct[n]

        # The step as the transitions see it: current weights in the state leaves.
        leaves = list(state_leaves)
        for n, position in enumerate(weight_positions):
            leaves[position] = weight_leaves[n]
        jacobians = {g.index: group_jacobian(module, g, leaves, list(input_leaves)) for g in graph.hidden_groups
                     if any(p.group.index == g.index for p in pairs)}
        signal_of = {s.path: signals[k] for k, s in enumerate(hidden)}

        pair_grads, new_traces = [], []
        for pair, rule, eqn, trace in zip(pairs, rules, pair_eqns, traces):
            y = captured[eqn.outvars[0]]
            _, Df = jax.jvp(
                lambda y_: _compat.jaxpr_as_fun(pair.transition)(y_, *leaves, *input_leaves)[0],
                (y,), (jnp.ones_like(y),),
            )
            G = jnp.stack([signal_of[path] for path in pair.group.paths], axis=-1)
            batch = G.shape[0]
            x = None if eqn.primitive.name == "etp_elemwise" else captured[eqn.invars[0]]
            canonical = PairSignals(
                X=pair.canonical_x(x, eqn.params, batch, trace_dtype),
                D=pair.canonical_units(jacobians[pair.group.index], 2).astype(trace_dtype),
                Df=pair.canonical_units(Df, 1).astype(trace_dtype),
                G=pair.canonical_units(G, 1).astype(trace_dtype),
            )
            grad, trace = rule.step(trace, canonical, t)
            pair_grads.append(grad)
            new_traces.append(trace)
        return loss, new_leaves, weight_grads, pair_grads, new_traces

    def run(weight_leaves, state_leaves, xs_leaves, targets):
        weight_leaves = list(weight_leaves)
        batch = pairs[0].group.shape[0] if pairs else 1
        traces0 = [rule.init_traces(pair, batch, trace_dtype) for pair, rule in zip(pairs, rules)]
        grads0 = [jnp.zeros_like(w) for w in weight_leaves]
        accumulate = jnp.promote_types(trace_dtype, jnp.float32)  # bfloat16 traces, float32 sums
        pair_grads0 = [jnp.zeros((pair.patch, pair.outputs), accumulate) for pair in pairs]

        def body(carry, inputs):
            state_leaves, traces, weight_acc, pair_acc, t = carry
            input_leaves, target = inputs
            loss, new_leaves, weight_grads, pair_grads, traces = step(
                weight_leaves, state_leaves, input_leaves, target, traces, t)
            weight_acc = [a + g for a, g in zip(weight_acc, weight_grads)]
            pair_acc = [a + g.astype(a.dtype) for a, g in zip(pair_acc, pair_grads)]
            return (list(new_leaves), traces, weight_acc, pair_acc, t + 1), loss

        carry = (list(state_leaves), traces0, grads0, pair_grads0, jnp.zeros((), jnp.int32))
        (final_leaves, _, weight_acc, pair_acc, _), losses = lax.scan(body, carry, (list(xs_leaves), targets))
        # Map each pair's effective-weight gradient back to the ParamState leaves
        # through the op's weight function and any chain (mask, ...) before it.
        if pairs:
            first_inputs = [x[0] for x in xs_leaves]
            cotangents = _effective_cotangents(pairs, pair_acc)
            values, pull = jax.vjp(lambda w: _effective_values(module, w, state_leaves, first_inputs, weight_positions,
                                                               list(cotangents)), weight_leaves)
            mapped = pull({slot: cotangents[slot].astype(values[slot].dtype) for slot in values})[0]
            weight_acc = [a + m.astype(a.dtype) for a, m in zip(weight_acc, mapped)]
        return weight_acc, losses, final_leaves

    return OnlineProgram(run=run)


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

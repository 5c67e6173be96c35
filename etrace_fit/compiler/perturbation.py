"""Pass 4 — perturbation: the step with ``h^t = ĥ^t + p`` for every hidden state, and the
learning signal it yields.

The rewritten step takes one extra input ``p`` per hidden state, added where the new
hidden value is produced, so everything in the step that reads ``h^t`` sees it: the
gradient of a step loss with respect to ``p`` at ``p = 0`` is ``∂L^t/∂h^t``, the total
derivative through everything the step computes from ``h^t`` — the output, later
layers' states, and other states of the same group (an LSTM's ``h^t`` from ``c^t``).
The traces already carry that last, within-group path (it is part of the group's
transition), so :func:`group_signal_correction` gives what to subtract to get the
learning signal the rules use. Read ``graph.py`` next.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
from jax import lax

from .. import _compat
from ._dataflow import is_boundary
from .hidden_groups import HiddenGroup
from .module_info import ModuleInfo

__all__ = ["add_output_perturbations", "group_signal_correction", "hidden_outputs", "perturbed_step",
           "within_group_readers"]


def hidden_outputs(module: ModuleInfo) -> tuple[dict[Any, tuple[int, ...]], dict[int, tuple[int, Any]]]:
    """Where each hidden state ``k`` (``module.hidden`` order) gets its new value:
    ``(at_production, at_output)``.

    ``at_production`` maps a variable that produces a new hidden value to the state it
    becomes. ``at_output`` maps every other state ``k`` to ``(position among the step's
    outputs, variable)``: a literal, an unchanged input, or a copy of a value another
    state already takes is perturbed where it leaves the step — a copy from the value
    before the other state's perturbation, so each state gets its own signal.
    """
    invars = set(module.jaxpr.invars)
    num_outputs, offsets = len(module.output_vars), module.leaf_offsets
    at_production: dict[Any, tuple[int, ...]] = {}
    at_output: dict[int, tuple[int, Any]] = {}
    for k, state in enumerate(module.hidden):
        var = state.out_vars[0]
        if isinstance(var, _compat.Literal) or var in invars or var in at_production:
            at_output[k] = (num_outputs + offsets[state.path], var)
        else:
            at_production[var] = (k,)
    return at_production, at_output


def perturbed_step(module: ModuleInfo) -> Any:
    """The closed jaxpr ``(*input leaves, *state leaves, *perturbations) -> (*output
    leaves, *new state leaves)``, one perturbation per hidden state (in
    ``module.hidden`` order, each shaped like its state), added where it is produced."""
    closed = module.closed_jaxpr
    jaxpr = closed.jaxpr
    at_production, at_output = hidden_outputs(module)

    def step(*args):
        num_args = len(jaxpr.invars)
        values, perturbations = list(args[:num_args]), args[num_args:]

        produced = {}

        def on_write(var, value):
            states = at_production.get(var)
            if states is None:
                return value
            produced[var] = value
            return value + perturbations[states[0]]

        outs = _compat.interpret(jaxpr, list(closed.consts), values, on_write=on_write)
        return add_output_perturbations(outs, at_output, produced, perturbations)

    avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in jaxpr.invars]
    perturbation_avals = [jax.ShapeDtypeStruct(s.in_vars[0].aval.shape, s.in_vars[0].aval.dtype)
                          for s in module.hidden]
    return jax.make_jaxpr(step)(*avals, *perturbation_avals)


def add_output_perturbations(outs: list, at_output: dict, produced: dict, perturbations: Sequence[Any]) -> list:
    """Perturb the states :func:`hidden_outputs` puts at the output (a copy starts from
    the value before its source's own perturbation)."""
    outs = list(outs)
    for k, (position, var) in at_output.items():
        outs[position] = produced.get(var, outs[position]) + perturbations[k]
    return outs


def _production_equations(module: ModuleInfo) -> dict[int, int]:
    """Hidden state index -> index of the equation producing its new value."""
    at_production, _ = hidden_outputs(module)
    found = {}
    for index, eqn in enumerate(module.jaxpr.eqns):
        for var in eqn.outvars:
            if var in at_production:
                found[at_production[var][0]] = index
    return found


def within_group_readers(module: ModuleInfo, groups: Sequence[HiddenGroup]) -> tuple[int, ...]:
    """Indices of the groups in which one state's new value is computed from another
    state's new value within the step (without crossing a trainable op)."""
    productions = _production_equations(module)
    index_of = {s.path: k for k, s in enumerate(module.hidden)}
    eqns = module.jaxpr.eqns
    result = []
    for group in groups:
        members = [index_of[p] for p in group.paths if index_of[p] in productions]
        member_vars = {eqns[productions[k]].outvars[0]: k for k in members}
        reached: dict[Any, set] = {var: {k} for var, k in member_vars.items()}
        reads_member = False
        for index, eqn in enumerate(eqns):
            if is_boundary(eqn):
                continue
            sources = set()
            for var in eqn.invars:
                if not isinstance(var, _compat.Literal):
                    sources |= reached.get(var, set())
            if not sources:
                continue
            if index in (productions[k] for k in members):
                reads_member = True
                break
            for var in eqn.outvars:
                reached[var] = reached.get(var, set()) | sources
        if reads_member:
            result.append(group.index)
    return tuple(result)


def group_signal_correction(
    module: ModuleInfo,
    groups: Sequence[HiddenGroup],
    signals: Sequence[Any],
    state_leaves: Sequence[Any],
    input_leaves: Sequence[Any],
) -> list[Any]:
    """Learning signals without the within-group paths: ``g_A = G_A − Σ_B J_BAᵀ G_B``.

    ``signals`` are the perturbation gradients ``G`` (``module.hidden`` order); ``J_BA``
    is the direct derivative of state ``B``'s new value with respect to state ``A``'s
    new value inside the step (same group, other new values held, trainable ops held
    constant). Groups without such paths (LIF, ALIF, GRU) are returned unchanged.
    """
    correct = set(within_group_readers(module, groups))
    if not correct:
        return list(signals)
    productions = _production_equations(module)
    index_of = {s.path: k for k, s in enumerate(module.hidden)}
    closed = module.closed_jaxpr
    signals = list(signals)
    for group in groups:
        if group.index not in correct:
            continue
        members = [index_of[p] for p in group.paths if index_of[p] in productions]
        by_eqn = {productions[k]: n for n, k in enumerate(members)}
        leaves = list(state_leaves)

        def computed_from(given):
            # Every member's new value is the given one downstream; record what each
            # member's own equation computes from them.
            computed = [None] * len(members)

            def override(index, eqn, invals):
                if index in by_eqn:
                    computed[by_eqn[index]] = _compat.eval_equation(eqn, invals)[0]
                    return [given[by_eqn[index]]]
                if is_boundary(eqn):
                    return [lax.stop_gradient(v) for v in _compat.eval_equation(eqn, invals)]
                return None

            _compat.interpret(closed.jaxpr, list(closed.consts), [*input_leaves, *leaves], override=override)
            return computed

        current = _current_values(module, members, productions, leaves, input_leaves)
        _, pull = jax.vjp(computed_from, current)
        (correction,) = pull([signals[k] for k in members])
        for n, k in enumerate(members):
            signals[k] = signals[k] - correction[n]
    return signals


def _current_values(module, members, productions, leaves, input_leaves) -> list[Any]:
    """The members' new values at these inputs (one plain evaluation of the step)."""
    wanted = {module.jaxpr.eqns[productions[k]].outvars[0]: n for n, k in enumerate(members)}
    values = [None] * len(members)

    def on_write(var, value):
        if var in wanted:
            values[wanted[var]] = value
        return value

    _compat.interpret(module.closed_jaxpr.jaxpr, list(module.closed_jaxpr.consts), [*input_leaves, *leaves],
                      on_write=on_write)
    return values

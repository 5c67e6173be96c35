"""Pass 4 — fidelity: which traced weights get an approximate online gradient, and why.

With the previous-state learning signal (docs/theory.md §5.8) a trace rule is exact for a
weight when the only memory its effect travels through is its own hidden group's,
and that group recurs per unit. This pass names each way a model breaks that, per
relation, as a ``APPROXIMATE`` diagnostic (the rules' own approximations, such as
ES-D-RTRL's factorisation, are added by the plan). Read ``graph.py`` next.
"""

from __future__ import annotations

from typing import Any, Iterable

from .. import _compat
from ..ops import etp_op_info
from ._dataflow import carries_derivative, is_boundary, is_elementwise, memory_values, reached
from .diagnostics import Diagnostic, DiagnosticKind, format_path
from .hidden_groups import HiddenGroup, _dependencies
from .module_info import ModuleInfo
from .relations import Relation

__all__ = ["affected_states", "approximations", "state_feeds"]

DENSE_RECURRENCE = "dense_recurrence"
LATER_MEMORY = "later_memory"
NON_ELEMENTWISE = "non_elementwise_group"
MIXING_PATH = "mixing_path"
UNTRACED_USE = "untraced_use"


def _reached(module: ModuleInfo, starts: Iterable[Any], after: int = -1, differentiable: bool = False) -> set:
    """Every variable computed (through any op) from ``starts`` by equations after
    ``after`` (``differentiable``: not through ``stop_gradient``)."""
    return reached(module.jaxpr, starts, after, differentiable)


def approximations(
    module: ModuleInfo, groups: tuple[HiddenGroup, ...], relations: tuple[Relation, ...]
) -> tuple[Diagnostic, ...]:
    """One ``APPROXIMATE`` record per relation and reason (see the module docstring)."""
    state_of = {s.path: s for s in module.hidden}
    new_value_group = {state_of[p].out_vars[0]: g.index for g in groups for p in g.paths
                       if not isinstance(state_of[p].out_vars[0], _compat.Literal)}
    # state -> the values its previous value reaches with a derivative, at any depth (a recurrent
    # spike read under stop_gradient, as e-prop's detached reset, is no dense recurrence)
    previous = _previous_reach(module, groups)
    feeds = state_feeds(module, groups, previous)
    eqns = module.jaxpr.eqns
    weight_uses, untraced = _plain_uses(module, relations)
    recurring, recurrence_sources = _dense_recurrence(module, groups, relations, previous)
    mixing_sources = _mixing_sources(module)

    records = []
    for relation in relations:
        name = format_path(relation.weight_path)
        eqn = eqns[relation.eqn_index]
        own = set(relation.hidden_groups)
        after_y = _reached(module, eqn.outvars, after=relation.eqn_index, differentiable=True)
        # The weight's trace is zero on the states of its groups its effect never reaches (a
        # trace state beside the membrane it is driven by): an off-diagonal Jacobian, or a
        # later memory, read off those states alone meets a zero trace, so only the paths
        # out of the states it reaches count.
        affected = affected_states(module, groups, relation, feeds, after_y)
        others = {new_value_group[v] for v in after_y if v in new_value_group} - own
        for p in affected:
            others |= {new_value_group[v] for v in previous[p] if v in new_value_group} - own
        if others:
            names = ", ".join(groups[g].name for g in sorted(others))
            records.append(_record(relation, LATER_MEMORY, (
                f"{name} also shapes the memory of {names}; the traces follow its own hidden group only, so "
                f"its effect on later steps through that memory is dropped (exact would need BPTT)"),
                groups=tuple(sorted(others))))
        recurring_here = [g for g in own if recurring.get(g, ()) and recurrence_sources[g] & affected]
        recurrent = [g for g in recurring_here if relation.eqn_index in recurring[g]]
        through = [g for g in recurring_here if relation.eqn_index not in recurring[g]]
        if recurrent:
            records.append(_record(relation, DENSE_RECURRENCE, (
                f"{name}'s input reads the previous state of {groups[recurrent[0]].name} it drives (dense "
                f"recurrence): the traces keep the per-unit (diagonal) part of the Jacobian only")))
        elif through:
            weights = ", ".join(dict.fromkeys(format_path(r.weight_path) for r in relations
                                              if r.eqn_index in recurring[through[0]]))
            records.append(_record(relation, DENSE_RECURRENCE, (
                f"{name} drives {groups[through[0]].name}, whose units drive each other through {weights} (dense "
                f"recurrence): the traces keep the per-unit (diagonal) part of the Jacobian only, so {name}'s "
                f"effect on later steps through the other units is dropped")))
        mixing = [g for g in own if not groups[g].elementwise and mixing_sources & affected]
        if mixing:
            records.append(_record(relation, NON_ELEMENTWISE, (
                f"the units of {groups[mixing[0]].name}, which {name} drives, mix within a step through an op "
                f"that is not an ETP op: the traces keep the per-unit part of the Jacobian only")))
        mixers = _mixing_ops(module, relation.eqn_index, {state_of[p].out_vars[0] for g in own
                                                          for p in groups[g].paths})
        if mixers:
            records.append(_record(relation, MIXING_PATH, (
                f"{name}'s output reaches {', '.join(groups[g].name for g in sorted(own))} through "
                f"{', '.join(mixers)}, which mixes units (a normalisation, over the batch too, pooling, a reduction): the traces "
                f"follow the sum of its effects over the mixed units, which a normalisation that removes the mean "
                f"(LayerNorm, BatchNorm, GroupNorm) makes zero: the weight then gets its one-step gradient only")))
        plain = weight_uses.get(relation.eqn_index, ())
        if plain:
            records.append(_record(relation, UNTRACED_USE, (
                f"{name} is also used by plain jnp ops ({', '.join(plain)}) that reach a hidden state: "
                f"that use gets its one-step gradient, not a trace")))
    records.extend(untraced)
    return tuple(records)


def _dense_recurrence(module: ModuleInfo, groups: tuple[HiddenGroup, ...], relations: tuple[Relation, ...],
                      previous: dict) -> tuple[dict, dict]:
    """``{group: {equation index}}``: the dense or convolution ops into a group whose
    input reads that group's previous state (a recurrent weight, ``z^{t−1} W_rec``);
    and ``{group: {state path}}``: the states whose previous values that input reads.
    Such a group's units drive each other from step to step, so the trace of every
    weight into it whose effect reaches those states (the input weight, a learned time
    constant, a bias) misses the off-diagonal part of its Jacobian, not only the
    recurrent weight's."""
    found: dict = {}
    sources: dict = {}
    for relation in relations:
        if relation.op_kind == "elementwise":  # a per-unit product with the previous state is diagonal
            continue
        eqn = module.jaxpr.eqns[relation.eqn_index]
        x_var, _ = etp_op_info(eqn.primitive).split_operands(list(eqn.invars))
        if x_var is None or isinstance(x_var, _compat.Literal):
            continue
        for g in relation.hidden_groups:
            read = {p for p in groups[g].paths if x_var in previous[p]}
            if read:
                found.setdefault(g, set()).add(relation.eqn_index)
                sources.setdefault(g, set()).update(read)
    return found, sources


def _mixing_sources(module: ModuleInfo) -> set:
    """The hidden states whose previous values reach a new hidden value through an op
    that mixes units (not an ETP op): the sources of a group's off-diagonal Jacobian."""
    deps = _dependencies(module)
    hidden = module.hidden
    return {hidden[j].path for state in hidden if not isinstance(state.out_vars[0], _compat.Literal)
            for j, elementwise in deps.get(state.out_vars[0], {}).items() if not elementwise}


def _previous_reach(module: ModuleInfo, groups: Iterable[HiddenGroup]) -> dict:
    """``{state path: the values its previous value reaches with a derivative}``."""
    state_of = {s.path: s for s in module.hidden}
    return {path: _reached(module, [state_of[path].in_vars[0]], differentiable=True)
            for group in groups for path in group.paths}


def state_feeds(module: ModuleInfo, groups: Iterable[HiddenGroup], previous: dict | None = None) -> dict:
    """``{state path: the states of its group whose new values its previous value reaches
    with a derivative}``: the group's transition, state by state."""
    groups = tuple(groups)
    previous = _previous_reach(module, groups) if previous is None else previous
    state_of = {s.path: s for s in module.hidden}
    return {path: {q for q in group.paths if state_of[q].out_vars[0] in previous[path]}
            for group in groups for path in group.paths}


def affected_states(module: ModuleInfo, groups: tuple[HiddenGroup, ...], relation: Relation,
                    feeds: dict | None = None, after_y: set | None = None) -> set:
    """The states of ``relation``'s hidden groups that its weight's effect reaches: those
    its op's output reaches within the step (``after_y``, if the caller has it: what that
    output reaches with a derivative), and every state they feed, step after step
    (:func:`state_feeds`). The weight's trace is zero on the others."""
    feeds = state_feeds(module, groups) if feeds is None else feeds
    state_of = {s.path: s for s in module.hidden}
    if after_y is None:
        after_y = _reached(module, module.jaxpr.eqns[relation.eqn_index].outvars, after=relation.eqn_index,
                           differentiable=True)
    start = {p for g in relation.hidden_groups for p in groups[g].paths if state_of[p].out_vars[0] in after_y}
    found, stack = set(start), list(start)
    while stack:
        for q in feeds.get(stack.pop(), ()):
            if q not in found:
                found.add(q)
                stack.append(q)
    return found


def _mixing_ops(module: ModuleInfo, start: int, targets: set) -> list[str]:
    """The primitives on a path from equation ``start``'s output to ``targets`` (new
    hidden values) that mix units (not elementwise), without crossing another
    trainable ETP op (those paths are classified apart)."""
    eqns = module.jaxpr.eqns
    forward = set(eqns[start].outvars)
    on_path = []
    for index in range(start + 1, len(eqns)):
        eqn = eqns[index]
        if is_boundary(eqn) or not any(not isinstance(v, _compat.Literal) and v in forward for v in eqn.invars):
            continue
        forward.update(eqn.outvars)
        on_path.append(index)
    backward = {v for v in targets if not isinstance(v, _compat.Literal)}
    mixers = []
    for index in reversed(on_path):
        eqn = eqns[index]
        if not any(v in backward for v in eqn.outvars):
            continue
        # Only float operands carry a derivative: a cond's branch index or a comparison's
        # bool (a switch on the mean input) is no path for the gradient.
        backward.update(v for v in eqn.invars if not isinstance(v, _compat.Literal) and carries_derivative(v))
        if not is_elementwise(eqn) and eqn.primitive.name not in mixers:
            mixers.append(eqn.primitive.name)
    return mixers[::-1]


def _record(relation: Relation, reason: str, message: str, groups: tuple[int, ...] = ()) -> Diagnostic:
    context = (("groups", groups), ("reason", reason)) if groups else (("reason", reason),)
    return Diagnostic(DiagnosticKind.APPROXIMATE, message, primitive=relation.primitive,
                      weight_path=relation.weight_path, hidden_paths=relation.hidden_paths, context=context)


def _plain_uses(module: ModuleInfo, relations: tuple[Relation, ...]) -> tuple[dict[int, tuple[str, ...]], list]:
    """The plain (non-ETP) primitives outside every operand chain that read a weight
    leaf, or a value its operand chain made of it (``w.T``, ``w * 2`` shared with the
    op), and whose result reaches a new hidden value: per relation, and as records for
    the leaves no relation holds (a threshold read through ``layers.read`` for the
    output spike only, and raw in the reset: no relation's check saw that use)."""
    eqns = module.jaxpr.eqns
    leaf_vars = _leaf_vars(module)
    every_leaf = set(leaf_vars.values())
    traced = _traced_equations(module, every_leaf)
    # a state no later step reads with a derivative is no memory: what reaches it acts within its step
    memory = memory_values(module)

    def uses_of(values: set) -> tuple[str, ...]:
        found = [eqn.primitive.name for index, eqn in enumerate(eqns) if index not in traced
                 and any(not isinstance(v, _compat.Literal) and v in values for v in eqn.invars)
                 and memory & _reached(module, eqn.outvars, after=index, differentiable=True)]
        return tuple(dict.fromkeys(found))

    per_relation = {}
    for relation in relations:
        leaves = {leaf_vars[(o.path, o.leaf)] for o in relation.operands}
        chain, _ = _operand_chain(module, relation.eqn_index, leaves)
        uses = uses_of(leaves | {v for i in chain for v in eqns[i].outvars})
        if uses:
            per_relation[relation.eqn_index] = uses
    related = {leaf_vars[(o.path, o.leaf)] for relation in relations for o in relation.operands}
    name_of = {var: key for key, var in leaf_vars.items()}
    weights = {state.path: state for state in module.weights}
    records, seen = [], set()
    for index, eqn in enumerate(eqns):
        if etp_op_info(eqn.primitive) is None or index in {r.eqn_index for r in relations}:
            continue
        chain, leaves = _operand_chain(module, index, every_leaf)
        for leaf in sorted(leaves - related - seen, key=lambda v: str(name_of[v][0])):
            seen.add(leaf)
            uses = uses_of({leaf} | {v for i in chain for v in eqns[i].outvars})
            if not uses:
                continue
            path, leaf_name = name_of[leaf]
            where = weights[path].name + (f"['{leaf_name}']" if leaf_name else "")
            records.append(Diagnostic(DiagnosticKind.APPROXIMATE, (
                f"{where} is also used through plain jnp ops ({', '.join(uses)}) that reach a hidden state, besides "
                f"{eqn.primitive.name}, which drives none: that use is not traced, so it gets the one-step gradient "
                f"(read the weight through etrace_fit.ops everywhere, e.g. layers.read(...), to trace it)"),
                primitive=eqn.primitive.name, weight_path=path, context=(("reason", UNTRACED_USE),)))
    return per_relation, records


def _leaf_vars(module: ModuleInfo) -> dict:
    """``{(weight path, leaf name): the step's input variable of that leaf}``."""
    return {(s.path, leaf): var for s in module.weights for var, leaf in zip(s.in_vars, s.leaf_names)}


def _traced_equations(module: ModuleInfo, leaves: set) -> set[int]:
    """Equations that feed a weight into an ETP op (the ops, their masks and casts): traced uses."""
    eqns = module.jaxpr.eqns
    etp = [i for i, eqn in enumerate(eqns) if etp_op_info(eqn.primitive) is not None]
    return set(etp) | {i for index in etp for i in _operand_chain(module, index, leaves)[0]}


def _operand_chain(module: ModuleInfo, index: int, leaves: set) -> tuple[set[int], set]:
    """The indices of the equations between the weight leaves and ETP equation
    ``index`` (masks, casts), and the leaves among ``leaves`` they start from."""
    eqns = module.jaxpr.eqns
    producer = {var: i for i, eqn in enumerate(eqns) for var in eqn.outvars}
    eqn = eqns[index]
    _, trainables = etp_op_info(eqn.primitive).split_operands(list(eqn.invars))
    chain, found, stack = set(), set(), list(trainables.values())
    while stack:
        var = stack.pop()
        if isinstance(var, _compat.Literal):
            continue
        if var in leaves:
            found.add(var)
            continue
        if var not in producer:
            continue
        index = producer[var]
        if index not in chain:
            chain.add(index)
            stack.extend(eqns[index].invars)
    return chain, found

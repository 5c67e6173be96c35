"""Pass 5 — a numerical check of what the passes before it call exact.

The passes classify the step's equations by hand-written rules (what is elementwise,
what is memory, what is a plain use of a weight). Where they find nothing, D-RTRL's
gradient for a weight is claimed to be BPTT's, which rests on three facts about one
step (docs/theory.md §5.4):

1. each hidden group the weight drives recurs per unit on the states its effect
   reaches (``fidelity.affected_states``; its trace is zero on the others):
   ``∂h^t/∂h^{t−1}`` in directions on those states is the per-unit ``D`` the rules build;
2. the weight's whole one-step effect on those groups is ``Df ⊙ ∂y`` (``∂y`` its op's
   output moved by the weight, ``Df`` the per-unit transition from ``y``): no other
   path, no mixing of units after the op;
3. neither the weight nor those groups' previous states move any other carried state
   in one step, but the later memories the passes named (``later_memory``, which a
   plan may resolve, docs/theory.md §5.10).

All three are facts about memory states (``_dataflow.memory_values``): a hidden state
no later step reads with a derivative meets a zero learning signal and feeds no other
trace, so whatever moves it within the step is the one-step gradient's, exact.

This pass tests the three on the traced step itself, at one random point, with one
forward-mode pass per fact and direction (a random tangent: a classification that
misses a coupling fails it with probability one) against the true Jacobian-vector
products of the whole step. A fact that fails adds an ``APPROXIMATE`` record
(``reason="numerical_check"``): the weight is then reported approximate, as for any
other reason, and the message names the state and the size of the miss. It costs one
compiled program of a few forward passes, so :func:`compile_graph` runs it when the
model has a module class from outside etrace_fit (a user's neuron, a custom
composition) unless told otherwise (``verify=``).
"""

from __future__ import annotations

import math
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .. import _compat
from .diagnostics import Diagnostic, DiagnosticKind, format_path
from ._dataflow import memory_values
from .fidelity import affected_states, state_feeds
from .hidden_groups import HiddenGroup, group_jacobian
from .module_info import ModuleInfo
from .relations import Relation

__all__ = ["NUMERICAL_CHECK", "claimed_exact", "numerical_check", "wants_check"]

NUMERICAL_CHECK = "numerical_check"
_ENV = "ETRACE_FIT_VERIFY"


def wants_check(model: Any, verify: bool | None) -> bool:
    """``verify`` if given; else the ``ETRACE_FIT_VERIFY`` environment variable
    (``1`` / ``0``); else whether a module of ``model`` is of a class defined outside
    etrace_fit and brainstate (what the library's own tests do not cover)."""
    if verify is not None:
        return bool(verify)
    setting = os.environ.get(_ENV, "").strip().lower()
    if setting in ("1", "true", "yes", "on"):
        return True
    if setting in ("0", "false", "no", "off"):
        return False
    return any(not type(node).__module__.startswith(("etrace_fit.", "brainstate."))
               for node in _modules(model))


def _modules(model: Any) -> list:
    try:
        return [model, *(node for _, node in model.nodes().items())]
    except (AttributeError, TypeError):  # a plain callable step
        return [model]


def claimed_exact(relations: Sequence[Relation], records: Sequence[Diagnostic]) -> dict[tuple, set]:
    """``{weight path: later groups}`` for every traced weight whose relations have no
    record but ``later_memory`` ones: those a plan may call exact, with the groups its
    effect may reach later. A relation's records name its first weight
    (``Relation.weight_path``) and stand for all its operands (a LoRA adapter's
    ``lora_a`` and ``lora_b``), as the plan reads them."""
    later: dict[tuple, set] = {}
    blocked = set()
    for record in records:
        if record.weight_path is None or record.level < 1:
            continue
        context = dict(record.context)
        if record.kind is DiagnosticKind.APPROXIMATE and context.get("reason") == "later_memory":
            later.setdefault(record.weight_path, set()).update(context.get("groups", ()))
        else:
            blocked.add(record.weight_path)
    found: dict[tuple, set] = {}
    for relation in relations:
        named = (relation.weight_path, *relation.weight_paths)
        for path in relation.weight_paths:
            found.setdefault(path, set()).update(*(later.get(p, set()) for p in named))
            if any(p in blocked for p in named):
                blocked.add(path)
    return {path: groups for path, groups in found.items() if path not in blocked}


def numerical_check(module: ModuleInfo, groups: Sequence[HiddenGroup], relations: Sequence[Relation],
                    records: Sequence[Diagnostic], input_leaves: Sequence[Any], seed: int = 0
                    ) -> tuple[Diagnostic, ...]:
    """One ``APPROXIMATE`` record per claimed-exact weight that the step contradicts
    (see the module docstring); none when every claim holds or none is made."""
    exact = claimed_exact(relations, records)
    if not exact:
        return ()
    state_leaves = module.state_leaves()
    if any(isinstance(leaf, jax.core.Tracer) for leaf in [*state_leaves, *input_leaves]):
        return ()  # compiled inside a user's jit: no concrete point to evaluate at
    jaxpr = module.jaxpr
    num_inputs = len(module.input_vars)
    input_leaves = list(input_leaves)
    if len(input_leaves) != num_inputs or any(
            tuple(np.shape(leaf)) != tuple(var.aval.shape) for leaf, var in zip(input_leaves, module.input_vars)):
        return ()  # inputs given in another form than traced: nothing to stand on
    positions = module.leaf_offsets
    num_outputs = len(module.output_vars)
    # Every carried floating-point state but the weights: where an effect may show.
    # A hidden state no later step reads with a derivative (a spike kept for a detached reset,
    # a monitor) is no memory: its trace meets a zero signal and feeds no other trace, so
    # what moves it within the step is the one-step gradient's, exact whatever it is.
    memory = memory_values(module)
    inert = {s.path for s in module.hidden if s.out_vars[0] not in memory}
    carried = [s for s in module.states if s.kind != "weight" and s.written and s.path not in inert
               and all(jnp.issubdtype(v.aval.dtype, jnp.inexact) for v in s.in_vars)]
    weight_of = {s.path: s for s in module.weights}
    point = _random_point(module, state_leaves, input_leaves, seed)
    states_at, inputs_at = point

    def step_outputs(leaves, inputs, captures=()):
        found = {}

        def on_write(var, value):
            if var in captures:
                found[var] = value
            return value

        outs = _compat.interpret(jaxpr, list(module.closed_jaxpr.consts), [*inputs, *leaves], on_write=on_write)
        new = {s.path: outs[num_outputs + positions[s.path]] for s in carried}
        return new, [found[v] for v in captures]

    # Per weight and group, the states its effect reaches (fidelity.affected_states): the
    # group's Jacobian must be per unit on those columns; the others meet a zero trace.
    feeds = state_feeds(module, groups)
    own_states: dict = {}
    for path in exact:
        for relation in relations:
            if path in relation.weight_paths:
                reach = affected_states(module, groups, relation, feeds)
                for g in relation.hidden_groups:
                    mask = own_states.setdefault(path, {}).get(g, (False,) * groups[g].num_states)
                    own_states[path][g] = tuple(m or p in reach for m, p in zip(mask, groups[g].paths))
    own_groups = {path: sorted(own_states.get(path, {})) for path in exact}
    columns = {path: {g: (g, mask) for g, mask in own_states.get(path, {}).items()} for path in exact}
    checked = sorted({key for by_group in columns.values() for key in by_group.values()})
    # The random directions, drawn here: drawn inside the program, each draw compiled a
    # random-bit generator of its own (most of the program's compile).
    rng = np.random.default_rng(seed + 1)

    def direction(value):
        return rng.standard_normal(value.shape).astype(value.dtype)

    def masked(key):  # a random tangent on the states the weight reaches, zero on the others
        value = direction(np.stack([states_at[positions[p]] for p in groups[key[0]].paths], axis=-1))
        return value * np.asarray(key[1], value.dtype)

    group_directions = {key: masked(key) for key in checked}
    rows = {g: np.asarray([p not in inert for p in group.paths]) for g, group in enumerate(groups)}
    weight_directions = {path: [direction(states_at[positions[path] + n]) for n in range(len(weight_of[path].in_vars))
                                if np.issubdtype(states_at[positions[path] + n].dtype, np.inexact)]
                         for path in exact}

    def probes(states_at, inputs_at, group_directions, weight_directions):
        results = {}
        # Facts 1 and 3 for each group: a random tangent on its previous states.
        for key in checked:
            group = groups[key[0]]
            h_prev = jnp.stack([states_at[positions[p]] for p in group.paths], axis=-1)
            r = group_directions[key]

            def from_group(h):
                leaves = list(states_at)
                for s, p in enumerate(group.paths):
                    leaves[positions[p]] = h[..., s]
                return step_outputs(leaves, inputs_at)[0]

            _, moved = jax.jvp(from_group, (h_prev,), (r,))
            D = group_jacobian(module, group, states_at, inputs_at)
            predicted = jnp.einsum("...sr,...r->...s", D, r)
            true = jnp.stack([moved[p] for p in group.paths], axis=-1)
            results[("D", key)] = (true * rows[key[0]], predicted * rows[key[0]])
            results[("reach_h", key)] = {s.path: moved[s.path] for s in carried if s.path not in group.paths}
        # Fact 2 and 3 for each weight: a random tangent on all its leaves.
        for path in exact:
            state = weight_of[path]
            leaf_positions = [positions[path] + n for n in range(len(state.in_vars))]
            floats = [jnp.issubdtype(jnp.result_type(states_at[p]), jnp.inexact) for p in leaf_positions]
            own = [r for r in relations if path in r.weight_paths]
            captures = [module.jaxpr.eqns[r.eqn_index].outvars[0] for r in own]

            def from_weight(*values):
                leaves = list(states_at)
                values = iter(values)
                for p, f in zip(leaf_positions, floats):
                    if f:
                        leaves[p] = next(values)
                return step_outputs(leaves, inputs_at, captures)

            primals = tuple(states_at[p] for p, f in zip(leaf_positions, floats) if f)
            (_, ys), (moved, dys) = jax.jvp(from_weight, primals, tuple(weight_directions[path]))
            predicted = {g: 0.0 for g in own_groups[path]}
            for relation, y, dy in zip(own, ys, dys):
                for g, transition in zip(relation.hidden_groups, relation.transitions):
                    group = groups[g]

                    def through(y_):
                        return _compat.jaxpr_as_fun(transition)(y_, *states_at, *inputs_at)[0]

                    Df = jax.jvp(through, (y,), (jnp.ones_like(y),))[1]
                    predicted[g] = predicted[g] + Df * jnp.broadcast_to(dy, group.shape)[..., None]
            for g in own_groups[path]:
                group = groups[g]
                true = jnp.stack([moved[p] for p in group.paths], axis=-1)
                results[("Df", path, g)] = (true * rows[g], predicted[g] * rows[g])
            results[("reach_w", path)] = {s.path: moved[s.path] for s in carried}
        return results

    program = jax.jit(probes, compiler_options=_compat.quick_compile_options())
    results = program(states_at, inputs_at, group_directions, weight_directions)
    return _verdicts(groups, relations, exact, own_groups, columns, results)


def _random_point(module: ModuleInfo, state_leaves: list, input_leaves: list, seed: int) -> tuple[list, list]:
    """The states and inputs (numpy arrays: no eager op to compile) moved to a generic
    point: every float hidden state and input gets Gaussian noise of its own spread (at least 1, at least a fifth of its
    mean magnitude: a membrane at rest reaches its threshold), weights and integer
    states stay as they are."""
    rng = np.random.default_rng(seed)
    hidden = {module.leaf_offsets[s.path] + n for s in module.states if s.kind == "hidden"
              for n in range(len(s.in_vars))}

    def moved(value):
        value = np.asarray(value)
        if not np.issubdtype(value.dtype, np.inexact) or value.size == 0:
            return value
        wide = value.astype(np.float64)
        scale = max(float(wide.std()), 0.2 * float(np.abs(wide).mean()), 1.0)
        return (wide + scale * rng.standard_normal(wide.shape)).astype(value.dtype)

    states = [moved(v) if n in hidden else np.asarray(v) for n, v in enumerate(state_leaves)]
    return states, [moved(v) for v in input_leaves]


def _tolerance(dtype: Any) -> float:
    """The relative size of a miss that counts (10·√eps: 3.5e-3 in float32, 1.5e-7 in
    float64), also the absolute one per entry (the directions are of size 1 per entry):
    two routes to a zero effect may differ by rounding, which relative to zero is all."""
    return 10 * math.sqrt(float(jnp.finfo(dtype).eps)) if jnp.issubdtype(dtype, jnp.inexact) else 1e-3


def _miss(true: Any, predicted: Any, tolerance: float) -> float:
    """The share of ``true`` that ``predicted`` misses; 0 below the absolute floor."""
    true, predicted = np.asarray(true, np.float64), np.asarray(predicted, np.float64)
    difference = float(np.linalg.norm(true - predicted))
    if difference <= tolerance * math.sqrt(max(true.size, 1)):
        return 0.0
    return difference / (np.linalg.norm(true) + np.linalg.norm(predicted))


def _share(part: Any, whole: float, tolerance: float) -> float:
    """The share of an effect that reaches a state it should not; 0 below the floor."""
    part = np.asarray(part, np.float64)
    norm = float(np.linalg.norm(part))
    return 0.0 if norm <= tolerance * math.sqrt(max(part.size, 1)) else norm / (norm + whole)


def _verdicts(groups, relations, exact, own_groups, columns, results) -> tuple[Diagnostic, ...]:
    found = []
    for path, later in exact.items():
        problems = []
        own = own_groups[path]
        allowed = {p for g in (*own, *later) for p in groups[g].paths}
        tolerance = _tolerance(groups[own[0]].dtype) if own else 1e-3
        for g in own:
            miss = _miss(*results[("D", columns[path][g])], tolerance)
            if miss > tolerance:
                problems.append(
                    f"the step's Jacobian of {groups[g].name} on its previous states is not the per-unit D the traces "
                    f"use ({miss:.2g} of it missed: its units drive each other within the step)")
            miss = _miss(*results[("Df", path, g)], tolerance)
            if miss > tolerance:
                problems.append(
                    f"its one-step effect on {groups[g].name} is not its op's output times the per-unit "
                    f"transition ({miss:.2g} of it missed: a path that mixes units or does not pass its op)")
        scale = sum(float(np.linalg.norm(np.asarray(results[("Df", path, g)][0], np.float64))) for g in own)
        for state_path, value in results[("reach_w", path)].items():
            if state_path not in allowed and _share(value, scale, tolerance) > tolerance:
                problems.append(f"it moves {format_path(state_path)} within one step, a memory no pass reported")
        for g in own:
            scale = float(np.linalg.norm(np.asarray(results[("D", columns[path][g])][0], np.float64)))
            for state_path, value in results[("reach_h", columns[path][g])].items():
                if state_path not in allowed and _share(value, scale, tolerance) > tolerance:
                    problems.append(f"{groups[g].name}'s previous states move {format_path(state_path)} within one "
                                    f"step, a memory no pass reported")
        if not problems:
            continue
        relation = next(r for r in relations if path in r.weight_paths)
        problems = list(dict.fromkeys(problems))
        found.append(Diagnostic(
            DiagnosticKind.APPROXIMATE,
            f"{format_path(path)}: the compiler's passes found its online gradient exact, but a numerical check of "
            f"one step at a random point disagrees: {'; '.join(problems)}. Its online gradient is not BPTT's; "
            f"please report this model (a classification the passes should make)",
            primitive=relation.primitive, weight_path=path, hidden_paths=relation.hidden_paths,
            context=(("reason", NUMERICAL_CHECK),)))
    return tuple(found)

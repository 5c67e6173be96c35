"""Pass 2 — hidden groups: hidden states that update each other per unit in one step.

Two hidden states belong to one group when one's new value depends on the other's old
value without crossing a trainable dense or conv ETP op (those are boundaries). A group's
states are stacked on a trailing axis of size ``S``; its per-unit Jacobian
``D[..., s, s'] = ∂h_s^t / ∂h_{s'}^{t-1}`` (boundaries held constant) drives the traces.
Read ``relations.py`` next.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from .. import _compat
from ..errors import CompilationError
from ._dataflow import carries_derivative, cut_step, is_boundary, is_elementwise
from .diagnostics import Diagnostic, DiagnosticKind, format_path
from .module_info import ModuleInfo

__all__ = ["HiddenGroup", "group_jacobian", "group_transition", "hidden_groups", "transition_jaxpr"]


@dataclasses.dataclass(frozen=True)
class HiddenGroup:
    """Hidden states stacked on a trailing axis: ``paths[s]`` is state ``s``.

    Attributes:
        index: position among the graph's groups.
        paths: the states' paths, in the order the step's jaxpr takes them.
        shape: the shape every state of the group has (e.g. ``(B, units)``).
        dtype: their dtype.
        elementwise: whether the states couple only per unit within a step; when not,
            :func:`group_jacobian` extracts the per-unit part of the full Jacobian.
    """

    index: int
    paths: tuple[tuple, ...]
    shape: tuple[int, ...]
    dtype: Any
    elementwise: bool = True

    @property
    def num_states(self) -> int:
        return len(self.paths)

    @property
    def name(self) -> str:
        return "(" + ", ".join(format_path(p) for p in self.paths) + ")"


def _dependencies(module: ModuleInfo) -> dict[Any, dict[int, bool]]:
    """For every variable: the hidden states (by index) it depends on within the step
    without crossing a boundary, each with whether every such path is elementwise
    (a path through an int or bool value carries no derivative, so its mixing is moot)."""
    deps: dict[Any, dict[int, bool]] = {}
    for k, state in enumerate(module.hidden):
        deps[state.in_vars[0]] = {k: True}
    for eqn in module.jaxpr.eqns:
        if is_boundary(eqn):
            continue
        elementwise = is_elementwise(eqn)
        merged: dict[int, bool] = {}
        for var in eqn.invars:
            if isinstance(var, _compat.Literal):
                continue
            for k, flag in deps.get(var, {}).items():
                merged[k] = merged.get(k, True) and flag and elementwise
        if merged:
            for var in eqn.outvars:  # an int or bool carries no derivative: whatever mixed before it is moot
                deps[var] = merged if carries_derivative(var) else dict.fromkeys(merged, True)
    return deps


def hidden_groups(module: ModuleInfo) -> tuple[tuple[HiddenGroup, ...], tuple[Diagnostic, ...]]:
    """Group the module's hidden states; also returns the pass's diagnostics.

    Raises:
        CompilationError: a hidden state holds several arrays, or states that must share
            a group differ in shape or dtype (they could not be stacked).
    """
    hidden = module.hidden
    for state in hidden:
        if len(state.in_vars) != 1:
            raise CompilationError(
                f"HiddenState {state.name} holds a pytree of {len(state.in_vars)} arrays "
                f"({', '.join(state.leaf_names)}); the compiler needs one array per hidden state"
            )
    deps = _dependencies(module)
    parent = list(range(len(hidden)))

    def find(k):
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    def union(a, b):
        parent[find(a)] = find(b)

    diagnostics: list[Diagnostic] = []
    mixing: set[int] = set()
    for k, state in enumerate(hidden):
        out_var = state.out_vars[0]
        sources = {} if isinstance(out_var, _compat.Literal) else deps.get(out_var, {})
        for j, elementwise in sources.items():
            union(j, k)
            if not elementwise:
                mixing.add(k)
                diagnostics.append(Diagnostic(
                    DiagnosticKind.NON_ELEMENTWISE_COUPLING,
                    f"{state.name} depends on {hidden[j].name} through an op that mixes units "
                    f"(not a trainable ETP op); the traces keep the group Jacobian's per-unit part only",
                    hidden_paths=(hidden[j].path, state.path),
                ))

    members: dict[int, list[int]] = {}
    for k in range(len(hidden)):
        members.setdefault(find(k), []).append(k)
    groups = []
    for index, ks in enumerate(sorted(members.values(), key=min)):
        avals = [hidden[k].in_vars[0].aval for k in ks]
        first = avals[0]
        for k, aval in zip(ks, avals):
            if tuple(aval.shape) != tuple(first.shape):
                listing = ", ".join(f"{hidden[j].name} {tuple(a.shape)}" for j, a in zip(ks, avals))
                shapes = sorted({tuple(a.shape) for a in avals}, key=len)
                extra_axis = len(shapes) == 2 and shapes[1][:-1] == shapes[0]  # (B, H) beside (B, H, D)
                fix = ("give them one shape: a buffer with an axis more (a delay line of D taps, shape (batch, "
                       "units, D)) as D hidden states of the units' shape, one per tap, each written from the one "
                       "before (D-RTRL follows such a line exactly)" if extra_axis else
                       "a state of another shape that the units read and drive (a population-wide one, such as a "
                       "global inhibition of shape (batch, 1)) couples every unit with every other, which per-unit "
                       "traces cannot follow; give it the units' shape if it is per unit")
                raise CompilationError(
                    f"hidden states {listing} update each other but differ in shape, so they cannot form one "
                    f"hidden group; {fix}; algo='bptt' takes the states as they are"
                )
            if aval.dtype != first.dtype:
                listing = ", ".join(f"{hidden[j].name} {a.dtype}" for j, a in zip(ks, avals))
                raise CompilationError(
                    f"hidden states {listing} update each other per unit but differ in dtype, so they "
                    f"cannot form one hidden group; create them with one float dtype "
                    f"(brainstate.environ.dftype())"
                )
        groups.append(HiddenGroup(index, tuple(hidden[k].path for k in ks), tuple(first.shape), first.dtype,
                                  elementwise=not any(k in mixing for k in ks)))
    return tuple(groups), tuple(diagnostics)


def group_transition(module: ModuleInfo, group: HiddenGroup):
    """``f(h_prev, state_leaves, input_leaves) -> h_new``, both ``(*group.shape, S)``,
    with boundary ops held constant: the group's own transition."""
    positions = module.leaf_offsets
    out_positions = {path: len(module.output_vars) + offset for path, offset in positions.items()}

    def transition(h_prev, state_leaves, input_leaves):
        leaves = list(state_leaves)
        for s, path in enumerate(group.paths):
            leaves[positions[path]] = h_prev[..., s]
        outs = cut_step(module, leaves, list(input_leaves), outputs=[out_positions[path] for path in group.paths])
        return jnp.stack([outs[out_positions[path]] for path in group.paths], axis=-1)

    return transition


def transition_jaxpr(module: ModuleInfo, group: HiddenGroup):
    """The closed jaxpr of :func:`group_transition`: inputs ``(h_prev, *state leaves,
    *input leaves)``, output the stacked ``h_new``."""
    transition = group_transition(module, group)
    state_avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for s in module.states for v in s.in_vars]
    input_avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in module.input_vars]
    h_aval = jax.ShapeDtypeStruct((*group.shape, group.num_states), group.dtype)
    return jax.make_jaxpr(lambda h, *rest: transition(h, rest[: len(state_avals)], rest[len(state_avals) :]))(
        h_aval, *state_avals, *input_avals
    )


def group_jacobian(
    module: ModuleInfo, group: HiddenGroup, state_leaves: Sequence[Any], input_leaves: Sequence[Any]
) -> jax.Array:
    """The per-unit Jacobian ``D`` of shape ``(*group.shape, S, S)`` at the given values,
    by forward mode: one JVP per state of the group when states couple only per unit;
    otherwise the per-unit diagonal blocks of the full Jacobian (costly: ``jacfwd``)."""
    positions = module.leaf_offsets
    transition = group_transition(module, group)
    h_prev = jnp.stack([state_leaves[positions[path]] for path in group.paths], axis=-1)
    if not group.elementwise:
        full = jax.jacfwd(lambda h: transition(h, state_leaves, input_leaves))(h_prev)
        units, num_states = math.prod(group.shape), group.num_states
        full = full.reshape(units, num_states, units, num_states)
        index = jnp.arange(units)
        return full[index, :, index, :].reshape(*group.shape, num_states, num_states)
    columns = []
    for s in range(group.num_states):
        tangent = jnp.zeros_like(h_prev).at[..., s].set(1.0)
        _, column = jax.jvp(lambda h: transition(h, state_leaves, input_leaves), (h_prev,), (tangent,))
        columns.append(column)
    return jnp.stack(columns, axis=-1)

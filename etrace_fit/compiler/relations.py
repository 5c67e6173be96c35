"""Pass 3 — relations: which weight drives which hidden group, and how.

For every ETP equation: trace each trainable operand back to its ``ParamState`` (through
weight functions and masks), walk forward from its output ``y`` to the hidden states it
reaches without crossing another trainable ETP op, keep the states whose shape ``y``
broadcasts to, classify the paths, and build the transition ``y → h`` of each group.
Read ``fidelity.py`` next.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _compat
from ..ops import etp_op_info
from ._dataflow import cut_step, is_boundary, is_etp, memory_values, reached
from .diagnostics import Diagnostic, DiagnosticKind, Level, format_path
from .hidden_groups import HiddenGroup
from .module_info import ModuleInfo

__all__ = ["ALL_DIRECT", "ALL_THROUGH_OTHER_ETP", "MIXED", "OperandSource", "Relation", "relations"]

ALL_DIRECT, ALL_THROUGH_OTHER_ETP, MIXED = "all_direct", "all_through_other_etp", "mixed"
_DIRECT, _THROUGH = 1, 2
_PRODUCTS = frozenset({"mul", "dot_general", "div", "conv_general_dilated"})
_CLASS = {_DIRECT: ALL_DIRECT, _THROUGH: ALL_THROUGH_OTHER_ETP, _DIRECT | _THROUGH: MIXED}


@dataclasses.dataclass(frozen=True)
class OperandSource:
    """Where a trainable operand of an ETP op comes from.

    Attributes:
        key: the operand's key in the op (``"weight"``, ``"bias"``).
        path: the owning ``ParamState``'s path.
        leaf: the leaf inside the state's value (``"weight"`` of ``{weight, bias}``;
            ``""`` for an array state).
        chain: the primitives between the state and the op (masks, weight functions),
            in order; the op's own ``weight_fn`` appears as ``"weight_fn:<name>"``.
    """

    key: str
    path: tuple
    leaf: str
    chain: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Relation:
    """One ETP equation and the hidden groups its output drives.

    Attributes:
        eqn_index: the equation's position in the step's jaxpr.
        primitive: its name (``etp_mm``, ``etp_elemwise``, ...).
        op_kind: ``"dense"``, ``"conv"`` or ``"elementwise"``.
        operands: an :class:`OperandSource` per trainable operand.
        hidden_groups: indices of the groups reached.
        hidden_paths: the hidden states reached directly, in state order.
        paths: ``(hidden path, classification)`` for every hidden state reached at all.
        classification: ``all_direct`` or ``mixed`` (over the related states).
        x_shape, y_shape: the op's input and output shapes (``x_shape`` None: no x).
        trainable_shapes: ``(key, shape)`` per operand.
        transitions: per group in ``hidden_groups``, the closed jaxpr
            ``(y, *state leaves, *input leaves) -> h_new`` (stacked on the state axis)
            with other trainable ops held constant.
    """

    eqn_index: int
    primitive: str
    op_kind: str
    operands: tuple[OperandSource, ...]
    hidden_groups: tuple[int, ...]
    hidden_paths: tuple[tuple, ...]
    paths: tuple[tuple[tuple, str], ...]
    classification: str
    x_shape: tuple[int, ...] | None
    y_shape: tuple[int, ...]
    trainable_shapes: tuple[tuple[str, tuple[int, ...]], ...]
    transitions: tuple[Any, ...] = dataclasses.field(compare=False, repr=False)

    @property
    def weight_path(self) -> tuple:
        """The ``ParamState`` of the ``weight`` operand (the first operand otherwise)."""
        for operand in self.operands:
            if operand.key == "weight":
                return operand.path
        return self.operands[0].path

    @property
    def weight_paths(self) -> tuple[tuple, ...]:
        return tuple(dict.fromkeys(operand.path for operand in self.operands))

    @property
    def size(self) -> int:
        """Number of trainable parameters the op uses."""
        return sum(math.prod(shape) for _, shape in self.trainable_shapes)


def _dynamic_vars(module: ModuleInfo) -> set:
    """Variables that depend on the step's inputs or states (not constants only)."""
    dynamic = set(module.jaxpr.invars)
    for eqn in module.jaxpr.eqns:
        if any(not isinstance(v, _compat.Literal) and v in dynamic for v in eqn.invars):
            dynamic.update(eqn.outvars)
    return dynamic


class _Backtracer:
    """Traces an operand variable back to a ``ParamState`` leaf."""

    def __init__(self, module: ModuleInfo):
        self.leaf_of = {}
        for state in module.weights:
            for var, leaf in zip(state.in_vars, state.leaf_names):
                self.leaf_of[var] = (state.path, leaf)
        self.producer = {var: eqn for eqn in module.jaxpr.eqns for var in eqn.outvars}
        self.dynamic = _dynamic_vars(module)

    def trace(self, var: Any) -> tuple[tuple | None, str, tuple[str, ...], str | None]:
        """``(path, leaf, chain, problem)``; ``path`` is None when no state owns ``var``."""
        chain: list[str] = []
        while True:
            if isinstance(var, _compat.Literal) or var not in self.dynamic:
                return None, "", tuple(chain), "it is a constant"
            if var in self.leaf_of:
                path, leaf = self.leaf_of[var]
                return path, leaf, tuple(reversed(chain)), None
            eqn = self.producer.get(var)
            if eqn is None:
                return None, "", tuple(chain), "it is an input or a non-parameter state"
            if is_etp(eqn):
                return None, "", tuple(chain), f"it is the output of another ETP op ({eqn.primitive.name})"
            sources = [v for v in eqn.invars if not isinstance(v, _compat.Literal) and v in self.dynamic]
            if len(sources) != 1:
                return None, "", tuple(chain), (
                    f"it is computed by {eqn.primitive.name} from {len(sources)} non-constant values"
                )
            chain.append(eqn.primitive.name)
            var = sources[0]

    def _name(self, eqn: Any) -> str:
        """The primitive's name, marked where a product combines two values made of
        parameters (``w * w``, ``A @ B``): unlike a product by a constant, it is not
        linear in them (what ``learner._nonlinear_map`` reads)."""
        dynamic = sum(not isinstance(v, _compat.Literal) and v in self.dynamic for v in eqn.invars)
        name = eqn.primitive.name
        return f"{name}(parameter x parameter)" if dynamic > 1 and name in _PRODUCTS else name

    def trace_all(self, var: Any) -> tuple[list[tuple[tuple, str, tuple[str, ...]]], str | None]:
        """``([(path, leaf, chain), ...], problem)``: the one ``ParamState`` leaf ``var``
        comes from (:meth:`trace`), or, for an operand computed from several (a LoRA
        weight ``W + A @ B``), every leaf it is computed from, when it depends on
        nothing else (no input, no state but parameters, no ETP output); ``chain`` is
        then the primitives that combine them, in equation order. Empty and the
        problem otherwise."""
        path, leaf, chain, problem = self.trace(var)
        if path is not None:
            return [(path, leaf, chain)], None
        if not problem.startswith("it is computed by"):
            return [], problem
        leaves, seen, primitives, stack = [], set(), {}, [var]
        while stack:
            current = stack.pop()
            if isinstance(current, _compat.Literal) or current not in self.dynamic or current in seen:
                continue
            seen.add(current)
            if current in self.leaf_of:
                leaves.append(self.leaf_of[current])
                continue
            eqn = self.producer.get(current)
            if eqn is None or is_etp(eqn):
                return [], problem
            primitives[id(eqn)] = eqn
            stack.extend(eqn.invars)
        order = {id(eqn): n for n, eqn in enumerate(self.producer.values())}
        combined = tuple(dict.fromkeys(self._name(eqn)
                                       for eqn in sorted(primitives.values(), key=lambda e: order[id(e)])))
        position = {leaf: n for n, leaf in enumerate(self.leaf_of.values())}
        return [(p, l, combined) for p, l in sorted(set(leaves), key=position.__getitem__)], None


def _reach(module: ModuleInfo, start: int, y: Any) -> dict[Any, int]:
    """Forward from ``y``: for each variable, bit 1 if reached without crossing another
    trainable ETP op, bit 2 if reached through one."""
    reach = {y: _DIRECT}
    for eqn in module.jaxpr.eqns[start + 1 :]:
        flags = 0
        for var in eqn.invars:
            if not isinstance(var, _compat.Literal):
                flags |= reach.get(var, 0)
        if not flags:
            continue
        if is_boundary(eqn):
            flags = _THROUGH
        for var in eqn.outvars:
            reach[var] = reach.get(var, 0) | flags
    return reach


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    try:
        return tuple(np.broadcast_shapes(shape, target)) == tuple(target)
    except ValueError:
        return False


def _transition_jaxpr(module: ModuleInfo, eqn_index: int, y_aval: Any, group: HiddenGroup):
    out_positions = {path: len(module.output_vars) + offset for path, offset in module.leaf_offsets.items()}
    state_avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for s in module.states for v in s.in_vars]
    input_avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in module.input_vars]

    def transition(y, *rest):
        outs = cut_step(module, list(rest[: len(state_avals)]), list(rest[len(state_avals) :]), replace={eqn_index: y},
                        outputs=[out_positions[path] for path in group.paths])
        return jnp.stack([outs[out_positions[path]] for path in group.paths], axis=-1)

    return jax.make_jaxpr(transition)(jax.ShapeDtypeStruct(y_aval.shape, y_aval.dtype), *state_avals, *input_avals)


def relations(
    module: ModuleInfo, groups: tuple[HiddenGroup, ...], online: bool = True
) -> tuple[tuple[Relation, ...], tuple[Diagnostic, ...]]:
    """All relations of the step, in equation order, and the pass's diagnostics
    (``online``: a hidden state that stacks several values per unit is an error)."""
    backtracer = _Backtracer(module)
    hidden_out = [(s.out_vars[0], s) for s in module.hidden if not isinstance(s.out_vars[0], _compat.Literal)]
    group_of = {path: group for group in groups for path in group.paths}
    outputs = set(v for v in module.output_vars if not isinstance(v, _compat.Literal))
    found: list[Relation] = []
    diagnostics: list[Diagnostic] = []
    consumed_leaves: set = set()

    for index, eqn in enumerate(module.jaxpr.eqns):
        op = etp_op_info(eqn.primitive)
        if op is None:
            diagnostics.extend(_control_flow_diagnostics(eqn, backtracer))
            continue
        x, trainables = op.split_operands(list(eqn.invars))
        operands, problems = [], []
        weight_fn = eqn.params.get("weight_fn")
        for key, var in trainables.items():
            sources, problem = backtracer.trace_all(var)
            if not sources:
                problems.append(f"its {key} operand has no ParamState: {problem}")
                continue
            for path, leaf, chain in sources:  # several for an operand computed from several parameters
                if key == "weight" and weight_fn is not None:
                    chain = (*chain, f"weight_fn:{type(weight_fn).__name__}")
                operands.append(OperandSource(key, path, leaf, chain))
                consumed_leaves.add((path, leaf))
        name = eqn.primitive.name
        if not operands:
            diagnostics.append(Diagnostic(
                DiagnosticKind.EXCLUDED_NO_PARAM_STATE, f"{name} at equation {index}: " + "; ".join(problems),
                primitive=name,
            ))
            continue
        weight_path = next((o.path for o in operands if o.key == "weight"), operands[0].path)
        for problem in problems:
            diagnostics.append(Diagnostic(
                DiagnosticKind.EXCLUDED_NO_PARAM_STATE, f"{name}: {problem}", primitive=name, weight_path=weight_path
            ))

        y = eqn.outvars[0]
        reach = _reach(module, index, y)
        reached = {s.path: reach[var] for var, s in hidden_out if var in reach}
        reached = {path: flags for path, flags in sorted(reached.items(), key=lambda item: _order(module, item[0]))}
        direct = [path for path, flags in reached.items() if flags & _DIRECT]
        # A dense or conv output must match the state per unit; an elementwise
        # parameter may broadcast over the batch (and over units it is shared by).
        fits = _broadcasts_to if op.kind == "elementwise" else (lambda a, b: tuple(a) == tuple(b))
        shape_ok = [path for path in direct if fits(tuple(y.aval.shape), group_of[path].shape)]
        for path in direct:
            if path not in shape_ok:
                state_shape = tuple(group_of[path].shape)
                flattened = (op.kind == "dense" and len(y.aval.shape) == 2 and len(state_shape) > 2
                             and math.prod(y.aval.shape) == math.prod(state_shape)
                             and y.aval.shape[-1] == state_shape[-1])
                why = (f" (a dense op on ({', '.join(map(str, state_shape[:-1]))}, ...) inputs, applied per position: "
                       f"it flattens the leading axes; Conv1d / Conv2d with kernel_size=1 is the same map and is "
                       f"traced per position)" if flattened else "")
                stacked = len(state_shape) == len(y.aval.shape) + 1 and state_shape[:-1] == tuple(y.aval.shape)
                if stacked:  # (v, i) of a Norse LIF in one (B, H, 2) state: every weight into it got zero
                    diagnostics.append(Diagnostic(
                        DiagnosticKind.EXCLUDED_SHAPE_MISMATCH,
                        f"{format_path(path)} {state_shape} stacks {state_shape[-1]} values per unit on its last "
                        f"axis, which {name} {tuple(y.aval.shape)} drives: the online rules follow hidden states of "
                        f"the units' shape, one per quantity, so every weight into it would get no gradient through "
                        f"time. Split it into {state_shape[-1]} HiddenStates of shape {tuple(y.aval.shape)} (with "
                        f"ef.layers.Neuron: self.hidden('v'), self.hidden('i'), ...; they form one hidden group, "
                        f"which D-RTRL follows exactly); algo='bptt' takes it as written",
                        level=Level.ERROR if online else None,
                        primitive=name, weight_path=weight_path, hidden_paths=(path,),
                    ))
                    continue
                how = (f"is broadcast over {format_path(path)} {group_of[path].shape}: a dense op's output "
                            f"must have its state's shape (one output per unit), and one output that every unit "
                            f"reads couples them all" if op.kind != "elementwise"
                            and _broadcasts_to(tuple(y.aval.shape), state_shape) else
                            f"does not broadcast to {format_path(path)} {group_of[path].shape}")
                diagnostics.append(Diagnostic(
                    DiagnosticKind.EXCLUDED_SHAPE_MISMATCH,
                    f"{name} output {tuple(y.aval.shape)} {how}{why}; that path is not traced (it gets the "
                    f"one-step gradient)",
                    primitive=name, weight_path=weight_path, hidden_paths=(path,),
                ))
        if not shape_ok:
            diagnostics.append(_exclusion(name, weight_path, reached, direct, reach, outputs))
            continue

        related_groups = tuple(sorted({group_of[path].index for path in shape_ok}))
        classification = MIXED if any(reached[p] == (_DIRECT | _THROUGH) for p in shape_ok) else ALL_DIRECT
        transitions = tuple(_transition_jaxpr(module, index, y.aval, groups[g]) for g in related_groups)
        relation = Relation(
            eqn_index=index, primitive=name, op_kind=op.kind, operands=tuple(operands),
            hidden_groups=related_groups, hidden_paths=tuple(shape_ok),
            paths=tuple((path, _CLASS[flags]) for path, flags in reached.items()),
            classification=classification,
            x_shape=None if x is None else tuple(x.aval.shape), y_shape=tuple(y.aval.shape),
            trainable_shapes=tuple((key, tuple(var.aval.shape)) for key, var in trainables.items()
                                   if any(o.key == key for o in operands)),
            transitions=transitions,
        )
        found.append(relation)
        hidden_names = ", ".join(format_path(p) for p in shape_ok)
        diagnostics.append(Diagnostic(
            DiagnosticKind.RELATION_INCLUDED, f"{name} drives {hidden_names} ({classification})",
            primitive=name, weight_path=weight_path, hidden_paths=tuple(shape_ok),
        ))
        if classification == MIXED:
            through = ", ".join(format_path(p) for p in shape_ok if reached[p] & _THROUGH)
            diagnostics.append(Diagnostic(
                DiagnosticKind.PARTIAL_PATH,
                f"{name} also reaches {through} through another trainable ETP op; online rules drop that "
                f"part of the gradient",
                primitive=name, weight_path=weight_path, hidden_paths=tuple(shape_ok),
            ))

    diagnostics.extend(_untraced_weights(module, consumed_leaves))
    return tuple(found), tuple(diagnostics)


def _order(module: ModuleInfo, path: tuple) -> int:
    return [s.path for s in module.states].index(path)


def _exclusion(name, weight_path, reached, direct, reach, outputs) -> Diagnostic:
    """Why an ETP op with a weight relates to no hidden state."""
    if direct:
        kind, message = DiagnosticKind.EXCLUDED_SHAPE_MISMATCH, (
            f"{name} reaches hidden states only with shapes it does not drive unit by unit; not traced: it gets "
            f"the one-step gradient (use algo='bptt' for the exact one)"
        )
    elif reached:
        names = ", ".join(format_path(p) for p in reached)
        kind, message = DiagnosticKind.EXCLUDED_WEIGHT_TO_WEIGHT, (
            f"{name} reaches {names} only through another trainable ETP op; it gets the one-step "
            f"gradient (use algo='bptt' for the exact one)"
        )
    elif any(var in reach for var in outputs):
        kind, message = DiagnosticKind.EXCLUDED_NON_TEMPORAL, (
            f"{name} drives the step's output but no hidden state; its instantaneous gradient is exact"
        )
    else:
        kind, message = DiagnosticKind.EXCLUDED_UNUSED, f"{name}'s output reaches neither a hidden state nor the output"
    return Diagnostic(kind, message, primitive=name, weight_path=weight_path, hidden_paths=tuple(reached))


def _untraced_weights(module: ModuleInfo, consumed: set) -> list[Diagnostic]:
    """Weights (or leaves of them) that no ETP op uses: plain ``jnp`` use, or unused."""
    used = {v for eqn in module.jaxpr.eqns for v in eqn.invars if not isinstance(v, _compat.Literal)}
    used |= {v for v in module.jaxpr.outvars if not isinstance(v, _compat.Literal)}
    hidden_new = memory_values(module)  # a state read by no later step's derivative is no memory to trace
    records = []
    for state in module.weights:
        for var, leaf in zip(state.in_vars, state.leaf_names):
            if (state.path, leaf) in consumed:
                continue
            where = state.name + (f"['{leaf}']" if leaf else "")
            kind = DiagnosticKind.NOT_TRACED
            if var not in used:
                message = f"{where} is not used by the step"
            elif hidden_new & reached(module.jaxpr, [var], differentiable=True):
                message = (f"{where} is used through plain jnp ops, not an ETP op: online rules cannot trace it; "
                           f"it gets the one-step gradient (route it through etrace_fit.ops to trace it)")
            else:  # a readout written with plain jnp (brainstate.nn.Linear): nothing to trace
                kind, message = DiagnosticKind.EXCLUDED_NON_TEMPORAL, (
                    f"{where} is used through plain jnp ops that reach the step's output but no hidden state a later "
                    f"step reads with a derivative; "
                    f"its instantaneous gradient is exact")
            records.append(Diagnostic(kind, message, weight_path=state.path))
    return records


def _control_flow_diagnostics(eqn: Any, backtracer: _Backtracer) -> list[Diagnostic]:
    """An ETP op inside ``scan`` / ``while`` / ``cond`` (or another call), at any depth,
    is not traced: say which primitive, which weight, and which control flow."""
    records = []

    def visit(outer_eqn, inner, to_outer, nesting):
        operands = _compat.control_flow_operands(outer_eqn, inner)
        # inner variable -> outer-level variable, when the binding is known
        binding = {} if operands is None else {
            var: to_outer(operand) for var, operand in zip(inner.invars, operands)
        }
        for inner_eqn in inner.eqns:
            op = etp_op_info(inner_eqn.primitive)
            if op is None:
                for deeper in _compat.jaxprs_in_params(inner_eqn.params):
                    visit(inner_eqn, deeper, lambda v, b=binding: b.get(v), (*nesting, inner_eqn.primitive.name))
                continue
            _, trainables = op.split_operands(list(inner_eqn.invars))
            outer_var = binding.get(trainables.get("weight"))
            weight_path = None if outer_var is None else backtracer.trace(outer_var)[0]
            weight = format_path(weight_path) if weight_path is not None else "an unidentified weight"
            where = " inside ".join(reversed(nesting))
            records.append(Diagnostic(
                DiagnosticKind.IN_CONTROL_FLOW,
                f"{inner_eqn.primitive.name} using {weight} sits inside {where}; online rules do not look "
                f"inside control flow, so it gets the one-step gradient",
                primitive=inner_eqn.primitive.name, weight_path=weight_path,
                context=(("control_flow", where),),
            ))

    for inner in _compat.jaxprs_in_params(eqn.params):
        visit(eqn, inner, lambda v: v, (eqn.primitive.name,))
    return records

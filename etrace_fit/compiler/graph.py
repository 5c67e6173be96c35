"""The compiled graph: every pass's result in one immutable value, and its report.

``compile_graph(model, *example_inputs)`` runs the passes in order (module info →
hidden groups → relations → fidelity) and returns an :class:`ETraceGraph` that the learning rules
consume. ``report()`` prints a table per weight; ``explain(path)`` says in words why a
weight is or is not traced.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import jax

from ..errors import CompilationError
from .diagnostics import Diagnostic, DiagnosticKind, Level, format_path
from .fidelity import approximations
from .hidden_groups import HiddenGroup, hidden_groups
from .module_info import ModuleInfo, module_info
from .relations import Relation, relations
from .verify import numerical_check, wants_check

__all__ = ["ETraceGraph", "compile_graph"]

_EXCLUSIONS = (
    DiagnosticKind.EXCLUDED_NON_TEMPORAL,
    DiagnosticKind.EXCLUDED_WEIGHT_TO_WEIGHT,
    DiagnosticKind.EXCLUDED_SHAPE_MISMATCH,
    DiagnosticKind.EXCLUDED_NO_PARAM_STATE,
    DiagnosticKind.EXCLUDED_UNUSED,
    DiagnosticKind.NOT_TRACED,
    DiagnosticKind.IN_CONTROL_FLOW,
)


@dataclasses.dataclass(frozen=True)
class ETraceGraph:
    """What the compiler found in one step of a model.

    Attributes:
        module: the traced step and its state map (:class:`ModuleInfo`).
        hidden_groups: the hidden groups, in state order.
        relations: one per ETP equation that drives a hidden group, in equation order.
        diagnostics: every pass's records, in pass order.
    """

    module: ModuleInfo
    hidden_groups: tuple[HiddenGroup, ...]
    relations: tuple[Relation, ...]
    diagnostics: tuple[Diagnostic, ...]

    @property
    def weight_paths(self) -> tuple[tuple, ...]:
        return tuple(state.path for state in self.module.weights)

    def relations_of(self, weight_path: Any) -> tuple[Relation, ...]:
        path = self._resolve(weight_path)
        return tuple(r for r in self.relations if path in r.weight_paths)

    def diagnostics_of(self, weight_path: Any) -> tuple[Diagnostic, ...]:
        path = self._resolve(weight_path)
        return tuple(d for d in self.diagnostics if d.weight_path == path)

    def _resolve(self, weight_path: Any) -> tuple:
        for path in self.weight_paths:
            if weight_path == path or weight_path == format_path(path):
                return path
        known = ", ".join(format_path(p) for p in self.weight_paths)
        raise KeyError(f"{weight_path!r} is not a weight of this model; weights: {known}")

    def report(self, resolved: tuple = ()) -> str:
        """A table: weight path | primitive | hidden groups | classification | size,
        then the groups and every warning (but the records in ``resolved``, which the
        plan's rules take care of)."""
        rows = [("weight", "primitive", "hidden groups", "classification", "size")]
        for path in self.weight_paths:
            related = self.relations_of(path)
            for relation in related:
                groups = " ".join(self.hidden_groups[g].name for g in relation.hidden_groups)
                rows.append((format_path(path), relation.primitive, groups, relation.classification, str(relation.size)))
            for record in self.diagnostics_of(path):
                row = (format_path(path), record.primitive or "-", "-", record.kind.label,
                       str(_size(self.module, path)))
                if record.kind in _EXCLUSIONS and row not in rows:  # one row per exclusion, not per record
                    rows.append(row)
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = [" | ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
        lines.insert(1, "-+-".join("-" * width for width in widths))
        lines.append("")
        lines.append("hidden groups:")
        for group in self.hidden_groups:
            lines.append(f"  {group.index}: {group.name}  S={group.num_states}  shape={group.shape}")
        if not self.hidden_groups:  # compiled for BPTT (online=False): why there are none
            lines.extend(f"  {d.message}" for d in self.diagnostics if d.message.startswith(_NO_GROUPS))
        notes = [d for d in self.diagnostics if d.level >= Level.WARNING and d not in resolved]
        if notes:
            lines.append("")
            lines.append("warnings:")
            lines.extend(f"  {d}" for d in notes)
        return "\n".join(lines)

    def explain(self, weight_path: Any) -> str:
        """Why ``weight_path`` (a path tuple or ``"layers.0.weight"``) is or is not traced."""
        path = self._resolve(weight_path)
        name = format_path(path)
        sentences = []
        for relation in self.relations_of(path):
            groups = ", ".join(self.hidden_groups[g].name for g in relation.hidden_groups)
            operands = ", ".join(
                f"{o.key} from {format_path(o.path)}" + (f"['{o.leaf}']" if o.leaf else "")
                + (f" via {' → '.join(o.chain)}" if o.chain else "")
                for o in relation.operands
            )
            shapes = f"y {relation.y_shape}" if relation.x_shape is None else f"x {relation.x_shape} → y {relation.y_shape}"
            how = ("directly (no other trainable op on the way)" if relation.classification == "all_direct"
                   else "directly and also through another trainable op (that part is dropped)")
            sentences.append(
                f"{name} is traced: the {relation.op_kind} op {relation.primitive} (equation "
                f"{relation.eqn_index}, {shapes}; {operands}) drives the hidden group {groups} {how}."
            )
        for record in self.diagnostics_of(path):
            if record.kind is not DiagnosticKind.RELATION_INCLUDED:
                sentences.append(f"{name}: {record.kind.label}: {record.message}.")
        if not sentences:
            sentences.append(f"{name} is not traced and no pass reported on it.")
        return "\n".join(sentences)


_NO_GROUPS = "none"


def _size(module: ModuleInfo, path: tuple) -> int:
    import math

    state = module.state(path)
    return sum(math.prod(v.aval.shape) for v in state.in_vars)


def compile_graph(model: Any, *example_inputs: Any, step_fn: Any = None, online: bool = True,
                  verify: bool | None = None) -> ETraceGraph:
    """Compile one time step of ``model`` into an :class:`ETraceGraph`.

    Args:
        model: a ``brainstate.nn.Module`` whose states are initialised
            (``brainstate.nn.init_all_states(model, batch_size=B)``).
        example_inputs: one time step's inputs, e.g. ``x: (B, features)``.
        step_fn: traced instead of ``model(*example_inputs)`` when given (see
            :func:`~etrace_fit.compiler.module_info.module_info`).
        online: ``False`` compiles for BPTT, which needs no traces: ``custom_vjp``
            functions stay as written, memory in a plain ``State`` is allowed, and
            hidden states that cannot form groups (of two shapes) leave the graph
            without groups instead of raising.
        verify: test what the passes call exact on the traced step itself, at a
            random point (:mod:`~etrace_fit.compiler.verify`); a claim the step
            contradicts makes the weight approximate, with a record that says why.
            Default: when a module of ``model`` is of a class from outside etrace_fit
            and brainstate, or as the ``ETRACE_FIT_VERIFY`` environment variable says.

    Raises:
        CompilationError: the model has no hidden state, writes a weight in its step,
            or changes a hidden state's unit, shape or dtype.
        ShapeError: an example input does not fit a layer (the message names the layer).

    Example::

        graph = compile_graph(model, jnp.zeros((32, 40)))
        print(graph.report()); print(graph.explain("layers.0.weight"))
    """
    module = module_info(model, *example_inputs, step_fn=step_fn, online=online)
    try:
        groups, group_records = hidden_groups(module)
    except CompilationError as error:
        if online:
            raise
        # BPTT carries every state and needs no hidden groups: states the online rules
        # could not group (a delay buffer beside its membrane) are only reported
        groups, found = (), ()
        diagnostics = (*module.diagnostics, Diagnostic(
            DiagnosticKind.STATE_MISMATCH, f"{_NO_GROUPS} (BPTT needs none): {error}", level=Level.INFO))
    else:
        found, relation_records = relations(module, groups, online)
        diagnostics = (*module.diagnostics, *group_records, *relation_records,
                       *approximations(module, groups, found))
        if online and wants_check(model, verify):
            try:
                diagnostics += numerical_check(module, groups, found, diagnostics, jax.tree.leaves(example_inputs))
            except Exception as error:  # a check must not stop a compile that works: said, not raised
                warnings.warn(f"the compiler's numerical check could not run on this model ({type(error).__name__}: "
                              f"{error}); its weights are classified by the passes alone (please report the "
                              f"model; verify=False or ETRACE_FIT_VERIFY=0 skips the check)", RuntimeWarning,
                              stacklevel=2)
    errors = [d for d in diagnostics if d.level >= Level.ERROR]
    if errors:
        raise CompilationError("; ".join(str(d) for d in errors))
    return ETraceGraph(module=module, hidden_groups=groups, relations=found, diagnostics=diagnostics)

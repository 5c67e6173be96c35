"""The ETP compiler (DESIGN.md §4): one pass per module, each a pure function.

``compile_graph(model, *example_inputs) -> ETraceGraph`` runs them in order:
``module_info`` → ``hidden_groups`` → ``relations``; ``perturbed_step`` builds the
step that yields learning signals. Read ``module_info.py`` first.
"""

from .diagnostics import Diagnostic, DiagnosticKind, Level, format_path
from .graph import ETraceGraph, compile_graph
from .hidden_groups import HiddenGroup, group_jacobian, group_transition, hidden_groups, transition_jaxpr
from .module_info import ModuleInfo, StateInfo, module_info
from .perturbation import group_signal_correction, hidden_outputs, perturbed_step, within_group_readers
from .relations import ALL_DIRECT, ALL_THROUGH_OTHER_ETP, MIXED, OperandSource, Relation, relations

__all__ = [
    "ALL_DIRECT",
    "ALL_THROUGH_OTHER_ETP",
    "Diagnostic",
    "DiagnosticKind",
    "ETraceGraph",
    "HiddenGroup",
    "Level",
    "MIXED",
    "ModuleInfo",
    "OperandSource",
    "Relation",
    "StateInfo",
    "compile_graph",
    "format_path",
    "group_signal_correction",
    "group_jacobian",
    "group_transition",
    "hidden_groups",
    "hidden_outputs",
    "module_info",
    "perturbed_step",
    "relations",
    "transition_jaxpr",
    "within_group_readers",
]

"""The ETP compiler (docs/theory.md §4): one pass per module, each a pure function.

``compile_graph(model, *example_inputs) -> ETraceGraph`` runs them in order:
``module_info`` → ``hidden_groups`` → ``relations``. Read ``module_info.py`` first.
"""

from .diagnostics import Diagnostic, DiagnosticKind, Level, format_path
from .graph import ETraceGraph, compile_graph
from .hidden_groups import HiddenGroup, group_jacobian, group_transition, hidden_groups, transition_jaxpr
from .module_info import ModuleInfo, StateInfo, module_info
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
    "group_jacobian",
    "group_transition",
    "hidden_groups",
    "module_info",
    "relations",
    "transition_jaxpr",
]

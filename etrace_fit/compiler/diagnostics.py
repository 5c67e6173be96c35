"""Structured records the compiler passes emit instead of a flood of warnings.

Every pass returns its :class:`Diagnostic` records; :class:`~etrace_fit.compiler.graph.ETraceGraph`
keeps them all, and its ``report()`` / ``explain()`` turn them into text.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

__all__ = ["Diagnostic", "DiagnosticKind", "Level", "format_path"]


class Level(enum.IntEnum):
    """Severity: ``info`` (a fact), ``warning`` (gradients are approximate or one-step),
    ``error`` (the model cannot be compiled as written)."""

    INFO = 0
    WARNING = 1
    ERROR = 2


class DiagnosticKind(enum.Enum):
    """What a record is about, with its default level (docs/theory.md §4.5)."""

    RELATION_INCLUDED = ("relation included", Level.INFO)
    EXCLUDED_NO_PARAM_STATE = ("excluded: no param state", Level.WARNING)
    EXCLUDED_NON_TEMPORAL = ("excluded: non-temporal", Level.INFO)
    EXCLUDED_SHAPE_MISMATCH = ("excluded: shape mismatch", Level.WARNING)
    EXCLUDED_WEIGHT_TO_WEIGHT = ("excluded: weight-to-weight", Level.WARNING)
    EXCLUDED_UNUSED = ("excluded: output unused", Level.INFO)
    NOT_TRACED = ("weight not used by an ETP op", Level.WARNING)
    NOT_READ = ("weight not read by the step", Level.WARNING)
    PARTIAL_PATH = ("partial path", Level.WARNING)
    APPROXIMATE = ("approximate online gradient", Level.WARNING)
    NON_ELEMENTWISE_COUPLING = ("non-elementwise hidden coupling", Level.WARNING)
    IN_CONTROL_FLOW = ("primitive inside control flow", Level.WARNING)
    IN_NESTED_JIT = ("primitive inside nested jit", Level.INFO)
    MULTI_OUTPUT_PRIMITIVE = ("multi-output primitive", Level.WARNING)
    AMBIGUOUS_PYTREE_LEAF = ("ambiguous pytree leaf", Level.WARNING)
    CARRIED_WITHOUT_TRACE = ("carried without trace", Level.INFO)
    STATE_MISMATCH = ("state mismatch", Level.ERROR)
    PARAM_WRITTEN_IN_STEP = ("param written in step", Level.ERROR)

    @property
    def label(self) -> str:
        return self.value[0]

    @property
    def default_level(self) -> Level:
        return self.value[1]


def format_path(path: Any) -> str:
    """``("layers", 0, "weight")`` → ``"layers.0.weight"``."""
    if path is None:
        return "-"
    if isinstance(path, tuple):
        return ".".join(str(part) for part in path)
    return str(path)


@dataclasses.dataclass(frozen=True)
class Diagnostic:
    """One record: kind, level, message, and what it concerns.

    Attributes:
        kind: the :class:`DiagnosticKind`.
        message: one sentence for a human.
        level: severity (the kind's default unless a pass says otherwise).
        primitive: the primitive's name, if any.
        weight_path: the ``ParamState`` path concerned, if any.
        hidden_paths: the hidden state paths concerned.
        context: further facts as sorted ``(key, value)`` pairs.
    """

    kind: DiagnosticKind
    message: str
    level: Level | None = None
    primitive: str | None = None
    weight_path: tuple | None = None
    hidden_paths: tuple[tuple, ...] = ()
    context: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self):
        if self.level is None:
            object.__setattr__(self, "level", self.kind.default_level)

    def __str__(self) -> str:
        where = f" [{format_path(self.weight_path)}]" if self.weight_path is not None else ""
        return f"{self.level.name.lower()}: {self.kind.label}{where}: {self.message}"

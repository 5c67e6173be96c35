"""Hybrid (DESIGN.md §5.3): choose a rule per traced pair, and report the choice.

Elementwise relations get D-RTRL (their trace is as small as the weight). Dense and conv
relations get D-RTRL when its trace memory is within ``factor`` (default 4) of the
ES-D-RTRL trace, else ES-D-RTRL. ``algo`` may also name one rule for every pair, or be a
dict ``{path pattern: rule name}`` that forces rules per weight (``fnmatch`` patterns on
``"layers.0.weight"``; unmatched weights follow the hybrid choice).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from typing import Any, Mapping

import jax.numpy as jnp

from ..compiler import ETraceGraph, format_path
from ..errors import ConfigError
from .base import Rule, TracedPair, traced_pairs
from .d_rtrl import DRTRL
from .esd_rtrl import ESDRTRL

__all__ = ["ONLINE_RULES", "Plan", "make_plan"]

ONLINE_RULES = ("d_rtrl", "esd_rtrl", "hybrid")


@dataclasses.dataclass(frozen=True)
class Plan:
    """The rule chosen for every traced pair, and what its traces cost."""

    graph: ETraceGraph
    pairs: tuple[TracedPair, ...]
    rules: tuple[Rule, ...]
    batch: int
    trace_dtype: Any

    def trace_bytes(self) -> tuple[int, ...]:
        itemsize = jnp.dtype(self.trace_dtype).itemsize
        return tuple(rule.trace_bytes(pair, self.batch, itemsize) for pair, rule in zip(self.pairs, self.rules))

    def rule_of(self, weight_path: Any) -> tuple[str, ...]:
        """The rule names used for ``weight_path`` (a tuple or ``"layers.0.weight"``)."""
        return tuple(rule.name for pair, rule in zip(self.pairs, self.rules)
                     if weight_path in (pair.relation.weight_path, format_path(pair.relation.weight_path)))

    def report(self) -> str:
        """The compile report followed by a table of the rule per traced pair and its trace memory."""
        rows = [("weight", "primitive", "hidden group", "rule", "trace memory")]
        for pair, rule, size in zip(self.pairs, self.rules, self.trace_bytes()):
            rows.append((format_path(pair.relation.weight_path), pair.relation.primitive, pair.group.name,
                         rule.name, _bytes(size)))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
        lines.insert(1, "-+-".join("-" * w for w in widths))
        total = _bytes(sum(self.trace_bytes()))
        return (self.graph.report() + f"\n\nonline rules (batch {self.batch}, traces "
                f"{jnp.dtype(self.trace_dtype).name}, total {total}):\n" + "\n".join(lines))


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _rule_by_name(name: str, alpha: float) -> Rule:
    if name == "d_rtrl":
        return DRTRL()
    if name == "esd_rtrl":
        return ESDRTRL(alpha)
    raise ConfigError(f"unknown rule {name!r} for a weight; valid: 'd_rtrl', 'esd_rtrl'")


def _hybrid_rule(pair: TracedPair, batch: int, alpha: float, factor: float) -> Rule:
    if pair.kind == "elementwise":
        return DRTRL()
    d_rtrl, esd = DRTRL(), ESDRTRL(alpha)
    return d_rtrl if d_rtrl.trace_bytes(pair, batch, 1) <= factor * esd.trace_bytes(pair, batch, 1) else esd


def make_plan(
    graph: ETraceGraph,
    algo: str | Mapping[str, str],
    *,
    alpha: float,
    batch: int,
    trace_dtype: Any = jnp.float32,
    factor: float = 4.0,
) -> Plan:
    """Pick a rule for every traced pair of ``graph`` (see the module docstring)."""
    pairs = traced_pairs(graph)
    overrides: Mapping[str, str] = {}
    if isinstance(algo, Mapping):
        overrides, default = algo, "hybrid"
        for pattern, name in overrides.items():
            _rule_by_name(name, alpha)
            if not any(fnmatch.fnmatchcase(format_path(p), pattern) for p in graph.weight_paths):
                known = ", ".join(format_path(p) for p in graph.weight_paths)
                raise ConfigError(f"algo pattern {pattern!r} matches no weight; weights: {known}")
    elif algo in ONLINE_RULES:
        default = algo
    else:
        raise ConfigError(f"unknown online rule {algo!r}; valid: 'd_rtrl', 'esd_rtrl', 'hybrid', or a dict "
                          f"{{path pattern: 'd_rtrl' | 'esd_rtrl'}}")
    rules = []
    for pair in pairs:
        name = format_path(pair.relation.weight_path)
        forced = next((rule for pattern, rule in overrides.items() if fnmatch.fnmatchcase(name, pattern)), None)
        if forced is not None:
            rules.append(_rule_by_name(forced, alpha))
        elif default == "hybrid":
            rules.append(_hybrid_rule(pair, batch, alpha, factor))
        else:
            rules.append(_rule_by_name(default, alpha))
    return Plan(graph=graph, pairs=pairs, rules=tuple(rules), batch=batch, trace_dtype=trace_dtype)

"""Hybrid (docs/theory.md §5.3): choose a rule per traced pair, and report the choice.

Elementwise relations get D-RTRL (their trace is as small as the weight). Dense and conv
relations get D-RTRL wherever its trace fits the memory budget and ES-D-RTRL beyond it:
starting from ES-D-RTRL, pairs move to D-RTRL — those whose D-RTRL gradient is exact
(the compiler found no approximation for the weight) first, then the cheapest — while
the plan's traces fit the budget. The budget is trace bytes *per sample*
(``memory_budget``, e.g. ``"16MiB"``; default :data:`DEFAULT_BUDGET_PER_SAMPLE`), so the
plan never depends on the batch size. ``algo`` may also name one rule for every pair,
or be a dict ``{path pattern: rule name}`` that forces rules per weight (``fnmatch``
patterns on ``"layers.0.weight"``; unmatched weights follow the hybrid choice).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import warnings
from typing import Any, Mapping

import jax.numpy as jnp

from ..compiler import DiagnosticKind, ETraceGraph, format_path
from ..errors import ConfigError
from .base import Rule, TracedPair, traced_pairs
from .d_rtrl import DRTRL
from .eprop import EPropRule
from .esd_rtrl import ESDRTRL
from .readout import ReadoutMemory, readout_memory
from .registry import ONLINE_ALGOS, check_algo, make_rule, sequence_algo, signal_algo

__all__ = ["DEFAULT_BUDGET_PER_SAMPLE", "Plan", "format_bytes", "make_plan", "parse_bytes"]

#: Trace memory per sample the hybrid may spend on D-RTRL when no budget is given: at
#: batch 32 that is 128 MiB (a GRU(64→128) needs 0.3 MiB per sample for D-RTRL everywhere).
DEFAULT_BUDGET_PER_SAMPLE = 4 * 1024**2


# Compiler records after which a weight's online gradient is not BPTT's.
_APPROXIMATE_KINDS = (
    DiagnosticKind.APPROXIMATE,
    DiagnosticKind.PARTIAL_PATH,
    DiagnosticKind.EXCLUDED_WEIGHT_TO_WEIGHT,
    DiagnosticKind.EXCLUDED_SHAPE_MISMATCH,
    DiagnosticKind.EXCLUDED_NO_PARAM_STATE,
    DiagnosticKind.IN_CONTROL_FLOW,
    DiagnosticKind.NOT_TRACED,
)


@dataclasses.dataclass(frozen=True)
class Plan:
    """The rule chosen for every traced pair, and what its traces cost."""

    graph: ETraceGraph
    pairs: tuple[TracedPair, ...]
    rules: tuple[Rule, ...]
    batch: int  # the batch size the report's totals are shown at (the rules do not depend on it)
    trace_dtype: Any
    memory_budget: int | None = None  # bytes per sample (None: the default)
    hybrid: bool = False  # whether the hybrid chose any rule (the budget line of the report)
    feedback: Any = None  # a signal replacement's Feedback (e-prop), read by the step program
    signal: Any = None  # the signal replacement itself (EProp), for the report
    readout: ReadoutMemory | None = None  # the leaky readout whose memory the traces follow

    def resolved(self) -> tuple:
        """The compiler's "later memory" records this plan makes exact: the only later
        memory is the readout's, and every pair of the weight carries the readout
        memory (docs/theory.md §5.10)."""
        if self.readout is None:
            return ()
        carried: dict[Any, bool] = {}
        for pair in self.pairs:
            path = pair.relation.weight_path
            carried[path] = carried.get(path, True) and pair.readout_memory
        return tuple(record for record in self.graph.diagnostics
                     if dict(record.context).get("reason") == "later_memory"
                     and set(dict(record.context).get("groups", ())) <= {self.readout.group}
                     and carried.get(record.weight_path, False))

    def trace_bytes(self, batch: int | None = None) -> tuple[int, ...]:
        """Trace bytes per pair at ``batch`` (default: the plan's batch)."""
        itemsize = jnp.dtype(self.trace_dtype).itemsize
        batch = self.batch if batch is None else batch
        return tuple(rule.trace_bytes(pair, batch, itemsize) for pair, rule in zip(self.pairs, self.rules))

    def bytes_per_sample(self) -> int:
        """All traces of one sample: the memory the batch multiplies."""
        return sum(self.trace_bytes(1))

    def rule_of(self, weight_path: Any) -> tuple[str, ...]:
        """The rule names used for ``weight_path`` (a tuple or ``"layers.0.weight"``)."""
        return tuple(rule.name for pair, rule in zip(self.pairs, self.rules)
                     if weight_path in pair.relation.weight_paths
                     or weight_path in map(format_path, pair.relation.weight_paths))

    def approximations(self) -> dict[str, tuple[str, ...]]:
        """``{weight path: reasons}`` for every weight whose online gradient under this
        plan is not BPTT's (a weight not listed gets the exact gradient): what the
        compiler found (a path through a later layer's memory, dense recurrence,
        weight-to-weight, an untraced use) and ES-D-RTRL's factorisation."""
        found: dict[str, list[str]] = {}
        # every trainable operand of an op is named (a LoRA adapter's lora_a and lora_b
        # beside its frozen base weight, the relation's weight_path)
        operands = {r.weight_path: r.weight_paths for r in self.graph.relations}

        def add(weight_path, reason, replace=False):
            for path in operands.get(weight_path, (weight_path,)):
                if replace:
                    found[format_path(path)] = [reason]
                else:
                    found.setdefault(format_path(path), []).append(reason)

        resolved = self.resolved()
        for record in self.graph.diagnostics:  # the same records as _structurally_approximate
            if record.kind in _APPROXIMATE_KINDS and record.weight_path is not None and record not in resolved:
                add(record.weight_path, record.message)
        for pair, rule in zip(self.pairs, self.rules):
            if isinstance(rule, ESDRTRL) and pair.kind != "elementwise":
                add(pair.relation.weight_path,
                    f"ES-D-RTRL factorises its trace into input and output parts (exact only where "
                    f"{pair.group.name}'s Jacobian is the constant decay {rule.alpha:g}; biases are exact)")
            elif isinstance(rule, EPropRule):  # e-prop's own account replaces the compiler's
                feedback = "the readout's weights" if self.feedback.matrix is None else "a fixed random matrix"
                add(pair.relation.weight_path,
                    f"e-prop: the learning signal is the readout's error fed back through {feedback} (eligibility "
                    f"filtered with the readout's decay κ = {rule.kappa:g}); the paths through the recurrent "
                    f"weights to later steps are dropped", replace=True)
            elif not isinstance(rule, (DRTRL, ESDRTRL)):
                add(pair.relation.weight_path, f"rule {rule.name!r} is not one whose exactness the library knows")
        return {path: tuple(dict.fromkeys(reasons)) for path, reasons in found.items()}

    def report(self) -> str:
        """The compile report followed by a table of the rule per traced pair, its trace
        memory and whether the weight's gradient is exact, then the reasons for every
        approximate one."""
        approximate = self.approximations()
        rows = [("weight", "primitive", "hidden group", "rule", "trace memory", "gradient")]
        for pair, rule, size in zip(self.pairs, self.rules, self.trace_bytes()):
            name = format_path(pair.relation.weight_path)
            shown = " + ".join(map(format_path, pair.relation.weight_paths))  # a weight made of several (LoRA)
            rows.append((shown, pair.relation.primitive, pair.group.name, rule.name, format_bytes(size),
                         "approximate" if name in approximate else "exact"))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
        lines.insert(1, "-+-".join("-" * w for w in widths))
        total = format_bytes(sum(self.trace_bytes()))
        if self.memory_budget is not None:
            over = (", over it: ES-D-RTRL's traces are the floor" if self.hybrid
                    and self.bytes_per_sample() > self.memory_budget else "")
            budget = f", budget {format_bytes(self.memory_budget)} per sample{over}"
        else:
            budget = f", budget {format_bytes(DEFAULT_BUDGET_PER_SAMPLE)} per sample (default)" if self.hybrid else ""
        why = "".join(f"\n  {path}: " + "; ".join(reasons) for path, reasons in approximate.items())
        memory = ""
        if self.readout is not None:
            readout = self.graph.hidden_groups[self.readout.group].name
            reading = ", ".join(self.graph.hidden_groups[g].name for g in self.readout.reading)
            held = self.readout
            memory = (f"\nreadout memory: {reading} → {readout} (κ = {held.kappa:.4g}): one more trace state "
                      f"per unit follows the readout's memory" if not held.units else
                      f"\nreadout memory: {reading} → {readout} (κ = {held.kappa_range[0]:.4g}–"
                      f"{held.kappa_range[1]:.4g}, one per readout unit): {held.units} more trace states per unit "
                      f"follow the readout's memory, one for each readout unit")
        return (self.graph.report(self.resolved()) + f"\n\nonline rules (batch {self.batch}, traces "
                f"{jnp.dtype(self.trace_dtype).name}, total {total}: {format_bytes(self.bytes_per_sample())} per sample"
                f"{budget}):\n" + "\n".join(lines) + memory
                + (f"\n\napproximate online gradients (compare with BPTT: ef.gradient_fidelity):{why}"
                   if approximate else "\n\nevery weight gets its exact (BPTT) gradient"))


def format_bytes(n: int) -> str:
    """``1536`` → ``"1.5 KiB"`` (reports and summaries)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


_UNITS = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1024, "mib": 1024**2, "gib": 1024**3}


def parse_bytes(value: Any, what: str = "memory_budget") -> int | None:
    """``None``, a non-negative int of bytes, or a string like ``"64MiB"`` / ``"1.5 GB"``."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{what} must be bytes (int) or a size like '64MiB', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{what} must be non-negative, got {value}")
        return value
    if isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = text[len(number):] or "b"
        try:
            amount = float(number)
        except ValueError:
            amount = -1.0
        if unit in _UNITS and amount >= 0:
            if not math.isfinite(amount * _UNITS[unit]):  # '1e400', 'inf': int() raised OverflowError
                raise ConfigError(f"{what} must be a finite size like '64MiB', got {value!r}")
            return int(amount * _UNITS[unit])
    raise ConfigError(f"{what} must be bytes (int) or a size like '64MiB' (units: B, KB, MB, GB, KiB, MiB, GiB), "
                      f"got {value!r}")


def _hybrid_rule(pair: TracedPair, alpha: float) -> Rule:
    """The hybrid's starting rule: D-RTRL for elementwise pairs, ES-D-RTRL otherwise."""
    return DRTRL() if pair.kind == "elementwise" else ESDRTRL(alpha)


def _structurally_approximate(graph: ETraceGraph, resolved: tuple = ()) -> set[str]:
    """Weight paths whose D-RTRL gradient the compiler already finds approximate."""
    return {format_path(d.weight_path) for d in graph.diagnostics
            if d.kind in _APPROXIMATE_KINDS and d.weight_path is not None and d not in resolved}


def with_readout_memory(graph: ETraceGraph, pairs: tuple[TracedPair, ...]):
    """``(pairs, readout)``: the pairs into the groups a leaky readout reads marked to
    carry its memory (``readout.py``), and the :class:`ReadoutMemory` (or ``None``)."""
    readout = readout_memory(graph)
    if readout is None:
        return pairs, None
    return tuple(dataclasses.replace(p, readout_memory=readout.states) if p.group.index in readout.reading else p
                 for p in pairs), readout


def make_plan(
    graph: ETraceGraph,
    algo: str | Mapping[str, str],
    *,
    alpha: float,
    batch: int,
    trace_dtype: Any = jnp.float32,
    memory_budget: Any = None,
) -> Plan:
    """Pick a rule for every traced pair of ``graph`` (see the module docstring);
    ``batch`` is only where the report counts totals."""
    budget = parse_bytes(memory_budget)
    pairs, readout = with_readout_memory(graph, traced_pairs(graph))
    overrides: Mapping[str, Any] = {}
    if sequence_algo(algo) is not None:
        raise ConfigError(f"BPTT has no plan: make_plan takes an online algo; valid: "
                          f"{', '.join(map(repr, ONLINE_ALGOS))}, a rule value, or a dict")
    check_algo(algo)
    replacement = signal_algo(algo)
    if replacement is not None:  # e-prop: its own plan
        return replacement.plan(graph, batch=batch, trace_dtype=trace_dtype, memory_budget=budget)
    if isinstance(algo, Mapping):
        overrides, default = algo, "hybrid"
        for pattern in overrides:
            if not any(fnmatch.fnmatchcase(format_path(p), pattern) for p in graph.weight_paths):
                known = ", ".join(format_path(p) for p in graph.weight_paths)
                raise ConfigError(f"algo pattern {pattern!r} matches no weight; weights: {known}")
    else:
        default = algo
    rules, chosen = [], []  # chosen: pairs whose rule the hybrid picked (not forced)
    deciding = set()  # the patterns that decided some traced weight's rule
    for n, pair in enumerate(pairs):
        name = format_path(pair.relation.weight_path)
        pattern = next((pattern for pattern in overrides if fnmatch.fnmatchcase(name, pattern)), None)
        forced = None if pattern is None else overrides[pattern]
        deciding.add(pattern)
        if forced is not None:
            rules.append(make_rule(forced, alpha))
        elif isinstance(default, str) and default == "hybrid":
            rules.append(_hybrid_rule(pair, alpha))
            chosen.append(n)
        else:
            rules.append(make_rule(default, alpha))
    dead = [pattern for pattern in overrides if pattern not in deciding]
    if dead:  # a weight that drives no hidden state has no rule; a pattern after one that matched first decides nothing
        traced = sorted({format_path(pair.relation.weight_path) for pair in pairs})
        warnings.warn(f"algo pattern(s) {', '.join(map(repr, dead))} decide no traced weight's rule: every weight "
                      f"they match drives no hidden state (its gradient is one step, no rule applies) or was decided "
                      f"by an earlier pattern (the first that matches decides); traced weights: {', '.join(traced)}",
                      UserWarning, stacklevel=4)
    if chosen:  # D-RTRL wherever it fits the per-sample budget: exact weights first, then the cheapest
        limit = DEFAULT_BUDGET_PER_SAMPLE if budget is None else budget
        itemsize = jnp.dtype(trace_dtype).itemsize
        total = sum(rule.trace_bytes(pair, 1, itemsize) for pair, rule in zip(pairs, rules))
        extra = {n: DRTRL().trace_bytes(pairs[n], 1, itemsize) - rules[n].trace_bytes(pairs[n], 1, itemsize)
                 for n in chosen if rules[n].name == "esd_rtrl"}
        resolved = Plan(graph=graph, pairs=pairs, rules=tuple(rules), batch=batch, trace_dtype=trace_dtype,
                        readout=readout).resolved()
        approximate = _structurally_approximate(graph, resolved)
        is_approximate = {n: format_path(pairs[n].relation.weight_path) in approximate for n in extra}
        for n in sorted(extra, key=lambda n: (is_approximate[n], extra[n], n)):
            if total + extra[n] <= limit:
                rules[n], total = DRTRL(), total + extra[n]
        if total > limit:
            warnings.warn(f"memory_budget: {format_bytes(limit)} per sample is less than this model's smallest "
                          f"traces, {format_bytes(total)} per sample with ES-D-RTRL wherever the hybrid chooses (the "
                          f"floor): the traces take that; give at least {format_bytes(total)}, or another algo",
                          UserWarning, stacklevel=3)
    return Plan(graph=graph, pairs=pairs, rules=tuple(rules), batch=batch, trace_dtype=trace_dtype,
                memory_budget=budget, hybrid=bool(chosen), readout=readout)

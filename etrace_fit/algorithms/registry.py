"""The rule registry: every name ``algo`` accepts, in one place.

Two kinds of values plug in. A *trace rule* is a value with ``name``, ``init_traces``,
``step``, ``trace_bytes`` and ``trace_norm`` (:class:`~etrace_fit.algorithms.base.Rule`):
the plan gives each traced weight one. To add one, write its module and add one line
to :data:`RULES` — or pass the value itself as ``algo`` (alone, or as a value of the
``{path pattern: rule}`` dict). A *sequence-level algorithm* (BPTT, truncated BPTT) is a
value with ``name`` and ``build(graph, step_loss) -> OnlineProgram`` that replaces the
plan for the whole model: :data:`SEQUENCE_ALGOS` by name, ``"tbptt:<window>"``, or the
value itself (:func:`sequence_algo`). A *signal replacement* (e-prop) keeps the trace
rules but feeds them another learning signal: a value with ``name`` and
``plan(graph, batch=, trace_dtype=, memory_budget=) -> Plan`` whose plan carries a
``feedback`` for the step program (``"eprop"``, ``"eprop:random"`` or the value:
:func:`signal_algo`). Everything that lists or validates
algorithms (the plan, ``compile``, the ``Trainer``, the ``etrace-fit`` command, their
error messages) reads this module.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..errors import ConfigError
from .base import Rule
from .bptt import BPTT, TBPTT
from .d_rtrl import DRTRL
from .eprop import EProp, parse_eprop
from .esd_rtrl import ESDRTRL

__all__ = ["ALGOS", "ONLINE_ALGOS", "RULES", "SEQUENCE_ALGOS", "SIGNAL_ALGOS", "check_algo", "is_rule",
           "make_rule", "sequence_algo", "signal_algo"]

#: Trace rules by name: a factory of the ES smoothing factor α.
RULES: dict[str, Callable[[float], Rule]] = {
    "d_rtrl": lambda alpha: DRTRL(),
    "esd_rtrl": ESDRTRL,
}
#: Sequence-level choices on top of the trace rules (as registered at import; the
#: checks below read RULES itself, so a rule registered later is accepted too).
#: Signal replacements by name (``"eprop:random"``, ``":seed=N"``, ``":kappa=F"``
#: give other :class:`EProp` values).
SIGNAL_ALGOS: dict[str, Any] = {"eprop": EProp()}
ONLINE_ALGOS = (*RULES, "hybrid", *SIGNAL_ALGOS)
ALGOS = (*ONLINE_ALGOS, "bptt")
#: Sequence-level algorithms by name (``"tbptt:<window>"`` gives :class:`TBPTT`).
SEQUENCE_ALGOS: dict[str, Any] = {"bptt": BPTT()}


def _algos() -> tuple[str, ...]:
    return (*RULES, "hybrid", *SIGNAL_ALGOS, *SEQUENCE_ALGOS)


def signal_algo(algo: Any) -> Any:
    """The signal replacement ``algo`` names or is (``"eprop"``, ``"eprop:random"``,
    ``EProp(...)``, or any value with ``plan``), or None."""
    if isinstance(algo, str):
        return SIGNAL_ALGOS[algo] if algo in SIGNAL_ALGOS else parse_eprop(algo)
    if callable(getattr(algo, "plan", None)) and isinstance(getattr(algo, "name", None), str):
        return algo
    return None


def sequence_algo(algo: Any) -> Any:
    """The sequence-level algorithm ``algo`` names or is (``"bptt"``, ``"tbptt:50"``,
    ``TBPTT(50)``, or any value with ``build``), or None for the trace rules."""
    if isinstance(algo, str):
        if algo in SEQUENCE_ALGOS:
            return SEQUENCE_ALGOS[algo]
        if algo == "tbptt" or algo.startswith("tbptt:"):
            window = algo.partition(":")[2]
            if not window.isdigit() or int(window) < 1:
                raise ConfigError(f"truncated BPTT needs a window of steps: algo='tbptt:50' or "
                                  f"algo=ef.algorithms.TBPTT(50), got {algo!r}")
            return TBPTT(int(window))
        return None
    if callable(getattr(algo, "build", None)) and isinstance(getattr(algo, "name", None), str):
        return algo
    return None


def is_rule(value: Any) -> bool:
    """Whether ``value`` is a rule value (rather than a name)."""
    return all(callable(getattr(value, attr, None)) for attr in ("init_traces", "step", "trace_bytes", "trace_norm"))


def _names(names) -> str:
    return ", ".join(repr(n) for n in names)


def make_rule(rule: Any, alpha: float) -> Rule:
    """The rule for a weight: a registered name or a rule value."""
    if is_rule(rule):
        return rule
    if isinstance(rule, str) and rule in RULES:
        return RULES[rule](alpha)
    raise ConfigError(f"unknown rule {rule!r} for a weight; valid: {_names(RULES)} or a rule value")


def check_algo(algo: Any) -> None:
    """``ConfigError`` unless ``algo`` is a name of :data:`ALGOS`, a rule value, or a dict
    of path patterns to rules."""
    if isinstance(algo, Mapping):
        for rule in algo.values():
            make_rule(rule, 0.9)
        return
    if sequence_algo(algo) is not None or signal_algo(algo) is not None:
        return
    if not is_rule(algo) and algo not in _algos():
        raise ConfigError(f"unknown algo {algo!r}; valid: {_names(_algos())}, 'tbptt:<window>', 'eprop:random', a rule value, or "
                          f"a dict {{path pattern: {' | '.join(repr(n) for n in RULES)}}}")

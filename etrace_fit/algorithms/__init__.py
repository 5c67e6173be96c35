"""Online learning rules (docs/theory.md §5): D-RTRL, ES-D-RTRL, hybrid, e-prop, and
(truncated) BPTT.

``sequence_grad(model, xs, targets, step_loss, algo=...)`` is the entry point. A rule is
a small object with ``init_traces`` and ``step`` over a canonical form of the signals
(``base.py``); adding a rule means adding one module. Read ``base.py`` first.
"""

from .base import PairSignals, Rule, TracedPair, traced_pairs
from .bptt import BPTT, TBPTT
from .d_rtrl import DRTRL
from .eprop import EProp, EPropRule
from .esd_rtrl import ESDRTRL, resolve_decay
from .fidelity import WeightFidelity, gradient_fidelity
from .hybrid import Plan, make_plan
from .learner import CompiledSequence, Learner, LearnerState, compile
from .registry import ALGOS, RULES, SEQUENCE_ALGOS, SIGNAL_ALGOS
from .sequence import compile_sequence, online_fit, plan_for, sequence_grad

__all__ = [
    "ALGOS",
    "BPTT",
    "CompiledSequence",
    "DRTRL",
    "EProp",
    "EPropRule",
    "Learner",
    "LearnerState",
    "ESDRTRL",
    "PairSignals",
    "Plan",
    "RULES",
    "Rule",
    "SEQUENCE_ALGOS",
    "SIGNAL_ALGOS",
    "TBPTT",
    "TracedPair",
    "WeightFidelity",
    "compile",
    "compile_sequence",
    "gradient_fidelity",
    "make_plan",
    "online_fit",
    "plan_for",
    "resolve_decay",
    "sequence_grad",
    "traced_pairs",
]

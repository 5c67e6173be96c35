"""A test wrapper shared by the algorithm and layer tests: a rule without its chunked
or in-loop forms, so that the engine scans the rule's per-step ``step`` (the reference
form the chunked ones are tested against)."""

from __future__ import annotations


class PerStep:
    """``rule`` offering only ``step``: no ``chunk``, ``step_rows`` or ``finish_rows``.

    ``for_pair`` is forwarded when the rule has one (D-RTRL fitted to a sparse pair), and
    the specialised rule is wrapped again.
    """

    def __init__(self, rule):
        self.rule, self.name = rule, rule.name

    def for_pair(self, pair):
        return PerStep(self.rule.for_pair(pair)) if hasattr(self.rule, "for_pair") else self

    def init_traces(self, pair, batch, dtype):
        return self.rule.init_traces(pair, batch, dtype)

    def step(self, traces, signals, t):
        return self.rule.step(traces, signals, t)

    def trace_bytes(self, pair, batch, itemsize):
        return self.rule.trace_bytes(pair, batch, itemsize)

    def trace_norm(self, traces, t):
        return self.rule.trace_norm(traces, t)

"""e-prop (Bellec et al. 2020): the D-RTRL traces with the readout's error fed back
as the learning signal — a *signal replacement*, the registry's third kind of value.

For a network whose readout ``y^t = κ y^{t−1} + z^t W_out + b`` (``κ = 0``: a stateless
readout) reads the spikes ``z^t`` of one recurrent layer, e-prop trains the layer's
weights with

    e^t[i, j]  = Σ_s ψ^t[j, s] ε^t[i, j, s]        ψ = ∂z^t/∂h^t  (the pseudo-derivative)
    ē^t        = κ ē^{t−1} + e^t                   (filtered like the readout)
    L^t[j]     = Σ_k B[j, k] ∂E^t/∂y^t[k]          B = W_out (symmetric) or fixed random
    ∂E/∂W[i, j] ≈ Σ_t L^t[j] ē^t[i, j]

where ``ε`` is the D-RTRL trace (docs/theory.md §5.1: ``ε^t = D^t ε^{t−1} + Df^t x^t``,
with ``D`` the layer's own per-unit Jacobian; for a recurrent LIF with
``detach_reset=True``, ``D = α`` and ``ε`` is e-prop's eligibility vector, the
low-pass filtered presynaptic activity). Unlike the library's D-RTRL signal
(§5.8, ``∂L^t/∂h^{t−1}`` through every path of a step), the learning signal comes
from the readout alone: the path through the recurrent weights to later steps is
dropped (e-prop's approximation), and the readout's memory is followed exactly by the
``κ`` filter. The readout's own weights, and every weight the plan does not give to
e-prop, keep their usual exact gradient.

``EProp`` finds the readout (the step's last dense ETP op), the layer it reads (the one
hidden group whose new state reaches the readout's input through elementwise ops only)
and ``κ`` (the readout group's decay, which must be one number) when the plan is made,
and says what it could not find by name.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax

from ..compiler import ETraceGraph, format_path
from ..errors import ConfigError
from ..ops import etp_op_info
from .base import traced_pairs
from .d_rtrl import DRTRL
from .readout import dense_readouts, groups_reaching, readout_decay, reading_is_elementwise

__all__ = ["EProp", "EPropRule", "Feedback", "parse_eprop"]

_FEEDBACK = ("symmetric", "random")


@dataclasses.dataclass(frozen=True)
class Feedback:
    """Where e-prop's learning signal comes from (found by :meth:`EProp.feedback`).

    Attributes:
        readout: the readout's equation index in the step's jaxpr.
        group: the index of the hidden group the readout reads.
        matrix: the fixed random feedback ``B`` shaped like the readout weight
            ``(inputs, outputs)``, or ``None`` for symmetric feedback (``B = W_out``).
        kappa: the readout's decay ``κ`` (0 for a stateless readout).
    """

    readout: int
    group: int
    matrix: Any
    kappa: float


class EPropRule(DRTRL):
    """The trace rule of e-prop's weights (see the module docstring): D-RTRL over the
    layer's states and one more state per unit, the filtered eligibility ``ē``. With
    ``ψ = ∂z^t/∂h^t``,

        ē^t = κ ē^{t−1} + ψ^t·ε^t = (ψ^t D^t) ε^{t−1} + κ ē^{t−1} + (ψ^t Df^t) x^t

    is linear in the trace like the states' own recursion, and ``Σ L^t ē^t`` is the
    D-RTRL gradient with the signal ``G = (L ψD, κL)`` on ``(ε^{t−1}, ē^{t−1})`` and the
    one-step part ``dY = L ψDf`` (the step program builds these signals; the readout
    memory of docs/theory.md §5.10 has the same form with another signal). So e-prop
    runs on D-RTRL's exact chunk (§5.9) instead of a loop that read and wrote its
    ``(B, P, S+1, K, O)`` traces at every step (the demo's model: 200 → 33 ms a batch).
    Traces ``(B, P, S+1, K, O)``, ``ē`` the last state."""

    name = "eprop"
    extra_state = True

    def __init__(self, kappa: float, **options):
        super().__init__(**{"sparse": False, **options})
        self.kappa = float(kappa)

    def trace_norm(self, traces, t: jax.Array) -> jax.Array:
        """The norm of the filtered eligibility ``ē`` per sample."""
        return super().trace_norm(traces[:, :, -1:], t)

    def __repr__(self) -> str:
        return f"EPropRule(kappa={self.kappa:g})"


@dataclasses.dataclass(frozen=True)
class EProp:
    """e-prop (``algo="eprop"``, ``"eprop:random"`` or ``EProp(...)``), a baseline
    beside BPTT, truncated BPTT and the library's own rules.

    Args:
        feedback: ``"symmetric"`` (the readout's weights carry the error back, e-prop's
            "symmetric e-prop") or ``"random"`` (a fixed random matrix ``B`` with
            entries ``N(0, 1/inputs)`` drawn from ``seed``: "random e-prop", as in
            feedback alignment).
        kappa: the readout's decay ``κ`` for the eligibility filter; ``None`` (default)
            reads it off the model (0 for a stateless readout such as ``Linear``,
            ``exp(−dt/τ)`` for a ``LeakyRateReadout``).
        seed: the random feedback's seed (the same seed, the same ``B``: runs and
            resumes are reproducible).

    Which model it takes: a recurrent layer read by the step's last dense ETP op (the
    readout), e.g. ``Sequential(RecurrentALIF(40, 100), LeakyRateReadout(100, 2))``.
    Weights that drive another layer are an error (e-prop feeds the error back to the
    layer the readout reads); use ``"hybrid"`` for deeper models.
    """

    feedback: str = "symmetric"
    kappa: float | None = None
    seed: int = 0
    name: ClassVar[str] = "eprop"

    def __post_init__(self):
        if self.feedback not in _FEEDBACK:
            raise ConfigError(f"EProp: feedback must be one of {_FEEDBACK}, got {self.feedback!r}")
        if self.kappa is not None and not (isinstance(self.kappa, (int, float)) and 0.0 <= self.kappa < 1.0):
            raise ConfigError(f"EProp: kappa must be a decay in [0, 1) or None (read off the readout), "
                              f"got {self.kappa!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"EProp: seed must be an int, got {self.seed!r}")

    def __str__(self) -> str:
        parts = ["eprop"] + (["random"] if self.feedback == "random" else [])
        parts += [f"seed={self.seed}"] if self.seed else []
        parts += [f"kappa={self.kappa!r}"] if self.kappa is not None else []
        return ":".join(parts)

    # ---------------------------------------------------------------- the model
    def feedback_of(self, graph: ETraceGraph) -> Feedback:
        """The readout, the layer it reads, ``B`` and ``κ`` of ``graph`` (``ConfigError``
        naming what is missing when the model is not one e-prop takes)."""
        module = graph.module
        eqns = module.jaxpr.eqns
        dense = dense_readouts(graph)
        if not dense:
            raise ConfigError("algo='eprop': the step has no dense ETP op to read out from (e-prop feeds the "
                              "readout's error back; end the model with Linear or LeakyRateReadout)")
        readout = dense[-1]
        eqn = eqns[readout]
        op = etp_op_info(eqn.primitive)
        x_var = eqn.invars[op.x_index]
        weight_shape = tuple(op.split_operands(list(eqn.invars))[1]["weight"].aval.shape)
        what = f"the readout ({eqn.primitive.name} {weight_shape[0]} → {weight_shape[-1]}, the step's last dense op)"
        reading = groups_reaching(graph, x_var)
        if len(reading) != 1:
            if not reading:  # a spike of the membrane before its reset, written into no state
                raise ConfigError(
                    f"algo='eprop': {what} must read the spikes of one recurrent layer as the step writes them, but "
                    f"its input is computed from no hidden state's new value (a spike taken from the membrane "
                    f"before the reset that follows it, as Norse's LIF does, is such an input): e-prop's "
                    f"eligibility follows the states the step writes. Store the spike as a hidden state "
                    f"(self.hidden('z')) and return it, or take it from the new membrane; algo='hybrid' or "
                    f"'d_rtrl' take the neuron as written")
            found = ", ".join(graph.hidden_groups[g].name for g in reading)
            raise ConfigError(f"algo='eprop': {what} must read the spikes of one recurrent layer; it reads the "
                              f"hidden groups {found}")
        group = graph.hidden_groups[reading[0]]
        if not reading_is_elementwise(graph, group, x_var):
            raise ConfigError(f"algo='eprop': {what} reads {group.name} through an op that mixes units (a "
                              f"reshape, pooling, a norm); e-prop needs the readout's input unit j to be neuron j")
        if tuple(x_var.aval.shape) != tuple(group.shape):
            raise ConfigError(f"algo='eprop': {what} takes input of shape {tuple(x_var.aval.shape)}, but the layer "
                              f"it reads, {group.name}, has shape {tuple(group.shape)}; expected one input per neuron")
        kappa = self.kappa if self.kappa is not None else _readout_decay(graph, readout, what)
        matrix = None
        if self.feedback == "random":
            dtype = x_var.aval.dtype
            matrix = (jax.random.normal(jax.random.PRNGKey(self.seed), weight_shape, dtype)
                      / math.sqrt(weight_shape[0]))
        return Feedback(readout=readout, group=group.index, matrix=matrix, kappa=float(kappa))

    def plan(self, graph: ETraceGraph, *, batch: int, trace_dtype: Any, memory_budget: Any = None):
        """The plan: :class:`EPropRule` for every weight into the layer the readout
        reads, D-RTRL for the readout's own weights."""
        from .hybrid import Plan  # hybrid imports the registry, which imports this module

        feedback = self.feedback_of(graph)
        readout_groups = {g for r in graph.relations if r.eqn_index == feedback.readout for g in r.hidden_groups}
        pairs, rules = traced_pairs(graph), []
        for pair in pairs:
            if pair.group.index == feedback.group:
                rules.append(EPropRule(feedback.kappa))
            elif pair.group.index in readout_groups:
                rules.append(DRTRL())
            else:
                raise ConfigError(
                    f"algo='eprop': {format_path(pair.relation.weight_path)} drives {pair.group.name}, which the "
                    f"readout does not read; e-prop feeds the readout's error back to the layer it reads "
                    f"({graph.hidden_groups[feedback.group].name}) only. Use algo='hybrid' for this model")
        return Plan(graph=graph, pairs=pairs, rules=tuple(rules), batch=batch, trace_dtype=trace_dtype,
                    memory_budget=None, feedback=feedback, signal=self)


def parse_eprop(name: str) -> EProp | None:
    """``"eprop"``, ``"eprop:random"``, ``"eprop:symmetric"``, with optional
    ``:seed=N`` and ``:kappa=F`` parts, as an :class:`EProp`; ``None`` for other names."""
    head, _, rest = name.partition(":")
    if head != "eprop":
        return None
    options: dict[str, Any] = {}
    for part in filter(None, rest.split(":")):
        key, eq, value = part.partition("=")
        try:
            if not eq and key in _FEEDBACK:
                options["feedback"] = key
            elif key == "seed":
                options["seed"] = int(value)
            elif key == "kappa":
                options["kappa"] = float(value)
            else:
                raise ValueError(part)
        except ValueError:
            raise ConfigError(f"algo {name!r}: expected 'eprop', 'eprop:random' or 'eprop:symmetric' with optional "
                              f"':seed=<int>' and ':kappa=<decay>', got the part {part!r}") from None
    return EProp(**options)


# ------------------------------------------------------------ reading the model
def _readout_decay(graph: ETraceGraph, readout: int, what: str) -> float:
    """``κ``: 0 when the readout's output drives no hidden group, else the decay of the
    one-state group it drives, evaluated at the current states (it must be one number)."""
    groups = [g for r in graph.relations if r.eqn_index == readout for g in r.hidden_groups]
    if not groups:
        return 0.0
    group = graph.hidden_groups[groups[0]]
    advice = "pass EProp(kappa=...) with the readout's decay"
    if len(groups) > 1 or group.num_states != 1:
        raise ConfigError(f"algo='eprop': {what} drives {group.name}, not one leaky state; {advice}")
    try:
        low, high = readout_decay(graph, group)
    except jax.errors.ConcretizationTypeError:
        raise ConfigError(f"algo='eprop': cannot read the readout's decay while tracing; {advice}") from None
    if high - low > 1e-6 or not 0.0 <= low <= high < 1.0:
        raise ConfigError(f"algo='eprop': {what} drives {group.name}, whose decay is not one number in [0, 1) "
                          f"(from {low:g} to {high:g}): e-prop filters its eligibility traces with one κ; {advice}")
    return (low + high) / 2

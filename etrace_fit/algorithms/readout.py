"""The readout, and which hidden groups reach it unit by unit.

Two users: e-prop (``eprop.py``), whose learning signal is the readout's error, and the
trace rules' *readout memory* (docs/theory.md §5.10). A leaky readout
``r^t = κ r^{t−1} + u^t W + b`` keeps every earlier input ``u^s`` in its state, so a
weight ``θ`` of the layer it reads moves the loss at ``t`` through ``r^{t−1}`` as well,
a path a trace of the layer's own state misses. Because ``κ`` is one number, that path
needs only one more trace per unit: ``ē^t = κ ē^{t−1} + du^t/dθ``, with ``du^t/dθ``
read off the layer's own trace (``du^t/dθ = ∂u^t/∂h^{t−1} ε^{t−1} + ∂u^t/∂y^t x^t``),
and the history term gains ``κ ∂L^t/∂u^t|_readout · ē^{t−1}``. The plan carries that
trace as one extra state of the pair (``TracedPair.readout_memory``), so every rule
follows it unchanged: D-RTRL exactly, ES-D-RTRL through its factorisation.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _compat
from ..compiler import ETraceGraph, group_jacobian
from ..compiler._dataflow import is_boundary, is_elementwise
from ..ops import etp_op_info

__all__ = ["ReadoutMemory", "dense_readouts", "new_state_vars", "readout_memory", "reading_is_elementwise",
           "groups_reaching", "readout_decay", "is_affine"]


@dataclasses.dataclass(frozen=True)
class ReadoutMemory:
    """A leaky readout whose memory the traces follow (see the module docstring).

    Attributes:
        readout: the readout's equation index in the step's jaxpr (a dense ETP op).
        group: the index of the readout's own hidden group (one state per unit, decay ``κ``).
        reading: the hidden groups whose new states reach the readout's input unit by
            unit; their pairs carry the extra state.
        kappa: ``κ`` at the states the plan was made at (the step reads it again at
            every step from the readout's Jacobian); the mean of the units' with ``units``.
        units: 0 when ``κ`` is one number (one more trace state per unit read); else the
            readout's units, whose decays differ (a learned or per-unit ``τ``): one memory
            state per readout unit (docs/theory.md §5.10).
        kappa_range: the smallest and largest ``κ`` (the report's).
    """

    readout: int
    group: int
    reading: tuple[int, ...]
    kappa: float
    units: int = 0
    kappa_range: tuple[float, float] = (0.0, 0.0)

    @property
    def states(self) -> int:
        """The trace states each pair of a read group carries for the memory."""
        return self.units or 1


#: A readout whose units decay at different rates is followed with one memory state per
#: readout unit (the trace of each weight it reads grows by that many states) up to this
#: many units; beyond, the memory is not followed (an approximate gradient, warned).
MAX_MEMORY_UNITS = 32


def dense_readouts(graph: ETraceGraph) -> list[int]:
    """Equation indices of the dense ETP ops with a 2-D weight and a variable input."""
    found = []
    for index, eqn in enumerate(graph.module.jaxpr.eqns):
        op = etp_op_info(eqn.primitive)
        if op is None or op.kind != "dense" or op.x_index is None:
            continue
        weight = op.split_operands(list(eqn.invars))[1].get("weight")
        if weight is not None and len(weight.aval.shape) == 2 and not isinstance(eqn.invars[op.x_index],
                                                                                    _compat.Literal):
            found.append(index)
    return found


def readout_input(graph: ETraceGraph, readout: int) -> Any:
    """The readout's input variable ``u``."""
    eqn = graph.module.jaxpr.eqns[readout]
    return eqn.invars[etp_op_info(eqn.primitive).x_index]


def new_state_vars(graph: ETraceGraph, group: Any) -> list:
    """The jaxpr variables holding ``group``'s new states, in state order."""
    module = graph.module
    outvars = module.jaxpr.outvars
    offset = len(module.output_vars)
    return [outvars[offset + module.leaf_offsets[path]] for path in group.paths]


def _reach(graph: ETraceGraph, sources: list, relabel: bool = False) -> tuple[set, set]:
    """``(reached, mixed)``: the variables computed from ``sources`` without passing a
    trainable dense/conv op, and those among them that some path reaches through an
    op that mixes units (a reduction, a transpose, a reshape). With ``relabel`` a
    reshape that keeps the batch axis (``Flatten``) does not mix: it lays the units out
    anew in the same row-major order, so a reshape back to the group's shape finds
    each unit where it was (see :func:`_reads_in_order`)."""
    reached = {v for v in sources if not isinstance(v, _compat.Literal)}
    mixed: set = set()
    for eqn in graph.module.jaxpr.eqns:
        if is_boundary(eqn):
            continue
        inputs = [v for v in eqn.invars if not isinstance(v, _compat.Literal)]
        if any(v in reached for v in inputs):
            reached.update(eqn.outvars)
            in_order = relabel and _keeps_batch_order(eqn)
            if not (is_elementwise(eqn) or in_order) or any(v in mixed for v in inputs):
                mixed.update(eqn.outvars)
    return reached, mixed


def _keeps_batch_order(eqn: Any) -> bool:
    """A reshape of one operand (``Flatten``'s, a squeeze) whose leading (batch) axis
    keeps its length: sample by sample, the same numbers in the same row-major order."""
    if eqn.primitive.name not in ("reshape", "squeeze") or len(eqn.invars) != 1:
        return False
    before, after = eqn.invars[0].aval.shape, eqn.outvars[0].aval.shape
    return len(before) > 0 and len(after) > 0 and before[0] == after[0]


def _reads_in_order(group: Any, var: Any) -> bool:
    """Whether ``var`` (reached from ``group`` unit by unit, reshapes keeping the batch
    axis allowed) holds one number per unit of the group, in the group's row-major order:
    the same batch length and as many numbers per sample. The step program reads its
    derivatives and ``∂L/∂var`` in the group's layout by a reshape
    (``TracedPair.canonical_units``), which is then exact."""
    shape, unit_shape = tuple(var.aval.shape), tuple(group.shape)
    return (shape == unit_shape or (len(shape) > 0 and len(unit_shape) > 0 and shape[0] == unit_shape[0]
                                    and math.prod(shape) == math.prod(unit_shape)))


# Ops affine in an operand that varies with the step when the others are fixed: between
# the units and a readout (a pooling's window sums and count, a global average's slice,
# mean and stack, a transpose, a flatten, a constant added). Only the linear part reaches
# a derivative.
_TAIL_OPS = {"reshape", "squeeze", "expand_dims", "broadcast_in_dim", "transpose", "reduce_window_sum", "reduce_sum",
             "convert_element_type", "copy", "copy_p", "neg", "mul", "div", "add", "add_any", "sub", "pad", "slice",
             "concatenate", "stack"}


def _fixed_vars(graph: ETraceGraph) -> set:
    """The step's variables that no input or state but the weights moves: the weights,
    and what the step makes of them and of constants alone (not through a trainable
    dense or conv op): a learned ``τ``'s decay, a pooling's count."""
    module = graph.module
    fixed = {v for w in module.weights for v in w.in_vars}
    for eqn in module.jaxpr.eqns:
        operands = [v for v in eqn.invars if not isinstance(v, _compat.Literal)]
        if all(v in fixed for v in operands) and not is_boundary(eqn):
            fixed.update(eqn.outvars)
    return fixed


def linear_tail(graph: ETraceGraph, var: Any) -> tuple[Any, tuple[int, ...]]:
    """``(v, eqns)``: ``var`` as ``M v + c``, ``M`` a linear map and ``c`` a constant that
    the step's inputs and states do not move — the equations ``eqns`` (in order) each
    read one varying operand (the last's output) and fixed ones (literals, the weights,
    what is made of them): an average pooling's window sum and division, a transpose, a
    reshape. ``(var, ())`` when its own equation is no such op. The readout memory keeps
    one trace state per unit of ``v`` and meets it with ``Mᵀ ∂L/∂var``
    (:func:`tail_transpose`)."""
    module = graph.module
    fixed = _fixed_vars(graph)
    producer = {out: index for index, eqn in enumerate(module.jaxpr.eqns) for out in eqn.outvars}
    eqns = module.jaxpr.eqns
    chain = []
    while var in producer:
        eqn = eqns[producer[var]]
        if eqn.primitive.name not in _TAIL_OPS or len(eqn.outvars) != 1 or var in fixed:
            break
        varying = [n for n, v in enumerate(eqn.invars) if not isinstance(v, _compat.Literal) and v not in fixed]
        if len(varying) != 1 or (eqn.primitive.name == "div" and varying != [0]):
            break
        chain.append(producer[var])
        var = eqn.invars[varying[0]]
    return var, tuple(reversed(chain))


def tail_transpose(graph: ETraceGraph, eqns: tuple[int, ...], consts: list, args: list, v: Any,
                   cotangent: jax.Array) -> jax.Array:
    """``Mᵀ cotangent`` for the tail ``eqns`` of :func:`linear_tail` (``M`` maps ``v`` to
    their last output), the step's fixed operands evaluated from ``args`` (inputs and
    state leaves): a pull-back through those equations alone."""
    jaxpr = graph.module.jaxpr
    source, last = jaxpr.eqns[eqns[0]], jaxpr.eqns[eqns[-1]].outvars[0]
    position = [n for n, var in enumerate(source.invars) if var is v][0]

    def tail(value):
        found = {}

        def override(index, eqn, invals):
            if index != eqns[0]:
                return None
            invals = list(invals)
            invals[position] = value
            return _compat.eval_equation(eqn, invals)

        def on_write(var, out):
            if var is last:
                found["u"] = out
            return out

        # only what ``last`` depends on is evaluated; XLA drops what leads to v alone
        _compat.interpret(jaxpr, consts, args, override=override, on_write=on_write, wanted=[last])
        return found["u"]

    return jax.vjp(tail, jnp.zeros(v.aval.shape, cotangent.dtype))[1](cotangent)[0]


def groups_reaching(graph: ETraceGraph, var: Any) -> list[int]:
    """The hidden groups whose new states reach ``var`` without crossing a dense or conv op."""
    return [g.index for g in graph.hidden_groups if var in _reach(graph, new_state_vars(graph, g))[0]]


def reading_is_elementwise(graph: ETraceGraph, group: Any, var: Any) -> bool:
    """Whether ``var`` depends on ``group``'s new states through per-unit ops only."""
    reached, mixed = _reach(graph, new_state_vars(graph, group))
    return var in reached and var not in mixed


def _previous_and_driving(graph: ETraceGraph, group: Any) -> tuple[list, list]:
    """``group``'s previous-state variables and the outputs of the relations that drive it."""
    state_of = {s.path: s for s in graph.module.hidden}
    previous = [state_of[path].in_vars[0] for path in group.paths]
    eqns = graph.module.jaxpr.eqns
    driving = [eqns[r.eqn_index].outvars[0] for r in graph.relations if group.index in r.hidden_groups]
    return previous, driving


def step_vars(graph: ETraceGraph, group: Any) -> list:
    """What a step of ``group`` is made of: its previous and new states and the outputs
    of the relations that drive it."""
    previous, driving = _previous_and_driving(graph, group)
    return previous + new_state_vars(graph, group) + driving


# ops linear in every operand that depends on the step (the rest are constants)
_LINEAR = {"add", "add_any", "sub", "neg", "convert_element_type", "copy", "copy_p", "reshape",
           "broadcast_in_dim", "squeeze", "expand_dims", "transpose"}


def is_affine(graph: ETraceGraph, group: Any) -> bool:
    """Whether ``group``'s new states are affine in its previous states and the outputs
    of the relations that drive it, with coefficients that no state or input moves:
    ``h^t = κ h^{t−1} + c y^t + b`` (``κ`` may be an elementwise relation's output that
    only a weight moves: a learned ``τ``). A reset, a spike or a gate
    (``LeakySpikeReadout``) is not: its decay depends on the state, and no ``ē`` could
    follow it."""
    module = graph.module
    previous, driving = _previous_and_driving(graph, group)
    # a relation's output that only the weights move (a learned τ's decay) is a coefficient
    fixed = _fixed_vars(graph)
    driving = [v for v in driving if v not in fixed]
    reached = set(previous) | set(driving)
    varying = set(module.input_vars) | {s.in_vars[0] for s in module.hidden} | reached
    nonlinear: set = set()
    for eqn in module.jaxpr.eqns:
        inputs = [v for v in eqn.invars if not isinstance(v, _compat.Literal)]
        if not any(v in reached for v in inputs):
            if any(v in varying for v in inputs):
                varying.update(eqn.outvars)
            continue
        on = [not isinstance(v, _compat.Literal) and v in reached for v in eqn.invars]
        fixed = [isinstance(v, _compat.Literal) or v not in varying for v in eqn.invars]
        name = eqn.primitive.name
        linear = (name in _LINEAR
                  or (name == "mul" and sum(on) == 1 and all(f for o, f in zip(on, fixed) if not o))
                  or (name == "div" and on == [True, False] and fixed[1]))
        if not linear or any(v in nonlinear for v in inputs):
            nonlinear.update(eqn.outvars)
        reached.update(eqn.outvars)
        varying.update(eqn.outvars)
    news = new_state_vars(graph, group)
    return all(v in reached and v not in nonlinear for v in news)


def reads_unit_by_unit(graph: ETraceGraph, group: Any, var: Any) -> bool:
    """Whether ``var`` depends on ``group``'s step (previous states, new states, the
    relations' outputs) only through per-unit ops and reshapes that keep the batch axis
    (a ``Flatten`` before the readout), and holds one number per unit in the group's
    order (:func:`_reads_in_order`)."""
    reached, mixed = _reach(graph, step_vars(graph, group), relabel=True)
    return var in reached and var not in mixed and _reads_in_order(group, var)


def readout_decay(graph: ETraceGraph, group: Any) -> tuple[float, float]:
    """The smallest and largest entry of ``group``'s Jacobian at the graph's current
    states (``ConcretizationTypeError`` while tracing)."""
    module = graph.module
    inputs = [np.zeros(v.aval.shape, v.aval.dtype) for v in module.input_vars]  # concrete in any trace

    def extremes(leaves, inputs):
        D = group_jacobian(module, group, leaves, inputs)
        return jnp.min(D), jnp.max(D)

    leaves = module.state_leaves()
    if any(_compat.is_tracer(leaf) for leaf in jax.tree.leaves(leaves)):
        with jax.ensure_compile_time_eval():  # raises ConcretizationTypeError for traced states
            low, high = extremes(leaves, inputs)
        return float(low), float(high)
    # One compiled program, called as such (also inside a caller's trace): evaluated op
    # by op, the Jacobian compiled ~100 tiny programs (1.3 s of the demo's start).
    low, high = jax.jit(extremes).lower(leaves, inputs).compile()(leaves, inputs)
    return float(low), float(high)


def readout_memory(graph: ETraceGraph) -> ReadoutMemory | None:
    """The step's leaky readout and the groups that read into it, or ``None`` when there
    is no memory to follow: the last dense ETP op drives no hidden group (a ``Linear``
    readout), drives more than one or one with several states, its step is not affine
    (a spiking readout's reset), a decay is not in ``(0, 1]`` (1: a readout that only
    sums its input), the decays differ per unit (a learned or per-unit ``τ``) over more
    than :data:`MAX_MEMORY_UNITS` units, or no group reaches its input unit by unit."""
    readouts = dense_readouts(graph)
    if not readouts:
        return None
    readout = readouts[-1]
    driven = {g for r in graph.relations if r.eqn_index == readout for g in r.hidden_groups}
    if len(driven) != 1:
        return None
    group = graph.hidden_groups[driven.pop()]
    learned_decay = any(r.op_kind == "elementwise" and group.index in r.hidden_groups for r in graph.relations)
    if group.num_states != 1 or not group.elementwise or not is_affine(graph, group):
        return None
    try:
        low, high = readout_decay(graph, group)
    except jax.errors.ConcretizationTypeError:
        return None
    if not 0.0 < low <= high <= 1.0:
        return None
    units = math.prod(group.shape[1:])
    # a learned τ may start uniform; it will not stay so
    per_unit = learned_decay or high - low > 1e-6
    if per_unit and units > MAX_MEMORY_UNITS:
        return None
    v, _ = linear_tail(graph, readout_input(graph, readout))  # u = M v: the memory is kept per unit of v
    reading = tuple(g.index for g in graph.hidden_groups
                    if g.index != group.index and g.elementwise and reads_unit_by_unit(graph, g, v))
    if not reading:
        return None
    return ReadoutMemory(readout=readout, group=group.index, reading=reading, kappa=(low + high) / 2,
                         units=units if per_unit else 0, kappa_range=(low, high))

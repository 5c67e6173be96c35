"""The online program (docs/theory.md §5.6–5.9): the step's signals, chunked, fed to the rules.

At every step (§5.8) the *step program* runs the step forward as a function of the
weights and the previous hidden values ``h^{t-1}``; one pull-back of the step loss gives
every weight's exact one-step gradient and the learning signal ``∂L^t/∂h^{t-1}``, and one
linearisation of the group transitions gives ``D`` and ``Df``. None of this needs the
traces, so the program runs the step over a *chunk* of ``C`` steps first, stacks each
traced pair's canonical signals ``(C, B, ...)`` and only then hands them to the pair's
rule, which reads and writes its traces once per chunk (§5.9) and does its
weight-gradient GEMMs over ``C·B`` rows; signals that are the same at every step are
handed to such a rule once (``base.Fixed``), not stacked. A rule whose traces are
cheap to advance runs in the step loop instead (ES-D-RTRL: ``step_rows`` there,
``finish_rows`` once per chunk). Steps a caller marks inactive (their loss weight is zero) skip the pull-back;
the traces still advance. Read ``sequence.py`` for the public entry point and
``d_rtrl.py`` for a rule.
"""

from __future__ import annotations

import dataclasses
import os
import platform
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from .. import _compat
from ..compiler import ETraceGraph, group_jacobian
from ..compiler._dataflow import cut_step
from ..errors import CompilationError
from ..ops import etp_op_info
from ..ops.dense import matmul_of_parts, weight_rows
from .base import Derivation, Derived, Fixed, PairSignals, Rule, TracedPair, gram, joined_states, scalar_loss
from .readout import linear_tail, new_state_vars, readout_memory, tail_transpose

__all__ = ["Collected", "OnlineProgram", "StepProgram", "TraceState", "build_online", "chunk_size", "run_rule_chunk"]

#: Steps per chunk when the caller does not choose and the chunk's buffers are small
#: (the trace is read and written once per chunk; the chunk's signals are kept
#: meanwhile). Sequence lengths that are multiples of 100 steps (100 ms at dt = 1 ms)
#: share it, and so the same memory.
DEFAULT_CHUNK = 100
# The chunk is the longer of two (chunk_size): up to DEFAULT_CHUNK steps whose buffers
# take at most _CHUNK_BUFFER_BYTES (or the traces' size, if larger), and up to
# _BASE_CHUNK steps within _BASE_BUFFER_BYTES (or the traces' size). Fewer, longer
# chunks pay the per-chunk work (the trace's passes, the loop's start, GEMMs with a
# short inner dimension) less often; measured 2026-11-25 (2 cores), chunks of 100 or 50
# against 25: GRU H = 128, B = 16, T = 200, D-RTRL 1.12 → 0.92× BPTT, ES-D-RTRL 0.85 →
# 0.73×; RLIF 1.31 → 1.06× and 0.85 → 0.75×; H = 512, B = 64, D-RTRL 1.93 → 1.55×
# (chunks of 50). The buffers' budget was 16 MiB until 2026-11-26, when 32 MiB measured
# better (D-RTRL, chunk sizes alternated in one process, wall time against BPTT's): the
# demo's ALIF (three trace states, 0.5 MB of signals per step by chunk_size's estimate,
# B = 32, loss at the last step) in chunks of 38 against 19, 1.09 → 0.95× a batch; the
# LIF net at B = 64, T = 200, in chunks of 100 against 50, 1.28 → 1.11×. Larger buffers
# lost: the LIF net at B = 64 in chunks of 200 (36 MB) 1.55×, the demo in chunks of 114
# (59 MB) 1.22×; and at T = 2000 chunks of 200 were no faster than chunks of 100 (GRU
# 0.73 / 0.73×, RLIF 0.77 / 0.76×) for 1.7× the temp memory. (A sequence that fits one
# chunk runs faster than any split of it, its trace never read, being zero: not a reason
# for longer chunks.) Large batches, whose budget would hold a few steps only, keep the
# chunks of 32 steps within 64 MiB. The 32 MiB are for rules that pass over their trace
# once per chunk (a ``chunk`` method: D-RTRL, e-prop); ES-D-RTRL's work per chunk is one
# GEMM over the rows it kept, measured within noise from 25 to 200 steps (GRU 0.70–0.76×
# BPTT), so a program of such rules only keeps _ROWS_BUFFER_BYTES and its memory (the
# GRU at B = 64, T = 50: 11.1 MiB of temp in chunks of 25, 21.5 in one of 50, when the
# chunk stacked X, the history and δy; 14.0 MiB in one of 50 with ε_x and one signal row,
# 2026-11-26, since the budget counts those rows, ESDRTRL.row_bytes).
_CHUNK_BUFFER_BYTES = 32 * 1024**2
_ROWS_BUFFER_BYTES = 16 * 1024**2
_BASE_CHUNK, _BASE_BUFFER_BYTES = 32, 64 * 1024**2


class Collected(NamedTuple):
    """What a run also returns with ``collect``: the model's ``outputs`` at every
    step (its output pytree, each leaf with a leading time axis) and each traced pair's
    final ``trace_norms`` per sample (``(B,)`` in ``pairs`` order; none for BPTT): of
    the traces after the sequence's last step, or with ``active="last"`` of those the
    last step's loss reads (before that step's input enters them)."""

    outputs: Any
    trace_norms: list


class TraceState(NamedTuple):
    """The online rules' state between calls (streaming): each pair's ``traces`` and the
    steps ``t`` seen since the last reset (a ``()`` int32)."""

    traces: list
    t: Any


@dataclasses.dataclass(frozen=True)
class OnlineProgram:
    """A pure function over one sequence and what it needs to map results back.

    ``run(weight_leaves, state_leaves, xs_leaves, targets, collect=False, active=None)
    -> (weight grads, losses, final state leaves[, Collected])``: ``weight_leaves`` in
    ``module.weights`` leaf order, ``state_leaves`` all states' leaves (the weights'
    among them are ignored), ``xs`` time-major; ``active`` an optional ``(T,)`` bool:
    ``False`` where the step's loss is known to be zero, or ``"last"``: only the last
    step has a loss. A step marked so has its loss and its gradient parts taken as
    zero: a chunk with no step of loss (with ``"last"``, every step but the last) skips
    the pull-back and does not evaluate the loss (XLA then drops what only the loss
    reads: a stateless readout when no outputs are collected); in a chunk with some,
    the marked steps' pull-back runs and a select keeps their parts at zero (no branch
    per step).
    ``collect``: ``True`` for the outputs of every step; ``"final"`` for those of the
    last step only (with ``active="last"``: the other steps do not evaluate what only
    the outputs read; otherwise it is ``True``) — ``Collected.outputs`` then has a
    leading axis of 1, or of ``T`` when ``T`` = 1. ``traces``: a
    :class:`TraceState` to start from (``init_traces(batch)`` or one a previous call
    returned) instead of zero traces at ``t = 0``; the call then returns
    the final :class:`TraceState` as its last element (streaming: a long sequence in
    consecutive calls). ``pairs`` names what the trace norms belong to;
    ``chunk_for(T, active=None)`` is the steps per chunk of a sequence of length ``T``
    (with ``active="last"``, of its steps before the last, which runs alone).
    """

    run: Callable[..., Any]
    run_with_updates: Callable[..., Any] | None = None
    pairs: tuple = ()
    chunk_for: Callable[..., int] = lambda length, active=None: 1
    init_traces: Callable[[int], TraceState] = lambda batch: TraceState([], jnp.zeros((), jnp.int32))


# ------------------------------------------------------------------ the step program
@dataclasses.dataclass(frozen=True)
class StepProgram:
    """One step of the model extended with everything the rules need.

    ``signals(weights, others, inputs, target, active) -> (loss, outputs, new others,
    one-step weight grads, [PairSignals per pair], [(x, δy) per deferred op])``:
    ``weights`` the weight leaves, ``others`` the non-weight state leaves (module order
    without the weights), the signals in the canonical form of ``base.py``. With
    ``active`` statically false the pull-back is skipped: weight grads, ``G`` and ``dY``
    are zero and the deferred list is ``None``; with a traced ``active`` the pull-back
    runs and a select zeroes the loss and its parts where it is false.

    ``prepare(weights)`` is what the steps read off fixed weights (the row blocks of a
    gate's weight, for the pull-back of ``[x, h]``'s ``h`` columns alone); a caller that
    runs many steps with the same weights computes it once, outside its loop, and
    passes it as ``signals(..., prepared=)``. ``products(weights, input_leaves)`` is the
    output of each dense op that reads the inputs alone over a chunk of steps (leading
    axis the steps'), one GEMM each; the step at ``t`` reads its row as
    ``signals(..., pre=)`` instead of computing the product; ``on_inputs`` are those ops'
    indices in the step's equations.

    ``deferred`` are the dense and conv ETP ops no pair traces (GRU's ``W_r``, a
    readout): the pull-back stops at their weights and returns ``δy = ∂L^t/∂y`` and
    their input ``x`` instead of a per-step weight gradient, so the caller turns a
    whole chunk of them into one GEMM over ``C·B`` rows (:func:`deferred_gradients`).
    """

    graph: ETraceGraph
    pairs: tuple[TracedPair, ...]
    signals: Callable[..., Any]
    other_positions: tuple[int, ...]
    weight_positions: tuple[int, ...]
    deferred: tuple[int, ...] = ()
    prepare: Callable[[Any], Any] = lambda weights: {}
    products: Callable[[Any, Any], Any] = lambda weights, input_leaves: {}
    on_inputs: tuple[int, ...] = ()

    def assemble(self, weights, others) -> list:
        """All state leaves in module order from the weight and the other leaves."""
        return _assemble(self.weight_positions, self.other_positions, weights, others)

    def others(self, state_leaves) -> list:
        return [state_leaves[p] for p in self.other_positions]


def build_step_program(graph: ETraceGraph, pairs: tuple[TracedPair, ...], step_loss: Callable,
                       trace_dtype: Any, feedback: Any = None, readout: Any = None) -> StepProgram:
    """The :class:`StepProgram` of ``graph`` for ``pairs``; with ``feedback`` (e-prop's,
    ``eprop.Feedback``) the pairs into the group the readout reads get e-prop's signals
    instead (``G`` the readout's error fed back per unit, ``psi`` = ∂z^t/∂h^t). With
    ``readout`` (``readout.ReadoutMemory``) the pairs marked ``readout_memory`` get one
    more state per unit, the readout memory ``ē`` (docs/theory.md §5.10)."""
    module = graph.module
    # The signals (a decay D = exp(-dt/τ) among them) stay at float32 or more: in bfloat16 every
    # τ above ~512 steps became no decay at all and τ = 500 one of 256. Only the traces are stored
    # in trace_dtype.
    signal_dtype = jnp.promote_types(trace_dtype, jnp.float32)
    jaxpr, consts = module.closed_jaxpr.jaxpr, list(module.closed_jaxpr.consts)
    num_outputs = len(module.output_vars)
    weight_positions = tuple(module.weight_leaf_positions)
    num_leaves = len(module.state_leaves())
    other_positions = tuple(p for p in range(num_leaves) if p not in set(weight_positions))
    hidden = module.hidden
    eqns = module.jaxpr.eqns
    pair_eqns = [eqns[p.relation.eqn_index] for p in pairs]

    # What to read off the forward pass for each pair: the op's x and y.
    capture = {}
    for eqn in pair_eqns:
        capture[eqn.outvars[0]] = True
        if eqn.primitive.name != "etp_elemwise":
            capture[eqn.invars[0]] = True
    hidden_positions = [module.leaf_offsets[state.path] for state in hidden]
    # e-prop: the readout's input x (perturbed for the learning signal ∂L^t/∂x, with the
    # readout's transpose swapped for B under random feedback) and the read group's new
    # states (replaced, to differentiate x with respect to them: ψ).
    readout_x = read_vars = read_group = None
    eprop_pairs: set = set()
    if feedback is not None:
        readout_eqn = eqns[feedback.readout]
        readout_x_index = etp_op_info(readout_eqn.primitive).x_index
        readout_x = readout_eqn.invars[readout_x_index]
        read_group = graph.hidden_groups[feedback.group]
        read_vars = {var: s for s, var in enumerate(new_state_vars(graph, read_group))}
        eprop_pairs = {p.index for p in pairs if p.group.index == feedback.group}
    # Readout memory: the readout op's own input u perturbed (∂L^t/∂u^t through the
    # readout only, not through a loss term that also reads u), and u's derivatives
    # with respect to h^{t-1} and the relations' y from the same linearisation as D.
    if readout is None and any(p.readout_memory for p in pairs):
        readout = readout_memory(graph)
    memory_pairs = {p.index for p in pairs if p.readout_memory}
    memory_v, memory_tail = None, ()
    if memory_pairs:
        readout_eqn = eqns[readout.readout]
        readout_x_index = etp_op_info(readout_eqn.primitive).x_index
        readout_x = readout_eqn.invars[readout_x_index]
        # u = M v (a pooling, a transpose before the readout; readout.linear_tail): the
        # memory is kept per unit of v, met by Mᵀ ∂L/∂u.
        memory_v, memory_tail = linear_tail(graph, readout_x)
        if readout.units:  # a memory state per readout unit: its signal needs the readout's operands
            for var in readout_eqn.invars:
                if not isinstance(var, _compat.Literal):
                    capture[var] = True
    # where the memory reads its units: (equation, operand) of v (u: the readout's input)
    memory_at = ((memory_tail[0], [n for n, v in enumerate(eqns[memory_tail[0]].invars) if v is memory_v][0])
                 if memory_tail else (readout.readout, readout_x_index) if memory_pairs else None)
    # Dense and conv relations: their one-step gradient X^T δy is left to the rule (one
    # GEMM with the history part), so the pull-back stops at their trainable operands
    # and returns δy = ∂L^t/∂y instead. Dense and conv ops no pair traces (deferred)
    # likewise: the chunk does their X^T δy in one GEMM. Elementwise parameters keep the
    # weight pull-back.
    related = {p.relation.eqn_index for p in pairs}
    deferred = tuple(i for i, eqn in enumerate(eqns) if i not in related and _deferrable(eqn))
    for i in deferred:
        capture[eqns[i].invars[etp_op_info(eqns[i].primitive).x_index]] = True
    fused = list(dict.fromkeys(p.relation.eqn_index for p in pairs if p.kind != "elementwise"))
    fused += list(deferred)
    fused_positions = {i: etp_op_info(eqns[i].primitive).trainable_positions(len(eqns[i].invars)).values()
                       for i in fused}
    y_avals = [eqns[i].outvars[0].aval for i in fused]
    # Dense ops on a concatenation ([x, h] of a gate): the pull-back computes the
    # cotangent of the parts that need one only (ops.matmul_of_parts), not every column.
    # Dense ops on one value the step computes (a readout on h): one part, for the
    # prepared transpose below. Model inputs need no cotangent.
    input_of_var = {var: n for n, var in enumerate(jaxpr.invars[:len(module.input_vars)])}
    split_of = _dense_inputs(eqns, exclude={readout_x, *input_of_var})
    split_concats = {concat for concat in split_of.values() if concat is not None}
    weight_of_var = {var: n for n, var in enumerate(jaxpr.invars[len(module.input_vars):])
                     if n in set(weight_positions)}
    # Fused dense ops that read a model input and weights alone: their output does not
    # depend on the step's states, so a chunk computes it for all its steps in one GEMM.
    on_inputs = tuple(i for i in fused if eqns[i].primitive.name == "etp_mm"
                      and not isinstance(eqns[i].invars[0], _compat.Literal) and eqns[i].invars[0] in input_of_var
                      and all(not isinstance(v, _compat.Literal) and v in weight_of_var for v in eqns[i].invars[1:]))

    def assemble(weights, others):
        return _assemble(weight_positions, other_positions, weights, others)

    def prepare(weights) -> dict:
        """What the step reads off the weights that stay fixed over the sequence (or the
        window between updates): the row blocks of each split dense op's weight (a
        single block for an op on one value), transposed and laid out contiguously, so
        the pull-back's ``δy @ W[rows]ᵀ`` is a product with a row-major operand
        (ops.matmul_of_parts' ``rows_t``; XLA on CPU ran ``(16, 128) @ W[rows]ᵀ`` with
        the transpose folded into the product at 9.5 µs a step against 6.4; the
        optimization barrier keeps it from folding the transpose back). Measured
        2026-11-26, H = 128, B = 16, T = 200, loss at every step, alternated in one
        process: ES-D-RTRL on the GRU 0.633 → 0.608× BPTT, on the RLIF net 0.763 →
        0.712×; D-RTRL on the RLIF net 1.051 → 1.009×, on the GRU within noise. The
        readout's ``(H, 10)`` weight too (2026-11-26, a seventh session, both orders):
        ES-D-RTRL on the feed-forward LIF net 0.626 / 0.593 → 0.568 / 0.586×, on the
        RLIF net 0.573 / 0.618 → 0.544 / 0.604×, on the GRU 0.634 / 0.598 → 0.614 /
        0.589×. A caller computes it once outside its loops and passes it to every
        step."""
        leaves = assemble(weights, [None] * len(other_positions))
        prepared = {}
        for index, concat in split_of.items():
            eqn = eqns[index]
            weight_var = eqn.invars[1]
            if isinstance(weight_var, _compat.Literal) or weight_var not in weight_of_var:
                continue  # the weight is computed in the step: slice it there
            sizes = [v.aval.shape[-1] for v in (eqns[concat].invars if concat is not None else eqn.invars[:1])]
            blocks = weight_rows(leaves[weight_of_var[weight_var]], sizes, eqn.params.get("weight_fn"))
            prepared[index] = [lax.optimization_barrier(block.T) for block in blocks]
        return prepared

    def products(weights, input_leaves):
        """``{op index: output}`` of the ops on inputs alone (``on_inputs``: a first layer's
        ``x W + b``) over a chunk of inputs (leading axis the steps'): one GEMM over the
        chunk's ``C·B`` rows each, which the steps read (``signals(..., pre=)``) instead of
        a thin ``(B, I)(I, O)`` product each. Measured 2026-11-26 (a seventh session),
        alternated in one process in both orders, ratios to BPTT: H = 128, B = 16,
        T = 200, feed-forward LIF net, loss at every step, medians of five runs ES-D-RTRL
        0.629 → 0.577, D-RTRL 0.895 → 0.742; loss at the last step ES-D-RTRL 0.282 / 0.279
        → 0.223 / 0.241, D-RTRL 0.496 / 0.475 → 0.402 / 0.447; the demo's step (hybrid,
        B = 32, T = 230) 0.841 / 0.858 → 0.796 / 0.806× BPTT's batch. BPTT's ``jax.grad``
        over ``lax.scan`` keeps the product in its loop. The input rows of a concatenation
        (a GRU's ``[x, h]``) measured slower done so (ES-D-RTRL on the GRU 0.579 → 0.596×,
        D-RTRL 0.806 → 0.919×; docs/performance-log.md, a fourteenth session): at B = 16
        a step's thin product costs about as much over 128 rows as over 192."""
        leaves = assemble(weights, [None] * len(other_positions))
        found = {}
        for index in on_inputs:
            eqn = eqns[index]
            rest = [leaves[weight_of_var[v]] for v in eqn.invars[1:]]
            x = input_leaves[input_of_var[eqn.invars[0]]]
            found[index] = jax.vmap(lambda x_t: _compat.eval_equation(eqn, [x_t, *rest])[0])(x)
        return found

    def forward(weights, hidden_prev, y_perturbations, others, input_leaves, target, x_perturbation=None,
                prepared=None, with_loss=True, pre=None):
        """One step as a function of the weights, the previous hidden values and a
        perturbation of each fused relation's output (and, for e-prop, of the
        readout's input)."""
        prepared, pre = prepared or {}, pre or {}
        leaves = assemble(weights, others)
        for position, value in zip(hidden_positions, hidden_prev):
            leaves[position] = value
        perturbation_of = dict(zip(fused, y_perturbations))
        captured, parts_of = {}, {}

        def override(index, eqn, invals):
            if index in split_concats:
                parts_of[index] = list(invals)
                return None
            random_feedback = feedback is not None and feedback.matrix is not None and index == feedback.readout
            memory_input = memory_pairs and x_perturbation is not None and index == readout.readout
            if index in pre:
                return [pre[index] + perturbation_of[index] if index in perturbation_of else pre[index]]
            own = index in split_of and (split_of[index] is not None or index in prepared)
            if index not in perturbation_of and not random_feedback and not memory_input and not own:
                return None
            invals = list(invals)
            if memory_input:
                invals[readout_x_index] = invals[readout_x_index] + x_perturbation
            for position in fused_positions.get(index, ()):
                invals[position] = lax.stop_gradient(invals[position])
            if own and not memory_input and not random_feedback:
                x, weight, *bias = invals
                parts = parts_of[split_of[index]] if split_of[index] is not None else [x]
                out = matmul_of_parts(eqn.primitive, x, parts, weight, *bias,
                                      weight_fn=eqn.params.get("weight_fn"), rows_t=prepared.get(index))
            elif not random_feedback:
                out = _compat.eval_equation(eqn, invals)[0]
            if random_feedback:  # the forward value as is; x's cotangent through B instead of Wᵀ
                x = invals[readout_x_index]
                invals[readout_x_index] = lax.stop_gradient(x)
                out = _compat.eval_equation(eqn, invals)[0] + (x - lax.stop_gradient(x)) @ feedback.matrix
            return [out + perturbation_of[index] if index in perturbation_of else out]

        def on_write(var, value):
            if x_perturbation is not None and feedback is not None and var is readout_x:
                value = value + x_perturbation
            if var in capture:
                captured[var] = value
            return value

        outs = _compat.interpret(jaxpr, consts, [*input_leaves, *leaves], override=override, on_write=on_write)
        outputs = jax.tree.unflatten(module.output_treedef, outs[:num_outputs])
        if with_loss:
            loss = scalar_loss(step_loss, outputs, target)
        else:  # known to be zero (active): not evaluated
            shape = jax.eval_shape(lambda o: scalar_loss(step_loss, o, target), outputs)
            loss = jnp.zeros(shape.shape, shape.dtype)
        new_others = [outs[num_outputs + p] for p in other_positions]
        return loss, (new_others, [captured[var] for var in capture], outputs)

    # D and Df from one linearisation of all groups' transitions at once: the step with
    # every related op's output y an input and other trainable ops held constant.
    groups = [g for g in graph.hidden_groups if any(p.group.index == g.index for p in pairs)
              or (memory_pairs and g.index == readout.group)]
    relation_eqns = list(dict.fromkeys(p.relation.eqn_index for p in pairs))
    state_position = module.leaf_offsets

    def transition_derivatives(leaves, input_leaves, captured):
        """``D`` per group, ``Df`` per pair and, with a readout memory, the derivatives
        of the readout's input ``u`` per group state and per relation (same pass), all
        split per state (``D[s][r]``, ``Df[s]``: arrays of the group's shape): arrays
        with a trailing state axis are several times slower to write on CPU."""
        h_prev = [[leaves[state_position[path]] for path in g.paths] for g in groups]
        ys = [captured[eqns[i].outvars[0]] for i in relation_eqns]

        def transitions(h_groups, ys_, reading):
            """The new states of the groups ``reading`` (positions; the others ``None``)
            and, with a readout memory, the readout's input: only the equations these
            read are traced (``cut_step``'s ``outputs``)."""
            step_leaves = list(leaves)
            for group, hs in zip(groups, h_groups):
                for path, h in zip(group.paths, hs):
                    step_leaves[state_position[path]] = h
            inputs_of = {memory_at[0]: None} if memory_pairs else None
            positions = {n: [num_outputs + state_position[path] for path in g.paths] for n, g in enumerate(groups)
                         if n in reading}
            outs = cut_step(module, step_leaves, input_leaves, replace=dict(zip(relation_eqns, ys_)),
                            inputs_of=inputs_of, outputs=[p for n in sorted(positions) for p in positions[n]])
            new = [[outs[p] for p in positions[n]] if n in positions else None for n in range(len(groups))]
            return new + ([inputs_of[memory_at[0]][memory_at[1]]] if memory_pairs else [])

        # One forward-mode pass per direction (a ones tangent on one state of one
        # elementwise group, or on one relation's output), the other inputs closed over:
        # JAX then carries tangents only along what the perturbed input reaches. A
        # vmapped pass over stacked one-hot tangents made XLA fold those into constant
        # arrays (directions × B × units) that every derivative's kernel read from
        # memory at every step (ES-D-RTRL on the demo's model: 20–21 → 17.5 ms a batch).
        # Each pass evaluates only the transitions whose derivatives are read (its own
        # group's; a relation's: the groups of its pairs), not the whole step again.
        directions = [("h", n, s) for n, g in enumerate(groups) if g.elementwise for s in range(g.num_states)]
        directions += [("y", m, None) for m in range(len(ys))]
        # driven[m]: (pair, group position) of every pair relation m's output drives
        driven = [[(pair, groups.index(pair.group)) for pair in pairs if pair.relation.eqn_index == eqn_index]
                  for eqn_index in relation_eqns]

        def column(kind, i, s):
            reading = {n for _, n in driven[i]} if kind == "y" else {i}

            def perturbed(value):
                if kind == "y":
                    return transitions(h_prev, [value if m == i else y for m, y in enumerate(ys)], reading)
                return transitions([[value if (n, q) == (i, s) else h for q, h in enumerate(hs)]
                                    for n, hs in enumerate(h_prev)], ys, reading)

            value = ys[i] if kind == "y" else h_prev[i][s]
            return jax.jvp(perturbed, (value,), (jnp.ones_like(value),))[1]

        # columns[d][n][s]: the tangent of group n's state s in direction d (n =
        # len(groups): the readout's input).
        columns = {d: column(*d) for d in directions}
        jacobians, memory = {}, {}
        if memory_pairs:  # ∂u/∂h^{t-1} per state of each group read, ∂u/∂y per relation
            for n, group in enumerate(groups):
                if group.index in readout.reading:
                    memory[group.index] = [columns[("h", n, s)][len(groups)] for s in range(group.num_states)]
            for m, eqn_index in enumerate(relation_eqns):
                memory[("y", eqn_index)] = columns[("y", m, None)][len(groups)]
        for n, group in enumerate(groups):
            states = range(group.num_states)
            if not group.elementwise:  # units mix: the exact per-unit blocks, at a cost
                full = group_jacobian(module, group, leaves, input_leaves)
                jacobians[group.index] = [[full[..., s, r] for r in states] for s in states]
                continue
            jacobians[group.index] = [[columns[("h", n, r)][n][s] for r in states] for s in states]
        sensitivities = {}
        for m, pairs_driven in enumerate(driven):
            for pair, n in pairs_driven:
                sensitivities[pair.index] = [columns[("y", m, None)][n][s] for s in range(pair.group.num_states)]
        return jacobians, sensitivities, memory

    def readout_sensitivity(leaves, input_leaves, h_new):
        """ψ = ∂x/∂h^t per unit ``(B, ..., S)``: the readout's input ``x`` as a function of
        the read group's new states, one forward-mode pass per state (the other states
        closed over, as in ``transition_derivatives``)."""
        states = [h_new[..., s] for s in range(h_new.shape[-1])]

        def readout_input(state, value):
            found = {}

            def on_write(var, value_):
                if var in read_vars:
                    s = read_vars[var]
                    value_ = (value if s == state else states[s]).astype(value_.dtype)
                if var is readout_x:
                    found["x"] = value_
                return value_

            _compat.interpret(jaxpr, consts, [*input_leaves, *leaves], on_write=on_write)
            return found["x"]

        return jnp.stack([jax.jvp(lambda v: readout_input(s, v), (h,), (jnp.ones_like(h),))[1]
                          for s, h in enumerate(states)], axis=-1)

    def readout_memory_signals(x_signal, kappa, captured, output_grad_of, args):
        """The readout memory's signals and decays at this step: ``[Mᵀ ∂L/∂u]`` and
        ``[κ (B,)]`` for a readout of one decay; with one memory state per readout unit
        ``o``, ``[Mᵀ (W[:, o] ∂L/∂y_o)]`` and ``[κ_o]`` (``y`` the readout op's output,
        which drives the readout: ``∂L/∂y = ∂L/∂r``). ``x_signal`` None: no signal
        (a step without loss)."""
        if not readout.units:
            kappas = [kappa[:, 0]]
            if x_signal is None or not memory_tail:
                return [x_signal], kappas
            return [tail_transpose(graph, memory_tail, consts, args, memory_v, x_signal)], kappas
        kappas = [kappa[:, o] for o in range(readout.units)]
        if x_signal is None:
            return [None] * readout.units, kappas
        if readout.readout not in output_grad_of:
            raise CompilationError("the readout memory per readout unit needs the readout op's output cotangent; "
                                   "its weight is not traced")
        invals = [v.val if isinstance(v, _compat.Literal) else captured[v] for v in readout_eqn.invars]

        def drive(x):
            return _compat.eval_equation(readout_eqn, [*invals[:readout_x_index], x, *invals[readout_x_index + 1:]])[0]

        pull = jax.vjp(drive, invals[readout_x_index])[1]
        dy = output_grad_of[readout.readout]
        # ∂L/∂y_o through the readout's column o alone, every o in one batched pull-back
        # (traced once: a loop traced the step's tail once per readout unit)
        picked = dy[None] * jnp.eye(readout.units, dtype=dy.dtype)[:, None, :]
        signals_ = jax.vmap(lambda c: pull(c)[0])(picked)
        if memory_tail:
            signals_ = jax.vmap(lambda c: tail_transpose(graph, memory_tail, consts, args, memory_v, c))(signals_)
        return list(signals_), kappas

    def signals(weights, others, input_leaves, target, active=None, prepared=None, pre=None):
        weights, others, input_leaves = list(weights), list(others), list(input_leaves)
        leaves = assemble(weights, others)
        hidden_prev = [leaves[position] for position in hidden_positions]
        y_zeros = [jnp.zeros(a.shape, a.dtype) for a in y_avals]
        x_zero = None if readout_x is None else jnp.zeros(readout_x.aval.shape, readout_x.aval.dtype)

        def with_pullback():
            loss, pullback, aux = jax.vjp(
                lambda w, h, p, xp: forward(w, h, p, others, input_leaves, target, xp, prepared, pre=pre), weights,
                hidden_prev,
                y_zeros, x_zero, has_aux=True)
            # One pull-back with h^{t-1} as an input (docs/theory.md §5.8): the exact one-step
            # gradient ∂L^t/∂θ|h^{t-1} (for fused relations as δy = ∂L^t/∂y, which the
            # rule turns into X^T δy), and the learning signal ∂L^t/∂h^{t-1} (e-prop:
            # ∂L^t/∂x at the readout's input as well).
            weight_grads, hidden_signals, output_grads, x_signal = pullback(jnp.ones_like(loss))
            return loss, aux, (list(weight_grads), list(hidden_signals), list(output_grads), x_signal)

        def without_pullback():
            # The step's loss is zero by the caller's word (``active``): not evaluated,
            # so XLA drops what only the loss reads (a stateless readout, when the
            # outputs are not collected).
            loss, aux = forward(weights, hidden_prev, y_zeros, others, input_leaves, target, prepared=prepared,
                                with_loss=False, pre=pre)
            zeros = ([jnp.zeros_like(w) for w in weights], [jnp.zeros_like(h) for h in hidden_prev],
                     [jnp.zeros_like(y) for y in y_zeros], None if x_zero is None else jnp.zeros_like(x_zero))
            return loss, aux, zeros

        if active is None or active is True:
            loss, aux, grads = with_pullback()
        elif active is False:  # known statically: no branch in the program
            loss, aux, grads = without_pullback()
        else:
            # A per-step flag: the pull-back runs and a step without loss keeps zeros (a
            # select: a NaN or inf its loss may give does not pass). A branch per step
            # here had cost more than the pull-backs it skipped (every 10th step marked:
            # ES-D-RTRL on the GRU 0.77 → 0.55× BPTT, D-RTRL on the LIF net 1.45 → 1.04×;
            # every step: 1.02 → 0.58×, 1.68 → 1.03×); a chunk without any loss still runs
            # without the pull-back (run_chunk).
            loss, aux, grads = with_pullback()
            loss = jnp.where(active, loss, jnp.zeros_like(loss))
            grads = jax.tree.map(lambda g: jnp.where(active, g, jnp.zeros_like(g)), grads)
        new_others, captured_values, outputs = aux
        weight_grads, hidden_signals, output_grads, x_signal = grads
        psi = None
        if read_group is not None:
            new_leaves = assemble(weights, new_others)
            h_new = jnp.stack([new_leaves[state_position[path]] for path in read_group.paths], axis=-1)
            psi = readout_sensitivity(leaves, input_leaves, h_new)
        captured = dict(zip(capture, captured_values))
        output_grad_of = dict(zip(fused, output_grads))

        jacobians, sensitivities, memory = transition_derivatives(leaves, input_leaves, captured)
        signal_of = {s.path: hidden_signals[k] for k, s in enumerate(hidden)}
        pair_signals, one_step_taken, columns = [], set(), {}
        memory_signals = memory_kappas = None
        if memory_pairs:
            memory_signals, memory_kappas = readout_memory_signals(
                x_signal, jacobians[readout.group][0][0].reshape(hidden_prev[0].shape[0], -1), captured,
                output_grad_of, [*input_leaves, *leaves])

        def canonical_x(pair, x, params, batch):
            # Pairs whose dense ops read one input (an LSTM's four gates on ``[x, h]``) get one
            # ``X``, bias column and all, so the step loop stacks it once for all of them.
            if pair.kind != "dense":
                return pair.canonical_x(x, params, batch, trace_dtype)
            key = (id(x), pair.has_bias)
            if key not in columns:
                columns[key] = pair.canonical_x(x, params, batch, trace_dtype)
            return columns[key]

        for pair, eqn in zip(pairs, pair_eqns):
            index = pair.relation.eqn_index
            dY = G = None
            batch = hidden_prev[0].shape[0]
            x = None if eqn.primitive.name == "etp_elemwise" else captured[eqn.invars[0]]
            units = pair.canonical_units
            D = tuple(tuple(units(d, 0) for d in row) for row in jacobians[pair.group.index])
            Df = tuple(units(d, 0) for d in sensitivities[pair.index])
            if pair.index in eprop_pairs:
                # e-prop (eprop.EPropRule): its filtered eligibility ē as one more state,
                # ē^t = (ψD) ε^{t-1} + κ ē^{t-1} + (ψDf) x^t, met by the readout's error L
                # per unit: G = (L ψD, κL), and the one-step part L ψDf.
                one_step_taken.add(index)
                per_state = units(psi, 1)
                states = range(len(Df))
                u_prev = [sum(per_state[..., s] * D[s][r] for s in states) for r in states]
                u_y = sum(per_state[..., s] * Df[s] for s in states)
                L = None if active is False else units(x_signal, 0)
                D, Df, G = _with_memory_state(D, Df, None if L is None else [L * u for u in u_prev],
                                              kappas=[jnp.full((batch,), feedback.kappa, Df[0].dtype)],
                                              u_prev=u_prev, u_y=u_y, u_signals=None if L is None else [L])
                pair_signals.append(PairSignals(
                    X=canonical_x(pair, x, eqn.params, batch), D=_cast(D, signal_dtype),
                    Df=_cast(Df, signal_dtype), G=_cast(G, signal_dtype),
                    dY=None if L is None else (L * u_y).astype(signal_dtype)))
                continue
            if index in output_grad_of and index not in one_step_taken and active is not False:  # once per relation
                one_step_taken.add(index)
                dY = units(output_grad_of[index], 0).astype(signal_dtype)
            if active is not False:  # statically without signal: G and dY are None
                G = tuple(units(signal_of[path], 0) for path in pair.group.paths)
            if pair.index in memory_pairs:
                D, Df, G = _with_memory_state(
                    D, Df, G, kappas=memory_kappas, u_prev=[units(u, 0) for u in memory[pair.group.index]],
                    u_y=units(memory[("y", index)], 0),
                    u_signals=None if G is None else [units(signal, 0) for signal in memory_signals])
            # Split per state (base.split_states); a rule that reads the canonical form
            # gets it joined where the engine hands the signals over.
            pair_signals.append(PairSignals(
                X=canonical_x(pair, x, eqn.params, batch),
                D=_cast(D, signal_dtype), Df=_cast(Df, signal_dtype), G=_cast(G, signal_dtype), dY=dY))
        one_step = None
        if active is not False:
            one_step = [(captured[eqns[i].invars[etp_op_info(eqns[i].primitive).x_index]], output_grad_of[i])
                        for i in deferred]
        return loss, outputs, new_others, weight_grads, pair_signals, one_step

    return StepProgram(graph=graph, pairs=tuple(pairs), signals=signals, other_positions=other_positions, prepare=prepare,
                       weight_positions=weight_positions, deferred=deferred, products=products,
                       on_inputs=on_inputs)


def _with_memory_state(D, Df, G, *, kappas, u_prev, u_y, u_signals):
    """Split signals with one more state per unit for each entry of ``kappas``,
    ``ē_m^t = u_prev·ε^{t-1} + κ_m ē_m^{t-1} + u_y x^t``, met by the signal
    ``κ_m·u_signals[m]``; no state but ``ē_m`` itself reads ``ē_m`` (``None`` entries
    of ``D``). The readout memory (docs/theory.md §5.10: ``u`` the readout's input,
    ``u_prev = ∂u^t/∂h^{t-1}``, ``u_y = ∂u^t/∂y^t``, ``u_signals`` ``[∂L^t/∂u^t]``, or one
    per readout unit ``o`` when the decays differ, ``κ_m (B,)`` read off the readout's
    Jacobian at this step) and e-prop's filtered eligibility (``eprop.EPropRule``) are
    all this."""
    dtype, m = Df[0].dtype, len(kappas)
    ks = [jnp.broadcast_to(k.reshape(-1, 1, 1).astype(dtype), Df[0].shape) for k in kappas]
    rows = tuple(tuple(u.astype(dtype) for u in u_prev) + tuple(k if j == i else None for j in range(m))
                 for i, k in enumerate(ks))
    D = tuple(tuple(row) + (None,) * m for row in D) + rows
    Df = tuple(Df) + (u_y.astype(dtype),) * m
    if G is not None:
        G = tuple(G) + tuple((k * signal).astype(G[0].dtype) for k, signal in zip(ks, u_signals))
    return D, Df, G


def _cast(tree: Any, dtype: Any) -> Any:
    """Every array of ``tree`` as ``dtype`` (``None`` entries stay)."""
    return jax.tree.map(lambda a: a.astype(dtype), tree)


def _dense_inputs(eqns, exclude: set) -> dict[int, int | None]:
    """``{dense op index: index of the concatenate that makes its x, or None}`` for the
    dense ETP ops (``etp_mm``, ``etp_mv``) whose input is a concatenation along its last
    axis (a gate's ``[x, h]``) or another variable (a readout's ``h``), but those whose
    input is in ``exclude``."""
    producer = {var: i for i, eqn in enumerate(eqns) for var in eqn.outvars}
    found = {}
    for i, eqn in enumerate(eqns):
        if eqn.primitive.name not in ("etp_mm", "etp_mv"):
            continue
        x = eqn.invars[0]
        if isinstance(x, _compat.Literal) or x in exclude:
            continue
        concat = eqns[producer[x]] if x in producer else None
        joined = concat is not None and concat.primitive.name == "concatenate" \
            and concat.params["dimension"] == len(x.aval.shape) - 1
        found[i] = producer[x] if joined else None
    return found


def _deferrable(eqn) -> bool:
    """A dense or conv ETP op with its input as a variable: linear in its trainable
    operands, so ``C`` steps of its one-step gradient are one contraction."""
    op = etp_op_info(eqn.primitive)
    if op is None or op.kind not in ("dense", "conv") or op.x_index is None:
        return False
    operands = [eqn.invars[op.x_index], *op.split_operands(list(eqn.invars))[1].values()]
    return len(operands) > 1 and not any(isinstance(v, _compat.Literal) for v in operands)


def deferred_gradients(eqn, xs: jax.Array, cotangents: jax.Array, dtype: Any, merge: bool = True) -> dict:
    """``{key: ∂/∂(effective operand)}`` of ``Σ_c <δy_c, op(x_c)>`` for a deferred op
    over a chunk (``xs``, ``cotangents`` with leading axes ``(C, B)``), the weight taken
    after its weight function: one contraction over ``C·B`` rows. The op is linear in
    its trainable operands, so the gradient does not depend on their values. ``merge``:
    as :func:`~.base.gram`'s (False when the batch is split over devices)."""
    op = etp_op_info(eqn.primitive)
    _, trainables = op.split_operands(list(eqn.invars))
    if op.kind == "dense":  # y = x W + b: W's gradient is Xᵀ δy, b's the sum of δy
        cotangents = cotangents.astype(xs.dtype)
        grads = {"weight": gram(xs, cotangents, merge), "bias": cotangents.sum(axis=tuple(range(cotangents.ndim - 1)))}
        return {key: grads[key].astype(dtype) for key in trainables}
    zeros = {key: jnp.zeros(var.aval.shape, var.aval.dtype) for key, var in trainables.items()}
    params = {**eqn.params, "weight_fn": None} if "weight_fn" in eqn.params else dict(eqn.params)
    # A conv wants one batch axis.
    rows, cotangents = xs.reshape(-1, *xs.shape[2:]), cotangents.reshape(-1, *cotangents.shape[2:])
    _, pull = jax.vjp(lambda tr: op.reference(rows, tr, params), zeros)
    grads = pull(cotangents.astype(rows.dtype))[0]
    return {key: value.astype(dtype) for key, value in grads.items()}


# ------------------------------------------------------------------ rules over a chunk
def run_rule_chunk(rule: Rule, traces: Any, signals: PairSignals, t0: jax.Array) -> tuple[jax.Array | None, Any]:
    """``rule`` over one chunk of stacked signals (leading axis ``C``): its ``chunk``
    when it has one, else its per-step ``step`` scanned over the chunk. A chunk without
    learning signal (``G`` is ``None``: no step of it has a loss) only advances the
    traces, by the rule's ``advance`` when it has one, and returns no gradient."""
    if signals.G is None:
        advance = getattr(rule, "advance", None)
        if advance is not None:
            return None, advance(traces, signals, t0)
        signals = signals._replace(G=jnp.zeros_like(signals.Df))
        return None, run_rule_chunk(rule, traces, signals, t0)[1]
    chunk = getattr(rule, "chunk", None)
    if chunk is not None:
        return chunk(traces, signals, t0)

    def body(carry, signals_t):
        traces, total, t = carry
        grad, traces = rule.step(traces, PairSignals(*signals_t), t)
        total = grad if total is None else total + grad
        return (traces, total, t + 1), None

    first = jax.tree.map(lambda s: s[0], tuple(signals))
    grad, traces_1 = rule.step(traces, PairSignals(*first), t0)
    rest = jax.tree.map(lambda s: s[1:], tuple(signals))
    (traces, total, _), _ = lax.scan(body, (traces_1, grad, t0 + 1), rest)
    return total, traces


def shared_groups(pairs, rules, eqns) -> list[list[int]]:
    """Pairs (indices, two or more each) that the step loop runs as one: dense relations
    on the same input ``X`` (an LSTM's four gates on ``[x, h]``) whose rules share with
    one another (``Rule.shares_with``, ``Rule.joined``) and whose canonical sizes agree
    but for the outputs."""
    groups: list[list[int]] = []
    for n, (pair, rule) in enumerate(zip(pairs, rules)):
        if not hasattr(rule, "joined") or pair.relation.op_kind != "dense":
            continue
        x, sizes = eqns[pair.relation.eqn_index].invars[0], (pair.patch, pair.positions, pair.num_states)
        for group in groups:
            lead = pairs[group[0]]
            if (eqns[lead.relation.eqn_index].invars[0] is x and rules[group[0]].shares_with(rule)
                    and (lead.patch, lead.positions, lead.num_states) == sizes):
                group.append(n)
                break
        else:
            groups.append([n])
    return [group for group in groups if len(group) > 1]


def passes_side_by_side() -> int:
    """How many of a chunk's independent passes XLA runs at once: on CPU, one per core
    (its thunks run side by side on the host's threads), elsewhere one."""
    return (os.cpu_count() or 1) if jax.default_backend() == "cpu" else 1


def chunk_groups(pairs, rules, side_by_side: int | None = None) -> list[list[int]]:
    """Pairs (indices) whose rules' chunks run as one (``Rule.chunk_group``): pairs that
    drive the same hidden group, so read the same ``D`` and ``G``, whose rules join one
    another's chunks (``Rule.joins_chunk_with``), when they are more than the passes XLA
    runs at once (``side_by_side``, default :func:`passes_side_by_side`): one pass does
    the shared work once, but pairs apart run side by side. On 2 cores (D-RTRL, H = 128,
    B = 16, T = 200, alternated in one process, 2026-11-26): the LSTM's four gates
    joined 1.40 → 1.28× BPTT with the loss at every step, 0.97 → 0.86× at the last step;
    the GRU's two weights joined 0.45 → 0.52× at the last step and within noise at every
    step, so they stay apart there."""
    side_by_side = passes_side_by_side() if side_by_side is None else side_by_side
    groups: list[list[int]] = []
    for n, (pair, rule) in enumerate(zip(pairs, rules)):
        if not hasattr(rule, "chunk_group"):
            continue
        for group in groups:
            lead = pairs[group[0]]
            if (lead.group.index == pair.group.index and lead.readout_memory == pair.readout_memory
                    and lead.positions == pair.positions and rules[group[0]].joins_chunk_with(rule)):
                group.append(n)
                break
        else:
            groups.append([n])
    return [group for group in groups if len(group) > max(1, side_by_side)]


def signal_bytes(pair: TracedPair, batch: int, itemsize: int) -> int:
    """Bytes per step of a pair's signals stacked over a chunk for a rule's ``chunk``
    (``X``; ``D``, ``Df``, ``G``, ``dY`` and the step's states per unit): the estimate
    :func:`chunk_size` budgets for a rule without ``row_bytes``."""
    S = pair.num_states
    return batch * pair.positions * (pair.patch + pair.outputs * (S ** 2 + 3 * S + 1)) * itemsize


#: glibc's largest mmap threshold on 64-bit hosts (``DEFAULT_MMAP_THRESHOLD_MAX``).
#: glibc serves a block above it with a fresh mapping at every ``malloc``, and XLA's
#: CPU runtime allocates a program's temp memory at every call: a program whose temp
#: memory is above it pays a page fault per 4 KiB it touches, at every call. Measured
#: 2026-11-27 (D-RTRL, H = 128, B = 64, T = 200, alternated in one process): the LIF
#: net in chunks of 100 took 32.8 MiB, 8404 faults a call and 1.69× BPTT's time, in
#: chunks of 50 18.5 MiB, no faults and 1.18×; the RLIF net 43.9 MiB and 1.03× against
#: 31.1 MiB and 0.88×.
MMAP_LINE = 32 * 1024**2


def mmap_line() -> int | None:
    """The temp memory (bytes) above which a compiled program on this host pays page
    faults at every call: :data:`MMAP_LINE` on the CPU backend under glibc, or the
    threshold ``MALLOC_MMAP_THRESHOLD_`` fixes when it is set; None elsewhere (a GPU's
    allocator pools its memory; other C libraries differ)."""
    if jax.default_backend() != "cpu" or platform.libc_ver()[0] != "glibc":
        return None
    fixed = os.environ.get("MALLOC_MMAP_THRESHOLD_", "").strip()
    return int(fixed) if fixed.isdigit() else MMAP_LINE


def sized_program(first: Any, build: Callable[[int], Any], temp: Callable[[Any], int], chunk: int
                  ) -> tuple[int | None, Any]:
    """``(cap, program)``: ``first`` (its chunks of ``chunk`` steps), or ``build(cap)``
    where :func:`chunk_cap` caps the chunk; ``temp(program)`` is its temp bytes, which
    compiles it (:func:`temp_bytes`). The one decision of the Trainer's step, the
    functional API's programs (``Learner.under_line``) and ``benchmarks/speed.py``."""
    made = {None: first}

    def temp_at(cap):
        if cap not in made:
            made[cap] = build(cap)
        return temp(made[cap])

    cap = chunk_cap(temp_at, chunk)
    return cap, made[cap]


def temp_bytes(fn: Any, *args: Any, **kwargs: Any) -> int:
    """XLA's temp memory of the jitted ``fn`` compiled for these arguments (a call with
    them then finds it compiled)."""
    return fn.lower(*args, **kwargs).compile().memory_analysis().temp_size_in_bytes


def chunk_cap(temp_at: Callable[[int | None], int], chunk: int) -> int | None:
    """The cap on a program's chunk that keeps its temp memory under :func:`mmap_line`,
    from the compiled program itself (no estimate places a program within a few MiB
    of the line: chunk_size's is off by up to a quarter either way, the performance
    log's twelfth session). ``temp_at(cap)`` is the temp bytes of the program with its
    chunks at most ``cap`` steps (None: the automatic ``chunk``), which compiles it.
    Returns None when the automatic chunk is under the line, when half of it is not
    (the trace alone may be over the line), or when half of it would be shorter than
    :data:`_BASE_CHUNK` steps (then not compiled); else ``chunk // 2``. Shorter chunks
    read and write the trace more often: alternated in one process (2026-11-27,
    D-RTRL, B = 64, T = 200), halving paid from 100 steps (the LIF net at H = 128
    1.69 → 1.18× BPTT, the RLIF net 1.04 → 0.90×) but not from 25 (the LIF net at
    H = 512 in chunks of 10, under the line, 1.07× and 1.15× against 0.94× and 1.12×
    in chunks of 25, over it; ES-D-RTRL on the GRU at H = 512 0.81× both).
    """
    line = mmap_line()
    if line is None or chunk // 2 < _BASE_CHUNK or temp_at(None) <= line:
        return None
    return chunk // 2 if temp_at(chunk // 2) <= line else None


def chunk_size(pairs, rules, batch: int, itemsize: int, length: int, requested: int | None = None,
               extra: int = 0, shared: list[list[int]] = (), cap: int | None = None) -> int:
    """Steps per chunk: ``requested``, else the longer of :data:`DEFAULT_CHUNK` steps
    halved while the chunk's stacked signals (each rule's ``row_bytes`` per step, else
    :func:`signal_bytes`, a group of ``shared`` pairs (:func:`shared_groups`) its joined
    form's; plus ``extra`` bytes per step: the rows of the ops whose one-step gradient is
    deferred to the chunk) would take more than the traces (or
    32 MiB when a rule reads and writes its trace once per chunk, D-RTRL's ``chunk``;
    16 MiB otherwise) and 32 steps halved likewise against the traces (or 64 MiB); at most the
    sequence length ``length`` and ``cap`` (a limit :func:`chunk_cap` found), and
    lowered (by at most half) to the size that leaves the shortest last chunk: a
    divisor of ``length`` when one exists."""
    if requested is not None:
        return max(1, min(int(requested), length))
    grouped = {n for group in shared for n in group}
    per_step = sum(rule.row_bytes(pair, batch, itemsize) if hasattr(rule, "row_bytes")
                   else signal_bytes(pair, batch, itemsize)
                   for n, (pair, rule) in enumerate(zip(pairs, rules)) if n not in grouped) + extra
    for group in shared:
        members = [pairs[n] for n in group]
        per_step += rules[group[0]].joined([p.outputs for p in members]).row_bytes(members, batch, itemsize)
    traces = sum(rule.trace_bytes(pair, batch, itemsize) for pair, rule in zip(pairs, rules))

    def longest(size: int, budget: int) -> int:
        while size > 1 and size * per_step > max(traces, budget):
            size //= 2
        return size

    passes = any(hasattr(rule, "chunk") for rule in rules)  # a trace read and written per chunk
    size = max(longest(DEFAULT_CHUNK, _CHUNK_BUFFER_BYTES if passes else _ROWS_BUFFER_BYTES),
               longest(_BASE_CHUNK, _BASE_BUFFER_BYTES))
    size = max(1, min(size, length, length if cap is None else cap))
    # Down to half the cap, the size that leaves the shortest last chunk (the longest
    # size among equals): a divisor leaves none. A shorter last chunk is a second copy
    # of the chunk's program (0.3 s of the demo's 1.4 s compile for a 22-step one,
    # against 0.06 s for a 1-step one) whose buffers XLA keeps apart from the loop's:
    # with a divisor memory stays the same for any length (T = 200 and 2000 both run
    # in chunks of 100).
    return min(range(size, size // 2, -1), key=lambda d: length % d) if size > 1 else size


# ------------------------------------------------------------------ the program
def build_online(
    graph: ETraceGraph,
    pairs: tuple[TracedPair, ...],
    rules: tuple[Rule, ...],
    step_loss: Callable[[Any, Any], jax.Array],
    *,
    trace_dtype: Any = jnp.float32,
    chunk: int | None = None,
    sharded: bool = False,
    feedback: Any = None,
    readout: Any = None,
    max_chunk: int | None = None,
) -> OnlineProgram:
    """The online program for ``pairs`` trained by ``rules`` (one rule per pair), over
    chunks of ``chunk`` steps (default: :func:`chunk_size`, at most ``max_chunk``
    steps: the cap :func:`chunk_cap` finds). ``sharded``: the batch is
    split over devices (a rule with ``for_sharding`` is swapped for that form).
    ``feedback``: a signal replacement's (``Plan.feedback``, e-prop); ``readout``: the
    leaky readout whose memory the pairs marked ``readout_memory`` follow (``Plan.readout``)."""
    if sharded:
        rules = tuple(rule.for_sharding() if hasattr(rule, "for_sharding") else rule for rule in rules)
    # A rule may specialise to its pair's structure (D-RTRL skips the products of
    # entries of D that are zero by construction: a readout memory's ē column).
    rules = tuple(rule.for_pair(pair) if hasattr(rule, "for_pair") else rule for pair, rule in zip(pairs, rules))
    module = graph.module
    program = build_step_program(graph, pairs, step_loss, trace_dtype, feedback, readout)
    batch = pairs[0].group.shape[0] if pairs else 1
    accumulate = jnp.promote_types(trace_dtype, jnp.float32)  # bfloat16 traces, float32 sums
    weight_positions = program.weight_positions

    eqns = module.jaxpr.eqns
    deferred = program.deferred
    shared = shared_groups(pairs, rules, eqns)
    by_group = chunk_groups(pairs, rules)
    # Bytes per step the chunk stacks besides the rules' signals: the deferred ops' X and
    # δy rows (in the trace dtype) and the inputs' products computed for the whole chunk
    # (StepProgram.products, in the model's dtype; the LIF net's first layer at B = 64,
    # H = 128: 32 KB a step). The estimate still misses a program's temp memory by up to
    # a quarter either way (docs/performance-log.md, the twelfth session): that LIF net's
    # D-RTRL program takes 32.8 MiB in chunks of 100, above glibc's largest mmap
    # threshold (32 MiB); the Trainer finds that in the compiled step and halves the
    # chunk (chunk_cap, max_chunk here).
    deferred_rows = sum(eqns[i].invars[etp_op_info(eqns[i].primitive).x_index].aval.size + eqns[i].outvars[0].aval.size
                        for i in deferred)
    product_bytes = sum(eqns[i].outvars[0].aval.size * eqns[i].outvars[0].aval.dtype.itemsize
                        for i in program.on_inputs)

    def zero_accumulators(weights):
        """Per weight leaf (the pull-back's direct gradients); then per pair its ``(K, O)``
        and per deferred op its ``{key: effective operand}`` gradient sums."""
        pair_acc = [jnp.zeros((pair.patch, pair.outputs), accumulate) for pair in pairs]
        pair_acc += [{key: jnp.zeros(var.aval.shape, accumulate)
                      for key, var in etp_op_info(eqns[i].primitive).split_operands(list(eqns[i].invars))[1].items()}
                     for i in deferred]
        return [jnp.zeros_like(w) for w in weights], pair_acc

    def weight_gradients(weights, weight_acc, pair_acc, others, input_leaves):
        """Accumulated gradients per weight leaf: the one-step / direct parts plus each
        pair's effective-weight gradient mapped back through the op's weight function
        and any chain (mask, ...) between the ParamState and the op."""
        if not pairs and not deferred:
            return list(weight_acc)
        state_leaves = program.assemble(weights, others)
        cotangents = _effective_cotangents(pairs, pair_acc[:len(pairs)])
        for i, grads in zip(deferred, pair_acc[len(pairs):]):
            cotangents.update({(i, key): value for key, value in grads.items()})
        values, pull = jax.vjp(lambda w: _effective_values(module, w, state_leaves, input_leaves, weight_positions,
                                                           list(cotangents)), list(weights))
        mapped = pull({slot: cotangents[slot].astype(values[slot].dtype) for slot in values})[0]
        return [a + m.astype(a.dtype) for a, m in zip(weight_acc, mapped)]

    def run_chunk(weights, carry, inputs, collect, pullback=None, prepared=None, buffers=None):
        """``C`` steps (``C`` = the inputs' leading axis): the step program over the
        chunk, then every rule once over the stacked signals. ``pullback``: a static
        True / False for every step of the chunk, else the inputs' per-step flags; a
        chunk whose flags are all false runs as ``pullback=False`` (no signal, the
        rules only advance their traces). ``buffers`` (with ``pullback`` None): as
        :func:`chunk_steps`'; a chunk without any loss hands them on untouched."""
        flags = inputs[2]
        if pullback is not None or flags is None:
            return chunk_steps(weights, carry, inputs, collect, pullback, prepared, buffers)

        def without_loss():
            out = chunk_steps(weights, carry, inputs, collect, False, prepared)
            return out if buffers is None else (out, buffers)

        return lax.cond(jnp.any(flags), lambda: chunk_steps(weights, carry, inputs, collect, None, prepared, buffers),
                        without_loss)

    def chunk_steps(weights, carry, inputs, collect, pullback, prepared=None, buffers=None, stacked=False):
        """As :func:`run_chunk` with a static ``pullback``. ``buffers``: arrays (leading
        axis ``C``) the step loop writes its stacked outputs into (:func:`_scan_into`);
        then returns ``(result, buffers)``. ``stacked``: returns only those outputs (for
        their shapes, under ``jax.eval_shape``)."""
        others, traces, weight_acc, pair_acc, t = carry
        pair_acc = list(pair_acc)  # a copy: both branches of run_chunk's cond read the carry
        # Steps known to have no loss: the rules with a cheap per-step advance advance in
        # the step loop itself (one loop, no stacked signals); the others once after it.
        stepwise = {n for n, rule in enumerate(rules) if pullback is False and getattr(rule, "advance_step", None) is not None}
        # Steps with a loss: a rule with step_rows (ES-D-RTRL) runs in the step loop too,
        # stacks only what its one GEMM per chunk reads, and finishes after the loop.
        rowwise = {n for n, rule in enumerate(rules) if pullback is not False and hasattr(rule, "step_rows")}
        # Pairs on one X that run in the loop as one (shared_groups): the first of each
        # group carries them all (its rule's ``joined`` form), the others nothing.
        joined = {group[0]: (group, rules[group[0]].joined([pairs[n].outputs for n in group]))
                  for group in shared if set(group) <= stepwise | rowwise}
        followers = {n for group, _ in joined.values() for n in group[1:]}
        stepwise, rowwise = stepwise - followers, rowwise - followers

        def runner(n):  # what runs pair n (and its group) in the loop
            return joined[n][1] if n in joined else rules[n]

        def step(carry, inputs_t):
            others, weight_acc, inner = carry
            (input_leaves, target, active), t_step, pre_t = inputs_t
            active = active if pullback is None else pullback
            loss, outputs, others, weight_grads, signals, one_step = program.signals(
                weights, others, input_leaves, target, active, prepared, pre_t)
            weight_acc = [a + g.astype(a.dtype) for a, g in zip(weight_acc, weight_grads)]
            # Each rule's signals in the form it reads them (stacked, for a chunk): its
            # stack_form when it has one (D-RTRL: per-state slabs), else canonical.
            signals = [rules[n].stack_form(s) if hasattr(rules[n], "stack_form") else joined_states(s)
                       for n, s in enumerate(signals)]
            rows = {}
            inner = expanded(inner)
            for n, trace in list(inner.items()):
                read = [signals[m] for m in joined[n][0]] if n in joined else signals[n]
                if n in rowwise:
                    rows[n], inner[n] = runner(n).step_rows(trace, read, t_step)
                else:
                    inner[n] = runner(n).advance_step(trace, read)
            signals = [None if n in followers else rows.get(n) if n in inner else s for n, s in enumerate(signals)]
            inner = squeezed(inner)
            return (others, weight_acc, inner), (loss, outputs if collect else None, signals, one_step)

        starting = {n: joined[n][1].start([traces[m] for m in joined[n][0]]) if n in joined else traces[n]
                    for n in stepwise | rowwise}
        inner = {n: runner(n).begin_rows(trace) if n in rowwise else trace
                 for n, trace in starting.items()}  # what the step loop carries per rule
        # The loop carries them without their axes of size one (a dense pair's position
        # and state axes, ``(B, 1, 1, K, O)``): XLA gave such carries layouts that put the
        # unit axes first, and the fused update, reading them in the rule's layout,
        # could not write in place, so each step copied the trace first (the demo's
        # readout trace, 51 KB a step; two of the GRU's ES-D-RTRL traces). Measured
        # 2026-11-27, alternated in one process in both orders: the demo's step 0.876 →
        # 0.850 and 0.907 → 0.846× BPTT's batch; ES-D-RTRL on the GRU 0.653 → 0.580,
        # 0.670 → 0.631 and 0.667 → 0.705× BPTT (H = 128, B = 16, T = 200; the RLIF and
        # LIF nets within noise); identical numbers.
        shapes = [v.shape for v in jax.tree.leaves(inner)]

        def squeezed(tree):
            return jax.tree.map(lambda v: v.reshape(tuple(d for d in v.shape if d != 1)), tree)

        def expanded(tree):
            leaves, treedef = jax.tree.flatten(tree)
            return jax.tree.unflatten(treedef, [v.reshape(shape) for v, shape in zip(leaves, shapes)])

        inner = squeezed(inner)
        length = jax.tree.leaves(inputs)[0].shape[0]
        steps = t + jnp.arange(length, dtype=t.dtype)
        pre = program.products(weights, inputs[0]) if length > 1 else {}
        # Signals that are the same at every step (a membrane's ∂V/∂x = 1, a zero
        # tangent, a readout's decay) are not stacked for the rules that read them once,
        # and a signal several pairs read (a hidden group's D, G) is stacked once
        # (a chunk of one step stacks nothing: not worth the analysis' trace).
        once = [n for n, rule in enumerate(rules)
                if length > 1 and n not in stepwise | rowwise and getattr(rule, "takes_fixed", False)]
        first = jax.tree.map(lambda v: v[0], (inputs, steps, pre))
        derivable = [n for n in once if getattr(rules[n], "takes_derived", False)]
        body, restore = _hoist_fixed(
            step, (others, weight_acc, inner), first, lambda ys: [ys[2][n] for n in once],
            derive=lambda ys: [(ys[2][n].D, ys[2][n].Df, ys[2][n].G, ys[2][n].dY) for n in derivable]
        ) if once else (step, None)
        if stacked:
            return lax.scan(body, (others, weight_acc, inner), (inputs, steps, pre))[1]
        if buffers is None:
            (others, weight_acc, inner), ys = lax.scan(body, (others, weight_acc, inner), (inputs, steps, pre))
        else:
            (others, weight_acc, inner), ys = _scan_into(body, (others, weight_acc, inner), (inputs, steps, pre),
                                                         buffers)
            buffers = ys
        losses, outputs, signals, one_step = ys if restore is None else restore(ys)
        inner = expanded(inner)
        new_traces, finished = [], {}
        for n in rowwise:
            grad, inner[n] = runner(n).finish_rows(inner[n], signals[n])
            finished.update(zip(joined[n][0], grad) if n in joined else [(n, grad)])
        for lead, (group, run_group) in joined.items():  # the traces back per pair
            inner.update(zip(group, run_group.traces(inner[lead])))
        # Pairs of one hidden group whose rules chunk together (chunk_groups): one pass.
        chunked = {}
        for group in by_group:
            group = [n for n in group if n not in inner]
            if len(group) > 1:
                chunked.update(zip(group, rules[group[0]].chunk_group(
                    [rules[n] for n in group], [traces[n] for n in group], [signals[n] for n in group], t)))
        for n, (rule, trace, pair_signals) in enumerate(zip(rules, traces, signals)):
            if n in finished:
                pair_acc[n] = pair_acc[n] + finished[n].astype(pair_acc[n].dtype)
            if n in inner:
                new_traces.append(inner[n])
                continue
            grad, trace = chunked[n] if n in chunked else run_rule_chunk(rule, trace, pair_signals, t)
            if grad is not None:
                pair_acc[n] = pair_acc[n] + grad.astype(pair_acc[n].dtype)
            new_traces.append(trace)
        for n, (i, (xs, cotangents)) in enumerate(zip(deferred, one_step or ()), start=len(pairs)):
            grads = deferred_gradients(eqns[i], xs, cotangents, accumulate, merge=not sharded)
            pair_acc[n] = {key: pair_acc[n][key] + grads[key] for key in pair_acc[n]}
        result = (others, new_traces, weight_acc, list(pair_acc), t + length), (losses, outputs)
        return result if buffers is None else (result, buffers)

    def run_steps(weights, carry, inputs, size, collect, pullback=None, length=None, prepared=None):
        """The first ``length`` steps (default: all) of ``inputs`` (leading axis T): full
        chunks of ``size`` in a scan, then the remainder as one shorter chunk. Each chunk
        is sliced from ``inputs`` in place: a sliced or reshaped prefix would be a copy of
        the inputs, temp memory that grows with T."""
        length = jax.tree.leaves(inputs)[0].shape[0] if length is None else length
        full, tail = divmod(length, size)
        pieces = []
        if full and pullback is None:
            # Steps that may have a loss: the step loop's stacked outputs go into buffers
            # the chunks hand on to one another, filled with zeros once per call; a scan's
            # own stacked outputs XLA zero-fills and copies anew for each chunk.
            shapes = jax.eval_shape(lambda: chunk_steps(weights, carry, _slice(inputs, 0, size), collect, None,
                                                        prepared, stacked=True))

            def chunk(state, i):
                (result, out), buffers = run_chunk(weights, state[0], _slice(inputs, i * size, size), collect,
                                                   None, prepared, buffers=state[1])
                return (result, buffers), out

            buffers = jax.tree.map(lambda shape: jnp.zeros(shape.shape, shape.dtype), shapes)
            (carry, _), (losses, outputs) = lax.scan(chunk, (carry, buffers), jnp.arange(full))
            pieces.append(jax.tree.map(lambda v: v.reshape(full * size, *v.shape[2:]), (losses, outputs)))
        elif full:
            carry, (losses, outputs) = lax.scan(
                lambda c, i: run_chunk(weights, c, _slice(inputs, i * size, size), collect, pullback, prepared),
                carry, jnp.arange(full))
            pieces.append(jax.tree.map(lambda v: v.reshape(full * size, *v.shape[2:]), (losses, outputs)))
        if tail:
            carry, out = run_chunk(weights, carry, _slice(inputs, full * size, tail), collect, pullback, prepared)
            pieces.append(out)
        if len(pieces) == 1:
            return carry, pieces[0]
        return carry, jax.tree.map(lambda a, b: jnp.concatenate([a, b]), *pieces)

    def init_traces(batch_size: int = batch) -> TraceState:
        return TraceState([rule.init_traces(pair, batch_size, trace_dtype) for pair, rule in zip(pairs, rules)],
                          jnp.zeros((), jnp.int32))

    def start(traces):
        traces = init_traces() if traces is None else traces
        return list(traces.traces), jnp.asarray(traces.t, jnp.int32)

    def trace_norms(traces, t):
        return [rule.trace_norm(trace, t) for rule, trace in zip(rules, traces)]

    def sequence_inputs(xs_leaves, targets, active):
        length = jax.tree.leaves(xs_leaves)[0].shape[0]
        if isinstance(active, str):
            if active != "last":
                raise ValueError(f"active must be None, 'last' or a (T,) bool array, got {active!r}")
            active = jnp.arange(length) == length - 1
        active = None if active is None else jnp.asarray(active, bool).reshape(length)
        return (list(xs_leaves), targets, active), length

    def size_for(length, active=None):
        itemsize = jnp.dtype(trace_dtype).itemsize
        last_alone = isinstance(active, str) and length > 1
        return chunk_size(pairs, rules, batch, itemsize, length - 1 if last_alone else length, chunk,
                          extra=deferred_rows * itemsize + product_bytes, shared=shared, cap=max_chunk)

    def run(weight_leaves, state_leaves, xs_leaves, targets, collect=False, active=None, traces=None):
        weights, streaming = list(weight_leaves), traces is not None
        inputs, length = sequence_inputs(xs_leaves, targets, active)
        trace_values, t0 = start(traces)
        carry = (program.others(state_leaves), trace_values, *zero_accumulators(weights), t0)
        size = size_for(length, active)
        prepared = program.prepare(weights)
        if isinstance(active, str) and length > 1:
            # "last": every step but the last without pull-back and without a per-step
            # branch (the rules only advance their traces), then the last step alone
            # with its loss: no chunk of stacked signals that are zero but at one step.
            carry, head = run_steps(weights, carry, inputs, size, collect is True, pullback=False,
                                    length=length - 1, prepared=prepared)
            # The norms are of the traces the last step's gradient reads: without a
            # stream to hand them on, the traces after that step (its input added to
            # them, read by no loss) are not computed (the demo's step: 2465 -> 2335
            # HLO instructions, 87 -> 83 fusions outside its loops, 2026-11-28).
            read = carry[1], carry[4]
            carry, last = chunk_steps(weights, carry, _slice(inputs, length - 1, 1), bool(collect), True, prepared)
            losses = jnp.concatenate([head[0], last[0]])
            out = (losses, last[1] if collect == "final" else jax.tree.map(
                lambda a, b: jnp.concatenate([a, b]), head[1], last[1]))
        else:
            carry, out = run_steps(weights, carry, inputs, size, collect, prepared=prepared)
            read = carry[1], carry[4]
        (others, traces, weight_acc, pair_acc, t), (losses, outputs) = carry, out
        grads = weight_gradients(weights, weight_acc, pair_acc, program.others(state_leaves),
                                 [x[0] for x in xs_leaves])
        final = program.assemble(weights, others)
        result = (grads, losses, final) + ((Collected(outputs, trace_norms(*read)),) if collect else ())
        return result + ((TraceState(traces, t),) if streaming else ())

    def run_with_updates(weight_leaves, state_leaves, xs_leaves, targets, optimizer, opt_state, every,
                         collect=False, active=None, traces=None, project=None):
        """As ``run``, but applies ``optimizer`` every ``every`` steps inside the scan
        (traces carry on across updates: true online learning), then ``project`` to the
        weight leaves (the weights' constraints) when given. Returns ``(weights,
        opt_state, losses, final state leaves)``, then a :class:`Collected` with
        ``collect`` and the final :class:`TraceState` when ``traces`` is given."""
        inputs, length = sequence_inputs(xs_leaves, targets, active)
        size = size_for(min(every, length))

        def window(weights, opt_state, inner, window_inputs):
            inner, out = run_steps(weights, inner, window_inputs, size, collect, prepared=program.prepare(weights))
            others, traces, weight_acc, pair_acc, t = inner
            last_inputs = [x[-1] for x in window_inputs[0]]
            grads = weight_gradients(weights, weight_acc, pair_acc, others, last_inputs)
            updates, opt_state = optimizer.update(grads, opt_state, weights)
            weights = list(optax.apply_updates(weights, updates))
            weights = weights if project is None else list(project(weights))
            inner = (others, traces, *zero_accumulators(weights), t)
            return weights, opt_state, inner, out

        weights, streaming = list(weight_leaves), traces is not None
        trace_values, t0 = start(traces)
        inner = (program.others(state_leaves), trace_values, *zero_accumulators(weights), t0)
        full, tail = divmod(length, every)
        pieces = []
        if full:
            def body(carry, n):
                weights, opt_state, inner = carry
                weights, opt_state, inner, out = window(weights, opt_state, inner, _slice(inputs, n * every, every))
                return (weights, opt_state, inner), out

            (weights, opt_state, inner), out = lax.scan(body, (weights, opt_state, inner), jnp.arange(full))
            pieces.append(jax.tree.map(lambda v: v.reshape(full * every, *v.shape[2:]), out))
        if tail:  # a last partial window still updates the weights
            weights, opt_state, inner, out = window(weights, opt_state, inner, _slice(inputs, full * every, tail))
            pieces.append(out)
        losses, outputs = pieces[0] if len(pieces) == 1 else jax.tree.map(
            lambda a, b: jnp.concatenate([a, b]), *pieces)
        others, traces, _, _, t = inner
        final = program.assemble(weights, others)
        result = (weights, opt_state, losses, final) + ((Collected(outputs, trace_norms(traces, t)),) if collect else ())
        return result + ((TraceState(traces, t),) if streaming else ())

    return OnlineProgram(run=run, run_with_updates=run_with_updates, pairs=tuple(pairs), chunk_for=size_for,
                         init_traces=init_traces)


def _scan_into(body: Callable, carry: Any, xs: Any, buffers: Any) -> tuple[Any, Any]:
    """``lax.scan(body, carry, xs)`` whose stacked outputs are written into ``buffers``
    (leading axis the steps', structure the outputs') instead of arrays of its own.
    XLA makes a scan's stacked outputs as zero-filled arrays before its loop; in a loop
    over chunks it fills them and copies the fill for each chunk, two passes of writes
    and one of reads per buffer before the step loop overwrites it. Buffers handed from
    chunk to chunk are written in place. ES-D-RTRL, loss at every step, H = 128, B = 16,
    T = 200, two runs alternated in one process (2026-11-26): GRU 0.608–0.613 →
    0.583–0.588× BPTT, LIF 0.731–0.762 → 0.692–0.721×, RLIF 0.642–0.671 → 0.627–0.642×
    (B = 64 and T = 2000 gain too); D-RTRL on the GRU 0.80–0.84 → 0.77–0.78×, on the
    LIF net within noise, its temp memory 0.9–1.7 MiB larger (the buffers stay live
    between chunks)."""
    def step(state, xs_i):
        carry_, stacked = state
        x, i = xs_i
        carry_, y = body(carry_, x)
        return (carry_, jax.tree.map(lambda b, v: lax.dynamic_update_index_in_dim(b, v.astype(b.dtype), i, 0),
                                     stacked, y)), None

    length = jax.tree.leaves(xs)[0].shape[0]
    (carry, stacked), _ = lax.scan(step, (carry, buffers), (xs, jnp.arange(length)))
    return carry, stacked


def _hoist_fixed(step: Callable, carry: Any, first: Any, select: Callable,
                 derive: Callable | None = None) -> tuple[Callable, Callable | None]:
    """``step`` (a scan body over ``carry`` and per-step inputs like ``first``) without
    the stacked outputs that ``select`` picks and that are the same at every step: the
    new body returns ``None`` in their place, and ``restore(ys)`` puts a :class:`Fixed`
    there (read off the step once, or a literal fill), so the loop neither computes nor
    stores them. Likewise without a stacked output whose value another one has
    (``_compat.equal_outputs``: a hidden group's ``D`` and ``G``, which each pair of the
    group reads): ``restore`` hands it the other's stacked array. D-RTRL on
    LSTM(64 → 128) + Linear(10), whose four gates drive one group, B = 16, T = 200, loss
    at every step: 1.69 → 1.35× BPTT, temp 45.4 → 40.8 MiB; on the GRU (two pairs)
    0.82 → 0.79× and 0.50 → 0.46× with the loss at the last step (alternated in one
    process, 2026-11-26). ``restore`` is ``None`` when there is nothing to restore.

    ``derive`` picks stacked outputs (of those ``select`` picks) that a rule may read as
    :class:`Derived`: of these, the ones the step makes by elementwise equations from
    values that take fewer bytes (``_compat.recomputed_outputs``: a neuron's Jacobian
    entries from its states and input) are not stacked; the body stacks those values
    after its own outputs, ``(carry, (ys, values))``, and ``restore`` hands the rule a
    :class:`Derived` that computes each again where the rule reads it. The demo's ALIF
    with a readout memory (seven ``D``/``Df`` slabs of ``(32, 200)`` a step from three):
    its step's temp memory 14.8 → 10.2 MiB, its time 0.98–1.02× (alternated in one
    process, three runs, 2026-11-27)."""
    closed, shape = jax.make_jaxpr(step, return_shape=True)(carry, first)
    leaves, treedef = jax.tree.flatten(shape)
    positions = jax.tree.unflatten(treedef, list(range(len(leaves))))
    chosen = set(jax.tree.leaves(select(positions[1])))
    found = _compat.step_invariant_outputs(closed)
    hoisted = {i: found[i][1] for i in chosen if found[i][0]}
    # A stacked output that is another's value (a hidden group's D and G, read by each of
    # its pairs) is stacked once and shared.
    stacked = set(jax.tree.leaves(positions[1]))
    same = _compat.equal_outputs(closed)
    repeats = {i: same[i] for i in stacked if same[i] != i and same[i] in stacked and same[i] not in hoisted}
    candidates = set(jax.tree.leaves(derive(positions[1]))) - set(hoisted) - set(repeats) if derive else ()
    derived, sources = _compat.recomputed_outputs(closed, candidates) if candidates else ([], [])
    derived = set(derived)
    # the loop runs this trace (with the sources as more outputs): the step is not traced again
    run = _compat.jaxpr_as_fun(_compat.with_outputs(closed, sources) if derived else closed)

    def recompute(indices):  # the derived outputs ``indices`` as a function of the sources
        return _compat.jaxpr_as_fun(_compat.derivation(closed, list(indices), sources))

    def body(carry_, inputs_t):
        outs = run(*jax.tree.leaves((carry_, inputs_t)))
        outs, values = outs[:len(leaves)], outs[len(leaves):]
        carry_, ys = jax.tree.unflatten(treedef, [None if i in hoisted or i in repeats or i in derived else out
                                                  for i, out in enumerate(outs)])
        return (carry_, (ys, tuple(values))) if derived else (carry_, ys)

    def restore(ys):
        if derived:
            ys, values = ys
            source = Derivation(recompute, tuple(values))
            steps = jax.tree.leaves(ys)[0].shape[0]
            ys = jax.tree.map(lambda i, y: Derived(source, i, (steps, *closed.out_avals[i].shape),
                                                   closed.out_avals[i].dtype) if i in derived else y,
                              positions[1], ys)
        ys = with_fixed(ys)
        if not repeats:
            return ys
        values = {}
        jax.tree.map(values.__setitem__, positions[1], ys)  # each output's stacked value (or Fixed)
        return jax.tree.map(lambda i: values[repeats.get(i, i)], positions[1])

    def with_fixed(ys):
        steps = jax.tree.leaves(ys)[0].shape[0]  # the losses are always stacked
        needed = any(fill is None for fill in hoisted.values())
        values = run(*jax.tree.leaves((carry, first))) if needed else None

        def fixed(i, stacked):
            if i not in hoisted:
                return stacked
            fill, aval = hoisted[i], closed.out_avals[i]
            return Fixed(jnp.full(aval.shape, fill, aval.dtype) if fill is not None else values[i],
                         None if fill is None else float(fill), steps)

        return jax.tree.map(fixed, positions[1], ys)

    return body, restore if hoisted or repeats or derived else None


def _assemble(weight_positions, other_positions, weights, others) -> list:
    """State leaves in module order from the weight leaves and the other leaves."""
    leaves = [None] * (len(weight_positions) + len(other_positions))
    for position, value in zip(weight_positions, weights):
        leaves[position] = value
    for position, value in zip(other_positions, others):
        leaves[position] = value
    return leaves


def _slice(tree: Any, start: Any, size: int) -> Any:
    """``size`` steps of every leaf of ``tree`` from step ``start`` (traced or not)."""
    return jax.tree.map(lambda v: lax.dynamic_slice_in_dim(v, start, size), tree)


def _effective_cotangents(pairs, pair_acc) -> dict:
    """Summed effective-operand gradients keyed by ``(equation index, operand key)``."""
    totals: dict = {}
    for pair, grad in zip(pairs, pair_acc):
        for key, value in pair.effective_grads(grad).items():
            slot = (pair.relation.eqn_index, key)
            totals[slot] = totals[slot] + value if slot in totals else value
    return totals


def _effective_values(module, weight_leaves, state_leaves, input_leaves, weight_positions, slots) -> dict:
    """The effective operands (after weight functions) of the pairs' ops as functions
    of the weight leaves, read off one evaluation of the step."""
    leaves = list(state_leaves)
    for n, position in enumerate(weight_positions):
        leaves[position] = weight_leaves[n]
    eqns = module.jaxpr.eqns
    wanted = {}
    for eqn_index, key in slots:
        eqn = eqns[eqn_index]
        _, trainables = etp_op_info(eqn.primitive).split_operands(list(eqn.invars))
        wanted[(eqn_index, key)] = (trainables[key], eqn)
    captured = {}
    variables = {var for var, _ in wanted.values() if not isinstance(var, _compat.Literal)}

    def on_write(var, value):
        if var in variables:
            captured[var] = value
        return value

    _compat.interpret(module.jaxpr, list(module.closed_jaxpr.consts), [*input_leaves, *leaves], on_write=on_write)
    values = {}
    for slot, (var, eqn) in wanted.items():
        operand = captured[var]
        if slot[1] == "weight":
            fn = eqn.params.get("fn") if eqn.primitive.name == "etp_elemwise" else eqn.params.get("weight_fn")
            operand = operand if fn is None else fn(operand)
        values[slot] = operand
    return values

"""What every online rule shares: traced pairs in one canonical form, and the rule API.

A *traced pair* is one relation (an ETP equation) together with one hidden group it
drives. Whatever the op (dense, conv, elementwise), its signals at step ``t`` are put in
one canonical form so a rule is written once:

    X  (B, P, K)        the op's input per position (conv: patches; elementwise: ones),
                        with a column of ones appended when the op has a bias
    D  (B, P, O, S, S)  the group's per-unit Jacobian ∂h^t/∂h^{t-1} (with a readout
                        memory, ``readout.py``, or under e-prop, ``eprop.py``, one
                        more state ``ē`` per unit)
    Df (B, P, O, S)     ∂h^t/∂y^t per unit
    G  (B, P, O, S)     the learning signal ∂L^t/∂h^{t-1} (docs/theory.md §5.8)
    dY (B, P, O)        ∂L^t/∂y^t, the op output's gradient over every path of step t
                        (dense and conv pairs; None for elementwise ones and for a
                        relation's second pair)

and a rule returns the step's gradient with respect to the *effective* weight ``(K, O)``
(the op's weight after its weight function, with the bias as row ``K-1``): the exact
one-step part ``Xᵀ dY`` (when ``dY`` is given; elementwise parameters get theirs from
the step's pull-back) plus the *history part*, ``G`` contracted with its traces of step
``t-1``; then it advances its traces with ``X``, ``D`` and ``Df``. Read
``d_rtrl.py`` for the simplest rule, ``online.py`` for how signals are produced.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..compiler import ETraceGraph, HiddenGroup, Relation
from ..errors import ShapeError

__all__ = ["Fixed", "PairSignals", "Rule", "TracedPair", "joined_states", "split_states", "traced_pairs"]


class PairSignals(NamedTuple):
    """The canonical signals of one traced pair at one step (shapes in the module doc)."""

    X: jax.Array
    D: jax.Array
    Df: jax.Array
    G: jax.Array
    dY: jax.Array | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class Fixed:
    """A stacked signal that is the same at every step of a chunk, handed to a rule that
    says it reads such (``takes_fixed``) in place of the ``(C, ...)`` stack: ``value``
    without the step axis and ``fill``, the number at every entry when the step makes it
    from a literal (a membrane's ``∂V^t/∂x^t = 1``, a tangent that is zero), else
    ``None``; ``steps`` the chunk's length ``C``. Not a pytree node: JAX sees it as a
    leaf, so a rule takes it apart before scanning."""

    value: jax.Array
    fill: Any = None
    steps: int = 1


@dataclasses.dataclass(frozen=True, eq=False)
class Derivation:
    """Per-step values the step loop stacked instead of some of its signals (``inputs``,
    each ``(C, ...)``), and ``outputs(indices)``: a function of those values at one step
    that gives the signals with these indices at that step, as a list, by the
    elementwise equations that made them in the step (only theirs: a rule that reads
    one hidden group's signals does not trace the others')."""

    outputs: Any
    inputs: tuple


@dataclasses.dataclass(frozen=True, eq=False)
class Derived:
    """A stacked signal the engine did not stack, handed to a rule that says it reads
    such (``takes_derived``): at each step it is the signal ``index`` of ``source``
    (:class:`Derivation`), which the rule computes where it reads the step's signals (a
    neuron's Jacobian entries from its states, which take fewer bytes to stack).
    ``shape`` and ``dtype``: the stacked signal's. Not a pytree node."""

    source: Derivation
    index: int
    shape: tuple
    dtype: Any


def split_states(signals: PairSignals) -> PairSignals:
    """The signals with every state axis split: ``D[s][r]`` (a nested tuple, ``None``
    where the entry is zero by construction), ``Df[s]`` and ``G[s]`` (tuples), each of
    the canonical shape without its state axes, with any leading axes (a chunk's ``C``).
    The step program makes this form (a trailing ``S`` or ``S×S`` block is several times
    slower to write on CPU); signals already split are returned as they are."""
    X, D, Df, G = signals[:4]
    if isinstance(Df, tuple):
        return signals
    states = range(Df.shape[-1])
    return signals._replace(D=tuple(tuple(D[..., s, r] for r in states) for s in states),
                            Df=tuple(Df[..., s] for s in states),
                            G=G if G is None or G.ndim < Df.ndim else tuple(G[..., s] for s in states))


def joined_states(signals: PairSignals) -> PairSignals:
    """The canonical form (module docstring) of signals split by :func:`split_states`."""
    X, D, Df, G = signals[:4]
    if not isinstance(Df, tuple):
        return signals
    zero = jnp.zeros_like(Df[0])
    D = jnp.stack([jnp.stack([zero if d is None else d for d in row], axis=-1) for row in D], axis=-2)
    return signals._replace(D=D, Df=jnp.stack(Df, axis=-1),
                            G=jnp.stack(G, axis=-1) if isinstance(G, tuple) else G)


class Rule(Protocol):
    """An online learning rule in the optax spirit: pure functions over a trace pytree.

    ``init_traces(pair, batch, dtype)`` returns zero traces; ``step(traces, signals, t)``
    returns ``(history part (K, O) of this step's gradient, new traces)``; ``trace_bytes(pair, batch,
    itemsize)`` says how much memory the traces take; ``trace_norm(traces, t)`` is the
    Frobenius norm per sample ``(B,)`` of the eligibility trace the rule stands for
    (what ``G`` is contracted with), for dashboards. ``t`` counts steps since the last
    reset (0 at the first step). Optionally ``chunk(traces, signals, t0)``: the same
    over a chunk of steps, each signal with a leading time axis ``C``, returning the
    chunk's summed gradient and the traces after it (``online.run_rule_chunk`` scans
    ``step`` for a rule without one); and ``advance(traces, signals, t0)``: the traces
    after a chunk in which no step has a loss (``G`` and ``dY`` are ``None``; without
    it, the rule runs on a zero ``G`` and its gradient is dropped); and
    ``advance_step(traces, signals)``: the same for one step (unstacked signals), for a
    rule whose advance is cheap elementwise work — the engine then runs it inside its
    step loop on steps it knows have no loss, instead of a loop of its own per chunk
    (ES-D-RTRL; D-RTRL reads its whole trace per step, so only a small trace's rule
    has it — ``None`` means the rule has none);
    ``begin_rows(traces)``, ``step_rows(inner, signals, t)`` and
    ``finish_rows(inner, rows)``: the rule on steps with a loss inside the engine's
    step loop — ``begin_rows`` makes the state the loop carries from the chunk's
    starting traces, ``step_rows`` advances it per step and returns the rows of the
    chunk's gradient, which the engine stacks over the chunk and hands to
    ``finish_rows`` with the state after the last step, for ``(the chunk's gradient,
    the final traces)`` (ES-D-RTRL: no buffers of ``D``, ``Df``, ``G`` and no second
    loop); and ``row_bytes(pair, batch, itemsize)``: the bytes per step the engine
    stacks over a chunk for the rule (``online.chunk_size`` budgets them; without it,
    ``online.signal_bytes``, what a ``chunk`` reads); and
    ``shares_with(rule)`` and ``joined(sizes)``: pairs whose rules share with one another
    and whose dense ops read the same ``X`` run in the engine's step loop as one, through
    the object ``joined`` returns (``online.shared_groups``; ES-D-RTRL's ``JoinedRows``:
    one ``ε_x`` and one row of it per step, one GEMM); and
    ``joins_chunk_with(rule)`` and ``chunk_group(rules, traces, signals, t0)``: the
    chunks of pairs that drive one hidden group (so read the same ``D`` and ``G``) and
    whose rules join one another's run as one call, which returns ``[(gradient, new
    traces)]`` per pair (``online.chunk_groups``; D-RTRL: one backward pass for the
    group); and
    ``for_pair(pair)``: the rule specialised to one pair's structure (the engine calls
    it once per pair when it builds the program); and ``takes_fixed = True``: its
    ``chunk`` reads a :class:`Fixed` in place of any stacked signal that is the same at
    every step (the engine then does not stack it); and ``takes_derived = True``: its
    ``chunk`` reads a :class:`Derived` in place of a stacked signal that the step
    computes elementwise from values that take fewer bytes (the engine stacks those).
    """

    name: str

    def init_traces(self, pair: "TracedPair", batch: int, dtype: Any) -> Any: ...

    def step(self, traces: Any, signals: PairSignals, t: jax.Array) -> tuple[jax.Array, Any]: ...

    def trace_bytes(self, pair: "TracedPair", batch: int, itemsize: int) -> int: ...

    def trace_norm(self, traces: Any, t: jax.Array) -> jax.Array: ...


@dataclasses.dataclass(frozen=True)
class TracedPair:
    """One relation and one hidden group it drives, with the sizes of the canonical form.

    Attributes:
        index: position among the plan's pairs.
        relation, group: what is paired.
        transition: the closed jaxpr ``(y, *state leaves, *input leaves) -> h_new``.
        positions: ``P`` (output positions sharing the weight: 1 unless conv).
        patch: ``K`` (input features per position, bias column included).
        outputs: ``O`` (units per position).
        readout_memory: the group reaches a leaky readout unit by unit, and the pair
            carries this many more states per unit for the readout's memory
            (``readout.py``, docs/theory.md §5.10): one ``ē`` for a readout of one decay,
            one per readout unit when their decays differ; ``S`` is the group's states
            plus these (0: none).
        pattern: for a dense op whose weight function holds a fixed mask (a
            ``SparseLinear``, a masked ``Linear``), the entries ``(k, o)`` of the
            canonical ``(K, O)`` weight that can be nonzero (two int arrays, the bias
            row included); None for a dense weight. D-RTRL keeps its trace there only
            when they are at most half the entries (:data:`SPARSE_DENSITY`).
    """

    index: int
    relation: Relation
    group: HiddenGroup
    transition: Any = dataclasses.field(compare=False, repr=False)
    positions: int = 1
    patch: int = 1
    outputs: int = 1
    readout_memory: int = 0
    pattern: Any = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def kind(self) -> str:
        return self.relation.op_kind

    @property
    def sparse_entries(self) -> tuple[Any, Any] | None:
        """``pattern`` where sparse enough for D-RTRL to keep its trace there (at most
        :data:`SPARSE_DENSITY` of the ``K·O`` entries), else None."""
        if self.pattern is None or len(self.pattern[0]) > SPARSE_DENSITY * self.patch * self.outputs:
            return None
        return self.pattern

    @property
    def has_bias(self) -> bool:
        return any(o.key == "bias" for o in self.relation.operands)

    @property
    def num_states(self) -> int:
        """``S``: the group's states, plus the readout memory's states if carried."""
        return self.group.num_states + int(self.readout_memory)

    @property
    def unit_shape(self) -> tuple[int, ...]:
        return tuple(self.group.shape[1:])

    # ------------------------------------------------------------ canonical form
    def canonical_x(self, x: jax.Array | None, eqn_params: dict, batch: int, dtype: Any) -> jax.Array:
        """``X (B, P, K)`` from the op's input ``x``."""
        if self.kind == "elementwise":
            return jnp.ones((batch, 1, 1), dtype)
        if self.kind == "dense":
            columns = x.reshape(batch, 1, -1)
        else:
            weight_shape = dict(self.relation.trainable_shapes)["weight"]
            patches = lax.conv_general_dilated_patches(
                x, filter_shape=weight_shape[:-2], window_strides=eqn_params["strides"],
                padding=eqn_params["padding"], rhs_dilation=eqn_params["dilation"],
                dimension_numbers=_CONV_DIMENSIONS[len(weight_shape) - 2],
            )
            columns = patches.reshape(batch, self.positions, -1)
        columns = columns.astype(dtype)
        if self.has_bias:
            columns = jnp.concatenate([columns, jnp.ones((*columns.shape[:2], 1), dtype)], axis=-1)
        return columns

    def canonical_units(self, value: jax.Array, trailing: int) -> jax.Array:
        """``(B, *unit_shape, *rest)`` → ``(B, P, O, *rest)`` (``rest`` has ``trailing`` axes)."""
        rest = value.shape[value.ndim - trailing :] if trailing else ()
        return value.reshape(value.shape[0], self.positions, self.outputs, *rest)

    def effective_grads(self, grad: jax.Array) -> dict[str, jax.Array]:
        """Canonical ``(K, O)`` gradient → gradients of the op's effective operands by key
        (the weight after its weight function; for elementwise ops, ``y``)."""
        shapes = dict(self.relation.trainable_shapes)
        out: dict[str, jax.Array] = {}
        if self.has_bias:
            out["bias"] = grad[-1].reshape(shapes["bias"])
            grad = grad[:-1]
        if self.kind == "dense":
            out["weight"] = grad.reshape(shapes["weight"])
        elif self.kind == "conv":
            kernel = shapes["weight"][:-2]
            c_in, c_out = shapes["weight"][-2:]
            grad = grad.reshape(c_in, math.prod(kernel), c_out)  # patches are channel-major
            out["weight"] = jnp.moveaxis(grad, 0, 1).reshape(*kernel, c_in, c_out)
        else:
            per_unit = grad.reshape(self.unit_shape)
            out["weight"] = _sum_to_shape(per_unit, self.relation.y_shape)
        return out


_CONV_DIMENSIONS = {1: ("NWC", "WIO", "NWC"), 2: ("NHWC", "HWIO", "NHWC"), 3: ("NDHWC", "DHWIO", "NDHWC")}


def _sum_to_shape(value: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Sum the axes ``shape`` was broadcast along (numpy rules) to get back ``shape``."""
    lead = value.ndim - len(shape)
    value = value.sum(axis=tuple(range(lead))) if lead else value
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and value.shape[i] != 1)
    return value.sum(axis=axes, keepdims=True) if axes else value


def sample_norm(values: jax.Array) -> jax.Array:
    """The 2-norm of each sample's entries (axis 0 is the batch), in at least float32,
    scaled by the sample's largest magnitude so that no square overflows: a float32
    trace whose norm is 1e20 reads 1e20, where summing its squares reads inf."""
    values = values.astype(jnp.promote_types(values.dtype, jnp.float32)).reshape(values.shape[0], -1)
    return _scaled_norm(jnp.square, values, axis=1)


def global_norm(tree: Any) -> jax.Array:
    """The 2-norm of every entry of ``tree`` together (a gradient's global norm), in at
    least float32 and scaled as :func:`sample_norm` is: ``optax.global_norm`` sums the
    squares, so a float32 gradient of norm 1e20 read inf (and a clip made it zero)."""
    leaves = [leaf.astype(jnp.promote_types(leaf.dtype, jnp.float32)).ravel() for leaf in jax.tree.leaves(tree)]
    if not leaves:
        return jnp.zeros((), jnp.float32)
    return _scaled_norm(jnp.square, jnp.concatenate(leaves)[None], axis=1)[0]


def _scaled_norm(square: Any, values: jax.Array, axis: int) -> jax.Array:
    """``sqrt(Σ values²)`` along ``axis`` with the values scaled by the power of two of
    their largest magnitude first (``ldexp``, exact): dividing by the magnitude itself
    became a product with its reciprocal, which is subnormal above 2^126 and flushed
    to zero on CPU (a trace entry of 5e36 read a norm of 0). Inf and NaN pass through."""
    scale = jnp.max(jnp.abs(values), axis=axis, keepdims=True)
    finite = jnp.isfinite(scale)
    _, exponent = jnp.frexp(jnp.where(finite, scale, 1.0))
    norm = jnp.ldexp(jnp.sqrt(jnp.sum(square(jnp.ldexp(values, -exponent)), axis=axis, keepdims=True)), exponent)
    return jnp.squeeze(jnp.where(finite, norm, scale), axis)


def gram(a: jax.Array, b: jax.Array, merge: bool = True) -> jax.Array:
    """``Σ aᵀ b`` over every leading axis: ``a (..., K)``, ``b (..., O)`` → ``(K, O)``, a
    weight gradient from stacked rows. The product is taken with the smaller of ``K``,
    ``O`` as its rows and transposed: XLA on CPU ran ``(400, 128)ᵀ (400, 10)`` 3× slower
    than ``(400, 10)ᵀ (400, 128)`` (a readout's gradient over a chunk).

    The leading axes are merged first, so the product contracts one axis: over the
    stacked ``(C, B, P, K)`` rows of a chunk, XLA on CPU copied ``a`` transposed and ran
    the product apart (ES-D-RTRL's chunk GEMM on the feed-forward LIF net, ``(1600,
    65)ᵀ (1600, 128)``: 98 + 452 µs a chunk), where on two axes it runs one product
    that reads ``a`` as it lies (268 µs); ES-D-RTRL on that net 0.77–0.79 → 0.72–0.73×
    BPTT in three of four runs alternated in one process (H = 128, B = 16, T = 200,
    loss at every step; GRU, RLIF and D-RTRL within noise), 2026-11-26. ``merge=False``
    keeps the axes (rows split over devices along the batch, an inner axis: merged, the
    split would have to be redone)."""
    if merge:
        a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    lead = "abcdefgh"[:a.ndim - 1]
    if b.shape[-1] < a.shape[-1]:  # the barrier keeps XLA from folding the transpose back into the product
        return lax.optimization_barrier(jnp.einsum(f"{lead}o,{lead}k->ok", b, a)).T
    return jnp.einsum(f"{lead}k,{lead}o->ko", a, b)


def scalar_loss(step_loss: Any, outputs: Any, target: Any) -> jax.Array:
    """``step_loss(outputs, target)``, which must be a scalar: a per-sample loss ``(B,)``
    summed silently would scale the gradient by the batch size, so it is an error."""
    from ..errors import ConfigError

    value = step_loss(outputs, target)
    if jnp.ndim(value) != 0:
        name = getattr(step_loss, "__name__", type(step_loss).__name__)
        raise ConfigError(f"step_loss {name!r} returned shape {tuple(jnp.shape(value))}; it must return one scalar "
                          f"per step (reduce over the batch inside it, e.g. jnp.mean(per_sample) or .sum())")
    return value


#: A masked dense weight whose nonzero entries are at most this fraction of the matrix
#: gets a D-RTRL trace the size of its nonzeros (``TracedPair.sparse_entries``); above it
#: the gathers cost more than the dense trace they save.
SPARSE_DENSITY = 0.5


def _nonzero_pattern(eqn: Any, relation: Relation, patch: int, outputs: int) -> tuple[Any, Any] | None:
    """Where a dense op's effective weight can be nonzero, from a fixed mask in its weight
    function (``Masked``, alone or first in a ``Chain`` of functions that keep zeros at
    zero), as ``(k, o)`` over the canonical ``(K, O)`` with the bias row; else None."""
    from ..ops.weight_fns import Chain, Masked, Positive, SignConstrained

    fn = eqn.params.get("weight_fn")
    fns = fn.fns if isinstance(fn, Chain) else (fn,)
    if relation.op_kind != "dense" or [o.key for o in relation.operands if o.key != "bias"] != ["weight"]:
        return None
    if not fns or not isinstance(fns[0], Masked) or not all(isinstance(f, (Masked, Positive, SignConstrained))
                                                            for f in fns):
        return None
    shape = dict(relation.trainable_shapes)["weight"]
    mask = np.ones(shape, bool)
    for f in fns:
        if isinstance(f, Masked):
            mask &= np.broadcast_to(np.asarray(f.mask) != 0, shape)
    mask = mask.reshape(-1, outputs)
    if patch > mask.shape[0]:  # the bias row: every unit
        mask = np.concatenate([mask, np.ones((patch - mask.shape[0], outputs), bool)])
    k, o = np.nonzero(mask)
    return k.astype(np.int32), o.astype(np.int32)


def traced_pairs(graph: ETraceGraph) -> tuple[TracedPair, ...]:
    """Every (relation, group) pair of the graph, in relation order."""
    pairs = []
    for relation in graph.relations:
        for group_index, transition in zip(relation.hidden_groups, relation.transitions):
            group = graph.hidden_groups[group_index]
            units = tuple(group.shape[1:])
            if not units:  # an unbatched model whose units were read as its batch (xs (T, I) with I = N)
                raise ShapeError(
                    f"hidden group {group.name} has shape {tuple(group.shape)}: the online rules need hidden states "
                    f"of shape (batch, units...) and inputs xs (T, B, ...). Initialise the states with "
                    f"brainstate.nn.init_all_states(model, batch_size=B) (B = 1 for one sequence) and give xs a "
                    f"batch axis; algo='bptt' takes an unbatched model")
            if relation.op_kind == "dense":
                positions, outputs = 1, units[-1]
                patch = relation.x_shape[-1]
            elif relation.op_kind == "conv":
                positions, outputs = math.prod(units[:-1]), units[-1]
                weight_shape = dict(relation.trainable_shapes)["weight"]
                patch = math.prod(weight_shape[:-1])
            else:
                positions, outputs, patch = 1, math.prod(units), 0
            patch += 1 if any(o.key == "bias" for o in relation.operands) or relation.op_kind == "elementwise" else 0
            pattern = _nonzero_pattern(graph.module.jaxpr.eqns[relation.eqn_index], relation, patch, outputs)
            pairs.append(TracedPair(len(pairs), relation, group, transition, positions, patch, outputs,
                                    pattern=pattern))
    return tuple(pairs)

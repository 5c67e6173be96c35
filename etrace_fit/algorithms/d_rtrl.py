"""D-RTRL (docs/theory.md §5.1): the diagonal RTRL trace, the size of the weight.

    ε[b,p,s,k,o]^t = Σ_s' D[b,p,o,s,s']^t ε[b,p,s',k,o]^{t-1} + Df[b,p,o,s]^t X[b,p,k]^t
    ∂L^t/∂W[k,o] ≈ Σ_{b,p} X[b,p,k]^t dY[b,p,o]^t + Σ_{b,p,s} G[b,p,o,s]^t ε[b,p,s,k,o]^{t-1}

with ``G = ∂L^t/∂h^{t-1}`` and ``dY = ∂L^t/∂y^t`` (docs/theory.md §5.8: the first sum is the
exact one-step part). Exact (equal to BPTT) for weights into a layer whose only
recurrence is per unit and whose influence on later losses runs only through its own
hidden group, whatever the output reads. Memory ``B·P·K·O·S``, laid out ``(B, P, S, K, O)``
so the units are the fast axis (a trailing state axis of 2 made every pass over the
trace several times slower). A sparse weight (a fixed mask, ``TracedPair.sparse_entries``)
keeps the trace at its ``N`` possible nonzeros only: ``(B, P, S, N)``, entry ``n`` the
weight ``(k_n, o_n)``, memory ``B·P·N·S``.
"""

from __future__ import annotations

import copy
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .base import Derived, Fixed, PairSignals, TracedPair, gram, sample_norm, split_states

__all__ = ["DRTRL", "STEPWISE_NUMBERS", "advance_trace"]

#: A D-RTRL trace of at most this many numbers per sample advances inside the step loop
#: on steps without loss (``DRTRL.for_pair``); larger ones once per chunk.
STEPWISE_NUMBERS = 4096


def _total(terms) -> Any:
    """The sum of the terms that are not ``None`` (structural zeros), ``None`` if none are."""
    terms = [term for term in terms if term is not None]
    return sum(terms[1:], terms[0]) if terms else None


def _times(a: Any, b: Any) -> Any:
    return None if a is None or b is None else a * b


def _split_fixed(tree: Any) -> tuple[Any, Any]:
    """Nested tuples of stacked signals as two of the same structure: the stacked
    entries (``None`` where fixed) and the :class:`~.base.Fixed` values (``None``
    elsewhere)."""
    if isinstance(tree, tuple):
        parts = [_split_fixed(item) for item in tree]
        return tuple(p[0] for p in parts), tuple(p[1] for p in parts)
    return (None, tree.value) if isinstance(tree, Fixed) else (tree, None)


def _merged(stacked: Any, fixed: Any) -> Any:
    """One step's signals from a slice of the stacked entries and the fixed values."""
    if isinstance(stacked, tuple):
        return tuple(_merged(a, b) for a, b in zip(stacked, fixed))
    return fixed if stacked is None else stacked


def _split_derived(tree: Any) -> tuple[Any, Any, list]:
    """Nested tuples of stacked signals as the stacked entries (``None`` where
    :class:`~.base.Derived`), the Derived ones (``None`` elsewhere) and, per
    :class:`~.base.Derivation` they come from, ``(source, function of its inputs at one
    step giving the signals read here)``."""
    wanted: dict[int, tuple] = {}

    def split(item):
        if isinstance(item, tuple):
            parts = [split(i) for i in item]
            return tuple(p[0] for p in parts), tuple(p[1] for p in parts)
        if isinstance(item, Derived):
            source, indices = wanted.get(id(item.source), (item.source, set()))
            wanted[id(item.source)] = (source, indices | {item.index})
            return None, item
        return item, None

    stacked, derived = split(tree)
    return stacked, derived, [(source, sorted(indices), source.outputs(sorted(indices)))
                              for source, indices in wanted.values()]


def _with_derived(stacked: Any, derived: Any, sources: list, inputs: tuple) -> Any:
    """One step's signals: the slice ``stacked`` of the stacked entries with the
    :class:`~.base.Derived` ones computed from the step's slice ``inputs`` of their
    sources' inputs (``sources`` from :func:`_split_derived`, one call each)."""
    values = {(id(source), index): value for (source, indices, outputs), step in zip(sources, inputs)
              for index, value in zip(indices, outputs(*step))}

    def merged(a, b):
        if isinstance(a, tuple) or isinstance(b, tuple):
            return tuple(merged(x, y) for x, y in zip(a, b))
        return values[id(b.source), b.index] if isinstance(b, Derived) else a

    return merged(stacked, derived)


def _structural(value: Any) -> Any:
    """``None`` (a structural zero) for a signal fixed at zero, else the signal."""
    return None if isinstance(value, Fixed) and value.fill == 0 else value


def _closure(nonzero: list[list[bool]]) -> list[list[bool]]:
    """Where a product of any number of matrices with the pattern ``nonzero`` (and the
    identity) can be nonzero."""
    states = len(nonzero)
    closed = [[i == j for j in range(states)] for i in range(states)]
    while True:
        grown = [[closed[i][j] or any(closed[i][m] and nonzero[m][j] for m in range(states))
                  for j in range(states)] for i in range(states)]
        if grown == closed:
            return closed
        closed = grown


def advance_trace(traces: jax.Array, X: jax.Array, D: jax.Array, Df: jax.Array) -> jax.Array:
    """One step of the trace: ``ε^t = D ε^{t-1} + Df ⊗ X`` (``traces (B, P, S, K, O)``)."""
    # Σ_r D[..., s, r] · trace[..., r] written out over the few states: XLA fuses
    # these products, where an einsum with a tiny contraction became a slow
    # batched matmul (3.5x slower per step on CPU, B=32, K=41, O=100, S=2).
    states = traces.shape[2]
    carried = jnp.stack([sum(D[:, :, None, :, s, r] * traces[:, :, r] for r in range(states))
                         for s in range(states)], axis=2)
    return (carried + X[:, :, None, :, None] * jnp.moveaxis(Df, -1, 2)[:, :, :, None, :]).astype(traces.dtype)


class DRTRL:
    """The D-RTRL rule (see the module docstring). ``sharded``: the traces are split
    over devices along the batch (``Trainer(mesh=...)``): the chunk's history sum over
    samples is then one contraction XLA splits per device, not a loop over samples
    (3x faster on one CPU, but it would gather the whole trace onto every device)."""

    name = "d_rtrl"

    #: :meth:`chunk` reads signals that are the same at every step as :class:`~.base.Fixed`
    #: (the engine then neither recomputes nor stacks them in its step loop).
    takes_fixed = True
    #: It also reads as :class:`~.base.Derived` the slabs the step makes elementwise from values
    #: of under half their bytes (a neuron's ``D`` from its states): the engine stacks those
    #: values and :meth:`chunk_group` computes the slabs again in its backward pass.
    takes_derived = True

    #: One more trace state per unit than the pair's own, which no other state depends
    #: on (e-prop's filtered eligibility ``ē``, ``eprop.EPropRule``); a pair's readout
    #: memory is counted in ``pair.num_states`` already.
    extra_state = False

    def __init__(self, sharded: bool = False, zeros: frozenset = frozenset(), stepwise: bool = False,
                 sparse: bool = True, entries: tuple | None = None):
        self.sharded = sharded
        self.zeros = frozenset(zeros)  # (s, r): D[..., s, r] is zero by construction
        self.stepwise = stepwise  # a small trace: advanced in the step loop on steps without loss
        self.sparse = sparse  # keep a sparse weight's trace at its nonzeros (False: always dense)
        self.entries = entries  # (k, o) of those nonzeros, once fitted to a pair (for_pair)

    def _replace(self, **changes) -> "DRTRL":
        """A copy with ``changes`` (of the same class: a subclass keeps its own fields)."""
        rule = copy.copy(self)
        vars(rule).update(changes)
        return rule

    def for_sharding(self) -> "DRTRL":
        """This rule for traces split over devices along the batch."""
        return self._replace(sharded=True)

    def _entries(self, pair: TracedPair) -> tuple | None:
        return pair.sparse_entries if self.sparse else None

    def for_pair(self, pair: TracedPair) -> "DRTRL":
        """This rule fitted to ``pair``: told which entries of its per-unit Jacobian are
        zero by construction, so the chunk skips their products (a readout memory's
        ``ē`` is reached by no other state, docs/theory.md §5.10, which leaves a third of
        an ALIF's ``3×3`` products out); and, for a trace of at most
        :data:`STEPWISE_NUMBERS` numbers per sample (a readout's), advanced inside the
        step loop on steps without loss, where XLA fuses it with the step (the chunk's
        own loop cost more than such a trace's whole update: the demo 31 → 28 ms)."""
        zeros = self.zeros
        extra = int(pair.readout_memory) + int(self.extra_state)  # ē states, the last ones
        if extra:  # no other state reads them, and each reads itself alone
            first, states = self._states(pair) - extra, self._states(pair)
            zeros = frozenset((s, r) for r in range(first, states) for s in range(states) if s != r)
        entries = self._entries(pair)
        stepwise = self._numbers(pair) <= STEPWISE_NUMBERS
        return self._replace(zeros=zeros, stepwise=stepwise, entries=entries)

    def _numbers(self, pair: TracedPair) -> int:
        """Trace numbers per sample."""
        entries = self._entries(pair)
        weights = pair.patch * pair.outputs if entries is None else len(entries[0])
        return pair.positions * weights * self._states(pair)

    def _states(self, pair: TracedPair) -> int:
        """``S``: trace states per unit."""
        return pair.num_states + int(self.extra_state)

    @property
    def advance_step(self):
        """``advance_step(traces, signals)``: the trace after one step without learning
        signal, from one step's :meth:`stack_form` signals — for a small trace only
        (``None`` otherwise: the engine then advances it per chunk)."""
        return self._advance_step if self.stepwise else None

    def _advance_step(self, traces: jax.Array, signals: PairSignals) -> jax.Array:
        X, D, Df = self.stack_form(signals)[:3]
        if self.entries is not None:
            k, o = self.entries
            shape, states = traces.shape, traces.shape[2]
            E = traces.reshape(shape[0] * shape[1], states, shape[3])
            new = [_total([_times(None if D[s][r] is None else D[s][r][:, o], E[:, r]) for r in range(states)]
                          + [X[:, k] * Df[s][:, o].astype(X.dtype)]) for s in range(states)]
            return jnp.stack(new, axis=1).reshape(shape).astype(traces.dtype)
        shape, states = traces.shape, traces.shape[2]
        E = traces.reshape(shape[0] * shape[1], states, shape[3], shape[4])
        new = [_total([_times(None if D[s][r] is None else D[s][r][:, None, :], E[:, r]) for r in range(states)]
                      + [X[:, :, None] * Df[s][:, None, :].astype(X.dtype)]) for s in range(states)]
        return jnp.stack(new, axis=1).reshape(shape).astype(traces.dtype)

    def init_traces(self, pair: TracedPair, batch: int, dtype: Any) -> jax.Array:
        entries = self._entries(pair)
        if entries is not None:
            return jnp.zeros((batch, pair.positions, self._states(pair), len(entries[0])), dtype)
        return jnp.zeros((batch, pair.positions, self._states(pair), pair.patch, pair.outputs), dtype)

    def trace_bytes(self, pair: TracedPair, batch: int, itemsize: int) -> int:
        return batch * self._numbers(pair) * itemsize

    def _scattered(self, values: jax.Array, K: int, O: int) -> jax.Array:
        """A sparse trace's per-entry gradient ``(N,)`` as the ``(K, O)`` gradient."""
        k, o = self.entries
        return jnp.zeros((K, O), values.dtype).at[k, o].add(values)

    def step(self, traces: jax.Array, signals: PairSignals, t: jax.Array) -> tuple[jax.Array, jax.Array]:
        X, D, Df, G, dY = signals[:5]
        if self.entries is not None:  # the canonical signals at each entry's input and unit
            k, o = self.entries
            states = traces.shape[2]
            D_n, Df_n = D[:, :, o], Df[:, :, o]
            carried = jnp.stack([sum(D_n[..., s, r] * traces[:, :, r] for r in range(states)) for s in range(states)],
                                axis=2)
            new = (carried + X[:, :, None, k] * jnp.moveaxis(Df_n, -1, 2)).astype(traces.dtype)
            grad = self._scattered(jnp.einsum("bpns,bpsn->n", G[:, :, o], traces), X.shape[-1], D.shape[2])
        else:
            new = advance_trace(traces, X, D, Df)
            grad = jnp.einsum("bpos,bpsko->ko", G, traces)
        if dY is not None:  # the one-step part
            grad = grad + jnp.einsum("bpk,bpo->ko", X, dY)
        return grad, new

    def stack_form(self, signals: PairSignals) -> PairSignals:
        """The signals as :meth:`chunk` reads them: every state axis split into slabs of
        shape ``(..., B·P, O)`` (``D[s][r]``, ``None`` where ``self.zeros`` says the entry
        is zero by construction; ``Df[s]``, ``G[s]``), ``X (..., B·P, K)``. The engine
        applies it to each step before stacking the chunk, so every stacked slab is
        contiguous: a chunk read ``(C, B, P, O, S, S)`` with a trailing ``S×S`` block
        through strided slices and shifted copies, which took most of its time (packing
        the slabs into one array per step made the chunk's loop read them slower)."""
        X, D, Df, G, dY = split_states(signals)[:5]

        def rows(value):  # (..., B, P, O) → (..., B·P, O)
            return None if value is None else value.reshape(*value.shape[:-3], -1, value.shape[-1])

        return signals._replace(
            X=rows(X), D=tuple(tuple(None if (s, r) in self.zeros else rows(d) for r, d in enumerate(row))
                               for s, row in enumerate(D)),
            Df=tuple(map(rows, Df)), G=None if G is None else tuple(map(rows, G)), dY=rows(dY))

    def chunk(self, traces: jax.Array, signals: PairSignals, t0: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The same over ``C`` steps at once (docs/theory.md §5.9), exactly: the trace is read
        and written once, the in-chunk part is one GEMM over ``C·B·P`` rows.

        With ``E_0`` the trace before the chunk and step ``r`` = 1..C, one backward pass
        from ``r = C`` carries ``λ_r`` (``λ_C = 0``, ``λ_{r-1} = G_r + D_rᵀ λ_r``) and the
        suffix product ``Π_r = D_C⋯D_{r+1}`` (``Π_C = I``, ``Π_{r-1} = Π_r D_r``); the
        chunk's gradient is ``Σ λ_0 ⊙ E_0 + Σ_r X_rᵀ (dY_r + Df_r·λ_r)`` and
        ``E_C = Π_0 E_0 + Σ_r (Π_r Df_r) ⊗ X_r`` — never a division (a hard reset has
        ``D = 0``). ``signals``: stacked in :meth:`stack_form` (canonical or split: converted).
        """
        return self.chunk_group([self], [traces], [signals], t0)[0]

    def joins_chunk_with(self, other) -> bool:
        """Pairs driving one hidden group whose rules are this one and ``other`` can run
        their chunks as one (:meth:`chunk_group`): the same rule, the same pattern of
        zeros in ``D``, the same placement."""
        return type(other) is type(self) and other.zeros == self.zeros and other.sharded == self.sharded

    def chunk_group(self, rules: list, traces: list, signals: list, t0: jax.Array) -> list[tuple]:
        """:meth:`chunk` for pairs that drive one hidden group (``rules``, one per pair,
        each :meth:`joins_chunk_with` this one; the first is this one), as
        ``[(gradient, new trace)]`` per pair. ``λ`` and the suffix products ``Π`` depend
        only on the group's ``D`` and ``G``, which every pair reads alike (they are read
        from the first pair's signals): one backward pass carries them for all, each
        pair's reach ``Π_r Df_r`` and signal ``dY_r + Df_r·λ_r`` made in the same pass.
        A pass per pair read the group's ``D`` and ``G`` and multiplied the suffix
        products once per pair: an LSTM's four gates, four passes a chunk (LSTM(64 → 128)
        + Linear(10), B = 16, T = 200, loss at every step: 1.40 → 1.28× BPTT, alternated
        in one process, 2026-11-26)."""
        signals = [s if isinstance(s.Df, tuple) and getattr(s.Df[0], "ndim", 3) != 4 else rule.stack_form(s)
                   for rule, s in zip(rules, signals)]
        # Signals the engine found to be the same at every step (Fixed) are closed over,
        # not scanned; one fixed at zero is a structural zero (LIF's ∂a/∂x, say), one
        # fixed at one (∂V/∂x) a product XLA leaves out.
        D = tuple(tuple(map(_structural, row)) for row in signals[0].D)
        G = signals[0].G
        Dfs = tuple(tuple(map(_structural, s.Df)) for s in signals)
        dYs = tuple(s.dY for s in signals)
        (D, Dfs, G, dYs), (D_fixed, Dfs_fixed, G_fixed, dYs_fixed) = _split_fixed((D, Dfs, G, dYs))
        X0 = signals[0].X
        steps = X0.steps if isinstance(X0, Fixed) else X0.shape[0]
        a_slab = next(iter(jax.tree.leaves((Dfs, Dfs_fixed, D, D_fixed))))  # (..., rows, O)
        states = traces[0].shape[2]
        rows, O = traces[0].shape[0] * traces[0].shape[1], a_slab.shape[-1]  # rows: samples × positions
        S = range(states)
        # Per-unit S×S matrices are nested lists of (rows, O) slabs; entries of D that
        # are zero by construction are None and their products are skipped, the suffix
        # products keeping the closure of that pattern.
        closed = _closure([[_merged(D[s][r], D_fixed[s][r]) is not None for r in S] for s in S])
        one, zero = jnp.ones((rows, O), a_slab.dtype), jnp.zeros((rows, O), a_slab.dtype)
        identity = [[(one if i == j else zero) if closed[i][j] else None for j in S] for i in S]

        def filled(value):  # an entry the pattern allows but no product reached yet
            return zero if value is None else value

        def times(suffix, D_r):  # Π_r D_r
            return [[filled(_total(_times(suffix[i][m], D_r[m][j]) for m in S)) if closed[i][j] else None
                     for j in S] for i in S]

        def reached(suffix, Df_r):  # Π_r Df_r per state
            return [filled(_total(_times(suffix[i][m], Df_r[m]) for m in S)) for i in S]

        # Signals the step loop did not stack (Derived) are computed again from what it
        # stacked instead, at each step of the backward pass.
        (G, D, Dfs, dYs), derived, sources = _split_derived((G, D, Dfs, dYs))  # in the scans' order
        source_inputs = tuple(source.inputs for source, _, _ in sources)

        if G is None:  # no learning signal in the chunk: advance the traces only
            def carry_only(suffix, inputs):
                inputs, from_sources = inputs
                D_r, Dfs_r = _merged(_with_derived(inputs, derived[1:3], sources, from_sources), (D_fixed, Dfs_fixed))
                return times(suffix, D_r), [reached(suffix, Df_r) for Df_r in Dfs_r]

            decay, reach = lax.scan(carry_only, identity, ((D, Dfs), source_inputs), reverse=True, length=steps)
            mu, signal = None, [None] * len(rules)
        else:
            def back(carry, inputs):
                lam, suffix = carry  # λ_r and Π_r
                inputs, from_sources = inputs
                inputs = _with_derived(inputs, derived, sources, from_sources)
                G_r, D_r, Dfs_r, dYs_r = _merged(inputs, (G_fixed, D_fixed, Dfs_fixed, dYs_fixed))
                signal = [filled(_total([_times(Df_r[s], lam[s]) for s in S] + [dY_r]))
                          for Df_r, dY_r in zip(Dfs_r, dYs_r)]
                lam = [_total([G_r[j]] + [_times(D_r[i][j], lam[i]) for i in S]) for j in S]  # G + Dᵀ λ
                return (lam, times(suffix, D_r)), ([reached(suffix, Df_r) for Df_r in Dfs_r], signal)

            (mu, decay), (reach, signal) = lax.scan(back, ([zero] * states, identity),
                                                     ((G, D, Dfs, dYs), source_inputs), reverse=True, length=steps)
        return [rule._finish(trace, s.X, steps, mu, decay, reach_n, signal_n)
                for rule, trace, s, reach_n, signal_n in zip(rules, traces, signals, reach, signal)]

    def _finish(self, traces, X, steps, mu, decay, reach, signal) -> tuple[jax.Array, jax.Array]:
        """One pair's gradient and trace after a chunk from the backward pass of
        :meth:`chunk_group` (``mu`` ``λ_0`` and ``signal`` ``None`` without a learning
        signal)."""
        if isinstance(X, Fixed):
            X = jnp.broadcast_to(X.value, (steps, *X.value.shape))
        shape, dtype, states = traces.shape, traces.dtype, traces.shape[2]
        rows, K, O = shape[0] * shape[1], X.shape[-1], reach[0].shape[-1]
        S = range(states)
        grad = None if signal is None else gram(X, signal.astype(X.dtype), merge=not self.sharded)
        if self.entries is not None:  # the same at the sparse weight's entries only
            k, o = self.entries
            E = traces.reshape(rows, states, -1)
            E = [E[:, s] for s in S]
            # Σ_r X_r[:, k] ⊙ (Π_r Df_r)[:, o], one step at a time: gathered for the whole
            # chunk at once, these (C, rows, N) arrays took more memory than a dense trace.
            def gathered(total, inputs):
                X_r, reach_r = inputs
                return [total[s] + X_r[:, k] * reach_r[s][:, o].astype(X.dtype) for s in S], None

            reached_in, _ = lax.scan(gathered, [jnp.zeros((rows, len(k)), X.dtype) for _ in S], (X, reach))
            new = [_total([_times(None if decay[s][r] is None else decay[s][r][:, o], E[r]) for r in S]
                          + [reached_in[s]]) for s in S]
            new = jnp.stack(new, axis=1).reshape(shape).astype(dtype)
            if grad is None:
                return None, new
            history = sum(jnp.sum(mu[s][:, o] * E[s], axis=0) for s in S)
            return grad + self._scattered(history.astype(grad.dtype), K, O), new
        E = traces.reshape(rows, states, K, O)
        E = [E[:, s] for s in S]
        # E_C per state: the trace carried by Π_0, plus one (K×C)(C×O) GEMM per row.
        new = [_total([_times(None if decay[s][r] is None else decay[s][r][:, None, :], E[r]) for r in S]
                      + [jnp.einsum("cnk,cno->nko", X, reach[s].astype(X.dtype))]) for s in S]
        new = (new[0][:, None] if states == 1 else jnp.stack(new, axis=1)).reshape(shape).astype(dtype)
        if grad is None:
            return None, new
        # Σ_n μ[n] ⊙ E[n] as a loop over rows: a reduce over the leading axis of the
        # trace ran ~9x slower on CPU.
        if self.sharded:  # a sum over the (split) samples: partial sums per device, then one all-reduce
            history = sum(jnp.einsum("no,nko->ko", mu[s], E[s]) for s in S).astype(dtype)
        else:
            total = jnp.promote_types(dtype, mu[0].dtype)  # bfloat16 traces: summed at the signals' float32
            history = lax.fori_loop(0, rows, lambda n, acc: acc + sum(mu[s][n][None, :] * E[s][n] for s in S
                                                                      ).astype(total), jnp.zeros((K, O), total))
        return grad + history.astype(grad.dtype), new

    def advance(self, traces: jax.Array, signals: PairSignals, t0: jax.Array) -> jax.Array:
        """The trace after a chunk without learning signal (``G`` is ``None``)."""
        return self.chunk(traces, signals, t0)[1]

    def trace_norm(self, traces: jax.Array, t: jax.Array) -> jax.Array:
        return sample_norm(traces)

"""ES-D-RTRL (docs/theory.md §5.2): exponentially smoothed, factorised traces.

    ε_x^t = α ε_x^{t-1} + X^t
    ε_f^t = D^t ε_f^{t-1} + (1 − α) Df^t          (D over the state axis)
    ∂L^t/∂W[k,o] ≈ Σ_{b,p} X[b,p,k]^t dY[b,p,o]^t
                   + Σ_{b,p} ε_x[b,p,k]^{t-1} Σ_s G[b,p,o,s]^t ε_f[b,p,o,s]^{t-1} / (1 − α^t)

with ``G = ∂L^t/∂h^{t-1}``, ``dY = ∂L^t/∂y^t`` (docs/theory.md §5.8): the first sum is the exact
one-step part, the second (the history) is zero at ``t = 0``. Memory ``B·P·(K + O·S)``: ``ε_x``
``(B, P, K)`` and ``ε_f`` ``(B, P, S, O)``, each state's slab contiguous. Exact at ``t = 0``
and, at every step, on a leaky linear integrator whose Jacobian is the constant ``α``.

The engine runs the rule inside its step loop: ``step_rows`` advances both traces and
keeps each step's ``ε_x^{t-1}`` and one signal row; ``finish_rows`` turns a chunk of them
into one GEMM over ``C·B·P`` rows (BPTT's size). ``step`` is the same math one step at a
time (the reference the tests hold the chunked form to).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ..errors import ConfigError
from .base import PairSignals, TracedPair, gram, sample_norm, split_states

__all__ = ["ESDRTRL", "resolve_decay"]


def resolve_decay(decay: float | None, rank: int | None, default: float = 0.9) -> float:
    """``α`` from ``decay`` (in [0, 1)) or ``rank`` r (α = (r − 1)/(r + 1)); ``default``
    when neither is given. Both given, or out of range: :class:`ConfigError`."""
    if decay is not None and rank is not None:
        raise ConfigError(f"give decay or rank, not both (got decay={decay}, rank={rank})")
    if rank is not None:
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
            raise ConfigError(f"rank must be a positive int, got {rank!r}")
        return (rank - 1) / (rank + 1)
    if decay is None:
        return default
    try:
        value = float(decay)
    except (TypeError, ValueError):
        value = None
    if value is None or isinstance(decay, bool) or not 0.0 <= value < 1.0:
        raise ConfigError(f"decay must be a number in [0, 1), got {decay!r}")
    return value


class ESDRTRL:
    """The ES-D-RTRL rule with smoothing factor ``alpha`` (see the module docstring)."""

    name = "esd_rtrl"

    def __init__(self, alpha: float, sharded: bool = False):
        self.alpha = float(alpha)
        self.sharded = sharded  # the traces split over devices along the batch (base.gram's merge)

    def for_sharding(self) -> "ESDRTRL":
        """This rule for traces split over devices along the batch."""
        return type(self)(self.alpha, sharded=True)

    def init_traces(self, pair: TracedPair, batch: int, dtype: Any) -> tuple[jax.Array, jax.Array]:
        return (
            jnp.zeros((batch, pair.positions, pair.patch), dtype),
            jnp.zeros((batch, pair.positions, pair.num_states, pair.outputs), dtype),
        )

    def trace_bytes(self, pair: TracedPair, batch: int, itemsize: int) -> int:
        return batch * pair.positions * (pair.patch + pair.outputs * pair.num_states) * itemsize

    def shares_with(self, other) -> bool:
        """Pairs of this rule and ``other`` that read the same ``X`` can run as one
        (:meth:`joined`): same rule, same ``α``, same placement."""
        return type(other) is type(self) and other.alpha == self.alpha and other.sharded == self.sharded

    def joined(self, sizes: list[int]) -> "JoinedRows":
        """This rule over pairs that read the same ``X`` with ``sizes`` outputs each, as
        the engine's step loop runs them (:class:`JoinedRows`)."""
        return JoinedRows(self, sizes)

    def row_bytes(self, pair: TracedPair, batch: int, itemsize: int) -> int:
        """Bytes per step of what the engine stacks over a chunk for this rule: the rows
        of :meth:`step_rows` (``ε_x`` and one signal row), whatever the number of states.
        Budgeted as D-RTRL's signals (``D``, ``Df``, ``G`` per state), an LSTM's four
        gates (two states) got chunks of 25 steps instead of 100: ES-D-RTRL on
        LSTM(64 → 128) + Linear(10), B = 16, T = 200, loss at every step, 0.648 → 0.591×
        BPTT (chunks of 25 against 100 alternated in one process, 2026-11-26)."""
        return batch * pair.positions * (pair.patch + pair.outputs) * itemsize

    def step(self, traces, signals: PairSignals, t: jax.Array):
        X, G, dY = signals.X, signals.G, signals.dY
        eps_x, eps_f = traces
        history = self._history(G, eps_f, t)
        if dY is None:
            grad = jnp.einsum("bpk,bpo->ko", eps_x, history)
        else:  # one GEMM for both parts: [X; ε_x]ᵀ [dY; history], inner dimension 2·B·P
            grad = jnp.einsum("bpk,bpo->ko", jnp.concatenate([X, eps_x.astype(X.dtype)]),
                              jnp.concatenate([dY, history.astype(dY.dtype)]))
        return grad, self.advance_step(traces, signals)

    def _history(self, G, eps_f, t):
        """``Σ_s G ε_f^{t-1} / (1 − α^t)``: the traces of step t-1 stand for ε^{t-1} with
        the bias correction 1 − α^t; at t = 0 they are zero and so is the history part
        (no division by zero). ``G``: split per state (a tuple of ``(B, P, O)``) or
        canonical ``(B, P, O, S)``; ``t``: a scalar."""
        G = G if isinstance(G, tuple) else tuple(G[..., s] for s in range(G.shape[-1]))
        dtype = jnp.promote_types(G[0].dtype, jnp.float32)
        correction = 1.0 - jnp.asarray(self.alpha, dtype) ** jnp.maximum(jnp.asarray(t).astype(dtype), 1.0)
        return sum(g * eps_f[:, :, s] for s, g in enumerate(G)) / correction

    def stack_form(self, signals: PairSignals) -> PairSignals:
        """The signals as the engine hands them to :meth:`step_rows` and
        :meth:`advance_step`: split per state (``base.split_states``), so each state's
        ``ε_f`` is advanced on whole ``(B, P, O)`` slabs and an entry of ``D`` that is
        zero by construction costs nothing (a trailing ``S×S`` block of ``D`` took most
        of the step loop's time on CPU: it is written and read through strided slices)."""
        return split_states(signals)

    def begin_rows(self, traces):
        """The state :meth:`step_rows` carries over a chunk: the traces and the previous
        step's ``dY`` (zero at the chunk's start; it meets ``ε_x`` one step later)."""
        eps_x, eps_f = traces
        dtype = jnp.promote_types(eps_f.dtype, jnp.float32)
        return eps_x, eps_f, jnp.zeros(eps_f[:, :, 0].shape, dtype)

    def step_rows(self, inner, signals: PairSignals, t: jax.Array):
        """One step inside the engine's step loop (steps with a loss): both traces
        advanced, and the step's rows ``(ε_x^{t-1}, dY^{t-1} + h^t − α dY^t)`` with ``h^t``
        the history signal ``Σ_s G ε_f^{t-1} / (1 − α^t)``. No buffers of ``D``, ``Df``,
        ``G``, no second loop over them, and no reverse filter (:meth:`finish_rows`).

        Why these rows: with ``e_j`` the ``ε_x`` before step ``j`` of a chunk, the chunk's
        gradient is ``Σ_j X_jᵀ dY_j + e_jᵀ h_j``, and ``X_j = e_{j+1} − α e_j``, so it
        regroups exactly into ``Σ_j e_jᵀ (dY_{j−1} + h_j − α dY_j) + e_Cᵀ dY_{C−1}``
        (``dY_{−1}`` = 0): each row of ``ε_x`` meets one signal row, in the order the
        step loop makes them."""
        G, dY = signals.G, signals.dY
        eps_x, eps_f, dY_prev = inner
        signal = self._history(G, eps_f, t).astype(dY_prev.dtype) + dY_prev
        if dY is not None:  # this pair takes its relation's one-step part
            dY = dY.astype(dY_prev.dtype)
            signal, dY_prev = signal - self.alpha * dY, dY
        eps_x_new, eps_f_new = self.advance_step((eps_x, eps_f), signals)
        return (eps_x, signal), (eps_x_new, eps_f_new, dY_prev)

    def finish_rows(self, inner, rows):
        """The chunk's gradient and final traces from :meth:`step_rows`' rows stacked over
        it (leading axis ``C``) and its carried state after the last step: one GEMM over
        ``C·B·P`` rows (BPTT's size; the traces at the chunk's start are its first
        rows) and one over ``B·P`` for the last step's ``dY``.

        Measured 2026-11-26 against the form it replaced (rows ``X``, history, ``dY``;
        ``ε_x`` advanced once per chunk; the history filtered by a reverse scan over the
        chunk, ``h̃_j = Σ_{i>j} α^{i−1−j} h_i``, before the GEMM), H = 128, B = 16,
        T = 200, loss at every step, alternated in one process: GRU 0.687 → 0.659×
        BPTT, feed-forward LIF 0.896 → 0.792×, RLIF 0.741 → 0.732×; the GRU's temp
        memory 11.0 → 7.9 MiB."""
        E, R = rows
        eps_x, eps_f, dY_last = inner
        dtype = jnp.promote_types(R.dtype, jnp.float32)
        merge = not self.sharded
        grad = gram(E, R.astype(E.dtype), merge) + gram(eps_x.astype(dtype), dY_last, merge)
        return grad, (eps_x, eps_f)

    def advance_step(self, traces, signals: PairSignals):
        """The traces after one step without learning signal: a few elementwise ops,
        which the engine runs inside its step loop (fused with the step) instead of a
        second loop over the chunk's stacked signals."""
        X, D, Df = split_states(signals)[:3]
        eps_x, eps_f = traces
        states = range(len(Df))
        new = [sum((D[s][r] * eps_f[:, :, r] for r in states if D[s][r] is not None), (1.0 - self.alpha) * Df[s])
               for s in states]
        return ((self.alpha * eps_x + X).astype(eps_x.dtype), jnp.stack(new, axis=2).astype(eps_f.dtype))

    def trace_norm(self, traces, t: jax.Array) -> jax.Array:
        """The norm of ``eps_x ⊗ eps_f`` (bias-corrected, as the gradient uses it)."""
        eps_x, eps_f = traces  # (B, P, K) and (B, P, S, O): |ε_x ⊗ ε_f| = |ε_x| |ε_f| per patch
        pairs = jax.vmap(sample_norm, in_axes=1, out_axes=1)
        norm = sample_norm(pairs(eps_x) * pairs(eps_f))
        correction = 1.0 - jnp.asarray(self.alpha, norm.dtype) ** jnp.maximum(t.astype(norm.dtype), 1.0)
        return norm / correction


class JoinedRows:
    """ES-D-RTRL over pairs whose dense ops read the same ``X`` (an LSTM's four gates on
    ``[x, h]``), in the engine's step loop: one ``ε_x`` carried (the pairs' are the same
    filtered input) and one row of it stacked per step; each pair's ``ε_f``, history and
    signal row its own, the signal rows side by side; one GEMM per chunk, whose columns
    are the pairs' gradients. The states the engine carries: ``start`` →
    ``(ε_x, (ε_f, ...))``, ``begin_rows`` adds the previous ``dY`` per pair.

    ES-D-RTRL on LSTM(64 → 128) + Linear(10), T = 200, alternated in one process with
    the pairs run one by one (2026-11-26): B = 16, loss at every step, 0.554 → 0.507×
    BPTT and temp 9.8 → 6.3 MiB; at the last step only 0.235 → 0.223×; B = 64 0.720 →
    0.642×."""

    def __init__(self, rule: ESDRTRL, sizes: list[int]):
        self.rule, self.sizes = rule, list(sizes)

    def row_bytes(self, pairs: list, batch: int, itemsize: int) -> int:
        """Bytes per step stacked for the pairs: one row of ``ε_x``, their signal rows."""
        return batch * pairs[0].positions * (pairs[0].patch + sum(p.outputs for p in pairs)) * itemsize

    def start(self, traces: list) -> tuple:
        return traces[0][0], tuple(eps_f for _, eps_f in traces)

    def traces(self, state) -> list:
        eps_x, eps_fs = state[:2]
        return [(eps_x, eps_f) for eps_f in eps_fs]

    def advance_step(self, state, signals: list):
        eps_x, eps_fs = state
        new = [self.rule.advance_step((eps_x, eps_f), s) for eps_f, s in zip(eps_fs, signals)]
        return new[0][0], tuple(eps_f for _, eps_f in new)

    def begin_rows(self, state):
        eps_x, eps_fs = state
        return eps_x, eps_fs, tuple(self.rule.begin_rows((eps_x, eps_f))[2] for eps_f in eps_fs)

    def step_rows(self, inner, signals: list, t: jax.Array):
        eps_x, eps_fs, previous = inner
        out = [self.rule.step_rows((eps_x, eps_f, dY), s, t) for eps_f, dY, s in zip(eps_fs, previous, signals)]
        rows = (out[0][0][0], jnp.concatenate([signal for (_, signal), _ in out], axis=-1))
        # each pair's ε_x advance is the same expression of the same values (XLA computes it once)
        return rows, (out[0][1][0], tuple(new[1] for _, new in out), tuple(new[2] for _, new in out))

    def finish_rows(self, inner, rows) -> tuple[list, tuple]:
        """Per pair its gradient ``(K, O)``, and the state after the chunk (for :meth:`traces`)."""
        eps_x, eps_fs, previous = inner
        grad, _ = self.rule.finish_rows((eps_x, eps_fs[0], jnp.concatenate(previous, axis=-1)), rows)
        bounds = [sum(self.sizes[:n]) for n in range(1, len(self.sizes))]
        return jnp.split(grad, bounds, axis=-1), (eps_x, eps_fs)

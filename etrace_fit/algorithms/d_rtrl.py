"""D-RTRL (DESIGN.md §5.1): the diagonal RTRL trace, the size of the weight.

    ε[b,p,k,o,s]^t = Σ_s' D[b,p,o,s,s']^t ε[b,p,k,o,s']^{t-1} + Df[b,p,o,s]^t X[b,p,k]^t
    ∂L^t/∂W[k,o] ≈ Σ_{b,p} X[b,p,k]^t dY[b,p,o]^t + Σ_{b,p,s} G[b,p,o,s]^t ε[b,p,k,o,s]^{t-1}

with ``G = ∂L^t/∂h^{t-1}`` and ``dY = ∂L^t/∂y^t`` (DESIGN.md §5.8: the first sum is the
exact one-step part). Exact (equal to BPTT) for weights into a layer whose only
recurrence is per unit and whose influence on later losses runs only through its own
hidden group, whatever the output reads. Memory ``B·P·K·O·S``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .base import PairSignals, TracedPair

__all__ = ["DRTRL"]


def _apply(M: jax.Array, v: jax.Array) -> jax.Array:
    """``M v`` per unit: ``M (..., S, S)``, ``v (..., S)``."""
    return sum(M[..., :, r] * v[..., None, r] for r in range(v.shape[-1]))


def _transpose_apply(M: jax.Array, v: jax.Array) -> jax.Array:
    """``Mᵀ v`` per unit."""
    return sum(M[..., r, :] * v[..., r, None] for r in range(v.shape[-1]))


def _matmul(A: jax.Array, M: jax.Array) -> jax.Array:
    """``A M`` per unit (written out over the few states: it fuses)."""
    return sum(A[..., :, r, None] * M[..., None, r, :] for r in range(M.shape[-1]))


class DRTRL:
    """The D-RTRL rule (see the module docstring)."""

    name = "d_rtrl"

    def init_traces(self, pair: TracedPair, batch: int, dtype: Any) -> jax.Array:
        return jnp.zeros((batch, pair.positions, pair.patch, pair.outputs, pair.num_states), dtype)

    def trace_bytes(self, pair: TracedPair, batch: int, itemsize: int) -> int:
        return batch * pair.positions * pair.patch * pair.outputs * pair.num_states * itemsize

    def step(self, traces: jax.Array, signals: PairSignals, t: jax.Array) -> tuple[jax.Array, jax.Array]:
        X, D, Df, G, dY = signals
        dtype = traces.dtype
        # Σ_r D[..., s, r] · trace[..., r] written out over the few states: XLA fuses
        # these products, where an einsum with a tiny contraction became a slow
        # batched matmul (3.5x slower per step on CPU, B=32, K=41, O=100, S=2).
        carried = sum(D[:, :, None, :, :, r] * traces[:, :, :, :, None, r] for r in range(traces.shape[-1]))
        new = (carried + X[:, :, :, None, None] * Df[:, :, None, :, :]).astype(dtype)
        grad = jnp.einsum("bpos,bpkos->ko", G, traces)
        if dY is not None:  # the one-step part
            grad = grad + jnp.einsum("bpk,bpo->ko", X, dY)
        return grad, new

    def chunk(self, traces: jax.Array, signals: PairSignals, t0: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The same over ``C`` steps at once (DESIGN.md §5.9), exactly: the trace is read
        and written once, the in-chunk part is one GEMM over ``C·B·P`` rows.

        With ``E_0`` the trace before the chunk and step ``r`` = 1..C,
        ``λ_C = 0, λ_r = G_{r+1} + D_{r+1}ᵀ λ_{r+1}`` (backward, per unit),
        ``μ = G_1 + D_1ᵀ λ_1``; the chunk's gradient is ``Σ μ ⊙ E_0 + Σ_r X_rᵀ (dY_r + Df_r·λ_r)``
        and ``E_C = (D_C⋯D_1) E_0 + Σ_r (D_C⋯D_{r+1} Df_r) ⊗ X_r``. Suffix products come
        from a reverse scan, never a division (a hard reset has ``D = 0``).
        """
        X, D, Df, G, dY = signals
        shape, dtype, states = traces.shape, traces.dtype, traces.shape[-1]
        C, rows = X.shape[0], shape[0] * shape[1]  # rows: samples × positions
        # Views without the singleton axes (free reshapes): a (B, 1, K, O, 1) trace made
        # XLA transpose all of it.
        X = X.reshape(C, rows, X.shape[-1])
        D, Df, G = (v.reshape(C, rows, *v.shape[3:]) for v in (D, Df, G))
        eye = jnp.broadcast_to(jnp.eye(states, dtype=D.dtype), D.shape[1:])
        shifted_G = jnp.concatenate([G[1:], jnp.zeros_like(G[:1])])
        shifted_D = jnp.concatenate([D[1:], eye[None]])

        def back(carry, inputs):
            lam, suffix = carry  # λ_{r+1} and D_C⋯D_{r+2}
            G_next, D_next, Df_r = inputs
            lam = G_next + _transpose_apply(D_next, lam)
            suffix = _matmul(suffix, D_next)  # D_C⋯D_{r+1}
            return (lam, suffix), (lam, _apply(suffix, Df_r))

        (lam_1, suffix_1), (lam, reach) = lax.scan(back, (jnp.zeros_like(G[0]), eye), (shifted_G, shifted_D, Df),
                                                    reverse=True)
        mu = G[0] + _transpose_apply(D[0], lam_1)  # (rows, O, S)
        decay = _matmul(suffix_1, D[0])  # D_C⋯D_1
        signal = (Df * lam).sum(axis=-1)
        if dY is not None:  # the one-step part, in the same GEMM
            signal = signal + dY.reshape(C, rows, -1)
        grad = jnp.einsum("cnk,cno->ko", X, signal.astype(X.dtype))
        E = traces.reshape(rows, *shape[2:4]) if states == 1 else traces.reshape(rows, *shape[2:])
        reach = reach.astype(X.dtype)
        if states == 1:
            mu, decay, reach = mu[..., 0], decay[..., 0, 0], reach[..., 0]
            # Σ_n μ[n] ⊙ E[n] as a loop over rows: a reduce over the leading axis of the
            # trace ran ~9x slower on CPU.
            history = lax.fori_loop(0, rows, lambda n, acc: acc + mu[n][None, :] * E[n],
                                    jnp.zeros(E.shape[1:], E.dtype))
            new = decay[:, None, :] * E + jnp.einsum("cnk,cno->nko", X, reach)
        else:
            history = lax.fori_loop(0, rows, lambda n, acc: acc + (mu[n][None] * E[n]).sum(axis=-1),
                                    jnp.zeros(E.shape[1:3], E.dtype))
            carried = sum(decay[:, None, :, :, r] * E[..., None, r] for r in range(states))
            new = carried + jnp.einsum("cnk,cnos->nkos", X, reach)
        return grad + history.astype(grad.dtype), new.reshape(shape).astype(dtype)

    def trace_norm(self, traces: jax.Array, t: jax.Array) -> jax.Array:
        squares = jnp.square(traces.astype(jnp.promote_types(traces.dtype, jnp.float32)))
        return jnp.sqrt(squares.reshape(squares.shape[0], -1).sum(axis=1))

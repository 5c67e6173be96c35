"""D-RTRL (DESIGN.md §5.1): the diagonal RTRL trace, the size of the weight.

    ε[b,p,k,o,s]^t = Σ_s' D[b,p,o,s,s']^t ε[b,p,k,o,s']^{t-1} + Df[b,p,o,s]^t X[b,p,k]^t
    ∂L^t/∂W[k,o] ≈ Σ_{b,p,s} G[b,p,o,s]^t ε[b,p,k,o,s]^t

Exact (equal to BPTT) for weights into a layer whose only recurrence is per unit and
that a stateless layer reads out. Memory ``B·P·K·O·S``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from .base import PairSignals, TracedPair

__all__ = ["DRTRL"]


class DRTRL:
    """The D-RTRL rule (see the module docstring)."""

    name = "d_rtrl"

    def init_traces(self, pair: TracedPair, batch: int, dtype: Any) -> jax.Array:
        return jnp.zeros((batch, pair.positions, pair.patch, pair.outputs, pair.num_states), dtype)

    def trace_bytes(self, pair: TracedPair, batch: int, itemsize: int) -> int:
        return batch * pair.positions * pair.patch * pair.outputs * pair.num_states * itemsize

    def step(self, traces: jax.Array, signals: PairSignals, t: jax.Array) -> tuple[jax.Array, jax.Array]:
        X, D, Df, G = signals
        dtype = traces.dtype
        if traces.shape[-1] == 1:  # S = 1: the Jacobian is an elementwise factor
            carried = D[:, :, None, :, 0, :] * traces
        else:
            carried = jnp.einsum("bposr,bpkor->bpkos", D, traces)
        new = (carried + X[:, :, :, None, None] * Df[:, :, None, :, :]).astype(dtype)
        grad = jnp.einsum("bpos,bpkos->ko", G, new)
        return grad, new

"""Hashable weight functions for the ``weight_fn`` argument of the ETP ops.

Each is a frozen value: two layers built with equal arguments share jit caches, and
the compiler can print what constrains a weight. They receive the weight's mantissa.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Chain", "Masked", "Positive", "SignConstrained", "Standardized"]


@dataclasses.dataclass(frozen=True, eq=False)
class Masked:
    """``w * mask``: connections where ``mask`` is 0 stay absent and get no gradient.

    ``mask`` is a concrete array (numpy or jax) broadcastable to the weight.
    """

    mask: np.ndarray

    def __post_init__(self):
        object.__setattr__(self, "mask", np.asarray(self.mask))

    def __call__(self, w: jax.Array) -> jax.Array:
        return w * jnp.asarray(self.mask, dtype=w.dtype)

    # Masks are compared by value so that equal layers share compiled code.
    def __eq__(self, other):
        return isinstance(other, Masked) and self.mask.shape == other.mask.shape and bool(
            np.array_equal(self.mask, other.mask)
        )

    def __hash__(self):
        return hash((Masked, self.mask.shape, self.mask.tobytes()))


@dataclasses.dataclass(frozen=True)
class Positive:
    """``|w|``: a non-negative (e.g. Dale's-law excitatory) weight."""

    def __call__(self, w: jax.Array) -> jax.Array:
        return jnp.abs(w)


@dataclasses.dataclass(frozen=True, eq=False)
class SignConstrained:
    """``|w| * sign``: each row (presynaptic unit) keeps the sign given in ``signs``.

    ``signs`` is an ``(I,)`` or ``(I, O)`` array of ``+1`` / ``-1`` (Dale's law).
    """

    signs: np.ndarray

    def __post_init__(self):
        object.__setattr__(self, "signs", np.asarray(self.signs))

    def __call__(self, w: jax.Array) -> jax.Array:
        signs = jnp.asarray(self.signs, dtype=w.dtype)
        return jnp.abs(w) * (signs[:, None] if signs.ndim == 1 else signs)

    def __eq__(self, other):
        return isinstance(other, SignConstrained) and self.signs.shape == other.signs.shape and bool(
            np.array_equal(self.signs, other.signs)
        )

    def __hash__(self):
        return hash((SignConstrained, self.signs.shape, self.signs.tobytes()))


@dataclasses.dataclass(frozen=True)
class Standardized:
    """Weight standardisation (Qiao et al. 2019): each output unit's incoming weights
    (every axis but the last: the kernel and the input channels of a conv) shifted to
    zero mean and scaled to unit variance, ``(w − mean) / √(var + eps)``. The gradient
    flows through the statistics (they are part of the weight function)."""

    eps: float = 1e-5

    def __call__(self, w: jax.Array) -> jax.Array:
        axes = tuple(range(w.ndim - 1))
        mean = jnp.mean(w, axis=axes, keepdims=True)
        var = jnp.var(w, axis=axes, keepdims=True)
        return (w - mean) * jax.lax.rsqrt(var + self.eps)


@dataclasses.dataclass(frozen=True)
class Chain:
    """Applies ``fns`` in order (``Chain((f, g))(w) == g(f(w))``)."""

    fns: tuple[Callable[[jax.Array], jax.Array], ...]

    def __call__(self, w: jax.Array) -> jax.Array:
        for fn in self.fns:
            w = fn(w)
        return w

"""Dropout, with its random key carried as model state.

In training (``fit``, ``ef.compile``, ``sequence_grad``: every program that learns)
each call draws a fresh mask per element, so per sample and per step; in evaluation
and prediction it is the identity, as Keras' ``Dropout`` is. The key lives in the
layer (a ``DropoutKey`` state): the Trainer carries it from batch to batch and saves it
in checkpoints, so a resumed run draws the masks the uninterrupted run would have, and
the same seed gives the same run. Resetting hidden states does not reset the key.

The mask is data to the online rules: the step's derivatives are taken at the mask
drawn for that step, so D-RTRL stays exact where the recurrence is elementwise.
"""

from __future__ import annotations

from typing import Any

import brainstate
import jax
import jax.numpy as jnp

from ..errors import ConfigError
from .base import training

__all__ = ["Dropout", "DropoutKey", "training"]


class DropoutKey(brainstate.LongTermState):
    """A dropout layer's ``uint32 (2,)`` random key: a long-term state, carried across
    batches (not reset) and saved in checkpoints (``Trainer.save``)."""


class Dropout(brainstate.nn.Module):
    """Keras' ``Dropout(rate)``: in training each element is zeroed with probability
    ``rate`` and the others are scaled by ``1 / (1 − rate)``; in evaluation ``y = x``.

    Shapes: ``x: (B, ...)`` → same.

    Args:
        rate: the fraction dropped, in ``[0, 1)``.
        seed: the key's seed; ``None`` takes one from ``brainstate.random`` (so
            ``brainstate.random.seed(s)`` before building the model fixes the run).
        broadcast_dims: axes that share one mask value (Keras' ``noise_shape`` with
            ones there), e.g. ``(1, 2)`` on ``(B, H, W, C)`` drops whole channels.

    Example::

        model = ef.Sequential(Linear(40, 128), LIF(128), Dropout(0.2), LeakyRateReadout(128, 2))
    """

    def __init__(self, rate: float, *, seed: int | None = None, broadcast_dims: tuple[int, ...] = (),
                 name: str | None = None):
        super().__init__(name=name)
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= float(rate) < 1.0:
            raise ConfigError(f"Dropout: rate must be a number in [0, 1), got {rate!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigError(f"Dropout({rate}): seed must be an int or None, got {seed!r}")
        dims = tuple(broadcast_dims)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims):
            raise ConfigError(f"Dropout({rate}): broadcast_dims are axes after the batch axis (>= 1), got "
                              f"{broadcast_dims!r}")
        self.rate, self.seed, self.broadcast_dims = float(rate), seed, dims
        self._summary = f"{rate}"
        key = jax.random.PRNGKey(seed) if seed is not None else brainstate.random.split_key()
        if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            key = jax.random.key_data(key)
        self.key = DropoutKey(jnp.asarray(key, jnp.uint32))

    def update(self, x: Any) -> jax.Array:
        if not training() or self.rate == 0.0:
            return x
        for d in self.broadcast_dims:
            if d >= jnp.ndim(x):
                raise ConfigError(f"Dropout({self.rate}): broadcast_dims {self.broadcast_dims} on an input of shape "
                                  f"{tuple(jnp.shape(x))}")
        key, draw = jax.random.split(self.key.value)
        self.key.value = key
        shape = tuple(1 if n in self.broadcast_dims else s for n, s in enumerate(jnp.shape(x)))
        keep = jax.random.bernoulli(draw, 1.0 - self.rate, shape)
        return jnp.where(keep, x / (1.0 - self.rate), jnp.zeros((), jnp.result_type(x)))

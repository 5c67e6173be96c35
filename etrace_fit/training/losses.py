"""Per-sample losses by name or callable, for the trainer.

A loss maps one step's ``(output, target)`` to a per-sample vector ``(B,)``; the
trainer weights and averages it (last step, every step, or a mask). Names:
``"cross_entropy"`` (integer labels) and ``"mse"``.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from ..errors import ConfigError, ShapeError

__all__ = ["LOSSES", "check_labels", "cross_entropy", "get_loss", "mse"]

Loss = Callable[[jax.Array, Any], jax.Array]


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Softmax cross-entropy with integer labels: ``logits (B, C)``, ``labels (B,)`` → ``(B,)``."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels.astype(jnp.int32))


def mse(output: jax.Array, target: jax.Array) -> jax.Array:
    """Mean squared error over the feature axes: ``(B, ...)`` → ``(B,)``."""
    error = (output - jnp.asarray(target, output.dtype)) ** 2
    return error.reshape(error.shape[0], -1).mean(axis=1)


LOSSES: dict[str, Loss] = {"cross_entropy": cross_entropy, "mse": mse}


def get_loss(loss: str | Loss) -> Loss:
    """The loss function for a name in :data:`LOSSES`, or ``loss`` itself if callable."""
    if callable(loss):
        return loss
    if loss not in LOSSES:
        raise ConfigError(f"unknown loss {loss!r}; valid names: {', '.join(LOSSES)}, or a callable (output, target) -> (B,)")
    return LOSSES[loss]


def check_labels(labels: Any, num_classes: int, *, where: str = "y") -> None:
    """Raise :class:`ShapeError` unless ``labels`` are integers in ``[0, num_classes)``."""
    values = jnp.asarray(labels)
    if not jnp.issubdtype(values.dtype, jnp.integer):
        raise ShapeError(f"{where}: cross_entropy needs integer class labels, got dtype {values.dtype}")
    if values.size == 0:
        return
    low, high = int(values.min()), int(values.max())
    if low < 0 or high >= num_classes:
        raise ShapeError(
            f"{where}: labels must lie in [0, {num_classes}) for a model with {num_classes} outputs, "
            f"got values from {low} to {high}"
        )

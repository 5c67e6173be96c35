"""Per-sample losses by name or callable, for the trainer.

A loss maps one step's ``(output, target)`` to a per-sample vector ``(B,)``; the
trainer weights and averages it (last step, every step, or a mask). Names, with Keras'
aliases: ``"cross_entropy"`` = ``"sparse_categorical_crossentropy"`` (integer labels),
``"categorical_crossentropy"`` (one-hot or soft targets), ``"mse"`` =
``"mean_squared_error"``, ``"mae"`` = ``"mean_absolute_error"``; the spiking losses of
:mod:`etrace_fit.training.spiking` (``"spike_count_cross_entropy"``) are looked up here too.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..errors import ConfigError, ShapeError

__all__ = ["LOSSES", "categorical_cross_entropy", "check_labels", "cross_entropy", "get_loss", "mae", "mse"]

Loss = Callable[[jax.Array, Any], jax.Array]


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Softmax cross-entropy with integer labels: ``logits (B, C)``, ``labels (B,)`` → ``(B,)``."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels.astype(jnp.int32))


cross_entropy.integer_labels = True  # the trainer checks the labels' range before training


def mse(output: jax.Array, target: jax.Array) -> jax.Array:
    """Mean squared error over the feature axes: ``(B, ...)`` → ``(B,)``."""
    error = (output - jnp.asarray(target, output.dtype)) ** 2
    return error.reshape(error.shape[0], -1).mean(axis=1)


def mae(output: jax.Array, target: jax.Array) -> jax.Array:
    """Mean absolute error over the feature axes: ``(B, ...)`` → ``(B,)``."""
    error = jnp.abs(output - jnp.asarray(target, output.dtype))
    return error.reshape(error.shape[0], -1).mean(axis=1)


def categorical_cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Softmax cross-entropy with one-hot (or soft) targets ``(B, C)`` → ``(B,)``."""
    return optax.softmax_cross_entropy(logits, jnp.asarray(targets, logits.dtype))


LOSSES: dict[str, Loss] = {
    "cross_entropy": cross_entropy,
    "sparse_categorical_crossentropy": cross_entropy,
    "categorical_crossentropy": categorical_cross_entropy,
    "mse": mse,
    "mean_squared_error": mse,
    "mae": mae,
    "mean_absolute_error": mae,
}


def get_loss(loss: str | Loss) -> Loss:
    """The loss function for a name in :data:`LOSSES` (or a spiking loss name), or
    ``loss`` itself if callable; anything else is a :class:`ConfigError`."""
    if callable(loss):
        return loss
    from .spiking import SPIKING_LOSSES

    if isinstance(loss, str) and loss in SPIKING_LOSSES:
        return SPIKING_LOSSES[loss]
    if not isinstance(loss, str) or loss not in LOSSES:
        raise ConfigError(f"loss: unknown {loss!r}; valid names: {', '.join([*LOSSES, *SPIKING_LOSSES])}, or a "
                          f"callable (output, target) -> (B,)")
    return LOSSES[loss]


def check_labels(labels: Any, num_classes: int, *, where: str = "y") -> None:
    """Raise :class:`ShapeError` unless ``labels`` are integers in ``[0, num_classes)``."""
    values = np.asarray(labels)  # on the host: jnp's min and max compiled two programs, 0.1 s a call
    if not np.issubdtype(values.dtype, np.integer):
        raise ShapeError(f"{where}: cross_entropy needs integer class labels, got dtype {values.dtype}")
    if values.size == 0:
        return
    low, high = int(values.min()), int(values.max())
    if low < 0 or high >= num_classes:
        raise ShapeError(
            f"{where}: labels must lie in [0, {num_classes}) for a model with {num_classes} outputs, "
            f"got values from {low} to {high}"
        )

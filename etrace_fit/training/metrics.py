"""Per-sample metrics by name or callable, for the trainer.

Names, with Keras' aliases (a metric is logged under the name it was given):
``"accuracy"`` = ``"acc"`` = ``"sparse_categorical_accuracy"`` (integer labels),
``"categorical_accuracy"`` (one-hot targets), ``"mse"`` = ``"mean_squared_error"``,
``"mae"`` = ``"mean_absolute_error"``.

A metric maps one step's ``(output, target)`` to a per-sample vector ``(B,)``; the
trainer averages it over samples (and over the steps the loss is placed on).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from ..errors import ConfigError
from .losses import class_labels, mae, mse

__all__ = ["METRICS", "accuracy", "categorical_accuracy", "get_metrics"]

Metric = Callable[[jax.Array, Any], jax.Array]


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """1.0 where ``argmax(logits)`` equals the integer label, else 0.0: ``(B,)``."""
    return (jnp.argmax(logits, axis=-1) == class_labels(logits, labels)).astype(jnp.float32)


def categorical_accuracy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """1.0 where ``argmax(logits)`` equals ``argmax(targets)`` (one-hot), else 0.0: ``(B,)``."""
    return (jnp.argmax(logits, axis=-1) == jnp.argmax(targets, axis=-1)).astype(jnp.float32)


METRICS: dict[str, Metric] = {
    "accuracy": accuracy, "acc": accuracy, "sparse_categorical_accuracy": accuracy,
    "categorical_accuracy": categorical_accuracy,
    "mse": mse, "mean_squared_error": mse, "mae": mae, "mean_absolute_error": mae,
}


def get_metrics(metrics: Sequence[str | Metric] | None) -> dict[str, Metric]:
    """``{name: function}`` for names in :data:`METRICS` and callables (named by
    ``__name__``); duplicate names are an error."""
    found: dict[str, Metric] = {}
    for metric in metrics or ():
        if callable(metric):
            name, function = getattr(metric, "__name__", type(metric).__name__), metric
        elif isinstance(metric, str) and metric in METRICS:
            name, function = metric, METRICS[metric]
        else:
            raise ConfigError(f"metrics: unknown {metric!r}; valid names: {', '.join(METRICS)}, or a callable "
                              f"(output, target) -> (B,)")
        if name in found:
            raise ConfigError(f"metric {name!r} given twice")
        found[name] = function
    return found

"""Per-sample metrics by name or callable, for the trainer (``"accuracy"``, ``"mse"``).

A metric maps one step's ``(output, target)`` to a per-sample vector ``(B,)``; the
trainer averages it over samples (and over the steps the loss is placed on).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from ..errors import ConfigError
from .losses import mse

__all__ = ["METRICS", "accuracy", "get_metrics"]

Metric = Callable[[jax.Array, Any], jax.Array]


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """1.0 where ``argmax(logits)`` equals the integer label, else 0.0: ``(B,)``."""
    return (jnp.argmax(logits, axis=-1) == jnp.asarray(labels)).astype(jnp.float32)


METRICS: dict[str, Metric] = {"accuracy": accuracy, "mse": mse}


def get_metrics(metrics: Sequence[str | Metric] | None) -> dict[str, Metric]:
    """``{name: function}`` for names in :data:`METRICS` and callables (named by
    ``__name__``); duplicate names are an error."""
    found: dict[str, Metric] = {}
    for metric in metrics or ():
        if callable(metric):
            name, function = getattr(metric, "__name__", type(metric).__name__), metric
        elif metric in METRICS:
            name, function = metric, METRICS[metric]
        else:
            raise ConfigError(f"unknown metric {metric!r}; valid names: {', '.join(METRICS)}, or a callable "
                              f"(output, target) -> (B,)")
        if name in found:
            raise ConfigError(f"metric {name!r} given twice")
        found[name] = function
    return found

"""Per-sample metrics by name or callable, for the trainer.

Names, with Keras' aliases (a metric is logged under the name it was given):
``"accuracy"`` = ``"acc"`` = ``"sparse_categorical_accuracy"`` (integer labels),
``"categorical_accuracy"`` (one-hot targets), ``"spike_accuracy"`` (a spiking readout:
ties, a silent readout among them, count as wrong), ``"mse"`` = ``"mean_squared_error"``,
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

__all__ = ["DEFAULT_METRICS", "METRICS", "accuracy", "categorical_accuracy", "default_metrics", "get_metrics",
           "spike_accuracy"]

Metric = Callable[[jax.Array, Any], jax.Array]


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """1.0 where ``argmax(logits)`` equals the integer label, else 0.0: ``(B,)``. As
    Keras' ``"accuracy"``, it follows the targets: one-hot (or probability) targets of
    the output's shape are compared by their ``argmax`` (the usual
    ``loss="categorical_crossentropy", metrics=["accuracy"]``)."""
    _check_classes("accuracy", logits)
    labels = jnp.asarray(labels)
    if labels.shape == logits.shape and logits.shape[-1] > 1:
        return categorical_accuracy(logits, labels)
    return (jnp.argmax(logits, axis=-1) == class_labels(logits, labels)).astype(jnp.float32)


def spike_accuracy(spikes: jax.Array, labels: jax.Array) -> jax.Array:
    """1.0 where the label's readout neuron fired more than every other one, else 0.0:
    ``(B,)``. Ties count as wrong, so a readout that stays silent scores 0 (``"accuracy"``'s
    argmax takes the first of equal entries: a silent readout scored the share of class
    0). Integer or one-hot labels."""
    _check_classes("spike_accuracy", spikes)
    labels = jnp.asarray(labels)
    wanted = jnp.argmax(labels, axis=-1) if labels.shape == spikes.shape else class_labels(spikes, labels)
    top = jnp.max(spikes, axis=-1)
    unique = jnp.sum(spikes == top[..., None], axis=-1) == 1
    return ((jnp.argmax(spikes, axis=-1) == wanted) & unique).astype(jnp.float32)


def _check_classes(name: str, output: jax.Array) -> None:
    """An argmax over one unit is always class 0: refused (at trace time, before training)."""
    if jnp.ndim(output) == 0 or jnp.shape(output)[-1] < 2:
        raise ConfigError(
            f"metric {name!r} takes the argmax over the output's classes, but the output has shape "
            f"{tuple(jnp.shape(output))} (one unit): every prediction would be class 0. Give the model one output "
            f"per class (2 for a yes/no task, with cross-entropy), or pass a metric of your own, e.g. "
            f"lambda out, y: ((out[..., 0] > 0) == y).astype(float)")


def categorical_accuracy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """1.0 where ``argmax(logits)`` equals ``argmax(targets)`` (one-hot), else 0.0: ``(B,)``."""
    if jnp.shape(targets) != jnp.shape(logits):  # integer labels: argmax over the batch would be garbage
        raise ValueError(f"categorical_accuracy takes one-hot targets of the output's shape {tuple(logits.shape)}, "
                         f"got {tuple(jnp.shape(targets))} (integer labels? use 'accuracy')")
    return (jnp.argmax(logits, axis=-1) == jnp.argmax(targets, axis=-1)).astype(jnp.float32)


METRICS: dict[str, Metric] = {
    "accuracy": accuracy, "acc": accuracy, "sparse_categorical_accuracy": accuracy,
    "categorical_accuracy": categorical_accuracy, "spike_accuracy": spike_accuracy,
    "mse": mse, "mean_squared_error": mse, "mae": mae, "mean_absolute_error": mae,
}


_RESERVED = ("loss", "learning_rate")

#: The Trainer's default ``metrics``: :func:`default_metrics` of its loss.
DEFAULT_METRICS: tuple = ("accuracy",)


def default_metrics(loss: Any) -> list[str]:
    """``["accuracy"]`` for a classification loss (the cross-entropies, by name or the
    built-in functions), ``["spike_accuracy"]`` for the spiking readouts' cross-entropy,
    else none."""
    from .losses import categorical_cross_entropy, cross_entropy

    from .spiking import SPIKING_LOSSES

    classifying = ("cross_entropy", "sparse_categorical_crossentropy", "categorical_crossentropy")
    if isinstance(loss, str):
        return ["accuracy"] if loss in classifying else ["spike_accuracy"] if loss == "spike_rate_cross_entropy" else []
    if loss is SPIKING_LOSSES["spike_rate_cross_entropy"]:
        return ["spike_accuracy"]
    return ["accuracy"] if loss in (cross_entropy, categorical_cross_entropy) else []


def per_sample(value: Any, batch: int) -> jax.Array:
    """A metric's value for one step as ``(batch,)``: a scalar (the batch's value, as a
    Keras metric may return) for every sample, ``(batch, ...)`` averaged per sample."""
    value = jnp.asarray(value)
    if value.ndim == 0:
        return jnp.broadcast_to(value, (batch,))
    return value.reshape(value.shape[0], -1).mean(axis=1) if value.ndim > 1 else value


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
        if name in _RESERVED or name.startswith("val_"):
            # logged beside the metrics: a metric named "loss" replaced the loss in History and evaluate
            raise ConfigError(f"metric {name!r}: the trainer logs {', '.join(map(repr, _RESERVED))} and the 'val_' "
                              f"names itself; give the metric another name (its __name__)")
        found[name] = function
    return found

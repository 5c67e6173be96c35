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

__all__ = ["LOSSES", "categorical_cross_entropy", "check_batch_targets", "check_labels", "check_target_shape",
           "class_labels", "cross_entropy", "get_loss", "loss_name", "mae", "mse", "needs_targets"]

Loss = Callable[[jax.Array, Any], jax.Array]


def class_labels(logits: jax.Array, labels: Any) -> jax.Array:
    """Integer labels ``(B,)`` for ``logits (B, C)``, also from Keras' ``(B, 1)``."""
    labels = jnp.asarray(labels)
    return labels[..., 0] if labels.ndim == logits.ndim and labels.shape[-1] == 1 else labels


def _like(output: jax.Array, target: Any) -> jax.Array:
    """``target`` in ``output``'s shape and dtype: a regression target ``(B,)`` for an
    output ``(B, 1)`` is reshaped, as Keras does (broadcast, it would pair every sample
    with every target)."""
    target = jnp.asarray(target, output.dtype)
    return target.reshape(output.shape) if target.shape != output.shape and target.size == output.size else target


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Softmax cross-entropy with integer labels: ``logits (B, C)``, ``labels (B,)`` (or
    ``(B, 1)``) → ``(B,)``."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, class_labels(logits, labels).astype(jnp.int32))


cross_entropy.integer_labels = True  # the trainer checks the labels' range before training


def mse(output: jax.Array, target: jax.Array) -> jax.Array:
    """Mean squared error over the feature axes: ``(B, ...)`` → ``(B,)``."""
    error = (output - _like(output, target)) ** 2
    return error.reshape(error.shape[0], -1).mean(axis=1)


def mae(output: jax.Array, target: jax.Array) -> jax.Array:
    """Mean absolute error over the feature axes: ``(B, ...)`` → ``(B,)``."""
    error = jnp.abs(output - _like(output, target))
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


def loss_name(loss: Loss) -> str:
    """A loss's name in messages: Keras' for a built-in one, else its ``__name__``."""
    from .spiking import SPIKING_LOSSES

    names = [name for name, known in [*LOSSES.items(), *SPIKING_LOSSES.items()] if known is loss]
    if names:
        return names[-1] if loss is cross_entropy else names[0]
    return getattr(loss, "__name__", type(loss).__name__)


def needs_targets(loss: Loss) -> bool:
    """Whether ``loss`` reads targets: every built-in one does; a callable of yours may
    not (it then gets zeros when no ``y`` is given)."""
    from .spiking import SPIKING_LOSSES

    return any(loss is known for known in [*LOSSES.values(), *SPIKING_LOSSES.values()])


def check_batch_targets(loss: Loss, targets: Any) -> None:
    """:class:`ConfigError` when batches of an iterable carry no ``y`` the loss needs."""
    if targets is None and needs_targets(loss):
        raise ConfigError(f"x: loss {loss_name(loss)!r} needs targets, but the data's batches carry none; yield "
                          f"(x, y) or (x, y, mask) batches")


def check_target_shape(loss: Loss, output: tuple, target: tuple, *, where: str = "y") -> None:
    """:class:`ShapeError` naming ``where`` when a built-in loss's targets do not fit the
    model's output: ``output`` and ``target`` are one sample's shapes at one step (a
    classifier's ``(C,)``; integer labels ``()``). A callable loss is not checked."""
    if not any(loss is known for known in LOSSES.values()):
        return
    name = loss_name(loss)
    dims = "".join(f", {d}" for d in output)  # y's shape after (N, ...) or (N, T, ...)
    size = int(np.prod(output, dtype=np.int64))
    if loss is cross_entropy:
        if target in ((), (1,)):
            return
        hint = " (one-hot targets? use loss='categorical_crossentropy')" if target == output else ""
        raise ShapeError(f"{where}: loss {name!r} takes one integer class label per sample (y of shape (N,) or "
                         f"(N, 1), or (N, T) per step); got targets of shape {target} per sample{hint}")
    if loss is categorical_cross_entropy:
        if target == output:
            return
        hint = " (integer labels? use loss='sparse_categorical_crossentropy')" if target in ((), (1,)) else ""
        raise ShapeError(f"{where}: loss {name!r} takes one-hot or probability targets, shape {output} per sample "
                         f"as the model's output (y of shape (N{dims}), or (N, T{dims}) per step); got targets of "
                         f"shape {target} per sample{hint}")
    if int(np.prod(target, dtype=np.int64)) != size:
        raise ShapeError(f"{where}: loss {name!r} compares targets with the model's output, shape {output} per "
                         f"sample; got targets of shape {target} per sample (give y of shape (N{dims}), or "
                         f"(N, T{dims}) per step)")


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

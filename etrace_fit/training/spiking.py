"""Losses for spiking readouts, and when to use which ``loss_on``.

A spiking readout (:class:`~etrace_fit.layers.LeakySpikeReadout`) emits 0/1 spikes; the
class is the neuron that fires most. Cross-entropy on the spikes of the *last* step
alone (``loss_on="last"``) barely learns: one step's spikes are mostly zero, so the
logits are equal and the loss sits at ``ln C``. Put the loss on every step instead —
the per-step form of a loss on spike *rates*, which is what an online rule can use,
since each step's loss is known at that step:

- ``"spike_rate_cross_entropy"`` with ``loss_on="all"``: softmax cross-entropy of
  ``scale · z^t`` against the label at every step, averaged over time (snnTorch's
  ``ce_rate_loss``). The target neuron is pushed to fire, the others to stay silent.
- ``"spike_rate_mse"`` with ``loss_on="all"``: squared error of the spikes against a
  target rate per step — ``correct_rate`` for the label's neuron, ``incorrect_rate``
  for the others (snnTorch's ``mse_count_loss`` divided over the steps).

``spike_rate_mse(correct_rate=..., incorrect_rate=...)`` and
``spike_rate_cross_entropy(scale=...)`` build variants. A rate readout
(:class:`~etrace_fit.layers.LeakyRateReadout`, a leaky integral of its input) works with
``loss_on="last"`` and the plain ``"cross_entropy"``. The metric ``"spike_accuracy"``
scores the step's spikes the same way (argmax of spikes, ties counted as wrong).

A hidden spiking layer that falls silent stops learning (no spikes, no surrogate
gradient downstream), and one that fires at every step carries no information.
:class:`FiringRateRegularizer` (``Trainer(..., regularizers=[...])``) keeps each
hidden spiking layer near a target rate, at every step, whatever ``loss_on`` is.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import optax

from ..errors import ConfigError

__all__ = ["FiringRateRegularizer", "SPIKING_LOSSES", "spike_rate_cross_entropy", "spike_rate_mse"]


def spike_rate_cross_entropy(scale: float = 5.0) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """Per-step cross-entropy of ``scale · spikes (B, C)`` against integer labels ``(B,)``
    → ``(B,)``; use with ``loss_on="all"``. ``scale`` sets how confident one spike is."""
    if not scale > 0:
        raise ConfigError(f"spike_rate_cross_entropy: scale must be positive, got {scale!r}")

    def loss(spikes: jax.Array, labels: jax.Array) -> jax.Array:
        return optax.softmax_cross_entropy_with_integer_labels(scale * spikes, jnp.asarray(labels).astype(jnp.int32))

    loss.__name__ = "spike_rate_cross_entropy"
    loss.integer_labels = True  # the trainer checks the labels' range before training
    return loss


def spike_rate_mse(correct_rate: float = 0.8, incorrect_rate: float = 0.1) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """Per-step squared error of ``spikes (B, C)`` against ``correct_rate`` for the
    label's neuron and ``incorrect_rate`` for the others, summed over neurons → ``(B,)``;
    use with ``loss_on="all"``. Rates are spikes per step, in ``[0, 1]``."""
    for name, rate in (("correct_rate", correct_rate), ("incorrect_rate", incorrect_rate)):
        if not 0.0 <= rate <= 1.0:
            raise ConfigError(f"spike_rate_mse: {name} must be a rate in [0, 1] (spikes per step), got {rate!r}")

    def loss(spikes: jax.Array, labels: jax.Array) -> jax.Array:
        onehot = jax.nn.one_hot(jnp.asarray(labels).astype(jnp.int32), spikes.shape[-1], dtype=spikes.dtype)
        target = incorrect_rate + (correct_rate - incorrect_rate) * onehot
        return jnp.sum((spikes - target) ** 2, axis=-1)

    loss.__name__ = "spike_rate_mse"
    loss.integer_labels = True
    return loss


SPIKING_LOSSES = {"spike_rate_cross_entropy": spike_rate_cross_entropy(),
                  "spike_rate_mse": spike_rate_mse()}


class FiringRateRegularizer:
    """A penalty keeping spiking layers near a target firing rate (spikes per step).

    At every step ``t``, for each chosen layer with spikes ``z^t (B, N)``, the penalty
    per sample is ``strength · (mean_j z_j^t − target)²``: the squared distance of the
    layer's *population* rate at that step from ``target``. The trainer adds it to
    the loss at every step, averaged over the steps (weight ``1/T``) and over the batch,
    whatever ``loss_on`` places the task loss at; the logged ``loss`` includes it, as
    Keras adds regularisation losses. A per-step penalty is what an online rule can
    use (each step's loss is known at that step). It is on the population rate and not
    on each neuron's: for 0/1 spikes ``(z − target)²`` is linear in ``z`` and would only
    push every neuron down.

    Args:
        target: the rate to keep, in ``[0, 1]`` spikes per step (e.g. ``0.05``).
        strength: the penalty's weight, ``> 0``.
        layers: paths of the layers to regularise (``["layers.0", "layers.2"]``, as
            :meth:`~etrace_fit.Trainer.spiking_layers` names them); ``None``: every
            spiking layer but the readouts (:class:`~etrace_fit.layers.LeakySpikeReadout`,
            whose rate the task loss sets).

    Example::

        trainer = ef.Trainer(model, loss_on="last",
                             regularizers=[ef.training.FiringRateRegularizer(target=0.05, strength=1.0)])
    """

    def __init__(self, target: float = 0.05, strength: float = 1.0, layers: Sequence[str] | None = None):
        if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0.0 <= target <= 1.0:
            raise ConfigError(f"FiringRateRegularizer: target must be a rate in [0, 1] (spikes per step), "
                              f"got {target!r}")
        if isinstance(strength, bool) or not isinstance(strength, (int, float)) or not strength > 0:
            raise ConfigError(f"FiringRateRegularizer: strength must be a number > 0, got {strength!r}")
        if isinstance(layers, str):
            raise ConfigError(f"FiringRateRegularizer: layers must be a list of layer paths, got the string "
                              f"{layers!r}; write layers=[{layers!r}]")
        self.target, self.strength = float(target), float(strength)
        self.layers = None if layers is None else tuple(layers)

    def __repr__(self) -> str:
        return (f"FiringRateRegularizer(target={self.target}, strength={self.strength}"
                + ("" if self.layers is None else f", layers={list(self.layers)}") + ")")

    def select(self, spiking: Mapping[str, Any]) -> tuple[str, ...]:
        """The paths this regulariser acts on among ``spiking`` (``{path: layer}``);
        ``ConfigError`` naming the spiking layers for an unknown path, or when none is left."""
        from ..layers import LeakySpikeReadout

        if self.layers is None:
            chosen = tuple(p for p, layer in spiking.items() if not isinstance(layer, LeakySpikeReadout))
        else:
            unknown = [p for p in self.layers if p not in spiking]
            if unknown:
                raise ConfigError(f"{self!r}: no spiking layer {', '.join(map(repr, unknown))} in the model; "
                                  f"its spiking layers: {', '.join(map(repr, spiking)) or 'none'}")
            chosen = self.layers
        if not chosen:
            raise ConfigError(f"{self!r}: the model has no hidden spiking layer to regularise (its spiking "
                              f"layers: {', '.join(map(repr, spiking)) or 'none'}); name one with layers=[...]")
        return chosen

    def __call__(self, spikes: Mapping[str, jax.Array]) -> jax.Array:
        """The penalty per sample ``(B,)`` of one step, summed over ``{path: spikes (B, ...)}``
        (the trainer passes the layers :meth:`select` chose)."""
        total = 0.0
        for z in spikes.values():
            rate = jnp.mean(z.reshape(z.shape[0], -1), axis=1)
            total = total + self.strength * (rate - self.target) ** 2
        return total

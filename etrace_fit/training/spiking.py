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
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from ..errors import ConfigError

__all__ = ["SPIKING_LOSSES", "spike_rate_cross_entropy", "spike_rate_mse"]


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

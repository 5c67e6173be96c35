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
(the default with ``"spike_rate_cross_entropy"``) scores the step's spikes the same way:
the label's neuron must fire more than every other one (ties, a silent readout among
them, count as wrong).

A hidden spiking layer that falls silent stops learning (no spikes, no surrogate
gradient downstream), and one that fires at every step carries no information. Three
regularisers (``Trainer(..., regularizers=[...])``) act on hidden spiking layers at every
step, whatever ``loss_on`` is:

- :class:`FiringRateRegularizer`: each step's *population* rate near a target (a true
  per-step loss);
- :class:`NeuronRateRegularizer`: each neuron's rate near a target (e-prop's
  firing-rate regularisation);
- :class:`RateBounds`: each neuron above a lower bound, the population below an upper
  one (Cramer et al. 2020's SHD regularisers).

A neuron's rate over a sequence is not a sum of per-step losses, so the last two work
on a *running estimate* ``r̂_j`` of each neuron's rate, as online e-prop does: an
exponential average, over the batches trained so far, of the neuron's mean spikes per
step (``memory``: the weight of the past). At every step the loss is
``P(r̂) + Σ_j ∂P/∂r̂_j · (z_j^t − sg(z_j^t))``: its value is the penalty at the
estimate, its gradient that of ``P`` of the sequence's rates when ``r̂`` equals them
(e-prop's learning signal ``∂P/∂r̂_j`` for neuron ``j``). The first batch has no
estimate and no penalty. ``evaluate`` reports ``P`` of the rates it measures.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import optax

from ..errors import ConfigError

__all__ = ["FiringRateRegularizer", "NeuronRateRegularizer", "RateBounds", "SPIKING_LOSSES",
           "spike_rate_cross_entropy", "spike_rate_mse"]


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


def _number(owner: str, name: str, value: Any, low: float, high: float | None = None, open_low: bool = False) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    ok = ok and (value > low if open_low else value >= low) and (high is None or value <= high)
    if not ok:
        bound = (f"> {low}" if open_low else f">= {low}") + ("" if high is None else f" and <= {high}")
        raise ConfigError(f"{owner}: {name} must be a number {bound}, got {value!r}")
    return float(value)


class _LayerRegularizer:
    """What every regulariser shares: the layers it acts on (``layers=None``: every
    spiking layer but the readouts) and its per-sequence value for ``evaluate``."""

    #: Whether the trainer keeps a running estimate of each neuron's rate for it.
    uses_rates = False
    layers: tuple[str, ...] | None = None

    def _check_layers(self, layers: Any) -> tuple[str, ...] | None:
        if isinstance(layers, str):
            raise ConfigError(f"{type(self).__name__}: layers must be a list of layer paths, got the string "
                              f"{layers!r}; write layers=[{layers!r}]")
        return None if layers is None else tuple(layers)

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


    def sequence_penalty(self, spikes: Mapping[str, jax.Array]) -> jax.Array:
        """The penalty of whole sequences, ``{path: (T, B, ...)}`` → ``()``: the
        per-step penalty averaged over steps and samples (what training adds)."""
        return jnp.mean(jax.vmap(lambda z: self(z))(spikes))


class FiringRateRegularizer(_LayerRegularizer):
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
        self.target, self.strength = float(target), float(strength)
        self.layers = self._check_layers(layers)

    def __repr__(self) -> str:
        return (f"FiringRateRegularizer(target={self.target}, strength={self.strength}"
                + ("" if self.layers is None else f", layers={list(self.layers)}") + ")")

    def __call__(self, spikes: Mapping[str, jax.Array], rates: Any = None) -> jax.Array:
        """The penalty per sample ``(B,)`` of one step, summed over ``{path: spikes (B, ...)}``
        (the trainer passes the layers :meth:`select` chose; ``rates`` is not used)."""
        total = 0.0
        for z in spikes.values():
            rate = jnp.mean(z.reshape(z.shape[0], -1), axis=1)
            total = total + self.strength * (rate - self.target) ** 2
        return total


class _RatePenalty(_LayerRegularizer):
    """A penalty ``P`` on each neuron's rate, applied online through a running estimate
    (see the module docstring); subclasses define :meth:`penalty`."""

    uses_rates = True

    def __init__(self, layers: Sequence[str] | None, memory: float):
        self.layers = self._check_layers(layers)
        self.memory = _number(type(self).__name__, "memory", memory, 0.0, 1.0)
        if self.memory == 1.0:
            raise ConfigError(f"{type(self).__name__}: memory must be < 1 (the weight of past batches in the "
                              f"running rate), got 1.0")

    def penalty(self, rates: Mapping[str, jax.Array]) -> jax.Array:
        """``P`` of per-neuron rates ``{path: (...)}`` (spikes per step) → ``()``."""
        raise NotImplementedError

    def __call__(self, spikes: Mapping[str, jax.Array], rates: Mapping[str, jax.Array]) -> jax.Array:
        """One step's loss per sample ``(B,)``: ``P(r̂)`` plus the linear term that gives
        each spike ``z_j^t`` the gradient ``∂P/∂r̂_j`` (``rates``: the estimate ``r̂``)."""
        rates = jax.lax.stop_gradient(dict(rates))
        value, grads = jax.value_and_grad(self.penalty)(rates)
        batch = next(iter(spikes.values())).shape[0]
        linear = sum(jnp.sum((grads[p] * (z - jax.lax.stop_gradient(z))).reshape(batch, -1), axis=1)
                     for p, z in spikes.items())
        return value + linear

    def sequence_penalty(self, spikes: Mapping[str, jax.Array]) -> jax.Array:
        """``P`` of the rates measured over whole sequences ``{path: (T, B, ...)}``."""
        return self.penalty({p: jnp.mean(z, axis=(0, 1)) for p, z in spikes.items()})


class NeuronRateRegularizer(_RatePenalty):
    """e-prop's firing-rate regularisation (Bellec et al. 2020): each neuron's rate near a
    target, ``P = strength · mean_j (r_j − target)²`` over the chosen layers' neurons,
    applied online through the running rate estimate (module docstring).

    Args:
        target: the rate to keep, spikes per step (e-prop: 10 Hz at dt = 1 ms → 0.01).
        strength: the penalty's weight, ``> 0``.
        layers: as in :class:`FiringRateRegularizer`.
        memory: weight of the past batches in the running rate, in ``[0, 1)`` (0: the
            last batch only).

    Example::

        trainer = ef.Trainer(model, regularizers=[NeuronRateRegularizer(target=0.01, strength=1.0)])
    """

    def __init__(self, target: float = 0.01, strength: float = 1.0, layers: Sequence[str] | None = None,
                 memory: float = 0.9):
        self.target = _number("NeuronRateRegularizer", "target", target, 0.0, 1.0)
        self.strength = _number("NeuronRateRegularizer", "strength", strength, 0.0, open_low=True)
        super().__init__(layers, memory)

    def __repr__(self) -> str:
        return (f"NeuronRateRegularizer(target={self.target}, strength={self.strength}, memory={self.memory}"
                + ("" if self.layers is None else f", layers={list(self.layers)}") + ")")

    def penalty(self, rates: Mapping[str, jax.Array]) -> jax.Array:
        every = jnp.concatenate([jnp.ravel(r) for r in rates.values()])
        return self.strength * jnp.mean((every - self.target) ** 2)


class RateBounds(_RatePenalty):
    """Cramer et al. (2020)'s SHD regularisers on rates: a lower bound per neuron and an
    upper bound on the population,
    ``P = lower_strength · mean_j relu(lower − r_j)² + upper_strength · Σ_layers relu(mean_j r_j − upper)²``,
    applied online through the running rate estimate (module docstring). Cramer et al.
    bound spike counts per sample; here the bounds are on rates (spikes per step) of the
    running estimate, so a silent neuron is pushed up and an over-active layer down.

    Args:
        lower: the rate each neuron should reach (None: no lower bound).
        upper: the population rate a layer should not exceed (None: no upper bound).
        lower_strength, upper_strength: the two weights, ``> 0``.
        layers, memory: as in :class:`NeuronRateRegularizer`.
    """

    def __init__(self, lower: float | None = 0.001, upper: float | None = 0.1, lower_strength: float = 1.0,
                 upper_strength: float = 1.0, layers: Sequence[str] | None = None, memory: float = 0.9):
        if lower is None and upper is None:
            raise ConfigError("RateBounds: give lower, upper or both (rates in spikes per step)")
        self.lower = None if lower is None else _number("RateBounds", "lower", lower, 0.0, 1.0)
        self.upper = None if upper is None else _number("RateBounds", "upper", upper, 0.0, 1.0)
        if self.lower is not None and self.upper is not None and self.lower > self.upper:
            raise ConfigError(f"RateBounds: lower ({lower}) must not exceed upper ({upper})")
        self.lower_strength = _number("RateBounds", "lower_strength", lower_strength, 0.0, open_low=True)
        self.upper_strength = _number("RateBounds", "upper_strength", upper_strength, 0.0, open_low=True)
        super().__init__(layers, memory)

    def __repr__(self) -> str:
        return (f"RateBounds(lower={self.lower}, upper={self.upper}, lower_strength={self.lower_strength}, "
                f"upper_strength={self.upper_strength}, memory={self.memory}"
                + ("" if self.layers is None else f", layers={list(self.layers)}") + ")")

    def penalty(self, rates: Mapping[str, jax.Array]) -> jax.Array:
        total = 0.0
        if self.lower is not None:
            every = jnp.concatenate([jnp.ravel(r) for r in rates.values()])
            total = total + self.lower_strength * jnp.mean(jax.nn.relu(self.lower - every) ** 2)
        if self.upper is not None:
            total = total + self.upper_strength * sum(jax.nn.relu(jnp.mean(r) - self.upper) ** 2
                                                      for r in rates.values())
        return total

"""Keras' weight constraints: a projection applied to a weight after every optimizer update.

A layer takes them as ``w_constraint=`` / ``b_constraint=`` (Keras' ``kernel_constraint`` /
``bias_constraint``), as an instance, a Keras name (``"non_neg"``, ``"max_norm"``,
``"min_max_norm"``, ``"unit_norm"``) or any function ``array -> array`` of the same shape::

    Linear(100, 100, w_constraint=constraints.MaxNorm(2.0))   # every column's norm at most 2
    Linear(40, 100, w_constraint="non_neg")                   # excitatory inputs only

The weight is held as a :class:`~etrace_fit.layers.Constrained` state, which the Trainer's
step (every rule), ``update_every`` inside a sequence and ``ef.online_fit`` project after
each update; gradients are not changed (a projection, not a reparameterisation: for a
weight that is positive by construction see ``weight_fn=ops.Positive()``). The formulas
and defaults are Keras': ``axis`` names the axes a norm runs over, ``0`` for a dense
weight ``(in, out)`` (one norm per output unit), ``(0, 1, 2)`` for a ``Conv2d`` kernel
``(kh, kw, in, out)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp

from .errors import ConfigError

__all__ = ["Constraint", "MaxNorm", "MinMaxNorm", "NonNeg", "UnitNorm", "get"]

#: Keras' fuzz in the norm constraints' division (``keras.backend.epsilon()``).
EPSILON = 1e-7


class Constraint:
    """Base class: ``constraint(w) -> w`` of the same shape and dtype, run inside the
    jitted step on the weight's new value."""

    def __call__(self, w: Any) -> Any:
        return w

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"

    def __eq__(self, other: Any) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted((k, repr(v)) for k, v in vars(self).items()))))


def _axis(axis: int | Sequence[int], name: str) -> int | tuple[int, ...]:
    if isinstance(axis, bool) or not isinstance(axis, (int, Sequence)) or (
            isinstance(axis, Sequence) and not all(isinstance(a, int) and not isinstance(a, bool) for a in axis)):
        raise ConfigError(f"{name}: axis must be an int or a sequence of ints, got {axis!r}")
    return axis if isinstance(axis, int) else tuple(axis)


def _norms(w: Any, axis: int | tuple[int, ...]) -> Any:
    return jnp.sqrt(jnp.sum(jnp.square(w), axis=axis, keepdims=True))


class NonNeg(Constraint):
    """``w ← w · (w ≥ 0)``: negative entries become zero."""

    def __call__(self, w: Any) -> Any:
        return w * (w >= 0).astype(w.dtype)


class MaxNorm(Constraint):
    """Each slice's 2-norm over ``axis`` at most ``max_value`` (Srivastava et al. 2014):
    ``w ← w · clip(‖w‖, 0, max_value) / (ε + ‖w‖)``."""

    def __init__(self, max_value: float = 2.0, axis: int | Sequence[int] = 0):
        if isinstance(max_value, bool) or not isinstance(max_value, (int, float)) or not max_value >= 0:
            raise ConfigError(f"MaxNorm: max_value must be a number >= 0, got {max_value!r}")
        self.max_value, self.axis = float(max_value), _axis(axis, "MaxNorm")

    def __call__(self, w: Any) -> Any:
        norms = _norms(w, self.axis)
        return w * (jnp.clip(norms, 0, self.max_value) / (EPSILON + norms))


class MinMaxNorm(Constraint):
    """Each slice's 2-norm over ``axis`` moved ``rate`` of the way into
    ``[min_value, max_value]``:
    ``w ← w · (rate · clip(‖w‖, min, max) + (1 − rate) ‖w‖) / (ε + ‖w‖)``."""

    def __init__(self, min_value: float = 0.0, max_value: float = 1.0, rate: float = 1.0,
                 axis: int | Sequence[int] = 0):
        numbers = {"min_value": min_value, "max_value": max_value, "rate": rate}
        for name, value in numbers.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ConfigError(f"MinMaxNorm: {name} must be a number >= 0, got {value!r}")
        if min_value > max_value or rate > 1:
            raise ConfigError(f"MinMaxNorm: needs min_value <= max_value and rate <= 1, got min_value={min_value!r}, "
                              f"max_value={max_value!r}, rate={rate!r}")
        self.min_value, self.max_value, self.rate = float(min_value), float(max_value), float(rate)
        self.axis = _axis(axis, "MinMaxNorm")

    def __call__(self, w: Any) -> Any:
        norms = _norms(w, self.axis)
        desired = self.rate * jnp.clip(norms, self.min_value, self.max_value) + (1 - self.rate) * norms
        return w * (desired / (EPSILON + norms))


class UnitNorm(Constraint):
    """Each slice's 2-norm over ``axis`` one: ``w ← w / (ε + ‖w‖)``."""

    def __init__(self, axis: int | Sequence[int] = 0):
        self.axis = _axis(axis, "UnitNorm")

    def __call__(self, w: Any) -> Any:
        return w / (EPSILON + _norms(w, self.axis))


#: Keras' names of its constraints (``keras.constraints.get``).
NAMES: dict[str, type[Constraint]] = {"non_neg": NonNeg, "nonneg": NonNeg, "max_norm": MaxNorm,
                                      "min_max_norm": MinMaxNorm, "unit_norm": UnitNorm}


def get(identifier: str | Callable[[Any], Any] | None, argument: str = "constraint",
        owner: str = "") -> Callable[[Any], Any] | None:
    """A constraint from ``identifier``: ``None``, a Keras name (:data:`NAMES`, with its
    defaults) or a callable (returned as it is); anything else is a :class:`ConfigError`
    naming ``owner`` and ``argument``."""
    where = f"{owner}: " if owner else ""
    if identifier is None or callable(identifier) and not isinstance(identifier, type):
        return identifier
    if isinstance(identifier, type) and issubclass(identifier, Constraint):
        raise ConfigError(f"{where}{argument}={identifier.__name__} is the class: give an instance, "
                          f"{identifier.__name__}(...)")
    if isinstance(identifier, str) and identifier.lower() in NAMES:
        return NAMES[identifier.lower()]()
    raise ConfigError(f"{where}{argument} must be None, a function (weight -> weight) or one of "
                      f"{', '.join(repr(n) for n in NAMES)}, got {identifier!r}")

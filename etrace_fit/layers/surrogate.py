"""Surrogate-gradient spike functions.

``spike(v)`` is the Heaviside step ``H(v)`` forward; its derivative is replaced by a
smooth pseudo-derivative ``scale * h(v)`` so gradients flow through spikes.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError

__all__ = ["FastSigmoid", "Sigmoid", "Surrogate", "Triangle", "get_surrogate"]


@partial(jax.custom_jvp, nondiff_argnums=(1,))
def _heaviside(v, surrogate):
    v = jnp.asarray(v)
    return (v > 0).astype(v.dtype)


@_heaviside.defjvp
def _heaviside_jvp(surrogate, primals, tangents):
    (v,), (dv,) = primals, tangents
    return _heaviside(v, surrogate), surrogate.derivative(v) * dv


@dataclasses.dataclass(frozen=True)
class Surrogate:
    """Base class: ``surrogate(v)`` spikes where ``v > 0`` with derivative ``derivative(v)``."""

    scale: float = 1.0

    #: Fields that must be positive finite numbers (checked when it is made: a zero or
    #: negative one gives no gradient or one pointing the wrong way, silently).
    positive = ("scale",)

    def __post_init__(self):
        for field in type(self).positive:
            value = getattr(self, field)
            try:
                ok = not isinstance(value, bool) and bool(np.all(np.isfinite(value)) and np.all(np.asarray(value) > 0))
            except TypeError:
                ok = False
            if not ok:
                raise ConfigError(f"{type(self).__name__}: {field} must be a positive finite number, got {value!r} "
                                  f"(the spikes' gradient is {field} times the pseudo-derivative)" if field == "scale"
                                  else f"{type(self).__name__}: {field} must be a positive finite number, got {value!r}")

    def __call__(self, v: jax.Array) -> jax.Array:
        return _heaviside(jnp.asarray(v), self)

    def derivative(self, v: jax.Array) -> jax.Array:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Sigmoid(Surrogate):
    """Pseudo-derivative ``scale * alpha * σ(alpha v) (1 − σ(alpha v))``.

    Example::

        z = Sigmoid(alpha=4.0)(v - v_threshold)
    """

    alpha: float = 4.0
    positive = ("scale", "alpha")

    def derivative(self, v):
        # σ(αv)·σ(−αv) rather than s·(1 − s), which cancels in float32 for large αv.
        return self.scale * self.alpha * jax.nn.sigmoid(self.alpha * v) * jax.nn.sigmoid(-self.alpha * v)


@dataclasses.dataclass(frozen=True)
class Triangle(Surrogate):
    """Piecewise-linear pseudo-derivative ``scale * max(0, 1 − |v| / width) / width``
    (e-prop's with ``scale=0.3``).

    Example::

        z = Triangle(width=1.0, scale=0.3)(v - v_threshold)
    """

    width: float = 1.0
    positive = ("scale", "width")

    def derivative(self, v):
        return self.scale * jnp.maximum(0.0, 1.0 - jnp.abs(v) / self.width) / self.width


@dataclasses.dataclass(frozen=True)
class FastSigmoid(Surrogate):
    """SuperSpike's pseudo-derivative ``scale / (1 + alpha |v|)^2``.

    Example::

        z = FastSigmoid(alpha=10.0)(v - v_threshold)
    """

    alpha: float = 10.0
    positive = ("scale", "alpha")

    def derivative(self, v):
        return self.scale / (1.0 + self.alpha * jnp.abs(v)) ** 2


_BY_NAME = {"sigmoid": Sigmoid, "triangle": Triangle, "fast_sigmoid": FastSigmoid}


def get_surrogate(surrogate: str | Surrogate, scale: float | None = None) -> Surrogate:
    """A surrogate from its name (``"sigmoid"``, ``"triangle"``, ``"fast_sigmoid"``) or
    instance; ``scale`` overrides the instance's scale."""
    if isinstance(surrogate, str):
        if surrogate not in _BY_NAME:
            raise ConfigError(f"unknown surrogate {surrogate!r}; valid names: {', '.join(_BY_NAME)}")
        surrogate = _BY_NAME[surrogate]()
    if not isinstance(surrogate, Surrogate):
        raise ConfigError(f"surrogate must be a name or a Surrogate instance, got {type(surrogate).__name__}")
    return surrogate if scale is None else dataclasses.replace(surrogate, scale=scale)

"""Helpers shared by the layers: time step, shape checks, parameter and state creation.

Layers only use ``etrace_fit.ops`` for their weights; this module holds what every
layer needs besides that. Read ``linear.py`` next for the simplest layer.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import brainstate
import jax
import jax.numpy as jnp
import saiunit as u

from ..errors import ConfigError, ShapeError

__all__ = ["Decay", "check_last_axis", "describe", "get_dt", "make_param", "make_state"]

Initializer = Callable[..., Any] | Any


def describe(layer: Any) -> str:
    """A short name for messages: ``LIF(size=100)`` or the module's given name."""
    name = getattr(layer, "name", None)
    summary = getattr(layer, "_summary", None)
    base = f"{type(layer).__name__}({summary})" if summary else type(layer).__name__
    return f"{base} '{name}'" if name else base


def get_dt(layer: Any) -> Any:
    """The simulation time step from ``brainstate.environ``, or a clear error."""
    try:
        return brainstate.environ.get_dt()
    except KeyError:
        raise ConfigError(
            f"{describe(layer)} needs the time step dt, and none is set. Set it with "
            f"brainstate.environ.set(dt=1.0) (or `with brainstate.environ.context(dt=1.0):`); "
            f"time constants are in the unit of dt."
        ) from None


def check_last_axis(layer: Any, x: Any, expected: int, what: str = "features") -> None:
    """Raise :class:`ShapeError` unless ``x.shape[-1] == expected``."""
    shape = tuple(jnp.shape(x))
    if len(shape) == 0 or shape[-1] != expected:
        raise ShapeError(
            f"{describe(layer)}: expected input with {expected} {what} on the last axis, "
            f"got x.shape={shape}"
        )


def make_param(initializer: Initializer, shape: Sequence[int], what: str, layer: Any) -> jax.Array:
    """A parameter array of ``shape`` in the environment's float dtype.

    ``initializer`` is a ``brainstate.nn.init`` initializer, a callable of the shape,
    or an array that broadcasts to ``shape``.
    """
    shape = tuple(shape)
    if callable(initializer):
        value = brainstate.nn.init.param(initializer, shape, allow_none=False)
    else:
        value = initializer
    mantissa = jnp.asarray(u.get_mantissa(value))
    try:
        mantissa = jnp.broadcast_to(mantissa, shape)
    except ValueError:
        raise ShapeError(
            f"{describe(layer)}: {what} must have (or broadcast to) shape {shape}, got shape {mantissa.shape}"
        ) from None
    unit = u.get_unit(value)
    mantissa = mantissa.astype(brainstate.environ.dftype())
    return mantissa if unit.is_unitless else u.Quantity(mantissa, unit=unit)


def make_state(initializer: Initializer, size: Sequence[int], batch_size: int | None) -> jax.Array:
    """A hidden-state value of shape ``(batch_size, *size)`` (``size`` when unbatched)."""
    value = brainstate.nn.init.param(initializer, tuple(size), batch_size)
    return jnp.asarray(value, dtype=brainstate.environ.dftype())


class Decay:
    """``exp(-dt / tau)``: the per-step decay of a leaky variable with time constant tau.

    A hashable value (compared by dt's value and unit), so the elementwise ETP op that
    learns ``tau`` gets a fn that jit can cache on. ``dt`` and ``tau`` may be saiunit
    quantities of the same dimension.
    """

    def __init__(self, dt: Any):
        self.dt = dt
        try:
            self._key = (float(jnp.asarray(u.get_mantissa(dt))), u.get_unit(dt))
        except jax.errors.ConcretizationTypeError:
            # dt traced by an enclosing transformation: only equal to itself.
            self._key = (id(dt), u.get_unit(dt))

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Decay) and self._key == other._key

    def __hash__(self) -> int:
        return hash((Decay, self._key))

    def __repr__(self) -> str:
        return f"Decay(dt={self.dt})"

    def __call__(self, tau: Any) -> jax.Array:
        ratio = self.dt / tau
        if not u.get_unit(ratio).is_unitless:
            raise ConfigError(f"dt ({self.dt}) and tau ({u.get_unit(tau)}) must be in the same unit")
        return jnp.exp(-u.get_mantissa(ratio))


def check_trailing_shape(layer: Any, x: Any, expected: tuple[int, ...]) -> None:
    """Raise :class:`ShapeError` unless ``x``'s trailing axes are ``expected``."""
    if len(expected) == 1:
        check_last_axis(layer, x, expected[0])
        return
    shape = tuple(jnp.shape(x))
    if shape[len(shape) - len(expected):] != tuple(expected) or len(shape) < len(expected):
        raise ShapeError(f"{describe(layer)}: expected input of shape (..., {', '.join(map(str, expected))}), got x.shape={shape}")


def time_constant(layer: Any, tau: Any, size: int | tuple[int, ...], learn: bool, what: str = "tau") -> Any:
    """A time constant broadcast to the layer's unit shape: a ``ParamState`` when learned.

    Validates ``tau > 0``. A learned time constant is read through the elementwise ETP
    op by :func:`decay_of`, so the compiler relates it to the layer's hidden group.
    """
    mantissa = jnp.asarray(u.get_mantissa(tau))
    shape = (size,) if isinstance(size, int) else tuple(size)
    try:
        mantissa = jnp.broadcast_to(mantissa, shape)
    except ValueError:
        raise ShapeError(f"{describe(layer)}: {what} must be a scalar or have shape {shape}, got shape {mantissa.shape}") from None
    if not bool(jnp.all(mantissa > 0)):
        raise ConfigError(f"{describe(layer)}: {what} must be positive, got {tau}")
    unit = u.get_unit(tau)
    value = jnp.asarray(mantissa, dtype=brainstate.environ.dftype())
    value = value if unit.is_unitless else u.Quantity(value, unit=unit)
    return brainstate.ParamState(value) if learn else value


def decay_of(layer: Any, tau: Any) -> jax.Array:
    """``exp(-dt / tau)`` per unit; through ``etp_elemwise_p`` when ``tau`` is learned."""
    from .. import ops

    decay = Decay(get_dt(layer))
    try:
        if isinstance(tau, brainstate.ParamState):
            return ops.elementwise(tau.value, fn=decay)
        return decay(tau)
    except ConfigError as error:
        raise ConfigError(f"{describe(layer)}: {error}") from None

"""saiunit quantities at the boundary of the ETP ops.

Primitives see plain arrays only: the public op functions split each quantity into
mantissa and unit before binding and attach the output unit afterwards.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import saiunit as u

from ..errors import ShapeError

__all__ = ["attach_unit", "in_unit", "split_unit"]


def split_unit(value: Any) -> tuple[jax.Array, u.Unit]:
    """``(mantissa as a jax array, unit)``; plain arrays have the unitless unit."""
    mantissa, unit = u.split_mantissa_unit(value)
    return jnp.asarray(mantissa), unit


def in_unit(value: Any, unit: u.Unit, *, op: str, what: str) -> jax.Array:
    """The mantissa of ``value`` expressed in ``unit``; error when dimensions differ."""
    ratio = value / unit
    if not u.get_unit(ratio).is_unitless:
        raise ShapeError(
            f"{op}: {what} must have the unit {unit} of the output, got {u.get_unit(value)}"
        )
    return jnp.asarray(u.get_mantissa(ratio))


def attach_unit(mantissa: jax.Array, unit: u.Unit) -> Any:
    """``mantissa`` as a quantity of ``unit`` (the bare array when unitless)."""
    return mantissa if unit.is_unitless else u.Quantity(mantissa, unit=unit)

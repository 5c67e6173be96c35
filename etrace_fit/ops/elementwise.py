"""Elementwise ETP primitive: ``y = fn(θ)`` for a per-unit parameter θ.

Time constants, thresholds and gains are parameters that act on each unit alone; the
op has no input ``x``. The compiler may look through it (it is not a boundary between
hidden groups). :func:`elementwise` is the public entry point.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax
import saiunit as u

from .. import _compat
from ..errors import ShapeError
from ._units import attach_unit, split_unit
from .registry import EtpOp, check_no_traced_capture

__all__ = ["elementwise", "etp_elemwise_p"]

ParamFn = Callable[[jax.Array], jax.Array]


def _identity(theta):
    return theta


def _elemwise_reference(theta, *, fn: ParamFn):
    return fn(theta)


def _abstract_eval(theta, *, fn: ParamFn):
    out = jax.eval_shape(fn, jax.ShapeDtypeStruct(theta.shape, theta.dtype))
    return _compat.ShapedArray(out.shape, out.dtype)


def _jvp(primals, tangents, *, fn: ParamFn):
    (theta,), (dtheta,) = primals, tangents
    y = etp_elemwise_p.bind(theta, fn=fn)
    _, dy = jax.jvp(fn, (theta,), (dtheta,))
    return y, dy


@dataclasses.dataclass(frozen=True)
class _MappedFn:
    """``fn`` applied along a ``vmap``-ped axis; a value, so jit caches are shared."""

    fn: ParamFn
    axis: int

    def __call__(self, theta):
        return jax.vmap(self.fn, in_axes=self.axis)(theta)


def _batch(args, dims, *, fn: ParamFn):
    (theta,), (dim,) = args, dims
    return etp_elemwise_p.bind(theta, fn=_MappedFn(fn, dim)), 0


etp_elemwise_p = _compat.register_primitive(
    "etp_elemwise",
    reference=_elemwise_reference,
    abstract_eval=_abstract_eval,
    jvp=_jvp,
    batch=_batch,
)


class ElementwiseOp(EtpOp):
    """Registry entry of ``etp_elemwise_p``: one operand, the parameter θ."""

    kind = "elementwise"
    x_index = None
    transparent = True

    def trainable_positions(self, num_operands: int) -> dict[str, int]:
        return {"weight": 0}

    def reference(self, x, trainables: Mapping[str, Any], params: Mapping[str, Any]) -> jax.Array:
        return _elemwise_reference(trainables["weight"], fn=params["fn"])

    def drtrl_trace_shapes(self, *, batch_shape, x_shape, trainable_shapes, y_shape, num_states):
        # One trace entry per sample, unit and state: ε[b, *θ, s].
        return {"weight": (*batch_shape, *trainable_shapes["weight"], num_states)}


ElementwiseOp(etp_elemwise_p)


@dataclasses.dataclass(frozen=True)
class _WithUnit:
    """Runs ``fn`` on the quantity ``θ * unit`` and returns the mantissa in ``out_unit``."""

    fn: ParamFn
    unit: Any
    out_unit: Any

    def __call__(self, theta):
        out = self.fn(u.Quantity(theta, unit=self.unit))
        return u.get_mantissa(out / self.out_unit) if not self.out_unit.is_unitless else u.get_mantissa(out)


def elementwise(w: Any, fn: ParamFn | None = None) -> Any:
    """``fn(w)`` through ``etp_elemwise_p``, for a per-unit trainable parameter.

    Args:
        w: the parameter θ, any shape (e.g. ``(units,)``), optionally a saiunit
            quantity, in which case ``fn`` receives the quantity.
        fn: an elementwise function (identity by default): its output must have the
            shape of ``w``. Pass a hashable callable (module-level function or frozen
            dataclass) so repeated calls share jit caches. It is a static part of the
            op: the values it closes over must be concrete, not traced.

    Returns:
        ``fn(w)`` with ``w``'s shape (a quantity when ``fn`` returns one).

    Example (``dt`` a Python float)::

        alpha = elementwise(tau, fn=lambda tau: jnp.exp(-dt / tau))
    """
    fn = _identity if fn is None else fn
    check_no_traced_capture("etp_elemwise", "fn", fn)
    theta, unit = split_unit(w)
    if unit.is_unitless:
        inner, out_unit = fn, unit
    else:
        probe = jax.eval_shape(lambda t: fn(u.Quantity(t, unit=unit)), jax.ShapeDtypeStruct(theta.shape, theta.dtype))
        out_unit = u.get_unit(probe)
        inner = _WithUnit(fn, unit, out_unit)
    out = jax.eval_shape(inner, jax.ShapeDtypeStruct(theta.shape, theta.dtype))
    if tuple(out.shape) != tuple(theta.shape):
        raise ShapeError(
            f"etp_elemwise: fn must map the parameter elementwise, keeping its shape "
            f"{tuple(theta.shape)}, but it returned shape {tuple(out.shape)}"
        )
    return attach_unit(etp_elemwise_p.bind(theta, fn=inner), out_unit)

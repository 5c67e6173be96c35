"""Convolution ETP primitive, 1-D and 2-D, channels-last.

``x: (B, *spatial, C_in)``, ``W: (*kernel, C_in, C_out)``, optional ``b: (C_out,)``;
stride, padding and kernel dilation are equation parameters. Like the dense op it is a
boundary for the compiler. :func:`conv` is the public entry point.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from .. import _compat
from ..errors import ShapeError
from ._units import attach_unit, in_unit, split_unit
from .registry import EtpOp, apply_weight_fn, check_same_dtype, check_weight_fn, weight_fn_jvp

__all__ = ["conv", "etp_conv_p"]

WeightFn = Callable[[jax.Array], jax.Array]
_DIMENSION_NUMBERS = {1: ("NWC", "WIO", "NWC"), 2: ("NHWC", "HWIO", "NHWC"), 3: ("NDHWC", "DHWIO", "NDHWC")}


def _conv_no_bias(x, weight, *, strides, padding, dilation):
    return lax.conv_general_dilated(
        x,
        weight,
        window_strides=strides,
        padding=padding,
        rhs_dilation=dilation,
        dimension_numbers=_DIMENSION_NUMBERS[weight.ndim - 2],
    )


def _conv_reference(x, weight, *bias, strides, padding, dilation, weight_fn=None):
    y = _conv_no_bias(x, apply_weight_fn(weight_fn, weight), strides=strides, padding=padding, dilation=dilation)
    return y + bias[0] if bias else y


def _check_conv_shapes(x_shape, weight_shape, bias_shape) -> None:
    spatial = len(weight_shape) - 2
    if spatial not in _DIMENSION_NUMBERS:
        raise ShapeError(
            f"etp_conv: weight must have shape (*kernel, C_in, C_out) with a 1-D, 2-D or 3-D kernel, "
            f"got weight.shape={tuple(weight_shape)}"
        )
    if len(x_shape) != spatial + 2:
        raise ShapeError(
            f"etp_conv: a {spatial}-D kernel needs x of shape (B, {', '.join(['...'] * spatial)}, C_in), "
            f"got x.shape={tuple(x_shape)} with weight.shape={tuple(weight_shape)}"
        )
    if x_shape[-1] != weight_shape[-2]:
        raise ShapeError(
            f"etp_conv: x.shape={tuple(x_shape)} and weight.shape={tuple(weight_shape)} do not match: "
            f"x's channel axis ({x_shape[-1]}) must equal weight's C_in axis ({weight_shape[-2]})"
        )
    if bias_shape is not None and tuple(bias_shape) != (weight_shape[-1],):
        raise ShapeError(
            f"etp_conv: bias must have shape ({weight_shape[-1]},) to match weight.shape="
            f"{tuple(weight_shape)}, got bias.shape={tuple(bias_shape)}"
        )


def _abstract_eval(x, weight, *bias, strides, padding, dilation, weight_fn=None):
    _check_conv_shapes(x.shape, weight.shape, bias[0].shape if bias else None)
    check_same_dtype("etp_conv", x=x, weight=weight, bias=bias[0] if bias else None)
    out = jax.eval_shape(
        lambda a, w: _conv_no_bias(a, w, strides=strides, padding=padding, dilation=dilation),
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        jax.ShapeDtypeStruct(weight.shape, weight.dtype),
    )
    return _compat.ShapedArray(out.shape, out.dtype)


def _jvp(primals, tangents, *, strides, padding, dilation, weight_fn=None):
    x, weight, *bias = primals
    dx, dweight, *dbias = tangents
    geometry = dict(strides=strides, padding=padding, dilation=dilation)
    y = etp_conv_p.bind(x, weight, *bias, weight_fn=weight_fn, **geometry)
    terms = []
    if not _compat.is_symbolic_zero(dx):
        terms.append(_conv_no_bias(dx, apply_weight_fn(weight_fn, weight), **geometry))
    if not _compat.is_symbolic_zero(dweight):
        _, dweight_eff = weight_fn_jvp(weight_fn, weight, dweight)
        terms.append(_conv_no_bias(x, dweight_eff, **geometry))
    if dbias and not _compat.is_symbolic_zero(dbias[0]):
        terms.append(jnp.broadcast_to(dbias[0], y.shape))
    tangent = sum(terms[1:], terms[0]) if terms else jnp.zeros_like(y)
    return y, tangent


def _batch(args, dims, *, strides, padding, dilation, weight_fn=None):
    x, *rest = args
    x_dim, *rest_dims = dims
    geometry = dict(strides=strides, padding=padding, dilation=dilation, weight_fn=weight_fn)
    if any(d is not _compat.NOT_MAPPED for d in rest_dims):
        # Per-sample weights (rare): plain computation, no longer an ETP op.
        out = jax.vmap(lambda *a: _conv_reference(*a, **geometry), in_axes=tuple(dims))(*args)
        return out, 0
    x = jnp.moveaxis(x, x_dim, 0)
    mapped, batch = x.shape[0], x.shape[1]
    y = etp_conv_p.bind(x.reshape(mapped * batch, *x.shape[2:]), *rest, **geometry)
    return y.reshape(mapped, batch, *y.shape[1:]), 0


etp_conv_p = _compat.register_primitive(
    "etp_conv", reference=_conv_reference, abstract_eval=_abstract_eval, jvp=_jvp, batch=_batch
)


class ConvOp(EtpOp):
    """Registry entry of ``etp_conv_p``: operands ``(x, weight[, bias])``."""

    kind = "conv"
    x_index = 0
    transparent = False

    def trainable_positions(self, num_operands: int) -> dict[str, int]:
        return {"weight": 1, "bias": 2} if num_operands == 3 else {"weight": 1}

    def reference(self, x, trainables: Mapping[str, Any], params: Mapping[str, Any]) -> jax.Array:
        bias = (trainables["bias"],) if "bias" in trainables else ()
        return _conv_reference(x, trainables["weight"], *bias, **params)

    def drtrl_trace_shapes(self, *, batch_shape, x_shape, trainable_shapes, y_shape, num_states):
        # Every output position carries its own trace of the shared kernel:
        # ε[b, *position, *kernel, c_in, c_out, s]; the bias: ε[b, *position, c_out, s].
        positions = tuple(y_shape[len(batch_shape) : -1])
        shapes = {"weight": (*batch_shape, *positions, *trainable_shapes["weight"], num_states)}
        if "bias" in trainable_shapes:
            shapes["bias"] = (*batch_shape, *positions, *trainable_shapes["bias"], num_states)
        return shapes

    def esd_trace_shapes(self, *, batch_shape, x_shape, trainable_shapes, y_shape, num_states):
        # ε_x smooths the input patch each output position sees: (b, *position, K·C_in).
        positions = tuple(y_shape[len(batch_shape) : -1])
        patch = math.prod(trainable_shapes["weight"][:-1])
        return (*batch_shape, *positions, patch), (*y_shape, num_states)


ConvOp(etp_conv_p)


def _normalise_tuple(value: int | Sequence[int], spatial: int, name: str) -> tuple[int, ...]:
    values = (value,) * spatial if isinstance(value, int) else tuple(value)
    if len(values) != spatial or not all(isinstance(v, int) and v >= 1 for v in values):
        raise ShapeError(f"etp_conv: {name} must be a positive int or {spatial} positive ints, got {value!r}")
    return values


def _normalise_padding(padding, x_spatial, kernel_spatial, strides, dilation) -> tuple[tuple[int, int], ...]:
    spatial = len(kernel_spatial)
    if isinstance(padding, str):
        if padding.upper() not in ("SAME", "VALID"):
            raise ShapeError(f"etp_conv: padding must be 'SAME', 'VALID', an int or (low, high) pairs, got {padding!r}")
        dilated = [(k - 1) * d + 1 for k, d in zip(kernel_spatial, dilation)]
        return tuple(lax.padtype_to_pads(x_spatial, dilated, strides, padding.upper()))
    if isinstance(padding, int):
        return ((padding, padding),) * spatial
    pairs = tuple(tuple(p) if not isinstance(p, int) else (p, p) for p in padding)
    if len(pairs) != spatial or not all(len(p) == 2 for p in pairs):
        raise ShapeError(f"etp_conv: padding must give {spatial} (low, high) pairs, got {padding!r}")
    return tuple((int(lo), int(hi)) for lo, hi in pairs)


def conv(
    x: Any,
    w: Any,
    b: Any = None,
    *,
    stride: int | Sequence[int] = 1,
    padding: str | int | Sequence[Any] = "SAME",
    dilation: int | Sequence[int] = 1,
    weight_fn: WeightFn | None = None,
) -> Any:
    """Channels-last convolution through ``etp_conv_p``.

    Args:
        x: ``(B, L, C_in)`` / ``(B, H, W, C_in)``, or the same without the batch axis.
        w: ``(K, C_in, C_out)`` (1-D) or ``(KH, KW, C_in, C_out)`` (2-D).
        b: optional ``(C_out,)`` bias.
        stride: int or one int per spatial axis.
        padding: ``"SAME"``, ``"VALID"``, an int, or one ``(low, high)`` pair per axis.
        dilation: kernel dilation, int or one int per spatial axis.
        weight_fn: optional shape-preserving function of the kernel (see :func:`matmul`).

    Returns:
        ``(B, *spatial_out, C_out)`` (no batch axis if ``x`` had none).
    """
    x_m, x_unit = split_unit(x)
    w_m, w_unit = split_unit(w)
    out_unit = x_unit * w_unit
    b_m = None if b is None else in_unit(b, out_unit, op="etp_conv", what="bias b")
    spatial = w_m.ndim - 2
    unbatched = x_m.ndim == spatial + 1
    if unbatched:
        x_m = x_m[None]
    _check_conv_shapes(x_m.shape, w_m.shape, None if b_m is None else b_m.shape)
    check_weight_fn("etp_conv", weight_fn, w_m)
    strides = _normalise_tuple(stride, spatial, "stride")
    dilation_ = _normalise_tuple(dilation, spatial, "dilation")
    pads = _normalise_padding(padding, x_m.shape[1:-1], w_m.shape[:spatial], strides, dilation_)
    dtype = jnp.result_type(*(a for a in (x_m, w_m, b_m) if a is not None))
    bias = () if b_m is None else (b_m.astype(dtype),)
    y = etp_conv_p.bind(
        x_m.astype(dtype), w_m.astype(dtype), *bias,
        strides=strides, padding=pads, dilation=dilation_, weight_fn=weight_fn,
    )
    return attach_unit(y[0] if unbatched else y, out_unit)

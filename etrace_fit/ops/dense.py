"""Dense ETP primitives: ``y = x @ weight_fn(W) + b``.

``etp_mm_p`` takes a batch ``x: (B, I)``, ``etp_mv_p`` one sample ``x: (I,)``; both
take ``W: (I, O)`` and an optional ``b: (O,)``. A vmapped ``etp_mv_p`` becomes an
``etp_mm_p`` and a vmapped ``etp_mm_p`` stays one, so the op remains visible to the
compiler. :func:`matmul` is the public entry point.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
from jax import lax

from .. import _compat
from ..errors import ShapeError
from ._units import attach_unit, in_unit, split_unit
from .registry import EtpOp, apply_weight_fn, check_same_dtype, check_weight_fn, weight_fn_jvp

__all__ = ["etp_mm_p", "etp_mv_p", "matmul", "matmul_of_parts", "weight_rows"]

WeightFn = Callable[[jax.Array], jax.Array]


def _dense_reference(x, weight, *bias, weight_fn: WeightFn | None = None):
    y = jnp.matmul(x, apply_weight_fn(weight_fn, weight))
    return y + bias[0] if bias else y


def _check_dense_shapes(op: str, x_ndim: int, x, weight, bias) -> None:
    if x.ndim != x_ndim:
        expected = "(B, I)" if x_ndim == 2 else "(I,)"
        raise ShapeError(f"{op}: x must have shape {expected}, got x.shape={tuple(x.shape)}")
    if weight.ndim != 2:
        raise ShapeError(f"{op}: weight must have shape (I, O), got weight.shape={tuple(weight.shape)}")
    if x.shape[-1] != weight.shape[0]:
        raise ShapeError(
            f"{op}: x.shape={tuple(x.shape)} and weight.shape={tuple(weight.shape)} do not match: "
            f"x's last axis ({x.shape[-1]}) must equal weight's first axis ({weight.shape[0]})"
        )
    if bias is not None and tuple(bias.shape) != (weight.shape[1],):
        raise ShapeError(
            f"{op}: bias must have shape ({weight.shape[1]},) to match weight.shape="
            f"{tuple(weight.shape)}, got bias.shape={tuple(bias.shape)}"
        )


def _make_abstract_eval(op: str, x_ndim: int):
    def abstract_eval(x, weight, *bias, weight_fn=None):
        _check_dense_shapes(op, x_ndim, x, weight, bias[0] if bias else None)
        check_same_dtype(op, x=x, weight=weight, bias=bias[0] if bias else None)
        return _compat.ShapedArray((*x.shape[:-1], weight.shape[1]), x.dtype)

    return abstract_eval


def _make_jvp(get_primitive: Callable[[], Any]):
    def jvp(primals, tangents, *, weight_fn=None):
        x, weight, *bias = primals
        dx, dweight, *dbias = tangents
        y = get_primitive().bind(x, weight, *bias, weight_fn=weight_fn)
        terms = []
        if not _compat.is_symbolic_zero(dx):
            terms.append(jnp.matmul(dx, apply_weight_fn(weight_fn, weight)))
        if not _compat.is_symbolic_zero(dweight):
            _, dweight_eff = weight_fn_jvp(weight_fn, weight, dweight)
            terms.append(jnp.matmul(x, dweight_eff))
        if dbias and not _compat.is_symbolic_zero(dbias[0]):
            terms.append(jnp.broadcast_to(dbias[0], y.shape))
        tangent = sum(terms[1:], terms[0]) if terms else jnp.zeros_like(y)
        return y, tangent

    return jvp


def _fallback_batch(args, dims, weight_fn):
    """Weights mapped by ``vmap`` (rare: per-sample weights): plain computation."""
    out = jax.vmap(lambda *a: _dense_reference(*a, weight_fn=weight_fn), in_axes=tuple(dims))(*args)
    return out, 0


def _mm_batch(args, dims, *, weight_fn=None):
    x, *rest = args
    x_dim, *rest_dims = dims
    if any(d is not _compat.NOT_MAPPED for d in rest_dims):
        return _fallback_batch(args, dims, weight_fn)
    x = jnp.moveaxis(x, x_dim, 0)
    mapped, batch = x.shape[0], x.shape[1]
    y = etp_mm_p.bind(x.reshape(mapped * batch, x.shape[2]), *rest, weight_fn=weight_fn)
    return y.reshape(mapped, batch, y.shape[-1]), 0


def _mv_batch(args, dims, *, weight_fn=None):
    x, *rest = args
    x_dim, *rest_dims = dims
    if any(d is not _compat.NOT_MAPPED for d in rest_dims):
        return _fallback_batch(args, dims, weight_fn)
    return etp_mm_p.bind(jnp.moveaxis(x, x_dim, 0), *rest, weight_fn=weight_fn), 0


etp_mm_p = _compat.register_primitive(
    "etp_mm",
    reference=_dense_reference,
    abstract_eval=_make_abstract_eval("etp_mm", 2),
    jvp=_make_jvp(lambda: etp_mm_p),
    batch=_mm_batch,
)
etp_mv_p = _compat.register_primitive(
    "etp_mv",
    reference=_dense_reference,
    abstract_eval=_make_abstract_eval("etp_mv", 1),
    jvp=_make_jvp(lambda: etp_mv_p),
    batch=_mv_batch,
)


def weight_rows(weight: jax.Array, sizes: list[int], weight_fn: WeightFn | None = None) -> list[jax.Array]:
    """The effective weight ``weight_fn(W)`` split into row blocks of ``sizes``."""
    effective = apply_weight_fn(weight_fn, weight)
    starts = [sum(sizes[:n]) for n in range(len(sizes))]
    return [effective[start:start + size] for start, size in zip(starts, sizes)]


def matmul_of_parts(primitive: Any, x: jax.Array, parts: list[jax.Array], weight: jax.Array, *bias: jax.Array,
                    weight_fn: WeightFn | None = None, rows_t: list[jax.Array] | None = None) -> jax.Array:
    """``primitive``'s output for ``x = concatenate(parts, axis=-1)`` (one GEMM forward),
    differentiated part by part: a part with a tangent contributes ``dpart @ W[rows]``,
    a part without one nothing. Its transpose is ``δy @ W[rows]ᵀ`` for the parts that
    need a cotangent only (a GRU gate's ``[x, h]``: the ``h`` columns, not all of
    ``I + H``), where differentiating the concatenation would compute every column and
    slice. ``x``'s own tangent is ignored: ``x`` must be ``concatenate(parts)``.
    ``rows_t``: the transposes ``(O, size)`` of :func:`weight_rows`' blocks, computed
    once outside a loop (a slice inside it would copy the weight every step) and laid
    out contiguously; they are constants of the differentiation. The pull-back is then
    ``δy @ rows_t[n]``, a product with a row-major operand, which XLA on CPU runs faster
    than one with the transpose folded in (the tangent, if wanted, takes the folded
    form). Without them the blocks are sliced here."""
    sizes = [part.shape[-1] for part in parts]

    @jax.custom_jvp
    def dense(x, parts, weight, bias):
        return primitive.bind(x, weight, *bias, weight_fn=weight_fn)

    def jvp(primals, tangents):
        x, parts, weight, bias = primals
        _, dparts, dweight, dbias = tangents
        y = primitive.bind(x, weight, *bias, weight_fn=weight_fn)
        if rows_t is not None:  # dpart @ rows_t[n]ᵀ: its transpose is δy @ rows_t[n]
            products = [lambda d, n=n: lax.dot_general(d, rows_t[n], (((d.ndim - 1,), (1,)), ((), ())))
                        for n in range(len(parts))]
        else:
            blocks = weight_rows(weight, sizes, weight_fn)
            products = [lambda d, n=n: jnp.matmul(d, blocks[n]) for n in range(len(parts))]
        terms = [product(dpart) for product, dpart in zip(products, dparts) if not _compat.is_symbolic_zero(dpart)]
        if not _compat.is_symbolic_zero(dweight):
            terms.append(jnp.matmul(x, weight_fn_jvp(weight_fn, weight, dweight)[1]))
        if dbias and not _compat.is_symbolic_zero(dbias[0]):
            terms.append(jnp.broadcast_to(dbias[0], y.shape))
        return y, (sum(terms[1:], terms[0]) if terms else jnp.zeros_like(y))

    dense.defjvp(jvp, symbolic_zeros=True)
    return dense(x, list(parts), weight, list(bias))


class DenseOp(EtpOp):
    """Registry entry of ``etp_mm_p`` / ``etp_mv_p``: operands ``(x, weight[, bias])``."""

    kind = "dense"
    x_index = 0
    transparent = False

    def trainable_positions(self, num_operands: int) -> dict[str, int]:
        return {"weight": 1, "bias": 2} if num_operands == 3 else {"weight": 1}

    def reference(self, x, trainables: Mapping[str, Any], params: Mapping[str, Any]) -> jax.Array:
        bias = (trainables["bias"],) if "bias" in trainables else ()
        return _dense_reference(x, trainables["weight"], *bias, weight_fn=params.get("weight_fn"))

    def drtrl_trace_shapes(self, *, batch_shape, x_shape, trainable_shapes, y_shape, num_states):
        # ε[b, i, k, s] for the weight; the bias is a weight whose input is constant 1.
        return {key: (*batch_shape, *shape, num_states) for key, shape in trainable_shapes.items()}

    def esd_trace_shapes(self, *, batch_shape, x_shape, trainable_shapes, y_shape, num_states):
        return tuple(x_shape), (*y_shape, num_states)


DenseOp(etp_mm_p)
DenseOp(etp_mv_p)


def matmul(x: Any, w: Any, b: Any = None, weight_fn: WeightFn | None = None) -> Any:
    """``x @ weight_fn(w) + b`` through a dense ETP primitive.

    Args:
        x: ``(I,)`` (one sample: ``etp_mv_p``), ``(B, I)`` (``etp_mm_p``), or
            ``(..., I)`` (leading axes flattened into one batch axis, then restored).
        w: ``(I, O)`` weight.
        b: optional ``(O,)`` bias, in the unit of ``x * w``.
        weight_fn: optional shape-preserving function applied to ``w`` inside the op
            (mask, sign constraint, positivity); gradients flow through it. It gets the
            mantissa of ``w`` and must be hashable (a module-level function or a
            frozen dataclass instance, so repeated calls share jit caches).

    Returns:
        ``(..., O)``, a saiunit quantity when ``x`` or ``w`` carries a unit.
    """
    x_m, x_unit = split_unit(x)
    w_m, w_unit = split_unit(w)
    out_unit = x_unit * w_unit
    b_m = None if b is None else in_unit(b, out_unit, op="etp_mm", what="bias b")
    dtype = jnp.result_type(*(a for a in (x_m, w_m, b_m) if a is not None))
    x_m, w_m = x_m.astype(dtype), w_m.astype(dtype)
    bias = () if b_m is None else (b_m.astype(dtype),)

    if x_m.ndim == 0:
        raise ShapeError(f"etp_mm: x must have at least one axis, got a scalar; weight.shape={tuple(w_m.shape)}")
    # Check the shapes the caller gave, before leading axes are flattened away.
    _check_dense_shapes("etp_mv" if x_m.ndim == 1 else "etp_mm", x_m.ndim, x_m, w_m, b_m)
    check_weight_fn("etp_mm", weight_fn, w_m)
    if x_m.ndim == 1:
        y = etp_mv_p.bind(x_m, w_m, *bias, weight_fn=weight_fn)
    elif x_m.ndim == 2:
        y = etp_mm_p.bind(x_m, w_m, *bias, weight_fn=weight_fn)
    else:
        lead = x_m.shape[:-1]
        y = etp_mm_p.bind(x_m.reshape(-1, x_m.shape[-1]), w_m, *bias, weight_fn=weight_fn)
        y = y.reshape(*lead, y.shape[-1])
    return attach_unit(y, out_unit)

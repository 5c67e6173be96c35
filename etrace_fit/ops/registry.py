"""What the compiler and the learning rules know about each ETP primitive.

An ETP (eligibility-trace propagation) primitive marks the place where a weight meets
an input: ``y = op(x, θ)``. Every primitive registers one :class:`EtpOp` here, saying
which operands are trainable (by key and position), which is ``x``, whether the
compiler may look through the op, and the per-sample rules the learning rules need.
Read ``dense.py`` next for a concrete op.
"""

from __future__ import annotations

import abc
import math
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp

from .._compat import Primitive
from .._compat import is_tracer
from ..errors import ConfigError, ShapeError

__all__ = ["EtpOp", "etp_op_info", "is_etp_primitive", "registered_ops"]

Shape = tuple[int, ...]

_REGISTRY: dict[Primitive, "EtpOp"] = {}


class EtpOp(abc.ABC):
    """Metadata and per-sample rules of one ETP primitive.

    Attributes:
        kind: ``"dense"``, ``"elementwise"`` or ``"conv"``.
        primitive: the JAX primitive.
        x_index: position of the input ``x`` among the operands (``None``: no ``x``).
        y_index: position of ``y`` among the outputs (all ETP ops have one output).
        transparent: whether the compiler may look through the op when it groups
            hidden states (elementwise ops: yes; dense and conv ops are boundaries).
    """

    kind: str
    primitive: Primitive
    x_index: int | None
    y_index: int = 0
    transparent: bool = False

    def __init__(self, primitive: Primitive):
        self.primitive = primitive
        _REGISTRY[primitive] = self

    @property
    def name(self) -> str:
        return self.primitive.name

    # ----------------------------------------------------------------- operands
    @abc.abstractmethod
    def trainable_positions(self, num_operands: int) -> dict[str, int]:
        """Positions of the trainable operands by key (``"weight"``, ``"bias"``)."""

    def split_operands(self, operands: Sequence[Any]) -> tuple[Any, dict[str, Any]]:
        """``(x, {key: trainable operand})`` from an equation's operands in order."""
        positions = self.trainable_positions(len(operands))
        x = None if self.x_index is None else operands[self.x_index]
        return x, {key: operands[pos] for key, pos in positions.items()}

    @abc.abstractmethod
    def reference(self, x: Any, trainables: Mapping[str, Any], params: Mapping[str, Any]) -> jax.Array:
        """The op's output from plain ``jax.numpy``; ``params`` are the equation's."""

    # -------------------------------------------------------- learning-rule hooks
    def weight_grad(
        self,
        x: Any,
        trainables: Mapping[str, Any],
        y_cotangent: jax.Array,
        params: Mapping[str, Any],
        *,
        per_sample: bool = False,
    ) -> dict[str, jax.Array]:
        """Gradient of ``<y_cotangent, y>`` with respect to each trainable operand.

        Includes the op's ``weight_fn``. With ``per_sample=False`` the batch is summed
        (one value per trainable, shaped like it). With ``per_sample=True`` the
        cotangent (and ``x``) carry a leading batch axis ``B`` and each result gets
        one: ``(B, *trainable.shape)``; for a dense op this is the outer product
        ``x[b, i] * y_cotangent[b, k]``.
        """
        trainables = dict(trainables)

        def contract(x_, cotangent):
            _, vjp = jax.vjp(lambda tr: self.reference(x_, tr, params), trainables)
            return vjp(cotangent)[0]

        if not per_sample:
            return contract(x, y_cotangent)
        if self.x_index is None:
            return jax.vmap(lambda c: contract(None, c))(y_cotangent)
        return jax.vmap(lambda xb, cb: contract(xb[None], cb[None]))(x, y_cotangent)

    @abc.abstractmethod
    def drtrl_trace_shapes(
        self,
        *,
        batch_shape: Shape,
        x_shape: Shape | None,
        trainable_shapes: Mapping[str, Shape],
        y_shape: Shape,
        num_states: int,
    ) -> dict[str, Shape]:
        """Shape of the D-RTRL trace of each trainable operand (docs/theory.md §5.1).

        ``batch_shape`` is the hidden state's batch axes (``()`` unbatched);
        ``x_shape`` and ``y_shape`` are the op's own; ``num_states`` is the hidden
        group's ``S``. Traces carry the batch axes first and ``S`` last.
        """

    def esd_trace_shapes(
        self,
        *,
        batch_shape: Shape,
        x_shape: Shape | None,
        trainable_shapes: Mapping[str, Shape],
        y_shape: Shape,
        num_states: int,
    ) -> tuple[Shape, Shape] | None:
        """Shapes ``(ε_x, ε_f)`` of the ES-D-RTRL traces (docs/theory.md §5.2), or ``None``
        when the factorisation does not apply (an op with no ``x``)."""
        return None

    def trace_bytes(self, shapes: Mapping[str, Shape] | Sequence[Shape], itemsize: int = 4) -> int:
        """Bytes taken by traces of the given shapes."""
        values = shapes.values() if isinstance(shapes, Mapping) else shapes
        return sum(math.prod(shape) for shape in values) * itemsize

    def __repr__(self) -> str:
        return f"EtpOp({self.name}, kind={self.kind!r})"


def etp_op_info(primitive: Any) -> EtpOp | None:
    """The :class:`EtpOp` registered for ``primitive``, or ``None`` for other primitives."""
    return _REGISTRY.get(primitive)


def is_etp_primitive(primitive: Any) -> bool:
    """Whether ``primitive`` is one of the ETP primitives."""
    return primitive in _REGISTRY


def registered_ops() -> tuple[EtpOp, ...]:
    """All registered ETP ops, in registration order."""
    return tuple(_REGISTRY.values())


def apply_weight_fn(weight_fn: Callable[[jax.Array], jax.Array] | None, weight: jax.Array) -> jax.Array:
    """The effective weight ``weight_fn(weight)`` (identity when ``weight_fn`` is None)."""
    return weight if weight_fn is None else weight_fn(weight)


def weight_fn_jvp(
    weight_fn: Callable[[jax.Array], jax.Array] | None, weight: jax.Array, tangent: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """``(weight_fn(weight), its tangent)``: forward-mode through the weight function."""
    if weight_fn is None:
        return weight, tangent
    return jax.jvp(weight_fn, (weight,), (tangent,))


def check_same_dtype(op: str, **operands: Any) -> None:
    """Raise :class:`~etrace_fit.errors.ShapeError` unless all operands share a dtype."""
    dtypes = {name: jnp.dtype(value.dtype) for name, value in operands.items() if value is not None}
    if len(set(dtypes.values())) > 1:
        listing = ", ".join(f"{name}: {dtype}" for name, dtype in dtypes.items())
        raise ShapeError(f"{op}: operands must share one dtype, got {listing}")


def check_weight_fn(op: str, weight_fn: Callable[[jax.Array], jax.Array] | None, weight: jax.Array) -> None:
    """Raise :class:`~etrace_fit.errors.ShapeError` unless ``weight_fn`` keeps the weight's shape."""
    if weight_fn is None:
        return
    if not callable(weight_fn):
        raise ShapeError(f"{op}: weight_fn must be callable or None, got {type(weight_fn).__name__}")
    check_no_traced_capture(op, "weight_fn", weight_fn)
    effective = jax.eval_shape(weight_fn, jax.ShapeDtypeStruct(weight.shape, weight.dtype))
    if tuple(effective.shape) != tuple(weight.shape):
        raise ShapeError(
            f"{op}: weight_fn must keep the weight's shape {tuple(weight.shape)}, "
            f"it returned {tuple(effective.shape)}"
        )


def _captured_values(fn: Any, depth: int = 0) -> list[Any]:
    """Values a callable closes over: closure cells and attributes, one level into callables."""
    found = []
    cells = getattr(fn, "__closure__", None) or ()
    members = [cell.cell_contents for cell in cells if cell.cell_contents is not None]
    members += list(getattr(fn, "__dict__", {}).values())
    for member in members:
        if callable(member) and not hasattr(member, "shape") and depth < 2:
            found.extend(_captured_values(member, depth + 1))
        elif isinstance(member, (tuple, list)) and depth < 2:
            for item in member:
                found.extend(_captured_values(item, depth + 1) if callable(item) else jax.tree.leaves(item))
        else:
            found.extend(jax.tree.leaves(member))
    return found


def check_no_traced_capture(op: str, argument: str, fn: Any) -> None:
    """Raise :class:`ConfigError` when ``fn`` closes over a traced value.

    The function is a static parameter of the primitive; a tracer captured from an
    enclosing ``jit``/``vmap``/``grad`` would leak out of its trace (JAX's
    "UnexpectedTracerError" or "No constant handler"). Such values must be concrete.
    """
    if fn is None:
        return
    if any(is_tracer(value) for value in _captured_values(fn)):
        raise ConfigError(
            f"{op}: {argument} closes over a traced value (an argument of an enclosing jit, vmap or "
            f"grad); {argument} is a static part of the op, so the values it uses must be concrete "
            f"(Python numbers or arrays known before tracing)"
        )

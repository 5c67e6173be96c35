"""Every use of JAX internals lives here, so a JAX upgrade touches one file.

The rest of the package imports primitives, jaxpr types and interpreter hooks from
this module only. Tested against the JAX range pinned in ``pyproject.toml``; read
``etrace_fit/ops/registry.py`` next to see how the ETP primitives use these hooks.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
from jax.extend.core import (  # noqa: F401  (re-exported for the compiler)
    ClosedJaxpr,
    Jaxpr,
    JaxprEqn,
    Literal,
    Primitive,
    Var,
    jaxpr_as_fun,
    new_jaxpr_eqn,
)
from jax.interpreters import ad, batching, mlir

ShapedArray = jax.core.ShapedArray
eval_jaxpr = jax.core.eval_jaxpr

#: The batch-dimension marker JAX uses for an operand that ``vmap`` does not map.
NOT_MAPPED = None

__all__ = [
    "ClosedJaxpr",
    "Jaxpr",
    "JaxprEqn",
    "Literal",
    "NOT_MAPPED",
    "Primitive",
    "ShapedArray",
    "Var",
    "eval_jaxpr",
    "is_symbolic_zero",
    "is_tracer",
    "jaxpr_as_fun",
    "new_jaxpr_eqn",
    "register_primitive",
]


def is_tracer(value: Any) -> bool:
    """True when ``value`` is a JAX tracer (an abstract value under a transformation)."""
    return isinstance(value, jax.core.Tracer)


def is_symbolic_zero(tangent: Any) -> bool:
    """True when ``tangent`` is JAX's symbolic zero (an input with no tangent)."""
    return type(tangent) is ad.Zero


def register_primitive(
    name: str,
    *,
    reference: Callable[..., Any],
    abstract_eval: Callable[..., Any],
    jvp: Callable[..., Any],
    batch: Callable[..., Any],
) -> Primitive:
    """Create a single-output primitive with all the JAX rules it needs.

    ``reference`` computes the output from plain ``jax.numpy`` and serves both as the
    eager implementation (after ``abstract_eval`` has checked the operands) and, via
    ``mlir.lower_fun``, as the lowering under ``jit``.
    ``jvp(primals, tangents, **params)`` and ``batch(args, dims, **params)`` follow the
    signatures of ``ad.primitive_jvps`` and ``batching.primitive_batchers``; the JVP
    must express tangents with ordinary (transposable) ops so reverse mode works
    without a transpose rule of our own.
    """
    primitive = Primitive(name)

    def checked_reference(*args, **params):
        # Eager binds skip abstract evaluation; run it so shape errors read the same.
        abstract_eval(*args, **params)
        return reference(*args, **params)

    primitive.def_impl(checked_reference)
    primitive.def_abstract_eval(abstract_eval)
    mlir.register_lowering(primitive, mlir.lower_fun(reference, multiple_results=False))
    ad.primitive_jvps[primitive] = jvp
    batching.primitive_batchers[primitive] = batch
    return primitive

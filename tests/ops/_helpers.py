"""Small helpers shared by the ETP-primitive tests (not a test module)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# Relative tolerance per dtype; the absolute tolerance is the same number scaled by
# the magnitude of the expected values (sums of products grow with the inner size).
TOL = {
    jnp.dtype(jnp.float32): 1e-6,
    jnp.dtype(jnp.bfloat16): 1e-2,
    jnp.dtype(jnp.float64): 1e-12,
}


def assert_close(actual, expected, tol=None, check_dtype=True):
    """``actual`` equals ``expected`` (same shape and dtype) up to a dtype-scaled tolerance."""
    actual_leaves = jax.tree_util.tree_leaves(actual)
    expected_leaves = jax.tree_util.tree_leaves(expected)
    assert len(actual_leaves) == len(expected_leaves)
    for a, e in zip(actual_leaves, expected_leaves):
        a, e = jnp.asarray(a), jnp.asarray(e)
        assert a.shape == e.shape, (a.shape, e.shape)
        if check_dtype:
            assert a.dtype == e.dtype, (a.dtype, e.dtype)
        rtol = TOL[jnp.dtype(e.dtype)] if tol is None else tol
        a64 = np.asarray(a.astype(jnp.float32) if a.dtype == jnp.bfloat16 else a, dtype=np.float64)
        e64 = np.asarray(e.astype(jnp.float32) if e.dtype == jnp.bfloat16 else e, dtype=np.float64)
        scale = max(1.0, float(np.max(np.abs(e64), initial=0.0)))
        np.testing.assert_allclose(a64, e64, rtol=rtol, atol=rtol * scale)


def random_array(rng: np.random.Generator, shape, dtype=jnp.float32, positive=False):
    """A standard-normal (or, with ``positive``, a 0.5..2.0 uniform) array of ``dtype``."""
    if positive:
        value = rng.uniform(0.5, 2.0, size=shape)
    else:
        value = rng.standard_normal(size=shape)
    return jnp.asarray(value, dtype=dtype)


def top_level_primitives(fun, *args, **kwargs):
    """Primitives of the top-level equations of ``jax.make_jaxpr(fun)(*args)``."""
    closed = jax.make_jaxpr(fun, **kwargs)(*args)
    return [eqn.primitive for eqn in closed.jaxpr.eqns]


def random_shapes(seed: int, count: int, low: int, high: int, ndim: int):
    """``count`` shapes of ``ndim`` axes, each size drawn in ``[low, high]`` with a fixed seed."""
    rng = np.random.default_rng(seed)
    return [tuple(int(v) for v in rng.integers(low, high + 1, size=ndim)) for _ in range(count)]

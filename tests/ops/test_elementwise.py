"""Elementwise ETP primitive (``etp_elemwise_p``) through :func:`etrace_fit.ops.elementwise`."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import saiunit as u

from etrace_fit.errors import ShapeError
from etrace_fit.ops import elementwise, etp_elemwise_p

from ._helpers import assert_close, random_array, random_shapes, top_level_primitives

DT = 0.1


def decay(tau):
    """``exp(-dt / tau)``: the membrane decay factor of a time constant."""
    return jnp.exp(-DT / tau)


@dataclasses.dataclass(frozen=True)
class ScaledTanh:
    """A hashable parametrised fn, as the docstring recommends."""

    scale: float

    def __call__(self, theta):
        return self.scale * jnp.tanh(theta)


FNS = {
    "identity": (None, lambda t: t),
    "decay": (decay, decay),
    "softplus": (jax.nn.softplus, jax.nn.softplus),
    "scaled_tanh": (ScaledTanh(1.5), lambda t: 1.5 * jnp.tanh(t)),
}

# Shapes of θ: (U,), (A, U), and a scalar; sizes drawn with a fixed seed.
SHAPES = [s[:1] for s in random_shapes(seed=10, count=1, low=2, high=9, ndim=1)] + random_shapes(
    seed=11, count=1, low=2, high=6, ndim=2
) + [()]


def _theta(shape, dtype=jnp.float32, seed=0):
    # Positive values keep exp(-dt / tau) well-conditioned.
    return random_array(np.random.default_rng(seed), shape, dtype, positive=True)


# ---------------------------------------------------------------------------- forward
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", list(FNS))
def test_forward_equals_fn(shape, name):
    fn, plain = FNS[name]
    theta = _theta(shape)
    y = elementwise(theta, fn) if fn is not None else elementwise(theta)
    assert y.shape == theta.shape and y.dtype == theta.dtype
    assert_close(y, plain(theta))
    assert_close(jax.jit(lambda t: elementwise(t, fn))(theta), plain(theta))


def test_forward_binds_one_etp_elemwise():
    prims = top_level_primitives(lambda t: elementwise(t, decay), jnp.ones((3,)))
    assert prims == [etp_elemwise_p]


# ---------------------------------------------------------------------- derivatives
@pytest.mark.parametrize(
    "shape, name", list(zip(SHAPES, ["decay", "softplus", "scaled_tanh"])), ids=str
)
def test_grad_equals_plain_grad(shape, name):
    fn, plain = FNS[name]
    theta = _theta(shape)
    cot = random_array(np.random.default_rng(1), shape)
    grad = jax.grad(lambda t: jnp.sum(cot * elementwise(t, fn)))
    expected = jax.grad(lambda t: jnp.sum(cot * plain(t)))(theta)
    assert_close(grad(theta), expected)
    assert_close(jax.jit(grad)(theta), expected)


@pytest.mark.parametrize("shape", SHAPES[:2], ids=str)
@pytest.mark.parametrize("name", ["decay", "softplus"])
def test_jvp_equals_plain_jvp(shape, name):
    fn, plain = FNS[name]
    theta = _theta(shape)
    tangent = random_array(np.random.default_rng(2), shape)
    expected = jax.jvp(plain, (theta,), (tangent,))
    assert_close(jax.jvp(lambda t: elementwise(t, fn), (theta,), (tangent,)), expected)
    assert_close(jax.jit(lambda p, t: jax.jvp(lambda a: elementwise(a, fn), (p,), (t,)))(theta, tangent), expected)


@pytest.mark.parametrize("name", ["decay", "softplus"])
def test_second_order_derivatives_equal_plain(name):
    fn, plain = FNS[name]
    theta = _theta(SHAPES[0])
    tangent = random_array(np.random.default_rng(3), theta.shape)

    def hvp(f):
        return jax.jit(lambda t, v: jax.jvp(jax.grad(lambda a: jnp.sum(jnp.sin(f(a)))), (t,), (v,))[1])

    assert_close(hvp(lambda a: elementwise(a, fn))(theta, tangent), hvp(plain)(theta, tangent), tol=1e-5)
    # d/dθ0 of (d/dθ0 of fn(θ)[0]) via nested grads of a scalar entry.
    second = jax.grad(lambda a: jax.grad(lambda c: elementwise(c, fn)[0])(a)[0])
    second_plain = jax.grad(lambda a: jax.grad(lambda c: plain(c)[0])(a)[0])
    assert_close(jax.jit(second)(theta), jax.jit(second_plain)(theta), tol=1e-5)


# ---------------------------------------------------------------------------- vmap
@pytest.mark.parametrize("in_axis", [0, 1])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", ["decay", "scaled_tanh"])
def test_vmap_equals_plain(in_axis, jit, name):
    fn, plain = FNS[name]
    thetas = _theta(SHAPES[1])  # (A, U): vmap over either axis
    mapped = jax.vmap(lambda t: elementwise(t, fn), in_axes=in_axis)
    mapped = jax.jit(mapped) if jit else mapped
    expected = jnp.moveaxis(plain(thetas), in_axis, 0)
    assert_close(mapped(thetas), expected)


def test_vmap_of_a_non_elementwise_fn_maps_each_slice():
    # The batching rule must apply fn per mapped slice, not across the mapped axis.
    thetas = _theta((3, 4))

    def fn(t):  # shape-preserving, but couples every entry of the slice it gets
        return t / jnp.sum(t)

    for in_axis in (0, 1):
        y = jax.vmap(lambda t: elementwise(t, fn), in_axes=in_axis)(thetas)
        assert_close(y, jax.vmap(fn, in_axes=in_axis)(thetas))


def test_vmap_of_grad_equals_plain():
    thetas = _theta((3, 5))
    per_row = jax.vmap(jax.grad(lambda t: jnp.sum(jnp.tanh(elementwise(t, decay)))))
    plain = jax.vmap(jax.grad(lambda t: jnp.sum(jnp.tanh(decay(t)))))
    assert_close(jax.jit(per_row)(thetas), plain(thetas))


@pytest.mark.parametrize("in_axis", [0, 1])
def test_vmap_keeps_etp_elemwise_in_jaxpr(in_axis):
    prims = top_level_primitives(jax.vmap(lambda t: elementwise(t, decay), in_axes=in_axis), jnp.ones((3, 4)))
    assert etp_elemwise_p in prims
    assert jax.lax.exp_p not in prims
    nested = top_level_primitives(jax.vmap(jax.vmap(lambda t: elementwise(t, decay))), jnp.ones((2, 3, 4)))
    assert nested.count(etp_elemwise_p) == 1


# -------------------------------------------------------------------------- dtypes
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_dtype_is_preserved_and_values_match(dtype):
    theta = _theta(SHAPES[0], dtype)
    y = elementwise(theta, decay)
    assert y.dtype == jnp.dtype(dtype)
    assert_close(y, decay(theta))
    g = jax.jit(jax.grad(lambda t: jnp.sum(elementwise(t, decay)).astype(jnp.float32)))(theta)
    assert g.dtype == jnp.dtype(dtype)
    assert_close(g, jax.grad(lambda t: jnp.sum(decay(t)).astype(jnp.float32))(theta))


def test_float64_is_preserved_and_values_match():
    with jax.enable_x64(True):
        theta = _theta(SHAPES[0], jnp.float64)
        assert theta.dtype == jnp.float64
        y = elementwise(theta, decay)
        assert y.dtype == jnp.float64
        assert_close(y, decay(theta))
        g = jax.jit(jax.grad(lambda t: jnp.sum(elementwise(t, decay))))(theta)
        assert g.dtype == jnp.float64
        assert_close(g, jax.grad(lambda t: jnp.sum(decay(t)))(theta))


def test_fn_changing_dtype_gives_its_dtype():
    theta = _theta((4,))
    y = elementwise(theta, lambda t: t.astype(jnp.bfloat16))
    assert y.dtype == jnp.bfloat16
    assert jax.jit(lambda t: elementwise(t, lambda a: a.astype(jnp.bfloat16)))(theta).dtype == jnp.bfloat16


# -------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "fn, out_shape",
    [(jnp.sum, "()"), (lambda t: jnp.concatenate([t, t]), "(8,)"), (lambda t: t[:, None], "(4, 1)")],
    ids=["sum", "concat", "expand"],
)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_fn_changing_shape_raises_shape_error(fn, out_shape, jit):
    call = (lambda t: elementwise(t, fn))
    with pytest.raises(ShapeError) as info:
        (jax.jit(call) if jit else call)(jnp.ones((4,)))
    message = str(info.value)
    assert "etp_elemwise" in message and "(4,)" in message and out_shape in message


def test_fn_changing_shape_of_a_quantity_raises_shape_error():
    with pytest.raises(ShapeError, match="etp_elemwise"):
        elementwise(jnp.ones((4,)) * u.ms, lambda t: u.math.sum(t))


# --------------------------------------------------------------------------- units
def test_dimensionless_fn_of_a_quantity_gives_a_plain_array():
    tau_m = _theta((5,)) * 10.0
    fn = lambda t: u.math.exp(-(0.1 * u.ms) / t)  # noqa: E731
    y = elementwise(tau_m * u.ms, fn)
    assert not isinstance(y, u.Quantity)
    assert_close(y, jnp.exp(-0.1 / tau_m))
    y_jit = jax.jit(lambda t: elementwise(t * u.ms, fn))(tau_m)
    assert not isinstance(y_jit, u.Quantity)
    assert_close(y_jit, jnp.exp(-0.1 / tau_m))


def test_quantity_in_another_scale_is_read_in_its_own_unit():
    tau_m = _theta((5,))
    y = elementwise(tau_m * u.second, lambda t: u.math.exp(-(0.1 * u.ms) / t))
    assert_close(y, jnp.exp(-1e-4 / tau_m))


def test_fn_returning_a_quantity_keeps_its_unit():
    tau_m = _theta((5,))
    y = elementwise(tau_m * u.ms, lambda t: 2.0 * t)
    assert isinstance(y, u.Quantity) and u.get_unit(y) == u.ms
    assert_close(u.get_mantissa(y), 2.0 * tau_m)
    y = elementwise(tau_m * u.ms, lambda t: t * t)
    assert u.get_unit(y).dim == (u.ms * u.ms).dim
    assert_close(u.get_mantissa(y.in_unit(u.ms * u.ms)), tau_m * tau_m, tol=1e-5)


def test_grad_flows_through_a_quantity_fn():
    tau_m = _theta((5,)) * 10.0
    fn = lambda t: u.math.exp(-(0.1 * u.ms) / t)  # noqa: E731
    g = jax.grad(lambda t: jnp.sum(elementwise(t * u.ms, fn)))(tau_m)
    assert_close(g, jnp.exp(-0.1 / tau_m) * 0.1 / tau_m**2, tol=1e-5)


def test_fn_closing_over_a_traced_value_raises_config_error_under_jit_and_vmap():
    from etrace_fit.errors import ConfigError

    tau = jnp.array([10.0, 20.0])

    def alpha(dt):
        return elementwise(tau, fn=lambda t: jnp.exp(-dt / t))

    for transform in (jax.jit, jax.vmap):
        with pytest.raises(ConfigError, match="etp_elemwise: fn closes over a traced value"):
            transform(alpha)(jnp.ones(3) if transform is jax.vmap else 1.0)
    # A concrete dt is fine under both.
    np.testing.assert_allclose(jax.jit(lambda t: elementwise(t, fn=lambda v: jnp.exp(-1.0 / v)))(tau), np.exp(-1.0 / tau), rtol=1e-6)

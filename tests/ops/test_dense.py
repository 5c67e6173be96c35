"""Dense ETP primitives (``etp_mm_p``, ``etp_mv_p``) through :func:`etrace_fit.ops.matmul`.

Every result is compared with the same expression written in plain ``jax.numpy``.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import saiunit as u

from etrace_fit.errors import ShapeError
from etrace_fit.ops import Chain, Masked, Positive, SignConstrained, etp_mm_p, etp_mv_p, matmul

from ._helpers import assert_close, random_array, random_shapes, top_level_primitives

# (B, I, O) with a fixed seed; a leading B=1, I=1 edge case is covered separately.
SHAPES = random_shapes(seed=0, count=3, low=2, high=9, ndim=3)


def _weight_fn_cases(I, O, seed=1):
    """``(name, weight_fn, plain jnp equivalent)`` for each supported weight function."""
    rng = np.random.default_rng(seed)
    mask = (rng.uniform(size=(I, O)) > 0.4).astype(np.float32)
    row_signs = np.where(rng.uniform(size=(I,)) > 0.5, 1.0, -1.0).astype(np.float32)
    full_signs = np.where(rng.uniform(size=(I, O)) > 0.5, 1.0, -1.0).astype(np.float32)
    return {
        "none": (None, lambda w: w),
        "masked": (Masked(mask), lambda w: w * jnp.asarray(mask, w.dtype)),
        "positive": (Positive(), jnp.abs),
        "sign_rows": (SignConstrained(row_signs), lambda w: jnp.abs(w) * jnp.asarray(row_signs, w.dtype)[:, None]),
        "sign_full": (SignConstrained(full_signs), lambda w: jnp.abs(w) * jnp.asarray(full_signs, w.dtype)),
        "chain": (Chain((Masked(mask), Positive())), lambda w: jnp.abs(w * jnp.asarray(mask, w.dtype))),
    }


WEIGHT_FN_NAMES = ["none", "masked", "positive", "sign_rows", "sign_full", "chain"]

# Transformations are checked under jit for every random shape (each with its own
# weight function) and once eagerly (op-by-op dispatch is slow, so only once).
TRANSFORM_CASES = [
    (SHAPES[0], "masked", True),
    (SHAPES[1], "chain", True),
    (SHAPES[2], "sign_full", True),
    (SHAPES[0], "none", False),
]
VMAP_CASES = [(SHAPES[0], True), (SHAPES[1], True), (SHAPES[2], True), (SHAPES[2], False)]


def _setup(shape, x_shape, weight_fn_name="none", bias=True, dtype=jnp.float32, seed=2):
    """Operands and the pair (etp function, plain jnp function) of ``(x, w, b)``."""
    _, I, O = shape
    rng = np.random.default_rng(seed)
    x = random_array(rng, x_shape, dtype)
    w = random_array(rng, (I, O), dtype)
    b = random_array(rng, (O,), dtype) if bias else None
    weight_fn, plain_fn = _weight_fn_cases(I, O)[weight_fn_name]

    def etp(x, w, b=None):
        return matmul(x, w, b, weight_fn=weight_fn)

    def ref(x, w, b=None):
        y = x @ plain_fn(w)
        return y if b is None else y + b

    return x, w, b, etp, ref


def _args(x, w, b):
    return (x, w) if b is None else (x, w, b)


# ---------------------------------------------------------------------------- forward
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("rank", ["mv", "mm", "nd3", "nd4"])
def test_forward_equals_plain_matmul_for_every_input_rank(shape, bias, rank):
    B, I, _ = shape
    x_shape = {"mv": (I,), "mm": (B, I), "nd3": (2, B, I), "nd4": (2, 1, B, I)}[rank]
    x, w, b, etp, ref = _setup(shape, x_shape, bias=bias)
    y = etp(*_args(x, w, b))
    assert y.shape == (*x_shape[:-1], shape[2]) and y.dtype == jnp.float32
    assert_close(y, ref(*_args(x, w, b)))


@pytest.mark.parametrize("shape", SHAPES[:2], ids=str)
@pytest.mark.parametrize("weight_fn_name", WEIGHT_FN_NAMES)
def test_forward_applies_weight_fn_inside_the_op(shape, weight_fn_name):
    B, I, _ = shape
    x, w, b, etp, ref = _setup(shape, (B, I), weight_fn_name)
    assert_close(etp(x, w, b), ref(x, w, b))
    assert_close(jax.jit(etp)(x, w, b), ref(x, w, b))
    assert_close(etp(x[0], w, b), ref(x[0], w, b))


def test_forward_with_unit_sizes():
    x, w, b, etp, ref = _setup((1, 1, 1), (1, 1))
    assert_close(etp(x, w, b), ref(x, w, b))
    assert_close(etp(x[0], w, b), ref(x[0], w, b))


def test_rank_selects_the_primitive():
    w, b = jnp.ones((3, 2)), jnp.ones((2,))
    assert top_level_primitives(lambda x: matmul(x, w, b), jnp.ones((3,))) == [etp_mv_p]
    assert top_level_primitives(lambda x: matmul(x, w, b), jnp.ones((4, 3))) == [etp_mm_p]
    prims = top_level_primitives(lambda x: matmul(x, w, b), jnp.ones((2, 4, 3)))
    assert prims.count(etp_mm_p) == 1 and etp_mv_p not in prims


# ---------------------------------------------------------------------- derivatives
@pytest.mark.parametrize("shape, weight_fn_name, jit", TRANSFORM_CASES, ids=str)
@pytest.mark.parametrize("rank", ["mv", "mm", "nd3"])
def test_grad_wrt_x_w_b_equals_plain_grad(shape, weight_fn_name, rank, jit):
    B, I, O = shape
    x_shape = {"mv": (I,), "mm": (B, I), "nd3": (2, B, I)}[rank]
    x, w, b, etp, ref = _setup(shape, x_shape, weight_fn_name)
    cotangent = random_array(np.random.default_rng(3), (*x_shape[:-1], O))

    def loss(f):
        return lambda x, w, b: jnp.sum(cotangent * f(x, w, b))

    grad = jax.grad(loss(etp), argnums=(0, 1, 2))
    grad = jax.jit(grad) if jit else grad
    assert_close(grad(x, w, b), jax.jit(jax.grad(loss(ref), argnums=(0, 1, 2)))(x, w, b))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_grad_without_bias_equals_plain_grad(shape):
    B, I, O = shape
    x, w, _, etp, ref = _setup(shape, (B, I), "positive", bias=False)
    loss = lambda f: (lambda x, w: jnp.sum(jnp.sin(f(x, w))))  # noqa: E731
    assert_close(jax.jit(jax.grad(loss(etp), (0, 1)))(x, w), jax.jit(jax.grad(loss(ref), (0, 1)))(x, w))


def test_masked_weight_gets_no_gradient_where_mask_is_zero():
    mask = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], np.float32)
    x, w = jnp.ones((4, 3)), jnp.ones((3, 2))
    g = jax.grad(lambda w: jnp.sum(matmul(x, w, weight_fn=Masked(mask))))(w)
    np.testing.assert_array_equal(np.asarray(g)[mask == 0], 0.0)
    assert np.all(np.asarray(g)[mask == 1] == 4.0)


@pytest.mark.parametrize("shape, weight_fn_name, jit", TRANSFORM_CASES, ids=str)
@pytest.mark.parametrize("rank", ["mv", "mm"])
def test_jvp_equals_plain_jvp(shape, weight_fn_name, rank, jit):
    B, I, _ = shape
    x_shape = (I,) if rank == "mv" else (B, I)
    x, w, b, etp, ref = _setup(shape, x_shape, weight_fn_name)
    rng = np.random.default_rng(4)
    tangents = (random_array(rng, x.shape), random_array(rng, w.shape), random_array(rng, b.shape))
    jvp = lambda f: (lambda p, t: jax.jvp(f, p, t))  # noqa: E731
    run = jax.jit(jvp(etp)) if jit else jvp(etp)
    assert_close(run((x, w, b), tangents), jax.jit(jvp(ref))((x, w, b), tangents))


@pytest.mark.parametrize("shape", SHAPES[:2], ids=str)
def test_jvp_with_some_symbolic_zero_tangents(shape):
    B, I, _ = shape
    x, w, b, etp, ref = _setup(shape, (B, I), "masked")
    dw = random_array(np.random.default_rng(5), w.shape)
    # Tangent only on w (x and b are closed over: their tangents are symbolic zeros).
    assert_close(
        jax.jvp(lambda w: etp(x, w, b), (w,), (dw,)),
        jax.jvp(lambda w: ref(x, w, b), (w,), (dw,)),
    )
    db = random_array(np.random.default_rng(6), b.shape)
    assert_close(
        jax.jvp(lambda b: etp(x, w, b), (b,), (db,)),
        jax.jvp(lambda b: ref(x, w, b), (b,), (db,)),
    )


@pytest.mark.parametrize("shape, weight_fn_name, jit", [TRANSFORM_CASES[1], TRANSFORM_CASES[3]], ids=str)
def test_second_order_derivatives_equal_plain(shape, weight_fn_name, jit):
    B, I, _ = shape
    x, w, b, etp, ref = _setup(shape, (B, I), weight_fn_name)
    rng = np.random.default_rng(7)
    tangents = (random_array(rng, x.shape), random_array(rng, w.shape), random_array(rng, b.shape))

    def loss(f):
        return lambda x, w, b: jnp.sum(jnp.sin(f(x, w, b)))

    def hvp(f):
        return lambda p, t: jax.jvp(jax.grad(loss(f), argnums=(0, 1, 2)), p, t)[1]

    def grad_of_grad(f):
        return jax.grad(lambda x, w, b: jnp.sum(jax.grad(loss(f), argnums=1)(x, w, b) ** 2), argnums=(0, 1, 2))

    run_hvp = jax.jit(hvp(etp)) if jit else hvp(etp)
    run_gg = jax.jit(grad_of_grad(etp)) if jit else grad_of_grad(etp)
    assert_close(run_hvp((x, w, b), tangents), jax.jit(hvp(ref))((x, w, b), tangents), tol=1e-5)
    assert_close(run_gg(x, w, b), jax.jit(grad_of_grad(ref))(x, w, b), tol=1e-5)


# ---------------------------------------------------------------------------- vmap
@pytest.mark.parametrize("shape, jit", VMAP_CASES, ids=str)
@pytest.mark.parametrize("in_axis", [0, 1])
def test_vmap_of_single_sample_over_x(shape, in_axis, jit):
    B, I, _ = shape
    xs, w, b, etp, ref = _setup(shape, (B, I) if in_axis == 0 else (I, B), "sign_rows")
    mapped = jax.vmap(lambda x: etp(x, w, b), in_axes=in_axis)
    mapped = jax.jit(mapped) if jit else mapped
    expected = ref(xs if in_axis == 0 else xs.T, w, b)
    assert_close(mapped(xs), expected)


@pytest.mark.parametrize("shape, jit", VMAP_CASES, ids=str)
@pytest.mark.parametrize("in_axis", [0, 1, 2])
def test_vmap_of_batch_over_x(shape, in_axis, jit):
    B, I, _ = shape
    V = 3
    base = {0: (V, B, I), 1: (B, V, I), 2: (B, I, V)}[in_axis]
    xs, w, b, etp, ref = _setup(shape, base, "masked")
    mapped = jax.vmap(lambda x: etp(x, w, b), in_axes=in_axis)
    mapped = jax.jit(mapped) if jit else mapped
    expected = ref(jnp.moveaxis(xs, in_axis, 0), w, b)
    assert_close(mapped(xs), expected)


@pytest.mark.parametrize(
    "shape, in_axes, jit",
    [(SHAPES[1], axes, True) for axes in [(0, 0, None), (None, 0, 0), (0, None, 0), (0, 0, 0)]]
    + [(SHAPES[2], (0, 0, 0), False)],
    ids=str,
)
@pytest.mark.parametrize("rank", ["mv", "mm"])
def test_vmap_with_batched_weight_or_bias_falls_back_correctly(shape, rank, in_axes, jit):
    B, I, O = shape
    V = 2
    rng = np.random.default_rng(8)
    x_shape = (I,) if rank == "mv" else (B, I)
    _, _, _, etp, ref = _setup(shape, x_shape, "chain")
    full = {0: (V, *x_shape), 1: (V, I, O), 2: (V, O)}
    base = {0: x_shape, 1: (I, O), 2: (O,)}
    args = [random_array(rng, full[k] if in_axes[k] == 0 else base[k]) for k in range(3)]
    mapped = jax.vmap(etp, in_axes=in_axes)
    mapped = jax.jit(mapped) if jit else mapped
    assert_close(mapped(*args), jax.vmap(ref, in_axes=in_axes)(*args))


@pytest.mark.parametrize("shape", SHAPES[1:], ids=str)
def test_vmap_of_grad_and_grad_of_vmap(shape):
    B, I, O = shape
    xs, w, b, etp, ref = _setup(shape, (B, I), "positive")

    def per_sample_grad(f):
        return jax.vmap(jax.grad(lambda x, w, b: jnp.sum(jnp.tanh(f(x, w, b))), argnums=(1, 2)), in_axes=(0, None, None))

    def grad_of_vmapped(f):
        return jax.grad(lambda x, w, b: jnp.sum(jnp.tanh(jax.vmap(lambda x: f(x, w, b))(x))), argnums=(0, 1, 2))

    assert_close(jax.jit(per_sample_grad(etp))(xs, w, b), jax.jit(per_sample_grad(ref))(xs, w, b))
    assert_close(jax.jit(grad_of_vmapped(etp))(xs, w, b), jax.jit(grad_of_vmapped(ref))(xs, w, b))


def test_vmap_of_single_sample_becomes_etp_mm_in_jaxpr():
    w, b = jnp.ones((3, 2)), jnp.ones((2,))
    for in_axis, xs in ((0, jnp.ones((4, 3))), (1, jnp.ones((3, 4)))):
        prims = top_level_primitives(jax.vmap(lambda x: matmul(x, w, b), in_axes=in_axis), xs)
        assert prims.count(etp_mm_p) == 1, prims
        assert etp_mv_p not in prims
        assert jax.lax.dot_general_p not in prims


def test_vmap_of_batch_keeps_etp_mm_in_jaxpr():
    w = jnp.ones((3, 2))
    for in_axis, xs in ((0, jnp.ones((5, 4, 3))), (1, jnp.ones((4, 5, 3))), (2, jnp.ones((4, 3, 5)))):
        prims = top_level_primitives(jax.vmap(lambda x: matmul(x, w, weight_fn=Positive()), in_axes=in_axis), xs)
        assert prims.count(etp_mm_p) == 1, prims
        assert jax.lax.dot_general_p not in prims
    # Two nested vmaps over a single sample: still one etp_mm.
    nested = jax.vmap(jax.vmap(lambda x: matmul(x, w)))
    prims = top_level_primitives(nested, jnp.ones((2, 5, 3)))
    assert prims.count(etp_mm_p) == 1 and jax.lax.dot_general_p not in prims


def test_weight_fn_is_an_equation_parameter():
    mask = np.eye(3, 2, dtype=np.float32)
    eqns = jax.make_jaxpr(lambda x, w: matmul(x, w, weight_fn=Masked(mask)))(jnp.ones((4, 3)), jnp.ones((3, 2))).eqns
    (eqn,) = [e for e in eqns if e.primitive is etp_mm_p]
    assert eqn.params["weight_fn"] == Masked(mask.copy())
    assert hash(eqn.params["weight_fn"]) == hash(Masked(mask.copy()))


# -------------------------------------------------------------------------- dtypes
@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize("dtype, rank", [(jnp.bfloat16, "mv"), (jnp.bfloat16, "nd3"), (jnp.float32, "mm")], ids=str)
def test_dtype_is_preserved_and_values_match(dtype, rank):
    shape = SHAPES[0]
    B, I, O = shape
    x_shape = {"mv": (I,), "mm": (B, I), "nd3": (2, B, I)}[rank]
    x, w, b, etp, ref = _setup(shape, x_shape, "sign_rows", dtype=dtype)
    y = etp(x, w, b)
    assert y.dtype == jnp.dtype(dtype)
    assert_close(y, ref(x, w, b))
    assert_close(jax.jit(etp)(x, w, b), ref(x, w, b))
    cot = jnp.ones(y.shape, dtype)
    g = jax.jit(jax.grad(lambda x, w, b: jnp.sum(cot * etp(x, w, b)).astype(jnp.float32), (0, 1, 2)))(x, w, b)
    g_ref = jax.jit(jax.grad(lambda x, w, b: jnp.sum(cot * ref(x, w, b)).astype(jnp.float32), (0, 1, 2)))(x, w, b)
    assert [a.dtype for a in g] == [jnp.dtype(dtype)] * 3
    assert_close(g, g_ref)


@pytest.mark.parametrize("rank", ["mv", "mm"])
def test_float64_is_preserved_and_values_match(x64, rank):
    shape = SHAPES[1]
    B, I, O = shape
    x_shape = (I,) if rank == "mv" else (B, I)
    x, w, b, etp, ref = _setup(shape, x_shape, "chain", dtype=jnp.float64)
    assert x.dtype == jnp.float64
    y = etp(x, w, b)
    assert y.dtype == jnp.float64
    assert_close(y, ref(x, w, b))
    assert_close(jax.jit(etp)(x, w, b), ref(x, w, b))
    g = jax.jit(jax.grad(lambda x, w, b: jnp.sum(jnp.sin(etp(x, w, b))), (0, 1, 2)))(x, w, b)
    g_ref = jax.jit(jax.grad(lambda x, w, b: jnp.sum(jnp.sin(ref(x, w, b))), (0, 1, 2)))(x, w, b)
    assert_close(g, g_ref)


@pytest.mark.parametrize(
    "x_dtype, w_dtype, b_dtype, expected",
    [
        (jnp.float32, jnp.bfloat16, None, jnp.float32),
        (jnp.bfloat16, jnp.float32, None, jnp.float32),
        (jnp.bfloat16, jnp.bfloat16, jnp.float32, jnp.float32),
        (jnp.int32, jnp.float32, None, jnp.float32),
        (jnp.float16, jnp.bfloat16, None, jnp.float32),
    ],
    ids=["f32@bf16", "bf16@f32", "bf16+f32bias", "i32@f32", "f16@bf16"],
)
def test_mixed_dtypes_are_promoted(x_dtype, w_dtype, b_dtype, expected):
    rng = np.random.default_rng(9)
    x = jnp.asarray(rng.integers(-3, 4, size=(4, 3)), x_dtype)
    w = jnp.asarray(rng.standard_normal((3, 2)), w_dtype)
    b = None if b_dtype is None else jnp.asarray(rng.standard_normal((2,)), b_dtype)
    y = matmul(x, w, b)
    assert y.dtype == jnp.dtype(expected)
    ref = x.astype(expected) @ w.astype(expected)
    ref = ref if b is None else ref + b.astype(expected)
    assert_close(y, ref)
    assert jax.jit(matmul)(x, w, b).dtype == jnp.dtype(expected)


# -------------------------------------------------------------------------- errors
def _call(mode, fn, *args, **kwargs):
    if mode == "jit":
        return jax.jit(lambda *a: fn(*a, **kwargs))(*args)
    return fn(*args, **kwargs)


MODES = ["eager", "jit"]


@pytest.mark.parametrize("mode", MODES)
def test_mismatched_inner_dims_raise_shape_error_naming_op_and_shapes(mode):
    with pytest.raises(ShapeError) as info:
        _call(mode, matmul, jnp.ones((3, 5)), jnp.ones((4, 2)))
    message = str(info.value)
    assert "etp_mm" in message
    assert "x.shape=(3, 5)" in message and "weight.shape=(4, 2)" in message


@pytest.mark.parametrize("mode", MODES)
def test_mismatched_single_sample_raises_shape_error(mode):
    with pytest.raises(ShapeError) as info:
        _call(mode, matmul, jnp.ones((5,)), jnp.ones((4, 2)))
    message = str(info.value)
    assert re.search(r"etp_m[mv]", message)
    assert "x.shape=(5,)" in message and "weight.shape=(4, 2)" in message


@pytest.mark.parametrize("mode", MODES)
def test_mismatched_leading_axes_input_names_the_shape_given(mode):
    with pytest.raises(ShapeError) as info:
        _call(mode, matmul, jnp.ones((2, 3, 5)), jnp.ones((4, 2)))
    message = str(info.value)
    assert "etp_mm" in message and "weight.shape=(4, 2)" in message
    # The user passed (2, 3, 5); the flattened (6, 5) is an implementation detail.
    assert "(2, 3, 5)" in message


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bias_shape", [(1,), (3,), (4, 2), ()], ids=str)
def test_bias_of_wrong_shape_raises_shape_error(mode, bias_shape):
    with pytest.raises(ShapeError) as info:
        _call(mode, matmul, jnp.ones((4, 3)), jnp.ones((3, 2)), jnp.ones(bias_shape))
    assert "etp_mm" in str(info.value) and "bias" in str(info.value)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("w_shape", [(3,), (3, 2, 2)], ids=str)
def test_weight_that_is_not_2d_raises_shape_error(mode, w_shape):
    with pytest.raises(ShapeError) as info:
        _call(mode, matmul, jnp.ones((4, 3)), jnp.ones(w_shape))
    assert "etp_mm" in str(info.value) and f"weight.shape={w_shape}" in str(info.value)


@pytest.mark.parametrize("mode", MODES)
def test_scalar_x_raises_shape_error(mode):
    with pytest.raises(ShapeError, match="etp_mm"):
        _call(mode, matmul, jnp.float32(1.0), jnp.ones((3, 2)))


@pytest.mark.parametrize("mode", MODES)
def test_weight_fn_changing_shape_raises_shape_error(mode):
    with pytest.raises(ShapeError) as info:
        _call(mode, matmul, jnp.ones((4, 3)), jnp.ones((3, 2)), weight_fn=jnp.transpose)
    assert "etp_mm" in str(info.value) and "(3, 2)" in str(info.value) and "(2, 3)" in str(info.value)


def test_non_callable_weight_fn_raises_shape_error():
    with pytest.raises(ShapeError, match="weight_fn"):
        matmul(jnp.ones((4, 3)), jnp.ones((3, 2)), weight_fn=np.ones((3, 2)))


def test_shape_error_is_a_value_error():
    with pytest.raises(ValueError):
        jax.jit(matmul)(jnp.ones((3, 5)), jnp.ones((4, 2)))


# --------------------------------------------------------------------------- units
def test_quantity_input_gives_quantity_output_with_plain_mantissa():
    x, w, b, etp, ref = _setup(SHAPES[0], (SHAPES[0][0], SHAPES[0][1]), bias=False)
    y = matmul(x * u.mV, w)
    assert isinstance(y, u.Quantity)
    assert u.get_unit(y) == u.mV
    assert_close(u.get_mantissa(y), ref(x, w))


def test_quantity_bias_in_compatible_unit_is_converted():
    B, I, O = SHAPES[1]
    x, w, b, etp, ref = _setup(SHAPES[1], (B, I))
    y = matmul(x * u.mV, w, (b / 1000.0) * u.volt)  # b mV written in volts
    assert u.get_unit(y) == u.mV
    assert_close(u.get_mantissa(y), ref(x, w, b), tol=1e-5)


def test_units_of_x_and_w_multiply():
    B, I, O = SHAPES[2]
    x, w, b, etp, ref = _setup(SHAPES[2], (B, I))
    y = matmul(x * u.mV, w * u.nS, b * (u.mV * u.nS))
    assert u.get_unit(y).dim == (u.mV * u.nS).dim
    assert_close(u.get_mantissa(y.in_unit(u.mV * u.nS)), ref(x, w, b), tol=1e-5)


def test_quantity_works_under_jit_and_grad():
    B, I, O = SHAPES[0]
    x, w, b, etp, ref = _setup(SHAPES[0], (B, I), bias=False)
    y = jax.jit(lambda x, w: matmul(x * u.mV, w))(x, w)
    assert u.get_unit(y) == u.mV
    assert_close(u.get_mantissa(y), ref(x, w))
    g = jax.grad(lambda w: jnp.sum(u.get_mantissa(matmul(x * u.mV, w))))(w)
    assert_close(g, jax.grad(lambda w: jnp.sum(ref(x, w)))(w))


@pytest.mark.parametrize("bias", [jnp.ones(2) * u.ms, jnp.ones(2)], ids=["ms", "unitless"])
def test_bias_with_mismatched_unit_raises_shape_error(bias):
    with pytest.raises(ShapeError) as info:
        matmul(jnp.ones((4, 3)) * u.mV, jnp.ones((3, 2)), bias)
    assert "etp_mm" in str(info.value) and "bias" in str(info.value)


def test_quantity_bias_for_unitless_output_raises_shape_error():
    with pytest.raises(ShapeError, match="etp_mm"):
        matmul(jnp.ones((4, 3)), jnp.ones((3, 2)), jnp.ones(2) * u.mV)


def test_weight_fn_closing_over_a_traced_value_raises_config_error():
    from etrace_fit.errors import ConfigError

    x, w = jnp.ones((2, 3)), jnp.ones((3, 4))

    def masked(scale):
        return matmul(x, w, weight_fn=lambda v: v * scale)

    with pytest.raises(ConfigError, match="etp_mm: weight_fn closes over a traced value"):
        jax.jit(masked)(2.0)


# ------------------------------------------------------------------ matmul_of_parts
@pytest.mark.parametrize("weight_fn_name", ["none", "sign_full"])
@pytest.mark.parametrize("rows", [False, True], ids=["sliced_inside", "rows_t_given"])
def test_matmul_of_parts_has_the_concatenations_value_and_gradients(weight_fn_name, rows):
    """``matmul_of_parts`` (the step program's pull-back of a gate's ``[x, h]``) equals
    ``concatenate(parts) @ weight_fn(W) + b`` in value and in its gradient with respect
    to the parts, the weight and the bias, whichever parts are differentiated; the
    weight's row blocks sliced inside or given transposed (``rows_t``, as the step
    program hands them over)."""
    from etrace_fit.ops.dense import matmul_of_parts, weight_rows

    rng = np.random.default_rng(3)
    a, h, w, b = (jnp.asarray(rng.normal(size=s)) for s in ((4, 3), (4, 5), (8, 6), (6,)))
    weight_fn, plain_fn = _weight_fn_cases(8, 6)[weight_fn_name]
    given_t = [block.T for block in weight_rows(w, [3, 5], weight_fn)] if rows else None

    def split(a, h, w, b):
        return jnp.tanh(matmul_of_parts(etp_mm_p, jnp.concatenate([a, h], -1), [a, h], w, b, weight_fn=weight_fn,
                                        rows_t=given_t)).sum()

    def plain(a, h, w, b):
        return jnp.tanh(jnp.concatenate([a, h], -1) @ plain_fn(w) + b).sum()

    assert_close(split(a, h, w, b), plain(a, h, w, b))
    for argnums in ((1,), (0, 1), (1, 3), (0, 1, 2, 3)) if not rows else ((1,), (0, 1), (1, 3)):
        got = jax.jit(jax.grad(split, argnums))(a, h, w, b)
        expected = jax.grad(plain, argnums)(a, h, w, b)
        for g, e in zip(got, expected):
            assert_close(g, e)


def test_matmul_of_parts_pulls_back_only_the_parts_that_need_it():
    """The gradient with respect to ``h`` alone is one ``(B, H)`` product, not the
    ``(B, I + H)`` product that differentiating the concatenation computes and slices."""
    from etrace_fit import _compat
    from etrace_fit.ops.dense import matmul_of_parts

    a, h, w = jnp.ones((4, 3)), jnp.ones((4, 5)), jnp.ones((8, 6))
    split = jax.grad(lambda h: matmul_of_parts(etp_mm_p, jnp.concatenate([a, h], -1), [a, h], w).sum())
    plain = jax.grad(lambda h: (jnp.concatenate([a, h], -1) @ w).sum())

    def cotangent_shapes(fn):
        jaxpr = jax.make_jaxpr(fn)(h)
        found = []

        def visit(jaxpr):
            for eqn in jaxpr.eqns:
                if eqn.primitive.name == "dot_general":
                    found.append(tuple(eqn.outvars[0].aval.shape))
                for sub in _compat.jaxprs_in_params(eqn.params):
                    visit(sub)
        visit(jaxpr.jaxpr)
        return found

    assert (4, 8) in cotangent_shapes(plain)
    assert (4, 8) not in cotangent_shapes(split) and (4, 5) in cotangent_shapes(split)

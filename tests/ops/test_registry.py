"""The ETP registry: metadata, operand positions, per-sample rules and trace shapes."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from etrace_fit.ops import (
    EtpOp,
    Masked,
    Positive,
    conv,
    elementwise,
    etp_conv_p,
    etp_elemwise_p,
    etp_mm_p,
    etp_mv_p,
    etp_op_info,
    is_etp_primitive,
    matmul,
    registered_ops,
)

from ._helpers import assert_close, random_array, random_shapes

ALL_PRIMITIVES = (etp_mm_p, etp_mv_p, etp_elemwise_p, etp_conv_p)
SHAPES = random_shapes(seed=200, count=3, low=2, high=7, ndim=3)  # (B, I, O)
S = 3  # number of states of a hidden group


def decay(tau):
    return jnp.exp(-0.1 / tau)


def _only_eqn(fun, *args):
    """The jaxpr and its single ETP equation."""
    closed = jax.make_jaxpr(fun)(*args)
    eqns = [e for e in closed.jaxpr.eqns if is_etp_primitive(e.primitive)]
    assert len(eqns) == 1, closed
    return closed.jaxpr, eqns[0]


# ------------------------------------------------------------------------- metadata
@pytest.mark.parametrize(
    "primitive, kind, x_index, transparent",
    [
        (etp_mm_p, "dense", 0, False),
        (etp_mv_p, "dense", 0, False),
        (etp_conv_p, "conv", 0, False),
        (etp_elemwise_p, "elementwise", None, True),
    ],
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_metadata_of_each_primitive(primitive, kind, x_index, transparent):
    info = etp_op_info(primitive)
    assert isinstance(info, EtpOp)
    assert info.primitive is primitive
    assert info.name == primitive.name
    assert info.kind == kind
    assert info.x_index == x_index
    assert info.transparent is transparent
    assert info.y_index == 0
    assert is_etp_primitive(primitive)
    assert primitive.name in repr(info) and kind in repr(info)


@pytest.mark.parametrize("primitive", [lax.add_p, lax.dot_general_p, lax.conv_general_dilated_p, lax.exp_p])
def test_other_primitives_are_not_etp(primitive):
    assert not is_etp_primitive(primitive)
    assert etp_op_info(primitive) is None


def test_registered_ops_are_the_four_primitives():
    ops = registered_ops()
    assert len(ops) == 4
    assert {op.primitive for op in ops} == set(ALL_PRIMITIVES)
    assert all(etp_op_info(op.primitive) is op for op in ops)


def test_dense_ops_are_distinct_entries():
    assert etp_op_info(etp_mm_p) is not etp_op_info(etp_mv_p)


# ----------------------------------------------------------------------- operands
@pytest.mark.parametrize("primitive", [etp_mm_p, etp_mv_p, etp_conv_p])
def test_trainable_positions_with_and_without_bias(primitive):
    info = etp_op_info(primitive)
    assert info.trainable_positions(3) == {"weight": 1, "bias": 2}
    assert info.trainable_positions(2) == {"weight": 1}


def test_elementwise_trainable_position():
    assert etp_op_info(etp_elemwise_p).trainable_positions(1) == {"weight": 0}


@pytest.mark.parametrize("rank", ["mv", "mm"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_split_operands_of_a_dense_equation(rank, bias):
    x = jnp.ones((4,) if rank == "mv" else (2, 4))
    w, b = jnp.ones((4, 3)), jnp.ones((3,))
    fun = (lambda x, w, b: matmul(x, w, b)) if bias else (lambda x, w, b: matmul(x, w))
    jaxpr, eqn = _only_eqn(fun, x, w, b)
    assert eqn.primitive is (etp_mv_p if rank == "mv" else etp_mm_p)
    x_var, trainables = etp_op_info(eqn.primitive).split_operands(eqn.invars)
    assert x_var is jaxpr.invars[0]
    assert trainables["weight"] is jaxpr.invars[1]
    if bias:
        assert set(trainables) == {"weight", "bias"} and trainables["bias"] is jaxpr.invars[2]
    else:
        assert set(trainables) == {"weight"}


def test_split_operands_of_a_conv_equation():
    x, w, b = jnp.ones((2, 6, 3)), jnp.ones((3, 3, 4)), jnp.ones((4,))
    jaxpr, eqn = _only_eqn(lambda x, w, b: conv(x, w, b, stride=2), x, w, b)
    x_var, trainables = etp_op_info(etp_conv_p).split_operands(eqn.invars)
    assert x_var is jaxpr.invars[0]
    assert trainables == {"weight": jaxpr.invars[1], "bias": jaxpr.invars[2]}


def test_split_operands_of_an_elementwise_equation():
    jaxpr, eqn = _only_eqn(lambda t: elementwise(t, decay), jnp.ones((5,)))
    x_var, trainables = etp_op_info(etp_elemwise_p).split_operands(eqn.invars)
    assert x_var is None
    assert trainables == {"weight": jaxpr.invars[0]}


# ------------------------------------------------------------------------ reference
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_reference_with_equation_params_matches_the_op(shape):
    B, I, O = shape
    rng = np.random.default_rng(B * 100 + I)
    x, w, b = random_array(rng, (B, I)), random_array(rng, (I, O)), random_array(rng, (O,))
    mask = (rng.uniform(size=(I, O)) > 0.5).astype(np.float32)
    fun = lambda x, w, b: matmul(x, w, b, weight_fn=Masked(mask))  # noqa: E731
    _, eqn = _only_eqn(fun, x, w, b)
    got = etp_op_info(eqn.primitive).reference(x, {"weight": w, "bias": b}, eqn.params)
    assert_close(got, x @ (w * mask) + b)


# ------------------------------------------------------------------ weight_grad
def _plain_vjp(fun, trainables, cotangent):
    _, vjp = jax.vjp(fun, trainables)
    return vjp(cotangent)[0]


def _jitted_weight_grad(info, params, per_sample=False):
    """``info.weight_grad`` under jit (as the learning rules call it), with fixed params."""
    return jax.jit(lambda x, tr, c: info.weight_grad(x, tr, c, params, per_sample=per_sample))


@pytest.mark.parametrize(
    "shape, weight_fn", list(zip(SHAPES, [None, Positive(), "masked"])), ids=["none", "positive", "masked"]
)
def test_dense_weight_grad_equals_vjp_and_outer_product(shape, weight_fn):
    B, I, O = shape
    rng = np.random.default_rng(sum(shape))
    x, w, b = random_array(rng, (B, I)), random_array(rng, (I, O)), random_array(rng, (O,))
    cot = random_array(rng, (B, O))
    mask = (rng.uniform(size=(I, O)) > 0.5).astype(np.float32)
    wfn, plain = {
        None: (None, lambda v: v),
        "masked": (Masked(mask), lambda v: v * mask),
    }.get(weight_fn, (weight_fn, jnp.abs))
    _, eqn = _only_eqn(lambda x, w, b: matmul(x, w, b, weight_fn=wfn), x, w, b)
    info = etp_op_info(eqn.primitive)
    trainables = {"weight": w, "bias": b}

    summed = info.weight_grad(x, trainables, cot, eqn.params)  # eagerly
    expected = _plain_vjp(lambda tr: x @ plain(tr["weight"]) + tr["bias"], trainables, cot)
    assert set(summed) == {"weight", "bias"}
    assert_close(summed, expected)

    assert_close(_jitted_weight_grad(info, eqn.params)(x, trainables, cot), expected)
    per_sample = _jitted_weight_grad(info, eqn.params, per_sample=True)(x, trainables, cot)
    assert per_sample["weight"].shape == (B, I, O) and per_sample["bias"].shape == (B, O)
    assert_close({k: v.sum(0) for k, v in per_sample.items()}, summed, tol=1e-5)
    # d<c, x @ f(W)>/dW per sample = outer(x_b, c_b) * f'(W).
    _, fprime = jax.jvp(plain, (w,), (jnp.ones_like(w),))
    assert_close(per_sample["weight"], jnp.einsum("bi,bo->bio", x, cot) * fprime)
    assert_close(per_sample["bias"], cot)


def test_dense_weight_grad_without_bias_and_for_a_single_sample():
    rng = np.random.default_rng(300)
    x, w, cot = random_array(rng, (5,)), random_array(rng, (5, 3)), random_array(rng, (3,))
    _, eqn = _only_eqn(lambda x, w: matmul(x, w), x, w)
    assert eqn.primitive is etp_mv_p
    got = etp_op_info(etp_mv_p).weight_grad(x, {"weight": w}, cot, eqn.params)
    assert set(got) == {"weight"}
    assert_close(got["weight"], jnp.outer(x, cot))


@pytest.mark.parametrize(
    "x_shape, w_shape, stride, padding",
    [((3, 9, 2), (3, 2, 4), 2, "SAME"), ((2, 6, 5, 3), (2, 3, 3, 2), 1, "VALID")],
    ids=["1d", "2d"],
)
def test_conv_weight_grad_equals_vjp(x_shape, w_shape, stride, padding):
    rng = np.random.default_rng(len(x_shape))
    x, w = random_array(rng, x_shape), random_array(rng, w_shape)
    b = random_array(rng, w_shape[-1:])
    fun = lambda x, w, b: conv(x, w, b, stride=stride, padding=padding, weight_fn=Positive())  # noqa: E731
    _, eqn = _only_eqn(fun, x, w, b)
    y = fun(x, w, b)
    cot = random_array(rng, y.shape)
    info = etp_op_info(etp_conv_p)
    trainables = {"weight": w, "bias": b}
    spatial = len(w_shape) - 2
    dn = {1: ("NWC", "WIO", "NWC"), 2: ("NHWC", "HWIO", "NHWC")}[spatial]

    def plain(x_, tr):
        return lax.conv_general_dilated(
            x_, jnp.abs(tr["weight"]), (stride,) * spatial, padding, dimension_numbers=dn
        ) + tr["bias"]

    summed = _jitted_weight_grad(info, eqn.params)(x, trainables, cot)
    assert_close(summed, jax.jit(lambda tr: _plain_vjp(lambda t: plain(x, t), tr, cot))(trainables))

    per_sample = _jitted_weight_grad(info, eqn.params, per_sample=True)(x, trainables, cot)
    B = x_shape[0]
    assert per_sample["weight"].shape == (B, *w_shape) and per_sample["bias"].shape == (B, w_shape[-1])
    assert_close({k: v.sum(0) for k, v in per_sample.items()}, summed, tol=1e-5)
    one_sample = jax.jit(lambda xi, ci: _plain_vjp(lambda t: plain(xi[None], t), trainables, ci[None]))
    for i in range(B):
        assert_close({k: v[i] for k, v in per_sample.items()}, one_sample(x[i], cot[i]))


def test_elementwise_weight_grad_equals_vjp():
    rng = np.random.default_rng(400)
    tau = random_array(rng, (6,), positive=True)
    _, eqn = _only_eqn(lambda t: elementwise(t, decay), tau)
    info = etp_op_info(etp_elemwise_p)
    cot = random_array(rng, (6,))

    summed = info.weight_grad(None, {"weight": tau}, cot, eqn.params)
    assert_close(summed, _plain_vjp(lambda tr: {"weight": decay(tr["weight"])}["weight"], {"weight": tau}, cot))
    assert_close(summed["weight"], cot * decay(tau) * 0.1 / tau**2, tol=1e-5)

    B = 4
    cots = random_array(rng, (B, 6))
    per_sample = info.weight_grad(None, {"weight": tau}, cots, eqn.params, per_sample=True)
    assert per_sample["weight"].shape == (B, 6)
    assert_close(per_sample["weight"], cots * (decay(tau) * 0.1 / tau**2), tol=1e-5)
    summed_cots = info.weight_grad(None, {"weight": tau}, cots.sum(0), eqn.params)
    assert_close(per_sample["weight"].sum(0), summed_cots["weight"], tol=1e-5)


# ------------------------------------------------------------------ trace shapes
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_dense_trace_shapes(shape):
    B, I, O = shape
    info = etp_op_info(etp_mm_p)
    kwargs = dict(
        batch_shape=(B,),
        x_shape=(B, I),
        trainable_shapes={"weight": (I, O), "bias": (O,)},
        y_shape=(B, O),
        num_states=S,
    )
    assert info.drtrl_trace_shapes(**kwargs) == {"weight": (B, I, O, S), "bias": (B, O, S)}
    assert info.esd_trace_shapes(**kwargs) == ((B, I), (B, O, S))
    no_bias = dict(kwargs, trainable_shapes={"weight": (I, O)})
    assert info.drtrl_trace_shapes(**no_bias) == {"weight": (B, I, O, S)}


def test_dense_trace_shapes_unbatched():
    info = etp_op_info(etp_mv_p)
    kwargs = dict(batch_shape=(), x_shape=(4,), trainable_shapes={"weight": (4, 2)}, y_shape=(2,), num_states=S)
    assert info.drtrl_trace_shapes(**kwargs) == {"weight": (4, 2, S)}
    assert info.esd_trace_shapes(**kwargs) == ((4,), (2, S))


def test_elementwise_trace_shapes():
    info = etp_op_info(etp_elemwise_p)
    kwargs = dict(batch_shape=(5,), x_shape=None, trainable_shapes={"weight": (7,)}, y_shape=(7,), num_states=S)
    assert info.drtrl_trace_shapes(**kwargs) == {"weight": (5, 7, S)}
    assert info.esd_trace_shapes(**kwargs) is None


@pytest.mark.parametrize(
    "x_shape, w_shape, stride",
    [((3, 9, 2), (3, 2, 4), 2), ((2, 7, 6, 3), (3, 2, 3, 5), 2)],
    ids=["1d", "2d"],
)
def test_conv_trace_shapes_follow_output_positions(x_shape, w_shape, stride):
    B = x_shape[0]
    y = jax.eval_shape(lambda x, w: conv(x, w, stride=stride), jnp.ones(x_shape), jnp.ones(w_shape))
    positions = y.shape[1:-1]
    assert positions != x_shape[1:-1]  # the stride shrinks them
    c_out = w_shape[-1]
    kwargs = dict(
        batch_shape=(B,),
        x_shape=x_shape,
        trainable_shapes={"weight": w_shape, "bias": (c_out,)},
        y_shape=y.shape,
        num_states=S,
    )
    info = etp_op_info(etp_conv_p)
    assert info.drtrl_trace_shapes(**kwargs) == {
        "weight": (B, *positions, *w_shape, S),
        "bias": (B, *positions, c_out, S),
    }
    eps_x, eps_f = info.esd_trace_shapes(**kwargs)
    assert eps_x == (B, *positions, math.prod(w_shape[:-1]))
    assert eps_f == (*y.shape, S)


def test_trace_bytes_counts_every_element():
    info = etp_op_info(etp_mm_p)
    shapes = {"weight": (2, 3, 4, 5), "bias": (2, 4, 5)}
    assert info.trace_bytes(shapes) == (120 + 40) * 4
    assert info.trace_bytes(list(shapes.values()), itemsize=2) == (120 + 40) * 2

"""Convolution ETP primitive (``etp_conv_p``) through :func:`etrace_fit.ops.conv`.

Every result is compared with ``jax.lax.conv_general_dilated`` (channels-last) plus bias.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import saiunit as u
from jax import lax

from etrace_fit.errors import ShapeError
from etrace_fit.ops import Chain, Masked, Positive, SignConstrained, conv, etp_conv_p

from ._helpers import assert_close, random_array, top_level_primitives

DIMENSION_NUMBERS = {1: ("NWC", "WIO", "NWC"), 2: ("NHWC", "HWIO", "NHWC")}

# (spatial dims, stride, padding, dilation, bias, weight_fn name): strides 1/2,
# padding SAME/VALID/int/pairs, dilation 1/2, with and without bias and weight_fn.
CONFIGS = [
    (1, 1, "SAME", 1, True, "none"),
    (1, 2, "VALID", 2, False, "positive"),
    (1, 1, 2, 1, True, "masked"),
    (1, 2, [(2, 1)], 1, True, "none"),
    (2, 1, "SAME", 1, True, "none"),
    (2, (2, 1), [(1, 0), (2, 1)], (1, 2), True, "chain"),
    (2, 2, "VALID", 2, False, "none"),
    (2, 2, "SAME", 2, True, "signs"),
]
CONFIG_IDS = [f"{d}d-s{s}-p{p}-d{dl}-{'b' if b else 'nob'}-{f}" for d, s, p, dl, b, f in CONFIGS]


def _setup(config, seed, dtype=jnp.float32):
    """Random operands for ``config`` and the pair (etp function, lax reference)."""
    spatial, stride, padding, dilation, with_bias, wfn_name = config
    rng = np.random.default_rng(seed)
    B = int(rng.integers(1, 4))
    size = tuple(int(v) for v in rng.integers(5, 9, size=spatial))
    kernel = tuple(int(v) for v in rng.integers(1, 4, size=spatial))
    c_in, c_out = int(rng.integers(1, 4)), int(rng.integers(1, 5))
    x = random_array(rng, (B, *size, c_in), dtype)
    w = random_array(rng, (*kernel, c_in, c_out), dtype)
    b = random_array(rng, (c_out,), dtype) if with_bias else None

    mask = (rng.uniform(size=w.shape) > 0.3).astype(np.float32)
    signs = np.where(rng.uniform(size=w.shape) > 0.5, 1.0, -1.0).astype(np.float32)
    weight_fn, plain = {
        "none": (None, lambda v: v),
        "positive": (Positive(), jnp.abs),
        "masked": (Masked(mask), lambda v: v * jnp.asarray(mask, v.dtype)),
        "chain": (Chain((Masked(mask), Positive())), lambda v: jnp.abs(v * jnp.asarray(mask, v.dtype))),
        "signs": (SignConstrained(signs), lambda v: jnp.abs(v) * jnp.asarray(signs, v.dtype)),
    }[wfn_name]

    strides = (stride,) * spatial if isinstance(stride, int) else tuple(stride)
    rhs_dilation = (dilation,) * spatial if isinstance(dilation, int) else tuple(dilation)
    lax_padding = [(padding, padding)] * spatial if isinstance(padding, int) else padding

    def etp(x, w, b=None):
        return conv(x, w, b, stride=stride, padding=padding, dilation=dilation, weight_fn=weight_fn)

    def ref(x, w, b=None):
        y = lax.conv_general_dilated(
            x,
            plain(w),
            window_strides=strides,
            padding=lax_padding,
            rhs_dilation=rhs_dilation,
            dimension_numbers=DIMENSION_NUMBERS[spatial],
        )
        return y if b is None else y + b

    return x, w, b, etp, ref


def _args(x, w, b):
    return (x, w) if b is None else (x, w, b)


# ---------------------------------------------------------------------------- forward
@pytest.mark.parametrize("index", range(len(CONFIGS)), ids=CONFIG_IDS)
def test_forward_equals_lax_reference(index):
    x, w, b, etp, ref = _setup(CONFIGS[index], seed=index)
    expected = ref(*_args(x, w, b))
    y = etp(*_args(x, w, b))
    assert y.dtype == jnp.float32
    assert_close(y, expected)
    assert_close(jax.jit(etp)(*_args(x, w, b)), expected)


@pytest.mark.parametrize("index", [0, 5], ids=[CONFIG_IDS[0], CONFIG_IDS[5]])
def test_unbatched_x_gives_unbatched_output(index):
    x, w, b, etp, ref = _setup(CONFIGS[index], seed=20 + index)
    x0 = x[0]
    y = etp(x0, w, b)
    expected = ref(x0[None], w, b)[0]
    assert y.shape == expected.shape
    assert_close(y, expected)
    assert_close(jax.jit(etp)(x0, w, b), expected)


def test_padding_accepts_lowercase_strings():
    x, w, b, _, ref = _setup((2, 1, "SAME", 1, True, "none"), seed=30)
    assert_close(conv(x, w, b, padding="same"), ref(x, w, b))
    assert_close(conv(x, w, b, padding="valid"), jax.lax.conv_general_dilated(
        x, w, (1, 1), "VALID", dimension_numbers=DIMENSION_NUMBERS[2]) + b)


# ---------------------------------------------------------------------- derivatives
@pytest.mark.parametrize("index", range(len(CONFIGS)), ids=CONFIG_IDS)
def test_grad_wrt_x_w_b_equals_lax_grad(index):
    x, w, b, etp, ref = _setup(CONFIGS[index], seed=40 + index)
    args = _args(x, w, b)
    cot = random_array(np.random.default_rng(index), ref(*args).shape)
    argnums = tuple(range(len(args)))

    def grad(f):
        return jax.jit(jax.grad(lambda *a: jnp.sum(cot * f(*a)), argnums=argnums))

    assert_close(grad(etp)(*args), grad(ref)(*args))


def test_grad_eagerly_equals_lax_grad():
    x, w, b, etp, ref = _setup(CONFIGS[5], seed=49)
    loss = lambda f: (lambda x, w, b: jnp.sum(jnp.sin(f(x, w, b))))  # noqa: E731
    assert_close(jax.grad(loss(etp), (0, 1, 2))(x, w, b), jax.jit(jax.grad(loss(ref), (0, 1, 2)))(x, w, b))


@pytest.mark.parametrize("index", [1, 4, 5], ids=[CONFIG_IDS[i] for i in (1, 4, 5)])
def test_jvp_equals_lax_jvp(index):
    x, w, b, etp, ref = _setup(CONFIGS[index], seed=50 + index)
    args = _args(x, w, b)
    rng = np.random.default_rng(51)
    tangents = tuple(random_array(rng, a.shape) for a in args)

    def jvp(f):
        return jax.jit(lambda p, t: jax.jvp(f, p, t))

    assert_close(jvp(etp)(args, tangents), jvp(ref)(args, tangents))
    # Tangent on the kernel only (x and b tangents are symbolic zeros).
    only_w = lambda f: jax.jvp(lambda w: f(x, w, *args[2:]), (w,), (tangents[1],))  # noqa: E731
    assert_close(only_w(etp), only_w(ref))


def test_second_order_derivatives_equal_lax():
    x, w, b, etp, ref = _setup(CONFIGS[5], seed=60)
    v = random_array(np.random.default_rng(61), w.shape)

    def hvp(f):
        loss = lambda w: jnp.sum(jnp.sin(f(x, w, b)))  # noqa: E731
        return jax.jit(lambda w, v: jax.jvp(jax.grad(loss), (w,), (v,))[1])

    assert_close(hvp(etp)(w, v), hvp(ref)(w, v), tol=1e-5)


# ---------------------------------------------------------------------------- vmap
@pytest.mark.parametrize("index, in_axis", [(0, 0), (3, 1), (5, 0), (7, 2)], ids=str)
def test_vmap_over_x_equals_lax_reference(index, in_axis):
    x, w, b, etp, ref = _setup(CONFIGS[index], seed=70 + index)
    V = 2
    xs = jnp.stack([x, x[::-1] * 0.5], axis=in_axis)  # V=2 different batches
    assert xs.shape[in_axis] == V
    mapped = jax.jit(jax.vmap(lambda x: etp(x, w, b), in_axes=in_axis))
    expected = jax.vmap(lambda x: ref(x, w, b), in_axes=in_axis)(xs)
    assert_close(mapped(xs), expected)


def test_vmap_eagerly_over_unbatched_x():
    x, w, b, etp, ref = _setup(CONFIGS[4], seed=80)
    assert_close(jax.vmap(lambda x: etp(x, w, b))(x), ref(x, w, b))


@pytest.mark.parametrize("in_axes", [(0, 0, None), (None, 0, 0), (0, None, 0)], ids=str)
def test_vmap_with_batched_kernel_or_bias_falls_back_correctly(in_axes):
    x, w, b, etp, ref = _setup(CONFIGS[5], seed=90)
    V = 2
    args = [jnp.stack([a, a * -0.5]) if ax == 0 else a for a, ax in zip((x, w, b), in_axes)]
    expected = jax.vmap(ref, in_axes=in_axes)(*args)
    assert_close(jax.jit(jax.vmap(etp, in_axes=in_axes))(*args), expected)
    assert expected.shape[0] == V


@pytest.mark.parametrize("index", [0, 5], ids=[CONFIG_IDS[0], CONFIG_IDS[5]])
def test_vmap_keeps_etp_conv_in_jaxpr(index):
    x, w, b, etp, _ = _setup(CONFIGS[index], seed=100)
    for fn, arg in (
        (jax.vmap(lambda x: etp(x, w, b)), jnp.stack([x, x])),  # batched x
        (jax.vmap(lambda x: etp(x, w, b), in_axes=1), jnp.stack([x, x], axis=1)),
        (jax.vmap(lambda x: etp(x, w, b)), x),  # unbatched x
    ):
        prims = top_level_primitives(fn, arg)
        assert prims.count(etp_conv_p) == 1, prims
        assert lax.conv_general_dilated_p not in prims


def test_vmap_of_grad_equals_lax():
    x, w, b, etp, ref = _setup(CONFIGS[4], seed=110)

    def per_sample(f):
        loss = lambda x, w, b: jnp.sum(jnp.tanh(f(x, w, b)))  # noqa: E731
        return jax.jit(jax.vmap(jax.grad(loss, argnums=(1, 2)), in_axes=(0, None, None)))

    # Inside the vmap each x is one unbatched sample; the lax reference needs a batch axis.
    unbatched_ref = lambda x, w, b: ref(x[None], w, b)[0]  # noqa: E731
    assert_close(per_sample(etp)(x, w, b), per_sample(unbatched_ref)(x, w, b))


def test_equation_parameters_hold_the_geometry():
    x, w, b, etp, _ = _setup(CONFIGS[5], seed=120)
    (eqn,) = [e for e in jax.make_jaxpr(etp)(x, w, b).eqns if e.primitive is etp_conv_p]
    assert eqn.params["strides"] == (2, 1)
    assert eqn.params["padding"] == ((1, 0), (2, 1))
    assert eqn.params["dilation"] == (1, 2)
    assert isinstance(eqn.params["weight_fn"], Chain)


# -------------------------------------------------------------------------- dtypes
@pytest.mark.parametrize("index", [0, 5], ids=[CONFIG_IDS[0], CONFIG_IDS[5]])
def test_bfloat16_is_preserved_and_values_match(index):
    x, w, b, etp, ref = _setup(CONFIGS[index], seed=130, dtype=jnp.bfloat16)
    y = etp(x, w, b)
    assert y.dtype == jnp.bfloat16
    assert_close(y, ref(x, w, b))
    g = jax.jit(jax.grad(lambda w: jnp.sum(etp(x, w, b)).astype(jnp.float32)))(w)
    assert g.dtype == jnp.bfloat16
    assert_close(g, jax.jit(jax.grad(lambda w: jnp.sum(ref(x, w, b)).astype(jnp.float32)))(w))


def test_float64_is_preserved_and_values_match():
    with jax.enable_x64(True):
        x, w, b, etp, ref = _setup(CONFIGS[5], seed=140, dtype=jnp.float64)
        assert x.dtype == jnp.float64
        y = jax.jit(etp)(x, w, b)
        assert y.dtype == jnp.float64
        assert_close(y, ref(x, w, b))


def test_mixed_dtypes_are_promoted():
    x, w, b, etp, ref = _setup(CONFIGS[4], seed=150)
    y = etp(x.astype(jnp.bfloat16), w, b)
    assert y.dtype == jnp.float32
    assert_close(y, ref(x.astype(jnp.bfloat16).astype(jnp.float32), w, b))
    assert etp(x, w.astype(jnp.bfloat16), b.astype(jnp.bfloat16)).dtype == jnp.float32


# -------------------------------------------------------------------------- errors
def _call(jit, fn, *args, **kwargs):
    run = (lambda *a: fn(*a, **kwargs))
    return (jax.jit(run) if jit else run)(*args)


JIT = pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])


@JIT
@pytest.mark.parametrize(
    "x_shape, w_shape", [((2, 8, 3), (3, 4, 5)), ((2, 6, 6, 2), (3, 3, 4, 5))], ids=["1d", "2d"]
)
def test_channel_mismatch_raises_shape_error_naming_op_and_shapes(jit, x_shape, w_shape):
    with pytest.raises(ShapeError) as info:
        _call(jit, conv, jnp.ones(x_shape), jnp.ones(w_shape))
    message = str(info.value)
    assert "etp_conv" in message
    assert f"x.shape={x_shape}" in message and f"weight.shape={w_shape}" in message


@JIT
@pytest.mark.parametrize(
    "x_shape, w_shape",
    [((2, 4, 4, 4, 4, 3), (2, 2, 2, 2, 3, 5)), ((4, 4, 4, 4, 3), (2, 2, 2, 2, 3, 5)), ((2, 3), (3, 5))],
    ids=["4d-kernel", "4d-kernel-unbatched", "0d-kernel"],
)
def test_kernel_with_unsupported_spatial_rank_raises_shape_error(jit, x_shape, w_shape):
    with pytest.raises(ShapeError) as info:
        _call(jit, conv, jnp.ones(x_shape), jnp.ones(w_shape))
    assert "etp_conv" in str(info.value) and f"weight.shape={w_shape}" in str(info.value)


@JIT
def test_x_of_wrong_rank_raises_shape_error(jit):
    with pytest.raises(ShapeError) as info:
        _call(jit, conv, jnp.ones((8, 3)), jnp.ones((3, 3, 3, 5)))
    assert "etp_conv" in str(info.value) and "x.shape=(8, 3)" in str(info.value)


@JIT
def test_bias_of_wrong_shape_raises_shape_error(jit):
    with pytest.raises(ShapeError, match="etp_conv.*bias"):
        _call(jit, conv, jnp.ones((2, 8, 3)), jnp.ones((3, 3, 5)), jnp.ones((4,)))


def test_weight_fn_changing_shape_raises_shape_error():
    with pytest.raises(ShapeError, match="etp_conv"):
        conv(jnp.ones((2, 8, 3)), jnp.ones((3, 3, 5)), weight_fn=lambda w: w[:2])


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(stride=0),
        dict(stride=(1, 1)),
        dict(dilation=-1),
        dict(padding="FULL"),
        dict(padding=[(1, 1), (1, 1)]),
    ],
    ids=["stride0", "stride-pair", "dilation-neg", "padding-full", "padding-two-pairs"],
)
def test_bad_geometry_raises_shape_error(kwargs):
    with pytest.raises(ShapeError, match="etp_conv"):
        conv(jnp.ones((2, 8, 3)), jnp.ones((3, 3, 5)), **kwargs)


# --------------------------------------------------------------------------- units
def test_quantity_input_gives_quantity_output_with_plain_mantissa():
    x, w, b, etp, ref = _setup(CONFIGS[0], seed=160)
    y = conv(x * u.mV, w, b * u.mV)
    assert isinstance(y, u.Quantity) and u.get_unit(y) == u.mV
    assert_close(u.get_mantissa(y), ref(x, w, b))
    with pytest.raises(ShapeError, match="etp_conv"):
        conv(x * u.mV, w, b * u.ms)


def test_a_neuron_after_a_conv_is_told_about_the_positions_and_unbatched_states_about_the_batch():
    """LIF(C) after a conv (positions forgotten) broadcast its state to the input and
    failed in JAX naming no layer; an unbatched conv net's (L, C) state passed the batch
    check with L read as the batch, and the conv weight fell to its one-step gradient."""
    import brainstate

    import etrace_fit as ef
    from etrace_fit import layers as L
    from etrace_fit.errors import ShapeError

    rng = np.random.default_rng(0)
    with brainstate.environ.context(dt=1.0):
        forgot = ef.Sequential(L.Conv1d(2, 3, 3), L.LIF(3), L.Flatten(), L.Linear(3, 2))
        brainstate.nn.init_all_states(forgot, batch_size=2)
        with pytest.raises(ShapeError, match=r"LIF\(3\): expected input \(batch, 3\) or \(3\), got "
                                             r"x.shape=\(2, 5, 3\): more axes than a batch and the layer's units "
                                             r".*LIF\(\(5, 3\)\)"):
            forgot(jnp.ones((2, 5, 2)))
        model = ef.Sequential(L.Conv1d(2, 3, 3, w_init=rng.standard_normal((3, 2, 3))), L.LIF((5, 3)),
                              L.Flatten(num_feature_axes=2), L.Linear(15, 2))
        brainstate.nn.init_all_states(model)  # unbatched: V is (5, 3)
        xs, ys = jnp.asarray(rng.standard_normal((4, 5, 2))), jnp.zeros((4, 2))
        with pytest.raises(ShapeError, match=r"hidden state layers\.1\.V has shape \(5, 3\), its layer's units, "
                                             r"without a batch axis"):
            ef.sequence_grad(model, xs, ys, lambda out, y: jnp.sum((out - y) ** 2), algo="d_rtrl")


def test_a_pooling_that_shrinks_the_positions_is_one_excluded_row_of_the_report():
    """The conv weight before AvgPool1d(2) is excluded (shape mismatch: its one-step
    gradient, not the traced sum docs/layers.md once promised), and the report printed
    its row once per record: twice, identical."""
    import brainstate

    import etrace_fit as ef
    from etrace_fit import layers as L

    with brainstate.environ.context(dt=1.0):
        model = ef.Sequential(L.Conv1d(2, 4, 3), L.AvgPool1d(2), L.LIF((4, 4)), L.Flatten(num_feature_axes=2),
                              L.Linear(16, 2))
        brainstate.nn.init_all_states(model, batch_size=2)
        report = ef.compile_graph(model, jnp.ones((2, 8, 2))).report()
    rows = [line for line in report.splitlines() if line.startswith("layers.0.weight")]
    assert len(rows) == 1 and "excluded: shape mismatch" in rows[0]


def test_a_dense_layer_applied_per_position_names_the_flattening_and_the_conv_that_is_traced():
    """Linear(2, 3) on (B, 5, 2) into LIF((5, 3)): the warning blamed a (10, 3) shape the
    user never wrote; Conv1d(kernel_size=1) is the same map and is exact."""
    import brainstate

    import etrace_fit as ef
    from etrace_fit import layers as L

    with brainstate.environ.context(dt=1.0):
        model = ef.Sequential(L.Linear(2, 3), L.LIF((5, 3)), L.Flatten(num_feature_axes=2), L.Linear(15, 2))
        brainstate.nn.init_all_states(model, batch_size=2)
        graph = ef.compile_graph(model, jnp.ones((2, 5, 2)))
    messages = [d.message for d in graph.diagnostics_of("layers.0.weight")]
    assert any("applied per position: it flattens the leading axes; Conv1d / Conv2d with kernel_size=1" in m
               for m in messages)

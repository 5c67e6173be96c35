"""``LIF`` and ``ALIF`` (etrace_fit/layers/spiking.py).

One step is compared with the docstring equations; gradients through 20 steps are
compared with an independent pure-jnp reference whose spike function is a
``jax.custom_jvp`` of its own (finite differences through a Heaviside mean nothing),
and, below threshold, with true finite differences.
"""

from __future__ import annotations


import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import saiunit as u

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.errors import ConfigError, ShapeError

from ._helpers import (assert_close, check_fd, check_grads_equal, layer_grads, make_spike, rand_np, randn,
                       values_of)

N, B, I, T = 6, 3, 4, 20
TAU = np.array([5.0, 10.0, 20.0, 15.0, 8.0, 30.0])


# --------------------------------------------------------------------------- one step


def _lif_step(v, x, alpha, th, v_reset, reset):
    # V is stored before reset: the spike it emitted is reset at the start of the step.
    z_prev = (v - th > 0).astype(v.dtype)
    if reset == "soft":
        v_after = v - z_prev * (th - v_reset)
    else:
        v_after = v * (1.0 - z_prev) + v_reset * z_prev
    v_new = alpha * v_after + x
    return v_new, (v_new - th > 0).astype(v.dtype)


@pytest.mark.parametrize("reset", ["soft", "hard"])
def test_lif_one_step(env64, reset):
    lif = L.LIF(N, tau=TAU, v_threshold=1.2, v_reset=-0.3, reset=reset)
    brainstate.nn.init_all_states(lif, batch_size=2)
    v0 = jnp.asarray([[0.0, 0.5, 1.0, -0.2, 2.0, 0.9], [1.1, 0.1, 0.0, 0.7, -1.0, 0.3]])
    x = jnp.asarray([[0.2, 0.9, 0.5, 0.1, 0.0, 0.05], [0.6, 1.5, 1.2, 0.0, 3.0, 0.2]])
    lif.V.value = v0
    alpha = jnp.exp(-1.0 / jnp.asarray(TAU))
    v1, z1 = _lif_step(v0, x, alpha, 1.2, -0.3, reset)
    assert 0 < float(z1.sum()) < z1.size  # some neurons spike, some don't
    z = lif(x)
    assert z.dtype == jnp.float64
    assert_close(z, z1)
    assert set(np.unique(np.asarray(z))) <= {0.0, 1.0}
    assert_close(lif.V.value, v1)
    # second step from the new state
    v2, z2 = _lif_step(v1, x, alpha, 1.2, -0.3, reset)
    assert_close(lif(x), z2)
    assert_close(lif.V.value, v2)


def test_lif_at_threshold_does_not_spike(env64):
    lif = L.LIF(3, tau=10.0)
    brainstate.nn.init_all_states(lif)
    assert_close(lif(jnp.asarray([1.0, 1.0 + 1e-9, 0.999])), jnp.asarray([0.0, 1.0, 0.0]))


@pytest.mark.parametrize("reset", ["soft", "hard"])
def test_alif_one_step(env64, reset):
    beta, th, vr = 0.7, 1.0, 0.1
    alif = L.ALIF(N, tau=TAU, tau_a=TAU * 10, beta=beta, v_threshold=th, v_reset=vr, reset=reset)
    brainstate.nn.init_all_states(alif, batch_size=2)
    v0 = jnp.asarray([[0.0, 0.5, 1.0, -0.2, 2.0, 0.9], [1.1, 0.1, 0.0, 0.7, -1.0, 0.3]])
    a0 = jnp.asarray([[0.0, 1.0, 0.5, 2.0, 0.2, 0.0], [0.3, 0.0, 1.5, 0.0, 0.8, 1.0]])
    x = jnp.asarray([[0.2, 0.9, 0.5, 0.1, 0.3, 0.05], [0.6, 1.5, 2.2, 0.6, 3.0, 0.2]])
    alif.V.value, alif.a.value = v0, a0
    alpha, rho = jnp.exp(-1.0 / jnp.asarray(TAU)), jnp.exp(-1.0 / jnp.asarray(TAU * 10))

    def ref(v, a):
        A_prev = th + beta * a
        z_prev = (v - A_prev > 0).astype(v.dtype)
        a_new = rho * a + z_prev
        v_after = v - z_prev * (A_prev - vr) if reset == "soft" else v * (1 - z_prev) + vr * z_prev
        v_new = alpha * v_after + x
        z = (v_new - (th + beta * a_new) > 0).astype(v.dtype)
        return v_new, a_new, z

    v1, a1, z1 = ref(v0, a0)
    assert 0 < float(z1.sum()) < z1.size
    # the adaptation matters: some neuron is above v_threshold but below A
    assert bool(jnp.any((v1 > th) & (z1 == 0)))
    assert_close(alif(x), z1)
    assert_close(alif.V.value, v1)
    assert_close(alif.a.value, a1)
    v2, a2, z2 = ref(v1, a1)
    assert_close(alif(x), z2)
    assert_close(alif.V.value, v2)
    assert_close(alif.a.value, a2)


def test_learned_tau_forward_equals_fixed(env64):
    xs = randn(0, 10, B, N, scale=0.8) + 0.3
    outs = []
    for learn in (False, True):
        alif = L.ALIF(N, tau=TAU, tau_a=TAU * 5, learn_tau=learn, learn_tau_a=learn)
        if learn:
            assert isinstance(alif.tau, brainstate.ParamState) and alif.tau.value.shape == (N,)
            assert isinstance(alif.tau_a, brainstate.ParamState) and alif.tau_a.value.shape == (N,)
            assert alif.tau.value.dtype == jnp.float64
            assert sorted(alif.states(brainstate.ParamState)) == [("tau",), ("tau_a",)]
        brainstate.nn.init_all_states(alif, batch_size=B)
        outs.append((brainstate.transform.for_loop(alif, xs), alif.V.value, alif.a.value))
    assert float(outs[0][0].sum()) > 0
    assert_close(outs[1], outs[0])


def test_scalar_tau_broadcasts(env64):
    lif = L.LIF(N, tau=7.0, learn_tau=True)
    assert_close(lif.tau.value, jnp.full((N,), 7.0))


# --------------------------------------------------------------------------- states


@pytest.mark.parametrize("batch", [1, 7, None])
@pytest.mark.parametrize("cls,names", [(L.LIF, ["V"]), (L.ALIF, ["V", "a"])])
def test_state_shapes(env, batch, cls, names):
    layer = cls(N)
    expected = (N,) if batch is None else (batch, N)
    brainstate.nn.init_all_states(layer, batch_size=batch)
    hidden = layer.states(brainstate.HiddenState)
    assert sorted(k for (k,) in hidden) == names
    assert all(s.value.shape == expected and s.value.dtype == jnp.float32 for s in hidden.values())
    assert layer(jnp.full(expected, 2.0)).shape == expected
    assert float(jnp.sum(layer.V.value != 0)) > 0
    brainstate.nn.reset_all_states(layer, batch_size=batch)
    for s in layer.states(brainstate.HiddenState).values():
        assert s.value.shape == expected
        assert float(jnp.max(jnp.abs(s.value))) == 0.0


def test_state_init(env64):
    lif = L.LIF(N, state_init=brainstate.nn.init.Constant(0.25))
    brainstate.nn.init_all_states(lif, batch_size=2)
    assert_close(lif.V.value, jnp.full((2, N), 0.25))
    alif = L.ALIF(N, state_init=brainstate.nn.init.Constant(0.25))
    brainstate.nn.init_all_states(alif, batch_size=2)
    assert_close(alif.V.value, jnp.full((2, N), 0.25))
    assert_close(alif.a.value, jnp.zeros((2, N)))


# --------------------------------------------------------------------------- gradients


def _inputs():
    xs = randn(7, T, B, I, scale=1.5) + 0.4
    c = randn(8, T, B, N)
    d = randn(9, B, N)
    e = randn(10, B, N)
    return xs, c, d, e


def _linear():
    return L.Linear(I, N, w_init=rand_np(1, I, N, scale=0.8), b_init=rand_np(2, N, scale=0.3))


def _ref_loss(vals, xs, c, d, e, *, kind, tau, tau_a, beta, th, vr, reset, surrogate, scale, detach):
    spike = make_spike(surrogate, scale)
    w = vals[("layers", 0, "weight")]
    tau = vals.get(("layers", 1, "tau"), tau)
    alpha = jnp.exp(-1.0 / tau)
    rho = jnp.exp(-1.0 / vals.get(("layers", 1, "tau_a"), tau_a)) if kind == "ALIF" else None

    def step(carry, x):
        v, a = carry
        A_prev = th + beta * a if kind == "ALIF" else th
        z_prev = spike(v - A_prev)
        zr = jax.lax.stop_gradient(z_prev) if detach else z_prev
        v_after = v - zr * (A_prev - vr) if reset == "soft" else v * (1.0 - zr) + vr * zr
        if kind == "ALIF":
            a = rho * a + z_prev
        A = th + beta * a if kind == "ALIF" else th
        v = alpha * v_after + (x @ w["weight"] + w["bias"])
        return (v, a), spike(v - A)

    zero = jnp.zeros((B, N))
    (v, a), zs = jax.lax.scan(step, (zero, zero), xs)
    out = jnp.sum(zs * c) + jnp.sum(v * d)
    if kind == "ALIF":
        out = out + jnp.sum(a * e)
    return out, zs


SPIKING_CASES = [
    dict(kind="LIF", reset="soft", surrogate="triangle", scale=None, detach=False, learn=True),
    dict(kind="LIF", reset="hard", surrogate="sigmoid", scale=None, detach=False, learn=True),
    dict(kind="LIF", reset="soft", surrogate="fast_sigmoid", scale=0.3, detach=True, learn=False),
    dict(kind="LIF", reset="hard", surrogate="triangle", scale=0.5, detach=True, learn=True),
    dict(kind="ALIF", reset="soft", surrogate="sigmoid", scale=None, detach=False, learn=True),
    dict(kind="ALIF", reset="hard", surrogate="fast_sigmoid", scale=None, detach=False, learn=True),
    dict(kind="ALIF", reset="soft", surrogate="triangle", scale=0.3, detach=True, learn=False),
]


@pytest.mark.parametrize("case", SPIKING_CASES, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_spiking_gradients_match_reference(env64, case):
    th, vr, beta = 1.0, -0.1, 0.4
    tau_a = TAU * 3
    common = dict(tau=TAU, v_threshold=th, v_reset=vr, reset=case["reset"], surrogate=case["surrogate"],
                  surrogate_scale=case["scale"], detach_reset=case["detach"], learn_tau=case["learn"])
    if case["kind"] == "LIF":
        neuron = L.LIF(N, **common)
    else:
        neuron = L.ALIF(N, tau_a=tau_a, beta=beta, learn_tau_a=case["learn"], **common)
    model = ef.Sequential(_linear(), neuron)
    brainstate.nn.init_all_states(model, batch_size=B)
    xs, c, d, e = _inputs()
    params = model.states(brainstate.ParamState)
    expected_keys = {("layers", 0, "weight")}
    if case["learn"]:
        expected_keys |= {("layers", 1, "tau")} | ({("layers", 1, "tau_a")} if case["kind"] == "ALIF" else set())
    assert set(params) == expected_keys

    def loss():
        brainstate.nn.reset_all_states(model, batch_size=B)
        zs = brainstate.transform.for_loop(model, xs)
        out = jnp.sum(zs * c) + jnp.sum(model[1].V.value * d)
        if case["kind"] == "ALIF":
            out = out + jnp.sum(model[1].a.value * e)
        return out, zs

    ref_kwargs = dict(kind=case["kind"], tau=jnp.asarray(TAU), tau_a=jnp.asarray(tau_a), beta=beta, th=th, vr=vr,
                      reset=case["reset"], surrogate=case["surrogate"],
                      scale=1.0 if case["scale"] is None else case["scale"], detach=case["detach"])
    ref_value, ref_zs = _ref_loss(values_of(params), xs, c, d, e, **ref_kwargs)
    value, zs = loss()
    rate = float(ref_zs.mean())
    assert 0.05 < rate < 0.7, f"firing rate {rate} makes the test weak"
    assert_close(zs, ref_zs)
    np.testing.assert_allclose(float(value), float(ref_value), rtol=1e-12)

    grads = brainstate.transform.grad(lambda: loss()[0], grad_states=params)()
    ref_grads = jax.grad(lambda v: _ref_loss(v, xs, c, d, e, **ref_kwargs)[0])(values_of(params))
    check_grads_equal(grads, ref_grads)


@pytest.mark.parametrize("kind", ["LIF", "ALIF"])
def test_subthreshold_gradients_match_finite_differences(env64, kind):
    # no spike ever fires: the membrane is a smooth function of weights and taus
    if kind == "LIF":
        neuron = L.LIF(N, tau=TAU, v_threshold=1e6, learn_tau=True)
    else:
        neuron = L.ALIF(N, tau=TAU, tau_a=TAU * 3, v_threshold=1e6, learn_tau=True, learn_tau_a=True)
    model = ef.Sequential(_linear(), neuron)
    brainstate.nn.init_all_states(model, batch_size=B)
    xs, c, _, _ = _inputs()
    params = model.states(brainstate.ParamState)

    def loss():
        brainstate.nn.reset_all_states(model, batch_size=B)
        zs, vs = brainstate.transform.for_loop(lambda x: (model(x), model[1].V.value), xs)
        return jnp.sum(zs) + jnp.sum(jnp.tanh(vs) * c)

    grads = layer_grads(loss, params)
    assert float(loss()) != 0.0
    # tau_a only acts on the adaptation, which stays 0 without spikes
    if kind == "ALIF":
        assert float(jnp.max(jnp.abs(grads[("layers", 1, "tau_a")]))) == 0.0
    check_fd(loss, params, grads, entries=5, skip_zero=lambda path, _: path[-1] == "tau_a")


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("cls", [L.LIF, L.ALIF])
def test_wrong_input_size(env, cls):
    layer = cls(N)
    brainstate.nn.init_all_states(layer, batch_size=B)
    with pytest.raises(ShapeError) as info:
        layer(jnp.ones((B, N + 1)))
    message = str(info.value)
    assert f"{cls.__name__}({N})" in message and f"({B}, {N + 1})" in message


def test_alif_beta_must_be_a_finite_number():
    """``beta=nan`` was taken: every batch's loss was NaN, blamed on the learning rate."""
    for bad in (float("nan"), "0.5", True):
        with pytest.raises(ConfigError, match=r"ALIF\(4\): beta \(the adaptation strength\) must be a finite number"):
            L.ALIF(4, beta=bad)


@pytest.mark.parametrize("cls", [L.LIF, L.ALIF])
def test_config_errors(cls):
    with pytest.raises(ConfigError) as info:
        cls(N, reset="zero")
    assert "'zero'" in str(info.value) and "soft" in str(info.value) and "hard" in str(info.value)
    with pytest.raises(ConfigError) as info:
        cls(N, surrogate="relu")
    for name in ("'relu'", "sigmoid", "triangle", "fast_sigmoid"):
        assert name in str(info.value)
    with pytest.raises(ConfigError, match="surrogate"):
        cls(N, surrogate=3)
    for bad in (0.0, -5.0, np.array([1.0, 2.0, 0.0, 1.0, 1.0, 1.0])):
        with pytest.raises(ConfigError, match="tau"):
            cls(N, tau=bad)
    with pytest.raises(ShapeError, match="tau"):
        cls(N, tau=np.ones(N + 1))
    with pytest.raises(ConfigError, match="v_threshold"):
        cls(N, v_threshold=0.0, v_reset=0.0)
    # raw numpy / Python errors before: a string, an array threshold, a non-finite one
    for bad in ("x", float("nan"), float("inf")):
        with pytest.raises(ConfigError, match=r"tau must be a positive finite number"):
            cls(N, tau=bad)
    with pytest.raises(ConfigError, match=r"v_threshold and v_reset must be numbers \(or one per unit\), got '1'"):
        cls(N, v_threshold="1")
    with pytest.raises(ConfigError, match=r"v_threshold and v_reset must be finite"):
        cls(N, v_threshold=float("nan"))
    cls(N, v_threshold=np.linspace(0.5, 1.5, N))  # one per unit: taken
    with pytest.raises(ConfigError, match=r"v_threshold \(.*\) must exceed v_reset"):
        cls(N, v_threshold=np.linspace(-0.5, 1.5, N))
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ConfigError, match="size"):
            cls(bad)


def test_alif_tau_a_must_be_positive():
    with pytest.raises(ConfigError, match="tau_a"):
        L.ALIF(N, tau_a=0.0)
    with pytest.raises(ConfigError, match="tau_a"):
        L.ALIF(N, tau_a=-200.0, learn_tau_a=True)


@pytest.mark.parametrize("cls", [L.LIF, L.ALIF])
def test_missing_dt(no_dt, cls):
    layer = cls(N, name="hidden")
    brainstate.nn.init_all_states(layer, batch_size=B)
    with pytest.raises(ConfigError) as info:
        layer(jnp.ones((B, N)))
    message = str(info.value)
    assert "brainstate.environ.set(dt=" in message
    assert f"{cls.__name__}({N}) 'hidden'" in message


# --------------------------------------------------------------------------- units


def _run_units(tau, tau_a, dt, learn=False):
    with brainstate.environ.context(dt=dt, precision=64):
        model = ef.Sequential(_linear(), L.ALIF(N, tau=tau, tau_a=tau_a, learn_tau=learn, learn_tau_a=learn))
        brainstate.nn.init_all_states(model, batch_size=B)
        xs = _inputs()[0]
        zs = brainstate.transform.for_loop(model, xs)
        return tuple(np.asarray(v) for v in (zs, model[1].V.value, model[1].a.value))


def test_units_give_same_output_as_plain_numbers():
    plain = _run_units(20.0, 200.0, 1.0)
    assert plain[0].dtype == np.float64 and plain[0].sum() > 0
    assert_close(_run_units(20.0 * u.ms, 200.0 * u.ms, 1.0 * u.ms), plain)
    assert_close(_run_units(0.02 * u.second, 0.2 * u.second, 1.0 * u.ms), plain)
    with brainstate.environ.context(dt=1.0 * u.ms, precision=64):
        lif = L.LIF(N, tau=20.0 * u.ms)
        brainstate.nn.init_all_states(lif, batch_size=B)
        ref = L.LIF(N, tau=20.0)
        brainstate.nn.init_all_states(ref, batch_size=B)
        x = randn(0, B, N) + 0.8
        with brainstate.environ.context(dt=1.0):
            expected = [ref(x) for _ in range(5)]
        assert_close([lif(x) for _ in range(5)], expected)
        assert_close(lif.V.value, ref.V.value)


def test_units_with_learned_time_constants():
    plain = _run_units(20.0, 200.0, 1.0)
    assert_close(_run_units(20.0 * u.ms, 200.0 * u.ms, 1.0 * u.ms, learn=True), plain)


def test_units_mismatch_raises():
    with brainstate.environ.context(dt=1.0 * u.ms):
        lif = L.LIF(3, tau=20.0)
        brainstate.nn.init_all_states(lif)
        with pytest.raises(ConfigError, match="unit"):
            lif(jnp.ones(3))


def test_per_unit_thresholds_and_beta_are_checked_against_the_units_and_run(env64):
    """A list threshold, one of the wrong length, one with a unit, a list beta: all built,
    then failed at the first step with Python's or JAX's error naming no layer."""
    import saiunit as u

    for bad, match in [(dict(v_threshold=np.ones(N + 1)), rf"LIF\({N}\): v_threshold has shape \({N + 1},\), which "
                                                           rf"does not fit the layer's units \({N},\)"),
                       (dict(v_threshold=1 * u.mV, v_reset=0 * u.mV), r"v_threshold must be a plain number"),
                       (dict(v_reset=[0.0, 0.1]), r"v_reset has shape \(2,\)")]:
        with pytest.raises(ConfigError, match=match):
            L.LIF(N, **bad)
    with pytest.raises(ConfigError, match=rf"ALIF\({N}\): beta has shape \(3,\)"):
        L.ALIF(N, beta=[0.1] * 3)
    thresholds = [0.5 + 0.1 * n for n in range(N)]
    listed, arrayed = L.LIF(N, v_threshold=thresholds), L.LIF(N, v_threshold=np.asarray(thresholds))
    alif = L.ALIF(N, beta=[0.2] * N)
    for layer in (listed, arrayed, alif):
        brainstate.nn.init_all_states(layer, batch_size=B)
    x = jnp.linspace(0.2, 1.0, B * N).reshape(B, N)
    np.testing.assert_array_equal(listed(x), arrayed(x))
    assert alif(x).shape == (B, N)

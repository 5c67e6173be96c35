"""``LeakyRateReadout`` and ``LeakySpikeReadout`` (etrace_fit/layers/readout.py)."""

from __future__ import annotations

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from etrace_fit import layers as L
from etrace_fit.errors import ConfigError, ShapeError

from ._helpers import (assert_close, check_fd, check_grads_equal, layer_grads, make_spike, rand_np, randn,
                       values_of)

I, O, B, T = 5, 3, 2, 20
TAU = np.array([4.0, 10.0, 25.0])


def _kw(seed=0):
    return dict(w_init=rand_np(seed, I, O, scale=0.6), b_init=rand_np(seed + 1, O, scale=0.3))


@pytest.mark.parametrize("batch", [B, None])
def test_rate_readout_one_step(env64, batch):
    readout = L.LeakyRateReadout(I, O, tau=TAU, **_kw())
    brainstate.nn.init_all_states(readout, batch_size=batch)
    lead = () if batch is None else (batch,)
    r0 = randn(1, *lead, O)
    readout.r.value = r0
    x = randn(2, *lead, I)
    p = readout.weight.value
    kappa = jnp.exp(-1.0 / jnp.asarray(TAU))
    r1 = kappa * r0 + x @ p["weight"] + p["bias"]
    assert_close(readout(x), r1)
    assert_close(readout.r.value, r1)
    assert_close(readout(x), kappa * r1 + x @ p["weight"] + p["bias"])


def test_rate_readout_without_bias(env64):
    readout = L.LeakyRateReadout(I, O, tau=10.0, w_init=rand_np(0, I, O), with_bias=False)
    assert set(readout.weight.value) == {"weight"}
    brainstate.nn.init_all_states(readout, batch_size=B)
    x = randn(2, B, I)
    assert_close(readout(x), x @ readout.weight.value["weight"])


@pytest.mark.parametrize("reset", ["soft", "hard"])
def test_spike_readout_one_step(env64, reset):
    th, vr = 0.8, -0.2
    readout = L.LeakySpikeReadout(I, O, tau=TAU, v_threshold=th, v_reset=vr, reset=reset, **_kw())
    brainstate.nn.init_all_states(readout, batch_size=4)
    v0 = randn(1, 4, O, scale=0.5)
    readout.V.value = v0
    x = randn(2, 4, I)
    p = readout.weight.value
    alpha = jnp.exp(-1.0 / jnp.asarray(TAU))

    def ref(v):
        # V is stored before reset: last step's spike is reset first.
        z_prev = (v > th).astype(v.dtype)
        v_after = v - z_prev * (th - vr) if reset == "soft" else v * (1 - z_prev) + vr * z_prev
        v_new = alpha * v_after + x @ p["weight"] + p["bias"]
        return v_new, (v_new > th).astype(v.dtype)

    v1, z1 = ref(v0)
    assert 0 < float(z1.sum()) < z1.size
    assert_close(readout(x), z1)
    assert_close(readout.V.value, v1)
    v2, z2 = ref(v1)
    assert_close(readout(x), z2)
    assert_close(readout.V.value, v2)


@pytest.mark.parametrize("batch", [1, 7, None])
@pytest.mark.parametrize("cls,name", [(L.LeakyRateReadout, "r"), (L.LeakySpikeReadout, "V")])
def test_state_shapes(env, batch, cls, name):
    readout = cls(I, O, w_init=np.ones((I, O)))
    expected = (O,) if batch is None else (batch, O)
    brainstate.nn.init_all_states(readout, batch_size=batch)
    hidden = readout.states(brainstate.HiddenState)
    assert list(hidden) == [(name,)]
    assert hidden[(name,)].value.shape == expected and hidden[(name,)].value.dtype == jnp.float32
    assert readout(jnp.ones((*expected[:-1], I))).shape == expected
    assert float(jnp.max(jnp.abs(hidden[(name,)].value))) > 0
    brainstate.nn.reset_all_states(readout, batch_size=batch)
    state = readout.states(brainstate.HiddenState)[(name,)]
    assert state.value.shape == expected and float(jnp.max(jnp.abs(state.value))) == 0.0


@pytest.mark.parametrize("learn_tau", [False, True])
def test_rate_readout_gradients_match_finite_differences(env64, learn_tau):
    readout = L.LeakyRateReadout(I, O, tau=TAU, learn_tau=learn_tau, **_kw())
    params = readout.states(brainstate.ParamState)
    assert set(params) == ({("weight",), ("tau",)} if learn_tau else {("weight",)})
    brainstate.nn.init_all_states(readout, batch_size=B)
    xs = randn(3, T, B, I)
    target = randn(4, T, B, O)

    def loss():
        brainstate.nn.reset_all_states(readout, batch_size=B)
        rs = brainstate.transform.for_loop(readout, xs)
        return jnp.sum((rs - target) ** 2)

    check_fd(loss, params, layer_grads(loss, params), entries=6)


@pytest.mark.parametrize("reset,surrogate,detach", [("soft", "triangle", False), ("hard", "sigmoid", True)])
def test_spike_readout_gradients_match_reference(env64, reset, surrogate, detach):
    th, vr = 0.5, 0.0
    readout = L.LeakySpikeReadout(I, O, tau=TAU, v_threshold=th, v_reset=vr, reset=reset, surrogate=surrogate,
                                  surrogate_scale=0.7, detach_reset=detach, learn_tau=True, **_kw())
    params = readout.states(brainstate.ParamState)
    assert set(params) == {("weight",), ("tau",)}
    brainstate.nn.init_all_states(readout, batch_size=B)
    xs = randn(3, T, B, I) + 0.3
    c = randn(4, T, B, O)
    d = randn(5, B, O)
    spike = make_spike(surrogate, 0.7)

    def ref(vals):
        p, tau = vals[("weight",)], vals[("tau",)]
        alpha = jnp.exp(-1.0 / tau)

        def step(v, x):
            z_prev = spike(v - th)
            zr = jax.lax.stop_gradient(z_prev) if detach else z_prev
            v_after = v - zr * (th - vr) if reset == "soft" else v * (1 - zr) + vr * zr
            v = alpha * v_after + x @ p["weight"] + p["bias"]
            return v, spike(v - th)

        v, zs = jax.lax.scan(step, jnp.zeros((B, O)), xs)
        return jnp.sum(zs * c) + jnp.sum(v * d), zs

    def loss():
        brainstate.nn.reset_all_states(readout, batch_size=B)
        zs = brainstate.transform.for_loop(readout, xs)
        return jnp.sum(zs * c) + jnp.sum(readout.V.value * d), zs

    (value, zs), (ref_value, ref_zs) = loss(), ref(values_of(params))
    assert 0.05 < float(ref_zs.mean()) < 0.7
    assert_close(zs, ref_zs)
    np.testing.assert_allclose(float(value), float(ref_value), rtol=1e-12)
    grads = brainstate.transform.grad(lambda: loss()[0], grad_states=params)()
    check_grads_equal(grads, jax.grad(lambda v: ref(v)[0])(values_of(params)))


@pytest.mark.parametrize("cls", [L.LeakyRateReadout, L.LeakySpikeReadout])
def test_wrong_input_size(env, cls):
    readout = cls(I, O, w_init=np.ones((I, O)))
    brainstate.nn.init_all_states(readout, batch_size=B)
    with pytest.raises(ShapeError) as info:
        readout(jnp.ones((B, I + 2)))
    message = str(info.value)
    assert f"{cls.__name__}({I}, {O})" in message and f"({B}, {I + 2})" in message


@pytest.mark.parametrize("cls", [L.LeakyRateReadout, L.LeakySpikeReadout])
def test_config_errors(cls):
    w = np.ones((I, O))
    for bad in (0.0, -1.0):
        with pytest.raises(ConfigError, match="tau"):
            cls(I, O, tau=bad, w_init=w)
    with pytest.raises(ConfigError, match="in_size"):
        cls(0, O)
    with pytest.raises(ConfigError, match="out_size"):
        cls(I, -1)


def test_spike_readout_config_errors():
    w = np.ones((I, O))
    with pytest.raises(ConfigError) as info:
        L.LeakySpikeReadout(I, O, reset="none", w_init=w)
    assert "LeakySpikeReadout(5, 3)" in str(info.value) and "soft" in str(info.value) and "hard" in str(info.value)
    with pytest.raises(ConfigError) as info:
        L.LeakySpikeReadout(I, O, surrogate="step", w_init=w)
    for name in ("'step'", "sigmoid", "triangle", "fast_sigmoid"):
        assert name in str(info.value)
    with pytest.raises(ConfigError, match="v_threshold"):
        L.LeakySpikeReadout(I, O, v_threshold=-1.0, v_reset=0.0, w_init=w)


@pytest.mark.parametrize("cls", [L.LeakyRateReadout, L.LeakySpikeReadout])
def test_missing_dt(no_dt, cls):
    readout = cls(I, O, w_init=np.ones((I, O)))
    brainstate.nn.init_all_states(readout)
    with pytest.raises(ConfigError, match=r"brainstate\.environ\.set\(dt="):
        readout(jnp.ones(I))

"""Synapses (exponential, dual-exponential, alpha, short-term plasticity), the IF neuron
and the LRU: the forward pass against numpy references written here, and every rule's
gradient against BPTT (float64): D-RTRL and hybrid exact (the recurrences are
elementwise), ES-D-RTRL within the cosine documented in docs/layers.md."""

from __future__ import annotations

import warnings

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.errors import ConfigError, ShapeError

from ._helpers import check_grads_equal, sequence_grads

T, B = 30, 3


def run(layer, xs):
    brainstate.nn.init_all_states(layer, batch_size=xs.shape[1])
    return np.asarray(brainstate.transform.for_loop(layer, jnp.asarray(xs)))


def impulse(size=2, steps=12):
    xs = np.zeros((steps, 1, size))
    xs[0] = 1.0
    return xs


# ------------------------------------------------------------------ forward references
def test_exponential_synapse_decays_by_exp_minus_dt_over_tau():
    with brainstate.environ.context(precision=64, dt=1.0):
        out = run(L.ExpSynapse(2, tau=4.0), impulse())
    alpha = np.exp(-1 / 4.0)
    np.testing.assert_allclose(out[:, 0, 0], alpha ** np.arange(12), rtol=1e-12)


def test_dual_exponential_synapse_rises_then_falls():
    with brainstate.environ.context(precision=64, dt=1.0):
        out = run(L.DualExpSynapse(2, tau_rise=2.0, tau_decay=6.0), impulse())
    rise, fall = np.exp(-1 / 2.0), np.exp(-1 / 6.0)
    t = np.arange(12)
    np.testing.assert_allclose(out[:, 0, 1], (fall ** t - rise ** t) / (fall - rise), rtol=1e-12, atol=1e-15)
    assert out[0, 0, 0] == 0.0 and out[1, 0, 0] == pytest.approx(1.0) and out[2, 0, 0] > 1.0
    assert out[-1, 0, 0] < out[3, 0, 0]


def test_alpha_synapse_is_the_discrete_alpha_function():
    with brainstate.environ.context(precision=64, dt=1.0):
        out = run(L.AlphaSynapse(2, tau=3.0), impulse())
    alpha = np.exp(-1 / 3.0)
    t = np.arange(12)
    np.testing.assert_allclose(out[:, 0, 0], (1 - alpha) * (t + 1) * alpha ** t, rtol=1e-12)


def test_if_neuron_integrates_without_leak_and_resets_by_subtraction():
    with brainstate.environ.context(precision=64, dt=1.0):
        out = run(L.IF(1), np.full((12, 1, 1), 0.35))
    # 0.35 per step, threshold 1, minus 1 after each spike: V = 0.35, 0.7, 1.05 (spike), 0.4, 0.75,
    # 1.1 (spike), 0.45, 0.8, 1.15 (spike), 0.5, 0.85, 1.2 (spike)
    np.testing.assert_array_equal(np.flatnonzero(out[:, 0, 0]), [2, 5, 8, 11])


def test_stp_depresses_with_a_large_u_and_facilitates_with_a_small_one():
    spikes = np.ones((6, 1, 1))

    def reference(U, tau_f, tau_d):
        u, x, out = U, 1.0, []
        for _ in range(6):
            u_plus = u + U * (1 - u)
            out.append(u_plus * x)
            x = x - u_plus * x
            u = U + (u_plus - U) * np.exp(-1 / tau_f)
            x = 1 + (x - 1) * np.exp(-1 / tau_d)
        return np.array(out)

    with brainstate.environ.context(precision=64, dt=1.0):
        depressing = run(L.STP(1, U=0.6, tau_f=2.0, tau_d=50.0), spikes)[:, 0, 0]
        facilitating = run(L.STP(1, U=0.05, tau_f=100.0, tau_d=2.0), spikes)[:, 0, 0]
    np.testing.assert_allclose(depressing, reference(0.6, 2.0, 50.0), rtol=1e-12)
    np.testing.assert_allclose(facilitating, reference(0.05, 100.0, 2.0), rtol=1e-12)
    assert depressing[-1] < depressing[0] and facilitating[-1] > facilitating[0]


def test_lru_matches_a_complex_numpy_recurrence():
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(10, 2, 3))
    with brainstate.environ.context(precision=64, dt=1.0):
        lru = L.LRU(3, 4, 2)
        out = run(lru, xs)
        nu, theta = np.asarray(lru.nu_log.value), np.asarray(lru.theta_log.value)
        B = np.asarray(lru.B_re.weight.value["weight"]) + 1j * np.asarray(lru.B_im.weight.value["weight"])
        C, bias = np.asarray(lru.C.weight.value["weight"]), np.asarray(lru.C.weight.value["bias"])
    lam = np.exp(-np.exp(nu) + 1j * np.exp(theta))
    gamma = np.sqrt(1 - np.abs(lam) ** 2)
    h = np.zeros((2, 4), complex)
    for t in range(10):
        h = lam * h + gamma * (xs[t] @ B)
        expected = np.concatenate([h.real, h.imag], axis=-1) @ C + bias
        np.testing.assert_allclose(out[t], expected, rtol=1e-10, atol=1e-12)
    assert np.all(np.abs(lam) < 1)


# ------------------------------------------------------------------ gradients
def spiking(synapse, threshold=0.5):
    return lambda: ef.Sequential(L.Linear(3, 5), synapse(), L.LIF(5, tau=5.0, v_threshold=threshold,
                                                                  surrogate="sigmoid"), L.Linear(5, 2))


MODELS = {  # name: (model, spike inputs, ES-D-RTRL cosine bound as in docs/layers.md)
    "ExpSynapse": (spiking(lambda: L.ExpSynapse(5, tau=4.0)), False, 0.99),
    "ExpSynapse(learn_tau)": (spiking(lambda: L.ExpSynapse(5, tau=4.0, learn_tau=True)), False, 0.99),
    "DualExpSynapse": (spiking(lambda: L.DualExpSynapse(5, tau_rise=2.0, tau_decay=6.0)), False, 0.98),
    "AlphaSynapse": (spiking(lambda: L.AlphaSynapse(5, tau=3.0), threshold=0.3), False, 0.99),
    "IF": (lambda: ef.Sequential(L.Linear(3, 5), L.IF(5, surrogate="sigmoid"), L.Linear(5, 2)), False, 0.99),
    "LRU": (lambda: L.LRU(3, 6, 2), False, 0.98),
    "STP": (lambda: ef.Sequential(L.STP(3, U=0.3, tau_f=20.0, tau_d=30.0), L.Linear(3, 5),
                                  L.LIF(5, tau=5.0, v_threshold=0.3, surrogate="sigmoid"), L.Linear(5, 2)), True, 0.99),
}


def grads_of(name, algo):
    make, spikes, _ = MODELS[name]
    rng = np.random.default_rng(0)
    brainstate.random.seed(1)
    model = make()
    brainstate.nn.init_all_states(model, batch_size=B)
    xs = (rng.random((T, B, 3)) < 0.3).astype(float) if spikes else rng.normal(size=(T, B, 3)) + 0.3
    ys = rng.normal(size=(T, B, 2))
    return model, sequence_grads(model, jnp.asarray(xs), jnp.asarray(ys), algo), jnp.asarray(xs)


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("algo", ["d_rtrl", "hybrid"])
def test_d_rtrl_and_hybrid_equal_bptt(name, algo):
    with brainstate.environ.context(precision=64, dt=1.0):
        _, reference, _ = grads_of(name, "reference")
        model, grads, xs = grads_of(name, algo)
        check_grads_equal(grads, reference, rtol=1e-8, atol=1e-12)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ef.ApproximationWarning)  # the compiler knows it is exact
            learner = ef.compile(model, xs[0], algo="d_rtrl")
        assert learner.rules and set(learner.rules.values()) == {"d_rtrl"}
        assert learner.approximations() == {}


@pytest.mark.parametrize("name", list(MODELS))
def test_es_d_rtrl_is_within_its_documented_cosine(name):
    with brainstate.environ.context(precision=64, dt=1.0):
        _, reference, _ = grads_of(name, "reference")
        _, grads, _ = grads_of(name, "esd_rtrl")
    flat = lambda g: np.concatenate([np.ravel(np.asarray(v)) for v in jax.tree.leaves(g)])  # noqa: E731
    a, r = flat(grads), flat(reference)
    assert np.all(np.isfinite(a))
    assert float(a @ r / np.linalg.norm(a) / np.linalg.norm(r)) >= MODELS[name][2]


# ------------------------------------------------------------------ errors
def test_bad_arguments_name_the_layer():
    with brainstate.environ.context(dt=1.0):
        with pytest.raises(ConfigError, match="DualExpSynapse\\(4\\): tau_rise \\(5.0\\) must be below"):
            L.DualExpSynapse(4, tau_rise=5.0, tau_decay=2.0)
        with pytest.raises(ConfigError, match="STP\\(4\\): U must be in"):
            L.STP(4, U=1.5)
        with pytest.raises(ConfigError, match="LRU\\(3, 4\\): need 0 <= r_min < r_max < 1"):
            L.LRU(3, 4, r_max=1.0)
        with pytest.raises(ConfigError, match="tau must be a positive finite number"):
            L.ExpSynapse(4, tau=0.0)
        synapse = L.AlphaSynapse(4)
        brainstate.nn.init_all_states(synapse, batch_size=2)
        with pytest.raises(ShapeError, match="AlphaSynapse\\(4\\).*got x.shape=\\(2, 5\\)"):
            synapse(jnp.ones((2, 5)))
        lru = L.LRU(3, 4)
        brainstate.nn.init_all_states(lru, batch_size=2)
        with pytest.raises(ShapeError, match="LRU\\(3, 4, 3\\).*3 features"):
            lru(jnp.ones((2, 5)))


def test_dual_exp_time_constants_are_compared_unit_by_unit_and_in_one_unit():
    """tau_rise=[1, 4], tau_decay=[3, 8] was refused (largest rise against smallest decay),
    and 1 ms / 5 ms raised a bare TypeError."""
    import saiunit as u

    with brainstate.environ.context(dt=1.0):
        L.DualExpSynapse(2, tau_rise=[1.0, 4.0], tau_decay=[3.0, 8.0])
        with pytest.raises(ConfigError, match=r"DualExpSynapse\(2\): tau_rise .* must be below tau_decay .* for every"):
            L.DualExpSynapse(2, tau_rise=[1.0, 9.0], tau_decay=[3.0, 8.0])
    with brainstate.environ.context(dt=1.0 * u.ms):
        synapse = L.DualExpSynapse(2, tau_rise=1.0 * u.ms, tau_decay=5.0 * u.ms)
        plain = L.DualExpSynapse(2, tau_rise=1.0, tau_decay=5.0)
        with pytest.raises(ConfigError, match=r"must be below tau_decay"):
            L.DualExpSynapse(2, tau_rise=0.01 * u.second, tau_decay=5.0 * u.ms)
    with brainstate.environ.context(dt=1.0 * u.ms):
        brainstate.nn.init_all_states(synapse, batch_size=1)
        out = [np.asarray(synapse(np.ones((1, 2)))) for _ in range(3)]
    with brainstate.environ.context(dt=1.0):
        brainstate.nn.init_all_states(plain, batch_size=1)
        np.testing.assert_allclose(out, [np.asarray(plain(np.ones((1, 2)))) for _ in range(3)], rtol=1e-6)

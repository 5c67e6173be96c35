"""``Sequential`` (etrace_fit/layers/sequential.py): composition, state paths, errors."""

from __future__ import annotations

import re

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.errors import ConfigError, ShapeError

from ._helpers import assert_close, check_grads_equal, make_spike, rand_np, randn, values_of

I, N, O, B, T = 4, 6, 2, 3, 20
TAU = np.array([5.0, 10.0, 20.0, 15.0, 8.0, 30.0])


def _model(learn=True, surrogate="sigmoid"):
    return ef.Sequential(
        L.Linear(I, N, w_init=rand_np(0, I, N, scale=0.8), b_init=rand_np(1, N, scale=0.3)),
        L.ALIF(N, tau=TAU, tau_a=TAU * 4, beta=0.3, learn_tau=learn, learn_tau_a=learn, surrogate=surrogate),
        L.LeakyRateReadout(N, O, tau=np.array([6.0, 12.0]), learn_tau=learn,
                           w_init=rand_np(2, N, O), b_init=rand_np(3, O)),
    )


def test_package_level_alias():
    assert ef.Sequential is L.Sequential


def test_container_protocol(env):
    layers = [L.Linear(I, N, w_init=np.ones((I, N))), jnp.tanh, L.LIF(N)]
    model = ef.Sequential(*layers)
    assert len(model) == 3
    assert list(model) == layers
    assert model[0] is layers[0] and model[2] is layers[2]


def test_forward_is_composition(env64):
    model = _model()
    brainstate.nn.init_all_states(model, batch_size=B)
    lin, alif, readout = model
    x = randn(5, B, I) * 2 + 0.5
    p, q = lin.weight.value, readout.weight.value
    alpha, rho = jnp.exp(-1.0 / jnp.asarray(TAU)), jnp.exp(-1.0 / jnp.asarray(TAU * 4))
    kappa = jnp.exp(-1.0 / jnp.asarray([6.0, 12.0]))
    v, a, r = jnp.zeros((B, N)), jnp.zeros((B, N)), jnp.zeros((B, O))
    for _ in range(3):
        A_prev = 1.0 + 0.3 * a
        z_prev = (v > A_prev).astype(v.dtype)
        a = rho * a + z_prev
        v = alpha * (v - z_prev * A_prev) + x @ p["weight"] + p["bias"]
        z = (v > 1.0 + 0.3 * a).astype(v.dtype)
        r = kappa * r + z @ q["weight"] + q["bias"]
        assert_close(model(x), r)
    assert float(a.sum()) > 0
    assert_close((alif.V.value, alif.a.value, readout.r.value), (v, a, r))


def test_plain_callables_in_the_stack(env64):
    model = ef.Sequential(L.Linear(I, N, w_init=rand_np(0, I, N), b_init=rand_np(1, N)), jnp.tanh,
                          L.Linear(N, O, w_init=rand_np(2, N, O), with_bias=False))
    x = randn(3, B, I)
    p = model[0].weight.value
    assert_close(model(x), jnp.tanh(x @ p["weight"] + p["bias"]) @ model[2].weight.value["weight"])


def test_state_paths(env):
    model = _model()
    brainstate.nn.init_all_states(model, batch_size=B)
    assert sorted(model.states(brainstate.HiddenState)) == [("layers", 1, "V"), ("layers", 1, "a"), ("layers", 2, "r")]
    assert sorted(model.states(brainstate.ParamState)) == [
        ("layers", 0, "weight"), ("layers", 1, "tau"), ("layers", 1, "tau_a"), ("layers", 2, "tau"), ("layers", 2, "weight"),
    ]
    fixed = _model(learn=False)
    assert sorted(fixed.states(brainstate.ParamState)) == [("layers", 0, "weight"), ("layers", 2, "weight")]
    rnn = ef.Sequential(L.Linear(I, N, w_init=np.ones((I, N))), L.LSTMCell(N, 3, w_init=np.zeros((N + 3, 3))))
    brainstate.nn.init_all_states(rnn)
    assert sorted(rnn.states(brainstate.HiddenState)) == [("layers", 1, "c"), ("layers", 1, "h")]
    assert ("layers", 1, "W_f", "weight") in rnn.states(brainstate.ParamState)


@pytest.mark.parametrize("batch", [1, 7, None])
def test_state_shapes_and_reset(env, batch):
    model = _model()
    brainstate.nn.init_all_states(model, batch_size=batch)
    lead = () if batch is None else (batch,)
    shapes = {k: s.value.shape for k, s in model.states(brainstate.HiddenState).items()}
    assert shapes == {("layers", 1, "V"): (*lead, N), ("layers", 1, "a"): (*lead, N), ("layers", 2, "r"): (*lead, O)}
    x = jnp.full((*lead, I), 3.0)
    for _ in range(3):
        assert model(x).shape == (*lead, O)
    assert all(float(jnp.max(jnp.abs(s.value))) > 0 for s in model.states(brainstate.HiddenState).values())
    brainstate.nn.reset_all_states(model, batch_size=batch)
    for key, state in model.states(brainstate.HiddenState).items():
        assert state.value.shape == shapes[key]
        assert float(jnp.max(jnp.abs(state.value))) == 0.0


def test_reset_to_another_batch_size(env):
    model = _model()
    brainstate.nn.init_all_states(model, batch_size=B)
    brainstate.nn.reset_all_states(model, batch_size=7)
    assert model(jnp.ones((7, I))).shape == (7, O)
    assert model[1].a.value.shape == (7, N)


def test_gradients_match_reference(env64):
    model = _model()
    brainstate.nn.init_all_states(model, batch_size=B)
    params = model.states(brainstate.ParamState)
    xs = randn(0, T, B, I) * 2
    spike = make_spike("sigmoid")

    def ref(vals):
        p, q = vals[("layers", 0, "weight")], vals[("layers", 2, "weight")]
        alpha, rho = jnp.exp(-1.0 / vals[("layers", 1, "tau")]), jnp.exp(-1.0 / vals[("layers", 1, "tau_a")])
        kappa = jnp.exp(-1.0 / vals[("layers", 2, "tau")])

        def step(carry, x):
            v, a, r = carry
            A = 1.0 + 0.3 * a
            v_pre = alpha * v + x @ p["weight"] + p["bias"]
            z = spike(v_pre - A)
            v = v_pre - z * A
            a = rho * a + z
            r = kappa * r + z @ q["weight"] + q["bias"]
            return (v, a, r), (r, z)

        zero = jnp.zeros((B, N))
        _, (rs, zs) = jax.lax.scan(step, (zero, zero, jnp.zeros((B, O))), xs)
        return jnp.sum(rs ** 2), zs

    def loss():
        brainstate.nn.reset_all_states(model, batch_size=B)
        ys = brainstate.transform.for_loop(model, xs)
        return jnp.sum(ys ** 2)

    ref_value, zs = ref(values_of(params))
    assert 0.05 < float(zs.mean()) < 0.7
    np.testing.assert_allclose(float(loss()), float(ref_value), rtol=1e-12)
    grads = brainstate.transform.grad(loss, grad_states=params)()
    check_grads_equal(grads, jax.grad(lambda v: ref(v)[0])(values_of(params)))


# --------------------------------------------------------------------------- errors


def _error_model():
    return ef.Sequential(L.Linear(4, 6, w_init=np.ones((4, 6))), L.LIF(6), L.Linear(5, 2, w_init=np.ones((5, 2))))


def test_shape_error_names_the_layer(env):
    model = _error_model()
    brainstate.nn.init_all_states(model, batch_size=B)
    with pytest.raises(ShapeError) as info:
        model(jnp.ones((B, 4)))
    message = str(info.value)
    assert message.startswith("Sequential.layers[2] Linear(5, 2)"), message
    assert f"x.shape=({B}, 6)" in message
    assert message.count("Linear(5, 2)") == 1
    assert isinstance(info.value.__cause__, ShapeError)

    with pytest.raises(ShapeError) as info:
        model(jnp.ones((B, 3)))
    message = str(info.value)
    assert message.startswith("Sequential.layers[0] Linear(4, 6)"), message
    assert f"x.shape=({B}, 3)" in message


def test_shape_error_inside_for_loop(env):
    model = _error_model()
    brainstate.nn.init_all_states(model, batch_size=B)
    with pytest.raises(ShapeError, match=re.escape("Sequential.layers[2] Linear(5, 2)")):
        brainstate.transform.for_loop(model, jnp.ones((5, B, 4)))


def test_named_layer_in_error(env):
    model = ef.Sequential(L.Linear(4, 6, w_init=np.ones((4, 6))), L.LIF(5, name="spk"))
    brainstate.nn.init_all_states(model, batch_size=B)
    with pytest.raises(ShapeError) as info:
        model(jnp.ones((B, 4)))
    assert str(info.value).startswith("Sequential.layers[1] LIF(5) 'spk'")


def test_config_error_is_located(no_dt):
    model = _error_model()
    brainstate.nn.init_all_states(model, batch_size=B)
    with pytest.raises(ConfigError) as info:
        model(jnp.ones((B, 4)))
    message = str(info.value)
    assert message.startswith("Sequential.layers[1] LIF(6)")
    assert "brainstate.environ.set(dt=" in message


def test_nested_sequential_error_is_located_once(env):
    inner = ef.Sequential(L.Linear(6, 3, w_init=np.ones((6, 3))))
    model = ef.Sequential(L.Linear(4, 5, w_init=np.ones((4, 5))), inner)
    with pytest.raises(ShapeError) as info:
        model(jnp.ones((B, 4)))
    message = str(info.value)
    assert message.startswith("Sequential.layers[")
    assert message.count("Sequential.layers[") == 1
    assert "Linear(6, 3)" in message and f"({B}, 5)" in message


def test_other_exceptions_pass_through(env):
    def boom(x):
        raise RuntimeError("boom")

    model = ef.Sequential(L.Linear(4, 5, w_init=np.ones((4, 5))), boom)
    with pytest.raises(RuntimeError, match="^boom$"):
        model(jnp.ones((B, 4)))


def test_non_callable_layer():
    with pytest.raises(ConfigError, match=r"layer 1 .*int"):
        ef.Sequential(jnp.tanh, 3)


@pytest.mark.parametrize("surrogate", [L.Sigmoid, L.Triangle, L.FastSigmoid])
def test_a_surrogate_is_not_taken_for_an_activation(env64, surrogate):
    """``layers.Sigmoid`` is the sigmoid surrogate (a 0/1 forward): as a layer it made
    every output a step function, silently, where the sigmoid activation was meant."""
    with pytest.raises(ConfigError, match=rf"layer 1 is layers.{surrogate.__name__}, a surrogate spike function.*"
                                          r"layers.Activation\('sigmoid'\)"):
        ef.Sequential(L.Linear(4, 5, w_init=np.ones((4, 5))), surrogate())
    model = ef.Sequential(L.Linear(4, 5, w_init=np.ones((4, 5))), L.Activation(surrogate()))  # on purpose: wrapped
    assert set(np.unique(np.asarray(model(jnp.linspace(-1, 1, 8).reshape(2, 4))))) <= {0.0, 1.0}
    assert np.allclose(ef.Sequential(L.Activation("sigmoid"))(jnp.zeros((1, 2))), 0.5)

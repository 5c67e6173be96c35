"""Parameters made by brainstate's own initializers run as one compiled program per
initializer kind, settings and shape (``layers.base.make_param``): the values of
brainstate's ``init.param`` run op by op (to rounding: one program may fuse a multiply
and an add that op by op round apart) and the same random state, with fewer programs."""

from __future__ import annotations

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import saiunit as u

from etrace_fit.layers import base
from etrace_fit.layers.base import make_param

init = brainstate.nn.init

KINDS = {
    "kaiming_normal": lambda: init.KaimingNormal(scale=2.0),
    "kaiming_uniform": lambda: init.KaimingUniform(),
    "xavier_normal": lambda: init.XavierNormal(),
    "lecun_normal": lambda: init.LecunNormal(),
    "orthogonal": lambda: init.Orthogonal(),
    "normal": lambda: init.Normal(0.1, 0.5),
    "uniform": lambda: init.Uniform(-0.3, 0.2),
    "truncated_normal": lambda: init.TruncatedNormal(scale=0.7),
    "constant": lambda: init.Constant(0.25),
    "zeros": lambda: init.ZeroInit(),
}


def _op_by_op(initializer, shape):
    """brainstate's ``init.param`` run eagerly, then what make_param does with it."""
    value = init.param(initializer, shape, allow_none=False)
    return jnp.broadcast_to(jnp.asarray(value), shape).astype(brainstate.environ.dftype())


def _random_key():
    return np.asarray(jax.random.key_data(brainstate.random.DEFAULT.value))


@pytest.mark.parametrize("precision", [32, 64])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_compiled_initializers_give_the_values_and_random_state_of_the_op_by_op_ones(kind, precision):
    with brainstate.environ.context(precision=precision):
        draws = {}
        for path in ("compiled", "op by op"):
            brainstate.random.seed(3)
            initializer = KINDS[kind]()
            make = make_param if path == "compiled" else lambda i, s, *_: _op_by_op(i, s)
            # two shapes, and a second draw of the first: each reads the state the last left
            values = [make(initializer, shape, "w_init", None) for shape in ((7, 5), (4, 9), (7, 5))]
            draws[path] = (values, _random_key())
        (compiled, key_compiled), (reference, key_reference) = draws["compiled"], draws["op by op"]
        eps = float(jnp.finfo(brainstate.environ.dftype()).eps)
        for got, want in zip(compiled, reference):
            assert got.dtype == want.dtype == brainstate.environ.dftype()
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=8 * eps, atol=8 * eps)
        np.testing.assert_array_equal(key_compiled, key_reference)
        if kind not in ("constant", "zeros"):  # random draws: the repeated shape gave new values
            assert not np.array_equal(np.asarray(compiled[0]), np.asarray(compiled[2]))


def test_an_initializer_compiles_once_per_settings_and_shape():
    compiles = []

    def on_event(event, duration, **kwargs):
        if event.endswith("backend_compile_duration"):
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(on_event)
    try:
        _count_compiles(compiles)
    finally:
        jax.monitoring.unregister_event_duration_listener(on_event)


def _count_compiles(compiles):
    shape = (13, 11)  # a shape no other test uses: its programs are new here
    brainstate.random.seed(0)
    make_param(init.KaimingNormal(scale=2.0), shape, "w_init", None)  # warm the RNG's own programs
    compiles.clear()
    make_param(init.KaimingNormal(scale=3.0), shape, "w_init", None)
    first = len(compiles)
    make_param(init.KaimingNormal(scale=3.0), shape, "w_init", None)  # equal settings, a new object
    make_param(init.KaimingNormal(scale=3.0), shape, "w_init", None)
    # op by op the truncated normal alone compiled ~24 programs on a new shape
    assert first == 1 and len(compiles) == 1, compiles
    make_param(init.KaimingNormal(scale=3.0, distribution="uniform"), shape, "w_init", None)
    assert len(compiles) == 2  # other settings: a program of their own


def test_a_users_initializer_runs_op_by_op():
    """A user's initializer may draw from NumPy: compiled, it would draw once and give the
    same values at every call."""

    class NumpyNormal(init.Initializer):
        def __init__(self):
            self.rng = np.random.default_rng(0)

        def __call__(self, shape, **kwargs):
            return jnp.asarray(self.rng.normal(size=shape))

    initializer = NumpyNormal()
    assert base._compiled_initializer(initializer, (3, 4)) is None
    first, second = make_param(initializer, (3, 4), "w_init", None), make_param(initializer, (3, 4), "w_init", None)
    assert not np.array_equal(np.asarray(first), np.asarray(second))
    rng = np.random.default_rng(0)
    np.testing.assert_allclose(np.asarray(first), rng.normal(size=(3, 4)).astype(np.float32))
    # a plain function, and an initializer with an array among its settings: op by op
    assert base._compiled_initializer(lambda shape: jnp.ones(shape), (3, 4)) is None
    constant = init.Constant(jnp.arange(4.0))
    assert base._compiled_initializer(constant, (3, 4)) is None
    np.testing.assert_array_equal(np.asarray(make_param(constant, (3, 4), "w_init", None)),
                                  np.broadcast_to(np.arange(4.0), (3, 4)))


def test_a_compiled_initializer_keeps_its_unit():
    brainstate.random.seed(1)
    value = make_param(init.Normal(0.0, 0.5, unit=u.mV), (3, 2), "w_init", None)
    brainstate.random.seed(1)
    reference = init.param(init.Normal(0.0, 0.5, unit=u.mV), (3, 2), allow_none=False)
    assert isinstance(value, u.Quantity) and value.unit == u.mV
    np.testing.assert_array_equal(np.asarray(value.mantissa), np.asarray(reference.mantissa))


def test_the_demo_models_weights_are_those_of_its_initializers_run_op_by_op():
    from etrace_fit.cli import TASKS

    with brainstate.environ.context(dt=1.0):
        brainstate.random.seed(0)
        model = TASKS["evidence"].make_model()
        brainstate.random.seed(0)
        reference = [_op_by_op(init.KaimingNormal(scale=2.0), (40, 200))]
    weights = jax.tree.leaves(brainstate.graph.treefy_states(model, brainstate.ParamState))
    eps = float(jnp.finfo(jnp.float32).eps)
    assert any(w.shape == (40, 200) and np.allclose(np.asarray(w), np.asarray(reference[0]), rtol=8 * eps, atol=8 * eps)
               for w in weights)


def test_initializers_with_their_own_random_state_draw_from_it():
    """An initializer made with a seed has a random state of its own: two such, equal
    in every setting, must not share a program (it would read the first one's state)."""
    first, second = init.KaimingNormal(seed=5), init.KaimingNormal(seed=5)
    a = make_param(first, (6, 4), "w_init", None)
    b = make_param(second, (6, 4), "w_init", None)
    again = make_param(first, (6, 4), "w_init", None)  # the first one's state moved on
    eps = float(jnp.finfo(jnp.float32).eps)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=8 * eps, atol=8 * eps)
    np.testing.assert_allclose(np.asarray(a), np.asarray(_op_by_op(init.KaimingNormal(seed=5), (6, 4))),
                               rtol=8 * eps, atol=8 * eps)
    assert not np.allclose(np.asarray(a), np.asarray(again))


def test_constant_parameters_and_hidden_states_compile_no_program():
    """Zeros, constants and arrays as parameters, time constants and hidden states are
    made on the host (``base._constant_on_host``): building a model of them, setting and
    resetting its states at two batch sizes compiles nothing, with caches cleared first
    (before 2026-11-27 the demo's model compiled 14 one-op programs there, 30–40 ms
    each), and the values and dtypes are those asked for."""
    from etrace_fit import layers

    compiles = []

    def on_event(event, duration, **kwargs):
        if event.endswith("backend_compile_duration"):
            compiles.append(event)

    jax.clear_caches()
    jax.monitoring.register_event_duration_secs_listener(on_event)
    try:
        with brainstate.environ.context(dt=1.0):
            linear = layers.Linear(7, 19, w_init=init.Constant(0.25), b_init=np.arange(19.0))
            alif = layers.ALIF(19, tau=np.linspace(5.0, 9.0, 19), refractory=2, state_init=init.Constant(-0.5))
            readout = layers.LeakyRateReadout(19, 3, w_init=init.ZeroInit(), b_init=init.Constant(0.1))
            for module in (linear, alif, readout):
                brainstate.nn.init_all_states(module, batch_size=5)
                brainstate.nn.reset_all_states(module, batch_size=6)
    finally:
        jax.monitoring.unregister_event_duration_listener(on_event)
    assert compiles == []
    params = linear.weight.value
    np.testing.assert_array_equal(params["weight"], np.full((7, 19), 0.25, np.float32))
    np.testing.assert_array_equal(params["bias"], np.arange(19.0, dtype=np.float32))
    assert params["weight"].dtype == params["bias"].dtype == jnp.float32
    np.testing.assert_allclose(alif.tau, np.linspace(5.0, 9.0, 19).astype(np.float32))
    np.testing.assert_array_equal(alif.V.value, np.full((6, 19), -0.5, np.float32))
    assert alif.refractory_steps.value.dtype == jnp.int32 and alif.refractory_steps.value.shape == (6, 19)
    np.testing.assert_array_equal(readout.weight.value["bias"], np.full(3, 0.1, np.float32))
    np.testing.assert_array_equal(readout.r.value, np.zeros((6, 3), np.float32))

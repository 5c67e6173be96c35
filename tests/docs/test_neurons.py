"""docs/neurons.md runs as written, and every neuron it shows gets the exact (BPTT)
gradient from D-RTRL and hybrid in ``Linear → neuron → Linear`` (float64), with the loss
at every step and at the last step only; every rule is exact at the first step.

BPTT is ``brainstate.transform.grad`` over ``for_loop`` (tests/algorithms/_helpers.py),
independent of the rules under test.
"""

from __future__ import annotations

import functools
import pathlib
import re
import warnings

import brainstate
import jax.numpy as jnp
import numpy as np
import pytest

import etrace_fit as ef
from etrace_fit import layers as L

from algorithms._helpers import Case, leaves_by_name, lin, mse, reference_bptt, rel_err

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "neurons.md"
I, N, O, B, T = 4, 8, 2, 3, 30


@functools.lru_cache(maxsize=None)
def page_namespace() -> dict:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    assert len(blocks) >= 6
    namespace: dict = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ef.ApproximationWarning)
            exec(compile("\n".join(blocks), str(PAGE), "exec"), namespace)
    finally:
        brainstate.environ.pop("dt")
    return namespace


# name -> (constructor, input scale and shift giving a moderate spike rate)
NEURONS = {
    "snntorch_subtract": (lambda ns: ns["SnnTorchLeaky"](N, reset="subtract"), 0.8, 0.4),
    "snntorch_zero": (lambda ns: ns["SnnTorchLeaky"](N, reset="zero"), 0.8, 0.4),
    "izhikevich": (lambda ns: ns["Izhikevich"](N), 4.0, 60.0),
    "refractory": (lambda ns: ns["RefractoryLIF"](N), 0.8, 0.4),
    "learned": (lambda ns: ns["LearnedLIF"](N), 0.8, 0.4),
    "custom_vjp": (lambda ns: ns["PortedLeaky"](N), 0.8, 0.4),
    "substepped": (lambda ns: ns["SubsteppedLIF"](N), 1.2, 0.6),
    "delayed": (lambda ns: ns["DelayedLIF"](N), 0.8, 0.4),
}


def last_step_loss(out, target):
    y, weight = target
    return weight * mse(out, y)


@functools.lru_cache(maxsize=None)
def case(name: str, loss_on: str, steps: int = T) -> Case:
    make, scale, shift = NEURONS[name]
    namespace = page_namespace()

    def build():
        return ef.Sequential(lin(I, N, 0, 2.0), make(namespace), lin(N, O, 2))

    built = Case(build, (steps, B, I), (steps, B, O), 64, x_scale=scale, x_shift=shift)
    if loss_on == "last":  # targets (ys, weight): the loss of the last step only
        with built.env():
            built.ys = (built.ys, jnp.zeros(steps).at[-1].set(1.0))
            built.step_loss = last_step_loss
            built.ref_grads, built.ref_losses = reference_bptt(built.model, built.xs, built.ys, last_step_loss, B)
    return built


def run(built: Case, algo: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        return built.run(algo)


def spike_fraction(built: Case) -> float:
    return float(built.forward(lambda x: built.model.layers[1](built.model.layers[0](x))).mean())


@pytest.mark.parametrize("name", list(NEURONS))
@pytest.mark.parametrize("loss_on", ["all", "last"])
def test_d_rtrl_and_hybrid_equal_bptt(name, loss_on):
    built = case(name, loss_on)
    assert 0.02 < spike_fraction(built) < 0.6
    ref = leaves_by_name(built.ref_grads)
    assert np.max(np.abs(ref["layers.0.weight['weight']"])) > 0
    for algo in ("d_rtrl", "hybrid"):
        grads, losses = run(built, algo)
        online = leaves_by_name(grads)
        errors = {leaf: rel_err(online[leaf], ref[leaf]) for leaf in ref if np.max(np.abs(ref[leaf])) > 0}
        assert max(errors.values()) < 1e-6, (algo, errors)
        np.testing.assert_allclose(losses, built.ref_losses, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(NEURONS))
@pytest.mark.parametrize("algo", ["d_rtrl", "esd_rtrl", "hybrid"])
def test_every_rule_is_exact_at_the_first_step(name, algo):
    built = case(name, "all", steps=1)
    grads, _ = run(built, algo)
    online, ref = leaves_by_name(grads), leaves_by_name(built.ref_grads)
    for leaf in ref:
        if np.max(np.abs(ref[leaf])) > 0:
            assert rel_err(online[leaf], ref[leaf]) < 1e-9, (leaf, algo)


@pytest.mark.parametrize("name", ["substepped", "custom_vjp"])
def test_control_flow_and_custom_vjp_inside_the_step_are_not_reported_approximate(name):
    """fori_loop, cond (on a layer-wide mean) and checkpoint were read as ops that mix
    units, and a custom_vjp spike as non-elementwise coupling: D-RTRL was exact and
    said it was not (ApproximationWarning, "one-step gradient only")."""
    built = case(name, "all")
    with built.env():
        graph = ef.compile_graph(built.model, built.xs[0])
    found = [d.message for d in graph.diagnostics if d.kind in (ef.compiler.DiagnosticKind.APPROXIMATE,
                                                                ef.compiler.DiagnosticKind.NON_ELEMENTWISE_COUPLING)]
    assert found == []


def test_a_delay_buffer_of_another_shape_is_refused_naming_the_split_into_taps():
    namespace = page_namespace()

    class BufferedLIF(namespace["DelayedLIF"]):
        def __init__(self, n, delay=3):
            L.Neuron.__init__(self, n)
            self.delay, self.beta, self.threshold, self.spike = delay, 0.9, 1.0, L.Sigmoid()
            self.hidden("V", init=0.0)

        def init_state(self, batch_size=None, **kwargs):
            super().init_state(batch_size, **kwargs)
            self.line = brainstate.HiddenState(jnp.zeros((batch_size, N, self.delay)))

        def reset_state(self, batch_size=None, **kwargs):
            super().reset_state(batch_size, **kwargs)
            self.line.value = jnp.zeros((batch_size, N, self.delay))

        def update(self, x):
            arriving = self.line.value[..., -1]
            self.line.value = jnp.concatenate([x[..., None], self.line.value[..., :-1]], axis=-1)
            v = self.beta * self.V.value + arriving
            spike = self.spike(v - self.threshold)
            self.V.value = v - spike * self.threshold
            return spike

    with brainstate.environ.context(dt=1.0):
        model = ef.Sequential(lin(I, N, 0), BufferedLIF(N), lin(N, O, 2))
        brainstate.nn.init_all_states(model, batch_size=B)
        with pytest.raises(ef.CompilationError, match=rf"hidden states .*line \({B}, {N}, 3\).*V \({B}, {N}\) .*"
                                                      r"differ in shape.*as D hidden states of the units' shape, one "
                                                      r"per tap"):
            ef.compile_graph(model, jnp.ones((B, I)))


def test_learned_threshold_and_tau_are_traced_and_get_nonzero_gradients():
    built = case("learned", "all")
    with built.env():
        graph = ef.compile_graph(built.model, built.xs[0])
    traced = {ef.compiler.format_path(r.weight_path) for r in graph.relations}
    assert {"layers.1.tau", "layers.1.threshold"} <= traced
    ref = leaves_by_name(built.ref_grads)
    assert np.max(np.abs(ref["layers.1.threshold"])) > 0 and np.max(np.abs(ref["layers.1.tau"])) > 0


def test_the_refractory_counter_is_int32_and_ends_where_the_forward_pass_ends():
    built = case("refractory", "all")
    with built.env():
        brainstate.nn.reset_all_states(built.model, batch_size=B)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ef.ApproximationWarning)
            ef.sequence_grad(built.model, built.xs, built.ys, mse, algo="d_rtrl")
        online_count = np.asarray(built.model.layers[1].count.value)
        brainstate.nn.reset_all_states(built.model, batch_size=B)
        for x in built.xs:  # an eager step-by-step forward pass
            built.model(x)
        forward_count = np.asarray(built.model.layers[1].count.value)
    assert online_count.dtype == np.int32
    np.testing.assert_array_equal(online_count, forward_count)
    assert forward_count.max() > 0


def test_a_neuron_without_update_is_refused_at_construction():
    with pytest.raises(TypeError, match="NoStep subclasses Neuron but defines no update"):
        type("NoStep", (L.Neuron,), {})(4)


def test_hidden_state_errors_name_the_layer_and_state():
    class Cell(L.Neuron):
        def update(self, x):
            return x

    cell = Cell(4)
    cell.hidden("V")
    with pytest.raises(ef.ConfigError, match="'V' is already"):
        cell.hidden("V")
    with pytest.raises(ef.ShapeError, match=r"Cell\(4\): init of hidden state 'W' must broadcast to \(4,\), got shape \(3,\)"):
        cell.hidden("W", init=np.zeros(3))
    with pytest.raises(ef.ConfigError, match="size must be a positive int"):
        Cell(0)


def test_the_pages_constrained_gain_is_clipped_after_every_update():
    """The page's ``Gain`` holds its weight as ``layers.Constrained``: an update of -100
    leaves it at the clip's floor, 0; the learned LIF's τ at 0.1·dt."""
    import jax
    import optax

    ns = page_namespace()
    down = optax.GradientTransformation(lambda p: optax.EmptyState(), lambda g, s, p=None: (
        jax.tree.map(lambda v: jnp.full_like(v, -100.0), g), s))
    rng = np.random.default_rng(0)
    x, y = (rng.random((4, 6, I)) < 0.4).astype(np.float32), rng.integers(0, 2, 4)
    with brainstate.environ.context(dt=1.0):
        model = ef.Sequential(L.Linear(I, N), ns["Gain"](N), ns["LearnedLIF"](N), L.LeakyRateReadout(N, O))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ef.ApproximationWarning)
            ef.Trainer(model, algo="d_rtrl", optimizer=down, loss_on="last").fit(x, y, batch_size=4, epochs=1,
                                                                                 verbose=0)
    np.testing.assert_array_equal(np.asarray(model.layers[1].gain.value), np.zeros(N))
    np.testing.assert_allclose(np.asarray(model.layers[2].tau.value), 0.1, rtol=1e-6)

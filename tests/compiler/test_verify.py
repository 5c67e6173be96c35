"""The compiler's numerical check (``compiler/verify.py``): it finds nothing where the
passes are right, and finds each kind of miss when the passes' records are hidden from
it or the passes are made to miss."""

from __future__ import annotations

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.compiler import graph as graph_module
from etrace_fit.compiler.verify import NUMERICAL_CHECK, claimed_exact, numerical_check, wants_check
from etrace_fit.errors import ApproximationWarning

from .test_fidelity import BUILDERS, B, I, N, PlainToo


def compiled(name, verify=False):
    model = BUILDERS[name]()
    brainstate.nn.init_all_states(model, batch_size=B)
    return ef.compile_graph(model, jnp.ones((B, I)), verify=verify)


def check(graph, records=None):
    records = graph.diagnostics if records is None else records
    found = numerical_check(graph.module, graph.hidden_groups, graph.relations, records, [jnp.ones((B, I))])
    return {ef.compiler.format_path(d.weight_path): d.message for d in found}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_nothing_is_found_where_the_passes_are_right(env64, name):
    assert check(compiled(name)) == {}


@pytest.mark.parametrize("name", ["lif", "alif_readout", "two_lif"])
def test_nothing_is_found_in_float32_either(name):
    with brainstate.environ.context(dt=1.0):
        assert check(compiled(name)) == {}


def test_a_later_layers_memory_the_passes_did_not_name_is_found(env64):
    found = check(compiled("two_lif"), records=())
    assert set(found) == {"layers.0.weight"}
    assert "moves layers.3.V within one step" in found["layers.0.weight"]


def test_a_stateful_readouts_memory_is_found_and_allowed_when_named(env64):
    graph = compiled("alif_readout")
    assert "moves layers.2.r within one step" in check(graph, records=())["layers.0.weight"]
    assert claimed_exact(graph.relations, graph.diagnostics)[("layers", 0, "weight")] == {1}
    assert check(graph) == {}


def test_dense_recurrence_is_found_in_the_jacobian(env64):
    found = check(compiled("gru"), records=())
    assert "is not the per-unit D the traces use" in found["layers.0.W_z.weight"]


def test_a_plain_use_of_the_weight_is_found_in_its_one_step_effect(env64):
    found = check(compiled("plain_too"), records=())
    assert "is not its op's output times the per-unit transition" in found["layers.0.w"]


class Lateral(brainstate.nn.Module):
    """A membrane that leaks into its neighbour (``jnp.roll``): units mix in the step."""

    def __init__(self):
        super().__init__()
        self.w = brainstate.ParamState(jnp.asarray(np.random.default_rng(0).standard_normal((I, N))))

    def init_state(self, batch_size=None, **kwargs):
        self.v = brainstate.HiddenState(jnp.zeros((batch_size, N)))

    def update(self, x):
        v = self.v.value
        self.v.value = 0.8 * v + 0.1 * jnp.roll(v, 1, axis=-1) + ef.ops.matmul(x, self.w.value)
        return jnp.tanh(self.v.value)


def test_units_that_mix_within_the_step_are_found(env64):
    model = Lateral()
    brainstate.nn.init_all_states(model, batch_size=B)
    graph = ef.compile_graph(model, jnp.ones((B, I)), verify=False)
    assert check(graph) == {}  # the passes name it (non-elementwise group)
    assert "its units drive each other within the step" in check(graph, records=())["w"]


def test_a_miss_of_the_passes_becomes_an_approximation_the_user_is_warned_of(env64, monkeypatch):
    """The passes made to find nothing (``approximations`` returns no record): the check's
    record takes its place, and the rules report the weight approximate."""
    monkeypatch.setattr(graph_module, "approximations", lambda *args: ())
    graph = compiled("two_lif", verify=True)
    records = [d for d in graph.diagnostics if dict(d.context).get("reason") == NUMERICAL_CHECK]
    assert [ef.compiler.format_path(d.weight_path) for d in records] == ["layers.0.weight"]
    assert "please report this model" in str(records[0])
    model = BUILDERS["two_lif"]()
    brainstate.nn.init_all_states(model, batch_size=B)
    with pytest.warns(ApproximationWarning, match="numerical check of one step"):
        learner = ef.compile(model, jnp.ones((B, I)), algo="d_rtrl", verify=True)
    assert "layers.0.weight" in learner.plan.approximations()


def test_it_runs_by_default_on_a_model_with_a_class_from_outside_the_library(monkeypatch):
    monkeypatch.delenv("ETRACE_FIT_VERIFY", raising=False)
    with brainstate.environ.context(dt=1.0):
        library_only = L.Sequential(L.Linear(I, N), L.LIF(N))
        custom = L.Sequential(PlainToo(), L.Linear(N, 2))
    assert not wants_check(library_only, None) and wants_check(custom, None)
    assert wants_check(library_only, True) and not wants_check(custom, False)
    monkeypatch.setenv("ETRACE_FIT_VERIFY", "1")
    assert wants_check(library_only, None)
    monkeypatch.setenv("ETRACE_FIT_VERIFY", "0")
    assert not wants_check(custom, None)


def test_it_stands_aside_where_the_values_are_traced(env64):
    """Compiled inside a user's jit (the functional API), states and inputs are tracers:
    there is no point to evaluate at, and the check crashed on them."""
    graph = compiled("two_lif")
    out = jax.jit(lambda x: (numerical_check(graph.module, graph.hidden_groups, graph.relations, (), [x]), x)[1])
    np.testing.assert_array_equal(out(jnp.ones((B, I))), jnp.ones((B, I)))


def test_rounding_around_a_zero_effect_is_no_miss():
    """Two routes to an effect of zero may differ by rounding, which relative to zero is
    all of it: an absolute floor per entry keeps that from reading as a miss."""
    from etrace_fit.compiler.verify import _miss, _share, _tolerance

    tolerance = _tolerance(jnp.float32)
    zeros, rounding = np.zeros(64), np.full(64, 1e-9)
    assert _miss(zeros, rounding, tolerance) == 0.0 and _share(rounding, 0.0, tolerance) == 0.0
    assert _miss(zeros, np.full(64, 0.1), tolerance) == 1.0 and _share(np.full(64, 0.1), 0.0, tolerance) == 1.0
    assert _miss(np.ones(64), np.ones(64) * 1.0001, tolerance) == 0.0


def test_a_check_that_cannot_run_warns_and_the_compile_goes_on(env64, monkeypatch):
    """The check is an addition: an error inside it must not stop a compile that works."""
    def broken(*args):
        raise ValueError("no point to stand on")

    monkeypatch.setattr(graph_module, "numerical_check", broken)
    with pytest.warns(RuntimeWarning, match=r"numerical check could not run on this model \(ValueError: no point to "
                                            r"stand on\).*verify=False"):
        graph = compiled("lif", verify=True)
    assert graph.relations

"""SparseLinear (etrace_fit/layers/linear.py) and D-RTRL's trace at a sparse weight's
nonzeros (etrace_fit/algorithms/d_rtrl.py): gradients against BPTT through the loop
(float64), the trace's size, and the layer's errors."""

from __future__ import annotations

from _per_step import PerStep
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.algorithms import d_rtrl
from etrace_fit.algorithms.online import build_online

from ._helpers import sequence_grads

I, H, O, B, T = 12, 9, 2, 3, 70  # T = 70: two chunks of 32 and a shorter one
PATH = ("layers", 0, "weight")


def build(neuron: str, density: float = 0.2):
    sparse = L.SparseLinear(I, H, density=density, seed=1, b_init=brainstate.nn.init.Constant(0.2))
    cell = (L.LIF(H, tau=5.0, v_threshold=0.5, surrogate="sigmoid") if neuron == "lif" else
            L.ALIF(H, tau=5.0, tau_a=20.0, beta=0.3, v_threshold=0.5, surrogate="sigmoid"))
    model = ef.Sequential(sparse, cell, L.Linear(H, O))
    brainstate.nn.init_all_states(model, batch_size=B)
    return model


def data(seed: int = 0):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.random((T, B, I)) < 0.4, jnp.float64), jnp.asarray(rng.normal(size=(T, B, O)))


def rel_err(got, ref) -> float:
    return float(np.max(np.abs(np.asarray(got) - np.asarray(ref))) / np.max(np.abs(np.asarray(ref))))


@pytest.mark.parametrize("neuron", ["lif", "alif"])
def test_d_rtrl_on_a_sparse_weight_equals_bptt_with_its_trace_at_the_nonzeros(neuron):
    with brainstate.environ.context(precision=64, dt=1.0):
        model = build(neuron)
        xs, ys = data()
        layer = model.layers[0]
        nnz = int(layer.mask.sum())
        _, plan = ef.algorithms.plan_for(model, xs, ys, lambda o, y: jnp.sum((o - y) ** 2), algo="d_rtrl")
        pair = plan.pairs[0]
        k, o = pair.sparse_entries
        assert len(k) == nnz + H  # the mask's entries and the bias row
        S = 1 if neuron == "lif" else 2
        assert plan.trace_bytes(1)[0] == (nnz + H) * S * 8  # not (I + 1)·H·S
        assert plan.rules[0].init_traces(pair, B, jnp.float64).shape == (B, 1, S, nnz + H)
        ref = sequence_grads(model, xs, ys, "reference")[PATH]
        got = sequence_grads(model, xs, ys, "d_rtrl")[PATH]
    mask = layer.mask.astype(bool)
    assert np.all(np.asarray(ref["weight"])[~mask] == 0) and np.all(np.asarray(got["weight"])[~mask] == 0)
    assert float(np.abs(ref["weight"]).max()) > 1e-3
    for key in ("weight", "bias"):
        assert rel_err(got[key], ref[key]) < 1e-9, key


@pytest.mark.parametrize("advance", ["in_the_step_loop", "per_chunk"])
def test_the_sparse_trace_stays_exact_with_the_loss_at_the_last_step(advance, monkeypatch):
    """``active="last"``: chunks without loss only advance the trace, in the step loop
    (a small trace) or once per chunk."""
    if advance == "per_chunk":
        monkeypatch.setattr(d_rtrl, "STEPWISE_NUMBERS", 0)
    with brainstate.environ.context(precision=64, dt=1.0):
        model = build("alif")
        xs, ys = data(1)
        flags = jnp.zeros((T, B)).at[-1].set(1.0)

        def weighted(out, target):
            y, w = target
            return jnp.sum(w[:, None] * (out - y) ** 2)

        targets = (ys, flags)
        params = model.states(brainstate.ParamState)

        def total():
            brainstate.nn.reset_all_states(model, batch_size=B)
            outs = brainstate.transform.for_loop(model, xs)
            return jax.vmap(weighted)(outs, targets).sum()

        ref = brainstate.transform.grad(total, grad_states=params)()[PATH]
        brainstate.nn.reset_all_states(model, batch_size=B)
        graph, plan = ef.algorithms.plan_for(model, xs, targets, weighted, algo="d_rtrl")
        program = build_online(graph, plan.pairs, plan.rules, weighted, trace_dtype=plan.trace_dtype, chunk=16)
        weights = [leaf for s in graph.module.weights for leaf in jax.tree.leaves(s.state.value)]
        grads, _, _ = jax.jit(lambda w, s, x, t: program.run(w, s, x, t, active="last"))(
            weights, graph.module.state_leaves(), [xs], targets)
    leaves = iter(grads)
    by_path = {s.path: jax.tree.map(lambda _: next(leaves), s.state.value) for s in graph.module.weights}
    got = by_path[PATH]
    for key in ("weight", "bias"):
        assert rel_err(got[key], ref[key]) < 1e-9, key


def test_es_d_rtrl_and_the_hybrid_train_a_sparse_weight_and_leave_the_absent_connections_alone():
    with brainstate.environ.context(precision=64, dt=1.0):
        model = build("lif")
        xs, ys = data(2)
        ref = np.asarray(sequence_grads(model, xs, ys, "reference")[PATH]["weight"])
        es = np.asarray(sequence_grads(model, xs, ys, "esd_rtrl")[PATH]["weight"])
        _, plan = ef.algorithms.plan_for(model, xs, ys, lambda o, y: jnp.sum((o - y) ** 2))
        assert plan.rule_of("layers.0.weight") == ("d_rtrl",)  # its small trace fits the default budget
        hybrid = np.asarray(sequence_grads(model, xs, ys, "hybrid")[PATH]["weight"])
    mask = model.layers[0].mask.astype(bool)
    assert np.all(es[~mask] == 0) and np.all(hybrid[~mask] == 0)
    assert np.dot(es.ravel(), ref.ravel()) / np.linalg.norm(es) / np.linalg.norm(ref) > 0.9
    assert rel_err(hybrid, ref) < 1e-9


def test_a_dense_enough_mask_keeps_the_dense_trace():
    with brainstate.environ.context(precision=64, dt=1.0):
        model = build("lif", density=0.8)
        xs, ys = data()
        _, plan = ef.algorithms.plan_for(model, xs, ys, lambda o, y: jnp.sum((o - y) ** 2), algo="d_rtrl")
    assert plan.pairs[0].pattern is not None and plan.pairs[0].sparse_entries is None
    assert plan.trace_bytes(1)[0] == (I + 1) * H * 8


def test_the_random_pattern_its_initial_scale_and_a_given_mask():
    with brainstate.environ.context(dt=1.0):
        brainstate.random.seed(0)
        layer = L.SparseLinear(400, 300, density=0.1, seed=3)
        assert layer.mask.shape == (400, 300) and layer.mask.sum() == 12_000 and layer.density == 0.1
        assert np.array_equal(layer.mask, L.SparseLinear(400, 300, density=0.1, seed=3).mask)
        assert not np.array_equal(layer.mask, L.SparseLinear(400, 300, density=0.1, seed=4).mask)
        effective = np.asarray(layer.weight_fn(layer.weight.value["weight"]))
        assert np.all(effective[layer.mask == 0] == 0)
        # Kaiming over the connections present: each output's input variance stays ~1/in·density·…
        np.testing.assert_allclose(effective[layer.mask == 1].std(), (1 / (0.1 * 400)) ** 0.5, rtol=0.1)
        y = layer(jnp.ones((2, 400)))
        np.testing.assert_allclose(np.asarray(y), np.ones((2, 400)) @ effective, rtol=1e-5, atol=1e-5)
        mask = np.eye(4, 3)
        given = L.SparseLinear(4, 3, mask=mask, with_bias=False)
        assert np.array_equal(given.mask, mask) and "density=0.25" in repr(given)


@pytest.mark.parametrize("kwargs, error, fragment", [
    (dict(), ef.ConfigError, r"SparseLinear\(4, 3\): give density or mask \(one of them\)"),
    (dict(density=0.5, mask=np.ones((4, 3))), ef.ConfigError, "give density or mask"),
    (dict(density=0.0), ef.ConfigError, r"density must be in \(0, 1\], got 0.0"),
    (dict(density=1.5), ef.ConfigError, "density must be in"),
    (dict(mask=np.ones((3, 4))), ef.ShapeError, r"mask must have shape \(4, 3\), got \(3, 4\)"),
    (dict(mask=np.full((4, 3), 0.5)), ef.ConfigError, "mask must hold 0 and 1 only"),
    (dict(mask=np.zeros((4, 3))), ef.ConfigError, "mask has no connection"),
])
def test_bad_arguments_name_the_layer(kwargs, error, fragment):
    with pytest.raises(error, match=fragment):
        L.SparseLinear(4, 3, **kwargs)


def test_a_sparse_weights_program_holds_less_memory_than_a_dense_ones():
    """XLA's temp and the trace of D-RTRL's program on a 10 % SparseLinear against the
    same Linear without a mask (the chunk's in-chunk sum gathered for the whole chunk at
    once took more temp than the dense program)."""
    from etrace_fit.algorithms.sequence import _prepare

    sizes = {}
    with brainstate.environ.context(dt=1.0):
        for name, first in (("sparse", L.SparseLinear(300, 300, density=0.1)), ("dense", L.Linear(300, 300))):
            model = ef.Sequential(first, L.LIF(300, tau=5.0), L.Linear(300, 2))
            brainstate.nn.init_all_states(model, batch_size=8)
            xs, ys = jnp.zeros((64, 8, 300)), jnp.zeros((64, 8, 2))
            graph, plan, _, program = _prepare(model, xs, ys, lambda o, y: jnp.sum((o - y) ** 2), "d_rtrl",
                                               None, None, None)
            weights = [leaf for s in graph.module.weights for leaf in jax.tree.leaves(s.state.value)]
            compiled = jax.jit(lambda w, s, x, y: program.run(w, s, x, y)).lower(
                weights, graph.module.state_leaves(), [xs], ys).compile()
            sizes[name] = (plan.trace_bytes(8)[0], compiled.memory_analysis().temp_size_in_bytes)
    (sparse_trace, sparse_temp), (dense_trace, dense_temp) = sizes["sparse"], sizes["dense"]
    assert sparse_trace < 0.15 * dense_trace
    # The chunk's other buffers (inputs, signals) are the same for both: the sparse
    # program saves at least what its trace saves.
    assert dense_temp - sparse_temp >= dense_trace - sparse_trace, sizes


def test_the_per_step_sparse_recursion_equals_bptt_too():
    """``DRTRL.step`` on the sparse layout (the engine scans it for a rule without a
    chunk) gives BPTT's gradient, as the chunk does."""
    with brainstate.environ.context(precision=64, dt=1.0):
        model = build("alif")
        xs, ys = data(3)
        ref = sequence_grads(model, xs, ys, "reference")[PATH]
        loss = lambda out, y: jnp.sum((out - y) ** 2)  # noqa: E731
        brainstate.nn.reset_all_states(model, batch_size=B)
        graph, plan = ef.algorithms.plan_for(model, xs, ys, loss, algo="d_rtrl")
        program = build_online(graph, plan.pairs, tuple(PerStep(r) for r in plan.rules), loss,
                               trace_dtype=plan.trace_dtype)
        weights = [leaf for s in graph.module.weights for leaf in jax.tree.leaves(s.state.value)]
        init = program.init_traces(B)
        assert init.traces[0].shape == (B, 1, 2, int(model.layers[0].mask.sum()) + H)
        grads, _, _ = jax.jit(program.run)(weights, graph.module.state_leaves(), [xs], ys)
    leaves = iter(grads)
    got = {s.path: jax.tree.map(lambda _: next(leaves), s.state.value) for s in graph.module.weights}[PATH]
    for key in ("weight", "bias"):
        assert rel_err(got[key], ref[key]) < 1e-9, key

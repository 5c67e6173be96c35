"""The readout memory (docs/theory.md §5.10): a leaky readout ``r^t = κ r^{t−1} + u^t W + b``
keeps the spikes of earlier steps, so the weights of the layer it reads move later
losses through ``r^{t−1}``. The plan gives those pairs one more trace state, ``ē``, and
D-RTRL becomes exact for every elementwise layer read by a leaky readout — checked
against BPTT (``brainstate.transform.grad`` over ``for_loop``) in float64, with the loss
at every step, at the last step only and under a mask, across chunk boundaries, for the
library's neurons and for neurons written the snnTorch / Norse way (spike from the
pre-reset membrane, reset from the previous spike, two states).
"""

from __future__ import annotations

import warnings

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.algorithms.base import PairSignals, joined_states, split_states, traced_pairs
from etrace_fit.algorithms.d_rtrl import DRTRL
from etrace_fit.algorithms.online import build_online

from ._helpers import (Case, assert_grads_match, assert_losses_match, leaves_by_name, lin, mse, rand,
                       reference_bptt, rel_err)
from .test_user_neurons import NorseLIF, PrevSpikeLIF, SnnTorchLeaky

T, B, I, N, O = 45, 3, 5, 7, 3  # T = 45: a chunk of 32 and one of 13
TAU_OUT = 5.0


def _readout(seed=2):
    return L.LeakyRateReadout(N, O, tau=TAU_OUT, w_init=rand(seed, N, O), b_init=rand(seed + 1, O, scale=0.1))


NEURONS = {
    "lif": lambda: L.LIF(N, tau=10.0, surrogate="sigmoid"),
    "alif": lambda: L.ALIF(N, tau=10.0, tau_a=30.0, beta=0.5, surrogate="sigmoid"),
    "snntorch": lambda: SnnTorchLeaky(N, beta=0.9),
    "prev_spike": lambda: PrevSpikeLIF(N, beta=0.9),
    "norse": lambda: NorseLIF(N),
}


def _model(neuron):
    return lambda: ef.Sequential(lin(I, N, 0, 2.0), NEURONS[neuron](), _readout())


def _weighted(out, target):
    y, w = target
    return w * mse(out, y)


def _random_signals(rng, C, P, S, K):
    """Canonical signals of a chunk for an ``S``-state pair whose last state is a
    readout memory (``D[..., s, S-1] = 0`` for ``s < S-1``)."""
    D = rng.normal(size=(C, B, P, N, S, S)) * 0.5
    D[..., :S - 1, S - 1] = 0.0
    return PairSignals(*(jnp.asarray(a) for a in (rng.normal(size=(C, B, P, K)), D, rng.normal(size=(C, B, P, N, S)),
                                                   rng.normal(size=(C, B, P, N, S)), rng.normal(size=(C, B, P, N)))))


PLACEMENTS = {"every": np.ones(T, bool), "last": np.arange(T) == T - 1,
              "mask": np.isin(np.arange(T), [0, 5, 31, 32, 44])}


@pytest.fixture(scope="module", params=list(NEURONS))
def case(request):
    return Case(_model(request.param), (T, B, I), (T, B, O), 64, x_scale=1.0, x_shift=0.5)


def _reference(case, flags):
    with case.env():
        targets = (case.ys, jnp.asarray(flags, case.ys.dtype))
        return reference_bptt(case.model, case.xs, targets, _weighted, B)


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_d_rtrl_is_exact_through_a_leaky_readout(case, placement):
    """Every weight, the hidden layer's included, gets BPTT's gradient (to 1e-9)."""
    flags = PLACEMENTS[placement]
    ref_grads, ref_losses = _reference(case, flags)
    with case.env(), warnings.catch_warnings():
        warnings.simplefilter("error", ef.ApproximationWarning)  # the plan says exact: no warning either
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        grads, losses = ef.sequence_grad(case.model, case.xs, (case.ys, jnp.asarray(flags, case.ys.dtype)),
                                         _weighted, algo="d_rtrl")
    assert_losses_match(np.asarray(losses), ref_losses, 1e-12)
    errors = assert_grads_match(jax.tree.map(np.asarray, grads), ref_grads, 1e-9)
    assert len(errors) == len(leaves_by_name(ref_grads)) == 4
    # the spikes are not degenerate: the hidden layer's weight has a real gradient
    hidden = leaves_by_name(ref_grads)["layers.0.weight['weight']"]
    assert float(np.abs(hidden).max()) > 1e-3


@pytest.mark.parametrize("advance", ["in_the_step_loop", "per_chunk"])
def test_the_last_step_program_skips_and_stays_exact(advance, monkeypatch):
    """``active="last"`` (the Trainer's ``loss_on="last"``: chunks without loss only
    advance the traces, the extra state included) equals BPTT, chunk 7 over T = 45;
    with these small traces advanced in the step loop (``DRTRL.for_pair``) and, as a
    large trace is, once per chunk."""
    if advance == "per_chunk":
        from etrace_fit.algorithms import d_rtrl
        monkeypatch.setattr(d_rtrl, "STEPWISE_NUMBERS", 0)
    case = Case(_model("alif"), (T, B, I), (T, B, O), 64)
    flags = PLACEMENTS["last"]
    ref_grads, _ = _reference(case, flags)
    with case.env():
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        targets = (case.ys, jnp.asarray(flags, case.ys.dtype))
        graph, plan = ef.algorithms.plan_for(case.model, case.xs, targets, _weighted, algo="d_rtrl")
        assert [p.readout_memory for p in plan.pairs] == [True, False]
        program = build_online(graph, plan.pairs, plan.rules, _weighted, trace_dtype=plan.trace_dtype, chunk=7)
        weights = [leaf for s in graph.module.weights for leaf in jax.tree.leaves(s.state.value)]
        grads, _, _ = jax.jit(lambda w, s, x, t: program.run(w, s, x, t, active="last"))(
            weights, graph.module.state_leaves(), [case.xs], targets)
    ref_leaves = [np.asarray(leaf) for s in graph.module.weights for leaf in jax.tree.leaves(ref_grads[s.path])]
    for g, r in zip(grads, ref_leaves):
        assert rel_err(np.asarray(g), r) < 1e-9


def test_report_and_plan_name_the_readout_memory():
    case = Case(_model("lif"), (T, B, I), (T, B, O), 64)
    with case.env():
        learner = ef.compile(case.model, case.xs[0], mse, algo="hybrid")
    report = learner.report()
    assert "readout memory: (layers.1.V) → (layers.2.r) (κ = 0.8187)" in report
    assert "every weight gets its exact (BPTT) gradient" in report
    assert "also shapes the memory" not in report  # the compiler's warning is resolved, not repeated
    assert learner.plan.approximations() == {}
    # the trace costs one more state per unit: (K + bias) · N · 2 numbers per sample
    assert learner.plan.trace_bytes(1)[0] == (I + 1) * N * 2 * jnp.dtype(learner.plan.trace_dtype).itemsize


def _per_unit_readout(kind):
    """A readout whose units decay at different rates: τ learned (from one value: it will
    not stay one) or fixed per unit."""
    if kind == "learned":
        return L.LeakyRateReadout(N, O, tau=TAU_OUT, w_init=rand(2, N, O), b_init=rand(3, O, scale=0.1),
                                  learn_tau=True)
    return L.LeakyRateReadout(N, O, tau=np.array([2.0, 5.0, 12.0]), w_init=rand(2, N, O),
                              b_init=rand(3, O, scale=0.1))


@pytest.mark.parametrize("kind", ["learned", "per_unit"])
@pytest.mark.parametrize("placement", ["every", "last"])
def test_a_readout_whose_units_decay_apart_gets_a_memory_state_per_readout_unit(kind, placement):
    """A learned or per-unit readout τ: ``κ`` differs per readout unit, so one ``ē`` per
    unit read cannot follow the memory; one memory state per readout unit does
    (``ē_o^t = κ_o ē_o^{t−1} + du^t/dθ``, met by ``κ_o W[:, o] ∂L/∂y_o``). Every weight,
    the learned τ's included, gets BPTT's gradient (before: the hidden weight
    approximate, warned)."""
    case = Case(lambda: ef.Sequential(lin(I, N, 0, 2.0), L.LIF(N, tau=10.0, surrogate="sigmoid"),
                                      _per_unit_readout(kind)), (T, B, I), (T, B, O), 64, x_scale=1.0, x_shift=0.5)
    plan, _ = _exact_with_memory(case, placement)
    assert plan.readout.units == O and [p.readout_memory for p in plan.pairs] == [O, 0, 0][:len(plan.pairs)]
    assert plan.pairs[0].num_states == 1 + O
    with case.env():
        report = ef.compile(case.model, case.xs[0], mse, algo="d_rtrl").report()
    assert f"{O} more trace states per unit follow the readout's memory, one for each readout unit" in report
    assert "every weight gets its exact (BPTT) gradient" in report


def test_a_readout_of_many_units_decaying_apart_is_not_followed():
    """Over ``MAX_MEMORY_UNITS`` readout units the trace would grow by as many states:
    not followed, the compiler's reason stays (approximate, warned)."""
    from etrace_fit.algorithms.readout import MAX_MEMORY_UNITS

    many = MAX_MEMORY_UNITS + 1
    build = lambda: ef.Sequential(lin(I, N, 0, 2.0), L.LIF(N, tau=10.0, surrogate="sigmoid"),  # noqa: E731
                                  L.LeakyRateReadout(N, many, tau=TAU_OUT, w_init=rand(2, N, many), learn_tau=True))
    case = Case(build, (T, B, I), (T, B, many), 64)
    with case.env():
        learner = ef.compile(case.model, case.xs[0], mse, algo="d_rtrl")
    assert learner.plan.readout is None
    assert "also shapes the memory of (layers.2.r)" in learner.plan.approximations()["layers.0.weight"][0]


def test_a_spiking_readout_is_not_affine_and_keeps_the_approximation():
    """``LeakySpikeReadout`` resets its membrane after a spike: its step is not
    ``κ r + u W``, so no readout memory (an ``ē`` would follow the wrong decay) and the
    compiler's reason stays in the plan."""
    build = lambda: ef.Sequential(lin(I, N, 0, 2.0), L.LIF(N, tau=10.0, surrogate="sigmoid"),
                                  L.LeakySpikeReadout(N, O, tau=TAU_OUT, w_init=rand(2, N, O), surrogate="sigmoid"))
    case = Case(build, (T, B, I), (T, B, O), 64)
    with case.env():
        learner = ef.compile(case.model, case.xs[0], mse, algo="d_rtrl")
        graph = learner.graph
        readout_group = graph.hidden_groups[-1]
        assert not ef.algorithms.readout.is_affine(graph, readout_group)
        assert ef.algorithms.readout.is_affine(graph, graph.hidden_groups[0]) is False  # LIF resets too
    assert learner.plan.readout is None and not any(p.readout_memory for p in learner.plan.pairs)
    assert "also shapes the memory of (layers.2.V)" in learner.plan.approximations()["layers.0.weight"][0]


def test_a_stateless_readout_or_a_deeper_layer_gets_no_extra_state():
    """``Linear`` readouts have no memory to follow; a first layer that reaches the
    readout through a second dense layer keeps its reason (a later layer's memory)."""
    stateless = Case(lambda: ef.Sequential(lin(I, N, 0, 2.0), L.LIF(N, tau=10.0), lin(N, O, 2)),
                     (4, B, I), (4, B, O), 64)
    with stateless.env():
        plan = ef.compile(stateless.model, stateless.xs[0], mse, algo="d_rtrl").plan
    assert plan.readout is None and not any(p.readout_memory for p in plan.pairs)
    deep = Case(lambda: ef.Sequential(lin(I, N, 0, 2.0), L.LIF(N, tau=10.0), lin(N, N, 3), L.LIF(N, tau=10.0),
                                      _readout()), (4, B, I), (4, B, O), 64)
    with deep.env():
        plan = ef.compile(deep.model, deep.xs[0], mse, algo="d_rtrl").plan
    assert [p.readout_memory for p in plan.pairs] == [False, True, False]
    assert "layers.0.weight" in plan.approximations() and "layers.2.weight" not in plan.approximations()


def test_a_recurrent_layer_read_by_a_leaky_readout_takes_the_same_path():
    """A recurrent layer whose recurrent block is zero is elementwise in fact: with the
    extra state D-RTRL is exact for its ``[x, z]`` weight (the recurrent rows
    included), without it is not. With a non-zero recurrent block the
    rule stays approximate (the dense recurrence), and the extra state neither helps nor
    hurts reliably: cosine to BPTT 0.93 with it, 0.93 without, mean of 13 seeds."""
    w = np.vstack([rand(4, I, N, scale=2.0), np.zeros((N, N))])
    case = Case(lambda: ef.Sequential(L.RecurrentLIF(I, N, w_init=w, surrogate="sigmoid"), _readout()),
                (T, B, I), (T, B, O), 64, x_scale=1.0, x_shift=0.5)
    with case.env():
        graph, plan = ef.algorithms.plan_for(case.model, case.xs, case.ys, mse, algo="d_rtrl")
        assert plan.readout is not None and [p.readout_memory for p in plan.pairs] == [True, False]
        weights = [leaf for s in graph.module.weights for leaf in jax.tree.leaves(s.state.value)]
        names = list(leaves_by_name({s.path: s.state.value for s in graph.module.weights}))
        errors = []
        for pairs in (plan.pairs, traced_pairs(graph)):
            program = build_online(graph, pairs, plan.rules, mse, trace_dtype=plan.trace_dtype)
            grads = program.run(weights, graph.module.state_leaves(), [case.xs], case.ys)[0]
            ref = leaves_by_name(case.ref_grads)
            errors.append({name: rel_err(g, ref[name]) for name, g in zip(names, grads)})
    with_memory, without = errors
    assert max(with_memory.values()) < 1e-9, with_memory
    assert without["layers.0.W.weight['weight']"] > 0.1, without


def test_d_rtrl_skips_the_readout_memorys_zero_column_without_changing_a_number():
    """The ``ē`` state is reached by no other state (``D[..., s, S-1] = 0`` for s < S-1),
    so ``DRTRL.for_pair`` leaves those products out of its chunk; the chunk's gradient
    and trace equal the dense rule's on the same signals (float64), with and without
    learning signal, also in the sharded form."""
    case = Case(_model("alif"), (T, B, I), (T, B, O), 64)
    with case.env():
        graph, plan = ef.algorithms.plan_for(case.model, case.xs, case.ys, mse, algo="d_rtrl")
        memory_pair, readout_pair = plan.pairs
        assert DRTRL().for_pair(readout_pair).zeros == frozenset()
        structured = DRTRL().for_pair(memory_pair)
        assert structured.zeros == {(0, 2), (1, 2)}  # ALIF's V and a do not read ē
        rng = np.random.default_rng(0)
        C, S, K = 6, memory_pair.num_states, memory_pair.patch
        signals = _random_signals(rng, C, 1, S, K)
        traces = jnp.asarray(rng.normal(size=(B, 1, S, K, N)))
        for dense, sparse in ((DRTRL(), structured), (DRTRL(sharded=True), structured.for_sharding())):
            for a, b in zip(dense.chunk(traces, signals, 0), sparse.chunk(traces, signals, 0)):
                np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-12, atol=1e-12)
            quiet = signals._replace(G=None, dY=None)
            np.testing.assert_allclose(np.asarray(sparse.advance(traces, quiet, 0)),
                                       np.asarray(dense.advance(traces, quiet, 0)), rtol=1e-12, atol=1e-12)


def test_d_rtrl_reads_canonical_split_and_stacked_signals_alike():
    """``DRTRL.chunk`` takes the chunk's signals canonical, split per state
    (``split_states``, what the step program makes) or in its own ``stack_form`` (what
    the engine stacks): the same gradient and trace (float64); ``joined_states`` undoes
    ``split_states``."""
    with brainstate.environ.context(precision=64):
        rng = np.random.default_rng(3)
        C, S, K = 5, 3, 4
        rule = DRTRL(zeros=frozenset({(0, 2), (1, 2)}))
        canonical = _random_signals(rng, C, 2, S, K)
        _check_the_forms_alike(rule, canonical, rng)


def _check_the_forms_alike(rule, canonical, rng):
    C, S, K = canonical.X.shape[0], canonical.Df.shape[-1], canonical.X.shape[-1]
    split = split_states(canonical)
    assert isinstance(split.D, tuple) and split.D[1][2].shape == (C, B, 2, N)
    for name, field in zip(PairSignals._fields, joined_states(split)):
        original = getattr(canonical, name)
        assert (field is None) == (original is None), name
        if field is not None:
            np.testing.assert_array_equal(np.asarray(field), np.asarray(original), err_msg=name)
    stacked = rule.stack_form(canonical)
    assert stacked.D[0][2] is None and stacked.Df[0].shape == (C, B * 2, N)  # structural zeros are skipped
    traces = jnp.asarray(rng.normal(size=(B, 2, S, K, N)))
    reference = rule.chunk(traces, canonical, 0)
    for form in (split, stacked):
        for got, want in zip(rule.chunk(traces, form, 0), reference):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-12)
    # and against per-step D-RTRL, which reads the canonical form
    total, trace = None, traces
    for c in range(C):
        grad, trace = rule.step(trace, PairSignals(*(None if a is None else a[c] for a in canonical)), c)
        total = grad if total is None else total + grad
    np.testing.assert_allclose(np.asarray(reference[0]), np.asarray(total), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(np.asarray(reference[1]), np.asarray(trace), rtol=1e-10, atol=1e-10)


def test_the_online_program_writes_no_state_block_per_step():
    """The step program keeps ``D``, ``Df`` and ``G`` split per state all the way to
    D-RTRL's chunk: the compiled program of an ALIF net with a leaky readout (``S = 3``)
    holds no array with a trailing ``3×3`` or ``3`` state block (before, such blocks were
    written at every step, and read back through strided slices and shifted copies:
    2× the program's time at the demo's size)."""
    import re

    from etrace_fit.algorithms.sequence import _prepare

    case = Case(_model("alif"), (T, B, I), (T, B, O), 32)
    with case.env():
        xs, ys = jnp.asarray(case.xs, jnp.float32), jnp.asarray(case.ys, jnp.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph, plan, _, program = _prepare(case.model, xs, ys, mse, "d_rtrl", None, None, None)
        assert plan.pairs[0].num_states == 3
        module = graph.module
        weights = [leaf for s in module.weights for leaf in jax.tree.leaves(s.state.value)]
        hlo = jax.jit(lambda w, s, x, y: program.run(w, s, x, y)).lower(
            weights, module.state_leaves(), [xs], ys).compile().as_text()
    blocks = re.findall(rf"f32\[[0-9,]*,{N},3(?:,3)?\]", hlo)
    assert not blocks, f"state blocks in the compiled program: {sorted(set(blocks))}"


def test_the_readout_decay_is_read_in_one_compiled_program_also_under_jit():
    """Finding the readout memory evaluates the readout's Jacobian once, compiled (op by
    op it compiled ~100 tiny programs: 1.3 s of the demo's start), and finds the same
    memory when the plan is made inside a caller's ``jax.jit``."""
    import logging

    from etrace_fit.algorithms.readout import readout_memory

    case = Case(_model("alif"), (T, B, I), (T, B, O), 32)
    with case.env():
        graph = ef.compile_graph(case.model, jnp.asarray(case.xs[0], jnp.float32))
        compiles = []
        handler = logging.Handler()
        handler.emit = lambda record: compiles.append(record.getMessage())
        logger = logging.getLogger("jax")
        logger.addHandler(handler)
        try:
            with jax.log_compiles(True):
                found = readout_memory(graph)
        finally:
            logger.removeHandler(handler)
        assert found is not None
        assert len([m for m in compiles if m.startswith("Finished XLA compilation")]) <= 2, compiles
        under_jit = {}

        @jax.jit
        def planned(x):
            under_jit["memory"] = readout_memory(graph)
            return x

        planned(1.0)
        assert under_jit["memory"] == found


def test_a_small_d_rtrl_trace_advances_in_the_step_loop_and_a_large_one_per_chunk():
    """``DRTRL.for_pair`` gives a trace of at most ``STEPWISE_NUMBERS`` numbers per
    sample (the readout's) an ``advance_step`` the engine runs inside its step loop on
    steps without loss; a larger one (the memory pair's, when made large) has none.
    ``advance_step`` equals a chunk of one step (float64); the last-step programs that
    use it equal BPTT (``test_the_last_step_program_skips_and_stays_exact``)."""
    from etrace_fit.algorithms import d_rtrl

    case = Case(_model("alif"), (T, B, I), (T, B, O), 64)
    with case.env():
        _, plan = ef.algorithms.plan_for(case.model, case.xs, case.ys, mse, algo="d_rtrl")
        memory_pair, readout_pair = plan.pairs
        small, large = d_rtrl.DRTRL().for_pair(readout_pair), d_rtrl.DRTRL().for_pair(memory_pair)
        assert small.advance_step is not None and small.for_sharding().advance_step is not None
        numbers = memory_pair.patch * memory_pair.outputs * memory_pair.num_states
        assert numbers <= d_rtrl.STEPWISE_NUMBERS and large.advance_step is not None
        original = d_rtrl.STEPWISE_NUMBERS
        d_rtrl.STEPWISE_NUMBERS = numbers - 1
        try:
            assert d_rtrl.DRTRL().for_pair(memory_pair).advance_step is None
        finally:
            d_rtrl.STEPWISE_NUMBERS = original
        rng = np.random.default_rng(4)
        S, K = memory_pair.num_states, memory_pair.patch
        D = rng.normal(size=(B, 1, N, S, S))
        D[..., :S - 1, S - 1] = 0.0
        step = PairSignals(*(jnp.asarray(a) for a in (rng.normal(size=(B, 1, K)), D,
                                                       rng.normal(size=(B, 1, N, S)))), None)
        traces = jnp.asarray(rng.normal(size=(B, 1, S, K, N)))
        stacked = jax.tree.map(lambda a: a[None], step)
        np.testing.assert_allclose(np.asarray(large.advance_step(traces, large.stack_form(step))),
                                   np.asarray(large.advance(traces, stacked, 0)), rtol=1e-12, atol=1e-12)


def test_the_readout_memory_under_weight_updates_is_warned_as_approximate():
    """With update_every or stateful=True the readout weight changes inside the memory
    the traces follow through the current weight: a user's full-RTRL reference measured
    0.5-30 % off, unwarned. A stateless readout stays exact: no warning."""
    import optax

    rng = np.random.default_rng(0)
    x, y = rng.random((4, 8, 3)).astype(np.float32) < 0.5, rng.integers(0, 2, 4)
    match = r"the online gradients of layers\.0\.weight are approximate with {}: their traces follow the leaky readout"
    with brainstate.environ.context(dt=1.0):
        for options, why in [({"update_every": 2}, "update_every=2"),
                             ({"stateful": True}, r"stateful=True \(the traces carry across batches\)")]:
            model = ef.Sequential(L.Linear(3, 6), L.LIF(6), L.LeakyRateReadout(6, 2))
            trainer = ef.Trainer(model, algo="d_rtrl", optimizer=optax.sgd(0.1), **options)
            with pytest.warns(ef.ApproximationWarning, match=match.format(why)):
                trainer.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False)
        model = ef.Sequential(L.Linear(3, 6), L.LIF(6), L.Linear(6, 2))
        with warnings.catch_warnings():
            warnings.simplefilter("error", ef.ApproximationWarning)
            ef.Trainer(model, algo="d_rtrl", optimizer=optax.sgd(0.1), update_every=2, stateful=True).fit(
                x, y, batch_size=4, epochs=1, verbose=0, shuffle=False)
        model = ef.Sequential(L.Linear(3, 6), L.LIF(6), L.LeakyRateReadout(6, 2))
        brainstate.nn.init_all_states(model, batch_size=4)
        xs = np.swapaxes(x, 0, 1).astype(np.float32)
        ys = np.zeros((8, 4, 2), np.float32)
        with pytest.warns(ef.ApproximationWarning, match=match.format("update_every=3")):
            ef.online_fit(model, xs, ys, lambda o, t: jnp.sum((o - t) ** 2), optax.sgd(0.1), update_every=3,
                          algo="d_rtrl")


# A Flatten before the leaky readout (every convolutional net's): a reshape that keeps the
# batch axis lays the units out anew in their row-major order, so the readout still reads
# each unit on its own, and D-RTRL stays exact. LC positions, C channels.
LC, C = 6, 3


def _flat_readout(units, seed=30):
    return L.LeakyRateReadout(units, O, tau=TAU_OUT, w_init=rand(seed, units, O, scale=0.7),
                              b_init=rand(seed + 1, O, scale=0.1))


def _conv1d_flat():
    conv = L.Conv1d(I, C, 3, padding="SAME", w_init=rand(20, 3, I, C, scale=0.6), b_init=rand(21, C, scale=0.3))
    return ef.Sequential(conv, L.LIF((LC, C), tau=10.0, surrogate="sigmoid"), L.Flatten(), _flat_readout(LC * C))


def _conv2d_flat():
    conv = L.Conv2d(2, C, 3, w_init=rand(22, 3, 3, 2, C, scale=0.5), b_init=rand(23, C, scale=0.3))
    return ef.Sequential(conv, L.ALIF((4, 4, C), tau=10.0, tau_a=30.0, beta=0.5, surrogate="sigmoid"), L.Flatten(),
                         _flat_readout(16 * C))


def _per_position_flat():
    """A dense map per position (``Conv1d(kernel_size=1)``), the last two axes flattened."""
    conv = L.Conv1d(I, C, 1, w_init=rand(24, 1, I, C, scale=0.8), b_init=rand(25, C, scale=0.3))
    return ef.Sequential(conv, L.LIF((LC, C), tau=10.0, surrogate="sigmoid"), L.Flatten(num_feature_axes=2),
                         _flat_readout(LC * C))


FLAT = {"conv1d_lif": (_conv1d_flat, (T, B, LC, I)), "conv2d_alif": (_conv2d_flat, (T, B, 4, 4, 2)),
        "per_position_lif": (_per_position_flat, (T, B, LC, I))}


@pytest.fixture(scope="module", params=list(FLAT))
def flat_case(request):
    build, x_shape = FLAT[request.param]
    return Case(build, x_shape, (T, B, O), 64, x_scale=1.0, x_shift=0.5)


@pytest.mark.parametrize("placement", ["every", "last"])
def test_d_rtrl_is_exact_through_a_flatten_before_the_leaky_readout(flat_case, placement):
    """Conv → LIF/ALIF → Flatten → LeakyRateReadout: the conv weight's gradient follows
    the readout's memory of every position's spikes (before: 0.77–0.85 relative error on
    the conv1d net, an ApproximationWarning), BPTT's to 1e-9 in float64, with no warning;
    the plan carries the memory on the neuron's pair."""
    plan, ref_grads = _exact_with_memory(flat_case, placement)
    assert [p.readout_memory for p in plan.pairs] == [True, False]
    first = leaves_by_name(ref_grads)
    assert max(float(np.abs(v).max()) for k, v in first.items() if k.startswith("layers.0.")) > 1e-3


def _exact_with_memory(case, placement):
    """D-RTRL on ``case`` with the loss placed as ``placement``: no ApproximationWarning,
    a readout memory in the plan, the losses and every gradient BPTT's (1e-12, 1e-9 in
    float64). Returns ``(plan, reference gradients)``."""
    flags = PLACEMENTS[placement]
    ref_grads, ref_losses = _reference(case, flags)
    targets = (case.ys, jnp.asarray(flags, case.ys.dtype))
    with case.env(), warnings.catch_warnings():
        warnings.simplefilter("error", ef.ApproximationWarning)
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        _, plan = ef.algorithms.plan_for(case.model, case.xs, targets, _weighted, algo="d_rtrl")
        assert plan.readout is not None
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        grads, losses = ef.sequence_grad(case.model, case.xs, targets, _weighted, algo="d_rtrl")
    assert_losses_match(np.asarray(losses), ref_losses, 1e-12)
    assert_grads_match(jax.tree.map(np.asarray, grads), ref_grads, 1e-9)
    return plan, ref_grads


class _ChannelsFirst(brainstate.nn.Module):
    """``(B, L, C) → (B, C, L)``: a channels-first flatten follows (a PyTorch habit)."""

    def update(self, x):
        return jnp.swapaxes(x, 1, 2)


def _conv_then(make_rest, units):
    """A builder (layers made in the test's precision) of Conv1d → LIF → rest → Flatten → readout."""
    return lambda: ef.Sequential(
        L.Conv1d(I, C, 3, padding="SAME", w_init=rand(20, 3, I, C, scale=0.6), b_init=rand(21, C, scale=0.3)),
        L.LIF((LC, C), tau=10.0, surrogate="sigmoid"), make_rest(), L.Flatten(), _flat_readout(units))


# u = M v: a fixed linear map between the neurons' spikes and the readout (readout.linear_tail)
TAILS = {"transpose": _conv_then(_ChannelsFirst, units=LC * C),
         "avg_pool": _conv_then(lambda: L.AvgPool1d(2), units=LC // 2 * C),
         "avg_pool_same": _conv_then(lambda: L.AvgPool1d(4, stride=2, padding="SAME"), units=LC // 2 * C),
         "global_avg_pool": _conv_then(lambda: L.AdaptiveAvgPool1d(1), units=C)}


@pytest.mark.parametrize("tail", list(TAILS))
def test_d_rtrl_is_exact_through_a_fixed_linear_map_before_the_readout(tail):
    """A transpose, an average pooling (VALID or SAME, whose count differs at the
    edges) or a global average between the spikes and the readout is a fixed linear map
    ``u = M v``: the memory is kept per spiking unit and met by ``Mᵀ ∂L/∂u``, and the
    conv weight gets BPTT's gradient (1e-9, float64) with no warning."""
    case = Case(TAILS[tail], (T, B, LC, I), (T, B, O), 64, x_scale=1.0, x_shift=0.5)
    with case.env(), warnings.catch_warnings():
        warnings.simplefilter("error", ef.ApproximationWarning)
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        graph, plan = ef.algorithms.plan_for(case.model, case.xs, case.ys, mse, algo="d_rtrl")
        assert [p.readout_memory for p in plan.pairs] == [True, False]
        _, tail_eqns = ef.algorithms.readout.linear_tail(
            graph, ef.algorithms.readout.readout_input(graph, plan.readout.readout))
        assert tail_eqns  # the map is there, not folded away
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        grads, _ = ef.sequence_grad(case.model, case.xs, case.ys, mse, algo="d_rtrl")
    assert_grads_match(jax.tree.map(np.asarray, grads), case.ref_grads, 1e-9)


@pytest.mark.parametrize("pool", [L.MaxPool1d, L.AdaptiveAvgPool1d], ids=["max_pool", "adaptive_bins"])
def test_a_readout_that_reads_units_through_a_nonlinear_or_branching_map_keeps_the_warning(pool):
    """A max pooling picks units by their values (no fixed ``M``); adaptive bins stack
    several slices (a map of more than one path, not followed). No readout memory there;
    the conv weight keeps the compiler's reason and its warning (its gradient is
    approximate, and BPTT's differs), the readout's own weight stays exact."""
    case = Case(_conv_then(lambda: pool(2), units=LC // 2 * C if pool is L.MaxPool1d else 2 * C),
                (T, B, LC, I), (T, B, O), 64, x_scale=1.0, x_shift=0.5)
    with case.env():
        with pytest.warns(ef.ApproximationWarning, match=r"layers\.0\.weight also shapes the memory"):
            learner = ef.compile(case.model, case.xs[0], mse, algo="d_rtrl")
        assert learner.plan.readout is None and not any(p.readout_memory for p in learner.plan.pairs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ef.ApproximationWarning)
            brainstate.nn.reset_all_states(case.model, batch_size=B)
            grads, _ = ef.sequence_grad(case.model, case.xs, case.ys, mse, algo="d_rtrl")
    errors = {k: rel_err(np.asarray(v), leaves_by_name(case.ref_grads)[k])
              for k, v in leaves_by_name(jax.tree.map(np.asarray, grads)).items()}
    assert errors["layers.0.weight['weight']"] > 1e-3, errors  # approximate, as warned
    readout = [k for k in errors if k.startswith("layers.4.")]
    assert readout and max(errors[k] for k in readout) < 1e-9, errors  # the readout's own weight stays exact


def test_a_dropout_after_the_flatten_keeps_the_memory_exact():
    """``Conv → LIF → Flatten → Dropout → LeakyRateReadout``: the mask is data of its
    step (it varies, so it is no fixed map), and the units reach the readout in their
    row-major order through the flatten and the mask: the memory is followed (D-RTRL
    equals BPTT on the same masks, ``gradient_fidelity`` in float64)."""
    with brainstate.environ.context(precision=64, dt=1.0):
        brainstate.random.seed(0)
        model = _conv_then(lambda: L.Dropout(0.3), units=LC * C)()
        model.layers.insert(3, model.layers.pop(2))  # the dropout after the flatten
        brainstate.nn.init_all_states(model, batch_size=B)
        xs = jnp.asarray(rand(10, T, B, LC, I) + 0.5)
        ys = jnp.asarray(rand(11, T, B, O))
        with warnings.catch_warnings():
            warnings.simplefilter("error", ef.ApproximationWarning)
            plan = ef.compile(model, xs[0], mse, algo="d_rtrl").plan
            fidelity = ef.gradient_fidelity(model, xs, ys, mse, algo="d_rtrl")
    assert plan.readout is not None and [p.readout_memory for p in plan.pairs] == [True, False]
    assert type(model.layers[3]).__name__ == "Dropout"
    for path, f in fidelity.items():
        assert f.cosine == pytest.approx(1.0, abs=1e-9) and f.norm_ratio == pytest.approx(1.0, rel=1e-9), path


class _Integrate(L.Neuron):
    """A readout that only sums its input (``κ = 1``: a spike count kept as a state), as
    a user writes one."""

    def __init__(self, n):
        super().__init__(n)
        self.hidden("r", init=0.0)

    def update(self, x):
        self.r.value = self.r.value + x
        return self.r.value


@pytest.mark.parametrize("placement", ["every", "last"])
def test_a_readout_that_only_sums_is_followed_too(placement):
    """``Linear → LIF → Linear → Integrate``: the sum is a memory with ``κ = 1`` (before,
    only ``κ < 1`` was followed and the first weight was 0.95 off, warned)."""
    case = Case(lambda: ef.Sequential(lin(I, N, 0, 2.0), L.LIF(N, tau=10.0, surrogate="sigmoid"), lin(N, O, 2),
                                      _Integrate(O)), (T, B, I), (T, B, O), 64, x_scale=1.0, x_shift=0.5)
    plan, _ = _exact_with_memory(case, placement)
    assert plan.readout.kappa == pytest.approx(1.0)


def test_a_learned_readout_tau_after_a_pooling_is_followed_too():
    """Both at once: one memory state per readout unit, each met through ``Mᵀ`` of the
    average pooling and flatten before the readout (one batched pull-back per step)."""
    build = lambda: ef.Sequential(  # noqa: E731
        L.Conv1d(I, C, 3, padding="SAME", w_init=rand(20, 3, I, C, scale=0.6), b_init=rand(21, C, scale=0.3)),
        L.LIF((LC, C), tau=10.0, surrogate="sigmoid"), L.AvgPool1d(2), L.Flatten(),
        L.LeakyRateReadout(LC // 2 * C, O, tau=TAU_OUT, w_init=rand(30, LC // 2 * C, O, scale=0.7), learn_tau=True))
    case = Case(build, (T, B, LC, I), (T, B, O), 64, x_scale=1.0, x_shift=0.5)
    plan, _ = _exact_with_memory(case, "every")
    assert plan.readout.units == O and plan.pairs[0].readout_memory == O

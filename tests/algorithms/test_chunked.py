"""Chunked rules (docs/theory.md §5.9) equal the same rules applied step by step, in float64.

The engine runs each rule once per chunk of ``C`` steps (``rule.chunk``). The reference
here is the rule's own per-step recursion (``rule.step``, scanned by the engine when a
rule has no ``chunk``), which the other tests compare with BPTT; chunk sizes that do
not divide the sequence length exercise the carried traces and the last, shorter chunk.
D-RTRL is also compared with the independent BPTT reference at a small chunk size.
"""

from __future__ import annotations

import pathlib
import re
import sys
import warnings

from _per_step import PerStep
import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.algorithms.online import build_online, chunk_size, DEFAULT_CHUNK, signal_bytes
from etrace_fit.algorithms.d_rtrl import DRTRL
from etrace_fit.algorithms.base import PairSignals

from ._helpers import (B, I, N, O, T, Case, MODELS, assert_grads_match, get_case, grads_by_path, lin, mse, program_grads,
                       rand, reference_bptt, to_host)
from .test_user_neurons import NEURONS


def _user_case(name, steps=T):
    make, scale, shift = NEURONS[name]
    return Case(lambda: ef.Sequential(lin(I, N, 0, 2.0), make(), lin(N, O, 2)), (steps, B, I), (steps, B, O), 64,
                x_scale=scale, x_shift=shift)


CASES = {
    **{name: (lambda name=name: Case(MODELS[name][0], MODELS[name][1], (T, B, O), 64))
       for name in ("lif", "alif", "leaky_tanh", "lif_learn_tau", "conv1d_lif", "conv2d_lif", "shared_weight")},
    # Four gate weights on one [x, h] (two states): ES-D-RTRL runs them as one pair
    # (online.shared_groups), the per-step reference one by one.
    "lstm": lambda: Case(lambda: ef.Sequential(L.LSTMCell(I, N), lin(N, O, 2)), (T, B, I), (T, B, O), 64),
    "snntorch_zero": lambda: _user_case("snntorch_zero"),  # a hard reset: D = 0 at every spike
    "refractory_lif": lambda: _user_case("refractory_lif"),
}


@pytest.fixture(scope="module")
def cases():
    return {}


def _case(cases, name):
    if name not in cases:
        cases[name] = CASES[name]()
    return cases[name]


@pytest.mark.parametrize("algo", ["d_rtrl", "esd_rtrl"])
@pytest.mark.parametrize("name", list(CASES))
def test_chunked_equals_per_step(cases, name, algo):
    """Chunks of 7 over T = 30 (four full chunks and a chunk of 2) and one chunk of
    all 30 steps give the per-step rule's gradients to float64 rounding."""
    case = _case(cases, name)
    reference, ref_losses = program_grads(case, algo, chunk=1, per_step=True)
    for chunk in (7, T):
        grads, losses = program_grads(case, algo, chunk=chunk)
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-12)
        for n, (g, r) in enumerate(zip(grads, reference)):
            scale = max(float(np.max(np.abs(r))), 1e-300)
            assert float(np.max(np.abs(g - r))) / scale < 1e-10, (name, algo, chunk, n)


def test_es_pairs_on_one_input_run_as_one_and_stay_exact(cases, monkeypatch):
    """An LSTM's four gate weights read the same ``[x, h]``: under ES-D-RTRL the step loop
    runs them as one pair (one ``ε_x``, their ``ε_f`` side by side, one GEMM per chunk;
    ``online.shared_groups``), with the loss at every step and at the last step only
    (the in-loop advance), and gives the per-step rule's gradients pair by pair, float64.
    D-RTRL's pairs, and ES pairs on different inputs (the GRU's ``W_z`` and ``W_h``), do
    not join."""
    from etrace_fit.algorithms.online import shared_groups

    case = _case(cases, "lstm")
    with case.env(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        graph, plan = ef.algorithms.plan_for(case.model, case.xs, case.ys, case.step_loss, algo="esd_rtrl")
        _, d_plan = ef.algorithms.plan_for(case.model, case.xs, case.ys, case.step_loss, algo="d_rtrl")
        gru = Case(lambda: ef.Sequential(L.GRUCell(I, N), lin(N, O, 2)), (T, B, I), (T, B, O), 64)
        with gru.env():
            gru_graph, gru_plan = ef.algorithms.plan_for(gru.model, gru.xs, gru.ys, gru.step_loss, algo="esd_rtrl")
    eqns = graph.module.jaxpr.eqns
    assert len(plan.pairs) == 4 and shared_groups(plan.pairs, plan.rules, eqns) == [[0, 1, 2, 3]]
    assert shared_groups(d_plan.pairs, d_plan.rules, eqns) == []
    assert len(gru_plan.pairs) == 2 and shared_groups(gru_plan.pairs, gru_plan.rules, gru_graph.module.jaxpr.eqns) == []
    # The chunk's budget counts the group's one row of ε_x (13 numbers) and its four
    # signal rows (4 × 8): 45 numbers a step and sample, where the pairs apart stack 84.
    pairs, rules = list(plan.pairs), plan.rules
    assert sum(r.row_bytes(p, 1, 8) for p, r in zip(pairs, rules)) == 84 * 8
    assert rules[0].joined([p.outputs for p in pairs]).row_bytes(pairs, 1, 8) == 45 * 8
    assert 100 * 400 * 45 * 8 <= 16 * 2**20 < 100 * 400 * 84 * 8
    assert chunk_size(pairs, rules, 400, 8, 4100) == 50
    assert chunk_size(pairs, rules, 400, 8, 4100, shared=[[0, 1, 2, 3]]) == 100
    module = graph.module
    weights = [leaf for s in module.weights for leaf in jax.tree.leaves(s.state.value)]
    flags = (np.arange(T) == T - 1).astype(np.float64)
    targets = (case.ys, jnp.asarray(flags))
    for active, ys, loss in ((None, case.ys, case.step_loss), ("last", targets, _weighted)):
        got = []
        for rules, chunk in ((tuple(PerStep(r) for r in plan.rules), 1), (plan.rules, 7)):
            with case.env():
                brainstate.nn.reset_all_states(case.model, batch_size=case.batch)
                program = build_online(graph, plan.pairs, rules, loss, trace_dtype=plan.trace_dtype, chunk=chunk)
                got.append(jax.jit(lambda w, s, x, y: program.run(w, s, x, y, active=active))(
                    weights, module.state_leaves(), [case.xs], ys)[0])
        for n, (g, r) in enumerate(zip(*got)):
            scale = float(np.max(np.abs(r)))
            assert scale > 1e-6 and float(np.max(np.abs(np.asarray(g) - np.asarray(r)))) / scale < 1e-10, (active, n)
    from etrace_fit.algorithms import online

    seen = []
    monkeypatch.setattr(online, "chunk_size", lambda *a, **k: seen.append(k.get("shared")) or chunk_size(*a, **k))
    program.chunk_for(T)
    assert seen == [[[0, 1, 2, 3]]]  # the program budgets the group as one


class TwoWeightsOneGroup(brainstate.nn.Module):
    """An ALIF layer driven by a dense weight and a sparse one (a fixed mask; D-RTRL keeps
    its trace at the present entries): two relations of one hidden group, the second
    through a ``tanh`` so that the two differ in ``Df`` and ``dY``."""

    def __init__(self):
        super().__init__()
        self.dense = lin(I, N, 0, 2.0)
        mask = np.asarray(rand(51, I, N) > 0.5, np.float64)  # ~30 % of the entries: a sparse trace
        self.sparse = L.Linear(I, N, w_init=rand(3, I, N, scale=1.5), with_bias=False, mask=mask)
        self.alif = L.ALIF(N, tau=10.0, tau_a=30.0, beta=0.5, surrogate="sigmoid")
        self.out = lin(N, O, 2)

    def update(self, x):
        return self.out(self.alif(self.dense(x) + 2.0 * jnp.tanh(self.sparse(x))))  # Df, dY per weight


def _reverse_scans(jaxpr) -> int:
    """``lax.scan``s run in reverse in ``jaxpr`` and every jaxpr inside it."""
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name == "scan" and eqn.params["reverse"]
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                if hasattr(sub, "jaxpr") and hasattr(sub.jaxpr, "eqns"):
                    count += _reverse_scans(sub.jaxpr)
                elif hasattr(sub, "eqns"):
                    count += _reverse_scans(sub)
    return count


@pytest.mark.parametrize("loss_on", ["all", "last"])
def test_pairs_of_one_group_chunk_as_one_and_stay_exact(loss_on, monkeypatch):
    """A hidden group's pairs read the same ``D`` and ``G``: D-RTRL runs their chunks as
    one backward pass (``online.chunk_groups``, ``DRTRL.chunk_group``), each pair's
    reach and signal made in it, and the gradients are BPTT's (ALIF is exact under
    D-RTRL), float64, with a dense and a sparse weight on the group, the loss at every
    step or only at the last (the chunks before it advance the traces only: no
    learning signal), chunks of 7 over 30 steps. The program has one backward pass per
    chunk where the pairs apart have two; the LSTM's four gates join, the GRU's two
    D-RTRL weights join, and ES-D-RTRL (no chunk) and the hybrid's mixed rules do not.
    Groups no larger than the passes XLA runs side by side (the host's cores) stay
    apart: with two, the GRU's pair does and the LSTM's four gates still join."""
    from etrace_fit.algorithms import d_rtrl, online

    monkeypatch.setattr(d_rtrl, "STEPWISE_NUMBERS", 0)  # every trace through the chunk
    monkeypatch.setattr(online, "passes_side_by_side", lambda: 1)  # two pairs join (on 2 cores they would not)
    chunk_groups = online.chunk_groups
    flags = (np.arange(T) == T - 1) if loss_on == "last" else np.ones(T, bool)
    case = Case(TwoWeightsOneGroup, (T, B, I), (T, B, O), 64)
    with case.env(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        targets = (case.ys, jnp.asarray(flags, case.ys.dtype))
        reference = reference_bptt(case.model, case.xs, targets, _weighted, B)[0]
        graph, plan = ef.algorithms.plan_for(case.model, case.xs, targets, _weighted, algo="d_rtrl")
        assert len(plan.pairs) == 2 and plan.pairs[1].sparse_entries is not None
        assert chunk_groups(plan.pairs, plan.rules) == [[0, 1]]
        module = graph.module
        weights = [leaf for s in module.weights for leaf in jax.tree.leaves(s.state.value)]
        args = (weights, module.state_leaves(), [case.xs], targets)
        active = "last" if loss_on == "last" else None
        scans = []
        for join in (True, False):
            if not join:
                monkeypatch.setattr(online, "chunk_groups", lambda *a: [])
            brainstate.nn.reset_all_states(case.model, batch_size=B)
            program = build_online(graph, plan.pairs, plan.rules, _weighted, trace_dtype=plan.trace_dtype, chunk=7)
            run = lambda w, s, x, y: program.run(w, s, x, y, active=active)  # noqa: E731
            scans.append(_reverse_scans(jax.make_jaxpr(run)(*args).jaxpr))
            grads = grads_by_path(module, [np.asarray(g) for g in jax.jit(run)(*args)[0]])
            assert_grads_match(grads, reference, 1e-9)
    assert scans[0] > 0 and 2 * scans[0] == scans[1], scans
    plan_d = {}
    for cell, groups in ((L.LSTMCell, [[0, 1, 2, 3]]), (L.GRUCell, [[0, 1]])):
        rnn = Case(lambda cell=cell: ef.Sequential(cell(I, N), lin(N, O, 2)), (T, B, I), (T, B, O), 64)
        with rnn.env(), warnings.catch_warnings():
            warnings.simplefilter("ignore", ef.ApproximationWarning)
            found = {}
            for algo in ("d_rtrl", "esd_rtrl", "hybrid"):
                _, plan = ef.algorithms.plan_for(rnn.model, rnn.xs, rnn.ys, rnn.step_loss, algo=algo,
                                                 **({"memory_budget": 1000} if algo == "hybrid" else {}))
                found[algo] = (chunk_groups(plan.pairs, plan.rules), {r.name for r in plan.rules})
                if algo == "d_rtrl":
                    plan_d[cell] = plan
        assert found["d_rtrl"][0] == groups and found["esd_rtrl"][0] == []
        # Pairs that XLA can run side by side (as many as the host's cores) stay apart.
        assert chunk_groups(plan_d[cell].pairs, plan_d[cell].rules, side_by_side=2) == ([[0, 1, 2, 3]]
                                                                                    if cell is L.LSTMCell else [])
        if cell is L.GRUCell:  # a budget that fits one weight's trace: one D-RTRL, one ES pair
            assert found["hybrid"] == ([], {"d_rtrl", "esd_rtrl"}), found["hybrid"]


@pytest.mark.parametrize("name", ["lif", "alif", "snntorch_zero"])
def test_chunked_d_rtrl_equals_bptt(cases, name):
    """Exact models: D-RTRL over chunks of 4 (and a last chunk of 2) is BPTT's gradient."""
    case = _case(cases, name)
    grads, losses = program_grads(case, "d_rtrl", chunk=4)
    with case.env():
        graph, _ = ef.algorithms.plan_for(case.model, case.xs, case.ys, case.step_loss, algo="d_rtrl")
    assert_grads_match(grads_by_path(graph.module, grads), case.ref_grads, 1e-8)
    np.testing.assert_allclose(losses, case.ref_losses, rtol=1e-10)


def test_chunk_size_is_automatic_and_bounded():
    """The default chunk is DEFAULT_CHUNK steps, never longer than the sequence, and
    shorter when the chunk's stacked signals would be large; a requested size wins."""
    case = Case(MODELS["lif"][0], MODELS["lif"][1], (T, B, O), 64)
    with case.env(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        _, plan = ef.algorithms.plan_for(case.model, case.xs, case.ys, case.step_loss, algo="d_rtrl")
    pairs, rules = plan.pairs, plan.rules
    assert DEFAULT_CHUNK == 100
    # A prime length has no divisor: the size down to half the cap with the shortest
    # last chunk (4099 = 64·64 + 3; every other size in 51..100 leaves 4 steps or more).
    assert chunk_size(pairs, rules, B, 8, 4099) == 64
    assert min(4099 % d for d in range(51, 101) if d != 64) >= 4
    assert chunk_size(pairs, rules, B, 8, 5) == 5
    # lengths with a divisor down to half the cap: no shorter last chunk; multiples of
    # 100 share one chunk, so the same memory
    assert chunk_size(pairs, rules, B, 8, 200) == 100 and chunk_size(pairs, rules, B, 8, 2000) == 100
    assert chunk_size(pairs, rules, B, 8, 4096) == 64
    assert chunk_size(pairs, rules, B, 8, 10_000, requested=3) == 3
    # The chunk's buffers (here 45 numbers of 8 bytes per sample and step) are capped at
    # 32 MiB while the traces are smaller: 1200 samples fit 50 steps, not 100.
    assert 100 * 1200 * 45 * 8 > 32 * 2**20 >= 50 * 1200 * 45 * 8
    assert chunk_size(pairs, rules, 1200, 8, 4100) == 50
    # Without a rule that reads and writes its trace once per chunk (ES-D-RTRL keeps
    # rows for one GEMM) the budget stays 16 MiB, over what that rule stacks: ε_x and one
    # signal row, 5 + 8 = 13 numbers per sample and step (row_bytes), not D-RTRL's 45
    # (signal_bytes). 1200 samples run 100 steps, 2000 samples 50.
    with case.env(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        _, es_plan = ef.algorithms.plan_for(case.model, case.xs, case.ys, case.step_loss, algo="esd_rtrl")
    assert not any(hasattr(rule, "chunk") for rule in es_plan.rules)
    assert es_plan.rules[0].row_bytes(es_plan.pairs[0], 1, 8) == 13 * 8
    assert signal_bytes(pairs[0], 1, 8) == 45 * 8 and not hasattr(rules[0], "row_bytes")
    assert 100 * 1200 * 13 * 8 <= 16 * 2**20 < 100 * 2000 * 13 * 8
    assert chunk_size(es_plan.pairs, es_plan.rules, 1200, 8, 4100) == 100
    assert chunk_size(es_plan.pairs, es_plan.rules, 2000, 8, 4100) == 50
    # ... but not below 32 steps while those fit 64 MiB: 4000 samples fit 12 steps in
    # 32 MiB, 32 in 64 MiB.
    assert 25 * 4000 * 45 * 8 > 32 * 2**20 and 32 * 4000 * 45 * 8 <= 64 * 2**20
    assert chunk_size(pairs, rules, 4000, 8, 4096) == 32
    assert chunk_size(pairs, rules, 10**7, 8, 4099) < DEFAULT_CHUNK  # a huge batch: shorter chunks


def test_the_chunk_budget_counts_the_rows_of_ops_whose_gradient_is_deferred(monkeypatch):
    """The readout's one-step gradient waits for the chunk's GEMM, its ``X`` (the spikes,
    ``B × N``) and ``δy`` (``B × O``) stacked per step, and the first layer's input
    product ``x W + b`` (``B × N``, in the model's dtype) is computed for the whole chunk
    before its steps: the program hands those bytes to ``chunk_size`` as ``extra``,
    which counts them with the rule's rows (ES-D-RTRL, 13 numbers per sample and step
    here): with the readout's 10 more, 1200 samples get 50 steps, not 100."""
    from etrace_fit.algorithms import online

    case = get_case("lif", 64)
    with case.env(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        graph, plan = ef.algorithms.plan_for(case.model, case.xs, case.ys, case.step_loss, algo="esd_rtrl")
    program = build_online(graph, plan.pairs, plan.rules, case.step_loss, trace_dtype=plan.trace_dtype)
    seen = []
    real = online.chunk_size
    monkeypatch.setattr(online, "chunk_size", lambda *a, **k: seen.append(k.get("extra")) or real(*a, **k))
    assert program.chunk_for(T) == T
    assert seen == [B * (N + O) * 8 + B * N * 8]
    rows = plan.rules[0].row_bytes(plan.pairs[0], 1, 8) // 8
    assert rows == 13 and N + O == 10
    assert 100 * 1200 * rows * 8 <= 16 * 2**20 < 100 * 1200 * (rows + N + O) * 8
    assert 50 * 1200 * (rows + N + O) * 8 <= 16 * 2**20
    assert real(plan.pairs, plan.rules, 1200, 8, 4100) == 100
    assert real(plan.pairs, plan.rules, 1200, 8, 4100, extra=1200 * (N + O) * 8) == 50


@pytest.mark.parametrize("every", [1, 5, 7, 30, 45])
def test_update_every_with_chunks_equals_per_step(every):
    """``run_with_updates`` (the optimizer inside the scan) gives the same weights with
    chunks as with the per-step rule, for windows that chunks do and do not divide."""
    case = Case(MODELS["lif"][0], MODELS["lif"][1], (T, B, O), 64)
    results = []
    for chunk, per_step in ((1, True), (4, False), (None, False)):
        with case.env(), warnings.catch_warnings():
            warnings.simplefilter("ignore", ef.ApproximationWarning)
            brainstate.nn.reset_all_states(case.model, batch_size=B)
            graph, plan = ef.algorithms.plan_for(case.model, case.xs, case.ys, mse, algo="d_rtrl")
            rules = tuple(PerStep(r) for r in plan.rules) if per_step else plan.rules
            program = build_online(graph, plan.pairs, rules, mse, trace_dtype=plan.trace_dtype, chunk=chunk)
            module = graph.module
            weights = [leaf for s in module.weights for leaf in jax.tree.leaves(s.state.value)]
            optimizer = optax.sgd(0.05)
            run = jax.jit(lambda w, s, x, y, o: program.run_with_updates(w, s, x, y, optimizer, o, every))
            new, _, losses, _ = run(weights, module.state_leaves(), [case.xs], case.ys, optimizer.init(weights))
        results.append((to_host(new), np.asarray(losses)))
    (ref, ref_losses), *others = results
    assert any(float(np.max(np.abs(w - w0))) > 1e-6 for w, w0 in zip(ref, [
        np.asarray(leaf) for s in graph.module.weights for leaf in jax.tree.leaves(s.state.value)]))
    for new, losses in others:
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-10)
        for w, r in zip(new, ref):
            np.testing.assert_allclose(w, r, rtol=1e-10, atol=1e-12)


class _WithoutAdvance:
    """D-RTRL as a user rule that has no ``advance``: a chunk without loss runs it on zeros."""

    name = "d_rtrl_without_advance"

    def __init__(self):
        self._rule = DRTRL()
        for attr in ("init_traces", "step", "trace_bytes", "trace_norm", "chunk"):
            setattr(self, attr, getattr(self._rule, attr))


def _weighted(out, target):
    y, w = target
    return w * mse(out, y)


def _last_and_mask():
    mask = np.zeros(T, bool)
    mask[[0, 6, 7, 13, 29]] = True
    last = np.arange(T) == T - 1
    return ((last, last), ("last", last), (mask, mask))


@pytest.fixture(scope="module")
def weighted_case():
    """The ALIF case and BPTT's gradient of each weighted loss (by its flags), shared by
    the rules (each reference is a compilation)."""
    case = Case(MODELS["alif"][0], MODELS["alif"][1], (T, B, O), 64)
    references = {}
    for _, flags in _last_and_mask():
        with case.env():
            brainstate.nn.reset_all_states(case.model, batch_size=B)
            targets = (case.ys, jnp.asarray(flags, case.ys.dtype))
            references[flags.tobytes()] = reference_bptt(case.model, case.xs, targets, _weighted, B)[0]
    return case, references


@pytest.mark.parametrize("algo", ["d_rtrl", "d_rtrl_per_chunk", "esd_rtrl", "without_advance"])
def test_inactive_steps_skip_only_zero_loss_steps(weighted_case, algo, monkeypatch):
    """``active`` marks steps whose loss weight is zero: skipping their pull-back gives
    the gradient of the weighted loss exactly, with the loss at the last step only (as
    a flag array and as the static ``"last"``, whose chunks without loss only advance
    the traces, also for ``run_with_updates``) and with a mask. Exactly BPTT's under
    D-RTRL (ALIF is elementwise), and the same as without flags under every rule. The
    programs are compiled once per rule and called with each loss placement.
    ``d_rtrl`` advances these small traces inside the step loop on steps without loss
    (``DRTRL.for_pair``), ``d_rtrl_per_chunk`` once per chunk (as a large trace)."""
    case, references = weighted_case
    if algo == "d_rtrl_per_chunk":
        from etrace_fit.algorithms import d_rtrl
        monkeypatch.setattr(d_rtrl, "STEPWISE_NUMBERS", 0)
        algo = "d_rtrl"
    sgd = optax.sgd(0.1)
    with case.env(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        targets = (case.ys, jnp.ones((T,), case.ys.dtype))
        rule = _WithoutAdvance() if algo == "without_advance" else algo
        graph, plan = ef.algorithms.plan_for(case.model, case.xs, targets, _weighted, algo=rule)
        program = build_online(graph, plan.pairs, plan.rules, _weighted, trace_dtype=plan.trace_dtype, chunk=7)
        module = graph.module
        weights = [leaf for s in module.weights for leaf in jax.tree.leaves(s.state.value)]
        states = module.state_leaves()
        opt = sgd.init(weights)
        full_run = jax.jit(program.run)
        flagged_run = jax.jit(lambda w, s, x, t, flag: program.run(w, s, x, t, active=flag))
        last_run = jax.jit(lambda w, s, x, t: program.run(w, s, x, t, active="last"))
        full_updates = jax.jit(lambda w, s, x, t: program.run_with_updates(w, s, x, t, sgd, opt, 4))
        flagged_updates = jax.jit(lambda w, s, x, t, flag: program.run_with_updates(w, s, x, t, sgd, opt, 4,
                                                                                    active=flag))
        last_updates = jax.jit(lambda w, s, x, t: program.run_with_updates(w, s, x, t, sgd, opt, 4, active="last"))
        for active, flags in _last_and_mask():
            args = (weights, states, [case.xs], (case.ys, jnp.asarray(flags, case.ys.dtype)))
            full, full_losses, _ = full_run(*args)
            if isinstance(active, str):
                skipped, losses, _ = last_run(*args)
                with_flags = last_updates(*args)[0]
            else:
                skipped, losses, _ = flagged_run(*args, jnp.asarray(active))
                with_flags = flagged_updates(*args, jnp.asarray(active))[0]
            without = full_updates(*args)[0]
            ref = references[flags.tobytes()]
            np.testing.assert_allclose(np.asarray(losses), np.asarray(full_losses), rtol=1e-12)
            ref_leaves = [np.asarray(leaf) for s in module.weights for leaf in jax.tree.leaves(ref[s.path])]
            for g, f, r in zip(skipped, full, ref_leaves):
                np.testing.assert_allclose(np.asarray(g), np.asarray(f), rtol=1e-10, atol=1e-14)
                if algo != "esd_rtrl":
                    assert float(np.max(np.abs(np.asarray(g) - r))) <= 1e-8 * float(np.max(np.abs(r)))
            for a, b in zip(with_flags, without):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("algo", ["d_rtrl", "esd_rtrl"])
@pytest.mark.parametrize("placement", ["all", "last", "mask"])
def test_the_online_programs_temp_memory_is_flat_in_the_sequence_length(algo, placement):
    """XLA's temp bytes of the whole-sequence program at T = 1000 are those at T = 100,
    wherever the loss is (the inputs are read chunk by chunk in place: a sliced prefix
    of them would be a copy, 0.5 MiB more at T = 1000 here)."""
    batch, inputs = 8, 16

    def loss(out, target):
        y, w = target
        return jnp.sum(w[:, None] * (out - y) ** 2)

    temps = {}
    with brainstate.environ.context(dt=1.0), warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        model = ef.Sequential(ef.layers.GRUCell(inputs, 8), ef.layers.Linear(8, 2))
        brainstate.nn.init_all_states(model, batch_size=batch)
        for steps in (100, 1000):
            xs = jnp.ones((steps, batch, inputs))
            flags = {"all": np.ones(steps), "last": np.arange(steps) == steps - 1,
                     "mask": np.arange(steps) % 7 == 0}[placement]
            targets = (jnp.zeros((steps, batch, 2)), jnp.broadcast_to(jnp.asarray(flags, jnp.float32)[:, None],
                                                                     (steps, batch)))
            graph, plan = ef.algorithms.plan_for(model, xs, targets, loss, algo=algo)
            program = build_online(graph, plan.pairs, plan.rules, loss, trace_dtype=plan.trace_dtype, chunk=20)
            active = {"all": None, "last": "last", "mask": jnp.asarray(flags, bool)}[placement]
            weights = [leaf for s in graph.module.weights for leaf in jax.tree.leaves(s.state.value)]
            run = jax.jit(lambda w, s, x, t: program.run(w, s, x, t, active=active))
            compiled = run.lower(weights, graph.module.state_leaves(), [xs], targets).compile()
            temps[steps] = compiled.memory_analysis().temp_size_in_bytes
    assert temps[1000] <= 1.05 * temps[100] + 16 * 1024, temps


def test_a_loss_at_the_last_step_chunks_the_steps_before_it_with_the_shortest_last_chunk():
    """With ``active="last"`` the last step runs alone, so the automatic chunk is chosen
    for the ``T - 1`` steps before it: T = 201 runs its first 200 steps in two chunks
    of 100 (201 itself would take 67, leaving a last chunk of 66 before the last step);
    the demo's T = 230 has a prime 229 before its last step, chunked as 3 × 76 and one
    step. The gradient is BPTT's (ALIF is exact under D-RTRL), float64."""
    steps = 201
    case = Case(MODELS["alif"][0], (steps, B, I), (steps, B, O), 64)
    flags = np.arange(steps) == steps - 1
    with case.env():
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        targets = (case.ys, jnp.asarray(flags, case.ys.dtype))
        reference = reference_bptt(case.model, case.xs, targets, _weighted, B)[0]
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        graph, plan = ef.algorithms.plan_for(case.model, case.xs, targets, _weighted, algo="d_rtrl")
        program = build_online(graph, plan.pairs, plan.rules, _weighted, trace_dtype=plan.trace_dtype)
        assert program.chunk_for(steps, "last") == chunk_size(plan.pairs, plan.rules, B, 8, steps - 1) == 100
        assert program.chunk_for(steps) == 67
        assert program.chunk_for(230, "last") == 76 and 229 == 3 * 76 + 1
        module = graph.module
        weights = [leaf for s in module.weights for leaf in jax.tree.leaves(s.state.value)]
        grads = jax.jit(lambda w, s, x, t: program.run(w, s, x, t, active="last"))(
            weights, module.state_leaves(), [case.xs], targets)[0]
    assert_grads_match(grads_by_path(module, grads), reference, 1e-8)


@pytest.mark.parametrize("algo", ["d_rtrl", "esd_rtrl"])
def test_a_mask_runs_no_branch_per_step_and_a_nan_at_an_unmarked_step_stays_out(weighted_case, algo):
    """With a per-step mask a chunk that has some loss runs the pull-back at every step
    and keeps the unmarked steps' parts at zero by a select: the compiled step loops hold
    no conditional (one per chunk decides whether the chunk has any loss), and a target
    that is NaN at an unmarked step, whose loss weight is zero, leaves the gradient and
    the losses as they are with a finite target there (0 · NaN would not)."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    import work

    case, references = weighted_case
    mask = _last_and_mask()[2][1]
    with case.env(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        targets = (case.ys, jnp.asarray(mask, case.ys.dtype))
        graph, plan = ef.algorithms.plan_for(case.model, case.xs, targets, _weighted, algo=algo)
        program = build_online(graph, plan.pairs, plan.rules, _weighted, trace_dtype=plan.trace_dtype, chunk=7)
        weights = [leaf for s in graph.module.weights for leaf in jax.tree.leaves(s.state.value)]
        states = graph.module.state_leaves()
        run = jax.jit(lambda w, s, x, t, flags: program.run(w, s, x, t, active=flags))
        finite = run(weights, states, [case.xs], targets, jnp.asarray(mask))
        unmarked = int(np.flatnonzero(~mask)[0])
        poisoned = (case.ys.at[unmarked].set(jnp.nan), targets[1])
        with_nan = run(weights, states, [case.xs], poisoned, jnp.asarray(mask))
        hlo = run.lower(weights, states, [case.xs], targets, jnp.asarray(mask)).compile().as_text()
    np.testing.assert_array_equal(np.asarray(with_nan[1]), np.asarray(finite[1]))
    for a, b in zip(with_nan[0], finite[0]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    computations, _ = work.parse(hlo)

    def conditionals(name):  # conditional ops in a computation and in those it runs
        return sum((opcode == "conditional") + sum(conditionals(called) for called in
                                                   re.findall(r"(?:body|calls|to_apply)=%([^\s,]+)", rest))
                   for _, _, opcode, rest in computations[name])

    step_loops = [re.search(r"body=%([^\s,]+)", rest).group(1) for ops in computations.values()
                  for _, _, opcode, rest in ops
                  if opcode == "while" and '"known_trip_count":{"n":"7"}' in rest]
    assert step_loops, "no loop over a chunk of 7 steps found"
    assert all(conditionals(body) == 0 for body in step_loops)


def test_steps_marked_without_loss_do_not_evaluate_it_and_final_collects_the_last_step(weighted_case):
    """With ``active="last"`` the steps without loss take it as zero without evaluating
    it (counted by a callback in the loss: only the last step calls it) and
    ``collect="final"`` returns the last step's outputs, equal to the last of
    ``collect=True``'s; gradients and losses are unchanged."""
    case, _ = weighted_case
    calls = []

    def counted(out, target):
        jax.debug.callback(lambda: calls.append(1))
        return _weighted(out, target)

    flags = np.arange(T) == T - 1
    with case.env():
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        targets = (case.ys, jnp.asarray(flags, case.ys.dtype))
        graph, plan = ef.algorithms.plan_for(case.model, case.xs, targets, counted, algo="d_rtrl")
        program = build_online(graph, plan.pairs, plan.rules, counted, trace_dtype=plan.trace_dtype, chunk=7)
        weights = [leaf for s in graph.module.weights for leaf in jax.tree.leaves(s.state.value)]
        args = (weights, graph.module.state_leaves(), [case.xs], targets)
        full = jax.jit(lambda *a: program.run(*a, collect=True))(*args)
        jax.effects_barrier()
        assert len(calls) == T  # without flags, every step's loss
        calls.clear()
        final = jax.jit(lambda *a: program.run(*a, collect="final", active="last"))(*args)
        jax.effects_barrier()
    assert len(calls) == 1  # the last step only
    np.testing.assert_allclose(np.asarray(final[1]), np.asarray(full[1]), rtol=1e-12, atol=1e-14)
    for a, b in zip(final[0], full[0]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-14)
    tail = jax.tree.leaves(final[3].outputs)[0]
    assert tail.shape[0] == 1
    np.testing.assert_allclose(np.asarray(tail), np.asarray(jax.tree.leaves(full[3].outputs)[0][-1:]), rtol=1e-12)


@pytest.mark.parametrize("merge", [True, False])
@pytest.mark.parametrize("k, o", [(7, 3), (3, 7), (5, 5)])
@pytest.mark.parametrize("lead", [(6,), (4, 3), (2, 3, 2)])
def test_gram_sums_the_outer_products_of_rows_in_either_orientation(k, o, lead, merge):
    """``base.gram`` (every chunk's weight-gradient GEMM: Xᵀ δy over C·B rows) computes
    the smaller side as the product's rows and transposes behind a barrier, over the
    leading axes merged into one (``merge``) or kept (rows split over devices); the
    result is Σ aᵀb over all leading axes every way, eager and jitted, float64."""
    from etrace_fit.algorithms.base import gram

    rng = np.random.default_rng(0)
    with brainstate.environ.context(precision=64):
        a, b = jnp.asarray(rng.normal(size=(*lead, k))), jnp.asarray(rng.normal(size=(*lead, o)))
        want = np.einsum("nk,no->ko", np.asarray(a).reshape(-1, k), np.asarray(b).reshape(-1, o))
        for got in (gram(a, b, merge), jax.jit(gram, static_argnums=2)(a, b, merge)):
            assert got.shape == (k, o) and got.dtype == jnp.float64
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-13, atol=1e-13)


def test_step_invariant_outputs_tells_fixed_outputs_and_their_fills():
    """Outputs that read no input are fixed (with their literal when they are a
    broadcast one); an output that reads an input, however little, is not."""
    from etrace_fit import _compat

    weight = jnp.arange(3.0)

    def step(h, x):
        tangent = jax.jvp(lambda v: 0.5 * v + x, (h,), (jnp.ones_like(h),))[1]  # 0.5 everywhere
        through = jax.jvp(lambda v: v + 0.0 * h, (x,), (jnp.ones_like(x),))[1]  # ∂/∂x: 1
        untouched = jax.jvp(lambda v: h * 2.0, (x,), (jnp.ones_like(x),))[1]  # a zero tangent
        return h * x, tangent, through, untouched, weight * 2.0, jnp.zeros(3) + x.sum()

    closed = jax.make_jaxpr(step)(jnp.ones(3), jnp.ones(3))
    found = _compat.step_invariant_outputs(closed)
    assert [fixed for fixed, _ in found] == [False, True, True, True, True, False]
    assert found[2][1] == 1.0 and found[3][1] == 0.0
    assert found[4][1] is None  # fixed by the closed-over weight, not a literal
    # (the 0.5 of `tangent` is a product of literals, not a broadcast one: fixed, no fill)
    assert found[1][1] is None


def test_equal_outputs_finds_one_value_returned_twice_or_laid_out_alike():
    """The same variable twice, or the same chain of layout-only equations (reshape,
    dtype conversion, ...) on the same input, is one value; a different layout, a
    different input, arithmetic or a literal is not."""
    from etrace_fit import _compat

    def step(h, x):
        d = h * x
        return (d, d, d.reshape(3, 1), d.reshape(3, 1), d.reshape(1, 3), h.reshape(3, 1),
                (d + 0.0).reshape(3, 1), d.reshape(3, 1).astype(jnp.float32), 2.0)

    closed = jax.make_jaxpr(step)(jnp.ones(3), jnp.ones(3))
    assert _compat.equal_outputs(closed) == [0, 0, 2, 2, 4, 5, 6, 2, 8]


def test_the_step_loop_stacks_a_repeated_output_once_and_restores_it_everywhere():
    """``_hoist_fixed``'s body returns ``None`` for a stacked output equal to an earlier
    one (as a hidden group's ``D`` is, once per pair of the group) and ``restore`` hands
    it the earlier one's stacked array; the loop's values are the plain scan's."""
    from etrace_fit.algorithms.online import _hoist_fixed

    def step(h, x):
        d = jnp.tanh(h * x)
        return h + d, (d.reshape(1, 3), [d.reshape(1, 3), x.reshape(1, 3)], d.reshape(3, 1))

    h0, xs = jnp.ones(3), jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)
    body, restore = _hoist_fixed(step, h0, xs[0], lambda ys: [])
    out = body(h0, xs[0])[1]
    assert out[1][0] is None and out[0] is not None and out[1][1] is not None and out[2] is not None
    h, ys = jax.lax.scan(body, h0, xs)
    want_h, want = jax.lax.scan(step, h0, xs)
    got = restore(ys)
    np.testing.assert_array_equal(np.asarray(h), np.asarray(want_h))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert got[1][0] is got[0]  # one stacked array, shared


def test_the_lstm_d_rtrl_program_stacks_its_groups_signals_once(cases, monkeypatch):
    """The LSTM's four gate pairs drive one hidden group: its ``D`` and ``G`` are stacked
    once, not once per pair (XLA's temp memory drops by more than a stacked slab's
    worth), with the same gradients to the bit."""
    from etrace_fit import _compat
    from etrace_fit.algorithms import online

    case = _case(cases, "lstm")
    # The pairs' chunks apart: joined (online.chunk_groups), they read the group's D and
    # G from its first pair only, and the others' stacking never shows.
    monkeypatch.setattr(online, "chunk_groups", lambda *a: [])
    shared_grads, _ = program_grads(case, "d_rtrl", chunk=T)
    with case.env(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        graph, plan = ef.algorithms.plan_for(case.model, case.xs, case.ys, case.step_loss, algo="d_rtrl")
        program = build_online(graph, plan.pairs, plan.rules, case.step_loss, trace_dtype=plan.trace_dtype, chunk=T)
        module = graph.module
        weights = [leaf for s in module.weights for leaf in jax.tree.leaves(s.state.value)]
        args = (weights, module.state_leaves(), [case.xs], case.ys)
        def compiled():  # traced anew each time (jit caches the trace of one function)
            return jax.jit(lambda *a: program.run(*a)).lower(*args).compile()

        temp = compiled().memory_analysis().temp_size_in_bytes
        monkeypatch.setattr(_compat, "equal_outputs", lambda closed: list(range(len(closed.jaxpr.outvars))))
        separate = compiled()
        apart = separate.memory_analysis().temp_size_in_bytes
        grads_apart = separate(*args)[0]
    slab = T * B * N * 8  # one stacked (T, B, N) float64 signal
    assert apart - temp > slab, (apart, temp)
    for a, b in zip(shared_grads, grads_apart):
        np.testing.assert_array_equal(a, np.asarray(b))


def _fixed_signals(cases, name):
    """The Fixed signals D-RTRL's chunk gets on ``case`` (the engine's default path)."""
    from etrace_fit.algorithms.base import Fixed

    seen = []

    class Spy(DRTRL):
        def chunk(self, traces, signals, t0):
            seen.extend(leaf for leaf in jax.tree.leaves(tuple(signals)) if isinstance(leaf, Fixed))
            return super().chunk(traces, signals, t0)

    case = _case(cases, name)
    with case.env(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        brainstate.nn.reset_all_states(case.model, batch_size=case.batch)
        graph, plan = ef.algorithms.plan_for(case.model, case.xs, case.ys, case.step_loss, algo="d_rtrl")
        rules = tuple(Spy(**{k: v for k, v in vars(r).items()}) for r in plan.rules)
        program = build_online(graph, plan.pairs, rules, case.step_loss, trace_dtype=plan.trace_dtype, chunk=7)
        module = graph.module
        weights = [leaf for s in module.weights for leaf in jax.tree.leaves(s.state.value)]
        grads, _, _ = jax.jit(program.run)(weights, module.state_leaves(), [case.xs], case.ys)
    return seen, grads_by_path(module, [np.asarray(g) for g in grads]), case


@pytest.mark.parametrize("name, fills", [("lif", {1.0}), ("alif", {0.0, 1.0})])
def test_signals_fixed_over_the_chunk_are_read_once_and_stay_exact(cases, name, fills):
    """A LIF's ``∂V/∂x = 1`` (and an ALIF's ``∂a/∂x = 0``) is the same at every step:
    the engine hands it to D-RTRL's chunk once (``Fixed``), not stacked per step, and the
    gradient is still BPTT's."""
    seen, grads, case = _fixed_signals(cases, name)
    assert {leaf.fill for leaf in seen} >= fills
    assert all(leaf.value.ndim == 2 for leaf in seen)  # (B·P, O): no step axis
    assert_grads_match(grads, case.ref_grads, 1e-8)


@pytest.mark.parametrize("with_signal", [True, False])
def test_chunk_reads_fixed_signals_as_their_stacked_broadcast(with_signal):
    """D-RTRL's chunk with some signals given once (a literal one, a literal zero, a
    value the same at every step) equals the chunk with those signals stacked, float64."""
    with brainstate.environ.context(precision=64):
        _check_fixed_chunk(with_signal)


def _check_fixed_chunk(with_signal):
    from etrace_fit.algorithms.base import Fixed

    rng = np.random.default_rng(0)
    steps, rows, K, O, S = 6, 4, 3, 5, 2
    slab = lambda: jnp.asarray(rng.normal(size=(steps, rows, O)))  # noqa: E731
    once = jnp.asarray(rng.normal(size=(rows, O)))
    stacked = lambda v: jnp.broadcast_to(v, (steps, rows, O))  # noqa: E731
    ones, zeros = jnp.ones((rows, O)), jnp.zeros((rows, O))
    X = jnp.asarray(rng.normal(size=(steps, rows, K)))
    assert X.dtype == jnp.float64
    D_full = ((slab(), stacked(once)), (stacked(zeros), slab()))
    D_fixed = ((D_full[0][0], Fixed(once)), (Fixed(zeros, 0.0), D_full[1][1]))
    Df_full, Df_fixed = (stacked(ones), stacked(zeros)), (Fixed(ones, 1.0), Fixed(zeros, 0.0))
    G = (slab(), slab()) if with_signal else None
    dY = slab() if with_signal else None
    traces = jnp.asarray(rng.normal(size=(rows, 1, S, K, O)))
    rule = DRTRL()
    expected = rule.chunk(traces, PairSignals(X, D_full, Df_full, G, dY), 0)
    got = rule.chunk(traces, PairSignals(X, D_fixed, Df_fixed, G, dY), 0)
    for e, g in zip(expected, got):
        if e is None:
            assert g is None
        else:
            np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-12, atol=1e-12)


def test_chunk_with_every_signal_fixed_knows_its_length():
    """A chunk whose every ``D``, ``Df`` and ``X`` is fixed (a readout's trace on steps
    without loss: ``D = κ``, ``Df = 1``) still advances the trace by ``C`` steps."""
    from etrace_fit.algorithms.base import Fixed

    with brainstate.environ.context(precision=64):
        rng = np.random.default_rng(1)
        steps, rows, K, O = 5, 3, 2, 4
        kappa, x = jnp.full((rows, O), 0.8), jnp.asarray(rng.normal(size=(rows, K)))
        traces = jnp.asarray(rng.normal(size=(rows, 1, 1, K, O)))
        signals = PairSignals(Fixed(x, None, steps), ((Fixed(kappa, None, steps),),),
                              (Fixed(jnp.ones((rows, O)), 1.0, steps),), None)
        _, got = DRTRL().chunk(traces, signals, 0)
        expected = traces
        for _ in range(steps):  # ε ← κ ε + x ⊗ 1
            expected = 0.8 * expected + x[:, None, None, :, None]
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-12)

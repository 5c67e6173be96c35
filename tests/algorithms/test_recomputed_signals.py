"""D-RTRL's chunk computes a neuron's Jacobian entries again instead of reading them stacked.

A multi-state neuron's ``D`` and ``Df`` entries (the demo's ALIF with a readout memory:
seven ``(B, N)`` slabs a step) are elementwise functions of a few per-step values (its
states before the step and its input: three slabs). The step loop stacks those values
instead (``_compat.recomputed_outputs``), and the chunk's backward pass computes the
entries again at each of its steps (``base.Derived``): the same numbers, less memory
traffic. Checked here: which outputs qualify and what the derivation computes, on a
hand-made step; and, end to end, that a chunked D-RTRL program that recomputes equals
BPTT (``brainstate.transform.grad`` over ``for_loop``) in float64, with the loss at
every step, at the last and under a mask, across chunk boundaries.
"""

from __future__ import annotations

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import etrace_fit as ef
from etrace_fit import _compat
from etrace_fit import layers as L
from etrace_fit.algorithms import d_rtrl
from etrace_fit.algorithms.base import Derived
from etrace_fit.algorithms.online import build_online

from ._helpers import Case, lin, mse, rand, reference_bptt, rel_err

T, B, I, N, O = 45, 3, 5, 7, 3  # chunks of 7: six full ones and one of 3


def _step(v, a, y, w):
    """Five Jacobian-like entries from (v, a) alone, one product, one copy of v, and two
    entries from y alone."""
    u = v - 1.0 - 1.8 * a
    s = jax.nn.sigmoid(u) * jnp.where(u > 0, 1.0, 0.5)
    return 0.9 - s, 1.8 * s, -s, 0.95 - 1.8 * s, s * s, y @ w, v * 1.0, jnp.tanh(y), 2.0 * y


def _closed():
    shapes = [jnp.zeros((4, 6))] * 3 + [jnp.zeros((6, 6))]
    return jax.make_jaxpr(_step)(*shapes)


def test_outputs_made_elementwise_from_fewer_bytes_are_recomputed_from_their_sources():
    closed = _closed()
    outputs, sources = _compat.recomputed_outputs(closed, range(5))
    assert outputs == [0, 1, 2, 3, 4]
    assert sources == closed.jaxpr.invars[:2]  # v and a; y, w and the product are not read
    rng = np.random.default_rng(0)
    v, a, y, w = (jnp.asarray(rng.normal(size=shape), jnp.float32) for shape in [(4, 6)] * 3 + [(6, 6)])
    again = _compat.jaxpr_as_fun(_compat.derivation(closed, outputs, sources))(v, a)
    for got, want in zip(again, _step(v, a, y, w)[:5]):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # The step can hand the sources on as more outputs, after its own.
    more = _compat.jaxpr_as_fun(_compat.with_outputs(closed, sources))(v, a, y, w)
    assert len(more) == 11
    np.testing.assert_array_equal(np.asarray(more[9]), np.asarray(v))


@pytest.mark.parametrize("candidates", [[5], [6], [0, 1], [0, 5]])
def test_nothing_is_recomputed_unless_its_sources_take_under_half_its_bytes(candidates):
    """A product is its own source; a copy of ``v`` or two entries of ``(v, a)`` would
    stack as many bytes as they save (the score counts a source twice); with the
    product beside it, the one entry alone does not pay either."""
    assert _compat.recomputed_outputs(_closed(), candidates) == ([], [])


def test_outputs_sharing_no_source_are_chosen_apart():
    """The entries of ``(v, a)`` pay; the two of ``y`` alone would not (two slabs for one),
    and do not keep the others from being chosen: each hidden group is decided alone."""
    closed = _closed()
    assert _compat.recomputed_outputs(closed, [0, 1, 2, 3, 4, 7, 8]) == ([0, 1, 2, 3, 4], closed.jaxpr.invars[:2])
    assert _compat.recomputed_outputs(closed, [7, 8]) == ([], [])


def _model():
    return ef.Sequential(lin(I, N, 0, 2.0), L.ALIF(N, tau=10.0, tau_a=30.0, beta=0.5, surrogate="sigmoid"),
                         L.LeakyRateReadout(N, O, tau=5.0, w_init=rand(2, N, O), b_init=rand(3, O, scale=0.1)))


def _weighted(out, target):
    y, w = target
    return w * mse(out, y)


PLACEMENTS = {"every": np.ones(T, bool), "last": np.arange(T) == T - 1,
              "mask": np.isin(np.arange(T), [0, 5, 31, 32, 44])}


@pytest.fixture(scope="module")
def case():
    return Case(_model, (T, B, I), (T, B, O), 64, x_scale=1.0, x_shift=0.5)


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_a_chunk_that_recomputes_the_alifs_entries_equals_bptt(case, placement, monkeypatch):
    """The ALIF read by a leaky readout (three trace states, seven ``D``/``Df`` entries
    from three slabs) in chunks of 7, each trace advanced per chunk: every weight gets
    BPTT's gradient to 1e-9, and the chunks did recompute (a :class:`Derived` reached
    D-RTRL's chunk)."""
    monkeypatch.setattr(d_rtrl, "STEPWISE_NUMBERS", 0)  # a small trace would advance in the step loop
    seen = []
    chunk_group = d_rtrl.DRTRL.chunk_group

    def spy(self, rules, traces, signals, t0):
        seen.extend(leaf for s in signals for leaf in jax.tree.leaves((s.D, s.Df))
                    if isinstance(leaf, Derived))
        return chunk_group(self, rules, traces, signals, t0)

    monkeypatch.setattr(d_rtrl.DRTRL, "chunk_group", spy)
    flags = PLACEMENTS[placement]
    targets = (case.ys, jnp.asarray(flags, case.ys.dtype))
    with case.env():
        ref_grads, ref_losses = reference_bptt(case.model, case.xs, targets, _weighted, B)
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        graph, plan = ef.algorithms.plan_for(case.model, case.xs, targets, _weighted, algo="d_rtrl")
        program = build_online(graph, plan.pairs, plan.rules, _weighted, trace_dtype=plan.trace_dtype, chunk=7)
        weights = [leaf for s in graph.module.weights for leaf in jax.tree.leaves(s.state.value)]
        active = {"every": None, "last": "last", "mask": jnp.asarray(flags)}[placement]
        grads, losses, _ = jax.jit(lambda w, s, x, t: program.run(w, s, x, t, active=active))(
            weights, graph.module.state_leaves(), [case.xs], targets)
    assert seen, "no chunk recomputed its signals"
    np.testing.assert_allclose(np.asarray(losses).reshape(-1), np.asarray(ref_losses).reshape(-1), rtol=1e-12)
    ref_leaves = [np.asarray(leaf) for s in graph.module.weights for leaf in jax.tree.leaves(ref_grads[s.path])]
    assert len(ref_leaves) == len(grads) == 4
    for g, r in zip(grads, ref_leaves):
        assert rel_err(np.asarray(g), r) < 1e-9

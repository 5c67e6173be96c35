"""``sequence_grad`` (etrace_fit/algorithms/sequence.py): its interface and contract.

Gradients keyed and shaped like the model's ParamStates, per-step losses, hidden states
left where the sequence ended, one compilation per shape, ``targets=None``, trace dtype,
``decay``/``rank``, argument errors, and that no ParamState is silently given a zero
gradient (a weight used through plain ``jnp`` gets the one-step gradient and a warning).
"""

from __future__ import annotations

import functools
import warnings

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import etrace_fit as ef
from etrace_fit import layers as L

from ._helpers import (MODELS, B, I, N, O, T, Case, assert_grads_match, assert_losses_match, assert_same_structure, cosine,
                       get_case, leaves_by_name, lin, mse, online_grads, rand, reference_bptt, rel_err, to_host)

TS = 8  # short sequences: these tests are about the interface


def _small(learn_tau=False, seed=0):
    with brainstate.environ.context(dt=1.0):
        model = ef.Sequential(lin(I, N, seed, 2.0), L.LIF(N, tau=10.0, learn_tau=learn_tau, surrogate="sigmoid"),
                              lin(N, O, seed + 2))
        brainstate.nn.init_all_states(model, batch_size=B)
    xs = jnp.asarray(rand(30, TS, B, I, scale=0.8, shift=0.6), jnp.float32)
    ys = jnp.asarray(rand(31, TS, B, O), jnp.float32)
    return model, xs, ys


@pytest.fixture(scope="module")
def small():
    return _small(learn_tau=True)


def env():
    return brainstate.environ.context(dt=1.0)


# ---------------------------------------------------------------- outputs and state


@pytest.mark.parametrize("algo", ["d_rtrl", "esd_rtrl", "hybrid", "bptt"])
def test_grads_keyed_like_param_states(small, algo):
    model, xs, ys = small
    with env():
        brainstate.nn.reset_all_states(model, batch_size=B)
        grads, losses = ef.sequence_grad(model, xs, ys, mse, algo=algo)
    assert_same_structure(grads, model)
    assert set(grads) == {("layers", 0, "weight"), ("layers", 1, "tau"), ("layers", 2, "weight")}
    assert isinstance(grads[("layers", 0, "weight")], dict) and set(grads[("layers", 0, "weight")]) == {"weight", "bias"}
    assert np.shape(losses) == (TS,) and np.asarray(losses).dtype == np.float32
    assert np.all(np.isfinite(np.asarray(losses)))
    for leaf_name, leaf in leaves_by_name(to_host(grads)).items():
        assert np.all(np.isfinite(leaf)), leaf_name


def test_hidden_states_end_where_a_forward_run_ends(small):
    model, xs, ys = small
    hidden = model.states(brainstate.HiddenState)
    with env():
        brainstate.nn.reset_all_states(model, batch_size=B)
        outs = brainstate.transform.for_loop(model, xs)
        expected = {path: np.asarray(state.value) for path, state in hidden.items()}
        losses_fwd = np.asarray(jax.vmap(mse)(outs, ys))
        for algo in ("d_rtrl", "esd_rtrl", "bptt"):
            brainstate.nn.reset_all_states(model, batch_size=B)
            _, losses = ef.sequence_grad(model, xs, ys, mse, algo=algo)
            for path, state in hidden.items():
                np.testing.assert_allclose(np.asarray(state.value), expected[path], rtol=1e-6, atol=1e-6,
                                           err_msg=f"{algo} {path}")
            np.testing.assert_allclose(np.asarray(losses), losses_fwd, rtol=1e-6)
    assert float(np.abs(expected[("layers", 1, "V")]).max()) > 0


def test_a_second_call_continues_from_where_the_first_ended(small):
    """Two halves in a row: the second starts from the states the first left."""
    model, xs, ys = small
    hidden = model.states(brainstate.HiddenState)
    with env():
        brainstate.nn.reset_all_states(model, batch_size=B)
        brainstate.transform.for_loop(model, xs)
        brainstate.transform.for_loop(model, xs)
        expected = np.asarray(hidden[("layers", 1, "V")].value)
        brainstate.nn.reset_all_states(model, batch_size=B)
        _, first = ef.sequence_grad(model, xs, ys, mse, algo="d_rtrl")
        _, second = ef.sequence_grad(model, xs, ys, mse, algo="d_rtrl")
    np.testing.assert_allclose(np.asarray(hidden[("layers", 1, "V")].value), expected, rtol=1e-6, atol=1e-6)
    assert not np.allclose(np.asarray(first), np.asarray(second))  # a different start, different losses


def test_weights_are_not_changed_and_are_read_at_call_time(small):
    model, xs, ys = small
    params = model.states(brainstate.ParamState)
    before = {path: to_host(state.value) for path, state in params.items()}
    calls = []

    def loss(out, target):
        calls.append(1)
        return mse(out, target)

    with env():
        online_grads(model, xs, ys, loss, B, algo="d_rtrl")
        for path, state in params.items():
            jax.tree.map(np.testing.assert_array_equal, to_host(state.value), before[path])
        traced = len(calls)
        # new weight values, same shapes: no recompilation, and the new values are used
        w = params[("layers", 0, "weight")]
        w.value = {"weight": w.value["weight"] * 1.3, "bias": w.value["bias"] - 0.1}
        try:
            grads, losses = online_grads(model, xs, ys, loss, B, algo="d_rtrl")
            ref_grads, ref_losses = reference_bptt(model, xs, ys, mse, B)
        finally:
            w.value = {key: jnp.asarray(value) for key, value in before[("layers", 0, "weight")].items()}
    assert len(calls) == traced
    assert_grads_match(grads, ref_grads, 1e-4)
    assert_losses_match(losses, ref_losses, 1e-5)


# ---------------------------------------------------------------- compilation cache


def test_no_retrace_on_a_second_call_with_the_same_shapes():
    model, xs, ys = _small(seed=5)
    traces = []

    def counted(out, target):  # runs in Python only while JAX traces it
        traces.append(1)
        return mse(out, target)

    with env():
        brainstate.nn.reset_all_states(model, batch_size=B)
        ef.sequence_grad(model, xs, ys, counted, algo="d_rtrl")
        first = len(traces)
        assert first >= 1
        brainstate.nn.reset_all_states(model, batch_size=B)
        ef.sequence_grad(model, xs * 0.5, ys + 1.0, counted, algo="d_rtrl")  # new values, same shapes
        ef.algorithms.plan_for(model, xs, ys, counted, algo="d_rtrl")
        assert len(traces) == first
        ef.sequence_grad(model, xs[:5], ys[:5], counted, algo="d_rtrl")  # another T: a new program
        assert len(traces) > first
        second = len(traces)
        ef.sequence_grad(model, xs[:5], ys[:5], counted, algo="d_rtrl")
        assert len(traces) == second
        # rank=3 and decay=0.5 are the same α: the same program
        ef.sequence_grad(model, xs, ys, counted, algo="esd_rtrl", rank=3)
        third = len(traces)
        ef.sequence_grad(model, xs, ys, counted, algo="esd_rtrl", decay=0.5)
        assert len(traces) == third


def test_rank_equals_decay(small):
    model, xs, ys = small
    with env():
        by_rank = online_grads(model, xs, ys, mse, B, algo="esd_rtrl", rank=3)
        by_decay = online_grads(model, xs, ys, mse, B, algo="esd_rtrl", decay=0.5)
        default = online_grads(model, xs, ys, mse, B, algo="esd_rtrl")
    for a, b in zip(jax.tree.leaves(by_rank), jax.tree.leaves(by_decay)):
        np.testing.assert_array_equal(a, b)
    # and α matters: the default (0.9) differs for the input weight
    key = "layers.0.weight['weight']"
    assert rel_err(leaves_by_name(default[0])[key], leaves_by_name(by_decay[0])[key]) > 1e-3


# ---------------------------------------------------------------- targets, dtypes


def test_targets_none_with_a_loss_ignoring_the_target(small):
    model, xs, _ = small

    def energy(out, target):
        assert target is None
        return jnp.sum(out ** 2)

    with env():
        grads, losses = online_grads(model, xs, None, energy, B, algo="d_rtrl")
        ref_grads, ref_losses = reference_bptt(model, xs, None, energy, B)
    assert np.shape(losses) == (TS,)
    assert_grads_match(grads, ref_grads, 1e-4)
    assert_losses_match(losses, ref_losses, 1e-5)


def test_several_inputs_and_pytree_targets():
    """xs a tuple (two positional inputs of the step), targets a dict of time-major arrays."""

    class TwoInputs(brainstate.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.out = lin(I, N, 0, 2.0), lin(3, N, 4), lin(N, O, 2)
            self.lif = L.LIF(N, tau=10.0, surrogate="sigmoid")

        def update(self, x, c):
            return self.out(self.lif(self.a(x) + self.b(c)))

    def loss(out, target):
        return jnp.sum(target["w"] * (out - target["y"]) ** 2)

    with brainstate.environ.context(precision=64, dt=1.0):
        model = TwoInputs()
        brainstate.nn.init_all_states(model, batch_size=B)
        xs = jnp.asarray(rand(1, TS, B, I, shift=0.5))
        cs = jnp.asarray(rand(2, TS, B, 3))
        targets = {"y": jnp.asarray(rand(3, TS, B, O)), "w": jnp.asarray(np.abs(rand(4, TS, B, 1)))}
        params = model.states(brainstate.ParamState)

        def total():
            brainstate.nn.reset_all_states(model, batch_size=B)
            outs = brainstate.transform.for_loop(lambda x, c: model(x, c), xs, cs)
            losses = jax.vmap(loss)(outs, targets)
            return losses.sum(), losses

        ref_grads, _, ref_losses = brainstate.transform.grad(total, grad_states=params, return_value=True,
                                                             has_aux=True)()
        ref_grads = to_host(ref_grads)
        brainstate.nn.reset_all_states(model, batch_size=B)
        grads, losses = ef.sequence_grad(model, (xs, cs), targets, loss, algo="d_rtrl")
    assert_same_structure(grads, model)
    assert_grads_match(to_host(grads), ref_grads, 1e-10)
    assert_losses_match(losses, ref_losses, 1e-12)


# Measured cosine(bfloat16 traces, float32 traces) on the LIF model: 0.99998 for the
# input weight under both rules, 1.00000 for its bias and the readout.
@pytest.mark.parametrize("algo", ["d_rtrl", "esd_rtrl"])
def test_bfloat16_traces_close_to_float32(algo):
    case = get_case("lif", 32)
    full = leaves_by_name(case.run(algo)[0])
    half, losses = case.run(algo, trace_dtype=jnp.bfloat16)
    half = leaves_by_name(half)
    for leaf in full:
        assert half[leaf].dtype == np.float32, leaf  # gradients keep the parameters' dtype
        cos = cosine(half[leaf], full[leaf])
        assert cos > 0.99, f"{leaf}: cosine {cos}"
    assert_losses_match(losses, case.ref_losses, 1e-5)  # the forward pass is not affected


def test_float64_traces_on_a_float64_model_by_default():
    case = get_case("lif", 64)
    with case.env():
        _, plan = ef.algorithms.plan_for(case.model, case.xs, case.ys, case.step_loss, algo="d_rtrl")
    assert jnp.dtype(plan.trace_dtype) == jnp.float64


# ---------------------------------------------------------------- argument errors


def test_decay_and_rank_errors(small):
    model, xs, ys = small
    with env():
        with pytest.raises(ef.ConfigError, match=r"\[0, 1\)"):
            ef.sequence_grad(model, xs, ys, mse, algo="esd_rtrl", decay=1.0)
        with pytest.raises(ef.ConfigError, match="not both"):
            ef.sequence_grad(model, xs, ys, mse, algo="esd_rtrl", decay=0.5, rank=3)
        with pytest.raises(ef.ConfigError, match="rank"):
            ef.sequence_grad(model, xs, ys, mse, algo="esd_rtrl", rank=0)


def test_other_config_errors(small):
    model, xs, ys = small
    with env():
        with pytest.raises(ef.ConfigError, match="trace_dtype"):
            ef.sequence_grad(model, xs, ys, mse, trace_dtype=jnp.int32)
        with pytest.raises(ef.ConfigError, match="step_loss"):
            ef.sequence_grad(model, xs, ys, "mse")


def test_shape_errors(small):
    model, xs, ys = small
    with env():
        with pytest.raises(ef.ShapeError, match="time-major"):
            ef.sequence_grad(model, xs[:, 0, 0], ys, mse)  # (T,): no batch, no features
        with pytest.raises(ef.ShapeError, match="no time steps"):
            ef.sequence_grad(model, xs[:0], ys[:0], mse)
        with pytest.raises(ef.ShapeError, match="T=8"):
            ef.sequence_grad(model, xs, ys[:-1], mse)  # targets with another T
        with pytest.raises(ef.ShapeError, match="one T"):
            ef.sequence_grad(model, (xs, xs[:-1]), ys, mse)  # inputs with different T
        with pytest.raises(ef.ShapeError):
            ef.sequence_grad(model, [], ys, mse)


@pytest.mark.parametrize("layout", ["batch_major", "no_batch_axis"])
def test_xs_not_time_major_is_a_shape_error(small, layout):
    """A batch-major ``(B, T, I)`` sequence, or one without the batch axis ``(T, I)``,
    must raise :class:`ShapeError` (every user error is an EtraceError). FAILS at the
    time of writing: batch-major gives a raw ``TypeError`` from JAX (broadcasting
    ``(B, N) + (T, N)`` inside LIF while the step is compiled); without the batch axis
    the call *succeeds*: the first Linear's relation is excluded for a shape mismatch
    and its weight silently falls back to the one-step gradient."""
    model, xs, ys = small
    bad = jnp.swapaxes(xs, 0, 1) if layout == "batch_major" else xs[:, 0]
    targets = jnp.swapaxes(ys, 0, 1) if layout == "batch_major" else ys
    assert bad.shape[1] != B  # what sits where the batch axis should be
    with env():
        brainstate.nn.reset_all_states(model, batch_size=B)
        with pytest.raises(ef.ShapeError):
            ef.sequence_grad(model, bad, targets, mse)


def test_an_unbatched_model_is_an_etrace_error():
    """Hidden states without a batch axis (``init_all_states(model)``): sequence_grad
    documents a batched model; it must say so with an EtraceError. FAILS at the time of
    writing: ``IndexError: tuple index out of range`` from ``traced_pairs`` (base.py,
    ``units[-1]`` with ``units = group.shape[1:] = ()``)."""
    with brainstate.environ.context(dt=1.0):
        model = ef.Sequential(lin(I, N, 0, 2.0), L.LIF(N, tau=10.0), lin(N, O, 2))
        brainstate.nn.init_all_states(model)
        xs = jnp.asarray(rand(1, TS, I), jnp.float32)
        ys = jnp.asarray(rand(2, TS, O), jnp.float32)
        with pytest.raises(ef.EtraceError):
            ef.sequence_grad(model, xs, ys, mse, algo="d_rtrl")


# ---------------------------------------------------------------- no silent zeros


class WithUnusedParam(brainstate.nn.Module):
    """A leaky tanh layer with an extra ParamState the step never reads."""

    def __init__(self):
        super().__init__()
        dtype = brainstate.environ.dftype()
        self.W = brainstate.ParamState({"weight": jnp.asarray(rand(12, I, N), dtype), "bias": jnp.zeros(N, dtype)})
        self.unused = brainstate.ParamState(jnp.ones(3, dtype))

    def init_state(self, batch_size=None, **kwargs):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, N), brainstate.environ.dftype()))

    def reset_state(self, batch_size=None, **kwargs):
        self.h.value = jnp.zeros((batch_size, N), brainstate.environ.dftype())

    def update(self, x):
        self.h.value = 0.8 * self.h.value + 0.2 * jnp.tanh(ef.ops.matmul(x, self.W.value["weight"], self.W.value["bias"]))
        return self.h.value


def test_unused_param_gets_zeros_in_the_models_key_order():
    """An unused ParamState's gradient is zero (correctly), and the gradient dict keeps
    the order of ``model.states(ParamState)``. The order part FAILS at the time of
    writing: ``sequence_grad`` appends the unused state's zeros after the others
    (sequence.py, the ``ordered`` dict), so ``zip(grads.values(), params.values())``
    pairs the wrong arrays."""
    with brainstate.environ.context(dt=1.0):
        model = ef.Sequential(WithUnusedParam(), lin(N, O, 2))
        brainstate.nn.init_all_states(model, batch_size=B)
        xs = jnp.asarray(rand(1, TS, B, I), jnp.float32)
        ys = jnp.asarray(rand(2, TS, B, O), jnp.float32)
        grads, _ = ef.sequence_grad(model, xs, ys, mse, algo="d_rtrl")
    np.testing.assert_array_equal(np.asarray(grads[("layers", 0, "unused")]), np.zeros(3, np.float32))
    assert np.max(np.abs(np.asarray(grads[("layers", 0, "W")]["weight"]))) > 0
    assert set(grads) == set(model.states(brainstate.ParamState).keys())
    assert list(grads) == list(model.states(brainstate.ParamState).keys())


@pytest.mark.parametrize("algo", ["d_rtrl", "esd_rtrl", "hybrid", "bptt"])
def test_every_param_state_gets_a_nonzero_gradient(algo):
    """LIF → Linear: exact under D-RTRL (and hybrid, which picks it here) and BPTT, so
    silent; ES-D-RTRL's factorised input weight is named in an ApproximationWarning."""
    build, x_shape = MODELS["lif"]
    case = Case(build, x_shape, (T, B, O), 32)  # a fresh model: warnings come with its compile
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grads, _ = case.run(algo)
    messages = [str(w.message) for w in caught]
    if algo == "esd_rtrl":
        assert len(messages) == 1 and all(issubclass(w.category, ef.ApproximationWarning) for w in caught)
        assert "layers.0.weight is approximate: ES-D-RTRL" in messages[0], messages
    else:
        assert messages == []
    for leaf_name, leaf in leaves_by_name(grads).items():
        assert np.count_nonzero(leaf) >= 0.5 * leaf.size, leaf_name


class PlainRecurrent(brainstate.nn.Module):
    """``h = 0.9·h + tanh(x @ W)`` with a plain ``@`` (no ETP op): not traceable online."""

    def __init__(self):
        super().__init__()
        self.W = brainstate.ParamState(jnp.asarray(rand(7, I, N, scale=0.7), brainstate.environ.dftype()))

    def init_state(self, batch_size=None, **kwargs):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, N), brainstate.environ.dftype()))

    def reset_state(self, batch_size=None, **kwargs):
        self.h.value = jnp.zeros((batch_size, N), brainstate.environ.dftype())

    def update(self, x):
        self.h.value = 0.9 * self.h.value + jnp.tanh(x @ self.W.value)
        return self.h.value


def test_plain_matmul_weight_gets_the_one_step_gradient_with_a_warning():
    with brainstate.environ.context(precision=64, dt=1.0):
        model = ef.Sequential(PlainRecurrent(), lin(N, O, 2))
        brainstate.nn.init_all_states(model, batch_size=B)
        xs = jnp.asarray(rand(40, TS, B, I))
        ys = jnp.asarray(rand(41, TS, B, O))
        with pytest.warns(UserWarning, match=r"layers\.0\.W is approximate.*one-step"):
            grads, losses = online_grads(model, xs, ys, mse, B, algo="d_rtrl")
        ref_grads, ref_losses = reference_bptt(model, xs, ys, mse, B)

        # independent one-step reference: Σ_t ∂L^t/∂W with h^{t-1} held at its value
        W = model.layers[0].W.value
        readout = model.layers[1].weight.value
        h_prev, one_step = jnp.zeros((B, N)), jnp.zeros_like(W)
        for t in range(TS):
            def step_loss(w, h_prev=h_prev, t=t):
                h = 0.9 * h_prev + jnp.tanh(xs[t] @ w)
                return mse(h @ readout["weight"] + readout["bias"], ys[t])
            one_step = one_step + jax.grad(step_loss)(W)
            h_prev = 0.9 * h_prev + jnp.tanh(xs[t] @ W)
        one_step = np.asarray(one_step)

    g = grads[("layers", 0, "W")]
    assert np.count_nonzero(g) == g.size
    assert rel_err(g, one_step) < 1e-10
    # it is an approximation (the recurrence through h is dropped), not the BPTT gradient
    assert rel_err(g, ref_grads[("layers", 0, "W")]) > 1e-3
    # the readout is exact, and the forward pass unaffected
    assert_grads_match(grads, ref_grads, 1e-10, only=["layers.1.weight"])
    assert_losses_match(losses, ref_losses, 1e-12)


class FusedGate(brainstate.nn.Module):
    """One matmul for two gates: ``y = x W + b`` of width 2N, split in halves,
    ``h = 0.8·h + 0.2·tanh(y₁)·σ(y₂)``. A common pattern; ``y`` has another shape than
    ``h``, so the compiler cannot relate W to h per unit (EXCLUDED_SHAPE_MISMATCH)."""

    def __init__(self):
        super().__init__()
        dtype = brainstate.environ.dftype()
        self.W = brainstate.ParamState({"weight": jnp.asarray(rand(8, I, 2 * N, scale=0.7), dtype),
                                        "bias": jnp.asarray(rand(9, 2 * N, scale=0.3), dtype)})

    def init_state(self, batch_size=None, **kwargs):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, N), brainstate.environ.dftype()))

    def reset_state(self, batch_size=None, **kwargs):
        self.h.value = jnp.zeros((batch_size, N), brainstate.environ.dftype())

    def update(self, x):
        y = ef.ops.matmul(x, self.W.value["weight"], self.W.value["bias"])
        self.h.value = 0.8 * self.h.value + 0.2 * jnp.tanh(y[:, :N]) * jax.nn.sigmoid(y[:, N:])
        return self.h.value


@functools.lru_cache(maxsize=None)
def fused_case():
    with brainstate.environ.context(precision=64, dt=1.0):
        model = ef.Sequential(FusedGate(), lin(N, O, 2))
        brainstate.nn.init_all_states(model, batch_size=B)
        xs = jnp.asarray(rand(42, TS, B, I))
        ys = jnp.asarray(rand(43, TS, B, O))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            grads, losses = online_grads(model, xs, ys, mse, B, algo="d_rtrl")
        ref_grads, ref_losses = reference_bptt(model, xs, ys, mse, B)
        graph = ef.compile_graph(model, xs[0])
        W = model.layers[0].W.value
        readout = model.layers[1].weight.value

        def cell(w, h_prev, x):
            y = x @ w["weight"] + w["bias"]
            return 0.8 * h_prev + 0.2 * jnp.tanh(y[:, :N]) * jax.nn.sigmoid(y[:, N:])

        h_prev, hs = jnp.zeros((B, N)), []
        for t in range(TS):
            hs.append(h_prev)
            h_prev = cell(W, h_prev, xs[t])
        hs = jnp.stack(hs)

        def one_step_total(w):
            new = jax.vmap(lambda hp, x: cell(w, hp, x))(hs, xs)
            return jax.vmap(mse)(new @ readout["weight"] + readout["bias"], ys).sum()

        one_step = to_host(jax.grad(one_step_total)(W))
    return dict(grads=grads, losses=losses, ref_grads=ref_grads, ref_losses=ref_losses, graph=graph,
                warnings=[str(w.message) for w in caught if issubclass(w.category, UserWarning)], one_step=one_step)


def test_fused_gate_weight_gets_the_one_step_gradient():
    case = fused_case()
    kinds = {d.kind for d in case["graph"].diagnostics_of("layers.0.W")}
    assert ef.compiler.DiagnosticKind.EXCLUDED_SHAPE_MISMATCH in kinds
    got = case["grads"][("layers", 0, "W")]
    for key in ("weight", "bias"):
        assert np.count_nonzero(got[key]) == got[key].size, key
        assert rel_err(got[key], case["one_step"][key]) < 1e-10, key
        assert rel_err(got[key], case["ref_grads"][("layers", 0, "W")][key]) > 1e-2, key
    assert_grads_match(case["grads"], case["ref_grads"], 1e-10, only=["layers.1.weight"])
    assert_losses_match(case["losses"], case["ref_losses"], 1e-12)


def test_fused_gate_weight_is_named_in_a_warning():
    """docs/algorithms.md: weights the compiler cannot trace get the one-step gradient
    "and a warning names them": a shape mismatch too."""
    messages = fused_case()["warnings"]
    assert any("layers.0.W" in m and "one-step" in m for m in messages), messages


# ---------------------------------------------------------------- online_fit


def test_online_fit_with_one_window_is_one_optimizer_step(small):
    """``update_every = T``: one update with the sequence's accumulated gradient, the
    same as ``sequence_grad`` followed by the optimizer."""
    import optax

    model, xs, ys = small
    params = model.states(brainstate.ParamState)
    hidden = model.states(brainstate.HiddenState)
    before = {path: state.value for path, state in params.items()}
    lr = 0.01
    try:
        with env():
            grads, losses = online_grads(model, xs, ys, mse, B, algo="d_rtrl")
            final_state = np.asarray(hidden[("layers", 1, "V")].value)
            brainstate.nn.reset_all_states(model, batch_size=B)
            opt_state, fit_losses = ef.online_fit(model, xs, ys, mse, optax.sgd(lr), update_every=TS, algo="d_rtrl")
            after = {path: to_host(state.value) for path, state in params.items()}
            fit_state = np.asarray(hidden[("layers", 1, "V")].value)
    finally:
        for path, state in params.items():
            state.value = before[path]
    np.testing.assert_allclose(np.asarray(fit_losses), losses, rtol=1e-6)
    np.testing.assert_allclose(fit_state, final_state, rtol=1e-6, atol=1e-6)
    for path in before:
        expected = jax.tree.map(lambda w, g: np.asarray(w) - lr * g, before[path], grads[path])
        jax.tree.map(lambda a, e: np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6), after[path], expected)
        moved = jax.tree.map(lambda a, b: float(np.max(np.abs(a - np.asarray(b)))), after[path], before[path])
        assert all(m > 0 for m in jax.tree.leaves(moved)), path


def test_online_fit_argument_errors(small):
    import optax

    model, xs, ys = small
    with env():
        with pytest.raises(ef.ConfigError, match="update_every"):
            ef.online_fit(model, xs, ys, mse, optax.sgd(0.1), update_every=0)
        with pytest.raises(ef.ConfigError, match="online rule"):
            ef.online_fit(model, xs, ys, mse, optax.sgd(0.1), algo="bptt")


# ---------------------------------------------------------------- inside a user's jit


@pytest.mark.parametrize("algo", ["d_rtrl", "bptt"])
def test_the_functional_api_runs_inside_a_users_jit(algo):
    """sequence_grad, learner.grad, learner.step and online_fit inside
    ``brainstate.transform.jit`` give what they give outside it. Their own programs are
    jitted with compiler options, which JAX takes only at the top level: inside a user's
    jit each runs unjitted, as part of the user's program (until 2026-11-27 every one
    of them raised there)."""
    import optax

    def run(jit):
        wrap = brainstate.transform.jit if jit else (lambda f: f)
        model, xs, ys = _small()
        out = {"sequence_grad": wrap(lambda xs: ef.sequence_grad(model, xs, ys, mse, algo=algo))(xs)}
        model, xs, ys = _small()
        learner = ef.compile(model, xs[0], mse, algo=algo)
        with env():
            learner.compiled(xs, ys)  # the model's step traced outside first
            out["grad"] = wrap(lambda xs: learner.grad(xs, ys))(xs)
            state = learner.init(B)
            out["step"] = wrap(lambda state, xs: learner.step(state, xs, ys)[:2])(state, xs)
        if algo != "bptt":
            model, xs, ys = _small()
            with env():
                fit = wrap(lambda xs: ef.online_fit(model, xs, ys, mse, optax.sgd(0.1), update_every=4, algo=algo)[1])
                out["online_fit"] = (fit(xs), jax.tree.map(np.asarray, model.states(brainstate.ParamState)
                                                             .to_dict_values()))
        return out

    with env():
        eager, jitted = run(False), run(True)
    assert set(jitted) == set(eager)
    for name in eager:
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name),
                     jitted[name], eager[name])


@pytest.mark.parametrize("algo", ["d_rtrl", "esd_rtrl", "bptt"])
def test_learner_step_runs_under_a_plain_jax_jit(algo):
    """learner.step is pure, so ``jax.jit(learner.step)`` works from its first call (the
    model's step traced inside the jit) and gives, over two chunks of a stream, the
    gradients, losses and carried states of the eager calls. Until 2026-11-27 it raised
    brainstate's TraceContextError: resetting the model's states at the batch size made
    traced initial values under jax.jit and wrote them into the states."""
    def two_chunks(step):
        model, xs, ys = _small()
        with env():
            learner = ef.compile(model, xs[0], mse, algo=algo)
            step = step(learner.step)
            first = step(learner.init(B), xs[:4], ys[:4])
            second = step(first[2], xs[4:], ys[4:])
        return first, second

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        eager, jitted = two_chunks(lambda f: f), two_chunks(jax.jit)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), jitted, eager)
    assert float(jnp.abs(jnp.asarray(jax.tree.leaves(eager[1][0])[0])).max()) > 0  # a gradient, not zeros

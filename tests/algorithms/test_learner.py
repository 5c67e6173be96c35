"""``ef.compile`` → ``Learner`` (etrace_fit/algorithms/learner.py): an explicit compile,
a plan chosen once for every batch size, and no stale program after the model changes."""

from __future__ import annotations

import re
import warnings

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.layers.dropout import DropoutKey

from ._helpers import B, I, N, O, T, Case, assert_grads_match, leaves_by_name, lin, mse, reference_bptt, to_host


def _lif():
    return ef.Sequential(lin(I, N, 0, 2.0), L.LIF(N, tau=10.0, surrogate="sigmoid"), lin(N, O, 2))


def test_compile_gives_a_learner_whose_gradient_is_bptts():
    case = Case(_lif, (T, B, I), (T, B, O), 64)
    with case.env():
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        learner = ef.compile(case.model, case.xs[0], mse, algo="d_rtrl")
        assert isinstance(learner, ef.Learner) and learner.is_current()
        assert learner.rules == {"layers.0.weight": "d_rtrl"}
        assert learner.approximations() == {}
        assert "every weight gets its exact (BPTT) gradient" in learner.report()
        grads, losses = learner.grad(case.xs, case.ys)
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        same, _ = ef.sequence_grad(learner, case.xs, case.ys, None)  # a learner where a model goes
    assert_grads_match(grads, case.ref_grads, 1e-8)
    assert_grads_match(same, case.ref_grads, 1e-8)
    np.testing.assert_allclose(np.asarray(losses), case.ref_losses, rtol=1e-12)


def test_bptt_learner_reports_and_is_exact():
    case = Case(_lif, (T, B, I), (T, B, O), 64)
    with case.env():
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        learner = ef.compile(case.model, case.xs[0], mse, algo="bptt")
        grads, _ = learner.grad(case.xs, case.ys)
    assert learner.plan is None and learner.rules == {} and "algo='bptt'" in learner.report()
    assert_grads_match(grads, case.ref_grads, 1e-10)


def test_a_bptt_report_carries_no_online_approximation():
    """Two LIF layers: the online rules approximate the first weight (a later layer's
    memory), and the report said so under BPTT too, then ended "exact gradients"."""
    with brainstate.environ.context(precision=64, dt=1.0):
        model = ef.Sequential(lin(I, N, 0, 2.0), L.LIF(N), lin(N, N, 1), L.LIF(N), lin(N, O, 2))
        brainstate.nn.init_all_states(model, batch_size=B)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ef.ApproximationWarning)
            online = ef.compile(model, jnp.ones((B, I)), mse, algo="d_rtrl").report()
        report = ef.compile(model, jnp.ones((B, I)), mse, algo="bptt").report()
    assert "approximate online gradient [layers.0.weight]" in online  # what BPTT's report must not repeat
    assert "approximate" not in report and report.endswith("algo='bptt': exact gradients, memory grows with T")


def test_the_plan_is_chosen_once_for_every_batch_size():
    """Compiled at batch 8 with a per-sample budget one byte short of D-RTRL: the
    program for batch 2 keeps ES-D-RTRL, as the report says, and so does a plan made at
    batch 2 (the budget is per sample)."""
    with brainstate.environ.context(dt=1.0):
        model = ef.Sequential(L.Linear(6, 8), L.ALIF(8), L.LeakyRateReadout(8, 2))
        brainstate.nn.init_all_states(model, batch_size=8)
        budget = 92 + 72 + (448 - 92) - 1  # bytes per sample: see test_trainer's twin
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ef.ApproximationWarning)
            learner = ef.compile(model, jnp.zeros((8, 6)), mse, memory_budget=budget)
            brainstate.nn.reset_all_states(model, batch_size=2)
            xs, ys = jnp.ones((5, 2, 6)), jnp.zeros((5, 2, 2))
            small = learner.compiled(xs, ys)
            fresh = ef.compile(model, xs[0], mse, memory_budget=budget)
    assert learner.rules == {"layers.0.weight": "esd_rtrl", "layers.2.weight": "d_rtrl"}
    assert [r.name for r in small.plan.rules] == ["esd_rtrl", "d_rtrl"] and small.plan.batch == 8
    assert small.graph.hidden_groups[0].shape == (2, 8)
    assert fresh.rules == learner.rules  # a batch-2 plan chooses the same


def test_a_changed_layer_attribute_is_never_served_a_stale_program():
    """sequence_grad keeps a learner per model, but checks the step before reusing it:
    after v_threshold changes, the gradient is BPTT's for the new threshold."""
    case = Case(_lif, (T, B, I), (T, B, O), 64)
    with case.env():
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        learner = ef.compile(case.model, case.xs[0], mse, algo="d_rtrl")
        before, _ = ef.sequence_grad(case.model, case.xs, case.ys, mse, algo="d_rtrl")
        case.model.layers[1].v_threshold = 0.5
        assert not learner.is_current()
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        after, _ = ef.sequence_grad(case.model, case.xs, case.ys, mse, algo="d_rtrl")
        expected, _ = reference_bptt(case.model, case.xs, case.ys, mse, B)
    assert_grads_match(before, case.ref_grads, 1e-8)
    assert_grads_match(after, expected, 1e-8)
    assert not np.allclose(after[("layers", 0, "weight")]["weight"], before[("layers", 0, "weight")]["weight"])


class _Gain:
    """A setting object of the user's own (no dataclass): followed by its attributes."""

    def __init__(self, value):
        self.value = value


def _swap_surrogate(lif):
    lif.surrogate = L.Triangle(width=0.3)  # surrogates are frozen: annealing a slope swaps them


def _fixed_tau_array(lif):
    lif.tau = L.time_constant(lif, 3.0, N, learn=False)  # a jax array


def _numpy_in_place(lif):
    lif.scale[:] = 0.5  # the same numpy array, changed in place


def _own_object_in_place(lif):
    lif.gain.value = 0.5


CHANGES = {"surrogate swapped": _swap_surrogate, "fixed tau array": _fixed_tau_array,
           "numpy array in place": _numpy_in_place, "own object's attribute": _own_object_in_place}


class _ScaledLIF(L.LIF):
    """The built-in LIF with two settings of the kinds users hold: a numpy array and an
    object of their own, both read by the step."""

    def __init__(self, n, **kwargs):
        super().__init__(n, **kwargs)
        self.scale, self.gain = np.ones(n), _Gain(1.0)

    def update(self, x):
        return super().update(x * jnp.asarray(self.scale) * self.gain.value)


@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("algo", ["d_rtrl", "bptt"])
def test_settings_that_are_not_numbers_are_followed_too(change, algo):
    """A surrogate swapped in, a fixed time constant held as an array, a numpy array or
    an object of the user's changed in place: each changes the step, but only plain
    numbers were compared, so sequence_grad, the Trainer and gradient_fidelity went on
    with the old program (layers.0 weight 0.4–1.9 away from BPTT's), and a held learner
    served it."""
    case = Case(lambda: ef.Sequential(lin(I, N, 0, 2.0), _ScaledLIF(N, tau=5.0), lin(N, O, 2)),
                (T, B, I), (T, B, O), 64)
    with case.env():
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        learner = ef.compile(case.model, case.xs[0], mse, algo=algo)
        before, _ = ef.sequence_grad(case.model, case.xs, case.ys, mse, algo=algo)
        CHANGES[change](case.model.layers[1])
        assert not learner.is_current()
        with pytest.raises(ef.ConfigError, match=r"layers\.1\.(surrogate|tau|scale|gain) changed from .* since the "
                                                 r"model was compiled"):
            learner.grad(case.xs, case.ys)
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        after, _ = ef.sequence_grad(case.model, case.xs, case.ys, mse, algo=algo)
        expected, _ = reference_bptt(case.model, case.xs, case.ys, mse, B)
    assert_grads_match(before, case.ref_grads, 1e-8)
    assert_grads_match(after, expected, 1e-8)
    assert not np.allclose(expected[("layers", 0, "weight")]["weight"], before[("layers", 0, "weight")]["weight"])


def test_an_unchanged_model_keeps_its_learner_whatever_its_settings_hold():
    """Settings compared by value: a numpy array (NaN included), an object, a surrogate
    left alone are no change, so nothing compiles again."""
    with brainstate.environ.context(dt=1.0):
        model = ef.Sequential(lin(I, N, 0, 2.0), _ScaledLIF(N, tau=5.0), lin(N, O, 2))
        model.layers[1].unused = np.array([np.nan, 1.0])
        brainstate.nn.init_all_states(model, batch_size=B)
        learner = ef.compile(model, jnp.zeros((B, I)), mse, algo="d_rtrl")
        assert learner.is_current()
        model.layers[1].scale = np.ones(N)  # another array of the same values
        assert learner.is_current()


def test_trainer_compiles_again_when_the_model_changed_between_fits():
    rng = np.random.default_rng(0)
    x, y = (rng.random((8, 10, I)) < 0.4).astype(np.float32), rng.integers(0, O, 8)
    with brainstate.environ.context(dt=1.0):
        model = _lif()
        trainer = ef.Trainer(model, algo="d_rtrl", optimizer=optax.sgd(1e-3))
        trainer.fit(x, y, batch_size=4, epochs=1, verbose=0)
        first = trainer.learner
        trainer.fit(x, y, batch_size=4, epochs=1, verbose=0)
        assert trainer.learner is first  # unchanged model: the same compiled learner
        model.layers[1].v_threshold = 0.7
        trainer.fit(x, y, batch_size=4, epochs=1, verbose=0)
        assert trainer.learner is not first and trainer.learner.is_current()


def test_compile_argument_errors():
    with brainstate.environ.context(dt=1.0):
        model = _lif()
        brainstate.nn.init_all_states(model, batch_size=B)
        with pytest.raises(ef.ConfigError, match="unknown algo 'rtrl'"):
            ef.compile(model, jnp.zeros((B, I)), mse, algo="rtrl")
        with pytest.raises(ef.ConfigError, match="trace_dtype must be"):
            ef.compile(model, jnp.zeros((B, I)), mse, trace_dtype=jnp.int32)
        learner = ef.compile(model, jnp.zeros((B, I)), algo="d_rtrl")  # no loss: report only
        assert "layers.0.weight" in learner.report()
        with pytest.raises(ef.ConfigError, match="step_loss must be a callable"):
            learner.grad(jnp.zeros((3, B, I)), jnp.zeros((3, B, O)))


def test_a_learner_whose_layer_setting_changed_refuses_to_serve_its_stale_program():
    """learner.grad went on with the old threshold (4.2 away from BPTT's gradient),
    silently, while sequence_grad(model) and the Trainer compiled again."""
    case = Case(_lif, (T, B, I), (T, B, O), 64)
    with case.env():
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        learner = ef.compile(case.model, case.xs[0], mse, algo="d_rtrl")
        learner.grad(case.xs, case.ys)
        state = learner.init(B)
        case.model.layers[1].v_threshold = 0.5
        with pytest.raises(ef.ConfigError, match=r"layers\.1\.v_threshold changed from 1\.0 to 0\.5 since the model "
                                                 r"was compiled, and the compiled step holds the old value; compile it "
                                                 r"again"):
            learner.grad(case.xs, case.ys)
        with pytest.raises(ef.ConfigError, match=r"layers\.1\.v_threshold changed"):
            learner.step(state, case.xs, case.ys)
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        fresh = ef.compile(case.model, case.xs[0], mse, algo="d_rtrl")
        grads, _ = fresh.grad(case.xs, case.ys)
        expected, _ = reference_bptt(case.model, case.xs, case.ys, mse, B)
    assert_grads_match(grads, expected, 1e-8)


def test_learner_calls_check_their_inputs_and_options_as_sequence_grad_does():
    case = Case(_lif, (T, B, I), (T, B, O), 64)
    with case.env():
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        learner = ef.compile(case.model, case.xs[0], mse, algo="d_rtrl")
        state = learner.init(B)
        for call, who in ((lambda xs, ys: learner.grad(xs, ys), "learner.grad"),
                          (lambda xs, ys: learner.step(state, xs, ys), "learner.step"),
                          (lambda xs, ys: ef.sequence_grad(learner, xs, ys, None), "sequence_grad")):
            with pytest.raises(ef.ShapeError, match=rf"{who}: targets must have the leading time axis T={T}, got "
                                                    rf"shape \(5, {B}, {O}\)"):
                call(case.xs, case.ys[:5])
            with pytest.raises(ef.ShapeError, match=rf"{who}: xs has no time steps \(T = 0\)"):
                call(case.xs[:0], case.ys[:0])
        with pytest.raises(ef.ConfigError, match=r"algo='esd_rtrl' given with a compiled learner, whose options were "
                                                 r"fixed by ef\.compile \('d_rtrl'\)"):
            ef.sequence_grad(learner, case.xs, case.ys, None, algo="esd_rtrl")
        weights = dict(state.weights)
        weights.pop("layers.2.weight")
        with pytest.raises(ef.ConfigError, match=r"learner\.step: state\.weights lacks layers\.2\.weight"):
            learner.step(state._replace(weights=weights), case.xs, case.ys)


@pytest.mark.parametrize("before", ["dropout", "batchnorm"])
def test_learner_step_reads_the_batch_off_a_hidden_state_not_a_key_or_statistics(before):
    """The batch check read the first state leaf with an axis: the dropout key (2,) or
    the running statistics (N,) refused every batch of another size."""
    with brainstate.environ.context(dt=1.0):
        middle = L.Dropout(0.2) if before == "dropout" else L.BatchNorm1d(N)
        model = ef.Sequential(L.Linear(I, N), middle, L.LIF(N), L.LeakyRateReadout(N, O))
        brainstate.nn.init_all_states(model, batch_size=3)
        xs, ys = jnp.ones((4, 3, I)), jnp.zeros((4, 3, O))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ef.ApproximationWarning)
            learner = ef.compile(model, xs[0], mse, algo="d_rtrl")
        grads, losses, _ = learner.step(learner.init(3), xs, ys)
        assert losses.shape == (4,) and set(grads) == set(learner.init(3).weights)
        with pytest.raises(ef.ShapeError, match=r"learner\.step: xs has 3 sequences per step but the state was made "
                                                r"for 5 \(learner\.init\(5\)\)"):
            learner.step(learner.init(5), xs, ys)


def test_a_changed_time_step_is_followed_like_a_layer_setting():
    """``brainstate.environ.set(dt=...)`` after a Trainer or learner compiled: the LIF's
    decay is baked into their programs, and predict served the old dt's outputs,
    silently. The Trainer compiles again, a held learner refuses, ``sequence_grad``
    compiles again."""
    rng = np.random.default_rng(0)
    x = (rng.random((8, 10, I)) < 0.4).astype(np.float32)
    with brainstate.environ.context(dt=1.0):
        model = _lif()
        trainer = ef.Trainer(model, algo="d_rtrl", optimizer=optax.sgd(0.1))
        before = trainer.predict(x, verbose=0)
        brainstate.nn.init_all_states(model, batch_size=B)
        xs, ys = jnp.asarray(x[:B].swapaxes(0, 1)), jnp.zeros((10, B, O))
        learner = ef.compile(model, xs[0], mse, algo="d_rtrl")
        grads_1, _ = ef.sequence_grad(model, xs, ys, mse, algo="d_rtrl")
        with brainstate.environ.context(dt=0.5):
            after = trainer.predict(x, verbose=0)
            fresh = ef.Trainer(model, algo="d_rtrl", optimizer=optax.sgd(0.1)).predict(x, verbose=0)
            brainstate.nn.init_all_states(model, batch_size=B)
            with pytest.raises(ef.ConfigError, match=r"brainstate\.environ\.dt changed from 1\.0 to 0\.5 since the "
                                                     r"model was compiled"):
                learner.grad(xs, ys)
            grads_half, _ = ef.sequence_grad(model, xs, ys, mse, algo="d_rtrl")
            expected, _ = reference_bptt(model, xs, ys, mse, B)
    np.testing.assert_array_equal(after, fresh)
    assert not np.allclose(after, before)
    assert_grads_match(to_host(grads_half), expected, 1e-4)
    # dt unset after the block is no change: the learner runs what it compiled with dt = 1
    with brainstate.environ.context(dt=1.0):
        brainstate.nn.init_all_states(model, batch_size=B)
        held = ef.compile(model, xs[0], mse, algo="d_rtrl")
        inside, _ = held.grad(xs, ys)
        brainstate.nn.reset_all_states(model, batch_size=B)  # grad goes on from the states it finds
    outside, _ = held.grad(xs, ys)
    for a, b in zip(jax.tree.leaves(outside), jax.tree.leaves(inside)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.allclose(leaves_by_name(to_host(grads_1))["layers.0.weight['weight']"],
                           leaves_by_name(expected)["layers.0.weight['weight']"])


def test_the_trainer_follows_a_changed_layer_setting_in_every_call():
    """predict and evaluate served the old threshold's programs after it changed: the
    same outputs, silently. A callback that anneals the threshold during fit is followed
    from the next batch."""
    rng = np.random.default_rng(0)
    x, y = (rng.random((8, 10, I)) < 0.4).astype(np.float32), rng.integers(0, O, 8)
    with brainstate.environ.context(dt=1.0):
        model = _lif()
        trainer = ef.Trainer(model, algo="d_rtrl", optimizer=optax.sgd(0.1))
        before = (trainer.predict(x, verbose=0), trainer.evaluate(x, y, verbose=0)["loss"])
        model.layers[1].v_threshold = 0.3
        after = (trainer.predict(x, verbose=0), trainer.evaluate(x, y, verbose=0)["loss"])
        fresh = ef.Trainer(model, algo="d_rtrl", optimizer=optax.sgd(0.1))
        np.testing.assert_array_equal(after[0], fresh.predict(x, verbose=0))
        assert after[1] == fresh.evaluate(x, y, verbose=0)["loss"] and after[1] != before[1]
        assert not np.allclose(after[0], before[0])
        # Annealed by a callback before the second batch: the same as setting it between two fits.
        annealed = ef.Trainer(_lif(), algo="d_rtrl", optimizer=optax.sgd(0.1))
        anneal = ef.callbacks.LambdaCallback(on_train_batch_begin=lambda batch, logs: setattr(
            annealed.model.layers[1], "v_threshold", 0.3) if batch == 1 else None)
        annealed.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0, callbacks=[anneal])
        twice_model = _lif()  # SGD keeps no state: a new trainer (a fresh compile) per batch is the reference
        ef.Trainer(twice_model, algo="d_rtrl", optimizer=optax.sgd(0.1)).train_on_batch(x[:4], y[:4])
        twice_model.layers[1].v_threshold = 0.3
        twice = ef.Trainer(twice_model, algo="d_rtrl", optimizer=optax.sgd(0.1))
        twice.train_on_batch(x[4:], y[4:])
        never = ef.Trainer(_lif(), algo="d_rtrl", optimizer=optax.sgd(0.1))
        never.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(jax.tree.leaves(annealed.get_weights()), jax.tree.leaves(twice.get_weights())):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    assert not all(np.allclose(np.asarray(a), np.asarray(b)) for a, b in
                   zip(jax.tree.leaves(annealed.get_weights()), jax.tree.leaves(never.get_weights())))


def _inputs(precision=64):
    rng = np.random.default_rng(3)
    dtype = np.float64 if precision == 64 else np.float32
    return jnp.asarray(rng.random((T, B, I)), dtype), jnp.asarray(rng.standard_normal((T, B, O)), dtype)


def test_a_rule_dict_in_another_order_is_another_plan():
    """The cache key sorted the dict, while the first matching pattern decides: the
    reversed dict silently reused the first one's ES-D-RTRL plan (1.5 off D-RTRL)."""
    with brainstate.environ.context(precision=64, dt=1.0):
        model = _lif()
        brainstate.nn.init_all_states(model, batch_size=B)
        xs, ys = _inputs()
        first = {"layers.*": "esd_rtrl", "layers.0.*": "d_rtrl"}
        grads = {}
        for name, algo in (("esd", first), ("d", dict(reversed(first.items()))), ("direct", "d_rtrl")):
            brainstate.nn.reset_all_states(model, batch_size=B)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ef.ApproximationWarning)
                grads[name] = np.asarray(ef.sequence_grad(model, xs, ys, mse, algo=algo)[0][("layers", 0, "weight")]
                                         ["weight"])
    np.testing.assert_array_equal(grads["d"], grads["direct"])
    assert not np.allclose(grads["esd"], grads["d"])


def test_gradient_fidelity_gives_both_runs_the_same_dropout_masks_and_puts_the_key_back():
    """The online run moved the dropout key on, so the BPTT reference drew other masks:
    D-RTRL, exact here, read cosine 0.86."""
    with brainstate.environ.context(precision=64, dt=1.0):
        brainstate.random.seed(0)
        model = ef.Sequential(lin(I, N, 0, 2.0), L.Dropout(0.3), L.LIF(N, tau=10.0, surrogate="sigmoid"), lin(N, O, 2))
        brainstate.nn.init_all_states(model, batch_size=B)
        xs, ys = _inputs()
        keys = lambda: [np.asarray(s.value) for s in model.states().values() if isinstance(s, DropoutKey)]  # noqa: E731
        before = keys()
        fidelity = ef.gradient_fidelity(model, xs, ys, mse, algo="d_rtrl")
        assert before and all(np.array_equal(a, b) for a, b in zip(before, keys()))
    for path, f in fidelity.items():
        assert f.cosine == pytest.approx(1.0, abs=1e-9) and f.norm_ratio == pytest.approx(1.0, rel=1e-9), path


def test_a_replaced_readout_is_compiled_again_and_a_held_learner_refuses_it():
    """A LeakyRateReadout replaced by one of another τ: its decay is a constant the
    jaxpr's text does not show, so e-prop went on with the old one (0.34 off), and a held
    learner failed with a KeyError or blamed the input shape."""
    def model(tau):
        return ef.Sequential(lin(I, N, 0, 2.0), L.LIF(N, tau=10.0, surrogate="sigmoid"),
                             L.LeakyRateReadout(N, O, tau=tau))

    with brainstate.environ.context(precision=64, dt=1.0):
        xs, ys = _inputs()
        swapped = model(4.0)
        brainstate.nn.init_all_states(swapped, batch_size=B)
        learner = ef.compile(swapped, xs[0], mse, algo="eprop")
        ef.sequence_grad(swapped, xs, ys, mse, algo="eprop")
        fresh = model(20.0)
        swapped.layers[2] = fresh.layers[2]
        brainstate.nn.init_all_states(swapped, batch_size=B)
        brainstate.nn.init_all_states(fresh, batch_size=B)
        assert not learner.is_current()
        for call in (lambda: learner.grad(xs, ys), lambda: learner.init(B)):
            with pytest.raises(ef.ConfigError, match=r"layers\.2 is not the layer object the step was compiled with"):
                call()
        after = ef.sequence_grad(swapped, xs, ys, mse, algo="eprop")[0]
        brainstate.nn.reset_all_states(fresh, batch_size=B)
        expected = ef.sequence_grad(fresh, xs, ys, mse, algo="eprop")[0]
    for path in expected:
        for a, b in zip(jax.tree.leaves(after[path]), jax.tree.leaves(expected[path])):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-14)


def test_a_stream_state_without_this_learners_traces_is_refused():
    """A BPTT learner's state (no traces) given to a D-RTRL learner gave zero gradients."""
    with brainstate.environ.context(precision=64, dt=1.0):
        model = _lif()
        brainstate.nn.init_all_states(model, batch_size=B)
        xs, ys = _inputs()
        online = ef.compile(model, xs[0], mse, algo="d_rtrl")
        bptt = ef.compile(model, xs[0], mse, algo="bptt")
        for state in (bptt.init(B), online.init(B)._replace(traces=[])):
            with pytest.raises(ef.ConfigError, match=r"learner.step: state.traces holds 0 traced pair\(s\), this "
                                                     r"learner has 1 \('d_rtrl'\)"):
                online.step(state, xs, ys)
        grads, _, _ = online.step(online.init(B), xs, ys)
    assert float(jnp.abs(grads["layers.0.weight"]["weight"]).max()) > 0


def test_a_bptt_learners_step_takes_active_and_online_fit_names_what_optimizer_it_takes():
    """``learner.step(..., active=)`` raised a TypeError from inside BPTT's program;
    ``online_fit(..., "adam")`` an AttributeError deep inside."""
    with brainstate.environ.context(precision=64, dt=1.0):
        model = _lif()
        brainstate.nn.init_all_states(model, batch_size=B)
        xs, ys = _inputs()
        active = np.zeros(T, bool)
        active[[4, T - 1]] = True
        ys = ys * jnp.asarray(active, ys.dtype)[:, None, None]  # no loss where inactive (what active promises)
        for algo in ("bptt", "tbptt:5"):
            learner = ef.compile(model, xs[0], mse, algo=algo)
            with_active = learner.step(learner.init(B), xs, ys, active=active)[0]
            without = learner.step(learner.init(B), xs, ys)[0]
            jax.tree.map(np.testing.assert_array_equal, with_active, without)
        with pytest.raises(ef.ConfigError, match=r"online_fit takes an optax optimizer \(optax.adam\(1e-3\)\), got "
                                                 r"'adam' \(the Trainer takes names\)"):
            ef.online_fit(model, xs, ys, mse, "adam", update_every=5, algo="d_rtrl")


class _SharedTwoCalls(brainstate.nn.Module):
    """One Linear called twice, into two LIF layers."""

    def __init__(self):
        super().__init__()
        self.lin, self.a, self.b, self.out = lin(I, N, 0, 2.0), L.LIF(N, tau=5.0), L.LIF(N, tau=3.0), lin(N, O, 2)

    def update(self, x):
        return self.out(self.a(self.lin(x)) + self.b(self.lin(-x)))


def test_rules_name_every_rule_a_weight_used_twice_gets():
    """Under a budget the two uses get D-RTRL and ES-D-RTRL; ``rules`` gave the last one's."""
    with brainstate.environ.context(dt=1.0):
        model = _SharedTwoCalls()
        brainstate.nn.init_all_states(model, batch_size=B)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ef.ApproximationWarning)
            budgeted = ef.compile(model, jnp.ones((B, I)), mse, algo="hybrid", memory_budget=250)
            exact = ef.compile(model, jnp.ones((B, I)), mse, algo="d_rtrl")
    assert budgeted.rules == {"lin.weight": "d_rtrl+esd_rtrl"} and exact.rules == {"lin.weight": "d_rtrl"}


def test_an_unbatched_model_whose_units_read_as_its_batch_gets_a_shape_error_naming_the_group():
    """xs (T, I) with I = N passed the batch-axis check (N read as B) and every online
    rule failed with an IndexError inside the planner."""
    with brainstate.environ.context(dt=1.0):
        model = ef.Sequential(lin(I, I, 0), L.LIF(I), lin(I, O, 2))
        brainstate.nn.init_all_states(model)  # unbatched
        xs, ys = jnp.ones((T, I)), jnp.zeros((T, O))
        for algo in ("d_rtrl", "esd_rtrl", "hybrid"):
            with pytest.raises(ef.ShapeError, match=r"hidden state layers\.1\.V has shape \(4,\), its layer's units, "
                                                    r"without a batch axis: the online rules need hidden states of "
                                                    r"shape \(batch, units...\)"):
                ef.sequence_grad(model, xs, ys, mse, algo=algo)
        ef.sequence_grad(model, xs, ys, mse, algo="bptt")  # BPTT takes it


def test_a_rule_pattern_that_decides_no_traced_weight_warns():
    """A pattern matching only a weight that drives no hidden state, or one whose weights
    an earlier pattern decided, did nothing, silently (one matching no weight is refused)."""
    with brainstate.environ.context(dt=1.0):
        model = _lif()
        brainstate.nn.init_all_states(model, batch_size=B)
        example = jnp.ones((B, I))
        for algo, dead in (({"layers.2.*": "esd_rtrl"}, "'layers.2.*'"),
                           ({"layers.*": "esd_rtrl", "layers.0.*": "d_rtrl"}, "'layers.0.*'")):
            with pytest.warns(UserWarning, match=rf"algo pattern\(s\) {re.escape(dead)} decide no traced weight's rule"
                                                 rf".*traced weights: layers\.0\.weight"):
                ef.compile(model, example, mse, algo=algo)
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            warnings.simplefilter("ignore", ef.ApproximationWarning)  # (ES-D-RTRL's, expected)
            ef.compile(model, example, mse, algo={"layers.0.*": "esd_rtrl"})

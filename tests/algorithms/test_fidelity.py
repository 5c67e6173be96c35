"""``gradient_fidelity``, the plan's approximation report, the ApproximationWarning and
the ``GradientFidelity`` callback (etrace_fit/algorithms/fidelity.py)."""

from __future__ import annotations

import math
import warnings

import brainstate
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.algorithms.fidelity import _compare
from etrace_fit.callbacks import GradientFidelity, LambdaCallback

from ._helpers import B, I, N, O, T, Case, cosine, leaves_by_name, lin, mse, online_grads


def _two_lif():
    return ef.Sequential(lin(I, N, 0, 2.0), L.LIF(N, tau=10.0, surrogate="sigmoid"), lin(N, N, 4, 2.0),
                         L.LIF(N, tau=20.0, surrogate="sigmoid"), lin(N, O, 2))


def _lif():
    return ef.Sequential(lin(I, N, 0, 2.0), L.LIF(N, tau=10.0, surrogate="sigmoid"), lin(N, O, 2))


def test_compare_edge_cases():
    assert _compare(np.ones(3), np.ones(3) * 2) == pytest.approx((1.0, 0.5))
    assert _compare(np.zeros(3), np.zeros(3)) == (1.0, 1.0)
    assert _compare(np.ones(3), np.zeros(3)) == (0.0, math.inf)
    assert _compare(np.zeros(3), np.ones(3)) == (0.0, 0.0)
    assert _compare(np.array([1.0, 0]), np.array([0, 1.0])).cosine == 0.0


def test_fidelity_is_one_where_d_rtrl_is_exact_and_states_are_kept():
    case = Case(_lif, (T, B, I), (T, B, O), 64)
    with case.env():
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        hidden = case.model.states(brainstate.HiddenState)
        for state in hidden.values():
            state.value = state.value + 0.25
        before = {path: np.asarray(state.value) for path, state in hidden.items()}
        measured = ef.gradient_fidelity(case.model, case.xs, case.ys, mse, algo="d_rtrl")
        after = {path: np.asarray(state.value) for path, state in hidden.items()}
    assert list(measured) == ["layers.0.weight", "layers.2.weight"]
    for path, (cos, ratio) in measured.items():
        assert cos > 1 - 1e-10 and abs(ratio - 1) < 1e-8, (path, cos, ratio)
    for path in before:
        np.testing.assert_array_equal(after[path], before[path])


def test_fidelity_measures_the_dropped_later_memory_path():
    """Against an independent BPTT (brainstate.transform.grad over for_loop)."""
    case = Case(_two_lif, (T, B, I), (T, B, O), 64)
    with case.env():
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        measured = ef.gradient_fidelity(case.model, case.xs, case.ys, mse, algo="d_rtrl")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ef.ApproximationWarning)
            grads, _ = online_grads(case.model, case.xs, case.ys, mse, B, algo="d_rtrl")
    online, ref = leaves_by_name({k: v for k, v in grads.items()}), leaves_by_name(case.ref_grads)
    flat = lambda d, p: np.concatenate([d[k].ravel() for k in sorted(d) if k.startswith(p + "[")])
    expected = cosine(flat(online, "layers.0.weight"), flat(ref, "layers.0.weight"))
    assert measured["layers.0.weight"].cosine == pytest.approx(expected, abs=1e-10)
    assert measured["layers.0.weight"].cosine < 0.99 and measured["layers.0.weight"].norm_ratio < 0.9
    assert measured["layers.4.weight"].cosine > 1 - 1e-10  # the stateless readout is exact


def test_plan_report_names_approximate_weights_and_why():
    case = Case(_two_lif, (T, B, I), (T, B, O), 64)
    with case.env(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, plan = ef.algorithms.plan_for(case.model, case.xs, case.ys, mse, algo="d_rtrl")
    assert set(plan.approximations()) == {"layers.0.weight"}
    assert "memory of (layers.3.V)" in plan.approximations()["layers.0.weight"][0]
    report = plan.report()
    assert "approximate online gradients" in report and "layers.0.weight: layers.0.weight also shapes" in report
    rows = {line.split("|")[0].strip(): line.split("|")[-1].strip() for line in report.splitlines()
            if line.startswith("layers.") and line.count("|") == 5}
    assert rows == {"layers.0.weight": "approximate", "layers.2.weight": "exact"}
    named = [str(w.message) for w in caught if issubclass(w.category, ef.ApproximationWarning)]
    assert len(named) == 1 and named[0].startswith("the online gradient of layers.0.weight is approximate")


def test_plan_report_says_every_gradient_is_exact():
    case = Case(_lif, (T, B, I), (T, B, O), 64)
    with case.env():
        _, plan = ef.algorithms.plan_for(case.model, case.xs, case.ys, mse, algo="d_rtrl")
    assert plan.approximations() == {}
    assert "every weight gets its exact (BPTT) gradient" in plan.report()


def test_gradient_fidelity_callback_logs_to_history_and_later_callbacks():
    rng = np.random.default_rng(0)
    x = (rng.random((8, 12, I)) < 0.4).astype(np.float32)
    y = rng.integers(0, O, 8)
    with brainstate.environ.context(dt=1.0):
        model = _two_lif()
        trainer = ef.Trainer(model, algo="d_rtrl", optimizer=optax.sgd(1e-3), loss_on="all")
        seen = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ef.ApproximationWarning)
            history = trainer.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[
                GradientFidelity(x[:4], y[:4], every_n_epochs=2),
                LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append(sorted(logs)))])
    keys = {f"fidelity_{m}/{p}" for m in ("cosine", "norm_ratio")
            for p in ("layers.0.weight", "layers.2.weight", "layers.4.weight")}
    assert all(len(history.history[k]) == 1 for k in keys)  # after epoch 2 only
    assert keys <= set(seen[1]) and not keys & set(seen[0])
    assert 0 < history.history["fidelity_cosine/layers.0.weight"][0] < 1
    assert history.history["fidelity_cosine/layers.4.weight"][0] == pytest.approx(1.0, abs=1e-5)


def test_gradient_fidelity_callback_checks_its_argument():
    with pytest.raises(ef.ConfigError, match="every_n_epochs must be a positive int, got 0"):
        GradientFidelity(np.zeros((1, 2, 3)), every_n_epochs=0)


def test_fidelity_of_a_learner_uses_its_rules_and_loss():
    case = Case(_two_lif, (T, B, I), (T, B, O), 64)
    with case.env(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        learner = ef.compile(case.model, case.xs[0], mse, algo="d_rtrl")
        from_learner = ef.gradient_fidelity(learner, case.xs, case.ys)
        from_model = ef.gradient_fidelity(case.model, case.xs, case.ys, mse, algo="d_rtrl")
    assert from_learner.keys() == from_model.keys()
    for path in from_model:
        assert from_learner[path] == pytest.approx(from_model[path], abs=1e-12), path

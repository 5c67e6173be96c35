"""BatchNorm and GroupNorm: forward passes against numpy references written here; batch
statistics in training and running statistics in evaluation (Keras' semantics); the
running statistics carried across batches, checkpointed and resumed exactly; the online
rules exact where nothing trainable reaches a neuron through the norm, and the compiler
naming the approximation where something does (float64, against BPTT)."""

from __future__ import annotations

import warnings

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.callbacks import BackupAndRestore, LambdaCallback
from etrace_fit.errors import ConfigError, ShapeError

from _killed import killed_before

from ._helpers import check_grads_equal, sequence_grads

pytestmark = pytest.mark.filterwarnings("ignore::etrace_fit.errors.ApproximationWarning")


def test_group_norm_normalises_each_sample_over_space_and_the_group_channels():
    x = np.random.default_rng(0).normal(2.0, 3.0, size=(3, 5, 6))
    norm = L.GroupNorm(2, 6, eps=1e-5)
    out = np.asarray(norm(jnp.asarray(x)))
    g = x.reshape(3, 5, 2, 3)
    mean = g.mean(axis=(1, 3), keepdims=True)
    var = g.var(axis=(1, 3), keepdims=True)
    np.testing.assert_allclose(out, ((g - mean) / np.sqrt(var + 1e-5)).reshape(3, 5, 6), rtol=1e-4, atol=1e-5)


def test_group_norm_arguments_are_checked():
    with pytest.raises(ConfigError, match=r"GroupNorm\(4, 6\): 6 channels do not split into 4 groups"):
        L.GroupNorm(4, 6)
    with pytest.raises(ConfigError, match="groups must be a positive int"):
        L.GroupNorm(0, 6)
    with pytest.raises(ShapeError, match=r"GroupNorm\(2, 6\).*expected \(B, \.\.\., 6\)"):
        L.GroupNorm(2, 6)(jnp.ones((6,)))


def _step(layer, x, fit):
    with brainstate.environ.context(fit=fit):
        return np.asarray(layer(jnp.asarray(x)))


def test_batch_norm_uses_the_batch_in_training_and_the_running_statistics_in_evaluation():
    rng = np.random.default_rng(1)
    x = rng.normal(3.0, 2.0, size=(8, 4, 5)).astype(np.float32)
    norm = L.BatchNorm1d(5, momentum=0.9, eps=1e-3)
    out = _step(norm, x, fit=True)
    mean, var = x.mean(axis=(0, 1)), x.var(axis=(0, 1))
    np.testing.assert_allclose(out, (x - mean) / np.sqrt(var + 1e-3), rtol=1e-4, atol=1e-4)
    stats = norm.stats.value
    np.testing.assert_allclose(stats["mean"], 0.1 * mean, rtol=1e-5)
    np.testing.assert_allclose(stats["var"], 0.9 + 0.1 * var * 32 / 31, rtol=1e-5)  # unbiased, as Keras
    before = jax.tree.map(np.asarray, norm.stats.value)
    evaluated = _step(norm, x, fit=False)
    np.testing.assert_allclose(evaluated, (x - before["mean"]) / np.sqrt(before["var"] + 1e-3), rtol=1e-5)
    for key in before:  # evaluation changes nothing
        np.testing.assert_array_equal(np.asarray(norm.stats.value[key]), before[key])


def test_batch_norm_shapes_and_arguments_are_checked():
    with pytest.raises(ShapeError, match=r"BatchNorm2d\(3\): expected \(B, H, W, 3\), got x.shape=\(2, 3\)"):
        _step(L.BatchNorm2d(3), np.ones((2, 3)), fit=True)
    with pytest.raises(ShapeError, match=r"BatchNorm1d\(3\): expected \(B, 3\) or \(B, L, 3\)"):
        _step(L.BatchNorm1d(3), np.ones((2, 2, 2, 3)), fit=True)
    with pytest.raises(ShapeError, match="at least 2 values per channel"):
        _step(L.BatchNorm(3), np.ones((1, 3)), fit=True)
    with pytest.raises(ConfigError, match=r"BatchNorm\(3\): momentum must be in \[0, 1\), got 1.5"):
        L.BatchNorm(3, momentum=1.5)


# ------------------------------------------------------------------ online gradients
def _reference_and_online(model, xs, ys, algo):
    """BPTT through a for_loop in training mode (the running statistics restored) and
    the online rule from the same states."""
    saved = {p: s.value for p, s in model.states(brainstate.LongTermState).items()}

    def restore():
        for p, s in model.states(brainstate.LongTermState).items():
            s.value = saved[p]

    with brainstate.environ.context(fit=True):
        reference = sequence_grads(model, xs, ys, "reference")
    restore()
    brainstate.nn.reset_all_states(model, batch_size=xs.shape[1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ef.ApproximationWarning)
        grads = ef.sequence_grad(model, xs, ys, lambda out, y: jnp.sum((out - y) ** 2), algo=algo)[0]
    restore()
    return reference, grads, [str(w.message) for w in caught if issubclass(w.category, ef.ApproximationWarning)]


@pytest.mark.parametrize("algo", ["d_rtrl", "hybrid"])
def test_a_batch_norm_after_the_neurons_keeps_the_online_rules_exact(env64, algo):
    """``Linear → LIF → BatchNorm1d → Linear``: the norm couples the samples of each step,
    but only after the neurons: the learning signal is pulled back through it exactly."""
    rng = np.random.default_rng(0)
    model = ef.Sequential(L.Linear(4, 6, w_init=rng.normal(0, 1.0, (4, 6))), L.LIF(6, tau=4.0, v_threshold=0.5),
                          L.BatchNorm1d(6), L.Linear(6, 2))
    brainstate.nn.init_all_states(model, batch_size=5)
    xs, ys = jnp.asarray(rng.random((12, 5, 4))), jnp.asarray(rng.normal(size=(12, 5, 2)))
    reference, grads, warned = _reference_and_online(model, xs, ys, algo)
    assert not warned, warned
    check_grads_equal(grads, reference, rtol=1e-9, atol=1e-12)


def test_a_batch_norm_between_a_weight_and_its_neurons_is_named_and_keeps_the_one_step_part(env64):
    """``Linear → BatchNorm1d → LIF``: the compiler names the batch reduction on the
    weight's path; what D-RTRL gives is close to BPTT (the exact one-step part, without
    the history through the norm): cosine measured 0.87, bound 0.8. Every weight is
    drawn here: the readout once came from the global key, so the cosine depended on
    which tests ran before (0.65–0.87, and -0.04 once); over six readout draws it is
    0.80–0.97."""
    rng = np.random.default_rng(2)
    readout = np.random.default_rng(100).normal(0, 1 / np.sqrt(6), (6, 2))
    model = ef.Sequential(L.Linear(4, 6, w_init=rng.normal(0, 1.0, (4, 6))), L.BatchNorm1d(6),
                          L.LIF(6, tau=4.0, v_threshold=0.5), L.Linear(6, 2, w_init=readout))
    brainstate.nn.init_all_states(model, batch_size=5)
    xs, ys = jnp.asarray(rng.random((12, 5, 4))), jnp.asarray(rng.normal(size=(12, 5, 2)))
    reference, grads, warned = _reference_and_online(model, xs, ys, "d_rtrl")
    assert any("layers.0.weight" in w and "which mixes units" in w and "reduce_sum" in w for w in warned), warned
    w, r = (np.asarray(g[("layers", 0, "weight")]["weight"]).ravel() for g in (grads, reference))
    cosine = float(w @ r / np.linalg.norm(w) / np.linalg.norm(r))
    assert 0.8 < cosine < 1 - 1e-6, cosine  # approximate, and not far off
    for path in [("layers", 3, "weight"), ("layers", 1, "scale"), ("layers", 1, "bias")]:
        check_grads_equal({path: grads[path]}, {path: reference[path]}, rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------ the Trainer
def _model():
    rng = np.random.default_rng(0)
    return ef.Sequential(L.Linear(4, 8, w_init=rng.normal(0, 1.5, (4, 8)).astype(np.float32)), L.LIF(8),
                         L.BatchNorm1d(8), L.LeakyRateReadout(8, 2, w_init=rng.normal(0, 0.3, (8, 2)).astype(np.float32)))


def _data():
    from etrace_fit.datasets import rate_discrimination

    return rate_discrimination(24, seq_len=12, num_channels=4, low_rate=0.05, high_rate=0.4, seed=0)


def _weights(trainer):
    return [np.asarray(leaf) for leaf in jax.tree.leaves(trainer.get_weights())]


def test_training_moves_the_running_statistics_evaluation_reads_them(env):
    x, y = _data()
    trainer = ef.Trainer(_model(), optimizer="adam")
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    stats = jax.tree.map(np.asarray, trainer._model.layers[2].stats.value)
    assert np.any(stats["mean"] > 0) and not np.allclose(stats["var"], 1.0)  # the spike rates moved them
    first = trainer.evaluate(x, y, verbose=0)
    assert trainer.evaluate(x, y, verbose=0) == first
    after = jax.tree.map(np.asarray, trainer._model.layers[2].stats.value)
    for key in stats:
        np.testing.assert_array_equal(after[key], stats[key])


def test_resume_with_batch_norm_continues_the_running_statistics_exactly(tmp_path, env):
    x, y = _data()
    straight = ef.Trainer(_model(), optimizer="adam")
    straight.fit(x, y, batch_size=8, epochs=4, verbose=0)
    backup = str(tmp_path / "backup")
    first = ef.Trainer(_model(), optimizer="adam")
    stop = killed_before(2)  # after epochs 0 and 1
    with pytest.raises(KeyboardInterrupt):
        first.fit(x, y, batch_size=8, epochs=4, verbose=0, callbacks=[stop, BackupAndRestore(backup)])
    resumed = ef.Trainer(_model(), optimizer="adam")
    began = []  # the resumed run starts at epoch 2
    record = LambdaCallback(on_epoch_begin=lambda e, logs: began.append(e))
    resumed.fit(x, y, batch_size=8, epochs=4, verbose=0, callbacks=[record, BackupAndRestore(backup)])
    assert began == [2, 3]
    assert resumed.history.history["loss"] == straight.history.history["loss"]
    for a, b in zip(_weights(straight), _weights(resumed)):
        np.testing.assert_array_equal(a, b)
    for key in ("mean", "var"):
        np.testing.assert_array_equal(np.asarray(straight._model.layers[2].stats.value[key]),
                                      np.asarray(resumed._model.layers[2].stats.value[key]))


@pytest.mark.parametrize("norm", [lambda: L.LayerNorm(5), lambda: L.BatchNorm1d(5), lambda: L.GroupNorm(1, 5)],
                         ids=["layer", "batch", "group"])
def test_behind_a_mean_removing_norm_d_rtrl_is_exactly_the_one_step_gradient(env64, norm):
    """The traces follow the sum of a weight's effects over the units the norm mixes;
    a norm that removes the mean makes that sum zero, so what is left is the one-step
    gradient, which truncated BPTT with a window of 1 computes independently, and the
    warning says so."""
    rng = np.random.default_rng(4)
    model = ef.Sequential(L.Linear(3, 5, w_init=rng.normal(size=(3, 5))), norm(),
                          L.LIF(5, tau=5.0, v_threshold=0.5, surrogate="sigmoid"), L.Linear(5, 2))
    brainstate.nn.init_all_states(model, batch_size=3)
    xs, ys = jnp.asarray(rng.normal(size=(20, 3, 3)) + 0.5), jnp.asarray(rng.normal(size=(20, 3, 2)))
    loss = lambda out, y: jnp.sum((out - y) ** 2)  # noqa: E731
    grads = {}
    for algo in ("d_rtrl", "tbptt:1", "bptt"):
        brainstate.nn.reset_all_states(model, batch_size=3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ef.ApproximationWarning)
            grads[algo] = np.asarray(ef.sequence_grad(model, xs, ys, loss, algo=algo)[0][("layers", 0, "weight")]
                                     ["weight"])
        if algo == "d_rtrl":
            assert any("one-step gradient only" in str(w.message) for w in caught)
    np.testing.assert_allclose(grads["d_rtrl"], grads["tbptt:1"], rtol=1e-9, atol=1e-12)
    assert not np.allclose(grads["d_rtrl"], grads["bptt"])  # the history it lacks is real

"""Embedding: rows of the table by id (against numpy indexing), a clear error for float
ids, and the table trained exactly by D-RTRL when its output drives a neuron (float64,
against BPTT through a for_loop)."""

from __future__ import annotations

import warnings

import brainstate
import jax.numpy as jnp
import numpy as np
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.errors import ConfigError

from ._helpers import check_grads_equal, sequence_grads


def test_rows_by_id_with_leading_axes_and_zero_rows_out_of_range():
    table = np.arange(12.0, dtype=np.float32).reshape(4, 3)
    embed = L.Embedding(4, 3, w_init=table)
    ids = np.array([[0, 3], [2, 2]])
    np.testing.assert_array_equal(np.asarray(embed(jnp.asarray(ids))), table[ids])
    np.testing.assert_array_equal(np.asarray(embed(jnp.asarray([4, -1]))), np.zeros((2, 3)))
    assert np.all(np.abs(np.asarray(L.Embedding(5, 8).weight.value["weight"])) <= 0.05)  # Keras' default init


def test_float_ids_and_bad_sizes_are_errors_naming_the_layer():
    with pytest.raises(ConfigError, match=r"Embedding\(4, 3\).*ids must be integers, got float32"):
        L.Embedding(4, 3)(jnp.ones((2,), jnp.float32))
    with pytest.raises(ConfigError, match="Embedding: num_embeddings must be a positive int, got 0"):
        L.Embedding(0, 3)


@pytest.mark.parametrize("algo", ["d_rtrl", "hybrid"])
def test_an_embedding_driving_a_neuron_is_exact_online(env64, algo):
    """``Embedding → LIF → Linear``: the table's output is the neuron's input current,
    related per unit, so D-RTRL gives BPTT's gradient for the table."""
    rng = np.random.default_rng(0)
    model = ef.Sequential(L.Embedding(6, 5, w_init=rng.normal(0, 1.0, (6, 5))), L.LIF(5, tau=4.0, v_threshold=0.5),
                          L.Linear(5, 2))
    brainstate.nn.init_all_states(model, batch_size=3)
    ids = jnp.asarray(rng.integers(0, 6, size=(15, 3)))
    ys = jnp.asarray(rng.normal(size=(15, 3, 2)))
    reference = sequence_grads(model, ids, ys, "reference")
    brainstate.nn.reset_all_states(model, batch_size=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ef.ApproximationWarning)  # the compiler finds nothing approximate
        grads = ef.sequence_grad(model, ids, ys, lambda out, y: jnp.sum((out - y) ** 2), algo=algo)[0]
    check_grads_equal(grads, reference, rtol=1e-9, atol=1e-12)
    table = np.asarray(grads[("layers", 0, "weight")]["weight"])
    unused = sorted(set(range(6)) - set(np.asarray(ids).ravel().tolist()))
    assert all(not table[i].any() for i in unused)  # ids never seen get no gradient


@pytest.mark.parametrize("algo", ["hybrid", "bptt"])
def test_the_trainer_takes_token_ids_as_batch_by_time_as_keras_does(env, algo):
    """Keras feeds an Embedding ``(batch, time)`` integer arrays; so does fit, evaluate
    and predict here (float data still needs its feature axis)."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 10, size=(32, 15)).astype(np.int32)
    y = ((x == 3).sum(axis=1) > 1).astype(np.int32)
    model = ef.Sequential(L.Embedding(10, 16), L.LIF(16, v_threshold=0.3), L.LeakyRateReadout(16, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        trainer = ef.Trainer(model, algo=algo, optimizer="adam", loss="sparse_categorical_crossentropy")
        history = trainer.fit(x, y, batch_size=8, epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    assert set(trainer.evaluate(x, y, verbose=0)) == {"loss", "accuracy"}
    assert trainer.predict(x[:4], verbose=0).shape == (4, 2)
    with pytest.raises(ef.errors.ShapeError, match=r"at least 3 axes, got shape \(8, 15\) \(float32\); only "
                                                   r"integer ids for an Embedding may come as \(batch, time\)"):
        trainer.fit(x.astype(np.float32), y, batch_size=8, epochs=1, verbose=0)

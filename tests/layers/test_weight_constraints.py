"""Keras' ``kernel_constraint`` / ``bias_constraint`` as ``w_constraint=`` / ``b_constraint=``
of the layers with a weight matrix (``etrace_fit.constraints``): the formulas against
Keras' written out in numpy, the names Keras accepts, errors naming the layer and the
argument, and the projection after every update under every rule, inside a sequence
(``update_every``, ``online_fit``), with a mask (a norm counts the connections present)
and through a checkpoint."""

from __future__ import annotations

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit import constraints as C
from etrace_fit import layers as L
from etrace_fit.errors import ConfigError

from ._helpers import fit_inside_sequence

pytestmark = pytest.mark.filterwarnings("ignore::etrace_fit.ApproximationWarning")  # constraints, not gradients

I, H, T, N = 3, 5, 6, 8
STEP = 100.0  # every update adds this to every weight


def _up():
    """An optimizer whose every update is +STEP: every weight's new value is known."""
    return optax.GradientTransformation(lambda params: optax.EmptyState(),
                                        lambda g, state, params=None: (jax.tree.map(
                                            lambda x: jnp.full_like(x, STEP), g), state))


def _data():
    rng = np.random.default_rng(0)
    return (rng.random((N, T, I)) < 0.4).astype(np.float32), rng.integers(0, 2, N)


# Keras' formulas (keras/src/constraints/constraints.py), in float64 numpy.
def _keras_max_norm(w, max_value, axis):
    norms = np.sqrt(np.sum(w ** 2, axis=axis, keepdims=True))
    return w * np.clip(norms, 0, max_value) / (1e-7 + norms)


def _keras_min_max_norm(w, lo, hi, rate, axis):
    norms = np.sqrt(np.sum(w ** 2, axis=axis, keepdims=True))
    return w * (rate * np.clip(norms, lo, hi) + (1 - rate) * norms) / (1e-7 + norms)


def _keras_unit_norm(w, axis):
    return w / (1e-7 + np.sqrt(np.sum(w ** 2, axis=axis, keepdims=True)))


@pytest.mark.parametrize("constraint, reference", [
    (C.NonNeg(), lambda w: w * (w >= 0)),
    (C.MaxNorm(1.5), lambda w: _keras_max_norm(w, 1.5, 0)),
    (C.MaxNorm(0.7, axis=(0, 1, 2)), lambda w: _keras_max_norm(w, 0.7, (0, 1, 2))),
    (C.MinMaxNorm(0.5, 1.0, rate=0.5, axis=1), lambda w: _keras_min_max_norm(w, 0.5, 1.0, 0.5, 1)),
    (C.MinMaxNorm(2.0, 3.0), lambda w: _keras_min_max_norm(w, 2.0, 3.0, 1.0, 0)),
    (C.UnitNorm(axis=-1), lambda w: _keras_unit_norm(w, -1)),
])
def test_each_constraint_is_keras_formula(constraint, reference):
    w = np.random.default_rng(1).normal(size=(3, 2, 4, 5)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(constraint(jnp.asarray(w))), reference(w.astype(np.float64)), rtol=1e-5,
                               atol=1e-6)
    assert repr(constraint).startswith(type(constraint).__name__ + "(")


def test_keras_names_callables_and_bad_values():
    assert C.get("non_neg") == C.NonNeg() and C.get("max_norm") == C.MaxNorm(2.0, 0)
    assert C.get("UNIT_NORM") == C.UnitNorm() and C.get("min_max_norm") == C.MinMaxNorm()
    clip = lambda w: jnp.clip(w, -1, 1)  # noqa: E731
    assert C.get(clip) is clip and C.get(None) is None
    with pytest.raises(ConfigError, match=r"Linear\(3, 5\): w_constraint must be None, a function .* got 'maxnorm'"):
        L.Linear(I, H, w_constraint="maxnorm")
    with pytest.raises(ConfigError, match=r"Conv1d\(3, 5, kernel_size=2\): b_constraint must be None.* got 1.0"):
        L.Conv1d(I, H, 2, b_constraint=1.0)
    with pytest.raises(ConfigError, match=r"w_constraint=UnitNorm is the class: give an instance, UnitNorm\(...\)"):
        L.LeakyRateReadout(H, 2, w_constraint=C.UnitNorm)
    with pytest.raises(ConfigError, match=r"RecurrentALIF\(3, 5\): b_constraint='non_neg' given, but the layer "
                                          r"has no bias \(with_bias=False\)"):
        L.RecurrentALIF(I, H, with_bias=False, b_constraint="non_neg")
    with pytest.raises(ConfigError, match=r"MaxNorm: max_value must be a number >= 0, got -1"):
        C.MaxNorm(-1)
    with pytest.raises(ConfigError, match=r"MinMaxNorm: needs min_value <= max_value and rate <= 1"):
        C.MinMaxNorm(2.0, 1.0)
    with pytest.raises(ConfigError, match=r"UnitNorm: axis must be an int or a sequence of ints, got 'rows'"):
        C.UnitNorm(axis="rows")
    assert type(L.Linear(I, H).weight) is brainstate.ParamState  # no constraint: a plain weight, as before


def _model():
    return ef.Sequential(L.Linear(I, H, w_constraint=C.MaxNorm(1.5), b_constraint=C.UnitNorm()), L.LIF(H),
                         L.LeakyRateReadout(H, 2, w_constraint="non_neg", b_constraint=lambda b: jnp.clip(b, 0, 3)))


def _assert_projected(model, readout_before):
    params = model.layers[0].weight.value
    np.testing.assert_allclose(np.linalg.norm(np.asarray(params["weight"]), axis=0), 1.5, rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(params["bias"])), 1.0, rtol=1e-5)
    readout = model.layers[2].weight.value
    np.testing.assert_allclose(np.asarray(readout["weight"]), readout_before + STEP, rtol=1e-6)  # already >= 0
    np.testing.assert_array_equal(np.asarray(readout["bias"]), 3.0)


@pytest.mark.parametrize("algo", ["d_rtrl", "esd_rtrl", "hybrid", "bptt"])
def test_every_rule_projects_the_layers_constraints_after_an_update(algo):
    x, y = _data()
    with brainstate.environ.context(dt=1.0):
        model = _model()
        before = np.asarray(model.layers[2].weight.value["weight"])
        ef.Trainer(model, algo=algo, optimizer=_up(), loss_on="last").fit(x, y, batch_size=N, epochs=1, verbose=0,
                                                                          shuffle=False)
        _assert_projected(model, before)


def test_update_every_and_online_fit_project_inside_the_sequence():
    x, y = _data()
    with brainstate.environ.context(dt=1.0):
        fit_inside_sequence(_model, _up(), x, y, lambda model: np.asarray(model.layers[2].weight.value["weight"]),
                            _assert_projected)


def test_a_norm_counts_the_connections_present_only():
    """SparseLinear's mask and a recurrent layer without self-connections: the norm is
    that of the connections present (those outside stay zero), as the layer uses it."""
    x, y = _data()
    with brainstate.environ.context(dt=1.0):
        sparse = L.SparseLinear(I, H, density=0.5, seed=3, w_constraint=C.MaxNorm(2.0))
        recurrent = L.RecurrentALIF(H, H, self_connections=False, w_constraint=C.MaxNorm(0.5),
                                    recurrent_constraint=C.UnitNorm())
        model = ef.Sequential(sparse, recurrent, L.LeakyRateReadout(H, 2))
        ef.Trainer(model, algo="hybrid", optimizer=_up(), loss_on="last").fit(x, y, batch_size=N, epochs=1,
                                                                              verbose=0)
    mask = np.asarray(sparse.mask)
    w = np.asarray(sparse.weight.value["weight"])
    np.testing.assert_array_equal(w[mask == 0], 0.0)
    present = mask.any(axis=0)
    np.testing.assert_allclose(np.linalg.norm(w, axis=0)[present], 2.0, rtol=1e-5)
    w = np.asarray(recurrent.W.weight.value["weight"])  # input rows, then recurrent rows (Keras' two kernels)
    np.testing.assert_allclose(np.linalg.norm(w[:H], axis=0), 0.5, rtol=1e-5)
    np.testing.assert_array_equal(np.diagonal(w[H:]), 0.0)
    np.testing.assert_allclose(np.linalg.norm(w[H:], axis=0), 1.0, rtol=1e-5)


def test_a_conv_kernels_norm_per_output_channel():
    """Keras' conv convention: ``axis=(0, 1, 2)`` of a ``(kh, kw, in, out)`` kernel, one
    norm per output channel."""
    rng = np.random.default_rng(0)
    x = (rng.random((4, 3, 6, 6, 2)) < 0.3).astype(np.float32)
    y = rng.integers(0, 2, 4)
    with brainstate.environ.context(dt=1.0):
        conv = L.Conv2d(2, 3, 3, w_constraint=C.MaxNorm(0.5, axis=(0, 1, 2)))
        model = ef.Sequential(conv, L.LIF((6, 6, 3)), L.Flatten(), L.LeakyRateReadout(108, 2))
        ef.Trainer(model, algo="bptt", optimizer=_up(), loss_on="last").fit(x, y, batch_size=4, epochs=1, verbose=0)
    kernel = np.asarray(conv.weight.value["weight"])
    np.testing.assert_allclose(np.sqrt((kernel ** 2).sum(axis=(0, 1, 2))), 0.5, rtol=1e-5)


def test_a_constrained_layer_keeps_its_projection_through_a_checkpoint(tmp_path):
    """Saved and loaded, the weights are the projected ones and the loaded layer still
    projects (the constraint belongs to the layer, not to the file)."""
    x, y = _data()
    with brainstate.environ.context(dt=1.0):
        model = _model()
        trainer = ef.Trainer(model, algo="hybrid", optimizer=_up(), loss_on="last")
        trainer.fit(x, y, batch_size=N, epochs=1, verbose=0)
        trainer.save_weights(tmp_path / "w.ckpt")
        other = _model()
        again = ef.Trainer(other, algo="hybrid", optimizer=_up(), loss_on="last")
        again.load_weights(tmp_path / "w.ckpt")
        np.testing.assert_allclose(np.asarray(other.layers[0].weight.value["weight"]),
                                   np.asarray(model.layers[0].weight.value["weight"]))
        again.fit(x, y, batch_size=N, epochs=1, verbose=0)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(other.layers[0].weight.value["weight"]), axis=0), 1.5,
                               rtol=1e-5)


CELLS = ["VanillaRNNCell", "GRUCell", "LSTMCell", "URLSTMCell", "MinGRUCell", "MinLSTMCell", "MGUCell",
         "MinimalRNNCell"]


@pytest.mark.parametrize("name", CELLS)
def test_every_rnn_cell_projects_each_gate_weights_input_and_state_rows(name):
    """Keras' three constraints of a cell: ``w_constraint`` (its ``kernel_constraint``) on
    each gate's rows that read the input, ``recurrent_constraint`` on those that read the
    state, ``b_constraint`` on the biases; a cell whose gates read the input only refuses
    a recurrent one; a bad one names the cell."""
    x, y = _data()
    recurrent = name not in ("MinGRUCell", "MinLSTMCell")
    with brainstate.environ.context(dt=1.0):
        cell = getattr(L, name)(I, H, w_constraint=C.MaxNorm(1.5), b_constraint=C.MaxNorm(1.0),
                                recurrent_constraint=C.UnitNorm() if recurrent else None)
        model = ef.Sequential(cell, L.Linear(H, 2))
        ef.Trainer(model, algo="hybrid", optimizer=_up(), loss_on="last").fit(x, y, batch_size=N, epochs=1,
                                                                              verbose=0)
        gates = {path: state.value for path, state in cell.states(brainstate.ParamState).items()}
        assert len(gates) >= 1 and all(set(gate) == {"weight", "bias"} for gate in gates.values())
        for path, gate in gates.items():
            w = np.asarray(gate["weight"])
            if w.shape[0] == I:  # reads the input only
                rows = {"input": w}
            elif name == "MinimalRNNCell":  # W_u on [h, z]
                rows = {"state": w[:H], "input": w[H:]}
            else:  # on [x, h]
                rows = {"input": w[:I], "state": w[I:]}
            assert recurrent or "state" not in rows
            np.testing.assert_allclose(np.linalg.norm(rows["input"], axis=0), 1.5, rtol=1e-5, err_msg=str(path))
            if "state" in rows:
                np.testing.assert_allclose(np.linalg.norm(rows["state"], axis=0), 1.0, rtol=1e-5, err_msg=str(path))
            np.testing.assert_allclose(np.linalg.norm(np.asarray(gate["bias"])), 1.0, rtol=1e-5)
        with pytest.raises(ConfigError, match=rf"{name}\(3, 5\): w_constraint must be None"):
            getattr(L, name)(I, H, w_constraint="maxnorm")
        if not recurrent:
            with pytest.raises(ConfigError, match=rf"{name}\(3, 5\): recurrent_constraint=UnitNorm\(axis=0\) "
                                                  r"given, but the cell's weights read the input only"):
                getattr(L, name)(I, H, recurrent_constraint=C.UnitNorm())


def test_an_embeddings_rows_keep_their_norm():
    """Keras' ``embeddings_constraint``: ``MaxNorm(m, axis=1)`` bounds every row (PyTorch's
    ``max_norm``)."""
    rng = np.random.default_rng(0)
    ids, y = rng.integers(0, 7, (N, T)), rng.integers(0, 2, N)
    with brainstate.environ.context(dt=1.0):
        embed = L.Embedding(7, H, w_constraint=C.MaxNorm(0.25, axis=1))
        model = ef.Sequential(embed, L.LIF(H), L.LeakyRateReadout(H, 2))
        ef.Trainer(model, algo="hybrid", optimizer=_up(), loss_on="last").fit(ids, y, batch_size=N, epochs=1,
                                                                              verbose=0)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(embed.weight.value["weight"]), axis=1), 0.25, rtol=1e-5)
    with pytest.raises(ConfigError, match=r"Embedding\(7, 5\): w_constraint must be None"):
        L.Embedding(7, H, w_constraint="max")

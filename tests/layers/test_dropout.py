"""Dropout: a mask per element, step and sample in training, the identity in evaluation
(as Keras'), the online rules exact against BPTT through the same masks (float64), the
same seed giving the same run, and exact resume with the key in the checkpoint."""

from __future__ import annotations

import warnings

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.callbacks import BackupAndRestore, LambdaCallback
from etrace_fit.errors import CheckpointError, ConfigError

from _killed import killed_before

T, B, I, H, O = 12, 3, 5, 7, 2
# The readout's memory makes the first weight approximate online (the tests say how).
pytestmark = pytest.mark.filterwarnings("ignore::etrace_fit.errors.ApproximationWarning")


def _forward(model, xs, fit):
    brainstate.nn.reset_all_states(model, batch_size=xs.shape[1])
    with brainstate.environ.context(fit=fit):
        return np.asarray(brainstate.transform.for_loop(model, jnp.asarray(xs)))


def test_training_drops_each_element_step_and_sample_apart_evaluation_is_the_identity():
    with brainstate.environ.context(dt=1.0):
        layer = L.Dropout(0.3, seed=0)
        xs = np.ones((50, 40, 20), np.float32)
        out = _forward(layer, xs, fit=True)
        kept = out != 0
        assert abs(1 - kept.mean() - 0.3) < 0.01  # 40 000 draws
        np.testing.assert_allclose(out[kept], 1 / 0.7, rtol=1e-6)  # survivors scaled, mean kept
        assert not np.array_equal(kept[0], kept[1])  # another mask every step
        assert not np.array_equal(kept[0, 0], kept[0, 1])  # and for every sample
        again = _forward(layer, xs, fit=True)
        assert not np.array_equal(again != 0, kept)  # the key moved on: the next batch draws new masks
        np.testing.assert_array_equal(_forward(layer, xs, fit=False), xs)  # evaluation


def test_broadcast_dims_share_one_mask_value():
    layer = L.Dropout(0.5, seed=1, broadcast_dims=(1,))
    out = _forward(layer, np.ones((4, 6, 3, 8), np.float32), fit=True)
    assert np.all(out == out[:, :, :1, :])  # axis 1 of each step's (B, 3, 8) input shares the mask
    assert 0 < np.mean(out == 0) < 1


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(rate=1.0), r"rate must be a number in \[0, 1\), got 1.0"),
    (dict(rate=-0.1), "rate must be"),
    (dict(rate="0.5"), "rate must be"),
    (dict(rate=0.5, seed="a"), r"Dropout\(0.5\): seed must be an int"),
    (dict(rate=0.5, broadcast_dims=(0,)), "axes after the batch axis"),
])
def test_bad_arguments_name_the_layer_and_the_value(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        L.Dropout(**kwargs)


def test_broadcast_dims_beyond_the_input_is_an_error():
    layer = L.Dropout(0.5, broadcast_dims=(3,))
    with pytest.raises(ConfigError, match=r"Dropout\(0.5\): broadcast_dims \(3,\) on an input of shape \(2, 4\)"):
        with brainstate.environ.context(fit=True):
            layer(jnp.ones((2, 4)))


# ------------------------------------------------------------------ gradients
def _reference(model, xs, ys, loss):
    """BPTT through the same masks: ``brainstate.transform.grad`` of the summed loss over
    a ``for_loop`` in training mode, from the key the online run starts from."""
    params = model.states(brainstate.ParamState)
    key = model.layers[1].key.value

    def total():
        brainstate.nn.reset_all_states(model, batch_size=xs.shape[1])
        model.layers[1].key.value = key
        with brainstate.environ.context(fit=True):
            outs = brainstate.transform.for_loop(model, xs)
        return jax.vmap(loss)(outs, ys).sum()

    grads = brainstate.transform.grad(total, grad_states=params)()
    brainstate.nn.reset_all_states(model, batch_size=xs.shape[1])  # sequence_grad starts from the states held
    model.layers[1].key.value = key
    return grads


@pytest.mark.parametrize("algo", ["d_rtrl", "hybrid", "esd_rtrl"])
def test_online_rules_see_the_masks_as_data_and_match_bptt(algo):
    """Linear → Dropout → LIF → Linear: the mask multiplies each unit's input current, an
    elementwise op, so D-RTRL (and hybrid) equal BPTT through the same masks; ES-D-RTRL
    within the cosine it has without dropout."""
    loss = lambda out, y: jnp.sum((out - y) ** 2)  # noqa: E731
    with brainstate.environ.context(precision=64, dt=1.0):
        rng = np.random.default_rng(0)
        readout = np.random.default_rng(100).normal(0, 1 / np.sqrt(H), (H, O))  # not the global key: order-free
        model = ef.Sequential(L.Linear(I, H, w_init=rng.normal(0, 1.0, (I, H))), L.Dropout(0.4, seed=3),
                              L.LIF(H, tau=4.0, v_threshold=0.5), L.Linear(H, O, w_init=readout))
        brainstate.nn.init_all_states(model, batch_size=B)
        xs = jnp.asarray(rng.random((T, B, I)))
        ys = jnp.asarray(rng.normal(size=(T, B, O)))
        expected = _reference(model, xs, ys, loss)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ef.ApproximationWarning)
            grads = ef.sequence_grad(model, xs, ys, loss, algo=algo)[0]
        without = _reference(ef.Sequential(model.layers[0], L.Dropout(0.0), *model.layers[2:]), xs, ys, loss)
    w = ("layers", 0, "weight")
    assert not np.allclose(np.asarray(expected[w]["weight"]), np.asarray(without[w]["weight"]))  # dropout acts
    for path in expected:
        for leaf, ref in zip(jax.tree.leaves(grads[path]), jax.tree.leaves(expected[path])):
            ref, leaf = np.asarray(ref), np.asarray(leaf)
            assert np.max(np.abs(ref)) > 0, path
            if algo == "esd_rtrl":
                cosine = np.sum(leaf * ref) / np.linalg.norm(leaf) / np.linalg.norm(ref)
                assert cosine > 0.9, (path, cosine)
            else:
                np.testing.assert_allclose(leaf, ref, rtol=1e-9, atol=1e-12, err_msg=str(path))


# ------------------------------------------------------------------ the Trainer
def _model(seed=None):
    rng = np.random.default_rng(0)
    return ef.Sequential(L.Linear(4, 8, w_init=rng.normal(0, 1.5, (4, 8)).astype(np.float32)),
                         L.Dropout(0.3, seed=seed), L.LIF(8),
                         L.LeakyRateReadout(8, 2, w_init=rng.normal(0, 0.3, (8, 2)).astype(np.float32)))


def _data():
    from etrace_fit.datasets import rate_discrimination

    return rate_discrimination(24, seq_len=12, num_channels=4, low_rate=0.05, high_rate=0.4, seed=0)


def _weights(trainer):
    return [np.asarray(leaf) for leaf in jax.tree.leaves(trainer.get_weights())]


def _trainer(model, optimizer="adam"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        return ef.Trainer(model, optimizer=optimizer)


def test_evaluate_and_predict_run_without_dropout_fit_with_it(env):
    x, y = _data()
    trainer = _trainer(_model(seed=0))
    first = trainer.predict(x, verbose=0)
    np.testing.assert_array_equal(first, trainer.predict(x, verbose=0))  # no mask: deterministic
    model = trainer._model
    plain = _trainer(ef.Sequential(model.layers[0], model.layers[2], model.layers[3]))
    np.testing.assert_allclose(plain.predict(x, verbose=0), first, rtol=1e-6)  # the identity
    assert trainer.evaluate(x, y, verbose=0) == trainer.evaluate(x, y, verbose=0)
    # Training at a zero learning rate measures the training loss at the same weights.
    frozen = _trainer(_model(seed=0), optimizer=optax.sgd(0.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        history = frozen.fit(x, y, batch_size=24, epochs=2, verbose=0)
    assert history.history["loss"][0] != history.history["loss"][1]  # new masks each batch
    assert history.history["loss"][0] != pytest.approx(frozen.evaluate(x, y, batch_size=24, verbose=0)["loss"])


def test_the_same_seed_gives_the_same_run_another_seed_another(env):
    x, y = _data()

    def run(seed):
        brainstate.random.seed(seed)
        trainer = _trainer(_model())  # the key from brainstate.random
        trainer.fit(x, y, batch_size=8, epochs=2, verbose=0)
        return trainer.history.history["loss"], _weights(trainer)

    (loss_a, w_a), (loss_b, w_b), (loss_c, _) = run(5), run(5), run(6)
    assert loss_a == loss_b and all(np.array_equal(a, b) for a, b in zip(w_a, w_b))
    assert loss_a != loss_c


def test_resume_from_a_backup_draws_the_masks_of_the_uninterrupted_run(tmp_path, env):
    x, y = _data()
    straight = _trainer(_model(seed=2))
    straight.fit(x, y, batch_size=8, epochs=4, verbose=0)
    backup = str(tmp_path / "backup")
    first = _trainer(_model(seed=2))
    stop = killed_before(2)  # after epochs 0 and 1
    with pytest.raises(KeyboardInterrupt):
        first.fit(x, y, batch_size=8, epochs=4, verbose=0, callbacks=[stop, BackupAndRestore(backup)])
    resumed = _trainer(_model(seed=99))  # another key at construction: the backup's must win
    began = []  # the resumed run starts at epoch 2
    record = LambdaCallback(on_epoch_begin=lambda e, logs: began.append(e))
    resumed.fit(x, y, batch_size=8, epochs=4, verbose=0, callbacks=[record, BackupAndRestore(backup)])
    assert began == [2, 3]
    assert resumed.history.history["loss"] == straight.history.history["loss"]
    for a, b in zip(_weights(straight), _weights(resumed)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(np.asarray(straight._model.layers[1].key.value),
                                  np.asarray(resumed._model.layers[1].key.value))


def test_a_checkpoint_without_the_dropout_key_names_it(tmp_path, env):
    x, y = _data()
    rng = np.random.default_rng(0)
    plain = ef.Sequential(L.Linear(4, 8, w_init=rng.normal(0, 1.5, (4, 8)).astype(np.float32)), L.LIF(8),
                          L.LeakyRateReadout(8, 2))
    trainer = _trainer(plain)
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    trainer.save(tmp_path / "plain.ckpt")
    with_dropout = _trainer(ef.Sequential(L.Linear(4, 8), L.LIF(8), L.LeakyRateReadout(8, 2), L.Dropout(0.1)))
    with pytest.raises(CheckpointError, match=r"missing \['layers.3.key'\]"):
        with_dropout.restore(tmp_path / "plain.ckpt")

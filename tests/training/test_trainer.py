"""Trainer.fit / evaluate / predict on small tasks, and the errors raised before training."""

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.algorithms.hybrid import format_bytes
from etrace_fit.datasets import rate_discrimination
from etrace_fit.errors import ConfigError, ShapeError

C, H, T = 6, 16, 30


def _data(n=96, seed=0):
    return rate_discrimination(n, seq_len=T, num_channels=C, low_rate=0.05, high_rate=0.3, seed=seed)


def _model(seed=0):
    rng = np.random.default_rng(seed)
    return ef.Sequential(
        L.Linear(C, H, w_init=rng.normal(0, 1.5, (C, H)).astype(np.float32)),
        L.LIF(H, tau=10.0),
        L.LeakyRateReadout(H, 2, tau=10.0, w_init=rng.normal(0, 0.3, (H, 2)).astype(np.float32)),
    )


def _weights(model):
    return jax.tree.map(np.asarray, model.states(brainstate.ParamState).to_dict_values())


def test_fit_reduces_the_loss_and_history_has_per_epoch_keys():
    x, y = _data()
    trainer = ef.Trainer(_model(), optimizer=optax.adam(1e-2))
    history = trainer.fit(x, y, batch_size=32, epochs=4, validation_split=0.25, verbose=0)
    assert set(history.history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert all(len(v) == 4 for v in history.history.values()) and history.epoch == [0, 1, 2, 3]
    assert history.history["loss"][-1] < 0.7 * history.history["loss"][0]
    assert history.history["val_accuracy"][-1] > 0.8
    logs = trainer.evaluate(x, y)
    assert set(logs) == {"loss", "accuracy"} and logs["accuracy"] > 0.8


def test_predict_returns_last_step_or_every_step_outputs():
    x, y = _data(10)
    trainer = ef.Trainer(_model())
    trainer.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert trainer.predict(x, batch_size=4).shape == (10, 2)
    assert trainer.predict(x, batch_size=4, last_only=False).shape == (10, T, 2)


def test_loss_on_all_with_per_step_targets_and_mse():
    x, _ = _data(32)
    targets = np.cumsum(x[..., :2], axis=1) * 0.1  # (N, T, 2): a running count per step
    trainer = ef.Trainer(_model(), loss="mse", metrics=["mse"], loss_on="all", optimizer=optax.adam(1e-2))
    history = trainer.fit(x, targets.astype(np.float32), batch_size=16, epochs=3, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    np.testing.assert_allclose(history.history["mse"], history.history["loss"], rtol=0.5)


def test_loss_on_mask_uses_only_marked_steps():
    x, y = _data(16)
    mask = np.zeros((16, T), np.float32)
    mask[:, -5:] = 1.0
    trainer = ef.Trainer(_model(), loss_on="mask")
    trainer.fit([(x, y, mask)], epochs=1, verbose=0)
    with pytest.raises(ShapeError, match="needs \\(x, y, mask\\) batches"):
        ef.Trainer(_model(), loss_on="mask").fit(x, y, epochs=1, verbose=0)


def test_a_metric_placed_by_a_mask_is_an_exact_mean_over_the_marked_steps():
    """placed_metrics over the weights a mask places (mask / count: 5 steps of 0.2,
    which float32 rounds): a metric that is 1 at every marked step reads exactly 1 (it
    read 1.0000015 before), a sequence without marked steps counts 0, and a partly
    right batch gives the mean over sequences of the mean over their marked steps (by
    hand)."""
    from etrace_fit.training.metrics import accuracy
    from etrace_fit.training.step import placed_metrics

    def placed(outputs, mask):
        weight = jnp.asarray(mask / np.maximum(mask.sum(axis=0, keepdims=True), 1.0))
        return float(placed_metrics({"accuracy": accuracy}, outputs, labels, weight)["accuracy"])

    steps, batch = 31, 64
    labels = jnp.zeros((steps, batch), jnp.int32)
    right = jnp.zeros((steps, batch, 3)).at[..., 0].set(1.0)
    mask = np.zeros((steps, batch), np.float32)
    mask[-5:] = 1.0
    assert placed(right, mask) == 1.0
    unmarked = mask.copy()
    unmarked[:, 0] = 0.0  # the first sequence has no marked step: it counts 0
    assert placed(right, unmarked) == float(np.float32(batch - 1) / np.float32(batch))
    wrong_at = np.zeros((steps, batch), bool)
    wrong_at[-1, :batch // 2] = True  # half the sequences wrong at their last step
    outputs = jnp.where(jnp.asarray(wrong_at)[..., None], jnp.zeros(3).at[1].set(1.0), right)
    by_hand = np.mean([np.sum(mask[:, b] * ~wrong_at[:, b]) / np.sum(mask[:, b]) for b in range(batch)])
    assert abs(placed(outputs, mask) - by_hand) < 1e-6


def test_update_every_trains_online_inside_the_sequence():
    x, y = _data(64)
    trainer = ef.Trainer(_model(), optimizer=optax.adam(1e-2), update_every=10)
    history = trainer.fit(x, y, batch_size=32, epochs=3, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(algo="rtrl"), "'d_rtrl', 'esd_rtrl', 'hybrid', 'eprop', 'bptt'"),
    (dict(loss="hinge"), "cross_entropy, sparse_categorical_crossentropy"),
    (dict(metrics=["f1"]), "accuracy, acc, "),
    (dict(loss_on="first"), "last, all, mask"),
    (dict(update_every=0), "update_every"),
])
def test_unknown_names_are_config_errors_listing_the_valid_ones(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        ef.Trainer(_model(), **kwargs)


@pytest.mark.parametrize("change, error, fragment", [
    (lambda x, y: (x[..., :-1], y), ShapeError, "Linear\\(6, 16\\)"),
    (lambda x, y: (x, y + 1), ShapeError, "labels must lie in \\[0, 2\\)"),
    (lambda x, y: (x.at[3, 2, 1].set(np.nan) if hasattr(x, "at") else _nan(x), y), ShapeError, "NaN or inf"),
    (lambda x, y: (x[:0], y[:0]), ShapeError, "empty"),
    (lambda x, y: (x, y[:-1]), ShapeError, "different numbers of samples"),
    (lambda x, y: (x[:, 0], y), ShapeError, "at least 3 axes"),
])
def test_bad_input_raises_before_any_update(change, error, fragment):
    x, y = _data(16)
    model = _model()
    before = _weights(model)
    trainer = ef.Trainer(model)
    bad_x, bad_y = change(x, y)
    with pytest.raises(error, match=fragment):
        trainer.fit(bad_x, bad_y, batch_size=8, epochs=1, verbose=0)
    jax.tree.map(np.testing.assert_array_equal, _weights(model), before)


def _nan(x):
    x = x.copy()
    x[3, 2, 1] = np.nan
    return x


def test_sequence_grad_recompiles_after_states_are_recreated():
    x, y = _data(8)
    model = _model()
    brainstate.nn.init_all_states(model, batch_size=8)
    loss = lambda out, target: optax.softmax_cross_entropy_with_integer_labels(out, target).mean()  # noqa: E731
    xs, ys = jnp.asarray(x.swapaxes(0, 1)), jnp.broadcast_to(jnp.asarray(y), (T, 8))
    first, _ = ef.sequence_grad(model, xs, ys, loss)
    brainstate.nn.init_all_states(model, batch_size=8)  # new HiddenState objects, zero values
    again, _ = ef.sequence_grad(model, xs, ys, loss)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), first, again)
    assert float(jnp.abs(model[1].V.value).sum()) > 0  # the new state objects were written


def test_report_shows_the_rule_per_weight_after_the_first_batch():
    x, y = _data(8)
    trainer = ef.Trainer(_model())
    with pytest.raises(ConfigError, match="call fit first"):
        trainer.report()
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    report = trainer.report()
    assert "layers.0.weight" in report and "trace memory" in report and ("d_rtrl" in report or "esd_rtrl" in report)


def test_report_shows_the_trace_memory_at_the_batch_trained_last():
    """After ``train_on_batch`` of another size (or a fit at another batch size) the
    report says the last batch's trace memory; a fit's smaller last batch does not
    count (its largest batch does). It had shown the compile batch's totals only."""
    x, y = _data(20)
    trainer = ef.Trainer(_model())
    trainer.fit(x, y, batch_size=16, epochs=1, verbose=0)  # batches of 16 and 4
    assert "last training batch" not in trainer.report()
    per_sample = trainer.learner.plan.bytes_per_sample()
    trainer.train_on_batch(x[:4], y[:4])
    assert (f"the last training batch had 4 samples: traces {format_bytes(per_sample * 4)} (the totals above are "
            f"at batch 16") in trainer.report()
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert "the last training batch had 8 samples" in trainer.report()
    trainer.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert "last training batch" not in trainer.report()


def test_a_last_smaller_batch_keeps_the_plan_of_the_first():
    """The budget is per sample, so a last batch of 2 gets the first batch's rules, and
    so does a plan made at batch 2 alone; the report counts totals at the first batch."""
    x, y = _data(10)
    model = ef.Sequential(L.Linear(C, 8), L.ALIF(8), L.LeakyRateReadout(8, 2))
    # per sample: layer 0 D-RTRL 7·8·3·4 = 672 B (ALIF's 2 states and the readout memory),
    # ES (7 + 8·3)·4 = 124 B; the readout's D-RTRL 72 B
    budget = 124 + 72 + (672 - 124) - 1  # one byte short of moving layer 0
    trainer = ef.Trainer(model, algo="hybrid", memory_budget=budget)
    with pytest.warns(ef.ApproximationWarning):
        trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert trainer.rules == {"layers.0.weight": "esd_rtrl", "layers.2.weight": "d_rtrl"}
    xs, ys, weight = trainer._time_major(ef.training.data.Batch(x[8:], y[8:]))
    last = trainer._compiled(xs, ys, weight)
    assert xs.shape[1] == 2 and [r.name for r in last.plan.rules] == ["esd_rtrl", "d_rtrl"]
    assert last.plan.batch == 8
    alone = ef.algorithms.compile_sequence(model, xs, (ys, weight), trainer._step_loss, memory_budget=budget)
    assert [r.name for r in alone.plan.rules] == ["esd_rtrl", "d_rtrl"] and alone.plan.batch == 2
    more = ef.algorithms.compile_sequence(model, xs, (ys, weight), trainer._step_loss, memory_budget=budget + 1)
    assert [r.name for r in more.plan.rules] == ["d_rtrl", "d_rtrl"]  # the test can tell the difference


def test_a_mask_for_array_data_keeps_padding_out_of_the_gradient():
    """fit(..., mask=) with loss_on="mask": whatever the padding holds, the weights after
    training are the same (the loss and so the gradient see the real steps only), and
    evaluate(..., mask=) agrees; a mask with another placement is refused."""
    from etrace_fit.datasets import pad_sequences

    rng = np.random.default_rng(0)
    seqs = [rng.normal(size=(int(rng.integers(5, 12)), 3)).astype(np.float32) for _ in range(16)]
    x, mask = pad_sequences(seqs)
    garbage = np.where(mask[..., None], x, rng.normal(0, 50.0, x.shape).astype(np.float32))
    y = rng.integers(0, 2, (16,))
    results = []
    for data in (x, garbage):
        brainstate.random.seed(0)
        trainer = ef.Trainer(ef.Sequential(L.GRUCell(3, 8), L.Linear(8, 2)), algo="d_rtrl", loss_on="mask",
                             optimizer=optax.sgd(0.1))
        trainer.fit(data, y, batch_size=8, epochs=2, shuffle=False, verbose=0, mask=mask)
        results.append((trainer.get_weights(), trainer.evaluate(data, y, mask=mask, verbose=0)))
    (w0, e0), (w1, e1) = results
    for a, b in zip(jax.tree.leaves(w0), jax.tree.leaves(w1)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(e0["loss"], e1["loss"], rtol=1e-5)
    with pytest.raises(ConfigError, match=r"mask was given but loss_on='last'"):
        ef.Trainer(ef.Sequential(L.GRUCell(3, 8), L.Linear(8, 2))).fit(x, y, mask=mask, verbose=0)


@pytest.mark.parametrize("time_major", [False, True])
def test_predict_with_a_mask_reads_each_sequence_at_its_last_real_step(time_major):
    """Without a mask, predict read padded sequences at the last padded step: what the
    padding held moved the outputs by up to 0.9 and their accuracy disagreed with
    evaluate's. With mask= (or (x, y, mask) batches), each output is its sequence's at
    its last real step (the reference: every step's outputs of the same x, indexed by
    hand), and the padded steps of last_only=False are zeros."""
    from etrace_fit.datasets import pad_sequences

    rng = np.random.default_rng(1)
    x, mask = pad_sequences([rng.normal(size=(int(n), 3)).astype(np.float32) for n in rng.integers(2, 9, 10)])
    noisy = np.where(mask[..., None], x, rng.normal(0, 5.0, x.shape).astype(np.float32))
    brainstate.random.seed(0)
    trainer = ef.Trainer(ef.Sequential(L.GRUCell(3, 8), L.Linear(8, 2)), loss_on="mask", time_major=time_major)
    major = (lambda a: np.swapaxes(a, 0, 1)) if time_major else (lambda a: a)
    every = major(trainer.predict(major(x), batch_size=4, last_only=False, verbose=0))
    expected = every[np.arange(10), mask.sum(axis=1) - 1]
    assert np.abs(trainer.predict(major(x), batch_size=4, verbose=0) - expected).max() > 1e-3  # the bug's size
    for data in (x, noisy):
        np.testing.assert_allclose(trainer.predict(major(data), batch_size=4, verbose=0, mask=major(mask)), expected,
                                   rtol=1e-6, atol=1e-7)
        steps = major(trainer.predict(major(data), batch_size=4, verbose=0, mask=major(mask), last_only=False))
        np.testing.assert_allclose(steps, np.where(mask[..., None], every, 0.0), rtol=1e-6, atol=1e-7)
    batches = [(major(x[i:i + 4]), None, major(mask[i:i + 4])) for i in range(0, 10, 4)]
    np.testing.assert_allclose(trainer.predict(batches, verbose=0), expected, rtol=1e-6, atol=1e-7)
    with pytest.raises(ShapeError, match=r"mask must have shape"):
        trainer.predict(major(x), mask=major(mask[:, :-1]), verbose=0)
    empty = mask.copy()
    empty[3] = False
    with pytest.raises(ShapeError, match=r"sequence 3 of batch 0 has no real step"):
        trainer.predict(major(x), mask=major(empty), verbose=0, batch_size=10)


def test_predict_on_a_trainer_with_the_loss_on_a_mask():
    """predict places no loss: a loss_on='mask' trainer predicts without a mask (this
    failed in TensorBoard's raster at the first epoch end of a masked spiking task)."""
    x, y = rate_discrimination(8, seq_len=6, num_channels=4, seed=0)
    trainer = ef.Trainer(ef.Sequential(L.GRUCell(4, 8), L.Linear(8, 2)), loss_on="mask")
    assert trainer.predict(x, verbose=0).shape == (8, 2)
    assert trainer.predict(x, verbose=0, last_only=False).shape == (8, 6, 2)


def test_a_float64_model_places_its_loss_in_float64_whatever_the_datas_dtype():
    """Loss weights (1/T, sample weights) followed x's dtype: a float64 model fed bool
    spikes got 1/T rounded to float32, 1e-8 off its float64 BPTT. Bool, int and float32
    x now train to the same weights as float64 x, to the bit."""
    rng = np.random.default_rng(0)
    spikes = rng.random((8, 10, C)) < 0.3
    y = rng.integers(0, 2, 8)
    weights = {}
    with brainstate.environ.context(precision=64):
        for dtype in (np.float64, np.float32, np.int32, bool):
            trainer = ef.Trainer(_model(), algo="bptt", optimizer=optax.sgd(0.5), loss_on="all")
            trainer.fit(spikes.astype(dtype), y, batch_size=4, epochs=1, shuffle=False, verbose=0,
                        sample_weight=np.linspace(0.1, 1.1, 8))
            weights[np.dtype(dtype).name] = _weights(trainer._model)
    for name, tree in weights.items():
        assert jax.tree.leaves(tree)[0].dtype == np.float64
        for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(weights["float64"])):
            np.testing.assert_array_equal(a, b, err_msg=name)

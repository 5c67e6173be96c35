"""Keras' ``steps`` and ``sample_weight`` on evaluate and predict, ``validation_steps``
and ``validation_batch_size`` on fit, predict on an iterable of batches, and iterators
read exactly as far as the steps say.

The references are the Trainer's own unweighted results on single samples combined by
the definition of the weighted loss (``Σ_i w_i l_i / N`` over one batch), so no other
implementation is needed; the reading of iterators is counted on the generators.
"""

import itertools
import warnings

import jax
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.callbacks import Callback
from etrace_fit.datasets import rate_discrimination
from etrace_fit.errors import ConfigError, ShapeError

C, H, T = 4, 8, 12


def _data(n=16, seed=0):
    return rate_discrimination(n, seq_len=T, num_channels=C, low_rate=0.05, high_rate=0.3, seed=seed)


def _trainer(**kwargs):
    rng = np.random.default_rng(0)
    model = ef.Sequential(L.Linear(C, H, w_init=rng.normal(0, 1.5, (C, H)).astype(np.float32)), L.LIF(H),
                          L.LeakyRateReadout(H, 2, w_init=rng.normal(0, 0.3, (H, 2)).astype(np.float32)))
    return ef.Trainer(model, **{"loss": "sparse_categorical_crossentropy", "metrics": ["acc"], **kwargs})


def _counting(x, y, batch_size, pulled, forever=False):
    """A generator of (x, y) batches that appends each batch's index to ``pulled``."""
    for index in itertools.count() if forever else range(len(x) // batch_size):
        pulled.append(index)
        first = (index * batch_size) % len(x)
        yield x[first:first + batch_size], y[first:first + batch_size]


class _Batches(Callback):
    def __init__(self):
        self.train = self.test = self.predict = 0

    def on_train_batch_begin(self, batch, logs=None):
        self.train += 1

    def on_test_batch_begin(self, batch, logs=None):
        self.test += 1

    def on_predict_batch_begin(self, batch, logs=None):
        self.predict += 1


# ------------------------------------------------------------------ sample weights
def test_evaluate_weighs_the_loss_by_sample_weight_and_leaves_the_metrics_unweighted():
    x, y = _data(8)
    trainer = _trainer()
    each = np.array([trainer.evaluate(x[i:i + 1], y[i:i + 1], verbose=0)["loss"] for i in range(8)])
    plain = trainer.evaluate(x, y, batch_size=8, verbose=0)
    weights = np.array([0.0, 1.0, 2.0, 0.5, 1.0, 0.0, 3.0, 1.0], np.float32)
    weighted = trainer.evaluate(x, y, batch_size=8, verbose=0, sample_weight=weights)
    assert plain["loss"] == pytest.approx(each.mean(), rel=1e-5)
    assert weighted["loss"] == pytest.approx(float(np.sum(weights * each)) / 8, rel=1e-5)
    assert weighted["acc"] == pytest.approx(plain["acc"])  # a sample weighed 0 still counts, as in fit
    every_step = _trainer(loss_on="all")  # per-step weights need a loss on every step (refused under "last")
    per_step = np.repeat(weights[:, None], T, axis=1)  # (N, T): the same weights at every step
    assert every_step.evaluate(x, y, batch_size=8, verbose=0, sample_weight=per_step)["loss"] == pytest.approx(
        every_step.evaluate(x, y, batch_size=8, verbose=0, sample_weight=weights)["loss"], rel=1e-6)
    assert trainer.evaluate(x, y, 8, 0, weights, return_dict=False)[0] == pytest.approx(weighted["loss"])


def test_test_on_batch_keeps_its_metrics_unweighted_under_a_zero_sample_weight():
    """Its metrics were placed with the weighted loss's weights: a sample weighed 0
    counted as wrong (accuracy 0.5 for two right answers)."""
    x, y = _data(8)
    trainer = _trainer()
    plain = trainer.test_on_batch(x, y, return_dict=True)
    zeroed = trainer.test_on_batch(x, y, sample_weight=np.r_[np.ones(4), np.zeros(4)].astype(np.float32),
                                   return_dict=True)
    assert plain["acc"] == pytest.approx(0.375)  # samples 4, 5 and 7 right: the ones weighed 0 below
    assert zeroed["acc"] == pytest.approx(plain["acc"])
    assert zeroed["loss"] != pytest.approx(plain["loss"])


def test_evaluate_refuses_bad_sample_weights_and_weights_with_an_iterable_before_any_batch():
    x, y = _data(8)
    trainer, seen = _trainer(), _Batches()
    with pytest.raises(ShapeError, match=r"sample_weight contains NaN or inf \(first in sample 0\)"):
        trainer.evaluate(x, y, sample_weight=np.full(8, np.nan, np.float32), callbacks=[seen], verbose=0)
    with pytest.raises(ShapeError, match=r"sample_weight has 3 entries for 8 samples"):
        trainer.evaluate(x, y, sample_weight=np.ones(3), callbacks=[seen], verbose=0)
    with pytest.raises(ConfigError, match="sample_weight and mask apply to array data"):
        trainer.evaluate([(x, y)], sample_weight=np.ones(8), callbacks=[seen], verbose=0)
    assert seen.test == 0


# ------------------------------------------------------------------ steps
def test_evaluate_steps_reads_that_many_batches_and_warns_when_the_data_gives_fewer():
    x, y = _data(24)
    trainer = _trainer()
    first_two = trainer.evaluate(x[:16], y[:16], batch_size=8, verbose=0)
    assert trainer.evaluate(x, y, batch_size=8, steps=2, verbose=0)["loss"] == pytest.approx(first_two["loss"])
    pulled = []
    endless = _counting(x, y, 8, pulled, forever=True)
    assert trainer.evaluate(endless, steps=2, verbose=0)["loss"] == pytest.approx(first_two["loss"])
    assert pulled == [0, 1]  # not a batch more
    trainer.evaluate(endless, steps=1, verbose=0)
    assert pulled == [0, 1, 2]  # it goes on where it stopped
    with pytest.warns(UserWarning, match="steps=5, but the data gave 3 batches"):
        trainer.evaluate(x, y, batch_size=8, steps=5, verbose=0)
    with pytest.raises(ConfigError, match="steps must be a positive int, got 0"):
        trainer.evaluate(x, y, steps=0, verbose=0)


def test_predict_takes_an_iterable_of_batches_and_steps():
    x, y = _data(24)
    trainer = _trainer()
    whole = trainer.predict(x, batch_size=8, verbose=0)
    np.testing.assert_allclose(trainer.predict([x[i:i + 8] for i in range(0, 24, 8)], verbose=0), whole, rtol=1e-6)
    np.testing.assert_allclose(trainer.predict([(x[i:i + 8], y[i:i + 8]) for i in range(0, 24, 8)], verbose=0),
                               whole, rtol=1e-6)  # (x, y) batches as fit reads them: y is not read
    pulled = []
    endless = _counting(x, y, 8, pulled, forever=True)
    np.testing.assert_allclose(trainer.predict(endless, steps=2, verbose=0), whole[:16], rtol=1e-6)
    assert pulled == [0, 1]
    np.testing.assert_allclose(trainer.predict(x, batch_size=8, steps=1, verbose=0), whole[:8], rtol=1e-6)
    every = trainer.predict([x[:8], x[8:16]], last_only=False, verbose=0)
    assert every.shape == (16, T, 2)
    with pytest.raises(ShapeError, match=r"predict\(last_only=False\): batch 1 has 6 steps, the first had 12"):
        trainer.predict([x[:8], x[8:16, :6]], last_only=False, verbose=0)
    assert trainer.predict([x[:8], x[8:16, :6]], verbose=0).shape == (16, 2)  # any length at the last step
    with pytest.raises(ShapeError, match="predict: batch 0 must be an x array or a tuple"):
        trainer.predict(["text"], verbose=0)
    with pytest.raises(ConfigError, match="predict takes an array x or an iterable of batches, got int"):
        trainer.predict(3, verbose=0)
    with pytest.warns(UserWarning, match="steps=4, but the data gave 3 batches"):
        trainer.predict(x, batch_size=8, steps=4, verbose=0)


def test_callbacks_passed_where_keras_puts_steps_are_named():
    x, y = _data(8)
    trainer = _trainer()
    with pytest.raises(ConfigError, match=r"evaluate: sample_weight got callbacks; .* pass callbacks=\[...\] by name"):
        trainer.evaluate(x, y, 8, 0, [_Batches()])
    with pytest.raises(ConfigError, match=r"predict: steps got callbacks"):
        trainer.predict(x, 8, 0, [_Batches()])


# ------------------------------------------------------------------ fit
def test_steps_per_epoch_reads_an_iterator_without_dropping_a_batch_between_epochs():
    """Each epoch read one batch past steps_per_epoch and dropped it: a generator of
    exactly epochs x steps batches ran out an epoch early."""
    x, y = _data(24)
    pulled, seen = [], _Batches()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "ran out of data"
        history = _trainer().fit(_counting(x, y, 4, pulled), epochs=3, steps_per_epoch=2, verbose=0,
                                 callbacks=[seen])
    assert history.epoch == [0, 1, 2]
    assert pulled == [0, 1, 2, 3, 4, 5] and seen.train == 6


def test_steps_per_epoch_on_arrays_goes_on_where_the_last_epoch_ended():
    """Every epoch started at the first batch again: with shuffle=False the first
    steps_per_epoch batches were all it ever trained on. As in Keras, an epoch goes on
    where the last ended and a pass that ends starts the next (here 4 batches a pass, 3
    an epoch: batches 0 1 2 | 3 0 1 | 2 3 0). The reference is the same batches given
    to train_on_batch in that order (SGD: the step alone decides)."""
    x, y = _data(32)
    fitted = _trainer(optimizer="sgd")
    fitted.fit(x, y, batch_size=8, epochs=3, steps_per_epoch=3, shuffle=False, verbose=0)
    by_hand = _trainer(optimizer="sgd")
    for k in (0, 1, 2, 3, 0, 1, 2, 3, 0):
        by_hand.train_on_batch(x[8 * k:8 * k + 8], y[8 * k:8 * k + 8])
    for a, b in zip(jax.tree.leaves(fitted.get_weights()), jax.tree.leaves(by_hand.get_weights())):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def test_steps_per_epoch_on_shuffled_arrays_resumes_where_an_uninterrupted_run_is(tmp_path):
    from _killed import killed_before

    from etrace_fit.callbacks import BackupAndRestore

    x, y = _data(32)
    reference = _trainer()
    reference.fit(x, y, batch_size=8, epochs=4, steps_per_epoch=3, verbose=0)
    with pytest.raises(KeyboardInterrupt):
        _trainer().fit(x, y, batch_size=8, epochs=4, steps_per_epoch=3, verbose=0,
                       callbacks=[killed_before(2), BackupAndRestore(tmp_path)])
    resumed = _trainer()
    resumed.fit(x, y, batch_size=8, epochs=4, steps_per_epoch=3, verbose=0, callbacks=[BackupAndRestore(tmp_path)])
    for a, b in zip(jax.tree.leaves(resumed.get_weights()), jax.tree.leaves(reference.get_weights())):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_validation_split_keeps_the_held_out_sample_weights():
    """As Keras splits (x, y, sample_weight) together, val_loss is the weighted loss of
    the held-out samples (it was their unweighted loss). With a zero learning rate the
    weights do not move, so evaluate on the held-out part is the reference."""
    x, y = _data(10)
    weights = np.linspace(0.5, 3.0, 10).astype(np.float32)
    trainer = _trainer(optimizer=optax.sgd(0.0))
    history = trainer.fit(x, y, batch_size=4, epochs=1, validation_split=0.25, sample_weight=weights, verbose=0)
    held = trainer.evaluate(x[7:], y[7:], sample_weight=weights[7:], verbose=0)
    assert history.history["val_loss"][0] == pytest.approx(held["loss"], rel=1e-6)
    assert history.history["val_acc"][0] == pytest.approx(held["acc"])
    assert held["loss"] != pytest.approx(trainer.evaluate(x[7:], y[7:], verbose=0)["loss"], rel=1e-3)


def test_validation_steps_and_validation_batch_size():
    x, y = _data(24)
    xv, yv = _data(24, seed=1)
    pulled, seen = [], _Batches()
    trainer = _trainer()
    history = trainer.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[seen],
                          validation_data=_counting(xv, yv, 4, pulled, forever=True), validation_steps=2)
    assert pulled == [0, 1, 2, 3, 4, 5] and seen.test == 6  # an endless iterator read on, two batches each time
    assert len(history.history["val_loss"]) == 3
    seen = _Batches()
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[seen], validation_data=(xv, yv),
                validation_batch_size=6, validation_steps=3)
    assert seen.test == 3 and seen.train == 3
    seen = _Batches()
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[seen], validation_data=(xv, yv),
                validation_batch_size=6)
    assert seen.test == 4
    for bad, message in ((dict(validation_steps=0), "validation_steps must be a positive int, got 0"),
                         (dict(validation_batch_size=1.5), "validation_batch_size must be a positive int, got 1.5")):
        with pytest.raises(ConfigError, match=message):
            trainer.fit(x, y, validation_data=(xv, yv), verbose=0, **bad)


def test_numpy_ints_are_taken_where_ints_are():
    """Sizes and counts computed with numpy (np.int64) were refused as not ints."""
    x, y = _data(16)
    trainer = _trainer()
    history = trainer.fit(x, y, batch_size=np.int64(8), epochs=np.int64(2), initial_epoch=np.int32(0),
                          validation_data=(x, y), validation_freq=np.int64(2), verbose=0)
    assert history.epoch == [0, 1] and len(history.history["val_loss"]) == 1
    assert type(history.params["epochs"]) is int  # JSON-ready in checkpoints and logs
    model = ef.Sequential(L.Linear(np.int64(C), np.int64(H)), L.GRUCell(np.int64(H), np.int32(H)),
                          L.Linear(np.int64(H), 2))
    assert model.layers[0].out_size == (H,) and type(model.layers[1].hidden_size) is int


@pytest.mark.parametrize("time_major", [False, True])
def test_a_keras_column_of_sample_weights_is_one_weight_per_sequence(time_major):
    """Also with ``time_major=True`` (x ``(T, N, C)``), where the ``(N, 1)`` column was
    swapped as ``(T, N)`` step weights are and refused as one weight for N samples."""
    x, y = _data(16)
    if time_major:
        x = np.swapaxes(x, 0, 1)
    weights = np.linspace(0.0, 2.0, 16).astype(np.float32)
    trainer = _trainer(time_major=time_major)
    assert trainer.evaluate(x, y, verbose=0, sample_weight=weights[:, None])["loss"] == pytest.approx(
        trainer.evaluate(x, y, verbose=0, sample_weight=weights)["loss"])
    fitted = []
    for given in (weights, weights[:, None]):
        other = _trainer(time_major=time_major)
        other.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, sample_weight=given)
        fitted.append(jax.tree.leaves(other.get_weights()))
    for a, b in zip(*fitted):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_class_weight_with_one_hot_targets_and_a_class_the_model_does_not_have():
    """Keras takes class_weight with one-hot targets; here it needed integer labels. A
    class beyond the model's outputs was taken without a word."""
    x, y = _data(16)
    fitted = []
    weighted = dict(sample_weight=np.where(y == 1, 3.0, 1.0).astype(np.float32))
    # integer one-hot rows too: they were read as labels and failed in a bare numpy reshape
    for one_hot, kwargs in [(np.eye(2, dtype=np.float32)[y], dict(class_weight={1: 3.0})),
                            (np.eye(2, dtype=np.int32)[y], dict(class_weight={1: 3.0})),
                            (np.eye(2, dtype=np.float32)[y], weighted)]:
        trainer = _trainer(loss="categorical_crossentropy", metrics=[])
        trainer.fit(x, one_hot, batch_size=8, epochs=1, shuffle=False, verbose=0, **kwargs)
        fitted.append(jax.tree.leaves(trainer.get_weights()))
    for a, b in zip(*fitted[:2]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    for a, b in zip(*fitted[1:]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    seen = _Batches()
    with pytest.raises(ConfigError, match=r"class_weight names class 5, but the model has 2 outputs \(classes 0\.\.1\)"):
        _trainer().fit(x, y, batch_size=8, verbose=0, class_weight={0: 1.0, 5: 2.0}, callbacks=[seen])
    assert seen.train == 0


def test_every_train_and_test_on_batch_checks_its_labels():
    """Only a trainer's first ``train_on_batch`` checked them, and ``test_on_batch`` never
    did: after one good chunk of a stream a label of -1 trained with a finite loss, and
    a label past the classes gave a NaN loss blamed on the gradient."""
    x, y = _data(8)
    trainer = _trainer(optimizer="adam")
    trainer.train_on_batch(x[:4], y[:4])
    before = trainer.get_weights()
    for bad in (-1, 2):
        labels = np.asarray(y[:4]).copy()
        labels[-1] = bad
        for call in (trainer.train_on_batch, trainer.test_on_batch):
            with pytest.raises(ShapeError, match=rf"y: labels must lie in \[0, 2\) for a model with 2 outputs, got "
                                                 rf"values from {labels.min()} to {labels.max()}"):
                call(x[:4], labels)
    with pytest.raises(ConfigError, match=r"class_weight names class 7, but the model has 2 outputs"):
        trainer.train_on_batch(x[:4], y[:4], class_weight={0: 1.0, 7: 2.0})
    jax.tree.map(np.testing.assert_array_equal, trainer.get_weights(), before)  # nothing trained on them


@pytest.mark.parametrize("rate", [float("inf"), float("nan"), -0.1, "fast", True])
def test_a_learning_rate_that_is_not_a_finite_number_at_least_zero_is_refused(rate):
    """An infinite or NaN rate was taken: the next update made every weight NaN (its
    gradient was finite, so it was applied) and ModelCheckpoint saved them."""
    trainer = _trainer(optimizer="adam")
    with pytest.raises(ConfigError, match=r"learning_rate must be a (finite number >= 0|number), got"):
        trainer.learning_rate = rate
    x, y = _data(8)
    schedule = ef.callbacks.LearningRateScheduler(lambda epoch: rate if epoch == 1 else 0.01)
    with pytest.raises(ConfigError, match=r"LearningRateScheduler: the schedule's rate for epoch 2 must be a"):
        trainer.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[schedule])
    assert trainer.epoch == 0 and all(np.isfinite(v).all() for v in jax.tree.leaves(trainer.get_weights()))


def test_an_update_that_makes_a_weight_non_finite_is_not_applied():
    """A finite loss and gradient with a rate of inf in an optax optimizer (which no
    setter sees): the update was applied and every weight became NaN."""
    x, y = _data(8)
    trainer = _trainer(optimizer=optax.sgd(float("inf")))
    before = trainer.get_weights()
    with pytest.warns(RuntimeWarning, match="not finite"):
        trainer.train_on_batch(x[:4], y[:4])
    assert trainer.skipped_batches == 1
    jax.tree.map(np.testing.assert_array_equal, trainer.get_weights(), before)

"""A run resumed by ``BackupAndRestore`` continues as the uninterrupted run would have
(docs/reliability.md): with every built-in callback that keeps progress, under every
algo, and in the cases the older resume tests did not hold (a random initial state
drawn from brainstate's global key, a fit that is not the trainer's first, stateful
streams, an iterator, a callback state that no longer fits).
"""

import os
import warnings

import brainstate
import jax
import numpy as np
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.callbacks import (BackupAndRestore, Callback, CSVLogger, EarlyStopping, LambdaCallback,
                                  LearningRateScheduler, ModelCheckpoint, ReduceLROnPlateau, TensorBoard)

from _killed import killed_before

from ._helpers import C, H, lif_model, rate_data


def _leaves(tree):
    return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


def _assert_same_run(straight, resumed):
    """The same history, weights and optimizer state, bitwise."""
    assert resumed.history.history == straight.history.history
    for one, other in ((straight.get_weights(), resumed.get_weights()), (straight.opt_state, resumed.opt_state)):
        one, other = _leaves(one), _leaves(other)
        assert len(one) == len(other) > 0
        for a, b in zip(one, other):
            np.testing.assert_array_equal(a, b)


def _straight_killed_resumed(make_trainer, tmp_path, epochs=4, kill=2, data=None, callbacks=lambda folder: [],
                             **fit):
    """An uninterrupted run, and the same run interrupted before epoch ``kill`` and
    started again, each trainer built by ``make_trainer`` as a script would build it
    (``callbacks(folder)``: the run's other callbacks, writing into ``folder``)."""
    x, y = rate_data(16) if data is None else data
    fit = {"batch_size": 8, "epochs": epochs, "verbose": 0, **fit}
    straight = make_trainer()
    straight.fit(x, y, callbacks=[*callbacks(tmp_path / "straight"), BackupAndRestore(tmp_path / "straight")], **fit)
    with pytest.raises(KeyboardInterrupt):
        make_trainer().fit(x, y, callbacks=[*callbacks(tmp_path / "killed"), killed_before(kill),
                                            BackupAndRestore(tmp_path / "killed")], **fit)
    resumed = make_trainer()
    resumed.fit(x, y, callbacks=[*callbacks(tmp_path / "killed"), BackupAndRestore(tmp_path / "killed")], **fit)
    return straight, resumed


def test_every_callback_with_progress_resumes_where_the_uninterrupted_run_was(tmp_path):
    """EarlyStopping's best weights and wait, ReduceLROnPlateau's cooldown and rate, a
    schedule, ModelCheckpoint's best value and batch count, CSVLogger(append=True)'s rows
    and TensorBoard's batch axis: after a resume each holds what the uninterrupted run's does."""
    held = {}

    def callbacks(folder):
        held[folder.name] = [
            EarlyStopping("loss", patience=10, min_delta=1e-3, restore_best_weights=True),
            ReduceLROnPlateau("loss", factor=0.5, patience=1, min_delta=10.0, cooldown=1),
            LearningRateScheduler(lambda epoch, rate: rate * 0.9),
            ModelCheckpoint(str(folder / "best.ckpt"), monitor="val_loss", save_best_only=True),
            ModelCheckpoint(str(folder / "batches" / "{epoch}-{batch}.ckpt"), monitor="loss", save_freq=3,
                            keep_last=2),
            CSVLogger(str(folder / "log.csv"), append=True),
            TensorBoard(str(folder / "tb"), update_freq="batch", histogram_freq=0, final_histograms=False)]
        return held[folder.name]

    straight, resumed = _straight_killed_resumed(lambda: ef.Trainer(lif_model(), optimizer="adam"), tmp_path,
                                                 epochs=5, callbacks=callbacks, validation_split=0.25)
    _assert_same_run(straight, resumed)
    for one, other in zip(held["straight"], held["killed"]):
        states = [one.state_dict(), other.state_dict()]
        for state, folder in zip(states, ("straight", "killed")):
            if "saved" in state:
                state["saved"] = [os.path.relpath(p, tmp_path / folder) for p in state["saved"]]
        assert states[0] == states[1], type(one).__name__
    assert (tmp_path / "straight" / "log.csv").read_text() == (tmp_path / "killed" / "log.csv").read_text()
    assert sorted(os.listdir(tmp_path / "straight" / "batches")) == sorted(os.listdir(tmp_path / "killed" / "batches"))


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["bptt", "d_rtrl", "esd_rtrl", "hybrid", "eprop", "eprop:random"])
def test_each_algo_resumes_bitwise_with_dropout_and_validation_freq(tmp_path, algo):
    def make_trainer():
        rng = np.random.default_rng(0)
        model = ef.Sequential(L.Linear(C, H, w_init=rng.normal(0, 1.5, (C, H)).astype(np.float32)), L.LIF(H),
                              L.Dropout(0.3, seed=1),
                              L.LeakyRateReadout(H, 2, w_init=rng.normal(0, 0.3, (H, 2)).astype(np.float32)))
        return ef.Trainer(model, algo=algo, optimizer="adam")

    _assert_same_run(*_straight_killed_resumed(make_trainer, tmp_path, kill=3, validation_split=0.25,
                                               validation_freq=2))


def test_a_random_initial_state_goes_on_drawing_where_the_uninterrupted_run_was(tmp_path):
    """Every batch draws its initial states from brainstate's global key; the backups
    did not hold it, so the resumed epochs drew what the run's first epochs had drawn
    (the script seeds brainstate as it starts) and ended on other weights."""
    def make_trainer():  # a LIF whose membrane starts at a random value in every batch
        brainstate.random.seed(0)  # a script seeds its run
        rng = np.random.default_rng(0)
        model = ef.Sequential(L.Linear(C, H, w_init=rng.normal(0, 1.5, (C, H)).astype(np.float32)),
                              L.LIF(H, state_init=brainstate.nn.init.Uniform(0.0, 1.0)),
                              L.LeakyRateReadout(H, 2, w_init=rng.normal(0, 0.3, (H, 2)).astype(np.float32)))
        return ef.Trainer(model, algo="d_rtrl", optimizer="adam")

    _assert_same_run(*_straight_killed_resumed(make_trainer, tmp_path))


@pytest.mark.parametrize("where", ["a new process", "the same trainer"])
def test_a_later_fit_resumes_with_the_shuffling_it_had(tmp_path, where):
    """A fit numbered from epoch 0 shuffles on from the epochs the trainer ran before
    (a warm-up fit, say); its resumed epochs shuffled as a first fit's would, and
    trained on other batches than the uninterrupted run."""
    x, y = rate_data(16)

    def warmed_up():
        trainer = ef.Trainer(lif_model(), optimizer="adam")
        trainer.fit(x, y, batch_size=8, epochs=2, verbose=0)
        return trainer

    if where == "a new process":
        straight, resumed = _straight_killed_resumed(warmed_up, tmp_path)
    else:  # Ctrl-C in a notebook, then the same cell again
        straight = warmed_up()
        straight.fit(x, y, batch_size=8, epochs=4, verbose=0, callbacks=[BackupAndRestore(tmp_path / "straight")])
        resumed = warmed_up()
        with pytest.raises(KeyboardInterrupt):
            resumed.fit(x, y, batch_size=8, epochs=4, verbose=0,
                        callbacks=[killed_before(2), BackupAndRestore(tmp_path / "killed")])
        resumed.fit(x, y, batch_size=8, epochs=4, verbose=0, callbacks=[BackupAndRestore(tmp_path / "killed")])
    _assert_same_run(straight, resumed)
    for trainer in (straight, resumed):  # and a fit after it goes on alike
        trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    _assert_same_run(straight, resumed)


def test_a_stateful_run_whose_epochs_start_the_streams_afresh_backs_up_without_a_warning(tmp_path):
    """Each epoch reads the arrays from their start, so its streams end with it and a
    backup misses nothing: the resumed run is the uninterrupted one. Every epoch's
    backup (and checkpoint) warned that the file held no streams' states."""
    x, y = rate_data(8)
    targets = np.repeat(np.asarray(y)[:, None], x.shape[1], axis=1)

    def make_trainer():
        return ef.Trainer(lif_model(), algo="d_rtrl", optimizer="adam", stateful=True, loss_on="all")

    def run(trainer, folder, *extra):
        trainer.fit(x, targets, batch_size=4, epochs=4, shuffle=False, verbose=0, callbacks=[
            *extra, ModelCheckpoint(str(tmp_path / folder / "{epoch}.ckpt")), BackupAndRestore(tmp_path / folder)])
        return trainer

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.simplefilter("ignore", ef.ApproximationWarning)  # the leaky readout's memory under updates
        straight = run(make_trainer(), "straight")
        with pytest.raises(KeyboardInterrupt):
            run(make_trainer(), "killed", killed_before(2))
        resumed = run(make_trainer(), "killed")
    _assert_same_run(straight, resumed)


def test_streams_that_go_on_into_the_next_epoch_are_backed_up_and_resumed(tmp_path):
    """With ``steps_per_epoch`` half a pass of the arrays, an epoch's streams go on in the
    next one. Each backup warned that it held no streams, and the resumed run started
    them afresh mid-pass: other losses and weights than the uninterrupted run's."""
    x, y = rate_data(8)
    targets = np.repeat(np.asarray(y)[:, None], x.shape[1], axis=1)

    def make_trainer():
        return ef.Trainer(lif_model(), algo="d_rtrl", optimizer="adam", stateful=True, loss_on="all")

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.simplefilter("ignore", ef.ApproximationWarning)  # the leaky readout's memory under updates
        # epochs 0-1 read one pass (batches 0 and 1 of the same streams), epochs 2-3 the next
        straight, resumed = _straight_killed_resumed(make_trainer, tmp_path, epochs=4, kill=3, batch_size=4,
                                                     steps_per_epoch=1, shuffle=False, data=(x, targets))
    _assert_same_run(straight, resumed)
    # a model whose hidden states differ (a refractory counter more) is named, and nothing is loaded
    make_trainer().fit(x, targets, batch_size=4, epochs=1, steps_per_epoch=1, shuffle=False, verbose=0,
                       callbacks=[ModelCheckpoint(str(tmp_path / "mid.ckpt"))])
    rng = np.random.default_rng(0)
    other = ef.Trainer(ef.Sequential(L.Linear(C, H, w_init=rng.normal(0, 1.5, (C, H)).astype(np.float32)),
                                     L.LIF(H, refractory=2),
                                     L.LeakyRateReadout(H, 2, w_init=rng.normal(0, 0.3, (H, 2)).astype(np.float32))),
                       algo="d_rtrl", optimizer="adam", stateful=True, loss_on="all")
    with pytest.raises(ef.CheckpointError, match=r"the saved streams' hidden states \(stateful=True\) do not fit "
                                                 r"the model's: layers\.1\.refractory_steps: saved absent"):
        other.restore(tmp_path / "mid.ckpt")
    assert other.opt_state is None and other.epoch == -1


def test_a_resume_over_an_iterator_says_its_batches_differ(tmp_path):
    """An iterator (a generator) is read on across epochs with ``steps_per_epoch``; the
    resumed run's iterator starts again, so its epochs read the first epochs' batches,
    silently: the docs promised the uninterrupted run's weights."""
    x, y = rate_data(16)

    def batches():
        while True:
            for start in (0, 8):
                yield x[start:start + 8], y[start:start + 8]

    def run(*extra):
        ef.Trainer(lif_model(), optimizer="adam").fit(batches(), epochs=4, steps_per_epoch=1, verbose=0,
                                                      callbacks=[*extra, BackupAndRestore(tmp_path)])

    with pytest.raises(KeyboardInterrupt):
        run(killed_before(1))
    with pytest.warns(RuntimeWarning, match=r"BackupAndRestore resumed this fit at epoch 2, but x is an iterator .* "
                                            r"read from its start, not where epoch 1 ended"):
        run()


def test_a_callback_state_that_cannot_be_restored_is_named_and_nothing_is_loaded(tmp_path):
    """A callback of the user's whose saved state the edited script reads otherwise (a
    key renamed): its raw KeyError came out of fit with the weights, optimizer state and
    history already restored. Now the backups are refused as another run's are, naming
    the callback, before training, and the trainer is as it was."""
    class Counter(Callback):
        def __init__(self, key):
            self.key, self.count = key, 0

        def on_epoch_end(self, epoch, logs=None):
            self.count += 1

        def state_dict(self):
            return {self.key: self.count}

        def load_state_dict(self, state):
            self.count = state[self.key]

    x, y = rate_data(16)
    with pytest.raises(KeyboardInterrupt):
        ef.Trainer(lif_model(), optimizer="adam").fit(x, y, batch_size=8, epochs=4, verbose=0, callbacks=[
            Counter("epochs"), killed_before(2), BackupAndRestore(tmp_path)])
    saved = (tmp_path / "latest.ckpt").read_bytes()
    trainer = ef.Trainer(lif_model(), optimizer="adam")
    before = _leaves(trainer.get_weights())
    with pytest.raises(ef.ConfigError, match=r"latest \(epoch 2\): .*the saved state of callback 'Counter' cannot "
                                             r"be restored \(KeyError: 'count'\)"):
        trainer.fit(x, y, batch_size=8, epochs=4, verbose=0, callbacks=[Counter("count"), BackupAndRestore(tmp_path)])
    for a, b in zip(before, _leaves(trainer.get_weights())):
        np.testing.assert_array_equal(a, b)
    assert trainer.opt_state is None and trainer.history.epoch == [] and trainer.epoch == -1
    assert (tmp_path / "latest.ckpt").read_bytes() == saved


def test_a_run_interrupted_while_its_backups_are_deleted_trains_nothing_when_started_again(tmp_path, monkeypatch):
    """The finished run's backups went newest first: interrupted after the latest one
    was gone, the run started again from the previous backup and trained its last
    epoch once more."""
    x, y = rate_data(16)
    removed = []
    real_remove = os.remove

    def interrupted_remove(path):
        removed.append(path)
        if len(removed) == 2:
            raise KeyboardInterrupt  # Ctrl-C between two deletions
        real_remove(path)

    monkeypatch.setattr(os, "remove", interrupted_remove)
    with pytest.raises(KeyboardInterrupt):
        ef.Trainer(lif_model(), optimizer="adam").fit(x, y, batch_size=8, epochs=3, verbose=0,
                                                      callbacks=[BackupAndRestore(tmp_path)])
    monkeypatch.setattr(os, "remove", real_remove)
    began = []
    again = ef.Trainer(lif_model(), optimizer="adam").fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[
        LambdaCallback(on_epoch_begin=lambda epoch, logs: began.append(epoch)), BackupAndRestore(tmp_path)])
    assert began == [] and again.epoch == [0, 1, 2]

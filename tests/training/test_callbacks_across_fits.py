"""Callbacks used again in a new ``fit``, and a run ``EarlyStopping`` ended, started again.

Keras resets ``EarlyStopping`` and ``ReduceLROnPlateau`` at ``on_train_begin`` so an
instance can be reused; here they carried the last fit's ``wait`` and ``best`` into the
next: a reused ``EarlyStopping(restore_best_weights=True)`` stopped the new fit after one
epoch and put the *last* fit's best weights back, and a reused ``ReduceLROnPlateau``
cut the rate in the new fit's first epoch. A run ``BackupAndRestore`` resumes keeps its
callbacks' progress (restorers run first).

A backup did not record that ``EarlyStopping`` ended the run, so a run killed after its
last backup but before the backups were deleted (or kept with
``delete_on_finish=False``) trained further epochs when started again.
"""

import jax
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit.callbacks import BackupAndRestore, EarlyStopping, LambdaCallback, ReduceLROnPlateau

from ._helpers import lif_model as _model, rate_data as _data


def _weights(trainer):
    return [np.asarray(leaf) for leaf in jax.tree.leaves(trainer.get_weights())]


def test_a_reused_early_stopping_starts_afresh_and_restores_this_fits_best():
    x, y = _data()
    trainer = ef.Trainer(_model(), optimizer=optax.adam(1e-2), seed=0)
    # min_delta so large that only each fit's first epoch "improves": every fit stops after its second
    stopping = EarlyStopping("loss", min_delta=100.0, patience=1, restore_best_weights=True)
    ends = []
    record = LambdaCallback(on_epoch_end=lambda epoch, logs: ends.append(_weights(trainer)))
    first = trainer.fit(x, y, batch_size=8, epochs=5, verbose=0, callbacks=[stopping, record])
    assert first.epoch == [0, 1] and stopping.stopped_epoch == 1
    first_best = ends[0]
    ends.clear()
    second = trainer.fit(x, y, batch_size=8, epochs=5, verbose=0, callbacks=[stopping, record])
    assert second.epoch == [0, 1] and stopping.stopped_epoch == 1 and stopping.best_epoch == 0
    for restored, best, old in zip(_weights(trainer), ends[0], first_best):
        np.testing.assert_array_equal(restored, best)  # this fit's first epoch, not the last fit's
    assert not all(np.array_equal(a, b) for a, b in zip(ends[0], first_best))


def test_a_reused_reduce_lr_on_plateau_starts_afresh():
    x, y = _data()
    trainer = ef.Trainer(_model(), optimizer=optax.inject_hyperparams(optax.adam)(learning_rate=0.01), seed=0)
    plateau = ReduceLROnPlateau("loss", factor=0.5, patience=2, min_delta=100.0)
    trainer.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[plateau])  # best, then one epoch waiting
    assert plateau.wait == 1 and trainer.learning_rate == pytest.approx(0.01)
    history = trainer.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[plateau])
    assert history.history["learning_rate"] == [pytest.approx(0.01)] and plateau.wait == 0
    assert trainer.learning_rate == pytest.approx(0.01)


class _Killed(Exception):
    pass


def _kill_at_train_end(logs=None):
    raise _Killed  # after the last backup, before BackupAndRestore deletes the backups


@pytest.mark.parametrize("how", ["killed before the backups went", "backups kept"])
def test_a_run_early_stopping_ended_trains_no_further_epoch_when_started_again(tmp_path, how):
    x, y = _data()

    def run(*extra, delete=True):
        trainer = ef.Trainer(_model(), optimizer=optax.adam(1e-2), seed=0)
        stopping = EarlyStopping("loss", min_delta=100.0, patience=1)
        history = trainer.fit(x, y, batch_size=8, epochs=6, verbose=0, callbacks=[
            stopping, *extra, BackupAndRestore(tmp_path / "backup", delete_on_finish=delete)])
        return trainer, history

    reference, reference_history = ef.Trainer(_model(), optimizer=optax.adam(1e-2), seed=0), None
    reference_history = reference.fit(x, y, batch_size=8, epochs=6, verbose=0,
                                      callbacks=[EarlyStopping("loss", min_delta=100.0, patience=1)])
    assert reference_history.epoch == [0, 1]
    if how == "backups kept":
        run(delete=False)
        trainer, history = run(delete=False)
    else:
        with pytest.raises(_Killed):
            run(LambdaCallback(on_train_end=_kill_at_train_end))
        trainer, history = run()
    assert history.epoch == [0, 1]
    assert history.history["loss"] == reference_history.history["loss"]
    for a, b in zip(_weights(trainer), _weights(reference)):
        np.testing.assert_array_equal(a, b)
    if how == "backups kept":
        assert (tmp_path / "backup" / "latest.ckpt").exists()
    else:
        assert not (tmp_path / "backup" / "latest.ckpt").exists()

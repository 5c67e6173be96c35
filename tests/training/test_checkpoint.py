"""Checkpoint files and Trainer.save / load; exact resume after SIGKILL (slow)."""

import json
import pathlib
import subprocess
import sys
import textwrap

import jax
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.callbacks import BackupAndRestore, LambdaCallback, ModelCheckpoint
from etrace_fit.datasets import rate_discrimination
from etrace_fit.errors import CheckpointError

C, H, T = 4, 8, 12
ROOT = pathlib.Path(__file__).resolve().parents[2]


def _model(hidden=H):
    rng = np.random.default_rng(0)
    return ef.Sequential(L.Linear(C, hidden, w_init=rng.normal(0, 1.5, (C, hidden)).astype(np.float32)), L.LIF(hidden),
                         L.LeakyRateReadout(hidden, 2, w_init=rng.normal(0, 0.3, (hidden, 2)).astype(np.float32)))


def _data(n=16):
    return rate_discrimination(n, seq_len=T, num_channels=C, low_rate=0.05, high_rate=0.4, seed=0)


def _weights(trainer):
    return {k: jax.tree.map(np.asarray, v) for k, v in trainer.get_weights().items()}


def test_save_and_load_round_trip_weights_optimizer_state_and_history(tmp_path):
    x, y = _data()
    trainer = ef.Trainer(_model(), optimizer=optax.adam(1e-2))
    trainer.fit(x, y, batch_size=8, epochs=2, verbose=0)
    trainer.save(tmp_path / "run.ckpt")
    loaded = ef.Trainer.load(tmp_path / "run.ckpt", _model(), optimizer=optax.adam(1e-2))
    jax.tree.map(np.testing.assert_array_equal, _weights(loaded), _weights(trainer))
    jax.tree.map(np.testing.assert_array_equal, loaded.opt_state, trainer.opt_state)
    assert loaded.history.history == trainer.history.history and loaded.epoch == 1
    # Both continue identically.
    trainer.fit(x, y, batch_size=8, epochs=3, initial_epoch=2, verbose=0)
    loaded.fit(x, y, batch_size=8, epochs=3, initial_epoch=2, verbose=0)
    jax.tree.map(np.testing.assert_array_equal, _weights(loaded), _weights(trainer))
    assert [p.name for p in tmp_path.iterdir()] == ["run.ckpt"]  # no temporary file left behind


def test_a_model_of_another_structure_gets_checkpoint_error_listing_the_mismatch(tmp_path):
    trainer = ef.Trainer(_model())
    trainer.save(tmp_path / "a.ckpt")
    with pytest.raises(CheckpointError, match=r"layers\.0\.weight: checkpoint .*\[4, 8\].*model .*\[4, 5\]"):
        ef.Trainer.load(tmp_path / "a.ckpt", _model(hidden=5))


@pytest.mark.parametrize("damage, fragment", [
    (lambda b: b[: len(b) - 10], "truncated"),
    (lambda b: b[:-5] + bytes(5), "corrupted"),
    (lambda b: b"garbage" + b, "not an etrace_fit checkpoint"),
    (lambda b: b.replace(b'"format_version": 2', b'"format_version": 9'), "format version 9"),
])
def test_damaged_files_raise_checkpoint_error(tmp_path, damage, fragment):
    trainer = ef.Trainer(_model())
    path = tmp_path / "a.ckpt"
    trainer.save(path)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CheckpointError, match=fragment):
        trainer.restore(path)
    with pytest.raises(CheckpointError, match="cannot read"):
        trainer.restore(tmp_path / "missing.ckpt")


def test_model_checkpoint_formats_names_keeps_the_last_n_and_the_best_only(tmp_path):
    x, y = _data()
    every = ModelCheckpoint(str(tmp_path / "all" / "{epoch:02d}-{loss:.3f}.ckpt"), keep_last=2)
    best = ModelCheckpoint(str(tmp_path / "best.ckpt"), monitor="val_accuracy", save_best_only=True)
    trainer = ef.Trainer(_model(), optimizer=optax.adam(1e-2))
    history = trainer.fit(x, y, batch_size=8, epochs=4, validation_split=0.25, callbacks=[every, best], verbose=0)
    names = sorted(p.name for p in (tmp_path / "all").iterdir())
    assert names == [f"{e:02d}-{history.history['loss'][e - 1]:.3f}.ckpt" for e in (3, 4)]
    assert best.best == max(history.history["val_accuracy"])
    with pytest.raises(Exception, match="nope"):
        ef.Trainer(_model()).fit(x, y, epochs=1, verbose=0, callbacks=[ModelCheckpoint(str(tmp_path / "{nope}"))])


def test_backup_and_restore_falls_back_to_the_previous_good_backup(tmp_path):
    x, y = _data()
    backup = tmp_path / "backup"
    trainer = ef.Trainer(_model(), optimizer=optax.adam(1e-2))
    trainer.fit(x, y, batch_size=8, epochs=2, verbose=0,
                callbacks=[BackupAndRestore(str(backup), delete_on_finish=False)])
    latest = backup / "latest.ckpt"
    latest.write_bytes(latest.read_bytes()[:-20])  # a torn latest backup
    resumed = ef.Trainer(_model(), optimizer=optax.adam(1e-2))
    with pytest.warns(UserWarning, match="latest backup is unusable"):
        resumed.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[BackupAndRestore(str(backup))])
    assert resumed.history.epoch == [0, 1, 2]  # epoch 0 from the previous backup, then 1 and 2 again
    assert not backup.exists() or not any(backup.iterdir())  # deleted after a finished run


def test_backups_of_another_model_or_optimizer_are_refused_before_training_and_kept(tmp_path):
    """An edited script (another width, another optimizer) warned, trained from epoch 0
    and rotated the finished run's backups out."""
    x, y = _data()
    backup = tmp_path / "backup"
    crash = LambdaCallback(on_epoch_end=lambda epoch, logs: (_ for _ in ()).throw(KeyboardInterrupt) if epoch == 2
                           else None)
    with pytest.raises(KeyboardInterrupt):
        ef.Trainer(_model(), optimizer=optax.adam(1e-2)).fit(x, y, batch_size=8, epochs=4, verbose=0,
                                                             callbacks=[BackupAndRestore(str(backup)), crash])
    saved = {p.name: p.read_bytes() for p in backup.iterdir()}
    assert set(saved) == {"latest.ckpt", "previous.ckpt"}
    for trainer, what in ((ef.Trainer(_model(hidden=5), optimizer=optax.adam(1e-2)), r"layers\.0\.weight"),
                          (ef.Trainer(_model(), optimizer="sgd"), "optimizer")):
        with pytest.raises(ef.ConfigError, match=rf"(?s)BackupAndRestore: the backups in .*backup are of a run this "
                                                 rf"trainer cannot continue .*latest \(epoch 2\): .*{what}.*\(and 1 "
                                                 rf"older one\(s\) alike\)\. They are "
                                                 rf"left as they are"):
            trainer.fit(x, y, batch_size=8, epochs=4, verbose=0, callbacks=[BackupAndRestore(str(backup))])
        assert trainer.history.epoch == [] and {p.name: p.read_bytes() for p in backup.iterdir()} == saved
    resumed = ef.Trainer(_model(), optimizer=optax.adam(1e-2))  # the run they belong to goes on
    resumed.fit(x, y, batch_size=8, epochs=4, verbose=0, callbacks=[BackupAndRestore(str(backup))])
    assert resumed.history.epoch == [0, 1, 2, 3] and resumed.epoch == 3


SCRIPT = textwrap.dedent("""
    import json, os, signal, sys
    import brainstate, numpy as np, optax
    import etrace_fit as ef
    from etrace_fit import layers as L
    from etrace_fit.callbacks import BackupAndRestore, LambdaCallback
    from etrace_fit.datasets import rate_discrimination
    mode, folder = sys.argv[1], sys.argv[2]
    brainstate.environ.set(dt=1.0)
    rng = np.random.default_rng(0)
    model = ef.Sequential(L.Linear(4, 8, w_init=rng.normal(0, 1.5, (4, 8)).astype(np.float32)), L.LIF(8),
                          L.LeakyRateReadout(8, 2, w_init=rng.normal(0, 0.3, (8, 2)).astype(np.float32)))
    x, y = rate_discrimination(24, seq_len=12, num_channels=4, low_rate=0.05, high_rate=0.4, seed=0)
    callbacks = [] if mode == "straight" else [BackupAndRestore(os.path.join(folder, "backup"))]
    if mode == "killed":
        callbacks.append(LambdaCallback(on_epoch_end=lambda e, logs: os.kill(os.getpid(), signal.SIGKILL) if e == 1 else None))
    trainer = ef.Trainer(model, optimizer=optax.adam(1e-2))
    history = trainer.fit(x, y, batch_size=8, epochs=4, validation_split=0.25, callbacks=callbacks, verbose=0)
    np.savez(os.path.join(folder, mode + ".npz"), *[np.asarray(l) for l in
             __import__("jax").tree.leaves(trainer.get_weights())])
    json.dump(history.history, open(os.path.join(folder, mode + ".json"), "w"))
""")


@pytest.mark.slow
def test_exact_resume_after_sigkill_matches_an_uninterrupted_run_bitwise(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)

    def run(mode):
        return subprocess.run([sys.executable, str(script), mode, str(tmp_path)], cwd=ROOT, capture_output=True,
                              text=True, timeout=600)

    assert run("straight").returncode == 0
    killed = run("killed")
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (tmp_path / "backup" / "latest.ckpt").exists() and not (tmp_path / "killed.npz").exists()
    resumed = run("resumed")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    straight, again = np.load(tmp_path / "straight.npz"), np.load(tmp_path / "resumed.npz")
    assert len(straight.files) == len(again.files) > 0
    for name in straight.files:
        np.testing.assert_array_equal(straight[name], again[name])
    assert json.load(open(tmp_path / "straight.json")) == json.load(open(tmp_path / "resumed.json"))

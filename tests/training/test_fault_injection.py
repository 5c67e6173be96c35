"""Fault injection (issue 13): a training subprocess is killed with SIGKILL at pseudo-random
points — after a batch, inside a checkpoint or CSV write (at an ``fsync``), just before a
rename — then run again with the same callbacks. Every time, the resumed run must end
with weights and history bitwise equal to an uninterrupted run's, a CSV with each
epoch's row once, every ``ModelCheckpoint`` file, and no temporary file left behind.
"""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
EPOCHS = 4

SCRIPT = textwrap.dedent("""
    import json, os, signal, sys
    mode, folder, kind, count, order = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    calls = {"n": 0}

    def kill_at_count():
        calls["n"] += 1
        if calls["n"] == count:
            os.kill(os.getpid(), signal.SIGKILL)

    if mode == "killed" and kind in ("fsync", "replace"):  # inside a write: before the data is safe / renamed
        original = getattr(os, kind)

        def patched(*args, **kwargs):
            kill_at_count()
            return original(*args, **kwargs)

        setattr(os, kind, patched)
    import brainstate, jax, numpy as np, optax
    import etrace_fit as ef
    from etrace_fit import layers as L
    from etrace_fit.callbacks import BackupAndRestore, CSVLogger, LambdaCallback, ModelCheckpoint
    from etrace_fit.datasets import rate_discrimination
    brainstate.environ.set(dt=1.0)
    rng = np.random.default_rng(0)
    model = ef.Sequential(L.Linear(4, 8, w_init=rng.normal(0, 1.5, (4, 8)).astype(np.float32)), L.LIF(8),
                          L.LeakyRateReadout(8, 2, w_init=rng.normal(0, 0.3, (8, 2)).astype(np.float32)))
    x, y = rate_discrimination(24, seq_len=12, num_channels=4, low_rate=0.05, high_rate=0.4, seed=0)
    writers = [CSVLogger(os.path.join(folder, "log.csv")),
               ModelCheckpoint(os.path.join(folder, "ckpt", "{epoch}.ckpt"))]
    callbacks = writers if mode == "straight" else (
        [BackupAndRestore(os.path.join(folder, "backup")), *writers] if order == "backup_first"
        else [*writers, BackupAndRestore(os.path.join(folder, "backup"))])
    if mode == "killed" and kind == "batch":
        callbacks.append(LambdaCallback(on_train_batch_end=lambda b, logs: kill_at_count()))
    trainer = ef.Trainer(model, optimizer=optax.adam(1e-2))
    history = trainer.fit(x, y, batch_size=8, epochs=%d, callbacks=callbacks, verbose=0)
    np.savez(os.path.join(folder, "weights.npz"), *[np.asarray(l) for l in jax.tree.leaves(trainer.get_weights())])
    json.dump({"history": history.history, "epoch": history.epoch}, open(os.path.join(folder, "history.json"), "w"))
""" % EPOCHS)

# (kind, count): the count-th call of os.fsync / os.replace, or the count-th batch (3 per
# epoch). Per epoch the writers call fsync 5 times (CSV row 1, checkpoint file and folder
# 2, backup 2) and replace 4 times (checkpoint 1, backup 1 + rotation 2).
_rng = np.random.default_rng(2026)
TRIALS = ([("fsync", int(n)) for n in _rng.choice(np.arange(1, 5 * EPOCHS), 4, replace=False)]
          + [("replace", int(n)) for n in _rng.choice(np.arange(1, 4 * EPOCHS), 3, replace=False)]
          + [("batch", int(n)) for n in _rng.choice(np.arange(1, 3 * EPOCHS), 3, replace=False)])
assert len(TRIALS) >= 10  # issue 13: at least ten kills


def _run(script, folder, mode, kind="none", count=0, order="backup_last"):
    return subprocess.run([sys.executable, str(script), mode, str(folder), kind, str(count), order], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    folder = tmp_path_factory.mktemp("straight")
    script = folder / "run.py"
    script.write_text(SCRIPT)
    done = _run(script, folder, "straight")
    assert done.returncode == 0, done.stderr[-3000:]
    return script, np.load(folder / "weights.npz"), json.loads((folder / "history.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(len(TRIALS)), ids=[f"{k}{n}" for k, n in TRIALS])
def test_a_run_killed_anywhere_resumes_bitwise_with_complete_callback_output(tmp_path, straight, trial):
    script, weights, history = straight
    kind, count = TRIALS[trial]
    order = "backup_first" if trial % 2 else "backup_last"
    killed = _run(script, tmp_path, "killed", kind, count, order)
    assert killed.returncode == -9, f"the kill point {kind} #{count} was not reached: {killed.stderr[-3000:]}"
    resumed = _run(script, tmp_path, "resumed", order=order)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = np.load(tmp_path / "weights.npz")
    assert len(again.files) == len(weights.files) > 0
    for name in weights.files:
        np.testing.assert_array_equal(again[name], weights[name])
    assert json.loads((tmp_path / "history.json").read_text()) == history
    rows = [line.split(",")[0] for line in (tmp_path / "log.csv").read_text().splitlines()]
    assert rows == ["epoch", *map(str, range(EPOCHS))]
    assert sorted(os.listdir(tmp_path / "ckpt")) == [f"{e}.ckpt" for e in range(1, EPOCHS + 1)]  # no temporary file
    backup = tmp_path / "backup"
    assert not backup.exists() or os.listdir(backup) == []  # backups deleted after the finished run

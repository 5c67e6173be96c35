"""Checkpoints that cannot lie and callbacks that lose nothing (issue 13).

Each test reproduces one failure the issue lists: a manifest edited or bit-flipped, a
manifest naming a file outside its folder, callback state keyed by list position, a
backup rotation that could leave no valid file, a NaN epoch backed up as finished,
writers failing after the first epoch, temporary files left behind, a callable loss
forgotten by ``Trainer.load``, a raw error for another optimizer.
"""

import json
import math
import os
import warnings

import jax
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit.callbacks import BackupAndRestore, CSVLogger, LambdaCallback, ModelCheckpoint, TensorBoard
from etrace_fit.errors import CheckpointError, ConfigError
from etrace_fit.checkpoint import TEMP_PREFIX, read_checkpoint

from _killed import killed_before

from ._helpers import lif_model as _model, rate_data as _data


def _weights(trainer):
    return [np.asarray(leaf) for leaf in jax.tree.leaves(trainer.get_weights())]


def _saved(tmp_path, epochs=2, **kwargs):
    x, y = _data()
    trainer = ef.Trainer(_model(), optimizer="adam", **kwargs)
    trainer.fit(x, y, batch_size=8, epochs=epochs, verbose=0)
    path = tmp_path / "run.ckpt"
    trainer.save(path)
    return trainer, path


# ------------------------------------------------------------------ the checksum covers the manifest
def test_an_edited_epoch_in_the_manifest_is_refused(tmp_path):
    trainer, path = _saved(tmp_path)
    data = path.read_bytes()
    assert data.count(b'"epoch": 1') == 1
    path.write_bytes(data.replace(b'"epoch": 1', b'"epoch": 2'))
    with pytest.raises(CheckpointError, match="checksum of its manifest and payload does not match"):
        trainer.restore(path)


def test_every_bit_flip_in_header_or_manifest_is_a_checkpoint_error(tmp_path):
    """300 single-bit flips spread over the header and the manifest (and 50 in the
    payload): each one raises CheckpointError, never another exception or a load."""
    trainer, path = _saved(tmp_path, epochs=1)
    data = path.read_bytes()
    header_end = data.index(b"\n", len(b"ETRACE-FIT-CHECKPOINT\n")) + 1
    manifest_bytes = json.loads(data[len(b"ETRACE-FIT-CHECKPOINT\n"):header_end])["manifest_bytes"]
    rng = np.random.default_rng(0)
    positions = list(rng.integers(0, header_end + manifest_bytes, 300)) + \
        list(rng.integers(header_end + manifest_bytes, len(data), 50))
    before = _weights(trainer)
    for position in positions:
        damaged = bytearray(data)
        damaged[position] ^= 1 << int(rng.integers(0, 8))
        path.write_bytes(bytes(damaged))
        with pytest.raises(CheckpointError):
            trainer.restore(path)
    for a, b in zip(before, _weights(trainer)):  # nothing was half-loaded
        np.testing.assert_array_equal(a, b)


def _parts(path):
    """``(magic line, header, manifest, payload)`` of a checkpoint file, by its layout."""
    data = path.read_bytes()
    magic = b"ETRACE-FIT-CHECKPOINT\n"
    header_end = data.index(b"\n", len(magic)) + 1
    header = json.loads(data[len(magic):header_end])
    manifest = json.loads(data[header_end:header_end + header["manifest_bytes"]])
    return magic, header, manifest, data[header_end + header["manifest_bytes"]:]


def test_a_format_1_checkpoint_is_still_read_with_a_warning(tmp_path):
    """Files written before 0.3 (checksum over the payload only) load, and say so."""
    import hashlib

    trainer, path = _saved(tmp_path, epochs=1)
    magic, _, manifest, payload = _parts(path)
    manifest.update(format_version=1, payload_bytes=len(payload), payload_sha256=hashlib.sha256(payload).hexdigest())
    old = tmp_path / "old.ckpt"
    old.write_bytes(magic + json.dumps(manifest, sort_keys=True).encode() + b"\n" + payload)
    fresh = ef.Trainer(_model(), optimizer="adam")
    with pytest.warns(UserWarning, match="format 1 checkpoint.*not checksummed"):
        fresh.restore(old)
    for a, b in zip(_weights(trainer), _weights(fresh)):
        np.testing.assert_array_equal(a, b)
    with warnings.catch_warnings(record=True) as caught:  # once, not once per read
        warnings.simplefilter("always")
        ef.Trainer.load(old, _model())
    assert len([w for w in caught if "format 1" in str(w.message)]) == 1


# ------------------------------------------------------------------ what load explains
def test_loading_with_another_optimizer_or_update_every_says_what_differs_and_changes_nothing(tmp_path):
    trainer, path = _saved(tmp_path)
    other = ef.Trainer(_model(), optimizer="sgd")
    before = _weights(other)
    with pytest.raises(CheckpointError, match=r"optimizer 'adam' when saved, 'sgd' now"):
        other.restore(path)
    for a, b in zip(before, _weights(other)):
        np.testing.assert_array_equal(a, b)
    assert other.epoch == -1 and other.history.history == {}
    with pytest.raises(CheckpointError, match=r"update_every None when saved, 4 now"):
        ef.Trainer(_model(), optimizer="adam", update_every=4).restore(path)
    with pytest.raises(CheckpointError, match=r"pass the same optimizer"):
        ef.Trainer(_model(), optimizer=optax.sgd(0.1)).restore(path)


def test_a_checkpoint_saved_before_training_restores_a_fresh_optimizer(tmp_path):
    """Its weights, epoch and history came back while the trained Adam moments and step
    count stayed: the next epoch differed from a fresh trainer restoring the same file."""
    x, y = _data()
    trainer = ef.Trainer(_model(), optimizer="adam")
    trainer.learning_rate = 0.02  # set before the optimizer exists: kept by the file too
    trainer.save(tmp_path / "start.ckpt")
    trainer.fit(x, y, batch_size=8, epochs=2, verbose=0)
    assert trainer.opt_state is not None
    trainer.restore(tmp_path / "start.ckpt")
    assert trainer.opt_state is None and trainer.epoch == -1 and trainer.learning_rate == pytest.approx(0.02)
    fresh = ef.Trainer(_model(), optimizer="adam")
    fresh.restore(tmp_path / "start.ckpt")
    assert fresh.learning_rate == pytest.approx(0.02)
    for again in (trainer, fresh):
        again.fit(x, y, batch_size=8, epochs=1, verbose=0)
    for a, b in zip(_weights(trainer), _weights(fresh)):
        np.testing.assert_array_equal(a, b)


def test_callable_metrics_must_be_passed_again_at_load(tmp_path):
    """They were dropped without a word while the history kept their column."""
    def top1(output, label):
        return (output.argmax(-1) == label).astype(np.float32)

    x, y = _data()
    trainer = ef.Trainer(_model(), optimizer="adam", metrics=["accuracy", top1])
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    trainer.save(tmp_path / "a.ckpt")
    with pytest.raises(ConfigError, match=r"metrics=\['accuracy', 'top1'\] of which \['top1'\] are functions .*"
                                          r"Trainer.load\(path, model, metrics=\[\.\.\.\]\)"):
        ef.Trainer.load(tmp_path / "a.ckpt", _model())
    loaded = ef.Trainer.load(tmp_path / "a.ckpt", _model(), metrics=["accuracy", top1])
    assert set(loaded.evaluate(x, y, verbose=0)) == {"loss", "accuracy", "top1"}


def test_saving_in_the_middle_of_a_stream_says_the_streams_start_afresh(tmp_path):
    x, y = _data(4)
    trainer = ef.Trainer(_model(), optimizer="sgd", stateful=True, loss_on="all")
    targets = np.repeat(np.asarray(y)[:, None], x.shape[1], axis=1)
    trainer.train_on_batch(x, targets)
    with pytest.warns(UserWarning, match=r"in the middle of a stream \(stateful=True\): the checkpoint holds the "
                                         r"weights and optimizer state, not the streams' hidden states"):
        trainer.save(tmp_path / "mid.ckpt")
    trainer.reset_states()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer.save(tmp_path / "end.ckpt")


def test_load_weights_casts_a_checkpoint_of_another_precision_and_restore_says_it_only_differs_there(tmp_path):
    import brainstate
    from etrace_fit import layers as L

    def model():
        brainstate.random.seed(0)
        return ef.Sequential(L.Linear(3, 8), L.LIF(8), L.LeakyRateReadout(8, 2))

    single = ef.Trainer(model(), optimizer="adam")
    single.save(tmp_path / "single.ckpt")
    single.save_weights(tmp_path / "single.weights")
    with brainstate.environ.context(precision=64):
        double = ef.Trainer(model(), optimizer="adam")
        assert {str(v["weight"].dtype) for v in double.get_weights().values()} == {"float64"}
        for path in ("single.weights", "single.ckpt"):
            double.load_weights(tmp_path / path)
            for (name, a), b in zip(double.get_weights().items(), single.get_weights().values()):
                assert a["weight"].dtype == np.float64, name
                np.testing.assert_array_equal(a["weight"], np.asarray(b["weight"], np.float64))
        with pytest.raises(CheckpointError, match=r"(?s)another structure:\n.*float32.*float64.*\nOnly floating dtypes "
                                                  r"differ .*trainer.load_weights\(path\) casts the weights"):
            double.restore(tmp_path / "single.ckpt")
    with pytest.raises(CheckpointError, match=r"another structure"):  # another shape is still refused
        ef.Trainer(_model(hidden=5), optimizer="adam").load_weights(tmp_path / "single.weights")


@pytest.mark.parametrize("path, message", [("", "the checkpoint path is empty"),
                                           ("newdir/", "newdir/ is a folder: give the checkpoint a file name in it")])
def test_a_path_that_cannot_be_a_checkpoint_file_is_refused_before_anything_is_written(tmp_path, monkeypatch,
                                                                                       path, message):
    monkeypatch.chdir(tmp_path / ".." if path == "" else tmp_path)
    before = sorted(os.listdir(".."))
    trainer = ef.Trainer(_model(), optimizer="adam")
    for save in (trainer.save, trainer.save_weights):
        with pytest.raises(CheckpointError, match=message):
            save(path)
    assert sorted(os.listdir("..")) == before and not os.path.exists("newdir")


def test_a_write_that_fails_names_the_checkpoint_not_the_temporary_file(tmp_path, monkeypatch):
    import tempfile

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tempfile, "mkstemp", full_disk)
    with pytest.raises(CheckpointError, match=r"cannot write checkpoint .*run\.ckpt: No space left on device"):
        ef.Trainer(_model(), optimizer="adam").save(tmp_path / "run.ckpt")
    assert os.listdir(tmp_path) == []


def test_a_checkpoint_of_a_newer_version_with_an_unknown_setting_says_so_at_load(tmp_path):
    """A file whose configuration holds a setting this etrace_fit does not know (written
    by a newer version) failed in Trainer.load with Python's raw TypeError from the
    constructor ("unexpected keyword argument")."""
    import hashlib

    trainer, path = _saved(tmp_path, epochs=1)
    magic, header, manifest, payload = _parts(path)
    manifest["config"]["label_smoothing"] = 0.1  # a setting of a newer release
    manifest["package_version"] = "9.0.0"
    written = json.dumps(manifest, sort_keys=True).encode()
    header.update(manifest_bytes=len(written), sha256=hashlib.sha256(written + payload).hexdigest())
    path.write_bytes(magic + json.dumps(header, sort_keys=True).encode() + b"\n" + written + payload)
    with pytest.raises(CheckpointError, match=r"run\.ckpt was written by etrace_fit 9\.0\.0 with settings this "
                                              r"etrace_fit .* does not know: label_smoothing=0\.1; .*load_weights"):
        ef.Trainer.load(path, _model())


def test_a_callable_loss_must_be_passed_again_at_load(tmp_path):
    def halved_cross_entropy(output, label):
        return 0.5 * optax.softmax_cross_entropy_with_integer_labels(output, label)

    x, y = _data()
    trainer = ef.Trainer(_model(), optimizer="adam", loss=halved_cross_entropy)
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    trainer.save(tmp_path / "a.ckpt")
    with pytest.raises(ConfigError, match=r"loss='halved_cross_entropy'.*Trainer.load\(path, model, loss=\.\.\.\)"):
        ef.Trainer.load(tmp_path / "a.ckpt", _model())
    loaded = ef.Trainer.load(tmp_path / "a.ckpt", _model(), loss=halved_cross_entropy)
    assert loaded.evaluate(x, y, verbose=0)["loss"] == pytest.approx(trainer.evaluate(x, y, verbose=0)["loss"])
    named = ef.Trainer(_model(), optimizer="adam", loss="mse", metrics=[])
    named.save(tmp_path / "b.ckpt")
    assert ef.Trainer.load(tmp_path / "b.ckpt", _model()).config["loss"] == "mse"


# ------------------------------------------------------------------ callbacks' files
def test_a_restored_list_never_makes_model_checkpoint_delete_outside_its_folder(tmp_path):
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    checkpoint = ModelCheckpoint(str(tmp_path / "ckpt" / "{epoch}.ckpt"), keep_last=1)
    with pytest.warns(UserWarning, match="outside.*ignored and never deleted"):
        checkpoint.load_state_dict({"best": math.inf, "saved": [str(outside), "../../etc/passwd"]})
    x, y = _data()
    ef.Trainer(_model()).fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[checkpoint])
    assert outside.read_text() == "keep me"
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["2.ckpt"]


def test_callback_state_follows_the_callback_not_its_position(tmp_path):
    """Two ModelCheckpoints swapped between runs each restore their own list (keyed by
    their file pattern), so keep_last deletes only their own old files."""
    x, y = _data()
    backup = str(tmp_path / "backup")

    def checkpoints():
        return (ModelCheckpoint(str(tmp_path / "a" / "{epoch}.ckpt"), keep_last=2),
                ModelCheckpoint(str(tmp_path / "b" / "{epoch}.ckpt"), keep_last=2))

    a, b = checkpoints()
    stop = killed_before(2)  # after epochs 0 and 1
    trainer = ef.Trainer(_model(), optimizer="adam")
    with pytest.raises(KeyboardInterrupt):
        trainer.fit(x, y, batch_size=8, epochs=4, verbose=0, callbacks=[a, b, stop, BackupAndRestore(backup)])
    a, b = checkpoints()
    resumed = ef.Trainer(_model(), optimizer="adam")
    began = []  # the resumed run starts at epoch 2
    record = LambdaCallback(on_epoch_begin=lambda e, logs: began.append(e))
    resumed.fit(x, y, batch_size=8, epochs=4, verbose=0, callbacks=[record, BackupAndRestore(backup), b, a])
    assert began == [2, 3]
    assert a.saved == [str(tmp_path / "a" / "3.ckpt"), str(tmp_path / "a" / "4.ckpt")]
    assert b.saved == [str(tmp_path / "b" / "3.ckpt"), str(tmp_path / "b" / "4.ckpt")]
    assert sorted(os.listdir(tmp_path / "a")) == sorted(os.listdir(tmp_path / "b")) == ["3.ckpt", "4.ckpt"]


@pytest.mark.parametrize("order", ["backup_first", "backup_last"])
def test_an_epoch_interrupted_at_its_end_is_rerun_without_lost_or_doubled_output(tmp_path, order):
    """A crash during epoch 1's end-of-epoch work (after the CSV row and the checkpoint,
    before the backup, whatever the list order): the resumed run redoes epoch 1 and the
    CSV has rows 0..3 once each, every checkpoint file exists."""
    x, y = _data()
    backup, csv_path = str(tmp_path / "backup"), str(tmp_path / "log.csv")

    class Crash(Exception):
        pass

    def crash(epoch, logs):
        if epoch == 1:
            raise Crash

    def callbacks(with_crash):
        listed = [CSVLogger(csv_path), ModelCheckpoint(str(tmp_path / "ckpt" / "{epoch}.ckpt"))]
        listed += [LambdaCallback(on_epoch_end=crash)] if with_crash else []
        return [BackupAndRestore(backup), *listed] if order == "backup_first" else [*listed, BackupAndRestore(backup)]

    with pytest.raises(Crash):
        ef.Trainer(_model(), optimizer="adam").fit(x, y, batch_size=8, epochs=4, verbose=0,
                                                   callbacks=callbacks(True))
    assert read_checkpoint(os.path.join(backup, "latest.ckpt"))[0]["epoch"] == 0  # epoch 1 not backed up
    history = ef.Trainer(_model(), optimizer="adam").fit(x, y, batch_size=8, epochs=4, verbose=0,
                                                         callbacks=callbacks(False))
    with open(csv_path) as handle:
        rows = [line.split(",")[0] for line in handle.read().splitlines()]
    assert rows == ["epoch", "0", "1", "2", "3"]
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["1.ckpt", "2.ckpt", "3.ckpt", "4.ckpt"]
    assert history.epoch == [0, 1, 2, 3]


def test_an_interrupted_backup_write_leaves_the_last_good_backup(tmp_path):
    """Ctrl-C while the second epoch's backup is written: the first epoch's backup is
    still there and valid, and the next run resumes from it."""
    x, y = _data()
    backup = tmp_path / "backup"
    trainer = ef.Trainer(_model(), optimizer="adam")
    original = trainer.save

    def interrupted_save(path):
        if trainer.epoch == 1:
            raise KeyboardInterrupt
        original(path)

    trainer.save = interrupted_save
    with pytest.raises(KeyboardInterrupt):
        trainer.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[BackupAndRestore(str(backup))])
    assert read_checkpoint(backup / "latest.ckpt")[0]["epoch"] == 0
    assert not [p for p in os.listdir(backup) if p.startswith(TEMP_PREFIX)]
    resumed = ef.Trainer(_model(), optimizer="adam")
    assert resumed.fit(x, y, batch_size=8, epochs=3, verbose=0,
                       callbacks=[BackupAndRestore(str(backup))]).epoch == [0, 1, 2]


def test_the_newest_valid_backup_is_used_whichever_file_holds_it(tmp_path):
    """A kill between writing next.ckpt and renaming it leaves next newer than latest."""
    x, y = _data()
    backup = tmp_path / "backup"
    trainer = ef.Trainer(_model(), optimizer="adam")
    trainer.fit(x, y, batch_size=8, epochs=2, verbose=0,
                callbacks=[BackupAndRestore(str(backup), delete_on_finish=False)])
    os.replace(backup / "latest.ckpt", backup / "next.ckpt")  # epoch 1, not yet renamed
    resumed = ef.Trainer(_model(), optimizer="adam")
    assert resumed.fit(x, y, batch_size=8, epochs=3, verbose=0,
                       callbacks=[BackupAndRestore(str(backup))]).epoch == [0, 1, 2]
    assert resumed.history.history["loss"][:2] == trainer.history.history["loss"]


def test_a_non_finite_epoch_is_not_backed_up(tmp_path):
    x, y = _data()
    backup = BackupAndRestore(str(tmp_path / "backup"), delete_on_finish=False)
    trainer = ef.Trainer(_model(), optimizer="adam")
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[backup])
    with pytest.warns(UserWarning, match="epoch 2 ended with loss nan; it is not backed up"):
        backup.on_epoch_end(1, {"loss": float("nan")})
    assert read_checkpoint(tmp_path / "backup" / "latest.ckpt")[0]["epoch"] == 0


@pytest.mark.parametrize("make", [
    lambda blocked: CSVLogger(str(blocked / "log.csv")),
    lambda blocked: ModelCheckpoint(str(blocked / "{epoch}.ckpt")),
    lambda blocked: BackupAndRestore(str(blocked / "backup")),
    lambda blocked: TensorBoard(str(blocked / "tb")),
], ids=["CSVLogger", "ModelCheckpoint", "BackupAndRestore", "TensorBoard"])
def test_an_unwritable_folder_fails_before_the_first_batch_naming_the_path(tmp_path, make):
    blocked = tmp_path / "a_file"
    blocked.write_text("not a folder")  # a path under a file cannot be created, even by root
    batches = []
    callback = make(blocked)
    x, y = _data()
    with pytest.raises(ConfigError, match=rf"{type(callback).__name__}: cannot write to the folder .*a_file"):
        ef.Trainer(_model()).fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[
            callback, LambdaCallback(on_train_batch_begin=lambda b, logs: batches.append(b))])
    assert batches == []


@pytest.mark.parametrize("append", [False, True])
def test_a_csv_filename_that_is_a_folder_fails_before_the_first_batch(tmp_path, append):
    """It was a raw IsADirectoryError: before training without append, after the whole
    first epoch with it."""
    (tmp_path / "log.csv").mkdir()
    batches = []
    x, y = _data()
    with pytest.raises(ConfigError, match=r"CSVLogger: filename .*log\.csv' is a folder; give the path of a "
                                          r"\.csv file"):
        ef.Trainer(_model()).fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[
            CSVLogger(str(tmp_path / "log.csv"), append=append),
            LambdaCallback(on_train_batch_begin=lambda b, logs: batches.append(b))])
    assert batches == []


@pytest.mark.parametrize("changed", [dict(algo="bptt"), dict(loss_on="all"), dict(seed=7), dict(optimizer="nadam"),
                                     dict(update_every=2), dict(grad_clip=0.01)])
def test_backups_of_a_run_with_other_settings_are_refused_and_kept(tmp_path, changed):
    """Another algo, loss placement or seed resumed the run silently: its History mixed
    hybrid and BPTT epochs, its shuffling changed mid-run. So did another optimizer whose
    state has the same shapes (Adam's moments read by NAdam), ``update_every`` or
    ``grad_clip``, which the docs list among what is refused."""
    from _killed import killed_before

    x, y = _data()
    backup = tmp_path / "backup"
    with pytest.raises(KeyboardInterrupt):
        ef.Trainer(_model(), optimizer="adam", seed=0).fit(x, y, batch_size=8, epochs=3, verbose=0,
                                                           callbacks=[killed_before(1), BackupAndRestore(backup)])
    before = (backup / "latest.ckpt").read_bytes()
    key, value = next(iter(changed.items()))
    with pytest.raises(ConfigError, match=rf"BackupAndRestore: .* cannot continue .*: latest \(epoch 1\): {key}="
                                          rf".* when backed up, {value!r} now\. They are left as they are"):
        ef.Trainer(_model(), **{"optimizer": "adam", "seed": 0, **changed}).fit(
            x, y, batch_size=8, epochs=3, verbose=0, callbacks=[BackupAndRestore(backup)])
    assert (backup / "latest.ckpt").read_bytes() == before


def test_temporary_files_of_a_killed_write_are_removed_at_start(tmp_path):
    for folder in ("backup", "ckpt"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / f"{TEMP_PREFIX}abc123").write_bytes(b"torn")
    (tmp_path / "ckpt" / "mine.txt").write_text("not ours")
    x, y = _data()
    ef.Trainer(_model()).fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[
        BackupAndRestore(str(tmp_path / "backup"), delete_on_finish=False),
        ModelCheckpoint(str(tmp_path / "ckpt" / "{epoch}.ckpt"))])
    assert sorted(os.listdir(tmp_path / "backup")) == ["latest.ckpt"]
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["1.ckpt", "mine.txt"]


def test_a_csv_rewrite_killed_midway_leaves_no_temporary_file_after_the_next_start(tmp_path):
    """A resumed CSVLogger rewrites its file without the rows past the resumed epoch,
    through a temporary file beside it; killed there (SIGKILL at its fsync), the
    temporary file stayed in the user's folder for good."""
    import subprocess
    import sys
    import textwrap

    log = tmp_path / "log.csv"
    log.write_text("epoch,loss\n0,0.7\n1,0.6\n2,0.5\n")
    script = textwrap.dedent("""
        import os, signal, sys
        from etrace_fit.callbacks import CSVLogger

        class Resumed:  # a trainer BackupAndRestore resumed at epoch 1
            resume_epoch = 1

        logger = CSVLogger(sys.argv[1])
        logger.set_model(Resumed())
        os.fsync = lambda descriptor: os.kill(os.getpid(), signal.SIGKILL)
        logger.on_train_begin()
    """)
    killed = subprocess.run([sys.executable, "-c", script, str(log)], capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert len(os.listdir(tmp_path)) == 2  # log.csv as it was, and the rewrite's temporary file
    x, y = _data()
    ef.Trainer(_model()).fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[CSVLogger(str(log))])
    assert os.listdir(tmp_path) == ["log.csv"]


def test_terminate_on_nan_with_a_backup_resumes_from_the_last_finite_epoch(tmp_path):
    """The issue's case: a learning rate that blows up in epoch 2 under TerminateOnNaN and
    BackupAndRestore. The NaN epoch is not backed up, so the rerun with a fixed learning
    rate trains from the last finite epoch instead of keeping NaN weights."""
    from etrace_fit.callbacks import LearningRateScheduler, TerminateOnNaN

    x, y = _data()
    targets = np.zeros((len(x), 2), np.float32)
    backup = str(tmp_path / "backup")
    blowing_up = ef.Trainer(_model(), optimizer=optax.inject_hyperparams(optax.sgd)(learning_rate=1e-2),
                            loss="mse", metrics=[])
    explode = LambdaCallback(on_epoch_end=lambda e, logs: setattr(blowing_up, "learning_rate", 1e30))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        blowing_up.fit(x, targets, batch_size=4, epochs=4, verbose=0,
                       callbacks=[explode, TerminateOnNaN(), BackupAndRestore(backup)])
    assert blowing_up.stop_training and len(blowing_up.history.epoch) == 2
    assert not math.isfinite(blowing_up.history.history["loss"][-1])
    assert read_checkpoint(os.path.join(backup, "latest.ckpt"))[0]["epoch"] == 0  # epoch 1 was NaN
    # The rerun resumes with the same optimizer (another one's state would not fit: a
    # ConfigError, tests/training/test_checkpoint.py); the backup holds the rate the run
    # had set, so the fix sets it again as the epochs begin.
    fixed = ef.Trainer(_model(), optimizer=optax.inject_hyperparams(optax.sgd)(learning_rate=1e-2), loss="mse",
                       metrics=[])
    history = fixed.fit(x, targets, batch_size=4, epochs=4, verbose=0, callbacks=[
        BackupAndRestore(backup), LearningRateScheduler(lambda epoch, rate: 1e-2)])
    assert history.epoch == [0, 1, 2, 3]
    assert history.history["loss"][0] == blowing_up.history.history["loss"][0]  # epoch 0 came from the backup
    assert all(math.isfinite(v) for v in history.history["loss"])
    assert all(np.isfinite(w).all() for w in _weights(fixed))

"""``BackupAndRestore``: resume an interrupted ``fit`` exactly where it stopped."""

from __future__ import annotations

import math
import os
import warnings

from ..checkpoint import read_checkpoint, remove_temporaries
from ..distributed import barrier, is_main_process
from ..errors import CheckpointError, ConfigError
from .base import Callback, checked_flag, writable_folder

__all__ = ["BackupAndRestore"]

# Trainer settings a resumed run must share with the backed-up one: they decide the
# gradients (algo, its decay, trace dtype and budget, loss, its placement, regularisers)
# and the batches (seed: the shuffling). Metrics, verbosity and the like may change.
_RUN_SETTINGS = ("algo", "decay", "memory_budget", "trace_dtype", "loss", "loss_callable", "loss_on", "regularizers",
                 "seed", "stateful", "time_major", "optimizer", "update_every", "grad_clip")


class BackupAndRestore(Callback):
    """Backs the run up at the end of every epoch; a new ``fit`` with the same callback
    restores the last backup and continues with the next epoch.

    Guarantees (docs/reliability.md):

    - The backup of an epoch is written after every other callback's end-of-epoch work
      (checkpoint files, CSV rows), whatever the list order; a crash before it re-runs
      the epoch, and the other callbacks write their output for it again in place
      (``CSVLogger`` drops rows past the resumed epoch, so none is doubled).
    - A new backup is written in full (``next.ckpt``) before the older ones rotate
      (``latest`` → ``previous``, ``next`` → ``latest``): a crash at any point leaves at
      least one valid backup. On resume the newest valid file of the three is used; a
      damaged one is skipped with a warning.
    - An epoch whose loss is not finite is not backed up (a run stopped by
      ``TerminateOnNaN`` resumes from the last finite epoch).
    - Temporary files of a killed write are removed when training starts; the folder
      must be writable, checked before training.
    - Backups that read back intact but do not fit the trainer (another model,
      optimizer, ``update_every``, ``algo``, loss, ``loss_on`` or ``seed``: an edited
      script) are a ``ConfigError`` before training, and stay as they are: training
      from scratch would rotate them out.

    The backups are deleted when ``fit`` returns (all its epochs done, or stopped by
    ``EarlyStopping``: the run is finished, as in Keras; a backup records the stop, so
    a run killed before the deletion, or kept with ``delete_on_finish=False``, trains
    no further epoch when started again) — except after an epoch whose
    loss was not finite (``TerminateOnNaN``, or every batch skipped): that run resumes
    from its last finite epoch. An interrupted ``fit`` (an exception, Ctrl-C) keeps them.

    Args:
        backup_dir: the folder for the backups.
        delete_on_finish: remove the backups after a completed run (default True).

    Example::

        trainer.fit(x, y, epochs=50, callbacks=[BackupAndRestore("runs/backup")])
    """

    restores_run = True
    adds_log_keys = False

    def __init__(self, backup_dir: str, delete_on_finish: bool = True):
        self.backup_dir = os.fspath(backup_dir)
        self.delete_on_finish = checked_flag("BackupAndRestore", "delete_on_finish", delete_on_finish)
        self.latest = os.path.join(self.backup_dir, "latest.ckpt")
        self.previous = os.path.join(self.backup_dir, "previous.ckpt")
        self.next = os.path.join(self.backup_dir, "next.ckpt")

    def state_key(self) -> str:
        return f"BackupAndRestore:{self.backup_dir}"

    def _candidates(self) -> list[tuple[int, str, str, dict]]:
        """``(epoch, path, label, saved config)`` of every backup whose file reads back intact."""
        found = []
        for path, label in ((self.next, "next"), (self.latest, "latest"), (self.previous, "previous")):
            if not os.path.exists(path):
                continue
            try:
                manifest, _ = read_checkpoint(path)
                found.append((int(manifest["epoch"]), path, label, dict(manifest.get("config") or {})))
            except (CheckpointError, KeyError, TypeError, ValueError) as error:
                warnings.warn(f"BackupAndRestore: the {label} backup is unusable ({error}); trying an older one")
        return sorted(found, key=lambda c: c[:3], reverse=True)

    def _changed_settings(self, saved: dict) -> list[str]:
        """The trainer's settings that decide what training computes (its rules, loss,
        shuffling) and differ from the backed-up run's: its epochs would go on with
        other gradients or other batches."""
        now = self.model.config

        def comparable(key):  # a regulariser of yours without a __repr__ is named by its address: not comparable
            return key in saved and " at 0x" not in str(saved[key]) + str(now.get(key))

        return [f"{key}={saved[key]!r} when backed up, {now.get(key)!r} now" for key in _RUN_SETTINGS
                if comparable(key) and saved[key] != now.get(key)]

    def state_dict(self) -> dict:
        """Whether the backed-up epoch ended the run (``EarlyStopping``): a resumed run
        that was stopped trains no further epoch."""
        return {"stopped": bool(getattr(self.model, "stop_training", False))}

    def load_state_dict(self, state: dict) -> None:
        self._stopped = bool(state.get("stopped", False))

    def on_train_begin(self, logs=None):
        self._unfinished = False  # the last epoch ended with a non-finite loss: keep the backups
        self._stopped = False
        if is_main_process():  # multi-host: every process restores, process 0 alone writes
            writable_folder(self.backup_dir, "BackupAndRestore")
            remove_temporaries(self.backup_dir)
        barrier("etrace_fit BackupAndRestore begin")
        refused = []
        for epoch, path, label, saved in self._candidates():
            changed = self._changed_settings(saved)
            if changed:
                refused.append(f"{label} (epoch {epoch + 1}): {'; '.join(changed)}")
                continue
            try:
                manifest = self.model._restore(path, note_learning_rate=False)  # the run's own rate
            except CheckpointError as error:  # intact, but not this model's / optimizer's
                refused.append(f"{label} (epoch {epoch + 1}): {error}")
                continue
            if refused:
                warnings.warn(f"BackupAndRestore: resuming from the {label} backup; newer ones do not fit this "
                              f"trainer: {'; '.join(refused)}")
            self.model.resume_epoch = manifest["epoch"] + 1
            if self._stopped:  # EarlyStopping ended the run at that epoch: it is finished
                self.model.resume_epoch = max(self.model.resume_epoch, int(self.params.get("epochs", 0)))
            return
        if refused:  # a run's backups that do not fit this trainer: never trained over, never rotated out
            older = f" (and {len(refused) - 1} older one(s) alike)" if len(refused) > 1 else ""
            raise ConfigError(
                f"BackupAndRestore: the backups in {self.backup_dir} are of a run this trainer cannot continue "
                f"(another model, optimizer, update_every, algo, loss or seed): {refused[0]}"
                f"{older}. They are left as they are: "
                f"resume with the model and optimizer they were written with, or give another backup_dir (or "
                f"delete that folder) to start afresh")

    def on_epoch_end(self, epoch, logs=None):
        loss = (logs or {}).get("loss")
        self._unfinished = loss is not None and not math.isfinite(float(loss))
        if self._unfinished:
            warnings.warn(f"BackupAndRestore: epoch {epoch + 1} ended with loss {loss}; it is not backed up (a "
                          "resumed run starts from the last finite epoch)")
            return
        self.model.save(self.next)  # complete before anything older moves (written by process 0)
        if is_main_process():
            if os.path.exists(self.latest):
                os.replace(self.latest, self.previous)
            os.replace(self.next, self.latest)
        barrier("etrace_fit BackupAndRestore rotated")

    def on_train_end(self, logs=None):
        if self.delete_on_finish and not getattr(self, "_unfinished", False) and is_main_process():
            for path in (self.next, self.previous, self.latest):  # the last epoch's last: a stop between trains none
                if os.path.exists(path):
                    os.remove(path)

"""``BackupAndRestore``: resume an interrupted ``fit`` exactly where it stopped."""

from __future__ import annotations

import os
import warnings

from ..errors import CheckpointError
from .base import Callback

__all__ = ["BackupAndRestore"]


class BackupAndRestore(Callback):
    """Backs the run up at the end of every epoch; a new ``fit`` with the same callback
    restores the last backup and continues with the next epoch.

    Two files are kept in ``backup_dir``: the latest backup and the one before it. If the
    latest is truncated or corrupted, the previous good one is used (with a warning).
    The backups are deleted when ``fit`` finishes all its epochs.

    Args:
        backup_dir: the folder for the backups.
        delete_on_finish: remove the backups after a completed run (default True).

    Example::

        trainer.fit(x, y, epochs=50, callbacks=[BackupAndRestore("runs/backup")])
    """

    def __init__(self, backup_dir: str, delete_on_finish: bool = True):
        self.backup_dir = os.fspath(backup_dir)
        self.delete_on_finish = delete_on_finish
        self.latest = os.path.join(self.backup_dir, "latest.ckpt")
        self.previous = os.path.join(self.backup_dir, "previous.ckpt")

    def on_train_begin(self, logs=None):
        for path, label in ((self.latest, "latest"), (self.previous, "previous")):
            if not os.path.exists(path):
                continue
            try:
                manifest = self.model.restore(path)
            except CheckpointError as error:
                warnings.warn(f"BackupAndRestore: the {label} backup is unusable ({error}); trying an older one")
                continue
            self.model.resume_epoch = manifest["epoch"] + 1
            return

    def on_epoch_end(self, epoch, logs=None):
        os.makedirs(self.backup_dir, exist_ok=True)
        if os.path.exists(self.latest):
            os.replace(self.latest, self.previous)
        self.model.save(self.latest)

    def on_train_end(self, logs=None):
        if self.delete_on_finish and not self.model.stop_training:
            for path in (self.latest, self.previous):
                if os.path.exists(path):
                    os.remove(path)

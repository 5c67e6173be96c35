"""``CSVLogger``: one row per epoch with every logged key."""

from __future__ import annotations

import csv
import os

from .base import Callback

__all__ = ["CSVLogger"]


class CSVLogger(Callback):
    """Writes ``epoch`` and the epoch's logs to a CSV file, one row per epoch.

    Args:
        filename: the CSV file (its folder is created).
        separator: the field separator.
        append: append to an existing file (resumed runs) instead of overwriting it.

    Example::

        trainer.fit(x, y, epochs=5, callbacks=[CSVLogger("runs/log.csv")])
    """

    def __init__(self, filename: str, separator: str = ",", append: bool = False):
        self.filename, self.separator, self.append = os.fspath(filename), separator, append
        self._keys: list[str] | None = None

    def on_train_begin(self, logs=None):
        folder = os.path.dirname(self.filename)
        if folder:
            os.makedirs(folder, exist_ok=True)
        if not self.append and os.path.exists(self.filename):
            os.remove(self.filename)
        self._keys = None

    def on_epoch_end(self, epoch, logs=None):
        logs = dict(logs or {})
        if self._keys is None:
            self._keys = sorted(logs)
        exists = os.path.exists(self.filename) and os.path.getsize(self.filename) > 0
        with open(self.filename, "a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=["epoch", *self._keys], delimiter=self.separator,
                                    extrasaction="ignore")
            if not exists:
                writer.writeheader()
            writer.writerow({"epoch": epoch, **{k: logs.get(k, "") for k in self._keys}})
            handle.flush()

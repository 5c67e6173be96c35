"""``CSVLogger``: one row per epoch with every logged key."""

from __future__ import annotations

import csv
import os

from ..errors import ConfigError
from .base import Callback, writable_folder

__all__ = ["CSVLogger"]


class CSVLogger(Callback):
    """Writes ``epoch`` and the epoch's logs to a CSV file, one row per epoch.

    A run resumed by ``BackupAndRestore`` keeps the rows of the epochs before the
    resumed one and drops any later row (written by the interrupted run for an epoch it
    did not back up), so every epoch has exactly one row, whichever order the callbacks
    are listed in. Each row is flushed and fsynced when written.

    Args:
        filename: the CSV file (its folder is created; it must be writable, checked
            before training).
        separator: the field separator.
        append: append to an existing file instead of overwriting it (a resumed run
            always keeps its earlier rows).

    Example::

        trainer.fit(x, y, epochs=5, callbacks=[CSVLogger("runs/log.csv")])
    """

    adds_log_keys = False

    main_process_only = True

    def __init__(self, filename: str, separator: str = ",", append: bool = False):
        self.filename, self.separator, self.append = os.fspath(filename), separator, append
        self._keys: list[str] | None = None
        # data rows the file held when this run began (append=True): a resume keeps them all,
        # whatever their epochs (an earlier fit's epochs 2-3 were dropped by a resume at epoch 3)
        self._rows_before: int | None = None

    def state_dict(self) -> dict:
        return {"rows_before": self._rows_before}

    def load_state_dict(self, state: dict) -> None:
        self._rows_before = state.get("rows_before")

    def state_key(self) -> str:
        return f"CSVLogger:{self.filename}"

    def on_train_begin(self, logs=None):
        writable_folder(os.path.dirname(self.filename), "CSVLogger")
        if os.path.isdir(self.filename):
            raise ConfigError(f"CSVLogger: filename {self.filename!r} is a folder; give the path of a .csv file in it "
                              f"(e.g. {os.path.join(self.filename, 'log.csv')!r})")
        if os.path.exists(self.filename) and not os.access(self.filename, os.W_OK):
            raise ConfigError(f"CSVLogger: cannot write to {self.filename!r} (read-only); give a writable path")
        self._keys = None
        resume = getattr(self.model, "resume_epoch", None)
        if resume is not None:  # keep the rows of the epochs the backup holds
            self._keep_rows_before(resume)
            return
        if not self.append and os.path.exists(self.filename):
            os.remove(self.filename)
        self._rows_before = self._data_rows()

    def _data_rows(self) -> int:
        if not os.path.exists(self.filename):
            return 0
        with open(self.filename, newline="") as handle:
            return max(len([row for row in csv.reader(handle, delimiter=self.separator) if row]) - 1, 0)

    def _keep_rows_before(self, epoch: int) -> None:
        if not os.path.exists(self.filename):
            return
        with open(self.filename, newline="") as handle:
            rows = list(csv.reader(handle, delimiter=self.separator))
        if not rows or rows[0][:1] != ["epoch"]:
            return
        earlier = self._rows_before or 0  # an earlier run's rows (append=True), kept whatever their epochs
        rows = [row for row in rows if row]
        kept = rows[:1 + earlier] + [row for row in rows[1 + earlier:] if row[0].isdigit() and int(row[0]) < epoch]
        if len(kept) == len(rows):
            self._keys = rows[0][1:]
            return
        temporary = self.filename + ".rewrite"
        with open(temporary, "w", newline="") as handle:
            csv.writer(handle, delimiter=self.separator).writerows(kept)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.filename)
        self._keys = rows[0][1:]

    def on_epoch_end(self, epoch, logs=None):
        logs = dict(logs or {})
        if self._keys is None:  # with the keys of epochs to come (val_* when validation_freq > 1), as Keras 3
            self._keys = sorted(set(logs) | set(getattr(self.model, "fit_log_keys", None) or ()))
        exists = os.path.exists(self.filename) and os.path.getsize(self.filename) > 0
        with open(self.filename, "a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=["epoch", *self._keys], delimiter=self.separator,
                                    extrasaction="ignore")
            if not exists:
                writer.writeheader()
            writer.writerow({"epoch": epoch, **{k: logs.get(k, "NA") for k in self._keys}})  # Keras: NA
            handle.flush()
            os.fsync(handle.fileno())

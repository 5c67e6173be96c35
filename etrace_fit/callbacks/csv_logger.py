"""``CSVLogger``: one row per epoch with every logged key."""

from __future__ import annotations

import csv
import glob
import os
import tempfile
import warnings

from ..errors import ConfigError
from .base import Callback, checked_flag, writable_folder

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
            always keeps its earlier rows). When this run logs keys the file has no
            column for (``val_*`` after a fit without validation), the file is rewritten
            with the union of the columns, its earlier rows empty in the new ones, with a
            warning: every row keeps its header's fields.

    Example::

        trainer.fit(x, y, epochs=5, callbacks=[CSVLogger("runs/log.csv")])
    """

    adds_log_keys = False

    main_process_only = True

    def __init__(self, filename: str, separator: str = ",", append: bool = False):
        if not isinstance(separator, str) or len(separator) != 1:
            raise ConfigError(f"CSVLogger: separator must be one character, got {separator!r}")
        self.filename, self.separator = os.fspath(filename), separator
        self.append = checked_flag("CSVLogger", "append", append)
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
        for leftover in glob.glob(glob.escape(self.filename) + ".????????.tmp"):  # a killed _rewrite's (mkstemp)
            os.remove(leftover)
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
        if len(kept) != len(rows):
            self._rewrite(kept)
        self._keys = rows[0][1:]

    def _rewrite(self, rows: list[list[str]]) -> None:
        """Replace the file by ``rows`` atomically: written to a temporary file beside it,
        fsynced, then renamed over it, so a crash leaves the old file or the new one."""
        folder = os.path.dirname(os.path.abspath(self.filename))
        descriptor, temporary = tempfile.mkstemp(prefix=os.path.basename(self.filename) + ".", suffix=".tmp",
                                                 dir=folder)
        try:
            with os.fdopen(descriptor, "w", newline="") as handle:
                csv.writer(handle, delimiter=self.separator).writerows(rows)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, self.filename)
        except BaseException:
            if os.path.exists(temporary):
                os.remove(temporary)
            raise

    def _columns(self, keys: list[str]) -> list[str]:
        """The columns (after ``epoch``) this run writes: ``keys``, or with ``append=True``
        onto a file with other columns, the file's then the new ones, after the file is
        rewritten with them (its rows empty there). Appended as they were, rows of another
        width came under the old header."""
        if not os.path.exists(self.filename) or os.path.getsize(self.filename) == 0:
            return keys
        with open(self.filename, newline="") as handle:
            rows = [row for row in csv.reader(handle, delimiter=self.separator) if row]
        if not rows:
            return keys
        columns = rows[0][1:]
        added = [key for key in keys if key not in columns]
        if not added:  # this run's rows get NA in the columns it does not log, as Keras writes a missing key
            return columns
        width = 1 + len(columns) + len(added)
        self._rewrite([[*rows[0], *added], *(row + [""] * (width - len(row)) for row in rows[1:])])
        warnings.warn(f"CSVLogger: {self.filename!r} has no column for {', '.join(added)}, which this run logs; the "
                      f"file is rewritten with them added (its {len(rows) - 1} earlier rows left empty there)",
                      UserWarning, stacklevel=3)
        return columns + added

    def on_epoch_end(self, epoch, logs=None):
        logs = dict(logs or {})
        if self._keys is None:  # with the keys of epochs to come (val_* when validation_freq > 1), as Keras 3
            self._keys = self._columns(sorted(set(logs) | set(getattr(self.model, "fit_log_keys", None) or ())))
        exists = os.path.exists(self.filename) and os.path.getsize(self.filename) > 0
        with open(self.filename, "a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=["epoch", *self._keys], delimiter=self.separator,
                                    extrasaction="ignore")
            if not exists:
                writer.writeheader()
            writer.writerow({"epoch": epoch, **{k: logs.get(k, "NA") for k in self._keys}})  # Keras: NA
            handle.flush()
            os.fsync(handle.fileno())

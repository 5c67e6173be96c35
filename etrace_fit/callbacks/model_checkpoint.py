"""``ModelCheckpoint``: save the trainer when an epoch ends, optionally only the best."""

from __future__ import annotations

import os
import string
import warnings

from ..checkpoint import remove_temporaries
from ..errors import ConfigError
from .base import Monitor, MonitoredCallback, check_verbose_flag, writable_folder

__all__ = ["ModelCheckpoint"]


class ModelCheckpoint(MonitoredCallback):
    """Saves ``trainer.save(path)`` at the end of epochs.

    Args:
        filepath: a path template formatted with ``epoch`` (1-based, as Keras) and the
            epoch's logs, e.g. ``"ckpt/{epoch:03d}-{val_loss:.3f}.ckpt"``.
        monitor: the logged key that decides "best".
        verbose: 1 prints each save (Keras' line).
        save_best_only: save only when ``monitor`` improves.
        mode: ``"min"``, ``"max"`` or ``"auto"``.
        keep_last: keep only the newest N files this callback wrote (None: all). Only
            files inside the folder of ``filepath`` are ever deleted, whatever a
            restored checkpoint lists.

    ``monitor`` (with ``save_best_only``) and the keys ``filepath`` names must be keys
    the fit logs, checked before training; an epoch that did not validate
    (``validation_freq``) is skipped when they are validation values. The folder (the
    part of ``filepath`` before any ``{field}``) must be writable, checked before
    training; temporary files a killed write left there are removed.
    State is saved under ``"ModelCheckpoint:<filepath>"``, so several checkpoints keep
    their own lists when reordered between runs.

    Example::

        ModelCheckpoint("ckpt/{epoch:03d}-{val_accuracy:.3f}.ckpt", monitor="val_accuracy", save_best_only=True)
    """

    main_process_only = True

    def __init__(self, filepath: str, monitor: str = "val_loss", verbose: int = 0, save_best_only: bool = False,
                 mode: str = "auto", keep_last: int | None = None):
        self.verbose = check_verbose_flag("ModelCheckpoint", verbose)  # first: a mode given where it was
        if keep_last is not None and keep_last < 1:
            raise ConfigError(f"ModelCheckpoint: keep_last must be a positive int or None, got {keep_last!r}")
        self._monitor = Monitor("ModelCheckpoint", monitor, mode)
        self.filepath, self.monitor, self.mode = os.fspath(filepath), monitor, self._monitor.mode
        self.save_best_only, self.keep_last = save_best_only, keep_last
        self.saved: list[str] = []

    def state_key(self) -> str:
        return f"ModelCheckpoint:{self.filepath}"

    def _base_folder(self) -> str:
        """The folder of ``filepath`` up to its first ``{field}``."""
        first = self.filepath.find("{")
        return os.path.dirname(self.filepath if first < 0 else self.filepath[:first])

    def _inside(self, path: str) -> bool:
        root = os.path.realpath(self._base_folder() or ".")
        return os.path.commonpath([root, os.path.realpath(path)]) == root

    def _fields(self) -> list[str]:
        """The logged keys ``filepath`` names (``{val_loss:.3f}`` names ``val_loss``)."""
        return [field.split(".")[0].split("[")[0] for _, field, _, _ in string.Formatter().parse(self.filepath)
                if field and field != "epoch"]

    def on_train_begin(self, logs=None):
        if self.save_best_only:
            self._check_monitor()
        for field in self._fields():
            Monitor("ModelCheckpoint", field).check(self.model, self._others(), what="filepath field")
        folder = writable_folder(self._base_folder(), "ModelCheckpoint")
        remove_temporaries(folder)

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        if self.save_best_only:
            value = self._current(epoch, logs)
            if value is None or not self._monitor.improves(value):
                if self.verbose and value is not None:
                    print(f"Epoch {epoch + 1}: {self.monitor} did not improve from {self.best:.5f}")
                return
            previous, self.best = self.best, value
        validates = getattr(self.model, "validates_epoch", None)
        if validates is not None and not validates(epoch) and any(
                f.startswith("val_") and f not in logs for f in self._fields()):
            return  # the name needs a validation value this epoch does not have (validation_freq)
        try:
            path = self.filepath.format(epoch=epoch + 1, **logs)
        except KeyError as error:
            raise ConfigError(f"ModelCheckpoint: {self.filepath!r} names {error}, which is not logged; logged keys: "
                              f"epoch, {', '.join(sorted(logs))}") from None
        folder = os.path.dirname(path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        self.model.save(path)
        if self.verbose:
            gain = (f"{self.monitor} improved from {previous:.5f} to {self.best:.5f}, " if self.save_best_only
                    else "")
            print(f"Epoch {epoch + 1}: {gain}saving model to {path}")
        if path in self.saved:
            self.saved.remove(path)
        self.saved.append(path)
        while self.keep_last is not None and len(self.saved) > self.keep_last:
            old = self.saved.pop(0)
            if os.path.exists(old) and self._inside(old):
                os.remove(old)

    def state_dict(self):
        return {"best": self.best, "saved": list(self.saved)}

    def load_state_dict(self, state):
        saved = [str(p) for p in state.get("saved", [])]
        outside = [p for p in saved if not self._inside(p)]
        if outside:
            warnings.warn(f"ModelCheckpoint: the restored list names files outside {self._base_folder() or '.'!r} "
                          f"({', '.join(map(repr, outside))}); they are ignored and never deleted")
        self.best, self.saved = float(state.get("best", self.best)), [p for p in saved if p not in outside]

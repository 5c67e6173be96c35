"""``ModelCheckpoint``: save the trainer when an epoch ends, optionally only the best."""

from __future__ import annotations

import os

from ..errors import ConfigError
from .base import Monitor, MonitoredCallback

__all__ = ["ModelCheckpoint"]


class ModelCheckpoint(MonitoredCallback):
    """Saves ``trainer.save(path)`` at the end of epochs.

    Args:
        filepath: a path template formatted with ``epoch`` (1-based, as Keras) and the
            epoch's logs, e.g. ``"ckpt/{epoch:03d}-{val_loss:.3f}.ckpt"``.
        monitor: the logged key that decides "best".
        mode: ``"min"``, ``"max"`` or ``"auto"``.
        save_best_only: save only when ``monitor`` improves.
        keep_last: keep only the newest N files this callback wrote (None: all).

    Example::

        ModelCheckpoint("ckpt/{epoch:03d}-{val_accuracy:.3f}.ckpt", monitor="val_accuracy", save_best_only=True)
    """

    def __init__(self, filepath: str, monitor: str = "val_loss", mode: str = "auto", save_best_only: bool = False,
                 keep_last: int | None = None):
        if keep_last is not None and keep_last < 1:
            raise ConfigError(f"ModelCheckpoint: keep_last must be a positive int or None, got {keep_last!r}")
        self._monitor = Monitor("ModelCheckpoint", monitor, mode)
        self.filepath, self.monitor, self.mode = os.fspath(filepath), monitor, self._monitor.mode
        self.save_best_only, self.keep_last = save_best_only, keep_last
        self.saved: list[str] = []

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        if self.save_best_only:
            value = self._monitor.value(logs)
            if not self._monitor.improves(value):
                return
            self.best = value
        try:
            path = self.filepath.format(epoch=epoch + 1, **logs)
        except KeyError as error:
            raise ConfigError(f"ModelCheckpoint: {self.filepath!r} names {error}, which is not logged; logged keys: "
                              f"epoch, {', '.join(sorted(logs))}") from None
        folder = os.path.dirname(path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        self.model.save(path)
        if path in self.saved:
            self.saved.remove(path)
        self.saved.append(path)
        while self.keep_last is not None and len(self.saved) > self.keep_last:
            old = self.saved.pop(0)
            if os.path.exists(old):
                os.remove(old)

    def state_dict(self):
        return {"best": self.best, "saved": list(self.saved)}

    def load_state_dict(self, state):
        self.best, self.saved = state["best"], list(state["saved"])

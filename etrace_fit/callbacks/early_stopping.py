"""``EarlyStopping``: stop when a monitored value stops improving."""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .base import Monitor, MonitoredCallback, check_verbose_flag, checked_flag, checked_int, checked_number

__all__ = ["EarlyStopping"]


class EarlyStopping(MonitoredCallback):
    """Stops training when ``monitor`` has not improved by ``min_delta`` for ``patience`` epochs.

    Args:
        monitor: the logged key to watch (``"val_loss"``, ``"val_accuracy"``, ...).
        min_delta: the smallest change that counts as an improvement.
        patience: epochs without improvement before stopping.
        verbose: 1 prints when it stops and when it restores the best weights (Keras' lines).
        mode: ``"min"``, ``"max"`` or ``"auto"`` (``max`` for accuracy-like keys).
        baseline: stop if the value does not beat this within ``patience`` epochs (as in
            Keras, the best epoch is still tracked, and its weights restored, when none
            beats it).
        restore_best_weights: put the best epoch's weights back when stopping or at the end
            (a run resumed by ``BackupAndRestore`` keeps them: they are saved in its backups).
        start_from_epoch: epochs of warm-up before the monitor is watched (Keras'; the
            epochs before it neither improve nor count towards ``patience``).

    An epoch that did not validate (``validation_freq``) is skipped when ``monitor`` is a
    validation value; a ``monitor`` the fit will not log is a ``ConfigError`` before training.

    Example::

        trainer.fit(x, y, validation_split=0.2, callbacks=[EarlyStopping("val_loss", patience=3)])
    """

    def __init__(self, monitor: str = "val_loss", min_delta: float = 0.0, patience: int = 0, verbose: int = 0,
                 mode: str = "auto", baseline: float | None = None, restore_best_weights: bool = False,
                 start_from_epoch: int = 0):
        self.verbose = check_verbose_flag("EarlyStopping", verbose)  # first: a mode given where it was
        self.start_from_epoch = checked_int("EarlyStopping", "start_from_epoch", start_from_epoch)
        patience = checked_int("EarlyStopping", "patience", patience)
        baseline = checked_number("EarlyStopping", "baseline", baseline, optional=True)
        restore_best_weights = checked_flag("EarlyStopping", "restore_best_weights", restore_best_weights)
        self._monitor = Monitor("EarlyStopping", monitor, mode, min_delta)
        self.monitor, self.mode, self.patience = monitor, self._monitor.mode, patience
        self.baseline, self.restore_best_weights = baseline, restore_best_weights
        self.wait, self.best_epoch, self.stopped_epoch = 0, -1, -1
        self.best_weights: Any = None

    def on_train_begin(self, logs=None):
        self._check_monitor()
        if self._new_run():  # Keras: a reused instance starts afresh (a restored run keeps its progress)
            self._monitor.reset()
            self.wait, self.best_epoch, self.stopped_epoch, self.best_weights = 0, -1, -1, None

    def on_epoch_end(self, epoch, logs=None):
        value = self._current(epoch, logs)
        if value is None or epoch < self.start_from_epoch:  # Keras: the warm-up is not watched
            return
        if self._monitor.improves(value):
            self._monitor.best, self.best_epoch = value, epoch
            if self.restore_best_weights:
                self.best_weights = self.model.get_weights()
            # Keras: the wait starts again only for a value that beats the baseline too; the best
            # epoch (and its weights) is tracked either way, so a run that never beats the
            # baseline still ends on its best weights; an improving epoch never stops the run
            beats_baseline = self.baseline is None or self._monitor.improves(value, self.baseline)
            self.wait = 0 if beats_baseline else self.wait + 1
            return
        self.wait += 1
        if self.wait >= max(self.patience, 1) and epoch > 0:  # Keras: never after the first epoch (a NaN there)
            self.stopped_epoch = epoch
            self.model.stop_training = True
            if self.verbose:
                print(f"Epoch {epoch + 1}: early stopping")

    def on_train_end(self, logs=None):
        if self.restore_best_weights and self.best_weights is not None:
            if self.verbose:
                print(f"Restoring model weights from the end of the best epoch: {self.best_epoch + 1}.")
            self.model.set_weights(self.best_weights)

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "wait": self.wait, "best_epoch": self.best_epoch, "stopped_epoch": self.stopped_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.wait = state["best"], state["wait"]
        self.best_epoch, self.stopped_epoch = state["best_epoch"], state["stopped_epoch"]

    def array_state(self) -> Any:
        if not self.restore_best_weights or self.best_weights is None:
            return None
        return {str(i): np.asarray(leaf) for i, leaf in enumerate(jax.tree.leaves(self.best_weights))}

    def load_array_state(self, arrays: Any) -> None:
        structure = jax.tree.structure(self.model.get_weights())
        if len(arrays) != structure.num_leaves:
            warnings.warn(f"EarlyStopping: the saved best weights have {len(arrays)} arrays, the model "
                          f"{structure.num_leaves}; they are not restored")
            return
        self.best_weights = jax.tree.unflatten(structure, [jnp.asarray(arrays[str(i)]) for i in range(len(arrays))])

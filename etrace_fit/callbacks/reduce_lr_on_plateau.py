"""``ReduceLROnPlateau``: lower the learning rate when a monitored value stalls."""

from __future__ import annotations

import numpy as np

from typing import Any

from ..errors import ConfigError
from .base import Monitor, MonitoredCallback, check_verbose_flag, checked_int, checked_number

__all__ = ["ReduceLROnPlateau"]


class ReduceLROnPlateau(MonitoredCallback):
    """Multiplies the learning rate by ``factor`` after ``patience`` epochs without improvement.

    Args:
        monitor: the logged key to watch; mode: ``"min"``, ``"max"`` or ``"auto"``.
        factor: in (0, 1); patience: epochs to wait; min_delta: the smallest improvement;
        cooldown: epochs to wait after a reduction; min_lr: the floor; verbose: 1 prints
        each reduction (Keras' line).

    The optimizer must be built with ``optax.inject_hyperparams`` (or given by name),
    checked before training. An epoch that did not validate is skipped when ``monitor``
    is a validation value.

    Example::

        ReduceLROnPlateau("val_loss", factor=0.5, patience=2, min_lr=1e-5)
    """

    def __init__(self, monitor: str = "val_loss", factor: float = 0.1, patience: int = 10, verbose: int = 0,
                 mode: str = "auto", min_delta: float = 1e-4, cooldown: int = 0, min_lr: float = 0.0):
        self.verbose = check_verbose_flag("ReduceLROnPlateau", verbose)  # first: a mode given where it was
        factor = checked_number("ReduceLROnPlateau", "factor", factor, low=0.0, high=1.0)  # Keras: factor < 1
        patience = checked_int("ReduceLROnPlateau", "patience", patience)
        cooldown = checked_int("ReduceLROnPlateau", "cooldown", cooldown)
        min_lr = checked_number("ReduceLROnPlateau", "min_lr", min_lr, low=0.0)
        self._monitor = Monitor("ReduceLROnPlateau", monitor, mode, min_delta)
        self.monitor, self.factor, self.patience, self.mode = monitor, factor, patience, self._monitor.mode
        self.cooldown, self.min_lr = cooldown, min_lr
        self.wait = self.cooldown_left = 0

    def on_train_begin(self, logs=None):
        self._check_monitor()
        if self._new_run():  # Keras: a reused instance starts afresh (a restored run keeps its progress)
            self._monitor.reset()
            self.wait = self.cooldown_left = 0
        if not self.model.learning_rate_settable:
            raise ConfigError("ReduceLROnPlateau changes the learning rate: build the optimizer with "
                              "optax.inject_hyperparams, e.g. optax.inject_hyperparams(optax.adam)"
                              "(learning_rate=1e-3), or give it by name (optimizer='adam')")

    def on_epoch_end(self, epoch, logs=None):
        value = self._current(epoch, logs)
        if value is None:
            return
        improved = self._monitor.improves(value)
        if self.cooldown_left > 0:
            self.cooldown_left -= 1
            self.wait = 0
        if improved:
            self.best, self.wait = value, 0
            return
        if self.cooldown_left > 0:
            return
        self.wait += 1
        if self.wait >= self.patience:
            current = self.model.learning_rate
            if current is None:
                raise ConfigError("ReduceLROnPlateau needs an optimizer built with optax.inject_hyperparams")
            # as Keras, at the rate's float32: 0.1 read back as 0.10000000149 stayed above min_lr=0.1
            # and "reduced" to itself every epoch
            if np.float32(current) > np.float32(self.min_lr):
                self.model.learning_rate = max(current * self.factor, self.min_lr)
                if self.verbose:
                    print(f"Epoch {epoch + 1}: ReduceLROnPlateau reducing learning rate to {self.model.learning_rate}.")
            self.wait, self.cooldown_left = 0, self.cooldown

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "wait": self.wait, "cooldown_left": self.cooldown_left}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.wait, self.cooldown_left = state["best"], state["wait"], state["cooldown_left"]

"""``LearningRateScheduler``: set the learning rate at the start of every epoch."""

from __future__ import annotations

from typing import Callable

from ..errors import ConfigError
from .base import Callback, check_verbose_flag, checked_learning_rate

__all__ = ["LearningRateScheduler"]


class LearningRateScheduler(Callback):
    """Sets ``trainer.learning_rate = schedule(epoch, current)`` before each epoch (or
    ``schedule(epoch)``: Keras takes a one-argument schedule too).

    The optimizer must be built with ``optax.inject_hyperparams`` so its learning rate is
    state, not a constant (or given by name; checked before training); the value then
    shows in ``logs["learning_rate"]``.

    Example::

        trainer = Trainer(model, optimizer=optax.inject_hyperparams(optax.adam)(learning_rate=1e-3))
        trainer.fit(x, y, callbacks=[LearningRateScheduler(lambda epoch, lr: lr * 0.9)])
    """

    def __init__(self, schedule: Callable[[int, float], float], verbose: int = 0):
        if not callable(schedule):
            raise ConfigError(f"LearningRateScheduler: schedule must be a function (epoch, lr) -> lr or "
                              f"(epoch) -> lr, got {type(schedule).__name__}")
        self.schedule, self.verbose = schedule, check_verbose_flag("LearningRateScheduler", verbose)
        self._takes_rate = _positional_count(schedule) != 1

    adds_log_keys = False

    def on_train_begin(self, logs=None):
        if not self.model.learning_rate_settable:
            raise ConfigError("LearningRateScheduler sets the learning rate: build the optimizer with "
                              "optax.inject_hyperparams, e.g. optax.inject_hyperparams(optax.adam)"
                              "(learning_rate=1e-3), or give it by name (optimizer='adam')")

    def on_epoch_begin(self, epoch, logs=None):
        given = self.schedule(epoch, self.model.learning_rate) if self._takes_rate else self.schedule(epoch)
        value = checked_learning_rate(given, f"LearningRateScheduler: the schedule's rate for epoch {epoch + 1}")
        self.model.learning_rate = value
        if self.verbose:
            print(f"LearningRateScheduler: epoch {epoch + 1} learning rate {value:.6g}")


def _positional_count(function: Callable) -> int | None:
    """How many positional arguments ``function`` takes (None: any number, or unknown)."""
    import inspect

    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: called as (epoch, lr)
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters)

"""``TerminateOnNaN``: stop as soon as a batch's loss is NaN or infinite."""

from __future__ import annotations

import math

from .base import Callback

__all__ = ["TerminateOnNaN"]


class TerminateOnNaN(Callback):
    """Sets ``trainer.stop_training`` when ``logs["loss"]`` of a batch is not finite.

    Example::

        trainer.fit(x, y, callbacks=[TerminateOnNaN()])
    """

    adds_log_keys = False

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(loss):
            print(f"TerminateOnNaN: batch {batch} has loss {loss}; stopping")
            self.model.stop_training = True

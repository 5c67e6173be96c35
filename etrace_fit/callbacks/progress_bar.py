"""``ProgressBar``: a tqdm bar per epoch with loss, metrics and throughput."""

from __future__ import annotations

import time

import jax
from tqdm.auto import tqdm

from .base import Callback

__all__ = ["ProgressBar"]


class ProgressBar(Callback):
    """One ``tqdm.auto`` bar per epoch; the postfix shows the running loss and metrics,
    sequences per second and time steps per second. ``Trainer.fit(verbose=1)`` adds one.

    Args:
        total: batches per epoch, when known (the bar's length).

    Example::

        trainer.fit(x, y, epochs=3, verbose=0, callbacks=[ProgressBar()])
    """

    #: Seconds between reads of the batch logs (the postfix's running means).
    refresh_seconds = 0.2

    def __init__(self, total: int | None = None, leave: bool = True):
        self.total, self.leave = total, leave
        self._bar = None

    def on_epoch_begin(self, epoch, logs=None):
        epochs = getattr(self.trainer, "epochs", None)
        label = f"epoch {epoch + 1}" + (f"/{epochs}" if epochs else "")
        self._bar = tqdm(total=self.total, desc=label, unit="batch", leave=self.leave, dynamic_ncols=True)
        self._start, self._sequences, self._steps = time.perf_counter(), 0, 0
        self._sums: dict[str, float] = {}
        self._count = 0
        self._pending: list = []  # batch logs not yet read (reading waits for the device)
        self._shown = 0.0

    def on_train_batch_begin(self, batch, logs=None):
        logs = logs or {}
        self._sequences += int(logs.get("size", 0))
        self._steps += int(logs.get("size", 0)) * int(logs.get("time_steps", 0))

    def on_train_batch_end(self, batch, logs=None):
        self._count += 1
        self._pending.append(getattr(logs, "raw", logs) or {})
        now = time.perf_counter()
        if now - self._shown >= self.refresh_seconds or self._count == self.total:
            # Read the pending logs at most every refresh_seconds: each read waits for
            # the device, which otherwise runs ahead of the Python loop.
            for pending in jax.device_get(self._pending):
                for key, value in pending.items():
                    self._sums[key] = self._sums.get(key, 0.0) + float(value)
            self._read, self._pending, self._shown = self._count, [], now
            elapsed = max(now - self._start, 1e-9)
            postfix = {key: f"{value / self._read:.4f}" for key, value in self._sums.items()}
            postfix["seq/s"] = f"{self._sequences / elapsed:.0f}"
            postfix["steps/s"] = f"{self._steps / elapsed:.0f}"
            self._bar.set_postfix(postfix, refresh=False)
        self._bar.update(1)

    def on_epoch_end(self, epoch, logs=None):
        if self._bar is not None:
            shown = {k: f"{v:.4f}" for k, v in (logs or {}).items()}
            self._bar.set_postfix(shown)
            self._bar.close()
            self._bar = None

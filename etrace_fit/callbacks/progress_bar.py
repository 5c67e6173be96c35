"""``ProgressBar``: a tqdm bar per epoch, then one line with every metric."""

from __future__ import annotations

import sys
import time
from typing import Mapping

from tqdm.auto import tqdm

from .base import Callback

__all__ = ["ProgressBar", "StepsBar", "epoch_line"]


def epoch_line(epoch: int, epochs: int | None, logs: Mapping[str, float], seconds: float) -> str:
    """Keras' end-of-epoch line: ``Epoch 3/10 - 1.2s - loss: 0.4310 - accuracy: 0.8125``
    (every logged value, never cut)."""
    def value(v: float) -> str:
        return f"{v:.4g}" if v and (abs(v) < 1e-3 or abs(v) >= 1e5) else f"{v:.4f}"

    shown = " - ".join(f"{key}: {value(float(v))}" for key, v in logs.items())
    head = f"Epoch {epoch + 1}" + (f"/{epochs}" if epochs else "")
    return f"{head} - {seconds:.1f}s" + (f" - {shown}" if shown else "")


class ProgressBar(Callback):
    """During an epoch, a ``tqdm.auto`` bar whose postfix shows the running loss and
    metrics, sequences per second and time steps per second; at its end the bar goes and
    one line with *every* logged value (validation included) stays, as Keras prints
    it. When the output is not a terminal (a log file, CI) there is no bar, only the
    line per epoch. ``Trainer.fit(verbose=1)`` (the default) adds one.

    Args:
        total: batches per epoch, when known (the bar's length; ``fit`` passes it).
        file: where to write (default ``sys.stderr``, as tqdm).
        bar: ``True``/``False`` to force the bar on or off (default: only on a terminal
            or in a notebook).
        ncols: the bar's width in characters (default: the terminal's, followed as it
            changes).

    Example::

        trainer.fit(x, y, epochs=3, verbose=0, callbacks=[ProgressBar()])
    """

    adds_log_keys = False

    main_process_only = True

    #: Seconds between reads of the batch logs (the postfix's running means).
    refresh_seconds = 0.2

    def __init__(self, total: int | None = None, file=None, bar: bool | None = None, ncols: int | None = None):
        self.total, self.file, self.bar, self.ncols = total, file, bar, ncols
        self._bar = None

    def _stream(self):
        return self.file if self.file is not None else sys.stderr

    def _show_bar(self) -> bool:
        if self.bar is not None:
            return self.bar
        if "ipykernel" in sys.modules:  # a notebook: tqdm.auto draws a widget
            return True
        isatty = getattr(self._stream(), "isatty", None)
        return bool(isatty and isatty())

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.perf_counter()
        epochs = self.params.get("epochs")
        total = self.total if self.total is not None else self.params.get("steps")
        self._total = total
        if self._show_bar():
            label = f"Epoch {epoch + 1}" + (f"/{epochs}" if epochs else "")
            self._bar = tqdm(total=total, desc=label, unit="batch", leave=False, file=self._stream(),
                             dynamic_ncols=self.ncols is None, ncols=self.ncols)
        self._start, self._sequences, self._steps = time.perf_counter(), 0, 0
        self._count = 0
        self._shown = 0.0

    def on_train_batch_begin(self, batch, logs=None):
        logs = logs or {}
        self._sequences += int(logs.get("size", 0))
        self._steps += int(logs.get("size", 0)) * int(logs.get("time_steps", 0))

    def on_train_batch_end(self, batch, logs=None):
        self._count += 1
        if self._bar is None:
            return  # no bar: nothing to show before the epoch's line, so never wait for the device
        now = time.perf_counter()
        if now - self._shown >= self.refresh_seconds or self._count == self._total:
            # Read the logs at most every refresh_seconds: each read waits for the device,
            # which otherwise runs ahead of the Python loop. They are the epoch's running
            # means (BatchLogs), as Keras' bar shows.
            self._shown = now
            elapsed = max(now - self._start, 1e-9)
            postfix = {key: f"{float(value):.4f}" for key, value in (logs or {}).items()}
            postfix["seq/s"] = f"{self._sequences / elapsed:.0f}"
            postfix["steps/s"] = f"{self._steps / elapsed:.0f}"
            self._bar.set_postfix(postfix, refresh=False)
        self._bar.update(1)

    def on_epoch_end(self, epoch, logs=None):
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elapsed = time.perf_counter() - self._epoch_start
        print(epoch_line(epoch, self.params.get("epochs"), logs or {}, elapsed), file=self._stream(), flush=True)


class StepsBar(ProgressBar):
    """``evaluate``'s and ``predict``'s output for ``verbose`` 1 and 2, as Keras': with 1
    a bar over the batches (on a terminal or in a notebook), then one line —
    ``evaluate - 3 batches - 0.2s - loss: 0.6931 - accuracy: 0.5000`` (``predict``'s
    without values) — on stderr with the bar, on stdout with 2 (as ``fit``'s lines).
    The methods add it; you need not."""

    def __init__(self, what: str, total: int | None, verbose: int):
        super().__init__(total=total)
        self.what, self.verbose = what, verbose

    def _begin(self) -> None:
        self._start, self._count = time.perf_counter(), 0
        if self.verbose == 1 and self._show_bar():
            self._bar = tqdm(total=self.total, desc=self.what, unit="batch", leave=False, file=self._stream(),
                             dynamic_ncols=self.ncols is None, ncols=self.ncols)

    def _step(self) -> None:
        self._count += 1
        if self._bar is not None:
            self._bar.update(1)

    def _end(self, logs: Mapping[str, float]) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        seconds = time.perf_counter() - self._start
        ordered = sorted(logs.items(), key=lambda item: item[0] != "loss")  # the loss first, as Keras
        shown = "".join(f" - {key}: {float(value):.4f}" for key, value in ordered)
        line = f"{self.what} - {self._count} batch{'es' * (self._count != 1)} - {seconds:.1f}s{shown}"
        print(line, file=self._stream() if self.verbose == 1 else sys.stdout, flush=True)

    def on_test_begin(self, logs=None):
        self._begin()

    def on_predict_begin(self, logs=None):
        self._begin()

    def on_test_batch_end(self, batch, logs=None):
        self._step()

    def on_predict_batch_end(self, batch, logs=None):
        self._step()

    def on_test_end(self, logs=None):
        self._end(logs or {})

    def on_predict_end(self, logs=None):
        self._end({})

"""A test helper shared by the resume tests: a run killed between two epochs."""

from __future__ import annotations

from etrace_fit.callbacks import LambdaCallback


def killed_before(epoch: int) -> LambdaCallback:
    """A callback that interrupts ``fit`` (``KeyboardInterrupt``, as Ctrl-C) when ``epoch``
    (0-based) begins: the epochs before it are finished and backed up, and ``fit`` does
    not return, so ``BackupAndRestore`` keeps its backups for the next run. (A callback
    setting ``stop_training`` instead finishes the run: the backups go, as in Keras.)"""

    def interrupt(at, logs=None):
        if at == epoch:
            raise KeyboardInterrupt(f"killed before epoch {epoch + 1}")

    return LambdaCallback(on_epoch_begin=interrupt)

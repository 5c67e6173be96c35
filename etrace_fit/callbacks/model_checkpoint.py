"""``ModelCheckpoint``: save the trainer when an epoch ends, optionally only the best."""

from __future__ import annotations

import os
import string
import warnings

from ..checkpoint import remove_temporaries
from ..errors import ConfigError
from .base import Monitor, MonitoredCallback, check_verbose_flag, checked_number, writable_folder

__all__ = ["ModelCheckpoint"]


class ModelCheckpoint(MonitoredCallback):
    """Saves ``trainer.save(path)`` (or ``trainer.save_weights(path)``) at the end of
    epochs, or every ``save_freq`` batches.

    Args (Keras' names and order; ``keep_last`` is ours):
        filepath: a path template formatted with ``epoch`` (1-based, as Keras), with
            ``batch`` (1-based) when saving every ``save_freq`` batches, and the logs,
            e.g. ``"ckpt/{epoch:03d}-{val_loss:.3f}.ckpt"``.
        monitor: the logged key that decides "best".
        verbose: 1 prints each save (Keras' line).
        save_best_only: save only when ``monitor`` improves.
        save_weights_only: write the weights alone (:meth:`Trainer.save_weights`;
            read them back with ``load_weights``) instead of the whole trainer.
        mode: ``"min"``, ``"max"`` or ``"auto"``.
        save_freq: ``"epoch"``, or an int ``n``: save after every ``n`` batches
            (counted across epochs, as Keras), reading the batch's logs (``loss`` and
            the metrics; no validation values).
        initial_value_threshold: with ``save_best_only``, the value ``monitor`` must
            beat before the first save.
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
                 save_weights_only: bool = False, mode: str = "auto", save_freq: str | int = "epoch",
                 initial_value_threshold: float | None = None, keep_last: int | None = None):
        self.verbose = check_verbose_flag("ModelCheckpoint", verbose)  # first: a mode given where it was
        for name, flag in (("save_best_only", save_best_only), ("save_weights_only", save_weights_only)):
            if not isinstance(flag, bool):
                moved = (" (mode comes after save_weights_only, as in Keras: pass mode= by name)"
                         if flag in ("min", "max", "auto") else "")
                raise ConfigError(f"ModelCheckpoint: {name} must be True or False, got {flag!r}{moved}")
        if save_freq != "epoch" and (not isinstance(save_freq, int) or isinstance(save_freq, bool) or save_freq < 1):
            raise ConfigError(f"ModelCheckpoint: save_freq must be 'epoch' or a positive int (batches between saves), "
                              f"got {save_freq!r}")
        initial_value_threshold = checked_number("ModelCheckpoint", "initial_value_threshold", initial_value_threshold,
                                                 optional=True)
        if keep_last is not None and (not isinstance(keep_last, int) or isinstance(keep_last, bool) or keep_last < 1):
            raise ConfigError(f"ModelCheckpoint: keep_last must be a positive int or None, got {keep_last!r}")
        self._monitor = Monitor("ModelCheckpoint", monitor, mode)
        if initial_value_threshold is not None:
            self._monitor.best = float(initial_value_threshold)
        self.filepath, self.monitor, self.mode = os.fspath(filepath), monitor, self._monitor.mode
        self.save_best_only, self.save_weights_only, self.keep_last = save_best_only, save_weights_only, keep_last
        self.save_freq, self.initial_value_threshold = save_freq, initial_value_threshold
        self.saved: list[str] = []
        self._batches_since_save = 0
        self._epoch = 0

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
                if field and field not in ("epoch", "batch")]

    def on_train_begin(self, logs=None):
        by_batch = self.save_freq != "epoch"
        for key, what in [*((self.monitor, "monitor"),) * self.save_best_only,
                          *((field, "filepath field") for field in self._fields())]:
            if by_batch and key.startswith("val_"):
                raise ConfigError(f"ModelCheckpoint: {what} {key!r} is a validation value, but save_freq="
                                  f"{self.save_freq} saves after batches, whose logs hold none; monitor "
                                  f"{key[4:]!r} or save at epochs (save_freq='epoch')")
        if self.save_best_only:
            self._check_monitor()
        for field in self._fields():
            Monitor("ModelCheckpoint", field).check(self.model, self._others(), what="filepath field")
        named = {field.split(".")[0].split("[")[0] for _, field, _, _ in string.Formatter().parse(self.filepath)
                 if field}
        if "batch" in named and not by_batch:
            raise ConfigError(f"ModelCheckpoint: filepath {self.filepath!r} names {{batch}}, but save_freq='epoch' "
                              f"saves at epochs' ends, where there is no batch; give save_freq=<batches> or leave "
                              f"{{batch}} out")
        try:  # with numbers where the logs will have them: a bad format spec fails now, not after an epoch
            # {batch} only where batches are saved: with save_freq="epoch" it failed after the first epoch
            sample = self.filepath.format(epoch=1, **({"batch": 1} if by_batch else {}),
                                          **{field: 0.5 for field in self._fields()})
        except (ValueError, IndexError, KeyError, AttributeError) as error:
            raise ConfigError(f"ModelCheckpoint: filepath {self.filepath!r} cannot be formatted with the epoch (an "
                              f"int) and the logs (floats): {type(error).__name__}: {error}; e.g. "
                              f"'ckpt/{{epoch:03d}}-{{val_loss:.3f}}.ckpt'") from None
        if os.path.isdir(sample) or sample.endswith(("/", os.sep)):
            raise ConfigError(f"ModelCheckpoint: filepath {self.filepath!r} is a folder; give a file path in it, "
                              f"e.g. {os.path.join(self.filepath, 'epoch-{epoch:03d}.ckpt')!r}")
        folder = writable_folder(self._base_folder(), "ModelCheckpoint")
        remove_temporaries(folder)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.save_freq == "epoch":
            return
        self._batches_since_save += 1
        if self._batches_since_save >= self.save_freq:
            self._batches_since_save = 0
            self._save(self._epoch, {key: float(value) for key, value in (logs or {}).items()}, batch)

    def on_epoch_end(self, epoch, logs=None):
        if self.save_freq == "epoch":
            self._save(epoch, logs or {})

    def _save(self, epoch: int, logs: dict, batch: int | None = None) -> None:
        validates = getattr(self.model, "validates_epoch", None)
        if validates is not None and not validates(epoch) and any(
                f.startswith("val_") and f not in logs for f in self._fields()):
            return  # the name needs a validation value this epoch does not have (validation_freq): not a best either
        if self.save_best_only:
            value = self._current(epoch, logs)
            if value is None or not self._monitor.improves(value):
                if self.verbose and value is not None:
                    print(f"Epoch {epoch + 1}: {self.monitor} did not improve from {self.best:.5f}")
                return
            previous, self.best = self.best, value
        at = {"epoch": epoch + 1} if batch is None else {"epoch": epoch + 1, "batch": batch + 1}
        try:
            path = self.filepath.format(**at, **logs)
        except KeyError as error:
            raise ConfigError(f"ModelCheckpoint: {self.filepath!r} names {error}, which is not logged; logged keys: "
                              f"{', '.join([*at, *sorted(logs)])}") from None
        folder = os.path.dirname(path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        if self.save_weights_only:
            self.model.save_weights(path)
        else:
            self.model.save(path)
        if self.verbose:
            gain = (f"{self.monitor} improved from {previous:.5f} to {self.best:.5f}, " if self.save_best_only
                    else "")
            print(f"Epoch {epoch + 1}{'' if batch is None else f', batch {batch + 1}'}: {gain}saving "
                  f"{'weights' if self.save_weights_only else 'model'} to {path}")
        if path in self.saved:
            self.saved.remove(path)
        self.saved.append(path)
        while self.keep_last is not None and len(self.saved) > self.keep_last:
            old = self.saved.pop(0)
            if os.path.exists(old) and self._inside(old):
                os.remove(old)

    def state_dict(self):
        return {"best": self.best, "saved": list(self.saved), "batches_since_save": self._batches_since_save}

    def load_state_dict(self, state):
        saved = [str(p) for p in state.get("saved", [])]
        outside = [p for p in saved if not self._inside(p)]
        if outside:
            warnings.warn(f"ModelCheckpoint: the restored list names files outside {self._base_folder() or '.'!r} "
                          f"({', '.join(map(repr, outside))}); they are ignored and never deleted")
        self.best, self.saved = float(state.get("best", self.best)), [p for p in saved if p not in outside]
        self._batches_since_save = int(state.get("batches_since_save", 0))

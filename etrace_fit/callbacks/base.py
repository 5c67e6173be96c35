"""``Callback`` and ``CallbackList``: Keras' hook names and signatures.

As in Keras, a callback's ``self.model`` is what ``fit`` was called on — here the
:class:`~etrace_fit.Trainer` (``self.model.stop_training``, ``self.model.get_weights()``,
``self.model.model`` for the ``brainstate`` module) — and ``self.params`` holds
``{"verbose", "epochs", "steps"}`` of the current ``fit``. (``self.trainer``, the name
before 0.3, still works for one release with a ``DeprecationWarning``.) ``logs`` is a
plain dict (``loss``, metrics, ``val_*``) — except a training batch's, which is a
dict-like :class:`BatchLogs` (read, set, ``copy()``; ``dict(logs)`` for a plain dict):
reading a value waits for that batch to finish, so a callback that does not read every
batch's logs lets the device run ahead.
``state_dict`` / ``load_state_dict`` let a resumed run restore a callback's progress.
"""

from __future__ import annotations

import math
import os

from collections.abc import Mapping, MutableMapping
from typing import Any, Iterable

import jax

__all__ = ["BatchLogs", "Callback", "CallbackList", "Monitor", "MonitoredCallback"]


class RunningMeans:
    """The running means of an epoch's batch logs, as Keras' are: after batch ``i``,
    each key's mean over batches ``0..i`` weighted by their sizes, so the last batch's
    equal the epoch's logs. ``records``: the epoch's ``(size, loss, metrics, finite)``
    per batch (device values, appended as batches run); read lazily, once each."""

    def __init__(self, records: list):
        self.records = records
        self._prefix: list[tuple[int, dict[str, float]]] = []  # per batch: (sizes so far, sums so far)

    def mean(self, key: str, index: int) -> float:
        while len(self._prefix) <= index:
            size, loss, metrics, _ = self.records[len(self._prefix)]
            total, sums = self._prefix[-1] if self._prefix else (0, {})
            values = jax.device_get({"loss": loss, **metrics})
            self._prefix.append((total + size, {k: sums.get(k, 0.0) + size * float(v) for k, v in values.items()}))
        total, sums = self._prefix[index]
        return sums[key] / total


class BatchLogs(MutableMapping):
    """A training batch's logs (``loss`` and metrics) as a dict-like mapping of floats:
    read, set (``logs["x"] = 1.0``, seen by the callbacks after), ``copy()`` (a plain
    dict), ``dict(logs)`` (for ``json.dumps``, say).

    As in Keras, ``loss`` and the metrics are the epoch's running means up to this
    batch (size-weighted; the last batch's equal the epoch's logs). They are computed
    on the device; ``logs["loss"]`` (or ``dict(logs)``) waits for them. ``raw`` holds
    this batch's own values as unconverted device scalars, for a callback that wants
    them (TensorBoard's batch curves) or accumulates without waiting
    (``jax.device_get`` a list of them later).
    """

    def __init__(self, raw: Mapping[str, Any], running: RunningMeans | None = None, index: int = 0):
        self.raw = dict(raw)
        self._floats: dict[str, float] = {}
        self._running, self._index = running, index
        self._means = set(self.raw) if running is not None else set()  # the keys read as running means

    def __getitem__(self, key: str) -> float:
        if key not in self._floats:
            self._floats[key] = (self._running.mean(key, self._index) if key in self._means
                                 else float(self.raw[key]))
        return self._floats[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.raw[key] = value
        self._floats.pop(key, None)
        self._means.discard(key)

    def __delitem__(self, key: str) -> None:
        del self.raw[key]
        self._floats.pop(key, None)
        self._means.discard(key)

    def __iter__(self):
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    def copy(self) -> dict[str, float]:
        """The logs as a plain dict of floats (waits for the batch)."""
        return dict(self)

    def __repr__(self) -> str:
        return f"BatchLogs({dict(self)!r})"

HOOKS = (
    "on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
    "on_train_batch_begin", "on_train_batch_end",
    "on_test_begin", "on_test_end", "on_test_batch_begin", "on_test_batch_end",
    "on_predict_begin", "on_predict_end", "on_predict_batch_begin", "on_predict_batch_end",
)


class Callback:
    """Base class: override the hooks you need; each receives a plain ``logs`` dict.

    Example::

        class PrintLoss(Callback):
            def on_epoch_end(self, epoch, logs=None):
                print(epoch, logs["loss"])
    """

    model: Any = None
    params: dict = {}
    #: A callback that restores runs (``BackupAndRestore``): its ``on_train_begin`` runs
    #: before every other callback's (they see the resumed epoch) and its
    #: ``on_epoch_end`` after theirs (an epoch is backed up only once every callback's
    #: epoch-end work is done; a crash before that re-runs the epoch).
    restores_run: bool = False
    #: In a multi-host run (``etrace_fit.distributed``) only process 0 runs this
    #: callback: it writes files or prints (TensorBoard, CSVLogger, ModelCheckpoint,
    #: ProgressBar). The others run in every process, with the same logs.
    main_process_only: bool = False
    #: Whether this callback may add keys to an epoch's ``logs`` (as ``GradientFidelity``
    #: and a user's callbacks may): a monitored key that neither ``fit`` nor any such
    #: callback logs is a :class:`~etrace_fit.ConfigError` before training.
    adds_log_keys: bool = True

    def state_key(self) -> str:
        """The name this callback's state is saved under in a checkpoint: its type and
        what it writes or watches (e.g. ``"ModelCheckpoint:ckpt/{epoch}.ckpt"``), so that
        reordering the callbacks between runs restores each its own state."""
        return type(self).__name__

    def set_model(self, model: Any) -> None:
        """Called by ``fit`` with the :class:`~etrace_fit.Trainer` (Keras' name)."""
        self.model = model

    def set_params(self, params: dict) -> None:
        """Called by ``fit`` with ``{"verbose", "epochs", "steps"}``."""
        self.params = dict(params)

    @property
    def trainer(self) -> Any:
        """Deprecated alias of :attr:`model` (removed in 0.4)."""
        import warnings

        warnings.warn("Callback.trainer is deprecated and will be removed in 0.4; use self.model (the Trainer, "
                      "as in Keras)", DeprecationWarning, stacklevel=2)
        return self.model

    def set_trainer(self, trainer: Any) -> None:
        """Deprecated alias of :meth:`set_model` (removed in 0.4)."""
        import warnings

        warnings.warn("Callback.set_trainer is deprecated and will be removed in 0.4; use set_model",
                      DeprecationWarning, stacklevel=2)
        self.set_model(trainer)

    def on_train_begin(self, logs=None): ...
    def on_train_end(self, logs=None): ...
    def on_epoch_begin(self, epoch, logs=None): ...
    def on_epoch_end(self, epoch, logs=None): ...

    def on_train_batch_begin(self, batch, logs=None):
        self.on_batch_begin(batch, logs)  # Keras' older name, called as Keras calls it

    def on_train_batch_end(self, batch, logs=None):
        self.on_batch_end(batch, logs)

    def on_batch_begin(self, batch, logs=None):
        """Keras' older name of :meth:`on_train_batch_begin` (called by its default)."""

    def on_batch_end(self, batch, logs=None):
        """Keras' older name of :meth:`on_train_batch_end` (called by its default)."""

    def on_test_begin(self, logs=None): ...
    def on_test_end(self, logs=None): ...
    def on_test_batch_begin(self, batch, logs=None): ...
    def on_test_batch_end(self, batch, logs=None): ...
    def on_predict_begin(self, logs=None): ...
    def on_predict_end(self, logs=None): ...
    def on_predict_batch_begin(self, batch, logs=None): ...
    def on_predict_batch_end(self, batch, logs=None): ...

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to continue this callback (JSON-serialisable)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def array_state(self) -> Any:
        """Arrays a resumed run needs (a pytree of arrays, saved in the checkpoint's
        payload beside the weights; ``None``: nothing), e.g. ``EarlyStopping``'s best
        weights."""
        return None

    def load_array_state(self, arrays: Any) -> None:
        """Restore what :meth:`array_state` returned."""


def writable_folder(folder: str, owner: str) -> str:
    """Create ``folder`` (``""``: the working directory) and check a file can be written
    in it; ``ConfigError`` naming ``owner`` and the path otherwise, so a writer fails
    at ``on_train_begin`` instead of after the first epoch."""
    import tempfile

    from ..errors import ConfigError

    folder = folder or "."
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise ConfigError(f"{owner}: cannot write to the folder {folder!r} ({error.strerror or error}); give a "
                          f"writable path") from None
    return folder


class CallbackList:
    """Calls each hook on every callback, in order."""

    def __init__(self, callbacks: Iterable[Callback] | None = None, model: Any = None, params: dict | None = None,
                 record: Any = None):
        self.callbacks = list(callbacks or [])
        # ``record(epoch, logs)``: called with the keys the callbacks added to an epoch's
        # logs or set anew, after every callback's ``on_epoch_end`` but the restorers' (the History
        # records them, as Keras' History, which runs last; a backup then holds them)
        self.record = record
        for position, callback in enumerate(self.callbacks):
            if not isinstance(callback, Callback):
                from ..errors import ConfigError

                raise ConfigError(f"callbacks[{position}] must be an etrace_fit.callbacks.Callback instance, got "
                                  f"{type(callback).__name__}; subclass Callback or wrap a function in "
                                  f"LambdaCallback")
            if model is not None:
                callback.set_model(model)
            if params is not None:
                callback.set_params(params)

    def __iter__(self):
        return iter(self.callbacks)

    def __getattr__(self, name: str):
        if name not in HOOKS:
            raise AttributeError(name)

        callbacks = self.callbacks
        if jax.process_count() > 1 and jax.process_index() != 0:  # multi-host: one process writes and prints
            callbacks = [c for c in callbacks if not c.main_process_only]
        if name == "on_train_begin":  # restorers first: the others see the resumed run
            callbacks = sorted(callbacks, key=lambda c: not c.restores_run)
        elif name == "on_epoch_end":  # restorers last: the backup commits every callback's work
            callbacks = sorted(callbacks, key=lambda c: c.restores_run)

        def dispatch(*args, **kwargs):
            for callback in callbacks:
                getattr(callback, name)(*args, **kwargs)

        def epoch_end(epoch, logs=None):
            before = dict(logs or {})
            try:
                for callback in callbacks:
                    if not callback.restores_run:
                        callback.on_epoch_end(epoch, logs)
            finally:  # also after a callback's error: what the others added or changed is kept
                self.record(epoch, {key: value for key, value in (logs or {}).items()
                                    if key not in before or value is not before[key]})
            for callback in callbacks:
                if callback.restores_run:
                    callback.on_epoch_end(epoch, logs)

        return epoch_end if name == "on_epoch_end" and self.record is not None else dispatch

    def _keys(self) -> list[str]:
        """Each callback's :meth:`~Callback.state_key`, numbered when two share one."""
        keys, seen = [], {}
        for callback in self.callbacks:
            key = callback.state_key()
            seen[key] = seen.get(key, 0) + 1
            keys.append(key if seen[key] == 1 else f"{key}#{seen[key]}")
        return keys

    def state_dict(self) -> dict[str, Any]:
        return {key: c.state_dict() for key, c in zip(self._keys(), self.callbacks)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Each callback's saved state, by state key; a :class:`~etrace_fit.CheckpointError`
        naming a callback whose ``load_state_dict`` fails on it (a state its code now
        reads otherwise)."""
        for key, callback in zip(self._keys(), self.callbacks):
            if key in state:
                try:
                    callback.load_state_dict(state[key])
                except Exception as error:  # the user's code: any error means the state does not fit
                    from ..errors import CheckpointError

                    raise CheckpointError(f"the saved state of callback {key!r} cannot be restored "
                                          f"({type(error).__name__}: {error})") from error

    def array_state(self) -> dict[str, Any]:
        """Each callback's :meth:`~Callback.array_state` that is not ``None``, by state key."""
        arrays = {key: c.array_state() for key, c in zip(self._keys(), self.callbacks)}
        return {key: value for key, value in arrays.items() if value is not None}

    def load_array_state(self, arrays: dict[str, Any]) -> None:
        for key, callback in zip(self._keys(), self.callbacks):
            if key in arrays:
                callback.load_array_state(arrays[key])


class Monitor:
    """Tracks the best value of one logged key (shared by EarlyStopping,
    ReduceLROnPlateau and ModelCheckpoint).

    ``mode="auto"`` means ``min`` for a loss and the error metrics (``mse``, ``mae``),
    ``max`` for accuracy-like keys (``acc``, ``auc``, ``precision``, ``recall`` in the
    name); for any other key (a metric of your own: ``val_f1``) it stays ``"auto"`` and
    a callback that compares values refuses it before training, as Keras 3 does (it
    was taken as ``min`` and kept the worst epochs of an F1). An improvement must beat
    the best by more than ``min_delta``.
    """

    def __init__(self, owner: str, monitor: str, mode: str = "auto", min_delta: float = 0.0):
        from ..errors import ConfigError

        if mode not in ("auto", "min", "max"):
            raise ConfigError(f"{owner}: mode must be 'auto', 'min' or 'max', got {mode!r}")
        if mode == "auto":
            mode = auto_mode(monitor) or "auto"
        min_delta = checked_number(owner, "min_delta", min_delta)
        self.owner, self.key, self.mode, self.min_delta = owner, monitor, mode, abs(min_delta)
        self.reset()

    def reset(self) -> None:
        """No best value yet."""
        self.best = float("-inf") if self.mode == "max" else float("inf")

    def check_mode(self) -> None:
        """:class:`~etrace_fit.ConfigError` when ``mode="auto"`` could not tell whether
        the key is to go up or down."""
        from ..errors import ConfigError

        if self.mode == "auto":
            raise ConfigError(f"{self.owner}: cannot tell whether {self.key!r} should go up or down (mode='auto' "
                              f"knows losses, mse / mae and accuracy-like names); pass mode='max' to keep the "
                              f"highest value, or mode='min' for the lowest")

    def check(self, trainer: Any, callbacks: Iterable[Callback], what: str = "monitor") -> None:
        """Before training: :class:`~etrace_fit.ConfigError` if ``fit`` will never log the
        key (a validation value without validation data; a name neither ``fit`` nor any
        callback that may add keys logs, a typo say), listing what it logs."""
        from ..errors import ConfigError

        keys = getattr(trainer, "fit_log_keys", None)
        if keys is None or self.key in keys:
            return
        if getattr(trainer, "regularizers", None) and self.key.removeprefix("val_").startswith("rate_"):
            return  # a regularised layer's rate, rate_<path>: its paths are known once the model is compiled
        logged = ", ".join(keys)
        if self.key.startswith("val_") and not any(k.startswith("val_") for k in keys):
            raise ConfigError(f"{self.owner}: {what} {self.key!r} is a validation value, but this fit has no "
                              f"validation data; pass validation_data= or validation_split=, or monitor "
                              f"{self.key[4:]!r} (this fit logs {logged})")
        if not any(c.adds_log_keys for c in callbacks):
            raise ConfigError(f"{self.owner}: {what} {self.key!r} is not among the keys this fit logs ({logged})")

    def value(self, logs: dict | None, epoch: int | None = None, trainer: Any = None) -> float | None:
        """The monitored value in ``logs``; ``None`` (the epoch is skipped, as in Keras)
        when it is a validation value and epoch ``epoch`` did not validate
        (``validation_freq``), or — with a warning, once — when a key a callback was to
        add is missing."""
        logs = logs or {}
        if self.key in logs:
            return float(logs[self.key])
        validates = getattr(trainer, "validates_epoch", None)
        if self.key.startswith("val_") and epoch is not None and validates is not None and not validates(epoch):
            return None
        if not getattr(self, "_warned", False):
            import warnings

            self._warned = True
            warnings.warn(f"{self.owner}: monitor {self.key!r} is not in the logs of epoch "
                          f"{'?' if epoch is None else epoch + 1} ({', '.join(sorted(logs))}); epochs without it are "
                          f"skipped", RuntimeWarning, stacklevel=3)
        return None

    def improves(self, value: float, reference: float | None = None) -> bool:
        """Whether ``value`` beats the best so far (or ``reference``) by more than ``min_delta``."""
        self.check_mode()
        reference = self.best if reference is None else reference
        if self.mode == "min":
            return value < reference - self.min_delta
        return value > reference + self.min_delta


def check_verbose_flag(owner: str, verbose: Any) -> int:
    """A callback's ``verbose``: 0 or 1, or ``False`` / ``True`` as Keras takes them (Keras'
    place for it, before ``mode``; a ``mode`` given by position where it used to be is
    named)."""
    from ..errors import ConfigError

    if isinstance(verbose, bool):
        return int(verbose)
    if isinstance(verbose, str) or verbose not in (0, 1, 2):
        moved = " (mode moved after it, as in Keras: pass mode= by name)" if verbose in ("min", "max", "auto") else ""
        raise ConfigError(f"{owner}: verbose must be 0 or 1, got {verbose!r}{moved}")
    return int(verbose)


def auto_mode(monitor: str) -> str | None:
    """``"min"`` / ``"max"`` for a key whose direction its name tells, else None."""
    name = monitor.removeprefix("val_")
    if name.endswith("loss") or name in ("mse", "mae", "mean_squared_error", "mean_absolute_error"):
        return "min"
    if any(k in name for k in ("acc", "auc", "precision", "recall")):
        return "max"
    return None


class MonitoredCallback(Callback):
    """A callback that tracks the best value of one logged key through ``self._monitor``."""

    _monitor: Monitor
    adds_log_keys = False

    def state_key(self) -> str:
        return f"{type(self).__name__}:{self._monitor.key}"

    def _check_monitor(self) -> None:
        """At ``on_train_begin``: the monitored key is one this fit will log (:meth:`Monitor.check`)
        and ``mode`` says which way it improves (:meth:`Monitor.check_mode`; for a key a
        callback adds, at its first value)."""
        self._monitor.check(self.model, self._others())
        if self._monitor.key in (getattr(self.model, "fit_log_keys", None) or ()):
            self._monitor.check_mode()

    def _others(self) -> list[Callback]:
        """The fit's other callbacks."""
        callbacks = getattr(getattr(self.model, "_callbacks", None), "callbacks", ())
        return [c for c in callbacks if c is not self]

    def _new_run(self) -> bool:
        """At ``on_train_begin``: whether this ``fit`` starts a run (no ``BackupAndRestore``
        restored one; restorers run first and set ``resume_epoch``)."""
        return getattr(self.model, "resume_epoch", None) is None

    def _current(self, epoch: int, logs: dict | None) -> float | None:
        """The monitored value at the end of ``epoch`` (``None``: this epoch is skipped)."""
        return self._monitor.value(logs, epoch, self.model)

    @property
    def best(self) -> float:
        return self._monitor.best

    @best.setter
    def best(self, value: float) -> None:
        self._monitor.best = value


def checked_int(owner: str, name: str, value: Any, minimum: int = 0) -> int:
    """A callback's count argument (``patience``, ``cooldown``, ``start_from_epoch``) as an
    int ``>= minimum`` (a numpy int too), else a ``ConfigError`` naming ``owner`` and
    ``name``: a string or a float was taken and failed in a comparison epochs later."""
    import numpy as np

    from ..errors import ConfigError

    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigError(f"{owner}: {name} must be an int >= {minimum}, got {value!r}"
                          f"{f' ({type(value).__name__})' if isinstance(value, str) else ''}")
    return int(value)


def checked_number(owner: str, name: str, value: Any, *, optional: bool = False, low: float | None = None,
                   high: float | None = None) -> float | None:
    """A callback's real-valued argument (``min_delta``, ``factor``, ``min_lr``,
    ``baseline``) as a finite float, inside ``(low, high)`` where given (``low`` alone:
    ``>= low``); ``None`` passes when ``optional``. Else a ``ConfigError`` naming
    ``owner`` and ``name`` (a string ``"0.5"`` failed in the first comparison, after an
    epoch of training)."""
    import numpy as np

    from ..errors import ConfigError

    if value is None and optional:
        return None
    expected = ("a number" + (" or None" if optional else "") if low is None else
                f"a number >= {low:g}" if high is None else f"a number in ({low:g}, {high:g})")
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value):
        raise ConfigError(f"{owner}: {name} must be {expected}, got {value!r}"
                          f"{f' ({type(value).__name__})' if isinstance(value, str) else ''}")
    if low is not None and (value < low if high is None else not low < value < high):
        raise ConfigError(f"{owner}: {name} must be {expected}, got {value!r}")
    return float(value)


def checked_flag(owner: str, name: str, value: Any) -> bool:
    """A callback's ``True`` / ``False`` argument, else a ``ConfigError`` naming ``owner``
    and ``name`` (the string ``"False"`` read as True)."""
    from ..errors import ConfigError

    if not isinstance(value, bool):
        raise ConfigError(f"{owner}: {name} must be True or False, got {value!r}")
    return value


def checked_learning_rate(value: Any, name: str) -> float:
    """``value`` as a float, or a ``ConfigError`` naming ``name``: a rate must be a finite
    number ≥ 0 (an infinite or NaN one makes every weight NaN at the next update, and a
    negative one climbs the loss)."""
    from ..errors import ConfigError

    try:
        rate = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(rate) or rate < 0:
        raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
    return rate

"""Checkpoints and weights of the :class:`~etrace_fit.Trainer`: ``save``, ``restore``,
``Trainer.load``, ``get_weights`` and ``set_weights`` (the file format and its
guarantees live in :mod:`etrace_fit.checkpoint`)."""

from __future__ import annotations

import inspect
import os
import warnings
from typing import TYPE_CHECKING, Any, Mapping

import brainstate
import jax
import jax.numpy as jnp
import numpy as np

from .. import checkpoint
from ..compiler import format_path
from ..distributed import is_main_process
from ..errors import CheckpointError, ConfigError, ShapeError
from .logs import History
from .optimizers import initial_state

if TYPE_CHECKING:
    from .trainer import Trainer

__all__ = ["Persistence", "WEIGHTS_ONLY"]

#: The manifest's ``content`` of a file :meth:`Persistence.save_weights` wrote.
WEIGHTS_ONLY = "weights"


class Persistence:
    """The Trainer's checkpoints and weights (a part of :class:`~etrace_fit.Trainer`)."""

    def _fingerprint(self) -> list:
        return checkpoint.fingerprint(self._params().to_dict_values())

    def save(self, path: Any, overwrite: bool = True) -> None:
        """Write weights, optimizer state, epoch, history and callback state to ``path``
        (atomically; see :mod:`etrace_fit.checkpoint`), with brainstate's global random key
        and, during ``fit``, a stateful trainer's streams that go on (restored with them).
        ``overwrite=False``: a ``ConfigError`` if ``path`` exists (Keras asks at a prompt;
        a training script has none). In a multi-host run only process 0 writes (the weights and optimizer
        state are replicated: every process holds the same); the others return at once
        (``BackupAndRestore`` waits for the file at a barrier)."""
        _check_overwrite("save", path, overwrite)
        state = {"params": {format_path(p): s.value for p, s in self._params().items()},
                 "opt_state": self.opt_state if self.opt_state is not None else {},
                 "long_term": {format_path(p): s.value for p, s in _long_term(self._model).items()},
                 "callbacks": self._callbacks.array_state(),
                 # a random initial state (hidden(init=Uniform(...))) draws from it at every batch
                 "random_key": _key_data(brainstate.random.get_key())}
        rates = None if self._state is None else self._state.rates
        if rates is not None:  # the regularisers' running rate estimates: a resumed run goes on with them
            state["rates"] = {str(n): {"sums": dict(held[0]), "count": held[1]}
                              for n, held in enumerate(rates) if held is not None}
        extra = {"epoch": self.epoch, "iterations": self.iterations, "history": self.history.history,
                 "history_epochs": self.history.epoch, "epochs_run": self._epochs_run,
                 "shuffle_offset": self._shuffle_offset,
                 "callbacks": self._callbacks.state_dict(), "config": self.config,
                 "has_opt_state": self.opt_state is not None, "process_count": jax.process_count(),
                 "pending_learning_rate": self._pending_learning_rate}
        mid_stream = self.stateful and self._stream is not None and not self._streams_end
        if mid_stream and self._fitting:  # streams that go on into the next epoch: a backup holds them
            state["streams"] = self._stream_state()
        if not is_main_process():
            return
        if mid_stream and "streams" not in state:
            warnings.warn(f"save({os.fspath(path)!r}) in the middle of a stream (stateful=True): the checkpoint holds "
                          f"the weights and optimizer state, not the streams' hidden states and traces, so a "
                          f"trainer restored from it starts its streams afresh; save after reset_states() (at a "
                          f"stream's end) to mark that", UserWarning, stacklevel=2)
        checkpoint.write_checkpoint(path, state, params_fingerprint=self._fingerprint(), extra=extra)

    def _stream_state(self) -> dict:
        """A stateful trainer's running streams: their batch size, the hidden states where
        the last batch ended (by path) and the eligibility traces (by position)."""
        self._sync.pending = True  # into the model as the training state holds them (a validation ran it since)
        self._push()
        hidden = {format_path(p): s.value for p, s in self._model.states(brainstate.HiddenState).items()}
        traces = jax.tree.leaves(self._state.traces)
        if self._state.traces is None and self._saved_traces is not None:  # restored, no batch run since
            traces = self._saved_traces
        traces = {str(n): leaf for n, leaf in enumerate(traces)}
        return {"size": self._stream, "hidden": hidden, "traces": traces}

    def _restored_streams(self, path: Any, state: dict) -> tuple | None:
        """``(batch size, [(hidden state, saved value)], saved trace leaves)`` of the streams
        a checkpoint written during ``fit`` holds (:meth:`_stream_state`), or None; a
        :class:`CheckpointError` naming a hidden state that does not fit the model."""
        saved = state.get("streams")
        if saved is None or not self.stateful:
            return None
        size, hidden = int(saved["size"]), dict(saved["hidden"])
        if not self._model.states(brainstate.HiddenState):  # a model no batch has run through yet
            self._ensure_states(size)
        held = {format_path(p): s for p, s in self._model.states(brainstate.HiddenState).items()}

        def shape(states, name):
            return np.shape(getattr(states[name], "value", states[name])) if name in states else "absent"

        differ = [f"{name}: saved {shape(hidden, name)}, the model's {shape(held, name)}"
                  for name in sorted(set(hidden) | set(held)) if shape(hidden, name) != shape(held, name)]
        if differ:
            raise CheckpointError(f"{path}: the saved streams' hidden states (stateful=True) do not fit the model's: "
                                  + "; ".join(differ))
        traces = dict(saved.get("traces") or {})
        return (size, [(held[name], jnp.asarray(hidden[name])) for name in held],
                [traces[str(n)] for n in range(len(traces))])

    def _restored_traces(self, fresh: Any) -> Any:
        """The eligibility traces of the streams a restored checkpoint holds, shaped as
        ``fresh`` (the program's zero traces); a :class:`CheckpointError` if they do not fit."""
        expected = jax.tree.leaves(fresh)
        if [np.shape(leaf) for leaf in self._saved_traces] != [np.shape(leaf) for leaf in expected]:
            raise CheckpointError("the restored streams' eligibility traces do not fit this trainer's rules (saved "
                                  "under another algo?); call reset_states() to start the streams afresh")
        return jax.tree.unflatten(jax.tree.structure(fresh), [jnp.asarray(saved, leaf.dtype) for saved, leaf in
                                                              zip(self._saved_traces, expected)])

    def save_weights(self, path: Any, overwrite: bool = True) -> None:
        """Keras' ``save_weights``: the model's weights (and its long-term states: dropout
        keys, running statistics) alone, in the checkpoint format of :meth:`save`
        (atomic, checksummed, no pickle). :meth:`load_weights` reads it (or a file
        :meth:`save` wrote); :meth:`restore` and :meth:`Trainer.load` refuse it, having
        no optimizer state, epoch or history to resume from. ``overwrite=False``: a
        ``ConfigError`` if ``path`` exists. In a multi-host run only process 0 writes."""
        _check_overwrite("save_weights", path, overwrite)
        state = {"params": {format_path(p): s.value for p, s in self._params().items()},
                 "long_term": {format_path(p): s.value for p, s in _long_term(self._model).items()}}
        if not is_main_process():
            return
        checkpoint.write_checkpoint(path, state, params_fingerprint=self._fingerprint(),
                                    extra={"content": WEIGHTS_ONLY, "config": self.config})

    def load_weights(self, path: Any, skip_mismatch: bool = False) -> None:
        """Keras' ``load_weights``: the weights (and long-term states) from a file
        :meth:`save_weights` or :meth:`save` wrote; the optimizer state, epoch and
        history stay as they are. :class:`CheckpointError` (and nothing changed) if the
        file does not fit the model, naming the weights that differ.
        ``skip_mismatch=True`` (Keras'): load the weights and long-term states the file
        holds at this model's path and shapes, keep the others as they are, and warn
        naming each one kept and why (a fine-tuned head of another size, a layer added)."""
        manifest, state = checkpoint.read_checkpoint(path)
        ours = self._fingerprint()
        if skip_mismatch:
            params, long_term, skipped = self._fitting_weights(path, state)
            if skipped:
                warnings.warn(f"load_weights({os.fspath(path)!r}, skip_mismatch=True) kept {len(skipped)} of the "
                              f"model's weights and states as they were: " + "; ".join(skipped),
                              UserWarning, stacklevel=2)
        else:
            if manifest.get("fingerprint") != ours:
                checkpoint.check_fingerprint(path, manifest, ours, cast=True)  # Keras casts float32 into float64
            params = self._saved_params(path, state)
            long_term = _restored_long_term(path, self._model, state)
        for path_, param in self._params().items():
            if path_ in params:
                param.value = jax.tree.map(lambda new, old: jnp.asarray(new, jnp.asarray(old).dtype), params[path_],
                                           param.value)
        for held, value in long_term:
            held.value = value
        self._model_touched = True

    def _fitting_weights(self, path: Any, state: dict) -> tuple[dict, list, list[str]]:
        """For ``load_weights(skip_mismatch=True)``: ``({path: value}`` of the weights the
        checkpoint holds at this model's path and leaf shapes, ``[(state, value)]`` of the
        long-term states likewise, and a line per weight or state kept, saying why)."""
        saved = dict(state.get("params", {}))
        params, skipped = {}, []

        def shapes(value):
            return [tuple(np.shape(leaf)) for leaf in jax.tree.leaves(value)]

        for path_, param in self._params().items():
            name = format_path(path_)
            if name not in saved:
                skipped.append(f"{name} (not in the file)")
                continue
            try:
                value = jax.tree.unflatten(jax.tree.structure(param.value),
                                           [jnp.asarray(leaf) for leaf in jax.tree.leaves(saved[name])])
            except (TypeError, ValueError):
                skipped.append(f"{name} (saved with {len(jax.tree.leaves(saved[name]))} leaves, the model has "
                               f"{len(jax.tree.leaves(param.value))})")
                continue
            if shapes(value) != shapes(param.value):
                skipped.append(f"{name} (saved {shapes(value)}, the model has {shapes(param.value)})")
                continue
            params[path_] = value
        long_term = []
        held_saved = dict(state.get("long_term") or {})
        for path_, held in _long_term(self._model).items():
            name = format_path(path_)
            values = [jnp.asarray(leaf) for leaf in jax.tree.leaves(held_saved.get(name, []))]
            if name in held_saved and [np.shape(v) for v in values] == [np.shape(v) for v in
                                                                          jax.tree.leaves(held.value)]:
                long_term.append((held, jax.tree.unflatten(jax.tree.structure(held.value), values)))
            elif state.get("long_term") is not None:
                skipped.append(f"{name} (a long-term state " + ("not in the file)" if name not in held_saved
                                                                  else "saved at other shapes)"))
        return params, long_term, skipped

    def _saved_params(self, path: Any, state: dict) -> dict:
        """``{path: value}`` of this model's weights from a checkpoint's payload (its
        fingerprint was checked on reading)."""
        try:
            return {p: jax.tree.unflatten(jax.tree.structure(s.value),
                                          [jnp.asarray(leaf) for leaf in jax.tree.leaves(state["params"][format_path(p)])])
                    for p, s in self._params().items()}
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"{path}: the checkpoint lacks or garbles {error} (written by another program?)"
                                  ) from error

    def restore(self, path: Any) -> dict:
        """Load a checkpoint written by :meth:`save` into this trainer and its model;
        returns the manifest. :class:`CheckpointError` (and nothing changed) if it does
        not fit the model, the optimizer or ``update_every``, naming what differs. The
        learning rate is part of the optimizer state, so the saved one is restored too;
        a warning says so when it differs from the one this trainer's optimizer had
        (set ``trainer.learning_rate`` afterwards to use yours). brainstate's global
        random key becomes the saved one, and a stateful trainer's streams go on from
        the file's (start afresh if it holds none)."""
        return self._restore(path, note_learning_rate=True)

    def _restore(self, path: Any, note_learning_rate: bool) -> dict:
        """:meth:`restore`; ``note_learning_rate``: warn when the restored rate replaces
        another (not for ``BackupAndRestore``, whose run set the saved one itself)."""
        before = self.learning_rate if note_learning_rate and self.learning_rate_settable else None
        manifest, state = checkpoint.read_checkpoint(path, params_fingerprint=self._fingerprint())
        if manifest.get("content") == WEIGHTS_ONLY:
            raise CheckpointError(f"{path} holds weights only (save_weights, ModelCheckpoint(save_weights_only=True)): "
                                  f"there is no optimizer state, epoch or history to resume; load it with "
                                  f"trainer.load_weights(path)")
        saved_processes = manifest.get("process_count", 1)
        if saved_processes != jax.process_count():
            raise CheckpointError(
                f"{path} was written by a run of {saved_processes} process(es), this one has {jax.process_count()}: "
                "each process reads its own share of iterable data, so the resumed epochs would see other "
                "batches; resume with the same number of processes (the number of devices may differ), or "
                "load the weights alone with set_weights")
        params = self._saved_params(path, state)
        try:
            epoch, epochs = int(manifest["epoch"]), [int(e) for e in manifest["history_epochs"]]
            history = {str(k): [float(x) for x in v] for k, v in dict(manifest["history"]).items()}
            callbacks = dict(manifest.get("callbacks", {}))
            # files written before these were kept: the epochs of the history, shuffled from the seed
            epochs_run, offset = int(manifest.get("epochs_run", len(epochs))), int(manifest.get("shuffle_offset", 0))
            random_key = state.get("random_key")
            random_key = None if random_key is None else jnp.asarray(random_key, jnp.uint32)
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"{path}: the checkpoint lacks or garbles {error} (written by another program?)"
                                  ) from error
        long_term = _restored_long_term(path, self._model, state)
        streams = self._restored_streams(path, state)
        rates = self._restored_rates(path, state)
        # A file saved before any batch holds no optimizer state: the restored trainer starts a fresh one (the
        # current one's moments and step count belong to the training since), as it does the rates.
        opt_state = self._restored_opt_state(path, manifest, state, params) if manifest.get("has_opt_state") else None
        try:  # before the trainer changes: a state a callback cannot take leaves it as it was
            self._callbacks.load_state_dict(callbacks)
        except CheckpointError as error:
            raise CheckpointError(f"{path}: {error}") from error.__cause__
        self._callbacks.load_array_state(dict(state.get("callbacks") or {}))  # older checkpoints hold none
        for path_, param in self._params().items():
            param.value = params[path_]
        for held, value in long_term:
            held.value = value
        self._model_touched = True
        self.opt_state = opt_state
        # None: estimated afresh from the next batch; the streams go on from the file's, or start afresh
        self._state = self._state._replace(rates=rates, traces=None)
        self._stream, self._saved_traces = (None, None) if streams is None else (streams[0], streams[2])
        for held, value in [] if streams is None else streams[1]:
            held.value = value
        if opt_state is None:
            pending = manifest.get("pending_learning_rate")
            self._pending_learning_rate = None if pending is None else float(pending)
        self.history = History(self.history.params, model=self)
        self.history.epoch.extend(epochs)
        self.history.history = {k: list(v) for k, v in history.items()}
        self.epoch = epoch
        self.iterations = int(manifest.get("iterations", 0))  # files written before it was kept: 0
        # shuffles go on from the restored run's epochs (a fit from epoch 0 after restoring a file
        # saved before training reads what a fresh trainer does); a fit BackupAndRestore resumes
        # shuffles as the interrupted fit did (from the epochs its trainer had run before it)
        self._epochs_run, self._shuffle_offset = epochs_run, offset
        if random_key is not None:  # the random draws go on where the saved run's were
            brainstate.random.set_key(random_key)
        after = self.learning_rate if before is not None else None
        if before is not None and after is not None and not np.isclose(before, after, rtol=1e-6, atol=0.0):
            warnings.warn(f"{path}: the saved learning rate {after:g} replaces this optimizer's {before:g} (the rate "
                          f"is part of the optimizer state); set trainer.learning_rate = {before:g} to use yours",
                          UserWarning, stacklevel=3)
        return manifest

    def _restored_rates(self, path: Any, state: dict) -> list | None:
        """The running rate estimates of this trainer's regularisers on running rates
        (:attr:`TrainState.rates`) saved at ``path``; ``None`` when the file holds none
        (saved before any batch, without such a regulariser, or by an older version: the
        estimates start afresh). A :class:`CheckpointError` when they do not fit."""
        saved = state.get("rates")
        if not saved or not self.regularizers:
            return None
        layers = self.spiking_layers()
        rates = []
        for n, (reg, paths) in enumerate(self.regularizers):
            if not reg.uses_rates:
                rates.append(None)
                continue
            entry = saved.get(str(n))
            try:
                sums = {p: jnp.asarray(entry["sums"][p]) for p in paths}
                for p in paths:  # one rate per neuron of the layer
                    expected = tuple(getattr(layers[p], "shape", sums[p].shape))
                    if sums[p].shape != expected:
                        raise ValueError(f"{p}: shape {sums[p].shape} saved, {expected} now")
                rates.append((sums, jnp.asarray(entry["count"], jnp.int32)))
            except (KeyError, TypeError, ValueError) as error:
                raise CheckpointError(f"{path}: the saved running rates of regularizers[{n}] ({reg!r}) do not fit "
                                      f"this trainer's ({error}); resume with the regularisers the run was saved "
                                      f"with") from error
        return rates

    def _restored_opt_state(self, path, manifest, state, params):
        """The saved optimizer state on this trainer's optimizer, or a CheckpointError
        saying which of optimizer, ``update_every`` and ``grad_clip`` differ."""
        from flax import serialization

        saved = manifest.get("config") or {}
        now = self.config
        differs = [f"{key} {saved.get(key)!r} when saved, {now.get(key)!r} now" for key in
                   ("optimizer", "update_every", "grad_clip") if key in saved and saved.get(key) != now.get(key)]
        if isinstance(saved.get("optimizer"), str) and isinstance(now.get("optimizer"), str) and \
                saved["optimizer"] != now["optimizer"]:  # the same shapes, another optimizer's meaning
            raise CheckpointError(f"{path}: the saved optimizer state does not fit this trainer's optimizer "
                                  f"({'; '.join(differs)}: another optimizer's state, whatever its shapes); restore "
                                  f"with optimizer={saved['optimizer']!r}, or load the weights alone with "
                                  f"trainer.load_weights(path)")
        if self.update_every is None:
            target = initial_state(self.optimizer, {format_path(p): v for p, v in params.items()})
        else:
            target = initial_state(self.optimizer, [leaf for v in params.values() for leaf in jax.tree.leaves(v)])
        try:
            restored = serialization.from_state_dict(target, state["opt_state"])
            leaves, saved_leaves = jax.tree.leaves(target), jax.tree.leaves(restored)
            for a, b in zip(leaves, saved_leaves):
                if np.shape(a) != np.shape(b):
                    raise ValueError(f"an optimizer state leaf of shape {np.shape(b)} where {np.shape(a)} is expected")
        except Exception as error:  # flax raises ValueError / KeyError / TypeError for another structure
            notes = differs + ([] if now.get("optimizer") is not None else [
                "an optax optimizer is code, not data: pass the same optimizer (and update_every) as when saved"])
            hint = "; ".join(notes) or "its structure differs"
            raise CheckpointError(f"{path}: the saved optimizer state does not fit this trainer's optimizer "
                                  f"({hint}); {error}") from error
        return jax.tree.map(jnp.asarray, restored)

    @classmethod
    def load(cls, path: Any, model: Any, optimizer: Any = None, **overrides: Any) -> "Trainer":
        """A trainer for ``model`` with the configuration, weights, optimizer state and
        history saved at ``path``. An optimizer given by name is saved by name; an optax
        optimizer is code, not data: pass the same one (default ``"adam"``). The same
        for a callable loss and for regularisers: a ``ConfigError`` asks for them
        (``Trainer.load(path, model, loss=my_loss)``); ``overrides`` replace any saved
        constructor argument."""
        with warnings.catch_warnings():  # a format-1 file warns once, when _restore reads it
            warnings.simplefilter("ignore")
            manifest, _ = checkpoint.read_checkpoint(path)
        if manifest.get("content") == WEIGHTS_ONLY:
            raise CheckpointError(f"{path} holds weights only (save_weights): build the trainer and call "
                                  f"trainer.load_weights(path)")
        nullable = ("decay", "update_every", "grad_clip", "memory_budget", "trace_dtype")
        config = {k: v for k, v in dict(manifest.get("config") or {}).items() if v is not None or k in nullable}
        # Code is not data: a callable loss and regularisers must be passed again.
        for key, what in (("loss_callable", "loss"), ("regularizers", "regularizers")):
            saved = config.pop(key, None)
            if saved is not None and what not in overrides:
                raise ConfigError(f"{path} was saved from a trainer with {what}={saved!r} (code, which a checkpoint "
                                  f"does not hold); pass it again: Trainer.load(path, model, {what}=...)")
        callables = config.pop("metric_callables", None)
        if callables and "metrics" not in overrides:
            raise ConfigError(f"{path} was saved from a trainer with metrics={[*config.get('metrics', []), *callables]}"
                              f" of which {callables} are functions (code, which a checkpoint does not hold); pass "
                              f"the metrics again: Trainer.load(path, model, metrics=[...])")
        config.update(overrides)
        from .trainer import unread_settings  # (the Trainer imports this module)

        for name in unread_settings(config.get("algo", "hybrid"), decay=config.get("decay"),
                                    memory_budget=config.get("memory_budget")):
            if name not in overrides:  # saved before the Trainer refused it (it was ignored): it stays ignored
                config.pop(name)
        from .. import __version__

        known = inspect.signature(cls.__init__).parameters
        unknown = {k: v for k, v in config.items() if k not in known and k not in overrides}
        if unknown:  # written by a newer release: its constructor raised a raw TypeError
            raise CheckpointError(f"{path} was written by etrace_fit {manifest.get('package_version', '?')} with "
                                  f"settings this etrace_fit ({__version__}) does not know: "
                                  f"{', '.join(f'{k}={v!r}' for k, v in unknown.items())}; upgrade etrace_fit, or "
                                  f"build the Trainer yourself and read the weights with trainer.load_weights(path)")
        saved_optimizer = config.pop("optimizer", None)
        trainer = cls(model, optimizer=saved_optimizer if optimizer is None else optimizer, **config)
        trainer._restore(path, note_learning_rate=optimizer is not None)  # a rate you gave, replaced: say so
        return trainer

    def count_params(self) -> int:
        """Keras' ``count_params``: every weight's numbers, trainable and not (a
        ``BatchNorm``'s running statistics; not a dropout key): ``summary()``'s total."""
        return int(sum(np.size(leaf) for leaf in jax.tree.leaves(self._params().to_dict_values()))) + \
            non_trainable_count(self._model)

    def get_weights(self) -> dict:
        """A copy of every ParamState's value, keyed by path."""
        return jax.tree.map(jnp.array, self._params().to_dict_values())

    def set_weights(self, weights: Mapping) -> None:
        """Put back values from :meth:`get_weights` (all of them or some paths): each
        path one of the model's weights, its value structured as ``get_weights`` gives
        it (a layer's ``{"weight", "bias"}``), of the same shapes, finite. Anything else
        is an error naming the path, and no weight changes (a wrong shape used to be
        taken and fail at the next ``fit``)."""
        params = self._params()
        if not isinstance(weights, Mapping):
            raise ConfigError(f"set_weights takes the dict get_weights returns ({{path: value}}), got a "
                              f"{type(weights).__name__}")
        unknown = [path for path in weights if path not in params]
        if unknown:
            raise ConfigError(f"set_weights: the model has no weight at {', '.join(map(repr, unknown))}; its weights: "
                              f"{', '.join(map(repr, params))}")
        for path, value in weights.items():
            current, name = params[path].value, format_path(path)
            if jax.tree.structure(value) != jax.tree.structure(current):
                expected = f" (a dict of {', '.join(map(repr, sorted(current)))})" if isinstance(current, Mapping) else ""
                given = f" of {sorted(value)!r}" if isinstance(value, Mapping) else ""
                raise ConfigError(f"set_weights: {name} must be structured as get_weights gives it{expected}, got "
                                  f"{type(value).__name__}{given}")
            for (where, new), old in zip(jax.tree_util.tree_flatten_with_path(value)[0], jax.tree.leaves(current)):
                label = name + jax.tree_util.keystr(where)
                if np.shape(new) != np.shape(old):
                    raise ShapeError(f"set_weights: {label} must have shape {np.shape(old)}, got {np.shape(new)}")
                if not np.isfinite(np.asarray(new, np.float64)).all():
                    raise ShapeError(f"set_weights: {label} contains NaN or inf")
        for path, value in weights.items():
            params[path].value = jax.tree.map(lambda new, old: jnp.asarray(new, jnp.asarray(old).dtype), value,
                                              params[path].value)
        self._model_touched = True


def non_trainable_count(model: Any) -> int:
    """The numbers Keras counts as non-trainable params: the float long-term states that
    are no weights (running statistics), not random keys or counters."""
    return int(sum(np.size(leaf) for state in _long_term(model).values() for leaf in jax.tree.leaves(state.value)
                   if jnp.issubdtype(jnp.result_type(leaf), jnp.floating)))


def frozen_param_count(model: Any) -> int:
    """The numbers of the weights' leaves their layers never train (``frozen_leaves()``:
    a ``LoRALinear``'s base ``W``), which Keras counts as non-trainable params."""
    from ..algorithms.learner import frozen_weights

    values = {format_path(path): state.value for path, state in model.states(brainstate.ParamState).items()}
    return sum(int(np.size(values[name][leaf] if isinstance(values[name], dict) else values[name]))
               for name, leaves in frozen_weights(model).items() for leaf in leaves)


def _key_data(key: Any) -> Any:
    """A random key's ``uint32`` data (a typed key's ``key_data``; a raw key as it is)."""
    return jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key


def _long_term(model: Any) -> dict:
    """The model's long-term states that are not weights (a dropout key, running
    statistics): carried across batches, so a checkpoint holds them too."""
    return {path: state for path, state in model.states(brainstate.LongTermState).items()
            if not isinstance(state, brainstate.ParamState)}


def _restored_long_term(path: Any, model: Any, state: dict) -> list:
    """``[(state, saved value)]`` for the model's long-term states, or a CheckpointError
    naming a state the checkpoint lacks or holds at another shape (checkpoints written
    before these were saved hold none: the model's own values stay)."""
    saved = state.get("long_term")
    held = _long_term(model)
    if saved is None:
        return []
    saved = dict(saved)
    missing = sorted(set(map(format_path, held)) - set(saved))
    extra = sorted(set(saved) - set(map(format_path, held)))
    if missing or extra:
        raise CheckpointError(f"{path}: the model's long-term states (dropout keys, running statistics) differ from "
                              f"the checkpoint's: missing {missing or 'none'}, not in the model {extra or 'none'}")
    restored = []
    for p, held_state in held.items():
        leaves = jax.tree.leaves(held_state.value)
        values = [jnp.asarray(leaf) for leaf in jax.tree.leaves(saved[format_path(p)])]
        if [np.shape(v) for v in values] != [np.shape(v) for v in leaves]:
            raise CheckpointError(f"{path}: long-term state {format_path(p)} was saved with shapes "
                                  f"{[np.shape(v) for v in values]}, the model has {[np.shape(v) for v in leaves]}")
        restored.append((held_state, jax.tree.unflatten(jax.tree.structure(held_state.value), values)))
    return restored


def _check_overwrite(what: str, path: Any, overwrite: bool) -> None:
    """A ``ConfigError`` before anything is written when ``path`` exists and ``overwrite``
    is False (Keras' ``save`` / ``save_weights`` argument)."""
    if not overwrite and os.path.exists(os.fspath(path)):
        raise ConfigError(f"{what}: {os.fspath(path)} exists and overwrite=False; give another path, or "
                          f"overwrite=True to replace it")

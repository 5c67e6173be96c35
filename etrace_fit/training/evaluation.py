"""Evaluation and prediction for the :class:`~etrace_fit.Trainer`: ``evaluate``,
``test_on_batch`` and ``predict``, each one jitted call per batch on the model from
reset states (a stateful trainer's from its streams), and the data adapters they share
with ``fit``."""

from __future__ import annotations

import contextlib
import itertools
import threading
import warnings
from collections.abc import Iterable, Mapping, Sized
from typing import Any, Sequence

import brainstate
import jax
import jax.numpy as jnp
import numpy as np

from .. import _compat
from ..callbacks import CallbackList
from ..distributed import ProcessLocal
from ..errors import ConfigError, ShapeError
from .data import (Arrays, Batch, batch_major, batch_name, batches, check_count, check_finite, check_mask,
                   check_not_a_pair, check_step_weights, check_weights, from_lists, listed_array, loss_weight, named,
                   placement, targets_key)
from .losses import check_batch_targets, check_target_shape, loss_name, needs_targets
from .logs import check_verbose, keras_result

__all__ = ["Evaluation"]


class Evaluation:
    """The Trainer's evaluation and prediction (a part of :class:`~etrace_fit.Trainer`)."""

    def _outputs(self, xs: jax.Array, carry: bool = False) -> jax.Array:
        """The model's outputs at every step, ``(T, B, ...)``, from reset states (from
        the carried ones with ``carry``: a stateful trainer's predict, which moves its
        streams on)."""
        self._push()
        self._ensure_states(xs.shape[1])
        if carry:
            carry = self._continue_stream(xs.shape[1])
            self._model_touched = True  # the streams' states moved on in the model: read them before training
        if not carry:
            self._states_at(xs.shape[1])
        return self._forward_program()(xs, carry)

    def _states_at(self, batch: int) -> None:
        """The hidden states at ``batch`` rows before a program that resets them itself:
        ``brainstate.transform.jit`` passes them in and JAX keys its cache on their shapes,
        so the states a smaller last batch left compiled the same program again (a
        ``predict`` of one shape compiled twice, the validation compiled ahead again)."""
        first = next(iter(self._model.states(brainstate.HiddenState).values()), None)  # one state tells
        leaves = [] if first is None else jax.tree.leaves(first.value)
        if leaves and np.ndim(leaves[0]) and np.shape(leaves[0])[0] != batch:
            brainstate.nn.reset_all_states(self._model, batch_size=batch)

    def _output_shape(self, xs: jax.Array) -> jax.ShapeDtypeStruct:
        """The shape and dtype :meth:`_outputs` would return for ``xs``, from a trace of
        the model alone: nothing is compiled or run (a compiled forward pass over the
        first batch took ~0.45 s of every ``fit``'s start, a program no later call used),
        and no state moves."""
        self._push()
        self._ensure_states(xs.shape[1])
        return self._forward_program().eval_shape(xs, False)[1]

    def _forward_program(self):
        """The jitted forward pass over a sequence (built once, and again after a layer
        setting changed)."""
        self._follow_settings()
        if self._forward is None:
            model = self._model

            @brainstate.transform.jit(static_argnums=1, compiler_options=_compat.compiler_options())
            def forward(xs, carry):
                if not carry:
                    brainstate.nn.reset_all_states(model, batch_size=xs.shape[1])
                with brainstate.environ.context(fit=False):  # dropout off, as in Keras' predict
                    return brainstate.transform.for_loop(model, xs)

            self._forward = forward
        return self._forward

    def _on_mesh(self, *arrays: Any) -> tuple:
        """Time-major batches on the trainer's mesh (as they are without one): split
        over the batch axis when the batch splits evenly over the devices, else
        replicated (every device runs the whole batch; results are the same)."""
        placement = self._placement
        if placement is None:
            return arrays
        axis = 1 if arrays[0].shape[1] % placement.size == 0 else None
        return tuple(placement.put(a, axis) for a in arrays)

    def _fetch(self, value: Any) -> np.ndarray:
        """A device array as numpy (gathered across processes in a multi-host run)."""
        return np.asarray(value) if self._placement is None else self._placement.fetch(value)

    def _eval_program(self):
        """The jitted evaluation step (built once): loss and metrics of a batch from
        reset states (``carry``: from the carried ones); built again after a layer
        setting changed."""
        self._follow_settings()
        if self._eval_step is None:
            self._eval_step = self._build_eval_step()
        return self._eval_step

    def _build_eval_step(self):
        model, loss_fn, regularizers = self._model, self.loss_fn, self.regularizers
        step = model if self._step_fn is None else self._step_fn

        @brainstate.transform.jit(static_argnums=3, compiler_options=_compat.compiler_options())
        def eval_step(xs, ys, weight, carry=False, metric_weight=None):
            """``weight`` places and weighs the loss; the metrics are placed by
            ``metric_weight`` (the placement without sample weights; ``weight`` when
            None), so a sample weighed 0 counts in them as in ``fit``'s."""
            metric_weight = weight if metric_weight is None else metric_weight
            if not carry:
                brainstate.nn.reset_all_states(model, batch_size=xs.shape[1])
            with brainstate.environ.context(fit=False):  # dropout off, as in Keras' evaluate
                outputs = brainstate.transform.for_loop(step, xs)
            penalty = 0.0
            if regularizers:  # the same loss as in training: the penalties averaged over steps and samples
                outputs, spikes = outputs
                penalty = sum(reg.sequence_penalty({p: spikes[p] for p in paths}) for reg, paths in regularizers)
            per_step = jax.vmap(loss_fn)(outputs, ys)
            return {"loss": jnp.sum(weight * per_step) / weight.shape[1] + penalty,
                    **self._metrics(outputs, ys, metric_weight)}

        return eval_step

    def _compile_evaluation_ahead(self, data: Arrays, batch_size: int) -> None:
        """Compile the evaluation of ``data``'s first batch on a thread of its own while
        ``fit`` traces and compiles its training step, so that the first validation does
        not wait for it. Traced and lowered here (tracing reads and writes the model's
        states, so it stays on the calling thread); XLA's compilation is the thread's, and
        JAX keeps its result for the evaluation's first call (:meth:`_evaluate_from_reset`
        waits for the thread). A compilation that fails on the thread is left to that
        call, which compiles again and raises. The demo's validation program compiled in
        0.29-0.45 s at the end of the first epoch; beside the training step's tracing, the
        first epoch took 4.19 s instead of 4.70 under hybrid, whose longer tracing hides
        all of it, and 3.17 s instead of 3.30 under BPTT (medians of three fresh
        ``etrace-fit train`` runs each, alternated, 2026-11-28)."""
        first = next(iter(batches(data.x, data.y, batch_size=batch_size, shuffle=False, mask=data.mask,
                                  sample_weight=data.sample_weight)))
        xs, ys, weight = self._time_major(first, False)
        self._ensure_states(xs.shape[1])
        self._states_at(xs.shape[1])
        if first.sample_weight is None:
            lowered = self._eval_program().lower(*self._on_mesh(xs, ys, weight), False)
        else:  # as _evaluate_from_reset calls it with weights
            placed = self._on_mesh(xs, ys, loss_weight(first, ys, weight, None, False), weight)
            lowered = self._eval_program().lower(*placed[:3], False, placed[3])

        def compile_() -> None:
            try:
                lowered.compile()
            except Exception:  # the evaluation's own call compiles again and raises it
                pass

        self._eval_compiling = threading.Thread(target=compile_, name="etrace_fit-compile-evaluation", daemon=True)
        self._eval_compiling.start()

    def _as_data(self, data: Any, name: str = "x", y: Any = None, targets: bool = True) -> Any:
        """Array data as batch-major :class:`Arrays` (``(x, y)`` or ``(x, y, mask)``
        tuples; time-major ones are swapped as views), an iterable of batches as is,
        ``None`` as ``None``. ``targets``: a ``ConfigError`` if arrays come without the
        ``y`` the loss needs (not for ``predict``)."""
        if data is None:
            return None
        if isinstance(data, (tuple, list)) and len(data) in (2, 3) and not hasattr(data[0], "shape"):
            # (x, y) of Python lists of numbers, as Keras converts them (not a list of batches: those form no array)
            listed = [None if part is None else listed_array(part) for part in data]
            if listed[0] is not None and all(a is not None or p is None for a, p in zip(listed, data)) and \
                    len({len(a) for a in listed if a is not None}) == 1:
                data = tuple(listed)
        alone = hasattr(data, "shape")
        if alone:
            data = (data, y)
        if isinstance(data, (tuple, list)) and len(data) in (2, 3) and hasattr(data[0], "shape"):
            x, y, mask = (*data, None)[:3]
            self._input_layer.check(x, "x" if name == "x" or name.endswith("_batch") else f"{name} x", self.time_major)
            if y is None and targets and needs_targets(self.loss_fn):
                given = "x alone" if alone else "y None"
                fix = ("(x_val, y_val)" if name == "validation_data" else f"{name}(x, y)" if name.endswith("_batch")
                       else "evaluate(x, y)")
                raise ConfigError(f"{name if name == 'validation_data' else 'y'}: loss {loss_name(self.loss_fn)!r} "
                                  f"needs targets, got {given}; give {fix}")
            if self.time_major:
                x, y, mask = batch_major(x, y, mask, name=name)
            if np.shape(x)[0] == 0:
                raise ShapeError(f"{name}: no samples (x has shape {tuple(np.shape(x))})")
            return Arrays(x, y, mask)
        if isinstance(data, (tuple, list)) and data and hasattr(data[0], "shape"):
            raise ConfigError(f"{name} must be (x, y), (x, y, mask) or an iterable of batches; got a "
                              f"{type(data).__name__} of {len(data)} arrays")
        return _checked_iterable(data, name)

    def _evaluate(self, data: Any, batch_size: int, hooks: CallbackList | None = None, name: str | None = None,
                  steps: int | None = None, sample_weight: Any = None) -> dict[str, float]:
        """Mean loss and metrics over ``data`` (:class:`Arrays` or an iterable of batches),
        from reset states (a stateful trainer carries them from batch to batch, as its
        training does); a stateful trainer's training streams are left where they were.
        ``name``: the data's name in errors (``validation_data``; None: ``x`` and ``y``, an
        iterable's ``batch 3``); ``steps``: at most this many batches (a
        warning if the data gives fewer); ``sample_weight``: per sequence or per sequence
        and step (arrays only, batch-major), weighing the loss as in ``fit``."""
        with self._keeping_streams():
            return self._evaluate_from_reset(data, batch_size, hooks, name, steps, sample_weight)

    @contextlib.contextmanager
    def _keeping_streams(self):
        """A stateful trainer's hidden states as they were after the block (evaluation
        from reset states must not cut the training streams)."""
        self._push()
        if not self.stateful or self._stream is None:
            yield
            return
        saved = {path: state.value for path, state in self._model.states(brainstate.HiddenState).items()}
        try:
            yield
        finally:
            for path, state in self._model.states(brainstate.HiddenState).items():
                state.value = saved[path]

    def _evaluate_from_reset(self, data: Any, batch_size: int, hooks: CallbackList | None = None,
                             name: str | None = None, steps: int | None = None,
                             sample_weight: Any = None) -> dict[str, float]:
        hooks = hooks if hooks is not None else CallbackList()
        arrays = isinstance(data, Arrays)
        if arrays:
            weights = data.sample_weight if sample_weight is None else sample_weight
            source, time_major = batches(data.x, data.y, batch_size=batch_size, shuffle=False, mask=data.mask,
                                         sample_weight=weights), False
        else:
            source, time_major = batches(data, batch_size=batch_size, shuffle=False, name=name), self.time_major
        if self._eval_compiling is not None:  # fit's compilation ahead: its result is JAX's to reuse
            self._eval_compiling.join()
            self._eval_compiling = None
        if steps is not None:  # no batch more is read: an iterator goes on where this stopped
            source = itertools.islice(source, steps)
        totals: dict[str, float] = {}
        count = ran = carried = 0
        hooks.on_test_begin({})
        for step, batch in enumerate(source):
            hooks.on_test_batch_begin(step, {})
            # an iterable's batch named in every error about it (validation_data batch 3: ...)
            label = None if arrays or not name else batch_name(step, name)
            with named(label) if label else contextlib.nullcontext():
                result, size = self._evaluate_batch(data, step, batch, time_major, name, carried)
            carried = size
            logs = {key: float(value) for key, value in result.items()}
            for key, value in logs.items():
                totals[key] = totals.get(key, 0.0) + value * size
            count += size
            ran = step + 1
            hooks.on_test_batch_end(step, {key: totals[key] / count for key in logs})  # Keras: running means
        if steps is not None and ran < steps:
            warnings.warn(f"steps={steps}, but the data gave {ran} batch{'es' * (ran != 1)}: the evaluation "
                          f"averages over those", UserWarning, stacklevel=3)
        result = {key: value / count for key, value in totals.items()}
        hooks.on_test_end(result)
        return result

    def _evaluate_batch(self, data: Any, step: int, batch: Batch, time_major: bool, name: str | None,
                        carried: int) -> tuple[dict, int]:
        """Batch ``step`` of :meth:`_evaluate_from_reset`'s ``data``, checked (the first
        batch and every batch of an iterable) and run: its loss and metrics (device
        values) and its size. ``carried``: the size of the batch before (a stateful
        trainer carries its states on to one of the same size)."""
        arrays = isinstance(data, Arrays)
        if arrays:
            x_name, y_name = (f"{name} x", f"{name} y") if name else ("x", "y")
        else:  # the batch is named around these (validation_data batch 3: x ...)
            x_name, y_name = ("x", "y") if name else (f"x of batch {step}", f"y of batch {step}")
        xs, ys, weight = self._time_major(batch, time_major)
        self._ensure_states(xs.shape[1])
        if step == 0 and (self._num_classes is None or self._sample_output is None):
            shape = np.shape(self._outputs(xs[:1]))
            self._num_classes = self._num_classes or int(shape[-1])
            self._sample_output = tuple(shape[2:])
        if step == 0:
            check_batch_targets(self.loss_fn, batch.y)
        if step == 0 and self._sample_output is not None:
            check_target_shape(self.loss_fn, self._sample_output, tuple(np.shape(ys)[2:]), where=y_name)
        if step == 0 and self.metric_fns and batch.y is not None and (
                targets_key(ys), tuple(map(id, self.metric_fns.values()))) not in getattr(
                self, "_metrics_checked", ()):  # fit checked them on its training targets
            self._check_metrics(self._output_shape(xs[:1]), ys)
        if step == 0 and arrays:  # every sample, before the first batch runs
            check_finite(data.x, x_name)
            self._check_targets(data.y, y_name)
        elif not arrays:
            check_finite(np.asarray(xs), x_name)
            self._check_targets(ys, y_name)
        # A stateful trainer's evaluation carries its own streams from batch to batch, as its
        # training does (from reset states, its training streams kept): each batch started
        # afresh, so a held-out stream's chunks, and val_loss, measured something else than loss.
        carry = self.stateful and step > 0 and xs.shape[1] == carried
        if not carry:
            self._states_at(xs.shape[1])
        if batch.sample_weight is None:
            return self._eval_program()(*self._on_mesh(xs, ys, weight), carry), xs.shape[1]
        weighted = loss_weight(batch, ys, weight, None, time_major)
        placed = self._on_mesh(xs, ys, weighted, weight)
        return self._eval_program()(*placed[:3], carry, placed[3]), xs.shape[1]

    def test_on_batch(self, x: Any, y: Any = None, sample_weight: Any = None, return_dict: bool = False,
                      mask: Any = None) -> Any:
        """Loss and metrics of one batch without an update, as Keras'
        ``test_on_batch`` (``mask (batch, time)`` with ``loss_on="mask"``): from reset
        states, or for a stateful trainer from its streams' current states (which it
        leaves where they were: the streams' traces only follow training)."""
        xs, ys, weighted, weight = self._one_batch(x, y, sample_weight, None, "test_on_batch", mask)
        self._ensure_states(xs.shape[1])
        self._push()
        carry = self.stateful and self._stream is not None and self._continue_stream(xs.shape[1])
        with self._keeping_streams():
            if not carry:
                self._states_at(xs.shape[1])
            logs = self._eval_program()(xs, ys, weighted, carry, None if weighted is weight else weight)
        logs = {"loss": float(logs["loss"]), **{k: float(v) for k, v in logs.items() if k != "loss"}}
        return keras_result(logs, return_dict, self.metrics_names)

    def evaluate(self, x: Any, y: Any = None, batch_size: int | None = 32, verbose: int | str = "auto",
                 sample_weight: Any = None, steps: int | None = None, callbacks: Sequence[Any] | None = None,
                 mask: Any = None, return_dict: bool = True) -> Any:
        """``{"loss": ..., <metric>: ...}`` averaged over the data (loss placed as in
        training). ``x`` as in :meth:`fit`: arrays (with ``y``, and ``mask`` with
        ``loss_on="mask"``) or an iterable of batches. The arguments are Keras', in its
        order: ``sample_weight`` (arrays: ``(N,)`` or ``(N, T)``) weighs the loss as in
        ``fit`` (metrics are not weighted); ``steps`` stops after that many batches (an
        endless iterator needs it; a warning if the data gives fewer);
        ``return_dict=False``: the loss alone or ``[loss, *metrics]`` (in
        :attr:`metrics_names` order); the dict is the default here. ``batch_size=None``
        is Keras' 32."""
        check_verbose(verbose)
        _check_moved("evaluate", sample_weight=sample_weight, steps=steps)
        x, y, sample_weight, mask = from_lists(x, y, sample_weight, mask)
        batch_size = 32 if batch_size is None else batch_size
        check_count(batch_size, "batch_size")
        if steps is not None:
            check_count(steps, "steps")
        _check_not_process_local(x, "evaluate's x")
        is_array = hasattr(x, "shape")
        if (sample_weight is not None or mask is not None) and not is_array:
            raise ConfigError("sample_weight and mask apply to array data (x, y); an iterable gives (x, y, mask) "
                              "batches")
        if sample_weight is not None:
            if self.time_major:  # (T, N) per step, as fit takes it
                check_weights(sample_weight, x)
                _, _, sample_weight = batch_major(x, None, sample_weight)
            else:
                sample_weight = check_weights(sample_weight, x)
            check_step_weights(sample_weight, self.loss_on)
        if mask is not None:
            data = self._as_data((x, y, mask), "x")
            check_mask(data.mask, data.x)
        else:
            data = self._as_data(x, "x", y)
        shown = _steps_bar("evaluate", verbose, data, batch_size, steps)
        hooks = CallbackList([*callback_list(callbacks, "evaluate"), *shown], model=self)
        result = self._evaluate(data, batch_size, hooks, steps=steps, sample_weight=sample_weight)
        names = [name for name in self.metrics_names if name in result]  # the loss, then the metrics in order
        return keras_result({**{name: result[name] for name in names}, **result}, return_dict, names)

    @property
    def metrics_names(self) -> list[str]:
        """Keras' ``metrics_names``: ``["loss", *metrics]``, the order of
        ``evaluate(..., return_dict=False)`` and ``*_on_batch``'s lists."""
        return ["loss", *self.metric_fns]

    def predict_on_batch(self, x: Any) -> np.ndarray:
        """Keras' ``predict_on_batch``: :meth:`predict` on ``x`` as one batch."""
        return self.predict(x, batch_size=max(1, len(x)), verbose=0)

    def predict(self, x: Any, batch_size: int | None = 32, verbose: int | str = "auto", steps: int | None = None,
                callbacks: Sequence[Any] | None = None, last_only: bool = True, mask: Any = None) -> np.ndarray:
        """Outputs: ``(N, ...)`` at the last step, or every step (``last_only=False``:
        batch-major ``(N, T, ...)``, time-major if the trainer is). ``x``: an array cut
        into batches of ``batch_size``, or, as in Keras, an iterable of batches (each
        an ``x`` array or a tuple whose first item is ``x``, as ``fit`` reads them;
        ``y`` is ignored, a third item is the mask); ``steps`` stops after that many
        batches (an endless iterator needs it; a warning if the data gives fewer).
        ``mask`` (``(N, T)``, as ``fit`` takes it; padded variable-length data): each
        sequence's output is read at its last real step, and with ``last_only=False``
        the padded steps' outputs are zeros, so what the padding holds changes nothing. A stateful trainer predicts from
        its streams' current states and moves them on (step-by-step prediction: call it
        with one step at a time); the eligibility traces follow training only, so call
        :meth:`reset_states` before training on a stream you predicted on."""
        if not isinstance(last_only, bool):  # "no" read as True
            raise ConfigError(f"predict: last_only must be True or False, got {last_only!r}")
        check_verbose(verbose)
        _check_moved("predict", steps=steps)
        x, _, _, mask = from_lists(x, mask=mask)
        check_not_a_pair(x, "predict")
        batch_size = 32 if batch_size is None else batch_size
        check_count(batch_size, "batch_size")
        if steps is not None:
            check_count(steps, "steps")
        if hasattr(x, "shape"):
            data = self._as_data((x, None) if mask is None else (x, None, mask), "x", targets=False)
            check_finite(data.x)
            if data.mask is not None:
                check_mask(data.mask, data.x)
            source, time_major = batches(data.x, None, batch_size=batch_size, shuffle=False, mask=data.mask), False
        elif mask is not None:
            raise ConfigError("predict: mask= applies to an array x; an iterable gives each batch's mask as the third "
                              "item of its (x, y, mask) tuples")
        elif isinstance(x, (str, bytes, dict)) or not hasattr(x, "__iter__"):
            raise ConfigError(f"predict takes an array x or an iterable of batches, got {type(x).__name__}")
        else:
            _check_not_process_local(x, "predict's x")
            source, time_major = (_predict_batch(item, step) for step, item in enumerate(x)), self.time_major
        shown = _steps_bar("predict", verbose, x if hasattr(x, "shape") else None, batch_size, steps)
        hooks = CallbackList([*callback_list(callbacks, "predict"), *shown], model=self)
        hooks.on_predict_begin({})
        outputs, ran, length = [], 0, None
        if steps is not None:  # no batch more is read
            source = itertools.islice(source, steps)
        for step, batch in enumerate(source):
            hooks.on_predict_batch_begin(step, {})
            if not hasattr(x, "shape"):  # an array was checked whole
                check_finite(np.asarray(batch.x), f"x of batch {step}")
            self._input_layer.check(batch.x, "x", time_major)
            xs, _, _ = placement(Batch(batch.x), "last", time_major)  # no loss here: any placement reads x alike
            length = xs.shape[0] if length is None else length
            if not last_only and xs.shape[0] != length:
                raise ShapeError(f"predict(last_only=False): batch {step} has {xs.shape[0]} steps, the first had "
                                 f"{length}; the outputs of every step stack only for one length (last_only=True "
                                 f"takes any)")
            out = self._fetch(self._outputs(*self._on_mesh(xs), carry=self.stateful))
            if batch.mask is not None:
                out = _masked_outputs(out, batch.mask, step, time_major, last_only)
            outputs.append(out[-1] if last_only else (out if self.time_major else np.swapaxes(out, 0, 1)))
            ran = step + 1
            hooks.on_predict_batch_end(step, {"outputs": outputs[-1]})
        hooks.on_predict_end({})
        if steps is not None and ran < steps:
            warnings.warn(f"steps={steps}, but the data gave {ran} batch{'es' * (ran != 1)}", UserWarning,
                          stacklevel=2)
        if not outputs:
            raise ShapeError("predict: the data gave no batches")
        return np.concatenate(outputs, axis=0 if last_only or not self.time_major else 1)


def _steps_bar(what: str, verbose: Any, data: Any, batch_size: int, steps: int | None) -> list:
    """``[StepsBar]`` for ``verbose`` 1 / 2 (``"auto"``: 1) in the main process, else ``[]``."""
    from ..callbacks.progress_bar import StepsBar
    from ..distributed import is_main_process

    level = check_verbose(verbose)
    if not level or not is_main_process():
        return []
    x = getattr(data, "x", data)
    total = -(-len(x) // batch_size) if hasattr(x, "shape") else None
    total = steps if total is None else total if steps is None else min(total, steps)
    return [StepsBar(what, total, level)]


def _masked_outputs(out: np.ndarray, mask: Any, step: int, time_major: bool, last_only: bool) -> np.ndarray:
    """Time-major outputs ``(T, B, ...)`` of a padded batch: with ``last_only``, each
    sequence's output at its last real step in the last row; else the padded steps'
    outputs zeroed. ``mask``: the batch's, ``(B, T)`` (``(T, B)`` if ``time_major``)."""
    marks = np.asarray(mask, bool)
    marks = marks if time_major else marks.T
    if marks.shape != out.shape[:2]:
        raise ShapeError(f"predict: the mask of batch {step} has shape {np.asarray(mask).shape}; expected (batch, "
                         f"time) = {out.shape[1::-1] if not time_major else out.shape[:2]} for its x")
    empty = ~marks.any(axis=0)
    if empty.any():
        raise ShapeError(f"predict: sequence {int(np.argmax(empty))} of batch {step} has no real step (its mask is "
                         f"all False), so it has no output to read")
    if last_only:
        last = marks.shape[0] - 1 - np.argmax(marks[::-1], axis=0)
        return out[last, np.arange(out.shape[1])][None]
    return np.where(marks.reshape(marks.shape + (1,) * (out.ndim - 2)), out, 0)


def _predict_batch(item: Any, position: int) -> Batch:
    """One item of an iterable given to ``predict``: an ``x`` array, or a tuple / list /
    :class:`Batch` whose first item is ``x`` (targets and weights are not read; a third
    item, or a batch's ``mask``, is the mask of the steps each sequence has)."""
    if isinstance(item, Batch):
        return Batch(item.x, mask=item.mask)
    if hasattr(item, "shape"):
        return Batch(item)
    if isinstance(item, (tuple, list)) and item and hasattr(item[0], "shape"):
        return Batch(item[0], mask=item[2] if len(item) == 3 and item[2] is not None else None)
    raise ShapeError(f"predict: batch {position} must be an x array or a tuple (x, ...), got {type(item).__name__}")


def _check_moved(method: str, **arguments: Any) -> None:
    """A ``ConfigError`` when callbacks come where Keras' order puts ``sample_weight`` or
    ``steps`` (before 0.4 ``callbacks`` came right after ``verbose``)."""
    from ..callbacks import Callback

    for name, value in arguments.items():
        if isinstance(value, Callback) or (isinstance(value, (list, tuple)) and value
                                           and all(isinstance(c, Callback) for c in value)):
            raise ConfigError(f"{method}: {name} got callbacks; the arguments follow Keras' order now "
                              f"({', '.join(arguments)} come before callbacks): pass callbacks=[...] by name")


def _check_not_process_local(data: Any, name: str) -> None:
    """``ConfigError`` for :class:`~etrace_fit.distributed.ProcessLocal` data where it is
    read whole in every process (validation, ``evaluate``, ``predict``): each process
    evaluated its own share as the whole data, and the processes logged different
    ``val_loss`` values, silently."""
    if isinstance(data, ProcessLocal):
        raise ConfigError(f"{name} is a ProcessLocal, but only fit's training batches are read as each process's "
                          f"share of a global batch; {name} is read whole in every process: pass it as arrays or "
                          f"batches that are the same in every process (each process transfers only the rows its "
                          f"devices hold)")


def _checked_iterable(data: Any, name: str) -> Any:
    """``data`` taken as an iterable of batches, or a ``ConfigError`` naming ``name`` for
    what cannot be one (checked before training: these failed at the first validation,
    after an epoch had trained)."""
    expected = f"{name} must be arrays (x, y) or (x, y, mask), or an iterable of such batches"
    _check_not_process_local(data, name)
    if isinstance(data, Mapping):
        raise ConfigError(f"{expected}; got a {type(data).__name__} with keys {sorted(map(str, data))} (named inputs "
                          f"are not taken: the model's step reads one x array)")
    if isinstance(data, (str, bytes)) or not isinstance(data, Iterable):
        raise ConfigError(f"{expected}; got {type(data).__name__} {data!r:.60}")
    if isinstance(data, (tuple, list)) and data and isinstance(data[0], (list, tuple)) and data[0] and \
            not any(hasattr(item, "shape") for item in data[0]):
        raise ConfigError(f"{expected}; got a {type(data).__name__} of Python lists: convert them to arrays first "
                          f"(np.asarray(x), np.asarray(y))")
    if isinstance(data, Sized) and len(data) == 0:
        raise ConfigError(f"{expected}; got an empty {type(data).__name__}")
    return data


def callback_list(callbacks: Any, where: str) -> list:
    """``callbacks`` as a list, or a ``ConfigError`` naming ``where``: a single callback
    (Keras takes a list) raised "object is not iterable"."""
    from ..callbacks import Callback

    if callbacks is None:
        return []
    if isinstance(callbacks, Callback):
        raise ConfigError(f"{where}: callbacks must be a list, got one {type(callbacks).__name__}; pass "
                          f"callbacks=[{type(callbacks).__name__}(...)]")
    if isinstance(callbacks, (str, bytes, Mapping)) or not isinstance(callbacks, Iterable):
        raise ConfigError(f"{where}: callbacks must be a list of callbacks, got {callbacks!r:.60}")
    return list(callbacks)

"""``Trainer``: Keras-style ``fit`` / ``evaluate`` / ``predict`` over online learning rules.

This module is the loop (``fit`` and the other Keras entry points); the pieces it uses
live beside it: ``data.py`` (the forms of data, layouts, loss placement and weights),
``step.py`` (the one jitted training step per input shape: the rule's scan from the
:class:`etrace_fit.Learner` compiled on the first batch, metrics, the optax update),
``logs.py`` (History, Keras' argument checks, the summary table), ``memory.py``,
``optimizers.py``, ``losses.py``, ``metrics.py``, ``checkpoint.py``. A last, smaller
batch compiles once, not every epoch; evaluation is one jitted call per batch as well.
Callbacks get Keras' hooks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import time
import warnings
from typing import Any, Mapping, Sequence

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..algorithms import gradient_fidelity
from ..algorithms.hybrid import parse_bytes
from ..algorithms.learner import _check_batch_axis, compile as compile_learner
from ..algorithms.registry import check_algo
from ..callbacks import BatchLogs, CallbackList, ProgressBar
from ..callbacks.progress_bar import epoch_line
from ..compiler import format_path
from .. import checkpoint
from ..errors import ApproximationWarning, CheckpointError, ConfigError, ShapeError
from .data import (Arrays, Batch, batch_major, batches, check_count, check_finite, check_shuffle, class_table, loss_weight,
                   placement, split_validation)
from .logs import History, check_verbose, keras_result, model_summary, validation_schedule
from .memory import check_trace_memory, device_memory
from .step import build_train_step, placed_metrics, sequence_targets
from .losses import check_labels, get_loss
from .metrics import get_metrics
from .optimizers import find_hyperparams, get_optimizer

__all__ = ["History", "Trainer", "check_trace_memory", "device_memory"]

LOSS_PLACEMENTS = ("last", "all", "mask")


def _class_label(value: Any) -> int | None:
    """An integer class label as an int (for dashboards), anything else as None."""
    value = np.asarray(value)
    return int(value) if value.ndim == 0 and np.issubdtype(value.dtype, np.integer) else None


@jax.jit
def _norms(gradients: Any, trace_norms: Any) -> tuple[jax.Array, jax.Array]:
    """The global gradient norm and the largest trace norm, in one call (one sync)."""
    gradient = optax.global_norm(gradients) if gradients is not None else jnp.zeros(())
    traces = [jnp.max(n) for n in jax.tree.leaves(trace_norms)]
    return gradient, jnp.max(jnp.stack(traces)) if traces else jnp.zeros(())


class Trainer:
    """Trains a ``brainstate`` model on sequences with an online rule (or BPTT).

    Args:
        model: a module whose one call is one time step (e.g. ``etrace_fit.Sequential``).
        algo: ``"hybrid"`` (default), ``"d_rtrl"``, ``"esd_rtrl"``, ``"bptt"`` or a dict
            ``{path pattern: rule}`` (see :func:`etrace_fit.sequence_grad`).
        optimizer: a Keras name (``"adam"``, ``"sgd"``, ``"rmsprop"``, ... at Keras'
            default learning rate; see :mod:`etrace_fit.training.optimizers`) or an optax
            ``GradientTransformation`` (default ``"adam"``).
        loss: a name — ``"cross_entropy"`` = ``"sparse_categorical_crossentropy"``
            (integer labels), ``"categorical_crossentropy"``, ``"mse"``, ``"mae"``, the
            spiking ``"spike_rate_cross_entropy"`` / ``"spike_rate_mse"`` — or
            ``(output, target) -> (B,)``.
        metrics: a list of names (``"accuracy"`` = ``"acc"``, ``"mse"``, ``"mae"``, ...)
            or callables ``(output, target) -> (B,)``.
        decay: ES-D-RTRL's smoothing factor α.
        loss_on: ``"last"`` (the last step), ``"all"`` (every step, averaged) or
            ``"mask"`` (the steps a per-batch mask marks, averaged per sequence).
        time_major: whether arrays are ``(time, batch, ...)`` instead of ``(batch, time, ...)``.
        seed: shuffling seed.
        update_every: apply the optimizer every ``k`` time steps inside the sequence
            (true online learning) instead of once per batch.
        grad_clip: clip gradients to this global norm before the optimizer.
        memory_budget: for ``algo="hybrid"``: trace memory *per sample* (bytes, or a
            size like ``"16MiB"``; default 4 MiB) the plan may spend on D-RTRL, exact
            weights first, then the cheapest; ES-D-RTRL beyond it. The plan does not
            depend on the batch size; ``fit`` checks batch × bytes per sample against
            the device's memory before training. ``trainer.report()`` shows both.
        stateful: as Keras' stateful RNNs — batch ``k + 1`` continues the sequences of
            batch ``k`` (the same streams, the next steps): hidden states *and*
            eligibility traces carry from batch to batch, so an online rule learns
            from a stream of any length with memory flat in it (with
            ``update_every``, updates happen inside each batch too). States reset at
            the start of every epoch and on :meth:`reset_states`; ``predict`` and
            ``test_on_batch`` carry them as well. Needs ``shuffle=False`` and batches
            of one size. BPTT carries the states and truncates its gradient at each
            batch (truncated BPTT).
        regularizers: penalties on hidden activity added to the loss at every step,
            e.g. ``[FiringRateRegularizer(target=0.05)]``
            (:class:`~etrace_fit.training.spiking.FiringRateRegularizer`); they act at
            every step whatever ``loss_on`` is, so no step skips its learning signal.
        stop_on_nonfinite: stop ``fit`` (with a warning naming the fix) after an epoch
            in which every batch had a non-finite loss or gradient. Such a batch's
            update is never applied; a few of them only warn.

    Example::

        trainer = Trainer(model, algo="hybrid", optimizer=optax.adam(3e-3))
        history = trainer.fit(x, y, batch_size=32, epochs=5, validation_split=0.2)
        trainer.evaluate(x_test, y_test)
    """

    def __init__(
        self,
        model: Any,
        algo: str | Mapping[str, str] = "hybrid",
        optimizer: Any = None,
        loss: Any = "cross_entropy",
        metrics: Sequence[Any] | None = ("accuracy",),
        decay: float | None = None,
        loss_on: str = "last",
        time_major: bool = False,
        seed: int = 0,
        update_every: int | None = None,
        grad_clip: float | None = None,
        memory_budget: int | str | None = None,
        stateful: bool = False,
        regularizers: Sequence[Any] | None = None,
        stop_on_nonfinite: bool = True,
    ):
        check_algo(algo)
        if isinstance(metrics, str):
            raise ConfigError(f"metrics must be a list of names or callables, got the string {metrics!r}; "
                              f"write metrics=[{metrics!r}]")
        if loss_on not in LOSS_PLACEMENTS:
            raise ConfigError(f"unknown loss_on {loss_on!r}; valid: {', '.join(LOSS_PLACEMENTS)}")
        if update_every is not None and (not isinstance(update_every, int) or update_every < 1):
            raise ConfigError(f"update_every must be a positive int or None, got {update_every!r}")
        if update_every is not None and algo == "bptt":
            raise ConfigError("update_every needs an online rule; BPTT sees the whole sequence first")
        if grad_clip is not None and not grad_clip > 0:
            raise ConfigError(f"grad_clip must be positive, got {grad_clip!r}")
        parse_bytes(memory_budget)
        if not isinstance(stateful, bool):
            raise ConfigError(f"stateful must be True or False, got {stateful!r}")
        if not isinstance(stop_on_nonfinite, bool):
            raise ConfigError(f"stop_on_nonfinite must be True or False, got {stop_on_nonfinite!r}")
        self.stop_on_nonfinite = stop_on_nonfinite
        self.model = model
        self.stateful = stateful
        self.regularizers, self._step_fn = self._resolve_regularizers(regularizers)
        self._stream = None  # stateful: (batch size, TraceState) carried to the next batch, None: start afresh
        self.config = dict(algo=dict(algo) if isinstance(algo, Mapping) else algo, loss=loss if isinstance(loss, str) else None,
                           loss_callable=None if isinstance(loss, str) or loss is None else
                           getattr(loss, "__name__", type(loss).__name__),
                           optimizer=optimizer if isinstance(optimizer, str) else None,
                           metrics=[m for m in (metrics or ()) if isinstance(m, str)], decay=decay, loss_on=loss_on,
                           time_major=time_major, seed=seed, update_every=update_every, grad_clip=grad_clip,
                           memory_budget=memory_budget, stateful=stateful, stop_on_nonfinite=stop_on_nonfinite,
                           regularizers=[repr(r) for r in self.regularizers] or None)
        self.epoch = -1  # the last finished epoch
        self._callbacks = CallbackList()
        # A callback (BackupAndRestore) may set this in on_train_begin: fit starts there.
        self.resume_epoch: int | None = None
        self.algo, self.decay, self.loss_on = algo, decay, loss_on
        self.time_major, self.seed, self.update_every = time_major, seed, update_every
        self.memory_budget = memory_budget
        self.loss_fn = get_loss(loss)
        self.metric_fns = get_metrics(metrics)
        optimizer = get_optimizer(optimizer)
        self.optimizer = optimizer if grad_clip is None else optax.chain(optax.clip_by_global_norm(grad_clip), optimizer)
        self.opt_state = None
        self.learner = None  # compiled on the first training batch (etrace_fit.compile)
        self._pending_learning_rate: float | None = None
        self.stop_training = False
        self.history = History(model=self)
        self._step_loss = self._make_step_loss()
        self._forward = None
        self._steps: dict[int, tuple[Any, Any]] = {}  # id(program) -> (program, jitted train step)
        self._batch_programs: dict[tuple, tuple] = {}  # batch shapes -> _batch_program's entry (one fit)
        self.skipped_batches = 0  # batches whose loss was not finite (their update was not applied)
        self._eval_step = None
        # From the last training batch, for dashboards: gradients per weight path
        # (None with update_every) and per-sample trace norms per traced weight.
        self.last_gradients: dict | None = None
        self.last_trace_norms: dict | None = None
        # Input sequences (N, T, ...) for dashboards, validation ones if fit has them;
        # sample_input is the first, sample_label its label.
        self.sample_input: np.ndarray | None = None
        self.sample_inputs: np.ndarray | None = None
        self.sample_label: Any = None
        self.batch_size: int | None = None
        self._num_classes: int | None = None  # the model's outputs, known after the first batch
        self._norms_warned = False
        self._recorder = None

    # ------------------------------------------------------------------ pieces
    def _resolve_regularizers(self, regularizers) -> tuple[tuple, Any]:
        """``((regulariser, its layer paths), ...)`` and the step function that returns
        the model's output with those layers' spikes (None without regularisers)."""
        if regularizers is None:
            return (), None
        if not isinstance(regularizers, (list, tuple)):
            raise ConfigError(f"regularizers must be a list, e.g. [FiringRateRegularizer(target=0.05)], got "
                              f"{type(regularizers).__name__}")
        spiking = self.spiking_layers()
        resolved = []
        for n, reg in enumerate(regularizers):
            if not callable(getattr(reg, "select", None)) or not callable(reg):
                raise ConfigError(f"regularizers[{n}] must be a regulariser such as FiringRateRegularizer(...), "
                                  f"got {reg!r}")
            resolved.append((reg, tuple(reg.select(spiking))))
        for path in dict.fromkeys(p for _, paths in resolved for p in paths):
            try:
                inspect.signature(spiking[path].spikes).bind(gradient=True)
            except TypeError:
                raise ConfigError(
                    f"{path} ({type(spiking[path]).__name__}): a regulariser needs its spikes with their surrogate "
                    f"gradient, and its spikes() takes no gradient argument; define spikes(self, gradient=False) "
                    f"returning the step's spikes, without stop_gradient when gradient is True") from None
        if not resolved:
            return (), None
        taps = {path: spiking[path] for _, paths in resolved for path in paths}
        model = self.model

        def step_fn(*inputs):
            return model(*inputs), {path: layer.spikes(gradient=True) for path, layer in taps.items()}

        return tuple(resolved), step_fn

    def _make_step_loss(self):
        loss_fn, regularizers = self.loss_fn, self.regularizers

        def step_loss(output, target):
            if not regularizers:
                y, weight = target
                return jnp.sum(weight * loss_fn(output, y)) / weight.shape[0]
            (y, weight, reg_weight), (output, spikes) = target, output
            task = jnp.sum(weight * loss_fn(output, y)) / weight.shape[0]
            penalty = sum(jnp.mean(reg({p: spikes[p] for p in paths})) for reg, paths in regularizers)
            return task + reg_weight * penalty

        return step_loss

    def _params(self):
        return self.model.states(brainstate.ParamState)

    def _time_major(self, batch: Batch, time_major: bool | None = None) -> tuple[np.ndarray, Any, np.ndarray]:
        """:func:`~etrace_fit.training.data.placement` with this trainer's ``loss_on``
        and layout."""
        return placement(batch, self.loss_on, self.time_major if time_major is None else time_major)

    def _ensure_states(self, batch_size: int) -> None:
        """Create the hidden states of a model no batch has run through yet."""
        if not self.model.states(brainstate.HiddenState):
            brainstate.nn.init_all_states(self.model, batch_size=batch_size)

    def _outputs(self, xs: jax.Array, carry: bool = False) -> jax.Array:
        """The model's outputs at every step, ``(T, B, ...)``, from reset states (from
        the carried ones with ``carry``: a stateful trainer's predict)."""
        self._ensure_states(xs.shape[1])
        if carry:
            self._continue_stream(xs.shape[1])
        if self._forward is None:
            model = self.model

            @brainstate.transform.jit(static_argnums=1)
            def forward(xs, carry):
                if not carry:
                    brainstate.nn.reset_all_states(model, batch_size=xs.shape[1])
                return brainstate.transform.for_loop(model, xs)

            self._forward = forward
        return self._forward(xs, carry)

    # ------------------------------------------------------------------ streams
    def reset_states(self) -> None:
        """Start every stream afresh (Keras' ``reset_states``): the next batch begins
        at the initial hidden states with zero eligibility traces."""
        self._stream = None

    def _continue_stream(self, batch_size: int):
        """The carried traces for the next batch of a stateful trainer (None: start
        afresh, resetting the hidden states); a batch of another size is an error."""
        if self._stream is None:
            brainstate.nn.reset_all_states(self.model, batch_size=batch_size)
            self._stream = (batch_size, None)
        size, traces = self._stream
        if size != batch_size:
            raise ShapeError(f"stateful=True continues the {size} streams of the last batch, but this batch has "
                             f"{batch_size} sequences; give every batch the same size (drop_remainder=True) or "
                             f"call reset_states() first")
        return traces

    def _check_first(self, xs, ys) -> None:
        """Errors before any training, on the first batch: the model's input size (the
        layer says), the loss's output shape (one value per sample) and the labels' range."""
        out = self._outputs(xs[:1])
        self._num_classes = int(out.shape[-1]) if out.ndim >= 2 else None
        value = jax.eval_shape(jax.vmap(self.loss_fn), out, ys[:1])
        if tuple(value.shape) != tuple(out.shape[:2]):
            name = getattr(self.loss_fn, "__name__", type(self.loss_fn).__name__)
            raise ConfigError(f"loss {name!r} returned shape {tuple(value.shape[1:])} for a batch of "
                              f"{out.shape[1]} samples; a loss returns one value per sample, shape "
                              f"({out.shape[1]},) (sum or average any other axis inside the loss)")
        self._check_targets(ys, "y")

    def _check_targets(self, y, where: str) -> None:
        """NaN / inf in float targets, and integer labels outside the model's classes."""
        if y is None:
            return
        y = np.asarray(y)
        check_finite(y, where)
        if getattr(self.loss_fn, "integer_labels", False) and self._num_classes is not None:
            check_labels(y, self._num_classes, where=where)

    def _metrics(self, outputs, ys, weight) -> dict[str, jax.Array]:
        return placed_metrics(self.metric_fns, outputs, ys, weight)

    # ------------------------------------------------------------------ public
    def fit(
        self,
        x: Any,
        y: Any = None,
        batch_size: int = 32,
        epochs: int = 1,
        verbose: int | str = "auto",
        callbacks: Sequence[Any] | None = None,
        validation_split: float = 0.0,
        validation_data: Any = None,
        shuffle: bool | str = True,
        class_weight: Mapping[int, float] | None = None,
        sample_weight: Any = None,
        initial_epoch: int = 0,
        steps_per_epoch: int | None = None,
        validation_freq: int | Sequence[int] = 1,
        drop_remainder: bool = False,
    ) -> History:
        """Train for ``epochs`` passes over the data; returns a new :class:`History`.

        The arguments are Keras' (same names, order and meaning):

        - ``verbose``: ``"auto"`` (= 1), 0 silent, 1 a progress bar per epoch
          (``callbacks.ProgressBar``; one line per epoch when the output is not a
          terminal), 2 one line per epoch.
        - ``shuffle``: ``True``, ``False``, or ``"batch"`` (shuffle the order of
          batch-sized chunks only).
        - ``class_weight``: ``{class: weight}`` scaling the loss of each step by the
          weight of its integer label (classes not named weigh 1).
        - ``sample_weight``: per sequence ``(N,)`` or per sequence and step ``(N, T)``
          (time-major ``(T, N)`` with ``time_major=True``), scaling the loss; metrics
          are not weighted.
        - ``initial_epoch``: the epoch to start at (to continue a run);
          ``validation_freq``: validate every ``n`` epochs, or at the listed (1-based)
          epochs.

        Logs per epoch: ``loss``, each metric, and with validation data ``val_loss`` and
        ``val_<metric>``. Bad data (empty, x and y of different lengths, NaN / inf,
        labels out of range, a wrong feature size) raises before any update.
        """
        verbose = check_verbose(verbose)
        check_shuffle(shuffle)
        if self.stateful and shuffle is not False:
            raise ConfigError("stateful=True reads batch k + 1 as the continuation of batch k: pass shuffle=False")
        if not isinstance(initial_epoch, int) or isinstance(initial_epoch, bool) or initial_epoch < 0:
            raise ConfigError(f"initial_epoch must be an int >= 0, got {initial_epoch!r}")
        if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < initial_epoch:
            raise ConfigError(f"epochs must be an int >= initial_epoch ({initial_epoch}), got {epochs!r}")
        validates = validation_schedule(validation_freq)
        check_count(batch_size, "batch_size")
        if steps_per_epoch is not None:
            check_count(steps_per_epoch, "steps_per_epoch")
        if validation_split and validation_data is not None:
            raise ConfigError("give validation_data or validation_split, not both")
        is_array = hasattr(x, "shape")
        if (sample_weight is not None or class_weight is not None) and not is_array:
            raise ConfigError("sample_weight and class_weight apply to array data (x, y)")
        if is_array and self.time_major:  # batches are cut along the batch axis: read it batch-major
            x, y, sample_weight = batch_major(x, y, sample_weight)
        if validation_split:
            if not is_array:
                raise ConfigError("validation_split needs array data; pass validation_data for iterables")
            (x, y), held_out = split_validation(x, y, validation_split)
            validation = Arrays(*held_out)
            if sample_weight is not None:
                sample_weight = np.asarray(sample_weight)[: len(x)]
        else:
            validation = self._as_data(validation_data, "validation_data")
        if is_array:
            check_finite(x)
            if y is not None:
                check_finite(y, "y")
        weights_by_class = None if class_weight is None else class_table(class_weight, y)
        self.sample_input = self.sample_inputs = self.sample_label = None
        self.batch_size = batch_size
        if isinstance(validation, Arrays):
            check_finite(validation.x, "validation x")
            if validation.y is not None:
                check_finite(validation.y, "validation y")
            if len(validation.x):
                self.sample_inputs = np.asarray(validation.x[:8])
                self.sample_input = self.sample_inputs[0]
                self.sample_label = None if validation.y is None else _class_label(validation.y[0])
        self.stop_training = False
        if self.learner is not None and not self.learner.is_current():
            self.learner = None  # a layer attribute changed or states were recreated: compile again
            self._steps.clear()
        self._batch_programs.clear()  # re-checked against the model's states at every fit
        params = self._params()
        callbacks = list(callbacks or [])
        steps = None
        if is_array:
            size = np.shape(x)[0]
            steps = size // batch_size if drop_remainder else -(-size // batch_size)
            steps = steps if steps_per_epoch is None else min(steps, steps_per_epoch)
        elif steps_per_epoch is not None:
            steps = steps_per_epoch
        if verbose == 1 and not any(isinstance(c, ProgressBar) for c in callbacks):
            callbacks.append(ProgressBar(total=steps))
        self.epochs = epochs
        fit_params = {"verbose": verbose, "epochs": epochs, "steps": steps}
        self.history = History(fit_params, model=self)
        hooks = CallbackList(callbacks, model=self, params=fit_params)
        self._callbacks = hooks
        self.resume_epoch = None
        self._warn_spiking_readout()
        hooks.on_train_begin({})
        if self.resume_epoch is not None:  # a BackupAndRestore callback restored a run
            initial_epoch = max(initial_epoch, self.resume_epoch)
        for epoch in range(initial_epoch, epochs):
            start = time.perf_counter()
            self.reset_states()  # stateful: every epoch reads the streams from their start
            hooks.on_epoch_begin(epoch, {})
            records = []  # per batch: (size, loss, metrics, finite) as device values until the epoch ends
            data = batches(x, y, batch_size=batch_size, shuffle=shuffle, seed=self.seed + epoch,
                           drop_remainder=drop_remainder, sample_weight=sample_weight)
            for step, batch in enumerate(data):
                if steps_per_epoch is not None and step >= steps_per_epoch:
                    break
                time_major = self.time_major and not is_array
                xs, ys, weight = self._time_major(batch, time_major)
                weighted = loss_weight(batch, ys, weight, weights_by_class, time_major)
                if not is_array:
                    check_finite(np.asarray(xs).swapaxes(0, 1), "x")
                if epoch == initial_epoch and step == 0:
                    self._check_first(xs, ys)
                    if is_array:  # every label, not only the first batch's, before the first update
                        self._check_targets(y, "y")
                    if isinstance(validation, Arrays):
                        self._check_targets(validation.y, "validation y")
                elif not is_array:  # an iterable's batches are checked as they come, before their step
                    self._check_targets(ys, f"y of batch {step}")
                    if self.sample_input is None:
                        self.sample_inputs = np.swapaxes(np.asarray(xs[:, :8]), 0, 1)
                        self.sample_input = self.sample_inputs[0]
                        self.sample_label = _class_label(ys[-1, 0])
                hooks.on_train_batch_begin(step, {"size": int(xs.shape[1]), "time_steps": int(xs.shape[0])})
                loss, logs, finite = self._train_batch(params, xs, ys, weighted, weight)
                hooks.on_train_batch_end(step, BatchLogs({"loss": loss, **logs}))
                records.append((xs.shape[1], loss, logs, finite))
                if self.stop_training:
                    break
            epoch_logs = self._epoch_logs(epoch, jax.device_get(records))
            if self.learning_rate is not None:
                epoch_logs["learning_rate"] = self.learning_rate
            if validation is not None and validates(epoch):
                epoch_logs.update({f"val_{k}": v for k, v in self._evaluate(validation, batch_size, hooks).items()})
            self.history.append(epoch, epoch_logs)
            self.epoch = epoch
            self._check_norms(epoch)
            hooks.on_epoch_end(epoch, epoch_logs)
            if verbose == 2:
                print(epoch_line(epoch, epochs, epoch_logs, time.perf_counter() - start), flush=True)
            if self.stop_training:
                break
        hooks.on_train_end({k: v[-1] for k, v in self.history.history.items()})
        return self.history

    #: Gradient (global) and eligibility-trace (per sample) norms above these at an
    #: epoch's end make ``fit`` warn once: training is about to diverge or overflow.
    EXPLODING_GRADIENT_NORM = 1e3
    EXPLODING_TRACE_NORM = 1e8

    def _check_norms(self, epoch: int) -> None:
        """Warn (once per trainer) when the last batch's gradient or trace norms explode."""
        if self._norms_warned:
            return
        gradient = trace = 0.0
        if self.last_gradients is not None or self.last_trace_norms:
            gradient, trace = (float(v) for v in _norms(self.last_gradients, self.last_trace_norms))
        found = []
        if not gradient <= self.EXPLODING_GRADIENT_NORM:
            found.append(f"the gradient norm is {gradient:.3g}")
        if not trace <= self.EXPLODING_TRACE_NORM:
            found.append(f"an eligibility-trace norm is {trace:.3g}")
        if found:
            self._norms_warned = True
            warnings.warn(f"epoch {epoch + 1}: {' and '.join(found)}, large enough to derail training or overflow "
                          f"float32; clip the gradient (Trainer(grad_clip=1.0)), lower the learning rate, or use "
                          f"trace_dtype float64 (TensorBoard's norms/ scalars follow them)", RuntimeWarning,
                          stacklevel=3)

    def _warn_spiking_readout(self) -> None:
        """Spikes of the last step alone carry almost no gradient: say what learns."""
        from ..layers import LeakySpikeReadout

        last = self.model.layers[-1] if hasattr(self.model, "layers") and len(self.model.layers) else self.model
        if isinstance(last, LeakySpikeReadout) and self.loss_on == "last":
            warnings.warn(
                f"{type(last).__name__} emits spikes, and a loss on the last step's spikes alone barely learns "
                f"(its loss stays near ln(classes)); use loss_on='all' with loss='spike_rate_cross_entropy' or "
                f"'spike_rate_mse', or a LeakyRateReadout with loss_on='last' (see etrace_fit.training.spiking)",
                UserWarning, stacklevel=3)

    def _compiled(self, xs, ys, weight):
        """The program for this batch's shape, from the learner compiled on the first
        batch: its plan is kept for every later shape (a last, smaller batch must not
        change a weight's rule under the report)."""
        if self.learner is None:
            with warnings.catch_warnings():
                warnings.simplefilter("once", UserWarning)
                _check_batch_axis(self.model, jax.tree.leaves(xs))
                self.learner = compile_learner(self.model, xs[0], self._step_loss, algo=self.algo, decay=self.decay,
                                               memory_budget=self.memory_budget, plan_batch=xs.shape[1],
                                               step_fn=self._step_fn)
            if self.learner.plan is not None:
                check_trace_memory(self.learner.plan, xs.shape[1])
        return self.learner.compiled(xs, sequence_targets(ys, weight, bool(self.regularizers)))

    def _build_step(self, compiled):
        """The jitted training step of ``compiled`` (see :func:`.step.build_train_step`)."""
        return build_train_step(compiled, self.optimizer, self.metric_fns, self.loss_on, self.update_every,
                                regularized=bool(self.regularizers))

    def _batch_program(self, xs, ys, weight):
        """``(compiled, jitted step)`` for this batch's shapes, kept per shape for the
        whole ``fit`` (no signature of the model's states per batch)."""
        key = (xs.shape, str(xs.dtype), ys.shape, str(ys.dtype), weight.shape)
        entry = self._batch_programs.get(key)
        if entry is None:
            compiled = self._compiled(xs, ys, weight)
            step = self._steps.get(id(compiled.program))
            if step is None:
                step = self._steps[id(compiled.program)] = (compiled.program, self._build_step(compiled))
            entry = self._batch_programs[key] = (compiled, step[1])
        return entry

    def _epoch_logs(self, epoch: int, records: list) -> dict[str, float]:
        """Size-weighted means of the batches' loss and metrics; warns when batches had a
        non-finite loss (their updates were not applied)."""
        total = sum(size for size, *_ in records)
        logs = {"loss": sum(size * float(loss) for size, loss, _, _ in records) / total}
        for key in records[0][2] if records else ():
            logs[key] = sum(size * float(metrics[key]) for size, _, metrics, _ in records) / total
        skipped = sum(not bool(finite) for *_, finite in records)
        fix = ("lower the learning rate, set grad_clip, or use trace_dtype float64 if eligibility traces overflow")
        if skipped and skipped == len(records) and self.stop_on_nonfinite:
            self.skipped_batches += skipped
            self.stop_training = True
            warnings.warn(f"epoch {epoch + 1}: every batch ({skipped}) had a non-finite loss or gradient, so "
                          f"nothing was learned; training stops ({fix}; Trainer(stop_on_nonfinite=False) "
                          "goes on)", RuntimeWarning, stacklevel=3)
        elif skipped:
            self.skipped_batches += skipped
            warnings.warn(f"epoch {epoch + 1}: {skipped} of {len(records)} batches had a non-finite loss or "
                          f"gradient; their updates were not applied ({fix}, or add TerminateOnNaN to stop)",
                          RuntimeWarning, stacklevel=3)
        return logs

    def _train_batch(self, params, xs, ys, weight, metric_weight=None):
        """One jitted training step; returns the batch's loss, metrics and finite flag
        as device values (no host sync)."""
        values = {format_path(path): state.value for path, state in params.items()}
        traces = None
        if self.stateful:  # the states go on from the last batch; the traces too
            traces = self._continue_stream(xs.shape[1])
        else:
            brainstate.nn.reset_all_states(self.model, batch_size=xs.shape[1])  # async: overlaps the last step
        compiled, step = self._batch_program(xs, ys, weight)
        if self.opt_state is None:
            self._init_optimizer(values if self.update_every is None else compiled.weight_leaves())
        if self.stateful and traces is None:
            traces = compiled.program.init_traces(xs.shape[1])
        leaves = compiled.state_leaves()
        new_values, self.opt_state, final, grads, loss, logs, norms, finite, traces = step(
            values, self.opt_state, leaves, [xs], ys, weight, None if metric_weight is weight else metric_weight,
            traces)
        for path, state in params.items():
            state.value = new_values[format_path(path)]
        compiled.write_states(final)
        if self.stateful:
            self._stream = (xs.shape[1], traces)
        self.last_gradients, self.last_trace_norms = grads, norms
        return loss, logs, finite

    def _build_eval_step(self):
        model, loss_fn, regularizers = self.model, self.loss_fn, self.regularizers
        step = model if self._step_fn is None else self._step_fn

        @brainstate.transform.jit(static_argnums=3)
        def eval_step(xs, ys, weight, carry=False):
            if not carry:
                brainstate.nn.reset_all_states(model, batch_size=xs.shape[1])
            outputs = brainstate.transform.for_loop(step, xs)
            penalty = 0.0
            if regularizers:  # the same loss as in training: the penalties averaged over steps and samples
                outputs, spikes = outputs
                penalty = sum(jnp.mean(jax.vmap(reg)({p: spikes[p] for p in paths})) for reg, paths in regularizers)
            per_step = jax.vmap(loss_fn)(outputs, ys)
            return {"loss": jnp.sum(weight * per_step) / weight.shape[1] + penalty,
                    **self._metrics(outputs, ys, weight)}

        return eval_step

    def _as_data(self, data: Any, name: str = "x", y: Any = None) -> Any:
        """Array data as batch-major :class:`Arrays` (``(x, y)`` or ``(x, y, mask)``
        tuples; time-major ones are swapped as views), an iterable of batches as is,
        ``None`` as ``None``."""
        if data is None:
            return None
        if hasattr(data, "shape"):
            data = (data, y)
        if isinstance(data, (tuple, list)) and len(data) in (2, 3) and hasattr(data[0], "shape"):
            x, y, mask = (*data, None)[:3]
            if self.time_major:
                x, y, mask = batch_major(x, y, mask, name=name)
            return Arrays(x, y, mask)
        if isinstance(data, (tuple, list)) and data and hasattr(data[0], "shape"):
            raise ConfigError(f"{name} must be (x, y), (x, y, mask) or an iterable of batches; got a "
                              f"{type(data).__name__} of {len(data)} arrays")
        return data

    def _evaluate(self, data: Any, batch_size: int, hooks: CallbackList | None = None) -> dict[str, float]:
        """Mean loss and metrics over ``data`` (:class:`Arrays` or an iterable of batches),
        from reset states; a stateful trainer's streams are left where they were."""
        with self._keeping_streams():
            return self._evaluate_from_reset(data, batch_size, hooks)

    @contextlib.contextmanager
    def _keeping_streams(self):
        """A stateful trainer's hidden states as they were after the block (evaluation
        from reset states must not cut the training streams)."""
        if not self.stateful or self._stream is None:
            yield
            return
        saved = {path: state.value for path, state in self.model.states(brainstate.HiddenState).items()}
        try:
            yield
        finally:
            for path, state in self.model.states(brainstate.HiddenState).items():
                state.value = saved[path]

    def _evaluate_from_reset(self, data: Any, batch_size: int, hooks: CallbackList | None = None
                             ) -> dict[str, float]:
        hooks = hooks if hooks is not None else CallbackList()
        if isinstance(data, Arrays):
            source, time_major = batches(data.x, data.y, batch_size=batch_size, shuffle=False, mask=data.mask), False
        else:
            source, time_major = batches(data, batch_size=batch_size, shuffle=False), self.time_major
        totals: dict[str, float] = {}
        count = 0
        hooks.on_test_begin({})
        for step, batch in enumerate(source):
            hooks.on_test_batch_begin(step, {})
            xs, ys, weight = self._time_major(batch, time_major)
            self._ensure_states(xs.shape[1])
            if step == 0 and self._num_classes is None:
                self._num_classes = int(self._outputs(xs[:1]).shape[-1])
            if step == 0 and isinstance(data, Arrays):  # every sample, before the first batch runs
                check_finite(data.x, "x")
                self._check_targets(data.y, "y")
            elif not isinstance(data, Arrays):
                check_finite(np.asarray(xs), f"x of batch {step}")
                self._check_targets(ys, f"y of batch {step}")
            if self._eval_step is None:
                self._eval_step = self._build_eval_step()
            logs = {key: float(value) for key, value in self._eval_step(xs, ys, weight, False).items()}
            for key, value in logs.items():
                totals[key] = totals.get(key, 0.0) + value * xs.shape[1]
            count += xs.shape[1]
            hooks.on_test_batch_end(step, logs)
        result = {key: value / count for key, value in totals.items()}
        hooks.on_test_end(result)
        return result

    def _one_batch(self, x: Any, y: Any, sample_weight: Any, class_weight: Any, name: str):
        """One batch of arrays as ``(xs, ys, loss weight, placement weight)``, time-major."""
        data = self._as_data((x, y), name)
        if not isinstance(data, Arrays):
            raise ConfigError(f"{name} takes arrays x (and y)")
        check_finite(data.x)
        batch = Batch(data.x, data.y, data.mask, None if sample_weight is None else np.asarray(sample_weight))
        if batch.sample_weight is not None and self.time_major and np.ndim(batch.sample_weight) == 2:
            batch = dataclasses.replace(batch, sample_weight=np.swapaxes(batch.sample_weight, 0, 1))
        xs, ys, weight = self._time_major(batch, False)
        table = None if class_weight is None else class_table(class_weight, data.y)
        return xs, ys, loss_weight(batch, ys, weight, table, False), weight

    def train_on_batch(self, x: Any, y: Any = None, sample_weight: Any = None, class_weight: Any = None,
                       return_dict: bool = False) -> Any:
        """One update on one batch, as Keras' ``train_on_batch``: the loss (and metrics:
        a list ``[loss, *metrics]``, or a dict with ``return_dict``). With
        ``stateful=True`` consecutive calls continue the same streams — hidden states
        and eligibility traces carry — so a stream fed in chunks learns online; call
        :meth:`reset_states` between streams."""
        xs, ys, weighted, weight = self._one_batch(x, y, sample_weight, class_weight, "train_on_batch")
        if self.learner is None:
            self._check_first(xs, ys)
        loss, logs, finite = self._train_batch(self._params(), xs, ys, weighted, weight)
        if not bool(finite):
            self.skipped_batches += 1
            warnings.warn("train_on_batch: the loss or gradient is not finite; the update was not applied",
                          RuntimeWarning, stacklevel=2)
        return keras_result({"loss": float(loss), **{k: float(v) for k, v in logs.items()}}, return_dict)

    def test_on_batch(self, x: Any, y: Any = None, sample_weight: Any = None, return_dict: bool = False) -> Any:
        """Loss and metrics of one batch without an update, as Keras'
        ``test_on_batch``: from reset states, or for a stateful trainer from its
        streams' current states (which it leaves where they were: the streams' traces
        only follow training)."""
        xs, ys, weighted, weight = self._one_batch(x, y, sample_weight, None, "test_on_batch")
        self._ensure_states(xs.shape[1])
        carry = self.stateful
        if carry:
            self._continue_stream(xs.shape[1])
        if self._eval_step is None:
            self._eval_step = self._build_eval_step()
        with self._keeping_streams():
            logs = self._eval_step(xs, ys, weighted, carry)
        logs = {"loss": float(logs["loss"]), **{k: float(v) for k, v in logs.items() if k != "loss"}}
        return keras_result(logs, return_dict)

    def evaluate(self, x: Any, y: Any = None, batch_size: int = 32, verbose: int | str = "auto",
                 callbacks: Sequence[Any] | None = None) -> dict[str, float]:
        """``{"loss": ..., <metric>: ...}`` averaged over the data (loss placed as in
        training). ``x`` as in :meth:`fit`: arrays (with ``y``) or an iterable of batches."""
        check_verbose(verbose)
        check_count(batch_size, "batch_size")
        return self._evaluate(self._as_data(x, "x", y), batch_size, CallbackList(callbacks, model=self))

    def spiking_layers(self) -> dict[str, Any]:
        """The model's layers with a ``spikes()`` method (LIF, ALIF, spiking readouts), by path."""
        return {format_path(path): node for path, node in self.model.nodes().items()
                if callable(getattr(node, "spikes", None))}

    def record_spikes(self, x: Any) -> dict[str, np.ndarray]:
        """Run one input sequence ``x`` of shape ``(T, features...)`` from reset states
        and return every spiking layer's spikes, ``{path: (T, *size)}`` of 0 / 1.

        ``ConfigError`` if the model has no spiking layer. The model's hidden states
        are left at batch size 1; the next ``fit`` / ``evaluate`` batch resets them.
        """
        layers = self.spiking_layers()
        if not layers:
            raise ConfigError(f"record_spikes: the model ({type(self.model).__name__}) has no spiking layer "
                              "(a layer with a spikes() method such as LIF or ALIF)")
        x = jnp.asarray(x)
        step_rank = self._step_input_rank()
        if x.ndim < 2 or (step_rank is not None and x.ndim != step_rank + 1):
            expected = "(time, features...)" if step_rank is None else \
                "(time, " + ", ".join(["features"] * step_rank) + ")"
            hint = "; this looks like a batch of sequences: pass one, e.g. x[0]" if step_rank is not None and \
                x.ndim == step_rank + 2 else ""
            raise ShapeError(f"record_spikes: x must be one sequence {expected}, got shape {tuple(x.shape)}{hint}")
        self._ensure_states(1)
        if self._recorder is None:
            model = self.model

            @brainstate.transform.jit
            def record(xs):
                brainstate.nn.reset_all_states(model, batch_size=1)

                def step(x_t):
                    model(x_t)
                    return {name: layer.spikes() for name, layer in layers.items()}

                return brainstate.transform.for_loop(step, xs)

            self._recorder = record
        spikes = self._recorder(x[:, None])
        return {name: np.asarray(value[:, 0]) for name, value in spikes.items()}

    def _step_input_rank(self) -> int | None:
        """How many feature axes one step's input has (from the compiled step, or the
        first layer's ``in_size``), or None when that is not known."""
        if self.learner is not None:
            return len(self.learner.graph.module.input_vars[0].aval.shape) - 1
        first = self.model.layers[0] if hasattr(self.model, "layers") and len(self.model.layers) else self.model
        size = getattr(first, "in_size", None)
        if isinstance(size, int):
            return 1
        return len(size) if isinstance(size, tuple) else None

    def gradient_fidelity(self, x: Any, y: Any = None, mask: Any = None) -> dict[str, Any]:
        """Cosine and norm ratio of this trainer's online gradient against BPTT's on one
        batch (``x`` laid out as for ``fit``, the loss placed as in training), per
        weight path: ``{"layers.0.weight": WeightFidelity(cosine, norm_ratio)}``. See
        :func:`etrace_fit.gradient_fidelity`; for ``algo="bptt"`` every value is 1."""
        xs, ys, weight = self._time_major(Batch(x, y, mask))
        self._ensure_states(xs.shape[1])
        brainstate.nn.reset_all_states(self.model, batch_size=xs.shape[1])
        targets = sequence_targets(ys, weight, bool(self.regularizers))
        if self._step_fn is None:
            return gradient_fidelity(self.model, xs, targets, self._step_loss, algo=self.algo, decay=self.decay,
                                     memory_budget=self.memory_budget)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ApproximationWarning)  # what is measured here
            learner = compile_learner(self.model, xs[0], self._step_loss, algo=self.algo, decay=self.decay,
                                      memory_budget=self.memory_budget, step_fn=self._step_fn)
        return gradient_fidelity(learner, xs, targets)

    def summary(self, x: Any = None, print_fn: Any = print) -> str:
        """Keras' ``summary()``: one row per layer — its type, parameter count, hidden
        states (shape per sample) and, once compiled, the rule per weight and its trace
        memory per sample — then the totals. The rules are chosen at the first
        training batch; pass ``x`` (training data, laid out as for :meth:`fit`) to
        compile on its first samples now. Printed with ``print_fn`` (None: not
        printed) and returned."""
        if x is not None and self.learner is None:
            data = self._as_data(x, "x")
            if isinstance(data, Arrays):
                first = next(batches(data.x, data.y, batch_size=32, shuffle=False, mask=data.mask))
            else:
                first = next(iter(batches(data, batch_size=32, shuffle=False)))
            xs, ys, weight = self._time_major(first, False if isinstance(data, Arrays) else None)
            self._ensure_states(xs.shape[1])
            brainstate.nn.reset_all_states(self.model, batch_size=xs.shape[1])
            self._compiled(xs, ys, weight)
        self._ensure_states(1)  # the hidden states' shapes per sample (fit resets them per batch)
        text = model_summary(self.model, self.learner, algo=self.algo)
        if print_fn is not None:
            print_fn(text)
        return text

    @property
    def rules(self) -> dict[str, str]:
        """The rule per traced weight path (``{"layers.0.weight": "d_rtrl", ...}``) of
        the plan compiled on the first training batch; empty for BPTT or before ``fit``."""
        return {} if self.learner is None else self.learner.rules

    def report(self) -> str:
        """The compile report with the rule chosen per weight, its trace memory and which
        gradients are approximate (available once ``fit`` has seen a batch)."""
        if self.learner is None:
            raise ConfigError("the model is compiled on the first training batch; call fit first")
        return self.learner.report()

    # ----------------------------------------------------------- learning rate
    def _init_optimizer(self, values: Any) -> None:
        """Create the optimizer state over ``values`` and apply a learning rate set
        before it existed."""
        self.opt_state = self.optimizer.init(values)
        if self._pending_learning_rate is not None:
            self.learning_rate, self._pending_learning_rate = self._pending_learning_rate, None

    def _hyperparams(self) -> dict | None:
        return find_hyperparams(self.opt_state)

    @property
    def learning_rate(self) -> float | None:
        """The optimizer's current learning rate, when it was built with
        ``optax.inject_hyperparams`` (else None)."""
        if self.opt_state is None:
            return self._pending_learning_rate
        hyperparams = self._hyperparams()
        if hyperparams is None or "learning_rate" not in hyperparams:
            return None
        return float(hyperparams["learning_rate"])

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        if self.opt_state is None:
            self._pending_learning_rate = float(value)
            return
        hyperparams = self._hyperparams()
        if hyperparams is None or "learning_rate" not in hyperparams:
            raise ConfigError("the learning rate can only be changed for an optimizer built with "
                              "optax.inject_hyperparams, e.g. optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)")
        hyperparams["learning_rate"] = jnp.asarray(value, jnp.asarray(hyperparams["learning_rate"]).dtype)

    # -------------------------------------------------------------- checkpoints
    def _fingerprint(self) -> list:
        return checkpoint.fingerprint(self._params().to_dict_values())

    def save(self, path: Any) -> None:
        """Write weights, optimizer state, epoch, history and callback state to ``path``
        (atomically; see :mod:`etrace_fit.checkpoint`)."""
        state = {"params": {format_path(p): s.value for p, s in self._params().items()},
                 "opt_state": self.opt_state if self.opt_state is not None else {}}
        extra = {"epoch": self.epoch, "history": self.history.history, "history_epochs": self.history.epoch,
                 "callbacks": self._callbacks.state_dict(), "config": self.config,
                 "has_opt_state": self.opt_state is not None}
        checkpoint.write_checkpoint(path, state, params_fingerprint=self._fingerprint(), extra=extra)

    def restore(self, path: Any) -> dict:
        """Load a checkpoint written by :meth:`save` into this trainer and its model;
        returns the manifest. :class:`CheckpointError` (and nothing changed) if it does
        not fit the model, the optimizer or ``update_every``, naming what differs."""
        manifest, state = checkpoint.read_checkpoint(path, params_fingerprint=self._fingerprint())
        try:
            params = {p: jax.tree.unflatten(jax.tree.structure(s.value),
                                            [jnp.asarray(leaf) for leaf in jax.tree.leaves(state["params"][format_path(p)])])
                      for p, s in self._params().items()}
            epoch, epochs = int(manifest["epoch"]), [int(e) for e in manifest["history_epochs"]]
            history = {str(k): [float(x) for x in v] for k, v in dict(manifest["history"]).items()}
            callbacks = dict(manifest.get("callbacks", {}))
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"{path}: the checkpoint lacks or garbles {error} (written by another program?)"
                                  ) from error
        opt_state = self.opt_state
        if manifest.get("has_opt_state"):
            opt_state = self._restored_opt_state(path, manifest, state, params)
        for path_, param in self._params().items():
            param.value = params[path_]
        self.opt_state = opt_state
        self.history = History(self.history.params, model=self)
        self.history.epoch.extend(epochs)
        self.history.history = {k: list(v) for k, v in history.items()}
        self.epoch = epoch
        self._callbacks.load_state_dict(callbacks)
        return manifest

    def _restored_opt_state(self, path, manifest, state, params):
        """The saved optimizer state on this trainer's optimizer, or a CheckpointError
        saying which of optimizer, ``update_every`` and ``grad_clip`` differ."""
        from flax import serialization

        saved = manifest.get("config") or {}
        now = self.config
        differs = [f"{key} {saved.get(key)!r} when saved, {now.get(key)!r} now" for key in
                   ("optimizer", "update_every", "grad_clip") if key in saved and saved.get(key) != now.get(key)]
        if self.update_every is None:
            target = self.optimizer.init({format_path(p): v for p, v in params.items()})
        else:
            target = self.optimizer.init([leaf for v in params.values() for leaf in jax.tree.leaves(v)])
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
        manifest, _ = checkpoint.read_checkpoint(path)
        nullable = ("decay", "update_every", "grad_clip", "memory_budget")
        config = {k: v for k, v in dict(manifest.get("config") or {}).items() if v is not None or k in nullable}
        # Code is not data: a callable loss and regularisers must be passed again.
        for key, what in (("loss_callable", "loss"), ("regularizers", "regularizers")):
            saved = config.pop(key, None)
            if saved is not None and what not in overrides:
                raise ConfigError(f"{path} was saved from a trainer with {what}={saved!r} (code, which a checkpoint "
                                  f"does not hold); pass it again: Trainer.load(path, model, {what}=...)")
        config.update(overrides)
        saved_optimizer = config.pop("optimizer", None)
        trainer = cls(model, optimizer=saved_optimizer if optimizer is None else optimizer, **config)
        trainer.restore(path)
        return trainer

    def get_weights(self) -> dict:
        """A copy of every ParamState's value, keyed by path."""
        return jax.tree.map(jnp.array, self._params().to_dict_values())

    def set_weights(self, weights: Mapping) -> None:
        """Put back values from :meth:`get_weights`."""
        params = self._params()
        for path, value in weights.items():
            params[path].value = value

    def predict(self, x: Any, batch_size: int = 32, verbose: int | str = "auto",
                callbacks: Sequence[Any] | None = None, last_only: bool = True) -> np.ndarray:
        """Outputs for array data: ``(N, ...)`` at the last step, or every step
        (``last_only=False``: batch-major ``(N, T, ...)``, time-major if the trainer is).
        A stateful trainer predicts from its streams' current states and moves them on
        (step-by-step prediction: call it with one step at a time); the eligibility
        traces follow training only, so call :meth:`reset_states` before training on
        a stream you predicted on."""
        check_verbose(verbose)
        check_count(batch_size, "batch_size")
        if not hasattr(x, "shape"):
            raise ConfigError(f"predict takes an array x, got {type(x).__name__}")
        data = self._as_data(x, "x")
        check_finite(data.x)
        hooks = CallbackList(callbacks, model=self)
        hooks.on_predict_begin({})
        outputs = []
        for step, batch in enumerate(batches(data.x, None, batch_size=batch_size, shuffle=False)):
            hooks.on_predict_batch_begin(step, {})
            xs, _, _ = self._time_major(batch, False)
            out = self._outputs(xs, carry=self.stateful)
            outputs.append(np.asarray(out[-1] if last_only else (out if self.time_major else jnp.swapaxes(out, 0, 1))))
            hooks.on_predict_batch_end(step, {"outputs": outputs[-1]})
        hooks.on_predict_end({})
        return np.concatenate(outputs, axis=0 if last_only or not self.time_major else 1)

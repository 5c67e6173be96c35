"""``Trainer``: Keras-style ``fit`` / ``evaluate`` / ``predict`` over online learning rules.

This module is the training loop: ``fit``, ``train_on_batch`` and the path of one batch
— the :class:`~.state.TrainState` it carries from batch to batch and the one pure
jitted step per input shape (``step.py``) that maps it to the next; nothing is written
into the model per batch (``state.py`` syncs the two lazily). The rest of the class
lives beside it, one concern per module: ``evaluation.py`` (evaluate, predict,
test_on_batch), ``dashboards.py`` (rasters, summary, report, fidelity, norm warnings),
``persistence.py`` (save, restore, load, weights), ``optimizers.py`` (names and the
learning rate); ``data.py`` (the forms of data, layouts, loss placement and weights),
``logs.py`` (History, Keras' argument checks, the summary table), ``memory.py``,
``losses.py``, ``metrics.py``. Callbacks get Keras' hooks.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import threading
import time
import warnings
from typing import Any, Callable, Iterator, Mapping, Sequence

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..algorithms.esd_rtrl import resolve_decay
from ..algorithms.hybrid import parse_bytes
from ..algorithms.learner import (_check_batch_axis, _states_at, attribute_snapshot, changed_setting, frozen_weights,
                                  warn_readout_memory_under_updates, warn_weight_maps_under_updates,
                                  check_trace_dtype, compile as compile_learner, layer_nodes)
from ..algorithms.online import sized_program, temp_bytes
from ..algorithms.registry import check_algo, sequence_algo, signal_algo
from ..callbacks import BatchLogs, CallbackList, ProgressBar
from ..callbacks.base import RunningMeans
from ..callbacks.progress_bar import epoch_line
from ..compiler import format_path
from ..distributed import Placement, ProcessLocal, batch_axes, is_main_process, resolve_mesh
from ..errors import ConfigError, ShapeError
from .data import (Arrays, Batch, InputLayer, NoBatches, as_batch, batch_major, batch_name, batches, check_count,
                   check_finite, check_mask, check_not_a_pair, check_shuffle, check_step_weights, check_weights,
                   class_table, from_lists, loss_weight, named, placement, read_once, split_validation, targets_key)
from .logs import History, check_verbose, keras_result, validation_schedule
from .memory import check_trace_memory, device_memory
from .state import (ModelSync, Reset, TrainState, _other_positions, check_hidden_states_reset, eager_reset,
                    traced_reset)
from .step import build_train_step, placed_metrics, sequence_targets
from .losses import (LOSSES, check_batch_targets, check_labels, check_target_shape, get_loss, loss_name,
                     needs_targets)
from .metrics import DEFAULT_METRICS, default_metrics, get_metrics
from .dashboards import Dashboards
from .evaluation import Evaluation, callback_list
from .optimizers import LearningRate, check_optimizer, clip_by_global_norm, get_optimizer
from .persistence import Persistence

__all__ = ["History", "Trainer", "check_trace_memory", "device_memory"]

LOSS_PLACEMENTS = ("last", "all", "mask")


def _epoch_of_passes(read: Callable, epoch: int, steps: int, seed: int, per_pass: int) -> Iterator:
    """Epoch ``epoch``'s ``steps`` batches of array data read in passes of ``per_pass``
    batches: as Keras reads arrays with ``steps_per_epoch``, each epoch goes on where
    the last ended, and a pass that ends starts the next (pass ``p`` shuffled with
    ``seed + p``). A function of ``epoch`` alone, so a resumed run reads what an
    uninterrupted one does; with ``steps >= per_pass`` every epoch is one whole pass."""
    if steps >= per_pass:
        yield from read(seed=seed + epoch)
        return
    first = epoch * steps
    for index in range(first, first + steps):
        p, offset = divmod(index, per_pass)
        if index == first or offset == 0:
            current = itertools.islice(read(seed=seed + p), offset, None)
        yield next(current)


def _batches_per_pass(size: int, batch_size: int, drop_remainder: bool) -> int:
    """How many batches one pass of ``size`` array samples gives."""
    return size // batch_size if drop_remainder else -(-size // batch_size)


def _listed_batch_sizes(data: Any, time_major: bool) -> list[int] | None:
    """The sizes of a list (or tuple) of batches, read off each batch's first input
    array; ``None`` for another iterable or a batch of another form."""
    if not isinstance(data, (list, tuple)):
        return None
    sizes = []
    for batch in data:
        first = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
        leaves = jax.tree.leaves(first)
        if not leaves or np.ndim(leaves[0]) < 2:
            return None
        sizes.append(int(np.shape(leaves[0])[1 if time_major else 0]))
    return sizes


def _data_starts_afresh(epoch: int, first_epoch: int, steps: int | None, per_pass: int | None,
                        once: bool) -> bool:
    """Whether epoch ``epoch`` reads the data from its start (where a stateful trainer's
    streams start afresh): always, but where ``steps_per_epoch`` makes it go on where the
    last epoch ended, mid-pass in arrays (``_epoch_of_passes``) or in an iterator read
    once. Resetting there cut every stream at each epoch while its data went on."""
    if steps is None:
        return True
    if per_pass is not None:
        return steps >= per_pass or (epoch * steps) % per_pass == 0
    return not once or epoch == first_epoch


def _check_stateful_passes(stateful: bool, steps: int | None, per_pass: int | None) -> None:
    """With ``stateful=True`` and arrays read ``steps_per_epoch`` batches at a time, a pass
    of the data (where the streams start afresh) must start at an epoch's start."""
    if stateful and steps is not None and per_pass is not None and steps < per_pass and per_pass % steps:
        raise ConfigError(
            f"stateful=True with steps_per_epoch={steps}: a pass of the arrays is {per_pass} batches, so a pass "
            f"would start inside an epoch, where the streams start afresh; give steps_per_epoch dividing {per_pass}, "
            f"or at least {per_pass}")


def _first_batch_ahead(data: Iterator) -> Iterator:
    """``data`` with its first batch read now (an empty iterable raises here, before the
    epoch's first step), then the rest as they come."""
    first = next(data, None)
    if first is None:  # batches() raised NoBatches already, unless the generator was closed
        raise NoBatches("the data iterable yielded no batches")
    return itertools.chain([first], data)


def _class_label(value: Any) -> int | None:
    """An integer class label as an int (for dashboards), anything else as None."""
    value = np.asarray(value)
    return int(value) if value.ndim == 0 and np.issubdtype(value.dtype, np.integer) else None


def input_layer(model: Any) -> InputLayer:
    """The layer of ``model`` that reads ``x`` first: a :class:`~etrace_fit.Sequential`'s
    first layer (through nested ones), else the model itself. It takes token ids if it
    is an ``Embedding``, and not if it is another etrace_fit layer or has an ``in_size``;
    a module of yours without one may read ids its own way: that cannot be told."""
    from ..layers import Embedding, Sequential
    from ..layers.base import describe

    path, layer = type(model).__name__, model
    while isinstance(layer, Sequential) and len(layer):
        path, layer = f"{path}.layers[0]", layer.layers[0]
    name = f"{path} {describe(layer)}" if layer is not model else describe(layer)
    if isinstance(layer, Embedding):
        return InputLayer(name, True)
    in_size = getattr(layer, "in_size", None)
    in_size = tuple(in_size) if isinstance(in_size, (tuple, list)) and in_size else None
    if in_size is None and not type(layer).__module__.startswith("etrace_fit."):
        return InputLayer(name)
    return InputLayer(name, False, in_size)


def _shape_key(tree: Any) -> tuple:
    """Shapes and dtypes of a batch's arrays, as a hashable key."""
    return tuple((tuple(np.shape(leaf)), str(getattr(leaf, "dtype", type(leaf).__name__)))
                 for leaf in jax.tree.leaves(tree))


_READ_BY = {"decay": "is ES-D-RTRL's trace decay (read by algo='esd_rtrl' and 'hybrid', and by a dict of rules)",
            "memory_budget": "is the trace memory algo='hybrid' may spend on D-RTRL"}


def unread_settings(algo: Any, **settings: Any) -> list[str]:
    """The names among ``settings`` (``decay``, ``memory_budget``) that are given but
    that ``algo`` does not read: a decay under BPTT (no traces), D-RTRL or e-prop (its
    filter is the readout's κ), a memory budget under anything but hybrid (the CLI
    refuses its ``--memory-budget`` alike)."""
    unread = []
    named = algo if isinstance(algo, str) else None
    if settings.get("decay") is not None and (sequence_algo(algo) is not None or named == "d_rtrl"
                                              or signal_algo(algo) is not None):
        unread.append("decay")
    if settings.get("memory_budget") is not None and named is not None and named != "hybrid":
        unread.append("memory_budget")
    return unread


class Trainer(Evaluation, Dashboards, Persistence, LearningRate):
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
            or callables ``(output, target) -> (B,)`` (or a scalar, the batch's value).
            By default ``["accuracy"]`` for a classification loss (the cross-entropies)
            and none for another (Keras has none; a regression's "accuracy" means
            nothing); ``None`` or ``[]``: none.
        decay: ES-D-RTRL's smoothing factor α (for ``"esd_rtrl"``, ``"hybrid"`` or a dict of
            rules; given with ``"bptt"`` or ``"d_rtrl"``, which do not read it: ``ConfigError``).
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
        trace_dtype: the eligibility traces' dtype: ``"float32"``, ``"bfloat16"``
            (half the trace memory; gradients stay in the weights' dtype) or
            ``"float64"`` (needs ``jax_enable_x64``). ``None`` (default): the hidden
            states' dtype.
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
        mesh: data parallelism (docs/scaling.md). ``None``: one device; ``"auto"``:
            every device (of every process after
            :func:`etrace_fit.distributed.initialize`); an int: that many devices; or
            a ``jax.sharding.Mesh`` with a ``"batch"`` axis. Each batch, its hidden
            states and its eligibility traces are split over the batch axis (a batch
            size must be a multiple of its size), the weights and optimizer state
            replicated; losses and metrics are sums over the whole batch, so the run
            equals the one-device run up to the order of floating-point sums.

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
        metrics: Sequence[Any] | None = DEFAULT_METRICS,
        decay: float | None = None,
        loss_on: str = "last",
        time_major: bool = False,
        seed: int = 0,
        update_every: int | None = None,
        grad_clip: float | None = None,
        memory_budget: int | str | None = None,
        trace_dtype: Any = None,
        stateful: bool = False,
        regularizers: Sequence[Any] | None = None,
        stop_on_nonfinite: bool = True,
        mesh: Any = None,
    ):
        check_algo(algo)
        if metrics is DEFAULT_METRICS:
            metrics = default_metrics(loss)
        if isinstance(metrics, str):
            raise ConfigError(f"metrics must be a list of names or callables, got the string {metrics!r}; "
                              f"write metrics=[{metrics!r}]")
        if loss_on not in LOSS_PLACEMENTS:
            raise ConfigError(f"unknown loss_on {loss_on!r}; valid: {', '.join(LOSS_PLACEMENTS)}")
        if update_every is not None and (isinstance(update_every, bool)
                                         or not isinstance(update_every, (int, np.integer)) or update_every < 1):
            raise ConfigError(f"update_every must be a positive int or None, got {update_every!r}")
        update_every = None if update_every is None else int(update_every)  # a numpy int too, as epochs take
        if not isinstance(time_major, bool):  # "yes" and "no" read as True
            raise ConfigError(f"time_major must be True or False, got {time_major!r}")
        if update_every is not None and sequence_algo(algo) is not None:
            raise ConfigError("update_every needs an online rule; BPTT sees the whole sequence first")
        if grad_clip is not None and (isinstance(grad_clip, bool) or not isinstance(grad_clip, (int, float, np.number))
                                      or not grad_clip > 0):
            raise ConfigError(f"grad_clip must be a positive number or None, got {grad_clip!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ConfigError(f"seed must be an int >= 0, got {seed!r}")
        if not isinstance(model, brainstate.nn.Module):
            raise ConfigError(f"model must be a brainstate module (an etrace_fit.Sequential, a layer, or your "
                              f"brainstate.nn.Module subclass), got {type(model).__name__}")
        parse_bytes(memory_budget)
        trace_dtype = check_trace_dtype(trace_dtype)
        if trace_dtype is not None and sequence_algo(algo) is not None:
            raise ConfigError(f"trace_dtype={trace_dtype.name!r} sets the eligibility traces' dtype, but algo={algo!r} "
                              f"keeps no traces (it would be ignored); drop it, or use an online rule")
        given = {"decay": decay, "memory_budget": memory_budget}
        for name in unread_settings(algo, **given):
            raise ConfigError(f"{name}={given[name]!r} {_READ_BY[name]}, but algo={algo!r} does not read it (it "
                              f"would be ignored); drop it, or use algo='hybrid'")
        if not isinstance(stateful, bool):
            raise ConfigError(f"stateful must be True or False, got {stateful!r}")
        if not isinstance(stop_on_nonfinite, bool):
            raise ConfigError(f"stop_on_nonfinite must be True or False, got {stop_on_nonfinite!r}")
        self.stop_on_nonfinite = stop_on_nonfinite
        self.mesh = resolve_mesh(mesh)
        # Data parallelism (etrace_fit.distributed): batches, hidden states and traces
        # split over the mesh's batch axis, weights and optimizer state replicated.
        self._placement = None if self.mesh is None else Placement(self.mesh)
        self._model = model
        self._sync = ModelSync(model)  # moves values between the training state and the model, lazily
        self._state: TrainState | None = None  # everything training changes (see training/state.py)
        self._model_touched = True  # the model may hold values the training state lacks: read it first
        self.stateful = stateful
        self.regularizers, self._step_fn = self._resolve_regularizers(regularizers)
        self._stream: int | None = None  # stateful: the running streams' batch size; None: start afresh
        self._streams_end = False  # at an epoch's end after which the streams start afresh (save: nothing lost)
        self._saved_traces: list | None = None  # a restored checkpoint's streams' traces, until their next batch
        if decay is not None:
            resolve_decay(decay, None)  # a ConfigError now, not at the first fit
        if metrics is not None and not isinstance(metrics, (str, list, tuple)):  # (a string: refused with a fix)
            raise ConfigError(f"metrics must be a list of metric names or functions, got {metrics!r:.60}")
        self.config = dict(algo=dict(algo) if isinstance(algo, Mapping) else
                           str(algo) if sequence_algo(algo) is not None or signal_algo(algo) is not None else algo, loss=loss if isinstance(loss, str) else None,
                           loss_callable=None if isinstance(loss, str) or loss is None else
                           getattr(loss, "__name__", type(loss).__name__),
                           optimizer=optimizer if isinstance(optimizer, str) else None,
                           metrics=[m for m in (metrics or ()) if isinstance(m, str)],
                           metric_callables=[getattr(m, "__name__", type(m).__name__) for m in (metrics or ())
                                             if not isinstance(m, str)] or None, decay=decay, loss_on=loss_on,
                           time_major=time_major, seed=seed, update_every=update_every, grad_clip=grad_clip,
                           memory_budget=memory_budget, trace_dtype=None if trace_dtype is None else trace_dtype.name,
                           stateful=stateful, stop_on_nonfinite=stop_on_nonfinite,
                           regularizers=[repr(r) for r in self.regularizers] or None)
        self.epoch = -1  # the last finished epoch
        self.iterations = 0  # training batches run, across fits (Keras' optimizer.iterations)
        self._callbacks = CallbackList()
        # A callback (BackupAndRestore) may set this in on_train_begin: fit starts there.
        self.resume_epoch: int | None = None
        self.algo, self.decay, self.loss_on = algo, decay, loss_on
        self.time_major, self.seed, self.update_every = time_major, seed, update_every
        self._epochs_run = 0  # epochs trained by every fit so far: the next fit's shuffles go on from them
        self._shuffle_offset = 0  # the last fit's: epoch e shuffles with seed + offset + e (saved, for a resume)
        self.memory_budget, self.trace_dtype = memory_budget, trace_dtype
        self.loss_fn = get_loss(loss)
        self.metric_fns = get_metrics(metrics)
        given, optimizer = optimizer, get_optimizer(optimizer)
        self.optimizer = optimizer if grad_clip is None else optax.chain(clip_by_global_norm(grad_clip), optimizer)
        if not isinstance(given, str) and given is not None:
            values = {format_path(p): s.value for p, s in model.states(brainstate.ParamState).items()}
            check_optimizer(self.optimizer, values if update_every is None else jax.tree.leaves(values), given)
        self.learner = None  # compiled on the first training batch (etrace_fit.compile)
        self._pending_learning_rate: float | None = None
        self.stop_training = False
        self._resets_checked = False  # _ensure_states checked that reset_state resets every hidden state
        self._sample_output: tuple | None = None  # one sample's output at one step, once a batch was checked
        self.fit_log_keys: list[str] | None = None  # during fit: the keys every epoch logs (callbacks check theirs)
        self.validates_epoch = None  # during fit: whether an epoch (0-based) validates
        self.history = History(model=self)
        self._step_loss = self._make_step_loss()
        self._forward = None
        self._checked: dict[tuple, tuple] = {}  # _check_first's passed checks -> (loss, the model's classes)
        self._steps: dict[int, tuple[Any, Any]] = {}  # id(program) -> (program, jitted step)
        self._resets: dict[int, tuple[Any, Reset]] = {}  # id(program) -> (program, its traced reset)
        self._local_batches = False  # fit(ProcessLocal(...)): each process feeds its share of every batch
        self._axes: dict[int, tuple[Any, tuple]] = {}  # id(program) -> (program, batch axes of states, traces)
        self._batch_programs: dict[tuple, tuple] = {}  # batch shapes -> _batch_program's entry (one fit)
        # batch shapes -> (the program _under_line sized, the (compiled, step) it chose), across fits
        self._sized: dict[tuple, tuple[Any, tuple]] = {}
        self.skipped_batches = 0  # batches whose loss was not finite (their update was not applied)
        self._eval_step = None
        self._eval_compiling: threading.Thread | None = None  # fit's compilation of the validation ahead
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
        self.last_train_batch: int | None = None  # the batch of the last train_on_batch, or the last fit's largest
        self._fitting = False
        self._num_classes: int | None = None  # the model's outputs, known after the first batch
        self._norms_warned = False
        self._recorder = None
        self._setting_nodes = layer_nodes(model)  # the layers, walked once: their settings are read per batch
        self._input_layer = input_layer(model)  # whether integer x (batch, time) are token ids
        self._settings = attribute_snapshot(model, self._setting_nodes)
        self._rates_at_start = None  # see _initial_rates

    # ------------------------------------------------------- the training state
    @property
    def model(self) -> Any:
        """The ``brainstate`` module being trained, up to date: during ``fit`` the
        weights live in the trainer's training state and reach the module lazily — at
        every epoch's end, when ``fit`` returns, and whenever it is read through this
        attribute (or ``get_weights``, ``save``, ``evaluate``, ...). Values written into
        it (``set_weights``, a callback) are picked up before the next batch."""
        self._push()
        self._model_touched = True
        return self._model

    @property
    def opt_state(self) -> Any:
        """The optimizer's state (None before the first batch)."""
        return None if self._state is None else self._state.opt_state

    @opt_state.setter
    def opt_state(self, value: Any) -> None:
        self._state = (self._state or TrainState(None, None, None, None))._replace(opt_state=value)

    def _push(self) -> None:
        """Bring the model up to date with the training state (a no-op when it is)."""
        self._sync.push(self._state)

    def _pull(self, module: Any) -> TrainState:
        """The training state with what the model holds now (see :class:`ModelSync`)."""
        self._state = self._sync.pull(self._state, module)
        self._model_touched = False
        return self._state

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
        model = self._model

        def step_fn(*inputs):
            return model(*inputs), {path: layer.spikes(gradient=True) for path, layer in taps.items()}

        return tuple(resolved), step_fn

    def _make_step_loss(self):
        loss_fn, regularizers = self.loss_fn, self.regularizers

        def step_loss(output, target):
            if not regularizers:
                y, weight = target
                return jnp.sum(weight * loss_fn(output, y)) / weight.shape[0]
            (y, weight, reg_weight, rate_inputs), (output, spikes) = target, output
            task = jnp.sum(weight * loss_fn(output, y)) / weight.shape[0]
            penalty = 0.0
            for (reg, paths), rates in zip(regularizers, rate_inputs):
                chosen = {p: spikes[p] for p in paths}
                if rates is None:
                    penalty = penalty + jnp.mean(reg(chosen))
                else:  # no estimate before the first batch: no penalty
                    penalty = penalty + rates["known"] * jnp.mean(reg(chosen, rates["rates"]))
            return task + reg_weight * penalty

        return step_loss

    def _initial_rates(self) -> list | None:
        """:attr:`TrainState.rates` before any batch: zero sums per regulariser on
        running rates (``None`` for the others), shaped like its layers' spikes."""
        if not self.regularizers:
            return None
        if self._rates_at_start is None:
            layers = self.spiking_layers()
            zeros = {}
            for path in dict.fromkeys(p for _, paths in self.regularizers for p in paths):
                spikes = layers[path].spikes()
                zeros[path] = jnp.zeros(jnp.shape(spikes)[1:], jnp.asarray(spikes).dtype)
            self._rates_at_start = [({p: zeros[p] for p in paths}, jnp.zeros((), jnp.int32)) if reg.uses_rates
                                    else None for reg, paths in self.regularizers]
        return self._rates_at_start

    def _params(self):
        """The model's ParamStates, up to date (written from the training state first)."""
        self._push()
        return self._model.states(brainstate.ParamState)

    def _time_major(self, batch: Batch, time_major: bool | None = None) -> tuple[np.ndarray, Any, np.ndarray]:
        """:func:`~etrace_fit.training.data.placement` with this trainer's ``loss_on``
        and layout."""
        time_major = self.time_major if time_major is None else time_major
        self._input_layer.check(batch.x, "x", time_major)
        return placement(batch, self.loss_on, time_major, per_sequence=self._targets_per_sequence(batch, time_major),
                         wdtype=self._loss_weight_dtype())

    def _loss_weight_dtype(self) -> Any:
        """float64 for a model with float64 weights (whatever the data's dtype: bool or
        int spikes gave float32 loss weights, 1/T rounded, 1e-8 off float64 BPTT), else
        None (the data's)."""
        if getattr(self, "_wide_weights", None) is None:
            leaves = jax.tree.leaves(self._model.states(brainstate.ParamState).to_dict_values())
            self._wide_weights = any(jnp.result_type(leaf) == jnp.float64 for leaf in leaves)
        return np.float64 if self._wide_weights else None

    def _targets_per_sequence(self, batch: Batch, time_major: bool) -> bool:
        """Whether a batch-major ``y (B, T)`` is one target of ``T`` values per sequence,
        not ``T`` per-step targets: when the loss takes targets of the output's shape
        (``categorical_crossentropy``'s one-hot rows, ``mse`` / ``mae`` on several
        outputs) and the model has ``T`` outputs. Read per step, such a one-hot ``y`` was
        refused by a message asking for the shape it had (a callable loss got it per
        step, silently)."""
        from .losses import categorical_cross_entropy, mae, mse

        y = batch.y
        if time_major or y is None or np.ndim(y) != 2 or not any(self.loss_fn is f for f in
                                                                   (categorical_cross_entropy, mse, mae)):
            return False
        size, steps = np.shape(batch.x)[:2]
        if np.shape(y) != (size, steps) or steps < 2:
            return False
        output = self._sample_output
        if output is None:  # the first batch: the model's output shape, traced without running
            output = tuple(self._output_shape(np.swapaxes(np.asarray(batch.x), 0, 1)[:1]).shape[2:])
        return output == (steps,)

    def _ensure_states(self, batch_size: int) -> None:
        """Create the hidden states of a model no batch has run through yet (and bring
        the model up to date: every caller is about to run it)."""
        self._push()
        if not self._model.states(brainstate.HiddenState):
            key = brainstate.random.get_key()
            brainstate.nn.init_all_states(self._model, batch_size=batch_size)
            # Creating them draws nothing from the global key (every batch's reset draws its own
            # random initial states): a run resumed from a backup, whose fresh model creates them
            # after the key is restored, draws on as the uninterrupted run does.
            brainstate.random.set_key(key)
        if not self._resets_checked:  # once: a hidden state no reset_state writes would leak across batches
            check_hidden_states_reset(self._model, batch_size)
            self._resets_checked = True

    # ------------------------------------------------------------------ streams
    def reset_states(self) -> None:
        """Start every stream afresh (Keras' ``reset_states``): the next batch begins
        at the initial hidden states with zero eligibility traces."""
        self._stream = None

    def _continue_stream(self, batch_size: int) -> bool:
        """Whether a stateful trainer's next batch continues running streams (False: it
        starts them, from the initial states); a batch of another size is an error."""
        if self._stream is None:
            self._stream = batch_size
            return False
        if self._stream != batch_size:
            raise ShapeError(f"stateful=True continues the {self._stream} streams of the last batch, but this batch "
                             f"has {batch_size} sequences; give every batch the same size (drop_remainder=True) or "
                             f"call reset_states() first")
        return True

    def _check_first(self, xs, ys) -> None:
        """Errors before any training, on the first batch: the model's input size (the
        layer says), the loss's output shape (one value per sample) and the labels' range.
        The first two are traced once per batch shape, loss and compiled model
        (``self._checked``; a later ``fit`` with them only checks the labels): the traces
        took ~5 ms of every ``fit``'s start."""
        key = (id(self.loss_fn), _shape_key(xs), _shape_key(ys))  # a loss object need not be hashable
        passed = self._checked.get(key)
        if passed is None or passed[0] is not self.loss_fn:
            out = self._output_shape(xs[:1])
            name = loss_name(self.loss_fn)
            if hasattr(out, "shape") and len(out.shape) >= 2:
                check_target_shape(self.loss_fn, tuple(out.shape[2:]), tuple(np.shape(ys)[2:]), where="y")
            try:
                value = jax.eval_shape(jax.vmap(self.loss_fn), out, ys[:1])
            except (TypeError, ValueError) as error:  # a loss of yours on targets it does not take
                raise ConfigError(f"loss {name!r} fails on the model's output {tuple(out.shape[1:])} and the targets "
                                  f"{tuple(np.shape(ys)[1:])} of one step (batch first): {error}") from None
            if tuple(value.shape) != tuple(out.shape[:2]):
                raise ConfigError(f"loss {name!r} returned shape {tuple(value.shape[1:])} for a batch of "
                                  f"{out.shape[1]} samples; a loss returns one value per sample, shape "
                                  f"({out.shape[1]},) (sum or average any other axis inside the loss)")
            self._check_metrics(out, ys)
            self._checked[key] = (self.loss_fn, int(out.shape[-1]) if out.ndim >= 2 else None)
            self._sample_output = tuple(out.shape[2:])  # one sample, one step: for validation's y
        else:
            self._ensure_states(np.shape(xs)[1])  # as the trace would have
        self._num_classes = self._checked[key][1]
        self._check_targets(ys, "y")

    def _check_metrics(self, out, ys) -> None:
        """Each metric on the model's output and the targets of one step, traced without
        running: an error naming the metric (not JAX's broadcasting error from inside
        the training step), and one value per sample or a scalar."""
        if not self.metric_fns:
            return
        if not hasattr(self, "_metrics_checked"):
            self._metrics_checked = set()
        self._metrics_checked.add((targets_key(ys), tuple(map(id, self.metric_fns.values()))))
        for name, fn in self.metric_fns.items():
            try:
                value = jax.eval_shape(lambda output, target: fn(output[0], target[0]), out, ys[:1])
            except (TypeError, ValueError) as error:
                raise ConfigError(f"metric {name!r} fails on the model's output {tuple(out.shape[1:])} and the "
                                  f"targets {tuple(np.shape(ys)[1:])} of one step (batch first): {error}") from None
            if not hasattr(value, "shape") or (value.ndim and value.shape[0] != out.shape[1]):
                shape = getattr(value, "shape", type(value).__name__)
                raise ConfigError(f"metric {name!r} returned {shape} for a batch of {out.shape[1]} samples; a metric "
                                  f"returns one value per sample, shape ({out.shape[1]},), or a scalar for the batch")

    def _check_batch(self, xs, ys, y, weights_by_class) -> None:
        """:meth:`_check_first` and the targets and class weights of a batch: before
        ``fit``'s first update, and before every ``train_on_batch`` / ``test_on_batch``
        (a stream's later chunks were taken unchecked: a label of -1 trained)."""
        check_batch_targets(self.loss_fn, y)
        self._check_first(xs, ys)
        if weights_by_class is not None and self._num_classes and len(weights_by_class) > self._num_classes:
            raise ConfigError(f"class_weight names class {len(weights_by_class) - 1}, but the model has "
                              f"{self._num_classes} outputs (classes 0..{self._num_classes - 1})")

    def _check_listed_batches(self, data: Sequence, name: str) -> None:
        """Every batch of a list (or tuple) of batches named ``name`` (``validation_data``),
        before training, checked as a training batch is (its form, NaN / inf, its layout,
        the model's input size, the targets' shape and labels), each error naming the
        batch: found at the first validation, they came after an epoch had trained."""
        for position, item in enumerate(data):
            label = batch_name(position, name)
            with named(label):
                batch = as_batch(item, position, name)
                check_finite(np.asarray(batch.x), "x")
                xs, ys, _ = self._time_major(batch)
                self._check_batch(xs, ys, batch.y, None)

    def _check_targets(self, y, where: str) -> None:
        """NaN / inf in float targets, and integer labels outside the model's classes."""
        if y is None:
            return
        y = np.asarray(y)
        check_finite(y, where)
        if getattr(self.loss_fn, "integer_labels", False) and self._num_classes is not None:
            check_labels(y, self._num_classes, where=where)
        if self.loss_fn is LOSSES["categorical_crossentropy"] and y.size and np.min(y) < 0:  # the loss fell forever
            raise ShapeError(f"{where}: categorical_crossentropy takes probabilities (one-hot or soft labels, each "
                             f">= 0), got values down to {np.min(y):g}")

    def _metrics(self, outputs, ys, weight) -> dict[str, jax.Array]:
        return placed_metrics(self.metric_fns, outputs, ys, weight)

    # ------------------------------------------------------------------ public
    def fit(
        self,
        x: Any,
        y: Any = None,
        batch_size: int | None = 32,
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
        validation_steps: int | None = None,
        validation_batch_size: int | None = None,
        validation_freq: int | Sequence[int] = 1,
        drop_remainder: bool = False,
        mask: Any = None,
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
        - ``mask`` (not in Keras; array data): ``(N, T)`` bool, the steps each sequence
          really has (``datasets.pad_sequences`` and the readers' ``variable_length``
          give it) — with ``loss_on="mask"`` the loss is averaged over them and padding
          gives no gradient.
        - ``initial_epoch``: the epoch to start at (to continue a run);
          ``validation_freq``: validate every ``n`` epochs, or at the listed (1-based)
          epochs.
        - ``validation_steps``: validate on that many batches of ``validation_data``
          (an endless iterator needs it; it is read on where the last validation
          stopped); ``validation_batch_size``: the batch size of validation arrays
          (default ``batch_size``).

        Logs per epoch: ``loss``, each metric, and with validation data ``val_loss`` and
        ``val_<metric>``. Bad data (empty, x and y of different lengths, NaN / inf,
        labels out of range, a wrong feature size, no targets or targets shaped for
        another loss, a NaN or negative ``sample_weight``, a mask that is not True /
        False) raises before any update (docs/reliability.md).
        """
        verbose = check_verbose(verbose)
        check_shuffle(shuffle)
        if not isinstance(drop_remainder, bool):  # "no" read as True dropped the last batch
            raise ConfigError(f"drop_remainder must be True or False, got {drop_remainder!r}")
        if self.stateful and shuffle is not False:
            raise ConfigError("stateful=True reads batch k + 1 as the continuation of batch k: pass shuffle=False")
        if not isinstance(initial_epoch, (int, np.integer)) or isinstance(initial_epoch, bool) or initial_epoch < 0:
            raise ConfigError(f"initial_epoch must be an int >= 0, got {initial_epoch!r}")
        if not isinstance(epochs, (int, np.integer)) or isinstance(epochs, bool) or epochs < initial_epoch:
            raise ConfigError(f"epochs must be an int >= initial_epoch ({initial_epoch}), got {epochs!r}")
        epochs, initial_epoch = int(epochs), int(initial_epoch)  # numpy ints too, as Keras takes them
        validates = validation_schedule(validation_freq)
        batch_size = 32 if batch_size is None else batch_size  # Keras' default
        check_count(batch_size, "batch_size")
        if steps_per_epoch is not None:
            check_count(steps_per_epoch, "steps_per_epoch")
        if validation_steps is not None:
            check_count(validation_steps, "validation_steps")
        validation_batch_size = batch_size if validation_batch_size is None else validation_batch_size
        check_count(validation_batch_size, "validation_batch_size")
        if validation_split and validation_data is not None:
            raise ConfigError("give validation_data or validation_split, not both")
        self._local_batches = isinstance(x, ProcessLocal)  # each process feeds its share of every batch
        if self._local_batches:
            if self._placement is None:
                raise ConfigError("ProcessLocal batches are shares of a global batch across processes: give the "
                                  "Trainer a mesh (mesh='auto' after etrace_fit.distributed.initialize)")
            x = x.batches
        x, y, sample_weight, mask = from_lists(x, y, sample_weight, mask)  # Keras' lists of numbers, as arrays
        is_array = hasattr(x, "shape")
        if y is None:  # with y, a tuple of arrays is Keras' several inputs, named as such in batches()
            check_not_a_pair(x, "fit")
        if (sample_weight is not None or class_weight is not None or mask is not None) and not is_array:
            raise ConfigError("sample_weight, class_weight and mask apply to array data (x, y); an iterable "
                              "gives (x, y, mask) batches")
        if mask is not None and self.loss_on != "mask":
            raise ConfigError(f"mask was given but loss_on={self.loss_on!r} ignores it; use "
                              f"Trainer(loss_on='mask') to average the loss over the marked steps")
        if is_array:
            self._input_layer.check(x, "x", self.time_major)
        if is_array and self.time_major:  # batches are cut along the batch axis: read it batch-major
            x, y, sample_weight = batch_major(x, y, sample_weight)
            mask = None if mask is None else np.swapaxes(np.asarray(mask), 0, 1)
        if validation_split:
            if not is_array:
                raise ConfigError("validation_split needs array data; pass validation_data for iterables")
            if sample_weight is not None:  # checked whole: Keras' (N, 1) column is one weight per sequence
                sample_weight = check_weights(sample_weight, x)
                check_step_weights(sample_weight, self.loss_on)
            (x, y), held_out = split_validation(x, y, validation_split)
            # as Keras, the held-out samples keep their weights: val_loss is weighted as loss is
            validation = Arrays(*held_out, None if mask is None else np.asarray(mask)[len(x):],
                                sample_weight=None if sample_weight is None else sample_weight[len(x):])
            if sample_weight is not None:
                sample_weight = sample_weight[: len(x)]
            if mask is not None:
                mask = np.asarray(mask)[: len(x)]
        else:
            validation = self._as_data(validation_data, "validation_data")
        if not is_array and read_once(x) and steps_per_epoch is None and epochs - initial_epoch > 1:
            raise ConfigError(f"x is an iterator (a generator, say): it is read once, so its batches last one epoch, "
                              f"but epochs={epochs}; pass something that starts over when iterated again (a list "
                              f"of batches, a class with __iter__), or give steps_per_epoch to read an endless "
                              f"iterator in epochs")
        if is_array:
            check_finite(x)
            if sample_weight is not None:
                sample_weight = check_weights(sample_weight, x)
                check_step_weights(sample_weight, self.loss_on)
            if mask is not None:
                check_mask(mask, x)
            if y is not None:
                check_finite(y, "y")
            elif needs_targets(self.loss_fn):
                raise ConfigError(f"y: loss {loss_name(self.loss_fn)!r} needs targets, got y=None; call fit(x, y)")
        weights_by_class = None if class_weight is None else class_table(class_weight, y)
        self.sample_input = self.sample_inputs = self.sample_label = None
        self.batch_size = batch_size
        validations = sum(map(validates, range(initial_epoch, epochs)))
        if (validation is not None and not isinstance(validation, Arrays) and read_once(validation)
                and validations > 1 and validation_steps is None):
            raise ConfigError(f"validation_data is an iterator (a generator, say): it is read once, but this fit "
                              f"validates {validations} times; pass a list of batches or arrays (x_val, y_val), "
                              f"or give validation_steps to read an endless iterator in pieces")
        validation_name = "validation_split" if validation_split else "validation_data"  # in errors
        if isinstance(validation, Arrays):
            check_finite(validation.x, f"{validation_name} x")
            if validation.mask is not None:
                check_mask(validation.mask, validation.x, f"{validation_name} mask")
            if validation.y is not None:
                check_finite(validation.y, f"{validation_name} y")
            if len(validation.x):
                self.sample_inputs = np.asarray(validation.x[:8])
                self.sample_input = self.sample_inputs[0]
                self.sample_label = None if validation.y is None else _class_label(validation.y[0])
        if self.sample_input is None and is_array and len(x):  # no validation: the dashboards read training data
            self.sample_inputs = np.asarray(x[:8])
            self.sample_input = self.sample_inputs[0]
            self.sample_label = None if y is None else _class_label(np.asarray(y)[0])
        self.stop_training = False
        self._follow_settings()
        if self.learner is not None and not self.learner.is_current():
            self._drop_programs()  # states were recreated, or the step changed otherwise: compile again
        self._batch_programs.clear()  # re-checked against the model's states at every fit
        self._sync.refresh()
        self._model_touched = True  # weights set since the last call are read before the first batch
        callbacks = callback_list(callbacks, "fit")
        steps = None
        if is_array:
            size = np.shape(x)[0]
            if self.stateful and size % batch_size and not drop_remainder and size > batch_size:
                divisors = [d for d in range(1, size + 1) if size % d == 0 and d <= batch_size]
                raise ConfigError(
                    f"stateful=True continues batch k's {batch_size} streams in batch k + 1, but {size} sequences"
                    f"{' (after validation_split)' if validation_split else ''} in batches of {batch_size} end with "
                    f"a batch of {size % batch_size}; give a batch_size that divides {size} (e.g. {divisors[-1]}), "
                    f"or drop_remainder=True")
            steps = _batches_per_pass(size, batch_size, drop_remainder)
            if steps_per_epoch is not None and steps_per_epoch > steps:
                warnings.warn(f"steps_per_epoch={steps_per_epoch}, but {size} sequences give {steps} batches of "
                              f"{batch_size}: each epoch runs {steps}", UserWarning, stacklevel=2)
            steps = steps if steps_per_epoch is None else min(steps, steps_per_epoch)
        elif steps_per_epoch is not None:
            steps = steps_per_epoch
        if self._placement is not None:
            self._check_split(batch_size, np.shape(x)[0] if is_array else None, drop_remainder,
                              None if is_array else _listed_batch_sizes(x, self.time_major))
            if not is_main_process():  # one process prints
                verbose = 0
        # as Keras: no progress logger of fit's own when the callbacks hold one (verbose=2's lines came twice)
        shown = any(isinstance(c, ProgressBar) for c in callbacks)
        if verbose == 1 and not shown:
            callbacks.append(ProgressBar(total=steps))
        self.epochs = epochs
        fit_params = {"verbose": verbose, "epochs": epochs, "steps": steps}
        self.history = History(fit_params, model=self)
        if validation is not None and not any(validates(epoch) for epoch in range(initial_epoch, epochs)):
            warnings.warn(f"validation_freq={validation_freq!r}: no epoch of this fit ({initial_epoch + 1}.."
                          f"{epochs}) validates, so the validation data is never used", UserWarning, stacklevel=2)
            validation = None  # and a callback watching a val_ key is told before training
        self.fit_log_keys = self._log_keys(validation is not None)
        self.validates_epoch = (lambda epoch: False) if validation is None else validates
        hooks = CallbackList(callbacks, model=self, params=fit_params,
                             record=lambda epoch, logs: self.history.add(logs))  # restore swaps the History
        self._callbacks = hooks
        self.resume_epoch = None
        self._warn_spiking_readout()
        self._last_epoch_logs = {}
        self.last_train_batch, self._fitting = None, True
        try:
            self._fit_epochs(x, y, batch_size, epochs, 0 if shown else verbose, hooks, validation, validates, shuffle,
                             initial_epoch, steps_per_epoch, drop_remainder, sample_weight, weights_by_class, is_array,
                             mask, (validation_steps, validation_batch_size, validation_name))
        finally:
            self._fitting = False
            self._push()  # the model holds every finished batch's update, also after an error
        # Keras: the last epoch's logs (no val_* when it did not validate), not each key's last value
        hooks.on_train_end(dict(self._last_epoch_logs))
        return self.history

    def _log_keys(self, validated: bool) -> list[str]:
        """The keys every epoch of this fit logs (``val_*`` on the epochs that validate),
        before the callbacks add theirs."""
        keys = ["loss", *self.metric_fns] + (["learning_rate"] if self.learning_rate_settable else [])
        return keys + ([f"val_{key}" for key in ["loss", *self.metric_fns]] if validated else [])

    def _check_split(self, batch_size: int, size: int | None, drop_remainder: bool,
                     listed: list[int] | None = None) -> None:
        """:class:`ConfigError` before training when a batch would not split evenly over
        the mesh's devices: of array data (``size`` samples), or of a list of batches
        (``listed``, their sizes; an iterator's batches are checked as they come).
        ``batch_size`` matters only for arrays it splits (a list of batches of 6 on 3
        devices was refused for the unused default of 32)."""
        if listed is not None:  # ProcessLocal: each process lists its share, the global batch is P of them
            processes = jax.process_count() if self._local_batches else 1
            for position, batch in enumerate(listed):
                if batch * processes % self._placement.size:
                    share = "" if processes == 1 else f" in each of {processes} processes, {batch * processes} in all"
                    self._placement.check_batch(batch * processes,
                                                f"batch {position} of the list ({batch} sequences{share})")
            return
        if size is None:
            return
        if size >= batch_size:
            self._placement.check_batch(batch_size)
        last = 0 if drop_remainder else size % batch_size
        devices = self._placement.size
        if last % devices:  # then size % devices too: no batch size (all multiples of devices) splits them all
            fewer = max(d for d in range(1, devices) if size % d == 0)
            drop = (f"pass drop_remainder=True (each epoch leaves the last {last} out)" if size >= batch_size else
                    f"use a batch_size of {size // devices * devices} with drop_remainder=True (each epoch leaves "
                    f"{size % devices} out)" if size >= devices else "use more samples than devices")
            raise ConfigError(f"the last batch ({size} samples in batches of {batch_size} leave {last}) does not "
                              f"split evenly over the {devices} devices of the mesh's batch axis, and no batch size "
                              f"would: {size} is not a multiple of {devices}. {drop[0].upper() + drop[1:]}, or train "
                              f"on {fewer} device{'s' * (fewer > 1)} (mesh={fewer}), which {size} samples split over")

    def _fit_epochs(self, x, y, batch_size, epochs, verbose, hooks, validation, validates, shuffle, initial_epoch,
                    steps_per_epoch, drop_remainder, sample_weight, weights_by_class, is_array, mask,
                    validation_reading) -> None:
        validation_steps, validation_batch_size, validation_name = validation_reading
        if validation is not None and not isinstance(validation, Arrays) and read_once(validation):
            validation = iter(validation)  # read on across validations (validation_steps)
        per_pass = _batches_per_pass(len(x), batch_size, drop_remainder) if is_array else None
        _check_stateful_passes(self.stateful, steps_per_epoch, per_pass)
        # Shuffles go on from the epochs this trainer ran when a fit numbers its epochs from 0
        # (Keras shuffles anew at every fit: three fit(epochs=1) calls read one order three
        # times); a fit from initial_epoch shuffles as its epochs' numbers say.
        self._shuffle_offset = self._epochs_run if initial_epoch == 0 else 0
        hooks.on_train_begin({})  # a BackupAndRestore restores the interrupted fit's offset
        if self.resume_epoch is not None:  # a BackupAndRestore callback restored a run
            initial_epoch = max(initial_epoch, self.resume_epoch)
            if not is_array and read_once(x) and initial_epoch < epochs:  # no backup can hold where it stood
                warnings.warn(f"BackupAndRestore resumed this fit at epoch {initial_epoch + 1}, but x is an iterator "
                              f"(a generator, say), read from its start, not where epoch {initial_epoch} ended: the "
                              f"resumed epochs train on other batches than an uninterrupted run (for an exact resume "
                              f"give arrays, a list of batches or a Sequence)", RuntimeWarning, stacklevel=3)
        seed = self.seed + self._shuffle_offset
        for epoch in range(initial_epoch, epochs):
            start = time.perf_counter()
            if _data_starts_afresh(epoch, initial_epoch, steps_per_epoch, per_pass, read_once(x)):
                self.reset_states()  # stateful: an epoch that reads the data from its start, the streams too
            hooks.on_epoch_begin(epoch, {})
            records = []  # per batch: (size, loss, metrics, finite) as device values until the epoch ends
            running = RunningMeans(records)  # the batch logs' running means, as Keras gives them
            read = functools.partial(batches, x, y, batch_size=batch_size, shuffle=shuffle,
                                     drop_remainder=drop_remainder, sample_weight=sample_weight, mask=mask)
            if steps_per_epoch is not None and is_array:  # Keras: the next epoch goes on where this one ended
                data = _epoch_of_passes(read, epoch, steps_per_epoch, seed, per_pass)
            else:
                data = read(seed=seed + epoch)
                if steps_per_epoch is not None:  # no batch more is read: an iterator goes on where the epoch ended
                    data = itertools.islice(data, steps_per_epoch)
            try:
                data = _first_batch_ahead(data)
            except NoBatches:
                if epoch == initial_epoch or not read_once(x):
                    raise
                ran = epoch - initial_epoch
                warnings.warn(f"x ran out of data after {ran} epoch{'s' * (ran != 1)} of {steps_per_epoch} steps: "
                              f"training stops (an iterator must give steps_per_epoch x epochs batches)",
                              RuntimeWarning, stacklevel=3)
                break
            for step, batch in enumerate(data):
                time_major = self.time_major and not is_array
                xs, ys, weight = self._time_major(batch, time_major)
                weighted = loss_weight(batch, ys, weight, weights_by_class, time_major)
                if not is_array:
                    check_finite(np.asarray(xs).swapaxes(0, 1), "x")
                if epoch == initial_epoch and step == 0:
                    self._check_batch(xs, ys, batch.y, weights_by_class)
                    if is_array:  # every label, not only the first batch's, before the first update
                        self._check_targets(y, "y")
                    if isinstance(validation, Arrays):
                        if self._sample_output is not None and validation.y is not None:
                            y_val, steps = np.asarray(validation.y), np.shape(validation.x)[1]
                            per_step = y_val.ndim >= 2 and y_val.shape[1] == steps and not self._targets_per_sequence(
                                Batch(np.asarray(validation.x[:1]), y_val[:1]), False)  # as the batches read it
                            check_target_shape(self.loss_fn, self._sample_output,
                                               tuple(y_val.shape[2:] if per_step else y_val.shape[1:]),
                                               where=f"{validation_name} y")
                        self._check_targets(validation.y, f"{validation_name} y")
                        if len(validation.x) and any(map(validates, range(epoch, epochs))):
                            self._compile_evaluation_ahead(validation, validation_batch_size)
                    elif isinstance(validation, (list, tuple)):  # batches in memory: checked as training's are
                        self._check_listed_batches(validation, validation_name)
                elif not is_array:  # an iterable's batches are checked as they come, before their step
                    self._check_targets(ys, f"y of batch {step}")
                    if self._placement is not None and not self._local_batches:
                        self._placement.check_batch(xs.shape[1], f"batch {step} of epoch {epoch + 1} of x "
                                                                  f"({xs.shape[1]} sequences)")
                    if self.sample_input is None:
                        self.sample_inputs = np.swapaxes(np.asarray(xs[:, :8]), 0, 1)
                        self.sample_input = self.sample_inputs[0]
                        self.sample_label = _class_label(ys[-1, 0])
                hooks.on_train_batch_begin(step, {"size": int(xs.shape[1]), "time_steps": int(xs.shape[0])})
                loss, logs, finite = self._train_batch(xs, ys, weighted, weight)
                records.append((xs.shape[1], loss, logs, finite))
                hooks.on_train_batch_end(step, BatchLogs({"loss": loss, **logs}, running, len(records) - 1))
                if self.stop_training:
                    break
            if not is_array and callable(getattr(x, "on_epoch_end", None)):
                x.on_epoch_end()  # a Keras Sequence / PyDataset's own hook, as Keras calls it
            ran_out = (steps_per_epoch is not None and not is_array and read_once(x) and not self.stop_training
                       and len(records) < steps_per_epoch)
            if ran_out:  # Keras: "your input ran out of data; interrupting training"
                warnings.warn(f"x ran out of data in epoch {epoch + 1}, after {len(records)} of its {steps_per_epoch} "
                              f"steps: training stops after this epoch (an iterator must give steps_per_epoch x "
                              f"epochs batches)", RuntimeWarning, stacklevel=3)
            epoch_logs = self._epoch_logs(epoch, jax.device_get(records))
            if self.learning_rate is not None:
                epoch_logs["learning_rate"] = self.learning_rate
            if validation is not None and validates(epoch):
                try:
                    validated = self._evaluate(validation, validation_batch_size, hooks, validation_name,
                                               steps=validation_steps)
                except NoBatches:  # an iterator read on across validations ran out: the epoch is kept
                    if isinstance(validation, Arrays) or not read_once(validation):
                        raise
                    warnings.warn(f"validation_data ran out of batches: epoch {epoch + 1} is not validated (an "
                                  f"iterator read on across validations must give validation_steps x the validated "
                                  f"epochs batches)", RuntimeWarning, stacklevel=3)
                    validated = {}
                epoch_logs.update({f"val_{k}": v for k, v in validated.items()})
            self.history.append(epoch, epoch_logs)  # the keys callbacks add join it after them
            self.epoch = epoch
            self._push()  # the model is current at every epoch's end
            self._check_norms(epoch)
            self._epochs_run += 1
            # a stateful trainer's streams end here when the next epoch reads the data from its start:
            # a checkpoint written now (a backup) misses nothing of them
            self._streams_end = _data_starts_afresh(epoch + 1, initial_epoch, steps_per_epoch, per_pass, read_once(x))
            try:
                hooks.on_epoch_end(epoch, epoch_logs)
            finally:
                self._streams_end = False
            self._last_epoch_logs = epoch_logs
            if verbose == 2:
                print(epoch_line(epoch, epochs, epoch_logs, time.perf_counter() - start), flush=True)
            if self.stop_training or ran_out:
                break


    def _compiled(self, xs, ys, weight, max_chunk=None, check_memory=True):
        """The program for this batch's shape, from the learner compiled on the first
        batch: its plan is kept for every later shape (a last, smaller batch must not
        change a weight's rule under the report). Traced with the model's states at
        this batch size; the model is left as it was. ``max_chunk``: see
        ``Learner.compiled``. ``check_memory``: this batch's traces are checked against
        the device's memory (every new batch shape: a later ``fit`` with a larger batch,
        or one after ``summary(x)``, went unchecked)."""
        with _states_at(self._model, xs.shape[1]):
            if self.learner is None:
                with warnings.catch_warnings():
                    # after the user's filters (append): "once" ahead of them overrode a user's
                    # simplefilter("ignore" / "error", ef.ApproximationWarning)
                    warnings.filterwarnings("once", category=UserWarning, append=True)
                    _check_batch_axis(self._model, jax.tree.leaves(xs), online=sequence_algo(self.algo) is None)
                    self.learner = compile_learner(self._model, xs[0], self._step_loss, algo=self.algo,
                                                   decay=self.decay, memory_budget=self.memory_budget,
                                                   trace_dtype=self.trace_dtype, plan_batch=xs.shape[1],
                                                   step_fn=self._step_fn, mesh=self.mesh)
                if self.learner.plan is not None:
                    changing = [f"update_every={self.update_every}"] * (self.update_every is not None
                                                                        and self.update_every < xs.shape[0])
                    changing += ["stateful=True (the traces carry across batches)"] * self.stateful
                    if changing:
                        warn_readout_memory_under_updates(self.learner.plan, " and ".join(changing), stacklevel=6)
                        warn_weight_maps_under_updates(self.learner.plan, " and ".join(changing), stacklevel=6)
            if check_memory and self.learner.plan is not None:
                check_trace_memory(self.learner.plan, xs.shape[1],
                                   devices=1 if self._placement is None else self._placement.size)
            return self.learner.compiled(xs, sequence_targets(ys, weight, self.regularizers, self._initial_rates()),
                                         max_chunk=max_chunk)

    def _build_step(self, compiled):
        """The jitted training step of ``compiled`` (see :func:`.step.build_train_step`)."""
        return build_train_step(compiled, self.optimizer, self.metric_fns, self.loss_on, self.update_every,
                                regularizers=self.regularizers, reset=self._reset_of(compiled),
                                placement=self._placement, axes=self._batch_axes_of(compiled),
                                frozen=frozen_weights(self._model))

    def _batch_axes(self, compiled) -> tuple | None:
        """With a mesh: the batch axis of each of the training state's hidden-state
        leaves and of each trace leaf (``None``: the leaf has none and is replicated),
        found by comparing their shapes at two batch sizes."""
        if self._placement is None:
            return None
        module, program = compiled.module, compiled.program
        others = _other_positions(module)
        batch = module.input_vars[0].aval.shape[0]

        def states_at(size):
            with _states_at(self._model, size):
                leaves = module.state_leaves()
            return [jax.ShapeDtypeStruct(np.shape(leaves[n]), jnp.result_type(leaves[n])) for n in others]

        traces = batch_axes(lambda size: jax.eval_shape(lambda: program.init_traces(size)), batch)
        return batch_axes(states_at, batch), traces

    def _reset_of(self, compiled) -> Reset:
        """The model's reset at the batch size of ``compiled``, traced once per program."""
        entry = self._resets.get(id(compiled.program))
        if entry is None:
            batch = compiled.module.input_vars[0].aval.shape[0]
            entry = self._resets[id(compiled.program)] = (compiled.program,
                                                          traced_reset(self._model, compiled.module, batch))
        return entry[1]

    def _batch_program(self, xs, ys, weight, max_chunk=None):
        """``(compiled, jitted step, reset)`` for this batch's shapes, kept per shape for
        the whole ``fit`` (no signature of the model's states per batch). ``max_chunk``:
        a new entry whose chunks take at most that many steps (:meth:`_under_line`)."""
        key = _shape_key((xs, ys, weight))
        entry = self._batch_programs.get(key)
        if entry is None or max_chunk is not None:
            if isinstance(xs, jax.Array) and not xs.is_fully_addressable:  # ProcessLocal: traced at its shapes
                xs, ys, weight = (np.zeros(a.shape, a.dtype) for a in (xs, ys, weight))
            if self.learner is not None:  # the learner keeps as many programs as the data has shapes
                self.learner.keep_programs(len(self._batch_programs) + 1)
            compiled = self._compiled(xs, ys, weight, max_chunk)
            step = self._steps.get(id(compiled.program))
            if step is None:
                self._forget_dropped_programs()
                step = self._steps[id(compiled.program)] = (compiled.program, self._build_step(compiled))
            entry = self._batch_programs[key] = (compiled, step[1], self._reset_of(compiled))
        return entry

    def _forget_dropped_programs(self) -> None:
        """Drop the steps, resets and batch axes of programs neither the learner nor this
        fit holds any more: kept by ``id(program)``, they grew by one compiled step per
        new program (17 batch shapes compiled every shape again at every ``fit``)."""
        held = {id(p) for p in self.learner.programs()} if self.learner is not None else set()
        held |= {id(entry[0].program) for entry in self._batch_programs.values()}
        for cache in (self._steps, self._resets, self._axes):
            for key in [key for key in cache if key not in held]:
                del cache[key]
        for key in [key for key, (first, _) in self._sized.items() if id(first) not in held]:
            del self._sized[key]

    def _chunk_of(self, compiled, length: int) -> int | None:
        """Steps per chunk of the online program of ``compiled`` on sequences of
        ``length`` steps as this trainer runs it (None for BPTT)."""
        if compiled.plan is None:
            return None
        every, program = self.update_every, compiled.program
        if every:
            return program.chunk_for(min(every, length))
        last = self.loss_on == "last" and not self.regularizers  # the last step runs alone
        return program.chunk_for(length, "last" if last else None)

    def _under_line(self, xs, ys, weight, compiled, step, args, options):
        """``(compiled, step)`` for this batch's shapes with its temp memory kept under
        ``online.mmap_line()`` where halving the chunk does it (``online.chunk_cap``):
        above the line every call page-faults its temp memory anew. Checked once per
        shape and program, before the first call: the step is compiled there (the call
        then finds it compiled), and a second time, chunked shorter, only when it is
        over the line. A later ``fit`` whose shape finds the same program takes the
        same choice (reading the compiled step's temp memory took ~6 ms a ``fit``)."""
        key = _shape_key((xs, ys, weight))
        entry = self._sized.get(key)
        if entry is not None and compiled.program is entry[1][0].program:
            return compiled, step  # the chosen program is the shape's entry already
        if entry is None or compiled.program is not entry[0]:
            if compiled.plan is None:
                return compiled, step
            entry = self._sized[key] = (compiled.program, sized_program(
                (compiled, step), lambda cap: self._batch_program(xs, ys, weight, max_chunk=cap)[:2],
                lambda program: temp_bytes(program[1], *args, **options), self._chunk_of(compiled, xs.shape[0]))[1])
        compiled, step = entry[1]
        # the shape's entry from now on (a shorter chunk that did not help had taken its place)
        self._batch_programs[key] = (compiled, step, self._reset_of(compiled))
        return compiled, step

    def _epoch_logs(self, epoch: int, records: list) -> dict[str, float]:
        """Size-weighted means of the batches' loss and metrics; warns when batches had a
        non-finite loss (their updates were not applied)."""
        total = sum(size for size, *_ in records)
        logs = {"loss": sum(size * float(loss) for size, loss, _, _ in records) / total}
        for key in records[0][2] if records else ():
            logs[key] = sum(size * float(metrics[key]) for size, _, metrics, _ in records) / total
        skipped = sum(not bool(finite) for *_, finite in records)
        fix = ("lower the learning rate, set grad_clip, or use Trainer(trace_dtype='float64') if eligibility "
               "traces overflow")
        if skipped and skipped == len(records) and self.stop_on_nonfinite:
            self.skipped_batches += skipped
            self.stop_training = True
            warnings.warn(f"epoch {epoch + 1}: every batch ({skipped}) had a non-finite loss or gradient (or made a "
                          f"weight or the optimizer state non-finite), so "
                          f"nothing was learned; training stops ({fix}; Trainer(stop_on_nonfinite=False) "
                          "goes on)", RuntimeWarning, stacklevel=4)
        elif skipped:
            self.skipped_batches += skipped
            warnings.warn(f"epoch {epoch + 1}: {skipped} of {len(records)} batches had a non-finite loss or "
                          f"gradient (or made a weight or the optimizer state non-finite); their updates were not "
                          f"applied ({fix}, or add TerminateOnNaN to stop)",
                          RuntimeWarning, stacklevel=4)
        return logs

    def _train_batch(self, xs, ys, weight, metric_weight=None):
        """One jitted training step from the training state to the next; returns the
        batch's loss, metrics and finite flag as device values (no host sync, nothing
        written into the model)."""
        compiled, step, args, options = self._step_call(xs, ys, weight, metric_weight)
        self._state, result = step(*args, **options)
        self.iterations += 1
        samples = int(np.shape(args[3])[1])  # (T, B), the global batch (weight: a process's share of it)
        # what report() shows the memory at: train_on_batch's batch, or fit's largest (not a smaller last one)
        if getattr(self, "_fitting", False):
            samples = max(samples, getattr(self, "last_train_batch", None) or 0)
        self.last_train_batch = samples
        self._sync.pending = True
        self._sync.module = compiled.module
        self.last_gradients, self.last_trace_norms = result.gradients, result.trace_norms
        return result.loss, result.metrics, result.finite

    def _follow_settings(self) -> None:
        """Drop every compiled program when a layer setting they hold changed (a threshold
        set between calls, or by a callback during ``fit``): the next call compiles them
        anew. ``predict`` and ``evaluate`` served the old setting's programs before,
        silently. ~30 µs a call on the demo's model."""
        now = attribute_snapshot(self._model, self._setting_nodes)
        if now != self._settings and changed_setting(self._settings, now) is not None:
            self._settings = now
            self._drop_programs()

    def _drop_programs(self) -> None:
        """Forget the compiled learner and every program built from it or the model."""
        self.learner = None
        for cache in (self._checked, self._steps, self._resets, self._axes, self._batch_programs, self._sized):
            cache.clear()
        self._forward = self._eval_step = self._recorder = None

    def _step_call(self, xs, ys, weight, metric_weight=None, stream: bool | None = None):
        """``(compiled, jitted step, args, keyword args)`` of the training step on this
        batch from the training state (the optimizer state is created on the first
        batch; with a mesh, everything is placed on it). ``stream`` False: start new
        sequences even in a stateful trainer."""
        if self._local_batches:  # this process's rows: the global batch from every process's
            metric_weight = None if metric_weight is weight else metric_weight
            xs, ys, weight = (self._placement.from_local(a, 1) for a in (xs, ys, weight))
            metric_weight = weight if metric_weight is None else self._placement.from_local(metric_weight, 1)
        self._follow_settings()
        compiled, step, reset = self._batch_program(xs, ys, weight)
        state = self._state
        if self._model_touched or state is None or state.states is None:
            state = self._pull(compiled.module)
        if self.regularizers and state.rates is None:
            state = self._state = state._replace(rates=self._initial_rates())
        if state.opt_state is None:
            self._init_optimizer(state.weights if self.update_every is None else
                                 compiled.weight_leaves({s.path: state.weights[format_path(s.path)]
                                                         for s in compiled.module.weights}))
            state = self._state
        batch = xs.shape[1]
        start = True
        if self.stateful and stream is not False:  # the states go on from the last batch; the traces too
            start = not self._continue_stream(batch)
            if state.traces is None:
                traces = compiled.program.init_traces(batch)
                if self._saved_traces is not None and not start:  # a restored checkpoint's streams go on
                    traces = self._restored_traces(traces)
                state = state._replace(traces=traces)
            self._saved_traces = None
        fresh = None
        if start:  # the reset positions' old values are not read: one input signature per batch shape
            states = list(state.states)
            for position, placeholder in zip(reset.positions, reset.placeholders):
                states[position] = placeholder
            state = state._replace(states=states)
            if reset.values is None:  # a reset that draws random numbers: the model's code, every batch
                fresh = eager_reset(self._model, compiled.module, reset, batch)
        metric_weight = None if metric_weight is weight else metric_weight
        if self._placement is not None:  # on the mesh: batches, states and traces split, the rest replicated
            xs, ys, weight, metric_weight, state, fresh = self._placed(compiled, state, xs, ys, weight,
                                                                       metric_weight, fresh, reset)
        args, options = (state, [xs], ys, weight, metric_weight), dict(fresh=fresh, start=start)
        compiled, step = self._under_line(xs, ys, weight, compiled, step, args, options)
        return compiled, step, args, options

    def step_memory(self, x: Any, y: Any = None, batch_size: int = 32) -> dict[str, int]:
        """XLA's memory analysis of the compiled training step on the first batch of
        ``x`` (arrays, batch-major), in bytes **per device**: ``temp`` (scratch,
        eligibility traces of a non-stateful trainer included), ``argument`` (the
        training state and the batch), ``output``, ``generated_code``; and for an
        online algo the steps per ``chunk`` of that step (docs/algorithms.md). Nothing
        is trained; with a mesh the step is the sharded one (docs/scaling.md)."""
        check_count(batch_size, "batch_size")
        batch = Batch(*(np.asarray(a)[:batch_size] if a is not None else None for a in (x, y)))
        if self.loss_on == "mask":  # the program is the same whatever steps the mask marks
            batch = dataclasses.replace(batch, mask=np.ones(np.shape(batch.x)[:2], bool))
        xs, ys, weight = self._time_major(batch, False)
        self._ensure_states(xs.shape[1])
        self._sync.refresh()
        self._model_touched = True
        compiled, step, args, options = self._step_call(xs, ys, weight, weight, stream=False)
        analysis = step.lower(*args, **options).compile().memory_analysis()
        chunk = self._chunk_of(compiled, xs.shape[0])
        return {"temp": int(analysis.temp_size_in_bytes), "argument": int(analysis.argument_size_in_bytes),
                "output": int(analysis.output_size_in_bytes),
                "generated_code": int(analysis.generated_code_size_in_bytes)} | (
                    {} if chunk is None else {"chunk": chunk})

    def _placed(self, compiled, state, xs, ys, weight, metric_weight, fresh, reset):
        """A batch and the training state on the mesh (leaves already there stay)."""
        placement = self._placement
        placement.check_batch(xs.shape[1], f"a batch of {xs.shape[1]} sequences")
        state_axes, trace_axes = self._batch_axes_of(compiled)
        state = TrainState(placement.replicate(state.weights), placement.replicate(state.opt_state),
                           placement.put_tree(state.states, state_axes),
                           None if state.traces is None else placement.put_tree(state.traces, trace_axes),
                           placement.replicate(state.rates))
        if fresh is not None:
            fresh = [placement.put(v, state_axes[n]) for v, n in zip(fresh, reset.positions)]
        put = lambda a: placement.put(a, 1)  # noqa: E731  time-major: the batch is axis 1
        return put(xs), put(ys), put(weight), None if metric_weight is None else put(metric_weight), state, fresh

    def _batch_axes_of(self, compiled) -> tuple:
        entry = self._axes.get(id(compiled.program))
        if entry is None:
            entry = self._axes[id(compiled.program)] = (compiled.program, self._batch_axes(compiled))
        return entry[1]

    def _one_batch(self, x: Any, y: Any, sample_weight: Any, class_weight: Any, name: str, mask: Any = None):
        """One batch of arrays as ``(xs, ys, loss weight, placement weight)``, time-major;
        ``mask`` the steps ``loss_on="mask"`` places the loss on (as ``x``: batch-major,
        or time-major with ``time_major=True``)."""
        x, y, sample_weight, mask = from_lists(x, y, sample_weight, mask)
        data = self._as_data((x, y) if mask is None else (x, y, mask), name)
        if not isinstance(data, Arrays):
            raise ConfigError(f"{name} takes arrays x (and y, and mask=)")
        if data.mask is not None:
            check_mask(data.mask, data.x, f"{name}: mask")
        elif self.loss_on == "mask":
            raise ConfigError(f"{name}: loss_on='mask' places the loss on the steps a mask marks; pass "
                              f"{name}(x, y, mask=mask) with mask (batch, time)")
        check_finite(data.x)
        if sample_weight is not None:
            sample_weight = check_weights(sample_weight, data.x)
            check_step_weights(sample_weight, self.loss_on, f"{name}: sample_weight")
        batch = Batch(data.x, data.y, data.mask, None if sample_weight is None else np.asarray(sample_weight))
        if batch.sample_weight is not None and self.time_major and np.ndim(batch.sample_weight) == 2:
            batch = dataclasses.replace(batch, sample_weight=np.swapaxes(batch.sample_weight, 0, 1))
        xs, ys, weight = self._time_major(batch, False)
        table = None if class_weight is None else class_table(class_weight, data.y)
        self._check_batch(xs, ys, data.y, table)
        return xs, ys, loss_weight(batch, ys, weight, table, False), weight

    def train_on_batch(self, x: Any, y: Any = None, sample_weight: Any = None, class_weight: Any = None,
                       return_dict: bool = False, mask: Any = None) -> Any:
        """One update on one batch, as Keras' ``train_on_batch``: the loss (and metrics:
        a list ``[loss, *metrics]``, or a dict with ``return_dict``); ``mask (batch,
        time)`` with ``loss_on="mask"``. With
        ``stateful=True`` consecutive calls continue the same streams — hidden states
        and eligibility traces carry — so a stream fed in chunks learns online; call
        :meth:`reset_states` between streams."""
        xs, ys, weighted, weight = self._one_batch(x, y, sample_weight, class_weight, "train_on_batch", mask)
        self._sync.refresh()
        self._model_touched = True  # weights set since the last call are read first
        try:
            loss, logs, finite = self._train_batch(xs, ys, weighted, weight)
        finally:
            self._push()
        if not bool(finite):
            self.skipped_batches += 1
            warnings.warn("train_on_batch: the loss or gradient is not finite, or the update would make a weight or "
                          "the optimizer state so; the update was not applied",
                          RuntimeWarning, stacklevel=2)
        return keras_result({"loss": float(loss), **{k: float(v) for k, v in logs.items()}}, return_dict,
                            self.metrics_names)


"""``Trainer``: Keras-style ``fit`` / ``evaluate`` / ``predict`` over online learning rules.

Each training step over a batch of sequences is **one** jitted call: the rule's scan
over time (from the :class:`etrace_fit.Learner` compiled on the first batch), the metrics on the outputs
that scan produced, and the optax update, compiled once per input shape (a last,
smaller batch compiles once, not every epoch). Evaluation is one jitted call per batch
as well. Data goes through :mod:`etrace_fit.training.data`; losses and metrics are per
sample and placed on the last step, every step, or a mask (``loss_on``); callbacks get
Keras' hooks.
"""

from __future__ import annotations

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
from ..compiler import format_path
from . import checkpoint
from ..errors import ConfigError, ShapeError
from .data import Batch, batches, check_finite, split_validation
from .losses import check_labels, cross_entropy, get_loss
from .metrics import get_metrics

__all__ = ["History", "Trainer", "check_trace_memory", "device_memory"]

LOSS_PLACEMENTS = ("last", "all", "mask")


def device_memory() -> int:
    """Bytes of memory of the first device: its ``bytes_limit`` where the runtime says
    (GPUs), else the host's physical memory (CPU)."""
    stats = jax.devices()[0].memory_stats() or {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_trace_memory(plan: Any, batch_size: int, available: int | None = None) -> None:
    """``ConfigError`` before training when the traces of ``batch_size`` samples alone
    would not fit in the device's memory, naming the largest batch that would."""
    per_sample = plan.bytes_per_sample()
    available = device_memory() if available is None else available
    if per_sample * batch_size > available:
        fits = available // max(per_sample, 1)
        raise ConfigError(
            f"the eligibility traces of a batch of {batch_size} need {per_sample * batch_size / 2**30:.2f} GiB "
            f"({per_sample / 2**20:.2f} MiB per sample) but the device has {available / 2**30:.2f} GiB: use a batch "
            f"size of at most {fits}, a smaller memory_budget (per sample) so hybrid picks ES-D-RTRL for more "
            f"weights, or trace_dtype bfloat16; trainer.report() lists the traces")


class History:
    """Per-epoch logs, as in Keras: ``history.history["loss"]`` is a list, one per epoch."""

    def __init__(self):
        self.history: dict[str, list[float]] = {}
        self.epoch: list[int] = []

    def append(self, epoch: int, logs: Mapping[str, float]) -> None:
        self.epoch.append(epoch)
        for key, value in logs.items():
            self.history.setdefault(key, []).append(float(value))


class Trainer:
    """Trains a ``brainstate`` model on sequences with an online rule (or BPTT).

    Args:
        model: a module whose one call is one time step (e.g. ``etrace_fit.Sequential``).
        algo: ``"hybrid"`` (default), ``"d_rtrl"``, ``"esd_rtrl"``, ``"bptt"`` or a dict
            ``{path pattern: rule}`` (see :func:`etrace_fit.sequence_grad`).
        optimizer: an optax ``GradientTransformation`` (default ``optax.adam(1e-3)``).
        loss: ``"cross_entropy"`` (integer labels), ``"mse"``, or ``(output, target) -> (B,)``.
        metrics: names (``"accuracy"``, ``"mse"``) or callables ``(output, target) -> (B,)``.
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
    ):
        check_algo(algo)
        if loss_on not in LOSS_PLACEMENTS:
            raise ConfigError(f"unknown loss_on {loss_on!r}; valid: {', '.join(LOSS_PLACEMENTS)}")
        if update_every is not None and (not isinstance(update_every, int) or update_every < 1):
            raise ConfigError(f"update_every must be a positive int or None, got {update_every!r}")
        if update_every is not None and algo == "bptt":
            raise ConfigError("update_every needs an online rule; BPTT sees the whole sequence first")
        if grad_clip is not None and not grad_clip > 0:
            raise ConfigError(f"grad_clip must be positive, got {grad_clip!r}")
        parse_bytes(memory_budget)
        self.model = model
        self.config = dict(algo=dict(algo) if isinstance(algo, Mapping) else algo, loss=loss if isinstance(loss, str) else None,
                           metrics=[m for m in (metrics or ()) if isinstance(m, str)], decay=decay, loss_on=loss_on,
                           time_major=time_major, seed=seed, update_every=update_every, grad_clip=grad_clip,
                           memory_budget=memory_budget)
        self.epoch = -1  # the last finished epoch
        self._callbacks = CallbackList()
        # A callback (BackupAndRestore) may set this in on_train_begin: fit starts there.
        self.resume_epoch: int | None = None
        self.algo, self.decay, self.loss_on = algo, decay, loss_on
        self.time_major, self.seed, self.update_every = time_major, seed, update_every
        self.memory_budget = memory_budget
        self.loss_fn = get_loss(loss)
        self.metric_fns = get_metrics(metrics)
        optimizer = optax.adam(1e-3) if optimizer is None else optimizer
        self.optimizer = optimizer if grad_clip is None else optax.chain(optax.clip_by_global_norm(grad_clip), optimizer)
        self.opt_state = None
        self.learner = None  # compiled on the first training batch (etrace_fit.compile)
        self._pending_learning_rate: float | None = None
        self.stop_training = False
        self.history = History()
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
        # One input sequence (T, ...) for dashboards: a validation sample if fit has one.
        self.sample_input: np.ndarray | None = None
        self._recorder = None

    # ------------------------------------------------------------------ pieces
    def _make_step_loss(self):
        loss_fn = self.loss_fn

        def step_loss(output, target):
            y, weight = target
            return jnp.sum(weight * loss_fn(output, y)) / weight.shape[0]

        return step_loss

    def _params(self):
        return self.model.states(brainstate.ParamState)

    def _time_major(self, batch: Batch) -> tuple[np.ndarray, Any, np.ndarray]:
        """``(xs (T, B, ...), ys (T, B, ...), weights (T, B))`` for one batch, on the host
        (numpy: no device work per batch before the one jitted step)."""
        x = np.asarray(batch.x)
        if x.ndim < 3:
            raise ShapeError(f"x must be {'(time, batch, features)' if self.time_major else '(batch, time, features)'}"
                             f" with at least 3 axes, got shape {tuple(x.shape)}")
        xs = x if self.time_major else np.swapaxes(x, 0, 1)
        steps, size = xs.shape[0], xs.shape[1]
        if self.loss_on == "mask":
            if batch.mask is None:
                raise ShapeError("loss_on='mask' needs (x, y, mask) batches; this batch has no mask")
            mask = np.asarray(batch.mask, np.float32)
            mask = mask if self.time_major else mask.T
            if mask.shape != (steps, size):
                raise ShapeError(f"mask must have shape {(size, steps)} (batch, time), got {tuple(np.shape(batch.mask))}")
            weight = mask / np.maximum(mask.sum(axis=0, keepdims=True), 1.0)
        elif self.loss_on == "all":
            weight = np.full((steps, size), 1.0 / steps, np.float32)
        else:
            weight = np.zeros((steps, size), np.float32)
            weight[-1] = 1.0
        y = None if batch.y is None else np.asarray(batch.y)
        if y is None:
            ys = np.zeros((steps, size), np.float32)
        elif y.ndim >= 2 and y.shape[:2] == ((steps, size) if self.time_major else (size, steps)):
            ys = y if self.time_major else np.swapaxes(y, 0, 1)  # per-step targets
        else:
            ys = np.broadcast_to(y, (steps, *y.shape))  # one target per sequence
        return xs, ys, weight.astype(np.float32)

    def _ensure_states(self, batch_size: int) -> None:
        """Create the hidden states of a model no batch has run through yet."""
        if not self.model.states(brainstate.HiddenState):
            brainstate.nn.init_all_states(self.model, batch_size=batch_size)

    def _outputs(self, xs: jax.Array) -> jax.Array:
        """The model's outputs at every step, ``(T, B, ...)``, from reset states."""
        self._ensure_states(xs.shape[1])
        if self._forward is None:
            model = self.model

            @brainstate.transform.jit
            def forward(xs):
                brainstate.nn.reset_all_states(model, batch_size=xs.shape[1])
                return brainstate.transform.for_loop(model, xs)

            self._forward = forward
        return self._forward(xs)

    def _check_first(self, xs, ys) -> None:
        """Errors before any training: the model's input size and the labels' range."""
        out = self._outputs(xs[:1])
        if self.loss_fn is cross_entropy:
            check_labels(np.asarray(ys), int(out.shape[-1]))

    def _metrics(self, outputs, ys, weight) -> dict[str, jax.Array]:
        """Each metric placed like the loss (traceable: runs inside the jitted step)."""
        return {name: jnp.sum(weight * jax.vmap(fn)(outputs, ys)) / weight.shape[1]
                for name, fn in self.metric_fns.items()}

    # ------------------------------------------------------------------ public
    def fit(
        self,
        x: Any,
        y: Any = None,
        batch_size: int = 32,
        epochs: int = 1,
        validation_data: Any = None,
        validation_split: float = 0.0,
        shuffle: bool = True,
        initial_epoch: int = 0,
        steps_per_epoch: int | None = None,
        callbacks: Sequence[Any] | None = None,
        verbose: int = 1,
        drop_remainder: bool = False,
    ) -> History:
        """Train for ``epochs`` passes over the data; returns the :class:`History`.

        ``verbose``: 0 silent, 1 a progress bar per epoch (``callbacks.ProgressBar``),
        2 one line per epoch.

        Logs per epoch: ``loss``, each metric, and with validation data ``val_loss`` and
        ``val_<metric>``. Bad data (empty, x and y of different lengths, NaN / inf,
        labels out of range, a wrong feature size) raises before any update.
        """
        if not isinstance(epochs, int) or epochs < initial_epoch:
            raise ConfigError(f"epochs must be an int >= initial_epoch ({initial_epoch}), got {epochs!r}")
        if validation_split and validation_data is not None:
            raise ConfigError("give validation_data or validation_split, not both")
        is_array = hasattr(x, "shape")
        if validation_split:
            if not is_array:
                raise ConfigError("validation_split needs array data; pass validation_data for iterables")
            (x, y), validation_data = split_validation(x, y, validation_split)
        if is_array:
            check_finite(x)
        self.sample_input = None
        if isinstance(validation_data, tuple) and len(validation_data) in (2, 3) and hasattr(validation_data[0], "shape"):
            check_finite(validation_data[0], "validation x")
            if len(validation_data[0]):
                self.sample_input = np.asarray(validation_data[0][:, 0] if self.time_major else validation_data[0][0])
        self.stop_training = False
        if self.learner is not None and not self.learner.is_current():
            self.learner = None  # a layer attribute changed or states were recreated: compile again
            self._steps.clear()
        self._batch_programs.clear()  # re-checked against the model's states at every fit
        params = self._params()
        callbacks = list(callbacks or [])
        if verbose == 1 and not any(isinstance(c, ProgressBar) for c in callbacks):
            total = None
            if is_array:
                size = np.shape(x)[0]
                total = size // batch_size if drop_remainder else -(-size // batch_size)
                total = total if steps_per_epoch is None else min(total, steps_per_epoch)
            callbacks.append(ProgressBar(total=total))
        self.epochs = epochs
        hooks = CallbackList(callbacks, trainer=self)
        self._callbacks = hooks
        self.resume_epoch = None
        hooks.on_train_begin({})
        if self.resume_epoch is not None:  # a BackupAndRestore callback restored a run
            initial_epoch = max(initial_epoch, self.resume_epoch)
        for epoch in range(initial_epoch, epochs):
            start = time.perf_counter()
            hooks.on_epoch_begin(epoch, {})
            records = []  # per batch: (size, loss, metrics, finite) as device values until the epoch ends
            data = batches(x, y, batch_size=batch_size, shuffle=shuffle, seed=self.seed + epoch,
                           drop_remainder=drop_remainder)
            for step, batch in enumerate(data):
                if steps_per_epoch is not None and step >= steps_per_epoch:
                    break
                xs, ys, weight = self._time_major(batch)
                if not is_array:
                    check_finite(np.asarray(xs).swapaxes(0, 1), "x")
                if epoch == initial_epoch and step == 0:
                    self._check_first(xs, ys)
                    if self.sample_input is None:
                        self.sample_input = np.asarray(xs[:, 0])
                hooks.on_train_batch_begin(step, {"size": int(xs.shape[1]), "time_steps": int(xs.shape[0])})
                loss, logs, finite = self._train_batch(params, xs, ys, weight)
                hooks.on_train_batch_end(step, BatchLogs({"loss": loss, **logs}))
                records.append((xs.shape[1], loss, logs, finite))
                if self.stop_training:
                    break
            epoch_logs = self._epoch_logs(epoch, jax.device_get(records))
            if self.learning_rate is not None:
                epoch_logs["learning_rate"] = self.learning_rate
            if validation_data is not None:
                epoch_logs.update({f"val_{k}": v for k, v in self._evaluate(validation_data, batch_size, hooks).items()})
            self.history.append(epoch, epoch_logs)
            self.epoch = epoch
            hooks.on_epoch_end(epoch, epoch_logs)
            if verbose == 2:
                shown = "  ".join(f"{k} {v:.4f}" for k, v in epoch_logs.items())
                print(f"epoch {epoch + 1}/{epochs}  {shown}  ({time.perf_counter() - start:.1f} s)")
            if self.stop_training:
                break
        hooks.on_train_end({k: v[-1] for k, v in self.history.history.items()})
        return self.history

    def _compiled(self, xs, ys, weight):
        """The program for this batch's shape, from the learner compiled on the first
        batch: its plan is kept for every later shape (a last, smaller batch must not
        change a weight's rule under the report)."""
        if self.learner is None:
            with warnings.catch_warnings():
                warnings.simplefilter("once", UserWarning)
                _check_batch_axis(self.model, jax.tree.leaves(xs))
                self.learner = compile_learner(self.model, xs[0], self._step_loss, algo=self.algo, decay=self.decay,
                                       memory_budget=self.memory_budget, plan_batch=xs.shape[1])
            if self.learner.plan is not None:
                check_trace_memory(self.learner.plan, xs.shape[1])
        return self.learner.compiled(xs, (ys, weight))

    def _build_step(self, compiled):
        """The whole training step over one batch as one pure function (jitted once
        per compiled program, i.e. per input shape). Steps whose loss weight is zero
        for every sample skip the online rules' pull-back; an update whose loss is not
        finite is not applied (the step says so in its last output)."""
        program, optimizer = compiled.program, self.optimizer
        paths = {format_path(s.path): s.path for s in compiled.module.weights}
        pair_names = [format_path(p.relation.weight_path) for p in program.pairs]
        every = self.update_every
        # With the loss at every step nothing is skipped: no per-step branch at all.
        skips = self.loss_on != "all" and compiled.plan is not None

        def collected_logs(losses, collected, ys, weight):
            norms = {}
            for name, norm in zip(pair_names, collected.trace_norms):
                norms[name] = jnp.hypot(norms[name], norm) if name in norms else norm
            return losses.sum(), self._metrics(collected.outputs, ys, weight), norms

        def train_step(values, opt_state, state_leaves, xs_leaves, ys, weight):
            weights = compiled.weight_leaves({path: values[name] for name, path in paths.items()})
            options = {}
            if skips:  # "last" is known statically: no per-step branch in the program
                options["active"] = "last" if self.loss_on == "last" else jnp.any(weight != 0, axis=1)
            if every is None:
                grad_leaves, losses, final, collected = program.run(weights, state_leaves, xs_leaves, (ys, weight),
                                                                    collect=True, **options)
                read = {format_path(path): g for path, g in compiled.per_state(grad_leaves).items()}
                grads = {name: read[name] if name in read else jax.tree.map(jnp.zeros_like, value)
                         for name, value in values.items()}
                updates, new_opt_state = optimizer.update(grads, opt_state, values)
                new_values = optax.apply_updates(values, updates)
            else:  # the optimizer runs inside the scan; its state is over the weight leaves
                weights, new_opt_state, losses, final, collected = program.run_with_updates(
                    weights, state_leaves, xs_leaves, (ys, weight), optimizer, opt_state, every, collect=True,
                    **options)
                new_values = dict(values)
                new_values.update({format_path(path): v for path, v in compiled.per_state(weights).items()})
                grads = None
            loss, logs, norms = collected_logs(losses, collected, ys, weight)
            # An update is applied only when the loss and what it is made from are finite:
            # an overflowing trace gives a NaN gradient under a finite loss.
            made_from = jax.tree.leaves(grads if grads is not None else new_values)
            finite = jnp.isfinite(loss) & jnp.all(jnp.stack([jnp.all(jnp.isfinite(g)) for g in made_from]))
            keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)  # noqa: E731
            new_values, new_opt_state = keep(new_values, values), keep(new_opt_state, opt_state)
            return new_values, new_opt_state, final, grads, loss, logs, norms, finite

        return jax.jit(train_step)

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
        if skipped:
            self.skipped_batches += skipped
            warnings.warn(f"epoch {epoch + 1}: {skipped} of {len(records)} batches had a non-finite loss or "
                          "gradient; their updates were not applied (lower the learning rate, set grad_clip, use "
                          "trace_dtype float64 if eligibility traces overflow, or add TerminateOnNaN to stop)",
                          RuntimeWarning, stacklevel=3)
        return logs

    def _train_batch(self, params, xs, ys, weight):
        """One jitted training step; returns the batch's loss, metrics and finite flag
        as device values (no host sync)."""
        values = {format_path(path): state.value for path, state in params.items()}
        brainstate.nn.reset_all_states(self.model, batch_size=xs.shape[1])  # async: overlaps the last step
        compiled, step = self._batch_program(xs, ys, weight)
        if self.opt_state is None:
            self._init_optimizer(values if self.update_every is None else compiled.weight_leaves())
        leaves = compiled.state_leaves()
        new_values, self.opt_state, final, grads, loss, logs, norms, finite = step(
            values, self.opt_state, leaves, [xs], ys, weight)
        for path, state in params.items():
            state.value = new_values[format_path(path)]
        compiled.write_states(final)
        self.last_gradients, self.last_trace_norms = grads, norms
        return loss, logs, finite

    def _build_eval_step(self):
        model, loss_fn = self.model, self.loss_fn

        @brainstate.transform.jit
        def eval_step(xs, ys, weight):
            brainstate.nn.reset_all_states(model, batch_size=xs.shape[1])
            outputs = brainstate.transform.for_loop(model, xs)
            per_step = jax.vmap(loss_fn)(outputs, ys)
            return {"loss": jnp.sum(weight * per_step) / weight.shape[1], **self._metrics(outputs, ys, weight)}

        return eval_step

    def _evaluate(self, data: Any, batch_size: int, hooks: CallbackList | None = None) -> dict[str, float]:
        hooks = hooks if hooks is not None else CallbackList()
        if isinstance(data, tuple) and len(data) in (2, 3) and hasattr(data[0], "shape"):
            x, y = data[0], data[1]
        else:
            x, y = data, None
        totals: dict[str, float] = {}
        count = 0
        hooks.on_test_begin({})
        for step, batch in enumerate(batches(x, y, batch_size=batch_size, shuffle=False)):
            hooks.on_test_batch_begin(step, {})
            xs, ys, weight = self._time_major(batch)
            self._ensure_states(xs.shape[1])
            if self._eval_step is None:
                self._eval_step = self._build_eval_step()
            logs = {key: float(value) for key, value in self._eval_step(xs, ys, weight).items()}
            for key, value in logs.items():
                totals[key] = totals.get(key, 0.0) + value * xs.shape[1]
            count += xs.shape[1]
            hooks.on_test_batch_end(step, logs)
        result = {key: value / count for key, value in totals.items()}
        hooks.on_test_end(result)
        return result

    def evaluate(self, x: Any, y: Any = None, batch_size: int = 32, callbacks: Sequence[Any] | None = None
                 ) -> dict[str, float]:
        """``{"loss": ..., <metric>: ...}`` averaged over the data (loss placed as in training)."""
        return self._evaluate((x, y) if hasattr(x, "shape") else x, batch_size, CallbackList(callbacks, trainer=self))

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
        if x.ndim < 2:
            raise ShapeError(f"record_spikes: x must be one sequence (time, features...), got shape {tuple(x.shape)}")
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

    def gradient_fidelity(self, x: Any, y: Any = None, mask: Any = None) -> dict[str, Any]:
        """Cosine and norm ratio of this trainer's online gradient against BPTT's on one
        batch (``x`` laid out as for ``fit``, the loss placed as in training), per
        weight path: ``{"layers.0.weight": WeightFidelity(cosine, norm_ratio)}``. See
        :func:`etrace_fit.gradient_fidelity`; for ``algo="bptt"`` every value is 1."""
        xs, ys, weight = self._time_major(Batch(x, y, mask))
        self._ensure_states(xs.shape[1])
        brainstate.nn.reset_all_states(self.model, batch_size=xs.shape[1])
        return gradient_fidelity(self.model, xs, (ys, weight), self._step_loss, algo=self.algo, decay=self.decay,
                                 memory_budget=self.memory_budget)

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
        found = []

        def visit(node):
            if hasattr(node, "hyperparams") and isinstance(node.hyperparams, dict):
                found.append(node.hyperparams)
            elif isinstance(node, (tuple, list)):
                for child in node:
                    visit(child)

        visit(self.opt_state)
        return found[0] if found else None

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
        (atomically; see :mod:`etrace_fit.training.checkpoint`)."""
        state = {"params": {format_path(p): s.value for p, s in self._params().items()},
                 "opt_state": self.opt_state if self.opt_state is not None else {}}
        extra = {"epoch": self.epoch, "history": self.history.history, "history_epochs": self.history.epoch,
                 "callbacks": self._callbacks.state_dict(), "config": self.config,
                 "has_opt_state": self.opt_state is not None}
        checkpoint.write_checkpoint(path, state, params_fingerprint=self._fingerprint(), extra=extra)

    def restore(self, path: Any) -> dict:
        """Load a checkpoint written by :meth:`save` into this trainer and its model;
        returns the manifest. :class:`CheckpointError` if it does not fit the model."""
        manifest, state = checkpoint.read_checkpoint(path, params_fingerprint=self._fingerprint())
        for path_, param in self._params().items():
            param.value = jax.tree.unflatten(jax.tree.structure(param.value),
                                             [jnp.asarray(leaf) for leaf in jax.tree.leaves(state["params"][format_path(path_)])])
        if manifest.get("has_opt_state"):
            if self.update_every is None:
                target = self.optimizer.init({format_path(p): s.value for p, s in self._params().items()})
            else:
                target = self.optimizer.init([leaf for s in self._params().values() for leaf in jax.tree.leaves(s.value)])
            from flax import serialization

            self.opt_state = jax.tree.map(jnp.asarray, serialization.from_state_dict(target, state["opt_state"]))
        self.history = History()
        for epoch in manifest["history_epochs"]:
            self.history.epoch.append(epoch)
        self.history.history = {k: list(v) for k, v in manifest["history"].items()}
        self.epoch = manifest["epoch"]
        self._callbacks.load_state_dict(manifest.get("callbacks", {}))
        return manifest

    @classmethod
    def load(cls, path: Any, model: Any, optimizer: Any = None, **overrides: Any) -> "Trainer":
        """A trainer for ``model`` with the configuration, weights, optimizer state and
        history saved at ``path``. The optimizer itself is code, not data: pass the same
        one (default ``optax.adam(1e-3)``)."""
        manifest, _ = checkpoint.read_checkpoint(path)
        nullable = ("decay", "update_every", "grad_clip", "memory_budget")
        config = {k: v for k, v in manifest["config"].items() if v is not None or k in nullable}
        config.update(overrides)
        trainer = cls(model, optimizer=optimizer, **config)
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

    def predict(self, x: Any, batch_size: int = 32, last_only: bool = True,
                callbacks: Sequence[Any] | None = None) -> np.ndarray:
        """Outputs for array data: ``(N, ...)`` at the last step, or every step
        (``last_only=False``: batch-major ``(N, T, ...)``, time-major if the trainer is)."""
        check_finite(x)
        hooks = CallbackList(callbacks, trainer=self)
        hooks.on_predict_begin({})
        outputs = []
        for step, batch in enumerate(batches(x, None, batch_size=batch_size, shuffle=False)):
            hooks.on_predict_batch_begin(step, {})
            xs, _, _ = self._time_major(batch)
            out = self._outputs(xs)
            outputs.append(np.asarray(out[-1] if last_only else (out if self.time_major else jnp.swapaxes(out, 0, 1))))
            hooks.on_predict_batch_end(step, {"outputs": outputs[-1]})
        hooks.on_predict_end({})
        return np.concatenate(outputs, axis=0 if last_only or not self.time_major else 1)

"""``TensorBoard``: scalars, norms, histograms, spike rasters, firing statistics, the
model summary and compile report, and one HParams entry per run (tensorboardX)."""

from __future__ import annotations

import itertools
import json
import math
import os
import time
import warnings
from typing import Any, Mapping

import numpy as np

from .base import Callback, Monitor, writable_folder
from .raster import firing_statistics, has_matplotlib, raster_figure, raster_image

# The event files' numbers, one count for the process: tensorboardX names a file by the
# second, the host and the process, so two callbacks of one process (a second fit's)
# numbering their files from 1 in one second wrote over each other's.
_FILE_NUMBERS = itertools.count(1)

__all__ = ["TensorBoard", "layer_labels", "readable_tag"]

#: Samples whose spikes give the firing statistics each epoch (the raster shows the first).
RASTER_SAMPLES = 8


def layer_labels(model: Any) -> dict[str, str]:
    """``{"layers.1": "ALIF_1", ...}``: each submodule's path → a readable label, its
    type and index (``Type_i``) or attribute name, nested labels joined by ``/``."""
    nodes = dict(model.nodes())
    labels: dict[tuple, str] = {}
    for path in sorted((p for p in nodes if p), key=len):
        key = path[-1]
        own = f"{type(nodes[path]).__name__}_{key}" if isinstance(key, int) else str(key)
        parent = next((labels[path[:k]] for k in range(len(path) - 1, 0, -1) if path[:k] in labels), None)
        labels[path] = own if parent is None else f"{parent}/{own}"
    return {".".join(str(p) for p in path): label for path, label in labels.items()}


def readable_tag(path: str, leaf: str = "", labels: Mapping[str, str] | None = None) -> str:
    """``"layers.0.weight"`` with leaf ``"weight"`` → ``"Linear_0/kernel"``: the owning
    layer's label, then the state name (a ``weight`` state's leaves alone, with Keras'
    ``kernel`` for the matrix)."""
    owner, _, name = path.rpartition(".")
    head = (labels or {}).get(owner, owner or name)
    if name == "weight" and leaf:
        return f"{head}/{'kernel' if leaf == 'weight' else leaf}"
    return f"{head}/{name}" + (f"/{leaf}" if leaf else "")


def _hparam_value(value: Any) -> Any:
    """A value the HParams dashboard shows as written: floats as numbers, ints (seed,
    epochs, batch size) and everything else as text."""
    if isinstance(value, bool) or isinstance(value, str):
        return value
    if isinstance(value, float):
        return value
    if value is None:
        return "none"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return json.dumps(value, default=str) if isinstance(value, (dict, list, tuple)) else str(value)


class TensorBoard(Callback):
    """Writes TensorBoard event files under ``log_dir`` (tensorboardX), as Keras does:
    ``log_dir/train`` and ``log_dir/validation`` sub-runs with the same tags, so the two
    curves overlay.

    Every epoch: each logged value as ``epoch/<key>`` (``val_<key>`` goes to the
    validation run as ``epoch/<key>``), ``epoch/sequences_per_second``; the last batch's
    gradient norms (``norms/gradient`` over all weights and ``norms/gradient/<layer>``)
    and ``norms/trace_log10/<weight>`` (log10 of the largest per-sample
    eligibility-trace norm; none for BPTT); for spiking models ``firing/rate/<layer>``
    (spikes per neuron and step), ``firing/silent_fraction/<layer>`` and
    ``firing/saturated_fraction/<layer>`` (neurons firing on ≥ 90 % of the steps) over
    a few validation sequences. Every ``histogram_freq`` epochs and at the last one:
    histograms of the weights (``weights/Linear_0/kernel``), the last batch's gradients
    (``gradients/...``; not with ``update_every``) and ``trace_norms_log10/...``. Every
    ``raster_freq`` epochs and at the last one: ``spikes/raster``, a figure with the
    input raster beside each spiking layer's, labelled axes, titled with the sequence's
    label and the prediction (matplotlib; without it ``spikes/raster`` is a plain image,
    input on top). After the first epoch: the model summary and the compile report in
    the text dashboard. At the end: one HParams entry for the run (in the train run, no
    twin folder) with every hyperparameter — optimizer, learning rate, epochs, batch
    size, algo, loss, ``loss_on``, decay, seed, and ``hparams`` you pass (e.g. the task)
    — and the final and best value of every logged key (``hparam/final_val_accuracy``,
    ``hparam/best_val_accuracy``, ...).

    Args:
        log_dir: the run's folder (created); give each run its own.
        update_freq: ``"epoch"`` (no per-batch points, Keras' default), ``"batch"`` (a
            ``batch/loss`` point every batch) or an int ``n`` (every ``n`` batches).
        histogram_freq: epochs between histograms (0: none, except at the last epoch
            unless ``final_histograms=False``).
        raster_freq: epochs between spike rasters (default ``histogram_freq``).
        hparams: extra hyperparameters for the HParams entry (``{"task": "shd"}``).
        final_histograms: also write histograms and rasters at the last epoch.
        legacy_tags: also write the tags of 0.2 (``epoch/val_loss`` in one run,
            ``weights/layers.0.weight/weight``); deprecated, removed in 0.4.
        write_graph: Keras' graph: here the model summary and the compile report in
            the text dashboard (a jitted JAX program has no layer graph to draw);
            ``False`` leaves them out.
        write_images: also write each weight matrix as an image
            (``weight_images/Linear_0/kernel``, scaled to its range) with the
            histograms.
        write_steps_per_second: also write ``epoch/steps_per_second`` (batches a
            second) and, with ``update_freq``, ``batch/steps_per_second``.
        profile_batch: profile training batch ``n`` (1-based, counted over the fit), or
            the batches ``(start, stop)``, with ``jax.profiler`` into ``log_dir/train``
            (TensorBoard's Profile tab); 0: none.
        embeddings_freq, embeddings_metadata: Keras' embedding projector, which is not
            written here: anything but ``0`` / ``None`` is a ``ConfigError``.

    Every argument after ``log_dir`` is passed by name: Keras' positional order
    (``histogram_freq`` second) and this callback's (``update_freq`` second) differ, so
    a position would be read the wrong way.

    Example::

        trainer.fit(x, y, epochs=10, callbacks=[TensorBoard("runs/evidence-1", hparams={"task": "evidence"})])
    """

    adds_log_keys = False

    main_process_only = True

    def __init__(self, log_dir: str = "runs", *, update_freq: int | str = "epoch", histogram_freq: int = 1,
                 raster_freq: int | None = None, hparams: Mapping[str, Any] | None = None,
                 final_histograms: bool = True, legacy_tags: bool = False, write_graph: bool = True,
                 write_images: bool = False, write_steps_per_second: bool = False,
                 profile_batch: int | tuple[int, int] = 0, embeddings_freq: int = 0, embeddings_metadata: Any = None):
        from ..errors import ConfigError

        for name, flag in (("write_graph", write_graph), ("write_images", write_images),
                           ("write_steps_per_second", write_steps_per_second)):
            if not isinstance(flag, bool):
                raise ConfigError(f"TensorBoard: {name} must be True or False, got {flag!r}")
        if embeddings_freq or embeddings_metadata is not None:
            raise ConfigError(f"TensorBoard: embeddings_freq={embeddings_freq!r}, embeddings_metadata="
                              f"{embeddings_metadata!r}: Keras' embedding projector is not written here; leave them "
                              f"0 and None (weights: histogram_freq, write_images)")
        self.profile_range = _profile_range(profile_batch)

        if update_freq == "epoch":
            update_freq = 0
        elif update_freq == "batch":
            update_freq = 1
        elif not isinstance(update_freq, int) or isinstance(update_freq, bool) or update_freq < 0:
            raise ConfigError(f"TensorBoard: update_freq must be 'epoch', 'batch' or an int >= 0 (batches between "
                              f"points), got {update_freq!r}")
        for name, value in (("histogram_freq", histogram_freq), ("raster_freq", raster_freq)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ConfigError(f"TensorBoard: {name} must be an int >= 0 (epochs between; 0: never), got {value!r}")
        if hparams is not None and not isinstance(hparams, Mapping):
            raise ConfigError(f"TensorBoard: hparams must be a dict {{name: value}}, got {type(hparams).__name__}")
        if legacy_tags:
            warnings.warn("TensorBoard(legacy_tags=True) writes the tags of 0.2 as well; they are removed in 0.4 "
                          "(see CHANGELOG.md)", DeprecationWarning, stacklevel=2)
        self.log_dir, self.update_freq, self.histogram_freq = os.fspath(log_dir), update_freq, histogram_freq
        self.raster_freq = histogram_freq if raster_freq is None else raster_freq
        self.hparams, self.final_histograms, self.legacy_tags = dict(hparams or {}), final_histograms, legacy_tags
        self.write_graph, self.write_images = write_graph, write_images
        self.write_steps_per_second = write_steps_per_second
        self._writers: dict[str, Any] = {}
        self._global_batch = 0
        self._dashboard_written = False
        self._first_rate = None
        self._in_fit = False
        self._profiling = False
        self._fit_batch = 0
        self._since_write, self._trained = 0, None

    # ------------------------------------------------------------------ writers
    def _writer(self, run: str):
        if run not in self._writers:
            from tensorboardX import SummaryWriter

            # each writer its own file: a file is closed at every epoch's end (below), and
            # tensorboardX names files by the second, so two in one second would be one
            self._writers[run] = SummaryWriter(os.path.join(self.log_dir, run),
                                               filename_suffix=f".{os.getpid()}.{next(_FILE_NUMBERS)}")
        return self._writers[run]

    def _close_writers(self) -> None:
        """Write everything given so far to disk and close the files (the next write
        opens new ones). tensorboardX writes from a thread of its own and its
        ``flush()`` does not wait for it: an epoch backed up by ``BackupAndRestore``
        could have its points still in the queue when the process was killed, and the
        resumed run, starting after that epoch, never wrote them again. ``close()``
        joins the thread."""
        for writer in self._writers.values():
            writer.close()
        self._writers = {}

    def state_key(self) -> str:
        return f"TensorBoard:{self.log_dir}"

    def on_train_begin(self, logs=None):
        if self._profiling:  # a fit that raised inside the profiled batches left it running
            self._stop_profile()
        writable_folder(self.log_dir, "TensorBoard")
        self._writer("train")
        self._in_fit = True
        if getattr(self.model, "resume_epoch", None) is None:  # a resumed run keeps what its state_dict holds
            self._dashboard_written = False
            self._first_rate = None
            # the batch axis goes on from the batches trained before (Keras' optimizer.iterations):
            # a second fit (initial_epoch=...) with a new callback drew over the first one's points
            self._global_batch = int(getattr(self.model, "iterations", self._global_batch))
        self._labels = layer_labels(self.model.model)
        self._fit_batch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._start, self._sequences, self._batches = time.perf_counter(), 0, 0
        self._batch_start, self._since_write, self._trained = self._start, 0, None

    def on_test_begin(self, logs=None):
        if self._in_fit and getattr(self, "_trained", 0) is None:  # the validation: the epoch's batches are done
            self._trained = time.perf_counter()  # (fit read their logs before it validates)

    def on_train_batch_begin(self, batch, logs=None):
        self._sequences += int((logs or {}).get("size", 0))
        self._batches += 1
        self._fit_batch += 1
        if self.profile_range and self._fit_batch == self.profile_range[0]:
            import jax

            jax.profiler.start_trace(os.path.join(self.log_dir, "train"))
            self._profiling = True

    def on_train_batch_end(self, batch, logs=None):
        self._global_batch += 1
        self._since_write += 1
        logs = logs or {}
        if self._first_rate is None:  # the run's first update's rate (a schedule's start), read once
            rate = getattr(self.model, "learning_rate", None)
            self._first_rate = None if rate is None else float(rate)
        if self._profiling and self._fit_batch >= self.profile_range[1]:
            self._stop_profile(logs)
        if self.update_freq and self._global_batch % self.update_freq == 0 and "loss" in logs:
            train = self._writer("train")
            # the batch's own loss (BatchLogs.raw), not Keras' running mean: a curve of batches
            train.add_scalar("batch/loss", float(getattr(logs, "raw", logs)["loss"]), self._global_batch)
            if self.write_steps_per_second:
                now = time.perf_counter()  # the batches since the last point or the epoch's start
                train.add_scalar("batch/steps_per_second", self._since_write / max(now - self._batch_start, 1e-9),
                                 self._global_batch)
            self._batch_start, self._since_write = time.perf_counter(), 0

    def _stop_profile(self, logs=None) -> None:
        """End the profile once the profiled batches' work is done (their loss is read)."""
        import jax

        if logs and "loss" in logs:
            jax.block_until_ready(logs["loss"])
        jax.profiler.stop_trace()
        self._profiling = False

    def _is_last(self, epoch: int) -> bool:
        return epoch + 1 >= int(self.params.get("epochs") or 0) or bool(self.model.stop_training)

    def on_epoch_end(self, epoch, logs=None):
        logs = dict(logs or {})
        train, trainer = self._writer("train"), self.model
        for key, value in logs.items():
            run, tag = ("validation", key[4:]) if key.startswith("val_") else ("train", key)
            self._writer(run).add_scalar(f"epoch/{tag}", float(value), epoch)
            if self.legacy_tags:
                train.add_scalar(f"epoch/{key}", float(value), epoch)
        if self._first_rate is None and "learning_rate" in logs:
            self._first_rate = float(logs["learning_rate"])
        # the training's pace: up to the validation, which the epoch's time includes
        elapsed = max((self._trained or time.perf_counter()) - self._start, 1e-9)
        train.add_scalar("epoch/sequences_per_second", self._sequences / elapsed, epoch)
        if self.write_steps_per_second:
            train.add_scalar("epoch/steps_per_second", self._batches / elapsed, epoch)
        self._norms(epoch)
        last = self.final_histograms and self._is_last(epoch)
        if (self.histogram_freq and epoch % self.histogram_freq == 0) or last:
            self._histograms(epoch)
        self._spiking(epoch, raster=bool(self.raster_freq and epoch % self.raster_freq == 0) or last)
        if self.write_graph and not self._dashboard_written:
            self._dashboard_written = True
            summary = trainer.summary(print_fn=None)
            train.add_text("model_summary", "```\n" + summary + "\n```", epoch)
            train.add_text("compile_report", "```\n" + trainer.report() + "\n```", epoch)
        self._close_writers()  # on disk before the epoch is backed up

    # ------------------------------------------------------------------ pieces
    def _tag(self, path: Any, leaf: str = "") -> str:
        name = path if isinstance(path, str) else ".".join(str(p) for p in path)
        return readable_tag(name, leaf, self._labels)

    def _leaves(self, tree: Mapping) -> list[tuple[Any, str, np.ndarray]]:
        out = []
        for path, value in tree.items():
            items = value.items() if isinstance(value, dict) else [("", value)]
            out.extend((path, leaf, np.asarray(array, np.float64)) for leaf, array in items)
        return out

    def _norms(self, epoch: int) -> None:
        train, trainer = self._writer("train"), self.model
        if trainer.last_gradients is not None:
            per_layer: dict[str, float] = {}
            for path, leaf, array in self._leaves(trainer.last_gradients):
                layer = self._tag(path, leaf).rsplit("/", 1)[0]
                per_layer[layer] = per_layer.get(layer, 0.0) + float(np.sum(array ** 2))
            total = math.sqrt(sum(per_layer.values()))
            if math.isfinite(total):
                train.add_scalar("norms/gradient", total, epoch)
            for layer, squared in per_layer.items():
                if math.isfinite(squared):
                    train.add_scalar(f"norms/gradient/{layer}", math.sqrt(squared), epoch)
        for path, norms in (trainer.last_trace_norms or {}).items():
            largest = float(np.max(np.asarray(norms, np.float64)))
            if math.isfinite(largest) and largest > 0:
                train.add_scalar(f"norms/trace_log10/{self._tag(path)}", math.log10(largest), epoch)

    def _histogram(self, tag: str, values: np.ndarray, epoch: int) -> None:
        values = values.ravel()
        values = values[np.isfinite(values)]  # a histogram of inf / NaN is an error in tensorboardX
        if values.size:
            self._writer("train").add_histogram(tag, values, epoch)

    def _weight_image(self, tag: str, values: np.ndarray, epoch: int) -> None:
        """A weight as a grey image scaled to its own range (a vector as one row; more
        axes folded into the rows), as Keras' ``write_images``."""
        image = values.reshape(1, -1) if values.ndim < 2 else values.reshape(-1, values.shape[-1])
        finite = np.isfinite(image)
        if not finite.any():
            return
        low, high = image[finite].min(), image[finite].max()
        scaled = np.where(finite, (image - low) / (high - low if high > low else 1.0), 0.0)
        self._writer("train").add_image(tag, scaled.astype(np.float32), epoch, dataformats="HW")

    def _histograms(self, epoch: int) -> None:
        trainer = self.model
        for path, leaf, array in self._leaves(trainer.get_weights()):
            self._histogram(f"weights/{self._tag(path, leaf)}", array, epoch)
            if self.write_images:
                self._weight_image(f"weight_images/{self._tag(path, leaf)}", array, epoch)
            if self.legacy_tags:
                name = ".".join(str(p) for p in path)
                self._histogram(f"weights/{name}{'/' + leaf if leaf else ''}", array, epoch)
        if trainer.last_gradients is not None:
            for path, leaf, array in self._leaves(trainer.last_gradients):
                self._histogram(f"gradients/{self._tag(path, leaf)}", array, epoch)
        for path, norms in (trainer.last_trace_norms or {}).items():
            norms = np.asarray(norms, np.float64)
            self._histogram(f"trace_norms_log10/{self._tag(path)}", np.log10(norms[norms > 0]), epoch)

    def _samples(self) -> tuple[np.ndarray, Any]:
        """Up to RASTER_SAMPLES sequences (validation ones if ``fit`` had them) and the
        first one's label."""
        trainer = self.model
        samples = trainer.sample_inputs if getattr(trainer, "sample_inputs", None) is not None \
            else trainer.sample_input[None]
        return np.asarray(samples[:RASTER_SAMPLES]), getattr(trainer, "sample_label", None)

    def _spiking(self, epoch: int, raster: bool) -> None:
        trainer = self.model
        if trainer.sample_input is None or not trainer.spiking_layers():
            return
        samples, label = self._samples()
        recorded = trainer._record_batch(samples)  # every sample's spikes in one call
        train = self._writer("train")
        for name in recorded:
            stats = firing_statistics(recorded[name])
            layer = self._labels.get(name, name)
            for key, value in stats.items():
                train.add_scalar(f"firing/{key}/{layer}", value, epoch)
        if not raster:
            return
        spikes = {self._labels.get(name, name): value[0] for name, value in recorded.items()}
        first = samples[:1] if not trainer.time_major else np.swapaxes(samples[:1], 0, 1)
        output = trainer.predict(first, verbose=0)
        # Class scores give a prediction for the title; other outputs (regression) none.
        prediction = int(np.argmax(output[0])) if np.ndim(output) == 2 and output.shape[1] > 1 else None
        if has_matplotlib():
            train.add_figure("spikes/raster", raster_figure(samples[0], spikes, label, prediction), epoch)
        else:
            train.add_image("spikes/raster", raster_image(samples[0], spikes), epoch, dataformats="HW")

    # ------------------------------------------------------------------ the end
    def _hparams(self) -> dict[str, Any]:
        trainer = self.model
        config = dict(trainer.config)
        optimizer = config.pop("optimizer", None) or "optax"  # a transformation of yours: no name to read
        if config.get("algo") == "hybrid" and config.get("memory_budget") is None:  # the budget it planned with
            from ..algorithms.hybrid import DEFAULT_BUDGET_PER_SAMPLE, format_bytes

            config["memory_budget"] = f"{format_bytes(DEFAULT_BUDGET_PER_SAMPLE)} (default)"
        # the batches trained (fit's largest), not a batch_size larger than the data
        batch = getattr(trainer, "last_train_batch", None) or getattr(trainer, "batch_size", None)
        values = {"optimizer": optimizer, "learning_rate": self._first_rate if self._first_rate is not None
                  else trainer.learning_rate, "epochs": self.params.get("epochs"), "batch_size": batch, **config,
                  **self.hparams}
        return {key: _hparam_value(value) for key, value in values.items()}

    def _metrics(self) -> dict[str, float]:
        history = self.model.history.history
        metrics = {}
        for key, values in history.items():
            finite = [v for v in values if math.isfinite(v)]
            if not finite or key == "learning_rate":
                continue
            metrics[f"hparam/final_{key}"] = float(values[-1])
            mode = Monitor("TensorBoard", key).mode
            if mode != "auto":  # a metric of the user's whose direction its name does not tell: no best
                metrics[f"hparam/best_{key}"] = float(max(finite) if mode == "max" else min(finite))
        return metrics

    def on_train_end(self, logs=None):
        if self._profiling:  # training stopped inside the profiled batches
            self._stop_profile()
        if not self._in_fit:  # no on_train_begin ran (or this end was called already)
            return
        self._in_fit = False
        from tensorboardX.summary import hparams

        metrics = self._metrics()
        if metrics:
            train = self._writer("train")
            experiment, start, end = hparams(self._hparams(), metrics)
            for summary in (experiment, start, end):
                train.file_writer.add_summary(summary)
            step = max(self.model.epoch, 0)
            for tag, value in metrics.items():
                train.add_scalar(tag, value, step)
        self._close_writers()

    def state_dict(self):
        return {"global_batch": self._global_batch, "first_rate": self._first_rate,
                "dashboard_written": self._dashboard_written}

    def load_state_dict(self, state):
        self._global_batch = state["global_batch"]
        self._first_rate = state.get("first_rate")  # the run's first rate: its HParams entry's
        self._dashboard_written = bool(state.get("dashboard_written", False))


def _profile_range(profile_batch: Any) -> tuple[int, int] | None:
    """Keras' ``profile_batch`` as ``(first, last)`` 1-based batches, or None for 0."""
    from ..errors import ConfigError

    def count(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    if count(profile_batch):
        return (profile_batch, profile_batch) if profile_batch else None
    if (isinstance(profile_batch, (tuple, list)) and len(profile_batch) == 2 and all(map(count, profile_batch))
            and 0 < profile_batch[0] <= profile_batch[1]):
        return int(profile_batch[0]), int(profile_batch[1])
    raise ConfigError(f"TensorBoard: profile_batch must be a batch number >= 0 (0: no profile) or a range "
                      f"(start, stop) with 0 < start <= stop, got {profile_batch!r}")

"""``TensorBoard``: scalars, histograms, spike rasters, the compile report and
hyperparameters (tensorboardX)."""

from __future__ import annotations

import json
import os
import time

import numpy as np

from .base import Callback

__all__ = ["TensorBoard"]


class TensorBoard(Callback):
    """Writes TensorBoard event files under ``log_dir`` (tensorboardX).

    Every epoch: each logged value as ``epoch/<key>`` (loss, metrics, ``val_*``,
    ``learning_rate``) and ``epoch/sequences_per_second``. Every ``update_freq`` batches:
    ``batch/loss``. Every ``histogram_freq`` epochs, histograms of every weight
    (``weights/<path>``), of the epoch's last batch's gradient (``gradients/<path>``;
    not with ``update_every``, where updates happen inside the sequence) and of its
    per-sample eligibility-trace norms at the end of the sequence
    (``trace_norms/<path>``, one value per sequence; none for BPTT). Every
    ``raster_freq`` epochs, for models with spiking layers: an image per spiking layer
    (``spikes/<path>``, neurons × time, white = spike) of one validation sequence (a
    training sequence without validation data). Once, after the first epoch: a text
    dashboard with the trainer's compile report (rule and trace memory per weight) and
    the trainer's configuration as hyperparameters.

    Args:
        log_dir: the folder for event files.
        update_freq: ``"epoch"`` (no per-batch points, Keras' default), ``"batch"`` (a
            ``batch/loss`` point every batch) or an int ``n`` (every ``n`` batches).
        histogram_freq: epochs between histograms (0: none).
        raster_freq: epochs between spike rasters (0: none; default ``histogram_freq``).

    Example::

        trainer.fit(x, y, epochs=10, callbacks=[TensorBoard("runs/evidence")])
    """

    def __init__(self, log_dir: str = "runs", update_freq: int | str = "epoch", histogram_freq: int = 1,
                 raster_freq: int | None = None):
        from ..errors import ConfigError

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
        self.log_dir, self.update_freq, self.histogram_freq = os.fspath(log_dir), update_freq, histogram_freq
        self.raster_freq = histogram_freq if raster_freq is None else raster_freq
        self._writer = None
        self._global_batch = 0
        self._dashboard_written = False

    def on_train_begin(self, logs=None):
        from tensorboardX import SummaryWriter

        self._writer = SummaryWriter(self.log_dir)
        self._dashboard_written = False

    def on_epoch_begin(self, epoch, logs=None):
        self._start, self._sequences = time.perf_counter(), 0

    def on_train_batch_begin(self, batch, logs=None):
        self._sequences += int((logs or {}).get("size", 0))

    def on_train_batch_end(self, batch, logs=None):
        self._global_batch += 1
        if self.update_freq and self._global_batch % self.update_freq == 0 and "loss" in (logs or {}):
            self._writer.add_scalar("batch/loss", float(logs["loss"]), self._global_batch)

    def on_epoch_end(self, epoch, logs=None):
        for key, value in (logs or {}).items():
            self._writer.add_scalar(f"epoch/{key}", float(value), epoch)
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        self._writer.add_scalar("epoch/sequences_per_second", self._sequences / elapsed, epoch)
        if self.histogram_freq and epoch % self.histogram_freq == 0:
            self._histograms(epoch)
        if self.raster_freq and epoch % self.raster_freq == 0:
            self._rasters(epoch)
        if not self._dashboard_written:
            self._dashboard_written = True
            self._writer.add_text("compile_report", "```\n" + self.model.report() + "\n```", epoch)
            config = {k: (json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in self.model.config.items()
                      if v is not None}
            self._writer.add_hparams(config, {f"hparam/{k}": float(v) for k, v in (logs or {}).items()},
                                     name="hparams")
        self._writer.flush()

    def _histogram_tree(self, prefix: str, tree: dict, epoch: int) -> None:
        for path, value in tree.items():
            name = path if isinstance(path, str) else ".".join(str(p) for p in path)
            leaves = value.items() if isinstance(value, dict) else [("", value)]
            for leaf, array in leaves:
                values = np.asarray(array, np.float64).ravel()
                values = values[np.isfinite(values)]  # a histogram of inf / NaN is an error in tensorboardX
                if values.size:
                    self._writer.add_histogram(f"{prefix}/{name}{'/' + leaf if leaf else ''}", values, epoch)

    def _histograms(self, epoch: int) -> None:
        trainer = self.model
        self._histogram_tree("weights", trainer.get_weights(), epoch)
        if trainer.last_gradients is not None:
            self._histogram_tree("gradients", trainer.last_gradients, epoch)
        if trainer.last_trace_norms:
            self._histogram_tree("trace_norms", trainer.last_trace_norms, epoch)

    def _rasters(self, epoch: int) -> None:
        trainer = self.model
        if trainer.sample_input is None or not trainer.spiking_layers():
            return
        for name, spikes in trainer.record_spikes(trainer.sample_input).items():
            raster = np.asarray(spikes).reshape(spikes.shape[0], -1).T  # (neurons, time)
            self._writer.add_image(f"spikes/{name}", (raster > 0).astype(np.uint8) * 255, epoch, dataformats="HW")

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def state_dict(self):
        return {"global_batch": self._global_batch}

    def load_state_dict(self, state):
        self._global_batch = state["global_batch"]

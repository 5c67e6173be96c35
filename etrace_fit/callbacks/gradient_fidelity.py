"""``GradientFidelity``: log how close the online gradient is to BPTT's while training."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .base import Callback

__all__ = ["GradientFidelity"]


class GradientFidelity(Callback):
    """Every ``every_n_epochs`` epochs, compares the trainer's online gradient with BPTT's
    on one fixed batch (:meth:`Trainer.gradient_fidelity`) and adds, per weight path,
    ``fidelity_cosine/<path>`` and ``fidelity_norm_ratio/<path>`` to the epoch's logs
    and to ``trainer.history``. List it before ``TensorBoard`` or ``CSVLogger`` so they
    record the values too (TensorBoard as ``epoch/fidelity_cosine/<path>``).

    The BPTT run costs about one training step with memory growing with the sequence
    length: pick a small batch.

    Args:
        x, y, mask: the batch, laid out as for ``fit`` (``x (B, T, ...)``).
        every_n_epochs: measure after epochs ``n, 2n, ...`` (1-based, as Keras'
            ``validation_freq``).

    Example::

        trainer.fit(x, y, epochs=20, callbacks=[GradientFidelity(x[:8], y[:8], every_n_epochs=5),
                                                TensorBoard("runs/exp")])
    """

    def __init__(self, x: Any, y: Any = None, mask: Any = None, every_n_epochs: int = 1):
        if not isinstance(every_n_epochs, int) or isinstance(every_n_epochs, bool) or every_n_epochs < 1:
            raise ConfigError(f"GradientFidelity: every_n_epochs must be a positive int, got {every_n_epochs!r}")
        self.x, self.y, self.mask = x, y, mask
        self.every_n_epochs = every_n_epochs

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every_n_epochs:
            return
        measured = {}
        for path, fidelity in self.model.gradient_fidelity(self.x, self.y, self.mask).items():
            measured[f"fidelity_cosine/{path}"] = fidelity.cosine
            measured[f"fidelity_norm_ratio/{path}"] = fidelity.norm_ratio
        if logs is not None:  # the History records them after the callbacks
            logs.update(measured)

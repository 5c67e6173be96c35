"""Training: the Trainer, and the data adapters, losses and metrics it uses.

Read ``data.py`` for the forms of data accepted, ``losses.py`` and ``metrics.py`` for
the names the trainer understands.
"""

from .data import Batch, batches, check_finite, split_validation
from .losses import LOSSES, check_labels, get_loss
from .metrics import METRICS, get_metrics
from .spiking import FiringRateRegularizer, NeuronRateRegularizer, RateBounds
from .trainer import History, Trainer

__all__ = ["Batch", "FiringRateRegularizer", "History", "LOSSES", "METRICS", "NeuronRateRegularizer", "RateBounds",
           "Trainer", "batches", "check_finite", "check_labels", "get_loss", "get_metrics", "split_validation"]

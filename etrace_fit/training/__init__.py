"""Training support: data adapters, losses and metrics (the Trainer builds on these).

Read ``data.py`` for the forms of data accepted, ``losses.py`` and ``metrics.py`` for
the names the trainer understands.
"""

from .data import Batch, batches, check_finite, split_validation
from .losses import LOSSES, check_labels, get_loss
from .metrics import METRICS, get_metrics

__all__ = ["Batch", "LOSSES", "METRICS", "batches", "check_finite", "check_labels", "get_loss", "get_metrics",
           "split_validation"]

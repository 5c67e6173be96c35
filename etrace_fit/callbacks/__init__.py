"""Callbacks with Keras' hook names, one per module. Read ``base.py`` first."""

from .backup_and_restore import BackupAndRestore
from .base import BatchLogs, Callback, CallbackList
from .csv_logger import CSVLogger
from .early_stopping import EarlyStopping
from .gradient_fidelity import GradientFidelity
from .lambda_callback import LambdaCallback
from .learning_rate_scheduler import LearningRateScheduler
from .model_checkpoint import ModelCheckpoint
from .progress_bar import ProgressBar
from .reduce_lr_on_plateau import ReduceLROnPlateau
from .tensorboard import TensorBoard
from .terminate_on_nan import TerminateOnNaN

__all__ = ["BackupAndRestore", "BatchLogs", "CSVLogger", "Callback", "CallbackList", "EarlyStopping", "GradientFidelity", "LambdaCallback",
           "LearningRateScheduler", "ModelCheckpoint", "ProgressBar", "ReduceLROnPlateau", "TensorBoard", "TerminateOnNaN"]

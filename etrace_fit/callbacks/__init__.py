"""Callbacks with Keras' hook names, one per module. Read ``base.py`` first."""

from .backup_and_restore import BackupAndRestore
from .base import Callback, CallbackList
from .csv_logger import CSVLogger
from .early_stopping import EarlyStopping
from .lambda_callback import LambdaCallback
from .model_checkpoint import ModelCheckpoint
from .terminate_on_nan import TerminateOnNaN

__all__ = ["BackupAndRestore", "CSVLogger", "Callback", "CallbackList", "EarlyStopping", "LambdaCallback",
           "ModelCheckpoint", "TerminateOnNaN"]

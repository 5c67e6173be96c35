"""Callbacks with Keras' hook names, one per module. Read ``base.py`` first."""

from .base import Callback, CallbackList
from .csv_logger import CSVLogger
from .early_stopping import EarlyStopping
from .lambda_callback import LambdaCallback
from .terminate_on_nan import TerminateOnNaN

__all__ = ["CSVLogger", "Callback", "CallbackList", "EarlyStopping", "LambdaCallback", "TerminateOnNaN"]

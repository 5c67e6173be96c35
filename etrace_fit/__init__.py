"""etrace_fit: online (eligibility-trace) training of recurrent and spiking networks in JAX.

Layers live in :mod:`etrace_fit.layers`, the ETP primitives they use in
:mod:`etrace_fit.ops`, the compiler that analyses a model's step in
:mod:`etrace_fit.compiler` (:func:`compile_graph`), the online rules in
:mod:`etrace_fit.algorithms` (:func:`compile`), the Keras-style :class:`Trainer` in
:mod:`etrace_fit.training` with :mod:`etrace_fit.callbacks`, built-in tasks in
:mod:`etrace_fit.datasets`, data parallelism over devices and hosts in
:mod:`etrace_fit.distributed`, errors in :mod:`etrace_fit.errors`.
"""

from . import algorithms, callbacks, compiler, datasets, distributed, errors, layers, ops, training
from .algorithms import Learner, LearnerState, compile, gradient_fidelity, online_fit, sequence_grad
from .compiler import ETraceGraph, compile_graph
from .errors import (ApproximationWarning, CheckpointError, CompilationError, ConfigError, DataError, EtraceError,
                     ShapeError)
from .layers import Sequential
from .training import History, Trainer

__version__ = "0.1.0"

__all__ = [
    "ApproximationWarning",
    "CheckpointError",
    "CompilationError",
    "ConfigError",
    "DataError",
    "ETraceGraph",
    "History",
    "Learner",
    "LearnerState",
    "EtraceError",
    "Sequential",
    "ShapeError",
    "Trainer",
    "__version__",
    "algorithms",
    "callbacks",
    "compile",
    "compile_graph",
    "compiler",
    "datasets",
    "distributed",
    "errors",
    "gradient_fidelity",
    "layers",
    "online_fit",
    "ops",
    "sequence_grad",
    "training",
]

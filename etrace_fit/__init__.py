"""etrace_fit: online (eligibility-trace) training of recurrent and spiking networks in JAX.

Layers live in :mod:`etrace_fit.layers`, the ETP primitives they use in
:mod:`etrace_fit.ops`, the compiler that analyses a model's step in
:mod:`etrace_fit.compiler` (:func:`compile_graph`), errors in :mod:`etrace_fit.errors`.
"""

from . import algorithms, compiler, errors, layers, ops
from .algorithms import Learner, compile, gradient_fidelity, online_fit, sequence_grad
from .compiler import ETraceGraph, compile_graph
from .errors import ApproximationWarning, CheckpointError, CompilationError, ConfigError, EtraceError, ShapeError
from .layers import Sequential
from .training import History, Trainer

__version__ = "0.1.0"

__all__ = [
    "ApproximationWarning",
    "CheckpointError",
    "CompilationError",
    "ConfigError",
    "ETraceGraph",
    "History",
    "Learner",
    "EtraceError",
    "Sequential",
    "ShapeError",
    "Trainer",
    "__version__",
    "algorithms",
    "compile",
    "compile_graph",
    "compiler",
    "errors",
    "gradient_fidelity",
    "layers",
    "online_fit",
    "ops",
    "sequence_grad",
]

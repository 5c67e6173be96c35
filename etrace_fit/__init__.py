"""etrace_fit: online (eligibility-trace) training of recurrent and spiking networks in JAX.

Layers live in :mod:`etrace_fit.layers`, the ETP primitives they use in
:mod:`etrace_fit.ops`, the compiler that analyses a model's step in
:mod:`etrace_fit.compiler` (:func:`compile_graph`), the online rules in
:mod:`etrace_fit.algorithms` (:func:`compile`), the Keras-style :class:`Trainer` in
:mod:`etrace_fit.training` with :mod:`etrace_fit.callbacks`, built-in tasks in
:mod:`etrace_fit.datasets`, data parallelism over devices and hosts in
:mod:`etrace_fit.distributed`, errors in :mod:`etrace_fit.errors`.
"""

import jax as _jax

# brainstate's import turns JAX's 64-bit mode off (its default precision is 32 bits), even when
# the user enabled it (jax.config.update or JAX_ENABLE_X64=1) before importing us: keep theirs.
_X64 = _jax.config.jax_enable_x64
import brainstate as _brainstate  # noqa: E402

if _X64 and not _jax.config.jax_enable_x64:
    _jax.config.update("jax_enable_x64", True)
del _brainstate, _X64

from . import (algorithms, callbacks, compiler, constraints, datasets, distributed, errors,  # noqa: E402
               layers, ops, training)
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
    "constraints",
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

"""etrace_fit: online (eligibility-trace) training of recurrent and spiking networks in JAX.

Layers live in :mod:`etrace_fit.layers`, the ETP primitives they use in
:mod:`etrace_fit.ops`, errors in :mod:`etrace_fit.errors`.
"""

from . import errors, layers, ops
from .errors import CheckpointError, CompilationError, ConfigError, EtraceError, ShapeError
from .layers import Sequential

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "CompilationError",
    "ConfigError",
    "EtraceError",
    "Sequential",
    "ShapeError",
    "__version__",
    "errors",
    "layers",
    "ops",
]

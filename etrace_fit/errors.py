"""Exception families of etrace_fit.

Every error a user can trigger derives from :class:`EtraceError`; messages name the
op, layer, state or argument involved, what was expected and what came.
"""

from __future__ import annotations

__all__ = ["ApproximationWarning", "CheckpointError", "CompilationError", "ConfigError", "DataError", "EtraceError",
           "ShapeError"]


class EtraceError(Exception):
    """Base class of all errors raised by etrace_fit."""


class ShapeError(EtraceError, ValueError):
    """An array reached an op or a layer with a shape (or dtype) it cannot take."""


class ConfigError(EtraceError, ValueError):
    """A constructor argument or environment setting is invalid or missing."""


class DataError(EtraceError, ValueError):
    """A data file or event array is not what its format promises (a truncated file, a
    missing key, events out of range, a checksum mismatch); the message names the file
    or argument, what was expected and what came."""


class CompilationError(EtraceError):
    """The ETP compiler cannot analyse the model as written."""


class CheckpointError(EtraceError):
    """A checkpoint is missing, corrupted, or does not match the model."""


class ApproximationWarning(UserWarning):
    """A weight's online gradient is approximate (not equal to BPTT's); the message
    names the weight and says why. Silence it with
    ``warnings.simplefilter("ignore", ApproximationWarning)``."""

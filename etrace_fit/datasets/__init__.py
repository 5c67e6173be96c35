"""Built-in tasks: synthetic generators (no download) and, later, real-format loaders."""

from .evidence import evidence_accumulation
from .synthetic import rate_discrimination

__all__ = ["evidence_accumulation", "rate_discrimination"]

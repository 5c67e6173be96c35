"""Built-in tasks: synthetic generators (no download) and, later, real-format loaders."""

from .synthetic import rate_discrimination

__all__ = ["rate_discrimination"]

"""Moved to :mod:`etrace_fit.checkpoint` (callbacks read checkpoint files too); this name stays."""

from ..checkpoint import *  # noqa: F401,F403
from ..checkpoint import __all__  # noqa: F401

"""Fixtures of the layer tests: the time step and precision come from ``brainstate.environ``.

Only contexts are used (never ``brainstate.environ.set``), so no test leaves a global
``dt`` behind for another one.
"""

from __future__ import annotations

import brainstate
import pytest


@pytest.fixture
def env():
    """``dt = 1.0`` in the default (32-bit) precision."""
    with brainstate.environ.context(dt=1.0):
        yield


@pytest.fixture
def env64():
    """``dt = 1.0`` and 64-bit floats: parameters and states built inside are float64."""
    with brainstate.environ.context(precision=64, dt=1.0):
        yield


@pytest.fixture
def no_dt():
    """No time step anywhere: a global ``dt`` (set by someone else) is removed, then restored."""
    previous = brainstate.environ.pop("dt", None)
    try:
        yield
    finally:
        if previous is not None:
            brainstate.environ.set(dt=previous)

"""Fixtures of the compiler tests: dt and precision come from ``brainstate.environ``
contexts only (never ``brainstate.environ.set``), so nothing leaks into other tests."""

from __future__ import annotations

import brainstate
import pytest


@pytest.fixture
def env64():
    """``dt = 1.0`` and 64-bit floats: models built and compiled inside are float64."""
    with brainstate.environ.context(precision=64, dt=1.0):
        yield

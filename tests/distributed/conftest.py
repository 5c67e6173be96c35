"""Data-parallel tests run with ``dt = 1`` and without the compile-time ApproximationWarning."""

import warnings

import brainstate
import pytest

import etrace_fit as ef


@pytest.fixture(autouse=True)
def unit_dt():
    with brainstate.environ.context(dt=1.0):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ef.ApproximationWarning)
            yield

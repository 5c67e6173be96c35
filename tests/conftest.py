"""Test options shared by the whole suite.

``--slow`` also runs the tests marked ``@pytest.mark.slow`` (``.ci/run`` passes it).
"""

import gc

import jax
import pytest


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False, help="also run tests marked slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--slow"):
        return
    skip_slow = pytest.mark.skip(reason="slow: run with --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)


@pytest.fixture(autouse=True, scope="module")
def _fresh_jax_caches():
    """Drop every compiled program after each test module. The whole suite in one
    process keeps thousands of XLA executables otherwise; with them, a run crashed
    (segfault inside XLA, no Python frame) at the same test twice, while that module
    passed on its own."""
    yield
    jax.clear_caches()
    gc.collect()

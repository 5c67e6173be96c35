"""Test options shared by the whole suite.

``--slow`` also runs the tests marked ``@pytest.mark.slow`` (``.ci/run`` passes it).
"""

import gc
import os

# The suite compiles thousands of small programs and runs most of them for a few steps:
# LLVM's optimisation of the generated code is a fifth to a quarter of its time. Its
# processes (this one, and the training runs, scripts and multi-device runs the tests
# start, which inherit the variable) compile at -O0. The HLO, the numerics (no fast math
# either way) and the buffers are the same; only the machine code is slower. A test that
# trains for long removes the flag from its process's variable (the demo's accuracy test).
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()

# The training runs the tests start (etrace-fit train, tasks.run) keep no compiled
# programs on disk even where the user's environment asks for it: no run reads another's
# (the compile cache's own test names a folder).
os.environ["ETRACE_FIT_COMPILE_CACHE"] = "none"

import jax  # noqa: E402
import pytest  # noqa: E402


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

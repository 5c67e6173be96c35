"""The small spiking model and task most Trainer tests train: ``Linear(4, 8) → LIF(8) →
LeakyRateReadout(8, 2)`` on 12-step rate discrimination."""

import contextlib

import jax
import numpy as np

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.datasets import rate_discrimination

C, H, T = 4, 8, 12


def lif_model(hidden: int = H):
    rng = np.random.default_rng(0)
    return ef.Sequential(L.Linear(C, hidden, w_init=rng.normal(0, 1.5, (C, hidden)).astype(np.float32)),
                         L.LIF(hidden),
                         L.LeakyRateReadout(hidden, 2, w_init=rng.normal(0, 0.3, (hidden, 2)).astype(np.float32)))


def rate_data(n: int = 16, seed: int = 0):
    return rate_discrimination(n, seq_len=T, num_channels=C, low_rate=0.05, high_rate=0.4, seed=seed)


@contextlib.contextmanager
def counting_compiles():
    """``[n]``: the XLA compilations while the block runs, counted as they happen."""
    count = [0]

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            count[0] += 1

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield count
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)

"""Synthetic sequence tasks generated on the fly, reproducible from a seed."""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError

__all__ = ["rate_discrimination"]


def rate_discrimination(
    num_samples: int,
    seq_len: int = 100,
    num_channels: int = 20,
    *,
    low_rate: float = 0.05,
    high_rate: float = 0.15,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Which of two input groups fires more? A two-way Poisson evidence task.

    The channels are split into two halves. In each sample one half (the label) spikes
    with probability ``high_rate`` per step, the other with ``low_rate``; the network
    must integrate spikes over time to tell which.

    Returns:
        ``x: (num_samples, seq_len, num_channels)`` float32 spikes (0/1), batch-major;
        ``y: (num_samples,)`` int32 labels in {0, 1}.

    Example::

        x, y = rate_discrimination(256, seq_len=100, num_channels=20, seed=0)
    """
    for name, value in (("num_samples", num_samples), ("seq_len", seq_len), ("num_channels", num_channels)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"rate_discrimination: {name} must be a positive int, got {value!r}")
    if num_channels < 2:
        raise ConfigError(f"rate_discrimination: num_channels must be at least 2, got {num_channels}")
    if not 0.0 <= low_rate < high_rate <= 1.0:
        raise ConfigError(
            f"rate_discrimination: need 0 <= low_rate < high_rate <= 1, got low_rate={low_rate}, high_rate={high_rate}"
        )
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, size=num_samples).astype(np.int32)
    half = num_channels // 2
    group = (np.arange(num_channels) >= half).astype(np.int32)  # channel -> group 0 / 1
    rates = np.where(group[None, :] == labels[:, None], high_rate, low_rate)  # (N, C)
    spikes = rng.random((num_samples, seq_len, num_channels)) < rates[:, None, :]
    return spikes.astype(np.float32), labels

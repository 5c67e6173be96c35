"""Device memory checks before training."""

from __future__ import annotations

import os
from typing import Any

import jax

from ..errors import ConfigError

__all__ = ["check_trace_memory", "device_memory"]


def device_memory() -> int:
    """Bytes of memory of this process's first device: its ``bytes_limit`` where the
    runtime says (GPUs), else the host's physical memory (CPU)."""
    stats = jax.local_devices()[0].memory_stats() or {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_trace_memory(plan: Any, batch_size: int, available: int | None = None, devices: int = 1) -> None:
    """``ConfigError`` before training when the traces of ``batch_size`` samples alone
    would not fit in the device's memory, naming the largest batch that would; with
    ``devices`` (a mesh's batch axis) each device holds ``batch_size / devices``."""
    per_sample = plan.bytes_per_sample()
    available = device_memory() if available is None else available
    local = batch_size // devices
    if per_sample * local > available:
        fits = available // max(per_sample, 1) * devices
        where = f" ({local} per device on {devices} devices)" if devices > 1 else ""
        raise ConfigError(
            f"the eligibility traces of a batch of {batch_size}{where} need {per_sample * local / 2**30:.2f} GiB "
            f"({per_sample / 2**20:.2f} MiB per sample) but {'each' if devices > 1 else 'the'} device has {available / 2**30:.2f} GiB: use a batch "
            f"size of at most {fits}, a smaller memory_budget (per sample) so hybrid picks ES-D-RTRL for more "
            f"weights, or Trainer(trace_dtype='bfloat16'); trainer.report() lists the traces")

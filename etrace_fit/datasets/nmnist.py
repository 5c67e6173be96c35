"""N-MNIST (Orchard et al. 2015): MNIST digits seen by a moving event camera, from the ``.bin`` files.

Each event is 40 bits: x, y, then polarity (1 bit) and a 23-bit timestamp in µs; an
event with ``y == 240`` marks a timestamp overflow, which adds ``2**13`` µs as the
dataset authors' reader does. The sensor is 34 x 34 with two polarities. Get
``Train.zip`` / ``Test.zip`` from the dataset's page (docs/datasets.md).
"""

from __future__ import annotations

import os
import pathlib

import numpy as np

from ..errors import ConfigError, DataError
from .events import bin_samples, check_binning, check_on_sensor, fingerprint, load_binned, with_mask

__all__ = ["EVENTS", "load_nmnist", "read_nmnist_events"]

EVENTS = np.dtype([("x", np.uint16), ("y", np.uint16), ("p", np.uint8), ("t", np.int64)])  # t in µs
SIZE = 34  # the sensor is SIZE x SIZE pixels
SPLITS = {"train": "Train", "test": "Test"}
OVERFLOW_Y = 240
#: µs an overflow marker adds to the timestamps after it: 2**13, as in the reader the dataset's
#: authors publish (``read_dataset`` in G. Orchard's event-Python, ``eventvision.py``), which
#: tonic's N-MNIST reader copies. The format's own description defines no marker; 2**23 (a wrap of
#: the 23-bit field) is what it might suggest, but would give other times than those readers.
OVERFLOW_US = 2**13
URL = "https://www.garrickorchard.com/datasets/n-mnist"
LAYOUT = "root/Train/<digit>/<id>.bin and root/Test/<digit>/<id>.bin (digit 0..9, the unzipped Train.zip / Test.zip)"


def read_nmnist_events(path: str | os.PathLike) -> np.ndarray:
    """The events of one N-MNIST ``.bin`` file: ``(E,)`` structured array ``EVENTS``
    with fields ``x``, ``y`` (pixels, 0..33), ``p`` (polarity, 0 or 1) and ``t`` (µs).

    Byte 0 is x, byte 1 y, bit 7 of byte 2 the polarity, and bits 0-6 of byte 2 with
    bytes 3 and 4 the 23-bit timestamp (big-endian). Each overflow marker (``y ==
    240``) adds ``OVERFLOW_US = 2**13`` µs to the timestamps after it (as the dataset
    authors' reader does) and is dropped. An empty file gives no events here;
    :func:`load_nmnist` refuses it.

    Raises:
        DataError: the file's size is not a multiple of 5 bytes (truncated).
    """
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size % 5:
        raise DataError(f"{path}: {raw.size} bytes is not a multiple of 5 (N-MNIST events are 40 bits each); "
                        f"the file is truncated or not an N-MNIST .bin")
    record = raw.reshape(-1, 5).astype(np.int64)
    overflow = record[:, 1] == OVERFLOW_Y
    stamp = ((record[:, 2] & 0x7F) << 16) | (record[:, 3] << 8) | record[:, 4]
    stamp += np.cumsum(overflow) * OVERFLOW_US  # markers before (and at) each event
    kept = ~overflow
    events = np.empty(int(kept.sum()), EVENTS)
    events["x"], events["y"] = record[kept, 0], record[kept, 1]
    events["p"], events["t"] = record[kept, 2] >> 7, stamp[kept]
    return events


def _sample(path: pathlib.Path) -> tuple[np.ndarray, np.ndarray]:
    """``(times in seconds from the recording's start, units p * 34 * 34 + y * 34 + x)``."""
    events = read_nmnist_events(path)
    if not events.size:  # every recording is a digit seen through three saccades: thousands of events
        size = path.stat().st_size
        found = f"only {size // 5} timestamp-overflow markers, y = {OVERFLOW_Y}" if size else "0 bytes"
        raise DataError(f"{path}: no events ({found}); an N-MNIST file holds the recording of one digit, thousands "
                        f"of events: this one is empty or cut short (unzip it again; the files are at {URL})")
    check_on_sensor(events, SIZE, SIZE, path, "N-MNIST")
    times = events["t"] * 1e-6
    units = (events["p"].astype(np.int64) * SIZE + events["y"]) * SIZE + events["x"]
    return times, units


def _files(root: pathlib.Path, split: str) -> tuple[list[pathlib.Path], np.ndarray]:
    if split not in SPLITS:
        raise ConfigError(f"load_nmnist: split must be one of {tuple(SPLITS)}, got {split!r}")
    folder = root / SPLITS[split]
    digits = [d for d in sorted(folder.iterdir()) if d.is_dir() and d.name.isdigit()] if folder.is_dir() else []
    beyond = [d.name for d in digits if int(d.name) > 9]
    if beyond:
        raise DataError(f"load_nmnist: {folder} has the folder(s) {', '.join(beyond)}; a folder's name is its "
                        f"samples' label, a digit 0..9 ({LAYOUT})")
    files = [(f, int(d.name)) for d in digits for f in sorted(d.glob("*.bin"))]
    if not files:
        raise FileNotFoundError(f"load_nmnist: no .bin files in {folder}/<digit>/. Expected the layout {LAYOUT}; "
                                f"get the files from {URL}")
    return [f for f, _ in files], np.array([label for _, label in files], np.int32)


def load_nmnist(
    root: str | os.PathLike,
    split: str = "train",
    *,
    dt: float | None = None,
    num_bins: int | None = None,
    max_time: float | None = None,
    flatten: bool = False,
    variable_length: bool = False,
    cache: bool | str | os.PathLike = True,
) -> tuple[np.ndarray, ...]:
    """N-MNIST from ``root/Train/<digit>/*.bin`` or ``root/Test/<digit>/*.bin``.

    Times are the files' own (µs from the recording's start). Binning as in
    :func:`~etrace_fit.datasets.load_shd`: ``dt`` (seconds) or ``num_bins``, and
    ``max_time`` (seconds; None: each sample's own length, zero-padded to the longest
    with ``dt``); samples are in the order digit, then file name.

    Returns:
        ``x: (N, T, 2, 34, 34)`` float32 event counts, axes (polarity, y, x) — or
        ``(N, T, 2312)`` with ``flatten=True`` — ``y: (N,)`` int32 digits, and with
        ``variable_length`` a ``mask: (N, T)`` bool of each sample's real steps.

    Raises:
        FileNotFoundError: no ``.bin`` files in the layout (the message names it and
            where to get the files). DataError: a truncated file, a file with no
            events (0 bytes, or overflow markers only), an event off the sensor (the
            message names the file, the event's index, x, y and t).
    """
    check_binning(dt, num_bins, max_time, "load_nmnist")
    root = pathlib.Path(root)
    files, labels = _files(root, split)
    key = {"dataset": "nmnist", "split": split, "dt": dt, "num_bins": num_bins, "max_time": max_time,
           "source": fingerprint(files)}

    def build() -> dict[str, np.ndarray]:
        x, lengths = bin_samples((_sample(f) for f in files), 2 * SIZE * SIZE, dt=dt, num_bins=num_bins,
                                 max_time=max_time, count=len(files), source=str(root))
        return {"x": x, "y": labels, "lengths": lengths}

    arrays = load_binned(f"nmnist_{split}", root, cache, key, build)
    x = arrays["x"] if flatten else arrays["x"].reshape(*arrays["x"].shape[:2], 2, SIZE, SIZE)
    return with_mask(x, arrays["y"], arrays["lengths"], variable_length)

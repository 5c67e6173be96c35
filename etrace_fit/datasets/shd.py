"""Spiking Heidelberg Digits (SHD) and Spiking Speech Commands (SSC), from their HDF5 files.

Cramer et al. (2020) publish both as ``<name>.h5.gz`` at https://zenkelab.org/datasets/ :
spoken words turned into spikes of 700 cochlear input units. The files are read
lazily, one sample at a time, with h5py (``pip install "etrace-fit[datasets]"``), then
binned by :func:`etrace_fit.datasets.events.bin_samples`. See docs/datasets.md.
"""

from __future__ import annotations

import os
import pathlib
import warnings
from typing import Any

import numpy as np

from ..errors import ConfigError, DataError
from .download import download as _download
from .download import gunzip as _gunzip
from .events import bin_samples, check_binning, fingerprint, load_binned, with_mask

__all__ = ["load_shd", "load_ssc"]

NUM_UNITS = 700
#: Classes per dataset: SHD's 20 spoken digits (10 German, 10 English), SSC's 35 commands.
CLASSES = {"shd": 20, "ssc": 35}
SPLITS = {"shd": ("train", "test"), "ssc": ("train", "valid", "test")}
URL = "https://zenkelab.org/datasets/{name}.h5.gz"
#: The longest recording either dataset holds is about 1.4 s; a last spike ten times later
#: than that is the sign of times in ms (or µs), not seconds.
LONGEST_RECORDING = 1.4
LAYOUT = ("an HDF5 file with the datasets spikes/times (one variable-length float array per sample, "
          "seconds), spikes/units (variable-length uint16 arrays, unit indices < 700) and labels (ints)")


def _h5py():
    try:
        import h5py
    except ImportError as exc:
        raise ImportError('reading the SHD / SSC files needs h5py: pip install "etrace-fit[datasets]" '
                          '(or pip install "h5py>=3.8,<4")') from exc
    return h5py


def _source(dataset: str, root: pathlib.Path, split: str, download: bool) -> pathlib.Path:
    if split not in SPLITS[dataset]:
        raise ConfigError(f"load_{dataset}: split must be one of {SPLITS[dataset]}, got {split!r}")
    name = f"{dataset}_{split}.h5"
    path = root / name
    packed = path.with_name(name + ".gz")
    if not path.exists() and packed.exists():  # the published .gz, downloaded by hand: unpacked beside it
        _gunzip(packed, path)
    if not path.exists():
        url = URL.format(name=f"{dataset}_{split}")
        if download:
            _download(url, path)
        else:
            raise FileNotFoundError(
                f"load_{dataset}: {path} not found. Expected the published file {name} in {root}: {LAYOUT}. "
                f"Get it from https://zenkelab.org/datasets/ ({url}, then gunzip it), or pass download=True.")
    return path


def _dataset(file: Any, path: pathlib.Path, key: str, kind: str, vlen: bool) -> Any:
    """``file[key]``, checked to hold (variable-length arrays of) ``kind`` numbers."""
    h5py = _h5py()
    if key not in file or not isinstance(file[key], h5py.Dataset):
        raise DataError(f"{path}: not the SHD/SSC layout, missing dataset {key!r}; expected {LAYOUT}")
    data = file[key]
    base = h5py.check_vlen_dtype(data.dtype) if vlen else data.dtype
    if base is None or np.dtype(base).kind not in kind or data.ndim != 1:
        expected = ("variable-length arrays of " if vlen else "") + ("floats" if kind == "f" else "integers")
        raise DataError(f"{path}: dataset {key!r} must hold {expected}, one entry per sample; got dtype "
                        f"{data.dtype} and shape {data.shape}. Expected {LAYOUT}")
    return data


def _read(path: pathlib.Path, dt, num_bins, max_time, classes: int) -> dict[str, np.ndarray]:
    h5py = _h5py()
    try:
        file = h5py.File(path, "r")
    except OSError as exc:
        raise DataError(f"{path}: not a readable HDF5 file ({exc}); expected {LAYOUT}") from exc
    with file:
        times = _dataset(file, path, "spikes/times", "f", vlen=True)
        units = _dataset(file, path, "spikes/units", "iu", vlen=True)
        labels = _dataset(file, path, "labels", "iu", vlen=False)
        if not len(times) == len(units) == len(labels):
            raise DataError(f"{path}: spikes/times, spikes/units and labels must have one entry per sample, got "
                            f"{len(times)}, {len(units)} and {len(labels)}")
        if len(labels) == 0:
            raise DataError(f"{path}: the file holds no samples")

        latest = [0.0, -1]  # the latest spike time read and its sample
        spike_free: list[int] = []  # the samples without spikes

        def samples():
            for i in range(len(labels)):
                sample_times, sample_units = times[i], units[i]
                if sample_times.shape != sample_units.shape:
                    raise DataError(f"{path}: sample {i} has {sample_times.size} spike times but "
                                    f"{sample_units.size} units")
                if sample_units.size and (sample_units.max() >= NUM_UNITS or sample_units.min() < 0):
                    bad = int(sample_units.max() if sample_units.max() >= NUM_UNITS else sample_units.min())
                    raise DataError(f"{path}: sample {i} has unit {bad}; expected 0 <= unit < {NUM_UNITS}")
                if sample_times.size and not (np.isfinite(sample_times).all() and sample_times.min() >= 0):
                    first = int(np.argmax(~(np.isfinite(sample_times) & (sample_times >= 0))))
                    raise DataError(f"{path}: sample {i} has spike time {sample_times[first]} (at index {first}); "
                                    f"expected finite times >= 0 in seconds")
                if sample_times.size and float(sample_times.max()) > latest[0]:
                    latest[:] = float(sample_times.max()), i
                if not sample_times.size:
                    spike_free.append(i)
                yield sample_times, sample_units

        y = np.asarray(labels[:])
        outside = (y < 0) | (y >= classes)
        if outside.any():
            first = int(np.argmax(outside))
            raise DataError(f"{path}: sample {first} has label {int(y[first])}; expected 0..{classes - 1} "
                            f"({classes} classes)")
        x, lengths = bin_samples(samples(), NUM_UNITS, dt=dt, num_bins=num_bins, max_time=max_time, count=len(labels),
                                source=str(path))
        if spike_free:
            # The layout allows a sample without spikes (a clip too quiet for the cochlea model), so a few are kept as
            # all-zero inputs; a file of nothing else is broken.
            which = ", ".join(map(str, spike_free[:5])) + (", ..." if len(spike_free) > 5 else "")
            message = (f"{path}: {len(spike_free)} of {len(labels)} samples have no spikes (at index {which}), so "
                       f"their inputs are all zeros")
            if len(spike_free) == len(labels):
                raise DataError(f"{message}: the file holds no spike at all; expected {LAYOUT}")
            warnings.warn(f"{message}, kept with their labels", RuntimeWarning, stacklevel=6)  # load_shd's caller
        if max_time is None and latest[0] > 10 * LONGEST_RECORDING:
            warnings.warn(f"{path}: sample {latest[1]} has a spike at t = {latest[0]:g}, but recordings last about "
                          f"{LONGEST_RECORDING} s, so each sample is binned to {x.shape[1]} steps: are the times in "
                          f"seconds (not ms or µs)? Or give max_time to keep [0, max_time) seconds",
                          RuntimeWarning, stacklevel=6)  # load_shd's caller
        return {"x": x, "y": y.astype(np.int32), "lengths": lengths}


def _load(dataset: str, root, split, dt, num_bins, max_time, variable_length, cache, download) -> tuple:
    check_binning(dt, num_bins, max_time, f"load_{dataset}")
    root = pathlib.Path(root)
    path = _source(dataset, root, split, download)
    key = {"dataset": dataset, "split": split, "dt": dt, "num_bins": num_bins, "max_time": max_time,
           "source": fingerprint([path])}
    arrays = load_binned(f"{dataset}_{split}", root, cache, key,
                         lambda: _read(path, dt, num_bins, max_time, CLASSES[dataset]))
    return with_mask(arrays["x"], arrays["y"], arrays["lengths"], variable_length)


def load_shd(
    root: str | os.PathLike,
    split: str = "train",
    *,
    dt: float | None = None,
    num_bins: int | None = None,
    max_time: float | None = 1.0,
    variable_length: bool = False,
    cache: bool | str | os.PathLike = True,
    download: bool = False,
) -> tuple[np.ndarray, ...]:
    """Spiking Heidelberg Digits from ``root/shd_<split>.h5`` (split ``"train"`` or ``"test"``).

    Args:
        root: the folder holding ``shd_train.h5`` / ``shd_test.h5`` (gunzipped).
        dt: bin width in seconds, or ``num_bins``: the number of bins (exactly one).
        max_time: keep ``[0, max_time)`` seconds of each sample (spikes after it are
            dropped) and give every sample ``ceil(max_time / dt)`` (or ``num_bins``)
            steps; None: each sample's own length (its last spike), zero-padded to the
            longest with ``dt``, stretched to ``num_bins`` bins with ``num_bins``.
        variable_length: also return the mask of each sample's real steps: the bins up
            to the one of its last spike (the rest is padding).
        cache: keep the binned arrays in ``root/.etrace_cache/`` (True), in another
            folder (a path) or not at all (False); another binning is another file.
        download: fetch a missing file from https://zenkelab.org/datasets/ first.

    Returns:
        ``x: (N, T, 700)`` float32 spike counts, ``y: (N,)`` int32 labels 0..19, and
        with ``variable_length`` a ``mask: (N, T)`` bool (train with
        ``Trainer(loss_on="mask")``; docs/datasets.md).

    Raises:
        FileNotFoundError: the file is missing (the message names the path, the
            layout and the URL). DataError: the file is not the published layout, or
            no sample has a spike. ImportError: h5py is not installed.

    A sample without spikes is allowed by the layout and kept, all zeros with its
    label (its mask, with ``variable_length``, is one step); a warning names how
    many and which.
    """
    return _load("shd", root, split, dt, num_bins, max_time, variable_length, cache, download)


def load_ssc(
    root: str | os.PathLike,
    split: str = "train",
    *,
    dt: float | None = None,
    num_bins: int | None = None,
    max_time: float | None = 1.0,
    variable_length: bool = False,
    cache: bool | str | os.PathLike = True,
    download: bool = False,
) -> tuple[np.ndarray, ...]:
    """Spiking Speech Commands from ``root/ssc_<split>.h5`` (split ``"train"``,
    ``"valid"`` or ``"test"``); arguments and results as :func:`load_shd`, with labels
    0..34."""
    return _load("ssc", root, split, dt, num_bins, max_time, variable_length, cache, download)

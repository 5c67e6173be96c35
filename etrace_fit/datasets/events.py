"""Event streams to dense arrays: binning, padding to one length, and an ``.npz`` cache.

The readers of the published neuromorphic datasets (:mod:`.shd`, :mod:`.nmnist`,
:mod:`.dvs_gesture`) turn their files into ``(times, units)`` per sample and call
:func:`bin_samples`, which uses :func:`bin_events` and :func:`pad_sequences`; their
results are kept by :func:`cached`. docs/datasets.md describes them all.
"""

from __future__ import annotations

import hashlib
import json
import numbers
import os
import pathlib
import tempfile
import warnings
import zipfile
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..errors import ConfigError, DataError

__all__ = ["bin_events", "bin_samples", "cached", "pad_sequences"]

# Bump when the cached arrays change meaning, or a file the readers used to accept is now refused: older cache
# files are then rebuilt (3: N-MNIST overflow markers add 2**13 µs; empty event files and gestures are errors).
CACHE_FORMAT = 3
_EDGE_DECIMALS = 9  # t / width is rounded to this many decimals, so t = k * dt lands in bin k
#: The most entries (bins × units) one sample may bin to: 1e9 (4 GB as float32). More is
#: a sign of times in the wrong unit (µs read as s), refused as such instead of a
#: MemoryError.
MAX_BINNED_ENTRIES = 10**9


def _is_seconds(value: Any) -> bool:
    """A positive, finite number of seconds, and not a bool (``True == 1`` passed as 1 s)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and bool(np.isfinite(value)) and value > 0


def check_binning(dt: float | None, num_bins: int | None, duration: float | None, caller: str) -> None:
    if (dt is None) == (num_bins is None):
        raise ConfigError(f"{caller}: give exactly one of dt (bin width in seconds) or num_bins, "
                          f"got dt={dt!r}, num_bins={num_bins!r}")
    if dt is not None and not _is_seconds(dt):
        raise ConfigError(f"{caller}: dt must be a positive number of seconds, got {dt!r}")
    if num_bins is not None and (isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer))
                                 or num_bins < 1):
        raise ConfigError(f"{caller}: num_bins must be a positive int, got {num_bins!r}")
    if duration is not None and not _is_seconds(duration):
        raise ConfigError(f"{caller}: duration / max_time must be a positive number of seconds or None, "
                          f"got {duration!r}")


def check_on_sensor(events: np.ndarray, width: int, height: int, source: Any, sensor: str) -> None:
    """Raise :class:`DataError` naming ``source`` and the first event of ``events`` (a
    structured array with fields ``x``, ``y``, ``t`` in µs) whose pixel lies outside the
    ``width x height`` sensor: its index in ``events``, its x, y and t, and how many
    such events there are."""
    off = (events["x"] >= width) | (events["y"] >= height)
    if off.any():
        first = int(np.argmax(off))
        event = events[first]
        raise DataError(f"{source}: event {first} (x={int(event['x'])}, y={int(event['y'])}, t={int(event['t'])} µs) "
                        f"is outside the {width} x {height} {sensor} sensor (x < {width}, y < {height}); "
                        f"{int(off.sum())} of {events.size} events are off it")


def _bin_index(times: np.ndarray, width: float, stored: np.dtype) -> np.ndarray:
    """``floor(t / width)``, with ``t`` on an edge when it is within 1e-9 bins of it or
    is the edge rounded to the dtype the times came in (``stored``): SHD publishes
    float16 seconds, in which 0.03 is 0.029998…, still bin 3 with ``dt = 0.01``."""
    scaled = times / width
    index = np.floor(np.round(scaled, _EDGE_DECIMALS)).astype(np.int64)
    if np.issubdtype(stored, np.floating) and np.finfo(stored).eps > np.finfo(np.float64).eps:
        edge = np.round(scaled) * width
        on_edge = edge.astype(stored).astype(np.float64) == times
        index = np.where(on_edge, np.round(scaled).astype(np.int64), index)
    return index


def host_memory() -> int | None:
    """Bytes of this machine's physical memory; None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _check_fits(entries: int, what: str, source: str) -> None:
    """A ``ConfigError`` when ``entries`` float32 counts (``what`` they are) are more
    than the machine's memory: the fill would end in swapping or the process killed,
    hours in, instead of an error naming the binning to change."""
    need, available = entries * 4, host_memory()
    if available is not None and need > available:
        raise ConfigError(f"{source}: the binned data {what} {need / 2**30:.1f} GiB (float32), more than this "
                          f"machine's {available / 2**30:.1f} GiB of memory: bin coarser (a larger dt or fewer "
                          f"num_bins), keep less of each sample (max_time) or fewer units (DVS Gesture's downsample)")


def _most_exact(dtype: np.dtype) -> int | None:
    """The largest count ``dtype`` holds exactly: its maximum for integers,
    ``2**(mantissa bits + 1)`` for floats (2048 for float16); None for other kinds
    (bool: whether any event fell in the bin, by choice)."""
    if np.issubdtype(dtype, np.integer):
        return int(np.iinfo(dtype).max)
    if np.issubdtype(dtype, np.floating):
        return 2 ** (np.finfo(dtype).nmant + 1)
    return None


def _check_events(times: Any, units: Any, num_units: int) -> tuple[np.ndarray, np.ndarray, np.dtype]:
    if isinstance(num_units, bool) or not isinstance(num_units, (int, np.integer)) or num_units < 1:
        raise ConfigError(f"bin_events: num_units must be a positive int, got {num_units!r}")
    times, units = np.asarray(times), np.asarray(units)
    if times.ndim != 1 or units.ndim != 1 or times.shape != units.shape:
        raise DataError(f"bin_events: times and units must be 1-D arrays of one length (one entry per event), "
                        f"got times {times.shape} and units {units.shape}")
    if not (np.issubdtype(times.dtype, np.floating) or np.issubdtype(times.dtype, np.integer)):
        raise DataError(f"bin_events: times must be numbers (seconds), got dtype {times.dtype}")
    stored, times = times.dtype, times.astype(np.float64)
    if not np.isfinite(times).all() or (times < 0).any():
        bad = int(np.argmax(~np.isfinite(times) | (times < 0)))
        raise DataError(f"bin_events: times must be finite and >= 0 (seconds from the sample's start), "
                        f"got times[{bad}] = {float(times[bad])}")
    if not np.issubdtype(units.dtype, np.integer):
        raise DataError(f"bin_events: units must be integer unit indices, got dtype {units.dtype}")
    if units.size and (units.min() < 0 or units.max() >= num_units):
        bad = int(np.argmax((units < 0) | (units >= num_units)))
        raise DataError(f"bin_events: units must be in [0, {num_units}) (num_units={num_units}), "
                        f"got units[{bad}] = {int(units[bad])}")
    return times, units.astype(np.int64), stored


def bin_events(
    times: Any,
    units: Any,
    num_units: int,
    *,
    dt: float | None = None,
    num_bins: int | None = None,
    duration: float | None = None,
    dtype: Any = np.float32,
) -> np.ndarray:
    """Count one sample's events per time bin and unit: ``(T, num_units)``.

    Args:
        times: ``(E,)`` event times in seconds from the sample's start (finite, >= 0).
        units: ``(E,)`` integer unit indices in ``[0, num_units)``.
        num_units: the number of input units (700 for SHD).
        dt: bin width in seconds; ``T = ceil(duration / dt)``.
        num_bins: the number of bins ``T``; each is ``duration / num_bins`` wide.
        duration: the window ``[0, duration)`` in seconds. Events at or after it are
            dropped. By default the window ends just past the last event, so the last
            event falls in the last bin: with ``dt``, ``T`` is the last event's bin + 1
            (0 bins without events); with ``num_bins``, the window is
            ``[0, max(times)]`` (all zeros without events).
        dtype: the dtype of the counts; one that cannot hold a count exactly (300
            events in one bin and unit as ``uint8``) is a ``ConfigError``. ``bool``
            gives whether any event fell in the bin (binary frames).

    Event ``t`` goes to bin ``floor(t / width)`` (``width`` = ``dt`` or
    ``duration / num_bins``); a time within 1e-9 bins of an edge, or equal to the edge
    rounded to the times' own dtype (float16 / float32 files), counts as on it, so
    ``t = k * dt`` lands in bin ``k`` despite float rounding. Counts are exact.

    Raises:
        ConfigError: not exactly one of ``dt`` / ``num_bins``, or a bad value; a
            ``dtype`` too narrow for a count.
        DataError: ``times`` and ``units`` of different lengths, a negative or
            non-finite time, a unit outside ``[0, num_units)``.

    Example::

        bin_events([0.0, 0.0015, 0.0025], [3, 3, 0], 4, dt=0.001)  # (3, 4)
    """
    check_binning(dt, num_bins, duration, "bin_events")
    times, units, stored = _check_events(times, units, num_units)
    kept = np.ones(times.shape, bool)
    if num_bins is not None:
        steps, span = int(num_bins), duration if duration is not None else (times.max() if times.size else 0.0)
        index = _bin_index(times, span / steps, stored) if span > 0 else np.zeros(times.shape, np.int64)
        if duration is None:  # the window is closed at the last event: it lands in the last bin
            index = np.minimum(index, steps - 1)
    else:
        index = _bin_index(times, dt, stored)
        if duration is not None:
            steps = int(np.ceil(np.round(duration / dt, _EDGE_DECIMALS)))
            # the window is [0, duration) even when its last bin is partial (duration not a multiple of dt)
            kept = _bin_index(times, duration, stored) < 1
        else:
            steps = int(index.max()) + 1 if index.size else 0
    if steps * num_units > MAX_BINNED_ENTRIES:
        raise DataError(f"bin_events: the events span {steps} bins of {num_units} units ({steps * num_units:.3g} "
                        f"entries, over {MAX_BINNED_ENTRIES:.0e}): the last event is at t = {times.max():g}; are the "
                        f"times in seconds (not µs or ms), and dt = {dt} in seconds too? Or give max_time / num_bins")
    kept &= index < steps
    flat = index[kept] * num_units + units[kept]
    counts = np.bincount(flat, minlength=steps * num_units)
    dtype, most = np.dtype(dtype), _most_exact(np.dtype(dtype))
    if most is not None and counts.size and counts.max() > most:  # astype would wrap (uint8: 300 -> 44) or round
        fullest = int(np.argmax(counts))
        raise ConfigError(f"bin_events: dtype={dtype.name} holds counts up to {most} exactly, but {int(counts.max())} "
                          f"events fall in one bin and unit (bin {fullest // num_units}, unit {fullest % num_units}); "
                          f"give a wider dtype (the default float32 is exact up to 2**24)")
    return counts.reshape(steps, num_units).astype(dtype)


def pad_sequences(sequences: Sequence[Any], length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Variable-length samples as one zero-padded array and a mask of the real steps.

    Args:
        sequences: ``N`` arrays ``(T_i, ...)`` with one trailing shape.
        length: pad to this many steps (at least the longest ``T_i``); default the
            longest.

    Returns:
        ``x: (N, T, ...)`` (the samples' common dtype, zeros after each sample's end)
        and ``mask: (N, T)`` bool, True on the ``T_i`` real steps. Train with
        ``Trainer(loss_on="mask")`` on ``(x, y, mask)`` batches, and pass
        ``(x, y, mask)`` as ``validation_data``: padded steps then carry no loss and
        no gradient.
    """
    arrays = [np.asarray(a) for a in sequences]
    if not arrays:
        raise DataError("pad_sequences: got no sequences; expected a list of (T_i, ...) arrays")
    for i, a in enumerate(arrays):
        if a.ndim < 1 or a.shape[1:] != arrays[0].shape[1:]:
            raise DataError(f"pad_sequences: every sequence must be (T_i, *{arrays[0].shape[1:]}); "
                            f"sequence {i} has shape {a.shape}")
    lengths = np.array([len(a) for a in arrays], np.int64)
    steps = int(lengths.max()) if length is None else int(length)
    if steps < lengths.max():
        raise ConfigError(f"pad_sequences: length={length} is shorter than the longest sequence "
                          f"({lengths.max()} steps)")
    x = np.zeros((len(arrays), steps, *arrays[0].shape[1:]), np.result_type(*arrays))
    for i, a in enumerate(arrays):
        x[i, : len(a)] = a
    return x, np.arange(steps)[None, :] < lengths[:, None]


def bin_samples(
    samples: Iterable[tuple[np.ndarray, np.ndarray]],
    num_units: int,
    *,
    dt: float | None = None,
    num_bins: int | None = None,
    max_time: float | None = None,
    count: int | None = None,
    source: str = "bin_samples",
) -> tuple[np.ndarray, np.ndarray]:
    """Bin many samples' ``(times, units)`` into one float32 array, with their lengths.

    Each sample is binned by :func:`bin_events` with ``duration=max_time``. With
    ``num_bins`` or ``max_time`` every sample has the same ``T``; with ``dt`` and no
    ``max_time`` each has its own and the shorter ones are zero-padded
    (:func:`pad_sequences`). ``count``, the number of samples when known, lets a fixed
    ``T`` be filled in place (no second copy of the data). Samples whose events all
    fall at or after ``max_time`` are all zeros: a warning names how many, and a
    ``DataError`` (naming ``source``, the files read) when that is every sample — the
    sign of times in ms or µs.

    Returns:
        ``x: (N, T, num_units)`` float32 counts and ``lengths: (N,)`` int64: the steps
        up to and including the bin of a sample's last kept event (at least 1), so
        ``np.arange(T) < lengths[:, None]`` masks the padding.
    """
    check_binning(dt, num_bins, max_time, "bin_samples")
    fixed = num_bins if num_bins is not None else (
        int(np.ceil(np.round(max_time / dt, _EDGE_DECIMALS))) if max_time is not None else None)
    filled = None
    if count is not None and fixed is not None:
        _check_fits(count * fixed * num_units, f"({count} samples x {fixed} steps x {num_units} units) would take",
                    source)
        filled = np.zeros((count, fixed, num_units), np.float32)
    counts, lengths, emptied, earliest, held = [], [], 0, np.inf, 0
    for i, (times, units) in enumerate(samples):
        sample = bin_events(times, units, num_units, dt=dt, num_bins=num_bins, duration=max_time)
        if filled is None:  # the count or the length unknown: stopped as soon as the samples are too much
            held += sample.shape[0] * num_units
            _check_fits(held, f"of the first {i + 1} samples ({num_units} units) takes", source)
        if len(times) and not sample.any():  # every event at or after max_time
            emptied, earliest = emptied + 1, min(earliest, float(np.min(times)))
        active = np.flatnonzero(sample.any(axis=1))
        lengths.append(max(int(active[-1]) + 1 if active.size else 0, 1))
        if filled is not None:
            filled[i] = sample
        else:
            counts.append(sample)
    if not lengths:
        raise DataError("bin_samples: got no samples; expected an iterable of (times, units) pairs")
    if emptied:
        message = (f"{emptied} of {len(lengths)} samples have events but none before max_time = {max_time} s (the "
                   f"earliest of theirs at t = {earliest:g} s), so they are all zeros: are the times in seconds (not "
                   f"ms or µs), or is max_time too short?")
        if emptied == len(lengths):
            raise DataError(f"{source}: {message}")
        warnings.warn(f"{source}: {message}", RuntimeWarning, stacklevel=3)
    if filled is not None:
        if len(lengths) != count:
            raise DataError(f"bin_samples: count={count} but the samples gave {len(lengths)}")
        return filled, np.asarray(lengths, np.int64)
    steps = max(max(lengths), max(len(c) for c in counts))
    _check_fits(len(counts) * steps * num_units,
                f"padded to the longest sample ({len(counts)} x {steps} steps x {num_units} units) would take", source)
    x, _ = pad_sequences(counts, length=steps)
    return x, np.asarray(lengths, np.int64)


# ------------------------------------------------------------------ cache
def cache_file(folder: str | os.PathLike, name: str, key: Mapping[str, Any]) -> pathlib.Path:
    """``folder/<name>_<12 hex digits of the key's hash>.npz``: another binning,
    another file."""
    digest = hashlib.sha256(_key_text(key).encode()).hexdigest()[:12]
    return pathlib.Path(folder) / f"{name}_{digest}.npz"


def _key_text(key: Mapping[str, Any] | None) -> str:
    return json.dumps({"cache_format": CACHE_FORMAT, **dict(key or {})}, sort_keys=True, default=str)


def _read(path: pathlib.Path, key_text: str) -> dict[str, np.ndarray] | None:
    """The arrays of a cache file whose stored key matches, else None (rebuild)."""
    try:
        with np.load(path, allow_pickle=False) as stored:
            if "__key__" not in stored.files or str(stored["__key__"]) != key_text:
                return None
            return {name: stored[name] for name in stored.files if name != "__key__"}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError):  # missing, truncated or not an npz
        return None


def cached(
    path: str | os.PathLike,
    build: Callable[[], Mapping[str, np.ndarray]],
    *,
    key: Mapping[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """``build()``'s arrays, kept in the ``.npz`` file ``path`` for the next call.

    The file stores ``key`` (the parameters the arrays depend on, e.g. ``dt`` and
    ``num_bins``, as JSON) beside the arrays; a file with another key, or one that
    cannot be read, is rebuilt and replaced. Writing goes to a temporary file in the
    same folder, then ``os.replace``: a crash never leaves a half-written cache.
    Arrays are stored with ``np.savez`` and read with ``allow_pickle=False`` (never
    pickle), so ``build`` must return plain numeric or string arrays.
    """
    path = pathlib.Path(path)
    key_text = _key_text(key)
    stored = _read(path, key_text)
    if stored is not None:
        return stored
    _check_writable(path.parent)  # before the build: its work would be thrown away
    arrays = {name: np.asarray(value) for name, value in dict(build()).items()}
    for name, value in arrays.items():
        if value.dtype == object or name == "__key__":
            raise DataError(f"cached: build() must return numeric arrays under names other than '__key__'; "
                            f"{name!r} has dtype {value.dtype}")
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            np.savez(stream, __key__=np.array(key_text), **arrays)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
    return arrays


def _check_writable(folder: pathlib.Path) -> None:
    """Create ``folder`` and write a file in it, or raise :class:`ConfigError` saying why
    (a file in its place, no permission)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise ConfigError(f"the dataset cache folder {folder} cannot be written ({error.strerror or error}); "
                          f"pass cache=False, or cache='<a writable folder>'") from None


def cache_folder(root: pathlib.Path, cache: bool | str | os.PathLike) -> pathlib.Path | None:
    """The loaders' ``cache`` argument: True → ``root/.etrace_cache``, a path → that
    folder, False → no cache."""
    if cache is True:
        return root / ".etrace_cache"
    if cache is False or cache is None:
        return None
    if isinstance(cache, (str, os.PathLike)):
        return pathlib.Path(cache)
    raise ConfigError(f"cache must be True, False or a folder path, got {cache!r}")


def fingerprint(paths: Iterable[pathlib.Path]) -> list:
    """``[count, total bytes, newest mtime_ns, digest]`` of the source files: part of a
    cache key, so a replaced or re-downloaded file is read again. The digest (SHA-256)
    covers each file's path below the files' common folder, size, mtime and ctime: a
    file moved to another class folder (N-MNIST's label is its folder) or rewritten at
    the same size and mtime changes the key; count, bytes and mtime alone missed both."""
    paths = [pathlib.Path(p) for p in paths]
    stats = [p.stat() for p in paths]
    base = os.path.commonpath([str(p.parent) for p in paths]) if paths else ""
    lines = sorted(f"{os.path.relpath(p, base)}\t{s.st_size}\t{s.st_mtime_ns}\t{s.st_ctime_ns}"
                   for p, s in zip(paths, stats))
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    return [len(stats), sum(s.st_size for s in stats), max((s.st_mtime_ns for s in stats), default=0), digest]


def load_binned(
    name: str,
    root: pathlib.Path,
    cache: bool | str | os.PathLike,
    key: Mapping[str, Any],
    build: Callable[[], Mapping[str, np.ndarray]],
) -> dict[str, np.ndarray]:
    """``build()`` through the cache the loaders share (or directly with ``cache=False``)."""
    folder = cache_folder(root, cache)
    if folder is not None and cache is True:  # the default: a read-only dataset folder loads without it
        try:
            _check_writable(folder)
        except ConfigError as error:
            warnings.warn(f"{error}; {name} is loaded without a cache (binned anew at every call)", RuntimeWarning,
                          stacklevel=3)
            folder = None
    if folder is None:
        return dict(build())
    return cached(cache_file(folder, name, key), build, key=key)


def with_mask(x: np.ndarray, y: np.ndarray, lengths: np.ndarray, variable_length: bool) -> tuple:
    """The loaders' result: ``(x, y)``, or ``(x, y, mask (N, T) bool)`` with
    ``variable_length``."""
    if not variable_length:
        return x, y
    return x, y, np.arange(x.shape[1])[None, :] < lengths[:, None]

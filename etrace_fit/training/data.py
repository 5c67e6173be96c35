"""Data the trainer accepts, turned into batches, with errors before any training.

Accepted: numpy / jax arrays ``x`` (and ``y``) cut into batches of ``batch_size``; any
iterable or generator of ``(x, y)`` or ``(x, y, mask)`` batches; objects with
``__len__`` and ``__getitem__`` returning such batches. Arrays are batch-major,
``(batch, time, ...)``. A final partial batch is kept unless ``drop_remainder``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import numpy as np

from ..errors import ConfigError, ShapeError

__all__ = ["Batch", "batches", "check_finite", "check_shuffle", "split_validation"]


@dataclasses.dataclass(frozen=True)
class Batch:
    """One batch, batch-major: ``x (B, T, ...)``, ``y`` (per sequence or per step) or
    None, ``mask (B, T)`` or None, ``sample_weight`` ``(B,)`` or ``(B, T)`` or None."""

    x: Any
    y: Any = None
    mask: Any = None
    sample_weight: Any = None

    @property
    def size(self) -> int:
        return int(np.shape(self.x)[0])


def check_finite(x: Any, name: str = "x") -> None:
    """Raise :class:`ShapeError` naming the first sample that holds NaN or inf."""
    values = np.asarray(x)
    if not np.issubdtype(values.dtype, np.floating) or values.size == 0:
        return
    bad = ~np.isfinite(values.reshape(values.shape[0], -1)).all(axis=1) if values.ndim else ~np.isfinite(values)
    if np.any(bad):
        first = int(np.argmax(bad))
        raise ShapeError(f"{name} contains NaN or inf (first in sample {first}); clean the data before training")


def check_shuffle(shuffle: Any) -> None:
    """``True``, ``False`` or ``"batch"`` (as in Keras), else :class:`ConfigError`."""
    if not (isinstance(shuffle, bool) or shuffle == "batch"):
        raise ConfigError(f"shuffle must be True, False or 'batch' (shuffle the order of batches only), got {shuffle!r}")


def _length(name: str, value: Any) -> int:
    shape = np.shape(value)
    if not shape:
        raise ShapeError(f"{name} must have a leading batch axis, got a scalar")
    return shape[0]


def split_validation(x: Any, y: Any, fraction: float) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """Keras' ``validation_split``: the last ``fraction`` of the samples (before any
    shuffling) become the validation set."""
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"validation_split must be in (0, 1), got {fraction!r}")
    total = _length("x", x)
    held = int(round(total * fraction))
    if held == 0 or held == total:
        raise ConfigError(f"validation_split={fraction} of {total} samples leaves an empty training or validation set")
    cut = total - held
    take = (lambda a, s: None if a is None else a[s])
    return (take(x, slice(0, cut)), take(y, slice(0, cut))), (take(x, slice(cut, None)), take(y, slice(cut, None)))


def _array_batches(x, y, batch_size, shuffle, seed, drop_remainder, sample_weight, mask) -> Iterator[Batch]:
    total = _length("x", x)
    if total == 0:
        raise ShapeError("x is empty: no samples to train on")
    if y is not None and _length("y", y) != total:
        raise ShapeError(f"x and y have different numbers of samples: x has {total}, y has {_length('y', y)}")
    if mask is not None and _length("mask", mask) != total:
        raise ShapeError(f"mask has {_length('mask', mask)} rows for {total} samples of x")
    if sample_weight is not None and _length("sample_weight", sample_weight) != total:
        raise ShapeError(f"sample_weight has {_length('sample_weight', sample_weight)} entries for {total} samples "
                         f"of x; give one weight per sample (N,) or per sample and step (N, T)")
    stop = total - total % batch_size if drop_remainder else total
    if stop == 0:
        raise ShapeError(f"drop_remainder=True with batch_size={batch_size} drops all {total} samples")
    rng = np.random.default_rng(seed)
    if shuffle == "batch":  # Keras: the order of batch-sized chunks is shuffled, not the samples
        chunks = [np.arange(first, min(first + batch_size, stop)) for first in range(0, stop, batch_size)]
        chunks = [chunks[i] for i in rng.permutation(len(chunks))]
    else:
        order = rng.permutation(total) if shuffle else np.arange(total)
        chunks = [order[first : first + batch_size] for first in range(0, stop, batch_size)]
    for index in chunks:
        yield Batch(x[index], None if y is None else y[index], None if mask is None else np.asarray(mask)[index],
                    None if sample_weight is None else np.asarray(sample_weight)[index])


def _as_batch(item: Any, position: int) -> Batch:
    if isinstance(item, Batch):
        return item
    if isinstance(item, (tuple, list)) and 1 <= len(item) <= 3:
        return Batch(*item)
    raise ShapeError(f"batch {position} must be (x, y) or (x, y, mask), got {type(item).__name__}"
                     + (f" of length {len(item)}" if isinstance(item, (tuple, list)) else ""))


def batches(
    x: Any,
    y: Any = None,
    *,
    batch_size: int = 32,
    shuffle: bool | str = True,
    seed: int = 0,
    drop_remainder: bool = False,
    sample_weight: Any = None,
    mask: Any = None,
) -> Iterator[Batch]:
    """Batches of ``x`` (and ``y``), whatever form the data comes in (module docstring).

    ``shuffle`` (``True``, ``False`` or Keras' ``"batch"``: shuffle the order of
    batch-sized chunks only), ``seed``, ``sample_weight`` and ``mask`` (``(N, T)``)
    apply to arrays only;
    iterables and sequences are read in their own order. Raises :class:`ShapeError` for
    empty data or ``x`` and ``y`` of different lengths, :class:`ConfigError` for a bad
    ``batch_size`` or ``shuffle``.
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}")
    check_shuffle(shuffle)
    if hasattr(x, "shape") and hasattr(x, "__getitem__"):
        yield from _array_batches(x, y, batch_size, shuffle, seed, drop_remainder, sample_weight, mask)
        return
    if y is not None:
        raise ConfigError("y must be None when x is an iterable or sequence of (x, y) batches")
    if sample_weight is not None:
        raise ConfigError("sample_weight applies to array data; an iterable gives weights inside its batches")
    if hasattr(x, "__len__") and hasattr(x, "__getitem__"):
        if len(x) == 0:
            raise ShapeError("the data sequence is empty: no batches to train on")
        items = (x[i] for i in range(len(x)))
    else:
        items = iter(x)
    count = 0
    for count, item in enumerate(items, start=1):
        batch = _as_batch(item, count - 1)
        if batch.y is not None and _length("y", batch.y) != batch.size:
            raise ShapeError(f"batch {count - 1}: x has {batch.size} samples, y has {_length('y', batch.y)}")
        yield batch
    if count == 0:
        raise ShapeError("the data iterable yielded no batches")

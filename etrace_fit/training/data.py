"""Data the trainer accepts, turned into batches, with errors before any training.

Accepted: numpy / jax arrays ``x`` (and ``y``) cut into batches of ``batch_size``
(Python lists of numbers are taken as arrays, :func:`from_lists`); any iterable or
generator of ``(x, y)`` or ``(x, y, mask)`` batches; objects with ``__len__`` and
``__getitem__`` returning such batches. Arrays are batch-major, ``(batch, time, ...)``.
A final partial batch is kept unless ``drop_remainder``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from typing import Any, Iterator, Mapping

import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError, ShapeError

__all__ = ["Arrays", "Batch", "InputLayer", "batch_major", "batches", "check_finite", "check_shuffle", "class_table",
           "loss_weight", "placement", "split_validation"]


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


@dataclasses.dataclass(frozen=True)
class InputLayer:
    """The layer that reads ``x`` first, for the checks of ``x``'s layout: ``name`` as
    messages give it (``Sequential.layers[0] Linear(4, 8)``), whether it reads token ids
    (an :class:`~etrace_fit.layers.Embedding`; None: cannot be told, a module of yours
    holding one), and its ``in_size`` (None: unknown)."""

    name: str
    takes_ids: bool | None = None
    in_size: tuple | None = None

    def check(self, x: Any, name: str = "x", time_major: bool = False) -> None:
        """:class:`ShapeError` for integers ``(batch, time)`` (no feature axis) when the
        first layer reads features, not ids (Keras reads them as ids only in an
        ``Embedding``: a ``Linear(4, 8)`` trained on them silently when the batch size
        was 4), and for ids ``(batch, time, 1)`` given to an ``Embedding``."""
        dtype = np.result_type(x) if hasattr(x, "dtype") else np.asarray(x).dtype
        shape = tuple(np.shape(x))
        if not np.issubdtype(dtype, np.integer):
            return
        layout = "(time, batch" if time_major else "(batch, time"
        if len(shape) == 2 and self.takes_ids is False:
            expects = f"{layout}, {', '.join(map(str, self.in_size))})" if self.in_size else f"{layout}, features)"
            raise ShapeError(f"{name} of shape {shape} ({dtype}) is {layout}) without a feature axis; only an "
                             f"Embedding first reads such integers as token ids, and the model's first layer, "
                             f"{self.name}, expects {expects}. Add a trailing feature axis (x[..., None] for one "
                             f"feature), or put an Embedding first for token ids")
        if len(shape) == 3 and shape[-1] == 1 and self.takes_ids is True:
            raise ShapeError(f"{name} of shape {shape} ({dtype}): the model's first layer, {self.name}, takes token "
                             f"ids {layout}) as Keras' Embedding does, not {layout}, 1); drop the trailing axis: "
                             f"x[..., 0]")


def _holds_numbers(value: Any) -> bool:
    """Whether ``value`` is a (nested) list or tuple whose first entry, at every depth,
    is one too, down to a Python or numpy number (no array inside: a list of arrays is
    a list of batches, or Keras' several inputs)."""
    if not isinstance(value, (list, tuple)) or not value:
        return False
    while isinstance(value, (list, tuple)) and value:
        value = value[0]
    return isinstance(value, (bool, int, float, np.number))


def listed_array(value: Any) -> np.ndarray | None:
    """A (nested) list of numbers as an array, as Keras converts it (Python floats at
    float32, Keras' ``floatx``); None when ``value`` is no such list or its rows differ
    in length (no one array)."""
    if not _holds_numbers(value):
        return None
    try:
        array = np.asarray(value)
    except ValueError:  # rows of different lengths
        return None
    if not np.issubdtype(array.dtype, np.number) and array.dtype != bool:
        return None
    return array.astype(np.float32) if array.dtype == np.float64 else array


def from_lists(x: Any, y: Any = None, sample_weight: Any = None, mask: Any = None) -> tuple:
    """``(x, y, sample_weight, mask)``, each (nested) list of numbers as an array (Keras
    takes ``y.tolist()``), anything else as it is (a list of batches of arrays stays
    one); a :class:`ShapeError` naming the argument for lists of numbers that form no
    array (rows of different lengths)."""
    converted = []
    for name, value in (("x", x), ("y", y), ("sample_weight", sample_weight), ("mask", mask)):
        array = listed_array(value)
        if array is None and _holds_numbers(value):
            batches_too = ", or a list of (x, y) batches of arrays" if name == "x" else ""
            raise ShapeError(f"{name} is a nested Python list whose rows differ in length, so it is no one array; "
                             f"give an array (sequences of different lengths: pad them with "
                             f"etrace_fit.datasets.pad_sequences){batches_too}")
        converted.append(value if array is None else array)
    return tuple(converted)


def check_not_a_pair(x: Any, call: str) -> None:
    """:class:`ConfigError` for ``x`` given as Keras' ``(x, y)`` or ``(x, y, sample_weight)``
    tuple of arrays (``fit((x, y))``): two or three arrays with one number of samples,
    the later ones with fewer axes than the first (labels, weights), which a list of
    batches of one kind never has. Read as a list of batches, it failed on "batch 0"."""
    if not isinstance(x, (tuple, list)) or not 2 <= len(x) <= 3 or not all(hasattr(a, "shape") for a in x):
        return
    first = np.shape(x[0])
    if len(first) < 2 or any(np.shape(a)[:1] != first[:1] or np.ndim(a) >= len(first) for a in x[1:]):
        return
    shapes = ", ".join(str(tuple(np.shape(a))) for a in x)
    fix = ("pass x alone: predict(x) (y is not read; a list of x batches is read batch by batch)" if call == "predict"
           else f"pass x and y separately: {call}(x, y) (a list of (x, y) batches is read batch by batch)")
    raise ConfigError(f"x is a {type(x).__name__} of arrays ({shapes}), which looks like (x, y"
                      f"{', sample_weight' * (len(x) == 3)}); {fix}")


def check_finite(x: Any, name: str = "x") -> None:
    """Raise :class:`ShapeError` naming the first sample that holds NaN or inf (every
    floating dtype, bfloat16 and float16 included)."""
    values = np.asarray(x)
    if not jnp.issubdtype(values.dtype, jnp.floating) or values.size == 0:
        return
    if not np.issubdtype(values.dtype, np.floating):  # bfloat16 (ml_dtypes): check it as float32
        values = values.astype(np.float32)
    bad = ~np.isfinite(values.reshape(values.shape[0], -1)).all(axis=1) if values.ndim else ~np.isfinite(values)
    if np.any(bad):
        first = int(np.argmax(bad))
        raise ShapeError(f"{name} contains NaN or inf (first in sample {first}); clean the data first")


def check_weights(weights: Any, x: Any, name: str = "sample_weight") -> np.ndarray:
    """``weights`` as an array, after a :class:`ShapeError` unless they are finite
    numbers ``>= 0`` (a NaN weight made its whole batch skip as non-finite; a negative one
    trained by gradient ascent). Keras' ``(N, 1)`` column is taken as ``(N,)`` (one per
    sequence) when batch-major ``x`` has more than one step."""
    values = np.asarray(weights)
    if values.ndim == 2 and values.shape[1] == 1 and np.ndim(x) >= 2 and np.shape(x)[1] != 1:
        values = values[:, 0]
    if values.dtype == bool or not np.issubdtype(values.dtype, np.number):
        raise ShapeError(f"{name} must be numbers, got dtype {values.dtype}")
    check_finite(values.reshape(values.shape[0], -1) if values.ndim else values, name)
    if values.size and values.min() < 0:
        first = int(np.argmax((values.reshape(values.shape[0], -1) < 0).any(axis=1))) if values.ndim else 0
        raise ShapeError(f"{name} must be >= 0, got {values.min():g} (first in sample {first}); a negative weight "
                         f"would train away from the targets")
    return values


def check_step_weights(weights: Any, loss_on: str, name: str = "sample_weight") -> None:
    """:class:`ConfigError` for per-step weights ``(N, T)`` under ``loss_on="last"``,
    which places the loss on the last step alone: every column but the last was ignored
    without a word (a per-step mask there is refused alike)."""
    if loss_on == "last" and np.ndim(weights) == 2:
        raise ConfigError(f"{name} has shape {tuple(np.shape(weights))}, a weight per sequence and step, but "
                          f"loss_on='last' ignores all but the last step's; give one weight per sequence, (N,), "
                          f"or use Trainer(loss_on='all') (every step) or Trainer(loss_on='mask') (the steps a mask "
                          f"marks) to weigh each step")


def check_mask(mask: Any, x: Any, name: str = "mask") -> None:
    """:class:`ShapeError` unless ``mask`` is ``(N, T)`` for ``x (N, T, ...)`` (batch-major)
    and marks steps with True / False (or 1 / 0): before training, so a validation mask is
    not found wrong at the first epoch's end. A mask is no weight: real-valued step weights
    go in ``sample_weight (N, T)``."""
    values = np.asarray(mask)
    expected = tuple(np.shape(x)[:2])
    if values.shape != expected:
        keras = (" (Keras' third element of validation_data, sample weights, is not taken: etrace_fit's is the "
                 "mask of the steps each sequence has)" if name.startswith("validation") and values.ndim == 1 else "")
        raise ShapeError(f"{name} must have shape {expected} (batch, time) for x of shape {tuple(np.shape(x))}, got "
                         f"{values.shape}{keras}")
    if values.dtype != bool and not np.isin(values, (0, 1)).all():
        raise ShapeError(f"{name} marks the steps each sequence has with True / False (or 1 / 0), got values from "
                         f"{values.min():g} to {values.max():g}; weight steps with sample_weight (N, T) instead")
    if values.size and not values.any():  # a loss of 0 and nothing learned, silently
        raise ShapeError(f"{name} marks no step of any sequence as real (all False): there is nothing to train on "
                         f"or measure")
    _warn_if_padded_in_front(values.astype(bool), name)


def _warn_if_padded_in_front(mask: np.ndarray, name: str) -> None:
    """A warning when every sequence's real steps run from some step to the end and the
    sequences start at different steps: padding in front (Keras' ``pad_sequences``
    default). The model runs through every step, so the padded steps' inputs move the
    states the real steps start from (a loss of 0.624 became 0.679 with padding 3.0 in
    place of 0), where padding at the end changes nothing. A loss after the same warm-up
    for every sequence (one start) is no padding and passes."""
    if mask.ndim != 2 or mask.shape[1] < 2 or not mask.any(axis=1).all() or not mask[:, -1].all():
        return
    starts = mask.argmax(axis=1)
    if len(np.unique(starts)) > 1 and (mask.sum(axis=1) == mask.shape[1] - starts).all():
        warnings.warn(
            f"{name}: every sequence's real steps run to the last step, from steps {int(starts.min())} to "
            f"{int(starts.max())}: padding in front? The model runs through every step, so padded steps' inputs "
            f"change the states the real steps start from (and the loss). Pad at the end (etrace_fit's "
            f"pad_sequences does; Keras' pad_sequences(..., padding='post'))", UserWarning, stacklevel=3)


def check_count(value: Any, name: str) -> int:
    """A positive int (``batch_size``, ``steps_per_epoch``), else :class:`ConfigError`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{name} must be a positive int, got {value!r}")
    return int(value)


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
    """Keras' ``validation_split``: the samples after ``floor(N · (1 − fraction))``
    (before any shuffling) become the validation set."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float, np.floating)) or not 0.0 < fraction < 1.0:
        raise ConfigError(f"validation_split must be a number in (0, 1), got {fraction!r}")
    total = _length("x", x)
    cut = int(math.floor(total * (1.0 - fraction)))  # Keras' split point: N = 10, 0.25 holds out 3
    if cut == 0 or cut == total:
        raise ConfigError(f"validation_split={fraction} of {total} samples leaves an empty training or validation set")
    take = (lambda a, s: None if a is None else a[s])
    return (take(x, slice(0, cut)), take(y, slice(0, cut))), (take(x, slice(cut, None)), take(y, slice(cut, None)))


def _array_batches(x, y, batch_size, shuffle, seed, drop_remainder, sample_weight, mask) -> Iterator[Batch]:
    total = _length("x", x)
    if total == 0:
        raise ShapeError("x is empty: no samples to train on")
    if y is not None and _length("y", y) != total:
        # arrays are batch-major here (a time-major trainer swapped them first)
        hint = (f"; x of shape {tuple(np.shape(x))} looks time-major (time={total}, batch={np.shape(x)[1]}, ...): "
                f"pass Trainer(time_major=True), or np.swapaxes(x, 0, 1)"
                if np.ndim(x) >= 2 and np.shape(x)[1] == _length("y", y) else "")
        raise ShapeError(f"x and y have different numbers of samples: x has {total}, y has {_length('y', y)}{hint}")
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


def as_batch(item: Any, position: int, name: str | None = None) -> Batch:
    """Item ``position`` of an iterable of batches as a :class:`Batch` (``name``: the
    data's name in errors, ``validation_data`` say; None: the training data)."""
    if isinstance(item, Batch):
        return item
    if isinstance(item, (tuple, list)) and 1 <= len(item) <= 3:
        return Batch(*item)
    raise ShapeError(f"{batch_name(position, name)} must be (x, y) or (x, y, mask), got {type(item).__name__}"
                     + (f" of length {len(item)}" if isinstance(item, (tuple, list)) else ""))


def batch_name(position: int, name: str | None = None) -> str:
    """``"batch 3"``, or ``"validation_data batch 3"`` for data named ``validation_data``."""
    return f"{name} batch {position}" if name else f"batch {position}"


@contextlib.contextmanager
def named(label: str) -> Iterator[None]:
    """:class:`ShapeError` and :class:`ConfigError` raised in the block with ``label``
    in front (``validation_data batch 0: ...``): a check that names ``x`` or ``y`` then
    says whose."""
    try:
        yield
    except (ShapeError, ConfigError) as error:
        if str(error).startswith(label):
            raise
        raise type(error)(f"{label}: {error}") from None


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
    name: str | None = None,
) -> Iterator[Batch]:
    """Batches of ``x`` (and ``y``), whatever form the data comes in (module docstring).

    ``shuffle`` (``True``, ``False`` or Keras' ``"batch"``: shuffle the order of
    batch-sized chunks only) and ``seed`` apply to arrays and to the batch order of a
    sequence object (Keras' ``Sequence`` / ``PyDataset``: ``__len__`` and
    ``__getitem__``); ``sample_weight`` and ``mask`` (``(N, T)``) to arrays only; lists
    and iterables of batches are read in their own order. Raises :class:`ShapeError` for
    empty data or ``x`` and ``y`` of different lengths, :class:`ConfigError` for a bad
    ``batch_size`` or ``shuffle``.
    """
    batch_size = check_count(batch_size, "batch_size")
    check_shuffle(shuffle)
    if hasattr(x, "shape") and hasattr(x, "__getitem__"):
        yield from _array_batches(x, y, batch_size, shuffle, seed, drop_remainder, sample_weight, mask)
        return
    if y is not None:
        if isinstance(x, Mapping) or (isinstance(x, (tuple, list)) and x and all(hasattr(a, "shape") for a in x)):
            raise ConfigError(f"x is a {type(x).__name__} of arrays (Keras' several or named inputs), which is not "
                              f"taken: the model's step takes one x array (batch, time, features); join the inputs "
                              f"into one, or pass an iterable of (x, y) batches with y=None")
        raise ConfigError("y must be None when x is an iterable or sequence of (x, y) batches")
    if sample_weight is not None:
        raise ConfigError("sample_weight applies to array data; an iterable gives weights inside its batches")
    if hasattr(x, "__len__") and hasattr(x, "__getitem__"):
        if len(x) == 0:
            raise ShapeError("the data sequence is empty: no batches to train on")
        order = range(len(x))
        if shuffle and not isinstance(x, (list, tuple)):
            # a Keras Sequence / PyDataset: its batch order shuffled per epoch, as Keras does (it was
            # read in one order whatever shuffle said); a list of batches keeps its order
            order = np.random.default_rng(seed).permutation(len(x))
        items = (x[int(i)] for i in order)
    else:
        items = iter(x)
    count = 0
    for count, item in enumerate(items, start=1):
        batch = as_batch(item, count - 1, name)
        if batch.y is not None and _length("y", batch.y) != batch.size:
            raise ShapeError(f"{batch_name(count - 1, name)}: x has {batch.size} samples, y has "
                             f"{_length('y', batch.y)}")
        yield batch
    if count == 0:
        raise NoBatches(f"{name or 'the data'} iterable yielded no batches")


class NoBatches(ShapeError):
    """An iterable of batches gave none (``fit`` stops with a warning when an iterator ran
    out after its first epoch, as Keras does)."""


def read_once(data: Any) -> bool:
    """Whether ``data`` is an iterator (a generator, say): iterating it again gives what
    is left, not its batches anew."""
    try:
        return iter(data) is data
    except TypeError:
        return False


# ------------------------------------------------------------------ layouts and weights
def targets_key(ys: Any) -> tuple:
    """What a metric check depends on in the targets ``(T, B, ...)``: one step's shape
    per sample and the dtype."""
    return tuple(np.shape(ys)[2:]), np.result_type(ys).str


def weight_dtype(x: np.ndarray) -> Any:
    """Loss weights in float64 for float64 data (exactness tests), else float32."""
    return np.float64 if x.dtype == np.float64 else np.float32


class Arrays:
    """Batch-major array data: ``x (N, T, ...)``, ``y``, ``mask`` and ``sample_weight``
    (``validation_split``'s held-out weights) or None."""

    def __init__(self, x: Any, y: Any = None, mask: Any = None, sample_weight: Any = None):
        self.x, self.y, self.mask, self.sample_weight = x, y, mask, sample_weight


def batch_major(x: Any, y: Any, weights: Any = None, name: str = "x") -> tuple:
    """Time-major arrays ``x (T, N, ...)``, per-step ``y (T, N, ...)`` or per-sequence
    ``y (N, ...)``, and ``(T, N)`` weights or masks (or ``(N,)``, or Keras' ``(N, 1)``
    column) as batch-major views;
    a ``y`` that fits neither reading is an error saying which layout was assumed."""
    if np.ndim(x) < 3:
        raise ShapeError(f"{name} must be (time, batch, features) with time_major=True, got shape {tuple(np.shape(x))}")
    steps, size = np.shape(x)[:2]
    swap = lambda a: None if a is None else np.swapaxes(np.asarray(a), 0, 1)  # noqa: E731
    if y is not None:
        shape = np.shape(y)
        if len(shape) >= 2 and shape[:2] == (steps, size):
            y = swap(y)
        elif not shape or shape[0] != size:
            hint = " — x looks batch-major: pass time_major=False" if shape and shape[0] == steps else ""
            raise ShapeError(f"time_major=True reads {name} of shape {tuple(np.shape(x))} as (time={steps}, "
                             f"batch={size}, ...), but y has shape {tuple(shape)}; expected ({size}, ...) per "
                             f"sequence or ({steps}, {size}, ...) per step{hint}")
    if weights is not None and np.ndim(weights) == 2:
        # Keras' (N, 1) column is one weight per sequence; (T, N) weights are per step
        keras_column = np.shape(weights) == (size, 1) and size != 1
        weights = np.asarray(weights)[:, 0] if keras_column else swap(weights)
    return swap(x), y, weights


def placement(batch: Batch, loss_on: str, time_major: bool, per_sequence: bool = False, wdtype: Any = None
              ) -> tuple[np.ndarray, Any, np.ndarray]:
    """``(xs (T, B, ...), ys (T, B, ...), weights (T, B))`` for one batch, on the host
    (numpy: no device work per batch before the one jitted step). ``weights`` place the
    loss in time (``loss_on``: ``"last"``, ``"all"`` averaged, ``"mask"`` averaged per
    sequence); float64 for float64 data, else float32. ``per_sequence``: a ``y`` whose
    second axis has ``T`` entries is one target per sequence (the Trainer knows it from
    the loss and the output), not one per step. ``wdtype``: the weights' dtype when the
    model's is wider than the data's (a float64 model fed bool spikes: float64)."""
    x = np.asarray(batch.x)
    tokens = x.ndim == 2 and np.issubdtype(x.dtype, np.integer)  # ids for an Embedding, as in Keras
    if x.ndim < 3 and not tokens:
        raise ShapeError(f"x must be {'(time, batch, features)' if time_major else '(batch, time, features)'}"
                         f" with at least 3 axes, got shape {tuple(x.shape)} ({x.dtype}); only integer ids for "
                         f"an Embedding may come as {'(time, batch)' if time_major else '(batch, time)'}")
    xs = x if time_major else np.swapaxes(x, 0, 1)
    steps, size = xs.shape[0], xs.shape[1]
    if steps == 0:
        raise ShapeError(f"x has no time steps (T = 0, shape {tuple(x.shape)}); a sequence needs at least one step")
    if batch.mask is not None and loss_on != "mask":
        raise ConfigError(f"a mask was given but loss_on={loss_on!r} ignores it; pass loss_on='mask' to place "
                          f"the loss by the mask, or drop the mask (a batch's third item is read as the mask: "
                          f"(x, y, mask); Keras' (x, y, sample_weight) batches are not taken, give sample_weight= "
                          f"with array data)")
    wdtype = weight_dtype(x) if wdtype is None else np.result_type(weight_dtype(x), wdtype).type
    if loss_on == "mask":
        if batch.mask is None:
            raise ShapeError("loss_on='mask' needs (x, y, mask) batches; this batch has no mask")
        mask = np.asarray(batch.mask, wdtype)
        mask = mask if time_major else mask.T
        if mask.shape != (steps, size):
            raise ShapeError(f"mask must have shape {(size, steps)} (batch, time), got {tuple(np.shape(batch.mask))}")
        weight = mask / np.maximum(mask.sum(axis=0, keepdims=True), 1.0)
    elif loss_on == "all":
        weight = np.full((steps, size), 1.0 / steps, wdtype)
    else:
        weight = np.zeros((steps, size), wdtype)
        weight[-1] = 1.0
    y = None if batch.y is None else np.asarray(batch.y)
    if y is None:
        ys = np.zeros((steps, size), np.float32)
    elif not per_sequence and y.ndim >= 2 and y.shape[:2] == ((steps, size) if time_major else (size, steps)):
        ys = y if time_major else np.swapaxes(y, 0, 1)  # per-step targets
    elif y.shape[:1] == (size,):
        ys = np.broadcast_to(y, (steps, *y.shape))  # one target per sequence
    else:
        layout = "(time, batch, ...)" if time_major else "(batch, time, ...)"
        hint = (" x looks batch-major: pass time_major=False" if time_major and y.shape[:1] == (steps,)
                else " x looks time-major: pass time_major=True" if not time_major and y.shape[:1] == (steps,)
                else "")
        raise ShapeError(f"x of shape {tuple(x.shape)} is read as {layout}: {size} sequences of {steps} steps, "
                         f"but y has shape {tuple(y.shape)}; expected ({size}, ...) per sequence or "
                         f"{(steps, size) if time_major else (size, steps)} per step.{hint}")
    return xs, ys, weight.astype(wdtype)


def loss_weight(batch: Batch, ys: np.ndarray, weight: np.ndarray, class_weight: np.ndarray | None,
                time_major: bool) -> np.ndarray:
    """The placement ``weight (T, B)`` times the batch's ``sample_weight`` and the
    class weight of each step's label (what the loss uses; metrics are unweighted,
    as in Keras)."""
    steps, size = weight.shape
    wdtype = weight.dtype
    if batch.sample_weight is None and class_weight is None:
        return weight  # the same array: the step then places the metrics with it too
    if batch.sample_weight is not None:
        sample_weight = np.asarray(batch.sample_weight, wdtype)
        if sample_weight.shape == (size,):
            weight = weight * sample_weight[None, :]
        elif sample_weight.shape == ((steps, size) if time_major else (size, steps)):
            weight = weight * (sample_weight if time_major else sample_weight.T)
        else:
            raise ShapeError(f"sample_weight must have shape ({size},) (one per sequence) or "
                             f"{(steps, size) if time_major else (size, steps)} (per step), got "
                             f"{tuple(sample_weight.shape)}")
    if class_weight is not None:
        labels = np.asarray(ys)
        # one-hot rows (a trailing class axis beyond one label per step and sequence), of any dtype:
        # integer one-hot was read as labels and failed in a reshape
        extra_axis = labels.ndim >= 1 and labels.size != steps * size and labels.size == steps * size * labels.shape[-1]
        if np.issubdtype(labels.dtype, np.floating) or extra_axis:
            labels = np.argmax(labels, axis=-1)
        weight = weight * class_weight[np.asarray(labels, np.int64).reshape(steps, size)]
    return weight.astype(wdtype)


def _one_hot(labels: np.ndarray) -> bool:
    """Whether ``labels`` are one-hot rows (0 / 1, one 1 per row, on the last axis; float or
    integer)."""
    if labels.ndim < 2 or not np.issubdtype(labels.dtype, np.number) or labels.shape[-1] < 2:
        return False
    return bool(np.isin(labels, (0.0, 1.0)).all() and (labels.sum(axis=-1) == 1).all())


def class_table(class_weight: Mapping[int, float], y: Any) -> np.ndarray:
    """``class_weight`` as a lookup table over the labels' range (1 where not named)."""
    if not isinstance(class_weight, Mapping) or not class_weight:
        raise ConfigError(f"class_weight must be a non-empty dict {{class: weight}}, got {class_weight!r}")
    labels = np.asarray(y) if y is not None else None
    if labels is not None and _one_hot(labels):  # Keras takes class_weight with one-hot targets too
        labels = np.concatenate([np.argmax(labels, axis=-1).ravel(), [labels.shape[-1] - 1]])
    if labels is None or not np.issubdtype(labels.dtype, np.integer):
        raise ConfigError("class_weight needs class labels y: integers, or one-hot rows")
    for key, value in class_weight.items():
        if not isinstance(key, (int, np.integer)) or isinstance(key, bool) or key < 0:
            raise ConfigError(f"class_weight keys must be class indices (ints >= 0), got {key!r}")
        if not isinstance(value, (int, float, np.number)) or not value >= 0:
            raise ConfigError(f"class_weight[{key}] must be a number >= 0, got {value!r}")
    # float64: loss_weight casts to the loss weights' dtype (0.3 rounded to float32 was 1e-8 off a float64 model)
    table = np.ones(max(int(labels.max(initial=0)), *class_weight) + 1, np.float64)
    for key, value in class_weight.items():
        table[key] = value
    return table

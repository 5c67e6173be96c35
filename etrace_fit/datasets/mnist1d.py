# The generator in this file (get_templates, the transforms, make_dataset) is vendored
# from MNIST-1D: https://github.com/greydanus/mnist1d
#   mnist1d/data.py       get_dataset_args, get_templates, make_dataset
#   mnist1d/transform.py  pad, shear, translate, corr_noise_like, iid_noise_like,
#                         interpolate, transform
#   mnist1d/utils.py      set_seed
# at commit 7878d96082abd200c546a07a4101fa90b30fdf7e (2024-10-09).
#
# The upstream files carry these notices, retained here:
#   data.py:                  "The MNIST-1D dataset | 2020 / Sam Greydanus"
#   transform.py, utils.py:   "The MNIST-1D dataset | 2024 / Sam Greydanus, Peter Steinbach"
# Copyright 2020-2024 Sam Greydanus, Peter Steinbach (as the upstream file headers name
# them; upstream's LICENSE file leaves the appendix's copyright line unfilled).
#
# Licensed under the Apache License, Version 2.0 (the "License"; its text is in
# licenses/mnist1d-Apache-2.0.txt at the repository's root);
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
#
# Changed from the original by the etrace_fit authors (Apache-2.0, section 4(b)):
# - the random numbers come from a private np.random.RandomState(seed) passed to every
#   transform instead of the global np.random.seed(seed) state (and random.seed(seed),
#   which the generator never draws from): the same Mersenne Twister stream, the same
#   calls in the same order, so the same arrays, but the caller's global random state is
#   left alone;
# - arguments are a validated dict instead of an ObjectView; no download, no pickle (the
#   original's get_dataset downloads or writes a pickle; load_mnist1d generates and
#   caches in .npz instead); plotting and the pickle helpers are not vendored;
# - make_dataset and the transforms are renamed private (_make_dataset, _pad, ..., _transform),
#   take that rng, read args["name"] instead of args.name, and import scipy lazily;
# - mnist1d_args, make_mnist1d and load_mnist1d are new wrappers.
"""MNIST-1D (Greydanus & Kobak, "Scaling Down Deep Learning with MNIST-1D", ICML 2024),
generated offline, exactly as the original code generates it.

Ten hand-made templates of length 12, one per digit, are padded, stretched, scaled,
shifted, given correlated and iid noise, sheared and resampled to 40 steps; the whole
set is standardised (mean 0, std 1). With the defaults (:func:`mnist1d_args`) that is
5000 samples, 4000 train and 1000 test, seed 42: the same arrays as upstream's
``make_dataset`` (and the published ``mnist1d_data.pkl``, to within an ulp).
:func:`make_mnist1d` returns the original's dictionary; :func:`load_mnist1d` one split
as ``x (N, 40, 1)`` float32, ``y (N,)`` int32, cached in ``.npz``.
"""

from __future__ import annotations

import numbers
import os
import pathlib
from typing import Any

import numpy as np

from ..errors import ConfigError
from .events import cache_file, cached

__all__ = ["load_mnist1d", "make_mnist1d", "mnist1d_args"]

UPSTREAM = "greydanus/mnist1d@7878d96082abd200c546a07a4101fa90b30fdf7e"

# The original's get_dataset_args(), in its order, without 'url' (the pickle's address:
# nothing here downloads).
_DEFAULTS: dict[str, Any] = {
    "num_samples": 5000,
    "train_split": 0.8,
    "template_len": 12,
    "padding": [36, 60],
    "scale_coeff": 0.4,
    "max_translation": 48,
    "corr_noise_scale": 0.25,
    "iid_noise_scale": 2e-2,
    "shear_scale": 0.75,
    "shuffle_seq": False,
    "final_seq_length": 40,
    "seed": 42,
}
_IGNORED = {"url"}  # accepted so the original's get_dataset_args(as_dict=True) can be passed as is
_MINIMUM = {"num_samples": 10, "template_len": 1, "max_translation": 1, "final_seq_length": 1, "seed": 0}
_REALS = ("train_split", "scale_coeff", "corr_noise_scale", "iid_noise_scale", "shear_scale")


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def mnist1d_args(**overrides: Any) -> dict[str, Any]:
    """The original MNIST-1D arguments, with ``overrides`` applied and checked.

    The defaults are upstream's ``get_dataset_args()``: ``num_samples=5000``,
    ``train_split=0.8``, ``template_len=12``, ``padding=[36, 60]``, ``scale_coeff=0.4``,
    ``max_translation=48``, ``corr_noise_scale=0.25``, ``iid_noise_scale=0.02``,
    ``shear_scale=0.75``, ``shuffle_seq=False``, ``final_seq_length=40``, ``seed=42``.
    Upstream's ``url`` (the address of its pickle) is accepted and dropped.

    Every class gets ``num_samples // 10`` samples, and the first
    ``int(N * train_split)`` of the shuffled ``N`` are the training set.

    Raises:
        ConfigError: an unknown argument, or a value of the wrong type or range.
    """
    unknown = sorted(set(overrides) - set(_DEFAULTS) - _IGNORED)
    if unknown:
        raise ConfigError(f"mnist1d_args: unknown argument(s) {unknown}; the arguments are {list(_DEFAULTS)}")
    args = {name: overrides.get(name, default) for name, default in _DEFAULTS.items()}
    for name, minimum in _MINIMUM.items():
        value = args[name]
        if not _is_int(value) or value < minimum or (name == "seed" and value >= 2**32):
            upper = " and < 2**32" if name == "seed" else ""
            raise ConfigError(f"mnist1d_args: {name} must be an int >= {minimum}{upper}, got {value!r}")
        args[name] = int(value)
    for name in _REALS:
        value = args[name]
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value):
            raise ConfigError(f"mnist1d_args: {name} must be a finite number, got {value!r}")
        args[name] = float(value)
    if not 0.0 <= args["train_split"] <= 1.0:
        raise ConfigError(f"mnist1d_args: train_split must be in [0, 1], got {args['train_split']!r}")
    padding = args["padding"]
    if (not isinstance(padding, (list, tuple)) or len(padding) != 2 or not all(_is_int(p) for p in padding)
            or not 0 <= padding[0] <= padding[1]):
        raise ConfigError(f"mnist1d_args: padding must be two ints [low, high] with 0 <= low <= high, "
                          f"got {padding!r}")
    args["padding"] = [int(p) for p in padding]
    if not isinstance(args["shuffle_seq"], (bool, np.bool_)):
        raise ConfigError(f"mnist1d_args: shuffle_seq must be True or False, got {args['shuffle_seq']!r}")
    args["shuffle_seq"] = bool(args["shuffle_seq"])
    return args


# ---------------------------------------------------------------- vendored: data.py
# (the generator's code is kept as upstream wrote it, spacing included)
# basic 1D templates for the 10 digits
def get_templates() -> dict[str, np.ndarray]:
    d0 = np.asarray([5,6,6.5,6.75,7,7,7,7,6.75,6.5,6,5])
    d1 = np.asarray([5,3,3,3.4,3.8,4.2,4.6,5,5.4,5.8,5,5])
    d2 = np.asarray([5,6,6.5,6.5,6,5.25,4.75,4,3.5,3.5,4,5])
    d3 = np.asarray([5,6,6.5,6.5,6,5,5,6,6.5,6.5,6,5])
    d4 = np.asarray([5,4.4,3.8,3.2,2.6,2.6,5,5,5,5,5,5])
    d5 = np.asarray([5,3,3,3,3,5,6,6.5,6.5,6,4.5,5])
    d6 = np.asarray([5,4,3.5,3.25,3,3,3,3,3.25,3.5,4,5])
    d7 = np.asarray([5,7,7,6.6,6.2,5.8,5.4,5,4.6,4.2,5,5])
    d8 = np.asarray([5,4,3.5,3.5,4,5,5,4,3.5,3.5,4,5])
    d9 = np.asarray([5,4,3.5,3.5,4,5,5,5,5,4.7,4.3,5])

    x = np.stack([d0,d1,d2,d3,d4,d5,d6,d7,d8,d9])
    x -= x.mean(1,keepdims=True) # whiten
    x /= x.std(1,keepdims=True)
    x -= x[:,:1]  # signal starts and ends at 0

    templates = {'x': x/6., 't': np.linspace(-5, 5, len(d0))/6.,
                 'y': np.asarray([0,1,2,3,4,5,6,7,8,9])}
    return templates


def _make_dataset(args: dict[str, Any]) -> dict[str, Any]:
    """Upstream's ``make_dataset(args)`` with its default templates; ``rng`` replaces
    the global state ``set_seed(args.seed)`` seeds (the same stream)."""
    templates = get_templates()
    rng = np.random.RandomState(args["seed"])  # reproducibility (upstream: set_seed(args.seed))

    xs, ys = [], []
    samples_per_class = args["num_samples"] // len(templates['y'])
    for label_ix in range(len(templates['y'])):
        for example_ix in range(samples_per_class):
            x = templates['x'][label_ix]
            t = templates['t']
            y = templates['y'][label_ix]
            x, new_t = _transform(x, t, args, rng) # new_t transformation is same each time
            xs.append(x) ; ys.append(y)

    batch_shuffle = rng.permutation(len(ys)) # shuffle batch dimension
    xs = np.stack(xs)[batch_shuffle]
    ys = np.stack(ys)[batch_shuffle]

    if args["shuffle_seq"]: # maybe shuffle the spatial dimension
        seq_shuffle = rng.permutation(args["final_seq_length"])
        xs = xs[...,seq_shuffle]

    new_t = new_t/xs.std()
    xs = (xs-xs.mean())/xs.std() # center the dataset & set standard deviation to 1

    # train / test split
    split_ix = int(len(ys)*args["train_split"])
    dataset = {'x': xs[:split_ix], 'x_test': xs[split_ix:],
               'y': ys[:split_ix], 'y_test': ys[split_ix:],
               't':new_t, 'templates': templates}
    return dataset


# ----------------------------------------------------------- vendored: transform.py
# transformations of the templates which will make them harder to classify
def _pad(x, padding, rng):
    """pad signal x with random number of zeros. Note, the signal is only padded at
    indices given by the interval in padding"""
    low, high = padding
    p = low + int(rng.rand() * (high - low + 1))
    if len(x.shape) == 1:
        return np.concatenate([x, np.zeros((p))])
    else:
        padding = np.zeros((x.shape[0], p))
        return np.concatenate([x, padding], axis=-1)


def _shear(x, scale, rng):
    coeff = scale * (rng.rand() - 0.5)
    return x - coeff * np.linspace(-0.5, 0.5, len(x))


def _translate(x, max_translation, rng):
    k = rng.choice(max_translation)
    return np.concatenate([x[-k:], x[:-k]])


def _corr_noise_like(x, scale, rng):
    from scipy.ndimage import gaussian_filter

    noise = scale * rng.randn(*x.shape)
    return gaussian_filter(noise, 2)


def _iid_noise_like(x, scale, rng):
    noise = scale * rng.randn(*x.shape)
    return noise


def _interpolate(x, N):
    from scipy.interpolate import interp1d

    scale = np.linspace(0, 1, len(x))
    new_scale = np.linspace(0, 1, N)
    new_x = interp1d(scale, x, axis=0, kind="linear")(new_scale)
    return new_x


def _transform(x, y, args, rng, eps=1e-8):
    new_x = _pad(x + eps, args["padding"], rng)  # pad
    new_x = _interpolate(new_x, args["template_len"] + args["padding"][-1])  # dilate
    new_y = _interpolate(y, args["template_len"] + args["padding"][-1])
    new_x *= 1 + args["scale_coeff"] * (rng.rand() - 0.5)  # scale
    new_x = _translate(new_x, args["max_translation"], rng)  # translate

    # add noise
    mask = new_x != 0
    new_x = mask * new_x + (1 - mask) * _corr_noise_like(new_x, args["corr_noise_scale"], rng)
    new_x = new_x + _iid_noise_like(new_x, args["iid_noise_scale"], rng)

    # shear and interpolate
    new_x = _shear(new_x, args["shear_scale"], rng)
    new_x = _interpolate(new_x, args["final_seq_length"])  # subsample
    new_y = _interpolate(new_y, args["final_seq_length"])
    return new_x, new_y


# ------------------------------------------------------------------ wrappers
def make_mnist1d(**args: Any) -> dict[str, Any]:
    """Generate MNIST-1D as upstream's ``make_dataset`` does: the same arrays for the
    same arguments.

    Args:
        **args: overrides of :func:`mnist1d_args` (e.g. ``num_samples=500``, ``seed=0``).

    Returns:
        A dict, as upstream: ``x (N_train, final_seq_length)`` and ``x_test`` float64,
        standardised over the whole set; ``y (N_train,)`` and ``y_test`` int64 labels
        0..9; ``t (final_seq_length,)`` the time grid; ``templates`` a dict of the ten
        templates ``x (10, 12)``, their grid ``t (12,)`` and labels ``y (10,)``. With the
        defaults ``N_train = 4000`` and ``N_test = 1000``.

    The global ``np.random`` and ``random`` states are not touched: the samples come from
    a private ``np.random.RandomState(seed)``, the stream upstream's
    ``np.random.seed(seed)`` gives. Needs scipy (a dependency of jax).

    Example::

        data = make_mnist1d(num_samples=500)
        data["x"].shape, data["x_test"].shape    # (400, 40), (100, 40)
    """
    return _make_dataset(mnist1d_args(**args))


def default_root() -> pathlib.Path:
    """``$XDG_CACHE_HOME/etrace_fit/mnist1d``, or ``~/.cache/etrace_fit/mnist1d``."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    folder = pathlib.Path(base) if base and os.path.isabs(base) else pathlib.Path.home() / ".cache"
    return folder / "etrace_fit" / "mnist1d"


def _check_split_not_empty(split: str, args: dict[str, Any]) -> None:
    """Raise :class:`ConfigError` when ``train_split`` leaves ``split`` without samples:
    upstream splits ``N = 10 * (num_samples // 10)`` samples at ``int(N * train_split)``."""
    total = 10 * (args["num_samples"] // 10)
    train = int(total * args["train_split"])
    if (train if split == "train" else total - train) > 0:
        return
    if split == "train":
        lowest = 1 / total
        while int(total * lowest) < 1:  # 1 / N itself can round below one sample (N = 850)
            lowest = float(np.nextafter(lowest, 1.0))
        valid = f"train_split in [{lowest!r}, 1]"
    else:
        valid = "train_split in [0, 1)"
    raise ConfigError(f"load_mnist1d: train_split={args['train_split']!r} with num_samples={args['num_samples']} "
                      f"leaves the {split!r} split empty (int({total} * {args['train_split']!r}) = {train} of {total} "
                      f"samples train, {total - train} test); for a non-empty {split!r} split give {valid}")


def _arrays(args: dict[str, Any]) -> dict[str, np.ndarray]:
    data = make_mnist1d(**args)
    return {name: data[name] for name in ("x", "y", "x_test", "y_test", "t")}


def load_mnist1d(
    split: str = "train",
    *,
    cache: bool = True,
    root: str | os.PathLike | None = None,
    sequence: bool = True,
    **args: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """One split of MNIST-1D, generated (no download) and cached.

    Args:
        split: ``"train"`` (the first ``int(N * train_split)`` samples) or ``"test"``.
        cache: keep the generated arrays (both splits, float64 as generated) in
            ``root/mnist1d_<hash of the arguments>.npz`` and read them from there next
            time; another argument, another file. ``False`` generates every time.
        root: the cache folder; default ``$XDG_CACHE_HOME/etrace_fit/mnist1d`` or
            ``~/.cache/etrace_fit/mnist1d``.
        sequence: ``x`` as ``(N, 40, 1)`` — one feature per time step, the batch-major
            form the recurrent models read — or, with ``False``, ``(N, 40)``.
        **args: overrides of :func:`mnist1d_args` (``num_samples``, ``seed``, ...).

    Returns:
        ``x`` float32 ``(N, final_seq_length, 1)`` or ``(N, final_seq_length)`` and ``y``
        int32 ``(N,)`` labels 0..9: :func:`make_mnist1d`'s arrays of that split.

    Raises:
        ConfigError: a ``split`` other than ``"train"`` / ``"test"``, a bad argument,
            or a ``train_split`` that leaves the split asked for empty (``0`` for
            ``"train"``, ``1`` for ``"test"``; the message gives the valid range).

    Example::

        x, y = load_mnist1d("train")              # (4000, 40, 1), (4000,)
        x_test, y_test = load_mnist1d("test")     # (1000, 40, 1), (1000,)
    """
    if split not in ("train", "test"):
        raise ConfigError(f"load_mnist1d: split must be 'train' or 'test', got {split!r}")
    if not isinstance(cache, (bool, np.bool_)):
        raise ConfigError(f"load_mnist1d: cache must be True or False (the folder is root=...), got {cache!r}")
    args = mnist1d_args(**args)
    _check_split_not_empty(split, args)
    if cache:
        key = {"dataset": "mnist1d", "generator": UPSTREAM, **args}
        folder = pathlib.Path(root) if root is not None else default_root()
        arrays = cached(cache_file(folder, "mnist1d", key), lambda: _arrays(args), key=key)
    else:
        arrays = _arrays(args)
    x, y = (arrays["x"], arrays["y"]) if split == "train" else (arrays["x_test"], arrays["y_test"])
    x = x.astype(np.float32)
    return (x[..., None] if sequence else x), y.astype(np.int32)

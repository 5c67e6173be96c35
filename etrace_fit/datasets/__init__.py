"""Built-in tasks: synthetic generators (no download) and readers of the published
neuromorphic datasets, from their original files, offline.

Synthetic: :func:`evidence_accumulation`, :func:`rate_discrimination`, :func:`copy_task`. Readers, each
returning batch-major ``x (N, T, ...)`` float32 event counts and ``y (N,)`` labels
(and a ``(N, T)`` mask with ``variable_length=True``): :func:`load_shd` /
:func:`load_ssc` (HDF5, needs h5py: ``pip install "etrace-fit[datasets]"``),
:func:`load_nmnist` (``.bin``), :func:`load_dvs_gesture` (AEDAT 3.1). Building blocks:
:func:`bin_events`, :func:`bin_samples`, :func:`pad_sequences`, :func:`cached`,
:func:`download`. MNIST-1D (Greydanus & Kobak), generated offline exactly as the
original code does: :func:`load_mnist1d` (``x (N, 40, 1)``, cached),
:func:`make_mnist1d`, :func:`mnist1d_args`. Read docs/datasets.md next.
"""

from .download import download
from .dvs_gesture import load_dvs_gesture, read_aedat31
from .events import bin_events, bin_samples, cached, pad_sequences
from .evidence import evidence_accumulation
from .mnist1d import load_mnist1d, make_mnist1d, mnist1d_args
from .nmnist import load_nmnist, read_nmnist_events
from .shd import load_shd, load_ssc
from .sequence_tasks import copy_task
from .synthetic import rate_discrimination

__all__ = [
    "bin_events",
    "bin_samples",
    "cached",
    "copy_task",
    "download",
    "evidence_accumulation",
    "load_dvs_gesture",
    "load_mnist1d",
    "load_nmnist",
    "load_shd",
    "load_ssc",
    "make_mnist1d",
    "mnist1d_args",
    "pad_sequences",
    "rate_discrimination",
    "read_aedat31",
    "read_nmnist_events",
]

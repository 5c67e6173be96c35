"""Checkpoint files: no pickle, atomic writes, loud failures, nothing unchecked.

A checkpoint is one file: a magic line; a header line (JSON: format version, the byte
lengths of the manifest and of the payload, and one SHA-256 over both); the manifest
(JSON: package version, the model's parameter fingerprint, epoch, history, callback
state, configuration); then the payload serialised with ``flax.serialization``
(msgpack). The checksum covers the manifest and the payload together, so an edited
epoch or a flipped bit anywhere is refused. The file is written to a temporary file in
the same folder (prefix :data:`TEMP_PREFIX`), flushed and fsynced, then renamed over
the target, so a crash leaves the old file or the new one, never a torn one. Every
problem found on reading is a :class:`CheckpointError` saying what is wrong.
Format 1 files (before 0.3: the checksum covered the payload only) are still read,
with a warning.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import tempfile
import warnings
from typing import Any

import jax
import numpy as np
from flax import serialization

from .compiler import format_path
from .errors import CheckpointError

__all__ = ["FORMAT_VERSION", "TEMP_PREFIX", "check_fingerprint", "fingerprint", "read_checkpoint", "remove_temporaries",
           "write_checkpoint"]

FORMAT_VERSION = 2
_MAGIC = b"ETRACE-FIT-CHECKPOINT\n"
#: Temporary files of an unfinished write start with this; a killed write leaves one behind.
TEMP_PREFIX = ".tmp-etrace-"


def fingerprint(params: dict) -> list[list]:
    """``[[path, [[leaf shape], dtype], ...]]`` for a ``{path: value}`` dict of parameters."""
    rows = []
    for path in sorted(params, key=format_path):
        leaves = [[list(np.shape(leaf)), str(np.asarray(leaf).dtype)] for leaf in jax.tree.leaves(params[path])]
        rows.append([format_path(path), leaves])
    return rows


def write_checkpoint(path: str | os.PathLike, state: dict[str, Any], *, params_fingerprint: list, extra: dict | None = None
                     ) -> None:
    """Write ``state`` (a pytree of arrays, numbers, strings, dicts) atomically to ``path``."""
    from . import __version__

    path = os.fspath(path)
    if not path:
        raise CheckpointError("the checkpoint path is empty: give a file name, e.g. 'runs/run.ckpt'")
    if os.path.isdir(path) or path.endswith(("/", os.sep)):
        raise CheckpointError(f"{path} is a folder: give the checkpoint a file name in it")
    parent = os.path.dirname(os.path.abspath(path))
    blocking = next((p for p in _ancestors(parent) if os.path.exists(p) and not os.path.isdir(p)), None)
    if blocking is not None:
        raise CheckpointError(f"{path}: {blocking} is a file, so the checkpoint's folder cannot be made there")
    payload = serialization.msgpack_serialize(serialization.to_state_dict(jax.tree.map(np.asarray, state)))
    manifest = json.dumps({"package_version": __version__, "fingerprint": params_fingerprint, **(extra or {})},
                          sort_keys=True, allow_nan=True).encode()
    header = {"format_version": FORMAT_VERSION, "manifest_bytes": len(manifest), "payload_bytes": len(payload),
              "sha256": hashlib.sha256(manifest + payload).hexdigest()}
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=folder)
    except OSError as error:  # a read-only or full disk: name the checkpoint, not our temporary file
        raise CheckpointError(f"cannot write checkpoint {path}: {error.strerror or error}") from error
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(_MAGIC)
            file.write(json.dumps(header, sort_keys=True).encode() + b"\n")
            file.write(manifest)
            file.write(payload)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        if os.path.exists(temporary):
            os.remove(temporary)
        if isinstance(error, OSError):
            raise CheckpointError(f"cannot write checkpoint {path}: {error.strerror or error}") from error
        raise
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _ancestors(folder: str) -> list[str]:
    """``folder`` and every folder above it."""
    found = [folder]
    while os.path.dirname(found[-1]) != found[-1]:
        found.append(os.path.dirname(found[-1]))
    return found


def remove_temporaries(folder: str | os.PathLike) -> list[str]:
    """Delete the temporary files a killed write left in ``folder``; returns their paths."""
    removed = []
    for leftover in glob.glob(os.path.join(glob.escape(os.fspath(folder)), TEMP_PREFIX + "*")):
        try:
            os.remove(leftover)
            removed.append(leftover)
        except OSError:
            pass
    return removed


def read_checkpoint(path: str | os.PathLike, *, params_fingerprint: list | None = None) -> tuple[dict, dict]:
    """``(manifest, state)`` from ``path``; :class:`CheckpointError` if the file is missing,
    truncated, corrupted anywhere (header, manifest or payload), of an unknown format
    version, or made for another model."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as error:
        raise CheckpointError(f"cannot read checkpoint {path}: {error.strerror}") from error
    if not data.startswith(_MAGIC):
        raise CheckpointError(f"{path} is not an etrace_fit checkpoint (bad header)")
    line, _, rest = data[len(_MAGIC):].partition(b"\n")
    try:
        header = json.loads(line)
        if not isinstance(header, dict):
            raise ValueError("not a JSON object")
    except ValueError as error:
        raise CheckpointError(f"{path}: the header is corrupted ({error})") from error
    version = header.get("format_version")
    if version == 1:
        manifest, payload = _format_1(path, header, rest)
    elif version == FORMAT_VERSION:
        manifest, payload = _format_2(path, header, rest)
    else:
        raise CheckpointError(f"{path}: format version {version!r} is not one this etrace_fit reads "
                              f"(1 or {FORMAT_VERSION}); was it written by a newer version?")
    if params_fingerprint is not None and manifest.get("fingerprint") != params_fingerprint:
        check_fingerprint(path, manifest, params_fingerprint)
    try:
        state = serialization.msgpack_restore(payload)
    except Exception as error:  # msgpack raises several types for bad bytes
        raise CheckpointError(f"{path}: the payload cannot be decoded ({error})") from error
    return manifest, state


def check_fingerprint(path: Any, manifest: dict, current: list, cast: bool = False) -> None:
    """A :class:`CheckpointError` naming the parameters whose saved shapes or dtypes differ
    from ``current``'s; ``cast``: floating dtypes may differ (the caller casts, as Keras'
    ``load_weights`` does), and without it a difference in them alone says so."""
    saved = manifest.get("fingerprint") or []
    if saved == current:
        return
    floats_only = _without_float_dtypes(saved) == _without_float_dtypes(current)
    if cast and floats_only:
        return
    hint = ("\nOnly floating dtypes differ (a model built at another precision): trainer.load_weights(path) casts "
            "the weights, as Keras' does; the optimizer state is the saved precision's" if floats_only else "")
    raise CheckpointError(f"{os.fspath(path)} was saved from a model of another structure:\n"
                          + _mismatch(saved, current) + hint)


def _without_float_dtypes(rows: list) -> list:
    return [[name, [[shape, "float" if np.dtype(dtype).kind == "f" else dtype] for shape, dtype in leaves]]
            for name, leaves in rows]


def _format_2(path: str, header: dict, rest: bytes) -> tuple[dict, bytes]:
    sizes = header.get("manifest_bytes"), header.get("payload_bytes")
    if not all(isinstance(n, int) and n >= 0 for n in sizes) or sum(sizes) != len(rest):
        raise CheckpointError(f"{path} is truncated or corrupted: {len(rest)} bytes after the header, the header "
                              f"says {sizes[0]!r} + {sizes[1]!r}")
    if hashlib.sha256(rest).hexdigest() != header.get("sha256"):
        raise CheckpointError(f"{path} is corrupted: the checksum of its manifest and payload does not match")
    try:
        manifest = json.loads(rest[:sizes[0]])
        if not isinstance(manifest, dict):
            raise ValueError("not a JSON object")
    except ValueError as error:  # a checksummed manifest that is not JSON: written by something else
        raise CheckpointError(f"{path}: the manifest is not valid ({error})") from error
    return manifest, rest[sizes[0]:]


def _format_1(path: str, manifest: dict, payload: bytes) -> tuple[dict, bytes]:
    """Before 0.3 the header line was the manifest and the checksum covered the payload."""
    if len(payload) != manifest.get("payload_bytes"):
        raise CheckpointError(f"{path} is truncated: {len(payload)} of {manifest.get('payload_bytes')} payload bytes")
    if hashlib.sha256(payload).hexdigest() != manifest.get("payload_sha256"):
        raise CheckpointError(f"{path} is corrupted: the payload's checksum does not match")
    warnings.warn(f"{path} is a format 1 checkpoint (etrace_fit < 0.3): its manifest (epoch, history) is not "
                  "checksummed; save it again to upgrade", UserWarning, stacklevel=3)
    return manifest, payload


def _mismatch(saved: list, current: list) -> str:
    saved_map, current_map = {p: l for p, l in saved}, {p: l for p, l in current}
    lines = []
    for name in sorted(set(saved_map) | set(current_map)):
        a, b = saved_map.get(name), current_map.get(name)
        if a != b:
            lines.append(f"  {name}: checkpoint {a if a is not None else 'absent'}, model {b if b is not None else 'absent'}")
    return "\n".join(lines)

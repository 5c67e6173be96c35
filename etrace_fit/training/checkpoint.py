"""Checkpoint files: no pickle, atomic writes, loud failures.

A checkpoint is one file: a magic line, a JSON manifest line (format version, package
version, the model's parameter fingerprint, the payload's length and SHA-256), then the
payload serialised with ``flax.serialization`` (msgpack). It is written to a temporary
file in the same folder, flushed and fsynced, then renamed over the target, so a crash
leaves the old file or the new one, never a torn one. Loading checks the magic, the
length, the checksum and the fingerprint, and raises :class:`CheckpointError` saying
what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any

import jax
import numpy as np
from flax import serialization

from ..compiler import format_path
from ..errors import CheckpointError

__all__ = ["FORMAT_VERSION", "fingerprint", "read_checkpoint", "write_checkpoint"]

FORMAT_VERSION = 1
_MAGIC = b"ETRACE-FIT-CHECKPOINT\n"


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
    from .. import __version__

    path = os.fspath(path)
    payload = serialization.msgpack_serialize(serialization.to_state_dict(jax.tree.map(np.asarray, state)))
    manifest = {
        "format_version": FORMAT_VERSION,
        "package_version": __version__,
        "fingerprint": params_fingerprint,
        "payload_bytes": len(payload),
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
        **(extra or {}),
    }
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(_MAGIC)
            file.write(json.dumps(manifest, sort_keys=True).encode() + b"\n")
            file.write(payload)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def read_checkpoint(path: str | os.PathLike, *, params_fingerprint: list | None = None) -> tuple[dict, dict]:
    """``(manifest, state)`` from ``path``; :class:`CheckpointError` if the file is missing,
    truncated, corrupted, of another format version, or made for another model."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as error:
        raise CheckpointError(f"cannot read checkpoint {path}: {error.strerror}") from error
    if not data.startswith(_MAGIC):
        raise CheckpointError(f"{path} is not an etrace_fit checkpoint (bad header)")
    rest = data[len(_MAGIC):]
    line, _, payload = rest.partition(b"\n")
    try:
        manifest = json.loads(line)
    except ValueError as error:
        raise CheckpointError(f"{path}: the manifest is corrupted ({error})") from error
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: format version {manifest.get('format_version')} is not {FORMAT_VERSION}")
    if len(payload) != manifest.get("payload_bytes"):
        raise CheckpointError(f"{path} is truncated: {len(payload)} of {manifest.get('payload_bytes')} payload bytes")
    if hashlib.sha256(payload).hexdigest() != manifest.get("payload_sha256"):
        raise CheckpointError(f"{path} is corrupted: the payload's checksum does not match")
    if params_fingerprint is not None and manifest.get("fingerprint") != params_fingerprint:
        raise CheckpointError(f"{path} was saved from a model of another structure:\n"
                              + _mismatch(manifest.get("fingerprint") or [], params_fingerprint))
    try:
        state = serialization.msgpack_restore(payload)
    except Exception as error:  # msgpack raises several types for bad bytes
        raise CheckpointError(f"{path}: the payload cannot be decoded ({error})") from error
    return manifest, state


def _mismatch(saved: list, current: list) -> str:
    saved_map, current_map = {p: l for p, l in saved}, {p: l for p, l in current}
    lines = []
    for name in sorted(set(saved_map) | set(current_map)):
        a, b = saved_map.get(name), current_map.get(name)
        if a != b:
            lines.append(f"  {name}: checkpoint {a if a is not None else 'absent'}, model {b if b is not None else 'absent'}")
    return "\n".join(lines)

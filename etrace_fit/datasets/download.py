"""Fetch one published data file with the standard library: checksum, gunzip, atomic.

Used by ``load_shd(..., download=True)`` (and :func:`gunzip` for a ``.gz`` downloaded by
hand); the other readers expect their files on disk (docs/datasets.md says where to get
them).
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import pathlib
import shutil
import tempfile
import urllib.error
import urllib.request

from ..errors import DataError

__all__ = ["download", "gunzip"]

_CHUNK = 1 << 20


def _fetch(url: str, stream, timeout: float) -> str:
    """Copy ``url``'s body into ``stream``; the sha256 of what came. Raises OSError for
    a connection that fails or ends before its announced Content-Length."""
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=timeout) as response:
        announced = response.headers.get("Content-Length")
        received = 0
        while chunk := response.read(_CHUNK):
            digest.update(chunk)
            stream.write(chunk)
            received += len(chunk)
    if announced is not None and received != int(announced):
        raise ConnectionError(f"the connection closed after {received} of {announced} bytes")
    return digest.hexdigest()


def download(url: str, dest: str | os.PathLike, sha256: str | None = None, *, timeout: float = 30) -> pathlib.Path:
    """Download ``url`` to the file ``dest`` (its folder is created); returns ``dest``.

    The body goes to a temporary file in ``dest``'s folder and is renamed onto
    ``dest`` only once complete (``os.replace``), so ``dest`` never holds half a file.
    ``sha256`` (hex), when given, is checked on the downloaded bytes. A ``.gz`` URL
    saved under a name without ``.gz`` is unpacked on the way (``shd_train.h5.gz`` →
    ``shd_train.h5``).

    Raises:
        OSError: the connection failed, timed out (``timeout`` seconds) or ended early;
            the message names the URL and where to save the file by hand.
        DataError: the checksum does not match (expected and got are named) or the
            ``.gz`` is corrupt. ``dest`` is not created and the temporary file removed.
    """
    dest = pathlib.Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    unpack = url.endswith(".gz") and not dest.name.endswith(".gz")
    manual = (f"download {url} by hand{' and gunzip it' if unpack else ''}, and save it as {dest}")
    handle, temporary = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    try:
        with os.fdopen(handle, "wb") as stream:
            try:
                got = _fetch(url, stream, timeout)
            except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
                reason = getattr(exc, "reason", None) or exc
                raise OSError(f"download of {url} failed: {reason}; {manual}") from exc
        if sha256 is not None and got != sha256.lower():
            raise DataError(f"download of {url}: sha256 mismatch, expected {sha256.lower()}, got {got}; the file is "
                            f"corrupt or changed upstream, {dest} was not written. Check the URL or {manual}")
        if unpack:
            try:
                gunzip(temporary, dest)
            except DataError as exc:
                raise DataError(f"download of {url}: not a valid gzip file ({exc.__cause__}); {dest} was not "
                                f"written; {manual}") from exc.__cause__
            os.unlink(temporary)
        else:
            os.replace(temporary, dest)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    return dest


def gunzip(packed: str | os.PathLike, dest: str | os.PathLike) -> pathlib.Path:
    """Unpack the gzip file ``packed`` to ``dest`` (beside it, through a temporary file
    renamed only once complete); ``packed`` is kept. Returns ``dest``.

    Raises:
        DataError: ``packed`` is not a valid (or a truncated) gzip file; ``dest`` is not
            created.
    """
    packed, dest = pathlib.Path(packed), pathlib.Path(dest)
    handle, temporary = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    try:
        with os.fdopen(handle, "wb") as target, gzip.open(packed, "rb") as source:
            shutil.copyfileobj(source, target, _CHUNK)
        os.replace(temporary, dest)
    except (OSError, EOFError) as exc:
        raise DataError(f"{packed} is not a valid gzip file ({exc}); {dest} was not written: download it "
                        f"again") from exc
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return dest

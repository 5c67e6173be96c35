"""DVS128 Gesture (Amir et al. 2017): 11 hand gestures seen by a 128 x 128 event camera.

Read from the original AEDAT 3.1 recordings (``user01_fluorescent.aedat``), each cut
into gestures by its ``*_labels.csv``; ``trials_to_train.txt`` / ``trials_to_test.txt``
name the recordings of each split. docs/datasets.md says where to get them.
"""

from __future__ import annotations

import os
import pathlib
import struct
from typing import Iterator

import numpy as np

from ..errors import ConfigError, DataError
from .events import bin_samples, check_binning, check_on_sensor, fingerprint, load_binned, with_mask

__all__ = ["load_dvs_gesture", "read_aedat31"]

EVENTS = np.dtype([("x", np.uint16), ("y", np.uint16), ("p", np.uint8), ("t", np.int64)])  # t in µs
SENSOR = 128
NUM_CLASSES = 11
POLARITY_EVENT = 1
PACKET_HEADER = struct.Struct("<hhiiiiii")  # type, source, size, ts offset, ts overflow, capacity, number, valid
HEADER_END = b"#!END-HEADER\r\n"
LABELS_HEADER = "class,startTime_usec,endTime_usec"
ARCHIVE_FOLDER = "DvsGesture"  # the folder DvsGesture.tar.gz unpacks into: the root to pass
URL = "https://research.ibm.com/interactive/dvsgesture/"
LAYOUT = ("root/trials_to_train.txt and root/trials_to_test.txt (one .aedat file name per line), and for each "
          "listed user01_fluorescent.aedat (AEDAT 3.1) its user01_fluorescent_labels.csv")


def _body_start(data: bytes, path) -> int:
    """The offset after the ASCII header (``#`` lines ending with ``#!END-HEADER``)."""
    first = data[: data.find(b"\n") + 1].strip()
    if first != b"#!AER-DAT3.1":
        raise DataError(f"{path}: expected an AEDAT 3.1 file starting with '#!AER-DAT3.1', got "
                        f"{first[:40].decode('ascii', 'replace')!r}")
    end = data.find(HEADER_END[:-2])
    if end < 0:
        raise DataError(f"{path}: the AEDAT 3.1 header has no '#!END-HEADER' line")
    end += len(HEADER_END) - 2
    for newline in (b"\r\n", b"\n"):  # the format's CRLF, or LF from a tool that rewrote the header
        if data.startswith(newline, end):
            return end + len(newline)
    raise DataError(f"{path}: the AEDAT 3.1 header's '#!END-HEADER' line does not end in a line break (CRLF); "
                    f"got {data[end:end + 8]!r} after it")


def _packets(data: bytes, path) -> Iterator[tuple[int, int, int, int, int]]:
    """``(byte offset, eventType, eventSize, eventTSOverflow, eventNumber)`` of each
    packet after the header, its header fields checked against what the format allows."""
    offset = _body_start(data, path)
    while offset < len(data):  # one iteration per packet (thousands), the events in bulk
        if offset + PACKET_HEADER.size > len(data):
            raise DataError(f"{path}: truncated packet header at byte {offset}: {len(data) - offset} bytes left, "
                            f"expected {PACKET_HEADER.size}")
        kind, _, size, ts_offset, overflow, _, number, valid = PACKET_HEADER.unpack_from(data, offset)
        impossible = [(name, value, expected) for name, value, expected, bad in (
            ("eventType", kind, "a type >= 0", kind < 0),
            ("eventSize", size, "a positive byte count", size <= 0),
            ("eventTSOverflow", overflow, "a count >= 0", overflow < 0),
            ("eventNumber", number, "a count >= 0", number < 0),
            ("eventValid", valid, f"a count in 0..eventNumber = {number}", not 0 <= valid <= max(number, 0)),
            ("eventSize", size, "8 for polarity events (eventType 1)", kind == POLARITY_EVENT and size != 8),
            ("eventTSOffset", ts_offset, "4 for polarity events (eventType 1)",
             kind == POLARITY_EVENT and ts_offset != 4),
        ) if bad]
        if impossible:
            name, value, expected = impossible[0]
            raise DataError(f"{path}: the packet header at byte {offset} has {name} = {value}, expected {expected}: "
                            f"the packet header is corrupt, or the bytes before it are not whole packets")
        body = offset + PACKET_HEADER.size
        if body + size * number > len(data):
            raise DataError(f"{path}: truncated packet at byte {offset}: its header announces {number} events of "
                            f"{size} bytes, only {len(data) - body} bytes follow")
        yield offset, kind, size, overflow, number
        offset = body + size * number


def read_aedat31(path: str | os.PathLike) -> np.ndarray:
    """The valid polarity events of an AEDAT 3.1 file: ``(E,)`` structured array with
    fields ``x``, ``y`` (pixels), ``p`` (polarity 0 / 1) and ``t`` (µs, 64-bit).

    After the ``#`` header, packets follow: a 28-byte little-endian header (int16
    eventType, int16 eventSource, int32 eventSize, eventTSOffset, eventTSOverflow,
    eventCapacity, eventNumber, eventValid) and ``eventNumber * eventSize`` bytes of
    events. Polarity packets (eventType 1, 8-byte events) hold uint32 data (bit 0
    valid, bit 1 polarity, bits 2-16 y, bits 17-31 x) and a uint32 timestamp whose
    full value is ``eventTSOverflow << 31 | timestamp``. Other packets are skipped, and
    events whose valid bit is 0 dropped. A file without valid polarity events gives
    none here; :func:`load_dvs_gesture` refuses it when its labels name gestures.

    Raises:
        DataError: no AEDAT 3.1 header; a packet cut short; a packet header field the
            format does not allow (a negative eventNumber, eventValid over
            eventNumber, a polarity packet whose events are not 8 bytes, ...); a
            valid event with a negative (int32) timestamp. The message names the
            file, the field and its value, and the byte offset.
    """
    data = pathlib.Path(path).read_bytes()
    words, overflows = [], []
    for offset, kind, _, overflow, number in _packets(data, path):
        if kind == POLARITY_EVENT:
            body = offset + PACKET_HEADER.size
            words.append(np.frombuffer(data, "<u4", count=2 * number, offset=body).reshape(number, 2))
            overflows.append(np.full(number, overflow, np.int64))
    packed = np.concatenate(words) if words else np.zeros((0, 2), "<u4")
    overflow = np.concatenate(overflows) if overflows else np.zeros(0, np.int64)
    valid = (packed[:, 0] & 1).astype(bool)
    word, stamp, overflow = packed[valid, 0], packed[valid, 1].astype(np.int64), overflow[valid]
    negative = np.flatnonzero(stamp >> 31)
    if negative.size:  # an int32 below 0: the format's stamps run to 2**31 - 1, then the overflow counts
        raise DataError(f"{path}: {negative.size} valid polarity event(s) have a negative timestamp (the first, "
                        f"valid event {int(negative[0])}: {int(stamp[negative[0]]) - 2**32}); AEDAT 3.1 stamps are "
                        f"int32 µs >= 0 with eventTSOverflow counting their wraps: the file is corrupt")
    events = np.empty(word.size, EVENTS)
    events["x"], events["y"], events["p"] = word >> 17, (word >> 2) & 0x7FFF, (word >> 1) & 1
    events["t"] = (overflow << 31) | stamp
    return events


def _contents(path: pathlib.Path) -> str:
    """What a file without valid polarity events holds, for the error saying so."""
    packets = list(_packets(path.read_bytes(), path))
    polarity = sum(number for _, kind, _, _, number in packets if kind == POLARITY_EVENT)
    if not packets:
        return "the header only, no packets"
    return (f"{len(packets)} packet(s) holding {polarity} polarity event(s)"
            + (", none of them valid (valid bit 0)" if polarity else ""))


def read_labels(path: pathlib.Path) -> np.ndarray:
    """``(G, 3)`` int64 rows ``class (1..11), start µs, end µs`` of a ``*_labels.csv``."""
    if not path.exists():
        raise FileNotFoundError(f"load_dvs_gesture: {path} not found; every recording needs its labels file. "
                                f"Expected {LAYOUT}; get the files from {URL}")
    lines = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if not lines or lines[0].replace(" ", "") != LABELS_HEADER:
        raise DataError(f"{path}: expected the header {LABELS_HEADER!r}, got {lines[0] if lines else ''!r}")
    try:
        rows = [[int(v) for v in line.split(",")] for line in lines[1:]]
    except ValueError as exc:
        raise DataError(f"{path}: expected rows of three integers (class,startTime_usec,endTime_usec): {exc}") from exc
    if any(len(row) != 3 for row in rows):
        row = next(i for i, r in enumerate(rows) if len(r) != 3)
        raise DataError(f"{path}: row {row + 1} has {len(rows[row])} values, expected 3 "
                        f"(class,startTime_usec,endTime_usec)")
    if not rows:
        raise DataError(f"{path}: the header only, no gesture rows (class,startTime_usec,endTime_usec); every "
                        f"recording's labels file lists its gestures")
    rows = np.array(rows, np.int64).reshape(-1, 3)
    bad = (rows[:, 0] < 1) | (rows[:, 0] > NUM_CLASSES) | (rows[:, 2] <= rows[:, 1])
    if bad.any():
        raise DataError(f"{path}: row {int(np.argmax(bad)) + 1} is {rows[np.argmax(bad)].tolist()}; expected a "
                        f"class in 1..{NUM_CLASSES} and startTime_usec < endTime_usec")
    return rows


def _trials(root: pathlib.Path, split: str) -> list[pathlib.Path]:
    if split not in ("train", "test"):
        raise ConfigError(f"load_dvs_gesture: split must be 'train' or 'test', got {split!r}")
    listing = root / f"trials_to_{split}.txt"
    if not listing.exists():
        unpacked = root / ARCHIVE_FOLDER
        if (unpacked / listing.name).exists():  # root is where the archive was unpacked, not its folder
            raise FileNotFoundError(f"load_dvs_gesture: {listing} not found, but {unpacked / listing.name} exists: "
                                    f"DvsGesture.tar.gz unpacks into a {ARCHIVE_FOLDER}/ folder; "
                                    f"pass root='{unpacked}'")
        raise FileNotFoundError(f"load_dvs_gesture: {listing} not found. Expected {LAYOUT}; get DvsGesture.tar.gz "
                                f"from {URL}, unpack it and pass its {ARCHIVE_FOLDER}/ folder as root")
    names = [line.strip() for line in listing.read_text().splitlines() if line.strip()]
    paths = [root / name for name in names]
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(f"load_dvs_gesture: {path} (listed in {listing.name}) not found. Expected "
                                    f"{LAYOUT}; get the files from {URL}")
    if not paths:
        raise DataError(f"{listing}: lists no recordings")
    return paths


def _gestures(recordings: list[pathlib.Path], downsample: int, labels: list[int]):
    """``(times s, units)`` of every gesture, in the order of the recordings and their
    label rows; appends each gesture's class - 1 to ``labels``. A recording without
    events, a labels row outside the recording's events and one whose window holds no
    event are errors, never an empty sample."""
    side = -(-SENSOR // downsample)
    for recording in recordings:
        events = read_aedat31(recording)
        check_on_sensor(events, SENSOR, SENSOR, recording, "DVS128")
        units = (events["p"].astype(np.int64) * side + events["y"] // downsample) * side + events["x"] // downsample
        labels_file = recording.with_name(recording.stem + "_labels.csv")
        rows = read_labels(labels_file)
        if not events.size:
            raise DataError(f"{recording}: no valid polarity events ({_contents(recording)}), but {labels_file.name} "
                            f"names {len(rows)} gesture(s) in it, at t = {int(rows[:, 1].min())}.."
                            f"{int(rows[:, 2].max())} µs (row 1: {rows[0].tolist()}): the recording is empty or cut "
                            f"short; unpack it again from {URL}")
        first, last = int(events["t"].min()), int(events["t"].max())
        outside = (rows[:, 2] <= first) | (rows[:, 1] > last)
        if outside.any():
            row = int(np.argmax(outside))
            raise DataError(f"{labels_file}: row {row + 1} {rows[row].tolist()} lies outside the recording, whose "
                            f"events span t = {first}..{last} µs: expected the labels of {recording.name}, "
                            f"in µs on the recording's clock (class,startTime_usec,endTime_usec)")
        for row, (label, start, end) in enumerate(rows):
            inside = (events["t"] >= start) & (events["t"] < end)
            if not inside.any():
                raise DataError(f"{labels_file}: row {row + 1} {rows[row].tolist()} holds no event of "
                                f"{recording.name} (none in t = {start}..{end} µs, the recording's {events.size} "
                                f"events span t = {first}..{last} µs): a gesture is never empty; is the row "
                                f"another recording's?")
            labels.append(int(label) - 1)
            yield (events["t"][inside] - start) * 1e-6, units[inside]


def load_dvs_gesture(
    root: str | os.PathLike,
    split: str = "train",
    *,
    dt: float | None = None,
    num_bins: int | None = None,
    max_time: float | None = None,
    downsample: int = 4,
    flatten: bool = False,
    variable_length: bool = False,
    cache: bool | str | os.PathLike = True,
) -> tuple[np.ndarray, ...]:
    """DVS128 Gesture: one sample per labelled gesture of the split's recordings.

    A gesture is the events in ``[startTime_usec, endTime_usec)`` of its labels row,
    timed from its start. Pixels are pooled ``downsample x downsample`` (4: 128 → 32).
    Binning as in :func:`~etrace_fit.datasets.load_shd`: ``dt`` (seconds) or
    ``num_bins``, and ``max_time`` (seconds; None: each gesture's own length,
    zero-padded to the longest with ``dt``).

    Returns:
        ``x: (N, T, 2, S, S)`` float32 event counts with ``S = ceil(128 / downsample)``,
        axes (polarity, y, x) — ``(N, T, 2 * S * S)`` with ``flatten=True`` — ``y:
        (N,)`` int32 classes 0..10 (the CSV's class - 1), and with ``variable_length``
        a ``mask: (N, T)`` bool.

    Raises:
        FileNotFoundError: a missing list, recording or labels file (the message
            names it, the layout and the URL; for a ``root`` holding the archive's
            ``DvsGesture/`` folder, that folder to pass). DataError: a bad header, a truncated
            packet or an impossible packet header field, an event off the sensor, a
            bad labels row; a recording with no valid events, or a labels row with no
            event in its window (the message names the file and the row's times).
    """
    check_binning(dt, num_bins, max_time, "load_dvs_gesture")
    if isinstance(downsample, bool) or not isinstance(downsample, (int, np.integer)) or downsample < 1:
        raise ConfigError(f"load_dvs_gesture: downsample must be a positive int (4 pools 128 x 128 to 32 x 32), "
                          f"got {downsample!r}")
    downsample = int(downsample)  # np.int64(4) and 4: one cache key
    root = pathlib.Path(root)
    recordings = _trials(root, split)
    side = -(-SENSOR // downsample)
    sources = [p for r in recordings for p in (r, r.with_name(r.stem + "_labels.csv"))]
    key = {"dataset": "dvs_gesture", "split": split, "dt": dt, "num_bins": num_bins, "max_time": max_time,
           "downsample": downsample, "recordings": [r.name for r in recordings],
           "source": fingerprint(p for p in sources if p.exists())}

    def build() -> dict[str, np.ndarray]:
        labels: list[int] = []
        x, lengths = bin_samples(_gestures(recordings, downsample, labels), 2 * side * side, dt=dt,
                                 num_bins=num_bins, max_time=max_time, source=str(root))
        return {"x": x, "y": np.asarray(labels, np.int32), "lengths": lengths}

    arrays = load_binned(f"dvs_gesture_{split}", root, cache, key, build)
    x = arrays["x"] if flatten else arrays["x"].reshape(*arrays["x"].shape[:2], 2, side, side)
    return with_mask(x, arrays["y"], arrays["lengths"], variable_length)

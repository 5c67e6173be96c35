"""DVS128 Gesture from AEDAT 3.1 files written here with struct (etrace_fit/datasets/dvs_gesture.py)."""

import re
import struct

import numpy as np
import pytest

from etrace_fit.datasets import dvs_gesture, load_dvs_gesture, read_aedat31
from etrace_fit.errors import ConfigError, DataError

HEADER = b"#!AER-DAT3.1\r\n#Format: RAW\r\n#Source 1: DVS128\r\n#Start-Time: 2017-03-01\r\n#!END-HEADER\r\n"


def packet(kind, events, overflow=0, size=8):
    """A 28-byte little-endian packet header, then the events. Polarity events
    (kind 1) are ``(x, y, p, t, valid)``; other kinds carry ``size`` filler bytes each."""
    body = b""
    for x, y, p, t, valid in events:
        body += struct.pack("<II", valid | p << 1 | y << 2 | x << 17, t) if kind == 1 else b"\xab" * size
    valid = sum(e[4] for e in events)
    return struct.pack("<hhiiiiii", kind, 1, size, 4, overflow, len(events), len(events), valid) + body


def random_events(n, start, end, seed):
    rng = np.random.default_rng(seed)
    return [(int(x), int(y), int(p), int(t), 1) for x, y, p, t in
            zip(rng.integers(0, 128, n), rng.integers(0, 128, n), rng.integers(0, 2, n),
                np.sort(rng.integers(start, end, n)))]


def test_polarity_events_read_back_and_other_packets_are_skipped(tmp_path):
    first = random_events(50, 0, 1_000_000, 0)
    second = [(127, 0, 1, 5, 1), (3, 127, 0, 6, 0), (64, 65, 0, 7, 1)]  # the middle one is not valid
    path = tmp_path / "rec.aedat"
    path.write_bytes(HEADER + packet(1, first) + packet(0, [(0, 0, 0, 0, 1)] * 4)  # special events
                     + packet(2, [(0, 0, 0, 0, 1)] * 2, size=20) + packet(1, second, overflow=3))
    events = read_aedat31(path)
    expected = first + [second[0], second[2]]
    assert events.dtype.names == ("x", "y", "p", "t") and events.size == 52
    for name, column in zip("xyp", range(3)):
        assert events[name].tolist() == [e[column] for e in expected]
    assert events["t"].tolist() == [e[3] for e in first] + [3 << 31 | 5, 3 << 31 | 7]


def test_a_truncated_packet_names_the_file_and_the_byte_offset(tmp_path):
    whole = HEADER + packet(1, random_events(10, 0, 100, 1)) + packet(1, random_events(10, 0, 100, 2))
    path = tmp_path / "cut.aedat"
    path.write_bytes(whole[:-5])
    second_packet = len(HEADER) + 28 + 10 * 8
    with pytest.raises(DataError, match=rf"cut\.aedat: truncated packet at byte {second_packet}: .*10 events of 8"):
        read_aedat31(path)
    path.write_bytes(whole[: second_packet + 10])
    with pytest.raises(DataError, match=rf"cut\.aedat: truncated packet header at byte {second_packet}"):
        read_aedat31(path)


def test_a_header_rewritten_with_lf_line_ends_is_read(tmp_path):
    """The format ends header lines in CRLF; a tool that rewrote them with LF made the
    reader say the '#!END-HEADER' line was missing."""
    events = random_events(20, 0, 1000, 3)
    path = tmp_path / "lf.aedat"
    path.write_bytes(HEADER.replace(b"\r\n", b"\n") + packet(1, events))
    assert read_aedat31(path)["t"].tolist() == [e[3] for e in events]
    path.write_bytes(HEADER[:-2] + packet(1, events))
    with pytest.raises(DataError, match=r"'#!END-HEADER' line does not end in a line break"):
        read_aedat31(path)


def test_a_file_of_another_version_is_refused(tmp_path):
    path = tmp_path / "old.aedat"
    path.write_bytes(b"#!AER-DAT2.0\r\n#!END-HEADER\r\n" + b"\0" * 16)
    with pytest.raises(DataError, match=r"old\.aedat: expected an AEDAT 3.1 file.*'#!AER-DAT2.0'"):
        read_aedat31(path)


GESTURES = {  # recording -> rows (class, start µs, end µs)
    "user01_fluorescent": [(1, 1_000_000, 1_400_000), (11, 2_000_000, 2_250_000)],
    "user02_lab": [(5, 500_000, 900_000)],
}


@pytest.fixture
def gesture_root(tmp_path):
    """Two recordings with their labels; train lists both, test the second."""
    recorded = {}
    for k, (name, rows) in enumerate(GESTURES.items()):
        events = random_events(3000, 0, 3_000_000, 10 + k)  # some fall between the gestures
        recorded[name] = events
        (tmp_path / f"{name}.aedat").write_bytes(HEADER + packet(1, events[:1000]) + packet(1, events[1000:]))
        lines = ["class,startTime_usec,endTime_usec"] + [f"{c},{s},{e}" for c, s, e in rows]
        (tmp_path / f"{name}_labels.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "trials_to_train.txt").write_text("user01_fluorescent.aedat\nuser02_lab.aedat\n\n")
    (tmp_path / "trials_to_test.txt").write_text("user02_lab.aedat\n")
    return tmp_path, recorded


def dense(recorded, names, dt, steps, downsample=4):
    side = 128 // downsample
    samples = []
    for name in names:
        for _, start, end in GESTURES[name]:
            out = np.zeros((steps, 2, side, side))
            for x, y, p, t, _ in recorded[name]:
                step = (t - start) // int(round(dt * 1e6))
                if start <= t < end and step < steps:
                    out[step, p, y // downsample, x // downsample] += 1
            samples.append(out)
    return np.stack(samples)


def test_each_gesture_becomes_a_sample_with_exact_counts(gesture_root):
    root, recorded = gesture_root
    x, y = load_dvs_gesture(root, "train", dt=0.05, max_time=0.5, cache=False)
    assert x.shape == (3, 10, 2, 32, 32) and x.dtype == np.float32
    assert y.tolist() == [0, 10, 4] and y.dtype == np.int32
    np.testing.assert_array_equal(x, dense(recorded, ["user01_fluorescent", "user02_lab"], 0.05, 10))
    test_x, test_y = load_dvs_gesture(root, "test", dt=0.05, max_time=0.5, downsample=1, flatten=True, cache=False)
    assert test_x.shape == (1, 10, 2 * 128 * 128) and test_y.tolist() == [4]
    np.testing.assert_array_equal(test_x, dense(recorded, ["user02_lab"], 0.05, 10, 1).reshape(1, 10, -1))


def test_variable_length_masks_each_gestures_own_length(gesture_root):
    root, recorded = gesture_root
    x, y, mask = load_dvs_gesture(root, "train", dt=0.01, variable_length=True, cache=False)
    lengths = []
    for name in GESTURES:
        for _, start, end in GESTURES[name]:
            last = max(t for *_, t, _ in recorded[name] if start <= t < end)
            lengths.append((last - start) // 10_000 + 1)
    assert x.shape[:2] == (3, max(lengths))
    np.testing.assert_array_equal(mask.sum(axis=1), lengths)
    np.testing.assert_array_equal(x, dense(recorded, list(GESTURES), 0.01, max(lengths)))


def test_the_cache_is_read_on_the_second_call_and_rebuilt_for_another_binning(gesture_root, monkeypatch):
    root, _ = gesture_root
    first, _ = load_dvs_gesture(root, "test", num_bins=4)

    def no_reading(path):
        raise AssertionError(f"{path} was read again")

    monkeypatch.setattr(dvs_gesture, "read_aedat31", no_reading)
    again, y = load_dvs_gesture(root, "test", num_bins=4)
    np.testing.assert_array_equal(again, first)
    for changed in (dict(num_bins=5), dict(num_bins=4, downsample=2), dict(dt=0.1)):
        with pytest.raises(AssertionError, match="was read again"):
            load_dvs_gesture(root, "test", **changed)


def test_missing_files_name_the_layout_and_the_url(gesture_root):
    root, _ = gesture_root
    (root / "user02_lab_labels.csv").unlink()
    with pytest.raises(FileNotFoundError, match=r"user02_lab_labels\.csv not found.*trials_to_train\.txt.*"
                                                r"https://research\.ibm\.com/interactive/dvsgesture/"):
        load_dvs_gesture(root, "test", dt=0.1, cache=False)
    (root / "trials_to_test.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"trials_to_test\.txt not found.*AEDAT 3\.1.*DvsGesture\.tar\.gz"):
        load_dvs_gesture(root, "test", dt=0.1)
    (root / "user01_fluorescent.aedat").unlink()
    with pytest.raises(FileNotFoundError, match=r"user01_fluorescent\.aedat \(listed in trials_to_train\.txt\)"):
        load_dvs_gesture(root, "train", dt=0.1)


@pytest.mark.parametrize("text, match", [
    ("class,start,end\n1,0,10\n", r"expected the header 'class,startTime_usec,endTime_usec'"),
    ("class,startTime_usec,endTime_usec\n12,0,10\n", r"row 1 is \[12, 0, 10\]; expected a class in 1\.\.11"),
    ("class,startTime_usec,endTime_usec\n1,0,10\n2,5\n", r"row 2 has 2 values, expected 3"),
    ("class,startTime_usec,endTime_usec\n", r"the header only, no gesture rows"),
])
def test_a_bad_labels_file_names_the_file_and_what_was_expected(gesture_root, text, match):
    root, _ = gesture_root
    (root / "user02_lab_labels.csv").write_text(text)
    with pytest.raises(DataError, match=r"user02_lab_labels\.csv: " + match):
        load_dvs_gesture(root, "test", dt=0.1, cache=False)


@pytest.mark.parametrize("row", ["3,9000000,9500000", "3,3000000,3000400"])  # past the recording's last event
def test_a_labels_row_outside_the_recording_is_an_error_not_an_empty_sample(gesture_root, row):
    root, _ = gesture_root
    (root / "user02_lab_labels.csv").write_text(f"class,startTime_usec,endTime_usec\n5,500000,900000\n{row}\n")
    with pytest.raises(DataError, match=rf"user02_lab_labels\.csv: row 2 \[3, {row.split(',')[1]}, .* lies outside "
                                        r"the recording, whose events span t = \d+\.\.\d+ µs: expected the labels "
                                        r"of user02_lab\.aedat, in µs"):
        load_dvs_gesture(root, "test", dt=0.1, max_time=0.5, cache=False)


def test_bad_arguments_are_config_errors(gesture_root):
    root, _ = gesture_root
    with pytest.raises(ConfigError, match="downsample must be a positive int"):
        load_dvs_gesture(root, dt=0.1, downsample=0)
    with pytest.raises(ConfigError, match="split must be 'train' or 'test'"):
        load_dvs_gesture(root, "valid", dt=0.1)


def single_recording(root, aedat, rows=((5, 500_000, 900_000),)):
    """``root`` with one listed recording ``user01_lab.aedat`` and its labels."""
    (root / "user01_lab.aedat").write_bytes(aedat)
    lines = ["class,startTime_usec,endTime_usec"] + [f"{c},{s},{e}" for c, s, e in rows]
    (root / "user01_lab_labels.csv").write_text("\n".join(lines) + "\n")
    (root / "trials_to_train.txt").write_text("user01_lab.aedat\n")
    return root


@pytest.mark.parametrize("body, found", [
    (b"", r"the header only, no packets"),
    (packet(1, []), r"1 packet\(s\) holding 0 polarity event\(s\)"),
    (packet(1, [(5, 9, 1, 600_000, 0), (6, 9, 0, 700_000, 0)]) + packet(0, [(0, 0, 0, 0, 1)]),
     r"2 packet\(s\) holding 2 polarity event\(s\), none of them valid \(valid bit 0\)"),
], ids=["header-only", "empty-packet", "no-valid-event"])
def test_a_recording_without_valid_events_is_an_error_naming_it_and_its_gestures(tmp_path, body, found):
    """It loaded as all-zero gestures with their labels: the check that a labels row lies
    inside the recording's events was skipped when there were no events."""
    root = single_recording(tmp_path, HEADER + body, rows=[(5, 500_000, 900_000), (2, 1_000_000, 1_300_000)])
    assert read_aedat31(root / "user01_lab.aedat").size == 0  # the reader returns what is there
    with pytest.raises(DataError, match=rf"user01_lab\.aedat: no valid polarity events \({found}\), but "
                                        r"user01_lab_labels\.csv names 2 gesture\(s\) in it, at t = "
                                        r"500000\.\.1300000 µs \(row 1: \[5, 500000, 900000\]\): the recording is "
                                        r"empty or cut short"):
        load_dvs_gesture(root, "train", dt=0.1, max_time=0.5, cache=False)


def test_a_labels_row_whose_window_holds_no_event_is_an_error_not_an_empty_sample(tmp_path):
    events = [(5, 9, 1, 600_000, 1), (7, 11, 0, 899_999, 1), (64, 0, 1, 3_000_000, 1)]
    root = single_recording(tmp_path, HEADER + packet(1, events),
                            rows=[(5, 500_000, 900_000), (4, 1_000_000, 1_400_000)])  # the second: inside, but empty
    with pytest.raises(DataError, match=r"user01_lab_labels\.csv: row 2 \[4, 1000000, 1400000\] holds no event of "
                                        r"user01_lab\.aedat \(none in t = 1000000\.\.1400000 µs, the recording's 3 "
                                        r"events span t = 600000\.\.3000000 µs\)"):
        load_dvs_gesture(root, "train", dt=0.1, max_time=0.5, cache=False)
    single_recording(tmp_path, HEADER + packet(1, events), rows=[(5, 500_000, 900_000)])
    x, y = load_dvs_gesture(root, "train", dt=0.1, max_time=0.5, cache=False)
    assert y.tolist() == [4] and x.sum() == 2


def test_an_event_off_the_sensor_names_that_event_and_the_sensor(tmp_path):
    """The message named max(x) and max(y), of different events."""
    events = [(5, 9, 1, 600_000, 1), (200, 3, 0, 700_000, 1), (3, 150, 1, 800_000, 1)]
    root = single_recording(tmp_path, HEADER + packet(1, events))
    with pytest.raises(DataError, match=r"user01_lab\.aedat: event 1 \(x=200, y=3, t=700000 µs\) is outside the "
                                        r"128 x 128 DVS128 sensor \(x < 128, y < 128\); 2 of 3 events are off it"):
        load_dvs_gesture(root, "train", dt=0.1, cache=False)


@pytest.mark.parametrize("field, value, expected", [
    ("eventNumber", -1, r"a count >= 0"),
    ("eventValid", 3, r"a count in 0\.\.eventNumber = 2"),
    ("eventTSOverflow", -5, r"a count >= 0"),
    ("eventSize", 16, r"8 for polarity events \(eventType 1\)"),
    ("eventTSOffset", 0, r"4 for polarity events \(eventType 1\)"),
    ("eventType", -3, r"a type >= 0"),
])
def test_an_impossible_packet_header_field_is_named_with_its_value_and_offset(tmp_path, field, value, expected):
    """A negative eventNumber was reported as a 'truncated packet'."""
    fields = {"eventType": 1, "eventSource": 1, "eventSize": 8, "eventTSOffset": 4, "eventTSOverflow": 0,
              "eventCapacity": 2, "eventNumber": 2, "eventValid": 2}
    good = packet(1, [(1, 2, 0, 10, 1), (3, 4, 1, 20, 1)])
    bad = struct.pack("<hhiiiiii", *{**fields, field: value}.values()) + good[28:]
    path = tmp_path / "bad.aedat"
    path.write_bytes(HEADER + good + bad)
    offset = len(HEADER) + len(good)
    with pytest.raises(DataError, match=rf"bad\.aedat: the packet header at byte {offset} has {field} = {value}, "
                                        rf"expected {expected}: the packet header is corrupt"):
        read_aedat31(path)


# ---- bytes written from iniVation's AEDAT 3.1 specification (docs.inivation.com, file-formats/aedat-3.1): a 28-byte
# little-endian packet header (int16 eventType, int16 eventSource, int32 eventSize, eventTSOffset, eventTSOverflow,
# eventCapacity, eventNumber, eventValid), then eventNumber events of eventSize bytes; a polarity event (type 1) is
# uint32 data (bit 0 valid, bit 1 polarity, bits 2-16 y, bits 17-31 x) and an int32 timestamp, 64-bit time
# eventTSOverflow * 2**31 + timestamp
SPEC_HEADER = b"#!AER-DAT3.1\r\n#Format: RAW\r\n#Source 1: DVS128\r\n#!END-HEADER\r\n"
POLARITY = np.dtype([("data", "<u4"), ("timestamp", "<i4")])


def spec_polarity(events, overflow=0):
    """A polarity packet of ``(x, y, on, timestamp, valid)`` events."""
    body = np.array([(valid | on << 1 | y << 2 | x << 17, t) for x, y, on, t, valid in events], POLARITY).tobytes()
    header = struct.pack("<hhiiiiii", 1, 1, 8, 4, overflow, len(events), len(events), sum(e[4] for e in events))
    return header + body


def spec_other(kind, size, number, ts_offset=0):
    """A packet of another event type: its events are bytes that would read as valid polarity events."""
    word = struct.pack("<II", 1 | 1 << 1 | 7 << 2 | 9 << 17, 123)
    body = (word * size)[:size] * number
    return struct.pack("<hhiiiiii", kind, 1, size, ts_offset, 0, number, number, number) + body


def test_packets_of_every_type_overflow_and_validity_read_as_the_specification_says(tmp_path):
    path = tmp_path / "mixed.aedat"
    path.write_bytes(SPEC_HEADER + spec_other(0, 8, 3, ts_offset=4)           # special events
                     + spec_polarity([(1, 2, 1, 100, 1), (3, 4, 0, 200, 0), (127, 127, 0, 2**31 - 1, 1)])
                     + spec_other(2, 36, 2, ts_offset=12)                       # frames: other sizes and offsets
                     + spec_other(3, 40, 1, ts_offset=36)                       # IMU
                     + spec_polarity([])                                        # an empty packet
                     + spec_polarity([(5, 6, 1, 7, 1), (8, 9, 0, 8, 1)], overflow=2)
                     + spec_other(12, 13, 2))                                   # an odd size
    events = read_aedat31(path)
    assert events.tolist() == [(1, 2, 1, 100), (127, 127, 0, 2**31 - 1), (5, 6, 1, 2 * 2**31 + 7),
                               (8, 9, 0, 2 * 2**31 + 8)]


def test_a_valid_event_with_a_negative_timestamp_is_refused(tmp_path):
    """The spec's stamps are int32 µs >= 0 (eventTSOverflow counts the wraps); a negative
    one had been read with its sign bit dropped, a plausible but wrong time. An invalid
    event's stamp is not read."""
    path = tmp_path / "signed.aedat"
    path.write_bytes(SPEC_HEADER + spec_polarity([(1, 2, 1, 100, 1), (3, 4, 0, -5, 0), (5, 6, 1, -7, 1)]))
    with pytest.raises(DataError, match=r"signed\.aedat: 1 valid polarity event\(s\) have a negative timestamp "
                                        r"\(the first, valid event 1: -7\)"):
        read_aedat31(path)


def test_a_header_without_an_end_line_is_refused(tmp_path):
    path = tmp_path / "open.aedat"
    path.write_bytes(b"#!AER-DAT3.1\r\n#Format: RAW\r\n" + spec_polarity([(1, 2, 1, 100, 1)]))
    with pytest.raises(DataError, match=r"open\.aedat: the AEDAT 3\.1 header has no '#!END-HEADER' line"):
        read_aedat31(path)


def test_a_last_packet_cut_inside_its_events_is_refused(tmp_path):
    whole = SPEC_HEADER + spec_polarity([(1, 2, 1, 100, 1)]) + spec_polarity([(3, 4, 0, 200, 1), (5, 6, 1, 300, 1)])
    path = tmp_path / "cut.aedat"
    path.write_bytes(whole[:-8])  # the last event is missing
    with pytest.raises(DataError, match=r"cut\.aedat: truncated packet at byte \d+: its header announces 2 events of 8 "
                                        r"bytes, only 8 bytes follow"):
        read_aedat31(path)


def gesture_files(root, events, rows, name="user05_natural"):
    (root / f"{name}.aedat").write_bytes(SPEC_HEADER + spec_polarity(events))
    (root / f"{name}_labels.csv").write_text("class,startTime_usec,endTime_usec\r\n"
                                             + "".join(f"{c},{s},{e}\r\n" for c, s, e in rows))
    (root / "trials_to_train.txt").write_text(f"{name}.aedat\r\n")
    return root


def test_a_gesture_keeps_the_event_at_its_start_and_drops_the_one_at_its_end(tmp_path):
    """[startTime_usec, endTime_usec), as the readers that cut this data set do (SpikingJelly's
    DVS128Gesture: events['t'] >= t_start and events['t'] < t_end)."""
    events = [(10, 10, 1, 999_999, 1), (20, 20, 1, 1_000_000, 1), (30, 30, 0, 1_009_999, 1),
              (40, 40, 0, 1_010_000, 1)]
    root = gesture_files(tmp_path, events, [(6, 1_000_000, 1_010_000)])
    x, y, mask = load_dvs_gesture(root, dt=0.001, downsample=1, variable_length=True, cache=False)
    assert y.tolist() == [5] and x.shape == (1, 10, 2, 128, 128) and x.sum() == 2
    assert x[0, 0, 1, 20, 20] == 1 and x[0, 9, 0, 30, 30] == 1 and mask.sum() == 10


def test_a_class_listed_twice_gives_two_samples_and_overlapping_rows_share_events(tmp_path):
    """user26_fluorescent_labels.csv lists a class more than once; in user22_led_labels.csv a
    row ends after the next one starts."""
    events = [(1, 1, 1, 100_000, 1), (2, 2, 1, 300_000, 1), (3, 3, 0, 500_000, 1), (4, 4, 0, 700_000, 1)]
    root = gesture_files(tmp_path, events, [(4, 50_000, 350_000), (9, 250_000, 600_000), (4, 450_000, 800_000)])
    x, y = load_dvs_gesture(root, dt=0.1, max_time=0.4, downsample=1, cache=False)
    assert y.tolist() == [3, 8, 3]
    assert x.reshape(3, 4, -1).sum(axis=(1, 2)).tolist() == [2, 2, 2]
    assert x[0, 0, 1, 1, 1] == x[0, 2, 1, 2, 2] == 1          # t - 50 ms: 50 ms and 250 ms
    assert x[1, 0, 1, 2, 2] == x[1, 2, 0, 3, 3] == 1          # t - 250 ms: 50 ms and 250 ms
    assert x[2, 0, 0, 3, 3] == x[2, 2, 0, 4, 4] == 1          # t - 450 ms: 50 ms and 250 ms


def test_downsampling_pools_pixels_and_a_size_that_does_not_divide_128_keeps_the_edge(tmp_path):
    events = [(0, 0, 1, 1_000, 1), (2, 2, 1, 1_001, 1), (3, 0, 1, 1_002, 1), (127, 127, 0, 1_003, 1),
              (126, 125, 0, 1_004, 0)]  # the last is not valid
    root = gesture_files(tmp_path, events, [(1, 0, 10_000)])
    x, _ = load_dvs_gesture(root, num_bins=1, downsample=3, cache=False)
    assert x.shape == (1, 1, 2, 43, 43) and x.sum() == 4
    assert x[0, 0, 1, 0, 0] == 2 and x[0, 0, 1, 0, 1] == 1 and x[0, 0, 0, 42, 42] == 1


def test_gestures_after_a_timestamp_overflow_are_cut_on_the_64_bit_clock(tmp_path):
    late = 2**31
    (tmp_path / "user07_led.aedat").write_bytes(SPEC_HEADER + spec_polarity([(1, 1, 1, 2**31 - 10, 1)])
                                                + spec_polarity([(2, 2, 0, 5, 1), (3, 3, 1, 20_005, 1)], overflow=1))
    (tmp_path / "user07_led_labels.csv").write_text(f"class,startTime_usec,endTime_usec\n2,{late},{late + 30_000}\n")
    (tmp_path / "trials_to_test.txt").write_text("user07_led.aedat\n")
    x, y = load_dvs_gesture(tmp_path, "test", dt=0.01, max_time=0.03, downsample=1, cache=False)
    assert y.tolist() == [1] and x.sum() == 2 and x[0, 0, 0, 2, 2] == 1 and x[0, 2, 1, 3, 3] == 1


def test_the_archives_own_dvsgesture_folder_is_named_when_root_is_its_parent(tmp_path):
    """DvsGesture.tar.gz unpacks into a DvsGesture/ folder (SpikingJelly's DVS128Gesture reads
    <extract root>/DvsGesture/trials_to_train.txt). Given the folder it was unpacked into, the
    error said to 'unpack it into' that same folder, which the user had just done."""
    inner = tmp_path / "DvsGesture"
    inner.mkdir()
    gesture_files(inner, [(1, 1, 1, 100_000, 1)], [(1, 0, 200_000)])
    outer, found = re.escape(str(tmp_path)), re.escape(str(inner))
    with pytest.raises(FileNotFoundError, match=rf"{outer}/trials_to_train\.txt not found, but {found}/trials_to_train"
                                                rf"\.txt exists: DvsGesture\.tar\.gz unpacks into a DvsGesture/ "
                                                rf"folder; pass root='{found}'"):
        load_dvs_gesture(tmp_path, dt=0.1, cache=False)
    with pytest.raises(FileNotFoundError, match=r"unpack it and pass its DvsGesture/ folder as root"):
        load_dvs_gesture(tmp_path, "test", dt=0.1, cache=False)  # no list of test trials anywhere
    assert load_dvs_gesture(inner, dt=0.1, cache=False)[1].tolist() == [0]


def test_a_numpy_integer_downsample_is_taken_as_an_int(tmp_path):
    """``downsample=np.int64(2)`` was refused as 'must be a positive int', though num_bins takes one."""
    root = gesture_files(tmp_path, [(127, 0, 1, 1_000, 1)], [(3, 0, 10_000)])
    x, y = load_dvs_gesture(root, num_bins=1, downsample=np.int64(2), cache=False)
    assert x.shape == (1, 1, 2, 64, 64) and x[0, 0, 1, 0, 63] == 1 and y.tolist() == [2]
    load_dvs_gesture(root, num_bins=1, downsample=np.int64(2))
    load_dvs_gesture(root, num_bins=1, downsample=2)
    assert len(list((root / ".etrace_cache").glob("dvs_gesture_train_*.npz"))) == 1  # one key for both
    with pytest.raises(ConfigError, match=r"downsample must be a positive int .*got True"):
        load_dvs_gesture(root, num_bins=1, downsample=True, cache=False)

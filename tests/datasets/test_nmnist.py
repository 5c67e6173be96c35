"""N-MNIST from .bin files packed here byte by byte (etrace_fit/datasets/nmnist.py)."""

import numpy as np
import pytest

from etrace_fit.datasets import load_nmnist, nmnist, read_nmnist_events
from etrace_fit.errors import ConfigError, DataError


def pack(x, y, p, stamps):
    """40-bit events: x, y, then polarity in bit 7 and the 23-bit µs timestamp, big-endian."""
    stamps = np.asarray(stamps, np.int64)
    out = np.zeros((len(stamps), 5), np.uint8)
    out[:, 0], out[:, 1] = x, y
    out[:, 2] = (np.asarray(p) << 7) | ((stamps >> 16) & 0x7F)
    out[:, 3], out[:, 4] = (stamps >> 8) & 0xFF, stamps & 0xFF
    return out.tobytes()


def random_events(n, seed, max_us=300_000):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 34, n), rng.integers(0, 34, n), rng.integers(0, 2, n),
            np.sort(rng.integers(0, max_us, n)))


def test_events_read_back_exactly(tmp_path):
    x, y, p, t = random_events(4000, 0, max_us=2**23)  # every timestamp bit in use
    path = tmp_path / "00001.bin"
    path.write_bytes(pack(x, y, p, t))
    events = read_nmnist_events(path)
    assert events.shape == (4000,) and events.dtype.names == ("x", "y", "p", "t")
    for name, expected in zip("xypt", (x, y, p, t)):
        np.testing.assert_array_equal(events[name], expected)


def test_an_overflow_marker_adds_2_to_the_13_to_later_timestamps_and_is_dropped(tmp_path):
    """As the dataset authors' reader (G. Orchard's event-Python ``read_dataset``, copied
    by tonic) does: every event with y == 240 adds 2**13 µs to its own and all later
    timestamps. We added 2**23, so a file with markers got other times than theirs."""
    x, y, p = [1, 0, 2, 0, 3], [5, 240, 6, 240, 7], [1, 0, 0, 1, 1]
    stamps = [8_000_000, 0, 100, 0, 42]
    path = tmp_path / "wrap.bin"
    path.write_bytes(pack(x, y, p, stamps))
    events = read_nmnist_events(path)
    assert events["x"].tolist() == [1, 2, 3] and events["y"].tolist() == [5, 6, 7] and events["p"].tolist() == [1, 0, 1]
    assert events["t"].tolist() == [8_000_000, 8_192 + 100, 16_384 + 42]
    # bytes written by hand from the format (x, y, polarity | t[22:16], t[15:8], t[7:0]), not through pack()
    path.write_bytes(bytes([3, 4, 0x80, 0x05, 0xDC,      # x=3, y=4, on, t = 0x05DC = 1500
                            0, 240, 0x00, 0x00, 0x00,    # an overflow marker
                            20, 33, 0x01, 0x00, 0x07]))  # x=20, y=33, off, t = 0x010007 = 65543
    events = read_nmnist_events(path)
    assert events.tolist() == [(3, 4, 1, 1_500), (20, 33, 0, 65_543 + 8_192)]


def test_a_truncated_file_names_the_file_and_its_size(tmp_path):
    path = tmp_path / "cut.bin"
    path.write_bytes(pack([1, 2], [1, 2], [0, 1], [5, 6])[:-3])
    with pytest.raises(DataError, match=r"cut\.bin: 7 bytes is not a multiple of 5"):
        read_nmnist_events(path)


def write_split(root, split="Train", per_digit=2, seed=0):
    """``root/<split>/<digit>/<id>.bin`` for digits 0, 3, 9; returns each file's events by label."""
    written = []
    for digit in (0, 3, 9):
        for k in range(per_digit):
            events = random_events(300, seed + 10 * digit + k)
            folder = root / split / str(digit)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{k:05d}.bin").write_bytes(pack(*events))
            written.append((digit, events))
    return written


def dense(written, dt, steps):
    out = np.zeros((len(written), steps, 2, 34, 34))
    for i, (_, (x, y, p, t)) in enumerate(written):
        bins = t // int(round(dt * 1e6))
        kept = bins < steps
        np.add.at(out[i], (bins[kept], p[kept], y[kept], x[kept]), 1)
    return out


def test_load_nmnist_counts_every_event_at_its_bin_polarity_and_pixel(tmp_path):
    written = write_split(tmp_path)
    x, y = load_nmnist(tmp_path, "train", dt=0.01, max_time=0.3, cache=False)
    assert x.shape == (6, 30, 2, 34, 34) and x.dtype == np.float32
    assert y.tolist() == [0, 0, 3, 3, 9, 9] and y.dtype == np.int32
    np.testing.assert_array_equal(x, dense(written, 0.01, 30))
    flat, _ = load_nmnist(tmp_path, "train", dt=0.01, max_time=0.3, flatten=True, cache=False)
    assert flat.shape == (6, 30, 2312)
    np.testing.assert_array_equal(flat, x.reshape(6, 30, 2312))


def test_variable_length_pads_to_the_longest_and_masks_the_rest(tmp_path):
    written = write_split(tmp_path, "Test", per_digit=1)
    x, y, mask = load_nmnist(tmp_path, "test", dt=0.001, variable_length=True, cache=False)
    lengths = np.array([events[3].max() // 1000 + 1 for _, events in written])
    assert x.shape == (3, lengths.max(), 2, 34, 34)
    np.testing.assert_array_equal(mask, np.arange(lengths.max()) < lengths[:, None])
    np.testing.assert_array_equal(x, dense(written, 0.001, lengths.max()))


def test_the_cache_is_read_on_the_second_call_and_rebuilt_for_another_dt(tmp_path, monkeypatch):
    written = write_split(tmp_path)
    first, _ = load_nmnist(tmp_path, dt=0.01, max_time=0.3)

    def no_reading(path):
        raise AssertionError(f"{path} was read again")

    monkeypatch.setattr(nmnist, "read_nmnist_events", no_reading)
    again, y = load_nmnist(tmp_path, dt=0.01, max_time=0.3)
    np.testing.assert_array_equal(again, first)
    with pytest.raises(AssertionError, match="was read again"):
        load_nmnist(tmp_path, dt=0.02, max_time=0.3)
    monkeypatch.undo()
    coarse, _ = load_nmnist(tmp_path, dt=0.02, max_time=0.3)
    np.testing.assert_array_equal(coarse, dense(written, 0.02, 15))


def test_a_missing_split_names_the_layout_and_where_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no \.bin files in .*Train.*root/Train/<digit>/<id>\.bin.*"
                                                r"https://www\.garrickorchard\.com/datasets/n-mnist"):
        load_nmnist(tmp_path, "train", dt=0.01)
    with pytest.raises(ConfigError, match="split must be one of"):
        load_nmnist(tmp_path, "valid", dt=0.01)


def test_an_event_off_the_sensor_names_that_event_and_the_sensor(tmp_path):
    """The message named max(x) and max(y), of different events: 'an event at x=40, y=50'
    that no event of the file is."""
    folder = tmp_path / "Train" / "1"
    folder.mkdir(parents=True)
    (folder / "bad.bin").write_bytes(pack([5, 40, 1], [5, 1, 50], [0, 1, 0], [10, 20, 30]))
    with pytest.raises(DataError, match=r"bad\.bin: event 1 \(x=40, y=1, t=20 µs\) is outside the 34 x 34 N-MNIST "
                                        r"sensor \(x < 34, y < 34\); 2 of 3 events are off it"):
        load_nmnist(tmp_path, dt=0.01, cache=False)


@pytest.mark.parametrize("content, found", [(b"", r"0 bytes"),
                                            (pack([0, 0], [240, 240], [0, 0], [0, 0]),
                                             r"only 2 timestamp-overflow markers, y = 240")],
                         ids=["zero-bytes", "markers-only"])
def test_a_file_without_events_is_an_error_naming_it_not_an_empty_labelled_sample(tmp_path, content, found):
    """A 0-byte .bin (a failed unzip) loaded as an all-zero sample with its folder's label."""
    write_split(tmp_path, "Test", per_digit=1)
    (tmp_path / "Test" / "3" / "empty.bin").write_bytes(content)
    assert read_nmnist_events(tmp_path / "Test" / "3" / "empty.bin").size == 0  # the reader returns what is there
    with pytest.raises(DataError, match=rf"3/empty\.bin: no events \({found}\); an N-MNIST file holds the recording "
                                        r"of one digit"):
        load_nmnist(tmp_path, "test", dt=0.01, max_time=0.3, cache=False)


def test_a_file_moved_to_another_digit_folder_is_relabelled_through_the_cache(tmp_path):
    """The cache key held the files' count, bytes and newest mtime only: a file moved to
    fix its label (a move keeps the mtime) gave the old labels, silently."""
    write_split(tmp_path, "Test", per_digit=1)
    _, y = load_nmnist(tmp_path, "test", dt=0.01)
    assert y.tolist() == [0, 3, 9]
    (tmp_path / "Test" / "5").mkdir()
    (tmp_path / "Test" / "3" / "00000.bin").rename(tmp_path / "Test" / "5" / "00000.bin")
    assert load_nmnist(tmp_path, "test", dt=0.01)[1].tolist() == [0, 5, 9]


def test_a_folder_that_is_not_a_digit_0_to_9_is_refused(tmp_path):
    write_split(tmp_path, "Train", per_digit=1)
    (tmp_path / "Train" / "10").mkdir()
    (tmp_path / "Train" / "10" / "a.bin").write_bytes(pack([1], [2], [0], [5]))
    with pytest.raises(DataError, match=r"Train has the folder\(s\) 10; a folder's name is its samples' label, a "
                                         r"digit 0\.\.9"):
        load_nmnist(tmp_path, "train", dt=0.01, cache=False)


def test_a_cache_written_before_empty_files_were_refused_is_not_reused(tmp_path, monkeypatch):
    """The readers now refuse files they used to load (and read overflow markers
    otherwise): a cache file of the old format must be rebuilt, not returned."""
    from etrace_fit.datasets import events as events_module

    folder = tmp_path / "Test" / "4"
    folder.mkdir(parents=True)
    (folder / "00001.bin").write_bytes(b"")
    key = {"dataset": "nmnist", "split": "test", "dt": 0.001, "num_bins": None, "max_time": 0.3,
           "source": events_module.fingerprint([folder / "00001.bin"])}
    stale = {"x": np.zeros((1, 300, 2312), np.float32), "y": np.array([4], np.int32), "lengths": np.array([1])}
    monkeypatch.setattr(events_module, "CACHE_FORMAT", 2)  # as the loader before this fix wrote it
    events_module.cached(events_module.cache_file(tmp_path / ".etrace_cache", "nmnist_test", key), lambda: stale,
                         key=key)
    assert load_nmnist(tmp_path, "test", dt=0.001, max_time=0.3)[1].tolist() == [4]  # that cache is found under 2
    monkeypatch.undo()
    with pytest.raises(DataError, match=r"00001\.bin: no events \(0 bytes\)"):
        load_nmnist(tmp_path, "test", dt=0.001, max_time=0.3)


# ---- bytes written from the published layout (garrickorchard.com/datasets/n-mnist): one 40-bit big-endian word per
# event, bits 39-32 x, 31-24 y, bit 23 polarity (1 ON), bits 22-0 the timestamp in µs
def spec_event(x, y, on, stamp):
    return (x << 32 | y << 24 | on << 23 | stamp).to_bytes(5, "big")


def test_bit_23_is_the_polarity_and_on_events_fill_channel_1(tmp_path):
    folder = tmp_path / "Train" / "4"
    folder.mkdir(parents=True)
    (folder / "00001.bin").write_bytes(spec_event(2, 5, 1, 1_500) + spec_event(33, 0, 0, 2_500)
                                       + spec_event(0, 33, 1, 2**23 - 1))  # every timestamp bit set, and ON
    events = read_nmnist_events(folder / "00001.bin")
    assert events.tolist() == [(2, 5, 1, 1_500), (33, 0, 0, 2_500), (0, 33, 1, 2**23 - 1)]
    x, y = load_nmnist(tmp_path, "train", dt=0.001, max_time=0.003, cache=False)
    assert y.tolist() == [4] and x.shape == (1, 3, 2, 34, 34) and x.sum() == 2  # the third is past max_time
    assert x[0, 1, 1, 5, 2] == 1 and x[0, 2, 0, 0, 33] == 1  # (polarity, y, x); OFF is channel 0
    flat, _ = load_nmnist(tmp_path, "train", dt=0.001, max_time=0.003, flatten=True, cache=False)
    assert np.flatnonzero(flat[0].sum(axis=0)).tolist() == [33, 34 * 34 + 5 * 34 + 2]  # p * 1156 + y * 34 + x


def test_times_after_overflow_markers_run_past_2_to_the_23(tmp_path):
    """The authors' reader adds 2**13 µs per marker (y = 240) to the stamps after it, so
    times go past the 23-bit field's 2**23 - 1 without wrapping."""
    path = tmp_path / "late.bin"
    path.write_bytes(spec_event(1, 1, 0, 2**23 - 2) + spec_event(0, 240, 0, 0) + spec_event(7, 3, 1, 2**23 - 1)
                     + spec_event(0, 240, 1, 5) + spec_event(0, 240, 0, 0) + spec_event(8, 4, 0, 0))
    assert read_nmnist_events(path).tolist() == [(1, 1, 0, 2**23 - 2), (7, 3, 1, 2**23 - 1 + 2**13),
                                                 (8, 4, 0, 3 * 2**13)]


@pytest.mark.parametrize("x, y", [(34, 0), (0, 34), (255, 255), (0, 239), (0, 241)])
def test_an_event_just_off_the_34_by_34_sensor_is_refused(tmp_path, x, y):
    folder = tmp_path / "Test" / "0"
    folder.mkdir(parents=True)
    (folder / "a.bin").write_bytes(spec_event(33, 33, 0, 10) + spec_event(x, y, 1, 20))
    with pytest.raises(DataError, match=rf"a\.bin: event 1 \(x={x}, y={y}, t=20 µs\) is outside the 34 x 34"):
        load_nmnist(tmp_path, "test", dt=0.001, cache=False)


def test_labels_come_from_the_digit_folders_of_the_split_alone(tmp_path):
    for split, digit, name in [("Train", 8, "00003.bin"), ("Train", 2, "00001.bin"), ("Train", 2, "00002.bin"),
                               ("Test", 5, "00001.bin")]:
        (tmp_path / split / str(digit)).mkdir(parents=True, exist_ok=True)
        (tmp_path / split / str(digit) / name).write_bytes(spec_event(digit, 0, 0, 100 * digit))
    (tmp_path / "Train" / "2" / "notes.txt").write_text("not an event file")
    (tmp_path / "Train" / "__MACOSX").mkdir()
    x, y = load_nmnist(tmp_path, "train", dt=0.001, cache=False)
    assert y.tolist() == [2, 2, 8]  # digit, then file name
    assert [int(np.flatnonzero(sample.sum(axis=0))[0]) for sample in x.reshape(3, -1, 2312)] == [2, 2, 8]
    assert load_nmnist(tmp_path, "test", dt=0.001, cache=False)[1].tolist() == [5]


def test_a_truncated_file_stops_the_loader_naming_it(tmp_path):
    folder = tmp_path / "Train" / "6"
    folder.mkdir(parents=True)
    (folder / "good.bin").write_bytes(spec_event(1, 1, 0, 10))
    (folder / "short.bin").write_bytes(spec_event(1, 1, 0, 10) + spec_event(2, 2, 1, 20)[:4])
    with pytest.raises(DataError, match=r"6/short\.bin: 9 bytes is not a multiple of 5"):
        load_nmnist(tmp_path, "train", dt=0.001, cache=False)

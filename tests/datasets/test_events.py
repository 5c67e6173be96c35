"""Binning event streams, padding to one length, and the .npz cache (etrace_fit/datasets/events.py)."""

import os

import numpy as np
import pytest

from etrace_fit.datasets import bin_events, bin_samples, cached, pad_sequences
from etrace_fit.datasets import events as events_module
from etrace_fit.datasets.events import cache_file
from etrace_fit.errors import ConfigError, DataError
from etrace_fit.training.data import Batch, placement


def test_every_event_is_counted_in_its_bin_and_unit():
    rng = np.random.default_rng(0)
    bins, units = rng.integers(0, 50, 3000), rng.integers(0, 7, 3000)
    times = (bins + rng.uniform(0.05, 0.95, bins.size)) * 0.002  # inside bin `bins` of width 2 ms
    counts = bin_events(times, units, 7, dt=0.002, duration=0.1)
    expected = np.zeros((50, 7))
    np.add.at(expected, (bins, units), 1)
    assert counts.shape == (50, 7) and counts.dtype == np.float32
    np.testing.assert_array_equal(counts, expected)


def test_events_on_a_bin_edge_land_in_the_bin_that_starts_there():
    # 0.3 / 0.1 is 2.9999999999999996 in floats; the event still belongs to bin 3
    counts = bin_events([0.0, 0.1, 0.3, 0.7], [0, 1, 2, 0], 3, dt=0.1)
    assert counts.shape == (8, 3)  # the last event's bin + 1
    assert [tuple(np.argwhere(counts)[i]) for i in range(4)] == [(0, 0), (1, 1), (3, 2), (7, 0)]


def test_microsecond_timestamps_bin_exactly():
    stamps = np.arange(0, 100_000, 1000)  # one event at the start of every 1 ms bin
    counts = bin_events(stamps * 1e-6, np.zeros(stamps.size, np.int64), 1, dt=0.001)
    np.testing.assert_array_equal(counts[:, 0], np.ones(100))


def test_events_at_or_after_the_duration_are_dropped():
    counts = bin_events([0.05, 0.29, 0.3, 0.5], [0, 0, 0, 0], 1, dt=0.1, duration=0.3)
    np.testing.assert_array_equal(counts[:, 0], [1, 0, 1])


def test_a_duration_between_bin_edges_still_drops_the_events_after_it():
    # T = ceil(0.25 / 0.1) = 3: the last bin is partial, [0.2, 0.25); 0.27 and 0.29 s are outside the window
    counts = bin_events([0.05, 0.21, 0.25, 0.27, 0.29], [0, 0, 0, 0, 0], 1, dt=0.1, duration=0.25)
    np.testing.assert_array_equal(counts[:, 0], [1, 0, 1])


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_times_on_an_edge_stored_in_a_short_float_land_in_the_bin_that_starts_there(dtype):
    # float32(0.03) = 0.029999999 and float16(0.03) = 0.029998779: rounding of the edge, not an earlier time
    k = np.arange(1, 11)
    counts = bin_events((k * 0.01).astype(dtype), np.zeros(10, np.int64), 1, dt=0.01, duration=0.2)
    np.testing.assert_array_equal(np.flatnonzero(counts[:, 0]), k)
    # times that are not an edge's rounding keep their floor: one float16 step below 0.03 is bin 2
    below = np.nextafter(np.float16(0.03), np.float16(0))
    assert np.flatnonzero(bin_events(np.array([below]), [0], 1, dt=0.01, duration=0.05)[:, 0]).tolist() == [2]


def test_samples_whose_events_all_fall_after_max_time_warn_and_all_of_them_is_an_error():
    in_ms = [(np.array([12.0, 350.0]), np.array([1, 2])), (np.array([40.0]), np.array([3]))]
    with pytest.raises(DataError, match=r"shd_train\.h5: 2 of 2 samples have events but none before max_time = 1\.0 s "
                                        r"\(the earliest of theirs at t = 12 s\).*seconds \(not ms or µs\)"):
        bin_samples(iter(in_ms), 4, dt=0.01, max_time=1.0, source="shd_train.h5")
    mixed = [(np.array([0.5]), np.array([0])), (np.array([3.0]), np.array([1])), (np.array([]), np.array([], int))]
    with pytest.warns(RuntimeWarning, match=r"1 of 3 samples have events but none before max_time"):
        x, _ = bin_samples(iter(mixed), 4, dt=0.1, max_time=1.0)
    assert x.shape == (3, 10, 4) and x.sum() == 1


def test_num_bins_without_a_duration_puts_the_last_event_in_the_last_bin():
    counts = bin_events([0.0, 0.5, 1.0], [0, 1, 1], 2, num_bins=4)
    np.testing.assert_array_equal(counts, [[1, 0], [0, 0], [0, 1], [0, 1]])
    with_window = bin_events([0.0, 0.5, 1.0], [0, 1, 1], 2, num_bins=4, duration=1.0)
    np.testing.assert_array_equal(with_window, [[1, 0], [0, 0], [0, 1], [0, 0]])  # 1.0 is past the window


def test_no_events_give_zero_steps_with_dt_and_zeros_with_num_bins():
    assert bin_events([], np.array([], np.int64), 3, dt=0.1).shape == (0, 3)
    np.testing.assert_array_equal(bin_events([], np.array([], np.int64), 3, num_bins=2), np.zeros((2, 3)))


@pytest.mark.parametrize("times, units, match", [
    ([0.1, 0.2], [0], r"times and units must be 1-D arrays of one length.*\(2,\) and units \(1,\)"),
    ([0.1, -0.2], [0, 1], r"finite and >= 0.*times\[1\] = -0.2"),
    ([0.1, np.nan], [0, 1], r"finite and >= 0.*times\[1\] = nan"),
    ([0.1, 0.2], [0, 4], r"units must be in \[0, 4\).*units\[1\] = 4"),
    ([0.1, 0.2], [0.0, 1.0], r"units must be integer unit indices, got dtype float64"),
])
def test_bad_events_raise_data_error_naming_the_argument(times, units, match):
    with pytest.raises(DataError, match=match):
        bin_events(times, units, 4, dt=0.1)


@pytest.mark.parametrize("kwargs, match", [
    (dict(), "exactly one of dt"),
    (dict(dt=0.1, num_bins=3), "exactly one of dt"),
    (dict(dt=-1.0), "dt must be a positive number"),
    (dict(num_bins=0), "num_bins must be a positive int"),
    (dict(dt=0.1, duration=float("inf")), "duration / max_time must be"),
])
def test_bad_binning_raises_config_error(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        bin_events([0.1], [0], 1, **kwargs)


@pytest.mark.parametrize("kwargs, match", [(dict(dt=True), r"dt must be a positive number of seconds, got True"),
                                           (dict(dt=0.1, duration=True), r"duration / max_time must be .*got True")])
def test_a_bool_for_seconds_is_refused_as_one_for_num_bins_is(kwargs, match):
    """``dt=True`` binned at 1 s (``True == 1``) with no word, where ``num_bins=True`` was refused."""
    with pytest.raises(ConfigError, match=match):
        bin_events([0.1], [0], 1, **kwargs)


def test_pad_sequences_pads_with_zeros_and_masks_the_real_steps():
    x, mask = pad_sequences([np.ones((2, 3)), 2 * np.ones((4, 3)), np.ones((1, 3))])
    assert x.shape == (3, 4, 3) and mask.shape == (3, 4) and mask.dtype == bool
    np.testing.assert_array_equal(mask.sum(1), [2, 4, 1])
    np.testing.assert_array_equal(x[0, :, 0], [1, 1, 0, 0])
    np.testing.assert_array_equal(x[1, :, 0], [2, 2, 2, 2])
    assert pad_sequences([np.ones((2, 3))], length=5)[0].shape == (1, 5, 3)
    with pytest.raises(DataError, match=r"sequence 1 has shape \(2, 4\)"):
        pad_sequences([np.ones((2, 3)), np.ones((2, 4))])
    with pytest.raises(ConfigError, match="shorter than the longest"):
        pad_sequences([np.ones((3, 1))], length=2)


def test_the_mask_gives_padded_steps_no_loss_weight_in_the_trainer():
    x, mask = pad_sequences([np.ones((2, 5)), np.ones((4, 5))])
    xs, ys, weight = placement(Batch(x, np.array([0, 1]), mask), "mask", time_major=False)
    assert xs.shape == (4, 2, 5)
    np.testing.assert_allclose(weight, [[0.5, 0.25], [0.5, 0.25], [0, 0.25], [0, 0.25]])


def test_bin_samples_lengths_end_at_each_samples_last_event():
    samples = [([0.01, 0.15], [0, 1]), ([0.35], [1]), ([], np.array([], np.int64))]
    x, lengths = bin_samples(samples, 2, dt=0.1)
    assert x.shape == (3, 4, 2)  # padded to the longest sample (its last event in bin 3)
    np.testing.assert_array_equal(lengths, [2, 4, 1])  # an empty sample keeps one step
    fixed, fixed_lengths = bin_samples(iter(samples), 2, dt=0.1, max_time=1.0, count=3)
    assert fixed.shape == (3, 10, 2)
    np.testing.assert_array_equal(fixed[:, :4], x)
    np.testing.assert_array_equal(fixed_lengths, lengths)


def test_cached_builds_once_and_reads_the_file_after(tmp_path):
    calls = []

    def build():
        calls.append(1)
        return {"x": np.arange(6.0).reshape(2, 3), "y": np.array([1, 2], np.int32)}

    path = tmp_path / "c" / "data.npz"
    first = cached(path, build, key={"dt": 0.1})
    second = cached(path, build, key={"dt": 0.1})
    assert calls == [1] and path.exists()
    np.testing.assert_array_equal(second["x"], first["x"])
    assert second["y"].dtype == np.int32
    assert [p.name for p in path.parent.iterdir()] == ["data.npz"]  # no temporary file left


def test_cached_rebuilds_when_the_key_changes_or_the_file_is_corrupt(tmp_path):
    path = tmp_path / "data.npz"
    cached(path, lambda: {"x": np.zeros(2)}, key={"dt": 0.1})
    assert cached(path, lambda: {"x": np.ones(2)}, key={"dt": 0.2})["x"].tolist() == [1, 1]
    assert cached(path, lambda: {"x": np.full(2, 5.0)}, key={"dt": 0.2})["x"].tolist() == [1, 1]
    path.write_bytes(b"not a zip file")
    assert cached(path, lambda: {"x": np.full(2, 7.0)}, key={"dt": 0.2})["x"].tolist() == [7, 7]


def test_cache_file_names_differ_by_binning():
    assert cache_file("c", "shd_train", {"dt": 0.1}) != cache_file("c", "shd_train", {"dt": 0.2})
    assert cache_file("c", "shd_train", {"dt": 0.1}) == cache_file("c", "shd_train", {"dt": 0.1})


def test_cached_refuses_object_arrays_and_leaves_no_file(tmp_path):
    with pytest.raises(DataError, match="'x' has dtype object"):
        cached(tmp_path / "data.npz", lambda: {"x": np.array([np.zeros(1), np.zeros(2)], dtype=object)})
    assert os.listdir(tmp_path) == []


def test_a_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    def broken_savez(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", broken_savez)
    with pytest.raises(OSError, match="disk full"):
        cached(tmp_path / "data.npz", lambda: {"x": np.zeros(2)})
    assert os.listdir(tmp_path) == []


def test_times_in_the_wrong_unit_are_a_data_error_not_a_memory_error():
    """A timestamp in µs read as seconds asked for 5 TiB of bins."""
    with pytest.raises(DataError, match=r"bin_events: the events span 10000000001 bins of 700 units .* the last event "
                                        r"is at t = 1e\+06; are the times in seconds \(not µs or ms\)"):
        bin_events([0.0, 1e6], [0, 1], 700, dt=1e-4)


# ---- checked against a plain numpy histogram, written from the documented rule (floor(t / width), [0, duration))
def off_the_edges(times, width):
    """The times not within 1e-6 bins of an edge, where numpy's float rounding and ours may differ."""
    phase = times / width - np.floor(times / width)
    return (phase > 1e-6) & (phase < 1 - 1e-6)


@pytest.mark.parametrize("binning", [dict(dt=0.01, duration=0.3), dict(dt=0.01), dict(num_bins=7, duration=0.42),
                                     dict(num_bins=7)], ids=["dt-window", "dt", "num_bins-window", "num_bins"])
def test_counts_equal_a_numpy_histogram_of_the_same_events(binning):
    rng = np.random.default_rng(11)
    times, units = rng.uniform(0, 0.5, 6000), rng.integers(0, 9, 6000)
    if "dt" in binning:
        width = binning["dt"]
        end = binning.get("duration", np.floor(times.max() / width) * width + width)
    else:
        end = binning.get("duration", times.max())
        width = end / binning["num_bins"]
    keep = off_the_edges(times, width) | (times == times.max())
    times, units = times[keep], units[keep]
    steps = int(round(end / width))
    inside = times < end if "duration" in binning else np.ones(times.size, bool)  # histogram's last edge is closed
    expected, _, _ = np.histogram2d(times[inside], units[inside], bins=[np.linspace(0, end, steps + 1),
                                                                          np.arange(10)])
    counts = bin_events(times, units, 9, **binning)
    assert counts.shape == (steps, 9)
    np.testing.assert_array_equal(counts, expected)


@pytest.mark.parametrize("dtype, most", [(np.uint8, 255), (np.int8, 127), (np.int16, 32767), (np.float16, 2048)])
def test_a_dtype_that_cannot_hold_a_count_is_refused_not_wrapped(dtype, most):
    """``dtype=np.uint8`` with 300 events in one bin and unit gave 44 (300 mod 256), and
    float16 gave 2048 for 2049: the docstring's 'counts are exact' did not hold."""
    units = np.zeros(most + 1, np.int64)
    exact = bin_events(np.full(most, 0.015), units[:-1], 2, dt=0.01, dtype=dtype)
    assert exact.dtype == dtype and exact[1, 0] == most and exact.sum() == most
    name = np.dtype(dtype).name
    with pytest.raises(ConfigError, match=rf"bin_events: dtype={name} holds counts up to {most} exactly, but "
                                          rf"{most + 1} events fall in one bin and unit \(bin 1, unit 0\)"):
        bin_events(np.full(most + 1, 0.015), units, 2, dt=0.01, dtype=dtype)


def test_a_bool_dtype_gives_whether_any_event_fell_in_the_bin():
    """Binary frames, a common SNN input: any count becomes True, none False."""
    frames = bin_events([0.011, 0.012, 0.013, 0.025], [1, 1, 1, 0], 2, dt=0.01, dtype=bool)
    assert frames.dtype == np.bool_
    np.testing.assert_array_equal(frames, [[False, False], [False, True], [True, False]])


def test_padded_samples_equal_each_sample_binned_alone_and_the_mask_covers_their_events():
    rng = np.random.default_rng(5)
    samples = [(rng.uniform(0, end, 50), rng.integers(0, 4, 50)) for end in (0.031, 0.2, 0.077)]
    x, lengths = bin_samples(samples, 4, dt=0.01)
    alone = [bin_events(t, u, 4, dt=0.01) for t, u in samples]
    assert x.shape == (3, max(len(a) for a in alone), 4)
    mask = np.arange(x.shape[1]) < lengths[:, None]
    for i, a in enumerate(alone):
        assert lengths[i] == len(a) == int(samples[i][0].max() // 0.01) + 1
        np.testing.assert_array_equal(x[i, : len(a)], a)
        assert not x[i][~mask[i]].any()  # padding holds nothing
        assert x[i].sum() == 50


def test_binning_more_than_the_machines_memory_is_refused_before_the_fill(monkeypatch):
    """All of N-MNIST's training set in 1 ms bins is 60000 x 300 x 2312 float32 counts,
    ~155 GiB: the fill had run until the machine swapped or killed the process. Now a
    ConfigError names the size and what to change, before a sample is binned when the
    count and length are known, else as soon as the samples binned are too many."""
    monkeypatch.setattr(events_module, "host_memory", lambda: 1000)
    read = []

    def samples(n):
        for k in range(n):
            read.append(k)
            yield np.array([0.001, 0.002]), np.array([0, 1])

    with pytest.raises(ConfigError, match=r"^loader: the binned data \(3 samples x 10 steps x 10 units\) would take "
                                          r"0\.0 GiB \(float32\), more than this machine's 0\.0 GiB of memory: bin "
                                          r"coarser \(a larger dt or fewer num_bins\)"):
        bin_samples(samples(3), 10, dt=0.001, max_time=0.01, count=3, source="loader")
    assert read == []
    with pytest.raises(ConfigError, match=r"^loader: the binned data of the first 3 samples \(10 units\) takes"):
        bin_samples(samples(20), 10, dt=0.001, max_time=0.01, source="loader")
    assert read == [0, 1, 2]  # 3 x 10 x 10 x 4 bytes > 1000: stopped there
    monkeypatch.setattr(events_module, "host_memory", lambda: 10**6)
    x, lengths = bin_samples(samples(3), 10, dt=0.001, max_time=0.01, count=3)
    assert x.shape == (3, 10, 10) and lengths.tolist() == [3, 3, 3]


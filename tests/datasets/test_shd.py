"""SHD / SSC from HDF5 files written here in the published layout (etrace_fit/datasets/shd.py)."""

import gzip
import os
import sys
import warnings

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")

from etrace_fit.datasets import load_shd, load_ssc  # noqa: E402
from etrace_fit.datasets import shd  # noqa: E402
from etrace_fit.datasets.events import bin_samples as real_bin  # noqa: E402
from etrace_fit.errors import ConfigError, DataError  # noqa: E402

DT = 0.01


def write_shd(path, times, units, labels, time_dtype=np.float32, label_dtype=np.uint8):
    """The published layout: spikes/times and spikes/units as variable-length arrays,
    labels, and the extra/ group (speaker, keys) the real files carry."""
    with h5py.File(path, "w") as file:
        t = file.create_dataset("spikes/times", (len(times),), dtype=h5py.vlen_dtype(np.dtype(time_dtype)))
        u = file.create_dataset("spikes/units", (len(units),), dtype=h5py.vlen_dtype(np.dtype(np.uint16)))
        for i, (sample_times, sample_units) in enumerate(zip(times, units)):
            t[i] = np.asarray(sample_times, time_dtype)
            u[i] = np.asarray(sample_units, np.uint16)
        file.create_dataset("labels", data=np.asarray(labels, label_dtype))
        file.create_dataset("extra/speaker", data=np.arange(len(labels), dtype=np.uint8))
        file.create_dataset("extra/keys", data=np.array([b"null", b"eins"]))


def random_samples(n=5, seed=0):
    """Per sample: the bin and unit of each spike, and its time (inside that bin of width DT)."""
    rng = np.random.default_rng(seed)
    bins, units, times = [], [], []
    for i in range(n):
        count = rng.integers(5, 40)
        last_bin = rng.integers(10, 50)  # samples of different lengths
        b = rng.integers(0, last_bin, count)
        b[0] = last_bin - 1
        bins.append(b)
        units.append(rng.integers(0, 700, count))
        times.append((b + 0.5) * DT)
    labels = rng.integers(0, 20, n)
    return bins, units, times, labels


def dense(bins, units, steps):
    out = np.zeros((len(bins), steps, 700))
    for i, (b, u) in enumerate(zip(bins, units)):
        np.add.at(out[i], (b, u), 1)
    return out


@pytest.fixture
def shd_root(tmp_path):
    bins, units, times, labels = random_samples()
    write_shd(tmp_path / "shd_train.h5", times, units, labels)
    return tmp_path, bins, units, labels


def test_spikes_land_in_their_exact_bins_and_units(shd_root):
    root, bins, units, labels = shd_root
    x, y = load_shd(root, "train", dt=DT, max_time=0.5, cache=False)
    assert x.shape == (5, 50, 700) and x.dtype == np.float32
    np.testing.assert_array_equal(x, dense(bins, units, 50))
    np.testing.assert_array_equal(y, labels)
    assert y.dtype == np.int32


def test_float16_times_as_published_are_read(tmp_path):
    write_shd(tmp_path / "shd_test.h5", [[0.125, 0.5]], [[3, 699]], [7], time_dtype=np.float16)
    x, y = load_shd(tmp_path, "test", dt=0.25, max_time=1.0, cache=False)
    assert x.shape == (1, 4, 700) and x[0, 0, 3] == 1 and x[0, 2, 699] == 1 and x.sum() == 2 and y.tolist() == [7]


def test_times_in_ms_without_max_time_warn_with_the_sample_and_the_steps(tmp_path):
    write_shd(tmp_path / "shd_test.h5", [[0.5, 3.0], [12.0, 800.0]], [[1, 2], [3, 4]], [0, 1])
    with pytest.warns(RuntimeWarning, match=r"shd_test.h5: sample 1 has a spike at t = 800, but recordings last about "
                                            r"1.4 s, so each sample is binned to 80001 steps: are the times in "
                                            r"seconds \(not ms or µs\)\? Or give max_time") as caught:
        x, _ = load_shd(tmp_path, "test", dt=0.01, max_time=None, cache=False)
    assert x.shape == (2, 80001, 700) and caught[0].filename == __file__
    write_shd(tmp_path / "shd_train.h5", [[0.5, 1.3]], [[1, 2]], [0])  # a real recording's length: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_shd(tmp_path, "train", dt=0.01, max_time=None, cache=False)[0].shape == (1, 131, 700)


def test_max_time_drops_later_spikes_and_num_bins_splits_it(shd_root):
    root, bins, units, _ = shd_root
    x, _ = load_shd(root, dt=DT, max_time=0.2, cache=False)
    kept = [(b[b < 20], u[b < 20]) for b, u in zip(bins, units)]
    np.testing.assert_array_equal(x, dense([k[0] for k in kept], [k[1] for k in kept], 20))
    coarse, _ = load_shd(root, num_bins=5, max_time=0.5, cache=False)  # bins of 0.1 s = 10 of DT
    np.testing.assert_array_equal(coarse, dense([b // 10 for b in bins], units, 5))


def test_variable_length_masks_end_at_each_samples_last_spike(shd_root):
    root, bins, units, labels = shd_root
    x, y, mask = load_shd(root, dt=DT, max_time=None, variable_length=True, cache=False)
    lengths = np.array([b.max() + 1 for b in bins])
    assert x.shape == (5, lengths.max(), 700) and mask.shape == (5, lengths.max()) and mask.dtype == bool
    np.testing.assert_array_equal(mask.sum(axis=1), lengths)
    np.testing.assert_array_equal(mask, np.arange(lengths.max()) < lengths[:, None])
    np.testing.assert_array_equal(x, dense(bins, units, lengths.max()))
    _, _, fixed_mask = load_shd(root, dt=DT, max_time=0.5, variable_length=True, cache=False)
    assert fixed_mask.shape == (5, 50)
    np.testing.assert_array_equal(fixed_mask.sum(axis=1), lengths)  # padding to max_time is masked too


def test_the_second_call_reads_the_cache_not_the_file(shd_root, monkeypatch):
    root = shd_root[0]
    x, y = load_shd(root, dt=DT, max_time=0.5)
    assert len(list((root / ".etrace_cache").glob("shd_train_*.npz"))) == 1

    def no_reading(*args, **kwargs):
        raise AssertionError("the HDF5 file was read again")

    monkeypatch.setattr(shd, "_read", no_reading)
    again_x, again_y = load_shd(root, dt=DT, max_time=0.5)
    np.testing.assert_array_equal(again_x, x)
    np.testing.assert_array_equal(again_y, y)
    _, _, mask = load_shd(root, dt=DT, max_time=0.5, variable_length=True)  # the mask comes from the cache too
    assert mask.shape == (5, 50)
    with pytest.raises(AssertionError, match="read again"):
        load_shd(root, dt=2 * DT, max_time=0.5)  # another dt: the stale file is not reused


def test_another_dt_builds_another_cache_file(shd_root):
    root, bins, units, _ = shd_root
    load_shd(root, dt=DT, max_time=0.5)
    coarse, _ = load_shd(root, dt=2 * DT, max_time=0.5)
    assert coarse.shape == (5, 25, 700)
    np.testing.assert_array_equal(coarse, dense([b // 2 for b in bins], units, 25))
    assert len(list((root / ".etrace_cache").glob("shd_train_*.npz"))) == 2


def test_a_replaced_file_is_read_again(shd_root, tmp_path):
    root = shd_root[0]
    first, _ = load_shd(root, dt=DT, max_time=0.5, cache=tmp_path / "elsewhere")
    write_shd(root / "shd_train.h5", [[0.005]], [[1]], [3])
    second, y = load_shd(root, dt=DT, max_time=0.5, cache=tmp_path / "elsewhere")
    assert second.shape == (1, 50, 700) and second[0, 0, 1] == 1 and y.tolist() == [3]


def test_ssc_has_a_validation_split(tmp_path):
    write_shd(tmp_path / "ssc_valid.h5", [[0.0, 0.015]], [[0, 1]], [34])
    x, y = load_ssc(tmp_path, "valid", dt=DT, max_time=0.1, cache=False)
    assert x.shape == (1, 10, 700) and x[0, 0, 0] == 1 and x[0, 1, 1] == 1 and y.tolist() == [34]
    with pytest.raises(ConfigError, match=r"split must be one of \('train', 'test'\), got 'valid'"):
        load_shd(tmp_path, "valid", dt=DT)


def test_a_missing_file_names_the_path_the_layout_and_the_url(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        load_shd(tmp_path, "test", dt=DT)
    message = str(info.value)
    assert str(tmp_path / "shd_test.h5") in message and "spikes/times" in message and "spikes/units" in message
    assert "https://zenkelab.org/datasets/shd_test.h5.gz" in message and "download=True" in message


def test_a_published_gz_downloaded_by_hand_is_unpacked_beside_it(tmp_path):
    """The zenkelab files are published gzipped; one saved by hand into root was 'not
    found' (the message said to gunzip it). A corrupt one is a DataError and leaves no
    .h5 behind."""
    write_shd(tmp_path / "made.h5", [[0.0, 0.015]], [[0, 1]], [3])
    with open(tmp_path / "made.h5", "rb") as source, gzip.open(tmp_path / "shd_test.h5.gz", "wb") as target:
        target.write(source.read())
    x, y = load_shd(tmp_path, "test", dt=DT, max_time=0.1, cache=False)
    assert x.shape == (1, 10, 700) and x[0, 0, 0] == 1 and x[0, 1, 1] == 1 and y.tolist() == [3]
    assert (tmp_path / "shd_test.h5").exists() and (tmp_path / "shd_test.h5.gz").exists()
    (tmp_path / "shd_train.h5.gz").write_bytes(gzip.compress(b"an HDF5 file")[:-8])  # cut short
    with pytest.raises(DataError, match=r"shd_train.h5.gz is not a valid gzip file .*/shd_train.h5 was not written"):
        load_shd(tmp_path, "train", dt=DT)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["made.h5", "shd_test.h5", "shd_test.h5.gz",
                                                          "shd_train.h5.gz"]


def test_binning_is_checked_before_the_file(tmp_path):
    with pytest.raises(ConfigError, match="load_shd: give exactly one of dt"):
        load_shd(tmp_path, dt=DT, num_bins=10)


def test_a_file_without_the_layout_names_the_file_and_the_missing_key(tmp_path):
    path = tmp_path / "shd_train.h5"
    with h5py.File(path, "w") as file:
        file.create_dataset("spikes/times", (1,), dtype=h5py.vlen_dtype(np.dtype(np.float32)))
        file.create_dataset("labels", data=np.zeros(1, np.uint8))
    with pytest.raises(DataError, match=r"shd_train\.h5: not the SHD/SSC layout, missing dataset 'spikes/units'"):
        load_shd(tmp_path, dt=DT, cache=False)


def test_a_wrong_dtype_names_the_file_and_the_key(tmp_path):
    path = tmp_path / "shd_train.h5"
    write_shd(path, [[0.1]], [[1]], [0])
    with h5py.File(path, "a") as file:
        del file["labels"]
        file.create_dataset("labels", data=np.zeros(1, np.float32))
    with pytest.raises(DataError, match=r"shd_train\.h5: dataset 'labels' must hold integers, one entry per "
                                        r"sample; got dtype float32"):
        load_shd(tmp_path, dt=DT, cache=False)


def test_a_unit_beyond_700_and_a_non_hdf5_file_are_data_errors(tmp_path):
    write_shd(tmp_path / "shd_train.h5", [[0.1, 0.2]], [[1, 700]], [0])
    with pytest.raises(DataError, match=r"shd_train\.h5: sample 0 has unit 700; expected 0 <= unit < 700"):
        load_shd(tmp_path, dt=DT, cache=False)
    (tmp_path / "shd_test.h5").write_bytes(b"plain text")
    with pytest.raises(DataError, match=r"shd_test\.h5: not a readable HDF5 file"):
        load_shd(tmp_path, "test", dt=DT, cache=False)


def test_without_h5py_the_error_says_how_to_install_it(shd_root, monkeypatch):
    monkeypatch.setitem(sys.modules, "h5py", None)  # `import h5py` now raises ImportError
    with pytest.raises(ImportError, match=r'pip install "etrace-fit\[datasets\]"'):
        load_shd(shd_root[0], dt=DT, cache=False)


def test_labels_outside_the_classes_and_bad_spikes_name_the_file_and_sample(tmp_path):
    write_shd(tmp_path / "shd_train.h5", [[0.01], [0.02]], [[1], [2]], [3, 20])
    with pytest.raises(DataError, match=r"shd_train\.h5: sample 1 has label 20; expected 0\.\.19 \(20 classes\)"):
        load_shd(tmp_path, dt=DT, cache=False)
    write_shd(tmp_path / "ssc_test.h5", [[0.01]], [[1]], [35])
    with pytest.raises(DataError, match=r"ssc_test\.h5: sample 0 has label 35; expected 0\.\.34"):
        load_ssc(tmp_path, "test", dt=DT, cache=False)
    write_shd(tmp_path / "shd_train.h5", [[0.01], [0.02, np.nan]], [[1], [2, 3]], [3, 4])
    with pytest.raises(DataError, match=r"shd_train\.h5: sample 1 has spike time nan \(at index 1\); expected finite "
                                         r"times >= 0"):
        load_shd(tmp_path, dt=DT, cache=False)
    with h5py.File(tmp_path / "shd_test.h5", "w") as file:  # signed units, as some converted files hold
        file.create_dataset("spikes/times", (1,), dtype=h5py.vlen_dtype(np.dtype(np.float32)))[0] = [0.01, 0.02]
        file.create_dataset("spikes/units", (1,), dtype=h5py.vlen_dtype(np.dtype(np.int16)))[0] = [3, -1]
        file.create_dataset("labels", data=np.array([1], np.uint8))
    with pytest.raises(DataError, match=r"shd_test\.h5: sample 0 has unit -1; expected 0 <= unit < 700"):
        load_shd(tmp_path, "test", dt=DT, cache=False)


def test_a_file_rewritten_at_the_same_size_and_mtime_is_read_again(tmp_path):
    path = tmp_path / "shd_train.h5"
    write_shd(path, [[0.01]], [[1]], [1])
    _, y = load_shd(tmp_path, dt=DT, max_time=0.1)
    stat = path.stat()
    write_shd(path, [[0.01]], [[1]], [7])
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    assert y.tolist() == [1] and load_shd(tmp_path, dt=DT, max_time=0.1)[1].tolist() == [7]


def test_a_cache_folder_that_cannot_be_written_fails_before_binning_or_is_skipped_by_default(tmp_path, monkeypatch):
    write_shd(tmp_path / "shd_train.h5", [[0.01]], [[1]], [1])
    binned = []
    monkeypatch.setattr(shd, "bin_samples", lambda *a, **k: binned.append(1) or real_bin(*a, **k))
    (tmp_path / "a_file").write_text("")
    with pytest.raises(ConfigError, match=r"the dataset cache folder .*a_file cannot be written .*pass cache=False"):
        load_shd(tmp_path, dt=DT, max_time=0.1, cache=tmp_path / "a_file")
    assert binned == []  # refused before the work
    (tmp_path / ".etrace_cache").write_text("")  # the default folder is taken: load without a cache
    with pytest.warns(RuntimeWarning, match=r"cannot be written .*shd_train is loaded without a cache"):
        x, y = load_shd(tmp_path, dt=DT, max_time=0.1)
    assert x.shape == (1, 10, 700) and y.tolist() == [1] and binned == [1]


def test_a_sample_without_spikes_is_kept_with_a_warning_and_a_file_without_any_spike_is_an_error(tmp_path):
    """The layout allows a spike-free sample (a clip too quiet for the cochlea model): it
    is kept, all zeros with its label, but no longer silently. A file where no sample
    has a spike is broken, not a data set."""
    write_shd(tmp_path / "shd_train.h5", [[], [0.015], []], [[], [3], []], [4, 5, 6])
    with pytest.warns(RuntimeWarning, match=r"shd_train\.h5: 2 of 3 samples have no spikes \(at index 0, 2\), so "
                                            r"their inputs are all zeros, kept with their labels") as caught:
        x, y, mask = load_shd(tmp_path, dt=DT, max_time=0.1, variable_length=True, cache=False)
    assert caught[0].filename == __file__
    assert x.shape == (3, 10, 700) and y.tolist() == [4, 5, 6] and x[1, 1, 3] == 1 and x.sum() == 1
    assert mask.sum(axis=1).tolist() == [1, 2, 1]
    write_shd(tmp_path / "shd_test.h5", [[], []], [[], []], [1, 2])
    with pytest.raises(DataError, match=r"shd_test\.h5: 2 of 2 samples have no spikes \(at index 0, 1\), so their "
                                        r"inputs are all zeros: the file holds no spike at all"):
        load_shd(tmp_path, "test", dt=DT, max_time=0.1, cache=False)


# ---- files written from the published layout (zenkelab.org/resources/spiking-heidelberg-datasets-shd): spikes/times
# (variable-length float16 seconds), spikes/units (variable-length uint16, 700 channels), labels, extra/...
def spec_file(path, times, units, labels, *, unit_dtype=np.uint16, leave_out=()):
    with h5py.File(path, "w") as file:
        if "spikes/times" not in leave_out:
            column = file.create_dataset("spikes/times", (len(times),), dtype=h5py.vlen_dtype(np.dtype(np.float16)))
            for i, sample in enumerate(times):
                column[i] = np.asarray(sample, np.float16)
        if "spikes/units" not in leave_out:
            column = file.create_dataset("spikes/units", (len(units),), dtype=h5py.vlen_dtype(np.dtype(unit_dtype)))
            for i, sample in enumerate(units):
                column[i] = np.asarray(sample, unit_dtype)
        if "labels" not in leave_out:
            file.create_dataset("labels", data=np.asarray(labels, np.uint16))
        file.create_dataset("extra/speaker", data=np.zeros(len(labels), np.uint16))
        file.create_dataset("extra/meta_info/gender", data=np.array([b"female"] * len(labels)))


def test_unsorted_spike_times_bin_as_sorted_ones_and_the_mask_ends_at_the_latest(tmp_path):
    times, units = [0.25, 0.0, 0.125, 0.0625], [5, 6, 7, 699]
    spec_file(tmp_path / "shd_train.h5", [times], [units], [19])
    order = np.argsort(times)
    spec_file(tmp_path / "shd_test.h5", [np.array(times)[order]], [np.array(units)[order]], [19])
    shuffled = load_shd(tmp_path, "train", dt=0.0625, max_time=None, variable_length=True, cache=False)
    ordered = load_shd(tmp_path, "test", dt=0.0625, max_time=None, variable_length=True, cache=False)
    for a, b in zip(shuffled, ordered):
        np.testing.assert_array_equal(a, b)
    x, y, mask = shuffled
    assert x.shape == (1, 5, 700) and mask.sum() == 5 and y.tolist() == [19]
    assert x[0, 4, 5] == x[0, 0, 6] == x[0, 2, 7] == x[0, 1, 699] == 1


def test_spikes_on_bin_edges_and_at_max_time_follow_the_window_rule(tmp_path):
    """float16 seconds, as published: k * dt lands in bin k, a spike at max_time is dropped."""
    times = [0.0, 0.01, 0.03, 0.06, 0.09, 0.1, 0.35]
    spec_file(tmp_path / "shd_train.h5", [times], [[0, 1, 3, 6, 9, 10, 35]], [2])
    x, _ = load_shd(tmp_path, dt=0.01, max_time=0.1, cache=False)
    assert x.shape == (1, 10, 700) and x.sum() == 5
    assert [tuple(hit) for hit in np.argwhere(x[0])] == [(0, 0), (1, 1), (3, 3), (6, 6), (9, 9)]
    coarse, _ = load_shd(tmp_path, num_bins=5, max_time=0.1, cache=False)  # edges every 0.02 s
    assert [tuple(hit) for hit in np.argwhere(coarse[0])] == [(0, 0), (0, 1), (1, 3), (3, 6), (4, 9)]


@pytest.mark.parametrize("missing", ["spikes/times", "spikes/units", "labels"])
def test_each_missing_dataset_is_named(tmp_path, missing):
    spec_file(tmp_path / "shd_train.h5", [[0.1]], [[1]], [0], leave_out=(missing,))
    with pytest.raises(DataError, match=rf"shd_train\.h5: not the SHD/SSC layout, missing dataset '{missing}'"):
        load_shd(tmp_path, dt=DT, cache=False)


def test_a_negative_unit_and_a_unit_past_699_name_the_sample(tmp_path):
    spec_file(tmp_path / "shd_train.h5", [[0.1], [0.1, 0.2]], [[1], [4, -2]], [0, 1], unit_dtype=np.int32)
    with pytest.raises(DataError, match=r"shd_train\.h5: sample 1 has unit -2; expected 0 <= unit < 700"):
        load_shd(tmp_path, dt=DT, cache=False)
    spec_file(tmp_path / "ssc_train.h5", [[0.1], [0.1, 0.2]], [[1], [4, 70000]], [0, 34], unit_dtype=np.uint32)
    with pytest.raises(DataError, match=r"ssc_train\.h5: sample 1 has unit 70000; expected 0 <= unit < 700"):
        load_ssc(tmp_path, dt=DT, cache=False)


def test_the_cache_key_follows_every_binning_argument(tmp_path, monkeypatch):
    spec_file(tmp_path / "shd_train.h5", [[0.01, 0.5]], [[1, 2]], [3])
    built = []
    real_read = shd._read
    monkeypatch.setattr(shd, "_read", lambda *args: built.append(args[1:4]) or real_read(*args))
    for binning in [dict(dt=0.01), dict(dt=0.01), dict(dt=0.02), dict(dt=0.01, max_time=0.8), dict(num_bins=10),
                    dict(num_bins=10, max_time=None), dict(num_bins=20, max_time=None), dict(dt=0.01, max_time=None),
                    dict(num_bins=10)]:
        load_shd(tmp_path, **binning)
    assert built == [(0.01, None, 1.0), (0.02, None, 1.0), (0.01, None, 0.8), (None, 10, 1.0), (None, 10, None),
                     (None, 20, None), (0.01, None, None)]
    assert len(list((tmp_path / ".etrace_cache").glob("shd_train_*.npz"))) == 7

"""MNIST-1D: our vendored generator gives the original's arrays, deterministically, and
load_mnist1d caches them without touching the caller's random state.

The reference values below were recorded by running the ORIGINAL code, unmodified —
github.com/greydanus/mnist1d, mnist1d/{data,transform,utils}.py at commit
7878d96082abd200c546a07a4101fa90b30fdf7e — as ``make_dataset(get_dataset_args())``
(with ``num_samples`` set to 500 for the small set), under numpy 2.4.6 and scipy
1.17.1, Python 3.11. The default-size arrays there also equal the published
``mnist1d_data.pkl`` (same labels, values within 2.3e-16).
"""

import random
import re

import numpy as np
import pytest

from etrace_fit.datasets import load_mnist1d, make_mnist1d, mnist1d_args
from etrace_fit.datasets import mnist1d as mnist1d_module
from etrace_fit.errors import ConfigError

RTOL = 1e-12

# make_dataset(get_dataset_args()) upstream: 5000 samples, seed 42.
DEFAULT = {
    "shapes": {"x": (4000, 40), "y": (4000,), "x_test": (1000, 40), "y_test": (1000,), "t": (40,)},
    "y[:20]": [2, 6, 4, 5, 6, 6, 6, 0, 3, 1, 6, 9, 4, 3, 4, 5, 1, 9, 0, 3],
    "y_test[:20]": [2, 6, 3, 9, 4, 3, 1, 9, 5, 2, 0, 7, 7, 1, 4, 6, 1, 4, 3, 9],
    "counts": [398, 396, 411, 394, 394, 402, 401, 404, 402, 398],
    "counts_test": [102, 104, 89, 106, 106, 98, 99, 96, 98, 102],
    "x[0, :5]": [-0.3320056673693902, -0.4719103656557236, -0.778697076293495, -1.0097408265367047,
                 -0.8823525654053074],
    "x[123, 17]": 0.5600317938187683,
    "x_test[7, 39]": -0.19210426641387415,
    "x.sum()": -51.78746787509556,
    "x_test.sum()": 51.78746787509186,
    "t[0]": -5.38753506670427,
}

# The same with num_samples = 500 (400 train, 100 test).
SMALL = {
    "shapes": {"x": (400, 40), "y": (400,), "x_test": (100, 40), "y_test": (100,), "t": (40,)},
    "y[:20]": [4, 9, 3, 2, 9, 1, 7, 7, 6, 6, 6, 4, 6, 9, 3, 6, 2, 4, 8, 2],
    "y_test[:20]": [7, 6, 1, 9, 1, 7, 1, 1, 5, 8, 6, 5, 7, 3, 0, 2, 5, 7, 2, 9],
    "counts": [44, 39, 38, 39, 42, 39, 34, 38, 42, 45],
    "counts_test": [6, 11, 12, 11, 8, 11, 16, 12, 8, 5],
    "x[0, :5]": [1.3985160746828285, 1.7330041087289827, 1.7836403489396757, 0.3649234199049151,
                 -0.78984471824872],
    "x[123, 17]": 1.5932022588962838,
    "x_test[7, 39]": -1.504142505423871,
    "x.sum()": 129.66311144015208,
    "x_test.sum()": -129.66311144015197,
    "t[0]": -5.426138036070041,
}


def check_against_upstream(data, ref):
    assert {name: data[name].shape for name in ref["shapes"]} == ref["shapes"]
    assert data["x"].dtype == np.float64 and data["y"].dtype.kind == "i"
    assert data["y"][:20].tolist() == ref["y[:20]"]
    assert data["y_test"][:20].tolist() == ref["y_test[:20]"]
    assert np.bincount(data["y"], minlength=10).tolist() == ref["counts"]
    assert np.bincount(data["y_test"], minlength=10).tolist() == ref["counts_test"]
    np.testing.assert_allclose(data["x"][0, :5], ref["x[0, :5]"], rtol=RTOL, atol=0)
    np.testing.assert_allclose(data["x"][123, 17], ref["x[123, 17]"], rtol=RTOL, atol=0)
    np.testing.assert_allclose(data["x_test"][7, 39], ref["x_test[7, 39]"], rtol=RTOL, atol=0)
    np.testing.assert_allclose(float(data["x"].sum()), ref["x.sum()"], rtol=RTOL, atol=0)
    np.testing.assert_allclose(float(data["x_test"].sum()), ref["x_test.sum()"], rtol=RTOL, atol=0)
    np.testing.assert_allclose(data["t"][0], ref["t[0]"], rtol=RTOL, atol=0)
    np.testing.assert_allclose(data["t"], -data["t"][::-1], rtol=RTOL)


def test_500_samples_equal_the_original_codes():
    check_against_upstream(make_mnist1d(num_samples=500), SMALL)


@pytest.mark.slow
def test_the_default_dataset_equals_the_original_codes():
    data = make_mnist1d()
    check_against_upstream(data, DEFAULT)
    everything = np.concatenate([data["x"], data["x_test"]])
    np.testing.assert_allclose([everything.mean(), everything.std()], [0.0, 1.0], atol=1e-12)


def test_the_templates_and_the_default_arguments_are_upstreams():
    assert mnist1d_args() == {
        "num_samples": 5000, "train_split": 0.8, "template_len": 12, "padding": [36, 60], "scale_coeff": 0.4,
        "max_translation": 48, "corr_noise_scale": 0.25, "iid_noise_scale": 0.02, "shear_scale": 0.75,
        "shuffle_seq": False, "final_seq_length": 40, "seed": 42}
    templates = make_mnist1d(num_samples=10)["templates"]
    assert templates["x"].shape == (10, 12) and templates["y"].tolist() == list(range(10))
    np.testing.assert_allclose(templates["x"][:, 0], 0.0, atol=0)          # every template starts at 0
    np.testing.assert_allclose(templates["t"], np.linspace(-5, 5, 12) / 6.0, rtol=RTOL)


def test_upstreams_own_argument_dict_is_accepted_and_bad_arguments_are_config_errors():
    upstream = dict(mnist1d_args(), url="https://github.com/greydanus/mnist1d/raw/master/mnist1d_data.pkl")
    assert mnist1d_args(**upstream) == mnist1d_args()                     # 'url' is dropped
    for bad in ({"num_sample": 100}, {"num_samples": 5}, {"seed": -1}, {"seed": 1.5}, {"padding": [60, 36]},
                {"train_split": 1.5}, {"shuffle_seq": "yes"}, {"scale_coeff": float("nan")}):
        with pytest.raises(ConfigError, match=next(iter(bad))):               # the message names the argument
            mnist1d_args(**bad)


def test_the_same_seed_gives_the_same_arrays_and_another_seed_others():
    a, b, c = (make_mnist1d(num_samples=100, seed=s) for s in (3, 3, 4))
    for name in ("x", "y", "x_test", "y_test", "t"):
        np.testing.assert_array_equal(a[name], b[name])
    assert not np.array_equal(a["x"], c["x"])


def test_generation_leaves_the_global_random_states_alone():
    np.random.seed(123)
    random.seed(123)
    expected_np, expected_py = np.random.rand(3), random.random()
    np.random.seed(123)
    random.seed(123)
    make_mnist1d(num_samples=50, seed=0)
    load_mnist1d(num_samples=50, cache=False)
    assert np.array_equal(np.random.rand(3), expected_np) and random.random() == expected_py


@pytest.mark.parametrize("sequence", [True, False])
def test_load_mnist1d_shapes_and_dtypes(tmp_path, sequence):
    data = make_mnist1d(num_samples=200)
    for split, (x_ref, y_ref) in {"train": (data["x"], data["y"]), "test": (data["x_test"], data["y_test"])}.items():
        x, y = load_mnist1d(split, root=tmp_path, sequence=sequence, num_samples=200)
        assert x.dtype == np.float32 and y.dtype == np.int32
        assert x.shape == ((len(y_ref), 40, 1) if sequence else (len(y_ref), 40))
        np.testing.assert_array_equal(x.reshape(len(y_ref), 40), x_ref.astype(np.float32))
        np.testing.assert_array_equal(y, y_ref)


def test_the_cache_is_read_the_second_time_and_rebuilt_when_an_argument_changes(tmp_path, monkeypatch):
    x, y = load_mnist1d("train", root=tmp_path, num_samples=100)
    assert len(list(tmp_path.glob("mnist1d_*.npz"))) == 1

    def fail(**args):
        raise AssertionError("regenerated although the cache holds these arrays")

    real = mnist1d_module.make_mnist1d
    monkeypatch.setattr(mnist1d_module, "make_mnist1d", fail)
    x2, y2 = load_mnist1d("train", root=tmp_path, num_samples=100)
    load_mnist1d("test", root=tmp_path, num_samples=100)                   # one file holds both splits
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
    with pytest.raises(AssertionError, match="regenerated"):
        load_mnist1d("train", root=tmp_path, num_samples=100, seed=1)      # another key: built again

    monkeypatch.setattr(mnist1d_module, "make_mnist1d", real)
    x3, _ = load_mnist1d("train", root=tmp_path, num_samples=100, seed=1)
    assert len(list(tmp_path.glob("mnist1d_*.npz"))) == 2 and not np.array_equal(x, x3)


def test_the_default_cache_folder_follows_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    load_mnist1d("test", num_samples=20)
    assert len(list((tmp_path / "xdg" / "etrace_fit" / "mnist1d").glob("mnist1d_*.npz"))) == 1
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert mnist1d_module.default_root() == tmp_path / "home" / ".cache" / "etrace_fit" / "mnist1d"


def test_a_bad_split_is_a_config_error_naming_the_allowed_values(tmp_path):
    with pytest.raises(ConfigError, match=r"split must be 'train' or 'test', got 'valid'"):
        load_mnist1d("valid", root=tmp_path, num_samples=20)
    assert not list(tmp_path.iterdir())


def test_a_train_split_that_leaves_the_split_asked_for_empty_is_a_config_error(tmp_path):
    """train_split=0 gave an empty (0, 40, 1) training set, silently."""
    with pytest.raises(ConfigError, match=r"train_split=0\.0 with num_samples=20 leaves the 'train' split empty "
                                          r"\(int\(20 \* 0\.0\) = 0 of 20 samples train, 20 test\); for a non-empty "
                                          r"'train' split give train_split in \[0\.05, 1\]"):
        load_mnist1d("train", root=tmp_path, num_samples=20, train_split=0.0)
    with pytest.raises(ConfigError, match=r"train_split=1\.0 with num_samples=20 leaves the 'test' split empty .* "
                                          r"give train_split in \[0, 1\)"):
        load_mnist1d("test", root=tmp_path, num_samples=20, train_split=1.0)
    assert not list(tmp_path.iterdir())                                     # refused before generating
    with pytest.raises(ConfigError, match=r"train_split in \[(.*), 1\]") as info:
        load_mnist1d("train", cache=False, num_samples=850, train_split=1 / 850)   # 850 * (1/850) < 1
    lowest = float(re.search(r"train_split in \[(.*), 1\]", str(info.value)).group(1))
    assert int(850 * lowest) == 1                                           # the range given is the real one
    x, y = load_mnist1d("train", cache=False, num_samples=20, train_split=1.0)  # the other split may be empty
    assert x.shape == (20, 40, 1) and len(y) == 20

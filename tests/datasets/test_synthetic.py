import numpy as np
import pytest

from etrace_fit.datasets import rate_discrimination
from etrace_fit.errors import ConfigError


def test_shapes_dtypes_and_binary_spikes():
    x, y = rate_discrimination(16, seq_len=30, num_channels=6, seed=1)
    assert x.shape == (16, 30, 6) and x.dtype == np.float32
    assert y.shape == (16,) and y.dtype == np.int32
    assert set(np.unique(x)) <= {0.0, 1.0}
    assert set(np.unique(y)) <= {0, 1}


def test_same_seed_same_data_other_seed_other_data():
    a = rate_discrimination(8, seed=3)
    b = rate_discrimination(8, seed=3)
    c = rate_discrimination(8, seed=4)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])


def test_the_labelled_group_fires_at_the_high_rate():
    x, y = rate_discrimination(400, seq_len=200, num_channels=10, low_rate=0.05, high_rate=0.3, seed=0)
    rates = x.mean(axis=1)  # (N, C)
    group_rate = np.stack([rates[:, :5].mean(1), rates[:, 5:].mean(1)], axis=1)
    chosen = group_rate[np.arange(len(y)), y]
    other = group_rate[np.arange(len(y)), 1 - y]
    np.testing.assert_allclose(chosen.mean(), 0.3, atol=0.01)
    np.testing.assert_allclose(other.mean(), 0.05, atol=0.01)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(num_samples=0), "num_samples"),
        (dict(num_samples=4, num_channels=1), "num_channels"),
        (dict(num_samples=4, low_rate=0.5, high_rate=0.2), "low_rate"),
    ],
)
def test_bad_arguments_raise_config_error_naming_them(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        rate_discrimination(**kwargs)

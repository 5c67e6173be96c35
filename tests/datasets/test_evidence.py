import numpy as np
import pytest

from etrace_fit.datasets import evidence_accumulation
from etrace_fit.errors import ConfigError


def test_layout_and_labels_follow_the_cues():
    x, y = evidence_accumulation(200, num_cues=3, channels_per_group=5, cue_steps=10, gap_steps=5, delay_steps=7,
                                 recall_steps=6, cue_rate=1.0, noise_rate=0.0, seed=0)
    assert x.shape == (200, 3 * 15 + 7 + 6, 20) and x.dtype == np.float32 and y.dtype == np.int32
    # With cue_rate 1 and no noise, each cue window is all ones on exactly one side.
    left = x[:, :45, 0:5].reshape(200, 3, 15, 5)[:, :, :10].mean(axis=(2, 3))
    right = x[:, :45, 5:10].reshape(200, 3, 15, 5)[:, :, :10].mean(axis=(2, 3))
    np.testing.assert_array_equal(left + right, np.ones((200, 3)))
    np.testing.assert_array_equal(y, (right.sum(axis=1) >= 2).astype(np.int32))
    assert x[:, -6:, 10:15].min() == 1.0 and x[:, :-6, 10:15].max() == 0.0  # recall only at the end
    assert x[:, :, 15:].max() == 0.0 and 0.3 < y.mean() < 0.7


def test_noise_fires_at_its_rate_and_seeds_reproduce():
    x, _ = evidence_accumulation(300, noise_rate=0.05, seed=1)
    np.testing.assert_allclose(x[:, :, 30:].mean(), 0.05, atol=0.005)
    a, b = evidence_accumulation(4, seed=2), evidence_accumulation(4, seed=2)
    np.testing.assert_array_equal(a[0], b[0])


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(num_cues=4), "odd"), (dict(cue_rate=1.5), "cue_rate"), (dict(gap_steps=-1), "gap_steps"),
    (dict(channels_per_group=0), "channels_per_group"),
])
def test_bad_arguments_are_config_errors(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        evidence_accumulation(4, **kwargs)

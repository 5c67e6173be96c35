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


def test_a_favoured_side_per_trial_and_a_silent_lead_in():
    x, y = evidence_accumulation(4000, num_cues=7, channels_per_group=5, cue_steps=10, gap_steps=5, delay_steps=7,
                                 recall_steps=6, cue_rate=1.0, noise_rate=0.0, minority_prob=0.3, lead_steps=4,
                                 seed=3)
    assert x.shape == (4000, 4 + 7 * 15 + 7 + 6, 20)
    assert x[:, :4].max() == 0.0  # nothing before the first cue
    right = x[:, 4:4 + 105, 5:10].reshape(4000, 7, 15, 5)[:, :, :10].mean(axis=(2, 3))
    left = x[:, 4:4 + 105, 0:5].reshape(4000, 7, 15, 5)[:, :, :10].mean(axis=(2, 3))
    np.testing.assert_array_equal(left + right, np.ones((4000, 7)))
    np.testing.assert_array_equal(y, (right.sum(axis=1) >= 4).astype(np.int32))
    # Cues on the side a trial favours: Binomial(7, 0.7) on it, so the margin is rarely 4-3.
    favoured = np.maximum(right.sum(axis=1), left.sum(axis=1))
    close = np.mean(favoured == 4)  # P(4-3) = P(Bin(7, .7) = 3 or 4) = 0.324 (fair coins: 0.547)
    assert abs(close - 0.324) < 0.03 and abs(y.mean() - 0.5) < 0.03
    fair = evidence_accumulation(4000, num_cues=7, cue_rate=1.0, noise_rate=0.0, seed=3)[0]
    fair_right = fair[:, :7 * 30, 10:20].reshape(4000, 7, 30, 10)[:, :, :20].mean(axis=(2, 3))
    assert abs(np.mean(np.maximum(fair_right.sum(1), 7 - fair_right.sum(1)) == 4) - 0.547) < 0.03


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(num_cues=4), "odd"), (dict(cue_rate=1.5), "cue_rate"), (dict(gap_steps=-1), "gap_steps"),
    (dict(channels_per_group=0), "channels_per_group"), (dict(minority_prob=-0.1), "minority_prob"),
    (dict(lead_steps=-1), "lead_steps"),
])
def test_bad_arguments_are_config_errors(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        evidence_accumulation(4, **kwargs)

"""The copy task (etrace_fit/datasets/sequence_tasks.py): layout, targets and mask."""

import numpy as np
import pytest

from etrace_fit.datasets import copy_task
from etrace_fit.errors import ConfigError


def test_the_symbols_come_back_after_the_delay_under_the_mask():
    x, y, mask = copy_task(64, length=4, delay=7, num_symbols=5, seed=1)
    steps = 2 * 4 + 7 + 1
    assert x.shape == (64, steps, 7) and y.shape == mask.shape == (64, steps)
    assert x.dtype == np.float32 and y.dtype == np.int32 and mask.dtype == bool
    np.testing.assert_array_equal(x.sum(axis=2), 1.0)  # one channel on at every step
    shown = x[:, :4, :5].argmax(axis=2)
    np.testing.assert_array_equal(y[:, -4:], shown)  # the outputs are the inputs, in order
    assert mask[:, -4:].all() and not mask[:, :-4].any()
    assert (x[:, 4:11, 5] == 1).all() and (x[:, 11, 6] == 1).all() and (x[:, 12:, 5] == 1).all()
    assert len(np.unique(shown)) == 5  # every symbol appears
    again, _, _ = copy_task(64, length=4, delay=7, num_symbols=5, seed=1)
    other, _, _ = copy_task(64, length=4, delay=7, num_symbols=5, seed=2)
    assert np.array_equal(x, again) and not np.array_equal(x, other)


@pytest.mark.parametrize("bad", [dict(length=0), dict(delay=-1), dict(num_symbols=1), dict(num_samples=2.5)])
def test_bad_arguments_name_the_argument(bad):
    args = dict(num_samples=4) | bad
    name = next(iter(bad))
    with pytest.raises(ConfigError, match=rf"copy_task: {name} must be an int"):
        copy_task(**args)

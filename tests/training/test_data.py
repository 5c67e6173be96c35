import numpy as np
import pytest

from etrace_fit.errors import ConfigError, ShapeError
from etrace_fit.training import Batch, batches, check_finite, split_validation

X = np.arange(10 * 4 * 3, dtype=np.float32).reshape(10, 4, 3)
Y = np.arange(10)


def test_arrays_are_cut_into_batches_and_the_final_partial_batch_is_kept():
    got = list(batches(X, Y, batch_size=4, shuffle=False))
    assert [b.size for b in got] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate([b.y for b in got]), Y)
    np.testing.assert_array_equal(got[2].x, X[8:])


def test_drop_remainder_drops_the_partial_batch():
    assert [b.size for b in batches(X, Y, batch_size=4, drop_remainder=True)] == [4, 4]


def test_shuffle_is_a_permutation_reproducible_from_the_seed():
    first = np.concatenate([b.y for b in batches(X, Y, batch_size=3, seed=1)])
    again = np.concatenate([b.y for b in batches(X, Y, batch_size=3, seed=1)])
    other = np.concatenate([b.y for b in batches(X, Y, batch_size=3, seed=2)])
    np.testing.assert_array_equal(first, again)
    assert sorted(first) == list(Y) and not np.array_equal(first, Y) and not np.array_equal(first, other)
    for b in batches(X, Y, batch_size=3, seed=1):  # x and y stay paired
        np.testing.assert_array_equal(b.x[:, 0, 0], b.y * 12)


def test_iterables_of_pairs_and_triples_and_sequences_are_accepted():
    mask = np.ones((2, 4))
    data = [(X[:3], Y[:3]), (X[3:5], Y[3:5], mask)]
    got = list(batches(iter(data)))
    assert [b.size for b in got] == [3, 2] and got[1].mask is mask and got[0].mask is None

    class Source:
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return data[i]

    assert [b.size for b in batches(Source())] == [3, 2]
    assert [b.size for b in batches(iter([Batch(X[:1])]))] == [1]


@pytest.mark.parametrize("make, fragment", [
    (lambda: batches(X[:0], Y[:0]), "empty"),
    (lambda: batches(X, Y[:9]), "x has 10, y has 9"),
    (lambda: batches(iter([])), "no batches"),
    (lambda: batches([]), "empty"),
    (lambda: batches(iter([(X[:2], Y[:3])])), "x has 2 samples, y has 3"),
    (lambda: batches(iter([(X[:2],) * 4])), "(x, y) or (x, y, mask)"),
    (lambda: batches(X[:3], Y[:3], batch_size=4, drop_remainder=True), "drops all 3"),
])
def test_bad_data_raises_shape_error_saying_what_is_wrong(make, fragment):
    with pytest.raises(ShapeError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        list(make())


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_batch_size_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="batch_size"):
        list(batches(X, Y, batch_size=bad))


def test_nan_and_inf_are_found_and_the_sample_named():
    check_finite(X)
    bad = X.copy()
    bad[7, 2, 1] = np.inf
    with pytest.raises(ShapeError, match="sample 7"):
        check_finite(bad)
    bad[3, 0, 0] = np.nan
    with pytest.raises(ShapeError, match="sample 3"):
        check_finite(bad, "validation x")


def test_validation_split_takes_the_last_fraction():
    (xt, yt), (xv, yv) = split_validation(X, Y, 0.2)
    np.testing.assert_array_equal(yt, Y[:8])
    np.testing.assert_array_equal(yv, Y[8:])
    assert xv.shape == (2, 4, 3)
    # Keras' split point floor(N (1 - f)): round(N f) held out 2 of 10 at 0.25 and refused 0.05
    for fraction, held in ((0.25, 3), (0.05, 1), (0.15, 2), (0.5, 5)):
        assert len(split_validation(X, Y, fraction)[1][1]) == held, fraction
    for bad in (0.0, 1.0, 1e-20, 0.9):  # 0.9: floor(10 · 0.0999…) = 0, as Keras
        with pytest.raises(ConfigError, match="validation_split"):
            split_validation(X, Y, bad)

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from etrace_fit.errors import ConfigError, ShapeError
from etrace_fit.training import check_labels, get_loss, get_metrics

LOGITS = jnp.asarray([[2.0, 0.5, -1.0], [0.1, 0.2, 3.0]])
LABELS = jnp.asarray([0, 1])


def test_cross_entropy_is_per_sample_negative_log_softmax():
    expected = -np.log(np.exp(LOGITS) / np.exp(LOGITS).sum(1, keepdims=True))[np.arange(2), np.asarray(LABELS)]
    np.testing.assert_allclose(get_loss("cross_entropy")(LOGITS, LABELS), expected, rtol=1e-6)


def test_mse_averages_over_features_per_sample():
    out, target = jnp.ones((2, 3, 2)), jnp.zeros((2, 3, 2)).at[1].set(3.0)
    np.testing.assert_allclose(get_loss("mse")(out, target), [1.0, 4.0])


def test_a_callable_loss_is_used_as_given_and_unknown_names_list_the_valid_ones():
    fn = lambda o, t: jnp.zeros(o.shape[0])  # noqa: E731
    assert get_loss(fn) is fn
    with pytest.raises(ConfigError, match="cross_entropy, mse"):
        get_loss("hinge")


def test_accuracy_and_custom_metrics():
    metrics = get_metrics(["accuracy", "mse", jax.nn.relu])
    assert list(metrics) == ["accuracy", "mse", "relu"]
    np.testing.assert_array_equal(metrics["accuracy"](LOGITS, LABELS), [1.0, 0.0])
    with pytest.raises(ConfigError, match="accuracy, mse"):
        get_metrics(["f1"])
    with pytest.raises(ConfigError, match="twice"):
        get_metrics(["accuracy", "accuracy"])
    assert get_metrics(None) == {}


def test_labels_out_of_range_or_not_integers_are_shape_errors():
    check_labels(np.array([0, 2, 1]), 3)
    with pytest.raises(ShapeError, match=r"\[0, 2\).*from 0 to 2"):
        check_labels(np.array([0, 2]), 2)
    with pytest.raises(ShapeError, match="from -1"):
        check_labels(np.array([-1, 0]), 2)
    with pytest.raises(ShapeError, match="integer"):
        check_labels(np.array([0.0, 1.0]), 2)

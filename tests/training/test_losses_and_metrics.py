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
    with pytest.raises(ConfigError, match=r"loss: unknown 'hinge'; valid names: cross_entropy, .*mse.*or a callable"):
        get_loss("hinge")
    with pytest.raises(ConfigError, match="loss: unknown 3"):
        get_loss(3)


def test_accuracy_and_custom_metrics():
    metrics = get_metrics(["accuracy", "mse", jax.nn.relu])
    assert list(metrics) == ["accuracy", "mse", "relu"]
    np.testing.assert_array_equal(metrics["accuracy"](LOGITS, LABELS), [1.0, 0.0])
    with pytest.raises(ConfigError, match=r"metrics: unknown 'f1'; valid names: accuracy, .*mse"):
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


def test_keras_loss_and_metric_names_are_the_same_functions_and_log_under_the_given_name():
    from etrace_fit.training.losses import categorical_cross_entropy, cross_entropy, mae, mse
    from etrace_fit.training.metrics import accuracy

    assert get_loss("sparse_categorical_crossentropy") is cross_entropy
    assert get_loss("mean_squared_error") is mse and get_loss("mean_absolute_error") is mae
    assert get_loss("categorical_crossentropy") is categorical_cross_entropy
    onehot = jax.nn.one_hot(LABELS, 3)
    np.testing.assert_allclose(categorical_cross_entropy(LOGITS, onehot), cross_entropy(LOGITS, LABELS), rtol=1e-6)
    out, target = jnp.array([[1.0, -1.0], [0.0, 2.0]]), jnp.array([[0.0, 0.0], [0.0, 0.0]])
    np.testing.assert_allclose(mae(out, target), [1.0, 1.0])
    metrics = get_metrics(["acc", "sparse_categorical_accuracy", "categorical_accuracy", "mae"])
    assert list(metrics) == ["acc", "sparse_categorical_accuracy", "categorical_accuracy", "mae"]
    assert metrics["acc"] is accuracy and metrics["sparse_categorical_accuracy"] is accuracy
    np.testing.assert_array_equal(metrics["categorical_accuracy"](LOGITS, onehot), accuracy(LOGITS, LABELS))


def test_spiking_losses_score_spikes_per_step_and_validate_their_rates():
    from etrace_fit.training.spiking import spike_rate_cross_entropy, spike_rate_mse

    spikes = jnp.array([[1.0, 0.0], [0.0, 0.0]])
    labels = jnp.array([0, 1])
    ce = get_loss("spike_rate_cross_entropy")(spikes, labels)
    # sample 0: the labelled neuron fired (logits 5, 0); sample 1: silence (logits equal: ln 2)
    np.testing.assert_allclose(ce, [np.log1p(np.exp(-5.0)), np.log(2.0)], rtol=1e-5)
    mse_ = spike_rate_mse(correct_rate=1.0, incorrect_rate=0.0)(spikes, labels)
    np.testing.assert_allclose(mse_, [0.0, 1.0])
    np.testing.assert_allclose(get_loss("spike_rate_mse")(spikes, labels), [0.2 ** 2 + 0.1 ** 2, 0.1 ** 2 + 0.8 ** 2],
                               rtol=1e-6)
    with pytest.raises(ConfigError, match=r"correct_rate must be a rate in \[0, 1\].*got 3"):
        spike_rate_mse(correct_rate=3)
    with pytest.raises(ConfigError, match="scale must be positive"):
        spike_rate_cross_entropy(scale=0.0)


def _fit_logs(loss, y, metrics=None, outputs=3, batch_size=4, **kwargs):
    """One epoch of a tiny trainer; its History."""
    import brainstate

    import etrace_fit as ef
    from etrace_fit import layers as L

    rng = np.random.default_rng(0)
    x = rng.normal(size=(len(y), 5, 4)).astype(np.float32)
    with brainstate.environ.context(dt=1.0):
        brainstate.random.seed(0)
        model = ef.Sequential(L.Linear(4, 8), L.LIF(8), L.LeakyRateReadout(8, outputs))
        options = {} if metrics is None else {"metrics": metrics}
        trainer = ef.Trainer(model, algo="bptt", loss=loss, **options)
        history = trainer.fit(x, y, batch_size=batch_size, epochs=1, verbose=0, shuffle=False, **kwargs)
        return trainer, x, history


def test_accuracy_follows_one_hot_targets_as_keras_accuracy_does():
    """loss='categorical_crossentropy', metrics=['accuracy'] with one-hot y failed with
    JAX's broadcasting error from inside the step; the value is the integer labels'."""
    labels = np.arange(12) % 3
    onehot = np.eye(3, dtype=np.float32)[labels]
    _, _, by_onehot = _fit_logs("categorical_crossentropy", onehot, metrics=["accuracy"])
    _, _, by_label = _fit_logs("sparse_categorical_crossentropy", labels, metrics=["accuracy"])
    assert by_onehot.history["accuracy"] == by_label.history["accuracy"]


def test_a_metric_that_cannot_take_the_targets_fails_before_training_naming_itself():
    with pytest.raises(ConfigError, match=r"metric 'categorical_accuracy' fails on the model's output \(4, 3\) and "
                                          r"the targets \(4,\) of one step .*integer labels\? use 'accuracy'"):
        _fit_logs("cross_entropy", np.arange(12) % 3, metrics=["categorical_accuracy"])

    trainer, x, _ = _fit_logs("cross_entropy", np.arange(12) % 3, metrics=["accuracy"])
    trainer.metric_fns = {"categorical_accuracy": get_metrics(["categorical_accuracy"])["categorical_accuracy"]}
    with pytest.raises(ConfigError, match=r"metric 'categorical_accuracy' fails on the model's output"):
        trainer.evaluate(x, np.arange(12) % 3, verbose=0)  # an evaluate checks them too

    def per_class(output, target):
        return output  # (B, C): per sample averaged, as Keras averages any shape

    def transposed(output, target):
        return output.T  # (C, B): not one value per sample

    trainer, _, history = _fit_logs("cross_entropy", np.arange(12) % 3, metrics=[per_class])
    assert np.isfinite(history.history["per_class"][0])
    with pytest.raises(ConfigError, match=r"metric 'transposed' returned \(3, 4\) for a batch of 4 samples; a metric "
                                          r"returns one value per sample, shape \(4,\), or a scalar"):
        _fit_logs("cross_entropy", np.arange(12) % 3, metrics=[transposed])


@pytest.mark.parametrize("batch_size", [3, 5])  # 5 = the sequence length: a scalar once broadcast on the wrong axis
def test_a_metric_returning_the_batchs_scalar_equals_its_per_sample_form(batch_size):
    def mean_accuracy(output, target):
        return jnp.mean((jnp.argmax(output, -1) == target).astype(jnp.float32))

    _, _, history = _fit_logs("cross_entropy", np.arange(15) % 3, metrics=["acc", mean_accuracy],
                              batch_size=batch_size)
    np.testing.assert_allclose(history.history["mean_accuracy"], history.history["acc"], rtol=1e-6)


def test_the_default_metric_is_accuracy_for_a_classifier_and_none_for_a_regression():
    """Keras has no default metric; ours was accuracy whatever the loss: a regression
    logged a meaningless accuracy (one output) or crashed in the step (two)."""
    for outputs, y in [(1, np.linspace(-1, 1, 8, dtype=np.float32)),
                       (2, np.linspace(-1, 1, 16, dtype=np.float32).reshape(8, 2))]:
        trainer, _, history = _fit_logs("mse", y, outputs=outputs)
        assert list(history.history) == ["loss", "learning_rate"] and trainer.metrics_names == ["loss"]
    trainer, _, history = _fit_logs("cross_entropy", np.arange(8) % 3)
    assert trainer.metrics_names == ["loss", "accuracy"]
    trainer, _, history = _fit_logs("mse", np.linspace(-1, 1, 8, dtype=np.float32), outputs=1, metrics=["mae"])
    assert trainer.metrics_names == ["loss", "mae"]


@pytest.mark.parametrize("loss", ["categorical_crossentropy", "mse"])
def test_targets_of_the_outputs_shape_are_per_sequence_when_there_are_as_many_as_steps(loss):
    """One-hot y (N, C) with C = T was read as T per-step labels and refused by a message
    asking for the shape it had; the loss's targets have the output's shape, so it is one
    per sequence (validation y too): evaluate's loss is the loss of predict's last-step
    outputs against each sequence's row, computed here by hand."""
    rng = np.random.default_rng(0)
    labels = np.arange(12) % 5
    y = np.eye(5, dtype=np.float32)[labels] if loss == "categorical_crossentropy" else \
        rng.normal(size=(12, 5)).astype(np.float32)
    trainer, x, history = _fit_logs(loss, y, metrics=[], outputs=5, validation_data=(
        rng.normal(size=(4, 5, 4)).astype(np.float32), y[:4]))
    assert np.isfinite(history.history["loss"][0]) and np.isfinite(history.history["val_loss"][0])
    out = trainer.predict(x, verbose=0).astype(np.float64)
    if loss == "mse":
        expected = np.mean((out - y) ** 2)
    else:
        expected = np.mean(-np.sum(y * (out - np.log(np.exp(out).sum(-1, keepdims=True))), axis=-1))
    assert trainer.evaluate(x, y, verbose=0)["loss"] == pytest.approx(expected, rel=1e-5)


def test_accuracy_on_one_output_unit_is_refused_before_training():
    """argmax over one unit is class 0 whatever the output: "accuracy" read the share of
    label-0 samples (0.0 on a model that fitted every target 1), silently."""
    with pytest.raises(ConfigError, match=r"metric 'accuracy' takes the argmax over the output's classes, but the "
                                          r"output has shape \(4, 1\) \(one unit\)"):
        _fit_logs("mse", np.ones(8, dtype=np.float32), metrics=["accuracy"], outputs=1)


def test_spike_accuracy_counts_ties_and_a_silent_readout_as_wrong():
    spikes = jnp.asarray([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    labels = jnp.asarray([0, 0, 0, 0])
    metrics = get_metrics(["spike_accuracy", "accuracy"])
    np.testing.assert_array_equal(metrics["spike_accuracy"](spikes, labels), [0.0, 1.0, 0.0, 0.0])
    np.testing.assert_array_equal(metrics["accuracy"](spikes, labels), [1.0, 1.0, 1.0, 0.0])  # Keras' argmax
    np.testing.assert_array_equal(metrics["spike_accuracy"](spikes, jnp.eye(2)[labels]), [0.0, 1.0, 0.0, 0.0])
    from etrace_fit.training.metrics import default_metrics
    from etrace_fit.training.spiking import SPIKING_LOSSES

    assert default_metrics("spike_rate_cross_entropy") == ["spike_accuracy"]
    assert default_metrics(SPIKING_LOSSES["spike_rate_cross_entropy"]) == ["spike_accuracy"]
    assert default_metrics("cross_entropy") == ["accuracy"]


@pytest.mark.parametrize("name", ["loss", "learning_rate", "val_accuracy"])
def test_a_metric_named_as_what_the_trainer_logs_is_refused(name):
    """A callable metric named "loss" replaced the loss in History and evaluate (42.0 for a
    cross-entropy of 1.66); one named "learning_rate" was replaced by the rate."""
    def metric(output, target):
        return jnp.zeros(output.shape[0])

    metric.__name__ = name
    with pytest.raises(ConfigError, match=rf"metric '{name}': the trainer logs 'loss', 'learning_rate' and the "
                                          r"'val_' names itself"):
        get_metrics([metric])

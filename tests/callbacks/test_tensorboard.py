"""The TensorBoard dashboards, read back from the event files (no screenshots): sub-runs,
tags, HParams values, the raster figure's labels, firing statistics, and the warning
when norms explode."""

import io
import json
import math
import pathlib
import struct
import warnings

import brainstate
import numpy as np
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.callbacks import TensorBoard
from etrace_fit.callbacks.raster import firing_statistics, raster_figure, raster_image
from etrace_fit.callbacks.tensorboard import layer_labels, readable_tag
from etrace_fit.datasets import rate_discrimination

C, H, T = 4, 8, 12


@pytest.fixture(autouse=True)
def dt():
    with brainstate.environ.context(dt=1.0):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ef.ApproximationWarning)
            yield


def _data(n=16):
    return rate_discrimination(n, seq_len=T, num_channels=C, low_rate=0.05, high_rate=0.3, seed=0)


def _model():
    rng = np.random.default_rng(0)
    return ef.Sequential(L.Linear(C, H, w_init=rng.normal(0, 1.5, (C, H)).astype(np.float32)), L.LIF(H),
                         L.LeakyRateReadout(H, 2, w_init=rng.normal(0, 0.3, (H, 2)).astype(np.float32)))


def _events(folder):
    from tensorboardX.proto import event_pb2

    for path in sorted(pathlib.Path(folder).glob("*tfevents*")):
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            yield event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4


def _values(folder):
    """``[(tag, step, value proto)]`` of the one run in ``folder`` (not its subfolders)."""
    return [(v.tag, e.step, v) for e in _events(folder) for v in e.summary.value]


def _scalars(folder):
    out = {}
    for tag, step, value in _values(folder):
        if value.WhichOneof("value") == "simple_value":
            out.setdefault(tag, {})[step] = value.simple_value
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One fit of 3 epochs with validation, every dashboard on."""
    folder = tmp_path_factory.mktemp("tb")
    with brainstate.environ.context(dt=1.0), warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        x, y = _data()
        trainer = ef.Trainer(_model(), optimizer="adam", seed=0)
        trainer.fit(x, y, batch_size=4, epochs=3, validation_split=0.25, verbose=0,
                    callbacks=[TensorBoard(folder, update_freq="batch", histogram_freq=2, hparams={"task": "rate"})])
    return folder, trainer


def test_train_and_validation_are_sub_runs_with_the_same_tags(run):
    folder, trainer = run
    assert sorted(p.name for p in folder.iterdir()) == ["train", "validation"]  # no hparams twin
    train, validation = _scalars(folder / "train"), _scalars(folder / "validation")
    for tag in ("epoch/loss", "epoch/accuracy"):
        assert sorted(train[tag]) == sorted(validation[tag]) == [0, 1, 2]
    history = trainer.history.history
    assert validation["epoch/accuracy"][2] == pytest.approx(history["val_accuracy"][2])
    assert train["epoch/loss"][2] == pytest.approx(history["loss"][2])
    assert not any(tag.startswith("epoch/val_") for tag in train)
    assert len(train["batch/loss"]) == 9 and "epoch/learning_rate" in train


def test_tags_are_readable_and_norms_firing_and_histograms_are_written(run):
    folder, trainer = run
    values = _values(folder / "train")
    kinds = {(tag, v.WhichOneof("value")) for tag, _, v in values}
    for tag in ("weights/Linear_0/kernel", "weights/Linear_0/bias", "weights/LeakyRateReadout_2/kernel",
                "gradients/Linear_0/kernel", "trace_norms_log10/Linear_0/weight"):
        assert (tag, "histo") in kinds, tag
    histogram_steps = {step for tag, step, _ in values if tag == "weights/Linear_0/kernel"}
    assert histogram_steps == {0, 2}  # every 2nd epoch, and the last one
    scalars = _scalars(folder / "train")
    for tag in ("norms/gradient", "norms/gradient/Linear_0", "norms/trace_log10/Linear_0/weight",
                "firing/rate/LIF_1", "firing/silent_fraction/LIF_1", "firing/saturated_fraction/LIF_1"):
        assert sorted(scalars[tag]) == [0, 1, 2], tag
    assert 0.0 <= scalars["firing/rate/LIF_1"][2] <= 1.0
    grads = trainer.last_gradients
    expected = math.sqrt(sum(float(np.sum(np.asarray(g) ** 2)) for g in grads["layers.0.weight"].values()))
    assert scalars["norms/gradient/Linear_0"][2] == pytest.approx(expected, rel=1e-5)
    largest = float(np.max(np.asarray(trainer.last_trace_norms["layers.0.weight"])))
    assert scalars["norms/trace_log10/Linear_0/weight"][2] == pytest.approx(math.log10(largest), rel=1e-5)
    texts = {tag for tag, _, v in values if v.metadata.plugin_data.plugin_name == "text"}
    assert {"model_summary/text_summary", "compile_report/text_summary"} <= texts
    assert ("spikes/raster", "image") in kinds
    assert trainer.sample_label in (0, 1) and trainer.sample_inputs.shape == (4, T, C)  # 4 validation sequences


def test_hparams_hold_every_hyperparameter_and_the_final_and_best_metrics(run):
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData

    folder, trainer = run
    values = _values(folder / "train")
    starts = [HParamsPluginData.FromString(v.metadata.plugin_data.content).session_start_info
              for tag, _, v in values if tag == "_hparams_/session_start_info"]
    assert len(starts) == 1
    hparams = {k: (v.string_value or v.number_value if v.WhichOneof("kind") != "bool_value" else v.bool_value)
               for k, v in starts[0].hparams.items()}
    assert hparams["optimizer"] == "adam" and hparams["learning_rate"] == pytest.approx(1e-3)
    assert hparams["epochs"] == "3" and hparams["batch_size"] == "4" and hparams["seed"] == "0"
    assert hparams["algo"] == "hybrid" and hparams["task"] == "rate" and hparams["loss_on"] == "last"
    assert hparams["memory_budget"] == "4.0 MiB (default)"  # the budget the plan used, not "none"
    scalars = _scalars(folder / "train")
    history = trainer.history.history
    assert scalars["hparam/final_val_accuracy"][2] == pytest.approx(history["val_accuracy"][-1])
    assert scalars["hparam/best_val_accuracy"][2] == pytest.approx(max(history["val_accuracy"]))
    assert scalars["hparam/best_val_loss"][2] == pytest.approx(min(history["val_loss"]))


def test_layer_labels_and_tags_name_layers_by_type_and_index():
    model = ef.Sequential(L.Linear(3, 4), ef.Sequential(L.Linear(4, 4), L.ALIF(4)), L.Linear(4, 2))
    labels = layer_labels(model)
    assert labels["layers.0"] == "Linear_0" and labels["layers.1.layers.1"] == "Sequential_1/ALIF_1"
    assert readable_tag("layers.0.weight", "weight", labels) == "Linear_0/kernel"
    assert readable_tag("layers.0.weight", "bias", labels) == "Linear_0/bias"
    assert readable_tag("layers.1.layers.1.tau", "", labels) == "Sequential_1/ALIF_1/tau"
    assert readable_tag("layers.0.weight", "", labels) == "Linear_0/weight"  # a trace norm: kernel and bias


def test_the_raster_figure_labels_its_axes_and_shows_label_and_prediction():
    pytest.importorskip("matplotlib")
    rng = np.random.default_rng(0)
    inputs, spikes = rng.random((T, C)) < 0.3, {"LIF_1": rng.random((T, H)) < 0.2}
    figure = raster_figure(inputs, spikes, label=1, prediction=0)
    axes = figure.axes
    assert [ax.get_xlabel() for ax in axes] == ["time step", "time step"]
    assert [ax.get_ylabel() for ax in axes] == ["input channel", "neuron"]
    assert axes[0].get_title().startswith("input (") and axes[1].get_title().startswith("LIF_1 (")
    assert figure._suptitle.get_text() == "label 1 · prediction 0"
    image = axes[1].get_images()[0].get_array()
    np.testing.assert_array_equal(np.asarray(image), spikes["LIF_1"].T.astype(np.float32))


def test_without_matplotlib_the_raster_is_a_plain_stacked_image(tmp_path, monkeypatch):
    import etrace_fit.callbacks.tensorboard as tb
    from PIL import Image

    rng = np.random.default_rng(0)
    inputs, spikes = rng.random((T, C)) < 0.3, {"LIF_1": rng.random((T, H)) < 0.2}
    image = raster_image(inputs, spikes)
    assert image.shape == (C + 1 + H, T)
    np.testing.assert_array_equal(image[:C] == 255, inputs.T)
    np.testing.assert_array_equal(image[C + 1:] == 255, spikes["LIF_1"].T)
    monkeypatch.setattr(tb, "has_matplotlib", lambda: False)
    x, y = _data(8)
    trainer = ef.Trainer(_model())
    trainer.fit(x, y, batch_size=8, epochs=1, validation_data=(x[4:], y[4:]), verbose=0,
                callbacks=[TensorBoard(tmp_path, histogram_freq=0)])
    images = [v.image for tag, _, v in _values(tmp_path / "train") if tag == "spikes/raster"]
    assert len(images) == 1
    drawn = np.asarray(Image.open(io.BytesIO(images[0].encoded_image_string)).convert("L"))
    expected = raster_image(x[4], {"LIF_1": trainer.record_spikes(x[4])["layers.1"]})  # the first validation sample
    np.testing.assert_array_equal(drawn, expected)


def test_firing_statistics_count_silent_and_saturated_neurons():
    spikes = np.zeros((2, 10, 4))
    spikes[:, :, 1] = 1.0            # always firing: saturated
    spikes[:, ::2, 2] = 1.0          # half the steps
    stats = firing_statistics(spikes)
    assert stats == {"rate": pytest.approx((1.0 + 0.5) / 4), "silent_fraction": 0.5, "saturated_fraction": 0.25}


def test_exploding_gradients_warn_once_with_the_fix():
    x, y = _data(8)
    trainer = ef.Trainer(_model(), optimizer="sgd", loss="mse", metrics=[])
    trainer.EXPLODING_GRADIENT_NORM = 1e-12  # any gradient counts as exploding here
    targets = np.full((8, 2), 1e3, np.float32)
    with pytest.warns(RuntimeWarning, match=r"epoch 1: the gradient norm is .*clip the gradient "
                                            r"\(Trainer\(grad_clip=1.0\)\) or lower the learning rate"):
        trainer.fit(x, targets, batch_size=8, epochs=2, verbose=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        trainer.fit(x, targets, batch_size=8, epochs=1, verbose=0)  # once per trainer


def test_bad_arguments_fail_in_the_constructor_and_legacy_tags_warn(tmp_path):
    with pytest.raises(ef.ConfigError, match="TensorBoard: hparams must be a dict"):
        TensorBoard(tmp_path, hparams=["task"])
    with pytest.warns(DeprecationWarning, match=r"TensorBoard\(legacy_tags=True\) writes the tags of 0.2"):
        board = TensorBoard(tmp_path, legacy_tags=True)
    x, y = _data(8)
    ef.Trainer(_model()).fit(x, y, batch_size=8, epochs=1, validation_data=(x, y), verbose=0, callbacks=[board])
    tags = {tag for tag, _, _ in _values(tmp_path / "train")}
    assert {"epoch/val_loss", "weights/layers.0.weight/weight", "weights/Linear_0/kernel"} <= tags
    json.dumps(sorted(tags))


def test_keras_arguments_write_graph_images_steps_per_second_and_a_profile(tmp_path):
    x, y = _data(16)
    ef.Trainer(_model()).fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[TensorBoard(
        tmp_path / "on", write_images=True, write_steps_per_second=True, update_freq=2, profile_batch=(2, 3))])
    values = _values(tmp_path / "on" / "train")
    tags = {tag for tag, _, _ in values}
    assert {"weight_images/Linear_0/kernel", "weight_images/LeakyRateReadout_2/kernel", "epoch/steps_per_second",
            "batch/steps_per_second", "model_summary/text_summary", "compile_report/text_summary"} <= tags
    image = next(v.image for tag, _, v in values if tag == "weight_images/Linear_0/kernel")
    assert (image.height, image.width) == (C, H)
    steps = _scalars(tmp_path / "on" / "train")
    assert sorted(steps["batch/steps_per_second"]) == [2, 4, 6, 8] and steps["epoch/steps_per_second"][0] > 0
    profiles = list((tmp_path / "on" / "train" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(profiles) == 1 and profiles[0].stat().st_size > 0
    ef.Trainer(_model()).fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[TensorBoard(
        tmp_path / "off", write_graph=False)])
    tags = {tag for tag, _, _ in _values(tmp_path / "off" / "train")}
    assert "epoch/loss" in tags and not {t for t in tags if "summary" in t or "images" in t or "steps_per" in t}
    assert not (tmp_path / "off" / "train" / "plugins").exists()


@pytest.mark.parametrize("kwargs, message", [
    (dict(embeddings_freq=1), r"embeddings_freq=1, embeddings_metadata=None: Keras' embedding projector is not "),
    (dict(embeddings_metadata={"emb": "m.tsv"}), r"Keras' embedding projector is not written here"),
    (dict(profile_batch=-1), r"profile_batch must be a batch number >= 0 \(0: no profile\) or a range \(start, "
                             r"stop\) with 0 < start <= stop, got -1"),
    (dict(profile_batch=(5, 2)), r"profile_batch must be .*got \(5, 2\)"),
    (dict(write_graph="yes"), r"write_graph must be True or False, got 'yes'"),
])
def test_keras_arguments_that_are_not_written_here_fail_in_the_constructor(tmp_path, kwargs, message):
    with pytest.raises(ef.ConfigError, match=message):
        TensorBoard(tmp_path, **kwargs)
    with pytest.raises(TypeError, match="positional"):
        TensorBoard(tmp_path, 1)  # Keras reads it as histogram_freq, this callback's order as update_freq


def test_an_epochs_points_are_on_disk_when_its_end_is_over_and_a_resumed_run_keeps_its_hparams(tmp_path):
    """tensorboardX writes from a thread and its flush() does not wait for it: an epoch
    BackupAndRestore had backed up could still have its points in the queue when the
    process was killed, and the resumed run never wrote them. And a resumed run's
    HParams entry recorded the rate of its first resumed epoch, not the run's first."""
    from _killed import killed_before

    from etrace_fit.callbacks import BackupAndRestore, LambdaCallback, LearningRateScheduler
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData

    x, y = _data()
    on_disk = []
    look = LambdaCallback(on_epoch_end=lambda epoch, logs: on_disk.append(
        sorted(_scalars(tmp_path / "tb" / "train").get("epoch/loss", {}))))

    def callbacks(*extra):
        return [LearningRateScheduler(lambda epoch: 0.01 * 0.5 ** epoch),
                TensorBoard(tmp_path / "tb", write_graph=False), look, *extra, BackupAndRestore(tmp_path / "backup")]

    with brainstate.environ.context(dt=1.0), warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        with pytest.raises(KeyboardInterrupt):
            ef.Trainer(_model(), optimizer="adam", seed=0).fit(x, y, batch_size=8, epochs=4, verbose=0,
                                                               callbacks=callbacks(killed_before(2)))
        assert on_disk == [[0], [0, 1]]  # each epoch's point written when its end is over
        ef.Trainer(_model(), optimizer="adam", seed=0).fit(x, y, batch_size=8, epochs=4, verbose=0,
                                                           callbacks=callbacks())
    assert sorted(_scalars(tmp_path / "tb" / "train")["epoch/loss"]) == [0, 1, 2, 3]
    starts = [HParamsPluginData.FromString(v.metadata.plugin_data.content).session_start_info
              for tag, _, v in _values(tmp_path / "tb" / "train") if tag == "_hparams_/session_start_info"]
    assert [s.hparams["learning_rate"].number_value for s in starts] == [pytest.approx(0.01)]


def test_a_fit_without_validation_still_gets_firing_dashboards_and_a_schedules_peak_rate(tmp_path):
    """With arrays and no validation data no sequences were picked for the firing
    statistics and the raster (an iterable's first batch was); the HParams rate of a
    schedule was the first epoch's last batch's and the optimizer read
    'GradientTransformationExtraArgs'. Now: the training data's first sequences, the
    schedule's first rate, 'optax'."""
    import optax
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData

    x, y = _data()
    schedule = optax.cosine_decay_schedule(0.01, 6)
    trainer = ef.Trainer(_model(), optimizer=optax.inject_hyperparams(optax.adam)(learning_rate=schedule))
    trainer.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[TensorBoard(tmp_path / "tb", write_graph=False)])
    scalars = _scalars(tmp_path / "tb" / "train")
    assert sorted(scalars["firing/rate/LIF_1"]) == [0, 1, 2]
    assert [round(scalars["epoch/learning_rate"][e], 6) for e in range(3)] == [
        round(float(schedule(2 * e + 1)), 6) for e in range(3)]  # each epoch's last update's rate
    [start] = [HParamsPluginData.FromString(v.metadata.plugin_data.content).session_start_info
               for tag, _, v in _values(tmp_path / "tb" / "train") if tag == "_hparams_/session_start_info"]
    assert start.hparams["learning_rate"].number_value == pytest.approx(0.01)
    assert start.hparams["optimizer"].string_value == "optax"


def test_the_exploding_gradient_warning_under_grad_clip_does_not_advise_clipping():
    x, y = _data()
    trainer = ef.Trainer(_model(), optimizer="sgd", grad_clip=1.0)
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    trainer.EXPLODING_GRADIENT_NORM = 1e-12
    with pytest.warns(RuntimeWarning, match=r"the gradient norm before clipping is .* \(each update is clipped to "
                                            r"grad_clip=1\): lower the learning rate") as record:
        trainer._check_norms(1)
    assert "Trainer(grad_clip=1.0)" not in str(record[0].message)


def _hparams_of(folder):
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData

    *_, start = [HParamsPluginData.FromString(v.metadata.plugin_data.content).session_start_info
                 for tag, _, v in _values(folder / "train") if tag == "_hparams_/session_start_info"]  # the last fit's
    return {k: v.string_value or v.number_value for k, v in start.hparams.items()}


def test_two_fits_in_one_second_keep_every_epoch_and_one_batch_axis(tmp_path):
    """A second fit with a new callback on the same folder: its event files took the
    first one's names (the same second and process, each callback numbering from 1)
    and epochs 1 and 2 were lost; its batch points restarted at step 1, over the first
    fit's. Keras' axis is the optimizer's iterations: the trainer's ``iterations``."""
    x, y = _data()
    trainer = ef.Trainer(_model(), optimizer="adam", seed=0)
    trainer.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[TensorBoard(tmp_path, update_freq="batch")])
    trainer.fit(x, y, batch_size=8, epochs=6, initial_epoch=3, verbose=0,
                callbacks=[TensorBoard(tmp_path, update_freq="batch")])
    scalars = _scalars(tmp_path / "train")
    assert sorted(scalars["epoch/loss"]) == [0, 1, 2, 3, 4, 5]
    assert sorted(scalars["batch/loss"]) == list(range(1, 13)) and trainer.iterations == 12
    assert _hparams_of(tmp_path)["batch_size"] == "8"


def test_the_hparams_batch_size_is_the_batch_trained(tmp_path):
    x, y = _data(8)
    ef.Trainer(_model(), optimizer="adam", seed=0).fit(x, y, batch_size=100, verbose=0,
                                                        callbacks=[TensorBoard(tmp_path)])
    assert _hparams_of(tmp_path)["batch_size"] == "8"  # batch_size=100 asked of 8 sequences: it said 100


class _Clock:
    """``time.perf_counter`` for the TensorBoard module: a batch takes 1 s, a validation
    100 s (callbacks move it), so the pace scalars have exact values."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


class _Advance(ef.callbacks.Callback):
    def __init__(self, clock):
        super().__init__()
        self.clock = clock

    def on_train_batch_end(self, batch, logs=None):
        self.clock.now += 1.0

    def on_test_end(self, logs=None):
        self.clock.now += 100.0


def test_the_pace_scalars_count_training_time_only_and_each_point_its_own_batches(tmp_path, monkeypatch):
    """``epoch/sequences_per_second`` ran to the epoch's end, its validation included
    (64 training sequences read 7250/s without validation and 1170/s with it); the
    batch points' time restarted at each epoch while their count did not, so a point
    across an epoch's start read twice the pace."""
    from etrace_fit.callbacks import tensorboard

    clock = _Clock()
    monkeypatch.setattr(tensorboard, "time", clock)
    x, y = _data()
    ef.Trainer(_model(), optimizer="adam", seed=0).fit(
        x, y, batch_size=4, epochs=2, validation_data=_data(8), verbose=0,
        callbacks=[_Advance(clock), TensorBoard(tmp_path, update_freq=3, write_steps_per_second=True)])
    scalars = _scalars(tmp_path / "train")
    assert scalars["epoch/sequences_per_second"] == {0: pytest.approx(4.0), 1: pytest.approx(4.0)}  # 16 in 4 s
    assert scalars["epoch/steps_per_second"] == {0: pytest.approx(1.0), 1: pytest.approx(1.0)}
    # points at batches 3 and 6: the second covers batch 4 (epoch 1) and 5, 6 (epoch 2, from its start)
    assert scalars["batch/steps_per_second"] == {3: pytest.approx(1.0), 6: pytest.approx(1.0)}

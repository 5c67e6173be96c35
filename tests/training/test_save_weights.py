"""Keras' ``save_weights`` / ``load_weights`` and ModelCheckpoint's ``save_weights_only``,
``save_freq`` and ``initial_value_threshold``."""

import os
import warnings

import jax
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.callbacks import ModelCheckpoint
from etrace_fit.datasets import rate_discrimination
from etrace_fit.errors import CheckpointError, ConfigError

C, H, T = 4, 8, 12


def _model(hidden=H, seed=0):
    rng = np.random.default_rng(seed)
    return ef.Sequential(L.Linear(C, hidden, w_init=rng.normal(0, 1.5, (C, hidden)).astype(np.float32)), L.LIF(hidden),
                         L.LeakyRateReadout(hidden, 2, w_init=rng.normal(0, 0.3, (hidden, 2)).astype(np.float32)))


def _data(n=16):
    return rate_discrimination(n, seq_len=T, num_channels=C, low_rate=0.05, high_rate=0.4, seed=0)


def _weights(trainer):
    return jax.tree.map(np.asarray, trainer.get_weights())


def _equal(a, b):
    jax.tree.map(np.testing.assert_array_equal, a, b)


def test_save_weights_and_load_weights_move_the_weights_alone(tmp_path):
    x, y = _data()
    trained = ef.Trainer(_model(), optimizer=optax.adam(1e-2))
    trained.fit(x, y, batch_size=8, epochs=2, verbose=0)
    trained.save_weights(tmp_path / "w.ckpt")
    other = ef.Trainer(_model(seed=1), optimizer=optax.adam(1e-2))
    other.fit(x, y, batch_size=8, epochs=1, verbose=0)
    opt_state, history = jax.tree.map(np.asarray, other.opt_state), dict(other.history.history)
    other.load_weights(tmp_path / "w.ckpt")
    _equal(_weights(other), _weights(trained))
    _equal(jax.tree.map(np.asarray, other.opt_state), opt_state)  # the optimizer state and history stay
    assert other.history.history == history and other.epoch == 0
    np.testing.assert_array_equal(other.predict(x, verbose=0), trained.predict(x, verbose=0))
    trained.save(tmp_path / "full.ckpt")  # a whole checkpoint's weights load too
    fresh = ef.Trainer(_model(seed=2))
    fresh.load_weights(tmp_path / "full.ckpt")
    _equal(_weights(fresh), _weights(trained))
    assert os.path.getsize(tmp_path / "w.ckpt") < os.path.getsize(tmp_path / "full.ckpt")  # no adam moments


def test_a_weights_file_is_refused_where_a_run_is_resumed_and_by_another_model(tmp_path):
    trainer = ef.Trainer(_model())
    trainer.save_weights(tmp_path / "w.ckpt")
    with pytest.raises(CheckpointError, match=r"w.ckpt holds weights only .*load it with trainer.load_weights"):
        ef.Trainer(_model()).restore(tmp_path / "w.ckpt")
    with pytest.raises(CheckpointError, match=r"w.ckpt holds weights only \(save_weights\)"):
        ef.Trainer.load(tmp_path / "w.ckpt", _model())
    smaller = ef.Trainer(_model(hidden=5))
    before = _weights(smaller)
    with pytest.raises(CheckpointError, match=r"layers\.0\.weight: checkpoint .*\[4, 8\].*model .*\[4, 5\]"):
        smaller.load_weights(tmp_path / "w.ckpt")
    _equal(_weights(smaller), before)  # nothing changed
    with pytest.raises(ConfigError, match="save_weights: .*w.ckpt exists and overwrite=False"):
        trainer.save_weights(tmp_path / "w.ckpt", overwrite=False)


def test_model_checkpoint_save_weights_only_writes_weight_files(tmp_path):
    x, y = _data()
    trainer = ef.Trainer(_model())
    path = str(tmp_path / "w-{epoch}.ckpt")
    trainer.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[ModelCheckpoint(path, save_weights_only=True)])
    assert sorted(os.listdir(tmp_path)) == ["w-1.ckpt", "w-2.ckpt"]
    loaded = ef.Trainer(_model(seed=3))
    loaded.load_weights(tmp_path / "w-2.ckpt")
    _equal(_weights(loaded), _weights(trainer))
    with pytest.raises(CheckpointError, match="holds weights only"):
        ef.Trainer(_model()).restore(tmp_path / "w-2.ckpt")


def test_model_checkpoint_save_freq_saves_every_n_batches_across_epochs(tmp_path, capsys):
    x, y = _data(24)  # 3 batches of 8 an epoch
    trainer = ef.Trainer(_model())
    path = str(tmp_path / "b-{epoch}-{batch}-{loss:.2f}.ckpt")
    trainer.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False,
                callbacks=[ModelCheckpoint(path, save_freq=2, verbose=1, monitor="loss")])
    names = sorted(os.listdir(tmp_path), key=lambda n: (int(n.split("-")[1]), int(n.split("-")[2])))
    assert [n.split("-")[1:3] for n in names] == [["1", "2"], ["2", "1"], ["2", "3"]]  # batches 2, 4, 6
    assert "Epoch 2, batch 3: saving model to" in capsys.readouterr().out
    with pytest.raises(ConfigError, match=r"monitor 'val_loss' is a validation value, but save_freq=2 saves after "
                                          r"batches"):
        trainer.fit(x, y, batch_size=8, epochs=1, verbose=0, validation_data=(x, y),
                    callbacks=[ModelCheckpoint(str(tmp_path / "v.ckpt"), save_freq=2, save_best_only=True)])
    # {batch} with saves at epochs: the check formatted it with batch=1 and passed; the first save failed
    before = jax.tree.leaves(trainer.get_weights())
    with pytest.raises(ConfigError, match=r"names \{batch\}, but save_freq='epoch' saves at epochs' ends"):
        trainer.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[ModelCheckpoint(path)])
    for a, b in zip(before, jax.tree.leaves(trainer.get_weights())):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_model_checkpoint_initial_value_threshold_and_its_arguments(tmp_path):
    x, y = _data()
    trainer = ef.Trainer(_model())
    trainer.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[
        ModelCheckpoint(str(tmp_path / "best.ckpt"), monitor="loss", save_best_only=True, initial_value_threshold=0.0)])
    assert not os.path.exists(tmp_path / "best.ckpt")  # no loss beats 0
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[
        ModelCheckpoint(str(tmp_path / "best.ckpt"), monitor="loss", save_best_only=True, initial_value_threshold=1e9)])
    assert os.path.exists(tmp_path / "best.ckpt")
    for kwargs, message in (
            (dict(save_weights_only="min"), r"save_weights_only must be True or False, got 'min' \(mode comes after"),
            (dict(save_freq=0), r"save_freq must be 'epoch' or a positive int \(batches between saves\), got 0"),
            (dict(save_freq="batch"), r"save_freq must be 'epoch' or a positive int"),
            (dict(initial_value_threshold="low"),
             r"ModelCheckpoint: initial_value_threshold must be a number or None, got 'low' \(str\)")):
        with pytest.raises(ConfigError, match=message):
            ModelCheckpoint("ckpt", **kwargs)
    with pytest.raises(ConfigError, match=r"save_weights_only must be True or False, got 'max' \(mode comes after"):
        ModelCheckpoint("ckpt", "val_loss", 0, True, "max")  # Keras 2 users' positional mode


def test_a_filepath_that_cannot_be_formatted_or_is_a_folder_fails_before_training(tmp_path):
    """These failed at the first epoch's end, and that epoch's training was lost."""
    from etrace_fit.callbacks import LambdaCallback

    x, y = _data()
    batches = []
    counting = LambdaCallback(on_train_batch_begin=lambda batch, logs: batches.append(batch))
    (tmp_path / "folder").mkdir()
    for filepath, message in (
            (tmp_path / "{val_loss:03d}.ckpt", r"cannot be formatted with the epoch \(an int\) and the logs "
                                               r"\(floats\): ValueError: Unknown format code 'd'"),
            (tmp_path / "{}.ckpt", r"cannot be formatted .*IndexError"),
            (tmp_path / "folder", r"filepath '.*folder' is a folder; give a file path in it")):
        with pytest.raises(ConfigError, match=message):
            ef.Trainer(_model()).fit(x, y, batch_size=8, epochs=1, verbose=0, validation_data=(x, y),
                                     callbacks=[ModelCheckpoint(str(filepath)), counting])
    assert batches == []


def test_save_to_a_folder_or_below_a_file_names_the_problem(tmp_path):
    trainer = ef.Trainer(_model())
    with pytest.raises(CheckpointError, match=r"is a folder: give the checkpoint a file name in it"):
        trainer.save(tmp_path)
    (tmp_path / "afile").write_text("")
    with pytest.raises(CheckpointError, match=r"afile is a file, so the checkpoint's folder cannot be made there"):
        trainer.save_weights(tmp_path / "afile" / "w.ckpt")


def test_restoring_over_another_learning_rate_says_that_the_saved_one_is_used(tmp_path):
    x, y = _data()
    saved = ef.Trainer(_model(), optimizer=optax.inject_hyperparams(optax.adam)(learning_rate=1e-3))
    saved.fit(x, y, batch_size=8, epochs=1, verbose=0)
    saved.save(tmp_path / "run.ckpt")
    mine = optax.inject_hyperparams(optax.adam)(learning_rate=0.05)
    with pytest.warns(UserWarning, match=r"run.ckpt: the saved learning rate 0.001 replaces this optimizer's 0.05 .*"
                                         r"set trainer.learning_rate = 0.05 to use yours"):
        loaded = ef.Trainer.load(tmp_path / "run.ckpt", _model(), optimizer=mine)
    assert loaded.learning_rate == pytest.approx(1e-3)
    with pytest.warns(UserWarning, match="the saved learning rate 0.001 replaces this optimizer's 0.05"):
        ef.Trainer(_model(), optimizer=mine).restore(tmp_path / "run.ckpt")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same rate, or an optimizer saved by name: nothing to say
        ef.Trainer(_model(), optimizer=optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)).restore(
            tmp_path / "run.ckpt")
        named = ef.Trainer(_model(), optimizer="adam")
        named.fit(x, y, batch_size=8, epochs=1, verbose=0)
        named.learning_rate = 1e-4
        named.save(tmp_path / "named.ckpt")
        assert ef.Trainer.load(tmp_path / "named.ckpt", _model()).learning_rate == pytest.approx(1e-4)


def test_save_with_overwrite_false_refuses_an_existing_file_and_leaves_it(tmp_path):
    """Keras' ``save(filepath, overwrite=True)``: with ``overwrite=False`` an existing
    file is refused before anything is written (Keras asks at a prompt; a script has
    none); by default it is replaced."""
    x, y = _data()
    trainer = ef.Trainer(_model(), optimizer=optax.adam(1e-2))
    trainer.save(tmp_path / "run.ckpt")
    before = (tmp_path / "run.ckpt").read_bytes()
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    with pytest.raises(ConfigError, match=r"save: .*run.ckpt exists and overwrite=False; give another path"):
        trainer.save(tmp_path / "run.ckpt", overwrite=False)
    assert (tmp_path / "run.ckpt").read_bytes() == before
    trainer.save(tmp_path / "new.ckpt", overwrite=False)  # a new path is written
    trainer.save(tmp_path / "run.ckpt")
    assert (tmp_path / "run.ckpt").read_bytes() != before
    loaded = ef.Trainer.load(tmp_path / "run.ckpt", _model(), optimizer=optax.adam(1e-2))
    assert len(loaded.history.history["loss"]) == 1  # the fitted epoch, not the first file's


def _with_head(classes, extra=False, seed=0):
    rng = np.random.default_rng(seed)
    layers = [L.Linear(C, H, w_init=rng.normal(0, 1.5, (C, H)).astype(np.float32)), L.LIF(H)]
    if extra:
        layers += [L.Linear(H, H, w_init=rng.normal(0, 0.3, (H, H)).astype(np.float32)), L.LIF(H)]
    layers.append(L.LeakyRateReadout(H, classes, w_init=rng.normal(0, 0.3, (H, classes)).astype(np.float32)))
    return ef.Sequential(*layers)


def test_load_weights_skip_mismatch_loads_what_fits_and_names_what_it_kept(tmp_path):
    """Keras' ``load_weights(skip_mismatch=True)``: a model whose head has another
    number of classes takes the first layer's weights and keeps its own head; a model
    with a layer the file lacks keeps that layer's; each kept weight is named in one
    warning with the shapes. Without it the same file is refused and nothing changes."""
    source = ef.Trainer(_with_head(2, seed=0))
    source.save_weights(tmp_path / "w.ckpt")
    saved = _weights(source)
    three = ef.Trainer(_with_head(3, seed=1))
    before = _weights(three)
    with pytest.raises(CheckpointError, match=r"layers\.2\.weight"):
        three.load_weights(tmp_path / "w.ckpt")
    _equal(_weights(three), before)
    with pytest.warns(UserWarning, match=r"skip_mismatch=True\) kept 1 of the model's weights and states as they "
                                         r"were: layers\.2\.weight \(saved \[\(2,\), \(8, 2\)\], the model has "
                                         r"\[\(3,\), \(8, 3\)\]\)"):
        three.load_weights(tmp_path / "w.ckpt", skip_mismatch=True)
    got = _weights(three)
    _equal(got[("layers", 0, "weight")], saved[("layers", 0, "weight")])
    _equal(got[("layers", 2, "weight")], before[("layers", 2, "weight")])
    deeper = ef.Trainer(_with_head(2, extra=True, seed=2))
    before = _weights(deeper)
    with pytest.warns(UserWarning, match=r"kept 2 of .*layers\.2\.weight \(saved \[\(2,\), \(8, 2\)\], the model "
                                         r"has \[\(8,\), \(8, 8\)\]\); layers\.4\.weight \(not in the file\)"):
        deeper.load_weights(tmp_path / "w.ckpt", skip_mismatch=True)
    got = _weights(deeper)
    _equal(got[("layers", 0, "weight")], saved[("layers", 0, "weight")])
    _equal(got[("layers", 4, "weight")], before[("layers", 4, "weight")])
    same = ef.Trainer(_with_head(2, seed=3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # everything fits: no warning
        same.load_weights(tmp_path / "w.ckpt", skip_mismatch=True)
    _equal(_weights(same), saved)


def test_load_weights_skip_mismatch_keeps_a_long_term_state_the_file_lacks(tmp_path):
    """A dropout key the file does not hold (the model gained a Dropout) stays the
    model's own, named in the warning; the weights that fit load."""
    ef.Trainer(_with_head(2, seed=0)).save_weights(tmp_path / "w.ckpt")
    model = _with_head(2, seed=1)
    model.layers.insert(2, L.Dropout(0.2, seed=0))
    trainer = ef.Trainer(model)
    keys = [np.asarray(s.value) for s in model.states().values() if type(s).__name__ == "DropoutKey"]
    with pytest.warns(UserWarning, match=r"\(a long-term state not in the file\)"):
        trainer.load_weights(tmp_path / "w.ckpt", skip_mismatch=True)
    after = [np.asarray(s.value) for s in model.states().values() if type(s).__name__ == "DropoutKey"]
    assert keys and all(np.array_equal(a, b) for a, b in zip(keys, after))

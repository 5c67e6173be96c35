"""Data parallelism on 4 emulated CPU devices (``Trainer(mesh=...)``) against one device.

The runs happen in one subprocess (``_four_devices.py``: XLA's device count is fixed at
start-up), in float64; each test reads its part of the JSON it prints.
"""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit import distributed, layers
from etrace_fit.errors import CheckpointError, ConfigError

from ._combos import COMBOS

WORKER = pathlib.Path(__file__).with_name("_four_devices.py")


@pytest.fixture(scope="module")
def runs():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    done = subprocess.run([sys.executable, str(WORKER)], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])




@pytest.mark.parametrize("model, algo", COMBOS)
def test_three_steps_on_four_devices_give_the_one_device_weights(runs, model, algo):
    result = runs["equivalence"][f"{model}/{algo}"]
    assert result["weights"] < 1e-10  # float64: the reduction order alone differs


@pytest.mark.parametrize("model, algo", COMBOS)
def test_history_evaluate_and_predict_match_the_one_device_run(runs, model, algo):
    result = runs["equivalence"][f"{model}/{algo}"]
    one, four = result["history_one"], result["history_four"]
    assert one.keys() == four.keys()
    for key in one:  # sums over the whole batch, not means of per-device means
        np.testing.assert_allclose(four[key], one[key], rtol=1e-12)
    for key in result["evaluate_one"]:
        np.testing.assert_allclose(result["evaluate_four"][key], result["evaluate_one"][key], rtol=1e-12)
    assert result["predict"] < 1e-12


def test_weights_are_replicated_and_hidden_states_split_over_the_batch_axis(runs):
    assert sorted(runs["equivalence"]) == sorted(f"{m}/{a}" for m, a in COMBOS)  # the worker ran these
    for result in runs["equivalence"].values():
        assert result["weight_sharding"] == {"devices": 4, "spec": []}
        assert result["state_sharding"] and all(s == {"devices": 4, "spec": ["batch"]}
                                                for s in result["state_sharding"])
        assert all(s == {"devices": 4, "spec": []} for s in result["key_sharding"])  # keys, running stats
    assert runs["equivalence"]["dropout/d_rtrl"]["key_sharding"]


def test_stateful_traces_are_split_a_quarter_per_device_and_training_matches(runs):
    stateful = runs["stateful_and_update_every"]["stateful"]
    assert stateful["weights"] < 1e-10
    assert stateful["trace_shards"] == [4] * len(stateful["trace_bytes_one"])
    assert [4 * b for b in stateful["trace_bytes_four"]] == stateful["trace_bytes_one"]


def test_update_every_on_four_devices_matches(runs):
    assert runs["stateful_and_update_every"]["update_every"]["weights"] < 1e-10


def test_compiled_step_needs_about_a_quarter_of_the_memory_per_device(runs):
    one, four = runs["memory"]["None"], runs["memory"]["4"]
    # D-RTRL traces dominate the scratch memory; the replicated weights and gradients do not split
    assert four["temp"] < 0.3 * one["temp"], (one, four)
    # the history sum over samples is split per device: gradients are all-reduced, no trace is gathered
    assert runs["memory"]["collectives"] == ["all-reduce"], runs["memory"]["collectives"]
    report = runs["memory"]["report 4"]
    assert report.startswith("data parallel over 4 devices") and "at batch 32: 8 per device" in report
    assert "data parallel" not in runs["memory"]["report None"]


@pytest.mark.parametrize("direction", ["None->4", "4->None"])
def test_a_checkpoint_resumes_on_another_number_of_devices(runs, direction):
    result = runs["checkpoints"][direction]
    assert result["weights"] < 1e-10


def test_bad_meshes_and_batches_fail_before_training_naming_the_numbers(runs):
    errors = runs["errors"]
    assert "no 'batch' axis" in errors["no_batch_axis"]["error"] and "('data',)" in errors["no_batch_axis"]["error"]
    assert "from 1 to the 4 device(s)" in errors["too_many_devices"]["error"]
    assert "'all'" in errors["bad_mesh"]["error"]
    indivisible = errors["indivisible_batch"]
    assert "batch_size 6" in indivisible["error"] and "4 devices" in indivisible["error"]
    assert indivisible["unchanged"] is True
    last = errors["indivisible_last_batch"]
    assert "26 samples in batches of 8 leave 2" in last["error"] and "drop_remainder=True" in last["error"]
    # 26 is no multiple of 4: no batch size splits it (the message once suggested 4, and one dividing 26)
    assert "no batch size would: 26 is not a multiple of 4" in last["error"] and "(mesh=2)" in last["error"]
    assert last["unchanged"] is True
    assert errors["drop_remainder_trains"] is True
    assert errors["listed_and_one_batch_train"] is True
    listed = errors["listed_short_batch"]
    assert listed["error"].startswith("batch 1 of the list (3 sequences) does not split evenly over the 4 devices")
    assert "drop_remainder" not in listed["error"] and "drop or pad a short last one" in listed["error"]
    assert listed["unchanged"] is True
    generated = errors["generated_short_batch"]
    assert generated["error"].startswith("batch 1 of epoch 1 of x (6 sequences) does not split evenly over the 4 "
                                         "devices"), generated["error"]


def test_evaluation_of_a_batch_that_does_not_split_runs_replicated(runs):
    errors = runs["errors"]
    for key, value in errors["evaluate_short_batch_one"].items():
        np.testing.assert_allclose(errors["evaluate_short_batch"][key], value, rtol=1e-12)


def test_the_command_line_trains_on_the_mesh_and_refuses_a_batch_that_does_not_split(runs):
    cli = runs["cli"]
    assert cli["--devices 4"]["devices"] == 4 and cli["--mesh auto"]["devices"] == 4
    assert cli["indivisible"]["status"] == 2
    assert "--batch-size 10 does not split evenly over the 4 devices" in cli["indivisible"]["stderr"]


def test_the_learner_streams_on_four_devices_with_the_one_device_gradients(runs):
    assert runs["learner"]["grads"] < 1e-10
    assert runs["learner"]["trace_devices"] and set(runs["learner"]["trace_devices"]) == {4}


def test_the_scaling_page_runs_on_four_devices(runs):
    assert runs["docs"]["devices"] == 4 and runs["docs"]["memory"]["temp"] > 0


# ------------------------------------------------------------------ in this process
def test_mesh_arguments_resolve_on_one_device():
    assert distributed.resolve_mesh(None) is None
    assert distributed.resolve_mesh("auto") is None or jax.device_count() > 1
    mesh = distributed.resolve_mesh(1)
    assert mesh.axis_names == ("batch",) and mesh.size == 1
    with pytest.raises(ConfigError, match="got bool"):
        distributed.resolve_mesh(True)
    with pytest.raises(ConfigError, match="jax.sharding.Mesh, got list"):
        distributed.resolve_mesh([0])


def test_a_one_device_mesh_trains_like_no_mesh():
    x = np.random.default_rng(0).normal(size=(8, 5, 3)).astype(np.float32)
    y = np.arange(8) % 2
    results = []
    for mesh in (None, 1):
        brainstate_seed(0)
        trainer = ef.Trainer(ef.Sequential(layers.GRUCell(3, 4), layers.Linear(4, 2)), optimizer=optax.sgd(0.1),
                             mesh=mesh)
        trainer.fit(x, y, batch_size=4, epochs=1, verbose=0)
        results.append(jax.tree.leaves(trainer.get_weights()))
    # The same math in another program (the mesh's sharding annotations): equal to
    # float32 rounding, which on an entry near zero (a bias at 3e-4) is not 1e-6 of it.
    for a, b in zip(*results):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-8)


def test_a_checkpoint_of_another_process_count_is_refused(tmp_path, monkeypatch):
    x = np.random.default_rng(0).normal(size=(8, 5, 3)).astype(np.float32)
    y = np.arange(8) % 2
    trainer = ef.Trainer(ef.Sequential(layers.GRUCell(3, 4), layers.Linear(4, 2)), optimizer="sgd")
    trainer.fit(x, y, batch_size=4, epochs=1, verbose=0)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    path = tmp_path / "two.ckpt"
    trainer.save(path)  # process 0 of a 2-process run writes
    monkeypatch.undo()
    before = jax.tree.leaves(trainer.get_weights())
    with pytest.raises(CheckpointError, match="2 process\\(es\\), this one has 1"):
        trainer.restore(path)
    for a, b in zip(before, jax.tree.leaves(trainer.get_weights())):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_process_local_batches_need_a_mesh():
    x = np.zeros((4, 5, 3), np.float32)
    trainer = ef.Trainer(ef.Sequential(layers.GRUCell(3, 4), layers.Linear(4, 2)))
    with pytest.raises(ConfigError, match="ProcessLocal batches .* give the Trainer a mesh"):
        trainer.fit(distributed.ProcessLocal([(x, np.zeros(4, int))]), epochs=1, verbose=0)


def brainstate_seed(seed):
    import brainstate

    brainstate.random.seed(seed)


def test_a_mesh_from_jax_make_mesh_trains_like_one_device(runs):
    """jax.make_mesh gives Explicit axes, which the step's sharding constraints refused
    in its first tracing (a ShardingTypeError); the trainer uses the same axes as Auto."""
    for name, result in runs["explicit_mesh"].items():
        assert set(result["given"]) == {"AxisType.Explicit"} and set(result["used"]) == {"AxisType.Auto"}, name
        assert result["devices"] == (4 if name == "batch" else 2)
        # a "model" axis repeats the step on its devices: said when the trainer is built
        assert result["warnings"] == ([] if name == "batch" else [
            "the mesh's axes {'model': 2} besides 'batch' hold copies of the same work: the batch is split over "
            "'batch' alone, so its 4 devices compute as 2; build Mesh(devices, ('batch',)) to split over all of them"])
        assert result["weights"] < 1e-10, name
        four, one = result["evaluate"]
        for key in one:
            np.testing.assert_allclose(four[key], one[key], rtol=1e-12)
        assert result["predict"] < 1e-12


@pytest.mark.parametrize("where", ["validation_data", "evaluate", "predict"])
def test_process_local_data_is_refused_where_it_would_be_read_whole(where):
    """Only fit's training batches are process shares: evaluating a ProcessLocal read each
    process's share as the whole data, and two processes logged different val_loss."""
    x = np.zeros((4, 5, 3), np.float32)
    y = np.zeros(4, int)
    trainer = ef.Trainer(ef.Sequential(layers.GRUCell(3, 4), layers.Linear(4, 2)))
    local = distributed.ProcessLocal([(x, y)])
    calls = {"validation_data": lambda: trainer.fit(x, y, validation_data=local, epochs=1, verbose=0),
             "evaluate": lambda: trainer.evaluate(local, verbose=0),
             "predict": lambda: trainer.predict(distributed.ProcessLocal([x]), verbose=0)}
    name = {"validation_data": "validation_data", "evaluate": "evaluate's x", "predict": "predict's x"}[where]
    with pytest.raises(ConfigError, match=f"^{name} is a ProcessLocal, .* the same in every process"):
        calls[where]()
    assert trainer.iterations == 0


def test_learned_time_constants_are_floored_on_four_devices(runs):
    """layers.Constrained's projection runs in the split step too (the step and
    update_every): every τ pushed past zero is back at 0.1 dt."""
    for name, taus in runs["constraints"].items():
        for tau in taus:
            np.testing.assert_allclose(tau, 0.1, rtol=1e-9, err_msg=name)

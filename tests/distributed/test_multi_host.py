"""Two processes on localhost (``etrace_fit.distributed.initialize`` with a local
coordinator and gloo CPU collectives) train like one process: ``_two_processes.py``.
jaxlib 0.10 ships gloo, so nothing here skips."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

WORKER = pathlib.Path(__file__).with_name("_two_processes.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("two_processes")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device per process
    single = subprocess.run([sys.executable, str(WORKER), str(folder), "single"], capture_output=True, text=True,
                            env=env, timeout=600)
    assert single.returncode == 0, single.stderr[-3000:]
    port = str(free_port())
    workers = [subprocess.Popen([sys.executable, str(WORKER), str(folder), str(n), port], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env) for n in (0, 1)]
    try:
        logs = [w.communicate(timeout=600) for w in workers]
    finally:
        for w in workers:
            w.kill()
    for worker, (_, err) in zip(workers, logs):
        assert worker.returncode == 0, err[-3000:]
    read = lambda name: json.loads((folder / f"{name}.json").read_text())  # noqa: E731
    return folder, read("single"), read("process0"), read("process1")


def test_two_processes_span_two_devices(outputs):
    _, single, first, second = outputs
    assert single["devices"] == 1 and single["processes"] == 1
    assert first["devices"] == second["devices"] == 2
    assert first["processes"] == second["processes"] == 2


def test_two_steps_on_two_processes_match_the_single_process_run(outputs):
    _, single, first, second = outputs
    for key, value in single["weights"].items():
        np.testing.assert_allclose(first["weights"][key], value, rtol=1e-10, atol=1e-14)
        np.testing.assert_array_equal(second["weights"][key], first["weights"][key])  # replicated


def test_each_process_feeding_its_half_of_every_batch_trains_like_whole_batches(outputs):
    _, single, first, second = outputs
    for key, value in single["local_weights"].items():
        np.testing.assert_allclose(first["local_weights"][key], value, rtol=1e-10, atol=1e-14)
        np.testing.assert_array_equal(second["local_weights"][key], first["local_weights"][key])
    for result in (first, second):  # the global batch of 8, not a process's share of 4
        assert "at batch 8: 4 per device" in result["local_report"], result["local_report"]


def test_process_shares_of_an_odd_size_train_like_whole_batches(outputs):
    """Each process's 3 rows make a global batch of 6, which splits over the 2 devices:
    the check before training read the share of 3 as the batch (refused it)."""
    _, single, first, second = outputs
    for key, value in single["odd_share_weights"].items():
        np.testing.assert_allclose(first["odd_share_weights"][key], value, rtol=1e-10, atol=1e-14)
        np.testing.assert_array_equal(second["odd_share_weights"][key], first["odd_share_weights"][key])


def test_history_evaluate_and_predict_match_in_every_process(outputs):
    _, single, *processes = outputs
    for result in processes:
        for key, value in single["history"].items():
            np.testing.assert_allclose(result["history"][key], value, rtol=1e-12)
        for key, value in single["evaluate"].items():
            np.testing.assert_allclose(result["evaluate"][key], value, rtol=1e-12)
        np.testing.assert_allclose(result["predict"], single["predict"], rtol=1e-10, atol=1e-14)


def test_only_process_zero_writes_logs_and_checkpoints(outputs):
    folder, *_ = outputs
    rows = (folder / "log.csv").read_text().splitlines()
    assert rows[0].startswith("epoch") and len(rows) == 2  # one epoch, written once
    assert (folder / "final.ckpt").exists()
    assert sorted(p.name for p in (folder / "backup").iterdir()) == ["latest.ckpt"]
    assert not [p for p in folder.rglob("*") if p.name.startswith(".tmp-etrace")]

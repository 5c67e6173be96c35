"""The task scripts in examples/ (etrace_fit/tasks.py): each has --help, runs a tiny
version of its task into its own run folder (TensorBoard, log.csv, best.ckpt), and a
task read from files says where to get them when they are missing. The file tasks run
on small files written here in each published format."""

import importlib.util
import pathlib
import struct

import brainstate
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = ["evidence_accumulation", "copy_task", "mnist1d", "shd", "nmnist", "dvs_gesture"]


def _main(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.fixture(autouse=True)
def _restore_dt():
    yield
    if "dt" in brainstate.environ.all():
        brainstate.environ.pop("dt")


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_has_help(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _main(name)(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--algo" in out and "--data-dir" in out and "--logdir" in out
    assert name in (ROOT / "README.md").read_text()  # each has its line in the README


@pytest.mark.parametrize("name", ["shd", "nmnist", "dvs_gesture"])
def test_a_file_task_without_files_says_where_to_get_them(name, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _main(name)(["--logdir", "none", "--verbose", "0"])
    assert exit_info.value.code == 2
    assert "pass --data-dir" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _main(name)(["--data-dir", str(tmp_path), "--logdir", "none", "--verbose", "0"])
    assert "FileNotFoundError" in capsys.readouterr().err  # the reader names the layout and the URL


def _run(name, tmp_path, *extra):
    summary = _main(name)(["--epochs", "1", "--logdir", str(tmp_path / "runs"), "--verbose", "0", *extra])
    (run,) = (tmp_path / "runs").iterdir()
    assert {"train", "validation", "log.csv", "best.ckpt"} <= {p.name for p in run.iterdir()}
    assert 0.0 <= summary["accuracy"] <= 1.0
    return summary


@pytest.mark.parametrize("model", ["lru", "gru"])
def test_copy_task_runs_either_model_into_its_own_folder(model, tmp_path):
    summary = _run("copy_task", tmp_path, "--model", model, "--samples", "32", "--val-samples", "16",
                   "--batch-size", "16")
    assert summary["run"].name.startswith("copy-hybrid-seed0-" if model == "lru" else "copy-gru-hybrid-seed0-")


def test_the_copy_tasks_lru_is_learned_exactly_online_and_the_gru_is_not():
    import jax.numpy as jnp

    import etrace_fit as ef
    from etrace_fit import tasks

    brainstate.environ.set(dt=1.0)
    x, _, _ = tasks.TASKS["copy"].make_data("train", 4, 0, None)
    for name, exact in (("copy", True), ("copy-gru", False)):
        model = tasks.TASKS[name].make_model()
        brainstate.nn.init_all_states(model, batch_size=4)
        learner = ef.compile(model, jnp.asarray(x[:, 0]), lambda out, y: jnp.sum(out), algo="hybrid")
        assert (learner.plan.approximations() == {}) == exact, name
        if exact:
            assert {rule.name for rule in learner.plan.rules} == {"d_rtrl"}


@pytest.mark.parametrize("model", ["gru", pytest.param("snn", marks=pytest.mark.slow)])
def test_mnist1d_runs_either_model_into_its_own_folder(model, tmp_path):
    summary = _run("mnist1d", tmp_path, "--model", model, "--samples", "64", "--val-samples", "32",
                   "--data-dir", str(tmp_path / "cache"))
    assert summary["run"].name.startswith(f"mnist1d-{model}-hybrid-seed0-")
    assert list((tmp_path / "cache" / "mnist1d").glob("mnist1d_*.npz"))  # generated once, cached there


@pytest.mark.slow
def test_the_eprop_preset_runs_into_its_own_folder(tmp_path, capsys):
    summary = _run("evidence_accumulation", tmp_path, "--samples", "8", "--val-samples", "8", "--batch-size", "8")
    assert summary["history"]["rate_layers.0"][0] > 0  # the rate regulariser logs the layer's rate
    assert summary["batches_per_epoch"] == 1
    reached = summary["iterations_to_target"]
    assert reached == (1 if summary["accuracy"] >= 0.9 else None)
    assert summary["seconds_to_target"] == (summary["epoch_seconds"][0] if reached else None)
    out = capsys.readouterr().out
    assert "validation accuracy >= 0.9 " in out
    assert (f"after 1 iterations ({summary['epoch_seconds'][0]:.0f} s)" in out) == bool(reached)


def test_the_eprop_preset_is_the_published_network_and_task():
    from etrace_fit import tasks

    task = tasks.TASKS["eprop-evidence"]
    brainstate.environ.set(dt=1.0)
    brainstate.random.seed(0)
    layer = task.make_model().layers[0]
    rho, alpha = np.exp(-1 / 2000), np.exp(-1 / 20)
    np.testing.assert_allclose(np.asarray(layer.beta), np.r_[np.zeros(50), np.full(50, 1.7 * (1 - rho) / (1 - alpha))],
                               rtol=1e-6)
    assert 0.017 < layer.beta[-1] < 0.018 and layer.v_threshold == 0.6 and layer.refractory == 5
    assert set(layer.W.weight.value) == {"weight"}  # no bias
    w = np.asarray(layer.W.weight_fn(layer.W.weight.value["weight"]))
    assert np.all(np.diag(w[40:]) == 0.0) and np.all(w[40:][~np.eye(100, dtype=bool)] != 0.0)  # no autapse
    np.testing.assert_allclose([w[:40].std(), w[40:][~np.eye(100, dtype=bool)].std()], [40 ** -0.5, 0.1], rtol=0.1)
    x, y, mask = task.make_data("train", 400, 0, None)
    assert x.shape == (400, 2250, 40) and mask[:, -150:].all() and not mask[:, :-150].any()
    assert x[:, :50, :30].max() == 0.0 and x[:, -150:, 20:30].mean() > 0.03  # a silent lead-in; the recall cue
    np.testing.assert_allclose(x[:, :, 30:].mean(), 0.01, atol=0.002)  # 10 Hz noise
    assert task.target_accuracy == 0.9


@pytest.mark.parametrize("curve, expected", [([0.5, 0.89, 0.9, 0.95], 150), ([0.95], 50), ([0.5, 0.8], None)])
def test_iterations_to_target_counts_batches_up_to_the_first_validation_that_reaches_it(curve, expected):
    from etrace_fit.tasks import iterations_to_target

    assert iterations_to_target(curve, 0.9, 50) == expected


@pytest.mark.parametrize("curve, expected", [([0.5, 0.89, 0.9, 0.95], 7.5), ([0.95], 2.0), ([0.5, 0.8], None)])
def test_seconds_to_target_is_the_end_of_the_first_epoch_that_reaches_it(curve, expected):
    from etrace_fit.tasks import seconds_to_target

    assert seconds_to_target(curve, 0.9, [2.0, 4.5, 7.5, 9.0][:len(curve)]) == expected
    expected_error = r"epoch_seconds has 5 entries, expected one per validation \(%d\)" % len(curve)
    with pytest.raises(ValueError, match=expected_error):
        seconds_to_target(curve, 0.9, [2.0, 4.5, 7.5, 9.0, 9.5])


def test_a_run_reports_when_each_epoch_ended():
    summary = _main("copy_task")(["--epochs", "2", "--samples", "32", "--val-samples", "16", "--batch-size", "16",
                                  "--logdir", "none", "--verbose", "0"])
    ends = summary["epoch_seconds"]
    assert len(ends) == 2 and 0.0 < ends[0] < ends[1] <= summary["seconds"]
    assert summary["iterations_to_target"] is None is summary["seconds_to_target"]  # the task sets no target


# ---------------------------------------------------------------- tiny files in the published formats
def _nmnist_file(path, rng, n=200):
    x, y, p = rng.integers(0, 34, n), rng.integers(0, 34, n), rng.integers(0, 2, n)
    t = np.sort(rng.integers(0, 290_000, n))
    raw = np.zeros((n, 5), np.uint8)
    raw[:, 0], raw[:, 1], raw[:, 2] = x, y, (p << 7) | ((t >> 16) & 0x7F)
    raw[:, 3], raw[:, 4] = (t >> 8) & 0xFF, t & 0xFF
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw.tobytes())


def _aedat(path, rng, n=2000, end=3_000_000):
    header = b"#!AER-DAT3.1\r\n#Format: RAW\r\n#!END-HEADER\r\n"
    t = np.sort(rng.integers(0, end, n))
    events = b"".join(struct.pack("<II", 1 | int(p) << 1 | int(y) << 2 | int(x) << 17, int(s)) for x, y, p, s in
                      zip(rng.integers(0, 128, n), rng.integers(0, 128, n), rng.integers(0, 2, n), t))
    path.write_bytes(header + struct.pack("<hhiiiiii", 1, 1, 8, 4, 0, n, n, n) + events)


@pytest.mark.slow
def test_nmnist_and_dvs_gesture_run_on_small_files(tmp_path):
    rng = np.random.default_rng(0)
    nmnist = tmp_path / "nmnist"
    for split in ("Train", "Test"):
        for digit in (0, 1):
            for k in range(2):
                _nmnist_file(nmnist / split / str(digit) / f"{k:05d}.bin", rng)
    _run("nmnist", tmp_path / "a", "--data-dir", str(nmnist), "--batch-size", "4")

    dvs = tmp_path / "dvs"
    dvs.mkdir()
    for name in ("user01_lab", "user02_lab"):
        _aedat(dvs / f"{name}.aedat", rng)
        (dvs / f"{name}_labels.csv").write_text("class,startTime_usec,endTime_usec\n1,100000,1500000\n"
                                                "2,1500000,2900000\n")
    (dvs / "trials_to_train.txt").write_text("user01_lab.aedat\n")
    (dvs / "trials_to_test.txt").write_text("user02_lab.aedat\n")
    _run("dvs_gesture", tmp_path / "b", "--data-dir", str(dvs), "--batch-size", "2")


@pytest.mark.slow
def test_shd_runs_on_a_small_file(tmp_path):
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        with h5py.File(tmp_path / f"shd_{split}.h5", "w") as file:
            times = file.create_dataset("spikes/times", (6,), dtype=h5py.vlen_dtype(np.dtype(np.float16)))
            units = file.create_dataset("spikes/units", (6,), dtype=h5py.vlen_dtype(np.dtype(np.uint16)))
            for i in range(6):
                times[i] = np.sort(rng.uniform(0, 0.9, 50)).astype(np.float16)
                units[i] = rng.integers(0, 700, 50).astype(np.uint16)
            file.create_dataset("labels", data=rng.integers(0, 20, 6).astype(np.uint8))
    _run("shd", tmp_path, "--data-dir", str(tmp_path), "--batch-size", "3")

"""The ``etrace-fit`` command: ``tasks``, ``train`` on a small run, its errors, and the
full demo reaching the README's promise (slow)."""

import os
import subprocess
import sys
from importlib import metadata

import brainstate
import pytest

from etrace_fit.cli import TASKS, main


@pytest.fixture
def restore_dt():
    yield
    if "dt" in brainstate.environ.all():
        brainstate.environ.pop("dt")


def test_tasks_lists_every_built_in_task(capsys):
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    for name in TASKS:
        assert name in out
    assert "T=230, C=40" in out and "ALIF(200)" in out


def test_a_short_train_prints_the_accuracy_and_where_the_logs_are(tmp_path, capsys, restore_dt):
    code = main(["train", "--task", "rate", "--epochs", "1", "--samples", "64", "--batch-size", "16",
                 "--logdir", str(tmp_path), "--verbose", "0", "--seed", "3"])
    assert code == 0
    out = capsys.readouterr().out
    assert "validation accuracy" in out and "after 1 epochs" in out and "algo hybrid" in out
    assert "layers.0.weight d_rtrl" in out  # the budget moved the dense weight to D-RTRL
    runs = list(tmp_path.iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("rate-hybrid-seed3-")
    assert f"TensorBoard logs: {runs[0]}" in out
    assert any("tfevents" in p.name for p in (runs[0] / "train").iterdir())
    assert any("tfevents" in p.name for p in (runs[0] / "validation").iterdir())


def test_trace_dtype_reaches_the_trainer(tmp_path, capsys, restore_dt):
    from etrace_fit.tasks import add_arguments, run
    import argparse

    args = add_arguments(argparse.ArgumentParser()).parse_args(
        ["--task", "rate", "--epochs", "1", "--samples", "32", "--logdir", "none", "--verbose", "0",
         "--trace-dtype", "bfloat16"])
    trainer = run(args.task, args)["trainer"]
    assert trainer.config["trace_dtype"] == "bfloat16" and "bfloat16" in trainer.report()
    with pytest.raises(SystemExit):
        main(["train", "--trace-dtype", "float16"])
    assert "invalid choice: 'float16'" in capsys.readouterr().err


def test_logdir_none_writes_no_logs(tmp_path, capsys, restore_dt, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--task", "rate", "--epochs", "1", "--samples", "32", "--logdir", "none",
                 "--verbose", "0", "--algo", "bptt"]) == 0
    out = capsys.readouterr().out
    assert "TensorBoard" not in out and "algo bptt" in out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, fragment", [
    (["train", "--epochs", "0"], "--epochs must be positive"),
    (["train", "--task", "mnist"], "invalid choice: 'mnist'"),
    (["train", "--algo", "rtrl"], "argument --algo: unknown algo 'rtrl'; valid: "),
    (["train", "--algo", "tbptt:x"], "argument --algo: truncated BPTT needs a window of steps"),
    (["train", "--lr", "-1"], "--lr must be positive"),
    ([], "required"),
])
def test_bad_arguments_exit_with_usage(argv, fragment, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert fragment in capsys.readouterr().err


def test_version_and_a_truncated_bptt_window(tmp_path, capsys, restore_dt, monkeypatch):
    from etrace_fit import __version__

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.strip() == f"etrace-fit {__version__}"
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--task", "rate", "--epochs", "1", "--samples", "32", "--logdir", "none",
                 "--verbose", "0", "--algo", "tbptt:5"]) == 0
    assert "algo tbptt:5" in capsys.readouterr().out


def test_a_bad_memory_budget_is_reported_without_a_traceback(capsys, restore_dt, tmp_path):
    code = main(["train", "--task", "rate", "--epochs", "1", "--samples", "32", "--logdir", str(tmp_path),
                 "--memory-budget", "plenty", "--verbose", "0"])
    assert code == 2
    assert "ConfigError: --memory-budget must be bytes" in capsys.readouterr().err


def test_python_dash_m_and_the_console_script_entry_point():
    result = subprocess.run([sys.executable, "-m", "etrace_fit", "tasks"], capture_output=True, text=True,
                            timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    assert "evidence" in result.stdout
    scripts = {e.name: e.value for e in metadata.entry_points(group="console_scripts")}
    assert scripts.get("etrace-fit") == "etrace_fit.cli:main"


@pytest.mark.slow
def test_the_demo_reaches_90_percent_validation_accuracy(tmp_path):
    """The README's main command, `etrace-fit train`, with its defaults, in a process of
    its own that compiles as a user's does (the suite's compile at -O0: tests/conftest.py)."""
    env = {**os.environ, "XLA_FLAGS": os.environ["XLA_FLAGS"].replace("--xla_backend_optimization_level=0", "")}
    done = subprocess.run([sys.executable, "-m", "etrace_fit.cli", "train", "--logdir", str(tmp_path), "--verbose",
                           "0"], capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    accuracy = float(out.split("validation accuracy ")[1].split()[0])
    assert accuracy >= 0.9, out


def test_a_second_run_reads_its_compiled_programs_from_the_compile_cache(tmp_path):
    """``--compile-cache DIR``: the first run keeps its compiled programs there (in a
    subfolder for this kind of CPU), and a
    second run of the same settings (another seed) compiles nothing new — no file is
    added, every program came from the folder — while a run with more epochs (another
    learning-rate schedule in the step) adds its step (and its optimizer's start); ``$ETRACE_FIT_COMPILE_CACHE``
    names the folder when the option does not, and ``none`` keeps none; when neither
    says, JAX's own cache setting stands (``$JAX_ENABLE_COMPILATION_CACHE=false`` keeps
    none), and when JAX has none either, the programs go to
    ``$XDG_CACHE_HOME/etrace_fit/compiled``. Fresh processes: JAX decides on its cache
    once per process."""
    cache, unused = tmp_path / "cache", tmp_path / "unused"
    argv = [sys.executable, "-m", "etrace_fit", "train", "--task", "rate", "--epochs", "1", "--samples", "32",
            "--val-samples", "16", "--batch-size", "16", "--logdir", "none", "--verbose", "0"]

    def train(*extra, variable="none", **environment):
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("JAX_") and k != "XDG_CACHE_HOME"},
               "ETRACE_FIT_COMPILE_CACHE": variable, "XDG_CACHE_HOME": str(tmp_path / "xdg"), **environment}
        if variable is None:
            del env["ETRACE_FIT_COMPILE_CACHE"]
        done = subprocess.run([*argv, *extra], capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "validation accuracy" in done.stdout

    train("--compile-cache", str(cache), "--seed", "1")
    (host,) = cache.iterdir()  # one subfolder: this machine's kind of CPU
    first, first_host = sorted(p.name for p in host.iterdir()), host.name
    assert any(name.startswith("jit_train_step") for name in first), first  # the training step is there
    train("--seed", "2", variable=str(cache))
    assert sorted(p.name for p in host.iterdir()) == first
    train("--seed", "2", "--epochs", "2", variable=str(cache))
    added = {p.name for p in host.iterdir()} - set(first)
    # the step and the optimizer's start (optimizers.initial_state), both with the schedule compiled in
    assert any(name.startswith("jit_train_step") for name in added), added
    assert all(name.startswith(("jit_train_step", "jit_init")) for name in added), added
    train("--compile-cache", "none", variable=str(unused))
    assert not unused.exists()
    jax_own = tmp_path / "jax"  # neither says: JAX's variables decide
    train(variable=None, JAX_COMPILATION_CACHE_DIR=str(jax_own), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    assert any(p.name.startswith("jit_train_step") for p in jax_own.iterdir())
    assert not (tmp_path / "xdg" / "etrace_fit").exists()
    train(variable=None, JAX_ENABLE_COMPILATION_CACHE="false")
    assert not (tmp_path / "xdg" / "etrace_fit").exists()
    train(variable=None)  # nothing says: the default folder
    (host,) = (tmp_path / "xdg" / "etrace_fit" / "compiled").iterdir()
    assert host.name == first_host and any(p.name.startswith("jit_train_step") for p in host.iterdir())


def test_the_default_compile_cache_keeps_within_its_limit(tmp_path):
    """Past its limit the cache loses its least recently used files first, down to three
    quarters of the limit; within it nothing goes."""
    from etrace_fit.tasks import prune_compile_cache

    host = tmp_path / "cpu"
    host.mkdir()
    for age, name in enumerate(["newest", "newer", "older", "oldest"]):
        path = host / name
        path.write_bytes(b"x" * 100)
        os.utime(path, (1e9 - age * 1000, 1e9 - age * 1000))
    assert prune_compile_cache(tmp_path, limit=400) == 0 and len(list(host.iterdir())) == 4
    assert prune_compile_cache(tmp_path, limit=300) == 200  # to 225 bytes: the two oldest go
    assert sorted(p.name for p in host.iterdir()) == ["newer", "newest"]
    path = host / "newer"
    os.utime(path, (1e9 + 5000, 1e9 - 1000))  # read lately: its access time counts
    assert prune_compile_cache(tmp_path, limit=150) == 100
    assert [p.name for p in host.iterdir()] == ["newer"]


def test_a_default_compile_cache_that_cannot_be_made_warns_and_trains(tmp_path):
    """The default folder is the command's choice, not the user's: when it cannot be made
    (here its parent is a file) the run warns, naming the folder and the options, and
    trains without a cache."""
    taken = tmp_path / "a-file"
    taken.write_text("")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("JAX_")}, "XDG_CACHE_HOME": str(taken)}
    del env["ETRACE_FIT_COMPILE_CACHE"]
    done = subprocess.run([sys.executable, "-m", "etrace_fit", "train", "--task", "rate", "--epochs", "1",
                           "--samples", "32", "--val-samples", "16", "--batch-size", "16", "--logdir", "none",
                           "--verbose", "0"], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "validation accuracy" in done.stdout
    assert f"no compile cache: cannot make '{taken}/etrace_fit/compiled'" in done.stderr
    assert "--compile-cache DIR" in done.stderr


@pytest.mark.parametrize("option, fragment", [
    (["--devices", "8"], "ConfigError: --devices: devices must be an int from 1 to the"),
    (["--mesh", "16"], "ConfigError: --mesh: devices must be an int from 1 to the"),
    (["--memory-budget", "lots"], "ConfigError: --memory-budget must be bytes"),
    (["--memory-budget", "4XB"], "ConfigError: --memory-budget must be bytes (int) or a size like '64MiB'"),
    (["--memory-budget", "1e400"], "ConfigError: --memory-budget must be a finite size like '64MiB', got '1e400'"),
    (["--memory-budget", "4MiB", "--algo", "bptt"], "ConfigError: --memory-budget is the trace memory --algo "
                                                    "hybrid may spend on D-RTRL; --algo bptt does not read it"),
    (["--memory-budget", "4MiB", "--algo", "eprop"], "--algo eprop does not read it"),
    (["--memory-budget", "4MiB", "--algo", "d_rtrl"], "--algo d_rtrl does not read it"),
    (["--trace-dtype", "bfloat16", "--algo", "bptt"], "ConfigError: --trace-dtype bfloat16 sets the eligibility "
                                                      "traces' dtype, but --algo bptt keeps no traces"),
    (["--trace-dtype", "float32", "--algo", "tbptt:5"], "but --algo tbptt:5 keeps no traces"),
    (["--data-dir", "DIR"], "ConfigError: --data-dir: task rate generates its data and reads no folder"),
    (["--compile-cache", ""], "ConfigError: --compile-cache must be a folder (or 'none' for no cache), got ''"),
    (["--logdir", ""], "ConfigError: --logdir must be a folder (or 'none' for no logs), got ''"),
    (["--logdir", "FILE"], "is a file; the run's logs go in a folder under it"),
    (["--logdir", "FILE/runs"], "ConfigError: --logdir FILE/runs: cannot make the folder and write in it (FILE is "
                                "a file)")])
def test_settings_are_refused_before_the_dataset_is_read(option, fragment, tmp_path, capsys, restore_dt, monkeypatch):
    """A real SHD is ~2 GB to read and bin: a typo in an option was reported after it.
    Each message names the option as typed (``--memory-budget``, not ``memory_budget``),
    and an option the run would ignore (a budget only hybrid reads, a trace dtype
    without traces, a data folder for generated data) is refused, not dropped."""
    from etrace_fit import tasks

    def no_data(*args, **kwargs):
        raise AssertionError("the dataset was read before the settings were checked")

    monkeypatch.setitem(tasks.TASKS, "rate", tasks.dataclasses.replace(tasks.TASKS["rate"], make_data=no_data))
    (tmp_path / "FILE").write_text("")
    (tmp_path / "DIR").mkdir()
    option = [a.replace("FILE", str(tmp_path / "FILE")).replace("DIR", str(tmp_path / "DIR")) for a in option]
    fragment = fragment.replace("FILE", str(tmp_path / "FILE"))
    logdir = [] if "--logdir" in option else ["--logdir", "none"]
    assert main(["train", "--task", "rate", "--epochs", "1", "--verbose", "0", *logdir, *option]) == 2
    assert fragment in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["DIR", "FILE"]  # no folder made


def test_a_logdir_that_cannot_be_made_leaves_no_folder_behind(tmp_path, capsys, restore_dt, monkeypatch):
    """The check makes the missing folders of ``--logdir`` and writes in the last; when
    a deeper one cannot be made (a name too long here), those it made go again. A
    folder that can be made is made and kept for the run."""
    from etrace_fit import tasks

    monkeypatch.setitem(tasks.TASKS, "rate", tasks.dataclasses.replace(tasks.TASKS["rate"], make_data=None))
    logdir = tmp_path / "new" / ("x" * 300) / "runs"
    assert main(["train", "--task", "rate", "--epochs", "1", "--verbose", "0", "--logdir", str(logdir)]) == 2
    err = capsys.readouterr().err
    assert f"ConfigError: --logdir {logdir}: cannot make the folder and write in it (File name too long)" in err
    assert list(tmp_path.iterdir()) == []
    tasks._check_logdir(str(tmp_path / "a" / "b"))
    assert (tmp_path / "a" / "b").is_dir() and list((tmp_path / "a" / "b").iterdir()) == []


@pytest.mark.parametrize("argv, fragment", [
    (["--batch-size", "3"], "ConfigError: --batch-size 3 does not split evenly over the 2 devices --devices asks "
                            "for: give a multiple of 2"),
    (["--samples", "7", "--batch-size", "4"], "ConfigError: --samples: 7 training sequences do not split evenly "
                                              "over the 2 devices --devices asks for")])
def test_batches_that_do_not_split_over_the_devices_are_refused_before_the_data(argv, fragment):
    """The Trainer refused these after the data was built, naming ``batch_size`` and
    ``drop_remainder=True``, which the command does not have. Two host devices in a
    process of their own."""
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2"}
    done = subprocess.run([sys.executable, "-m", "etrace_fit", "train", "--task", "rate", "--epochs", "1",
                           "--samples", "8", "--val-samples", "8", "--logdir", "none", "--devices", "2", *argv],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 2, done.stderr[-3000:]
    assert fragment in done.stderr
    assert "etrace-fit: task rate" not in done.stdout  # printed once the data is built


@pytest.mark.parametrize("algo, fragment", [
    ("tbptt:0", "argument --algo: truncated BPTT needs a window of steps, a positive whole number: tbptt:<window> "
                "(e.g. tbptt:50), got 'tbptt:0'"),
    ("rtrl", "argument --algo: unknown algo 'rtrl'; valid: d_rtrl, esd_rtrl, hybrid, eprop, bptt, tbptt:<window> or "
             "eprop:random"),
    ("eprop:x", "argument --algo: algo 'eprop:x': expected 'eprop', 'eprop:random' or 'eprop:symmetric'")])
def test_a_bad_algo_says_what_to_type_not_a_python_value(algo, fragment, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--algo", algo])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert fragment in err
    assert "algo=" not in err and "TBPTT(" not in err and "a dict" not in err


def test_an_mnist1d_cache_that_cannot_be_written_names_data_dir(tmp_path, capsys, restore_dt):
    taken = tmp_path / "a-file"
    taken.write_text("")
    assert main(["train", "--task", "mnist1d-gru", "--epochs", "1", "--verbose", "0", "--logdir", "none",
                 "--data-dir", str(taken)]) == 2
    err = capsys.readouterr().err
    assert f"--data-dir {taken} must be writable (MNIST-1D keeps the arrays it generates in <data-dir>/mnist1d)" in err
    assert "cache=" not in err


def test_more_samples_than_the_files_hold_warns(tmp_path, capsys, restore_dt, monkeypatch):
    """``--samples`` beyond what the dataset holds trained on fewer without a word."""
    from etrace_fit import tasks

    rate = tasks.TASKS["rate"]
    monkeypatch.setitem(tasks.TASKS, "rate", tasks.dataclasses.replace(
        rate, make_data=lambda split, n, seed, data_dir: rate.make_data(split, min(n, 8), seed, data_dir)))
    with pytest.warns(UserWarning) as record:
        assert main(["train", "--task", "rate", "--epochs", "1", "--samples", "16", "--val-samples", "12",
                     "--batch-size", "8", "--logdir", "none", "--verbose", "0"]) == 0
    messages = [str(w.message) for w in record]
    assert "--samples 16: task rate's split has 8 sequences; using all 8" in messages
    assert "--val-samples 12: task rate's split has 8 sequences; using all 8" in messages


def test_a_missing_shd_says_how_to_fetch_it_from_the_shell(tmp_path, capsys, restore_dt):
    assert main(["train", "--task", "shd", "--data-dir", str(tmp_path), "--epochs", "1", "--verbose", "0",
                 "--logdir", "none"]) == 2
    err = capsys.readouterr().err
    assert "pass download=True" not in err and f"load_shd('{tmp_path}', 'train', dt=0.01, download=True)" in err


def test_a_compile_cache_that_is_not_a_folder_is_reported_before_training(tmp_path, capsys, restore_dt):
    """A ``--compile-cache`` path that cannot be a folder (here a file) is a usage error
    naming the option and the path, before any training; no run folder is made."""
    taken = tmp_path / "a-file"
    taken.write_text("")
    logs = tmp_path / "runs"
    code = main(["train", "--task", "rate", "--epochs", "1", "--samples", "32", "--logdir", str(logs),
                 "--verbose", "0", "--compile-cache", str(taken / "cache")])
    assert code == 2
    err = capsys.readouterr().err
    assert "ConfigError: --compile-cache: cannot use" in err and str(taken / "cache") in err
    assert not logs.exists()

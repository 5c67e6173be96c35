"""The benchmark scripts still run (tiny sizes); their numbers live in benchmarks/README.md."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("args", [
    ["benchmarks/compile_time.py", "--units", "16", "--batch", "2", "--repeats", "1"],
    ["benchmarks/rules.py", "--lengths", "4", "8", "--repeats", "1", "--models", "lif"],
    ["benchmarks/epoch_time.py", "--task", "rate", "--epochs", "2", "--rounds", "1", "--samples", "64"],
    ["benchmarks/fidelity.py", "--lengths", "4", "--batch", "2", "--hidden", "4"],
])
def test_benchmark_script_runs(args):
    result = subprocess.run([sys.executable, "-W", "ignore", *args], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "bptt" in result.stdout or "compile_graph" in result.stdout

"""examples/train.py (the Trainer API spelled out) learns: accuracy clearly beats chance, as with BPTT."""

import importlib.util
import pathlib

import brainstate
import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "train.py"


def _main():
    spec = importlib.util.spec_from_file_location("train_example", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["hybrid", "bptt"])
def test_example_learns_the_task(algo, tmp_path):
    try:
        accuracy = _main()(["--algo", algo, "--epochs", "3", "--seed", "0", "--logdir", str(tmp_path)])
    finally:
        brainstate.environ.pop("dt")
    assert accuracy > 0.8
    (run,) = tmp_path.glob(f"example-{algo}-seed0-*")  # each run in its own folder
    assert {p.name for p in run.iterdir()} == {"train", "validation", "log.csv"}

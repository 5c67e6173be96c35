"""The README's main job trains: loss falls and accuracy beats chance clearly."""

import importlib.util
import pathlib

import brainstate
import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "train_bptt.py"


@pytest.mark.slow
def test_main_job_learns_the_task():
    spec = importlib.util.spec_from_file_location("train_bptt", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        accuracy = module.main(["--epochs", "3", "--seed", "0"])
    finally:
        brainstate.environ.pop("dt")
    assert accuracy > 0.8

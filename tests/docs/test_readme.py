"""The README's code, from "A first model" on, runs as written."""

import pathlib
import re

import brainstate
import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.slow
def test_readme_examples_run():
    text = README.read_text()
    section = text[text.index("## A first model"):]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) >= 3
    namespace: dict = {}
    try:
        exec(compile("\n".join(blocks), str(README), "exec"), namespace)
    finally:
        brainstate.environ.pop("dt")
    assert namespace["logits"].shape == (8, 2)
    assert namespace["losses"].shape == (100,)
    assert set(namespace["grads"]) == set(namespace["model"].states(brainstate.ParamState))

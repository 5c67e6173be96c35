"""Every Python code block in README.md and docs/*.md runs as written.

The blocks of one page run in order in one namespace (a page's first block is its
visible setup: imports, a model, data), in a temporary working directory, so files a
snippet writes (``runs/``, checkpoints) land there. A page is listed automatically; a
page whose code trains is marked slow. ``docs/neurons.md`` runs in its own test
(test_neurons.py), which also checks its neurons against BPTT.
"""

from __future__ import annotations

import pathlib
import re
import warnings

import brainstate
import pytest

import etrace_fit as ef

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OWN_TEST = {"neurons.md"}                    # run by test_neurons.py
SLOW = {"README.md", "training.md", "algorithms.md"}  # they train or compile several programs


def python_blocks(page: pathlib.Path) -> list[tuple[int, str]]:
    """``(first line number, code)`` of every ```python block of ``page``."""
    text = page.read_text()
    return [(text[: m.start(1)].count("\n") + 1, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M)]


def run_page(page: pathlib.Path) -> dict:
    namespace: dict = {"__name__": f"docs:{page.name}"}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ef.ApproximationWarning)
            for line, code in python_blocks(page):
                # Padded so a traceback names the page's own line numbers.
                exec(compile("\n" * (line - 1) + code, str(page), "exec"), namespace)
    finally:
        if "dt" in brainstate.environ.all():
            brainstate.environ.pop("dt")
    return namespace


def _param(page: pathlib.Path):
    marks = [pytest.mark.slow] if page.name in SLOW else []
    return pytest.param(page, id=page.name, marks=marks)


@pytest.mark.parametrize("page", [_param(p) for p in PAGES if p.name not in OWN_TEST and python_blocks(p)])
def test_every_python_block_of_the_page_runs(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = run_page(page)
    check = CHECKS.get(page.name)
    if check is not None:
        check(namespace, tmp_path)


def _readme(ns, tmp_path):
    assert ns["logits"].shape == (8, 2) and ns["losses"].shape == (100,)
    assert set(ns["grads"]) == set(ns["model"].states(brainstate.ParamState))
    assert len(ns["history"].history["loss"]) == 1


def _reliability(ns, tmp_path):
    folder = tmp_path / "runs" / "reliable"
    assert sorted(p.name for p in (folder / "ckpt").iterdir()) == ["01.ckpt", "02.ckpt"]
    assert (folder / "log.csv").read_text().count("\n") == 3  # a header and one row per epoch
    assert not (folder / "backup").exists() or not any((folder / "backup").iterdir())  # deleted after the run


def _training(ns, tmp_path):
    assert (tmp_path / "runs" / "log.csv").exists()  # CSVLogger created its folder
    assert ns["history"].params["epochs"] == ns["history"].epoch[-1] + 1


CHECKS = {"README.md": _readme, "training.md": _training, "reliability.md": _reliability}


def test_the_pages_with_code_are_all_collected():
    names = {p.name for p in PAGES if python_blocks(p)}
    assert {"README.md", "training.md", "algorithms.md", "compiler.md", "layers.md", "ops.md"} <= names


def test_docs_name_no_file_outside_the_repository():
    """Every ``docs/<page>.md`` a page or docstring mentions exists (DESIGN.md was
    cited 14 times and was not in the repository)."""
    texts = [p.read_text() for p in PAGES] + [p.read_text() for p in (ROOT / "etrace_fit").rglob("*.py")]
    named = {m for text in texts for m in re.findall(r"docs/([\w-]+\.md)", text)}
    missing = sorted(name for name in named if not (ROOT / "docs" / name).exists())
    assert not missing
    assert not any("DESIGN.md" in text for text in texts)

"""The API reference builds from the docstrings with ``mkdocs build --strict`` (a broken
link, a missing page in the nav or a docstring griffe cannot parse fails), and it names
every public class and function of the package."""

import pathlib
import re
import subprocess
import sys

import pytest

import etrace_fit as ef

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_mkdocs_build_strict_succeeds(tmp_path):
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "api" / "index.html").exists()
    page = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "validation_freq" in page and "spike_rate_cross_entropy" in page


def test_the_api_page_names_every_public_class_and_function_and_the_nav_every_page():
    api = (ROOT / "docs" / "api.md").read_text()
    documented = set(re.findall(r"^::: etrace_fit\.(\w+)", api, flags=re.M))
    public = {name for name in ef.__all__ if not name.startswith("_") and callable(getattr(ef, name))
              and not isinstance(getattr(ef, name), type(ef)) and not issubclass_error(getattr(ef, name))}
    assert public - documented == set()
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages == set(re.findall(r":\s*([\w-]+\.md)", nav))


def issubclass_error(value) -> bool:
    return isinstance(value, type) and issubclass(value, (Exception, Warning))

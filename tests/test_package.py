"""Package-level promises: public names, one module for JAX internals, import direction."""

import ast
import os
import pathlib
import subprocess
import sys

import pytest

import etrace_fit

PACKAGE = pathlib.Path(etrace_fit.__file__).parent
JAX_INTERNALS = ("jax._src", "jax.interpreters", "jax.extend", "jax.core", "jaxlib")
# ops -> compiler -> algorithms -> training: a module may import only from its own
# layer or those before it (docs/design.md).
ORDER = ["_compat", "errors", "ops", "layers", "datasets", "compiler", "checkpoint", "algorithms", "callbacks", "training", "cli",
         "__main__"]


def _imports(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text())
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = path.relative_to(PACKAGE).parts[:-1]
                parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                base = ".".join(("etrace_fit", *parts, base) if base else ("etrace_fit", *parts))
            names.append(base)
            names.extend(f"{base}.{alias.name}" for alias in node.names)
    return names


def _top_package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "etrace_fit" else None


def test_jax_internals_are_used_only_in_the_compat_module():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_compat.py":
            continue
        for name in _imports(path):
            if name.startswith(JAX_INTERNALS):
                offenders.append(f"{path.relative_to(PACKAGE)}: {name}")
    assert offenders == []


def test_imports_never_run_upward_through_the_layers():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        own = relative.parts[0].removesuffix(".py") if len(relative.parts) > 1 or relative.stem != "__init__" else None
        if own not in ORDER:
            continue
        for name in _imports(path):
            target = _top_package(name)
            if target in ORDER and ORDER.index(target) > ORDER.index(own):
                offenders.append(f"{relative} imports {name}")
    assert offenders == []


def test_public_names_are_exported():
    for name in ("Sequential", "ShapeError", "CompilationError", "CheckpointError", "ConfigError"):
        assert hasattr(etrace_fit, name), name
    assert etrace_fit.Sequential is etrace_fit.layers.Sequential
    for name in ("matmul", "elementwise", "conv", "etp_mm_p", "etp_mv_p", "etp_elemwise_p", "etp_conv_p"):
        assert hasattr(etrace_fit.ops, name), name


def test_subpackages_are_attributes_without_an_import():
    """``ef.datasets.evidence_accumulation`` after ``import etrace_fit as ef`` (it was an
    AttributeError), in a fresh interpreter so no earlier import can hide it."""
    code = ("import etrace_fit as ef; ef.datasets.evidence_accumulation; ef.callbacks.TensorBoard; "
            "ef.training.Trainer; ef.LearnerState")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


@pytest.mark.parametrize("enable", ["import jax; jax.config.update('jax_enable_x64', True); ", "import jax; "],
                         ids=["config", "environment"])
def test_importing_keeps_64_bit_jax_enabled_before_it(enable):
    """brainstate's import turned it off: float64 comparisons ran in float32, and
    ``trace_dtype="float64"`` asked for what the user had done."""
    code = enable + ("import etrace_fit; import jax.numpy as jnp; "
                     "assert jax.config.jax_enable_x64 and jnp.ones(1, jnp.float64).dtype == jnp.float64")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300,
                   env={**os.environ, "JAX_ENABLE_X64": "1" if "update" not in enable else "0"})
    off = "import jax, etrace_fit; assert not jax.config.jax_enable_x64"  # left off when it was off
    subprocess.run([sys.executable, "-c", off], check=True, timeout=300, env={**os.environ, "JAX_ENABLE_X64": "0"})


def test_docs_do_not_promise_what_exists_as_a_future_release():
    docs = pathlib.Path(__file__).resolve().parents[1] / "docs"
    for page in docs.glob("*.md"):
        assert "next release" not in page.read_text(), page.name


def test_import_in_a_fresh_interpreter_succeeds_and_registers_four_ops():
    code = "import etrace_fit; print(len(etrace_fit.ops.registered_ops()))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "4"

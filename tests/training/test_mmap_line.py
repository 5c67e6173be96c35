"""The Trainer keeps a step's temp memory under glibc's mmap line where a shorter chunk
does it (online.chunk_cap): above the line every call page-faults its temp memory."""

import logging
import platform

import brainstate
import jax
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit.algorithms import online

from etrace_fit.datasets import rate_discrimination

from .test_trainer import C, _model


def _weights(model):
    return jax.tree.map(np.asarray, model.states(brainstate.ParamState).to_dict_values())


def test_mmap_line_is_glibcs_on_cpu_or_the_threshold_the_environment_fixes(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setattr(platform, "libc_ver", lambda *a, **k: ("glibc", "2.36"))
    assert online.mmap_line() == online.MMAP_LINE == 32 * 2**20
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1048576")
    assert online.mmap_line() == 2**20
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "not a number")
    assert online.mmap_line() == online.MMAP_LINE
    monkeypatch.setattr(platform, "libc_ver", lambda *a, **k: ("", ""))  # musl, macOS: another allocator
    assert online.mmap_line() is None
    monkeypatch.setattr(platform, "libc_ver", lambda *a, **k: ("glibc", "2.36"))
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")  # a pooled device allocator
    assert online.mmap_line() is None


@pytest.mark.parametrize("temps, chunk, cap, asked", [
    ({None: 150, 50: 80}, 100, 50, [None, 50]),     # over the line, half the chunk under it: halved
    ({None: 150, 50: 120}, 100, None, [None, 50]),  # half the chunk still over: the longer chunk stays
    ({None: 100, 50: 80}, 100, None, [None]),       # at the line: not compiled again
    ({None: 150, 32: 80}, 64, 32, [None, 32]),      # half the chunk is 32 steps: still long enough
    ({None: 150, 31: 80}, 63, None, []),            # half would be under 32 steps: not even compiled
])
def test_chunk_cap_halves_the_chunk_only_when_that_brings_the_program_under_the_line(monkeypatch, temps, chunk, cap,
                                                                                       asked):
    monkeypatch.setattr(online, "mmap_line", lambda: 100)
    seen = []
    assert online.chunk_cap(lambda c: seen.append(c) or temps[c], chunk) == cap
    assert seen == asked
    monkeypatch.setattr(online, "mmap_line", lambda: None)  # no line on this host: nothing compiled
    seen.clear()
    assert online.chunk_cap(lambda c: seen.append(c) or temps[c], chunk) is None and seen == []


def _fit(monkeypatch, line, algo="d_rtrl", **options):
    monkeypatch.setattr(online, "mmap_line", lambda: line)
    x, y = rate_discrimination(64, seq_len=130, num_channels=C, low_rate=0.05, high_rate=0.3, seed=0)
    trainer = ef.Trainer(_model(), algo=algo, optimizer=optax.sgd(0.5), **options)
    history = trainer.fit(x, y, batch_size=32, epochs=2, verbose=0, shuffle=not options.get("stateful", False))
    return trainer, history, trainer.step_memory(x, y, batch_size=32)


def test_a_step_over_the_line_runs_in_half_the_chunk_with_the_same_training(monkeypatch):
    """Chunked D-RTRL is exact: the halved chunk trains the same weights, in less temp
    memory, under the line; where halving does not get under it, the chunk stays."""
    free, free_history, free_memory = _fit(monkeypatch, None)
    chunk, temp = free_memory["chunk"], free_memory["temp"]
    # loss_on="last": the 129 steps before the last, which runs alone, in chunks of 64
    # and one of 1 (129 = 3 · 43 has no divisor from 51 to 100); half: 32 (and one of 1)
    assert chunk == 64
    halved, halved_history, halved_memory = _fit(monkeypatch, temp - 1)
    assert halved_memory["chunk"] == 32 and halved_memory["temp"] <= temp - 1
    kept, kept_history, kept_memory = _fit(monkeypatch, 1)  # no chunk gets under a line of 1 byte
    assert kept_memory == free_memory
    for other, history in ((halved, halved_history), (kept, kept_history)):
        np.testing.assert_allclose(history.history["loss"], free_history.history["loss"], rtol=1e-5)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                     _weights(other.model), _weights(free.model))


def test_a_step_under_the_line_is_compiled_once(monkeypatch, caplog):
    """The check compiles the step its first call then finds compiled: no second compile."""
    with jax.log_compiles(True), caplog.at_level(logging.WARNING):
        trainer, _, memory = _fit(monkeypatch, 2**40)
    compiles = [r for r in caplog.records if "Finished XLA compilation of jit(train_step)" in r.getMessage()]
    assert len(compiles) == 1 and memory["chunk"] == 64


def test_bptt_has_no_chunk_to_halve(monkeypatch):
    _, _, memory = _fit(monkeypatch, 1, algo="bptt")
    assert "chunk" not in memory and memory["temp"] > 1


@pytest.mark.parametrize("options, chunk, halved_chunk", [
    # windows of 100 steps (and one of 30) in chunks of 100, then of 50
    (dict(update_every=100, loss_on="all"), 100, 50),
    # 130 steps in two chunks of 65, then (at most 32) in five of 26, a divisor; the traces carry on
    (dict(stateful=True, loss_on="all"), 65, 26),
])
def test_update_every_and_stateful_steps_are_halved_alike(monkeypatch, options, chunk, halved_chunk):
    """The optimizer inside the sequence and the traces carried from batch to batch run
    their chunks through the same cap: half the chunk, the same training."""
    free, free_history, free_memory = _fit(monkeypatch, None, **options)
    assert free_memory["chunk"] == chunk
    halved, halved_history, halved_memory = _fit(monkeypatch, free_memory["temp"] - 1, **options)
    assert halved_memory["chunk"] == halved_chunk and halved_memory["temp"] < free_memory["temp"]
    np.testing.assert_allclose(halved_history.history["loss"], free_history.history["loss"], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 _weights(halved.model), _weights(free.model))

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


def test_a_later_fit_takes_the_sized_step_without_compiling_or_reading_it_again(monkeypatch):
    """The check is made once per batch shape and program: a second fit on the same
    shapes trains in the halved chunk at once (each fit compiled the step's lowering and
    read its temp memory again, ~6 ms a fit); a changed layer setting, which compiles a
    new program, is checked again."""
    decided = _deciding(monkeypatch, under=True)
    x, y = rate_discrimination(64, seq_len=130, num_channels=C, low_rate=0.05, high_rate=0.3, seed=0)
    trainer = ef.Trainer(_model(), algo="d_rtrl", optimizer=optax.sgd(0.5))
    trainer.fit(x, y, batch_size=32, epochs=1, verbose=0)
    assert [d[:2] for d in decided] == [(64, 32)]
    sized = trainer._batch_programs[next(iter(trainer._batch_programs))][0].program
    for _ in range(2):
        trainer.fit(x, y, batch_size=32, epochs=1, verbose=0)
        assert len(decided) == 1 and trainer.step_memory(x, y, batch_size=32)["chunk"] == 32
        assert trainer._batch_programs[next(iter(trainer._batch_programs))][0].program is sized
    trainer.model.layers[1].tau = 5.0
    trainer.fit(x, y, batch_size=32, epochs=1, verbose=0)
    assert [d[:2] for d in decided] == [(64, 32), (64, 32)]


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


# ---------------------------------------------------------------- the functional API

B_API, T_API = 32, 130


def _api_case(seed=0):
    x, y = rate_discrimination(B_API, seq_len=T_API, num_channels=C, low_rate=0.05, high_rate=0.3, seed=seed)
    xs = jax.numpy.asarray(np.swapaxes(x, 0, 1))  # time-major (T, B, C)
    ys = jax.numpy.asarray(np.broadcast_to(np.eye(2, dtype=np.float32)[y], (T_API, B_API, 2)))
    model = _model()
    brainstate.nn.init_all_states(model, batch_size=B_API)
    return model, xs, ys


def _mse(out, target):
    return ((out - target) ** 2).sum()


def _deciding(monkeypatch, under):
    """With ``under``, each program's line is put 1 byte under its own temp memory
    (else there is no line); returns what ``chunk_cap`` decides: ``(chunk, cap, temp,
    temp at the cap)`` per program."""
    line, decided, real = [None], [], online.chunk_cap
    monkeypatch.setattr(online, "mmap_line", lambda: line[0])

    def spy(temp_at, chunk):
        free = temp_at(None)
        line[0] = free - 1 if under else None
        cap = real(temp_at, chunk)
        decided.append((chunk, cap, free, None if cap is None else temp_at(cap)))
        return cap

    monkeypatch.setattr(online, "chunk_cap", spy)
    return decided


def _close(a, b, rtol=1e-5):
    """Equal to float32 rounding: relative, and absolute against the array's largest entry
    (the chunks sum in another order)."""
    jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, rtol=rtol, atol=1e-6 * (1 + np.max(np.abs(v)))),
                 a, b)


def test_sequence_grad_and_learner_grad_run_under_the_line_with_the_same_gradients(monkeypatch):
    """The functional API checks its program as the Trainer does, once per shape: over
    the line, half the chunk (130 steps in chunks of 65, then of at most 32: 26), the
    same gradients (chunked D-RTRL is exact), less temp memory."""
    decided = _deciding(monkeypatch, under=False)
    model, xs, ys = _api_case()
    free, free_losses = ef.sequence_grad(model, xs, ys, _mse, algo="d_rtrl")
    assert [d[:2] for d in decided] == [(65, None)]

    decided = _deciding(monkeypatch, under=True)
    learner = ef.compile(_api_case()[0], xs[0], _mse, algo="d_rtrl")
    for run in (lambda: ef.sequence_grad(_api_case()[0], xs, ys, _mse, algo="d_rtrl"),
                lambda: learner.grad(xs, ys)):
        grads, losses = run()
        np.testing.assert_allclose(losses, free_losses, rtol=1e-5)
        _close(grads, free, rtol=1e-4)
    assert [d[:2] for d in decided] == [(65, 32), (65, 32)]  # chunks of at most 32 steps:
    assert learner.compiled(xs, ys, max_chunk=32).program.chunk_for(T_API) == 26  # 26, a divisor of 130
    assert all(capped < free for _, _, free, capped in decided)
    learner.grad(xs, ys)  # decided once per shape
    assert len(decided) == 2


def test_learner_step_and_online_fit_run_under_the_line_with_the_same_results(monkeypatch):
    """A stream's chunks (learner.step) and online_fit's windows go through the same
    cap: the same gradients, losses and trained weights in half the chunk."""
    _, xs, ys = _api_case()
    results, decisions = {}, {}
    for under in (False, True):
        decided = _deciding(monkeypatch, under)
        learner = ef.compile(_api_case()[0], xs[0], _mse, algo="d_rtrl")
        grads, losses, state = learner.step(learner.init(B_API), xs, ys)
        model = _api_case()[0]
        _, fit_losses = ef.online_fit(model, xs, ys, _mse, optax.sgd(0.1), update_every=100, algo="d_rtrl")
        results[under] = (grads, losses, state.traces, fit_losses, _weights(model))
        decisions[under] = [d[:2] for d in decided]
    # the stream's 130 steps in chunks of 65 (then at most 32: 26); online_fit's windows of 100 in one
    # chunk (then 50)
    assert decisions == {False: [(65, None), (100, None)], True: [(65, 32), (100, 50)]}
    _close(results[True], results[False])


def test_nothing_is_checked_inside_a_users_jit(monkeypatch):
    """Under jax.jit the arguments are tracers: the program is the user's to compile."""
    decided = _deciding(monkeypatch, under=True)
    _, xs, ys = _api_case()
    learner = ef.compile(_api_case()[0], xs[0], _mse, algo="d_rtrl")
    with brainstate.environ.context():  # the step traced at this shape first (tracing it under jit cannot write
        learner.compiled(xs, ys)         # the model's states)
    jitted = brainstate.transform.jit(lambda state, xs: learner.step(state, xs, ys)[1])
    losses = jitted(learner.init(B_API), xs)
    assert decided == []
    np.testing.assert_allclose(losses, learner.step(learner.init(B_API), xs, ys)[1], rtol=1e-5)
    assert [d[:2] for d in decided] == [(65, 32)]

"""``fit`` compiles its validation program on a thread of its own while it traces and
compiles the training step: the first validation runs a program compiled ahead, gives
the numbers ``evaluate`` gives, and falls back to compiling itself when the thread's
compilation fails."""

import threading

import jax
import numpy as np
import optax
import pytest

import etrace_fit as ef

from ._helpers import lif_model, rate_data

THREAD = "etrace_fit-compile-evaluation"


class CompileLog(ef.callbacks.Callback):
    """Every XLA compilation while ``fit`` runs: the thread it ran on, and whether a
    validation was running."""

    def __init__(self):
        super().__init__()
        self.testing = False
        self.compiles: list[tuple[str, bool]] = []

    def __call__(self, event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            self.compiles.append((threading.current_thread().name, self.testing))

    def on_test_begin(self, logs=None):
        self.testing = True

    def on_test_end(self, logs=None):
        self.testing = False


def _fit(validation, validation_freq=1, epochs=1, algo="d_rtrl", samples=24):
    x, y = rate_data(samples)
    trainer = ef.Trainer(lif_model(), algo=algo, optimizer=optax.adam(1e-2), loss_on="last")
    log = CompileLog()
    jax.monitoring.register_event_duration_secs_listener(log)
    try:
        trainer.fit(x, y, batch_size=8, epochs=epochs, verbose=0, validation_data=validation,
                    validation_freq=validation_freq, callbacks=[log])
    finally:
        jax.monitoring.unregister_event_duration_listener(log)
    return trainer, log


@pytest.mark.parametrize("algo, samples", [("d_rtrl", 24), ("bptt", 24), ("d_rtrl", 20)],
                         ids=["d_rtrl", "bptt", "a-smaller-last-batch"])
def test_the_first_validation_runs_a_program_compiled_beside_the_training_step(algo, samples):
    """With training data ending in a smaller batch (20 = 8 + 8 + 4) the program was
    compiled ahead and again at the first validation: the hidden states the last batch
    left were part of the program's cache key."""
    x_val, y_val = rate_data(16, seed=1)
    trainer, log = _fit((x_val, y_val), algo=algo, samples=samples)
    assert [testing for thread, testing in log.compiles if thread == THREAD] == [False]
    assert not [thread for thread, testing in log.compiles if testing]  # nothing compiled while validating
    assert trainer._eval_compiling is None
    assert trainer.history.history["val_loss"][0] == pytest.approx(
        trainer.evaluate(x_val, y_val, batch_size=8, verbose=0)["loss"], rel=1e-6)


def test_no_program_is_compiled_ahead_when_no_epoch_validates():
    with pytest.warns(UserWarning, match=r"validation_freq=\[3\]: no epoch of this fit \(1..2\) validates"):
        trainer, log = _fit(rate_data(16, seed=1), validation_freq=[3], epochs=2)
    assert not [thread for thread, _ in log.compiles if thread == THREAD]
    assert "val_loss" not in trainer.history.history


def test_a_validation_given_as_batches_compiles_when_it_runs():
    x_val, y_val = rate_data(16, seed=1)
    trainer, log = _fit([(x_val[:8], y_val[:8]), (x_val[8:], y_val[8:])])
    assert not [thread for thread, _ in log.compiles if thread == THREAD]
    assert [testing for _, testing in log.compiles].count(True) == 1
    assert np.isfinite(trainer.history.history["val_loss"][0])


def test_a_compilation_that_fails_on_the_thread_is_left_to_the_validation(monkeypatch):
    compile_ = jax.stages.Lowered.compile
    tried = []

    def failing_on_the_thread(self, *args, **kwargs):
        if threading.current_thread().name == THREAD:
            tried.append(True)
            raise RuntimeError("XLA ran out of something")
        return compile_(self, *args, **kwargs)

    monkeypatch.setattr(jax.stages.Lowered, "compile", failing_on_the_thread)
    x_val, y_val = rate_data(16, seed=1)
    trainer, log = _fit((x_val, y_val))
    assert tried == [True]
    assert [testing for _, testing in log.compiles].count(True) == 1  # the validation compiled it itself
    assert trainer.history.history["val_loss"][0] == pytest.approx(
        trainer.evaluate(x_val, y_val, batch_size=8, verbose=0)["loss"], rel=1e-6)

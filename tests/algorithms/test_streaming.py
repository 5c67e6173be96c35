"""Streaming, the reason to learn online: a learner's state (hidden states, eligibility
traces, the step count) carries across calls, so a long stream cut into chunks gives
what the whole stream in one call gives.

References are independent of the chunking under test: BPTT (brainstate grad over
for_loop, tests/algorithms/_helpers.py) for exactness, and the whole sequence in one
call for the equality of chunked and unchunked runs, in float64.
"""

from __future__ import annotations

import warnings

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.errors import ConfigError, ShapeError

I, N, O, B, T = 3, 6, 2, 4, 24


@pytest.fixture(autouse=True)
def float64_dt():
    with brainstate.environ.context(dt=1.0, precision=64), warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        yield


def _model(neuron="lif", seed=0):
    neuron = "lif" if neuron in ("d_rtrl", "esd_rtrl", "hybrid", "bptt") else neuron
    rng = np.random.default_rng(seed)
    cell = L.LIF(N, tau=5.0) if neuron == "lif" else L.ALIF(N, tau=5.0, tau_a=20.0)
    model = ef.Sequential(L.Linear(I, N, w_init=rng.normal(0, 1.5, (I, N))), cell,
                          L.Linear(N, O, w_init=rng.normal(0, 0.5, (N, O))))
    brainstate.nn.init_all_states(model, batch_size=B)
    return model


def _data(seed=1):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.random((T, B, I)) < 0.3, jnp.float64), jnp.asarray(rng.normal(size=(T, B, O)))


def _loss(out, y):
    return jnp.sum((out - y) ** 2) / out.shape[0]


def _close(a, b, rtol=1e-9, atol=1e-12):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


@pytest.mark.parametrize("algo", ["d_rtrl", "esd_rtrl", "hybrid", "bptt"])
@pytest.mark.parametrize("neuron", ["lif", "alif"])
def test_chunks_of_a_stream_sum_to_the_whole_streams_gradient(algo, neuron):
    """With the weights fixed, the gradients of consecutive chunks (state and traces
    carried by ``learner.step``) add up to the gradient of the whole stream in one call,
    for any chunk lengths, the last one shorter. BPTT carries the states only: its chunk
    gradients are truncated BPTT, so it is compared with its own truncated sum."""
    model = _model(neuron)
    xs, ys = _data()
    learner = ef.compile(model, xs[0], _loss, algo=algo)
    whole, whole_losses = learner.grad(xs, ys)
    state = learner.init(B)
    total, losses = None, []
    for start, stop in ((0, 7), (7, 16), (16, 24)):
        grads, chunk_losses, state = learner.step(state, xs[start:stop], ys[start:stop])
        total = grads if total is None else jax.tree.map(jnp.add, total, grads)
        losses.append(chunk_losses)
    np.testing.assert_allclose(np.concatenate(losses), whole_losses, rtol=1e-12)
    if algo == "bptt":  # truncated at the chunk boundaries: not the whole gradient
        assert not all(np.allclose(a, b) for a, b in zip(jax.tree.leaves(total), jax.tree.leaves(whole)))
        return
    _close(total, whole)
    assert int(state.t) == T
    assert all(float(jnp.abs(g).max()) > 1e-6 for g in jax.tree.leaves(whole))
    # Carrying the traces is what makes it exact: chunks that restart their traces (the
    # hidden states still carried) lose the history across the boundaries.
    state, restarted = learner.init(B), None
    for start, stop in ((0, 7), (7, 16), (16, 24)):
        grads, _, state = learner.step(state._replace(traces=learner.init(B).traces), xs[start:stop],
                                       ys[start:stop])
        restarted = grads if restarted is None else jax.tree.map(jnp.add, restarted, grads)
    assert not all(np.allclose(a, b, rtol=1e-6) for a, b in zip(jax.tree.leaves(restarted), jax.tree.leaves(whole)))


def test_the_learner_state_is_a_pure_value_and_init_does_not_touch_the_model():
    model = _model()
    xs, ys = _data()
    learner = ef.compile(model, xs[0], _loss, algo="d_rtrl")
    before = jax.tree.map(np.asarray, model.states().to_dict_values())
    state = learner.init(B)
    g1, l1, s1 = learner.step(state, xs[:10], ys[:10])
    g2, l2, s2 = learner.step(state, xs[:10], ys[:10])  # the same input state: the same result
    _close(g1, g2, rtol=0, atol=0)
    _close(s1, s2, rtol=0, atol=0)
    _close(before, jax.tree.map(np.asarray, model.states().to_dict_values()), rtol=0, atol=0)
    assert set(state.weights) == {"layers.0.weight", "layers.2.weight"}
    assert all(np.shape(leaf)[0] == B for leaf in state.states)
    assert len(state.traces) == len(learner.plan.pairs)
    larger = learner.init(2 * B)  # another batch size: the same plan, larger states and traces
    assert all(np.shape(leaf)[0] == 2 * B for leaf in larger.states)
    with pytest.raises(ShapeError, match=r"learner.step: xs has 4 sequences per step but the state was made "
                                         r"for 8 \(learner.init\(8\)\)"):
        learner.step(larger, xs, ys)
    with pytest.raises(ConfigError, match="batch_size must be a positive int"):
        learner.init(0)
    with pytest.raises(ConfigError, match=r"learner.step takes the LearnerState of learner.init\(batch_size\)"):
        learner.step({"weights": {}}, xs, ys)
    with pytest.raises(ConfigError, match=r"active as a \(T,\) bool array or None, got 'last'"):
        learner.step(state, xs, ys, active="last")
    flagged, _, _ = learner.step(state, xs[:10], ys[:10], active=np.ones(10, bool))  # every step has a loss
    _close(flagged, g1)


def test_new_weights_in_the_state_are_what_the_step_uses():
    model = _model()
    xs, ys = _data()
    learner = ef.compile(model, xs[0], _loss, algo="d_rtrl")
    state = learner.init(B)
    scaled = state._replace(weights=jax.tree.map(lambda w: 0.5 * w, state.weights))
    grads, _, _ = learner.step(scaled, xs, ys)
    for path, param in model.states(brainstate.ParamState).items():  # the model itself is untouched
        param.value = jax.tree.map(lambda w: 0.5 * w, param.value)
    brainstate.nn.init_all_states(model, batch_size=B)
    expected, _ = ef.compile(model, xs[0], _loss, algo="d_rtrl").grad(xs, ys)
    _close({ef.compiler.format_path(p): g for p, g in expected.items()}, grads)


def test_a_stream_whose_weights_change_between_chunks_names_what_becomes_approximate():
    """docs/algorithms.md: put new weights in with ``state._replace(weights=...)``. A
    stream updated so between chunks is ``online_fit``'s ``update_every``, where a
    learned τ's trace (followed through ``exp(−dt/τ)`` at the current τ) is approximate
    and named; ``learner.step`` computed the same and said nothing (an audit measured
    1.4 relative error on a leaky readout's memory). Warned once, eagerly; chunks with
    the weights handed on, and a stream's first chunk with any weights, stay silent."""
    rng = np.random.default_rng(0)
    model = ef.Sequential(L.Linear(I, N, w_init=rng.normal(0, 1.5, (I, N))), L.LIF(N, tau=5.0, learn_tau=True),
                          L.Linear(N, O, w_init=rng.normal(0, 0.5, (N, O))))
    brainstate.nn.init_all_states(model, batch_size=B)
    xs, ys = _data()
    learner = ef.compile(model, xs[0], _loss, algo="d_rtrl")

    def stream(update):
        state = learner.init(B)
        state = state._replace(weights=jax.tree.map(lambda w: 0.9 * w, state.weights))  # a first chunk: any weights
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for start in range(0, T, 8):
                grads, _, state = learner.step(state, xs[start:start + 8], ys[start:start + 8])
                if update:
                    state = state._replace(weights=jax.tree.map(lambda w, g: w - 0.1 * g, state.weights, grads))
        return [str(w.message) for w in caught if issubclass(w.category, ef.ApproximationWarning)]

    assert stream(update=False) == []
    [message] = stream(update=True)
    assert message.startswith("the online gradients of layers.1.tau (through ") and (
        "are approximate with weights changed between learner.step calls of one stream" in message)
    assert stream(update=True) == []  # once per learner


# ------------------------------------------------------------------ the Trainer
def _trainer_data(seed=2):
    rng = np.random.default_rng(seed)
    x = (rng.random((B, T, I)) < 0.3).astype(np.float64)        # B streams of T steps, batch-major
    y = rng.normal(size=(B, T, O))                              # a target per step
    return x, y


@pytest.mark.parametrize("algo", ["d_rtrl", "esd_rtrl"])
@pytest.mark.parametrize("k", [6, 8])
def test_a_stream_fed_in_chunks_trains_like_the_whole_sequence_with_update_every(algo, k):
    """``stateful=True`` with chunks of ``k`` steps, one update per chunk, gives the
    parameters of one call on the whole sequence with ``update_every=k``: the hidden
    states, traces and step count carry across the batches. (The whole-sequence run
    averages its loss over T steps, a chunk over k: the learning rates differ by T/k.)"""
    x, y = _trainer_data()
    lr = 0.05
    whole = ef.Trainer(_model(algo), algo=algo, optimizer=optax.sgd(lr), loss="mse", metrics=[], loss_on="all",
                       update_every=k)
    whole.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
    chunks = [(x[:, s:s + k], y[:, s:s + k]) for s in range(0, T, k)]
    streamed = ef.Trainer(_model(algo), algo=algo, optimizer=optax.sgd(lr * k / T), loss="mse", metrics=[],
                          loss_on="all", stateful=True)
    streamed.fit(chunks, epochs=1, shuffle=False, verbose=0)
    _close(whole.get_weights(), streamed.get_weights(), rtol=1e-9, atol=1e-12)
    by_hand = ef.Trainer(_model(algo), algo=algo, optimizer=optax.sgd(lr * k / T), loss="mse", metrics=[],
                         loss_on="all", stateful=True)
    losses = [by_hand.train_on_batch(cx, cy) for cx, cy in chunks]
    _close(whole.get_weights(), by_hand.get_weights(), rtol=1e-9, atol=1e-12)
    assert len(losses) == len(chunks) and all(isinstance(v, float) for v in losses)
    # Without the carry (a fresh stream per chunk) the result differs: the test can fail.
    fresh = ef.Trainer(_model(algo), algo=algo, optimizer=optax.sgd(lr * k / T), loss="mse", metrics=[],
                       loss_on="all")
    fresh.fit(chunks, epochs=1, shuffle=False, verbose=0)
    assert not all(np.allclose(a, b) for a, b in zip(jax.tree.leaves(whole.get_weights()),
                                                     jax.tree.leaves(fresh.get_weights())))


def test_reset_states_starts_a_stream_afresh_and_predict_carries_step_by_step():
    x, y = _trainer_data()
    trainer = ef.Trainer(_model(), algo="d_rtrl", optimizer="sgd", loss="mse", metrics=[], loss_on="all",
                         stateful=True)
    whole = ef.Trainer(_model(), algo="d_rtrl", loss="mse", metrics=[]).predict(x, batch_size=B, last_only=False)
    steps = [trainer.predict(x[:, t:t + 1], batch_size=B, last_only=False) for t in range(T)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), whole, rtol=1e-12)
    trainer.reset_states()
    np.testing.assert_allclose(trainer.predict(x[:, :1], batch_size=B, last_only=False), whole[:, :1], rtol=1e-12)
    first = trainer.test_on_batch(x[:, :5], y[:, :5])
    assert trainer.test_on_batch(x[:, :5], y[:, :5]) == first  # test_on_batch leaves the streams where they were
    with pytest.raises(ShapeError, match=r"stateful=True continues the 4 streams of the last batch, but this batch "
                                         r"has 2 sequences"):
        trainer.train_on_batch(x[:2, :5], y[:2, :5])
    with pytest.raises(ConfigError, match=r"stateful=True reads batch k \+ 1 as the continuation of batch k: "
                                          r"pass shuffle=False"):
        trainer.fit(x, y, batch_size=B, epochs=1, verbose=0)
    with pytest.raises(ConfigError, match="stateful must be True or False"):
        ef.Trainer(_model(), stateful="yes")


def test_stateful_arrays_that_end_in_a_smaller_batch_fail_before_training():
    """The last, smaller batch cannot continue the streams: it failed mid-epoch, after
    the epoch's updates."""
    x, y = _trainer_data()
    n = len(x)
    trainer = ef.Trainer(_model(), algo="d_rtrl", optimizer="sgd", loss="mse", metrics=[], loss_on="all",
                         stateful=True)
    before = jax.tree.map(np.asarray, trainer.get_weights())
    with pytest.raises(ConfigError, match=rf"stateful=True continues batch k's 3 streams in batch k \+ 1, but {n} "
                                          rf"sequences in batches of 3 end with a batch of {n % 3}; give a batch_size "
                                          rf"that divides {n} \(e.g. 2\), or drop_remainder=True"):
        trainer.fit(x, y, batch_size=3, epochs=1, shuffle=False, verbose=0)
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, trainer.get_weights()), before)
    trainer.fit(x, y, batch_size=3, epochs=1, shuffle=False, verbose=0, drop_remainder=True)


def test_train_and_test_on_batch_return_keras_results():
    x, y = _trainer_data()
    labels = (y[:, -1, 0] > 0).astype(np.int32)
    trainer = ef.Trainer(_model(), algo="d_rtrl", optimizer="sgd", metrics=["accuracy"])
    loss, accuracy = trainer.train_on_batch(x, labels)
    assert isinstance(loss, float) and 0.0 <= accuracy <= 1.0
    logs = trainer.test_on_batch(x, labels, return_dict=True)
    assert set(logs) == {"loss", "accuracy"}
    assert trainer.evaluate(x, labels, batch_size=B) == pytest.approx(logs)
    assert isinstance(ef.Trainer(_model(), metrics=[]).train_on_batch(x, labels), float)


@pytest.mark.parametrize("batch", [B, 1])
def test_recording_spikes_from_a_callback_leaves_the_streams_where_they_were(batch):
    """record_spikes left its own states (batch 1) in the model: the next chunk failed in
    JAX's scan on the carry's batch size (B = 4) or continued from them (B = 1,
    weights 2.7e-3 off); evaluate kept the streams already."""
    x, y = _trainer_data()
    chunks = [(x[:batch, s:s + 6], y[:batch, s:s + 6]) for s in range(0, T, 6)]

    def run(callbacks):
        trainer = ef.Trainer(_model(), algo="bptt", optimizer=optax.sgd(0.05), loss="mse", metrics=[],
                             loss_on="all", stateful=True)
        if callbacks:
            callbacks = [ef.callbacks.LambdaCallback(
                on_train_batch_end=lambda b, logs: (trainer.model, trainer.record_spikes(x[0, :5])))]
        trainer.fit(chunks, epochs=1, shuffle=False, verbose=0, callbacks=callbacks or None)
        return trainer.get_weights()

    _close(run(True), run(False), rtol=0, atol=0)


def test_an_epoch_that_goes_on_mid_stream_carries_the_streams():
    """With steps_per_epoch the data goes on where the last epoch ended (an endless
    iterator, arrays mid-pass), but every epoch reset the streams: the chunks trained as
    if each began a stream (losses 0.70 / 0.99 where carried 0.64 / 0.84)."""
    import itertools

    x, y = _trainer_data()
    k = 6

    def trainer():
        return ef.Trainer(_model(), algo="d_rtrl", optimizer=optax.sgd(0.05), loss="mse", metrics=[],
                          loss_on="all", stateful=True)

    carried = trainer()
    losses = [carried.train_on_batch(x[:, s:s + k], y[:, s:s + k]) for s in range(0, T, k)]

    def endless():
        for s in itertools.cycle(range(0, T, k)):
            yield x[:, s:s + k], y[:, s:s + k]

    streamed = trainer()
    history = streamed.fit(endless(), epochs=T // k, steps_per_epoch=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(history.history["loss"], losses, rtol=1e-9)
    _close(streamed.get_weights(), carried.get_weights())
    chunks_x = np.concatenate([x[:, s:s + k] for s in range(0, T, k)])
    chunks_y = np.concatenate([y[:, s:s + k] for s in range(0, T, k)])
    arrays = trainer()
    history = arrays.fit(chunks_x, chunks_y, batch_size=B, epochs=T // k, steps_per_epoch=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(history.history["loss"], losses, rtol=1e-9)
    # a pass of 4 batches read 3 at a time would start inside the second epoch
    with pytest.raises(ConfigError, match=r"stateful=True with steps_per_epoch=3: a pass of the arrays is 4 batches"):
        trainer().fit(chunks_x, chunks_y, batch_size=B, epochs=2, steps_per_epoch=3, shuffle=False, verbose=0)


def test_reading_the_states_at_another_batch_size_draws_nothing_from_the_global_key():
    """A mesh reads the hidden states' batch axes by resetting the model at twice the batch
    size: a random initial state drew from brainstate's global key there, so a run on a
    mesh (mesh=1 too) trained from other initial states than on one device (weights
    1.9e-2 off after one epoch)."""
    from etrace_fit.algorithms.learner import _states_at

    class Noisy(L.Neuron):
        def __init__(self, n):
            super().__init__(n)
            self.hidden("V", init=brainstate.nn.init.Uniform(0, 1))

        def update(self, x):
            self.V.value = 0.8 * self.V.value + x
            return jnp.tanh(self.V.value)

    def run(mesh):
        brainstate.random.seed(0)
        model = ef.Sequential(L.Linear(I, N), Noisy(N), L.Linear(N, O))
        trainer = ef.Trainer(model, algo="bptt", optimizer=optax.sgd(0.5), loss="mse", metrics=[], loss_on="all",
                             mesh=mesh)
        x, y = _trainer_data()
        trainer.fit(np.concatenate([x, x]), np.concatenate([y, y]), batch_size=B, epochs=1, shuffle=False,
                    verbose=0)
        return model, trainer.get_weights()

    model, one = run(None)
    _close(run(1)[1], one, rtol=0, atol=1e-15)
    before = np.asarray(jax.random.key_data(brainstate.random.get_key()))
    with _states_at(model, 2 * B):
        pass
    np.testing.assert_array_equal(np.asarray(jax.random.key_data(brainstate.random.get_key())), before)


def test_a_stateful_evaluation_carries_its_own_streams_from_batch_to_batch():
    """evaluate and fit's validation ran each batch from reset states: on a stream in
    chunks val_loss (0.796) measured another thing than loss (0.713, the whole stream's)."""
    x, y = _trainer_data()
    k = 6
    chunks_x = np.concatenate([x[:, s:s + k] for s in range(0, T, k)])
    chunks_y = np.concatenate([y[:, s:s + k] for s in range(0, T, k)])
    whole = ef.Trainer(_model(), algo="d_rtrl", loss="mse", metrics=[], loss_on="all")
    reference = whole.evaluate(x, y, batch_size=B, verbose=0)["loss"]
    streamed = ef.Trainer(_model(), algo="d_rtrl", optimizer=optax.sgd(0.0), loss="mse", metrics=[], loss_on="all",
                          stateful=True)
    history = streamed.fit(chunks_x, chunks_y, batch_size=B, epochs=1, shuffle=False, verbose=0,
                           validation_data=(chunks_x, chunks_y))
    # a chunk averages over its k steps: the mean over the T / k chunks is the whole stream's
    np.testing.assert_allclose(history.history["loss"][0], reference, rtol=1e-9)
    np.testing.assert_allclose(history.history["val_loss"][0], reference, rtol=1e-9)
    np.testing.assert_allclose(streamed.evaluate(chunks_x, chunks_y, batch_size=B, verbose=0)["loss"], reference,
                               rtol=1e-9)
    fresh = ef.Trainer(_model(), algo="d_rtrl", loss="mse", metrics=[], loss_on="all")  # not stateful: from reset
    assert abs(fresh.evaluate(chunks_x, chunks_y, batch_size=B, verbose=0)["loss"] - reference) > 1e-3

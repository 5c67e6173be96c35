"""The Trainer's training step: one jitted call per batch that applies the right
gradient, compiles once per input shape, and reports gradients, trace norms and spikes."""

import functools
import warnings

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.datasets import rate_discrimination
from etrace_fit.errors import ConfigError, ShapeError

from _shared_reference import PSEUDO_DERIVATIVES, spike_function

from ._helpers import counting_compiles

C, H, T = 5, 12, 20


def _data(n, seed=0):
    return rate_discrimination(n, seq_len=T, num_channels=C, low_rate=0.05, high_rate=0.3, seed=seed)


def _model(seed=0, cell=L.LIF):
    rng = np.random.default_rng(seed)
    return ef.Sequential(
        L.Linear(C, H, w_init=rng.normal(0, 1.5, (C, H)).astype(np.float32)),
        cell(H, tau=10.0),
        L.LeakyRateReadout(H, 2, tau=10.0, w_init=rng.normal(0, 0.3, (H, 2)).astype(np.float32)),
    )


def _reference_loss_and_grad(weights, x, y):
    """Mean cross-entropy at the last step of Linear → LIF (triangle surrogate, soft
    reset, membrane stored before reset) → leaky readout, written from the layer
    equations, differentiated by jax.grad through lax.scan."""
    spike = spike_function(PSEUDO_DERIVATIVES["triangle"])
    decay = np.exp(-1.0 / 10.0)

    def loss(w):
        w_in, w_out = w["layers.0.weight"]["weight"], w["layers.2.weight"]["weight"]

        def step(carry, x_t):
            v, r = carry
            z_prev = spike(v - 1.0)
            v = decay * (v - z_prev) + x_t @ w_in
            z = spike(v - 1.0)
            r = decay * r + z @ w_out
            return (v, r), None

        xs = jnp.swapaxes(x, 0, 1)
        (_, r), _ = jax.lax.scan(step, (jnp.zeros((x.shape[0], H)), jnp.zeros((x.shape[0], 2))), xs)
        return optax.softmax_cross_entropy_with_integer_labels(r, y).mean()

    return jax.value_and_grad(loss)(weights)


def test_one_sgd_step_applies_the_exact_bptt_gradient():
    x, y = _data(8)
    trainer = ef.Trainer(_model(), algo="bptt", optimizer=optax.sgd(0.5), metrics=())
    before = {k: {"weight": v["weight"]} for k, v in ((".".join(map(str, p)), s.value)
                                                       for p, s in trainer.model.states(brainstate.ParamState).items())}
    loss, grads = _reference_loss_and_grad(before, jnp.asarray(x), jnp.asarray(y))
    history = trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    np.testing.assert_allclose(history.history["loss"][0], loss, rtol=1e-5)
    for name in ("layers.0.weight", "layers.2.weight"):
        np.testing.assert_allclose(trainer.last_gradients[name]["weight"], grads[name]["weight"], rtol=1e-4, atol=1e-7)
        after = trainer.model.states(brainstate.ParamState)[tuple(int(p) if p.isdigit() else p
                                                                  for p in name.split("."))].value["weight"]
        np.testing.assert_allclose(after, before[name]["weight"] - 0.5 * grads[name]["weight"], rtol=1e-5, atol=1e-6)
    assert trainer.last_trace_norms == {} and trainer.rules == {}  # BPTT keeps no traces


def test_each_batch_is_one_call_and_each_shape_compiles_once():
    """20 samples in batches of 8: shapes 8, 8, 4. Epochs after the first compile nothing."""
    x, y = _data(20)
    xv, yv = _data(6, seed=1)
    trainer = ef.Trainer(_model(), optimizer=optax.adam(1e-2))
    calls = {"step": 0, "forward": 0, "shape": 0}
    build, outputs, output_shape = trainer._build_step, trainer._outputs, trainer._output_shape

    def counting_build(compiled):
        step = build(compiled)

        def counted(*args, **kwargs):
            calls["step"] += 1
            return step(*args, **kwargs)

        counted.lower = step.lower  # the trainer reads the compiled step's memory before its first call
        return counted

    def counting_outputs(xs):
        calls["forward"] += 1
        return outputs(xs)

    def counting_shape(xs):
        calls["shape"] += 1
        return output_shape(xs)

    trainer._build_step, trainer._outputs, trainer._output_shape = counting_build, counting_outputs, counting_shape
    compiles = []

    class Marks(ef.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            compiles.append(count[0])

        def on_epoch_end(self, epoch, logs=None):
            compiles.append(count[0])

    with counting_compiles() as count:
        trainer.fit(x, y, batch_size=8, epochs=3, validation_data=(xv, yv), verbose=0, callbacks=[Marks()])
    assert calls["step"] == 9  # one call per batch, 3 batches x 3 epochs
    # The shape check before the first batch traces the model once and runs nothing.
    assert calls["shape"] == 1 and calls["forward"] == 0
    assert len(trainer._steps) == 2  # one compiled step per batch shape (8 and 4)
    assert compiles[1] > compiles[0]  # the first epoch compiled ...
    assert compiles[2:] == [compiles[1]] * 4, compiles  # ... and later epochs reuse it all


def test_predict_and_evaluate_compile_once_per_shape_whatever_batch_ran_before():
    """``predict`` of one shape compiled the same program twice after a fit whose last
    batch was smaller: the states that batch left were part of the cache key."""
    x, y = _data(20)
    trainer = ef.Trainer(_model(), optimizer=optax.adam(1e-2))
    for call in (lambda: trainer.predict(x[:8], batch_size=4, verbose=0),
                 lambda: trainer.evaluate(x[:8], y[:8], batch_size=4, verbose=0)):
        trainer.fit(x[:10], y[:10], batch_size=4, epochs=1, verbose=0)  # batches of 4, 4 and 2
        with counting_compiles() as count:
            call()
        assert count[0] == 1  # two batches of 4: one program
        trainer.fit(x[:10], y[:10], batch_size=4, epochs=1, verbose=0)  # a smaller last batch again
        with counting_compiles() as count:
            call()
        assert count[0] == 0


@pytest.mark.slow
def test_data_of_more_batch_shapes_than_the_learner_keeps_compiles_them_once():
    """17 sequence lengths (one more than ``learner.MAX_PROGRAMS``): the learner dropped its
    oldest program as each new one came, so every later ``fit`` compiled all 17 again,
    and the trainer kept every old compiled step (RSS +110-150 MB a fit)."""
    rng = np.random.default_rng(0)
    batches = [(rng.random((2, steps, C)).astype(np.float32), rng.integers(0, 2, 2)) for steps in range(4, 21)]
    trainer = ef.Trainer(_model(), optimizer=optax.adam(1e-2))
    trainer.fit(batches, epochs=1, verbose=0, shuffle=False)
    assert len(trainer._steps) == 17
    with counting_compiles() as count:
        trainer.fit(batches, epochs=1, verbose=0, shuffle=False)
    assert count[0] == 0 and len(trainer._steps) == 17 and trainer.learner.max_programs >= 17


def test_a_later_fit_compiles_nothing_after_a_smaller_batch_or_an_evaluation():
    """Within a fit the steps are compiled once per batch shape; across fits they were
    compiled again whenever the last batch (data ending in a smaller batch) or an
    evaluate in between left the hidden states at another batch size: the learner's
    check that the model still compiles to the same step traced it at the wrong size
    and took it for changed (2-8 s a fit in a fit/evaluate loop)."""
    x, y = _data(20)
    trainer = ef.Trainer(_model(), optimizer=optax.adam(1e-2))
    trainer.fit(x[:12], y[:12], batch_size=8, epochs=1, verbose=0)  # batches of 8 and 4
    trainer.evaluate(x[12:17], y[12:17], verbose=0)  # 5 sequences
    with counting_compiles() as count:
        for _ in range(2):
            trainer.fit(x[:12], y[:12], batch_size=8, epochs=1, verbose=0)
            trainer.evaluate(x[12:17], y[12:17], verbose=0)
    assert count[0] == 0
    trainer.model.layers[1].v_threshold = 0.9  # a real change is still seen
    with counting_compiles() as count:
        trainer.fit(x[:12], y[:12], batch_size=8, epochs=1, verbose=0)
    assert count[0] > 0


def test_a_later_fit_skips_the_shape_checks_it_passed_until_the_model_changes():
    """The first batch's checks (the model's output shape, the loss's one value per
    sample) trace the model and the loss once per batch shape and loss; a later ``fit``
    with the same shapes only checks the labels. A changed layer attribute (the learner
    compiles again) or another loss traces them again; the labels are checked at every
    fit."""
    x, y = _data(16)
    model = _model()
    trainer = ef.Trainer(model, optimizer=optax.adam(1e-2))
    calls = {"shape": 0, "loss": 0}
    output_shape, loss_fn = trainer._output_shape, trainer.loss_fn

    def counting_shape(xs):
        calls["shape"] += 1
        return output_shape(xs)

    @functools.wraps(loss_fn)  # its integer_labels flag too
    def counting_loss(out, target):
        calls["loss"] += 1  # once per trace of the loss
        return loss_fn(out, target)

    trainer._output_shape, trainer.loss_fn = counting_shape, counting_loss
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    first = dict(calls)
    assert first["shape"] == 1 and first["loss"] >= 1
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert calls["shape"] == 1  # not traced again
    assert calls["loss"] == first["loss"]  # the step's programs are compiled; the check's trace is skipped
    with pytest.raises(ShapeError, match="labels must lie in"):
        trainer.fit(x, np.full_like(y, 5), batch_size=8, epochs=1, verbose=0)  # the labels: checked every fit
    model.layers[1].v_threshold = 0.9  # the step changes: compiled, and checked, again
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert calls["shape"] == 2

    class Unhashable:  # another loss, which need not be hashable: checked again
        __hash__ = None
        integer_labels = True

        def __call__(self, out, target):
            return loss_fn(out, target)

    trainer.loss_fn = Unhashable()
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert calls["shape"] == 3


@pytest.mark.parametrize("algo", ["hybrid", "esd_rtrl", "d_rtrl"])
def test_gradients_and_trace_norms_of_the_last_batch_are_kept(algo):
    x, y = _data(8)
    trainer = ef.Trainer(_model(), algo=algo)
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert set(trainer.last_gradients) == {"layers.0.weight", "layers.2.weight"}
    assert set(trainer.last_trace_norms) == {"layers.0.weight", "layers.2.weight"}
    for norms in trainer.last_trace_norms.values():
        assert norms.shape == (8,) and np.all(np.isfinite(norms)) and np.all(np.asarray(norms) > 0)
    assert float(jnp.abs(trainer.last_gradients["layers.0.weight"]["weight"]).sum()) > 0


def test_the_epoch_end_norm_check_is_exact_in_float64_and_compiles_nothing():
    """The norms the epoch-end check warns on: the global gradient norm and the largest
    per-sample trace norm, against numpy in float64 (float32 values whose squares
    overflow float32 included; a NaN stays a NaN, so it warns), on the host and in the
    program a multi-host run takes (tests/distributed run it across two processes);
    after a fit on one host, the check compiles no program."""
    from etrace_fit.training.dashboards import _global_norms, _norms

    gradients = {"a": {"weight": jnp.asarray([[3e20, 4e20]], jnp.float32)}, "b": {"bias": jnp.asarray([12e20])}}
    traces = {"a": jnp.asarray([1.0, 7.5, 2.0]), "b": jnp.asarray([3.0, 2.0])}
    # the host form, and the one program that arrays spanning several processes take
    for norms in (_norms, lambda g, t: tuple(float(v) for v in _global_norms(g, t))):
        gradient, trace = norms(gradients, traces)
        assert gradient == pytest.approx(13e20, rel=1e-6) and trace == 7.5
        assert norms(None, {}) == (0.0, 0.0)
        assert norms({"a": jnp.zeros(3)}, {"a": jnp.zeros(2)}) == (0.0, 0.0)
        assert np.isnan(norms({"a": jnp.asarray([1.0, np.nan])}, {})[0])
    x, y = _data(8)
    trainer = ef.Trainer(_model(), algo="d_rtrl")
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    leaves = jax.tree.leaves(trainer.last_gradients)
    want = np.sqrt(sum(np.sum(np.asarray(leaf, np.float64) ** 2) for leaf in leaves))
    got = _norms(trainer.last_gradients, trainer.last_trace_norms)
    assert got[0] == pytest.approx(want, rel=1e-12) and got[0] > 0
    assert got[1] == max(float(np.max(n)) for n in trainer.last_trace_norms.values())
    jax.clear_caches()  # nothing compiled before counts
    trainer._norms_warned = False
    with counting_compiles() as count:
        trainer._check_norms(0)
    assert count[0] == 0


def test_with_update_every_there_is_no_batch_gradient_but_trace_norms_remain():
    x, y = _data(8)
    trainer = ef.Trainer(_model(), update_every=5)
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert trainer.last_gradients is None
    assert set(trainer.last_trace_norms) == {"layers.0.weight", "layers.2.weight"}


def test_a_memory_budget_reaches_the_plan_and_is_checked_early():
    x, y = _data(8)
    trainer = ef.Trainer(_model(), memory_budget="1MiB")
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert "budget 1.0 MiB" in trainer.report()
    assert trainer.rules == {"layers.0.weight": "d_rtrl", "layers.2.weight": "d_rtrl"}
    with pytest.raises(ConfigError, match="memory_budget"):
        ef.Trainer(_model(), memory_budget="a lot")


@pytest.mark.parametrize("cell", [L.LIF, L.ALIF])
def test_record_spikes_matches_the_spikes_the_model_emits(cell):
    x, y = _data(4)
    rng = np.random.default_rng(0)
    model = ef.Sequential(L.Linear(C, H, w_init=rng.normal(0, 1.5, (C, H)).astype(np.float32)), cell(H, tau=10.0))
    trainer = ef.Trainer(model, loss="mse", metrics=())
    spikes = trainer.record_spikes(x[1])
    assert list(spikes) == ["layers.1"] and spikes["layers.1"].shape == (T, H)
    emitted = trainer.predict(x, batch_size=4, last_only=False)[1]  # the model's output is the spike train
    np.testing.assert_array_equal(spikes["layers.1"], emitted)
    assert 0 < spikes["layers.1"].sum() < T * H
    # TensorBoard's firing statistics record several sequences in one call: each one's
    # spikes are the model's for that sequence alone.
    batch = trainer._record_batch(x)["layers.1"]
    assert batch.shape == (4, T, H)
    np.testing.assert_array_equal(batch, trainer.predict(x, batch_size=4, last_only=False))
    np.testing.assert_array_equal(batch[1], spikes["layers.1"])


def test_record_spikes_errors():
    trainer = ef.Trainer(ef.Sequential(L.Linear(C, 2)), loss="mse", metrics=())
    with pytest.raises(ConfigError, match="no spiking layer"):
        trainer.record_spikes(np.zeros((T, C), np.float32))
    with pytest.raises(ShapeError, match="one sequence"):
        ef.Trainer(_model()).record_spikes(np.zeros((C,), np.float32))


@pytest.mark.parametrize("update_every", [None, 5])
def test_a_batch_with_a_non_finite_loss_is_not_applied_and_is_reported(update_every):
    """A batch whose loss is NaN (here: one poisoned target) leaves weights and optimizer
    state as they were, the other batches train, and the epoch warns with the count."""
    x, y = _data(24)
    y = y.astype(np.float32)
    y[9] = 1e3  # in the second batch of 8

    def loss(out, target):  # NaN for the poisoned sample
        return jnp.where(target > 100, jnp.nan, (out[..., 0] - target) ** 2)

    trainer = ef.Trainer(_model(), algo="d_rtrl", loss=loss, metrics=[], optimizer=optax.sgd(0.05),
                         update_every=update_every)
    before = {p: np.asarray(s.value["weight"]) for p, s in trainer.model.states(brainstate.ParamState).items()
              if isinstance(s.value, dict)}
    with pytest.warns(RuntimeWarning, match=r"epoch 1: 1 of 3 batches had a non-finite loss or gradient \(or made a "
                                            r"weight or the optimizer state non-finite\); their upd"):
        history = trainer.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert trainer.skipped_batches == 1
    assert np.isnan(history.history["loss"][0])  # the epoch's mean says so too
    after = trainer.model.states(brainstate.ParamState)
    for path, value in before.items():
        new = np.asarray(after[path].value["weight"])
        assert np.all(np.isfinite(new)) and not np.allclose(new, value), path  # the good batches trained
    assert all(np.all(np.isfinite(np.asarray(leaf))) for leaf in jax.tree.leaves(trainer.opt_state))


def _poisoned_loss(out, target):  # NaN for a target above 100, else squared error
    return jnp.where(target > 100, jnp.nan, (out[..., 0] - target) ** 2)


def test_a_skipped_batch_of_a_stream_leaves_its_states_and_traces_where_it_found_them():
    """stateful=True: a non-finite batch kept its weights back but handed its hidden
    states and traces on, so every later batch of the stream read them (an overflowing
    trace kept the stream non-finite until reset_states()). Now the stream goes on from
    before the batch: the next batch trains exactly as if the skipped one had not come."""
    x, y = _data(8)
    y = y.astype(np.float32)
    chunks = [(x[:, k * 4:(k + 1) * 4], np.repeat(y[:, None], 4, axis=1)) for k in range(3)]
    bad = (chunks[1][0], np.full_like(chunks[1][1], 1e3))
    runs = {}
    for name, batches in (("skipped", [chunks[0], bad, chunks[2]]), ("without", [chunks[0], chunks[2]])):
        trainer = ef.Trainer(_model(), algo="d_rtrl", loss=_poisoned_loss, metrics=[], optimizer=optax.sgd(0.05),
                             stateful=True, loss_on="all")
        losses = [float(trainer.train_on_batch(xb, yb)) for xb, yb in batches]
        runs[name] = trainer, losses
    (skipped, losses), (without, reference) = runs["skipped"], runs["without"]
    assert np.isnan(losses[1]) and losses[2] == reference[1]
    for path, weight in without.get_weights().items():
        jax.tree.map(np.testing.assert_array_equal, skipped.get_weights()[path], weight)
    for path, state in without.model.states(brainstate.HiddenState).items():
        np.testing.assert_array_equal(skipped.model.states(brainstate.HiddenState)[path].value, state.value)


def test_a_skipped_batch_leaves_batch_norms_running_statistics_as_they_were():
    """The running statistics a BatchNorm moves in training are state, not weights: a
    batch whose update was skipped still moved them (by its own, maybe overflowing,
    statistics), and evaluation read them."""
    x, y = _data(8)
    y = y.astype(np.float32)
    rng = np.random.default_rng(0)
    model = ef.Sequential(L.Linear(C, H, w_init=rng.normal(0, 1.5, (C, H)).astype(np.float32)), L.BatchNorm1d(H),
                          L.LIF(H, tau=10.0), L.Linear(H, 1, w_init=rng.normal(0, 0.3, (H, 1)).astype(np.float32)))
    trainer = ef.Trainer(model, algo="d_rtrl", loss=_poisoned_loss, metrics=[], optimizer=optax.sgd(0.05))
    trainer.train_on_batch(x, y)
    stats = model.layers[1].stats
    before = jax.tree.map(np.asarray, stats.value)
    assert np.isnan(float(trainer.train_on_batch(x[:, ::-1] * 3.0, np.full_like(y, 1e3))))
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, stats.value), before)
    trainer.train_on_batch(x[:, ::-1] * 3.0, y)
    assert not np.allclose(np.asarray(stats.value["mean"]), before["mean"])  # a finite batch moves them


class _UnreadParameter(brainstate.nn.Module):
    """A pass-through layer holding a ParamState its step never reads (an initial membrane
    a user's reset would set): no program leaf, but a weight of the trainer's state."""

    def __init__(self):
        super().__init__()
        self.unread = brainstate.ParamState(jnp.ones((H,), jnp.float32))

    def update(self, x):
        return x


def test_a_constrained_weight_trains_beside_a_weight_the_step_never_reads():
    """The update's projection (constraints, frozen leaves) ran over the program's weight
    leaves, which a weight the step never reads is not one of: a learned τ beside such a
    weight must still be constrained, and the unread weight left as the update left it."""
    x, y = _data(8)
    rng = np.random.default_rng(0)
    model = ef.Sequential(L.Linear(C, H, w_init=rng.normal(0, 1.5, (C, H)).astype(np.float32)), _UnreadParameter(),
                          L.LIF(H, tau=2.0, learn_tau=True),
                          L.Linear(H, 2, w_init=rng.normal(0, 0.3, (H, 2)).astype(np.float32)))
    trainer = ef.Trainer(model, algo="d_rtrl", optimizer=optax.sgd(1e3))  # a step that drives τ below its floor
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train_on_batch(x, y)
    tau = np.asarray(model.layers[2].tau.value)
    assert np.all(tau >= 0.1 - 1e-6) and np.all(np.isfinite(tau))
    np.testing.assert_array_equal(np.asarray(model.layers[1].unread.value), np.ones(H, np.float32))


def test_batch_logs_are_read_only_floats_that_wait_for_the_device():
    """``on_train_batch_end`` gets a mapping of floats (``raw``: the batch's own device
    scalars); the epoch's logs are the size-weighted means of the batches' own values,
    and, as in Keras, the last batch's logs (running means) equal them."""
    x, y = _data(20)
    seen = []

    class Spy(ef.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append((isinstance(logs, ef.callbacks.BatchLogs), dict(logs),
                         {k: float(v) for k, v in logs.raw.items()}))

    trainer = ef.Trainer(_model(), algo="esd_rtrl", optimizer=optax.sgd(0.0))
    history = trainer.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[Spy()])
    assert [s[0] for s in seen] == [True] * 3
    assert all(type(v) is float for _, logs, _ in seen for v in logs.values())
    assert all(set(raw) == {"loss", "accuracy"} for *_, raw in seen)
    sizes = [8, 8, 4]
    mean = sum(n * raw["loss"] for n, (_, _, raw) in zip(sizes, seen)) / 20
    assert history.history["loss"][0] == pytest.approx(mean, rel=1e-6)
    assert seen[-1][1]["loss"] == pytest.approx(mean, rel=1e-6)


def test_traces_that_do_not_fit_the_device_fail_before_training(monkeypatch):
    """At fit start the batch's traces are checked against the device's memory; the
    error names the batch size that would fit, and no update is applied."""
    from etrace_fit.training import memory as trainer_module

    x, y = _data(16)
    trainer = ef.Trainer(_model(), algo="d_rtrl")
    before = {p: np.asarray(s.value["weight"]) for p, s in trainer.model.states(brainstate.ParamState).items()}
    # per sample: layer 0 D-RTRL (5 + 1)·12·2·4 = 576 B (LIF's V and the readout memory,
    # docs/theory.md §5.10); the readout (12 + 1)·2·4 = 104 B
    monkeypatch.setattr(trainer_module, "device_memory", lambda: 680 * 5)
    with pytest.raises(ConfigError, match=r"a batch of 8 need .*0\.00 MiB per sample.* at most 5.*"
                                          r"or Trainer\(trace_dtype='bfloat16'\)"):
        trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    after = trainer.model.states(brainstate.ParamState)
    assert all(np.array_equal(np.asarray(after[p].value["weight"]), v) for p, v in before.items())
    ef.Trainer(_model(), algo="d_rtrl", trace_dtype="bfloat16").fit(x, y, batch_size=8, epochs=1, verbose=0)  # the fix
    monkeypatch.setattr(trainer_module, "device_memory", lambda: 680 * 8)
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)  # exactly fits


def test_every_new_batch_size_is_checked_against_the_devices_memory_but_not_summarys(monkeypatch):
    """The check ran when the learner was compiled only: a later fit with a larger batch,
    or any fit after ``summary(x)`` (which compiles on up to 32 samples, and raised for
    that batch the user never asked for), went unchecked into an out-of-memory."""
    from etrace_fit.training import memory as trainer_module

    x, y = _data(16)
    monkeypatch.setattr(trainer_module, "device_memory", lambda: 680 * 5)
    for first in (lambda t: t.fit(x, y, batch_size=4, epochs=1, verbose=0),
                  lambda t: t.summary(x, print_fn=None)):
        trainer = ef.Trainer(_model(), algo="d_rtrl")
        first(trainer)
        with pytest.raises(ConfigError, match=r"a batch of 16 need .* at most 5"):
            trainer.fit(x, y, batch_size=16, epochs=1, verbose=0)


def test_device_memory_is_known():
    from etrace_fit.training.trainer import device_memory

    assert device_memory() > 2**20


def test_a_non_finite_gradient_under_a_finite_loss_is_not_applied():
    """An overflowing eligibility trace gives NaN gradients while the loss is finite: the
    update is not applied either (the weights stay finite) and the epoch warns."""
    x, y = _data(16)
    trainer = ef.Trainer(_model(), algo="d_rtrl", optimizer=optax.sgd(0.05))
    real = trainer._build_step

    def poisoned(compiled):  # the program's gradient is NaN for one weight leaf
        program = compiled.program
        run = program.run

        def nan_run(*args, **kwargs):
            grads, *rest = run(*args, **kwargs)
            return ([g * jnp.nan if n == 0 else g for n, g in enumerate(grads)], *rest)

        import dataclasses
        patched = dataclasses.replace(compiled, program=dataclasses.replace(program, run=nan_run))
        return real(patched)

    trainer._build_step = poisoned
    before = [np.asarray(leaf) for leaf in jax.tree.leaves(trainer.model.states(brainstate.ParamState).to_dict_values())]
    with pytest.warns(RuntimeWarning, match="non-finite loss or gradient"):
        history = trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0]) and trainer.skipped_batches == 2
    after = [np.asarray(leaf) for leaf in jax.tree.leaves(trainer.model.states(brainstate.ParamState).to_dict_values())]
    assert all(np.array_equal(a, b) for a, b in zip(after, before))


def test_the_models_programs_compile_with_the_compiler_options(monkeypatch):
    """The Trainer's step, its evaluation and prediction and the online sequence
    programs are compiled with ``_compat.compiler_options()`` (on CPU: copy insertion
    with region analysis): an option XLA rejects, put there, fails the first batch of
    every rule, ``evaluate``, ``predict`` and ``sequence_grad``; the real options are
    accepted on this machine."""
    from etrace_fit import _compat

    assert _compat.compiler_options() == {"xla_cpu_copy_insertion_use_region_analysis": True}
    monkeypatch.setattr(_compat, "compiler_options", lambda: {"xla_no_such_option_for_this_test": True})
    x, y = _data(4)
    for algo in ("bptt", "d_rtrl", "esd_rtrl"):
        trainer = ef.Trainer(_model(), algo=algo, optimizer=optax.sgd(0.1), metrics=())
        with pytest.raises(Exception, match="xla_no_such_option_for_this_test"):
            trainer.fit(x, y, batch_size=4, epochs=1, verbose=0)
    trainer = ef.Trainer(_model(), algo="bptt", optimizer=optax.sgd(0.1), metrics=())
    for call in (lambda: trainer.evaluate(x, y, batch_size=4, verbose=0), lambda: trainer.predict(x, batch_size=4)):
        with pytest.raises(Exception, match="xla_no_such_option_for_this_test"):
            call()
    model = _model()
    brainstate.nn.init_all_states(model, batch_size=4)
    xs = jnp.asarray(np.swapaxes(x, 0, 1), jnp.float32)
    with pytest.raises(Exception, match="xla_no_such_option_for_this_test"):
        ef.sequence_grad(model, xs, jnp.zeros((T, 4, 2)), lambda out, target: jnp.mean((out - target) ** 2),
                         algo="d_rtrl")


def test_the_training_options_change_no_number():
    """Copy insertion with region analysis removes copies, not arithmetic: a loop whose
    carried values read one another (as a neuron's coupled states, a trace's per-unit
    matrix do) gives the same bits with the options as without, and ``None`` stands for
    no options where the probe fails (an XLA without the option)."""
    from etrace_fit import _compat

    def coupled(h):
        def step(c, x):
            a, b, d = c
            return (0.9 * a + b * x, 0.8 * b + d, 0.7 * d + jnp.tanh(a)), a * b
        return jax.lax.scan(step, (h, h + 1.0, h - 1.0), jnp.linspace(0.0, 1.0, 50))

    h = jnp.linspace(-1.0, 1.0, 6400).reshape(32, 200)
    plain = jax.jit(coupled)(h)
    tuned = jax.jit(coupled, compiler_options=_compat.compiler_options())(h)
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(tuned)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    probe = _compat.compiler_options.__wrapped__
    original = _compat._REGION_ANALYSIS
    try:
        _compat._REGION_ANALYSIS = "xla_no_such_option_for_this_test"
        assert probe() is None
    finally:
        _compat._REGION_ANALYSIS = original


@pytest.mark.parametrize("algo, expected", [
    ("bptt", ["jaxpr_call", "init_fn", "train_step"]),
    ("hybrid", ["jaxpr_call", "extremes", "init_fn", "train_step"]),
])
def test_a_fit_compiles_its_programs_and_no_one_op_program(algo, expected, caplog):
    """From cleared caches, a fit of one epoch with validation compiles the validation's
    forward pass (lowered on the first batch, compiled on a thread beside the rest), the
    optimizer's start (``init_fn``), the training step and, for the online rules' readout
    memory, its decay (``extremes``); the hidden states it resets and
    the step's placeholders are made on the host. Until 2026-11-27 eager zeros and
    constants at the batch size compiled one-op programs there as well (30–40 ms each:
    ~0.5 s of each ``etrace-fit train`` with the model's construction)."""
    import logging
    import re

    x, y = _data(16)
    model = _model()
    jax.clear_caches()
    with caplog.at_level(logging.WARNING, logger="jax"), jax.log_compiles():
        with brainstate.environ.context(dt=1.0):
            ef.Trainer(model, algo=algo, optimizer=optax.adam(1e-2)).fit(
                x, y, batch_size=8, epochs=1, verbose=0, validation_data=_data(8, 1))
    names = [m.group(1) for r in caplog.records for m in [re.search(r"Compiling jit\((\S+?)\)", r.getMessage())] if m]
    assert [n for n in names if n != "<lambda>"] == expected, names  # <lambda>: compiler_options' probe

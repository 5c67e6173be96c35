"""Regularisers on each neuron's rate, applied online through a running estimate
(``NeuronRateRegularizer``: e-prop's target rate; ``RateBounds``: Cramer et al.'s bounds).

The claim checked against an independent float64 BPTT reference: when the estimate
equals the batch's own per-neuron rates, the online (D-RTRL) gradient is exactly the
gradient of ``task + P(rates of the batch)``, with the rates a function of the weights.
"""

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.callbacks import LambdaCallback
from etrace_fit.errors import ConfigError
from etrace_fit.training import NeuronRateRegularizer, RateBounds
from etrace_fit.training.step import sequence_targets

from ._helpers import C, rate_data

H, T, B = 8, 12, 6


def _model(dtype=np.float32, bias=0.0):
    rng = np.random.default_rng(0)
    return ef.Sequential(L.Linear(C, H, w_init=rng.normal(0, 1.5, (C, H)).astype(dtype),
                                  b_init=np.full(H, bias, dtype)),
                         L.LIF(H), L.Linear(H, 2, w_init=rng.normal(0, 0.3, (H, 2)).astype(dtype)))


def _neuron_rates(model, xs):
    """Per-neuron mean spikes per step of the LIF over ``xs (T, B, C)``, from reset states."""
    if not model.states(brainstate.HiddenState):
        brainstate.nn.init_all_states(model, batch_size=xs.shape[1])
    brainstate.nn.reset_all_states(model, batch_size=xs.shape[1])
    spikes = brainstate.transform.for_loop(lambda x: model.layers[1](model.layers[0](x)), xs)
    return jnp.mean(spikes, axis=(0, 1))


@pytest.mark.parametrize("reg", [NeuronRateRegularizer(target=0.3, strength=2.0),
                                 RateBounds(lower=0.2, upper=0.2, lower_strength=3.0, upper_strength=5.0)],
                         ids=["neuron_rate", "bounds"])
def test_with_the_batchs_own_rates_as_the_estimate_the_gradient_is_bptts_of_the_rate_penalty(reg):
    with brainstate.environ.context(precision=64, dt=1.0):
        model = _model(np.float64)
        trainer = ef.Trainer(model, algo="d_rtrl", loss="cross_entropy", loss_on="last", regularizers=[reg])
        rng = np.random.default_rng(1)
        xs = jnp.asarray(rng.normal(0.3, 1.0, (T, B, C)))
        ys = jnp.asarray(rng.integers(0, 2, (T, B)))
        weight = jnp.zeros((T, B)).at[-1].set(1.0)
        brainstate.nn.init_all_states(model, batch_size=B)
        rates = _neuron_rates(model, xs)
        assert 0.05 < float(jnp.mean(rates)) < 0.9
        held = [({"layers.1": rates * (1.0 - reg.memory)}, jnp.asarray(1, jnp.int32))]  # one batch: r̂ = rates
        learner = ef.compile(model, xs[0], trainer._step_loss, algo="d_rtrl", step_fn=trainer._step_fn)
        brainstate.nn.reset_all_states(model, batch_size=B)  # learner.grad runs from the model's states
        online, losses = learner.grad(xs, sequence_targets(ys, weight, trainer.regularizers, held))

        params = model.states(brainstate.ParamState)

        def reference_loss(penalty=True):
            brainstate.nn.reset_all_states(model, batch_size=B)

            def step(x):
                z = model.layers[1](model.layers[0](x))
                return model.layers[2](z), z

            outs, spikes = brainstate.transform.for_loop(step, xs)
            task = jnp.sum(weight * optax.softmax_cross_entropy_with_integer_labels(outs, ys)) / B
            r = jnp.mean(spikes, axis=(0, 1))  # the batch's per-neuron rates, a function of the weights
            if isinstance(reg, NeuronRateRegularizer):
                p = 2.0 * jnp.mean((r - 0.3) ** 2)
            else:
                p = 3.0 * jnp.mean(jax.nn.relu(0.2 - r) ** 2) + 5.0 * jax.nn.relu(jnp.mean(r) - 0.2) ** 2
            return task + (p if penalty else 0.0), p

        value, p = reference_loss()
        reference = brainstate.transform.grad(lambda: reference_loss()[0], params)()
        task_only = brainstate.transform.grad(lambda: reference_loss(False)[0], params)()
    assert float(p) > 1e-3
    np.testing.assert_allclose(np.sum(np.asarray(losses)), float(value), rtol=1e-10)  # value: P at the estimate
    path = ("layers", 0, "weight")
    assert float(jnp.max(jnp.abs(reference[path]["weight"] - task_only[path]["weight"]))) > 1e-4
    for key in params:
        for got, want in zip(jax.tree.leaves(online[key]), jax.tree.leaves(reference[key])):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-9, atol=1e-12)


def test_the_running_estimate_is_the_bias_corrected_average_of_the_batches_rates():
    """lr 0 and two identical batches: the estimate is the batch's per-neuron rate
    (measured here independently), the logs hold each layer's mean rate, and the first
    batch carries no penalty (no estimate yet)."""
    x, y = rate_data(8)
    x2, y2 = np.concatenate([x, x]), np.concatenate([y, y])
    losses = {}
    for name, regs in (("plain", None), ("reg", [NeuronRateRegularizer(target=0.9, strength=5.0, memory=0.5)])):
        trainer = ef.Trainer(_model(), algo="d_rtrl", optimizer=optax.sgd(0.0), regularizers=regs, metrics=[])
        seen = []
        history = trainer.fit(x2, y2, batch_size=8, epochs=1, shuffle=False, verbose=0,
                              callbacks=[LambdaCallback(on_train_batch_end=lambda b, logs: seen.append(float(logs.raw["loss"])))])
        losses[name] = seen
    np.testing.assert_allclose(losses["reg"][0], losses["plain"][0], rtol=1e-6)  # batch 1: no estimate, no penalty
    assert losses["reg"][1] > losses["plain"][1] + 1e-3  # batch 2: the penalty at the estimate
    rates = _neuron_rates(trainer.model, jnp.swapaxes(jnp.asarray(x), 0, 1))
    sums, count = trainer._state.rates[0]
    assert int(count) == 2
    np.testing.assert_allclose(np.asarray(sums["layers.1"]) / (1 - 0.5 ** 2), np.asarray(rates), rtol=1e-5)
    np.testing.assert_allclose(history.history["rate_layers.1"][0], float(jnp.mean(rates)), rtol=1e-5)
    expected = 5.0 * float(jnp.mean((rates - 0.9) ** 2))
    np.testing.assert_allclose(losses["reg"][1] - losses["plain"][1], expected, rtol=1e-4)


def test_evaluate_adds_the_penalty_of_the_rates_it_measures():
    x, y = rate_data(8)
    model = _model()
    reg = RateBounds(lower=0.4, upper=None, lower_strength=2.0)
    plain = ef.Trainer(model).evaluate(x, y, batch_size=8, verbose=0)
    with_penalty = ef.Trainer(model, regularizers=[reg]).evaluate(x, y, batch_size=8, verbose=0)
    rates = _neuron_rates(model, jnp.swapaxes(jnp.asarray(x), 0, 1))
    penalty = 2.0 * float(jnp.mean(jax.nn.relu(0.4 - rates) ** 2))
    assert penalty > 1e-3
    np.testing.assert_allclose(with_penalty["loss"] - plain["loss"], penalty, rtol=1e-4)


def test_a_lower_bound_wakes_silent_neurons_and_a_target_rate_is_approached():
    x, y = rate_data(32, seed=2)
    xs = jnp.swapaxes(jnp.asarray(x[:16]), 0, 1)

    silent = ef.Trainer(_model(bias=-0.6), algo="d_rtrl", optimizer=optax.adam(3e-2), metrics=[],
                        regularizers=[RateBounds(lower=0.1, upper=None, lower_strength=50.0, memory=0.0)])
    before = float(jnp.mean(_neuron_rates(silent.model, xs) < 0.02))
    silent.fit(x, y, batch_size=8, epochs=6, verbose=0)
    after = float(jnp.mean(_neuron_rates(silent.model, xs) < 0.02))
    assert before >= 0.5 and after < 0.5 * before, (before, after)

    target = ef.Trainer(_model(), algo="d_rtrl", optimizer=optax.adam(3e-2), metrics=[],
                        regularizers=[NeuronRateRegularizer(target=0.05, strength=50.0, memory=0.0)])
    before = float(jnp.mean(jnp.abs(_neuron_rates(target.model, xs) - 0.05)))
    history = target.fit(x, y, batch_size=8, epochs=6, verbose=0)
    after = float(jnp.mean(jnp.abs(_neuron_rates(target.model, xs) - 0.05)))
    assert after < 0.5 * before, (before, after)
    assert "rate_layers.1" in history.history


def test_bad_arguments_name_the_regulariser_and_the_argument():
    with pytest.raises(ConfigError, match=r"NeuronRateRegularizer: memory must be < 1"):
        NeuronRateRegularizer(memory=1.0)
    with pytest.raises(ConfigError, match=r"NeuronRateRegularizer: target must be a number >= 0.0 and <= 1.0"):
        NeuronRateRegularizer(target=2.0)
    with pytest.raises(ConfigError, match=r"RateBounds: give lower, upper or both"):
        RateBounds(lower=None, upper=None)
    with pytest.raises(ConfigError, match=r"RateBounds: lower \(0.5\) must not exceed upper \(0.1\)"):
        RateBounds(lower=0.5, upper=0.1)
    with pytest.raises(ConfigError, match=r"RateBounds: upper_strength must be a number > 0"):
        RateBounds(upper_strength=0)
    with pytest.raises(ConfigError, match=r"no spiking layer 'layers.5'"):
        ef.Trainer(_model(), regularizers=[RateBounds(layers=["layers.5"])])


@pytest.mark.parametrize("resume", ["backup", "save and load"])
def test_a_resumed_run_goes_on_with_the_running_rates(tmp_path, resume):
    """The running estimate is training state: a run interrupted after epoch 1 and
    resumed (``BackupAndRestore``, or ``save`` then ``Trainer.load``) ends bit for bit
    as the uninterrupted run. The backups held no estimate, so a resumed run started it
    from zero and its loss differed from the first resumed epoch on."""
    from _killed import killed_before

    from etrace_fit.callbacks import BackupAndRestore

    x, y = rate_data(24)

    def regularizers():
        return [NeuronRateRegularizer(target=0.05, strength=5.0, memory=0.9),
                RateBounds(lower=0.01, lower_strength=2.0)]

    def trainer():
        return ef.Trainer(_model(), optimizer=optax.adam(3e-2), seed=0, regularizers=regularizers())

    reference = trainer()
    expected = reference.fit(x, y, batch_size=8, epochs=3, verbose=0)
    if resume == "backup":
        backup = BackupAndRestore(tmp_path / "backup")
        with pytest.raises(KeyboardInterrupt):
            trainer().fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[killed_before(2), backup])
        resumed = trainer()
        losses = resumed.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[backup]).history["loss"]
    else:
        first = trainer()
        first.fit(x, y, batch_size=8, epochs=2, verbose=0)
        first.save(tmp_path / "run.ckpt")
        resumed = ef.Trainer.load(tmp_path / "run.ckpt", _model(), optimizer=optax.adam(3e-2),
                                  regularizers=regularizers())
        history = resumed.fit(x, y, batch_size=8, epochs=3, initial_epoch=2, verbose=0)
        losses = first.history.history["loss"] + history.history["loss"]
    assert losses == expected.history["loss"]
    for a, b in zip(jax.tree.leaves(resumed.get_weights()), jax.tree.leaves(reference.get_weights())):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ef.CheckpointError, match=r"the saved running rates of regularizers\[0\]"):
        other = ef.Trainer(ef.Sequential(L.Linear(C, H + 1), L.LIF(H + 1), L.Linear(H + 1, 2)), optimizer="adam",
                           regularizers=[NeuronRateRegularizer(target=0.05)])
        other._restored_rates("run.ckpt", {"rates": {"0": {"sums": {"layers.1": np.zeros(H)}, "count": 3}}})

"""Firing-rate regularisers (issue 12, "Spiking losses"): a penalty on each hidden spiking
layer's population rate at every step, added to the loss whatever ``loss_on`` is.

The gradient is checked against an independent BPTT reference (``brainstate.transform.grad``
over a ``for_loop`` of the model, the loss and penalty written out here), in float64; the
effect is checked by the firing rate before and after training.
"""


import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit.training.step import sequence_targets
from etrace_fit import layers as L
from etrace_fit.datasets import rate_discrimination
from etrace_fit.errors import ConfigError
from etrace_fit.training import FiringRateRegularizer

C, H, T, B = 4, 8, 12, 6


def _model(dtype=np.float32, scale=1.5, readout="rate"):
    rng = np.random.default_rng(0)
    out = (L.LeakyRateReadout(H, 2, w_init=rng.normal(0, 0.3, (H, 2)).astype(dtype)) if readout == "rate"
           else L.Linear(H, 2, w_init=rng.normal(0, 0.3, (H, 2)).astype(dtype)))
    return ef.Sequential(L.Linear(C, H, w_init=rng.normal(0, scale, (C, H)).astype(dtype)), L.LIF(H), out)


def _data(n=16, seed=0):
    return rate_discrimination(n, seq_len=T, num_channels=C, low_rate=0.05, high_rate=0.3, seed=seed)


def _rate(trainer, x):
    return float(np.mean([trainer.record_spikes(x[i])["layers.1"].mean() for i in range(len(x))]))


# ------------------------------------------------------------------ the gradient
@pytest.mark.parametrize("loss_on", ["last", "all"])
def test_the_online_gradient_with_a_rate_penalty_equals_bptt_in_float64(loss_on):
    """Linear → LIF → Linear: the LIF is the only stateful layer and elementwise, so
    D-RTRL is exact, for the task loss and for a penalty on the LIF's spikes at every
    step (with ``loss_on="last"`` too: no step may skip its learning signal)."""
    with brainstate.environ.context(precision=64, dt=1.0):
        model = _model(np.float64, readout="linear")
        reg = FiringRateRegularizer(target=0.3, strength=2.0)
        trainer = ef.Trainer(model, algo="d_rtrl", loss="cross_entropy", loss_on=loss_on, regularizers=[reg])
        rng = np.random.default_rng(1)
        xs = jnp.asarray(rng.normal(0, 1.0, (T, B, C)))
        ys = jnp.asarray(rng.integers(0, 2, (T, B)))
        weight = jnp.zeros((T, B)).at[-1].set(1.0) if loss_on == "last" else jnp.full((T, B), 1.0 / T)
        brainstate.nn.init_all_states(model, batch_size=B)
        learner = ef.compile(model, xs[0], trainer._step_loss, algo="d_rtrl", step_fn=trainer._step_fn)
        online, _ = learner.grad(xs, sequence_targets(ys, weight, trainer.regularizers))

        params = model.states(brainstate.ParamState)
        lif = model.layers[1]

        def reference_loss(penalty=True):
            brainstate.nn.reset_all_states(model, batch_size=B)

            def step(x):  # the layers one by one: the LIF's output is its spikes, with their surrogate gradient
                z = lif(model.layers[0](x))
                return model.layers[2](z), z

            outs, spikes = brainstate.transform.for_loop(step, xs)
            task = optax.softmax_cross_entropy_with_integer_labels(outs, ys)  # (T, B)
            rate = spikes.mean(axis=-1)  # (T, B): population rate per step and sample
            return jnp.sum(weight * task) / B + (jnp.mean(2.0 * (rate - 0.3) ** 2) if penalty else 0.0)

        reference = brainstate.transform.grad(reference_loss, params)()
        task_only = brainstate.transform.grad(lambda: reference_loss(penalty=False), params)()
        assert float(jnp.max(jnp.abs(reference[("layers", 0, "weight")]["weight"]
                                     - task_only[("layers", 0, "weight")]["weight"]))) > 1e-6
        assert any(float(jnp.max(jnp.abs(leaf))) > 1e-6 for leaf in jax.tree.leaves(reference))
        for path in params:
            for got, want in zip(jax.tree.leaves(online[path]), jax.tree.leaves(reference[path])):
                np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-10,
                                           err_msg=str(path))


def test_gradient_fidelity_measures_a_trainer_with_a_regulariser():
    """A regulariser compiles the trainer's step with a ``step_fn``; measuring its
    fidelity compiled the BPTT reference alike and then passed it ``algo="bptt"``,
    which a compiled learner refuses: ``trainer.gradient_fidelity`` and the
    ``GradientFidelity`` callback failed on every such trainer (a mesh audit found it).
    D-RTRL is exact here (the test above), so every cosine is 1."""
    with brainstate.environ.context(precision=64, dt=1.0):
        trainer = ef.Trainer(_model(np.float64, readout="linear"), algo="d_rtrl", loss="cross_entropy",
                             loss_on="all", regularizers=[FiringRateRegularizer(target=0.3, strength=2.0)])
        x, y = _data(8)
        fidelity = trainer.gradient_fidelity(x, y)
        assert set(fidelity) == {"layers.0.weight", "layers.2.weight"}
        for path, measured in fidelity.items():
            assert measured.cosine == pytest.approx(1.0, abs=1e-9), path
            assert measured.norm_ratio == pytest.approx(1.0, rel=1e-6), path


def test_the_penalty_changes_the_gradient_of_the_weights_into_the_layer():
    """Guard against a penalty that never reaches the gradient: with and without it the
    input weights' gradients differ (same batch, same weights)."""
    x, y = _data(8)
    grads = []
    for regs in (None, [FiringRateRegularizer(target=0.5, strength=10.0)]):
        trainer = ef.Trainer(_model(), algo="d_rtrl", optimizer=optax.sgd(0.0), regularizers=regs)
        trainer.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        grads.append(np.asarray(trainer.last_gradients["layers.0.weight"]["weight"]))
    assert float(np.max(np.abs(grads[0] - grads[1]))) > 1e-4


# ------------------------------------------------------------------ the effect
@pytest.mark.parametrize("target", [0.0, 0.6])
def test_training_moves_the_firing_rate_towards_the_target(target):
    x, y = _data(32, seed=2)
    trainer = ef.Trainer(_model(), algo="d_rtrl", optimizer=optax.adam(3e-2), loss_on="last",
                         regularizers=[FiringRateRegularizer(target=target, strength=20.0)], metrics=[])
    before = _rate(trainer, x[:8])
    trainer.fit(x, y, batch_size=16, epochs=8, verbose=0)
    after = _rate(trainer, x[:8])
    assert abs(after - target) < 0.5 * abs(before - target), (before, after)


def test_evaluate_reports_the_loss_with_the_penalty():
    """Keras adds regularisation losses to ``loss`` in evaluate too: the difference to a
    trainer without the penalty is the penalty, computed here from recorded spikes."""
    x, y = _data(8)
    model = _model()
    reg = FiringRateRegularizer(target=0.1, strength=3.0)
    plain = ef.Trainer(model).evaluate(x, y, batch_size=8, verbose=0)
    trainer = ef.Trainer(model, regularizers=[reg])
    with_penalty = trainer.evaluate(x, y, batch_size=8, verbose=0)
    rates = np.stack([trainer.record_spikes(x[i])["layers.1"].mean(axis=-1) for i in range(len(x))])  # (N, T)
    penalty = float(np.mean(3.0 * (rates - 0.1) ** 2))
    assert penalty > 1e-3
    np.testing.assert_allclose(with_penalty["loss"] - plain["loss"], penalty, rtol=1e-4)
    assert with_penalty["accuracy"] == plain["accuracy"]


def test_layers_choose_which_spiking_layers_are_regularised():
    rng = np.random.default_rng(0)
    model = ef.Sequential(L.Linear(C, H, w_init=rng.normal(0, 1.5, (C, H)).astype(np.float32)), L.LIF(H),
                          L.Linear(H, H), L.LIF(H), L.LeakySpikeReadout(H, 2))
    trainer = ef.Trainer(model, loss="spike_rate_cross_entropy", loss_on="all",
                         regularizers=[FiringRateRegularizer(0.1), FiringRateRegularizer(0.2, layers=["layers.3"])])
    (_, default), (_, chosen) = trainer.regularizers
    assert default == ("layers.1", "layers.3")  # every spiking layer but the readout
    assert chosen == ("layers.3",)
    x, y = _data(8)
    history = trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


# ------------------------------------------------------------------ errors, before training
@pytest.mark.parametrize("kwargs, match", [
    (dict(target=1.5), r"target must be a rate in \[0, 1\].*1\.5"),
    (dict(target=-0.1), r"target must be a rate in \[0, 1\]"),
    (dict(strength=0), r"strength must be a number > 0, got 0"),
    (dict(strength="big"), r"strength must be a number > 0, got 'big'"),
    (dict(layers="layers.1"), r"layers must be a list of layer paths.*layers=\['layers.1'\]"),
])
def test_bad_regulariser_arguments_fail_in_the_constructor(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        FiringRateRegularizer(**kwargs)


def test_an_unknown_layer_or_a_model_without_spikes_fails_in_the_trainer():
    with pytest.raises(ConfigError, match=r"no spiking layer 'layers.7'.*its spiking layers: 'layers.1'"):
        ef.Trainer(_model(), regularizers=[FiringRateRegularizer(layers=["layers.7"])])
    rnn = ef.Sequential(L.GRUCell(C, H), L.Linear(H, 2))
    with pytest.raises(ConfigError, match=r"no hidden spiking layer to regularise.*its spiking layers: none"):
        ef.Trainer(rnn, regularizers=[FiringRateRegularizer()])
    with pytest.raises(ConfigError, match=r"regularizers must be a list"):
        ef.Trainer(_model(), regularizers=FiringRateRegularizer())
    with pytest.raises(ConfigError, match=r"regularizers\[0\] must be a regulariser"):
        ef.Trainer(_model(), regularizers=[lambda spikes: 0.0])


def test_a_neuron_whose_spikes_take_no_gradient_argument_is_named():
    class OldLIF(L.LIF):
        def spikes(self):  # the protocol before regularisers: no gradient argument
            return super().spikes()

    rng = np.random.default_rng(0)
    model = ef.Sequential(L.Linear(C, H, w_init=rng.normal(0, 1.5, (C, H)).astype(np.float32)), OldLIF(H),
                          L.Linear(H, 2))
    with pytest.raises(ConfigError, match=r"layers.1 \(OldLIF\).*spikes\(\) takes no gradient argument.*"
                                          r"spikes\(self, gradient=False\)"):
        ef.Trainer(model, regularizers=[FiringRateRegularizer()])

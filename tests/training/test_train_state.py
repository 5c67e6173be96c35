"""The Trainer holds one training state: nothing is written into the model per batch,
batches start from the model's own reset inside the step, and the model is brought up
to date whenever someone can look (epoch ends, ``trainer.model``, the end of ``fit``,
also after an error)."""

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.callbacks import Callback, LambdaCallback

from ._helpers import C, T, lif_model, rate_data


def _weights(module) -> list:
    return [np.asarray(leaf) for leaf in jax.tree.leaves(module.states(brainstate.ParamState).to_dict_values())]


def _writes_per_epoch(batches: int, monkeypatch) -> tuple[int, int]:
    """Writes into the model's states during the second epoch of a fit, and its states."""
    x, y = rate_data(8 * batches)
    model = lif_model()
    trainer = ef.Trainer(model, algo="d_rtrl", optimizer=optax.sgd(0.1))
    counting = {"on": False, "writes": 0}
    write = brainstate.State._write_value

    def counted(state, value):
        if counting["on"]:
            counting["writes"] += 1
        return write(state, value)

    class SecondEpoch(Callback):
        def on_epoch_begin(self, epoch, logs=None):
            counting["on"] = epoch == 1

        def on_epoch_end(self, epoch, logs=None):
            counting["on"] = False

    monkeypatch.setattr(brainstate.State, "_write_value", counted)
    trainer.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[SecondEpoch()])
    return counting["writes"], len(model.states())


def test_fit_writes_into_the_model_once_per_epoch_not_per_batch(monkeypatch):
    """Before, every batch reset the hidden states and wrote every weight and final
    state back on the host: the writes grew with the batches."""
    (two, states), (six, _) = _writes_per_epoch(2, monkeypatch), _writes_per_epoch(6, monkeypatch)
    assert two == six, (two, six)
    assert two <= states  # at most one write per state (weights, hidden states), at the epoch's end


def test_callbacks_see_the_current_weights_and_their_writes_are_trained_on():
    x, y = rate_data(32)
    seen = []

    class Watch(Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(_weights(self.model.model))  # through trainer.model: brought up to date

    trainer = ef.Trainer(lif_model(), algo="d_rtrl", optimizer=optax.sgd(0.5))
    trainer.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[Watch()])
    assert len(seen) == 4
    assert all(not all(np.array_equal(a, b) for a, b in zip(s, t)) for s, t in zip(seen, seen[1:]))  # each batch moved
    for a, b in zip(seen[-1], _weights(trainer.model)):
        np.testing.assert_array_equal(a, b)

    # A callback's writes (set_weights, or into the module directly) are what the next batch trains.
    for direct in (False, True):
        trainer = ef.Trainer(lif_model(), algo="d_rtrl", optimizer=optax.sgd(0.0))

        def zero(batch, logs, trainer=trainer, direct=direct):
            if batch == 0 and direct:
                for state in trainer.model.states(brainstate.ParamState).values():
                    state.value = jax.tree.map(jnp.zeros_like, state.value)
            elif batch == 0:
                trainer.set_weights(jax.tree.map(jnp.zeros_like, trainer.get_weights()))

        trainer.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[LambdaCallback(on_train_batch_end=zero)])
        assert all(not np.any(w) for w in _weights(trainer.model)), direct  # lr 0: the zeros stayed


def test_the_model_holds_every_finished_batch_when_fit_raises():
    x, y = rate_data(40)

    def crash(batch, logs):
        if batch == 2:
            raise KeyboardInterrupt

    crashed = ef.Trainer(lif_model(), algo="d_rtrl", optimizer=optax.sgd(0.5))
    with pytest.raises(KeyboardInterrupt):
        crashed.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0,
                    callbacks=[LambdaCallback(on_train_batch_end=crash)])
    model = lif_model()
    ef.Trainer(model, algo="d_rtrl", optimizer=optax.sgd(0.5)).fit(x, y, batch_size=8, epochs=1, shuffle=False,
                                                                   verbose=0, steps_per_epoch=3)
    for a, b in zip(_weights(crashed._model), _weights(model)):  # the module itself, not a synced view
        np.testing.assert_array_equal(a, b)


class _Leaky(ef.layers.Neuron):
    """``V ← 0.8 V + x (+ v0)``; the initial V from ``init``, or the learned ``v0``."""

    def __init__(self, n, init=0.0, learned_start=None):
        super().__init__(n)
        self.learned_start = learned_start
        if learned_start is not None:
            self.v0 = brainstate.ParamState(jnp.full((n,), 0.3, jnp.float32))
        self.hidden("V", init=init)

    def reset_state(self, batch_size=None, **kwargs):
        super().reset_state(batch_size, **kwargs)
        if self.learned_start is not None:
            self.V.value = jnp.broadcast_to(self.v0.value, self.V.value.shape)

    def update(self, x):
        bias = self.v0.value if self.learned_start == "also_in_update" else 0.0
        self.V.value = 0.8 * self.V.value + x + bias
        return self.V.value


def _leaky_model(**neuron):
    rng = np.random.default_rng(1)
    return ef.Sequential(L.Linear(C, 6, w_init=rng.normal(0, 1.0, (C, 6)).astype(np.float32)), _Leaky(6, **neuron),
                         L.Linear(6, 2, w_init=rng.normal(0, 0.5, (6, 2)).astype(np.float32)))


def _reference_loss(model, x, y) -> float:
    """The loss at the last step from the model's own ``reset_all_states``, eagerly."""
    xs = jnp.swapaxes(jnp.asarray(x), 0, 1)
    brainstate.nn.reset_all_states(model, batch_size=xs.shape[1])
    out = brainstate.transform.for_loop(model, xs)[-1]
    return float(jnp.mean(optax.softmax_cross_entropy_with_integer_labels(out, jnp.asarray(y))))


def _batch_losses(trainer, x, y, callbacks=()):
    losses = []
    trainer.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0,
                callbacks=[LambdaCallback(on_train_batch_end=lambda b, logs: losses.append(logs["loss"])), *callbacks])
    return losses


@pytest.mark.parametrize("neuron", [dict(init=0.5), dict(learned_start="reset_only"),
                                    dict(learned_start="also_in_update")], ids=["constant", "param", "param_in_step"])
def test_every_batch_starts_from_the_models_own_reset(neuron):
    """The step resets the hidden states itself (the model's reset_all_states traced
    once): identical batches give identical losses (lr 0), equal to the eager reference;
    a reset reading a weight (a learned initial state) reads its current value."""
    x, y = rate_data(8)
    x2, y2 = np.concatenate([x, x]), np.concatenate([y, y])
    model = _leaky_model(**neuron)
    trainer = ef.Trainer(model, algo="d_rtrl", optimizer=optax.sgd(0.0), metrics=())
    losses = _batch_losses(trainer, x2, y2)
    np.testing.assert_allclose(losses, [_reference_loss(model, x, y)] * 2, rtol=1e-5)
    if "learned_start" in neuron:  # a new initial state, set from outside, is the next batch's start
        trainer.set_weights({("layers", 1, "v0"): jnp.full((6,), -0.7, jnp.float32)})
        after = _batch_losses(trainer, x, y)
        np.testing.assert_allclose(after, [_reference_loss(trainer.model, x, y)], rtol=1e-5)
        assert abs(after[0] - losses[0]) > 1e-4


def test_a_random_initial_state_is_drawn_anew_for_every_batch():
    """A reset that draws random numbers cannot run inside the step; it runs as the
    model's code says, every batch: identical batches start differently."""
    x, y = rate_data(8)
    x2, y2 = np.concatenate([x, x]), np.concatenate([y, y])
    brainstate.random.seed(3)
    trainer = ef.Trainer(_leaky_model(init=brainstate.nn.init.Uniform(-1.0, 1.0)), algo="d_rtrl",
                         optimizer=optax.sgd(0.0), metrics=())
    first, second = _batch_losses(trainer, x2, y2)
    assert abs(first - second) > 1e-4


def test_the_training_state_is_one_pytree_and_the_model_follows_it_lazily():
    x, y = rate_data(16)
    trainer = ef.Trainer(lif_model(), algo="d_rtrl", optimizer=optax.adam(1e-2))
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    state = trainer._state
    assert isinstance(state, ef.training.state.TrainState)
    leaves = jax.tree.leaves(state)
    assert leaves and all(isinstance(leaf, jax.Array) for leaf in leaves)
    before = _weights(trainer._model)
    trainer.train_on_batch(x[:8], y[:8])  # one call: the model is current when it returns
    assert not all(np.array_equal(a, b) for a, b in zip(before, _weights(trainer._model)))
    for a, b in zip(_weights(trainer._model), jax.tree.leaves(trainer._state.weights)):
        np.testing.assert_array_equal(a, b)
    assert trainer._state.weights.keys() == {".".join(map(str, p)) for p in
                                             trainer._model.states(brainstate.ParamState)}
    assert T == next(iter(x.shape[1:]))  # the shared task's length, as the helpers say


def test_the_reset_is_traced_once_per_batch_shape(monkeypatch):
    """Batches of 8, 8 and 4 over two epochs: two programs, two traced resets (not one
    per batch, nor two per program)."""
    from etrace_fit.training import trainer as trainer_module

    calls = []
    real = trainer_module.traced_reset
    monkeypatch.setattr(trainer_module, "traced_reset", lambda *a: calls.append(a[2]) or real(*a))
    x, y = rate_data(20)
    ef.Trainer(lif_model(), algo="d_rtrl").fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert sorted(calls) == [4, 8]

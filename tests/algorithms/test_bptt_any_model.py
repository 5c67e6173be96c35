"""BPTT takes the models the online rules refuse.

A user comparing us with BPTT must be able to run BPTT on their model even where no
online rule can follow it: BPTT carries every state through its scan and differentiates
in reverse mode, so it needs no hidden groups and no forward-mode derivatives. Three
models the online rules refuse with a ``CompilationError`` (each named in its message):

- a delay buffer ``(B, N, D)`` beside its ``(B, N)`` membrane (hidden states of two
  shapes cannot form one hidden group);
- a ``jax.custom_vjp`` spike that mixes units (no forward-mode derivative);
- a membrane kept in a plain ``brainstate.State`` (no trace would follow it), beside
  a ``HiddenState`` or as the model's only memory.

Under ``algo="bptt"`` and ``TBPTT`` each gives the reference gradient (float64,
``brainstate.transform.grad`` over ``brainstate.transform.for_loop``; ``_helpers``),
and the Trainer trains it.
"""

from __future__ import annotations

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.errors import CompilationError

from ._helpers import B, I, N, O, Case, assert_grads_match, assert_losses_match, lin

T, D = 12, 3


class BufferLIF(L.Neuron):
    """A LIF whose input reaches the membrane ``D`` steps late through one ``(B, N, D)``
    buffer (as users port a delay line), beside the ``(B, N)`` membrane."""

    def __init__(self, n, delay=D):
        super().__init__(n)
        self.delay = delay
        self.spike = L.Sigmoid()
        self.hidden("V", init=0.0)

    def init_state(self, batch_size=None, **kwargs):
        super().init_state(batch_size, **kwargs)
        self.buffer = brainstate.HiddenState(jnp.zeros((batch_size, *self.shape, self.delay),
                                                       brainstate.environ.dftype()))

    def reset_state(self, batch_size=None, **kwargs):
        super().reset_state(batch_size, **kwargs)
        self.buffer.value = jnp.zeros((batch_size, *self.shape, self.delay), brainstate.environ.dftype())

    def update(self, x):
        arriving = self.buffer.value[..., -1]
        self.buffer.value = jnp.concatenate([x[..., None], self.buffer.value[..., :-1]], axis=-1)
        v = 0.9 * self.V.value + arriving + 0.5 * x
        spike = self.spike(v - 1.0)
        self.V.value = v - spike
        return spike


@jax.custom_vjp
def centred_spike(v):
    """A spike of the membrane above the layer's mean: it mixes units."""
    return (v - v.mean(axis=-1, keepdims=True) > 0).astype(v.dtype)


def _centred_forward(v):
    return centred_spike(v), v


def _centred_backward(v, grad):
    centred = v - v.mean(axis=-1, keepdims=True)
    local = grad / (1.0 + 4.0 * jnp.abs(centred)) ** 2
    return (local - local.mean(axis=-1, keepdims=True),)


centred_spike.defvjp(_centred_forward, _centred_backward)


class CentredLIF(L.Neuron):
    def __init__(self, n):
        super().__init__(n)
        self.hidden("V", init=0.0)

    def update(self, x):
        v = 0.9 * self.V.value + x
        spike = centred_spike(v)
        self.V.value = v - spike
        return spike


class PlainStateLeaky(brainstate.nn.Module):
    """A leaky tanh unit whose memory is a plain ``brainstate.State``; a ``HiddenState``
    beside it keeps the model recurrent in the library's sense."""

    def __init__(self, n):
        super().__init__()
        self.n = n

    def init_state(self, batch_size=None, **kwargs):
        self.v = brainstate.State(jnp.zeros((batch_size, self.n), brainstate.environ.dftype()))
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, self.n), brainstate.environ.dftype()))

    def reset_state(self, batch_size=None, **kwargs):
        self.v.value = jnp.zeros((batch_size, self.n), brainstate.environ.dftype())
        self.h.value = jnp.zeros((batch_size, self.n), brainstate.environ.dftype())

    def update(self, x):
        self.v.value = 0.8 * self.v.value + x
        self.h.value = 0.5 * self.h.value + jnp.tanh(self.v.value)
        return self.h.value


class PlainStateOnly(brainstate.nn.Module):
    """The same unit with its plain ``State`` as the model's only memory (BPTT refused
    it as a model with "nothing to learn online")."""

    def __init__(self, n):
        super().__init__()
        self.n = n

    def init_state(self, batch_size=None, **kwargs):
        self.v = brainstate.State(jnp.zeros((batch_size, self.n), brainstate.environ.dftype()))

    def reset_state(self, batch_size=None, **kwargs):
        self.v.value = jnp.zeros((batch_size, self.n), brainstate.environ.dftype())

    def update(self, x):
        self.v.value = 0.8 * self.v.value + jnp.tanh(x)
        return self.v.value


NEURONS = {
    "buffer beside membrane": (BufferLIF, r"differ in shape, so they cannot form one hidden group"),
    "unit-mixing custom_vjp": (CentredLIF, r"the jax.custom_vjp function centred_spike .* mixes entries"),
    "plain State memory": (PlainStateLeaky, r"State layers\.1\.v is carried from step to step"),
    "plain State alone": (PlainStateOnly, r"State layers\.1\.v is carried from step to step"),
}


@pytest.fixture(scope="module", params=list(NEURONS))
def case(request):
    neuron, _ = NEURONS[request.param]
    case = Case(lambda: L.Sequential(lin(I, N, 0, scale=2.0), neuron(N), lin(N, O, 2)), (T, B, I), (T, B, O), 64)
    case.name = request.param
    return case


def test_the_reference_is_not_degenerate(case):
    assert all(np.max(np.abs(leaf)) > 0 for leaf in jax.tree.leaves(case.ref_grads)), case.ref_grads


@pytest.mark.parametrize("algo", ["d_rtrl", "esd_rtrl", "hybrid"])
def test_the_online_rules_refuse_it_naming_the_cause(case, algo):
    with case.env(), pytest.raises(CompilationError, match=NEURONS[case.name][1]) as error:
        ef.compile(case.model, case.xs[0], case.step_loss, algo=algo)
    assert "algo='bptt' takes" in str(error.value), error.value


@pytest.mark.parametrize("algo", ["bptt", ef.algorithms.TBPTT(T)])
def test_bptt_gives_the_reference_gradient(case, algo):
    grads, losses = case.run(algo)
    assert_losses_match(losses, case.ref_losses, 1e-10)
    assert_grads_match(grads, case.ref_grads, 1e-10)


def test_the_bptt_report_says_why_there_are_no_hidden_groups():
    with brainstate.environ.context(precision=64, dt=1.0):
        model = L.Sequential(lin(I, N, 0), BufferLIF(N), lin(N, O, 2))
        brainstate.nn.init_all_states(model, batch_size=B)
        report = ef.compile(model, jnp.ones((B, I)), lambda o, y: jnp.sum((o - y) ** 2), algo="bptt").report()
    assert "hidden groups:\n  none (BPTT needs none): hidden states layers.1.buffer (3, 8, 3), layers.1.V (3, 8)" \
        in report, report


class Stateless(brainstate.nn.Module):
    def update(self, x):
        return jnp.tanh(x)


@pytest.mark.parametrize("algo, match", [
    ("bptt", r"Sequential writes no state in its step: nothing is carried from step to step, so there is no time to "
             r"backpropagate through; for a stateless model use plain jax.grad"),
    ("d_rtrl", r"Sequential has no hidden state that its step writes: there is nothing to learn online")])
def test_a_model_without_memory_is_refused_saying_so(algo, match):
    with brainstate.environ.context(precision=64, dt=1.0):
        model = L.Sequential(lin(I, N, 0), Stateless(), lin(N, O, 2))
        with pytest.raises(CompilationError, match=match):
            ef.compile(model, jnp.ones((B, I)), lambda o, y: jnp.sum((o - y) ** 2), algo=algo)


@pytest.mark.parametrize("name", list(NEURONS))
def test_the_trainer_trains_it_under_bptt(name):
    neuron, _ = NEURONS[name]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((12, T, I)).astype(np.float32)
    y = (x[:, :, 0].sum(axis=1) > 0).astype(np.int32)
    brainstate.environ.set(dt=1.0)
    model = L.Sequential(lin(I, N, 0, scale=2.0), neuron(N), lin(N, 2, 2))
    trainer = ef.Trainer(model, algo="bptt", optimizer=optax.sgd(0.05), loss_on="last", seed=0)
    history = trainer.fit(x, y, batch_size=6, epochs=3, verbose=0)
    losses = history.history["loss"]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    assert trainer.predict(x, verbose=0).shape == (12, 2)  # loss_on="last": the last step's output

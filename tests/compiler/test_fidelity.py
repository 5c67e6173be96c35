"""Pass 4 — fidelity (etrace_fit/compiler/fidelity.py): which traced weights get an
approximate online gradient, and for which reason."""

from __future__ import annotations

import brainstate
import jax.numpy as jnp
import numpy as np
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit import ops
from etrace_fit.compiler import DiagnosticKind, Level

from ._helpers import B, I, N, O, rand


def linear(seed, i, o):
    return L.Linear(i, o, w_init=rand(seed, i, o), b_init=rand(seed + 1, o, scale=0.3))


class PlainToo(brainstate.nn.Module):
    """A weight used by its ETP op and also by a plain ``@`` that reaches the state."""

    def __init__(self, made=None, plain=True):
        super().__init__()
        self.made, self.plain = made, plain  # made: the op reads a value made of the weight, shared with the @
        self.w = brainstate.ParamState(jnp.asarray(rand(3, *((N, I) if made == "transposed" else (I, N)), scale=0.3)))

    def init_state(self, batch_size=None, **kwargs):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, N)))

    def update(self, x):
        w = {None: self.w.value, "transposed": self.w.value.T, "scaled": 2.0 * self.w.value}[self.made]
        self.h.value = 0.9 * self.h.value + ops.matmul(x, w) + (jnp.tanh(x @ w) if self.plain else 0.0)
        return self.h.value


class PrevSpike(brainstate.nn.Module):
    """Output read off the previous membrane (snnTorch habit): still exact."""

    def __init__(self):
        super().__init__()
        self.spike = L.Sigmoid()

    def init_state(self, batch_size=None, **kwargs):
        self.v = brainstate.HiddenState(jnp.zeros((batch_size, N)))

    def update(self, x):
        z = self.spike(self.v.value - 1.0)
        self.v.value = 0.9 * self.v.value + x - z
        return z


BUILDERS = {
    "lif": lambda: L.Sequential(linear(0, I, N), L.LIF(N), linear(2, N, O)),
    "prev_spike": lambda: L.Sequential(linear(0, I, N), PrevSpike(), linear(2, N, O)),
    "two_lif": lambda: L.Sequential(linear(0, I, N), L.LIF(N), linear(2, N, N), L.LIF(N), linear(4, N, O)),
    "alif_readout": lambda: L.Sequential(linear(0, I, N), L.ALIF(N), L.LeakyRateReadout(N, O, w_init=rand(5, N, O))),
    "gru": lambda: L.Sequential(L.GRUCell(I, N, w_init=rand(6, I + N, N), b_init=np.zeros(N)), linear(2, N, O)),
    "plain_too": lambda: L.Sequential(PlainToo(), linear(2, N, O)),
}


def approximate(name):
    model = BUILDERS[name]()
    brainstate.nn.init_all_states(model, batch_size=B)
    graph = ef.compile_graph(model, jnp.ones((B, I)))
    records = [d for d in graph.diagnostics if d.kind is DiagnosticKind.APPROXIMATE]
    assert all(d.level is Level.WARNING for d in records)
    return {(ef.compiler.format_path(d.weight_path), dict(d.context)["reason"]) for d in records}, records


@pytest.mark.parametrize("name", ["lif", "prev_spike"])
def test_a_layer_read_out_by_a_stateless_layer_is_exact(env64, name):
    assert approximate(name)[0] == set()


def test_a_path_through_a_later_layers_memory_is_named(env64):
    found, records = approximate("two_lif")
    assert found == {("layers.0.weight", "later_memory")}
    assert "layers.3.V" in records[0].message


def test_a_stateful_readout_makes_the_layer_before_it_approximate_but_not_itself(env64):
    found, records = approximate("alif_readout")
    assert found == {("layers.0.weight", "later_memory")}
    assert "layers.2.r" in records[0].message


def test_gru_gates_on_the_state_are_dense_recurrence(env64):
    found, _ = approximate("gru")
    # W_r reaches h only through W_h: excluded as weight-to-weight, not a relation
    assert found == {("layers.0.W_z.weight", "dense_recurrence"), ("layers.0.W_h.weight", "dense_recurrence")}


def test_a_plain_use_of_a_traced_weight_is_named(env64):
    found, records = approximate("plain_too")
    assert found == {("layers.0.w", "untraced_use")}
    assert "dot_general" in records[0].message


@pytest.mark.parametrize("made", ["transposed", "scaled"])
def test_a_plain_use_of_a_value_made_of_the_weight_for_its_op_is_named(env64, made):
    """``w.T`` or ``2 * w`` read by the ETP op and by a plain ``@``: only plain reads of
    the weight itself were found, so D-RTRL was 0.3–0.4 off BPTT (relative) unwarned."""
    BUILDERS[made] = lambda: L.Sequential(PlainToo(made), linear(2, N, O))
    BUILDERS[made + "_alone"] = lambda: L.Sequential(PlainToo(made, plain=False), linear(2, N, O))
    try:
        found, records = approximate(made)
        assert found == {("layers.0.w", "untraced_use")} and "dot_general" in records[0].message
        assert approximate(made + "_alone")[0] == set()  # the op's own chain is no plain use
    finally:
        del BUILDERS[made], BUILDERS[made + "_alone"]

"""Pass 4 — ``perturbed_step`` (etrace_fit/compiler/perturbation.py).

The rewritten step at ``p = 0`` is the step; its gradient with respect to ``p`` is the
learning signal ``g^t = ∂L^t/∂h^t``, compared with closed forms for a step loss
``L = Σ out² + Σ_k Σ c_k ⊙ h_k^t``. Finally the signal and the relations' transitions
must combine into the exact one-step gradient: for an op whose output ``y`` reaches the
loss only through hidden states, ``∂L/∂y = Σ_s g_s ∂h_s^t/∂y``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import etrace_fit as ef
from etrace_fit import _compat
from etrace_fit.compiler import group_signal_correction, perturbed_step, within_group_readers

from ._helpers import (B, I, N, CopiesItsState, alif_net, eqn_outputs, gru, leaf_positions, lif_net, linear_params,
                       lstm, prime_spiking, rand, step_with_y, triangle_d)


def _readout_model():
    return prime_spiking(lif_net(readout="rate"))


def _alif_model():
    return prime_spiking(alif_net(learn_tau=True))


MODELS = {"gru": gru, "lif_rate_readout": _readout_model, "lstm": lstm, "alif_linear": _alif_model}


class Setup:
    """A compiled model, its perturbed step and the step loss."""

    def __init__(self, name):
        self.model = MODELS[name]()
        self.x = jnp.asarray(rand(50, B, I))
        self.graph = ef.compile_graph(self.model, self.x)
        self.module = self.graph.module
        self.leaves = self.module.state_leaves()
        self.num_out = len(self.module.output_vars)
        self.positions = leaf_positions(self.module)
        self.hidden = [s.path for s in self.module.hidden]
        self.coef = {path: jnp.asarray(rand(60 + k, *self.leaves[self.positions[path]].shape))
                     for k, path in enumerate(self.hidden)}
        self.jaxpr = perturbed_step(self.module)
        self.fn = _compat.jaxpr_as_fun(self.jaxpr)

    def zeros(self):
        return [jnp.zeros_like(self.leaves[self.positions[path]]) for path in self.hidden]

    def new(self, outs, path):
        return outs[self.num_out + self.positions[path]]

    def loss(self, outs):
        value = sum(jnp.sum(out ** 2) for out in outs[: self.num_out])
        return value + sum(jnp.sum(self.coef[path] * self.new(outs, path)) for path in self.hidden)

    def totals(self):
        """∂L/∂p: the total derivatives with respect to the new hidden values."""
        grads = jax.grad(lambda ps: self.loss(self.fn(self.x, *self.leaves, *ps)))(self.zeros())
        return dict(zip(self.hidden, grads))

    def signals(self):
        """The learning signals: totals less the within-group paths."""
        totals = self.totals()
        corrected = group_signal_correction(self.module, self.graph.hidden_groups, [totals[p] for p in self.hidden],
                                            self.leaves, [self.x])
        return dict(zip(self.hidden, corrected))


# ------------------------------------------------------------------------- layout


def test_perturbed_step_takes_one_perturbation_per_hidden_state(env64):
    setup = Setup("lstm")
    invars = setup.jaxpr.jaxpr.invars
    assert len(invars) == 1 + len(setup.leaves) + len(setup.hidden)
    for var, path in zip(invars[1 + len(setup.leaves):], setup.hidden):
        assert tuple(var.aval.shape) == setup.leaves[setup.positions[path]].shape
        assert var.aval.dtype == jnp.float64
    assert len(setup.jaxpr.jaxpr.outvars) == setup.num_out + len(setup.leaves)


@pytest.mark.parametrize("name", list(MODELS))
def test_perturbed_step_at_zero_is_the_step(env64, name):
    setup = Setup(name)
    outs = setup.fn(setup.x, *setup.leaves, *setup.zeros())
    expected_out, expected_new = setup.module.evaluate(setup.leaves, setup.x)
    expected = [*jax.tree.leaves(expected_out), *expected_new]
    assert len(outs) == len(expected)
    for a, e in zip(outs, expected):
        assert np.array_equal(np.asarray(a), np.asarray(e))


def test_a_perturbation_is_added_where_the_hidden_value_is_produced(env64):
    """GRU returns its new h: the output and the state output both become ĥ + p."""
    setup = Setup("gru")
    p = jnp.asarray(rand(70, B, N))
    outs = setup.fn(setup.x, *setup.leaves, p)
    h_hat = setup.model(setup.x)
    np.testing.assert_allclose(np.asarray(outs[0]), np.asarray(h_hat + p), rtol=1e-15)
    np.testing.assert_allclose(np.asarray(setup.new(outs, ("h",))), np.asarray(h_hat + p), rtol=1e-15)


# ----------------------------------------------------------------- learning signals


def test_gru_learning_signal_is_the_loss_gradient_wrt_the_new_h(env64):
    setup = Setup("gru")
    h_new = setup.model(setup.x)
    g = setup.signals()
    np.testing.assert_allclose(np.asarray(g[("h",)]), np.asarray(2 * h_new + setup.coef[("h",)]), rtol=1e-13)


def test_readout_model_learning_signals_include_what_reads_the_new_state(env64):
    """Linear → LIF → LeakyRateReadout: out = r^t, so ∂L/∂r^t = 2 r^t + c_r. The output
    spike z^t = H(V^t − θ) reads the new (pre-reset) V^t and feeds r^t = κ r + z W + b,
    so ∂L/∂V^t = c_V + σ'(V^t − θ) ⊙ ((2 r^t + c_r) Wᵀ)."""
    setup = Setup("lif_rate_readout")
    readout = setup.model.layers[2]
    w_out, _ = linear_params(readout)
    r_new = setup.model(setup.x)
    v_new = setup.model.layers[1].V.value
    g = setup.signals()
    v_path, r_path = ("layers", 1, "V"), ("layers", 2, "r")
    g_r = 2 * r_new + setup.coef[r_path]
    surrogate = triangle_d(v_new - setup.model.layers[1].v_threshold)
    assert np.any(np.asarray(surrogate) != 0.0)  # the readout path is not vacuous
    np.testing.assert_allclose(np.asarray(g[r_path]), np.asarray(g_r), rtol=1e-13)
    np.testing.assert_allclose(np.asarray(g[v_path]), np.asarray(setup.coef[v_path] + surrogate * (g_r @ w_out.T)),
                               rtol=1e-12, atol=1e-14)


def test_lstm_perturbation_gradients_are_total_derivatives_wrt_the_new_values(env64):
    """The perturbation of c is inserted where c^t is produced and h^t = o tanh(c^t) is
    computed from it, so ∂L/∂p_c = c_c + (2h + c_h) o (1 − tanh² c^t): the total derivative."""
    setup = Setup("lstm")
    h_new = setup.model(setup.x)
    c_new = setup.model.c.value
    totals = setup.totals()
    xh = jnp.concatenate([setup.x, setup.leaves[setup.positions[("h",)]]], axis=-1)
    params = setup.model.W_o.weight.value
    o = jax.nn.sigmoid(xh @ params["weight"] + params["bias"])
    expected_c = setup.coef[("c",)] + (2 * h_new + setup.coef[("h",)]) * o * (1 - jnp.tanh(c_new) ** 2)
    np.testing.assert_allclose(np.asarray(totals[("h",)]), np.asarray(2 * h_new + setup.coef[("h",)]), rtol=1e-13)
    np.testing.assert_allclose(np.asarray(totals[("c",)]), np.asarray(expected_c), rtol=1e-12)


def test_groups_without_within_group_paths_need_no_correction(env64):
    for name in ("gru", "lif_rate_readout", "alif_linear"):
        setup = Setup(name)
        assert within_group_readers(setup.module, setup.graph.hidden_groups) == ()
        totals, signals = setup.totals(), setup.signals()
        for path in setup.hidden:
            np.testing.assert_array_equal(np.asarray(totals[path]), np.asarray(signals[path]))


def test_lstm_learning_signals_are_the_partial_derivatives_wrt_h_and_c(env64):
    """out = h^t; L = Σ h² + c_h ⊙ h^t + c_c ⊙ c^t: ∂L/∂h^t = 2h + c_h and ∂L/∂c^t = c_c.
    (h^t = o tanh(c^t) is computed from c^t inside the step; the perturbation of c is
    inserted where c^t is produced, so h^t sees it too and the signal of c picks up
    (2h + c_h) o (1 − tanh² c^t) on top, a dependence that the group's transition
    already carries in ∂h^t/∂y.)"""
    setup = Setup("lstm")
    h_new = setup.model(setup.x)
    g = setup.signals()
    np.testing.assert_allclose(np.asarray(g[("h",)]), np.asarray(2 * h_new + setup.coef[("h",)]), rtol=1e-13)
    np.testing.assert_allclose(np.asarray(g[("c",)]), np.asarray(setup.coef[("c",)]), rtol=1e-13)


# ------------------------------------------- signal × transition = one-step gradient


@pytest.mark.parametrize("name", list(MODELS))
def test_signal_times_transition_derivative_is_the_one_step_gradient_wrt_y(env64, name):
    """For every relation of these models, the op's output y reaches the loss only
    through the hidden states of its group (or through ops of other weights whose
    effect is inside another hidden state's signal), so the chain rule over the state
    vector must be exact: vjp of the transition y → h^t with cotangent g equals ∂L/∂y."""
    setup = Setup(name)
    g = setup.signals()
    for relation in setup.graph.relations:
        (group_index,) = relation.hidden_groups
        group = setup.graph.hidden_groups[group_index]
        transition = _compat.jaxpr_as_fun(relation.transitions[0])
        y = _y_of(setup, relation)
        _, vjp = jax.vjp(lambda v: transition(v, *setup.leaves, setup.x)[0], y)
        (via_signal,) = vjp(jnp.stack([g[path] for path in group.paths], axis=-1))
        direct = jax.grad(lambda v: setup.loss(step_with_y(setup.module, relation.eqn_index, v, setup.leaves,
                                                           [setup.x])))(y)
        assert np.any(np.asarray(direct) != 0.0)
        np.testing.assert_allclose(np.asarray(via_signal), np.asarray(direct), rtol=1e-11, atol=1e-13,
                                   err_msg=f"{name}: {relation.weight_path}")


def _y_of(setup, relation):
    return eqn_outputs(setup.module, setup.leaves, [setup.x])[relation.eqn_index]


def test_hidden_states_holding_the_same_value_get_their_own_signals(env64):
    """h^t is read by the output tanh(h^t) and stored; last^t is a stored copy only.
    With L = Σ out + Σ c_h h^t + Σ c_last last^t: ∂L/∂h^t = 1 − tanh² h^t + c_h and
    ∂L/∂last^t = c_last. (perturbed_step maps the shared variable to one state only, so
    the other state's perturbation is never added.)"""
    model = CopiesItsState()
    x = jnp.asarray(rand(80, B, I))
    module = ef.compile_graph(model, x).module
    fn = _compat.jaxpr_as_fun(perturbed_step(module))
    leaves = module.state_leaves()
    positions = leaf_positions(module)
    hidden = [s.path for s in module.hidden]
    coef = {path: jnp.asarray(rand(81 + k, B, N)) for k, path in enumerate(hidden)}

    def loss(ps):
        outs = fn(x, *leaves, *ps)
        return jnp.sum(outs[0]) + sum(jnp.sum(coef[p] * outs[1 + positions[p]]) for p in hidden)

    grads = dict(zip(hidden, jax.grad(loss)([jnp.zeros((B, N)) for _ in hidden])))
    h_new = 0.9 * leaves[positions[("h",)]] + x @ model.w.value
    np.testing.assert_allclose(np.asarray(grads[("h",)]), np.asarray(1 - jnp.tanh(h_new) ** 2 + coef[("h",)]),
                               rtol=1e-13)
    np.testing.assert_allclose(np.asarray(grads[("last",)]), np.asarray(coef[("last",)]), rtol=1e-13)

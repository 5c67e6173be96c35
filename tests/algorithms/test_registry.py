"""The rule registry (etrace_fit/algorithms/registry.py): a new rule is one module and
one registry line, or a value passed as ``algo``."""

from __future__ import annotations

import brainstate
import jax.numpy as jnp
import pytest

import etrace_fit as ef
from etrace_fit.algorithms import registry

from ._helpers import B, I, O, T, Case, MODELS, assert_grads_match, leaves_by_name, mse, rel_err


class OneStepOnly:
    """A rule with no memory: the exact one-step part ``Xᵀ dY`` and no history."""

    name = "one_step_only"

    def init_traces(self, pair, batch, dtype):
        return jnp.zeros((batch,), dtype)

    def step(self, traces, signals, t):
        if signals.dY is None:  # an elementwise pair: its one-step part came from the pull-back
            return jnp.zeros((signals.X.shape[-1], signals.G.shape[2]), signals.G.dtype), traces
        return jnp.einsum("bpk,bpo->ko", signals.X, signals.dY), traces

    def trace_bytes(self, pair, batch, itemsize):
        return batch * itemsize

    def trace_norm(self, traces, t):
        return jnp.zeros_like(traces)


def _case(steps):
    return Case(MODELS["lif"][0], (steps, B, I), (steps, B, O), 64)


def test_a_rule_value_is_an_algo_and_gets_the_exact_first_step():
    """At T = 1 the one-step part is the whole gradient: the toy rule equals BPTT; at
    T = 30 the history it drops is visible."""
    one = _case(1)
    grads, _ = one.run(OneStepOnly())
    assert_grads_match(grads, one.ref_grads, 1e-10)
    long = _case(T)
    grads, _ = long.run(OneStepOnly())
    online, ref = leaves_by_name(grads), leaves_by_name(long.ref_grads)
    assert rel_err(online["layers.0.weight['weight']"], ref["layers.0.weight['weight']"]) > 1e-2
    assert_grads_match(grads, long.ref_grads, 1e-10, only=["layers.2.weight"])  # the readout is untraced


def test_a_registered_rule_is_accepted_by_name_everywhere(monkeypatch):
    monkeypatch.setitem(registry.RULES, "one_step_only", lambda alpha: OneStepOnly())
    case = _case(T)
    with case.env():
        brainstate.nn.reset_all_states(case.model, batch_size=B)
        learner = ef.compile(case.model, case.xs[0], mse, algo={"layers.0.*": "one_step_only"})
        assert learner.rules == {"layers.0.weight": "one_step_only"}
        assert "one_step_only" in learner.report()
        assert learner.approximations()["layers.0.weight"] == ("rule 'one_step_only' is not one whose exactness "
                                                               "the library knows",)
        by_name, _ = learner.grad(case.xs, case.ys)
    by_value, _ = case.run(OneStepOnly())
    assert_grads_match(by_name, by_value, 1e-12)
    with pytest.raises(ef.ConfigError, match="'d_rtrl', 'esd_rtrl', 'one_step_only', 'hybrid', 'eprop', 'bptt'"):
        registry.check_algo("nope")


def test_unknown_rule_in_a_dict_names_the_registered_ones():
    with pytest.raises(ef.ConfigError, match=r"unknown rule 'rtrl' for a weight; valid: 'd_rtrl', 'esd_rtrl'"):
        registry.check_algo({"layers.0.*": "rtrl"})

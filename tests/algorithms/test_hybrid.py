"""The hybrid plan (etrace_fit/algorithms/hybrid.py): a rule per traced weight, its
report, per-weight overrides, and configuration errors.

Rule of the module docstring: elementwise relations get D-RTRL; dense and conv
relations start on ES-D-RTRL (trace ``P·(K + O·S)`` per sample) and move to D-RTRL
(``P·K·O·S`` per sample), exact ones first, then the cheapest, while the traces of one
sample fit the budget (default: 4 MiB per sample). ``big_plan`` passes a budget of 0
unless told otherwise. The expected choices and byte counts below are computed from
those formulas by hand.
"""

from __future__ import annotations

import functools

import brainstate
import jax.numpy as jnp
import numpy as np
import pytest

import etrace_fit as ef
from etrace_fit import layers as L

from ._helpers import (assert_grads_match, get_case, leaves_by_name, mse, rand, rel_err)

BIG, BIG_BATCH = 256, 32


@functools.lru_cache(maxsize=None)
def big_model():
    """Linear(256, 256) → LIF(256, learned tau) → Linear(256, 2), batch 32, float32."""
    with brainstate.environ.context(dt=1.0):
        model = ef.Sequential(
            L.Linear(BIG, BIG, w_init=rand(0, BIG, BIG, scale=1 / 16), b_init=np.zeros(BIG)),
            L.LIF(BIG, tau=10.0, learn_tau=True),
            L.Linear(BIG, 2, w_init=rand(1, BIG, 2, scale=1 / 16), b_init=np.zeros(2)),
        )
        brainstate.nn.init_all_states(model, batch_size=BIG_BATCH)
    xs = jnp.zeros((2, BIG_BATCH, BIG), jnp.float32)
    ys = jnp.zeros((2, BIG_BATCH, 2), jnp.float32)
    return model, xs, ys


def big_plan(algo="hybrid", **kwargs):
    kwargs.setdefault("memory_budget", 0)
    model, xs, ys = big_model()
    with brainstate.environ.context(dt=1.0):
        return ef.algorithms.plan_for(model, xs, ys, mse, algo=algo, **kwargs)[1]


def rules_by_weight(plan):
    return {".".join(map(str, pair.relation.weight_path)): rule.name for pair, rule in zip(plan.pairs, plan.rules)}


def test_hybrid_on_a_big_dense_layer_and_a_learned_tau():
    plan = big_plan()
    assert rules_by_weight(plan) == {"layers.0.weight": "esd_rtrl", "layers.1.tau": "d_rtrl"}
    assert {pair.kind for pair in plan.pairs} == {"dense", "elementwise"}
    assert plan.rule_of("layers.0.weight") == ("esd_rtrl",)
    assert plan.rule_of(("layers", 1, "tau")) == ("d_rtrl",)
    assert plan.batch == BIG_BATCH and jnp.dtype(plan.trace_dtype) == jnp.float32
    # B·(K + O·S)·4 for the dense pair (K = 256 + bias), B·O·4 for the tau pair (K = 1)
    assert plan.trace_bytes() == (BIG_BATCH * (BIG + 1 + BIG) * 4, BIG_BATCH * 1 * BIG * 4)
    # what D-RTRL would have cost for the dense weight: 128x more, hence ES-D-RTRL
    d_rtrl = big_plan("d_rtrl")
    assert d_rtrl.trace_bytes()[0] == BIG_BATCH * (BIG + 1) * BIG * 4


def test_report_names_rules_and_trace_memory():
    report = big_plan().report()
    assert "layers.0.weight" in report and "layers.1.tau" in report
    assert "esd_rtrl" in report and "d_rtrl" in report
    assert "trace memory" in report
    assert "64.1 KiB" in report  # 32·513·4 B, the dense pair
    assert "32.0 KiB" in report  # 32·256·4 B, the tau pair
    assert "total 96.1 KiB" in report
    assert "batch 32" in report and "float32" in report
    # the compile report comes first: the readout is listed as non-temporal
    assert report.index("non-temporal") < report.index("online rules")
    lines = [line for line in report.splitlines() if line.startswith("layers.0.weight") and "esd_rtrl" in line]
    assert len(lines) == 1 and "64.1 KiB" in lines[0]


def test_bfloat16_traces_halve_the_memory():
    plan = big_plan(trace_dtype=jnp.bfloat16)
    assert plan.trace_bytes() == tuple(n // 2 for n in big_plan().trace_bytes())
    assert "bfloat16" in plan.report()


@pytest.mark.parametrize("algo,expected", [
    ({"layers.0.weight": "d_rtrl"}, {"layers.0.weight": "d_rtrl", "layers.1.tau": "d_rtrl"}),
    ({"layers.1.*": "esd_rtrl"}, {"layers.0.weight": "esd_rtrl", "layers.1.tau": "esd_rtrl"}),
    ({"layers.0.weight": "d_rtrl", "layers.1.tau": "esd_rtrl"}, {"layers.0.weight": "d_rtrl", "layers.1.tau": "esd_rtrl"}),
    ({"*": "d_rtrl"}, {"layers.0.weight": "d_rtrl", "layers.1.tau": "d_rtrl"}),
    ({"layers.2.weight": "esd_rtrl"}, {"layers.0.weight": "esd_rtrl", "layers.1.tau": "d_rtrl"}),  # readout: untraced
])
def test_dict_overrides_force_rules_per_weight(algo, expected):
    assert rules_by_weight(big_plan(algo)) == expected


@pytest.mark.parametrize("in_size,out_size,budget,expected", [
    (4, 8, 0, "esd_rtrl"),  # no budget: even a tiny dense weight stays on ES-D-RTRL
    (4, 8, 5 * 8 * 4 - 1, "esd_rtrl"),  # per sample D-RTRL is 5·8·4 B, one byte short
    (4, 8, 5 * 8 * 4, "d_rtrl"),  # the boundary is inclusive
    (1, 64, None, "d_rtrl"),  # the default budget
])
def test_a_dense_weight_moves_to_d_rtrl_when_its_trace_fits_per_sample(in_size, out_size, budget, expected):
    with brainstate.environ.context(dt=1.0):
        model = ef.Sequential(L.Linear(in_size, out_size, w_init=rand(0, in_size, out_size), b_init=np.zeros(out_size)),
                              L.LIF(out_size))
        plans = []
        for batch in (2, 64):  # the batch size never changes the choice
            brainstate.nn.init_all_states(model, batch_size=batch)
            xs = jnp.zeros((3, batch, in_size))
            plans.append(ef.algorithms.plan_for(model, xs, None, lambda out, _: out.sum(), memory_budget=budget)[1])
    assert [[rule.name for rule in plan.rules] for plan in plans] == [[expected]] * 2


def test_override_changes_the_gradient_of_that_weight_only():
    """``{"layers.0.*": "esd_rtrl"}`` on LIF with a learned tau: the input weight gets
    ES-D-RTRL's gradient, tau keeps D-RTRL's (exact), the readout is exact."""
    case = get_case("lif_learn_tau", 64)
    mixed = leaves_by_name(case.run({"layers.0.*": "esd_rtrl"})[0])
    esd = leaves_by_name(case.run("esd_rtrl")[0])
    d_rtrl = leaves_by_name(case.run("d_rtrl")[0])
    for leaf in ("layers.0.weight['weight']", "layers.0.weight['bias']"):
        assert rel_err(mixed[leaf], esd[leaf]) < 1e-12, leaf
    assert rel_err(mixed["layers.0.weight['weight']"], d_rtrl["layers.0.weight['weight']"]) > 1e-2
    assert_grads_match(case.run({"layers.0.*": "esd_rtrl"})[0], case.ref_grads, 1e-5,
                       only=["layers.1.tau", "layers.2.weight"])


@pytest.mark.parametrize("algo", ["rtrl", "D_RTRL", "", "e-prop"])
def test_unknown_algo_lists_the_valid_ones(algo):
    model, xs, ys = big_model()
    with brainstate.environ.context(dt=1.0):
        for call in (ef.sequence_grad, ef.algorithms.plan_for):
            with pytest.raises(ef.ConfigError) as info:
                call(model, xs, ys, mse, algo=algo)
            message = str(info.value)
            assert repr(algo) in message
            for valid in ("d_rtrl", "esd_rtrl", "hybrid", "bptt"):
                assert f"'{valid}'" in message


def test_dict_pattern_matching_no_weight_is_an_error():
    with pytest.raises(ef.ConfigError, match=r"layers\.9\.\*.*matches no weight") as info:
        big_plan({"layers.9.*": "d_rtrl"})
    assert "layers.0.weight" in str(info.value) and "layers.1.tau" in str(info.value)
    # one bad pattern among good ones is still an error
    with pytest.raises(ef.ConfigError, match="matches no weight"):
        big_plan({"layers.0.weight": "d_rtrl", "layer.0.weight": "esd_rtrl"})


@pytest.mark.parametrize("rule", ["bptt", "hybrid", "rtrl"])
def test_dict_with_unknown_rule_is_an_error(rule):
    with pytest.raises(ef.ConfigError, match="'d_rtrl', 'esd_rtrl'"):
        big_plan({"layers.0.weight": rule})


def test_plan_for_bptt_has_no_plan():
    model, xs, ys = big_model()
    with brainstate.environ.context(dt=1.0):
        graph, plan = ef.algorithms.plan_for(model, xs, ys, mse, algo="bptt")
    assert plan is None
    assert isinstance(graph, ef.ETraceGraph)


def test_make_plan_error_does_not_call_bptt_valid():
    """``make_plan`` (public in ``etrace_fit.algorithms``) rejects ``'bptt'`` (BPTT has
    no plan) but its message lists ``'bptt'`` among the valid values. FAILS at the time
    of writing (hybrid.py, the ``else`` branch of ``make_plan``)."""
    model, xs, ys = big_model()
    with brainstate.environ.context(dt=1.0):
        graph = ef.compile_graph(model, xs[0])
    with pytest.raises(ef.ConfigError) as info:
        ef.algorithms.make_plan(graph, "bptt", alpha=0.9, batch=BIG_BATCH)
    assert "'bptt'" not in str(info.value).split("valid:")[1]


# ---------------------------------------------------------------- memory budget
def test_a_budget_that_fits_the_d_rtrl_trace_moves_the_dense_weight_to_d_rtrl():
    """Budgets are bytes per sample; the report shows the totals at the batch too."""
    esd_dense, tau = BIG_BATCH * (BIG + 1 + BIG) * 4, BIG_BATCH * BIG * 4
    d_rtrl_dense = BIG_BATCH * (BIG + 1) * BIG * 4
    per_sample = (d_rtrl_dense + tau) // BIG_BATCH  # 264192 B
    assert rules_by_weight(big_plan(memory_budget=per_sample - 1))["layers.0.weight"] == "esd_rtrl"
    plan = big_plan(memory_budget=per_sample)
    assert rules_by_weight(plan) == {"layers.0.weight": "d_rtrl", "layers.1.tau": "d_rtrl"}
    assert sum(plan.trace_bytes()) == d_rtrl_dense + tau and plan.bytes_per_sample() == per_sample
    assert plan.memory_budget == per_sample
    assert "total 8.1 MiB: 258.0 KiB per sample, budget 258.0 KiB per sample" in plan.report()
    # a string size is read with its unit; a budget never overrides a forced rule
    assert rules_by_weight(big_plan(memory_budget="1GiB"))["layers.0.weight"] == "d_rtrl"
    forced = big_plan({"layers.0.*": "esd_rtrl"}, memory_budget="1GiB")
    assert rules_by_weight(forced)["layers.0.weight"] == "esd_rtrl"
    assert sum(big_plan(memory_budget=0).trace_bytes()) == esd_dense + tau
    # A budget under that floor (1 B: a plan not made before, programs are kept per budget) says so.
    with pytest.warns(UserWarning, match=r"memory_budget: 1 B per sample is less than this model's smallest "
                                         r"traces, 3.0 KiB per sample with ES-D-RTRL wherever the hybrid chooses "
                                         r"\(the floor\)"):
        floor = big_plan(memory_budget=1)
    assert sum(floor.trace_bytes()) == esd_dense + tau
    assert "per sample, budget 1 B per sample, over it: ES-D-RTRL's traces are the floor" in floor.report()


def test_the_budget_is_spent_on_the_cheapest_move_first():
    batch, item = 2, 4
    with brainstate.environ.context(dt=1.0):
        model = ef.Sequential(L.Linear(64, 64, b_init=np.zeros(64)), L.LIF(64),
                              L.Linear(64, 32, b_init=np.zeros(32)), L.LIF(32), L.Linear(32, 2))
        brainstate.nn.init_all_states(model, batch_size=batch)
        xs, ys = jnp.zeros((2, batch, 64)), jnp.zeros((2, batch, 2))
        esd = item * ((65 + 64) + (65 + 32))  # per sample
        extra_first, extra_second = item * (65 * 64 - 129), item * (65 * 32 - 97)
        _, plan = ef.algorithms.plan_for(model, xs, ys, mse, memory_budget=esd + extra_second)
        assert rules_by_weight(plan) == {"layers.0.weight": "esd_rtrl", "layers.2.weight": "d_rtrl"}
        _, plan = ef.algorithms.plan_for(model, xs, ys, mse, memory_budget=esd + extra_second + extra_first)
        assert rules_by_weight(plan) == {"layers.0.weight": "d_rtrl", "layers.2.weight": "d_rtrl"}


@pytest.mark.parametrize("value, expected", [(None, None), (0, 0), (1000, 1000), ("64MiB", 64 * 2**20),
                                             ("1.5 GB", 1_500_000_000), ("10kb", 10_000), ("512", 512)])
def test_parse_bytes_reads_sizes(value, expected):
    from etrace_fit.algorithms.hybrid import parse_bytes

    assert parse_bytes(value) == expected


@pytest.mark.parametrize("value", [-1, "lots", "12 parsecs", "-3MB", True, 1.5, "1e400", "inf", "nan"])
def test_a_bad_budget_is_a_config_error_naming_the_argument(value):
    with pytest.raises(ef.ConfigError, match="memory_budget"):
        big_plan(memory_budget=value)


# ---------------------------------------------------------------- default budget
def _two_layer_plan(batch, in_size=16, **kwargs):
    """Linear(in, 64) → LIF → Linear(64, 64) → LIF → Linear: the first weight is
    approximate (the second LIF's memory), the second exact; both start on ES-D-RTRL."""
    with brainstate.environ.context(dt=1.0):
        model = ef.Sequential(L.Linear(in_size, 64, b_init=np.zeros(64)), L.LIF(64),
                              L.Linear(64, 64, b_init=np.zeros(64)), L.LIF(64), L.Linear(64, 2))
        brainstate.nn.init_all_states(model, batch_size=batch)
        xs, ys = jnp.zeros((2, batch, in_size)), jnp.zeros((2, batch, 2))
        return ef.algorithms.plan_for(model, xs, ys, mse, **kwargs)[1]


def test_without_a_budget_d_rtrl_is_chosen_per_sample_and_the_plan_is_batch_free():
    from etrace_fit.algorithms.hybrid import DEFAULT_BUDGET_PER_SAMPLE

    assert DEFAULT_BUDGET_PER_SAMPLE == 4 * 2**20
    assert rules_by_weight(big_plan(memory_budget=None)) == {"layers.0.weight": "d_rtrl", "layers.1.tau": "d_rtrl"}
    assert "budget 4.0 MiB per sample (default)" in big_plan(memory_budget=None).report()
    plans = [_two_layer_plan(batch) for batch in (1, 2, 32)]
    assert len({tuple(rule.name for rule in plan.rules) for plan in plans}) == 1
    # both fit the default budget, the approximate weight too: D-RTRL is the closer gradient
    assert rules_by_weight(plans[0]) == {"layers.0.weight": "d_rtrl", "layers.2.weight": "d_rtrl"}
    # 16385·64·4 B per sample is more than 4 MiB: the factor rule's ES-D-RTRL stays
    assert rules_by_weight(_two_layer_plan(2, in_size=16384))["layers.0.weight"] == "esd_rtrl"


def test_the_budget_goes_to_exact_weights_before_cheaper_approximate_ones():
    batch, item = 2, 4
    esd = item * ((17 + 64) + (65 + 64))  # per sample
    extra_first, extra_second = item * (17 * 64 - 81), item * (65 * 64 - 129)
    assert extra_first < extra_second  # the first weight is the cheaper move, but approximate
    plan = _two_layer_plan(batch, memory_budget=esd + extra_second)
    assert rules_by_weight(plan) == {"layers.0.weight": "esd_rtrl", "layers.2.weight": "d_rtrl"}
    plan = _two_layer_plan(batch, memory_budget=esd + extra_second + extra_first)
    assert rules_by_weight(plan) == {"layers.0.weight": "d_rtrl", "layers.2.weight": "d_rtrl"}

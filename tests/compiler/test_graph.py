"""``compile_graph`` and ``ETraceGraph`` (etrace_fit/compiler/graph.py): the report,
``explain``, lookups by path, and immutability."""

from __future__ import annotations

import dataclasses

import brainstate
import jax.numpy as jnp
import pytest

import etrace_fit as ef
from etrace_fit import layers as L

from ._helpers import B, I, N, O, gru, linear, lstm

HEADER = ["weight", "primitive", "hidden groups", "classification", "size"]


def _lif_linear():
    model = L.Sequential(linear(0, I, N), L.LIF(N), linear(1, N, O))
    brainstate.nn.init_all_states(model, batch_size=B)
    return ef.compile_graph(model, jnp.ones((B, I)))


def _table(report):
    lines = report.splitlines()
    end = lines.index("")
    rows = [[cell.strip() for cell in line.split("|")] for line in lines[:end]]
    return rows[0], lines[1], rows[2:]


def test_report_is_a_table_with_one_row_per_weight(env64):
    header, rule, rows = _table(_lif_linear().report())
    assert header == HEADER
    assert set(rule) <= {"-", "+"}
    assert rows == [
        ["layers.0.weight", "etp_mm", "(layers.1.V)", "all_direct", str(I * N + N)],
        ["layers.2.weight", "etp_mm", "-", "excluded: non-temporal", str(N * O + O)],
    ]


def test_report_lists_groups_and_warnings(env64):
    graph = ef.compile_graph(gru(), jnp.ones((B, I)))
    report = graph.report()
    header, _, rows = _table(report)
    assert header == HEADER
    assert [(row[0], row[3]) for row in rows] == [
        ("W_z.weight", "all_direct"), ("W_r.weight", "excluded: weight-to-weight"), ("W_h.weight", "all_direct"),
    ]
    assert "hidden groups:\n  0: (h)  S=1  shape=(2, 4)" in report
    assert "warnings:" in report and "W_r.weight" in report.split("warnings:")[1]
    lif_report = _lif_linear().report()
    assert "warnings:" not in lif_report  # nothing at warning level there


def test_explain_a_traced_weight_names_its_hidden_group(env64):
    graph = _lif_linear()
    text = graph.explain("layers.0.weight")
    assert "traced" in text and "(layers.1.V)" in text and "etp_mm" in text
    assert graph.explain(("layers", 0, "weight")) == text
    assert "non-temporal" in graph.explain("layers.2.weight")


def test_explain_the_gru_reset_gate_says_weight_to_weight(env64):
    graph = ef.compile_graph(gru(), jnp.ones((B, I)))
    assert "weight-to-weight" in graph.explain("W_r.weight")
    assert "(h)" in graph.explain("W_z.weight")


def test_explain_an_unknown_path_raises_key_error_listing_the_weights(env64):
    graph = ef.compile_graph(lstm(), jnp.ones((B, I)))
    with pytest.raises(KeyError) as info:
        graph.explain("nope")
    message = str(info.value)
    assert "nope" in message
    for name in ("W_i.weight", "W_f.weight", "W_g.weight", "W_o.weight"):
        assert name in message


def test_lookups_by_weight_path(env64):
    graph = _lif_linear()
    assert graph.weight_paths == (("layers", 0, "weight"), ("layers", 2, "weight"))
    assert graph.relations_of("layers.0.weight") == graph.relations
    assert graph.relations_of(("layers", 2, "weight")) == ()
    assert [d.kind.name for d in graph.diagnostics_of("layers.2.weight")] == ["EXCLUDED_NON_TEMPORAL"]


def test_the_graph_and_its_parts_are_immutable(env64):
    graph = _lif_linear()
    with pytest.raises(dataclasses.FrozenInstanceError):
        graph.relations = ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        graph.module.states = ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        graph.hidden_groups[0].paths = ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        graph.relations[0].hidden_groups = ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        graph.module.states[0].kind = "hidden"
    assert isinstance(graph.relations, tuple) and isinstance(graph.hidden_groups, tuple)
    assert isinstance(graph.diagnostics, tuple) and isinstance(graph.module.states, tuple)

"""Diagnostics (etrace_fit/compiler/diagnostics.py): the kinds docs/theory.md §4.5 asks for,
their levels, and that compiling records instead of warning."""

from __future__ import annotations

import dataclasses
import warnings

import brainstate
import jax.numpy as jnp
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.compiler import Diagnostic, DiagnosticKind, Level, format_path

from ._helpers import B, I, N, alif_net, gru, linear, lstm

# docs/theory.md §4.5: "relation included; excluded: no param state, non-temporal, shape
# mismatch, weight-to-weight; partial path; primitive inside control flow; primitive
# inside nested jit; multi-output primitive; ambiguous pytree leaf; state mismatch;
# param written in step".
REQUIRED = {
    "RELATION_INCLUDED": "relation included",
    "EXCLUDED_NO_PARAM_STATE": "excluded: no param state",
    "EXCLUDED_NON_TEMPORAL": "excluded: non-temporal",
    "EXCLUDED_SHAPE_MISMATCH": "excluded: shape mismatch",
    "EXCLUDED_WEIGHT_TO_WEIGHT": "excluded: weight-to-weight",
    "PARTIAL_PATH": "partial path",
    "IN_CONTROL_FLOW": "primitive inside control flow",
    "IN_NESTED_JIT": "primitive inside nested jit",
    "MULTI_OUTPUT_PRIMITIVE": "multi-output primitive",
    "AMBIGUOUS_PYTREE_LEAF": "ambiguous pytree leaf",
    "STATE_MISMATCH": "state mismatch",
    "PARAM_WRITTEN_IN_STEP": "param written in step",
}


@pytest.mark.parametrize("name", list(REQUIRED))
def test_design_kinds_exist_with_a_label_and_a_level(name):
    kind = DiagnosticKind[name]
    assert kind.label == REQUIRED[name]
    assert isinstance(kind.default_level, Level)


def test_default_levels_follow_what_the_kind_means():
    assert DiagnosticKind.RELATION_INCLUDED.default_level is Level.INFO
    assert DiagnosticKind.IN_NESTED_JIT.default_level is Level.INFO
    assert DiagnosticKind.EXCLUDED_NON_TEMPORAL.default_level is Level.INFO  # its gradient is exact
    for name in ("EXCLUDED_WEIGHT_TO_WEIGHT", "EXCLUDED_SHAPE_MISMATCH", "PARTIAL_PATH", "IN_CONTROL_FLOW",
                 "NOT_TRACED", "NON_ELEMENTWISE_COUPLING"):
        assert DiagnosticKind[name].default_level is Level.WARNING, name
    assert DiagnosticKind.STATE_MISMATCH.default_level is Level.ERROR
    assert DiagnosticKind.PARAM_WRITTEN_IN_STEP.default_level is Level.ERROR
    assert Level.INFO < Level.WARNING < Level.ERROR


def test_a_record_takes_its_kinds_level_unless_given_one_and_is_immutable():
    record = Diagnostic(DiagnosticKind.EXCLUDED_WEIGHT_TO_WEIGHT, "reaches h only through W_h",
                        weight_path=("W_r", "weight"), primitive="etp_mm")
    assert record.level is Level.WARNING
    assert str(record) == "warning: excluded: weight-to-weight [W_r.weight]: reaches h only through W_h"
    assert Diagnostic(DiagnosticKind.STATE_MISMATCH, "m", level=Level.WARNING).level is Level.WARNING
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.message = "other"


def test_format_path():
    assert format_path(("layers", 0, "weight")) == "layers.0.weight"
    assert format_path(None) == "-"
    assert format_path("W_r.weight") == "W_r.weight"


def _models():
    model = L.Sequential(linear(0, I, N), L.LIF(N), linear(1, N, 2))
    brainstate.nn.init_all_states(model, batch_size=B)
    return [model, alif_net(learn_tau=True), gru(), lstm()]


def test_compiling_emits_no_python_warnings(env64):
    models = _models()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for model in models:
            graph = ef.compile_graph(model, jnp.ones((B, I)))
            graph.report()
            for path in graph.weight_paths:
                graph.explain(path)
    assert [str(w.message) for w in caught] == []


def test_every_record_of_a_compilation_is_kept_on_the_graph(env64):
    graph = ef.compile_graph(gru(), jnp.ones((B, I)))
    kinds = [d.kind for d in graph.diagnostics]
    assert kinds.count(DiagnosticKind.RELATION_INCLUDED) == 2
    assert kinds.count(DiagnosticKind.EXCLUDED_WEIGHT_TO_WEIGHT) == 1
    assert all(isinstance(d, Diagnostic) for d in graph.diagnostics)

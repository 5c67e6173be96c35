"""The online rules run the model's matmuls once per step, as BPTT does.

The first engine re-derived what the compiler already held: the LSTM's scan body ran
16 weight matmuls where the forward pass needs 5. The step program runs the model once
and the rules consume what it returns. This checks the *compiled* program (after XLA's
own common-subexpression elimination): every matrix product shaped like one of the
model's (a forward gate ``(B, H)``, the readout ``(B, O)``, a cotangent back to the
gate's input) occurs no more often than in BPTT's program. A gate's cotangent is
computed for the columns of ``[x, h]`` that need one only, ``(B, H)``: BPTT computes
all ``(B, I + H)`` and drops the ``x`` columns.
"""

from __future__ import annotations

import collections
import re
import warnings

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import etrace_fit as ef
from etrace_fit import layers

B, I, H, O, T = 4, 6, 9, 3, 5  # distinct sizes, so a product's shape says what it is
_DOT = re.compile(r"= (\w+)\[([\d,]*)\]\S* (?:dot|convolution)\([^\n]*?op_name=\"([^\"]*)\"")


def _model(cell):
    model = ef.Sequential(cell(I, H), layers.Linear(H, O))
    brainstate.nn.init_all_states(model, batch_size=B)
    return model


def _loss(out, y):
    return jnp.mean((out - y) ** 2)


def compiled_text(cell, algo: str) -> str:
    """The optimised HLO of ``cell``'s training program under ``algo``."""
    model = _model(cell)
    rng = np.random.default_rng(0)
    xs = jnp.asarray(rng.normal(size=(T, B, I)), jnp.float32)
    ys = jnp.asarray(rng.normal(size=(T, B, O)), jnp.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        learner = ef.compile(model, xs[0], _loss, algo=algo)
    compiled = learner.compiled(xs, ys)
    args = (compiled.weight_leaves(), compiled.state_leaves(), [xs], ys)
    return compiled.run.lower(*args).compile().as_text()


def matmul_shapes(cell, algo: str) -> collections.Counter:
    """How many matrix products of each output shape the compiled program runs, keyed
    ``(direction, shape)``: ``"back"`` for a pull-back's (JAX names it ``transpose(…)``),
    else ``"fwd"``."""
    text = compiled_text(cell, algo)
    return collections.Counter(("back" if "transpose(" in name else "fwd", tuple(int(d) for d in dims.split(",")))
                               for _, dims, name in _DOT.findall(text))


@pytest.mark.parametrize("cell", [layers.LSTMCell, layers.GRUCell], ids=["lstm", "gru"])
@pytest.mark.parametrize("algo", ["d_rtrl", "esd_rtrl"])
def test_online_program_runs_each_model_matmul_no_more_often_than_bptt(cell, algo):
    online, bptt = matmul_shapes(cell, algo), matmul_shapes(cell, "bptt")
    gates = 4 if cell is layers.LSTMCell else 3
    assert bptt["fwd", (B, H)] >= gates and bptt["back", (B, I + H)] >= gates, (
        f"the parser found no gate matmuls in BPTT's program: {dict(bptt)}")
    for key in (("fwd", (B, H)), ("fwd", (B, O))):
        assert online[key] <= bptt[key], f"{algo} runs {online[key]} matmuls {key}, BPTT {bptt[key]}: {dict(online)}"
    # the pull-back: a cotangent per gate and one from the readout, only the h columns
    assert online["back", (B, I + H)] == 0, dict(online)
    assert online["back", (B, H)] <= gates + 1 <= bptt["back", (B, H)] + bptt["back", (B, I + H)], dict(online)


def test_lstm_forward_runs_its_five_weight_matmuls_once():
    """The issue's count: four gates and the readout, each once per step."""
    online = matmul_shapes(layers.LSTMCell, "d_rtrl")
    assert online["fwd", (B, H)] + online["fwd", (B, O)] <= 5


def test_untraced_dense_ops_leave_their_weight_gradient_to_one_gemm_per_chunk():
    """GRU's W_r (one-step gradient only) and the readout are traced by no pair: the
    step's pull-back returns their input and ``δy`` instead of a per-step weight
    gradient (which would be a GEMM over only B rows each step); the chunk contracts
    them once. Their values are checked against references in test_approximations
    (W_r, plain-jnp GRU) and test_chunked (the readout, BPTT)."""
    from etrace_fit.algorithms.online import build_step_program

    model = _model(layers.GRUCell)
    x = jnp.zeros((B, I))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph, plan = ef.algorithms.plan_for(model, x[None], jnp.zeros((1, B, O)), _loss, algo="d_rtrl")
    program = build_step_program(graph, plan.pairs, _loss, jnp.float32)
    eqns = graph.module.jaxpr.eqns
    weight_shapes = sorted(tuple(eqns[i].invars[1].aval.shape) for i in program.deferred)
    assert weight_shapes == sorted([(I + H, H), (H, O)]), weight_shapes  # W_r on [x, h], the readout
    module = graph.module
    weights = [leaf for s in module.weights for leaf in jax.tree.leaves(s.state.value)]
    rng = np.random.default_rng(1)
    out = program.signals(weights, program.others(module.state_leaves()), [jnp.asarray(rng.normal(size=(B, I)))],
                          jnp.asarray(rng.normal(size=(B, O))))
    weight_grads, one_step = out[3], out[5]
    paths = [path for s in module.weights for path in [s.path] * len(jax.tree.leaves(s.state.value))]
    for path, grad in zip(paths, weight_grads):
        if "W_r" in path or path[:2] == ("layers", 1):
            assert not np.any(np.asarray(grad)), f"{path} got a per-step weight gradient"
    assert [tuple(x.shape) for x, _ in one_step] and all(x.shape[0] == B and dy.shape[0] == B for x, dy in one_step)
    assert any(np.any(np.asarray(dy)) for _, dy in one_step)


@pytest.mark.parametrize("cell, inputs", [(layers.LSTMCell, 1), (layers.GRUCell, 2)], ids=["lstm", "gru"])
def test_gates_on_one_input_stack_one_x_per_step(cell, inputs):
    """D-RTRL's chunk reads each pair's input ``X = [x, h, 1]``; the gates that share one
    input (an LSTM's four, a GRU's z and r; its candidate reads ``[x, r h]``) have it
    stacked once per step and transposed once per chunk, not once per gate (LSTM(64 →
    128): 1.50 → 1.27× BPTT's time). Counted in the compiled program: the writes of a
    ``(C, B, I + H + 1)`` buffer."""
    text = compiled_text(cell, "d_rtrl")
    writes = [line for line in text.splitlines()
              if re.search(rf"= f32\[{T},{B},{I + H + 1}\]\S* dynamic-update-slice\(", line)]
    assert len(writes) == inputs, writes

"""The online programs' arithmetic per time step, counted in their compiled HLO
(``benchmarks/work.py``) against what each rule's math needs: the engine's
structure (docs/theory.md §5.9) checked without a clock.

``Linear(I, H) → LIF(H) → Linear(H, O)`` and ``GRUCell(I, H) → Linear(H, O)`` with
batch ``B``: BPTT's per-step products are the forward pass, the pull-back and one
weight gradient per dense op over ``B`` rows. The online rules must keep the forward
pass and the pull-back per step and do their weight-gradient products once per chunk
over ``C·B`` rows, and a dense op on the inputs alone (the LIF net's input product) once
per chunk as well; steps without a loss skip the pull-back.
"""

import pathlib
import sys

import brainstate
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import speed  # noqa: E402
import work  # noqa: E402

import etrace_fit as ef  # noqa: E402
from etrace_fit import layers  # noqa: E402
from etrace_fit.algorithms.online import DEFAULT_CHUNK  # noqa: E402

I, O = speed.I, speed.O
B, H, T = 4, 32, 20


@pytest.fixture(autouse=True)
def _dt():
    with brainstate.environ.context(dt=1.0):
        yield


def _work(name: str, rule: str, loss: str):
    model = speed.build(name, H, B)
    xs, ys = speed.data(name, B, T, loss)
    return work.rule_work(model, rule, xs, ys, loss, batch=B)


def test_bptt_does_the_forward_pass_the_pull_back_and_per_step_weight_gradients():
    """The counter's anchor, on jax.grad over lax.scan: per step the input and readout
    products, the readout's pull-back (no cotangent of the data) and both weights'
    gradients over B rows, all thin."""
    counts = _work("lif", "bptt", "all")
    assert counts["thin"] == 2 * B * I * H + 3 * B * H * O
    assert counts["inner"] == B * I * H + B * H * O  # the weight gradients, Xᵀ δ over B rows
    assert counts["rows"] == B * I * H + 2 * B * H * O  # input and readout products, the readout's pull-back
    assert counts["batched"] == 0


@pytest.mark.parametrize("rule", ["esd_rtrl", "d_rtrl"])
def test_online_weight_gradients_are_one_product_per_chunk_not_per_step(rule):
    """Per step only the readout's product and its pull-back are thin products; the input
    product (it reads the inputs alone) and the input weight's gradient (and ES-D-RTRL's
    one-step part) are GEMMs over the chunk's C·B rows. A per-step input product or
    weight-gradient product would add B·I·H thin multiply-adds a step."""
    counts = _work("lif", rule, "all")
    readout_and_pull_back = B * H * O + B * H * O
    assert readout_and_pull_back <= counts["thin"] < readout_and_pull_back + B * I * H / 4
    # no weight gradient over a step's B rows: only ES-D-RTRL's last row, once per chunk (here one
    # chunk of T steps), e_Cᵀ δy_{C-1} over the input and the bias column (docs/theory.md §5.9)
    assert counts["inner"] == (B * (I + 1) * H / T if rule == "esd_rtrl" else 0)
    assert counts["batched"] >= 2 * B * I * H  # the input product and its weight's gradient, batched


@pytest.mark.parametrize("rule", ["esd_rtrl", "d_rtrl"])
def test_steps_without_loss_skip_the_pull_back(rule):
    """Loss at the last step only: the steps before it advance the traces on their input
    products, one GEMM over their chunk; the last step runs alone with its input product,
    the readout, its pull-back and the gradients. A pull-back at every step would add
    B·H·O a step (T·B·H·O in all)."""
    counts = _work("lif", rule, "last")
    extra = counts["thin"] * T - B * I * H  # what the last step does beyond its input product
    one_step_with_loss = B * I * H + 4 * B * H * O + B * (I + 1) * H
    assert 0 < extra <= one_step_with_loss
    # the T - 1 input products, and no chunk GEMM over rows that are zero but at one step
    assert counts["batched"] * T == (T - 1) * B * I * H


def test_the_gru_pull_back_computes_only_the_recurrent_rows_cotangent():
    """ES-D-RTRL's learning signal ∂L^t/∂h^{t-1} needs the gates' cotangents through
    their recurrent rows only (H×H per gate); BPTT's backward step also takes the input
    rows' (I×H per gate), which the online step must not compute (3·B·I·H a step)."""
    counts = _work("gru", "esd_rtrl", "all")
    forward = 3 * B * (I + H) * H + B * H * O
    pull_back = 3 * B * H * H + B * H * O
    assert forward + pull_back <= counts["thin"] < forward + pull_back + B * I * H
    bptt = _work("gru", "bptt", "all")
    assert bptt["thin"] == 3 * forward  # forward, pull-back with the input rows, weight gradients


@pytest.mark.parametrize("name", ["lif", "rlif", "gru"])
@pytest.mark.parametrize("rule", ["esd_rtrl", "d_rtrl"])
def test_the_pull_back_reads_every_weight_row_major(name, rule):
    """The step's pull-back ``δy @ Wᵀ`` (the readout's, a gate's recurrent rows) reads
    a transpose of the weight made once per sequence: no product in the online program
    contracts a weight along its minor dimension, which XLA on CPU runs ~1.5× slower at
    these sizes. BPTT's readout pull-back does (``B·H·O`` a step), which shows the
    counter sees such products."""
    assert _work(name, rule, "all")["folded"] == 0
    if name == "lif":
        assert _work(name, "bptt", "all")["folded"] == B * H * O


@pytest.mark.parametrize("name", ["lif", "gru"])
@pytest.mark.parametrize("rule", ["esd_rtrl", "d_rtrl"])
def test_a_sequence_of_several_chunks_fills_its_stacked_buffers_once(name, rule):
    """The step loop's stacked outputs (ES-D-RTRL's rows, D-RTRL's signals, the deferred
    ops' rows) are written into buffers the chunks hand on to one another: over four
    chunks the bytes filled and copied per step are fewer than over one. XLA's own
    stacked outputs of a scan inside the loop over chunks were zero-filled once and
    copied for each chunk, so four chunks wrote more per step than one (ES-D-RTRL on the
    LIF net 4.4 kB a step against 3.4 kB at one chunk; with the carried buffers 2.7 kB)."""
    model = speed.build(name, H, B)
    chunk = DEFAULT_CHUNK  # T = C runs as one chunk, T = 4C as four
    filled = {}
    for length in (chunk, 4 * chunk):
        xs, ys = speed.data(name, B, length, "all")
        filled[length] = work.rule_work(model, rule, xs, ys, "all", batch=B)["filled"]
    assert filled[4 * chunk] < filled[chunk]


def test_a_trace_advanced_in_the_step_loop_is_written_in_place():
    """D-RTRL's small trace of a leaky readout's weight, ``(B, 1, 1, H + 1, O)`` (one
    position, one state), advances inside the step loop on steps without a loss (the
    demo's shape). The loop carries it without its unit axes: carried with them, XLA
    laid it out with those axes first and copied it at every step before the fused
    update could write it (the demo: 51 kB a step). No copy of its size runs in a loop."""
    rng = np.random.default_rng(0)
    w = (rng.normal(0, 1.3 / np.sqrt(I), (I, H))).astype(np.float32)
    model = ef.Sequential(layers.Linear(I, H, w_init=w), layers.LIF(H, tau=10.0),
                          layers.LeakyRateReadout(H, O, tau=5.0))
    brainstate.nn.init_all_states(model, batch_size=B)
    xs, ys = speed.data("lif", B, T, "last")
    compiled = speed.compile_rule(model, "d_rtrl", xs, ys, "last")[0]
    computations, _ = work.parse(compiled.as_text())
    bodies = [rest.split("body=%", 1)[1].split(",", 1)[0] for instructions in computations.values()
              for _, _, opcode, rest in instructions if opcode == "while"]
    assert bodies
    trace = B * (H + 1) * O * 4  # float32 bytes
    copies = [(body, type_) for body in bodies for _, type_, opcode, _ in computations[body]
              if opcode == "copy" and work._bytes(type_) == trace]
    assert copies == []

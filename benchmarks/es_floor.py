"""Where ES-D-RTRL's time goes: its program against the same program without its
weight-gradient GEMMs, and BPTT, interleaved in one process.

    python benchmarks/es_floor.py [--models lif gru] [--loss all last] [--repeats 21]

For each model of ``speed.py`` (H = 128, B = 16, T = 200, the issue's target size) it
compiles four whole-sequence gradients: ``bptt``; ``esd_rtrl``; ``no_rule_gemm``, which
is ``esd_rtrl`` with ``ESDRTRL.finish_rows`` replaced by a stand-in that reads its rows
once and does no GEMM (the rule's GEMMs per chunk, ``Eᵀ R`` over the chunk's rows of
``ε_x`` and signals and the last step's ``ε_xᵀ dY``, gone); and ``loop_only``, which
also replaces the deferred ops' per-chunk GEMMs (the readout's ``X^T δy``) by such a
stand-in. Their gradients are wrong; only their time
matters. ``loop_only`` is the step loop: the forward pass, the pull-back for the
learning signal ``∂L^t/∂h^{t−1}`` (docs/theory.md §5.8), ``D``, ``Df``, ε_f advanced in
the loop and the rows stacked. The GEMMs removed have the FLOPs of BPTT's
weight-gradient GEMMs (2·T·B·K·O per weight), so no implementation of the rule gets
under ``loop_only`` plus what those FLOPs cost. Prints medians of wall time as ratios
to BPTT.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

import brainstate
import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import speed  # noqa: E402

from etrace_fit.algorithms import online  # noqa: E402
from etrace_fit.algorithms.esd_rtrl import ESDRTRL  # noqa: E402
from etrace_fit.ops import etp_op_info  # noqa: E402


def _no_rule_gemm(self, inner, rows):
    """Reads the rows once, no GEMM: the gradient is wrong."""
    E, R = rows
    touched = E.sum() + R.sum()
    return jnp.zeros((E.shape[-1], R.shape[-1]), E.dtype) + touched, tuple(inner[:2])


def _no_deferred_gemm(eqn, xs, cotangents, dtype, merge=True):
    """The deferred op's gradient replaced by zeros that read its rows once."""
    _, trainables = etp_op_info(eqn.primitive).split_operands(list(eqn.invars))
    touched = (xs.sum() + cotangents.sum()).astype(dtype)
    return {key: jnp.zeros(var.aval.shape, dtype) + touched for key, var in trainables.items()}


def measure(name: str, loss: str, repeats: int) -> dict[str, float]:
    model = speed.build(name, 128, 16)
    xs, ys = speed.data(name, 16, 200, loss)
    programs = {rule: speed.compile_rule(model, rule, xs, ys, loss) for rule in ("bptt", "esd_rtrl")}
    finish, deferred = ESDRTRL.finish_rows, online.deferred_gradients
    try:
        ESDRTRL.finish_rows = _no_rule_gemm
        programs["no_rule_gemm"] = speed.compile_rule(model, "esd_rtrl", xs, ys, loss)
        online.deferred_gradients = _no_deferred_gemm
        programs["loop_only"] = speed.compile_rule(model, "esd_rtrl", xs, ys, loss)
    finally:
        ESDRTRL.finish_rows, online.deferred_gradients = finish, deferred
    for compiled, args, _, _ in programs.values():
        jax.block_until_ready(compiled(*args))
    wall = {key: [] for key in programs}
    for _ in range(repeats):
        for key, (compiled, args, _, _) in programs.items():
            wall[key].append(speed.timed(compiled, args)[1])
    base = statistics.median(wall["bptt"])
    return {key: statistics.median(times) / base for key, times in wall.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["lif", "gru"], choices=list(speed.MODELS))
    parser.add_argument("--loss", nargs="+", default=["all", "last"], choices=["all", "last"])
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    brainstate.environ.set(dt=1.0)
    print("| model | loss | esd_rtrl / bptt | no_rule_gemm / bptt | loop_only / bptt |")
    print("|---|---|---|---|---|")
    for name in args.models:
        for loss in args.loss:
            ratios = measure(name, loss, args.repeats)
            print(f"| {name} | {loss} | {ratios['esd_rtrl']:.2f} | {ratios['no_rule_gemm']:.2f} "
                  f"| {ratios['loop_only']:.2f} |", flush=True)


if __name__ == "__main__":
    main()

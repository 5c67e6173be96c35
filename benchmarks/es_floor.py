"""How fast ES-D-RTRL could be with the per-step learning signal: its program against
the same program with the rule's own work removed, and BPTT, interleaved in one process.

    python benchmarks/es_floor.py [--models lif gru] [--loss all last] [--repeats 21]

For each model of ``speed.py`` (H = 128, B = 16, T = 200, the issue's target size) it
compiles three whole-sequence gradients: ``bptt``, ``esd_rtrl``, and ``floor``, which is
``esd_rtrl`` with ``ESDRTRL.chunk`` replaced by a stand-in that reads the chunk's
stacked signals once and runs no loop (its gradient is wrong; only its time matters).
What is left in ``floor`` is the step program: the forward pass, the pull-back of the
step loss for ``∂L^t/∂h^{t−1}`` (docs/theory.md §5.8), ``D`` and ``Df``, and the
one-step GEMMs. No implementation of the rule can make ES-D-RTRL faster than ``floor``
without changing the learning signal, so ``floor / bptt`` bounds the ratio from below.
Prints medians of wall time as ratios to BPTT.
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

from etrace_fit.algorithms.esd_rtrl import ESDRTRL  # noqa: E402


def _no_rule_work(self, traces, signals, t0):
    """Reads every stacked signal once, no loop: the cost floor of any ``chunk``."""
    X, D, Df, G, dY = signals[:5]
    eps_x, eps_f = traces
    new_f = eps_f + D.sum(axis=(0, -1)) + Df.sum(0)
    new_x = eps_x + X.sum(0)
    if G is None:
        return None, (new_x, new_f)
    return jnp.einsum("cbpk,cbpo->ko", X, (dY + G.sum(-1)).astype(X.dtype)), (new_x, new_f)


def measure(name: str, loss: str, repeats: int) -> dict[str, float]:
    model = speed.build(name, 128, 16)
    xs, ys = speed.data(name, 16, 200, loss)
    programs = {rule: speed.compile_rule(model, rule, xs, ys, loss) for rule in ("bptt", "esd_rtrl")}
    original = ESDRTRL.chunk
    ESDRTRL.chunk = _no_rule_work
    try:
        programs["floor"] = speed.compile_rule(model, "esd_rtrl", xs, ys, loss)
    finally:
        ESDRTRL.chunk = original
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
    print("| model | loss | esd_rtrl / bptt | floor / bptt |")
    print("|---|---|---|---|")
    for name in args.models:
        for loss in args.loss:
            ratios = measure(name, loss, args.repeats)
            print(f"| {name} | {loss} | {ratios['esd_rtrl']:.2f} | {ratios['floor']:.2f} |", flush=True)


if __name__ == "__main__":
    main()

"""Per-sequence time and XLA memory of bptt, d_rtrl, esd_rtrl and hybrid, side by side.

    python benchmarks/rules.py [--lengths 50 100 200 400 800] [--repeats 3] [--models gru lif]

Models (B=16, I=64, H=128, 10 outputs): a GRU cell with a linear readout, and a
Linear → LIF → Linear spiking network. For every T and rule it prints the median wall
time of one ``sequence_grad`` call (compiled beforehand), the XLA temp bytes of the
compiled program (``compiled.memory_analysis()``), and both as ratios to BPTT at the
same T. Results go to stdout as a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import brainstate
import jax
import jax.numpy as jnp
import numpy as np

import etrace_fit as ef
from etrace_fit import layers
from etrace_fit.algorithms.sequence import _prepare

B, I, H, O = 16, 64, 128, 10
RULES = ("bptt", "d_rtrl", "esd_rtrl", "hybrid")


def build(name: str):
    rng = np.random.default_rng(0)
    if name == "gru":
        model = ef.Sequential(layers.GRUCell(I, H), layers.Linear(H, O))
    else:
        model = ef.Sequential(
            layers.Linear(I, H, w_init=rng.normal(0, 2.0 / np.sqrt(I), (I, H)).astype(np.float32)),
            layers.LIF(H, tau=10.0), layers.Linear(H, O),
        )
    brainstate.nn.init_all_states(model, batch_size=B)
    return model


def loss(out, y):
    return jnp.mean((out - y) ** 2)


def measure(model, rule: str, length: int, repeats: int) -> tuple[float, int]:
    rng = np.random.default_rng(1)
    xs = jnp.asarray(rng.random((length, B, I)) < 0.2, jnp.float32)
    ys = jnp.asarray(rng.normal(size=(length, B, O)), jnp.float32)
    graph, _, runner, _ = _prepare(model, xs, ys, loss, rule, None, None, None)
    module = graph.module
    weights = [leaf for s in module.weights for leaf in jax.tree.leaves(s.state.value)]
    states = module.state_leaves()
    args = (weights, states, [xs], ys)
    compiled = runner.lower(*args).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times), temp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[50, 100, 200, 400, 800])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=["gru", "lif"])
    args = parser.parse_args()
    brainstate.environ.set(dt=1.0)
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}, B={B} I={I} H={H} O={O}")
    for name in args.models:
        model = build(name)
        print(f"\n### {name}\n")
        print("| T | rule | time (ms) | time / bptt | temp (KiB) | temp / bptt |")
        print("|---|---|---|---|---|---|")
        first_temp = {}
        for length in args.lengths:
            results = {rule: measure(model, rule, length, args.repeats) for rule in RULES}
            base_time, base_temp = results["bptt"]
            for rule, (seconds, temp) in results.items():
                first_temp.setdefault(rule, temp)
                print(f"| {length} | {rule} | {seconds * 1e3:.1f} | {seconds / base_time:.2f} | "
                      f"{temp / 1024:.0f} | {temp / max(base_temp, 1):.3f} |", flush=True)
        print()
        for rule in RULES:
            _, last = measure(model, rule, args.lengths[-1], 1)
            print(f"{name} {rule}: temp T={args.lengths[-1]} / T={args.lengths[0]} = {last / max(first_temp[rule], 1):.3f}")


if __name__ == "__main__":
    main()

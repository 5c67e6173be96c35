"""Time ``compile_graph`` on a 3-layer, 512-unit ALIF network (CPU).

    python benchmarks/compile_time.py [--units 512] [--batch 32] [--repeats 5]

Prints the first compile (includes JAX's one-off tracing caches) and the median of
the following ones, plus the number of relations found.
"""

from __future__ import annotations

import argparse
import statistics
import time

import brainstate
import jax.numpy as jnp

import etrace_fit as ef
from etrace_fit import layers


def build(units: int, inputs: int = 100, outputs: int = 10):
    return ef.Sequential(
        layers.Linear(inputs, units), layers.ALIF(units),
        layers.Linear(units, units), layers.ALIF(units),
        layers.Linear(units, units), layers.ALIF(units),
        layers.Linear(units, outputs),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=512)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    brainstate.environ.set(dt=1.0)
    times = []
    for _ in range(args.repeats + 1):
        model = build(args.units)  # a new model each time: nothing cached on it
        brainstate.nn.init_all_states(model, batch_size=args.batch)
        start = time.perf_counter()
        graph = ef.compile_graph(model, jnp.zeros((args.batch, 100)))
        times.append(time.perf_counter() - start)
    print(f"3-layer ALIF, {args.units} units, batch {args.batch}: {len(graph.relations)} relations, "
          f"{len(graph.hidden_groups)} groups")
    print(f"compile_graph: first {times[0]:.3f} s, median of next {args.repeats} {statistics.median(times[1:]):.3f} s")


if __name__ == "__main__":
    main()

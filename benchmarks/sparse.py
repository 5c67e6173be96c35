"""Memory and time of D-RTRL on a SparseLinear against the same Linear without a mask.

    python benchmarks/sparse.py [--size 1000] [--density 0.1 0.3] [--batch 16] [--length 64] [--repeats 5]

Model: ``SparseLinear(n, n, density) → LIF(n) → Linear(n, 2)`` (float32), against
``Linear(n, n)`` in its place; a squared-error loss at every step; one jitted
whole-sequence D-RTRL gradient each (``sequence._prepare``, as ``speed.py``). Reports the
trace bytes of the plan, XLA's temp bytes (``compiled.memory_analysis()``), and the
medians of wall and CPU time over ``--repeats`` rounds run interleaved (dense, sparse,
dense, ...) as ratios to the dense program; the peak RSS of the process at the end.
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
import warnings

import brainstate
import jax
import jax.numpy as jnp

import etrace_fit as ef
from etrace_fit import layers
from etrace_fit.algorithms.sequence import _prepare

MiB = 2 ** 20


def compiled_program(first, size: int, batch: int, length: int):
    model = ef.Sequential(first, layers.LIF(size, tau=5.0), layers.Linear(size, 2))
    brainstate.nn.init_all_states(model, batch_size=batch)
    xs = (jax.random.uniform(jax.random.PRNGKey(0), (length, batch, size)) < 0.1).astype(jnp.float32)
    ys = jnp.zeros((length, batch, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph, plan, _, program = _prepare(model, xs, ys, lambda o, y: jnp.sum((o - y) ** 2), "d_rtrl",
                                           None, None, None)
    weights = [leaf for s in graph.module.weights for leaf in jax.tree.leaves(s.state.value)]
    args = (weights, graph.module.state_leaves(), [xs], ys)
    compiled = jax.jit(lambda w, s, x, y: program.run(w, s, x, y)).lower(*args).compile()
    return compiled, args, plan.trace_bytes(batch)[0], compiled.memory_analysis().temp_size_in_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--density", type=float, nargs="+", default=[0.1, 0.3])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    brainstate.environ.set(dt=1.0)
    n = args.size
    programs = {"dense": compiled_program(layers.Linear(n, n), n, args.batch, args.length)}
    for density in args.density:
        programs[f"sparse {density:g}"] = compiled_program(layers.SparseLinear(n, n, density=density), n,
                                                           args.batch, args.length)
    for compiled, call_args, _, _ in programs.values():
        jax.block_until_ready(compiled(*call_args))  # warm-up
    wall = {name: [] for name in programs}
    cpu = {name: [] for name in programs}
    for _ in range(args.repeats):
        for name, (compiled, call_args, _, _) in programs.items():
            c0, w0 = time.process_time(), time.perf_counter()
            jax.block_until_ready(compiled(*call_args))
            cpu[name].append(time.process_time() - c0)
            wall[name].append(time.perf_counter() - w0)
    base_wall, base_cpu = statistics.median(wall["dense"]), statistics.median(cpu["dense"])
    base_trace, base_temp = programs["dense"][2], programs["dense"][3]
    print(f"D-RTRL, ({n} → LIF({n}) → 2), B = {args.batch}, T = {args.length}, float32, {args.repeats} rounds\n")
    print("| first layer | trace MiB | temp MiB | trace / dense | temp / dense | wall ms | wall / dense | cpu / dense |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (_, _, trace, temp) in programs.items():
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(f"| {name} | {trace / MiB:.1f} | {temp / MiB:.1f} | {trace / base_trace:.3f} | {temp / base_temp:.3f} "
              f"| {w * 1e3:.1f} | {w / base_wall:.2f} | {c / base_cpu:.2f} |")
    print(f"\npeak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()

"""The demo's training step per batch and its compilation, rules side by side in one process.

    python benchmarks/demo_step.py [--task evidence] [--algos hybrid esd_rtrl bptt] [--calls 20] [--rounds 7]

``benchmarks/demo.py`` times whole ``etrace-fit train`` runs, where a batch's step and
the step's compilation both count; this script tells them apart. For each algo it
builds the task's model and a Trainer as ``etrace-fit train`` does (``loss_on`` the
task's, batch size the task's), runs one epoch over two batches (which compiles the
step), then lowers and compiles that step once more from a cleared cache (the
compilation a fresh run pays; HLO instructions counted). Then ``--rounds`` rounds, algos
alternated (A B A B), each calling the Trainer's own jitted step ``--calls`` times on one
batch with no host work between calls (as ``benchmarks/trainer_overhead.py``'s "bare").
The table: medians per batch of wall and CPU time (``time.process_time``, all threads),
their ratios to the last algo, the page faults per batch (the process's minor faults:
a step whose temp memory the allocator maps anew at every call touches fresh pages, so
its time depends on the allocator's settings, e.g. glibc's ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` in the environment), the seconds to trace and lower the step
("lower") and to compile it, its HLO instructions after optimisation and its XLA temp
memory (``compiled.memory_analysis()``).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
import warnings

import brainstate
import jax
import numpy as np
import optax

import etrace_fit as ef
from etrace_fit.cli import TASKS
from etrace_fit.training.data import batches


def build(task, algo: str):
    """The Trainer's jitted step for one batch of ``task`` under ``algo``, ready to call:
    ``(step, state, xs, ys, weight)``, and the step's ``(lower s, compile s, HLO ops, temp MiB)``."""
    data = task.make_data("train", 2 * task.batch_size, 0, None)
    x, y = np.asarray(data[0]), np.asarray(data[1])
    mask = np.asarray(data[2]) if len(data) > 2 and data[2] is not None else None
    brainstate.random.seed(0)
    trainer = ef.Trainer(task.make_model(), algo=algo, optimizer=optax.adam(task.learning_rate),
                         loss=task.loss, loss_on=task.loss_on, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(x, y, batch_size=task.batch_size, epochs=1, verbose=0, mask=mask)  # compiles
    first = next(iter(batches(x, y, batch_size=task.batch_size, shuffle=False, mask=mask)))
    xs, ys, weight = trainer._time_major(first)
    _, step, reset = trainer._batch_program(xs, ys, weight)
    state = trainer._state._replace(states=[reset.placeholders[reset.positions.index(n)] if n in reset.positions
                                            else leaf for n, leaf in enumerate(trainer._state.states)])
    jax.clear_caches()
    start = time.perf_counter()
    lowered = step.lower(state, [xs], ys, weight, None, start=True)
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    done = time.perf_counter()
    ops = sum(1 for line in compiled.as_text().splitlines() if line.startswith("  ") and " = " in line)
    temp = compiled.memory_analysis().temp_size_in_bytes / 2**20
    return (step, state, xs, ys, weight), (lowered_at - start, done - lowered_at, ops, temp)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="evidence", choices=sorted(TASKS))
    parser.add_argument("--algos", nargs="+", default=["hybrid", "esd_rtrl", "bptt"])
    parser.add_argument("--calls", type=int, default=20, help="step calls per round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    brainstate.environ.set(dt=1.0)
    task = TASKS[args.task]
    programs, compiles = {}, {}
    for algo in args.algos:
        programs[algo], compiles[algo] = build(task, algo)
    for step, state, xs, ys, weight in programs.values():  # build() cleared the caches: compile again here
        jax.block_until_ready(step(state, [xs], ys, weight, None, start=True))
    times = {algo: [] for algo in args.algos}
    for _ in range(args.rounds):
        for algo, (step, state, xs, ys, weight) in programs.items():
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            cpu, wall = time.process_time(), time.perf_counter()
            current = state
            for _ in range(args.calls):
                current, result = step(current, [xs], ys, weight, None, start=True)
            jax.block_until_ready((current, result))
            times[algo].append(((time.process_time() - cpu) / args.calls * 1e3,
                                (time.perf_counter() - wall) / args.calls * 1e3,
                                (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / args.calls))
    base = args.algos[-1]
    base_cpu = statistics.median(c for c, _, _ in times[base])
    base_wall = statistics.median(w for _, w, _ in times[base])
    print(f"task {task.name}, batch {task.batch_size}, loss_on={task.loss_on!r}, {args.rounds} rounds of "
          f"{args.calls} calls")
    print(f"| algo | wall ms / batch | wall / {base} | cpu ms / batch | cpu / {base} | page faults / batch | "
          "lower s | compile s | HLO ops | temp MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for algo in args.algos:
        cpu = statistics.median(c for c, _, _ in times[algo])
        wall = statistics.median(w for _, w, _ in times[algo])
        faults = statistics.median(f for _, _, f in times[algo])
        lower, compile_, ops, temp = compiles[algo]
        print(f"| {algo} | {wall:.2f} | {wall / base_wall:.2f} | {cpu:.2f} | {cpu / base_cpu:.2f} | {faults:.0f} | "
              f"{lower:.2f} | {compile_:.2f} | {ops} | {temp:.1f} |")


if __name__ == "__main__":
    main()

"""Per-epoch wall time of ``Trainer.fit`` on a built-in task, rules side by side.

    python benchmarks/epoch_time.py [--task evidence] [--algos hybrid bptt] [--epochs 3] [--rounds 2]

For each round, every rule trains a fresh model of the task (``etrace_fit.tasks.TASKS``)
for ``--epochs`` epochs; the first epoch (which compiles) is reported apart, the later
ones give the steady per-epoch time. Rounds interleave the rules so a noisy neighbour
slows them alike; the table reports the median steady epoch and its ratio to the
first rule, plus peak RSS of this process at the end (all rules together).
"""

from __future__ import annotations

import argparse
import math
import resource
import statistics
import time
import warnings

import brainstate
import optax

from etrace_fit import Trainer
from etrace_fit.callbacks import Callback
from etrace_fit.cli import TASKS


class EpochTimes(Callback):
    def __init__(self):
        self.times: list[float] = []

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.times.append(time.perf_counter() - self._start)


def run(task_name: str, algo: str, epochs: int, samples: int | None, seed: int) -> list[float]:
    task = TASKS[task_name]
    brainstate.random.seed(seed)
    samples = samples or task.train_samples
    x, y = task.make_data("train", samples, seed, None)[:2]
    steps = epochs * math.ceil(samples / task.batch_size)
    trainer = Trainer(task.make_model(), algo=algo, optimizer=optax.adam(optax.cosine_decay_schedule(
        task.learning_rate, steps)), memory_budget=task.memory_budget if algo == "hybrid" else None)
    timer = EpochTimes()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        trainer.fit(x, y, batch_size=task.batch_size, epochs=epochs, verbose=0, callbacks=[timer])
    return timer.times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="evidence", choices=sorted(TASKS))
    parser.add_argument("--algos", nargs="+", default=["hybrid", "bptt"])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--samples", type=int, default=None)
    args = parser.parse_args(argv)
    brainstate.environ.set(dt=1.0)
    first: dict[str, list[float]] = {a: [] for a in args.algos}
    steady: dict[str, list[float]] = {a: [] for a in args.algos}
    for round_ in range(args.rounds):
        for algo in args.algos:
            times = run(args.task, algo, args.epochs, args.samples, seed=round_)
            first[algo].append(times[0])
            steady[algo].extend(times[1:])
    base = statistics.median(steady[args.algos[0]])
    print(f"task {args.task}, {args.epochs} epochs x {args.rounds} rounds")
    print("| algo | first epoch (s, compiles) | steady epoch (s, median) | ratio to " + args.algos[0] + " |")
    print("|---|---|---|---|")
    for algo in args.algos:
        median = statistics.median(steady[algo])
        print(f"| {algo} | {statistics.median(first[algo]):.2f} | {median:.2f} | {median / base:.2f} |")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of the process: {peak:.0f} MiB")


if __name__ == "__main__":
    main()

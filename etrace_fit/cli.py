"""The ``etrace-fit`` command: train a built-in task from the shell.

    etrace-fit tasks                     # the built-in tasks
    etrace-fit train                     # ALIF network, evidence accumulation, algo="hybrid"
    etrace-fit train --algo bptt --epochs 5 --logdir runs --seed 1

``train`` builds the task's data and model, trains with :class:`etrace_fit.Trainer`
(a progress bar per epoch, TensorBoard logs in a new folder under ``--logdir``), then
prints the final validation accuracy, the wall time, the rule chosen per weight and
where the logs are. A task is a :class:`Task`: data, a model and training defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import brainstate
import numpy as np
import optax

from . import layers
from .algorithms.registry import ALGOS
from .callbacks import TensorBoard
from .datasets import evidence_accumulation, rate_discrimination
from .errors import EtraceError
from .layers import Sequential
from .training import Trainer

__all__ = ["TASKS", "Task", "main"]


@dataclasses.dataclass(frozen=True)
class Task:
    """A built-in task: how to make its data and model, and how to train it.

    ``make_data(num_samples, seed) -> (x (N, T, C), y (N,))``; ``make_model() ->``
    a model whose step maps ``(B, C)`` to ``(B, classes)`` logits.
    """

    name: str
    description: str
    make_data: Callable[[int, int], tuple[np.ndarray, np.ndarray]]
    make_model: Callable[[], Any]
    train_samples: int
    val_samples: int
    epochs: int
    learning_rate: float
    batch_size: int = 32
    memory_budget: str | None = None  # per sample; None: the hybrid's default


def _evidence_model() -> Any:
    return Sequential(
        layers.Linear(40, 200, w_init=brainstate.nn.init.KaimingNormal(scale=2.0)),
        layers.ALIF(200, tau=20.0, tau_a=200.0, beta=0.5),
        layers.LeakyRateReadout(200, 2, tau=20.0),
    )


def _rate_model() -> Any:
    return Sequential(
        layers.Linear(20, 64, w_init=brainstate.nn.init.KaimingNormal(scale=4.0)),
        layers.LIF(64, tau=20.0),
        layers.LeakyRateReadout(64, 2, tau=20.0),
    )


_RATE = dict(seq_len=100, num_channels=20, low_rate=0.1, high_rate=0.13)

TASKS: dict[str, Task] = {
    "evidence": Task(
        name="evidence",
        description="e-prop evidence accumulation: 5 left/right cue bursts, a delay, a recall cue; "
                    "which side had more cues? Linear(40, 200) -> ALIF(200) -> LeakyRateReadout(2)",
        make_data=lambda n, seed: evidence_accumulation(n, num_cues=5, seed=seed),
        make_model=_evidence_model,
        train_samples=1024, val_samples=512, epochs=15, learning_rate=5e-3,
    ),
    "rate": Task(
        name="rate",
        description="rate discrimination: which half of 20 Poisson channels fires faster over 100 steps? "
                    "Linear(20, 64) -> LIF(64) -> LeakyRateReadout(2)",
        make_data=lambda n, seed: rate_discrimination(n, **_RATE, seed=seed),
        make_model=_rate_model,
        train_samples=1024, val_samples=512, epochs=8, learning_rate=3e-3,
    ),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="etrace-fit", description="Online training of recurrent and spiking "
                                     "networks with eligibility traces.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{train,tasks}")
    commands.add_parser("tasks", help="list the built-in tasks")
    train = commands.add_parser("train", help="train a built-in task", description="Train a built-in task and "
                                "print the validation accuracy and where the TensorBoard logs are.")
    train.add_argument("--task", default="evidence", choices=sorted(TASKS), help="the task (default: evidence)")
    train.add_argument("--algo", default="hybrid", choices=ALGOS, help="learning rule (default: hybrid)")
    train.add_argument("--epochs", type=int, help="passes over the training set (default: the task's)")
    train.add_argument("--batch-size", type=int, help="sequences per batch (default: 32)")
    train.add_argument("--logdir", default="runs", help="TensorBoard logs go to a new folder in here "
                       "(default: runs; 'none' for no logs)")
    train.add_argument("--seed", type=int, default=0, help="seed for data, weights and shuffling (default: 0)")
    train.add_argument("--samples", type=int, help="training sequences (default: the task's)")
    train.add_argument("--lr", type=float, help="peak learning rate of the cosine schedule (default: the task's)")
    train.add_argument("--memory-budget", help="trace memory per sample hybrid may spend on D-RTRL (default: 4MiB)")
    train.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2),
                       help="0 quiet, 1 a progress bar per epoch (default), 2 one line per epoch")
    return parser


def _positive(parser: argparse.ArgumentParser, name: str, value: int | float | None) -> None:
    if value is not None and not (value > 0 and math.isfinite(value)):
        parser.error(f"--{name} must be positive and finite, got {value}")


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Run ``etrace-fit train`` with parsed ``args``; returns a summary (accuracy,
    seconds, logdir, history)."""
    task = TASKS[args.task]
    epochs = task.epochs if args.epochs is None else args.epochs
    batch_size = task.batch_size if args.batch_size is None else args.batch_size
    samples = task.train_samples if args.samples is None else args.samples
    rate = task.learning_rate if args.lr is None else args.lr
    budget = task.memory_budget if args.memory_budget is None else args.memory_budget

    brainstate.environ.set(dt=1.0)
    brainstate.random.seed(args.seed)
    x, y = task.make_data(samples, args.seed)
    x_val, y_val = task.make_data(task.val_samples, args.seed + 1_000_003)  # a disjoint stream
    model = task.make_model()
    steps = epochs * math.ceil(samples / batch_size)
    optimizer = optax.inject_hyperparams(optax.adam)(learning_rate=optax.cosine_decay_schedule(rate, steps))
    trainer = Trainer(model, algo=args.algo, optimizer=optimizer, seed=args.seed,
                      memory_budget=budget if args.algo == "hybrid" else None)
    callbacks, logdir = [], None
    if args.logdir.lower() != "none":
        logdir = Path(args.logdir) / f"{task.name}-{args.algo}-seed{args.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
        callbacks.append(TensorBoard(str(logdir), histogram_freq=max(1, epochs // 5), hparams={"task": task.name}))
    if args.verbose:
        print(f"etrace-fit: task {task.name}, algo {args.algo}, {samples} training / {task.val_samples} validation "
              f"sequences of {x.shape[1]} steps, {epochs} epochs", flush=True)
    start = time.perf_counter()
    history = trainer.fit(x, y, batch_size=batch_size, epochs=epochs, validation_data=(x_val, y_val),
                          callbacks=callbacks, verbose=args.verbose)
    seconds = time.perf_counter() - start
    accuracy = history.history["val_accuracy"][-1]
    rules = ", ".join(f"{path} {rule}" for path, rule in trainer.rules.items())
    print(f"validation accuracy {accuracy:.3f} after {len(history.epoch)} epochs in {seconds:.0f} s "
          f"(algo {args.algo}{': ' + rules if rules else ''})")
    if logdir is not None:
        print(f"TensorBoard logs: {logdir}  (view with: tensorboard --logdir {args.logdir})")
    return {"accuracy": accuracy, "seconds": seconds, "logdir": logdir, "history": history.history,
            "trainer": trainer}


def tasks() -> None:
    """Print the built-in tasks."""
    for task in TASKS.values():
        x, _ = task.make_data(1, 0)
        print(f"{task.name:<9} {task.description}")
        print(f"{'':<9} input (T={x.shape[1]}, C={x.shape[2]}); defaults: {task.train_samples} training sequences, "
              f"{task.epochs} epochs, lr {task.learning_rate:g}")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "tasks":
        tasks()
        return 0
    for name in ("epochs", "batch_size", "samples", "lr"):
        _positive(parser, name.replace("_", "-"), getattr(args, name))
    if not 0 <= args.seed < 2 ** 32:  # numpy's seeds
        parser.error(f"--seed must be an integer in [0, 2**32), got {args.seed}")
    try:
        train(args)
    except EtraceError as error:
        print(f"etrace-fit: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

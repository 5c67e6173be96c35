"""The ``etrace-fit`` command: train a built-in task from the shell.

    etrace-fit tasks                     # the built-in tasks
    etrace-fit train                     # ALIF network, evidence accumulation, algo="hybrid"
    etrace-fit train --algo bptt --epochs 5 --logdir runs --seed 1
    etrace-fit train --task shd --data-dir ~/data/shd

``train`` builds the task's data and model, trains with :class:`etrace_fit.Trainer`
(a progress bar per epoch; TensorBoard logs, ``log.csv`` and the best checkpoint in a
new folder under ``--logdir``), then prints the final validation accuracy, the wall
time, the rule chosen per weight and where the logs are. The tasks live in
:mod:`etrace_fit.tasks`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .errors import EtraceError
from .tasks import TASKS, Task, add_arguments, check_arguments, describe, run

__all__ = ["TASKS", "Task", "main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="etrace-fit", description="Online training of recurrent and spiking "
                                     "networks with eligibility traces.")
    from . import __version__

    parser.add_argument("--version", action="version", version=f"etrace-fit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{train,tasks}")
    commands.add_parser("tasks", help="list the built-in tasks")
    train_parser = commands.add_parser("train", help="train a built-in task", description="Train a built-in task "
                                       "and print the validation accuracy and where the TensorBoard logs are.")
    add_arguments(train_parser)
    return parser


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Run ``etrace-fit train`` with parsed ``args`` (:func:`etrace_fit.tasks.run`)."""
    return run(args.task, args)


def tasks() -> None:
    """Print the built-in tasks."""
    print(describe())


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "tasks":
        tasks()
        return 0
    check_arguments(parser, args)
    try:
        train(args)
    except (EtraceError, FileNotFoundError, ImportError) as error:  # bad settings, missing data files or extras
        print(f"etrace-fit: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

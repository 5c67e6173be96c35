"""The copy task: a long dependency an online rule must carry across a delay.

Five symbols of eight, a 20-step delay, a go marker, then the five symbols in order
(T = 31); the loss sits on the recall steps (loss_on="mask"). GRUCell(10, 64) ->
Linear(8). Chance is 1/8 per symbol. Each run gets a folder in --logdir (TensorBoard,
log.csv, best.ckpt).

    python examples/copy_task.py [--algo hybrid] [--epochs 30] [--seed 0]
"""

from __future__ import annotations

from etrace_fit import tasks


def main(argv: list[str] | None = None) -> dict:
    return tasks.script("copy", __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()

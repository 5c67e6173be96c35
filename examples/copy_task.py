"""The copy task: a long dependency an online rule must carry across a delay.

Five symbols of eight, a 20-step delay, a go marker, then the five symbols in order
(T = 31); the loss sits on the recall steps (loss_on="mask"). --model lru (default):
LRU(10, 128, 128) -> ReLU -> Linear(128) -> ReLU -> Linear(8), a linear recurrence per
unit, for which D-RTRL (the hybrid's choice) gives BPTT's gradient; --model gru:
GRUCell(10, 64) -> Linear(8), a dense recurrence whose online traces keep the per-unit
part only. Chance is 1/8 per symbol. Each run gets a folder in --logdir (TensorBoard,
log.csv, best.ckpt).

    python examples/copy_task.py [--model lru] [--algo hybrid] [--epochs 30] [--seed 0]
"""

from __future__ import annotations

from etrace_fit import tasks


def main(argv: list[str] | None = None) -> dict:
    return tasks.script("copy", __doc__.splitlines()[0], argv, variants={"lru": "copy", "gru": "copy-gru"})


if __name__ == "__main__":
    main()

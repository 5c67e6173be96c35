"""MNIST-1D with a GRU or a recurrent spiking network, every rule against BPTT.

MNIST-1D (Greydanus & Kobak 2024) is generated offline exactly as the original code does
(4000 training / 1000 test sequences of 40 steps, one channel) and cached in --data-dir
(default ~/.cache/etrace_fit). --model gru: GRUCell(1, 64) -> Linear(10); --model snn:
RecurrentLIF(1, 128, tau=5) -> LeakyRateReadout(10, tau=400). The loss is the
cross-entropy at the last step. Each run gets a folder in --logdir (TensorBoard,
log.csv, best.ckpt).

    python examples/mnist1d.py [--model gru] [--algo hybrid] [--epochs 40] [--seed 0]
"""

from __future__ import annotations

from etrace_fit import tasks


def main(argv: list[str] | None = None) -> dict:
    return tasks.script("mnist1d", __doc__.splitlines()[0], argv, variants={"gru": "mnist1d-gru",
                                                                            "snn": "mnist1d-snn"})


if __name__ == "__main__":
    main()

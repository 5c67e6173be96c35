"""N-MNIST with a convolutional spiking network, from the original .bin files.

Unzip Train.zip and Test.zip (https://www.garrickorchard.com/datasets/n-mnist) into
--data-dir (Train/<digit>/*.bin, Test/<digit>/*.bin); events are binned to 10 ms over
300 ms (T = 30, 2 x 34 x 34) and cached. Conv2d -> LIF -> Conv2d -> LIF ->
LeakyRateReadout(10). Each run gets a folder in --logdir (TensorBoard, log.csv,
best.ckpt).

    python examples/nmnist.py --data-dir ~/data/nmnist [--algo hybrid] [--epochs 10]
"""

from __future__ import annotations

from etrace_fit import tasks


def main(argv: list[str] | None = None) -> dict:
    return tasks.script("nmnist", __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()

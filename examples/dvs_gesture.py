"""DVS128 Gesture with a convolutional spiking network, from the original AEDAT 3.1 files.

Put the user*_*.aedat files, their *_labels.csv and trials_to_train.txt /
trials_to_test.txt (https://research.ibm.com/interactive/dvsgesture/) in --data-dir;
events are downsampled to 32 x 32 and binned to 50 ms over 1.5 s (T = 30) and cached.
Conv2d -> LIF -> Conv2d -> LIF -> LeakyRateReadout(11). Each run gets a folder in
--logdir (TensorBoard, log.csv, best.ckpt).

    python examples/dvs_gesture.py --data-dir ~/data/dvs_gesture [--algo hybrid] [--epochs 30]
"""

from __future__ import annotations

from etrace_fit import tasks


def main(argv: list[str] | None = None) -> dict:
    return tasks.script("dvs-gesture", __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()

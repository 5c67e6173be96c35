"""Spiking Heidelberg Digits with a recurrent ALIF network, from the published HDF5 files.

Put shd_train.h5 and shd_test.h5 (https://zenkelab.org/datasets/, gunzipped) in
--data-dir; events are binned to 10 ms over 1 s (T = 100, 700 channels) and cached.
RecurrentALIF(700, 128) -> LeakyRateReadout(20); validation on the test split.
Published: recurrent LIF with BPTT 71.4 +- 1.9 % (Cramer et al. 2020). Each run gets a
folder in --logdir (TensorBoard, log.csv, best.ckpt).

    python examples/shd.py --data-dir ~/data/shd [--algo hybrid] [--epochs 30]
"""

from __future__ import annotations

from etrace_fit import tasks


def main(argv: list[str] | None = None) -> dict:
    return tasks.script("shd", __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()

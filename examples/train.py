"""Train a spiking network with the Trainer API: the code behind ``etrace-fit train``,
spelled out for your own model and data.

The network is ``Linear → LIF → LeakyRateReadout`` on the built-in rate-discrimination
task; the loss is the cross-entropy of the readout at the last step. ``--algo`` picks
the rule: ``hybrid`` (default, online: memory flat in the sequence length), ``d_rtrl``,
``esd_rtrl``, or ``bptt`` for comparison. Each run logs to its own folder,
``runs/example-<algo>-seed<seed>-<time>/`` (TensorBoard's train / validation runs and
``log.csv``), so runs sit side by side in ``tensorboard --logdir runs``.

    python examples/train.py [--algo hybrid] [--epochs 8] [--seed 0]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import brainstate
import optax

import etrace_fit as ef
from etrace_fit import callbacks, layers
from etrace_fit.datasets import rate_discrimination


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", default="hybrid", choices=["hybrid", "d_rtrl", "esd_rtrl", "bptt"])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--logdir", default="runs")
    args = parser.parse_args(argv)

    brainstate.environ.set(dt=1.0)  # time constants are in units of dt
    brainstate.random.seed(args.seed)
    task = dict(seq_len=100, num_channels=20, low_rate=0.1, high_rate=0.13)
    x, y = rate_discrimination(1024, **task, seed=args.seed)  # (N, T, C) spikes, (N,) labels
    x_val, y_val = rate_discrimination(512, **task, seed=args.seed + 1)

    model = ef.Sequential(
        layers.Linear(20, 64, w_init=brainstate.nn.init.KaimingNormal(scale=4.0)),
        layers.LIF(64, tau=20.0),
        layers.LeakyRateReadout(64, 2, tau=20.0),
    )
    trainer = ef.Trainer(model, algo=args.algo, optimizer=optax.adam(3e-3), seed=args.seed)
    run = Path(args.logdir) / f"example-{args.algo}-seed{args.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    suffix = 1
    while run.exists():  # two runs in the same second
        suffix += 1
        run = run.with_name(f"{run.name.rsplit('~', 1)[0]}~{suffix}")
    history = trainer.fit(
        x, y, batch_size=32, epochs=args.epochs, validation_data=(x_val, y_val),
        callbacks=[callbacks.TensorBoard(run, hparams={"task": "rate_discrimination"}),
                   callbacks.CSVLogger(run / "log.csv"),
                   callbacks.EarlyStopping(monitor="val_loss", patience=3, restore_best_weights=True)],
        verbose=2,
    )
    print(trainer.report())
    accuracy = history.history["val_accuracy"][-1]
    print(f"{args.algo}: final validation accuracy {accuracy:.3f}; logs in {run}")
    return accuracy


if __name__ == "__main__":
    main()

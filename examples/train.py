"""Train a spiking network on the built-in rate-discrimination task, online by default.

The network is ``Linear → LIF → LeakyRateReadout``; the loss is the cross-entropy of
the readout at the last step. Gradients come from ``etrace_fit.sequence_grad`` with the
chosen rule: ``hybrid`` (default, online: memory flat in the sequence length),
``d_rtrl``, ``esd_rtrl``, or ``bptt`` for comparison. This is the main job until the
Trainer lands.

    python examples/train.py [--algo hybrid] [--epochs 8] [--seed 0]
"""

from __future__ import annotations

import argparse
import time
import warnings

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax

import etrace_fit as ef
from etrace_fit import layers
from etrace_fit.datasets import rate_discrimination


def last_step_cross_entropy(logits, target):
    """``target = (label, weight)``: the weight is 1 at the last step, 0 before."""
    label, weight = target
    return weight * optax.softmax_cross_entropy_with_integer_labels(logits, label).mean()


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", default="hybrid", choices=["hybrid", "d_rtrl", "esd_rtrl", "bptt"])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    brainstate.environ.set(dt=1.0)
    brainstate.random.seed(args.seed)
    task = dict(seq_len=100, num_channels=20, low_rate=0.1, high_rate=0.13)
    x_train, y_train = rate_discrimination(1024, **task, seed=args.seed)
    x_val, y_val = rate_discrimination(512, **task, seed=args.seed + 1)

    model = ef.Sequential(
        layers.Linear(20, 64, w_init=brainstate.nn.init.KaimingNormal(scale=4.0)),
        layers.LIF(64, tau=20.0),
        layers.LeakyRateReadout(64, 2, tau=20.0),
    )
    batch, steps = args.batch_size, task["seq_len"]
    brainstate.nn.init_all_states(model, batch_size=batch)
    params = model.states(brainstate.ParamState)
    optimizer = optax.adam(3e-3)
    opt_state = optimizer.init(params.to_dict_values())
    weight = jnp.zeros((steps, 1)).at[-1].set(1.0)  # loss at the last step only

    @jax.jit
    def apply(grads, opt_state, values):
        updates, opt_state = optimizer.update(grads, opt_state, values)
        return optax.apply_updates(values, updates), opt_state

    @brainstate.transform.jit
    def accuracy(xs, ys):
        brainstate.nn.reset_all_states(model, batch_size=xs.shape[1])
        logits = brainstate.transform.for_loop(model, xs)[-1]
        return jnp.mean(jnp.argmax(logits, axis=-1) == ys)

    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    val_accuracy = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for epoch in range(args.epochs):
            order = rng.permutation(len(x_train))
            losses = []
            for first in range(0, len(order) - batch + 1, batch):
                index = order[first : first + batch]
                xs = jnp.asarray(x_train[index].swapaxes(0, 1))  # time-major (T, B, C)
                ys = (jnp.broadcast_to(jnp.asarray(y_train[index]), (steps, batch)), weight)
                brainstate.nn.reset_all_states(model, batch_size=batch)
                grads, step_losses = ef.sequence_grad(model, xs, ys, last_step_cross_entropy, algo=args.algo)
                new_values, opt_state = apply(grads, opt_state, params.to_dict_values())
                for path, value in new_values.items():
                    params[path].value = value
                losses.append(float(step_losses.sum()))
            val_accuracy = float(accuracy(jnp.asarray(x_val.swapaxes(0, 1)), jnp.asarray(y_val)))
            print(f"epoch {epoch + 1}/{args.epochs}  loss {np.mean(losses):.4f}  val_accuracy {val_accuracy:.3f}")
    print(f"{args.algo}: final validation accuracy {val_accuracy:.3f} in {time.perf_counter() - start:.1f} s")
    return val_accuracy


if __name__ == "__main__":
    main()

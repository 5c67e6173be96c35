"""Train a spiking network on the built-in rate-discrimination task with BPTT.

The network is ``Linear → LIF → LeakyRateReadout``; the loss is the cross-entropy of
the readout at the last step, and gradients come from ``brainstate.transform.grad``
over a loop in time (backpropagation through time). This is the main job until the
online trainer lands.

    python examples/train_bptt.py [--epochs 8] [--seed 0]
"""

from __future__ import annotations

import argparse
import time

import brainstate
import jax.numpy as jnp
import numpy as np
import optax

import etrace_fit as ef
from etrace_fit import layers
from etrace_fit.datasets import rate_discrimination


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    batch = args.batch_size
    brainstate.nn.init_all_states(model, batch_size=batch)
    params = model.states(brainstate.ParamState)
    optimizer = optax.adam(3e-3)
    opt_state = optimizer.init(params.to_dict_values())

    def run(xs):  # xs: (T, B, C), time-major
        brainstate.nn.reset_all_states(model, batch_size=xs.shape[1])
        return brainstate.transform.for_loop(model, xs)[-1]

    @brainstate.transform.jit
    def train_step(xs, ys, opt_state):
        def loss_fn():
            logits = run(xs)
            return optax.softmax_cross_entropy_with_integer_labels(logits, ys).mean()

        grads, loss = brainstate.transform.grad(loss_fn, grad_states=params, return_value=True)()
        updates, opt_state = optimizer.update(grads, opt_state, params.to_dict_values())
        for path, new_value in optax.apply_updates(params.to_dict_values(), updates).items():
            params[path].value = new_value
        return loss, opt_state

    @brainstate.transform.jit
    def accuracy(xs, ys):
        return jnp.mean(jnp.argmax(run(xs), axis=-1) == ys)

    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    val_accuracy = 0.0
    for epoch in range(args.epochs):
        order = rng.permutation(len(x_train))
        losses = []
        for first in range(0, len(order) - batch + 1, batch):
            index = order[first : first + batch]
            loss, opt_state = train_step(jnp.asarray(x_train[index].swapaxes(0, 1)), jnp.asarray(y_train[index]), opt_state)
            losses.append(float(loss))
        val_accuracy = float(accuracy(jnp.asarray(x_val.swapaxes(0, 1)), jnp.asarray(y_val)))
        print(f"epoch {epoch + 1}/{args.epochs}  loss {np.mean(losses):.4f}  val_accuracy {val_accuracy:.3f}")
    print(f"final validation accuracy {val_accuracy:.3f} in {time.perf_counter() - start:.1f} s")
    return val_accuracy


if __name__ == "__main__":
    main()

"""Online engine of this checkout against an older one (default: main at efc70aa), interleaved in one process.

    mkdir -p /tmp/old_pkg && git -C /work/main archive efc70aa etrace_fit | tar -x -C /tmp/old_pkg
    mv /tmp/old_pkg/etrace_fit /tmp/old_pkg/etrace_fit_main
    python benchmarks/compare_engines.py [--models gru lif] [--length 200] [--repeats 7] [--old-path /tmp/old_pkg]

The old package is imported as ``etrace_fit_main`` from ``--old-path`` (all imports
inside the package are relative, so renaming its folder is enough; its JAX primitives
are distinct objects from this checkout's even though they share names). The models
are those of ``rules.py`` (B=16, I=64, H=128, 10 outputs, float32): GRU =
``GRUCell(64, 128) → Linear(128, 10)``, LIF = ``Linear(64, 128) → LIF(128) →
Linear(128, 10)``. Each engine builds the model with its own layers; the old model
gets the new model's weights, copied by path.

For every model and rule it compiles one jitted ``sequence_grad`` runner per engine
(``etrace_fit.algorithms.sequence._prepare``, as ``rules.py`` does), checks that both
give the same per-step losses (the forward pass is the same), prints the largest
relative difference of the gradients between the engines (BPTT's must agree; the
online rules may differ where the engine's math changed), then calls the two compiled
programs ``--repeats`` times each, interleaved (old, new, old, new, ...), blocking on
the results. The Markdown table gives medians of CPU time (``time.process_time``,
all threads of the process) and wall time (``time.perf_counter``) and their ratios
new / old.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
import warnings

import brainstate
import jax
import jax.numpy as jnp
import numpy as np

B, I, H, O = 16, 64, 128, 10
RULES = ("bptt", "d_rtrl", "esd_rtrl", "hybrid")


def build(ef, name: str):
    """rules.py's model built from package ``ef``'s layers (random weights: overwritten later for old)."""
    layers = ef.layers
    rng = np.random.default_rng(0)
    if name == "gru":
        model = ef.Sequential(layers.GRUCell(I, H), layers.Linear(H, O))
    else:
        model = ef.Sequential(
            layers.Linear(I, H, w_init=rng.normal(0, 2.0 / np.sqrt(I), (I, H)).astype(np.float32)),
            layers.LIF(H, tau=10.0), layers.Linear(H, O),
        )
    brainstate.nn.init_all_states(model, batch_size=B)
    return model


def copy_weights(source, target) -> None:
    """Give ``target`` the parameter values of ``source``, matched by path."""
    src = source.states(brainstate.ParamState)
    dst = target.states(brainstate.ParamState)
    if set(src) != set(dst):
        raise SystemExit(f"parameter paths differ: {sorted(set(src) ^ set(dst))}")
    for path, state in dst.items():
        value = src[path].value
        if jax.tree.structure(value) != jax.tree.structure(state.value):
            raise SystemExit(f"parameter {path}: tree structures differ")
        state.value = jax.tree.map(jnp.array, value)


def loss(out, y):
    return jnp.mean((out - y) ** 2)


def prepare(sequence_module, model, rule, xs, ys):
    """The compiled runner of one engine and rule, and its arguments."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ApproximationWarning etc.: not what is measured here
        graph, _, runner, _ = sequence_module._prepare(model, xs, ys, loss, rule, None, None, None)
    module = graph.module
    weights = [leaf for s in module.weights for leaf in jax.tree.leaves(s.state.value)]
    args = (weights, module.state_leaves(), [xs], ys)
    compiled = runner.lower(*args).compile()
    paths = [(s.path, len(jax.tree.leaves(s.state.value))) for s in module.weights]
    return compiled, args, paths


def grads_by_path(grads, paths) -> dict:
    out, position = {}, 0
    for path, count in paths:
        for k in range(count):
            out[(path, k)] = np.asarray(grads[position + k])
        position += count
    return out


def max_rel_diff(a: dict, b: dict) -> tuple[float, str]:
    if set(a) != set(b):
        return float("nan"), f"different weights: {sorted(set(a) ^ set(b))}"
    worst, where = 0.0, ""
    for key in a:
        scale = max(float(np.max(np.abs(a[key]))), float(np.max(np.abs(b[key]))), 1e-30)
        diff = float(np.max(np.abs(a[key] - b[key]))) / scale
        if diff > worst:
            worst, where = diff, f"{'.'.join(map(str, key[0]))}[{key[1]}]"
    return worst, where


def timed(compiled, args) -> tuple[float, float]:
    c0, w0 = time.process_time(), time.perf_counter()
    jax.block_until_ready(compiled(*args))
    return time.process_time() - c0, time.perf_counter() - w0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gru", "lif"])
    parser.add_argument("--rules", nargs="+", default=list(RULES))
    parser.add_argument("--length", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--old-path", default="/tmp/old_pkg")
    args = parser.parse_args()

    sys.path.insert(0, args.old_path)
    import etrace_fit as new
    try:
        old = importlib.import_module("etrace_fit_main")
    except ImportError as error:
        raise SystemExit(f"cannot import etrace_fit_main from {args.old_path} ({error}); see this script's docstring")
    from etrace_fit.algorithms import sequence as new_sequence
    old_sequence = importlib.import_module("etrace_fit_main.algorithms.sequence")
    if old.__file__ == new.__file__:
        raise SystemExit("old and new package are the same files")

    brainstate.environ.set(dt=1.0)
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}, B={B} I={I} H={H} O={O}, T={args.length}, "
          f"{args.repeats} rounds interleaved (old, new)")
    print(f"new: {new.__file__}\nold: {old.__file__}\n")

    rng = np.random.default_rng(1)
    xs = jnp.asarray(rng.random((args.length, B, I)) < 0.2, jnp.float32)
    ys = jnp.asarray(rng.normal(size=(args.length, B, O)), jnp.float32)

    rows, checks = [], []
    for name in args.models:
        new_model = build(new, name)
        old_model = build(old, name)
        copy_weights(new_model, old_model)
        for rule in args.rules:
            c_old, a_old, p_old = prepare(old_sequence, old_model, rule, xs, ys)
            c_new, a_new, p_new = prepare(new_sequence, new_model, rule, xs, ys)
            g_old, l_old, _ = jax.block_until_ready(c_old(*a_old))
            g_new, l_new, _ = jax.block_until_ready(c_new(*a_new))
            l_old, l_new = np.asarray(l_old), np.asarray(l_new)
            loss_diff = float(np.max(np.abs(l_old - l_new)) / max(float(np.max(np.abs(l_old))), 1e-30))
            grad_diff, where = max_rel_diff(grads_by_path(g_old, p_old), grads_by_path(g_new, p_new))
            checks.append((name, rule, loss_diff, grad_diff, where))
            print(f"{name} {rule}: losses max rel diff {loss_diff:.2e}, gradients max rel diff {grad_diff:.2e}"
                  f" ({where})", flush=True)
            if loss_diff > 1e-5:
                print(f"  WARNING: the engines' losses differ on {name} {rule}: the forward passes are not the same")
            if rule == "bptt" and grad_diff > 1e-4:
                print(f"  WARNING: BPTT gradients differ between the engines on {name}")
            cpu = {"old": [], "new": []}
            wall = {"old": [], "new": []}
            for _ in range(args.repeats):
                for label, compiled, call_args in (("old", c_old, a_old), ("new", c_new, a_new)):
                    c, w = timed(compiled, call_args)
                    cpu[label].append(c)
                    wall[label].append(w)
            med = {k: (statistics.median(cpu[k]), statistics.median(wall[k])) for k in cpu}
            rows.append((name, rule, med["old"], med["new"]))
            del c_old, c_new

    print("\n| model | rule | old ms (cpu) | new ms (cpu) | new/old cpu | old ms (wall) | new ms (wall) | new/old wall |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rule, (oc, ow), (nc, nw) in rows:
        print(f"| {name} | {rule} | {oc * 1e3:.1f} | {nc * 1e3:.1f} | {nc / oc:.2f} | "
              f"{ow * 1e3:.1f} | {nw * 1e3:.1f} | {nw / ow:.2f} |")
    slow = [(n, r, nw / ow, nc / oc) for n, r, (oc, ow), (nc, nw) in rows if max(nw / ow, nc / oc) > 1.2]
    if slow:
        print("\nslower than 1.2× (wall, cpu): " + ", ".join(f"{n} {r} ({w:.2f}, {c:.2f})" for n, r, w, c in slow))


if __name__ == "__main__":
    main()

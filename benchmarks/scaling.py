"""Per-device memory of the data-parallel training step, one device against N.

    python benchmarks/scaling.py [--devices 4] [--models gru alif] [--hidden 128 512] [--batch 64 256]
        [--algos bptt d_rtrl esd_rtrl] [--length 50] [--max-gib 6] [--quick] [--json OUT.json]

For every configuration it builds the Trainer twice, ``mesh=None`` (one device) and
``mesh=N``, and reads XLA's memory analysis of the compiled training step per device
(``Trainer.step_memory``: scratch ``temp`` — non-stateful traces included — and the
``argument`` bytes), then the ratio N / 1. Step *time* is measured only on real
accelerators (``fit`` of a few batches, one device and N interleaved, medians of wall
and CPU time): emulated CPU devices share the same cores, so their time says nothing
about scaling. On a CPU-only machine the script emulates ``--devices`` CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count``, set before JAX starts, unless
already set). Models (I = 64 inputs, 10 outputs): "gru" = ``GRUCell(64, H) →
Linear(H, 10)`` on Gaussian inputs; "alif" = ``RecurrentALIF(64, H) →
LeakyRateReadout(H, 10)`` on Bernoulli(0.2) spikes. Markdown to stdout.
"""

from __future__ import annotations

import argparse
import os
import sys


def _emulate(argv: list[str]) -> None:
    """Ask XLA for ``--devices`` CPU devices before JAX is imported (CPU-only hosts)."""
    devices = 4
    if "--devices" in argv:
        devices = int(argv[argv.index("--devices") + 1])
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()


_emulate(sys.argv[1:])

import datetime  # noqa: E402
import json  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import brainstate  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

import etrace_fit as ef  # noqa: E402
from etrace_fit import layers  # noqa: E402

I, O = 64, 10
MiB, GiB = 2 ** 20, 2 ** 30
GATES = {"gru": 3, "alif": 2}  # D-RTRL trace size in (I + H + 1) · H per sample: weights × states


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build(name: str, hidden: int):
    brainstate.random.seed(0)
    if name == "gru":
        return ef.Sequential(layers.GRUCell(I, hidden), layers.Linear(hidden, O))
    return ef.Sequential(layers.RecurrentALIF(I, hidden, tau=20.0, tau_a=200.0, beta=0.5),
                         layers.LeakyRateReadout(hidden, O, tau=20.0))


def data(name: str, batch: int, length: int):
    rng = np.random.default_rng(0)
    if name == "alif":
        x = (rng.random((batch, length, I)) < 0.2).astype(np.float32)
    else:
        x = rng.normal(size=(batch, length, I)).astype(np.float32)
    return x, rng.integers(0, O, batch)


def trainer(name: str, hidden: int, algo: str, mesh):
    return ef.Trainer(build(name, hidden), algo=algo, optimizer="sgd", loss_on="all", mesh=mesh)


def measure(name, hidden, batch, algo, length, devices, max_bytes, accelerators) -> dict:
    config = {"model": name, "H": hidden, "B": batch, "algo": algo}
    estimate = 2 * batch * (I + hidden + 1) * hidden * GATES[name] * 4 if algo != "bptt" else \
        batch * length * hidden * 16 * 4
    if estimate > max_bytes:
        return {**config, "skipped": f"estimated {estimate / GiB:.1f} GiB on one device"}
    x, y = data(name, batch, length)
    memory = {}
    for count in (1, devices):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            memory[count] = trainer(name, hidden, algo, None if count == 1 else count).step_memory(x, y, batch)
    result = {**config, "memory": {str(k): v for k, v in memory.items()},
              "temp_ratio": memory[devices]["temp"] / max(memory[1]["temp"], 1)}
    if accelerators:
        result["time"] = timed(name, hidden, algo, x, y, batch, devices)
    return result


def timed(name, hidden, algo, x, y, batch, devices, rounds=3) -> dict:
    """Median wall and CPU seconds of one ``fit`` epoch, 1 device and N interleaved."""
    runs = {1: [], devices: []}
    trainers = {count: trainer(name, hidden, algo, None if count == 1 else count) for count in runs}
    xs, ys = np.concatenate([x] * 4), np.concatenate([y] * 4)
    for count, t in trainers.items():  # compile
        t.fit(xs, ys, batch_size=batch, epochs=1, verbose=0)
    for _ in range(rounds):
        for count, t in trainers.items():
            c0, w0 = time.process_time(), time.perf_counter()
            t.fit(xs, ys, batch_size=batch, epochs=1, verbose=0)
            runs[count].append((time.perf_counter() - w0, time.process_time() - c0))
    return {str(count): {"wall": statistics.median(r[0] for r in values),
                         "cpu": statistics.median(r[1] for r in values)} for count, values in runs.items()}


def markdown(results, devices, command, accelerators) -> str:
    platform = jax.devices()[0].platform
    lines = ["# Data-parallel scaling: memory per device", "",
             f"`{command}` on {datetime.date.today().isoformat()}: {jax.device_count()} {platform} device(s)"
             f"{' (emulated)' if not accelerators else ''}, jax {jax.__version__}. Per device, from XLA's memory "
             "analysis of the compiled training step (`Trainer.step_memory`); T = steps per sequence.", "",
             f"| model | H | B | algo | temp MiB, 1 device | temp MiB, {devices} devices | ratio | argument MiB, 1 "
             f"| argument MiB, {devices} |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        head = f"| {r['model']} | {r['H']} | {r['B']} | {r['algo']} "
        if "skipped" in r:
            lines.append(head + f"| skipped: {r['skipped']} | | | | |")
            continue
        one, many = r["memory"]["1"], r["memory"][str(devices)]
        lines.append(head + f"| {one['temp'] / MiB:.1f} | {many['temp'] / MiB:.1f} | {r['temp_ratio']:.2f} | "
                     f"{one['argument'] / MiB:.2f} | {many['argument'] / MiB:.2f} |")
    lines.append("")
    if accelerators:
        lines += ["| model | H | B | algo | epoch wall s, 1 | epoch wall s, N | speed-up |", "|---|---|---|---|---|---|---|"]
        for r in results:
            if "time" in r:
                one, many = r["time"]["1"]["wall"], r["time"][str(devices)]["wall"]
                lines.append(f"| {r['model']} | {r['H']} | {r['B']} | {r['algo']} | {one:.3f} | {many:.3f} | "
                             f"{one / many:.2f} |")
    else:
        lines.append("Step time is not measured here: emulated CPU devices share the same cores, so their time "
                     "says nothing about scaling. Run the script on GPUs or TPUs for it.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=4, help="N (CPU: emulated; default 4)")
    parser.add_argument("--models", nargs="+", default=["gru", "alif"], choices=["gru", "alif"])
    parser.add_argument("--hidden", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--algos", nargs="+", default=["bptt", "d_rtrl", "esd_rtrl"])
    parser.add_argument("--length", type=int, default=50, help="steps per sequence (default 50)")
    parser.add_argument("--max-gib", type=float, default=6.0)
    parser.add_argument("--quick", action="store_true", help="gru, H=128, B=64")
    parser.add_argument("--json", help="write the raw results here")
    args = parser.parse_args()
    if args.quick:
        args.models, args.hidden, args.batch = ["gru"], [128], [64]
    devices = min(args.devices, jax.device_count())
    accelerators = jax.devices()[0].platform != "cpu"
    brainstate.environ.set(dt=1.0)
    command = shlex.join(["python", "benchmarks/scaling.py", *sys.argv[1:]])
    grid = [(m, h, b, a) for m in args.models for h in args.hidden for b in args.batch for a in args.algos]
    results = []
    for n, (name, hidden, batch, algo) in enumerate(grid, 1):
        log(f"[{n}/{len(grid)}] {name} H={hidden} B={batch} {algo}")
        if batch % devices:
            results.append({"model": name, "H": hidden, "B": batch, "algo": algo,
                            "skipped": f"batch {batch} does not split over {devices} devices"})
            continue
        results.append(measure(name, hidden, batch, algo, args.length, devices, args.max_gib * GiB, accelerators))
    print(markdown(results, devices, command, accelerators))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"command": command, "devices": devices, "results": results}, handle, indent=1)


if __name__ == "__main__":
    main()

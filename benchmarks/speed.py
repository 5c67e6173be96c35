"""Speed and memory of the online rules against BPTT over a grid of sizes, interleaved in one process.

    python benchmarks/speed.py [--models gru rlif lif] [--hidden 128 512] [--batch 16 64] [--lengths 200 2000]
        [--loss all last mask] [--repeats 5] [--max-gib 8] [--quick] [--write-docs [--out docs/performance.md]]
        [--json OUT.json] [--processes N]

Models (I=64 inputs, O=10 outputs, float32): "gru" = ``GRUCell(64, H) → Linear(H, 10)``
on Gaussian inputs; "rlif" = ``RecurrentLIF(64, H, tau=10) → Linear(H, 10)`` on
Bernoulli(0.2) spike inputs, weights N(0, 1/√64) (input rows) and N(0, 1/√H) (recurrent
rows), which fire at about 10–12 % (the mean rate is printed per configuration); "lif" =
``Linear(64, H) → LIF(H, tau=10) → Linear(H, 10)``, the feed-forward spiking net of the
issue's targets, on the same spike inputs with input weights N(0, 1.3/√64). The loss is a
weighted squared error per step: "all" weighs every step 1/T, "last" only the last
step; with "last" the online rules get ``active="last"``, as the Trainer passes for
``loss_on="last"``: the steps without loss skip their pull-back, and the chunks without
any loss only advance the traces (BPTT has no such flag). "mask" (not in the default
grid) weighs every 10th step 10/T and hands the online rules the per-step flags the
Trainer passes for ``loss_on="mask"`` (``active`` = the steps with a weight).

``--models`` also takes every other recurrent layer of the library (:data:`LIBRARY`, not
in the default grid), each as ``cell(64, H) → Linear(H, 10)`` (the feed-forward spiking
ones as ``Linear(64, H) → neuron(H) → Linear(H, 10)``) with the library's default
initialisation and settings, on the GRU's inputs or, when spiking, the LIF net's: e.g.
``--models lstm alif --hidden 128 --batch 16 --lengths 200 --processes 3``. The page
lists them side by side (:func:`layers_table`).

For every configuration (model, H, B, T, loss) it compiles one jitted whole-sequence
gradient per rule (``etrace_fit.algorithms.sequence._prepare``, as ``rules.py`` does):
``bptt``, ``d_rtrl`` and ``esd_rtrl``, calls each once to warm up, then ``--repeats``
rounds interleaved (bptt, d_rtrl, esd_rtrl, bptt, ...), blocking on the results. It
reports medians of CPU time (``time.process_time``, all threads of the process) and
wall time (``time.perf_counter``), their ratios to BPTT, the XLA temp bytes of each
compiled program (``compiled.memory_analysis().temp_size_in_bytes``), and the peak RSS
of the process at the end. A configuration whose estimated memory exceeds ``--max-gib``
is skipped (and listed as such). ``--processes N``: each configuration is measured in N
fresh processes instead, the k-th building and running the rules in their order turned
k places (BPTT first, then last, ...): a program's time had moved by up to 20 % with
the order programs were built and run in one process; the tables give the median over
processes of each ratio, the targets also its range. ``--quick``: H=128, B=16, T=200, 3 repeats (a smoke
test). Progress goes to stderr; the Markdown report to stdout, or to ``--out`` with
``--write-docs`` (plus a PNG of the wall-time ratios next to it if matplotlib is there).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import resource
import shlex
import statistics
import subprocess
import sys
import time
import warnings

import brainstate
import jax
import jax.numpy as jnp
import numpy as np

import etrace_fit as ef
from etrace_fit import _compat, layers
from etrace_fit.algorithms import online
from etrace_fit.algorithms.sequence import _prepare

I, O = 64, 10
RULES = ("bptt", "d_rtrl", "esd_rtrl")
MiB, GiB = 2 ** 20, 2 ** 30
# BPTT keeps about this many floats per step, sample and unit for its backward pass
# (measured: 12.2 for the GRU, 5.7 for the recurrent LIF; rounded up for the estimate).
BPTT_FLOATS = {"gru": 16, "rlif": 8, "lif": 8}
GATES = {"gru": 3, "rlif": 1, "lif": 1}  # weights on [x, h] with a D-RTRL trace (B, I+H+1, H) each
MODELS = ("gru", "rlif", "lif")

# The library's other recurrent layers (--models, not in the default grid): name -> (what it
# is, spiking inputs, the states per unit of its hidden group, the model for H units).
LIBRARY = {
    "vanilla": ("VanillaRNNCell(64, H)", False, 1, lambda h: [layers.VanillaRNNCell(I, h)]),
    "lstm": ("LSTMCell(64, H)", False, 2, lambda h: [layers.LSTMCell(I, h)]),
    "mgu": ("MGUCell(64, H)", False, 1, lambda h: [layers.MGUCell(I, h)]),
    "minimalrnn": ("MinimalRNNCell(64, H)", False, 1, lambda h: [layers.MinimalRNNCell(I, h)]),
    "mingru": ("MinGRUCell(64, H)", False, 1, lambda h: [layers.MinGRUCell(I, h)]),
    "minlstm": ("MinLSTMCell(64, H)", False, 1, lambda h: [layers.MinLSTMCell(I, h)]),
    "urlstm": ("URLSTMCell(64, H)", False, 2, lambda h: [layers.URLSTMCell(I, h)]),
    "lru": ("LRU(64, H, H)", False, 2, lambda h: [layers.LRU(I, h, h)]),
    "ralif": ("RecurrentALIF(64, H)", True, 2, lambda h: [layers.RecurrentALIF(I, h)]),
    "alif": ("Linear(64, H) → ALIF(H)", True, 2, lambda h: [layers.Linear(I, h), layers.ALIF(h)]),
    "synlif": ("Linear(64, H) → ExpSynapse(H) → LIF(H, tau=10)", True, 2,
               lambda h: [layers.Linear(I, h), layers.ExpSynapse(h), layers.LIF(h, tau=10.0)]),
}
SPIKING = ("rlif", "lif", *(name for name, (_, spiking, _, _) in LIBRARY.items() if spiking))
CHUNK_BUFFERS = 64 * MiB        # the online program's chunk buffers may take this much (online.py)

# The speed targets at H=128, B=16, T=200: (rule, loss, bound on wall time / BPTT's),
# each for both models. The memory target (online temp flat in T) is in targets_table.
SPEED_TARGETS = [("d_rtrl", "all", 1.5), ("esd_rtrl", "all", 0.6), ("esd_rtrl", "last", 0.35),
                 ("d_rtrl", "last", 0.8)]
LABELS = {"bptt": "BPTT", "d_rtrl": "D-RTRL", "esd_rtrl": "ES-D-RTRL"}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def estimate_bytes(name: str, hidden: int, batch: int, length: int) -> int:
    """Peak memory of the largest of the three programs, roughly: BPTT's residuals grow
    with T; D-RTRL's traces (and the chunk buffers, about as large) do not."""
    states = LIBRARY[name][2] if name in LIBRARY else 1
    bptt = length * batch * hidden * BPTT_FLOATS.get(name, 16 * states) * 4
    traces = GATES.get(name, 4) * states * batch * (I + hidden + 1) * hidden * 4
    data = length * batch * (I + O + 1) * 4
    return max(bptt, 2 * traces + CHUNK_BUFFERS) + 3 * data


def build(name: str, hidden: int, batch: int):
    rng = np.random.default_rng(0)
    if name == "gru":
        cell = layers.GRUCell(I, hidden)
    elif name == "rlif":  # RecurrentLIF's one weight acts on [x, z_prev]: input rows, then recurrent rows
        w = np.concatenate([rng.normal(0, 1 / np.sqrt(I), (I, hidden)),
                            rng.normal(0, 1 / np.sqrt(hidden), (hidden, hidden))]).astype(np.float32)
        cell = layers.RecurrentLIF(I, hidden, tau=10.0, w_init=w)
    if name in LIBRARY:
        brainstate.random.seed(0)  # the library's own initialisers: the same weights in every process
        model = ef.Sequential(*LIBRARY[name][3](hidden), layers.Linear(hidden, O))
    elif name == "lif":
        w = (rng.normal(0, 1.3 / np.sqrt(I), (I, hidden))).astype(np.float32)
        model = ef.Sequential(layers.Linear(I, hidden, w_init=w), layers.LIF(hidden, tau=10.0), layers.Linear(hidden, O))
    else:
        model = ef.Sequential(cell, layers.Linear(hidden, O))
    brainstate.nn.init_all_states(model, batch_size=batch)
    return model


def data(name: str, batch: int, length: int, loss: str):
    rng = np.random.default_rng(1)
    if name in SPIKING:
        xs = jnp.asarray(rng.random((length, batch, I)) < 0.2, jnp.float32)
    else:
        xs = jnp.asarray(rng.normal(size=(length, batch, I)), jnp.float32)
    y_seq = jnp.asarray(rng.normal(size=(length, batch, O)), jnp.float32)
    if loss == "all":
        w_seq = jnp.full((length, batch), 1.0 / length, jnp.float32)
    elif loss == "mask":  # every 10th step
        marked = (np.arange(length) % 10 == 9)[:, None]
        w_seq = jnp.asarray(np.where(marked, 10.0 / length, 0.0) * np.ones((1, batch)), jnp.float32)
    else:
        w_seq = jnp.zeros((length, batch), jnp.float32).at[-1].set(1.0)
    return xs, (y_seq, w_seq)


def firing_rate(model, xs, batch: int, steps: int = 100) -> float:
    """Mean spike rate of the (recurrent) LIF layer over the first ``steps`` steps (eager)."""
    layers_ = list(model)[:-1]

    def spikes(x):
        for layer in layers_:
            x = layer(x)
        return x

    rate = float(np.mean([float(jnp.mean(spikes(xs[t]))) for t in range(min(steps, xs.shape[0]))]))
    brainstate.nn.init_all_states(model, batch_size=batch)  # start the measured sequence from rest
    return rate


def weighted_loss(out, target):  # target = (y_t, w_t); w_t has shape (B,)
    y, w = target
    return jnp.sum(w[:, None] * (out - y) ** 2) / w.shape[0]


def compile_rule(model, rule: str, xs, ys, loss: str):
    """The compiled whole-sequence gradient of ``rule``, its arguments, temp bytes and
    chunk; an online program's chunk capped as the Trainer caps it (``online.sized_program``:
    halved when that keeps its temp memory under glibc's mmap line)."""
    def compiled_at(cap):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ApproximationWarning etc.: not what is measured here
            graph, _, _, program = _prepare(model, xs, ys, weighted_loss, rule, None, None, None, max_chunk=cap)
        module = graph.module
        weights = [leaf for s in module.weights for leaf in jax.tree.leaves(s.state.value)]
        args = [weights, module.state_leaves(), [xs], ys]
        options = _compat.compiler_options()  # as the Trainer compiles (both rules alike)
        if rule != "bptt" and loss == "last":  # skip the pull-back of the steps without loss
            fn = jax.jit(lambda w, s, x, y: program.run(w, s, x, y, active="last"), compiler_options=options)
        elif rule != "bptt" and loss == "mask":  # the Trainer's flags for loss_on="mask"
            fn = jax.jit(lambda w, s, x, y: program.run(w, s, x, y, active=jnp.any(y[1] != 0, axis=1)),
                         compiler_options=options)
        else:
            fn = jax.jit(lambda w, s, x, y: program.run(w, s, x, y), compiler_options=options)
        chunk = None if rule == "bptt" else program.chunk_for(xs.shape[0], "last" if loss == "last" else None)
        compiled = fn.lower(*args).compile()
        return compiled, args, compiled.memory_analysis().temp_size_in_bytes, chunk

    first = compiled_at(None)
    if rule == "bptt":
        return first
    return online.sized_program(first, compiled_at, lambda made: made[2], first[3])[1]


def timed(compiled, args) -> tuple[float, float, int]:
    """CPU and wall seconds of one call, and the page faults it took (the process's
    minor faults: fresh pages of temp memory the allocator mapped anew for the call)."""
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    c0, w0 = time.process_time(), time.perf_counter()
    jax.block_until_ready(compiled(*args))
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    return cpu, wall, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0


def measure(name: str, hidden: int, batch: int, length: int, loss: str, repeats: int, max_bytes: float,
            order: int = 0) -> dict:
    """One configuration in this process: the rules compiled and run in the order of
    :data:`RULES` turned ``order`` places (0: BPTT first), interleaved for ``repeats``
    rounds."""
    config = {"model": name, "H": hidden, "B": batch, "T": length, "loss": loss}
    rotated = RULES[order % len(RULES):] + RULES[:order % len(RULES)]
    label = f"{name} H={hidden} B={batch} T={length} {loss}"
    estimate = estimate_bytes(name, hidden, batch, length)
    if estimate > max_bytes:
        log(f"  {label}: skipped (estimated {estimate / GiB:.1f} GiB)")
        return {**config, "skipped": f"would need {estimate / GiB:.1f} GiB"}
    model = build(name, hidden, batch)
    xs, ys = data(name, batch, length, loss)
    if name in SPIKING:
        config["firing_rate"] = firing_rate(model, xs, batch)
        log(f"  {label}: mean firing rate {config['firing_rate']:.1%}")
    log(f"  {label}: rules built and run in the order {', '.join(rotated)}")
    programs = {rule: compile_rule(model, rule, xs, ys, loss) for rule in rotated}
    largest = max(temp for _, _, temp, _ in programs.values())
    if largest > max_bytes:  # the estimate was too low: XLA's own count decides
        log(f"  {label}: skipped (XLA temp {largest / GiB:.1f} GiB)")
        return {**config, "skipped": f"would need {largest / GiB:.1f} GiB"}
    for compiled, args, _, _ in programs.values():  # warm-up
        jax.block_until_ready(compiled(*args))
    cpu = {rule: [] for rule in RULES}
    wall = {rule: [] for rule in RULES}
    faults = {rule: [] for rule in RULES}
    for _ in range(repeats):
        for rule, (compiled, args, _, _) in programs.items():
            c, w, f = timed(compiled, args)
            cpu[rule].append(c)
            wall[rule].append(w)
            faults[rule].append(f)
    results = {rule: {"cpu": cpu[rule], "wall": wall[rule], "cpu_median": statistics.median(cpu[rule]),
                      "wall_median": statistics.median(wall[rule]), "faults_median": statistics.median(faults[rule]),
                      "temp": programs[rule][2],
                      "chunk": programs[rule][3]} for rule in RULES}  # the tables' order, whatever the run's
    base = results["bptt"]
    for rule, r in results.items():
        r["cpu_ratio"] = r["cpu_median"] / base["cpu_median"]
        r["wall_ratio"] = r["wall_median"] / base["wall_median"]
        r["temp_ratio"] = r["temp"] / max(base["temp"], 1)
        log(f"  {label} {rule}: wall {r['wall_median'] * 1e3:.1f} ms "
            f"({r['wall_ratio']:.2f}× bptt), temp {r['temp'] / MiB:.1f} MiB")
    return {**config, "repeats": repeats, "rules": results}


def in_processes(config: tuple, processes: int, repeats: int, max_bytes: float) -> dict:
    """One configuration measured in ``processes`` fresh Python processes, the k-th
    compiling and running the rules in :data:`RULES`' order turned k places, pooled by
    :func:`pooled`. In one process a program's time had moved by up to 20 % with the
    order the programs were built and run in (docs/performance.md), which one process
    cannot tell from the rules' own difference."""
    name, hidden, batch, length, loss = config
    entries = []
    for k in range(processes):
        spec = json.dumps({"config": list(config), "repeats": repeats, "max_bytes": max_bytes, "order": k})
        done = subprocess.run([sys.executable, "-W", "ignore", __file__, "--one", spec], capture_output=True,
                              text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{name} H={hidden} B={batch} T={length} {loss}, process {k + 1}: "
                               f"{done.stderr[-2000:]}")
        sys.stderr.write(done.stderr)
        entries.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return pooled(entries)


def pooled(entries: list[dict]) -> dict:
    """Several processes' measurements of one configuration as one: per rule the
    medians over processes of its median times and of its ratios to BPTT (each
    process's ratio is of programs it ran side by side), every process's ratios kept
    (``wall_ratios``, ``cpu_ratios``) and all rounds' times; temp and chunk are the
    compiled program's, the same in each."""
    if len(entries) == 1 or "rules" not in entries[0]:
        return entries[0]
    rules = {}
    for rule in RULES:
        runs = [e["rules"][rule] for e in entries]
        rules[rule] = {"cpu": [t for r in runs for t in r["cpu"]], "wall": [t for r in runs for t in r["wall"]],
                       "cpu_median": statistics.median(r["cpu_median"] for r in runs),
                       "wall_median": statistics.median(r["wall_median"] for r in runs),
                       "temp": runs[0]["temp"], "chunk": runs[0]["chunk"], "temp_ratio": runs[0]["temp_ratio"],
                       "cpu_ratios": [r["cpu_ratio"] for r in runs], "wall_ratios": [r["wall_ratio"] for r in runs],
                       "cpu_ratio": statistics.median(r["cpu_ratio"] for r in runs),
                       "wall_ratio": statistics.median(r["wall_ratio"] for r in runs)}
        if all("faults_median" in r for r in runs):
            rules[rule]["faults_median"] = statistics.median(r["faults_median"] for r in runs)
    return {**entries[0], "processes": len(entries), "rules": rules}


def spread(r: dict, key: str = "wall", count: bool = True) -> str:
    """`` (low–high, N processes)`` after a pooled ratio (without the count: ``(low–high)``),
    else nothing."""
    ratios = r.get(f"{key}_ratios")
    if not ratios:
        return ""
    return f" ({min(ratios):.2f}–{max(ratios):.2f}" + (f", {len(ratios)} processes)" if count else ")")


def find(results, **config):
    for entry in results:
        if all(entry[k] == v for k, v in config.items()) and "rules" in entry:
            return entry
    return None


def targets_table(results) -> list[str]:
    lines = ["| target | model | measured | cpu ratio | result |", "|---|---|---|---|---|"]
    for rule, loss, bound, name in [(*target, name) for target in SPEED_TARGETS for name in MODELS]:
        title = f"{LABELS[rule]} ≤ {bound}× BPTT (loss {loss})"
        entry = find(results, model=name, H=128, B=16, T=200, loss=loss)
        if entry is None:
            lines.append(f"| {title} | {name} | — | — | not measured |")
            continue
        r = entry["rules"][rule]
        verdict = "PASS" if r["wall_ratio"] <= bound else "MISS"
        lines.append(f"| {title} | {name} | {r['wall_ratio']:.2f} (wall){spread(r)} | {r['cpu_ratio']:.2f} | "
                     f"{verdict} |")
    notes = []
    for name, loss in [(name, loss) for name in MODELS for loss in ("all", "last")]:
        # temp memory flat in T for the online rules, wherever the loss is; BPTT's for contrast
        short, long = (find(results, model=name, H=128, B=16, T=t, loss=loss) for t in (200, 2000))
        for rule in RULES:
            title = (f"{LABELS[rule]} temp T=2000 ≤ 1.05× T=200 (loss {loss})" if rule != "bptt"
                     else f"BPTT temp T=2000 / T=200 (loss {loss}, grows)")
            if short is None or long is None:
                lines.append(f"| {title} | {name} | — | — | not measured |")
                continue
            ratio = long["rules"][rule]["temp"] / max(short["rules"][rule]["temp"], 1)
            if short.get("run") != long.get("run"):  # one of them re-measured (--merge), on other code maybe
                lines.append(f"| {title} | {name} | {ratio:.3f} (temp) | — | not compared: T=200 and T=2000 "
                             f"come from different runs; re-measure both with --merge |")
                continue
            verdict = "—" if rule == "bptt" else ("PASS" if ratio <= 1.05 else "MISS")
            lines.append(f"| {title} | {name} | {ratio:.3f} (temp) | — | {verdict} |")
            if verdict == "MISS":  # compare the growth with the size of the inputs and targets per step
                growth = (long["rules"][rule]["temp"] - short["rules"][rule]["temp"]) / (2000 - 200)
                notes.append(f"{name} {rule} (loss {loss}): +{growth / 1024:.1f} KiB per step (inputs and targets: "
                             f"{16 * (I + O + 1) * 4 / 1024:.1f} KiB per step; chunk "
                             f"{long['rules'][rule]['chunk']})")
    if notes:
        lines += ["", "Online temp growing with T: " + "; ".join(notes) + ". The program's chunks are slices "
                  "of the inputs and the chunk size divides T where it can: growth means a buffer per step."]
    return lines


GRID_LAYERS = {"gru": "GRUCell(64, H)", "rlif": "RecurrentLIF(64, H, tau=10)",
               "lif": "Linear(64, H) → LIF(H, tau=10)"}


def layers_table(results) -> list[str]:
    """Every model measured at H = 128, B = 16, T = 200 (the grid's and the library's
    others, :data:`LIBRARY`) side by side: BPTT's wall time with the loss at every step,
    and each online rule's wall-time ratio to BPTT with the loss at every step and at
    the last (a pooled row: the median over its processes and their range)."""
    def ratio(entry, rule):
        return "—" if entry is None else f"{entry['rules'][rule]['wall_ratio']:.2f}" + spread(entry["rules"][rule],
                                                                                        count=False)

    lines = ["| model | layers (then `Linear(H, 10)`) | states per unit | BPTT ms (loss all) | D-RTRL (all) | "
             "ES-D-RTRL (all) | D-RTRL (last) | ES-D-RTRL (last) |", "|---|---|---|---|---|---|---|---|"]
    for name in (*MODELS, *LIBRARY):
        every, last = (find(results, model=name, H=128, B=16, T=200, loss=loss) for loss in ("all", "last"))
        if every is None and last is None:
            continue
        layers_, states = (LIBRARY[name][0], LIBRARY[name][2]) if name in LIBRARY else (GRID_LAYERS[name], 1)
        bptt = "—" if every is None else f"{every['rules']['bptt']['wall_median'] * 1e3:.1f}"
        lines.append(f"| {name} | {layers_} | {states} | {bptt} | {ratio(every, 'd_rtrl')} | "
                     f"{ratio(every, 'esd_rtrl')} | {ratio(last, 'd_rtrl')} | {ratio(last, 'esd_rtrl')} |")
    return lines


def layers_section(results) -> list[str]:
    """The library's other recurrent layers beside the grid's models (when any was measured;
    else no section), ending in a blank line."""
    if not any(e["model"] in LIBRARY and "rules" in e for e in results):
        return []
    return ["## Every recurrent layer of the library", "",
            "Each layer as `layer(64, H) → Linear(H, 10)` (the feed-forward neurons behind a `Linear(64, H)`), "
            "the library's default initialisation and settings, H = 128, B = 16, T = 200, float32, on the GRU's "
            "Gaussian inputs or the LIF net's spikes; wall time as a ratio to BPTT's, measured side by side "
            "(the median over fresh processes and their range; each layer's section below has the rest). "
            "\"states per unit\" is the size of the hidden group a weight drives (docs/theory.md §5.2), the "
            "`S` of D-RTRL's trace `(B, K, O, S)`.", "", *layers_table(results), "", *LAYERS_READING, ""]


def model_table(results, name: str) -> list[str]:
    lines = ["| H | B | T | loss | rule | chunk | cpu ms | wall ms | cpu/bptt | wall/bptt | temp MiB | temp/bptt | "
             "faults / call |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for entry in (e for e in results if e["model"] == name):
        head = f"| {entry['H']} | {entry['B']} | {entry['T']} | {entry['loss']} "
        if "skipped" in entry:
            lines.append(head + f"| skipped: {entry['skipped']} | | | | | | | | |")
            continue
        for rule, r in entry["rules"].items():
            lines.append(head + f"| {rule} | {r['chunk'] or '—'} | {r['cpu_median'] * 1e3:.1f} | "
                         f"{r['wall_median'] * 1e3:.1f} | {r['cpu_ratio']:.2f} | {r['wall_ratio']:.2f} | "
                         f"{r['temp'] / MiB:.1f} | {r['temp_ratio']:.3f} | "
                         f"{'—' if r.get('faults_median') is None else format(r['faults_median'], '.0f')} |")
    rates = [f"H={e['H']} B={e['B']} T={e['T']} {e['loss']}: {e['firing_rate']:.1%}"
             for e in results if e["model"] == name and "firing_rate" in e]
    if rates:
        lines += ["", "Mean firing rate of the spiking layer (first 100 steps): " + "; ".join(rates) + "."]
    return lines


def plot(results, path: pathlib.Path) -> str:
    """Wall ratio to BPTT against T, one panel per (H, B, loss), one line per model and rule;
    the Markdown that shows it (or says why there is none)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "(matplotlib is not installed: no plot.)"
    measured = [e for e in results if "rules" in e and e["model"] in MODELS]  # the grid's (layers_table: the rest)
    panels = sorted({(e["H"], e["B"], e["loss"]) for e in measured})
    if not panels:
        return "(nothing measured: no plot.)"
    cols = min(len(panels), 2)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4 * rows), squeeze=False)
    for ax, (hidden, batch, loss) in zip(axes.flat, panels):
        for name in sorted({e["model"] for e in measured}):
            for rule in RULES[1:]:
                points = sorted((e["T"], e["rules"][rule]["wall_ratio"]) for e in measured
                                if (e["model"], e["H"], e["B"], e["loss"]) == (name, hidden, batch, loss))
                if points:
                    ax.plot(*zip(*points), marker="o", label=f"{name} {rule}")
        ax.axhline(1.0, color="gray", linestyle=":")
        ax.set_xscale("log")
        ax.set_xlabel("T")
        ax.set_ylabel("wall time / BPTT")
        ax.set_title(f"H={hidden}, B={batch}, loss {loss}")
        ax.legend()
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"![wall time / BPTT against T]({path.name})"


SUMMARY = [
    "## In short (2026-11-29)",
    "",
    "- **D-RTRL** costs less than BPTT at H = 128, B = 16 (the targets' run of 2026-11-29, five processes a "
    "row): 0.72× on the GRU, 0.65× on the RLIF net and 0.76× on the feed-forward LIF net with the loss at "
    "every step, 0.32–0.53× with the loss at the last step, 0.41–0.59× at T = 2000. At B = 64 (2026-11-27) "
    "it takes 0.90× on the GRU, 0.95× on the RLIF net and 1.35× on the LIF net (1.01× and 1.80× in the run "
    "before, when their programs were over the allocator's 32 MiB line; below). At H = 512 it takes "
    "0.66–1.59×. Its memory does not grow with T.",
    "- **ES-D-RTRL** takes 0.52× BPTT's time on the GRU, 0.51× on the RLIF net and 0.54× on the LIF net at "
    "T = 200 in that run (processes 0.49–0.54×, 0.49–0.53×, 0.49–0.55×; CPU time 0.62×, 0.62×, 0.72×); "
    "0.29–0.37× at T = 2000 and 0.20–0.24× with the loss at the last step. That machine runs BPTT 2.5–3× "
    "faster than the one of the earlier tables (the GRU's 18.0 ms against 45.4 ms), and there the same "
    "rows had read 0.61× (0.57–0.62), 0.56× and 0.54× (2026-11-27), the GRU over the 0.6× target; on a "
    "third machine (2026-11-28, not merged) 0.56×, 0.59× and 0.63×. Which side of 0.6× a row lands on "
    "moves with the machine; the ratio's floor does not: per step the rule runs the forward pass and the "
    "pull-back for its learning signal (docs/theory.md §5.8), 0.53–0.57× of BPTT's per-step multiply-adds "
    "before any weight gradient (counted below), and the GRU and RLIF nets, whose steps are bound by those "
    "products, sit near it.",
    "- **Other layers** (2026-11-28, H = 128, B = 16, T = 200; \"Every recurrent layer of the library\" "
    "below): ES-D-RTRL 0.47–0.69× BPTT on all eleven; D-RTRL 0.97–1.00× on the other one-state cells with a "
    "recurrent product, 1.08–1.42× on two-state ones (LSTM, URLSTM, LRU, ALIF, RecurrentALIF, a synapse "
    "before a LIF) and on the minimal gated cells (MinGRU 1.15×, MinLSTM 1.09×).",
    "- **A mask** (`loss_on=\"mask\"`, here every 10th step) costs what the loss at every step does: "
    "ES-D-RTRL 0.61–0.76× BPTT, D-RTRL 0.85–1.02×.",
    "- **The demo** (`etrace-fit train`: hybrid = exact D-RTRL on a 3-state ALIF trace) with the command's "
    "defaults, which keep the compiled programs since 2026-11-29 (`~/.cache/etrace_fit/compiled`), reaches "
    "0.93 in 0.70× BPTT's time and ends its run in 0.59× (three seeds from an empty cache, so the first "
    "compiles: the table at the end, 2026-11-29, the targets' machine). Where every run compiles "
    "(`--compile-cache none`, or a first run) it reached 0.93 in 0.92× BPTT's time on that machine (2.9 s "
    "against 3.1 s; the whole run 0.65×), against 1.04–1.11× on the machines of 2026-11-29's earlier runs "
    "and 1.02–1.40× on the earlier ones: the hybrid's step compiles in 1.2 s against 0.76 s (118 fusions "
    "against 82, ~10 ms of XLA's compile each), and both medians are a second or third epoch's end, so the "
    "start decides. The batch's lead is BPTT's page faults under glibc's default allocator; with its "
    "settings changed, BPTT's batch is the faster one (1.18–1.49×, below).",
    "- **Everything else the issue asks for holds**: temp memory flat in T, the Trainer's overhead "
    "(`benchmarks/trainer_overhead.py`, a step of 10 ms: 1.06× the bare step's wall and CPU time at T = 300 on "
    "the targets' machine of 2026-11-29, 0.99× and 1.02× at T = 130 on that of 2026-11-27), chunked equal to "
    "per-step in float64.",
    "- **How these were measured**: in one process a ratio moves by up to 20 % with the order the programs "
    "are built and run in. So the H = 128 rows are medians over fresh processes, each building the rules in "
    "a turned order (`--processes 5` at B = 16, 3 at B = 64).",
]

READING = [
    "## Reading the numbers",
    "",
    "- The online programs run the model's step over a chunk of steps (forward, one pull-back for the "
    "learning signal and the one-step gradients, `D` and `Df`). D-RTRL then reads and writes its trace once "
    "per chunk and does its weight-gradient work as GEMMs over `C·B` rows (docs/theory.md §5.9), so at these "
    "sizes it costs about what BPTT does while its memory stays flat in T. ES-D-RTRL runs inside the step "
    "loop itself: both traces advance per step, the loop keeps each step's `ε_x` and one signal row, and "
    "after the loop one GEMM over `C·B` rows gives both gradient parts (docs/theory.md §5.9, last "
    "paragraphs).",
    "- With the loss at the last step only (`active=\"last\"`), every step but the last skips the pull-back, "
    "does not evaluate the loss (a stateless readout drops out) and only advances the traces: ES-D-RTRL and "
    "a small D-RTRL trace (at most 4096 numbers per sample) inside the step loop, a larger D-RTRL trace once "
    "per chunk. The last step runs alone with its loss (2026-11-25: before, the final chunk stacked signals "
    "that were zero but at one step; ES-D-RTRL on the LIF net 0.35× → 0.27× BPTT, on the GRU 0.31× → 0.25×, "
    "A/B in one process). The forward pass and `D`, `Df` still run at every step (the traces must advance); "
    "BPTT's backward pass cannot skip anything.",
    "- **The allocator is part of the comparison.** A program whose temp memory glibc maps anew at every "
    "call pays a page fault per 4 KiB page it touches. With glibc's default settings, BPTT's step in the "
    "demo (34 MB of temp memory, the activations of 230 steps) takes 8676 page faults a batch; the hybrid's "
    "takes none (`demo_step.py`'s page-fault column). Two runs (2026-11-27, an eleventh session), hybrid and "
    "BPTT alternated in one process, 7 rounds of 20 batches: by default the hybrid's batch took 0.80× and 0.87× BPTT's (28 and 33 ms against "
    "35 and 38 ms). With `MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=4294967296` in the "
    "environment it took 1.49× and 1.18× (33 and 35 ms against 22 and 30 ms; BPTT faulted 0 and 3037 "
    "times a batch). So the demo's batch beats BPTT's only under the default allocator. The GRU's BPTT at "
    "T = 2000 (189 MB) faults at every call under both settings (48410 faults). The programs of the target "
    "rows (T = 200, 3–23 MB of temp memory) take 0–1 faults a call (the grid's last column).",
    "- **The online programs' own line is 32 MiB.** glibc serves a block above its largest mmap threshold, "
    "32 MiB, with a fresh mapping at every call. At B = 64 the D-RTRL programs of the LIF and RLIF nets "
    "need 32.8 and 43.9 MiB of temp memory in chunks of 100 and take 8404 and 11245 page faults a call "
    "(1.80× and 1.01× BPTT in the grid). In chunks of 50 they need 18.5 and 31.1 MiB, take none, and ran "
    "1.18× and 0.88× BPTT against 1.69× and 1.03× in chunks of 100 (2026-11-27, a twelfth session, "
    "alternated in one process; the RLIF net again in a thirteenth: 1.04× in chunks of 100, 0.90× in 50, "
    "0.97× in 25). The automatic chunk sizes its buffers by an estimate of the rows it keeps "
    "(`online.chunk_size`), which misses the compiled program's temp memory by up to a quarter either way. "
    "So since the thirteenth session the Trainer reads the compiled step's temp memory before its first "
    "batch and, when it is over the line and half the chunk (at least 32 steps) brings it under, trains in "
    "half the chunk (`online.chunk_cap`); `speed.py` caps its programs alike. The grid's LIF and RLIF rows "
    "at B = 64 with the loss at every step now run in chunks of 50: at T = 200 1.35× and 0.95× BPTT (medians "
    "over 3 processes; 1.80× and 1.01× in chunks of 100). The faults are paid once per call, the shorter "
    "chunks' work once per chunk, so the gain shrinks with T: alternated in one process, the LIF net ran "
    "1.21 → 1.10× at T = 400, 0.96 → 0.96× at T = 800 and 0.94 → 0.96× at T = 2000 (CPU time 1.14 → 1.07×); "
    "the grid's T = 2000 row moved from 1.00× to 1.15× across runs. The GRU's D-RTRL at B = 64 (57.6 MiB, "
    "its trace alone 18 MiB) is over the line in any chunk and keeps its own.",
    "- What each change measured, and what was tried and reverted, is in the performance log "
    "([performance-log.md](performance-log.md)).",
]


LAYERS_READING = [
    "Read against the grid (2026-11-28, 3 processes a row, 7 rounds; the grid's three rows are the targets' "
    "runs above, 2026-11-29, on a machine where BPTT runs 2.5–3× faster: compare the ratios, not the "
    "milliseconds):",
    "",
    "- **ES-D-RTRL** takes 0.47–0.69× BPTT's time on every layer with the loss at every step and 0.17–0.32× "
    "with the loss at the last step: its step loop costs about the forward pass and the pull-back for the "
    "learning signal, whatever the layer.",
    "- **D-RTRL** costs about BPTT's time (0.80–1.00×) on the one-state layers whose step has a recurrent "
    "product (GRU, RLIF, vanilla, MGU, MinimalRNN) and more on the others. With `S` states per unit its "
    "trace has `S` slabs per weight and its chunk's GEMMs do about `S` times BPTT's weight-gradient "
    "multiply-adds (docs/theory.md §5.9): 1.08–1.42× on the two-state layers (LRU 1.08×, RecurrentALIF "
    "1.15×, URLSTM 1.18×, LSTM 1.27×, the synapse-filtered LIF 1.37×, the feed-forward ALIF 1.42×). Gates "
    "that read one input (an LSTM's four on `[x, h]`) share one stacked `X` and its transposes "
    "(2026-11-28: LSTM 1.50 → 1.27×, URLSTM 1.45 → 1.18×, MinLSTM 1.39 → 1.09×). On "
    "the minimal gated cells, whose gates read the input alone (MinGRU 1.15×, MinLSTM 1.09×), BPTT has no "
    "recurrent product to run per step, so its step is cheap, while D-RTRL still keeps a `(B, K, O)` trace "
    "per gate. With the loss at the last step D-RTRL takes 0.42–1.01×.",
    "- **What the default picks.** `hybrid` gives D-RTRL every weight whose trace fits the per-sample "
    "budget (4 MiB), which all of these do at H = 128: an LSTM trains by D-RTRL at 1.3× BPTT's time. "
    "Through an LSTM's dense recurrence neither rule is exact, and D-RTRL's gradient is the closer one "
    "(docs/fidelity.md); `algo=\"esd_rtrl\"` (or a smaller `memory_budget`) trades that for 0.51×. On the "
    "per-unit layers (ALIF, the synapse, LRU, minGRU / minLSTM) D-RTRL is exact and ES-D-RTRL is not "
    "(docs/layers.md says which rule is exact for each layer).",
]


DEMO_JSON = pathlib.Path(__file__).resolve().parent / "results" / "demo.json"


def demo_section() -> list[str]:
    """The demo's table from ``benchmarks/demo.py --json`` (when it has been run)."""
    if not DEMO_JSON.exists():
        return ["## The demo", "", "(run `python benchmarks/demo.py --json benchmarks/results/demo.json` first.)"]
    sys.path.insert(0, str(DEMO_JSON.parents[1]))
    from demo import table

    saved = json.loads(DEMO_JSON.read_text())
    return ["## The demo", "",
            "`etrace-fit train` with its defaults (hybrid: D-RTRL on both weights of the ALIF network, exact "
            "for it: the readout's memory is one more trace state per ALIF unit, docs/theory.md §5.10; loss at "
            "the last of 230 steps) against `--algo bptt` (and `--algo eprop`, the baseline users compare with), "
            "each seed trained from scratch, algos interleaved; "
            f"`{saved['meta']['command']}` on {saved['meta']['date']}:", "", *table(saved["results"]), "",
            "The runs share a compile cache that starts empty, as the command's default cache does on a "
            "fresh machine (`~/.cache/etrace_fit/compiled`, docs/training.md): each algo's first seed "
            "compiles its programs, the later two read them (the first seed's columns). What decides the "
            "time to 0.93: the seeds' validation curves are the same from run to run, and float rounding "
            "separates the two rules' curves within the first epoch: both reach 0.93 at their second or "
            "third epoch. The hybrid's epochs after the first take 0.37–0.57 s against BPTT's 0.65–0.80 s, "
            "its first 0.9–1.2 s against 1.1 s when its programs are read, 2.3–2.6 s against 1.7 s when "
            "they are compiled: its step compiles in 1.2 s against 0.76 s (XLA's CPU compiler spends ~10 ms "
            "on every fusion however small, and the step has 118 against BPTT's 82: the chunk's step loop "
            "and backward pass, the last step run alone, the one-step remainder, the trace norms; "
            "`kernels.py --compile`). Every run compiling (`demo.py --compile-cache none`, the command "
            "before it kept a cache), the same machine that day: the hybrid 0.72× BPTT's whole run and "
            "1.11× its time to 0.93 (3.4 s against 3.1; BPTT's first seed reached 0.93 at its second "
            "epoch). The hybrid's faster batches themselves depend on the allocator: "
            "BPTT's step page-faults its temp memory at every batch under glibc's default settings, and "
            "without that it is the faster one (\"Reading the numbers\" above). "
            "Earlier runs, and what changed between them: the performance log."]


WORK_JSON = pathlib.Path(__file__).resolve().parent / "results" / "work.json"


def work_section() -> list[str]:
    """The per-step counts of ``benchmarks/work.py --json`` (when it has been run)."""
    if not WORK_JSON.exists():
        return ["## Work per step, counted", "",
                "(run `python benchmarks/work.py --json benchmarks/results/work.json` first.)"]
    sys.path.insert(0, str(WORK_JSON.parents[1]))
    from work import render, render_demo

    saved = json.loads(WORK_JSON.read_text())
    meta = saved["meta"]
    demo = [] if not saved.get("demo") else [
        "", "The demo's training step (`--demo`: the Trainer's own step, evidence task, batch 32, loss at the "
        "last of 230 steps), counted the same way:", "", *render_demo(saved["demo"]), "",
        "The hybrid's D-RTRL advances the ALIF input weight's trace for three states (`V`, `a` and the "
        "readout's memory, docs/theory.md §5.10): `B·K·O·3` multiply-adds a step, done as batched products. "
        "That is 1.91× BPTT's multiply-adds, but only 0.49× its thin ones and 0.79× its kernels. Measured, "
        "its batch takes 0.92–1.0× BPTT's (`demo_step.py`)."]
    return [
        "## Work per step, counted", "",
        "`benchmarks/work.py` counts what each rule's compiled program does per time step in XLA's optimised "
        "HLO (compiled as above; a loop's body once per trip): the multiply-adds of *thin* products, whose "
        "smallest side is at most the batch size (a step loop's `(B, K)(K, O)`, BPTT's per-step `Xᵀ δ` over B "
        "rows; the latter, products whose inner dimension is the batch, also counted apart), those of *batched* "
        "products (a chunk's GEMM over `C·B` rows), the kernels launched, and the bytes written by fills and "
        "copies (a fusion that only broadcasts a number, XLA's zero-filled start of a scan's stacked outputs, "
        "and a copy). Unlike the times above these do not move from run to run. "
        f"`{meta['command']}` on {meta['date']} (jax {meta['jax']}), the wall ratios of the tables above "
        "alongside:", "", *render(saved["rows"]), "",
        "Read against the ES-D-RTRL ≤ 0.6× target (loss at every step): the rule's thin products are its "
        "forward pass, the pull-back for the learning signal `∂L^t/∂h^{t−1}` (docs/theory.md §5.8), which runs "
        "through the step's recurrent rows as BPTT's backward step does, and the readout's gradient. Only the "
        "hidden weights' gradient products move from BPTT's thin per-step ones to one batched GEMM per chunk. "
        "The forward pass and the pull-back alone are 0.53–0.57× BPTT's thin multiply-adds on the three nets "
        "(0.57–0.60× with the readout's gradient) at 0.81× BPTT's kernels. At H = 128, B = 16 the thin "
        "products and the kernel launches set the pace, so on the GRU and RLIF nets the rule's time sits near "
        "those counts (0.52× and 0.51× BPTT's on the machine of 2026-11-29, 0.61× and 0.56× on that of "
        "2026-11-27, where BPTT ran 2.5–3× slower); on the LIF net, whose input product leaves the step loop "
        "(it reads the inputs alone: one GEMM per chunk), the kernel launches do (0.54× on both). `tests/algorithms/test_work_per_step.py` holds the engine to this structure "
        "with the same counter. The column of `Xᵀ δ` over B rows is what the online rules batch: BPTT's "
        "per-step weight gradients, 47 % of its thin multiply-adds on the LIF net and 33 % on the GRU.", *demo]


def markdown(results, args, command: str, peak_rss: int, figure: str, date: str | None = None,
             updates: list | None = None) -> str:
    lines = [
        "# Performance: online rules against BPTT",
        "",
        "Generated by `benchmarks/speed.py`. For every configuration, one jitted whole-sequence gradient per "
        "rule (`bptt`, `d_rtrl`, `esd_rtrl`), compiled beforehand, called once to warm up and then "
        f"{args.repeats} round(s) interleaved in one process; medians of CPU time (`time.process_time`, all "
        "threads) and wall time (`time.perf_counter`), and ratios rule / BPTT. \"temp\" is XLA's "
        "`compiled.memory_analysis().temp_size_in_bytes`. Models: GRU = `GRUCell(64, H) → Linear(H, 10)` on "
        "Gaussian inputs; RLIF = `RecurrentLIF(64, H, tau=10) → Linear(H, 10)` on Bernoulli(0.2) spike inputs; "
        "LIF = `Linear(64, H) → LIF(H, tau=10) → Linear(H, 10)` (feed-forward, the same inputs); float32. "
        "Loss \"all\": squared error at every step, weight 1/T; \"last\": the last step only (the online rules "
        "get `active=\"last\"`, as the Trainer passes for `loss_on=\"last\"`: the other steps skip their pull-back "
        "and a chunk without any loss only advances the traces). \"chunk\" is the online program's steps per chunk. "
        "\"faults / call\" is the median of the page faults a call took (the process's minor faults; — where the "
        "row predates the column): a program whose temp memory the allocator maps anew at every call pays for "
        "every page it touches, which is part of its time (Reading the numbers, the allocator).",
        "",
        f"Machine: {os.cpu_count()} CPUs ({jax.devices()[0].platform}), jax {jax.__version__}, "
        f"{date or datetime.date.today().isoformat()}. Peak RSS of the process: {peak_rss / 1024:.0f} MiB. "
        "Command:",
        "",
        f"    {command}",
        "",
        *[line for update in updates or () for line in (
            f"Then {len(update['configurations'])} configuration(s) measured again on {update['date']} and "
            f"replaced in these tables ({', '.join(' '.join(map(str, c)) for c in update['configurations'])}):",
            "", f"    {update['command']}", "")],
        "## Targets",
        "",
        "At H = 128, B = 16, T = 200 (wall-time ratio decides; CPU ratio alongside). Machines are shared and "
        "noisy: compare ratios measured side by side, not absolute times. A row measured in several fresh "
        "processes (`--processes`, the rules built and run in a turned order in each) gives the median of the "
        "processes' ratios and their range.",
        "",
        *targets_table(results),
        "",
    ]
    lines += [*SUMMARY, "", figure, "", *READING, "", *layers_section(results), *work_section(), "",
              *demo_section(), ""]
    for name in sorted({e["model"] for e in results}):
        lines += [f"## {name}", "", *model_table(results, name), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=[*MODELS, *LIBRARY],
                        help="the grid's models (default) and any of the library's other recurrent layers")
    parser.add_argument("--hidden", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--batch", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--lengths", type=int, nargs="+", default=[200, 2000])
    parser.add_argument("--loss", nargs="+", default=["all", "last"], choices=["all", "last", "mask"])
    parser.add_argument("--repeats", type=int, default=None, help="rounds (default 5, 3 with --quick)")
    parser.add_argument("--max-gib", type=float, default=8.0, help="skip configurations estimated above this")
    parser.add_argument("--quick", action="store_true", help="H=128, B=16, T=200, 3 repeats")
    parser.add_argument("--write-docs", action="store_true", help="write the Markdown to --out (else stdout)")
    parser.add_argument("--out", default="docs/performance.md")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--from-json", help="render the Markdown (and plot) from a --json file instead of measuring")
    parser.add_argument("--processes", type=int, default=1,
                        help="measure each configuration in this many fresh processes, the rules built in a turned "
                             "order in each; ratios are the median over processes, with their range")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a process of --processes: one configuration as JSON
    parser.add_argument("--merge", action="store_true",
                        help="with --json: replace the configurations measured now in that file's results and keep "
                             "the others (e.g. the target row again with more rounds); the Markdown shows them all")
    args = parser.parse_args()
    if args.one:
        spec = json.loads(args.one)
        brainstate.environ.set(dt=1.0)
        print(json.dumps(measure(*spec["config"], spec["repeats"], spec["max_bytes"], order=spec["order"])))
        return
    if args.processes < 1:
        parser.error(f"--processes must be at least 1, got {args.processes}")
    if args.quick:
        args.hidden, args.batch, args.lengths = [128], [16], [200]
    if args.repeats is None:
        args.repeats = 3 if args.quick else 5
    command = shlex.join(["python", "benchmarks/speed.py", *sys.argv[1:]])
    if args.merge and (not args.json or not pathlib.Path(args.json).exists()):
        parser.error("--merge needs --json naming a file an earlier run wrote")

    brainstate.environ.set(dt=1.0)
    grid = [(m, h, b, t, loss) for m in args.models for h in args.hidden for b in args.batch
            for t in args.lengths for loss in args.loss]
    log(f"jax {jax.__version__}, {os.cpu_count()} CPUs, {len(grid)} configurations, {args.repeats} rounds each")
    results, date = [], None
    if args.from_json:
        saved = json.loads(pathlib.Path(args.from_json).read_text())
        results, meta = saved["results"], saved["meta"]
        command, peak_rss, args.repeats, date = meta["command"], meta["peak_rss_kib"], meta["repeats"], meta["date"]
    else:
        for n, (name, hidden, batch, length, loss) in enumerate(grid, 1):
            log(f"[{n}/{len(grid)}] {name} H={hidden} B={batch} T={length} loss={loss}")
            if args.processes > 1:
                results.append(in_processes((name, hidden, batch, length, loss), args.processes, args.repeats,
                                            args.max_gib * GiB))
            else:
                results.append(measure(name, hidden, batch, length, loss, args.repeats, args.max_gib * GiB))
        peak_rss = max(resource.getrusage(who).ru_maxrss  # KiB on Linux; --processes: the largest child's
                       for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))

    meta = {"command": command, "cpus": os.cpu_count(), "jax": jax.__version__,
            "date": date or datetime.date.today().isoformat(), "peak_rss_kib": peak_rss, "repeats": args.repeats,
            "processes": args.processes}
    if args.from_json:
        meta = saved["meta"]
    elif args.merge:
        results, meta = merged(pathlib.Path(args.json), results, meta)
        command, peak_rss, args.repeats, date = meta["command"], meta["peak_rss_kib"], meta["repeats"], meta["date"]
    if args.json and not args.from_json:  # the measurements first: rendering them must not lose them
        pathlib.Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1))

    figure = "(the plot is written only with `--write-docs`.)"
    if args.write_docs:
        out = pathlib.Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        figure = plot(results, out.with_suffix(".png"))
    text = markdown(results, args, command, peak_rss, figure, date, meta.get("updates", []))
    if args.write_docs:
        out.write_text(text + "\n")
        log(f"wrote {out}")
    else:
        print(text)


def merged(path: pathlib.Path, results: list, meta: dict) -> tuple[list, dict]:
    """``path``'s saved results with the configurations in ``results`` replaced (or
    added), and its meta with this run listed under ``updates``."""
    saved = json.loads(path.read_text())
    keys = ("model", "H", "B", "T", "loss")
    # Each re-measured entry names its run: a ratio between two entries (the temp memory
    # at T = 2000 against T = 200) is only read as a result when one run measured both.
    fresh = {tuple(e[k] for k in keys): {**e, "run": meta["command"]} for e in results}
    kept = [fresh.pop(tuple(e[k] for k in keys), e) for e in saved["results"]]
    old, now = saved["meta"], [[e[k] for k in keys] for e in results]
    # An earlier update whose configurations are all measured again now is superseded.
    earlier = [u for u in old.get("updates", []) if any(c not in now for c in u["configurations"])]
    updates = earlier + [{"command": meta["command"], "date": meta["date"], "configurations": now}]
    return kept + list(fresh.values()), {**old, "updates": updates}


if __name__ == "__main__":
    main()

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
from etrace_fit.algorithms.sequence import _prepare

I, O = 64, 10
RULES = ("bptt", "d_rtrl", "esd_rtrl")
MiB, GiB = 2 ** 20, 2 ** 30
# BPTT keeps about this many floats per step, sample and unit for its backward pass
# (measured: 12.2 for the GRU, 5.7 for the recurrent LIF; rounded up for the estimate).
BPTT_FLOATS = {"gru": 16, "rlif": 8, "lif": 8}
GATES = {"gru": 3, "rlif": 1, "lif": 1}  # weights on [x, h] with a D-RTRL trace (B, I+H+1, H) each
MODELS = ("gru", "rlif", "lif")
SPIKING = ("rlif", "lif")
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
    bptt = length * batch * hidden * BPTT_FLOATS[name] * 4
    traces = GATES[name] * batch * (I + hidden + 1) * hidden * 4
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
    if name == "lif":
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
    """The compiled whole-sequence gradient of ``rule``, its arguments, temp bytes and chunk."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ApproximationWarning etc.: not what is measured here
        graph, _, _, program = _prepare(model, xs, ys, weighted_loss, rule, None, None, None)
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
    compiled = fn.lower(*args).compile()
    chunk = None if rule == "bptt" else program.chunk_for(xs.shape[0], "last" if loss == "last" else None)
    return compiled, args, compiled.memory_analysis().temp_size_in_bytes, chunk


def timed(compiled, args) -> tuple[float, float]:
    c0, w0 = time.process_time(), time.perf_counter()
    jax.block_until_ready(compiled(*args))
    return time.process_time() - c0, time.perf_counter() - w0


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
    for _ in range(repeats):
        for rule, (compiled, args, _, _) in programs.items():
            c, w = timed(compiled, args)
            cpu[rule].append(c)
            wall[rule].append(w)
    results = {rule: {"cpu": cpu[rule], "wall": wall[rule], "cpu_median": statistics.median(cpu[rule]),
                      "wall_median": statistics.median(wall[rule]), "temp": programs[rule][2],
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
    return {**entries[0], "processes": len(entries), "rules": rules}


def spread(r: dict, key: str = "wall") -> str:
    """`` (low–high, N processes)`` after a pooled ratio, else nothing."""
    ratios = r.get(f"{key}_ratios")
    return f" ({min(ratios):.2f}–{max(ratios):.2f}, {len(ratios)} processes)" if ratios else ""


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


def model_table(results, name: str) -> list[str]:
    lines = ["| H | B | T | loss | rule | chunk | cpu ms | wall ms | cpu/bptt | wall/bptt | temp MiB | temp/bptt |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for entry in (e for e in results if e["model"] == name):
        head = f"| {entry['H']} | {entry['B']} | {entry['T']} | {entry['loss']} "
        if "skipped" in entry:
            lines.append(head + f"| skipped: {entry['skipped']} | | | | | | | |")
            continue
        for rule, r in entry["rules"].items():
            lines.append(head + f"| {rule} | {r['chunk'] or '—'} | {r['cpu_median'] * 1e3:.1f} | "
                         f"{r['wall_median'] * 1e3:.1f} | {r['cpu_ratio']:.2f} | {r['wall_ratio']:.2f} | "
                         f"{r['temp'] / MiB:.1f} | {r['temp_ratio']:.3f} |")
    rates = [f"H={e['H']} B={e['B']} T={e['T']} {e['loss']}: {e['firing_rate']:.1%}"
             for e in results if e["model"] == name and "firing_rate" in e]
    if rates:
        lines += ["", "Mean firing rate of the LIF layer (first 100 steps): " + "; ".join(rates) + "."]
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
    measured = [e for e in results if "rules" in e]
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
    "## In short (2026-11-27; the H = 128, B = 16 rows measured in five fresh processes each, the rules built "
    "in a turned order in each (a tenth session, `--processes 5`); the others on 2026-11-26)",
    "",
    "- **D-RTRL** costs less than BPTT at H = 128: 0.82× on the GRU, 0.85× on the RLIF net, 0.86× on the "
    "feed-forward LIF net (medians over processes; single processes 0.73–1.08×), 0.46–0.55× with the loss at "
    "the last step, 0.60–0.70× at T = 2000; its memory does not grow with T. At H = 512 it takes 0.66–1.59× "
    "(0.37–1.18× with the loss at the last step).",
    "- **ES-D-RTRL** takes 0.59× BPTT's time on the feed-forward LIF net, 0.61× on the GRU and 0.63× on the "
    "RLIF net at T = 200 (single processes 0.50–0.62, 0.58–0.70 and 0.57–0.69×), 0.40–0.52× at T = 2000 and "
    "0.23–0.25× with the loss at the last step (0.14–0.20× at T = 2000): the 0.6× target holds on the LIF net "
    "and not on the GRU and RLIF nets, whose medians sit 0.01 and 0.03 above it. Measured in one process with "
    "BPTT built first, as the tables did until this session, the same code had read 0.49 / 0.56 / 0.62× (LIF / "
    "RLIF / GRU), and single runs 0.56–0.71× on the GRU: one process's ratio moves with the order the programs "
    "are built and run in, which five processes in turned orders average out. Per step the rule runs the "
    "forward pass and the pull-back for its learning signal (docs/theory.md §5.8), the reverse step BPTT's "
    "backward pass runs: 0.53–0.57× of the multiply-adds BPTT does in per-step products, before any weight "
    "gradient, and 0.81× its kernels (the work section below, counted, not timed). Only the weight gradients "
    "become batched GEMMs. The GRU and RLIF nets, whose steps are bound by their products, sit on that floor; "
    "on the feed-forward LIF net the per-step kernels set the pace (the step loop alone takes 0.55–0.61×, "
    "`es_floor.py`).",
    "- **A mask** (`loss_on=\"mask\"`, here every 10th step) costs what the loss at every step does: "
    "ES-D-RTRL 0.61–0.76× BPTT at T = 200 and 0.46–0.52× at T = 2000, D-RTRL 0.85–1.02× and 0.62–0.74×; "
    "before the sixth session a branch per step made it cost more (ES-D-RTRL on the GRU 0.77×, D-RTRL on the "
    "LIF net 1.45×).",
    "- **The demo** (`etrace-fit train`: hybrid = exact D-RTRL on a 3-state ALIF trace) reaches BPTT's "
    "accuracy (0.980–0.986 against 0.980–0.984) in the same wall time within noise: 0.96–1.07× over ten runs "
    "of three seeds on one machine, 0.92–1.08× over four on another, 1.01× on a third, and 0.86–1.24× to its first "
    "validation at 0.93. Its batch takes 0.93–1.0× BPTT's (0.80–0.90× on the other machine since its input "
    "product became one GEMM per chunk) while doing 1.91× "
    "its multiply-adds, and its start is ~0.7–1 s longer (the step compiles in 1.2–1.45 s against 0.7 s; "
    "1.8–1.9 s against 1.2 s on the other machine). On a third machine (2026-11-27) its batch took "
    "0.99–1.13× BPTT's and it compiled in 2.1–2.7 s against 1.2–1.4 s: 1.01× BPTT's whole run, 1.24× to 0.93 "
    "(before its step loop stopped copying the readout's trace each step; after it, the batch 0.85× BPTT's on "
    "a quieter hour, and the demo again 1.01× BPTT's whole run, 1.34× to 0.93: its first epoch ended at "
    "5.6–6.7 s against 3.6–4.1 s, its later epochs took 0.89–1.7 s against 1.1–1.5 s). A ninth session "
    "(2026-11-27, the same machine) measured 0.93× and 1.06× BPTT's whole run in two runs of three seeds, "
    "1.32× and 1.29× to 0.93: every seed reaches 0.93 in the same epoch under both (the first or the third), "
    "so the start decides it, and the online step's start is its compile (2.3–2.5 s against 1.2–1.4 s, "
    "102 fusions against 55), not its tracing (next section's last bullet). A tenth session (2026-11-27, the "
    "same kind of machine): 0.92× BPTT's whole run, 1.03× to 0.93 (6.8 s against 6.6 s; its first epoch "
    "4.7–6.3 s against 4.0–4.4 s, its later ones 0.85–1.1 s against 1.3–1.5 s on two seeds), and in the "
    "table's run an hour later, with e-prop between them, 1.06× and 1.28× (first epochs 5.1–6.1 s against "
    "3.8–4.0 s, later ones 1.1–1.4 s against 1.2–1.4 s); with a compile "
    "cache the runs share (`demo.py --compile-cache fresh`: each algo's first seed compiles, the others "
    "read), 0.89× and 1.02×, the warm first epochs 2.3–2.5 s against 2.0–2.3 s: tracing and lowering the "
    "online step (0.7–1.0 s against 0.3–0.4 s) still costs what its faster epochs save by the third. Its "
    "step's compile, split by `benchmarks/kernels.py --compile`: 110 fusions emitted in 1.22 s (summed over "
    "the threads) and LLVM's code generation 1.08 s, against BPTT's 73 in 0.90 s and 0.63 s; the HLO passes "
    "0.22 s against 0.08 s.",
    "- **Everything else the issue asks for holds**: the loss-at-the-last-step targets, flat temp memory in "
    "T, the Trainer's overhead (1.04–1.07× the bare step), and chunked equal to per-step in float64.",
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
    "- The rows at H = 512 were measured again on 2026-11-26 (a fifth session, 3 rounds; the list of "
    "re-measurements above): they dated from the grid's first run of 2026-11-25, before the chunks of 100 "
    "steps, the copy insertion by region analysis and the changes to ES-D-RTRL's chunk below, and read "
    "D-RTRL 0.91–1.99× and ES-D-RTRL 0.53–1.24× BPTT with the loss at every step; now 0.74–1.54× and "
    "0.41–0.84× (GRU at B = 16, T = 200: D-RTRL 1.64 → 1.05×, ES-D-RTRL 0.87 → 0.68×). At H = 512, "
    "ES-D-RTRL's lead shrinks as the batch grows (GRU 0.68× at B = 16 against 0.84× at B = 64, RLIF "
    "0.67 / 0.78×): the per-step weight-gradient products that BPTT runs over B rows and ES-D-RTRL batches "
    "over `C·B` are less thin at B = 64, so batching them gains less; on the feed-forward LIF net, whose "
    "steps are bound by their kernels rather than their products, the larger batch helps ES-D-RTRL "
    "(0.71 → 0.41×). The rows with the loss at every step were measured once more in a sixth session, after "
    "the chunks began to hand their buffers on (below): D-RTRL 0.66–1.59×, ES-D-RTRL 0.39–0.83×, row by row "
    "within this machine's noise of the fifth session's (chunks of 25–100 steps there).",
    "- Chunks of up to 100 steps (2026-11-25; 25 before, as the chunk column of the rows not measured again "
    "shows) while their buffers take at most 32 MiB (16 MiB until 2026-11-26, and still under ES-D-RTRL "
    "alone) or the traces' size, never "
    "shorter than the 32 steps within 64 MiB of before: each chunk pays fixed work (the trace's passes, the "
    "loop's start, GEMMs with a short inner dimension), so longer chunks win until their buffers outgrow the "
    "caches (docs/theory.md §5.9). H = 128, B = 16, T = 200, loss at every step, chunks of 100 against 25 in "
    "one process: D-RTRL 1.12 → 0.92× BPTT (GRU), 1.31 → 1.06× (RLIF), 1.34 → 1.13× (LIF); ES-D-RTRL "
    "0.85 → 0.73×, 0.85 → 0.75×, 0.95 → 0.89×. The 32 MiB (2026-11-26, D-RTRL, alternated in one process): "
    "the demo's model (ALIF, B = 32, loss at the last step) in chunks of 38 against 19, 1.09 → 0.95× BPTT's "
    "batch; the LIF net at B = 64 in chunks of 100 against 50, 1.28 → 1.11×. Longer lost: the LIF net at "
    "B = 64 in chunks of 200 (36 MB of buffers by the estimate) 1.55×, the demo's model in chunks of 114 "
    "(59 MB) 1.22×; at T = 2000 chunks of 200 were no faster than chunks of 100 (GRU 0.73 / 0.73×, RLIF "
    "0.77 / 0.76×) for 1.7× the temp. (At T = 200 one chunk of 200 measured faster, GRU 0.81× against 0.93×: "
    "a sequence in one chunk never reads its starting trace, which is zero; no reason for longer chunks.) "
    "In the change to 100 steps `D` and `Df` came to be computed by one forward-mode pass per direction "
    "instead of one vmapped pass over stacked one-hot tangents, which XLA had folded into constant arrays "
    "read from memory at every step (ES-D-RTRL on the demo's model 20–21 → 17.5 ms a batch).",
    "- The rows measured on 2026-11-25 evening come from another machine than the rest of the grid "
    "(2 cores as well): its BPTT runs about twice as fast (GRU, T = 200: 25 ms against 48 ms), the online "
    "programs gain less, and at chunks of 25 the ratios there were D-RTRL 1.05 / 1.41 / 1.30 and ES-D-RTRL "
    "0.84 / 0.99 / 0.87 (GRU / RLIF / LIF) where the older rows read 1.02 / 0.89 / 0.93 and 0.74 / 0.64 / "
    "0.69. Compare ratios within a row, not across rows from different runs.",
    "- BPTT's temp memory grows linearly with T; the online rules' does not (the memory rows of the targets). "
    "With the loss at the last step, 4 bytes per step do grow (0.1–4 % here, 7.6 KiB at T = 2000): the per-step "
    "losses the program returns, joined from the chunks' pieces. (Before 2026-11-25 this table showed temp ratios "
    "of 1.1–7 for the loss at the last step: T = 200 had been measured again after a change, T = 2000 not. "
    "`--merge` now names each re-measured entry's run, and a pair from two runs is not judged.)",
    "- The temp memory with the loss at the last step is flat since 2026-11-25 late evening: the chunk is "
    "chosen for the `T − 1` steps before the last (which runs alone), as the size down to half the cap that "
    "leaves the shortest last chunk. Before, T = 200 ran its 199 steps as a chunk of 100 and one of 99 (two "
    "copies of the chunk's program; XLA kept the second one's buffers apart, and the temp at T = 2000 read "
    "1.11–1.21× T = 200's); now 2 × 99 and one step. The extra trace pass of that one step costs D-RTRL a "
    "little at T = 200 (GRU 10.9 → 11.7 ms, LIF 0.63 → 0.74× BPTT, runs hours apart on a noisy machine) and "
    "saves compile time: the demo's step (T = 230, 229 steps before the last, a prime) compiles in 1.17 s "
    "instead of 1.37 s and lowers in 0.31 s instead of 0.39 s as 12 × 19 + 1 steps instead of 9 × 23 + 22 — "
    "the shorter last chunk was a second copy of the chunk's program (2410 against 2678 HLO instructions; "
    "2007 without any).",
    "- 2026-11-26, two changes to ES-D-RTRL with the loss at every step (H = 128, B = 16, T = 200, each "
    "alternated with the code before it in one process, wall time / BPTT's): (1) the chunk lost its reverse "
    "filter: the step loop keeps `ε_x` before each step and the signal row `δy_{j−1} + h_j − α δy_j`, which "
    "regroups the chunk's gradient exactly into one GEMM (docs/theory.md §5.9) — GRU 0.687 → 0.659×, LIF "
    "0.896 → 0.792×, RLIF 0.741 → 0.732×, the GRU's temp memory 11.0 → 7.9 MiB; (2) the pull-back of a "
    "gate's `[x, h]` reads the weight's row blocks transposed once per sequence (XLA on CPU ran "
    "`δ @ W[rows]ᵀ` with the transpose folded into the product at 9.5 µs a step against 6.4 for a "
    "row-major operand) — GRU 0.633 → 0.608×, RLIF 0.763 → 0.712×, and D-RTRL on the RLIF net 1.051 → "
    "1.009×. (3) Later that day the chunk's GEMM (`base.gram`) came to merge the stacked rows' leading "
    "axes before the product: over `(C, B, P, K)` rows XLA on CPU copied `ε_x`'s rows transposed and ran "
    "the product apart (98 + 452 µs a chunk on the LIF net), over `(C·B·P, K)` it runs one product reading "
    "them as they lie (268 µs) — ES-D-RTRL on the LIF net 0.77–0.79 → 0.72–0.73× in three of four such "
    "runs, the GRU, the RLIF net, D-RTRL and the demo within noise. The target rows above were measured "
    "after all three. (4) ES-D-RTRL runs weights whose dense ops read the same input (an LSTM's four "
    "gates) as one in its step loop, one `ε_x` and one GEMM for them (`online.shared_groups`): LSTM(64 → 128) "
    "+ Linear(10), T = 200, 0.554 → 0.507× BPTT at B = 16, 0.720 → 0.642× at B = 64 (not a model of this "
    "grid). A first form that joined the gates' `D`, `Df`, `G` along the units measured nothing (0.556 against "
    "0.557×): XLA wrote the 8 joined signals out per step; the form kept joins only the signal rows. "
    "(5) The step loop stacks a signal once when several pairs read it (a hidden group's `D` and `G`, "
    "stacked once per pair of the group before; `_compat.equal_outputs`): D-RTRL on the GRU 0.82 → 0.79× "
    "BPTT, 0.50 → 0.46× with the loss at the last step, on the LSTM 1.69 → 1.35× (temp 45.4 → 40.8 MiB); "
    "identical gradients. The target rows above were measured after (5). (6) D-RTRL runs the chunks of the "
    "pairs that drive one hidden group as one backward pass (`online.chunk_groups`): `λ` and the suffix "
    "products are carried once, each pair's reach and signal made in the same pass; identical gradients. "
    "Passes apart run side by side on the host's threads, so a group joins only with more pairs than "
    "cores: on 2, the LSTM's four gates 1.40 → 1.28× BPTT (0.97 → 0.86× with the loss at the last step), "
    "while the GRU's two weights joined measured 0.45 → 0.52× at the last step and stay apart; the rows "
    "above were measured after this.",
    "- 2026-11-26, a sixth session: with the loss at every step the step loop's stacked outputs (ES-D-RTRL's "
    "rows, D-RTRL's signals, the deferred ops' rows) go into buffers the chunks hand on to one another "
    "(`online._scan_into`), zero-filled once per call. A scan's own stacked outputs XLA had zero-filled and "
    "copied anew for each chunk, inside the loop over chunks: on the GRU four fills and three copies of "
    "0.8–1.2 MB per chunk of 100 steps, ~1.4 ms of ES-D-RTRL's 16 ms by the profiler. `benchmarks/work.py` "
    "counts these bytes (`filled and copied / step` above); `test_work_per_step.py` holds a sequence of four "
    "chunks to fewer of them per step than one chunk. Alternated in one process with the code before (H = 128, "
    "B = 16, T = 200, two runs): ES-D-RTRL on the GRU 0.608–0.613 → 0.583–0.588× BPTT, on the LIF net "
    "0.731–0.762 → 0.692–0.721×, on the RLIF net 0.642–0.671 → 0.627–0.642×; at B = 64 and T = 2000 "
    "0.5–6 % faster too; D-RTRL on the GRU 0.80–0.84 → 0.77–0.78×, on the LIF net within noise, with "
    "0.9–1.7 MiB more temp memory (the buffers stay live between chunks); identical gradients. The rows at "
    "H = 128 with the loss at every step were measured after it: ES-D-RTRL 0.601× on the GRU (0.64 before), "
    "0.639× on the RLIF net (0.65), 0.743× on the LIF net (0.79); the GRU and LIF rows at B = 16 once more "
    "with 15 rounds: 0.614× and 0.725× (T = 200), 0.464× and 0.501× (T = 2000). Steps without a loss keep the scan's own "
    "outputs: carried there, D-RTRL on the GRU with the loss at the last step measured 0.46 → 0.505× (the "
    "demo's path, where carrying had lost before as well; the tried-and-reverted bullets below).",
    "- 2026-11-26, a sixth session: with a mask (`loss_on=\"mask\"`: `active` a flag per step) a chunk with "
    "any step of loss runs the pull-back at every step and a select keeps the unmarked steps' loss and "
    "gradient parts at zero, where a branch per step (`lax.cond` between the step with and without its "
    "pull-back) had run; such chunks hand their buffers on as above, and a chunk without any loss still "
    "skips the pull-back. The branch had cost more than the pull-backs it skipped, even with few steps "
    "marked. H = 128, B = 16, T = 200, alternated in one process with the code before, as ratios to BPTT: "
    "every 10th step marked, ES-D-RTRL on the GRU 0.77 → 0.55×, on the LIF net 0.85 → 0.71×, D-RTRL 1.10 → "
    "0.76× and 1.45 → 1.04×; every step marked, ES-D-RTRL on the GRU 1.02 → 0.58×, D-RTRL on the LIF net "
    "1.68 → 1.03×; the last step only, as a flag array, ES-D-RTRL on the GRU 0.52 → 0.42×, D-RTRL on the LIF "
    "net 1.09 → 0.91× (`\"last\"` stays the static path, 0.25× and 0.64×); gradients equal to float32 "
    "rounding. `test_chunked.py` holds the step loops of a masked run to no conditional, and a NaN target at "
    "an unmarked step out of the gradient. The rows with the loss \"mask\" (every 10th step, weight 10/T) "
    "were measured after it.",
    "- 2026-11-26, a seventh session (another machine of the same kind, where BPTT's step is slower): the "
    "pull-back of a dense op on one value the step computes (the readout's `δy @ Wᵀ` on `h`) reads a copy of "
    "the weight transposed once per sequence, as a gate's row blocks already did. With the transpose folded "
    "into the product XLA on CPU ran that `(16, 10)(10, 128)` product as the step loop's slowest kernel (7.7 µs "
    "a step by the profiler on the feed-forward LIF net, against 4.4 µs for BPTT's same product in its own "
    "loop); in a toy step loop the copy saved 1.5 µs of 17.7 a step. `benchmarks/work.py` counts such "
    "products (`folded`: a step's product whose weight is contracted along its minor dimension), and "
    "`test_work_per_step.py` holds the online programs to none (BPTT's readout pull-back has `B·H·O` a step). "
    "H = 128, B = 16, T = 200, loss at every step, alternated in one process in both orders, ratios to BPTT "
    "before → after: ES-D-RTRL on the LIF net 0.626 → 0.568 and 0.593 → 0.586, on the RLIF net 0.573 → "
    "0.544 and 0.618 → 0.604, on the GRU 0.634 → 0.614 and 0.598 → 0.589; D-RTRL on the LIF net 0.998 → "
    "0.951 and 1.046 → 0.840, on the RLIF net 0.889 → 0.825, on the GRU 0.833 → 0.825 and 0.781 → 0.782; "
    "identical gradients. Two copies of the same program compiled in one process read 0.587 and 0.569, 0.741 "
    "and 0.655 on the LIF net in two runs: the lead is within this machine's noise run by run and steady "
    "across them. The rows at H = 128, B = 16 with the loss at every step were measured after it, on this "
    "machine (before it, this machine's ES-D-RTRL read 0.59–0.63× on the LIF net where the sixth session's "
    "read 0.69–0.75×: part of the new rows' lead is the machine's). The demo's program does not change: its "
    "readout is a leaky readout whose input the readout memory perturbs, which keeps its own pull-back.",
    "- 2026-11-26, the seventh session, later: a dense op that reads the inputs alone (the LIF net's and the "
    "demo's first layer, `x W + b`) does not depend on the states, so each chunk computes it for all its "
    "steps as one GEMM over `C·B` rows before the step loop (`StepProgram.products`) and each step reads its "
    "row: the step loop's thin products lose the `(B, I)(I, H)` input product, which becomes batched work "
    "(`work.py`; `test_work_per_step.py` holds the LIF net's input product to a GEMM per chunk and the last "
    "step of a `loss_on=\"last\"` sequence to the only one that runs it alone). This is the split the "
    "hand-written ES-D-RTRL of `es_handwritten.py` had found worth 0.06–0.07× on this net, and that had "
    "measured nothing in the engine of 2026-11-25. Alternated in one process in both orders (H = 128, "
    "B = 16, T = 200, ratios to BPTT, before → after): loss at every step, five runs, ES-D-RTRL 0.629 / 0.609 "
    "/ 0.614 / 0.656 / 0.640 → 0.658 / 0.552 / 0.515 / 0.655 / 0.577 (medians 0.629 → 0.577), D-RTRL 1.180 / "
    "0.895 / 0.804 / 1.003 / 0.823 → 1.009 / 0.898 / 0.735 / 0.891 / 0.742 (0.895 → 0.742); loss at the last "
    "step ES-D-RTRL 0.282 / 0.279 → 0.223 / 0.241, D-RTRL 0.496 / 0.475 → 0.402 / 0.447; the demo's step "
    "(`demo_step.py`'s Trainer step, hybrid) 0.841 / 0.858 → 0.796 / 0.806× BPTT's batch, compiled in the same "
    "time (12 more HLO instructions). The RLIF net, whose weight reads `[x, z]`, runs the same program (its "
    "A / B pairs, 0.616 / 0.597, 0.565 / 0.595, 0.650 / 0.601, give this machine's noise), as does the GRU; "
    "the input rows of a concatenation are left for later. Gradients identical in these runs (the batched "
    "product sums in another order; the float64 tests hold it to BPTT). The LIF rows at B = 16 were measured "
    "after it: ES-D-RTRL 0.50× BPTT at T = 200 and 0.44× at T = 2000, D-RTRL 0.71× and 0.62×; with the loss at "
    "the last step 0.20× and 0.41×; temp memory 1.3–1.6 MiB more (the chunk's products), still flat in T.",
    "- Where ES-D-RTRL's time goes with the loss at every step, and why it sits on 0.6× rather than under it: "
    "`benchmarks/es_floor.py` compiles ES-D-RTRL's program twice more, once without the rule's per-chunk "
    "GEMMs and once also without the deferred ops' GEMMs (the readout's `Xᵀ δy`), leaving only the step loop "
    "(the forward pass, the pull-back for `∂L^t/∂h^{t−1}`, docs/theory.md §5.8, `D`, `Df`, both traces). "
    "2026-11-26 (after the merged rows of `base.gram`), H = 128, B = 16, T = 200, medians of 21 "
    "interleaved calls, as ratios to BPTT; the second figure of each cell measured in a sixth session, after "
    "the chunks began to hand their buffers on; the third (two runs) in a seventh session on another machine "
    "of the same kind, after the readout's pull-back began to read a transposed copy of its weight:",
    "",
    "  | model | ES-D-RTRL | without the rule's GEMMs | step loop only |",
    "  |---|---|---|---|",
    "  | LIF (feed-forward) | 0.78 / 0.75 / 0.65–0.68 | 0.66 / 0.63 / 0.56–0.59 | 0.60 / 0.61 / 0.54–0.55 |",
    "  | GRU | 0.61 / 0.58 / 0.63–0.64 | 0.54 / 0.52 / 0.54–0.55 | 0.49 / 0.48 / 0.51–0.54 |",
    "  | RLIF | 0.65 / 0.63 / 0.68 | 0.51 / 0.50 / 0.55 | 0.51 / 0.51 / 0.59 |",
    "",
    "  The step loop alone costs 0.48–0.61× BPTT: the learning signal needs the pull-back through the step at "
    "every step, the same reverse sweep as BPTT's backward pass. On the feed-forward LIF net BPTT's whole step "
    "takes ~26 µs (forward and backward), and the online loop's ~20 XLA kernels a step cost about 0.6× of it "
    "before any weight gradient; the rule's GEMM, `(65 × 1600)(1600 × 128)` per chunk, adds 0.12× (0.17× "
    "before its rows were merged; the same run's ES-D-RTRL read 0.78× where `speed.py` read 0.75× an hour "
    "earlier: the machine's noise). The GRU, "
    "whose steps are GEMM-bound, sits at the target (0.56–0.62×). An earlier version of this page "
    "(2026-11-24) called 0.78× / 0.69× a floor: that floor still buffered `D`, `Df` and `G` for a chunk "
    "rule, which ES-D-RTRL no longer does (GRU 0.84× → 0.73–0.78×, LIF 1.04× → 0.69–0.85× on 2026-11-25; the "
    "machine's noise is the spread); the 2026-11-25 version of this table read 0.79 / 0.78 / 0.71.",
    "- Every program here, BPTT's too, is compiled as the Trainer compiles it (since 2026-11-25 night): on "
    "CPU with XLA's copy insertion by region analysis (`_compat.compiler_options`), without which a "
    "loop whose carried values read one another (a neuron's coupled states, D-RTRL's suffix product over a "
    "chunk) copies each of them every step. Alternated in one process (H = 128, B = 16, T = 200), the online "
    "programs gained 2–20 % (GRU: D-RTRL 0.90 → 0.87×, ES-D-RTRL 0.72 → 0.68×; LIF: D-RTRL 1.05 → 0.98×, "
    "0.71 → 0.57× with the loss at the last step), BPTT nothing, the numbers identical; the demo's online "
    "step 27.9 → 26.3 ms a batch.",
    "- Tried and reverted (2026-11-25, no gain measured): computing a feed-forward layer's input product for "
    "a whole chunk before the step loop (one GEMM over `C·B` rows; on CPU the per-step small GEMM costs "
    "the same), and ES-D-RTRL's in-chunk filter as a `C×C` matrix product (slower than a reverse scan).",
    "- Tried and reverted (2026-11-26, alternated in one process): the pull-back moved out of the step loop "
    "and run once per chunk, vmapped over its steps from the stacked states (ES-D-RTRL: GRU 0.73 → 0.72×, "
    "LIF 0.89 → 1.05×: the batched pass reads and writes `(C, B, H)` arrays that leave the caches, where "
    "the per-step pull-back works on a few KB); the readout's weight transposed for its pull-back as the "
    "gates' are (GRU 0.616 → 0.648×); the step loop reading its inputs off the whole sequence instead of a "
    "sliced chunk (within noise); the step loop's stacked signals carried from chunk to chunk, so that XLA "
    "does not zero-fill them anew for each chunk (the demo's step 0.98 → 1.05× BPTT's); D-RTRL's reach "
    "written in place into the buffers of `D` and `Df` (the demo's step within noise, LIF 1.02 → 1.09×); "
    "D-RTRL's reach written by its backward pass straight into `(B, C, O)` buffers, so that the chunk's "
    "per-sample GEMMs need no transposed copies (1.8 ms a batch of the demo's step by the profiler; "
    "the strided writes cost as much: the demo's step 1.03 → 1.05× and 1.01 → 1.02× BPTT's in two runs); "
    "D-RTRL's suffix products over a chunk carried as one stacked array instead of one per entry of the "
    "`3×3` pattern (the demo's backward pass one kernel a step instead of seven, 31 µs a step either way: "
    "it reads `D` from buffers that have left the caches; the step 1.01 → 1.03× BPTT's). Later that day: "
    "the stacked signals carried once more, from a buffer zero-filled once per call instead of per chunk "
    "(the demo's step 0.952 → 0.977× BPTT's: 3 of its 10 buffers per chunk were still filled, by the "
    "backward pass's outputs, and the writes into buffers the previous chunk had read cost what the fill "
    "saved); the per-unit Jacobian made again at each step of D-RTRL's backward pass from the values it "
    "is made of, entrywise (an ALIF's six slabs and `∂ē/∂y` from `V`, `a` and the input current: the step "
    "loop stacked 4 of its 8 slabs and ran 15 kernels a step instead of 19, 39 against 59 µs a step by "
    "the profiler, a toy of the two loops ran 3.8 → 2.5 ms a chunk; but XLA made the slabs again inside "
    "each of the backward pass's kernels that read them, and the demo's step measured 0.973 → 0.965× and "
    "0.933 → 0.933× BPTT's, with an optimisation barrier after the remaking 0.929×; the feed-forward LIF, "
    "RLIF and GRU nets, one state per unit, saved too little for it to apply).",
    "- Tried and reverted (later on 2026-11-26, alternated in one process, both orders): the steps before "
    "the last that remain after the full chunks run with the last step as one short chunk whose pull-back "
    "runs at every step and counts at the last (no program copy and no trace pass for a remainder of its "
    "own; the demo's 229 = 6 × 38 + 1 steps end in a chunk of 2): the demo's step compiled in 1.52–1.56 s "
    "instead of 1.26 s (HLO 2396 → 2745 instructions: the chunk's machinery over two steps is larger than "
    "two single steps), its batch within noise (0.961 → 0.963 and 1.027 → 0.992× BPTT's); the step loop "
    "writing a D-RTRL pair's stacked signals of one shape as one array (`(N, B·P, O)` a step, the demo's "
    "7 slabs of `(32, 200)` in one 179 KB write instead of seven) and the backward pass reading its "
    "entries in place (slicing a step's packed row first ran the backward kernels 2–3× slower): the step "
    "loop 12.1 → 10.2 ms a batch by the profiler, but the one write took 14.6 µs a step, bound by memory "
    "as the seven were, and the demo's step measured 0.954 → 0.975× and 0.933 → 0.950× BPTT's. XLA "
    "options for the start: `xla_cpu_use_fusion_emitters=false` compiled the demo's online step in 0.83 s "
    "instead of 1.27 s but ran it in 26.2 ms instead of 23.9 (1.1 s more over the run's 480 batches); "
    "`xla_cpu_parallel_codegen_split_count` 1 or 2 changed nothing (the compile already keeps ~1.7 cores "
    "busy: 2.2 s of CPU in 1.27 s); XNNPACK's YNN fusions of whole dots (`LIBRARY_FUSION_TYPE_DOT`) ran "
    "the step 6 % slower, with elementwise ones 2× slower, and without YNN ES-D-RTRL on the LIF net went "
    "0.717 → 0.781× BPTT's time and BPTT 4 % slower. Where the online start goes (a one-epoch fit of two "
    "batches, 2.33–2.39 s against BPTT's 1.54–1.56 s): the step's compile +0.6 s, its tracing +0.23 s and "
    "lowering +0.14 s; by `perf`, the compile is LLVM's code generation (37 %), XLA's MLIR fusion "
    "emitters (19 %) and its HLO passes (~13 %), each about proportional to the kernels (137 fusions "
    "against BPTT's 82).",
    "- How far below the engine ES-D-RTRL can run on the feed-forward LIF net: `benchmarks/es_handwritten.py` "
    "writes the rule by hand as plain JAX over the model's weights (its gradient equal to the engine's to "
    "6e-7 of the largest entry), per step as the engine runs it, and with the step loop split: the input "
    "product for a chunk of C steps as one GEMM, a loop of only the membrane and `ε_f` recursions, and "
    "everything else (readout, loss, pull-back, history, the rule's rows and GEMM, the readout's gradient) "
    "vectorised over the chunk's `C·B` rows. Three runs on 2026-11-26, H = 128, B = 16, T = 200, loss at "
    "every step, 15–21 rounds alternated with the engine's programs, ratios to the engine's BPTT:",
    "",
    "  | program | run 1 | run 2 | run 3 |",
    "  |---|---|---|---|",
    "  | engine, ES-D-RTRL | 0.80 | 0.77 | 0.79 |",
    "  | by hand, per step | 0.88 | 0.91 | 0.97 |",
    "  | by hand, chunks of 5 | 0.65 | 0.67 | 0.70 |",
    "  | by hand, chunks of 10 | 0.61 | 0.62 | 0.65 |",
    "  | by hand, chunks of 10, input product per step | 0.68 | 0.70 | 0.71 |",
    "  | by hand, chunks of 20 | 0.79 | 0.79 | 0.80 |",
    "  | by hand, chunks of 100 | 0.83 | 0.90 | 0.94 |",
    "",
    "  The engine's step loop already beats the same loop written by hand; the split loop at its best "
    "chunk (10 steps; longer chunks lose it again) reaches 0.61–0.65×, still above the 0.6× target, and "
    "only with the input product taken out of the loop, which the engine does since the seventh session of "
    "2026-11-26 (`StepProgram.products`, the bullet above; alone, that change had measured nothing on "
    "2026-11-25, and it measured 0.63 → 0.58× in the engine of the seventh session). "
    "The engine's vectorised pull-back reverted earlier on 2026-11-26 ran chunks of 100 (LIF "
    "0.89 → 1.05×), where the split loop written by hand is slow too; tried again the same day in the "
    "engine with chunks of 5–50 (a step loop of the forward pass, `D`, `Df` and both traces, stacking each "
    "step's states and traces; then the step's pull-back vmapped over the chunk; gradients equal to 3e-7) "
    "it lost as well: LIF 0.696–0.752 → 0.77–0.94×, GRU 0.603 → 0.69–0.89×, since the engine's loop "
    "keeps the input product and the Jacobian's passes, and the vmapped pull-back runs the whole step "
    "again.",
    "- Tried and reverted (2026-11-26, a third session; alternated in one process, both orders): D-RTRL's "
    "step loop stacking the fewer values a per-unit Jacobian's entries are made of instead of the entries, "
    "its backward pass making the entries again at each step — a minimum vertex cut by bytes over the "
    "step's jaxpr (common subexpressions merged first: each forward-mode column of the Jacobian is a pass "
    "of its own with its own copy of the step; only entrywise equations between the cut and the entries). "
    "On the demo's ALIF it stacked 3 slabs of `(32, 200)` a step instead of 7 (two differences of a "
    "potential and its threshold and one surrogate derivative; without the merge, the potential, the "
    "adaptation and the input current; 4 slabs with arithmetic alone between cut and entries); the step loop went 13.5 → 11.1 ms a batch by the profiler, but each of the backward "
    "pass's kernels made the entries it reads again (XLA fused the remaking into all seven; an "
    "optimisation barrier did not stop it), 2.6–3.2 → 9–10 µs a step for the largest, and the demo's "
    "step measured 0.985 → 0.971, 1.009 → 1.003, 0.859 → 0.857 and 0.981 → 0.973× BPTT's: within noise. "
    "A bound that stacked one slab for all seven entries (wrong gradients) read 0.987 → 0.793× in one "
    "order and 0.978 → 0.967× in the other: in one process a program's time moved by up to 20 % with the "
    "order the programs were built and run in, and two copies of one program differed by up to 4 %, so "
    "smaller effects need both orders and more than one process. Also measured and dropped: the step "
    "loop unrolled by 2 and 4 (ES-D-RTRL on the LIF net 0.736 → 0.797 and 1.074×); the demo in chunks "
    "of 76 and 114 (0.938 and 1.20× BPTT's batch against 0.949 for 38); ES-D-RTRL in chunks of 100, 50, "
    "20 and 10 (LIF 0.724, 0.756, 0.815, 0.725×; GRU 0.602, 0.622, 0.701× for the first three); the XLA "
    "options `xla_cpu_enable_concurrency_optimized_scheduler` (the demo's online step 26.03 → 26.15 ms, "
    "BPTT 25.83 → 25.93), a memory-optimised `xla_cpu_scheduler_type` (25.89 → 28.39 ms), "
    "`xla_cpu_enable_fast_min_max` (25.89 → 26.29 ms) and `xla_llvm_disable_expensive_passes` (compile "
    "1.33 s either way); `xla_cpu_use_multi_output_fusion` and `xla_cpu_small_while_loop_byte_threshold` "
    "are not compile options of this jaxlib.",
    "- Tried and reverted (2026-11-26, a fourth session; alternated in one process): more XLA options "
    "for ES-D-RTRL on the LIF net against BPTT compiled alike (base 0.756 and 0.730× in two runs): "
    "`xla_cpu_multi_thread_eigen=false` 0.797×, `xla_cpu_use_xnnpack` 0.745×, "
    "`xla_cpu_use_fusion_emitters=false` 0.747×, `xla_cpu_prefer_vector_width` 512 / 128 0.772 / 0.776×, "
    "`xla_cpu_use_onednn` 0.750×, a greedy `xla_cpu_experimental_xnn_graph_fusion_mode` 0.727×, "
    "`xla_cpu_fast_math_honor_functions=false` 0.749× (`xla_cpu_enable_fast_math` 0.688×, but it changes "
    "the numbers; `xla_cpu_use_thunk_runtime` and `xla_cpu_disable_loop_unrolling` are not options of "
    "this jaxlib); two of the step loop's 20 kernels removed (the copy of `ε_x` by stacking it after its "
    "advance, the bias correction's one-number kernel; wrong-gradient stand-ins timed only, "
    "`benchmarks/work.py` counting 18.3 kernels a step instead of 20.3): 0.756 → 0.743×, so such small "
    "kernels cost ~0.2 µs each and the step's products and stacking writes set its pace; the step loop's "
    "stacked outputs as buffers it carries, each zero-filled by its own operation (XLA had filled one "
    "buffer and copied it into nine per chunk of the demo's step; the copies went): 0.963 → 0.984 and "
    "1.029 → 1.031× BPTT's batch; the demo with the loss at the last step run as a last chunk of 38–46 "
    "steps with the pull-back (only its last step's loss) instead of the last step alone, so that those "
    "steps need no trace advance: 0.971 → 1.019×, compiled in 1.83 s instead of 1.44; D-RTRL's three "
    "per-state reach products of a chunk as one batched GEMM on the states side by side: 1.010 → 1.022×; "
    "in toys, a chunk's GEMM overlapped with the next chunk's step loop (software-pipelined in the chunk "
    "loop: XLA on CPU ran them one after the other, 6.85 → 7.87 ms) and a GRU's two gate products on the "
    "same `[x, h]` as one (14.57 → 14.81 µs a step: at this size products cost their multiply-adds).",
    "- Since 2026-11-27 the step loop carries the traces it advances without their axes of size one "
    "(a dense pair's position and state axes, `(B, 1, 1, K, O)`): carried with them, XLA laid them out "
    "with the unit axes first and copied them at every step before the fused update could write them (the "
    "demo's readout trace, 51 kB a step; two of the GRU's ES-D-RTRL traces). Alternated in one process in "
    "both orders, on the third machine below: the demo's step 0.876 → 0.850 and 0.907 → 0.846× BPTT's "
    "batch; ES-D-RTRL on the GRU 0.653 → 0.580, 0.670 → 0.631 and 0.667 → 0.705× (the RLIF and LIF nets "
    "within noise; D-RTRL's programs at every step unchanged); identical numbers. "
    "`test_a_trace_advanced_in_the_step_loop_is_written_in_place` holds it.",
    "- Tried and reverted (2026-11-27, an eighth session, on a third machine of the same kind; alternated in "
    "one process, both orders, gradients equal to 4e-8): a gate's input rows `x W[:I] + b` computed for a "
    "whole chunk before the step loop, as a first layer's input product is, the step adding `h W[I:]`. One "
    "`(C·B, I)(I, H)` product per gate: ES-D-RTRL on the GRU 0.608 → 0.614 and 0.651 → 0.643×, D-RTRL "
    "0.794 → 0.936 and 0.783 → 1.065× (the chunk's `(1600, 64)(64, 128)` ran at ~35 GFLOP/s against the "
    "step's thin products' ~54, and the fills after it ran slower); one `(C·B, I)(I, 3H)` product for the "
    "three gates: ES-D-RTRL on the GRU 0.590 → 0.592, 0.552 → 0.559 and 0.673 → 0.670×, D-RTRL 0.794 → "
    "0.745 and 0.759 → 0.736×, but on the RLIF net ES-D-RTRL 0.694 → 0.733 and 0.726 → 0.797×, D-RTRL "
    "0.963 → 0.980 and 1.125 → 1.209×. On the demo's step (ms a batch, BPTT's 38–39): the readout's small "
    "D-RTRL trace carried flat through the step loop (XLA still copies it each step) 44.5 → 44.1; the no-loss "
    "steps' stacked signals handed from chunk to chunk instead of zero-filled per chunk (as the steps "
    "with a loss do; tried for both on 2026-11-26) 38.7 → 38.8; as on 2026-11-26, "
    "`xla_cpu_use_fusion_emitters=false` compiles the step in 1.74 s instead of 2.47 (BPTT 0.89 instead of "
    "1.27) but runs it in 34.1 ms instead of 33.1 (BPTT 42.2 instead of 36.6). Of the online step's 2.4 s "
    "compile (`jax.profiler`), XLA's fusion emitters take 1.37 s for its 109 fusions and LLVM 1.09 s; the HLO "
    "passes ~0.2 s. That machine measured (11 rounds, not in the table): ES-D-RTRL 0.66× on the GRU, 0.62× on "
    "the LIF net, 0.70× on the RLIF net; D-RTRL 1.01×, 0.93×, 0.97×; BPTT's GRU sequence 59 ms there against "
    "47–50 ms on the seventh session's machine. The demo there: hybrid 0.982 in 22.2 s against BPTT's 0.980 "
    "in 21.9 s (1.01×), 1.24× to 0.93; its step 0.99–1.13× BPTT's batch in three A/B runs.",
    "- Since 2026-11-27 (a ninth session) a forward-mode pass that gives one state's `D` or one relation's "
    "`Df` evaluates only the transitions it differentiates (`cut_step`'s `outputs`), not the whole step: "
    "one pass per state and per relation over the whole step had made the traced step grow with the square "
    "of the depth. JAX removed that dead code before lowering (the lowered and compiled programs are the "
    "same, the numbers identical), so only the tracing got shorter. Trace and lower of the Trainer's step, "
    "alternated in one process: the demo's 0.81–0.87 → 0.77 s (its compile 2.3–2.5 s either way); "
    "Linear/ALIF(128) × 3 + readout 1.81 → 1.42 s, × 5 2.80 → 1.83 s; `compile_graph` on "
    "`compile_time.py`'s net 0.056 → 0.027 s. `test_traced_size.py` holds the traced products and "
    "exponentials to the same growth per layer (1, 2, 3 layers). Where the demo's start goes now, in a "
    "one-epoch fit: the step's compile 2.4 s against BPTT's 1.36 s, its tracing 0.44 s against 0.23 s, "
    "the other programs alike under both: the validation's forward pass 0.6 s, and until the same day ~10 "
    "one-op programs at ~30 ms each for the optimizer's start (Adam's zeros per weight shape, the cosine "
    "schedule's value at step 0), now one compiled `optimizer.init` (`optimizers.initial_state`: 0.08–0.09 s; "
    "the fit's compilations 18 → 8 under BPTT, 2.42 → 2.20 s). Tried and reverted the same "
    "day: the remainder of the 229 steps before the last (one step) run with the last step as one chunk of "
    "two, with the pull-back static at both (compile 2.3 → 2.9 s, 2419 → 2725 HLO instructions) or flagged "
    "per step (→ 3.0 s, 2772): as on 2026-11-26, the chunk's machinery over two steps costs more to "
    "compile than two single steps (XLA flattens a one-trip loop).",
    "- A tenth session (2026-11-27) read each program's kernels with `benchmarks/kernels.py` (XLA's own "
    "per-kernel events) before changing anything. ES-D-RTRL on the GRU (H = 128, B = 16, T = 200, loss at "
    "every step): 6 thin products a step after the merge below, 8 before (the three gates' `[x, h]` products, "
    "the readout's, and their four pull-backs), 55 % of its kernel time, against BPTT's 8 products and 4 per-step "
    "weight-gradient products (`Xᵀ δ` over 16 rows, 3.4–3.7 ms a call each); the demo's hybrid step: its "
    "chunks' backward loop (the suffix products, 38 trips of 14 kernels) 14.5 ms of kernel time a call, the "
    "chunk's four products 10.7 ms, zero-fills and their copies of the step loop's stacked outputs "
    "(nine `(38, 32, 200)` buffers a chunk) 3–4 ms, transposes of the stacked slabs for the chunk's batched "
    "products 2–4 ms. The kernels run on both cores side by side, so their sum (55 ms) is not the wall time "
    "(28–36 ms), and what is off the critical path costs nothing to remove. Tried and reverted, alternated in "
    "one process in both orders, gradients equal to 2e-7: dense ops on the same value (the GRU's z and r gates "
    "on `[x, h]`, the LSTM's four) run as one product with their weights side by side, prepared once per "
    "sequence, so one forward and one pull-back product a step instead of two (four): the profiler's kernel "
    "time fell 17.5 → 13.4 ms a call (ES-D-RTRL on the GRU, loss at the last step) but the wall time moved "
    "within noise (paired medians 0.99, 0.98 and 1.00× on GRU / GRU / LSTM, loss at every step): the two "
    "products had already run side by side on the two cores; the step loop unrolled by 2 on the GRU (0.95 and "
    "1.03× in the two orders); the no-loss steps' stacked signals handed from chunk to chunk (the copies went, "
    "the demo's step 43.5 → 43.6 ms); for the compile, `xla_cpu_parallel_codegen_split_count=1`, "
    "`xla_backend_optimization_level=1` and `xla_llvm_disable_expensive_passes` changed the online step's "
    "2.3–2.8 s by less than the noise, and `xla_cpu_use_fusion_emitters=false` (1.5–1.7 s) made it run 28 → 39 "
    "ms a batch (BPTT 34 → 41). The targets' rows are now measured in five fresh processes with the rules "
    "built in a turned order (`--processes`): one process had put ES-D-RTRL on the GRU at 0.58–0.70× by the "
    "order alone.",
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
            "History of this table: before the readout memory (2026-11-23) hybrid gave 0.932 (0.930–0.943) in "
            "15.9 s, 0.98× BPTT's time, its traces missing the readout's memory of earlier spikes (D-RTRL "
            "cosine 0.63 with BPTT at T = 200). Following that memory made the run as accurate as BPTT, and "
            "made the ALIF trace three states instead of two: 0.977 in 37.0 s, 1.94× BPTT (2026-11-24). Keeping "
            "`D`, `Df`, `G` split per state from the step program to D-RTRL's chunk (arrays with a trailing "
            "`3×3` block were half the online program's time; docs/theory.md §5.9), reading the readout's "
            "decay in one compiled program (1 s of the start) and advancing the readout's small trace inside "
            "the step loop brought it to the table above (2026-11-25). Per batch, the online program now "
            "takes 27–29 ms against BPTT's 25 ms, and compiles in 2.0 s against 0.8 s; over 15 epochs the two "
            "runs take the same time within the noise of this machine. The grid above (2026-11-24) has "
            "one state per unit (GRU, LIF, RLIF), where these changes measured within noise (feed-forward LIF "
            "net, D-RTRL, loss at every step: 1.16–1.29× BPTT before, 1.10–1.38× after, runs alternated on a "
            "noisy machine). The online run's memory stays flat in T (the grid above). The table now shows "
            "the run of 2026-11-25 afternoon, after the last step of a `loss_on=\"last\"` sequence began to run "
            "alone: 0.982 in 22.4 s against BPTT's 0.980 in 22.3 s, the same time within noise (both runs "
            "took ~30 % longer than that morning's 16.7 / 17.0 s: a busier machine). The run of 2026-11-25 "
            "evening came from another machine of the same kind (2 cores), where BPTT's step is faster "
            "(24–25 ms a batch, the run 14.4 s) and the online step is not (34 ms): hybrid 1.39× BPTT's time "
            "there, the same program. Later that evening the same machine, after the signals "
            "that are the same at every step (∂V/∂x = 1, ∂a/∂x = 0, the readout's κ) began to reach D-RTRL's "
            "chunk once instead of stacked (docs/theory.md §5.9): hybrid 1.44× BPTT's time; per batch 25.8 "
            "against 23.4 ms (1.10×, runs alternated in one process), the rest is the online program's "
            "longer start (compiled in 1.4 s against 0.7 s; the first epoch 3.1–3.7 s against 2.1 s). e-prop now runs on D-RTRL's chunk, its filtered eligibility one more "
            "trace state (docs/algorithms.md, e-prop): 33 ms a batch instead of 200, the run 20.4 s instead "
            "of 97.9 s (6.8× BPTT's, measured that evening before the change). Part of BPTT's time in this "
            "demo is the kernel zeroing fresh pages: its temp buffer per batch is larger than glibc's mmap "
            "threshold, so every call maps it anew. With `MALLOC_MMAP_THRESHOLD_=1073741824 "
            "MALLOC_TRIM_THRESHOLD_=4294967296` (the freed buffer is reused) BPTT's step took 21 ms instead "
            "of 25–31 and the online programs' the same as without (hybrid 38–40, ES-D-RTRL 19–21 ms; "
            "2026-11-25, runs alternated): the ratio a user sees depends on the allocator too. The grid's "
            "rows at H = 128, B = 16 moved within noise with it. The run of 2026-11-25 "
            "night, after the automatic chunk began to leave the shortest last chunk (the 229 steps before the "
            "last as 12 × 19 + 1 instead of 9 × 23 + 22: the step compiles in 1.17 s instead of 1.37 s): hybrid "
            "1.23× BPTT's time; per batch 27.5 against 22.8 ms (1.20×, runs alternated in one process). Where "
            "that batch goes (jax.profiler): D-RTRL's two loops, the step loop and the backward pass over each "
            "chunk, take 21 ms against BPTT's forward and backward loops' 23.5 ms, but D-RTRL does three times "
            "BPTT's weight-gradient FLOPs here (one GEMM per trace state: `V`, `a` and the readout's memory) "
            "and its per-chunk GEMMs, trace combine and transposes took ~10 ms a batch at any chunk length "
            "(chunks of 12, 19, 38 and 76 steps: 27.5–27.7 ms; no longer so the next day, below). ES-D-RTRL on "
            "this model runs 7.7 ms a batch "
            "(0.34× BPTT, since its `ε_f` is advanced per state on split signals, 17.1 ms before) but reached "
            "0.855 (seed 0, 6.8 s), below the 0.93 target, so the hybrid's D-RTRL stays the default here. "
            "After that the training programs were compiled with XLA's copy insertion by region analysis "
            "(docs/theory.md §5.7): hybrid 1.16× BPTT's time, e-prop 1.12×, the same accuracies (the step "
            "27.9 → 26.3 ms a batch, its compile ~0.1 s longer; `benchmarks/demo_step.py`: hybrid 26.3 ms a "
            "batch against BPTT's 22.7, 1.16×, compiled in 1.20 s against 0.67 s). The table above "
            "(2026-11-26) is after the automatic chunk's buffers may take 32 MiB instead of 16: the 229 steps "
            "before the last run as 6 × 38 + 1 instead of 12 × 19 + 1, and the step alone takes 0.95× "
            "BPTT's batch (27.8 against 29.2 ms on a busier machine; e-prop 0.98×, ES-D-RTRL 0.29×; chunks of "
            "76 measured 0.92×, of 114 1.22×, alternated in one process), compiled in 1.45 s against 0.79 s. "
            "Since that day every run of `demo.py` is a fresh process, as each `etrace-fit train` is: in one "
            "process the runs had changed one another's times (with the order hybrid, e-prop, BPTT, BPTT's "
            "second and third seeds took 12.4–12.7 s against 14.8 s for its first and 15.3–15.9 s for the "
            "hybrid's, 1.25× BPTT's median; with the order BPTT, hybrid both took 15.2–15.3 s). In fresh "
            "processes the hybrid's run takes BPTT's time within noise (0.99× and 1.01× in two runs of "
            "demo.py that afternoon): its faster batches pay for its longer compile, and no more. With the "
            "compiled programs read from a compile cache (`--compile-cache fresh`: seeds 1 and 2 skip XLA's "
            "compilation; the first epoch 4.2 → 1.9 s under hybrid, 2.4 → 1.6 s under BPTT) the runs "
            "still take the same time: hybrid 15.1 s against BPTT's 14.9 (1.01×) — the hybrid's step is "
            "traced, planned and lowered anew in each run (~0.3 s more than BPTT's), and 0.95× of a batch "
            "is 0.6 s over the 480 batches, within this machine's noise between runs. Run again on "
            "2026-11-26 late (after `base.gram` merged its rows; the demo's path barely uses it): hybrid "
            "0.986 in 15.2 s against BPTT's 0.984 in 14.8 s (1.03×), e-prop 1.03× — the same parity, on "
            "the other side of 1 this time; the step alone measured 1.01–1.03× BPTT's batch that day (A/B "
            "in one process), compiled in 1.21–1.28 s against 0.70 s. Later on 2026-11-26 (after the fit's first checks stopped compiling a forward pass and the TensorBoard callback recorded its firing statistics in one call: both runs' start ~0.5 s shorter): hybrid 0.986 in 15.3 s against BPTT's 0.984 in 14.4 s (1.06×; the first seeds 15.17 s both, BPTT's later two 14.3–14.4 s, the hybrid's 15.3 s), its step alone 0.93–0.97× BPTT's batch (A/B in one process) and compiled in 1.15–1.28 s against 0.67–0.71 s, traced and lowered in 0.34–0.50 s against 0.17 s: the hybrid's longer start (~0.9 s) is more than its faster batches save over the 480 batches (~0.5 s). The table above is the run after that (later on 2026-11-26, the epoch-end norm check no longer compiling): hybrid 1.07× BPTT's time, e-prop 1.04×; the table before it, from that afternoon, read hybrid 0.986 in 17.0 s against BPTT's 0.984 in 16.8 s (1.01×) on a busier machine. Per epoch in one such run (with TensorBoard's callback, which costs both alike): the first took 4.13 s under hybrid against 3.21 s under BPTT, the other 14 took 0.81–1.00 s against 0.84–1.12 s. That run (hybrid 0.986 in 15.2 s against BPTT's 0.984 in 14.1 s, 1.07×; e-prop 0.980 in 14.7 s, 1.04×) gave way in the table above to the next one, in a third session of 2026-11-26 with no change on the demo's path, on a slower hour (18.3–19.9 s a run): hybrid 0.986 in 18.7 s against BPTT's 0.984 in 19.0 s, 0.99× (per seed 18.32 / 19.69 / 18.70 against 19.88 / 18.98 / 18.95 s: the seeds' spread is larger than the difference), e-prop 1.00×; a run of hybrid and BPTT alone just before read 0.96× (18.5 against 19.3 s), and one of two seeds 1.00×. The fresh-process runs of 2026-11-26 read 0.99, 1.01, 1.03, 1.06, 1.01, 1.07, 1.00, 0.96 and 0.99× in turn (changes to the fit's start between them moved both algos alike): parity within this machine's noise, not the steady lead the issue's target asks for. "
            "Since the fifth session of 2026-11-26 the table also gives the wall time until the validation "
            "first reached 0.93 (validation after every epoch; `tasks.run` reports when each epoch ended), the "
            "target's other reading: in the run shown, hybrid 4.9 s against BPTT's 4.2 s (1.16×), e-prop 5.0 s "
            "(1.19×). Every run reaches 0.93 within its first three epochs, so the online program's longer "
            "start decides it: the first epoch ended at 3.2–3.4 s under hybrid against 2.5–2.6 s under BPTT, "
            "and the later epochs took 0.82–0.87 s under both. The whole runs: hybrid 15.1 s against 14.8 s "
            "(1.02×), e-prop 1.02×. The table above is a seventh session's run (2026-11-26, another machine of the "
            "same kind, where every run takes ~1.5× longer and the accuracies differ in the third digit: XLA "
            "builds other code for its CPU), with no change on the demo's path: hybrid 0.980 in 24.8 s against "
            "BPTT's 0.980 in 23.0 s (1.08×), to 0.93 in 7.9 against 6.6 s (1.20×), e-prop 1.00×. Its first "
            "epochs ended at 5.4–6.5 s under hybrid against 4.1–4.5 s under BPTT; its later epochs took "
            "1.04–1.38 s under hybrid against 1.30–1.36 s. Two runs of hybrid and BPTT alone on that machine "
            "an hour before read 0.92× and 0.93× BPTT's whole-run time and 0.97× and 1.07× to 0.93 (later "
            "epochs 0.99–1.22 s against 1.26–1.48 s): on that machine the online batches are faster, by more "
            "than its longer start costs over 15 epochs in two runs of three, and the first validation at 0.93 "
            "comes as late or later. Parity within noise, as before. The table above is the run after the "
            "input product of the demo's first layer became one GEMM per chunk (the step alone 0.80–0.90× BPTT's "
            "batch): hybrid 0.982 in 22.2 s against BPTT's 0.980 in 22.9 s (0.97×), to 0.93 in 6.4 against "
            "7.4 s (0.86×), e-prop 0.96× and 1.09×; later epochs 0.98–1.23 s under hybrid against 1.28–1.40 s, "
            "first epochs 4.5–5.7 s against 4.4–5.0 s. Each seed reached 0.93 in the same epoch under both "
            "(the first, the third, the third): on this machine the hybrid's faster batches now pay for its "
            "longer start by the third epoch."]


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
        "The hybrid's D-RTRL keeps the ALIF's input weight's trace per sample for three states (`V`, `a` and "
        "the readout's memory, docs/theory.md §5.10), and its math advances it by `B·K·O·3` multiply-adds a "
        "step, which the chunk does as batched per-sample products: 1.91× BPTT's multiply-adds in all, while "
        "its thin products are 0.49× BPTT's and its kernels 0.79×. Measured, its batch takes 0.93–1.0× "
        "BPTT's (`demo_step.py`): the batched products' better rate pays for their number, and no more, "
        "which is why the whole run ties BPTT's (the table below) once the online program's longer compile "
        "is counted. ES-D-RTRL (0.49× the multiply-adds, 0.29× measured) stays under the 0.93 accuracy."]
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
        "through the step's recurrent rows as BPTT's backward step does, and the readout's gradient (10 "
        "outputs: a thin product however many rows it takes); only the hidden weights' gradient products move "
        "from BPTT's thin per-step ones to one batched GEMM per chunk, with the same multiply-adds. The "
        "forward pass and the pull-back alone are 0.53–0.57× BPTT's thin multiply-adds on the three nets, "
        "0.57–0.60× with the readout's gradient, at 0.81× BPTT's kernels (on the LIF net 0.19× and 0.73× since "
        "its input product, which reads the inputs alone, runs as one GEMM per chunk); the batched GEMM adds "
        "0.33–0.41× of "
        "BPTT's multiply-adds at a better rate. At H = 128, B = 16 the thin products and the kernel launches "
        "set the pace, so the rule sits at 0.6× at best: the GRU, whose steps are bound by their products, "
        "measures there (0.58–0.60× since the chunks hand their buffers on, 0.60–0.64× before); the "
        "feed-forward LIF net, whose per-step products are small next to its kernels and stacking writes, above "
        "it on the sixth session's machine (0.69–0.74×, 0.72–0.80× before; `es_floor.py`'s step loop alone "
        "0.60×) and on it on the seventh's, after its readout's pull-back began to read a transposed copy of "
        "the weight (0.57–0.74× in single runs, 0.59× in the table), and under it once its input product, "
        "which reads the inputs alone, became one GEMM per chunk (0.49–0.50× in the table, 0.51–0.66× in single "
        "runs; the rows below count that product as batched since). Under "
        "0.6× with room on that net a form of the rule needs fewer thin products or kernels per step than one forward "
        "pass and one pull-back: a split of the step loop by the model's structure (`es_handwritten.py`: "
        "0.61–0.65× written by hand for this net). `tests/algorithms/test_work_per_step.py` holds the engine "
        "to this structure with the same counter: per step only the forward pass (but a product on the "
        "inputs alone, one GEMM per chunk) and the pull-back (through "
        "the recurrent rows only) are thin products, the weight gradients one GEMM per chunk, and steps "
        "without a loss run no pull-back. The column of `Xᵀ δ` over B rows is what the online rules batch: "
        "BPTT's per-step weight gradients, 47 % of its thin multiply-adds on the LIF net (152 k of 324 k a "
        "step) and 33 % on the GRU; the online programs have none but ES-D-RTRL's last row of each chunk "
        "(docs/theory.md §5.9). Tried and dropped (2026-11-26, a fifth session): turning these counts into "
        "time with rates measured on this machine for the three kinds of product at each net's main shape "
        "(one product in a loop of 200 steps, medians: the step's `(16, K)(K, O)` 37–57 GMAC/s, the per-step "
        "`Xᵀ δ` over 16 rows 21–29, a chunk's `(1600, K)ᵀ (1600, O)` 16–61 and lowest at the LIF net's "
        "`(64, 128)`, 39–47 for that product alone in a program of its own): the model put ES-D-RTRL on the "
        "LIF net at 1.04× BPTT against the measured 0.79×. A product's rate depends on its shape and on what "
        "runs beside it, so these stay counts.", *demo]


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
        "and a chunk without any loss only advances the traces). \"chunk\" is the online program's steps per chunk.",
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
    lines += [*SUMMARY, "", figure, "", *READING, "", *work_section(), "", *demo_section(), ""]
    for name in sorted({e["model"] for e in results}):
        lines += [f"## {name}", "", *model_table(results, name), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
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

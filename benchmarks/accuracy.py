"""Accuracy of every rule against BPTT on the built-in tasks that run offline, written to
``docs/benchmarks.md``.

    python benchmarks/accuracy.py [--tasks mnist1d-gru copy] [--algos hybrid d_rtrl esd_rtrl bptt]
                                  [--seeds 0 1 2] [--json benchmarks/results/accuracy.json] [--write-docs]
                                  [any option of etrace-fit train, passed to every run: --epochs 1 ...]

Each (task, algo, seed) trains in a fresh subprocess with the task's defaults
(``etrace_fit.tasks``), so its peak RSS is its own. Runs are interleaved by seed (for
each seed every algo in turn) so a slow spell on this shared machine hits all rules
alike. The table gives the median final validation accuracy (the validation set is the
test split where the dataset has one), the median seconds per epoch (wall, the first,
compiling epoch excluded) and the peak RSS, next to the task's published reference;
for a task with a target accuracy (e-prop's evidence task: error < 10 %), also the
training iterations until the first validation that reached it. ``--json`` merges into
an existing file: the (task, algo) pairs run replace their old results, each task keeps
the date it was measured. ``--from-json`` re-renders the page from saved results.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import argparse, json, resource, sys, warnings
warnings.simplefilter("ignore")
from etrace_fit import tasks

task, algo, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
parser = tasks.add_arguments(argparse.ArgumentParser(), task=task)
args = parser.parse_args(["--algo", algo, "--seed", str(seed), "--logdir", "none", "--verbose", "0", *sys.argv[4:]])
summary = tasks.run(task, args)
ends = summary["epoch_seconds"]  # from the start of fit to each epoch's end
seconds = [later - earlier for earlier, later in zip(ends, ends[1:])]  # each epoch after the first
print("RESULT " + json.dumps({"accuracy": float(summary["accuracy"]), "best": float(summary["best_accuracy"]),
                              "epoch_seconds": seconds or ends,
                              "iterations_to_target": summary["iterations_to_target"],
                              "val_accuracy": [float(v) for v in summary["history"]["val_accuracy"]],
                              "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run_one(task: str, algo: str, seed: int, options: list[str] = ()) -> dict:
    """One training run in a subprocess; ``options``: more of the task's command-line
    options (``--epochs 1``: a smoke test)."""
    result = subprocess.run([sys.executable, "-c", CHILD, task, algo, str(seed), *options], capture_output=True,
                            text=True, cwd=ROOT, check=False)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"{task} {algo} seed {seed} failed:\n{result.stderr[-2000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def render(results: dict, dates: dict) -> str:
    """The Markdown page; ``dates`` says when each task was measured."""
    sys.path.insert(0, str(ROOT))
    from etrace_fit.tasks import TASKS

    lines = ["# Benchmarks: accuracy of every rule against BPTT", "",
             "Written by `benchmarks/accuracy.py` (do not edit by hand). Each task trains with its defaults",
             "(`etrace-fit tasks`; the scripts in `examples/`) on this project's 2-core CPU machine, seeds",
             "interleaved; medians over seeds; jax 0.10.2.", ""]
    for task, per_algo in results.items():
        lines += [f"## {task}", "", TASKS[task].description, "", f"Measured {dates[task]}.", ""]
        if TASKS[task].reference:
            lines += [f"Published / reference: {TASKS[task].reference}.", ""]
        target = TASKS[task].target_accuracy
        extra = "" if target is None else f" iterations to val. accuracy ≥ {target} (per seed) |"
        lines += ["| rule | final val. accuracy (median) | per seed | best epoch (median) | s / epoch | peak RSS (MiB) |"
                  + extra, "|---|---|---|---|---|---|" + ("" if target is None else "---|")]
        for algo, runs in per_algo.items():
            accuracy = statistics.median(r["accuracy"] for r in runs)
            best = statistics.median(r["best"] for r in runs)
            seconds = statistics.median(s for r in runs for s in r["epoch_seconds"])
            rss = max(r["peak_rss_mib"] for r in runs)
            seeds = ", ".join(f"{r['accuracy']:.3f}" for r in runs)
            row = f"| {algo} | {accuracy:.3f} | {seeds} | {best:.3f} | {seconds:.2f} | {rss:.0f} |"
            if target is not None:
                row += " " + ", ".join("not reached" if r.get("iterations_to_target") is None
                                       else str(r["iterations_to_target"]) for r in runs) + " |"
            lines.append(row)
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["mnist1d-gru", "copy"])
    parser.add_argument("--algos", nargs="+", default=["hybrid", "d_rtrl", "esd_rtrl", "bptt"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--from-json", help="render saved results instead of running")
    parser.add_argument("--write-docs", action="store_true", help="write docs/benchmarks.md")
    args, options = parser.parse_known_args(argv)  # the rest goes to every run (e.g. --epochs 1)
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        results, dates = saved["results"], saved["dates"]
    else:
        saved = json.loads(Path(args.json).read_text()) if args.json and Path(args.json).exists() else {}
        results, dates = saved.get("results", {}), saved.get("dates", {})
        for task in args.tasks:
            results.setdefault(task, {}).update({algo: [] for algo in args.algos})
            dates[task] = time.strftime("%Y-%m-%d")
            for seed in args.seeds:
                for algo in args.algos:
                    result = run_one(task, algo, seed, options)
                    results[task][algo].append(result)
                    print(f"{task} {algo} seed {seed}: {result['accuracy']:.3f}", flush=True)
                    if args.json:  # after every run: a long benchmark interrupted keeps what it measured
                        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                        Path(args.json).write_text(json.dumps({"dates": dates, "results": results}, indent=1))
    page = render(results, dates)
    print(page)
    if args.write_docs:
        (ROOT / "docs" / "benchmarks.md").write_text(page + "\n")


if __name__ == "__main__":
    main()

"""``etrace-fit train`` with its defaults against ``--algo bptt``: accuracy and wall time, seeds interleaved.

    python benchmarks/demo.py [--seeds 0 1 2] [--algos hybrid bptt] [--json benchmarks/results/demo.json]

For every seed, each algo trains the default task (the e-prop evidence task, T = 230,
loss at the last step) from scratch with the command's defaults (``etrace_fit.cli.train``;
no TensorBoard logs, no progress bar), one algo after the other (hybrid, bptt, hybrid,
bptt, ...), so a noisy neighbour slows both alike. Each run is a fresh Python process,
as each ``etrace-fit train`` is: runs in one process had changed one another's times
(2026-11-26: with the order hybrid, eprop, bptt, BPTT's second and third seeds took
12.4–12.7 s against 14.8 s for its first and 15.3–15.9 s for the hybrid's; with the
order bptt, hybrid both took 15.2–15.3 s). The table gives, per algo, the median over
seeds of the final validation accuracy and of the wall time of ``fit`` (compilation
included, as a user sees it; the process's start and imports not), and their ratio to
the last algo, and the first seed's time on its own. By default (``--compile-cache
fresh``) the runs share a compile cache that starts empty, as the command's default
cache does on a fresh machine (``etrace-fit train`` keeps its compiled programs in
``~/.cache/etrace_fit/compiled``): each algo's first seed compiles its programs, its
later seeds read them; with ``--compile-cache none`` every run compiles, as the
command did before it kept a cache. ``benchmarks/speed.py --write-docs``
copies the table into ``docs/performance.md`` when the JSON is there.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

from etrace_fit import tasks

ROOT = pathlib.Path(__file__).resolve().parent.parent
TARGET = 0.93  # the validation accuracy the demo target asks for

# One run in a fresh process: ``etrace-fit train`` with the given arguments; prints the
# summary's accuracy and fit seconds as JSON on its last line.
RUN = """
import json, sys, warnings
warnings.simplefilter("ignore")
from etrace_fit import cli
summary = cli.train(cli._parser().parse_args(sys.argv[1:]))
print(json.dumps({"accuracy": float(summary["accuracy"]), "seconds": float(summary["seconds"]),
                  "val_accuracy": [float(v) for v in summary["history"]["val_accuracy"]],
                  "epoch_seconds": summary["epoch_seconds"]}))
"""


def run(arguments: list[str]) -> dict:
    """``etrace-fit train`` with ``arguments`` in a fresh Python process: its final
    accuracy, fit seconds, validation accuracy after each epoch and seconds from the
    start of fit to each epoch's end."""
    result = subprocess.run([sys.executable, "-c", RUN, *arguments], cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"etrace-fit train {shlex.join(arguments)} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def to_target(runs: list[dict], target: float) -> float:
    """The median over ``runs`` of the seconds from the start of fit to the end of the
    first epoch whose validation reached ``target`` (a run that never did counts as
    inf); nan if a run was saved before the epochs' times were kept."""
    if any("epoch_seconds" not in run for run in runs):
        return math.nan
    seconds = [tasks.seconds_to_target(run["val_accuracy"], target, run["epoch_seconds"]) for run in runs]
    return statistics.median(math.inf if value is None else value for value in seconds)


def table(results: dict, target: float = TARGET) -> list[str]:
    """Markdown rows: per algo, median accuracy and seconds over the seeds, the median
    seconds until the validation first reached ``target`` (validation runs after each
    epoch), each as a ratio to the last algo's, and the first seed's seconds (the run
    that compiled, when the runs shared a compile cache)."""
    algos = list(results)
    base = statistics.median(r["seconds"] for r in results[algos[-1]])
    reach_base = to_target(results[algos[-1]], target)
    first_base = results[algos[-1]][0]["seconds"]
    lines = ["| algo | seeds | validation accuracy (median, min–max) | fit wall time s (median) | time / "
             f"{algos[-1]} | s to {target} (median) | / {algos[-1]}'s | first seed s | first / {algos[-1]}'s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for algo, runs in results.items():
        accuracies = [r["accuracy"] for r in runs]
        seconds = statistics.median(r["seconds"] for r in runs)
        reach = to_target(runs, target)
        first = runs[0]["seconds"]
        ratio = f"{reach / reach_base:.2f}" if math.isfinite(reach) and math.isfinite(reach_base) else "—"
        reached = (f"{reach:.1f} | {ratio}" if math.isfinite(reach) else
                   "not recorded | —" if math.isnan(reach) else "not reached | —")
        lines.append(f"| {algo} | {len(runs)} | {statistics.median(accuracies):.3f} ({min(accuracies):.3f}–"
                     f"{max(accuracies):.3f}) | {seconds:.1f} | {seconds / base:.2f} | {reached} | {first:.1f} | "
                     f"{first / first_base:.2f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--algos", nargs="+", default=["hybrid", "bptt"])
    parser.add_argument("--json", help="write the runs here")
    parser.add_argument("--epochs", type=int, help="fewer epochs than the task's (a smoke run)")
    parser.add_argument("--samples", type=int, help="fewer training sequences than the task's (a smoke run)")
    parser.add_argument("--compile-cache", choices=["fresh", "none"], default="fresh",
                        help="fresh (default, the command's default cache on a fresh machine): the runs share a "
                             "compile cache that starts empty (the first seed of each algo compiles, the later "
                             "ones read its programs); none: every run compiles")
    args = parser.parse_args()
    results: dict = {algo: [] for algo in args.algos}
    with tempfile.TemporaryDirectory(prefix="etrace-fit-demo-cache-") as folder:
        cache = folder if args.compile_cache == "fresh" else "none"
        for seed in args.seeds:
            for algo in args.algos:
                extra = [flag for name in ("epochs", "samples") if getattr(args, name)
                         for flag in (f"--{name}", str(getattr(args, name)))]
                summary = run(["train", "--algo", algo, "--seed", str(seed), "--logdir", "none", "--verbose", "0",
                               "--compile-cache", cache, *extra])
                results[algo].append({"seed": seed, **summary})
    text = "\n".join(table(results))
    print(text)
    if args.json:
        meta = {"date": time.strftime("%Y-%m-%d"), "command": shlex.join(["python", "benchmarks/demo.py", *sys.argv[1:]])}
        pathlib.Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1))


if __name__ == "__main__":
    main()

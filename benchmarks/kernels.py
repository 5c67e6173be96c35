"""Where a compiled program's time goes, kernel by kernel, from XLA's own trace events.

    python benchmarks/kernels.py [--model gru] [--rule esd_rtrl] [--loss all] [--hidden 128] [--batch 16]
        [--length 200] [--calls 5] [--top 25] [--compile]
    python benchmarks/kernels.py --demo hybrid      # the demo's training step (etrace-fit train)

Builds one program as ``speed.py`` does (``--model``, ``--rule`` including ``bptt``,
``--loss``, sizes) or, with ``--demo ALGO``, the Trainer's step of the demo task as
``demo_step.py`` does; runs it ``--calls`` times under ``jax.profiler.trace`` with XLA's
per-kernel trace events on (``--xla_cpu_enable_xprof_traceme``, set before JAX starts),
and prints per call: each kernel's total time and launches (a kernel in a loop of 200
steps launches 200 times), and totals by kind (products, copies, stacking writes into a
loop's buffers, transposes, fills, other fusions). Kernels run on the host's threads side
by side, so their sum exceeds the wall time; a ``while`` row includes the kernels of its
body and is left out of the totals. ``--compile`` profiles the program's XLA compilation
instead: the HLO passes, the fusion emitters (one per fusion) and LLVM's code generation.

Use it to find what to change; measure a change with ``speed.py`` or ``demo_step.py``
(programs side by side): the profiler's own cost inflates every kernel a little.
"""

from __future__ import annotations

import os
import sys

# XLA reads its flags once, when JAX starts: the per-kernel events must be asked for first.
_FLAG = "--xla_cpu_enable_xprof_traceme=true"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

import argparse  # noqa: E402
import collections  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import brainstate  # noqa: E402
import jax  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import speed  # noqa: E402

# By the kernel's HLO name, in this order: a fusion is named after what it fuses
# ("transpose_copy_fusion" transposes, "copy.12" only copies, "wrapped_broadcast.3" only
# fills, "broadcast_add_fusion" adds).
KINDS = (("dynamic-update-slice", "stacking writes"), ("transpose", "transposes"))
PRODUCT_MARKS = ("ynn_fusion", "dot", "custom-call", "gemm")
COMPILE_EVENTS = ("HLO passes through layout assignment", "HLO passes after layout assignment",
                  "FusionCompiler::Compile", "Codegen", "ThunkEmitter::EmitEntryComputation")


def kind_of(name: str) -> str:
    """The kind of a kernel event by its HLO name."""
    if name.startswith("while"):
        return "loop (includes its body)"
    if any(mark in name for mark in PRODUCT_MARKS):
        return "products"
    for mark, kind in KINDS:
        if mark in name.lower():
            return kind
    if name.startswith(("wrapped_broadcast", "broadcast.")):
        return "fills"
    return "copies" if name.startswith("copy") else "other fusions"


def events(trace_dir: str) -> list[dict]:
    """The complete ("X") events of the one trace ``jax.profiler.trace`` wrote there."""
    paths = sorted(pathlib.Path(trace_dir).rglob("*.trace.json.gz"))
    if not paths:
        raise RuntimeError(f"jax.profiler wrote no trace under {trace_dir}")
    with gzip.open(paths[-1]) as handle:
        data = json.load(handle)
    return [e for e in data["traceEvents"] if e.get("ph") == "X"]


def kernel_table(found: list[dict], calls: int, top: int) -> list[str]:
    """Per call: the ``top`` kernels by time and the totals by kind (ms)."""
    total, launches = collections.Counter(), collections.Counter()
    for event in found:
        name = event["name"]
        if name.startswith(("$", "end:")) or "Execute" in name or name.startswith(("Pjit", "DevicePut")):
            continue  # Python frames, the executor itself, the end markers of async kernels
        total[name] += event.get("dur", 0) / 1e3 / calls
        launches[name] += 1
    by_kind = collections.Counter()
    for name, ms in total.items():
        by_kind[kind_of(name)] += ms
    kernels = sum(ms for kind, ms in by_kind.items() if not kind.startswith("loop"))
    lines = [f"kernels: {kernels:.2f} ms a call in all (threads side by side; loops' rows not counted)", "",
             "| kind | ms a call | share |", "|---|---|---|"]
    for kind, ms in by_kind.most_common():
        share = "—" if kind.startswith("loop") else f"{ms / kernels:.0%}"
        lines.append(f"| {kind} | {ms:.2f} | {share} |")
    lines += ["", "| kernel | kind | ms a call | launches a call |", "|---|---|---|---|"]
    for name, ms in total.most_common(top):
        lines.append(f"| {name} | {kind_of(name)} | {ms:.3f} | {launches[name] // calls} |")
    return lines


def compile_table(found: list[dict]) -> list[str]:
    """The compilation's phases: total time and count of each."""
    total, count = collections.Counter(), collections.Counter()
    for event in found:
        for phase in COMPILE_EVENTS:
            if event["name"].startswith(phase):
                total[phase] += event.get("dur", 0) / 1e3
                count[phase] += 1
    lines = ["| phase | ms (summed over threads) | events |", "|---|---|---|"]
    lines += [f"| {phase} | {total[phase]:.1f} | {count[phase]} |" for phase in COMPILE_EVENTS if count[phase]]
    return lines


def build(args) -> tuple:
    """``(lowered program, its arguments)``."""
    brainstate.environ.set(dt=1.0)
    if args.demo:
        import demo_step
        from etrace_fit.cli import TASKS

        (step, state, xs, ys, weight), _ = demo_step.build(TASKS["evidence"], args.demo)
        arguments = (state, [xs], ys, weight, None)
        jax.clear_caches()  # lowered anew, so that compiling it compiles (a lowering keeps its executable)
        return step.lower(*arguments, start=True), arguments
    model = speed.build(args.model, args.hidden, args.batch)
    xs, ys = speed.data(args.model, args.batch, args.length, args.loss)
    compiled, arguments, _, _ = speed.compile_rule(model, args.rule, xs, ys, args.loss)
    return compiled, arguments


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gru", choices=[*speed.MODELS, *speed.LIBRARY])
    parser.add_argument("--rule", default="esd_rtrl", choices=["bptt", "d_rtrl", "esd_rtrl"])
    parser.add_argument("--loss", default="all", choices=["all", "last", "mask"])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=200)
    parser.add_argument("--demo", metavar="ALGO", help="the demo's training step under this algo instead")
    parser.add_argument("--calls", type=int, default=5, help="calls traced (after three untraced)")
    parser.add_argument("--top", type=int, default=25, help="kernels listed")
    parser.add_argument("--compile", action="store_true", help="profile the compilation instead")
    args = parser.parse_args()
    if args.calls < 1:
        parser.error(f"--calls must be at least 1, got {args.calls}")
    if args.compile and not args.demo:
        parser.error("--compile profiles the demo's step: give --demo ALGO")
    program, arguments = build(args)
    with tempfile.TemporaryDirectory() as trace_dir:
        if args.compile:
            with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
                start = time.perf_counter()
                program.compile()
                seconds = time.perf_counter() - start
            print(f"compiled in {seconds:.2f} s (wall, profiled)\n")
            print("\n".join(compile_table(events(trace_dir))))
            return
        compiled = program.compile() if args.demo else program
        for _ in range(3):
            jax.block_until_ready(compiled(*arguments))
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            for _ in range(args.calls):
                jax.block_until_ready(compiled(*arguments))
        print("\n".join(kernel_table(events(trace_dir), args.calls, args.top)))


if __name__ == "__main__":
    main()

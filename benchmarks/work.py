"""The work each rule's compiled program does per time step, counted in its optimised
HLO: no clock, no noise.

    python benchmarks/work.py [--models gru rlif lif] [--hidden 128] [--batch 16] [--length 200] [--loss all last] [--demo]

For each model of ``speed.py`` it compiles the whole-sequence gradient of ``bptt``,
``d_rtrl`` and ``esd_rtrl`` as ``speed.py`` does (the Trainer's compiler options) and
walks the program XLA will run: a loop's body counts once per trip (XLA's known trip
count), a conditional by its costlier branch. Per time step it counts

- the multiply-adds of every matrix product, split into *thin* products, whose smallest
  side (rows, columns or inner dimension) is at most the batch size — a step loop's
  ``(B, K)(K, O)`` (``rows``), BPTT's per-step ``Xᵀ δ``, which contracts the ``B`` rows
  (``inner``: a product whose inner dimension is the batch size) — and
  *batched* ones (a chunk's ``(C·B, K)ᵀ (C·B, O)``); of the step's ``(B, K)(K, O)``,
  those whose ``(K, O)`` operand is contracted along its minor dimension, read across
  its rows (``folded``: a pull-back ``δy @ Wᵀ`` with the transpose folded into the
  product, which XLA on CPU runs slower than one on a transposed copy);
- the kernels launched: every operation of a loop body or of the entry that is not
  bookkeeping (a fusion, a product, a copy count one each);
- the bytes written by fills and copies (``filled``): a fusion that only broadcasts a
  number (XLA's zero-filled start of a scan's stacked outputs) and a copy, by the size
  of what they write. A loop over chunks that filled its step loop's buffers anew for
  each chunk counts them once per chunk.

Why: a ratio of wall times on a shared 2-core machine moves by 5-20 % from run to run,
these counts do not; and they say which part of a rule's time is arithmetic the rule
must do. On these small nets the thin products and the kernels run at a per-step pace
that batching cannot change, so a rule whose thin products count as many multiply-adds
as BPTT's does not run in a fraction of BPTT's time. The table gives the measured wall
ratio (``results/speed.json``) alongside when it has the configuration. ``--demo`` counts
the demo's training step too (``demo_step.build``: the Trainer's own step).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import pathlib
import re
import sys
import warnings
from collections import Counter

import brainstate
import jax

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import speed  # noqa: E402

from etrace_fit import _compat  # noqa: E402

RULES = ("bptt", "d_rtrl", "esd_rtrl")
RESULTS = pathlib.Path(__file__).parent / "results" / "speed.json"
# Operations that launch nothing: they name, pass or reinterpret buffers.
_BOOKKEEPING = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "opt-barrier",
                "partition-id", "replica-id"}
_HEADER = re.compile(r"^(?:ENTRY )?%([^\s(]+) ")
_SHAPE = re.compile(r"^[a-z]+\d*\[([\d,]*)\]")


def _split_definition(line: str) -> tuple[str, str, str, str] | None:
    """``(name, type, opcode, rest)`` of an HLO instruction line, else ``None``."""
    line = line.strip()
    if line.startswith("ROOT "):
        line = line[5:]
    if not line.startswith("%") or " = " not in line:
        return None
    name, rest = line[1:].split(" = ", 1)
    if rest.startswith("("):  # a tuple type: up to its matching parenthesis
        depth = 0
        for end, char in enumerate(rest):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0:
                break
        type_, rest = rest[:end + 1], rest[end + 2:]
    else:
        type_, rest = rest.split(" ", 1)
    opcode, _, rest = rest.partition("(")
    return name, type_, opcode, rest


def _dims(text: str) -> list[int]:
    match = _SHAPE.match(text)
    return [int(d) for d in match.group(1).split(",") if d] if match else []


def _minor(type_: str) -> int | None:
    """The minor-most dimension of an array type's layout (``f32[128,10]{1,0}``: 1)."""
    match = re.search(r"\]\{(\d+)", type_)
    return int(match.group(1)) if match else None


def _attribute_dims(rest: str, key: str) -> list[int]:
    match = re.search(key + r"=\{([\d,]*)\}", rest)
    return [int(d) for d in match.group(1).split(",") if d] if match else []


def parse(hlo: str) -> tuple[dict[str, list], str]:
    """The computations of an HLO module's text (name → its instructions as
    ``(name, type, opcode, rest)``) and the entry computation's name."""
    computations, entry, current = {}, None, None
    for line in hlo.splitlines():
        if line.endswith("{") and not line.startswith(" "):
            header = _HEADER.match(line)
            if header:
                current = computations.setdefault(header.group(1), [])
                entry = header.group(1) if line.startswith("ENTRY") else entry
            continue
        if line.startswith("}"):
            current = None
        elif current is not None:
            definition = _split_definition(line)
            if definition:
                current.append(definition)
    return computations, entry


_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8,
             "s64": 8, "u64": 8}


def _bytes(type_: str) -> int:
    """The size of an array type ``f32[100,16]{1,0}`` (0 for a tuple)."""
    dtype = type_.split("[", 1)[0]
    return _ITEMSIZE.get(dtype, 0) * math.prod(_dims(type_)) if "[" in type_ and not type_.startswith("(") else 0


def count(hlo: str, thin: int) -> Counter:
    """Over a whole run of the module ``hlo``: multiply-adds of thin (``"thin"``) and
    batched (``"batched"``) products, kernels launched (``"kernels"``) and bytes written
    by fills and copies (``"filled"``); see the module docstring. A loop without a known
    trip count is an error."""
    computations, entry = parse(hlo)
    shapes = {name: type_ for instructions in computations.values() for name, type_, _, _ in instructions}

    def is_fill(computation: str) -> bool:  # a fusion that only broadcasts a number
        opcodes = [opcode for _, _, opcode, _ in computations[computation]]
        return opcodes[-1] == "broadcast" and set(opcodes) <= {"parameter", "constant", "broadcast"}

    def products(computation: str) -> Counter:  # the products inside a fusion
        total = Counter()
        for name, type_, opcode, rest in computations[computation]:
            if opcode == "dot":
                total += _product(type_, rest)
            elif opcode == "fusion":
                total += products(re.search(r"calls=%([^\s,]+)", rest).group(1))
        return total

    def _product(type_: str, rest: str) -> Counter:
        operands = re.findall(r"%([^\s,)]+)", rest.split(")", 1)[0])
        lhs, rhs = _dims(shapes[operands[0]]), _dims(shapes[operands[1]])
        lhs_inner, lhs_batch = _attribute_dims(rest, "lhs_contracting_dims"), _attribute_dims(rest, "lhs_batch_dims")
        rhs_inner, rhs_batch = _attribute_dims(rest, "rhs_contracting_dims"), _attribute_dims(rest, "rhs_batch_dims")
        inner = math.prod(lhs[d] for d in lhs_inner)
        rows = math.prod(n for d, n in enumerate(lhs) if d not in lhs_inner and d not in lhs_batch)
        columns = math.prod(n for d, n in enumerate(rhs) if d not in rhs_inner and d not in rhs_batch)
        batch = math.prod(lhs[d] for d in lhs_batch)
        macs = batch * rows * columns * inner
        if inner == thin:  # contracts the batch's rows: a weight gradient Xᵀ δ over one step
            return Counter({"thin": macs, "inner": macs})
        if min(rows, columns) <= thin:  # a step's product: (B, K)(K, O)
            # its other operand read across its rows: contracted along its minor dimension
            folded = len(rhs) == 2 and not rhs_batch and rhs_inner == [_minor(shapes[operands[1]])]
            return Counter({"thin": macs, "rows": macs, "folded": macs if folded else 0})
        return Counter({"batched": macs})

    def run(computation: str) -> Counter:  # a computation XLA runs instruction by instruction
        total = Counter()
        for name, type_, opcode, rest in computations[computation]:
            if opcode == "while":
                trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', rest)
                if trips is None:
                    raise ValueError(f"while loop %{name} has no known trip count")
                body = run(re.search(r"body=%([^\s,]+)", rest).group(1))
                total += Counter({key: value * int(trips.group(1)) for key, value in body.items()})
            elif opcode == "conditional":
                branches = re.search(r"branch_computations=\{([^}]*)\}", rest)
                names = (re.findall(r"%([^\s,]+)", branches.group(1)) if branches else
                         [re.search(key + r"=%([^\s,]+)", rest).group(1) for key in ("true_computation",
                                                                                       "false_computation")])
                total += max((run(n) for n in names), key=lambda c: (c["thin"] + c["batched"], c["kernels"]))
            elif opcode == "call":
                total += run(re.search(r"to_apply=%([^\s,]+)", rest).group(1))
            elif opcode not in _BOOKKEEPING:
                total["kernels"] += 1
                if opcode == "copy":
                    total["filled"] += _bytes(type_)
                if opcode == "fusion":
                    called = re.search(r"calls=%([^\s,]+)", rest).group(1)
                    total += products(called)
                    total["filled"] += _bytes(type_) if is_fill(called) else 0
                elif opcode == "dot":
                    total += _product(type_, rest)
        return total

    return run(entry)


def rule_work(model, rule: str, xs, ys, loss: str, batch: int) -> Counter:
    """Per-step counts (:func:`count`) of ``rule``'s whole-sequence gradient, compiled
    as ``speed.py`` compiles it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = speed.compile_rule(model, rule, xs, ys, loss)[0]
    length = xs.shape[0]
    return Counter({key: value / length for key, value in count(compiled.as_text(), thin=batch).items()})


def measured_ratio(name: str, hidden: int, batch: int, length: int, loss: str, rule: str) -> str:
    """The wall ratio to BPTT ``speed.py`` saved for this configuration, else ``—``."""
    if not RESULTS.exists():
        return "—"
    entry = speed.find(json.loads(RESULTS.read_text()).get("results", []), model=name, H=hidden, B=batch, T=length,
                       loss=loss)
    return f"{entry['rules'][rule]['wall_ratio']:.2f}" if entry and rule in entry["rules"] else "—"


def _ratios(counts: Counter, base: Counter) -> dict:
    """``counts``' numbers and their ratios to ``base``'s (BPTT's)."""
    return {"thin": counts["thin"], "rows": counts["rows"], "inner": counts["inner"], "batched": counts["batched"],
            "kernels": counts["kernels"], "filled": counts["filled"], "folded": counts["folded"],
            "macs_ratio": (counts["thin"] + counts["batched"]) / (base["thin"] + base["batched"]),
            "thin_ratio": counts["thin"] / base["thin"], "kernels_ratio": counts["kernels"] / base["kernels"]}


def _cells(row: dict) -> str:
    filled = f"{row['filled'] / 1e3:.1f} kB" if "filled" in row else "—"  # rows saved before it was counted
    return (f"{row['thin'] / 1e3:.0f} k | {row.get('inner', 0) / 1e3:.0f} k | {row['batched'] / 1e3:.0f} k "
            f"| {row['macs_ratio']:.2f} "
            f"| {row['thin_ratio']:.2f} | {row['kernels']:.1f} | {row['kernels_ratio']:.2f} | {filled}")


_COLUMNS = ("thin MACs / step | of them Xᵀ δ over B rows | batched MACs / step | MACs / bptt | thin MACs / bptt "
            "| kernels / step | kernels / bptt | filled and copied / step")


def measure(names, hidden: int, batch: int, length: int, losses) -> list[dict]:
    """Per model, loss and rule: the per-step counts and their ratios to BPTT's."""
    rows = []
    for name in names:
        model = speed.build(name, hidden, batch)
        for loss in losses:
            xs, ys = speed.data(name, batch, length, loss)
            work = {rule: rule_work(model, rule, xs, ys, loss, batch) for rule in RULES}
            rows += [{"model": name, "H": hidden, "B": batch, "T": length, "loss": loss, "rule": rule,
                      **_ratios(counts, work["bptt"])} for rule, counts in work.items()]
    return rows


def render(rows: list[dict]) -> list[str]:
    """Markdown rows of :func:`measure`'s counts, with the measured wall ratio."""
    lines = [f"| model | loss | rule | {_COLUMNS} | measured wall / bptt |", "|---" * 12 + "|"]
    return lines + [f"| {r['model']} | {r['loss']} | {r['rule']} | {_cells(r)} "
                    f"| {measured_ratio(r['model'], r['H'], r['B'], r['T'], r['loss'], r['rule'])} |" for r in rows]


def demo_rows(algos=("hybrid", "esd_rtrl", "bptt")) -> list[dict]:
    """Per-step counts of the demo's training step (``etrace-fit train``'s evidence task,
    batch 32, loss at the last of 230 steps) under each algo, as the Trainer compiles it
    (``demo_step.build``), with ratios to the last algo's."""
    import demo_step

    from etrace_fit.cli import TASKS

    task = TASKS["evidence"]
    counts = {}
    for algo in algos:
        (step, state, xs, ys, weight), _ = demo_step.build(task, algo)
        hlo = step.lower(state, [xs], ys, weight, None, start=True).compile().as_text()
        counts[algo] = Counter({key: value / xs.shape[0] for key, value in count(hlo, thin=xs.shape[1]).items()})
    return [{"algo": algo, **_ratios(c, counts[algos[-1]])} for algo, c in counts.items()]


def render_demo(rows: list[dict]) -> list[str]:
    """Markdown rows of :func:`demo_rows`."""
    return [f"| algo | {_COLUMNS} |", "|---" * 9 + "|"] + [f"| {r['algo']} | {_cells(r)} |" for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(speed.MODELS), choices=list(speed.MODELS))
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=200)
    parser.add_argument("--loss", nargs="+", default=["all", "last"], choices=["all", "last"])
    parser.add_argument("--demo", action="store_true", help="also count the demo's training step under "
                        "hybrid, esd_rtrl and bptt (etrace-fit train's default task)")
    parser.add_argument("--json", type=pathlib.Path, help="also save the counts here (speed.py --write-docs "
                        "renders results/work.json into docs/performance.md)")
    args = parser.parse_args()
    brainstate.environ.set(dt=1.0)
    rows = measure(args.models, args.hidden, args.batch, args.length, args.loss)
    print(f"H = {args.hidden}, B = {args.batch}, T = {args.length}; thin: smallest side <= {args.batch}; "
          f"jax {jax.__version__}, compiler options {_compat.compiler_options()}\n")
    print("\n".join(render(rows)))
    demo = demo_rows() if args.demo else None
    if demo:
        print("\nThe demo's training step (evidence task, batch 32, loss at the last of 230 steps):\n")
        print("\n".join(render_demo(demo)))
    if args.json:
        command = "python benchmarks/work.py " + " ".join(sys.argv[1:])
        meta = {"date": datetime.date.today().isoformat(), "jax": jax.__version__, "command": command}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows, "demo": demo}, indent=1))


if __name__ == "__main__":
    main()

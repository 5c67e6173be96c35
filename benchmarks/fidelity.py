"""Gradient fidelity of the online rules: each weight's online gradient against BPTT's.

    python benchmarks/fidelity.py --json OUT.json [--models gru lstm two_lif alif_readout]
        [--lengths 50 200] [--label NAME] [--batch 8] [--hidden 32]
    python benchmarks/fidelity.py --write-docs --before BEFORE.json --after AFTER.json [--docs docs/fidelity.md]

Models (B=8, I=16, H=32, O=4 by default, fixed seeds, float64, dt = 1): a GRU and an
LSTM cell with a linear readout (gate weights random with scale 1.5), two LIF layers
(``Linear → LIF → Linear → LIF → Linear``), and ``Linear → ALIF → LeakyRateReadout``.
Inputs and targets are standard normal; the spiking layers' weights (scale 2) make them
spike 9–24 % of the time. The loss is the squared error summed over every step. For every
model, length T and rule (d_rtrl, esd_rtrl, hybrid) it computes
``etrace_fit.sequence_grad`` and, per weight leaf, the cosine and the norm ratio
``|online| / |bptt|`` against a BPTT gradient computed independently of the library
(``brainstate.transform.grad`` over ``brainstate.transform.for_loop``). The spiking
models' spike fractions are printed (target 5–50 %); the warnings ``sequence_grad``
emits are ignored but kept in the JSON.

The first form prints the tables and writes the raw results (with the label, the git
commit of the imported ``etrace_fit``, the jax version and the date) as JSON; the
second turns a "before" and an "after" JSON into ``docs/fidelity.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import subprocess
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Callable

import brainstate
import jax
import jax.numpy as jnp
import numpy as np

import etrace_fit as ef
from etrace_fit import layers

RULES = ("d_rtrl", "esd_rtrl", "hybrid")
INPUT_SEED, TARGET_SEED = 10, 11
SPIKE_FRACTION_RANGE = (0.05, 0.5)
DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "fidelity.md"


@dataclass(frozen=True)
class Sizes:
    batch: int = 8
    inputs: int = 16
    hidden: int = 32
    outputs: int = 4


# ------------------------------------------------------------------ models

def rand(seed: int, *shape: int, scale: float = 1.0) -> np.ndarray:
    """A float64 numpy normal array (weights are built from arrays: brainstate's random
    initializers compile once per shape)."""
    return np.random.default_rng(seed).standard_normal(shape) * scale


def lin(in_size: int, out_size: int, seed: int, scale: float = 1.0) -> layers.Linear:
    return layers.Linear(in_size, out_size, w_init=rand(seed, in_size, out_size, scale=scale / np.sqrt(in_size)),
                         b_init=rand(seed + 1, out_size, scale=0.3))


def randomize(module: brainstate.nn.Module, seed: int, scale: float = 1.0, bias_scale: float = 0.3):
    """Fresh random values for every dict-valued ``ParamState`` (``W ~ N(0, scale²/fan_in)``,
    ``b ~ N(0, bias_scale²)``): gates built from one ``w_init`` array would start identical."""
    rng = np.random.default_rng(seed)
    for _, state in sorted(module.states(brainstate.ParamState).items()):
        if not isinstance(state.value, dict):
            continue
        new = {}
        for key in sorted(state.value):
            leaf = state.value[key]
            std = scale / np.sqrt(np.prod(leaf.shape[:-1])) if key == "weight" else bias_scale
            new[key] = jnp.asarray(rng.standard_normal(leaf.shape) * std, dtype=leaf.dtype)
        state.value = new
    return module


def gru(s: Sizes) -> ef.Sequential:
    cell = layers.GRUCell(s.inputs, s.hidden, w_init=np.zeros((s.inputs + s.hidden, s.hidden)),
                          b_init=np.zeros(s.hidden))
    return randomize(ef.Sequential(cell, lin(s.hidden, s.outputs, 2)), seed=7, scale=1.5)


def lstm(s: Sizes) -> ef.Sequential:
    cell = layers.LSTMCell(s.inputs, s.hidden, w_init=np.zeros((s.inputs + s.hidden, s.hidden)),
                           b_init=np.zeros(s.hidden))
    return randomize(ef.Sequential(cell, lin(s.hidden, s.outputs, 2)), seed=7, scale=1.5)


def two_lif(s: Sizes) -> ef.Sequential:
    return ef.Sequential(lin(s.inputs, s.hidden, 0, 2.0), layers.LIF(s.hidden, tau=10.0, surrogate="sigmoid"),
                         lin(s.hidden, s.hidden, 4, 2.0), layers.LIF(s.hidden, tau=10.0, surrogate="sigmoid"),
                         lin(s.hidden, s.outputs, 2))


def alif_readout(s: Sizes) -> ef.Sequential:
    readout = layers.LeakyRateReadout(s.hidden, s.outputs, tau=5.0,
                                      w_init=rand(2, s.hidden, s.outputs, scale=1 / np.sqrt(s.hidden)),
                                      b_init=rand(3, s.outputs, scale=0.3))
    return ef.Sequential(lin(s.inputs, s.hidden, 0, 2.0),
                         layers.ALIF(s.hidden, tau=10.0, tau_a=30.0, surrogate="sigmoid"), readout)


MODELS: dict[str, Callable[[Sizes], ef.Sequential]] = {
    "gru": gru, "lstm": lstm, "two_lif": two_lif, "alif_readout": alif_readout,
}


# ------------------------------------------------------------------ measuring

def squared_error(out: jax.Array, target: jax.Array) -> jax.Array:
    return jnp.sum((out - target) ** 2)


def reference_bptt(model: brainstate.nn.Module, xs: jax.Array, targets: jax.Array, batch_size: int) -> dict:
    """BPTT by JAX's autodiff, independent of etrace_fit: the gradient of
    ``Σ_t squared_error(model(xs[t]), targets[t])`` from reset states."""
    params = model.states(brainstate.ParamState)

    def loss_fn():
        brainstate.nn.reset_all_states(model, batch_size=batch_size)
        outs = brainstate.transform.for_loop(model, xs)
        return jax.vmap(squared_error)(outs, targets).sum()

    grads = brainstate.transform.jit(brainstate.transform.grad(loss_fn, grad_states=params))()
    return jax.tree.map(np.asarray, grads)


def leaves_by_name(grads: dict) -> dict[str, np.ndarray]:
    """``{"layers.0.W_h.weight['weight']": array}``: one entry per leaf of every gradient."""
    out = {}
    for path, value in grads.items():
        name = ".".join(str(p) for p in path)
        for key_path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
            out[name + jax.tree_util.keystr(key_path)] = np.asarray(leaf, np.float64).ravel()
    return out


def cosine_and_norm_ratio(online: np.ndarray, reference: np.ndarray) -> tuple[float | None, float | None]:
    """``(online·reference / (|online| |reference|), |online| / |reference|)``; None where
    a zero norm leaves it undefined."""
    online_norm, reference_norm = float(np.linalg.norm(online)), float(np.linalg.norm(reference))
    if reference_norm == 0.0:
        return None, None
    if online_norm == 0.0:
        return None, 0.0
    return float(online @ reference) / (online_norm * reference_norm), online_norm / reference_norm


def spike_fractions(model: ef.Sequential, xs: jax.Array, batch_size: int) -> dict[str, float]:
    """Mean spike output of every spiking layer over the sequence, from reset states."""
    spiking = {f"layers.{i}": layer for i, layer in enumerate(model.layers) if hasattr(layer, "spikes")}
    if not spiking:
        return {}

    def step(x):
        model(x)
        return {name: layer.spikes() for name, layer in spiking.items()}

    brainstate.nn.reset_all_states(model, batch_size=batch_size)
    spikes = brainstate.transform.for_loop(step, xs)
    return {name: float(np.mean(value)) for name, value in spikes.items()}


def measure(name: str, lengths: list[int], sizes: Sizes) -> list[dict]:
    """One record per length: spike fractions, and per rule the warnings and every
    leaf's cosine and norm ratio against BPTT."""
    records = []
    with brainstate.environ.context(precision=64, dt=1.0):
        model = MODELS[name](sizes)
        brainstate.nn.init_all_states(model, batch_size=sizes.batch)
        for length in lengths:
            start = time.perf_counter()
            xs = jnp.asarray(rand(INPUT_SEED, length, sizes.batch, sizes.inputs), jnp.float64)
            ys = jnp.asarray(rand(TARGET_SEED, length, sizes.batch, sizes.outputs), jnp.float64)
            fractions = spike_fractions(model, xs, sizes.batch)
            reference = leaves_by_name(reference_bptt(model, xs, ys, sizes.batch))
            rules = {}
            for rule in RULES:
                brainstate.nn.reset_all_states(model, batch_size=sizes.batch)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    grads, _ = ef.sequence_grad(model, xs, ys, squared_error, algo=rule)
                online = leaves_by_name(grads)
                leaves = {}
                for leaf, ref in reference.items():
                    cosine, norm_ratio = cosine_and_norm_ratio(online[leaf], ref)
                    leaves[leaf] = {"cosine": cosine, "norm_ratio": norm_ratio}
                rules[rule] = {"leaves": leaves, "warnings": sorted({str(w.message) for w in caught})}
            records.append({"model": name, "length": length, "spike_fractions": fractions, "rules": rules,
                            "seconds": time.perf_counter() - start})
    return records


def etrace_fit_commit() -> tuple[str, bool]:
    """Short commit of the repository ``etrace_fit`` is imported from, and whether the
    package has uncommitted changes there."""
    package = pathlib.Path(ef.__file__).resolve().parent

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=package, capture_output=True, text=True, check=True).stdout.strip()

    return git("rev-parse", "--short", "HEAD"), bool(git("status", "--porcelain", "--", "."))


def fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


def print_record(record: dict) -> None:
    fractions = ", ".join(f"{layer} {f:.3f}" for layer, f in record["spike_fractions"].items())
    if fractions:
        low, high = SPIKE_FRACTION_RANGE
        in_range = all(low <= f <= high for f in record["spike_fractions"].values())
        print(f"spike fraction: {fractions}" + ("" if in_range else f" (outside {low:.0%}–{high:.0%})"))
    print("| weight | rule | cosine | norm ratio |")
    print("|---|---|---|---|")
    leaves = next(iter(record["rules"].values()))["leaves"]
    for leaf in leaves:
        for rule, result in record["rules"].items():
            values = result["leaves"][leaf]
            print(f"| `{leaf}` | {rule} | {fmt(values['cosine'])} | {fmt(values['norm_ratio'])} |")
    print(f"({record['seconds']:.1f} s)", flush=True)


def run_measurements(args: argparse.Namespace) -> None:
    sizes = Sizes(batch=args.batch, hidden=args.hidden)
    commit, modified = etrace_fit_commit()
    print(f"etrace_fit from {ef.__file__} (commit {commit}{', modified' if modified else ''}), jax {jax.__version__}")
    print(f"cosine and norm ratio vs bptt per weight leaf, float64, {sizes}")
    start = time.perf_counter()
    records = []
    for name in args.models:
        for record in measure(name, args.lengths, sizes):
            print(f"\n### {name}, T = {record['length']}\n")
            print_record(record)
            records.append(record)
    seconds = time.perf_counter() - start
    print(f"\ntotal {seconds:.0f} s")
    if args.json is not None:
        result = {"label": args.label, "commit": commit, "modified": modified, "etrace_fit": ef.__file__,
                  "jax": jax.__version__, "date": datetime.datetime.now().isoformat(timespec="seconds"),
                  "sizes": asdict(sizes), "seconds": seconds, "records": records}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")


# ------------------------------------------------------------------ docs

INTRO = """\
# Gradient fidelity of the online rules

How close is each online rule's gradient to BPTT's? For every weight leaf, this page
gives the cosine between the online gradient and BPTT's and the norm ratio
`‖online‖ / ‖bptt‖` (both 1 for an exact gradient), on a few small models, before and
after a change of the engine. Generated by `benchmarks/fidelity.py`:

    python benchmarks/fidelity.py --json OUT.json --label NAME
    python benchmarks/fidelity.py --write-docs --before BEFORE.json --after AFTER.json

**How.** One batch per model and length (fixed seeds; random normal inputs and
targets), float64 throughout, `dt = 1`. The loss is the squared error summed over
every step. The online gradient is `etrace_fit.sequence_grad(model, xs, ys, loss,
algo=rule)` from reset states; the BPTT gradient is computed independently of the
library, by `brainstate.transform.grad` over a `brainstate.transform.for_loop` of the
model. Models: `gru` and `lstm` (a cell with random gate weights of scale 1.5, then a
`Linear` readout), `two_lif` (`Linear → LIF → Linear → LIF → Linear`, τ = 10) and
`alif_readout` (`Linear → ALIF → LeakyRateReadout`, τ = 10, τ_a = 30, readout τ = 5).

**Approximate by design.** D-RTRL keeps the per-unit (diagonal) part of each layer's
state-to-state Jacobian: it is exact for per-unit recurrence (LIF, ALIF, the leaky
readout) and approximate for dense recurrent weights (the GRU's and LSTM's gates; the
GRU's reset gate `W_r`, whose effect passes through another weight, gets the one-step
gradient only). Every online rule follows a weight through its own layer's hidden
states, so a path that leaves a layer and comes back through a *later* layer's memory
is dropped: the first layer's weights of `two_lif` (through the second LIF layer). The
one later memory the traces follow is a leaky readout with a fixed τ: the layer it
reads carries one more trace state per unit (docs/theory.md §5.10), which makes D-RTRL
exact on `alif_readout` (before that change: 0.85 at T = 50, 0.63 at T = 200). ES-D-RTRL further factorises each
D-RTRL trace into an input trace and a state trace: it matches D-RTRL on biases (their
input trace is a leaky sum of ones) and approximates it on weight matrices. `hybrid`
puts each weight on D-RTRL or ES-D-RTRL by its trace memory (docs/algorithms.md).
"""

TARGETS = (
    # (text, model, which leaves, threshold)
    ("GRU `W_h` (weight and bias, the lower) under D-RTRL", "gru", "W_h", 0.85),
    ("LSTM, every weight leaf (the lowest) under D-RTRL", "lstm", "", 0.98),
)


def describe_run(what: str, run: dict) -> str:
    s = run["sizes"]
    modified = " with uncommitted changes" if run["modified"] else ""
    return (f"- {what} (\"{run['label']}\"): etrace_fit at `{run['commit']}`{modified}, jax {run['jax']}, "
            f"{run['date']}; B = {s['batch']}, I = {s['inputs']}, H = {s['hidden']}, O = {s['outputs']}; "
            f"{run['seconds']:.0f} s.")


def lowest_cosine(run: dict, model: str, length: int, leaf_part: str) -> tuple[float, str] | None:
    """The lowest D-RTRL cosine among the model's leaves whose name contains
    ``leaf_part``, with that leaf; None if the run lacks the model or length."""
    for record in run["records"]:
        if record["model"] == model and record["length"] == length:
            leaves = record["rules"]["d_rtrl"]["leaves"]
            return min((v["cosine"], leaf) for leaf, v in leaves.items()
                       if leaf_part in leaf and v["cosine"] is not None)
    return None


def target_lines(before: dict, after: dict) -> list[str]:
    lines = ["## Targets", ""]
    lengths = sorted({r["length"] for r in after["records"]})
    for text, model, leaf_part, threshold in TARGETS:
        for length in lengths:
            parts = []
            for what, run in (("before", before), ("now", after)):
                found = lowest_cosine(run, model, length, leaf_part)
                if found is None:
                    parts.append(f"{what} —")
                else:
                    value, leaf = found
                    parts.append(f"{what} {value:.4f} (`{leaf}`, {'met' if value >= threshold else 'not met'})")
            lines.append(f"- {text}, target ≥ {threshold}, T = {length}: " + "; ".join(parts))
    return lines + [""]


def model_tables(before: dict, after: dict) -> list[str]:
    before_records = {(r["model"], r["length"]): r for r in before["records"]}
    lines = []
    for record in after["records"]:
        old = before_records.get((record["model"], record["length"]))
        lines += [f"## {record['model']}, T = {record['length']}", ""]
        if record["spike_fractions"]:  # a property of the model and inputs, not of the engine
            fractions = ", ".join(f"`{layer}` {f:.3f}" for layer, f in record["spike_fractions"].items())
            lines += [f"Spike fraction: {fractions}.", ""]
        lines += ["| weight | rule | cosine before | cosine now | norm ratio before | norm ratio now |",
                  "|---|---|---|---|---|---|"]
        leaves = next(iter(record["rules"].values()))["leaves"]
        for leaf in leaves:
            for rule in RULES:
                now = record["rules"][rule]["leaves"][leaf]
                then = old["rules"][rule]["leaves"].get(leaf, {}) if old is not None else {}
                lines.append(f"| `{leaf}` | {rule} | {fmt(then.get('cosine'))} | {fmt(now['cosine'])} | "
                             f"{fmt(then.get('norm_ratio'))} | {fmt(now['norm_ratio'])} |")
        lines.append("")
    return lines


def write_docs(before_path: pathlib.Path, after_path: pathlib.Path, docs_path: pathlib.Path) -> None:
    before, after = json.loads(before_path.read_text()), json.loads(after_path.read_text())
    lines = [INTRO, describe_run("Before", before), describe_run("Now", after), ""]
    lines += target_lines(before, after) + model_tables(before, after)
    docs_path.write_text("\n".join(lines).rstrip() + "\n")
    print(f"wrote {docs_path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=pathlib.Path, help="write the raw results here")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--lengths", type=int, nargs="+", default=[50, 200])
    parser.add_argument("--batch", type=int, default=Sizes.batch)
    parser.add_argument("--hidden", type=int, default=Sizes.hidden)
    parser.add_argument("--label", default="now")
    parser.add_argument("--write-docs", action="store_true", help="write --docs from --before and --after")
    parser.add_argument("--before", type=pathlib.Path)
    parser.add_argument("--after", type=pathlib.Path)
    parser.add_argument("--docs", type=pathlib.Path, default=DOCS)
    args = parser.parse_args()
    if args.write_docs:
        if args.before is None or args.after is None:
            parser.error("--write-docs needs --before and --after")
        write_docs(args.before, args.after, args.docs)
    else:
        run_measurements(args)


if __name__ == "__main__":
    main()

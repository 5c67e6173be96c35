"""The benchmark scripts still run (tiny sizes); their numbers live in benchmarks/README.md."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("args", [
    ["benchmarks/compile_time.py", "--units", "16", "--batch", "2", "--repeats", "1"],
    ["benchmarks/rules.py", "--lengths", "4", "8", "--repeats", "1", "--models", "lif"],
    ["benchmarks/epoch_time.py", "--task", "rate", "--epochs", "2", "--rounds", "1", "--samples", "64"],
    ["benchmarks/fidelity.py", "--lengths", "4", "--batch", "2", "--hidden", "4"],
    ["benchmarks/es_floor.py", "--models", "lif", "--loss", "last", "--repeats", "1"],
    # exits non-zero when a hand-written form's gradient is not the engine's ES-D-RTRL one
    ["benchmarks/es_handwritten.py", "--chunks", "5", "--length", "10", "--repeats", "1"],
    ["benchmarks/demo_step.py", "--task", "rate", "--algos", "esd_rtrl", "bptt", "--calls", "2", "--rounds", "1"],
])
def test_benchmark_script_runs(args):
    result = subprocess.run([sys.executable, "-W", "ignore", *args], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "bptt" in result.stdout or "compile_graph" in result.stdout
    if args[0].endswith("demo_step.py"):  # each algo's row: its page faults a batch (a count), its temp MiB
        rows = [line.split(" | ") for line in result.stdout.splitlines() if line.startswith(("| esd_rtrl", "| bptt"))]
        assert "| page faults / batch |" in result.stdout and "| temp MiB |" in result.stdout and len(rows) == 2
        assert all(row[5].isdigit() for row in rows), rows
        assert all(float(row[9].rstrip(" |")) > 0 for row in rows), rows


@pytest.mark.slow
def test_speed_script_writes_docs_and_merges_a_remeasured_configuration(tmp_path):
    """The script writes the Markdown (targets and every rule's row) and its JSON;
    ``--merge``: the configurations measured now replace theirs in the saved JSON, the
    others stay, and the Markdown names the re-measurement; the JSON is written before
    the page, so a page that fails to render loses no measurement; without a saved file
    it refuses before measuring anything."""
    import json

    saved, first_out, out = tmp_path / "speed.json", tmp_path / "first.md", tmp_path / "performance.md"
    base = ["benchmarks/speed.py", "--quick", "--models", "gru", "--json", str(saved)]
    first = subprocess.run([sys.executable, "-W", "ignore", *base, "--repeats", "1", "--loss", "all", "last",
                            "--write-docs", "--out", str(first_out)], cwd=ROOT, capture_output=True, text=True,
                           timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    text = first_out.read_text()
    assert "## Targets" in text and "| target | model | measured | cpu ratio | result |" in text
    for rule in ("bptt", "d_rtrl", "esd_rtrl"):
        for loss in ("all", "last"):
            assert f"| 128 | 16 | 200 | {loss} | {rule} |" in text
    assert "| temp/bptt | faults / call |" in text
    before = {e["loss"]: e for e in json.loads(saved.read_text())["results"]}
    for entry in before.values():  # each call's page faults, a count: the column's last cell is the median
        for rule, r in entry["rules"].items():
            assert r["faults_median"] >= 0 and float(r["faults_median"]).is_integer(), (rule, r)
            row = next(line for line in text.splitlines() if line.startswith(f"| 128 | 16 | 200 | {entry['loss']} | "
                                                                                f"{rule} |"))
            assert row.split(" | ")[-1] == f"{r['faults_median']:.0f} |"
    again = subprocess.run([sys.executable, "-W", "ignore", *base, "--repeats", "2", "--loss", "last", "--merge",
                            "--write-docs", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    data = json.loads(saved.read_text())
    after = {e["loss"]: e for e in data["results"]}
    assert set(after) == {"all", "last"} and len(data["results"]) == 2
    assert after["all"] == before["all"]  # kept as it was
    assert after["last"]["repeats"] == 2 and len(after["last"]["rules"]["bptt"]["wall"]) == 2
    assert data["meta"]["repeats"] == 1 and data["meta"]["updates"][0]["configurations"] == [["gru", 128, 16, 200, "last"]]
    text = out.read_text()
    assert "measured again on" in text and "--merge" in text
    (tmp_path / "page.md").mkdir()  # the page cannot be written: the measurements are saved before it
    once_more = subprocess.run([sys.executable, "-W", "ignore", *base, "--repeats", "1", "--loss", "last", "--merge",
                                "--write-docs", "--out", str(tmp_path / "page.md")],
                               cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert once_more.returncode != 0 and "IsADirectoryError" in once_more.stderr
    updates = json.loads(saved.read_text())["meta"]["updates"]
    assert len(updates) == 1 and "--repeats 1" in updates[0]["command"]  # the earlier update is superseded
    assert "| 128 | 16 | 200 | all | esd_rtrl |" in text and "| 128 | 16 | 200 | last | esd_rtrl |" in text
    refused = subprocess.run([sys.executable, "-W", "ignore", "benchmarks/speed.py", "--quick", "--merge", "--json",
                              str(tmp_path / "missing.json")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and "--merge needs --json" in refused.stderr and "[1/" not in refused.stderr


@pytest.mark.slow
def test_demo_script_compares_the_algos(tmp_path):
    out = tmp_path / "demo.json"
    args = ["benchmarks/demo.py", "--seeds", "0", "--epochs", "1", "--samples", "64", "--json", str(out)]
    result = subprocess.run([sys.executable, "-W", "ignore", *args], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| hybrid | 1 |" in result.stdout and "| bptt | 1 |" in result.stdout and "s to 0.93" in result.stdout
    import json

    saved = json.loads(out.read_text())
    assert set(saved["results"]) == {"hybrid", "bptt"} and 0.0 <= saved["results"]["hybrid"][0]["accuracy"] <= 1.0
    run = saved["results"]["hybrid"][0]
    assert len(run["val_accuracy"]) == len(run["epoch_seconds"]) == 1 and run["epoch_seconds"][0] <= run["seconds"]


def test_the_demo_table_gives_the_time_to_the_target_accuracy():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from demo import table

    def run(accuracy, ends):
        return {"accuracy": accuracy[-1], "seconds": ends[-1] + 0.5, "val_accuracy": accuracy, "epoch_seconds": ends}

    results = {"hybrid": [run([0.95, 0.97], [3.0, 4.0]), run([0.9, 0.96], [3.2, 4.2]), run([0.5, 0.6], [3.1, 4.1])],
               "bptt": [run([0.8, 0.95], [2.0, 3.0]), run([0.94, 0.97], [2.5, 3.5]), run([0.91, 0.93], [2.2, 3.2])]}
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in table(results, target=0.93)[2:]}
    # hybrid reached 0.93 after 3.0 and 4.2 s and never in one seed: median 4.2; bptt after 3.0, 2.5, 3.2: 3.0
    assert rows["hybrid"][5:7] == ["4.2", "1.40"] and rows["bptt"][5:7] == ["3.0", "1.00"]
    results["hybrid"][1] = run([0.5, 0.6], [3.2, 4.2])  # two of three never reach it: the median does not
    assert table(results, target=0.93)[2].split(" | ")[5:7] == ["not reached", "—"]
    del results["hybrid"][0]["epoch_seconds"]  # saved before the epochs' times were kept
    assert table(results, target=0.93)[2].split(" | ")[5:7] == ["not recorded", "—"]


@pytest.mark.slow
def test_trainer_overhead_script_runs():
    args = ["benchmarks/trainer_overhead.py", "--length", "5", "--batches", "2", "--rounds", "1"]
    result = subprocess.run([sys.executable, "-W", "ignore", *args], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| fit / bare |" in result.stdout


@pytest.mark.slow
def test_scaling_script_reports_memory_per_device():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the script emulates its devices
    args = ["benchmarks/scaling.py", "--quick", "--devices", "2", "--algos", "d_rtrl"]
    result = subprocess.run([sys.executable, "-W", "ignore", *args], cwd=ROOT, capture_output=True, text=True,
                            timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    row = next(line for line in result.stdout.splitlines() if line.startswith("| gru | 128 | 64 | d_rtrl"))
    ratio = float(row.split("|")[7])
    assert 0.3 < ratio < 0.7  # two devices: about half the traces each
    assert "Step time is not measured here" in result.stdout


@pytest.mark.slow
def test_accuracy_script_merges_its_runs_and_counts_iterations_to_the_target(tmp_path):
    import json

    out = tmp_path / "accuracy.json"
    kept = {"accuracy": 0.5, "best": 0.5, "epoch_seconds": [1.0], "peak_rss_mib": 100.0}
    out.write_text(json.dumps({"dates": {"copy": "2026-01-01"}, "results": {"copy": {"bptt": [kept]}}}))
    args = ["benchmarks/accuracy.py", "--tasks", "eprop-evidence", "--algos", "hybrid", "--seeds", "0", "--json",
            str(out), "--epochs", "1", "--samples", "8", "--val-samples", "8", "--batch-size", "8"]
    result = subprocess.run([sys.executable, "-W", "ignore", *args], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    saved = json.loads(out.read_text())
    assert saved["results"]["copy"] == {"bptt": [kept]} and saved["dates"]["copy"] == "2026-01-01"
    (run,) = saved["results"]["eprop-evidence"]["hybrid"]
    assert run["iterations_to_target"] in (None, 1) and len(run["val_accuracy"]) == 1
    assert "iterations to val. accuracy ≥ 0.9 (per seed) |" in result.stdout
    assert "Measured 2026-01-01." in result.stdout  # each task keeps its own date


@pytest.mark.slow
def test_sparse_script_compares_memory_with_the_dense_layer():
    args = ["benchmarks/sparse.py", "--size", "60", "--density", "0.1", "--repeats", "1", "--length", "4"]
    result = subprocess.run([sys.executable, "-W", "ignore", *args], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    row = next(line for line in result.stdout.splitlines() if line.startswith("| sparse 0.1 |"))
    assert float(row.split("|")[4]) < 0.2  # trace / dense


def _speed_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("speed_script", ROOT / "benchmarks" / "speed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_temp_ratio_across_two_runs_is_not_read_as_a_result(tmp_path):
    """A ``--merge`` that re-measures T = 200 but not T = 2000 (or the other way round)
    leaves the temp target of that pair unjudged: the two temps may come from different
    code. Measured together again, the pair is judged."""
    import json

    speed = _speed_script()

    def entry(steps, temp):
        rules = {rule: {"temp": temp, "wall_ratio": 0.5, "cpu_ratio": 0.5, "chunk": 25} for rule in speed.RULES}
        return {"model": "gru", "H": 128, "B": 16, "T": steps, "loss": "last", "repeats": 1, "rules": rules}

    def verdicts(results):
        rows = [line for line in speed.targets_table(results)
                if "T=200 (loss last) | gru |" in line and "BPTT" not in line]
        assert len(rows) == 2, rows  # D-RTRL and ES-D-RTRL
        return {row.rsplit("|", 2)[1].strip() for row in rows}

    saved = tmp_path / "speed.json"
    saved.write_text(json.dumps({"meta": {"command": "grid", "date": "d0"},
                                 "results": [entry(200, 100), entry(2000, 100)]}))
    assert verdicts(json.loads(saved.read_text())["results"]) == {"PASS"}
    # T = 200 measured again alone (its temp fell): 100 against 50 is no result
    results, meta = speed.merged(saved, [entry(200, 50)], {"command": "again", "date": "d1"})
    assert {e["T"]: e.get("run") for e in results} == {200: "again", 2000: None}
    assert verdicts(results) == {"not compared: T=200 and T=2000 come from different runs; re-measure both "
                                 "with --merge"}
    saved.write_text(json.dumps({"meta": meta, "results": results}))
    results, _ = speed.merged(saved, [entry(200, 50), entry(2000, 80)], {"command": "both", "date": "d2"})
    assert verdicts(results) == {"MISS"}  # 80 / 50: judged, one run measured both


def test_work_counts_a_programs_products_and_kernels_per_loop_trip():
    """benchmarks/work.py's HLO walk, on a program whose counts are known by hand: a loop
    of 7 trips with one (16, 64)(64, 128) product a step (thin: a side of 16), after it
    one (1600, 65)ᵀ(1600, 128) product (batched), and a conditional whose costlier
    branch (two products) counts, not the other (one (16, 16)(16, 128) product). Wrong trip counts, a branch summed
    instead of the larger taken, or the classes swapped would each change a number."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import jax
    import jax.numpy as jnp
    from jax import lax
    import work

    def program(xs, w, rows, columns, flag, h):
        def step(carry, x):
            y = jnp.tanh(x @ w)
            return carry + y.sum(), y

        total, ys = lax.scan(step, 0.0, xs)
        gram = rows.T @ columns
        branch = lax.cond(flag, lambda: (h @ jnp.tanh(h.T @ h)).sum(), lambda: (h[:, :16] @ h[:16]).sum())
        return total + gram.sum() + branch, ys

    f32 = jnp.float32
    args = (jnp.ones((7, 16, 64), f32), jnp.ones((64, 128), f32), jnp.ones((1600, 65), f32),
            jnp.ones((1600, 128), f32), True, jnp.ones((16, 128), f32))
    hlo = jax.jit(program).lower(*args).compile().as_text()
    counts = work.count(hlo, thin=16)
    # thin: 7 steps x 16*64*128, and the branch's (128, 16)(16, 128) and (16, 128)(128, 128)
    assert counts["thin"] == 7 * 16 * 64 * 128 + 128 * 16 * 128 + 16 * 128 * 128
    assert counts["inner"] == 128 * 16 * 128  # hᵀ h: 16 inner
    assert counts["rows"] == 7 * 16 * 64 * 128 + 16 * 128 * 128  # 16 rows
    assert counts["batched"] == 65 * 1600 * 128
    assert counts["kernels"] >= 7 * 2  # each step launches at least its product and the tanh
    # per trip: the loop's kernels scale with its length, the rest do not
    longer = work.count(jax.jit(program).lower(jnp.ones((14, 16, 64), f32), *args[1:]).compile().as_text(), thin=16)
    assert longer["thin"] - counts["thin"] == 7 * 16 * 64 * 128
    assert (longer["kernels"] - counts["kernels"]) % 7 == 0 and longer["kernels"] > counts["kernels"]


def test_work_refuses_a_loop_whose_trip_count_it_cannot_know():
    """A while loop whose length depends on data has no trip count to multiply by: an
    error naming the loop, not a count that is silently one trip."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import jax
    import jax.numpy as jnp
    from jax import lax
    import work

    def program(x, n):
        return lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] @ c[1]), (0, x))[1]

    hlo = jax.jit(program).lower(jnp.ones((8, 8)), 3).compile().as_text()
    with pytest.raises(ValueError, match="while loop %.* has no known trip count"):
        work.count(hlo, thin=4)


@pytest.mark.slow
def test_work_script_counts_every_rule():
    result = subprocess.run([sys.executable, "-W", "ignore", "benchmarks/work.py", "--models", "lif", "--hidden", "8",
                             "--batch", "2", "--length", "6"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| lif |")]
    assert [row.split("|")[2:4] for row in rows] == [[" all ", " bptt "], [" all ", " d_rtrl "], [" all ", " esd_rtrl "],
                                                     [" last ", " bptt "], [" last ", " d_rtrl "], [" last ", " esd_rtrl "]]
    assert rows[0].split("|")[7].strip() == "1.00"  # BPTT against itself
    assert "| of them Xᵀ δ over B rows |" in result.stdout


@pytest.mark.slow
def test_work_script_counts_the_demos_training_step(tmp_path):
    out = tmp_path / "work.json"
    result = subprocess.run([sys.executable, "-W", "ignore", "benchmarks/work.py", "--models", "lif", "--hidden", "8",
                             "--batch", "2", "--length", "6", "--loss", "all", "--demo", "--json", str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    import json

    demo = {row["algo"]: row for row in json.loads(out.read_text())["demo"]}
    assert list(demo) == ["hybrid", "esd_rtrl", "bptt"] and demo["bptt"]["macs_ratio"] == 1.0
    # the hybrid's D-RTRL trace per sample: batched products BPTT does not have
    assert demo["hybrid"]["batched"] > 0 == demo["bptt"]["batched"]
    assert "| hybrid |" in result.stdout


def test_pooled_processes_give_the_median_ratio_and_its_range():
    """``speed.py --processes``: a configuration measured in several processes reads as
    the median of the processes' ratios (each of programs run side by side), with every
    process's ratio and round kept; the targets table shows the range and judges the
    median. One process, or a skipped configuration, stays as measured."""
    speed = _speed_script()

    def entry(esd_ratio, order):
        rules = {}
        for rule in speed.RULES:
            ratio = {"bptt": 1.0, "d_rtrl": 0.7, "esd_rtrl": esd_ratio}[rule]
            rules[rule] = {"cpu": [0.01 * ratio], "wall": [0.02 * ratio, 0.03 * ratio], "cpu_median": 0.01 * ratio,
                           "wall_median": 0.02 * ratio, "temp": 1000, "chunk": None if rule == "bptt" else 100,
                           "temp_ratio": 1.0, "cpu_ratio": ratio, "wall_ratio": ratio,
                           "faults_median": {0: 10, 1: 4000, 2: 30}[order]}
        return {"model": "gru", "H": 128, "B": 16, "T": 200, "loss": "all", "repeats": 2, "order": order,
                "rules": rules}

    entries = [entry(0.62, 0), entry(0.55, 1), entry(0.58, 2)]
    result = speed.pooled(entries)
    esd = result["rules"]["esd_rtrl"]
    assert result["processes"] == 3
    assert esd["wall_ratio"] == 0.58 and esd["wall_ratios"] == [0.62, 0.55, 0.58] and esd["cpu_ratio"] == 0.58
    assert len(esd["wall"]) == 6 and esd["temp"] == 1000 and esd["chunk"] == 100
    assert esd["faults_median"] == 30  # the median over processes
    row = next(line for line in speed.model_table([result], "gru") if line.startswith("| 128 | 16 | 200 | all | esd"))
    assert row.endswith("| 30 |")
    del entries[1]["rules"]["esd_rtrl"]["faults_median"]  # a process measured before the column: none pooled
    assert "faults_median" not in speed.pooled(entries)["rules"]["esd_rtrl"]
    row = next(line for line in speed.model_table([speed.pooled(entries)], "gru") if "| esd_rtrl |" in line)
    assert row.endswith("| — |")
    row = next(line for line in speed.targets_table([result])
               if line.startswith("| ES-D-RTRL ≤ 0.6× BPTT (loss all)") and "| gru |" in line)
    assert "0.58 (wall) (0.55–0.62, 3 processes)" in row and row.endswith("| PASS |")
    assert speed.pooled(entries[:1]) is entries[0]
    skipped = {"model": "gru", "H": 512, "B": 64, "T": 2000, "loss": "all", "skipped": "would need 9 GiB"}
    assert speed.pooled([skipped, skipped]) is skipped


def test_the_layers_table_sets_every_measured_layer_beside_bptt():
    """``speed.py --models`` with the library's other layers: one row per model measured
    at H = 128, B = 16, T = 200 (the grid's first, then the library's in its order), BPTT's
    time with the loss at every step and each rule's ratio with its process range; a loss
    not measured reads "—", a model not measured at that size has no row; without any
    library layer measured the page has no such section."""
    speed = _speed_script()

    def entry(model, loss, esd, ranges=None, hidden=128):
        rules = {rule: {"wall_median": 0.02 * ratio, "wall_ratio": ratio, "cpu_ratio": ratio}
                 for rule, ratio in (("bptt", 1.0), ("d_rtrl", 1.3), ("esd_rtrl", esd))}
        if ranges:
            rules["esd_rtrl"]["wall_ratios"] = ranges
        return {"model": model, "H": hidden, "B": 16, "T": 200, "loss": loss, "rules": rules}

    results = [entry("lstm", "all", 0.45, [0.41, 0.45, 0.5]), entry("gru", "all", 0.6), entry("gru", "last", 0.25),
               entry("synlif", "all", 0.8, hidden=512)]
    table = speed.layers_table(results)
    rows = table[2:]
    assert [row.split(" | ")[0] for row in rows] == ["| gru", "| lstm"]  # synlif: not at H = 128
    assert rows[0] == "| gru | GRUCell(64, H) | 1 | 20.0 | 1.30 | 0.60 | 1.30 | 0.25 |"
    assert rows[1] == "| lstm | LSTMCell(64, H) | 2 | 20.0 | 1.30 | 0.45 (0.41–0.50) | — | — |"
    section = speed.layers_section(results)
    assert section[0] == "## Every recurrent layer of the library" and section[-1] == ""
    assert speed.layers_section([entry("gru", "all", 0.6)]) == []


@pytest.mark.slow
def test_every_library_layer_of_the_speed_script_builds_with_the_states_it_names():
    """Each of speed.py's library models builds, its step traces, and its hidden group has the
    number of states per unit the table prints (what D-RTRL's trace carries)."""
    import warnings

    import brainstate

    from etrace_fit.algorithms.sequence import _prepare

    speed = _speed_script()
    brainstate.environ.set(dt=1.0)
    for name, (_, spiking, states, _) in speed.LIBRARY.items():
        model = speed.build(name, 8, 2)
        xs, ys = speed.data(name, 2, 3, "all")
        assert (name in speed.SPIKING) == spiking
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = _prepare(model, xs, ys, speed.weighted_loss, "d_rtrl", None, None, None)[3]
        assert {pair.num_states for pair in program.pairs} == {states}, name


@pytest.mark.slow
def test_speed_script_measures_a_library_layer_into_its_own_row(tmp_path):
    out = tmp_path / "performance.md"
    result = subprocess.run([sys.executable, "-W", "ignore", "benchmarks/speed.py", "--quick", "--models", "mingru",
                             "--loss", "all", "--repeats", "1", "--write-docs", "--out", str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    text = out.read_text()
    assert "## Every recurrent layer of the library" in text and "## mingru" in text
    row = next(line for line in text.splitlines() if line.startswith("| mingru | MinGRUCell(64, H) | 1 |"))
    assert all(cell.strip() != "—" for cell in row.split("|")[4:7]) and row.endswith("| — | — |")


@pytest.mark.slow
def test_speed_script_measures_a_configuration_in_processes_with_the_rules_in_turned_orders(tmp_path):
    import json

    saved = tmp_path / "speed.json"
    result = subprocess.run([sys.executable, "-W", "ignore", "benchmarks/speed.py", "--quick", "--models", "lif",
                             "--loss", "last", "--repeats", "1", "--processes", "2", "--json", str(saved)],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "in the order bptt, d_rtrl, esd_rtrl" in result.stderr
    assert "in the order d_rtrl, esd_rtrl, bptt" in result.stderr
    data = json.loads(saved.read_text())
    (entry,) = data["results"]
    assert entry["processes"] == 2 and data["meta"]["processes"] == 2
    assert all(len(entry["rules"][rule]["wall_ratios"]) == 2 for rule in ("d_rtrl", "esd_rtrl"))
    assert "processes)" in result.stdout  # the targets table shows the range
    refused = subprocess.run([sys.executable, "-W", "ignore", "benchmarks/speed.py", "--quick", "--processes", "0"],
                             cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and "--processes must be at least 1" in refused.stderr


@pytest.mark.slow
def test_kernels_script_breaks_a_program_and_a_compilation_down():
    """benchmarks/kernels.py reads XLA's per-kernel events (a flag it sets before JAX
    starts): a step loop's kernels launch once per step, products and stacking writes
    are told apart, for a layer of the library too; ``--compile`` gives the compilation's phases."""
    args = ["benchmarks/kernels.py", "--model", "alif", "--rule", "esd_rtrl", "--hidden", "8", "--batch", "2",
            "--length", "6", "--calls", "2", "--top", "40"]
    result = subprocess.run([sys.executable, "-W", "ignore", *args], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| kind | ms a call | share |" in result.stdout and "| products |" in result.stdout
    rows = [row for row in (line.split("|") for line in result.stdout.splitlines()) if len(row) == 6
            and "fusion" in row[1]]  # the kernels' rows: name, kind, ms, launches
    assert any(int(row[4]) == 6 for row in rows), result.stdout  # a kernel of the 6-step loop, once a step
    compiled = subprocess.run([sys.executable, "-W", "ignore", "benchmarks/kernels.py", "--demo", "esd_rtrl",
                               "--compile"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert compiled.returncode == 0, compiled.stderr[-2000:]
    assert "| FusionCompiler::Compile |" in compiled.stdout and "| Codegen |" in compiled.stdout
    refused = subprocess.run([sys.executable, "-W", "ignore", "benchmarks/kernels.py", "--compile"], cwd=ROOT,
                             capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and "--demo ALGO" in refused.stderr
    no_calls = subprocess.run([sys.executable, "-W", "ignore", "benchmarks/kernels.py", "--calls", "0"], cwd=ROOT,
                              capture_output=True, text=True, timeout=600)
    assert no_calls.returncode == 2 and "--calls must be at least 1, got 0" in no_calls.stderr


def test_kernels_script_sorts_kernels_by_kind(monkeypatch):
    # the script adds its XLA flag to the environment when imported: not for this
    # process's later subprocesses
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import kernels

    assert kernels.kind_of("ynn_fusion.3") == "products" and kernels.kind_of("dot.17") == "products"
    assert kernels.kind_of("copy.157") == "copies"
    assert kernels.kind_of("bitcast_dynamic-update-slice_fusion.4") == "stacking writes"
    assert kernels.kind_of("transpose_copy_fusion.1") == "transposes"
    assert kernels.kind_of("wrapped_broadcast.8") == "fills" and kernels.kind_of("broadcast_add_fusion") != "fills"
    assert kernels.kind_of("while.319") == "loop (includes its body)"
    assert kernels.kind_of("multiply_add_fusion.2") == "other fusions"
    found = [{"name": "ynn_fusion", "dur": 4000}, {"name": "ynn_fusion", "dur": 2000},
             {"name": "copy.1", "dur": 2000}, {"name": "while.3", "dur": 9000}, {"name": "$python frame", "dur": 1e6}]
    table = kernels.kernel_table(found, calls=2, top=5)
    assert table[0].startswith("kernels: 4.00 ms a call")  # (4 + 2 + 2) µs·1e3 over 2 calls; the loop row apart
    assert "| products | 3.00 | 75% |" in table and "| copies | 1.00 | 25% |" in table
    assert "| ynn_fusion | products | 3.000 | 1 |" in table

"""Runs in a subprocess with 4 emulated CPU devices (``test_data_parallel.py`` starts
it): trains the same models on one device and on a 4-device mesh and prints what the
tests compare, as one JSON object on the last line of stdout."""

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402

import brainstate  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import etrace_fit as ef  # noqa: E402
from etrace_fit import layers  # noqa: E402
from etrace_fit.errors import ConfigError  # noqa: E402

from _combos import COMBOS  # noqa: E402  (this script's folder is on sys.path)

from etrace_fit.algorithms import online  # noqa: E402

jax.config.update("jax_enable_x64", True)
warnings.simplefilter("ignore")
# Every hidden group's D-RTRL pairs run their chunks as one pass (whatever this host's
# cores, online.chunk_groups), so the GRU's two weights join on the sharded traces too.
online.passes_side_by_side = lambda: 1
assert jax.device_count() == 4, jax.devices()


def gru():
    return ef.Sequential(layers.GRUCell(5, 8), layers.Linear(8, 3))


def alif():
    return ef.Sequential(layers.RecurrentALIF(5, 8, tau=5.0, tau_a=20.0, beta=0.5, v_threshold=0.5,
                                              w_init=brainstate.nn.init.KaimingNormal(scale=2.0)),
                         layers.LeakyRateReadout(8, 3, tau=5.0))


def dropout():
    """A mask per element, step and sample, drawn from one key: the same on 4 devices."""
    return ef.Sequential(layers.Linear(5, 8, w_init=brainstate.nn.init.KaimingNormal(scale=2.0)),
                         layers.Dropout(0.3, seed=1), layers.LIF(8, tau=5.0, v_threshold=0.5),
                         layers.LeakyRateReadout(8, 3, tau=5.0))


def lstm():
    """Four gate weights on one [x, h]: ES-D-RTRL runs them as one (online.shared_groups)."""
    return ef.Sequential(layers.LSTMCell(5, 8), layers.Linear(8, 3))


def batchnorm():
    """Batch statistics over the whole (split) batch; running statistics replicated."""
    return ef.Sequential(layers.Linear(5, 8, w_init=brainstate.nn.init.KaimingNormal(scale=2.0)),
                         layers.LIF(8, tau=5.0, v_threshold=0.5), layers.BatchNorm1d(8),
                         layers.LeakyRateReadout(8, 3, tau=5.0))


MODELS = {"gru": gru, "alif": alif, "dropout": dropout, "batchnorm": batchnorm, "lstm": lstm}


def data(n=24, steps=7, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, steps, 5))
    return x, rng.integers(0, 3, n)


def build(model, seed=0, **options):
    brainstate.random.seed(seed)
    return model()


def weights(trainer):
    flat = jax.tree_util.tree_flatten_with_path(trainer.get_weights())[0]
    return {jax.tree_util.keystr(path): np.asarray(v).tolist() for path, v in flat}


def max_difference(a, b):
    """The largest relative difference between two weight dicts."""
    worst = 0.0
    for key in a:
        p, q = np.asarray(a[key]), np.asarray(b[key])
        worst = max(worst, float(np.max(np.abs(p - q) / (np.abs(q) + 1e-12))))
    return worst


def sharding_of(value):
    sharding = value.sharding
    spec = getattr(sharding, "spec", None)
    return {"devices": len(sharding.device_set), "spec": None if spec is None else [str(s) for s in spec]}


def equivalence():
    """Weights after 3 SGD steps, the History, evaluate and predict: 1 device vs 4."""
    out = {}
    x, y = data()
    for name, algo in COMBOS:
        model = MODELS[name]
        runs = {}
        for mesh in (None, 4):
            trainer = ef.Trainer(build(model), algo=algo, optimizer=optax.sgd(0.5), mesh=mesh,
                                 loss_on="all")
            history = trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
            state = trainer._state
            runs[mesh] = {
                "weights": weights(trainer), "history": history.history,
                "evaluate": trainer.evaluate(x, y, batch_size=8, verbose=0),
                "predict": np.asarray(trainer.predict(x[:8], batch_size=8, verbose=0)).tolist(),
                "weight_sharding": sharding_of(jax.tree.leaves(state.weights)[0]),
                "state_sharding": [sharding_of(s) for s in state.states if np.ndim(s) >= 2],
                "key_sharding": [sharding_of(s) for s in state.states if np.ndim(s) == 1],
            }
        one, four = runs[None], runs[4]
        out[f"{name}/{algo}"] = {
            "weights": max_difference(four["weights"], one["weights"]),
            "history_one": one["history"], "history_four": four["history"],
            "evaluate_one": one["evaluate"], "evaluate_four": four["evaluate"],
            "predict": float(np.max(np.abs(np.subtract(four["predict"], one["predict"])))),
            "weight_sharding": four["weight_sharding"], "state_sharding": four["state_sharding"],
            "key_sharding": four["key_sharding"],
        }
    return out


def stateful_and_update_every():
    """A stateful trainer (traces carried between batches) and update_every on the mesh."""
    out = {}
    x, y = data(n=16, steps=12)
    for label, options in [("stateful", dict(stateful=True)), ("update_every", dict(update_every=4))]:
        runs = {}
        for mesh in (None, 4):
            trainer = ef.Trainer(build(gru), algo="d_rtrl", optimizer=optax.sgd(0.5), mesh=mesh, loss_on="all",
                                 **options)
            trainer.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False)
            runs[mesh] = trainer
        traces = runs[4]._state.traces
        out[label] = {"weights": max_difference(weights(runs[4]), weights(runs[None]))}
        if traces is not None:
            one = jax.tree.leaves(runs[None]._state.traces.traces)
            four = jax.tree.leaves(traces.traces)
            out[label]["trace_bytes_one"] = [int(t.addressable_shards[0].data.nbytes) for t in one]
            out[label]["trace_bytes_four"] = [int(t.addressable_shards[0].data.nbytes) for t in four]
            out[label]["trace_shards"] = [len(t.addressable_shards) for t in four]
    return out


def memory():
    """XLA's per-device memory of the compiled step (D-RTRL traces dominate)."""
    x, y = data(n=32, steps=20)
    out = {}
    for mesh in (None, 4):
        brainstate.random.seed(0)
        model = ef.Sequential(layers.GRUCell(5, 64), layers.Linear(64, 3))
        trainer = ef.Trainer(model, algo="d_rtrl", optimizer="sgd", mesh=mesh, loss_on="all")
        out[str(mesh)] = trainer.step_memory(x, y, batch_size=32)
        if mesh:  # the compiled step moves gradients between devices, never a trace
            from etrace_fit.training.data import Batch

            xs, ys, weight = trainer._time_major(Batch(x[:32], y[:32]), False)
            _, step, args, options = trainer._step_call(xs, ys, weight, weight, stream=False)
            text = step.lower(*args, **options).compile().as_text()
            out["collectives"] = sorted(set(re.findall(r"\b(all-gather|all-reduce|all-to-all|collective-permute|"
                                                       r"reduce-scatter)(?:-start)?\(", text)))
        trainer.fit(x, y, batch_size=32, epochs=1, verbose=0)
        out[f"report {mesh}"] = trainer.report().splitlines()[-1]
    return out


def checkpoints():
    """A 1-device checkpoint resumed on 4 devices (and back) continues as the run would."""
    x, y = data(n=16)
    out = {}
    with tempfile.TemporaryDirectory() as folder:
        for first, second in ((None, 4), (4, None)):
            reference = ef.Trainer(build(gru), algo="d_rtrl", optimizer=optax.adam(1e-2), loss_on="all")
            reference.fit(x, y, batch_size=8, epochs=2, verbose=0)
            trainer = ef.Trainer(build(gru), algo="d_rtrl", optimizer=optax.adam(1e-2), mesh=first, loss_on="all")
            trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
            path = os.path.join(folder, f"{first}.ckpt")
            trainer.save(path)
            resumed = ef.Trainer(build(gru), algo="d_rtrl", optimizer=optax.adam(1e-2), mesh=second,
                                 loss_on="all")
            resumed.restore(path)
            resumed.fit(x, y, batch_size=8, epochs=2, initial_epoch=1, verbose=0)
            out[f"{first}->{second}"] = {"weights": max_difference(weights(resumed), weights(reference)),
                                         "files": sorted(os.listdir(folder))}
    return out


def errors():
    """Bad configurations fail before training, with the numbers in the message."""
    from jax.sharding import Mesh

    x, y = data(n=26)
    out = {}

    def failure(make, fit=None):
        try:
            trainer = make()
            before = weights(trainer) if fit else None
            if fit:
                fit(trainer)
        except ConfigError as error:
            unchanged = None if not fit else before == weights(trainer)
            return {"error": str(error), "unchanged": unchanged}
        return {"error": None}

    out["no_batch_axis"] = failure(lambda: ef.Trainer(gru(), mesh=Mesh(np.array(jax.devices()), ("data",))))
    out["too_many_devices"] = failure(lambda: ef.Trainer(gru(), mesh=5))
    out["bad_mesh"] = failure(lambda: ef.Trainer(gru(), mesh="all"))
    out["indivisible_batch"] = failure(lambda: ef.Trainer(build(gru), mesh=4),
                                       lambda t: t.fit(x[:24], y[:24], batch_size=6, epochs=1, verbose=0))
    out["indivisible_last_batch"] = failure(lambda: ef.Trainer(build(gru), mesh=4),
                                            lambda t: t.fit(x, y, batch_size=8, epochs=1, verbose=0))
    trainer = ef.Trainer(build(gru), mesh=4)
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0, drop_remainder=True)
    out["drop_remainder_trains"] = True
    # evaluate and predict split what splits and run the rest replicated
    out["evaluate_short_batch"] = trainer.evaluate(x, y, batch_size=8, verbose=0)
    reference = ef.Trainer(build(gru))
    reference.set_weights(trainer.get_weights())
    out["evaluate_short_batch_one"] = reference.evaluate(x, y, batch_size=8, verbose=0)
    # batch_size is checked where it splits arrays: a list of batches of 6, or one batch of 12
    # samples under the default of 32, on 3 devices trained only with a dummy batch_size
    listed = [(x[i:i + 6], y[i:i + 6]) for i in range(0, 24, 6)]
    ef.Trainer(build(gru), mesh=3).fit(listed, epochs=1, verbose=0)
    ef.Trainer(build(gru), mesh=3).fit(x[:12], y[:12], epochs=1, verbose=0)
    out["listed_and_one_batch_train"] = True
    # a list whose last batch does not split: refused before the first batch trains
    out["listed_short_batch"] = failure(lambda: ef.Trainer(build(gru), mesh=4),
                                        lambda t: t.fit([(x[:8], y[:8]), (x[8:11], y[8:11])], epochs=1, verbose=0))
    # a generator's batch that does not split: named by its place, before its step (the one before trained)
    out["generated_short_batch"] = failure(
        lambda: ef.Trainer(build(gru), mesh=4),
        lambda t: t.fit((b for b in [(x[:8], y[:8]), (x[8:14], y[8:14])]), epochs=1, verbose=0))
    return out


def cli():
    """``etrace-fit train --devices 4`` and ``--mesh auto`` train on the mesh; a batch
    size that does not split is a usage error (exit 2) before training."""
    import contextlib
    import io

    from etrace_fit import cli as command

    out = {}
    for flags in (["--devices", "4"], ["--mesh", "auto"]):
        args = command._parser().parse_args(["train", "--task", "rate", "--epochs", "1", "--samples", "64",
                                             "--val-samples", "32", "--batch-size", "16", "--logdir", "none",
                                             "--verbose", "0", *flags])
        summary = command.train(args)
        out[" ".join(flags)] = {"devices": summary["trainer"].mesh.size, "accuracy": summary["accuracy"]}
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        status = command.main(["train", "--task", "rate", "--epochs", "1", "--samples", "64", "--batch-size", "10",
                               "--logdir", "none", "--verbose", "0", "--devices", "4"])
    out["indivisible"] = {"status": status, "stderr": stderr.getvalue()}
    return out


def learner():
    """ef.compile(..., mesh=4): init and step on the mesh give the one-device gradients."""
    x, y = data(n=8, steps=10)
    xs = np.swapaxes(x, 0, 1)
    targets = np.broadcast_to(np.eye(3)[y], (10, 8, 3))

    def loss(out, target):
        return ((out - target) ** 2).sum()

    grads = {}
    for mesh in (None, 4):
        brainstate.random.seed(0)
        model = gru()
        brainstate.nn.init_all_states(model, batch_size=8)
        learner = ef.compile(model, xs[0], loss, algo="d_rtrl", mesh=mesh)
        state = learner.init(8)
        total = None
        for chunk in (slice(0, 5), slice(5, 10)):  # a stream in two chunks
            g, _, state = learner.step(state, xs[chunk], targets[chunk])
            total = g if total is None else jax.tree.map(np.add, total, g)
        grads[mesh] = {jax.tree_util.keystr(p): np.asarray(v) for p, v in
                       jax.tree_util.tree_flatten_with_path(total)[0]}
        if mesh:
            sharded = [len(leaf.sharding.device_set) for leaf in jax.tree.leaves(state.traces)]
    worst = max(float(np.max(np.abs(grads[4][k] - grads[None][k]))) for k in grads[None])
    return {"grads": worst, "trace_devices": sharded}


def docs():
    """docs/scaling.md's code, run here on 4 devices (the docs test runs it on one)."""
    import pathlib
    import re

    page = pathlib.Path(__file__).resolve().parents[2] / "docs" / "scaling.md"
    namespace = {}
    for block in re.findall(r"```python\n(.*?)```", page.read_text(), re.S):
        exec(compile(block, str(page), "exec"), namespace)
    trainer = namespace["trainer"]
    return {"devices": trainer.mesh.size, "memory": trainer.step_memory(namespace["x"], namespace["y"], 16)}


def constraints():
    """A learned time constant pushed past zero by an update of -100 is put back at
    its floor (0.1 dt) on 4 devices as on one, the update_every path too."""
    import jax.numpy as jnp

    down = optax.GradientTransformation(lambda p: optax.EmptyState(), lambda g, s, p=None: (
        jax.tree.map(lambda v: jnp.full_like(v, -100.0), g), s))
    x, y = data(n=8)
    found = {}
    for name, options in (("step", {}), ("update_every", {"update_every": 3})):
        model = ef.Sequential(layers.Linear(5, 8), layers.LIF(8, tau=4.0, learn_tau=True),
                              layers.LeakyRateReadout(8, 3, tau=5.0, learn_tau=True))
        trainer = ef.Trainer(model, algo="d_rtrl", optimizer=down, mesh=4, **options)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        found[name] = [np.asarray(model.layers[1].tau.value).tolist(), np.asarray(model.layers[2].tau.value).tolist()]
    return found


def explicit_mesh():
    """A mesh from jax.make_mesh (Explicit axes in JAX 0.10): 2 SGD steps, evaluate and
    predict, against one device (a ShardingTypeError in the first step's tracing before)."""
    x, y = data(n=16)
    out = {}
    reference = ef.Trainer(build(gru), algo="d_rtrl", optimizer=optax.sgd(0.5), loss_on="all")
    reference.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    for name, mesh in (("batch", jax.make_mesh((4,), ("batch",))),
                       ("batch_model", jax.make_mesh((2, 2), ("batch", "model")))):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = ef.Trainer(build(gru), algo="d_rtrl", optimizer=optax.sgd(0.5), mesh=mesh, loss_on="all")
        trainer.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        out[name] = {"warnings": [str(w.message) for w in caught if "copies of the same work" in str(w.message)],
                     "given": [str(t) for t in mesh.axis_types], "used": [str(t) for t in trainer.mesh.axis_types],
                     "devices": trainer.mesh.shape["batch"],
                     "weights": max_difference(weights(trainer), weights(reference)),
                     "evaluate": [trainer.evaluate(x, y, batch_size=8, verbose=0),
                                  reference.evaluate(x, y, batch_size=8, verbose=0)],
                     "predict": float(np.max(np.abs(trainer.predict(x, batch_size=8, verbose=0)
                                                    - reference.predict(x, batch_size=8, verbose=0))))}
    return out


if __name__ == "__main__":
    brainstate.environ.set(precision=64, dt=1.0)
    parts = sys.argv[1:] or ["equivalence", "stateful_and_update_every", "memory", "checkpoints", "errors", "cli",
                             "docs", "learner", "constraints", "explicit_mesh"]
    results = {part: globals()[part]() for part in parts}
    print(json.dumps(results))

"""One process of a two-process run on localhost (``test_multi_host.py`` starts two),
or the single-process reference: trains 2 steps and writes what the test compares.

    python _two_processes.py OUT_DIR single
    python _two_processes.py OUT_DIR PROCESS_ID PORT
"""

import json
import os
import sys
import warnings

import brainstate
import jax
import numpy as np
import optax

import etrace_fit as ef
from etrace_fit import callbacks, distributed, layers

warnings.simplefilter("ignore")


def main(out: str, role: str, port: str | None) -> None:
    if role != "single":
        distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=int(role),
                               initialization_timeout=120)
    jax.config.update("jax_enable_x64", True)
    brainstate.environ.set(precision=64, dt=1.0)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 7, 5)), rng.integers(0, 3, 16)
    brainstate.random.seed(0)
    model = ef.Sequential(layers.GRUCell(5, 8), layers.Linear(8, 3))
    name = "single" if role == "single" else f"process{role}"
    trainer = ef.Trainer(model, algo="d_rtrl", optimizer=optax.sgd(0.5), loss_on="all",
                         mesh=None if role == "single" else "auto")
    writers = [] if role == "single" else [callbacks.CSVLogger(os.path.join(out, "log.csv")),
                                          callbacks.BackupAndRestore(os.path.join(out, "backup"),
                                                                     delete_on_finish=False)]
    history = trainer.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=writers)
    if role != "single":
        trainer.save(os.path.join(out, "final.ckpt"))
        distributed.barrier("saved")
    flat = jax.tree_util.tree_flatten_with_path(trainer.get_weights())[0]
    result = {
        "devices": jax.device_count(), "processes": jax.process_count(),
        "weights": {jax.tree_util.keystr(p): np.asarray(v).tolist() for p, v in flat},
        "history": history.history,
        "evaluate": trainer.evaluate(x, y, batch_size=8, verbose=0),
        "predict": np.asarray(trainer.predict(x, batch_size=8, verbose=0)).tolist(),
    }
    # Each process feeds only its half of every batch (ProcessLocal); the reference
    # reads the whole batches in order.
    brainstate.random.seed(0)
    model = ef.Sequential(layers.GRUCell(5, 8), layers.Linear(8, 3))
    trainer = ef.Trainer(model, algo="esd_rtrl", optimizer=optax.sgd(0.5), loss_on="all",
                         mesh=None if role == "single" else "auto")
    if role == "single":
        trainer.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    else:
        share = [(x[b + 4 * int(role):b + 4 * int(role) + 4], y[b + 4 * int(role):b + 4 * int(role) + 4])
                 for b in range(0, 16, 8)]
        trainer.fit(distributed.ProcessLocal(share), epochs=1, verbose=0)
        result["local_report"] = trainer.report().splitlines()[-1]
    flat = jax.tree_util.tree_flatten_with_path(trainer.get_weights())[0]
    result["local_weights"] = {jax.tree_util.keystr(p): np.asarray(v).tolist() for p, v in flat}
    # Shares of 3 rows (global batches of 6 over the 2 devices): the list's sizes were
    # checked against the devices as if each share were a whole batch, and refused.
    brainstate.random.seed(0)
    model = ef.Sequential(layers.GRUCell(5, 8), layers.Linear(8, 3))
    trainer = ef.Trainer(model, algo="d_rtrl", optimizer=optax.sgd(0.5), loss_on="all",
                         mesh=None if role == "single" else "auto")
    if role == "single":
        trainer.fit(x[:12], y[:12], batch_size=6, epochs=1, verbose=0, shuffle=False)
    else:
        share = [(x[b + 3 * int(role):b + 3 * int(role) + 3], y[b + 3 * int(role):b + 3 * int(role) + 3])
                 for b in range(0, 12, 6)]
        trainer.fit(distributed.ProcessLocal(share), epochs=1, verbose=0)
    flat = jax.tree_util.tree_flatten_with_path(trainer.get_weights())[0]
    result["odd_share_weights"] = {jax.tree_util.keystr(p): np.asarray(v).tolist() for p, v in flat}
    with open(os.path.join(out, f"{name}.json"), "w") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)

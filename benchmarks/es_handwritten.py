"""ES-D-RTRL on the feed-forward LIF net written by hand: how fast the rule can run here.

    python benchmarks/es_handwritten.py [--chunks 5 10 20 100] [--repeats 15]

``speed.py``'s "lif" model (``Linear(64, H) → LIF(H, τ = 10) → Linear(H, 10)``, H = 128,
B = 16, T = 200, loss at every step) under ES-D-RTRL (α = 0.9), written as plain JAX
programs over the model's weights, not through the engine, in forms with fewer and fewer
XLA kernels per step:

- ``by hand, per step``: one loop step per time step with everything in it (the engine's
  structure: forward, readout, loss, pull-back for ``∂L^t/∂h^{t−1}``, both traces, the
  gradient's products).
- ``by hand, chunks of C``: the step loop split (loop fission): the input product for C
  steps as one GEMM; a loop over the chunk that runs only the membrane and ``ε_f``
  recursions; then everything else vectorised over the chunk's ``C·B`` rows (readout,
  loss, pull-back, history, the rule's rows and GEMM, the readout's gradient; the
  ``ε_x`` filter regrouped onto the signal as a ``C×C`` product).
- ``by hand, chunks of C, input product per step``: the same with the input product
  back in the loop.

Each hand-written gradient is checked against the engine's ES-D-RTRL gradient (float32;
the largest difference relative to the leaf's largest entry is printed, and the script
fails above 1e-3) before anything is timed. All programs, the engine's BPTT and
ES-D-RTRL included, run alternated in one process (each round in the reverse order of
the one before); the table gives medians of wall time as ratios to the engine's BPTT.
The engine's step loop runs the pull-back at every step, as ``by hand, per step`` does;
the fission needs the model's structure (which layers only read the input, that nothing
recurrent reads the readout), which the engine does not split out.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import speed  # noqa: E402

from etrace_fit import _compat  # noqa: E402

H, B, T, ALPHA = 128, 16, 200, 0.9
DECAY = float(np.exp(-1 / 10.0))  # the membrane's exp(-dt / τ)


def _psi(u):  # the triangle surrogate's derivative (the LIF's default)
    return jnp.maximum(0.0, 1.0 - jnp.abs(u))


def _spike(u):
    return (u > 0).astype(u.dtype)


def per_step(W1, W2, xs, ys, ws):
    """``W1 (I + 1, H)`` and ``W2 (H + 1, O)`` carry their biases as the last row."""
    batch, hidden = xs.shape[1], W1.shape[1]

    def step(carry, inputs):
        V, eps_x, eps_f, g1, g2, t = carry
        x, y, w = inputs
        X = jnp.concatenate([x, jnp.ones((batch, 1), x.dtype)], 1)
        D = DECAY * (1.0 - _psi(V - 1.0))  # ∂V^t/∂V^{t−1}, soft reset
        V = DECAY * (V - _spike(V - 1.0)) + X @ W1
        Z = jnp.concatenate([_spike(V - 1.0), jnp.ones((batch, 1), V.dtype)], 1)
        out = Z @ W2
        d_out = 2.0 * w[:, None] * (out - y) / batch
        dY = (d_out @ W2[:hidden].T) * _psi(V - 1.0)  # ∂L^t/∂y^t
        history = dY * D * eps_f / (1.0 - ALPHA ** jnp.maximum(t, 1.0))  # G ε_f^{t−1}, bias-corrected
        g1 = g1 + X.T @ dY + eps_x.T @ history
        g2 = g2 + Z.T @ d_out
        loss = jnp.sum(w[:, None] * (out - y) ** 2) / batch
        return (V, ALPHA * eps_x + X, D * eps_f + (1.0 - ALPHA), g1, g2, t + 1.0), loss

    start = (jnp.zeros((batch, hidden)), jnp.zeros((batch, W1.shape[0])), jnp.zeros((batch, hidden)),
             jnp.zeros_like(W1), jnp.zeros_like(W2), 0.0)
    (_, _, _, g1, g2, _), losses = lax.scan(step, start, (xs, ys, ws))
    return g1, g2, losses


def fission(W1, W2, xs, ys, ws, C, input_in_loop=False):
    """The same, in chunks of ``C`` steps (``C`` divides T): see the module docstring."""
    steps, batch, hidden = xs.shape[0], xs.shape[1], W1.shape[1]
    j = np.arange(C)
    # h̃_j = Σ_{i>j} α^{i−1−j} h_i: the ε_x filter regrouped onto the history rows
    F = jnp.asarray(np.where(j[None, :] > j[:, None], ALPHA ** np.clip(j[None, :] - 1 - j[:, None], 0, None), 0.0),
                    xs.dtype)
    powers = jnp.asarray(ALPHA ** j, xs.dtype)  # α^j: the chunk's starting ε_x meets h_j
    tail = jnp.asarray(ALPHA ** (C - 1 - j), xs.dtype)  # ε_x after the chunk

    def chunk(carry, k):
        V0, eps_x, eps_f, g1, g2, t0 = carry
        x, y, w = (lax.dynamic_slice_in_dim(a, k * C, C) for a in (xs, ys, ws))
        X = jnp.concatenate([x, jnp.ones((C, batch, 1), x.dtype)], 2)
        inputs = X if input_in_loop else (X.reshape(C * batch, -1) @ W1).reshape(C, batch, hidden)

        def step(inner, current):
            V, ef = inner
            if input_in_loop:
                current = current @ W1
            D = DECAY * (1.0 - _psi(V - 1.0))
            V_new = DECAY * (V - _spike(V - 1.0)) + current
            return (V_new, D * ef + (1.0 - ALPHA)), (V_new, D * ef)  # D ε_f^{t−1}: G = dY · D

        (V, eps_f_new), (Vs, D_eps_f) = lax.scan(step, (V0, eps_f), inputs)
        Z = jnp.concatenate([_spike(Vs - 1.0), jnp.ones((C, batch, 1), Vs.dtype)], 2)
        out = (Z.reshape(C * batch, -1) @ W2).reshape(C, batch, -1)
        d_out = 2.0 * w[..., None] * (out - y) / batch
        dY = (d_out.reshape(C * batch, -1) @ W2[:hidden].T).reshape(C, batch, hidden) * _psi(Vs - 1.0)
        correction = 1.0 - ALPHA ** jnp.maximum(t0 + jnp.arange(C, dtype=xs.dtype), 1.0)
        history = dY * D_eps_f / correction[:, None, None]
        rows = dY + (F @ history.reshape(C, -1)).reshape(C, batch, hidden)
        g1 = g1 + X.reshape(C * batch, -1).T @ rows.reshape(C * batch, hidden) \
            + eps_x.T @ jnp.einsum("c,cbh->bh", powers, history)
        g2 = g2 + Z.reshape(C * batch, -1).T @ d_out.reshape(C * batch, -1)
        eps_x = ALPHA ** C * eps_x + jnp.einsum("c,cbk->bk", tail, X)
        losses = jnp.sum(w[..., None] * (out - y) ** 2, axis=(1, 2)) / batch
        return (V, eps_x, eps_f_new, g1, g2, t0 + C), losses

    start = (jnp.zeros((batch, hidden)), jnp.zeros((batch, W1.shape[0])), jnp.zeros((batch, hidden)),
             jnp.zeros_like(W1), jnp.zeros_like(W2), 0.0)
    (_, _, _, g1, g2, _), losses = lax.scan(chunk, start, jnp.arange(steps // C))
    return g1, g2, losses.reshape(-1)


def programs(chunks: list[int], length: int):
    """The engine's BPTT and ES-D-RTRL and the hand-written forms, compiled, with their
    arguments: ``{label: (compiled, args)}``, and the hand-written forms' largest
    difference from the engine's gradient (relative to each leaf's largest entry)."""
    model = speed.build("lif", H, B)
    xs, (y_seq, w_seq) = speed.data("lif", B, length, "all")
    engine = {f"engine {rule}": speed.compile_rule(model, rule, xs, (y_seq, w_seq), "all")[:2]
              for rule in ("bptt", "esd_rtrl")}
    b1, w1, b2, w2 = engine["engine esd_rtrl"][1][0]  # the weights, biases first
    W1, W2 = jnp.concatenate([w1, b1[None]]), jnp.concatenate([w2, b2[None]])
    options = _compat.compiler_options()  # as the engine's programs are compiled
    forms = {"by hand, per step": jax.jit(per_step, compiler_options=options)}
    for C in chunks:
        if length % C:
            raise SystemExit(f"--chunks: {C} does not divide T = {length}")
        forms[f"by hand, chunks of {C}"] = jax.jit(lambda *a, C=C: fission(*a, C), compiler_options=options)
        forms[f"by hand, chunks of {C}, input product per step"] = jax.jit(
            lambda *a, C=C: fission(*a, C, True), compiler_options=options)
    args = (W1, W2, xs, y_seq, w_seq)
    compiled, errors = dict(engine), {}
    reference = engine["engine esd_rtrl"]
    want = reference[0](*reference[1])[0]  # the engine's gradient, leaves as the weights
    want_1 = np.concatenate([np.asarray(want[1]), np.asarray(want[0])[None]])
    want_2 = np.concatenate([np.asarray(want[3]), np.asarray(want[2])[None]])
    for label, fn in forms.items():
        compiled[label] = (fn.lower(*args).compile(), args)
        g1, g2, _ = compiled[label][0](*args)
        errors[label] = max(float(np.abs(np.asarray(g) - w).max() / np.abs(w).max())
                            for g, w in ((g1, want_1), (g2, want_2)))
    return compiled, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, nargs="+", default=[5, 10, 20, 100])
    parser.add_argument("--length", type=int, default=T, help="sequence length (default 200)")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    brainstate.environ.set(dt=1.0)
    compiled, errors = programs(args.chunks, args.length)
    for label, error in errors.items():
        print(f"{label}: gradient differs from the engine's by {error:.1e} (relative to the largest entry)")
    if max(errors.values()) > 1e-3:
        raise SystemExit("a hand-written form does not compute the engine's ES-D-RTRL gradient")
    for fn, fn_args in compiled.values():  # warm-up
        jax.block_until_ready(fn(*fn_args))
    labels, wall = list(compiled), {label: [] for label in compiled}
    for round_ in range(args.repeats):
        for label in labels if round_ % 2 else labels[::-1]:
            fn, fn_args = compiled[label]
            start = time.perf_counter()
            jax.block_until_ready(fn(*fn_args))
            wall[label].append(time.perf_counter() - start)
    base = statistics.median(wall["engine bptt"])
    print(f"\nH = {H}, B = {B}, T = {args.length}, loss at every step, {args.repeats} rounds")
    print("| program | wall ms (median) | / engine BPTT |")
    print("|---|---|---|")
    for label in labels:
        median = statistics.median(wall[label])
        print(f"| {label} | {median * 1e3:.2f} | {median / base:.2f} |")


if __name__ == "__main__":
    main()

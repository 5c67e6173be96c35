"""Helpers shared by the layer tests (not a test module).

* :func:`assert_close` compares pytrees with a dtype-dependent tolerance.
* :func:`layer_grads` / :func:`check_fd` compute a model's gradients with
  ``brainstate.transform.grad`` and compare a few entries of each parameter leaf with
  central finite differences (float64).
* :func:`sequence_grads` gives a model's gradient of a squared error at every step, by
  a rule or (``algo="reference"``) by autodiff through the loop.
* :func:`make_spike` / :data:`PSEUDO_DERIVATIVES` give an independent spike function
  (Heaviside forward, hand-written pseudo-derivative) for pure-jnp references.
"""

from __future__ import annotations

import functools

import _shared_reference as _reference
import brainstate
import jax
import jax.numpy as jnp
import numpy as np

RTOL = {jnp.dtype(jnp.float32): 1e-5, jnp.dtype(jnp.float64): 1e-12}


def assert_close(actual, expected, rtol=None, atol=None):
    """Same tree, shapes and dtypes; values close (tolerance from the expected dtype).

    Works on host copies (numpy), so it can run outside the 64-bit context too.
    """
    a_leaves, a_tree = jax.tree.flatten(actual)
    e_leaves, e_tree = jax.tree.flatten(expected)
    assert a_tree == e_tree, (a_tree, e_tree)
    for a, e in zip(a_leaves, e_leaves):
        a, e = np.asarray(a), np.asarray(e)
        assert a.shape == e.shape, (a.shape, e.shape)
        assert a.dtype == e.dtype, (a.dtype, e.dtype)
        tol = RTOL[jnp.dtype(e.dtype)] if rtol is None else rtol
        e64 = e.astype(np.float64)
        scale = max(1.0, float(np.max(np.abs(e64), initial=0.0)))
        np.testing.assert_allclose(a.astype(np.float64), e64, rtol=tol, atol=tol * scale if atol is None else atol)


def randn(seed, *shape, scale=1.0):
    """A standard-normal array in the current default float dtype."""
    value = np.random.default_rng(seed).standard_normal(shape) * scale
    return jnp.asarray(value, dtype=brainstate.environ.dftype())


def values_of(states):
    """``{path: state.value}`` of a ``FlattedDict`` of states."""
    return {path: state.value for path, state in states.items()}


def layer_grads(loss, params):
    """``brainstate.transform.grad`` of a zero-argument loss w.r.t. ``params`` (a states dict)."""
    return brainstate.transform.grad(loss, grad_states=params)()


def check_fd(loss, params, grads, *, entries=6, eps=1e-6, rtol=1e-4, atol=1e-7, seed=0, skip_zero=None):
    """Compare ``grads`` with central differences of ``loss`` at ``entries`` random
    positions of every leaf of every state in ``params`` (restored afterwards).

    ``loss`` takes no argument and reads the states; it is jitted (states are its
    inputs, so perturbing a value does not recompile). Each leaf must have a non-zero
    gradient somewhere, so the check is never vacuous. ``skip_zero(path, leaf_index)``
    may exempt a leaf from that requirement.
    """
    f = brainstate.transform.jit(loss)
    rng = np.random.default_rng(seed)
    checked = 0
    for path, state in params.items():
        original = state.value
        leaves, treedef = jax.tree.flatten(original)
        g_leaves, g_treedef = jax.tree.flatten(grads[path])
        assert g_treedef == treedef, (path, g_treedef, treedef)
        for li, (leaf, g_leaf) in enumerate(zip(leaves, g_leaves)):
            assert g_leaf.shape == leaf.shape and g_leaf.dtype == leaf.dtype, path
            if not (skip_zero and skip_zero(path, li)):
                assert float(jnp.max(jnp.abs(g_leaf))) > 0, f"gradient of {path}[{li}] is all zero"
            flat = np.asarray(leaf).ravel()
            picks = rng.choice(flat.size, size=min(entries, flat.size), replace=False)
            for pick in picks:
                def at(delta):
                    new = flat.copy()
                    new[pick] += delta
                    new_leaves = list(leaves)
                    new_leaves[li] = jnp.asarray(new.reshape(leaf.shape), dtype=leaf.dtype)
                    state.value = jax.tree.unflatten(treedef, new_leaves)
                    return float(f())

                fd = (at(eps) - at(-eps)) / (2 * eps)
                state.value = original
                g = float(np.asarray(g_leaf).ravel()[pick])
                assert abs(g - fd) <= rtol * max(abs(g), abs(fd)) + atol, (
                    f"{path} leaf {li} entry {pick}: analytic {g!r} vs finite difference {fd!r}"
                )
                checked += 1
    assert checked > 0
    return checked


def check_grads_equal(actual, expected, rtol=1e-8, atol=1e-12):
    """Gradient dicts keyed by state path agree leaf by leaf."""
    assert set(actual) == set(expected), (set(actual), set(expected))
    for path in expected:
        a_leaves, a_tree = jax.tree.flatten(actual[path])
        e_leaves, e_tree = jax.tree.flatten(expected[path])
        assert a_tree == e_tree, path
        for a, e in zip(a_leaves, e_leaves):
            assert a.shape == e.shape and a.dtype == e.dtype, (path, a.shape, e.shape, a.dtype, e.dtype)
            assert float(jnp.max(jnp.abs(e))) > 0, f"reference gradient of {path} is all zero"
            np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=atol, err_msg=str(path))


# Pseudo-derivatives with the defaults documented in surrogate.py, written out again
# here (independently of the library) for the references.
PSEUDO_DERIVATIVES = _reference.PSEUDO_DERIVATIVES


def make_spike(name, scale=1.0):
    """Heaviside ``v > 0`` with the pseudo-derivative of surrogate ``name`` times ``scale``."""
    return _reference.spike_function(functools.partial(PSEUDO_DERIVATIVES[name], scale=scale))


def run_loop(model, xs, batch_size, out=None):
    """Reset ``model`` and run it over ``xs`` (time first) with ``brainstate.transform.for_loop``."""
    brainstate.nn.reset_all_states(model, batch_size=batch_size)
    body = (lambda x: model(x)) if out is None else (lambda x: out(model(x)))
    return brainstate.transform.for_loop(body, xs)


def rand_np(seed, *shape, scale=1.0):
    """A float64 numpy standard-normal array: a cheap initializer (random initializers
    of brainstate compile once per shape, which would dominate the suite's runtime)."""
    return np.random.default_rng(seed).standard_normal(shape) * scale


def randomize(module, seed=0, bias_scale=0.5):
    """Fresh random weights (see ``tests/_shared_reference.py``)."""
    return _reference.randomize(module, seed=seed, bias_scale=bias_scale)


def sequence_grads(model, xs, ys, algo):
    """Gradients of ``Σ_t |out_t − y_t|²`` over time-major ``xs (T, B, ...)`` from reset
    states: by ``ef.sequence_grad`` with ``algo``, or with ``algo="reference"`` by
    ``brainstate.transform.grad`` through a ``for_loop`` (BPTT, independent of the rules)."""
    import warnings

    import etrace_fit as ef

    loss = lambda out, y: jnp.sum((out - y) ** 2)  # noqa: E731
    batch = jnp.shape(xs)[1]
    brainstate.nn.reset_all_states(model, batch_size=batch)
    if algo == "reference":
        params = model.states(brainstate.ParamState)

        def total():
            brainstate.nn.reset_all_states(model, batch_size=batch)
            outs = brainstate.transform.for_loop(model, xs)
            return jax.vmap(loss)(outs, ys).sum()

        return brainstate.transform.grad(total, grad_states=params)()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        return ef.sequence_grad(model, xs, ys, loss, algo=algo)[0]


def fit_inside_sequence(make_model, optimizer, x, y, snapshot, check):
    """Train a fresh ``make_model()`` for one update inside the sequence, first with the
    Trainer's ``update_every`` and then with ``ef.online_fit`` (both D-RTRL, one batch of
    all of ``x`` (N, T, C), two outputs), and call ``check(model, snapshot(fresh model))``
    after each."""
    import etrace_fit as ef

    n, steps = x.shape[:2]
    model = make_model()
    before = snapshot(model)
    ef.Trainer(model, algo="d_rtrl", optimizer=optimizer, update_every=steps).fit(
        x, y, batch_size=n, epochs=1, verbose=0, shuffle=False)
    check(model, before)
    model = make_model()
    brainstate.nn.init_all_states(model, batch_size=n)
    before = snapshot(model)
    ef.online_fit(model, jnp.swapaxes(x, 0, 1), jnp.zeros((steps, n, 2)), lambda o, t: jnp.sum((o - t) ** 2),
                  optimizer, update_every=steps, algo="d_rtrl")
    check(model, before)

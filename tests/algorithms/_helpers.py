"""Helpers shared by the learning-rule tests (not a test module).

The reference gradient is always computed independently of the code under test:
``brainstate.transform.grad`` of a loss that resets the model and runs it with
``brainstate.transform.for_loop`` (BPTT by JAX's autodiff). The library's own
``algo='bptt'`` is only ever compared *with* that reference, never used as one.

Models are built from numpy arrays (``w_init=...``): brainstate's random initializers
compile once per shape, which would dominate the suite's runtime.
"""

from __future__ import annotations

import _shared_reference as _reference
import brainstate
import jax
import jax.numpy as jnp
import numpy as np

import functools

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit import ops


def rand(seed, *shape, scale=1.0, shift=0.0):
    """A float64 numpy normal array: a cheap initializer / input."""
    return np.random.default_rng(seed).standard_normal(shape) * scale + shift


def mse(out, target):
    """Summed squared error of one step (the step loss of most tests)."""
    return jnp.sum((out - target) ** 2)


def bptt_fn(model, step_loss, batch_size, initial=None):
    """A jitted ``(xs, targets) -> (grads, losses)``: the gradient of
    ``Σ_t step_loss(model(xs[t]), targets[t])`` by ``brainstate.transform.grad`` over a
    ``brainstate.transform.for_loop`` (independent of the learning rules under test).

    The sequence starts from reset states, or, with ``initial`` (``{hidden state path:
    value}``), from those values. ``targets`` may be None. The model runs in training
    mode (``brainstate.environ``'s ``fit``), as the rules trace it: a ``BatchNorm``
    normalises with the batch's statistics, not its running ones.
    """
    params = model.states(brainstate.ParamState)
    hidden = model.states(brainstate.HiddenState)

    def run(xs, targets):
        def loss_fn():
            brainstate.nn.reset_all_states(model, batch_size=batch_size)
            if initial is not None:
                for path, value in initial.items():
                    hidden[path].value = value
            with brainstate.environ.context(fit=True):
                outs = brainstate.transform.for_loop(model, xs)
            if targets is None:
                losses = jax.vmap(lambda o: step_loss(o, None))(outs)
            else:
                losses = jax.vmap(step_loss)(outs, targets)
            return losses.sum(), losses

        grads, _, losses = brainstate.transform.grad(loss_fn, grad_states=params, return_value=True, has_aux=True)()
        return grads, losses

    return brainstate.transform.jit(run)


def reference_bptt(model, xs, targets, step_loss, batch_size, initial=None):
    """``(grads, losses)`` of :func:`bptt_fn` as host (numpy) copies; the model is left
    with reset states."""
    grads, losses = bptt_fn(model, step_loss, batch_size, initial)(xs, targets)
    brainstate.nn.reset_all_states(model, batch_size=batch_size)
    return to_host(grads), np.asarray(losses)


def rtrl_window_fn(model, xs, targets, step_loss):
    """A jitted ``(weights, loss_on, perturbed) -> grads``: RTRL's gradient under weights
    that change within the sequence (``update_every``), by autodiff, independent of the
    rules under test.

    ``weights``: ``{ParamState path: value}`` with a leading axis ``T``, the weights each
    step runs with; ``loss_on``: ``(T,)`` weights of the steps' losses (1 on a window's
    steps, 0 elsewhere); ``perturbed``: ``(T,)``, 1 where the steps' weights get ``δ``.
    Returns ``d/dδ Σ_t loss_on[t]·step_loss(o_t, targets[t])`` at ``δ = 0``, where step
    ``t`` runs ``weights[t] + perturbed[t]·δ``, from reset states, in training mode, as
    ``{path: value}``. With ``perturbed`` all ones this is the exact online gradient of
    the window (a perturbation of every step since the sequence began, each step
    keeping the weights it ran with); with ones from the window's start only it is
    truncated BPTT. The model's weights and hidden states are left as they were
    (hidden states reset).
    """
    params = model.states(brainstate.ParamState)
    delta = {path: brainstate.State(jax.tree.map(jnp.zeros_like, state.value)) for path, state in params.items()}
    batch_size = jax.tree.leaves(xs)[0].shape[1]

    def loss(weights, loss_on, perturbed):
        saved = {path: state.value for path, state in params.items()}
        brainstate.nn.reset_all_states(model, batch_size=batch_size)

        def step(inputs):
            x, w, scale = inputs
            for path, state in params.items():
                state.value = jax.tree.map(lambda v, d: v + scale * d, w[path], delta[path].value)
            return model(x)

        with brainstate.environ.context(fit=True):
            outs = brainstate.transform.for_loop(step, (xs, weights, perturbed))
        for path, state in params.items():
            state.value = saved[path]
        return jnp.sum(loss_on * jax.vmap(step_loss)(outs, targets))

    grad = brainstate.transform.jit(brainstate.transform.grad(loss, grad_states=delta))

    def run(weights, loss_on, perturbed):
        dtype = jax.tree.leaves(xs)[0].dtype
        grads = grad(weights, jnp.asarray(loss_on, dtype), jnp.asarray(perturbed, dtype))
        brainstate.nn.reset_all_states(model, batch_size=batch_size)
        return to_host(grads)

    return run


class Case:
    """A model, one sequence, and its reference (BPTT) gradients and losses, built in
    ``precision`` with ``dt = 1``. :meth:`run` calls ``sequence_grad`` in the same
    environment, from reset states; results are host copies.

    Module-scoped fixtures build these once: the contexts are entered per call, never
    held open across tests.
    """

    def __init__(self, build, x_shape, y_shape, precision, *, step_loss=None, seed=10, x_scale=0.8, x_shift=0.4):
        self.precision = precision
        self.step_loss = mse if step_loss is None else step_loss
        self.batch = x_shape[1]
        with self.env():
            self.model = build()
            dtype = brainstate.environ.dftype()
            brainstate.nn.init_all_states(self.model, batch_size=self.batch)
            self.xs = jnp.asarray(rand(seed, *x_shape, scale=x_scale, shift=x_shift), dtype)
            self.ys = jnp.asarray(rand(seed + 1, *y_shape), dtype)
            self.ref_grads, self.ref_losses = reference_bptt(self.model, self.xs, self.ys, self.step_loss, self.batch)
        self._runs = {}

    def env(self):
        return brainstate.environ.context(precision=self.precision, dt=1.0)

    def run(self, algo, **kwargs):
        key = (repr(algo), tuple(sorted(kwargs.items())))
        if key not in self._runs:
            with self.env():
                self._runs[key] = online_grads(self.model, self.xs, self.ys, self.step_loss, self.batch,
                                               algo=algo, **kwargs)
        return self._runs[key]

    def forward(self, fn=None):
        """Host copy of ``for_loop(fn or model)`` over ``xs`` from reset states."""
        with self.env():
            brainstate.nn.reset_all_states(self.model, batch_size=self.batch)
            out = brainstate.transform.for_loop(self.model if fn is None else fn, self.xs)
            brainstate.nn.reset_all_states(self.model, batch_size=self.batch)
        return np.asarray(out)


def to_host(tree):
    return jax.tree.map(np.asarray, tree)


def online_grads(model, xs, targets, step_loss, batch_size, **kwargs):
    """``sequence_grad`` from reset states, as host copies."""
    from etrace_fit import sequence_grad

    brainstate.nn.reset_all_states(model, batch_size=batch_size)
    grads, losses = sequence_grad(model, xs, targets, step_loss, **kwargs)
    return to_host(grads), np.asarray(losses)


def program_grads(case, algo, chunk, per_step=False, active=None):
    """Gradient leaves and losses of ``case`` under ``algo`` with the engine built at
    ``chunk`` (``per_step``: each rule wrapped to its per-step form; ``active``: as
    ``program.run`` takes it, e.g. ``"last"``)."""
    import warnings

    from _per_step import PerStep

    from etrace_fit.algorithms.online import build_online

    with case.env(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        brainstate.nn.reset_all_states(case.model, batch_size=case.batch)
        graph, plan = ef.algorithms.plan_for(case.model, case.xs, case.ys, case.step_loss, algo=algo)
        rules = tuple(PerStep(r) for r in plan.rules) if per_step else plan.rules
        program = build_online(graph, plan.pairs, rules, case.step_loss, trace_dtype=plan.trace_dtype, chunk=chunk)
        module = graph.module
        weights = [leaf for s in module.weights for leaf in jax.tree.leaves(s.state.value)]
        run = jax.jit(lambda w, s, x, y: program.run(w, s, x, y, active=active))
        grads, losses, _ = run(weights, module.state_leaves(), [case.xs], case.ys)
    return [np.asarray(g) for g in grads], np.asarray(losses)


def grads_by_path(module, leaves):
    """A program's gradient leaves (``module.weights`` order) as ``{ParamState path: value}``."""
    out, cursor = {}, 0
    for state in module.weights:
        count = len(jax.tree.leaves(state.state.value))
        out[state.path] = jax.tree.unflatten(jax.tree.structure(state.state.value), leaves[cursor:cursor + count])
        cursor += count
    return out


def leaves_by_name(grads):
    """``{"layers.0.weight['weight']": array}``: one entry per leaf of every state's gradient."""
    out = {}
    for path, value in grads.items():
        name = ".".join(str(p) for p in path)
        for key_path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
            out[name + jax.tree_util.keystr(key_path)] = np.asarray(leaf)
    return out


def rel_err(a, b):
    """``max|a − b| / max|b|`` (``b`` must not be all zero)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = np.max(np.abs(b))
    assert scale > 0, "reference is all zero"
    return float(np.max(np.abs(a - b)) / scale)


def cosine(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def assert_same_structure(grads, model):
    """Keys exactly those of ``model.states(ParamState)`` (same order), each gradient with
    its state's value structure, shapes and dtypes."""
    params = model.states(brainstate.ParamState)
    assert list(grads.keys()) == list(params.keys())
    for path, state in params.items():
        g_leaves, g_tree = jax.tree.flatten(grads[path])
        v_leaves, v_tree = jax.tree.flatten(state.value)
        assert g_tree == v_tree, (path, g_tree, v_tree)
        for g, v in zip(g_leaves, v_leaves):
            assert np.shape(g) == np.shape(v), (path, np.shape(g), np.shape(v))
            assert np.asarray(g).dtype == np.asarray(v).dtype, (path, np.asarray(g).dtype, np.asarray(v).dtype)


def assert_grads_match(actual, expected, tol, only=None):
    """Every leaf (or the leaves whose name contains one of ``only``) within relative
    error ``tol``; the reference leaf must be non-zero. Returns ``{leaf: rel_err}``."""
    a, e = leaves_by_name(actual), leaves_by_name(expected)
    assert a.keys() == e.keys(), (a.keys(), e.keys())
    errors = {}
    for name in e:
        if only is not None and not any(o in name for o in only):
            continue
        assert np.max(np.abs(e[name])) > 0, f"reference gradient of {name} is all zero"
        errors[name] = rel_err(a[name], e[name])
    bad = {k: v for k, v in errors.items() if not v < tol}
    assert not bad, f"relative errors above {tol}: {bad} (all: {errors})"
    return errors


def assert_losses_match(actual, expected, rtol):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * max(1.0, float(np.max(np.abs(expected)))))


class LeakyTanh(brainstate.nn.Module):
    """``h = leak·h + (1 − leak)·tanh(x W + b)``: a rate layer with elementwise recurrence."""

    def __init__(self, in_size, size, *, seed=0, leak=0.8, scale=1.0):
        super().__init__()
        self.size, self.leak = size, leak
        self.W = brainstate.ParamState({
            "weight": jnp.asarray(rand(seed, in_size, size, scale=scale / np.sqrt(in_size)), brainstate.environ.dftype()),
            "bias": jnp.asarray(rand(seed + 1, size, scale=0.3), brainstate.environ.dftype()),
        })

    def init_state(self, batch_size=None, **kwargs):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, self.size), brainstate.environ.dftype()))

    def reset_state(self, batch_size=None, **kwargs):
        self.h.value = jnp.zeros((batch_size, self.size), brainstate.environ.dftype())

    def update(self, x):
        p = self.W.value
        self.h.value = self.leak * self.h.value + (1.0 - self.leak) * jnp.tanh(ops.matmul(x, p["weight"], p["bias"]))
        return self.h.value


class LeakyIntegrator(brainstate.nn.Module):
    """``h = a·h + x W``: a linear integrator whose Jacobian is the constant ``a``."""

    def __init__(self, in_size, size, a, *, seed=0, bias=False):
        super().__init__()
        self.size, self.a = size, a
        params = {"weight": jnp.asarray(rand(seed, in_size, size, scale=1 / np.sqrt(in_size)), brainstate.environ.dftype())}
        if bias:
            params["bias"] = jnp.asarray(rand(seed + 1, size, scale=0.3), brainstate.environ.dftype())
        self.W = brainstate.ParamState(params)

    def init_state(self, batch_size=None, **kwargs):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, self.size), brainstate.environ.dftype()))

    def reset_state(self, batch_size=None, **kwargs):
        self.h.value = jnp.zeros((batch_size, self.size), brainstate.environ.dftype())

    def update(self, x):
        p = self.W.value
        self.h.value = self.a * self.h.value + ops.matmul(x, p["weight"], p.get("bias"))
        return self.h.value


# ------------------------------------------------------------------ shared models

I, N, O, B, T = 4, 8, 2, 3, 30
LC, C = 6, 4  # conv: positions and channels
TOL = {64: 1e-5, 32: 1e-4}
LOSS_RTOL = {64: 1e-10, 32: 1e-5}


def lin(i, o, seed, scale=1.0):
    return L.Linear(i, o, w_init=rand(seed, i, o, scale=scale / np.sqrt(i)), b_init=rand(seed + 1, o, scale=0.3))


def _lif():
    return ef.Sequential(lin(I, N, 0, 2.0), L.LIF(N, tau=10.0, reset="hard", surrogate="sigmoid"), lin(N, O, 2))


def _alif():
    return ef.Sequential(lin(I, N, 0, 2.0), L.ALIF(N, tau=10.0, tau_a=30.0, beta=0.5, surrogate="sigmoid"),
                         lin(N, O, 2))


def _tanh():
    return ef.Sequential(LeakyTanh(I, N, scale=1.5), lin(N, O, 2))


def _lif_tau():
    tau = rand(5, N, scale=2.0, shift=10.0)
    return ef.Sequential(lin(I, N, 0, 2.0), L.LIF(N, tau=tau, learn_tau=True, surrogate="sigmoid"), lin(N, O, 2))


def _alif_tau():
    return ef.Sequential(lin(I, N, 0, 2.0),
                         L.ALIF(N, tau=10.0, tau_a=30.0, learn_tau=True, learn_tau_a=True, surrogate="sigmoid"),
                         lin(N, O, 2))


def _conv1d():
    conv = L.Conv1d(2, C, 3, w_init=rand(0, 3, 2, C, scale=0.8), b_init=rand(1, C, scale=0.3))
    return ef.Sequential(conv, L.LIF((LC, C), tau=10.0, surrogate="sigmoid"), L.Flatten(), lin(LC * C, O, 2))


def _conv1d_strided():
    conv = L.Conv1d(2, C, 3, stride=2, padding="VALID", w_init=rand(0, 3, 2, C, scale=0.8),
                    b_init=rand(1, C, scale=0.3))
    return ef.Sequential(conv, L.LIF((3, C), tau=10.0, surrogate="sigmoid"), L.Flatten(), lin(3 * C, O, 2))


def _conv2d():
    conv = L.Conv2d(2, C, 3, w_init=rand(0, 3, 3, 2, C, scale=0.5), b_init=rand(1, C, scale=0.3))
    return ef.Sequential(conv, L.LIF((4, 4, C), tau=10.0, surrogate="sigmoid"), L.Flatten(), lin(16 * C, O, 2))


def _masked_positive():
    mask = (rand(50, I, N) > 0).astype(np.float64)
    first = L.Linear(I, N, w_init=rand(0, I, N), b_init=rand(1, N, scale=0.3), mask=mask, weight_fn=ops.Positive())
    return ef.Sequential(first, L.LIF(N, tau=10.0, surrogate="sigmoid"), lin(N, O, 2))


class SharedWeight(brainstate.nn.Module):
    """One Linear feeding two LIF layers (x and −x): two relations of one weight."""

    def __init__(self):
        super().__init__()
        self.inp = lin(I, N, 0, 2.0)
        self.fast = L.LIF(N, tau=5.0, surrogate="sigmoid")
        self.slow = L.LIF(N, tau=15.0, surrogate="sigmoid")
        self.out = lin(2 * N, O, 2)

    def update(self, x):
        return self.out(jnp.concatenate([self.fast(self.inp(x)), self.slow(self.inp(-x))], axis=-1))


MODELS = {
    "lif": (_lif, (T, B, I)),
    "alif": (_alif, (T, B, I)),
    "leaky_tanh": (_tanh, (T, B, I)),
    "lif_learn_tau": (_lif_tau, (T, B, I)),
    "alif_learn_tau": (_alif_tau, (T, B, I)),
    "conv1d_lif": (_conv1d, (T, B, LC, 2)),
    "conv1d_strided_lif": (_conv1d_strided, (T, B, 8, 2)),
    "conv2d_lif": (_conv2d, (T, B, 4, 4, 2)),
    "masked_positive": (_masked_positive, (T, B, I)),
    "shared_weight": (SharedWeight, (T, B, I)),
}
CORE = ("lif", "alif", "leaky_tanh", "lif_learn_tau", "conv1d_lif")  # (a)-(e) of the spec
EXTRA = ("alif_learn_tau", "conv1d_strided_lif", "conv2d_lif", "masked_positive", "shared_weight")  # float64 only
CASES = [(name, p) for name in CORE for p in (64, 32)] + [(name, 64) for name in EXTRA]
CASE_IDS = [f"{n}-f{p}" for n, p in CASES]
SPIKING = {"lif", "alif", "lif_learn_tau", "alif_learn_tau", "conv1d_lif", "conv1d_strided_lif", "conv2d_lif",
           "masked_positive"}


@functools.lru_cache(maxsize=None)
def get_case(name, precision):
    """Built once per session (compiling a model's step costs a second or so)."""
    build, x_shape = MODELS[name]
    built = Case(build, x_shape, (T, B, O), precision)
    built.name = name
    return built


def randomize(module, seed, scale=1.0, bias_scale=0.3):
    """Fresh random weights (``tests/_shared_reference.py``): gates built from one
    ``w_init`` array would otherwise start identical."""
    return _reference.randomize(module, seed=seed, scale=scale, bias_scale=bias_scale)



def zero_recurrent_rows(cell, in_size):
    """Zero the rows of every gate weight that multiply the cell's own state (rows
    ``in_size:`` of ``[x, h] W``): the cell's only recurrence is then per unit."""
    for _, state in cell.states(brainstate.ParamState).items():
        value = dict(state.value)
        value["weight"] = value["weight"].at[in_size:].set(0.0)
        state.value = value
    return cell


class RecurrentLIF(brainstate.nn.Module):
    """LIF neurons whose input current is ``[x, z^{t-1}] W + b``, ``z^{t-1}`` the spike
    the stored potential emitted last step (read from the LIF state)."""

    def __init__(self, in_size, size, *, tau=10.0, seed=0, scale=2.0):
        super().__init__()
        self.W = lin(in_size + size, size, seed, scale)
        self.lif = L.LIF(size, tau=tau, surrogate="sigmoid")

    def update(self, x):
        z_prev = self.lif.surrogate(self.lif.V.value - self.lif.v_threshold)
        return self.lif(self.W(jnp.concatenate([x, z_prev], axis=-1)))


class RecurrentLIFState(brainstate.nn.Module):
    """As :class:`RecurrentLIF`, but the spikes fed back are kept in an extra
    HiddenState ``z`` (so ``z`` and ``V`` form one hidden group of two states)."""

    def __init__(self, in_size, size, *, tau=10.0, seed=0, scale=2.0):
        super().__init__()
        self.size = size
        self.W = lin(in_size + size, size, seed, scale)
        self.lif = L.LIF(size, tau=tau, surrogate="sigmoid")

    def init_state(self, batch_size=None, **kwargs):
        self.z = brainstate.HiddenState(jnp.zeros((batch_size, self.size), brainstate.environ.dftype()))

    def reset_state(self, batch_size=None, **kwargs):
        self.z.value = jnp.zeros((batch_size, self.size), brainstate.environ.dftype())

    def update(self, x):
        self.z.value = self.lif(self.W(jnp.concatenate([x, self.z.value], axis=-1)))
        return self.z.value

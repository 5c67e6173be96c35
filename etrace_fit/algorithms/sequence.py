"""``sequence_grad``: the gradient of a sequence's summed loss by any rule, in one jitted scan.

The public entry point of the learning rules. It compiles the model's step (once per
input shape), plans a rule per traced weight, and runs the whole sequence in one
``jit(lax.scan(...))``; a second call with the same shapes reuses the compiled code.
"""

from __future__ import annotations

import dataclasses
import warnings
import weakref
from typing import Any, Callable, Mapping

import brainstate
import jax
import jax.numpy as jnp

from ..compiler import compile_graph, format_path
from ..errors import ApproximationWarning, ConfigError, ShapeError
from .bptt import build_bptt
from .esd_rtrl import resolve_decay
from .hybrid import make_plan, parse_bytes
from .online import build_online

__all__ = ["CompiledSequence", "compile_sequence", "online_fit", "plan_for", "sequence_grad"]

ALGOS = ("d_rtrl", "esd_rtrl", "hybrid", "bptt")

# model -> {key: (graph, plan, jitted runner)}; weak so a dropped model frees its code.
_CACHE: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def _check_batch_axis(model, xs_leaves) -> None:
    """xs is (T, B, ...) and every hidden state is (B, ...): say which disagrees."""
    batch = jnp.shape(xs_leaves[0])[1]
    for path, state in model.states(brainstate.HiddenState).items():
        shape = tuple(jnp.shape(jax.tree.leaves(state.value)[0]))
        if not shape or shape[0] != batch:
            raise ShapeError(
                f"sequence_grad: xs has shape {tuple(jnp.shape(xs_leaves[0]))}, read as time-major (T, B, ...) "
                f"with B={batch}, but hidden state {format_path(path)} has shape {shape}; expected a "
                f"leading batch axis of {batch}. Initialise states with brainstate.nn.init_all_states(model, "
                f"batch_size=B), and pass xs time-major (swap axes 0 and 1 of batch-major data)"
            )


def _same_states(model, graph) -> bool:
    """Whether the compiled graph still refers to the model's current state objects."""
    current = model.states()
    return all(current.get(info.path) is info.state for info in graph.module.states)


def _signature(tree: Any) -> tuple:
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((tuple(jnp.shape(x)), jnp.result_type(x).name) for x in leaves)


def _algo_key(algo: Any) -> Any:
    return tuple(sorted(algo.items())) if isinstance(algo, Mapping) else algo


def _prepare(model, xs, targets, step_loss, algo, decay, rank, trace_dtype, memory_budget=None, plan_batch=None):
    if not isinstance(algo, Mapping) and algo not in ALGOS:
        raise ConfigError(f"unknown algo {algo!r}; valid: {', '.join(repr(a) for a in ALGOS)} or a dict "
                          f"{{path pattern: 'd_rtrl' | 'esd_rtrl'}}")
    if not callable(step_loss):
        raise ConfigError(f"step_loss must be a callable (output_t, target_t) -> scalar, got {type(step_loss).__name__}")
    xs_leaves = jax.tree.leaves(xs)
    if not xs_leaves:
        raise ShapeError("sequence_grad: xs is empty; expected a time-major array (T, B, ...)")
    length = jnp.shape(xs_leaves[0])[0] if jnp.ndim(xs_leaves[0]) else 0
    for leaf in xs_leaves:
        if jnp.ndim(leaf) < 2 or jnp.shape(leaf)[0] != length:
            raise ShapeError(f"sequence_grad: xs must be time-major (T, B, ...) with one T, got shapes "
                             f"{[tuple(jnp.shape(x)) for x in xs_leaves]}")
    if length == 0:
        raise ShapeError("sequence_grad: xs has no time steps (T = 0)")
    for leaf in jax.tree.leaves(targets):
        if jnp.ndim(leaf) < 1 or jnp.shape(leaf)[0] != length:
            raise ShapeError(f"sequence_grad: targets must have the leading time axis T={length}, got shape "
                             f"{tuple(jnp.shape(leaf))}")
    alpha = resolve_decay(decay, rank)
    memory_budget = parse_bytes(memory_budget)
    if trace_dtype is not None:
        trace_dtype = jnp.dtype(trace_dtype)
        if trace_dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float64)):
            raise ConfigError(f"trace_dtype must be float32, bfloat16 or float64, got {trace_dtype}")

    example = jax.tree.map(lambda x: x[0], xs)
    key = (_signature(xs), _signature(targets), _algo_key(algo), alpha, str(trace_dtype), memory_budget, step_loss,
           plan_batch)
    entries = _CACHE.setdefault(model, {})
    if key in entries and not _same_states(model, entries[key][0]):
        entries.clear()  # init_all_states made new state objects: compile again
    if key not in entries:
        _check_batch_axis(model, xs_leaves)
        graph = compile_graph(model, *((example,) if not isinstance(example, tuple) else example))
        if algo == "bptt":
            plan, program = None, build_bptt(graph, step_loss)
        else:
            batch = graph.hidden_groups[0].shape[0] if graph.hidden_groups[0].shape else 1
            batch = batch if plan_batch is None else plan_batch
            dtype = jnp.dtype(graph.hidden_groups[0].dtype) if trace_dtype is None else trace_dtype
            plan = make_plan(graph, algo, alpha=alpha, batch=batch, trace_dtype=dtype, memory_budget=memory_budget)
            warn_approximations(plan, stacklevel=4)
            program = build_online(graph, plan.pairs, plan.rules, step_loss, trace_dtype=dtype)
        entries[key] = (graph, plan, jax.jit(program.run), program)
    return entries[key]


def warn_approximations(plan, stacklevel: int = 2) -> None:
    """One :class:`~etrace_fit.errors.ApproximationWarning` per weight whose online
    gradient under ``plan`` is approximate, naming it and saying why."""
    for path, reasons in plan.approximations().items():
        warnings.warn(f"the online gradient of {path} is approximate: " + "; ".join(reasons)
                      + "; see the plan's report(), measure it with ef.gradient_fidelity, or use algo='bptt'",
                      ApproximationWarning, stacklevel=stacklevel)


def plan_for(model, xs, targets, step_loss, algo="hybrid", decay=None, rank=None, trace_dtype=None,
             memory_budget=None):
    """The compiled graph and rule plan ``sequence_grad`` would use (``None`` plan for BPTT)."""
    graph, plan, _, _ = _prepare(model, xs, targets, step_loss, algo, decay, rank, trace_dtype, memory_budget)
    return graph, plan


@dataclasses.dataclass(frozen=True)
class CompiledSequence:
    """A model's step compiled for one input signature, for callers that build their
    own jitted function around the pure program (the ``Trainer`` fuses it with the
    optimizer and the metrics into one call per batch).

    ``program.run(weight_leaves, state_leaves, xs_leaves, targets, collect=...)`` is
    pure; :meth:`weight_leaves`, :meth:`state_leaves`, :meth:`per_state` and
    :meth:`write_states` move values between it and the model's states.
    """

    graph: Any
    plan: Any  # None for BPTT
    program: Any

    @property
    def module(self):
        return self.graph.module

    def weight_leaves(self, values: Mapping | None = None) -> list:
        """The program's weight leaves, from the states or from ``values`` keyed by path."""
        if values is None:
            return _weight_leaves(self.module)
        return [leaf for s in self.module.weights for leaf in jax.tree.leaves(values[s.path])]

    def state_leaves(self) -> list:
        return self.module.state_leaves()

    def per_state(self, weight_leaves) -> dict:
        """Weight leaves regrouped per ParamState path (only the weights the step reads)."""
        return _per_state(self.module, weight_leaves)

    def write_states(self, final_leaves) -> None:
        """Leave the model's non-weight states where a run ended."""
        _write_states(self.module, final_leaves)


def compile_sequence(model, xs, targets, step_loss, algo="hybrid", decay=None, rank=None,
                     trace_dtype=None, memory_budget=None, plan_batch=None) -> CompiledSequence:
    """The compiled step, plan and pure program :func:`sequence_grad` would run
    (cached: the same shapes share one program). ``plan_batch``: the batch size the
    plan's memory budget is counted at (default: ``xs``'s), so that a caller whose
    batches differ in size (a last, smaller batch) keeps one plan."""
    graph, plan, _, program = _prepare(model, xs, targets, step_loss, algo, decay, rank, trace_dtype, memory_budget,
                                       plan_batch)
    return CompiledSequence(graph, plan, program)


def sequence_grad(
    model: Any,
    xs: Any,
    targets: Any,
    step_loss: Callable[[Any, Any], jax.Array],
    algo: str | Mapping[str, str] = "hybrid",
    decay: float | None = None,
    rank: int | None = None,
    trace_dtype: Any = None,
    memory_budget: Any = None,
) -> tuple[dict, jax.Array]:
    """Gradients of ``Σ_t step_loss(model(xs[t]), targets[t])`` over one sequence.

    Args:
        model: a ``brainstate.nn.Module`` with initialised states
            (``brainstate.nn.init_all_states(model, batch_size=B)``); the sequence starts
            from its current hidden states, with traces at zero.
        xs: time-major inputs ``(T, B, ...)`` (a pytree of them for several inputs).
        targets: a pytree with leading axis ``T``, or ``None``.
        step_loss: ``(output_t, target_t) -> scalar``.
        algo: ``"d_rtrl"``, ``"esd_rtrl"``, ``"hybrid"`` (default), ``"bptt"``, or a dict
            ``{path pattern: rule}`` forcing rules per weight.
        decay, rank: ES-D-RTRL's smoothing ``α`` (``decay`` in [0, 1), or ``rank`` r with
            α = (r − 1)/(r + 1)); 0.9 when neither is given.
        trace_dtype: dtype of the traces: the hidden states' dtype by default (float32
            for a float32 model); bfloat16 halves their memory.
        memory_budget: for ``"hybrid"``: total trace memory (bytes, or ``"64MiB"``)
            the plan may spend moving weights from ES-D-RTRL to D-RTRL, cheapest
            first (None: the factor-of-4 rule alone).

    Returns:
        ``(grads, losses)``: ``grads`` keyed exactly like
        ``model.states(brainstate.ParamState)``, each with its state's value structure;
        ``losses`` of shape ``(T,)``. The model's hidden states are left where the
        sequence ended; its weights are not changed.

    Example::

        grads, losses = sequence_grad(model, xs, ys, lambda out, y: ((out - y) ** 2).sum())
    """
    graph, _, runner, _ = _prepare(model, xs, targets, step_loss, algo, decay, rank, trace_dtype, memory_budget)
    module = graph.module
    grads_leaves, losses, final_leaves = runner(_weight_leaves(module), module.state_leaves(), jax.tree.leaves(xs), targets)
    _write_states(module, final_leaves)
    grads = _per_state(module, grads_leaves)
    # In the model's key order; a weight the step never reads gets zeros.
    return {path: grads[path] if path in grads else jax.tree.map(jnp.zeros_like, param.value)
            for path, param in model.states(brainstate.ParamState).items()}, losses


def online_fit(
    model: Any,
    xs: Any,
    targets: Any,
    step_loss: Callable[[Any, Any], jax.Array],
    optimizer: Any,
    opt_state: Any = None,
    *,
    update_every: int = 1,
    algo: str | Mapping[str, str] = "hybrid",
    decay: float | None = None,
    rank: int | None = None,
    trace_dtype: Any = None,
    memory_budget: Any = None,
) -> tuple[Any, jax.Array]:
    """Train on one sequence *online*: an optimizer update every ``update_every`` steps.

    Like :func:`sequence_grad`, but inside the scan the accumulated gradient is applied
    with ``optimizer`` (an optax ``GradientTransformation``) every ``update_every``
    steps (and once more for a last partial window); traces carry on across updates.
    The model's weights and hidden states are updated in place.

    Args:
        opt_state: the optimizer state from the previous call, or ``None`` to start
            (``optimizer.init`` of the list of weight leaves).

    Returns:
        ``(opt_state, losses)``; pass ``opt_state`` to the next call.

    Example::

        opt_state = None
        for xs, ys in sequences:
            opt_state, losses = online_fit(model, xs, ys, loss, optax.adam(1e-3), opt_state, update_every=10)
    """
    if not isinstance(update_every, int) or isinstance(update_every, bool) or update_every < 1:
        raise ConfigError(f"update_every must be a positive int, got {update_every!r}")
    if algo == "bptt":
        raise ConfigError("update_every needs an online rule ('d_rtrl', 'esd_rtrl', 'hybrid'); BPTT must see the "
                          "whole sequence before it has a gradient")
    graph, _, _, program = _prepare(model, xs, targets, step_loss, algo, decay, rank, trace_dtype, memory_budget)
    module = graph.module
    weights = _weight_leaves(module)
    if opt_state is None:
        opt_state = optimizer.init(weights)
    entries = _CACHE[model]
    key = ("online_fit", id(program), optimizer, update_every)
    if key not in entries:
        entries[key] = jax.jit(lambda w, s, x, y, o: program.run_with_updates(w, s, x, y, optimizer, o, update_every))
    weights, opt_state, losses, final_leaves = entries[key](weights, module.state_leaves(), jax.tree.leaves(xs),
                                                            targets, opt_state)
    _write_states(module, final_leaves)
    for path, value in _per_state(module, weights).items():
        module.state(path).state.value = value
    return opt_state, losses


def _weight_leaves(module) -> list:
    return [leaf for s in module.weights for leaf in jax.tree.leaves(s.state.value)]


def _per_state(module, weight_leaves) -> dict:
    """Weight leaves (in ``module.weights`` order) regrouped per ParamState value."""
    out, cursor = {}, 0
    for state in module.weights:
        count = len(state.in_vars)
        out[state.path] = jax.tree.unflatten(jax.tree.structure(state.state.value), weight_leaves[cursor:cursor + count])
        cursor += count
    return out


def _write_states(module, final_leaves) -> None:
    """Leave the written non-weight states where the sequence ended."""
    cursor = 0
    for state in module.states:
        count = len(state.in_vars)
        if state.kind != "weight" and state.written:
            state.state.value = jax.tree.unflatten(jax.tree.structure(state.state.value), final_leaves[cursor:cursor + count])
        cursor += count

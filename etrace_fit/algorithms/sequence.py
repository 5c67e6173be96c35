"""``sequence_grad`` and ``online_fit``: one call from a model to gradients or training.

Both compile the model with :func:`etrace_fit.compile` and keep the :class:`Learner`
per model and options, so a second call with the same shapes reuses the compiled
program; every call first checks that the model still compiles to the same step
(:meth:`Learner.is_current`: a changed layer attribute or recreated states mean a new
compile, never a stale program). In a loop, compile once yourself and pass the
learner: ``learner = ef.compile(model, xs[0], loss); sequence_grad(learner, xs, ys)``.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Mapping

import brainstate
import jax
import jax.numpy as jnp

from .. import _compat
from ..errors import ConfigError
from .esd_rtrl import resolve_decay
from .hybrid import parse_bytes
from .learner import (CompiledSequence, Learner, _check_batch_axis, _run, check_sequence, compile, frozen_weights,
                      warn_approximations, warn_readout_memory_under_updates, warn_unread,
                      warn_weight_maps_under_updates)
from .registry import ONLINE_ALGOS, check_algo, sequence_algo

__all__ = ["compile_sequence", "online_fit", "plan_for", "sequence_grad"]

# model -> {options: Learner}; weak so a dropped model frees its code.
_LEARNERS: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def _algo_key(algo: Any) -> Any:
    """A hashable key: rule values by identity."""
    def key(value):
        return value if isinstance(value, str) else ("rule", id(value))
    # In the dict's order: the first pattern that matches a weight decides its rule (hybrid.make_plan), so
    # {"layers.*": "esd_rtrl", "layers.0.*": "d_rtrl"} and its reverse are other plans.
    return tuple((p, key(r)) for p, r in algo.items()) if isinstance(algo, Mapping) else key(algo)


def _compiled(model, xs, targets, step_loss, algo, decay, rank, trace_dtype, memory_budget=None,
              plan_batch=None, max_chunk=None) -> CompiledSequence:
    """The program for these inputs, from ``model`` if it is a :class:`Learner`, else
    from the learner kept for ``model`` and these options (compiled again when the
    model changed). ``max_chunk``: see ``Learner.compiled``."""
    learner = _learner(model, xs, targets, step_loss, algo, decay, rank, trace_dtype, memory_budget, plan_batch,
                       stacklevel=5)
    return learner.compiled(xs, targets, step_loss, max_chunk=max_chunk)


def _learner(model, xs, targets, step_loss, algo, decay, rank, trace_dtype, memory_budget=None,
             plan_batch=None, stacklevel=4) -> Learner:
    """``model`` if it is a :class:`Learner`, else the learner kept for ``model`` and
    these options (compiled again when the model changed), after checking the inputs;
    ``stacklevel``: of the approximation warnings, for the public caller's caller."""
    if isinstance(model, Learner):
        given = {name: value for name, value in (("algo", None if algo == "hybrid" else algo), ("decay", decay),
                                                 ("rank", rank), ("trace_dtype", trace_dtype),
                                                 ("memory_budget", memory_budget)) if value is not None}
        if given:
            raise ConfigError(f"{', '.join(f'{k}={v!r}' for k, v in given.items())} given with a compiled learner, "
                              f"whose options were fixed by ef.compile ({model.algo!r}); pass the model to compile "
                              f"it with these, or compile a learner with them")
    else:
        check_algo(algo)
    if not callable(step_loss) and not (step_loss is None and isinstance(model, Learner)):
        raise ConfigError(f"step_loss must be a callable (output_t, target_t) -> scalar, got {type(step_loss).__name__}")
    check_sequence(xs, targets, "sequence_grad")
    xs_leaves = jax.tree.leaves(xs)
    if isinstance(model, Learner):  # the inputs checked as for a model
        return model
    alpha, budget = resolve_decay(decay, rank), parse_bytes(memory_budget)
    key = (_algo_key(algo), alpha, str(trace_dtype), budget, plan_batch)
    learners = _LEARNERS.setdefault(model, {})
    learner = learners.get(key)
    if learner is not None and not learner.is_current():
        learners.clear()  # a layer attribute changed or the states were recreated
        learner = None
    if learner is None:
        _check_batch_axis(model, xs_leaves, online=sequence_algo(algo) is None)
        learner = learners[key] = compile(
            model, jax.tree.map(lambda x: x[0], xs), algo=algo, decay=alpha, trace_dtype=trace_dtype,
            memory_budget=budget, plan_batch=plan_batch, warn=False)
        warn_unread(learner.graph, stacklevel=stacklevel)
        if learner.plan is not None:
            warn_approximations(learner.plan, stacklevel=stacklevel)
    return learner


def _prepare(model, xs, targets, step_loss, algo, decay, rank, trace_dtype, memory_budget=None, plan_batch=None,
             max_chunk=None):
    """``(graph, plan, jitted run, program)``: :func:`_compiled` as a tuple (benchmarks use it)."""
    compiled = _compiled(model, xs, targets, step_loss, algo, decay, rank, trace_dtype, memory_budget, plan_batch,
                         max_chunk)
    return compiled.graph, compiled.plan, compiled.run, compiled.program


def plan_for(model, xs, targets, step_loss, algo="hybrid", decay=None, rank=None, trace_dtype=None,
             memory_budget=None):
    """The compiled graph and rule plan ``sequence_grad`` would use (``None`` plan for BPTT)."""
    compiled = _compiled(model, xs, targets, step_loss, algo, decay, rank, trace_dtype, memory_budget)
    return compiled.graph, compiled.plan


def compile_sequence(model, xs, targets, step_loss, algo="hybrid", decay=None, rank=None,
                     trace_dtype=None, memory_budget=None, plan_batch=None) -> CompiledSequence:
    """The compiled step, plan and pure program :func:`sequence_grad` would run
    (cached: the same shapes share one program). ``plan_batch``: the batch size the
    plan's memory budget is counted at (default: ``xs``'s), so that a caller whose
    batches differ in size (a last, smaller batch) keeps one plan."""
    return _compiled(model, xs, targets, step_loss, algo, decay, rank, trace_dtype, memory_budget, plan_batch)


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
        memory_budget: for ``"hybrid"``: trace memory *per sample* (bytes, or
            ``"16MiB"``) the plan may spend on D-RTRL, exact weights first, then the
            cheapest (None: ``hybrid.DEFAULT_BUDGET_PER_SAMPLE``, 4 MiB); the plan
            never depends on the batch size.

    Returns:
        ``(grads, losses)``: ``grads`` keyed exactly like
        ``model.states(brainstate.ParamState)``, each with its state's value structure;
        ``losses`` of shape ``(T,)``. The model's hidden states are left where the
        sequence ended; its weights are not changed.

    Example::

        grads, losses = sequence_grad(model, xs, ys, lambda out, y: ((out - y) ** 2).sum())
    """
    learner = _learner(model, xs, targets, step_loss, algo, decay, rank, trace_dtype, memory_budget)
    compiled = learner.compiled(xs, targets, step_loss)
    args = (compiled.weight_leaves(), compiled.state_leaves(), jax.tree.leaves(xs), targets)
    compiled, run = learner.under_line(compiled, xs, targets, step_loss, "grad", _run, args)
    grads_leaves, losses, final_leaves = run(*args)
    compiled.write_states(final_leaves)
    grads = compiled.per_state(grads_leaves)
    params = (model.model if isinstance(model, Learner) else model).states(brainstate.ParamState)
    # In the model's key order; a weight the step never reads gets zeros.
    return {path: grads[path] if path in grads else jax.tree.map(jnp.zeros_like, param.value)
            for path, param in params.items()}, losses


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
    if sequence_algo(algo) is not None:
        raise ConfigError(f"update_every needs an online rule ({', '.join(map(repr, ONLINE_ALGOS))}); BPTT must see the "
                          "whole sequence before it has a gradient")
    learner = _learner(model, xs, targets, step_loss, algo, decay, rank, trace_dtype, memory_budget)
    compiled = learner.compiled(xs, targets, step_loss)
    if compiled.plan is None:
        raise ConfigError("update_every needs an online rule; this learner was compiled with algo='bptt'")
    weights = compiled.weight_leaves()
    if not (callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None))):
        raise ConfigError(f"online_fit takes an optax optimizer (optax.adam(1e-3)), got {optimizer!r:.60} (the "
                          f"Trainer takes names)")
    if opt_state is None:
        opt_state = optimizer.init(weights)
    key = ("online_fit", optimizer, update_every)
    if update_every < jnp.shape(jax.tree.leaves(xs)[0])[0] and key not in compiled.updates:
        warn_readout_memory_under_updates(compiled.plan, f"update_every={update_every}", stacklevel=3)
        warn_weight_maps_under_updates(compiled.plan, f"update_every={update_every}", stacklevel=3)

    def make(compiled):
        if key not in compiled.updates:
            program = compiled.program
            frozen = frozen_weights(learner.model)  # a LoRA base: kept under weight decay too, as the Trainer does
            compiled.updates[key] = jax.jit(
                lambda w, s, x, y, o: program.run_with_updates(
                    w, s, x, y, optimizer, o, update_every, project=lambda leaves: compiled.project(leaves, w, frozen)),
                compiler_options=_compat.compiler_options())
        return compiled.updates[key]

    args = (weights, compiled.state_leaves(), jax.tree.leaves(xs), targets, opt_state)
    length = jnp.shape(jax.tree.leaves(xs)[0])[0]
    compiled, run = learner.under_line(compiled, xs, targets, step_loss, key, make, args,
                                       length=min(update_every, length))
    weights, opt_state, losses, final_leaves = run(*args)
    compiled.write_states(final_leaves)
    for path, value in compiled.per_state(weights).items():
        compiled.module.state(path).state.value = value
    return opt_state, losses

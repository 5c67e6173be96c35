"""The training step: one pure jitted function per compiled program that runs the rule's
scan over a batch, the loss and metrics on its outputs, and the optax update."""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import optax

from .. import _compat
from ..algorithms.online import _assemble
from ..compiler import format_path
from ..layers.base import Constrained
from .metrics import per_sample
from .state import Reset, TrainState

__all__ = ["StepResult", "build_train_step", "placed_metrics", "sequence_targets", "updated_rates"]


def placed_metrics(metric_fns: Mapping[str, Any], outputs: Any, ys: Any, weight: jax.Array) -> dict[str, jax.Array]:
    """Each metric placed in time like the loss, averaged over samples (traceable). Per
    sequence ``Σ_t w·m / Σ_t w``: the placement's weights sum to 1 per sequence up to
    rounding (``mask / count``: 5 steps of 0.2 each), and dividing by their own sum keeps
    a metric that is 1 at every placed step at exactly 1 (it read 1.0000015 over such
    masks); a sequence without placed steps counts 0, as before."""
    total = jnp.sum(weight, axis=0)
    safe = jnp.where(total > 0, total, jnp.ones_like(total))
    batch = weight.shape[1]

    def at_step(fn):  # (batch,) per step, whatever shape the metric returns (a scalar: the batch's value)
        return jax.vmap(lambda output, target: per_sample(fn(output, target), batch))

    return {name: jnp.mean(jnp.where(total > 0, jnp.sum(weight * at_step(fn)(outputs, ys), axis=0) / safe, 0.0))
            for name, fn in metric_fns.items()}


def sequence_targets(ys: Any, weight: jax.Array, regularizers: Sequence = (), rates: Sequence | None = None
                     ) -> tuple:
    """The targets the trainer's step loss reads: ``(ys, weight)``, and with regularisers
    ``(ys, weight, 1/T per step, per regulariser its rate inputs)`` — they act at every
    step, whatever ``loss_on``. A regulariser on running rates
    (``uses_rates``) gets ``{"rates": {path: r̂ (T, ...)}, "known": (T,)}`` from
    ``rates`` (its entry of :attr:`TrainState.rates`: the running sums and how many
    batches they hold; ``known`` is 0 before the first batch), others ``None``."""
    if not regularizers:
        return ys, weight
    length = weight.shape[0]
    per_step = jnp.full((length,), 1.0 / length, jnp.result_type(weight.dtype, jnp.float32))
    inputs = []
    for (reg, _), held in zip(regularizers, rates if rates is not None else [None] * len(regularizers)):
        if not reg.uses_rates:
            inputs.append(None)
            continue
        sums, count = held
        known = (count > 0).astype(per_step.dtype)
        # The bias-corrected running average (as Adam's moments): after one batch, its rate.
        correction = jnp.where(count > 0, 1.0 - reg.memory ** count, 1.0)
        estimate = {p: jnp.broadcast_to(v / correction, (length, *v.shape)) for p, v in sums.items()}
        inputs.append({"rates": estimate, "known": jnp.broadcast_to(known, (length,))})
    return ys, weight, per_step, inputs


def updated_rates(regularizers: Sequence, rates: Sequence, spikes: Mapping[str, jax.Array]) -> tuple[list, dict]:
    """The running rate sums after a batch whose spikes were ``{path: (T, B, ...)}``, and
    each regularised layer's mean rate in it (for the logs, ``rate_<path>``)."""
    measured = {p: jnp.mean(jax.lax.stop_gradient(z), axis=(0, 1)) for p, z in spikes.items()}
    new = []
    for (reg, paths), held in zip(regularizers, rates):
        if not reg.uses_rates:
            new.append(None)
            continue
        sums, count = held
        new.append(({p: reg.memory * sums[p] + (1.0 - reg.memory) * measured[p] for p in paths}, count + 1))
    return new, {f"rate_{p}": jnp.mean(r) for p, r in measured.items()}


class StepResult(NamedTuple):
    """What one training step reports besides the next :class:`TrainState` (device
    values; nothing waits for them): the batch's ``loss`` and ``metrics``, whether its
    update was applied (``finite``), the gradients by weight path (None with
    ``update_every``) and each traced weight's per-sample trace norms."""

    loss: jax.Array
    metrics: dict
    finite: jax.Array
    gradients: dict | None
    trace_norms: dict


def build_train_step(compiled: Any, optimizer: Any, metric_fns: Mapping[str, Any], loss_on: str,
                     update_every: int | None, regularizers: Sequence = (), reset: Reset | None = None,
                     placement: Any = None, axes: tuple | None = None, frozen: Mapping[str, set] | None = None):
    """The whole training step over one batch as one pure jitted function (built once
    per compiled program, i.e. per input shape):

    ``step(state, xs_leaves, ys, weight, metric_weight, fresh=None, start=True)
    -> (next TrainState, StepResult)``

    With ``start`` the batch begins new sequences: its hidden states start at their
    initial values — ``reset`` (the model's ``reset_all_states`` traced at this batch
    size) computes them inside the step, or ``fresh`` gives them (a reset that draws
    random numbers, done eagerly) — and its eligibility traces at zero; without it the
    batch continues the streams of ``state`` (its states and traces; stateful
    training). ``state.traces`` None: the step keeps no traces across batches.

    ``weight`` places and weights the loss, ``metric_weight`` places the metrics (None:
    ``weight`` does). Steps whose loss weight is zero for every sample skip the online
    rules' pull-back; an update whose loss or gradient is not finite is not applied
    (``finite`` says so). ``regularizers`` (``((regulariser, layer paths), ...)``): the
    program's step returns ``(output, spikes)`` and its loss has a regulariser at every
    step (no step is skipped; metrics read the output); the running rates in
    ``state.rates`` move on by the batch's, and the logs hold each layer's rate.

    ``placement`` (an :class:`etrace_fit.distributed.Placement`) with ``axes`` (the
    batch axis of each hidden-state leaf and of each trace leaf): the next state keeps
    the states and traces split over the mesh's batch axis and the rest replicated.

    ``frozen`` (``{weight path: {leaf}}``, :func:`etrace_fit.algorithms.learner.frozen_weights`): leaves no update
    moves, as Keras leaves a non-trainable weight alone (a ``LoRALinear``'s base: its
    gradient is zero, but an optimizer's weight decay would shrink it)."""
    regularized = bool(regularizers)
    program, module = compiled.program, compiled.module
    paths = {format_path(s.path): s.path for s in module.weights}
    pair_names = [format_path(p.relation.weight_path) for p in program.pairs]
    weights_at = list(module.weight_leaf_positions)
    others_at = [n for n in range(len(module.state_leaves())) if n not in set(weights_at)]
    every = update_every
    # Keras' constraints, after every update (a learned time constant kept positive)
    constraint_of = {format_path(s.path): s.state.constraint for s in module.weights
                     if isinstance(s.state, Constrained)}
    frozen = {name: leaves for name, leaves in (frozen or {}).items() if name in paths}
    projects = bool(constraint_of or frozen)  # (the update's leaves pass through the program's project)

    # With the loss at every step nothing is skipped: no per-step branch at all.
    skips = loss_on != "all" and compiled.plan is not None and not regularized
    # The loss at the last step only: the steps before the final chunk evaluate neither
    # the loss nor the outputs (a stateless readout drops out of them).
    last_only = skips and loss_on == "last" and update_every is None

    def collected_logs(losses, collected, ys, metric_weight):
        norms = {}
        for name, norm in zip(pair_names, collected.trace_norms):
            norms[name] = jnp.hypot(norms[name], norm) if name in norms else norm
        outputs = collected.outputs[0] if regularized else collected.outputs
        if last_only:  # the program collected the final chunk's outputs: the metrics read the last step
            outputs, ys, metric_weight = jax.tree.map(lambda a: a[-1:], (outputs, ys, metric_weight))
        return losses.sum(), placed_metrics(metric_fns, outputs, ys, metric_weight), norms

    def initial(state, weights, fresh, start, batch):
        """The state leaves (module order) and traces the batch starts from."""
        others = list(state.states)
        traces = state.traces
        if start:
            values = fresh if fresh is not None else reset.values(weights)
            for position, value in zip(reset.positions, values):
                others[position] = value
            traces = None if traces is None else program.init_traces(batch)
        return _assemble(weights_at, others_at, weights, others), traces

    def train_step(state, xs_leaves, ys, weight, metric_weight, fresh=None, start=True):
        values = state.weights
        weights = compiled.weight_leaves({path: values[name] for name, path in paths.items()})
        state_leaves, traces = initial(state, weights, fresh, start, weight.shape[1])
        options, targets = {}, sequence_targets(ys, weight, regularizers, state.rates)
        if skips:  # "last" is known statically: no per-step branch in the program
            options["active"] = "last" if loss_on == "last" else jnp.any(weight != 0, axis=1)
        if every is None:
            grad_leaves, losses, final, collected, *stream = program.run(
                weights, state_leaves, xs_leaves, targets, collect="final" if last_only else True, traces=traces,
                **options)
            read = {format_path(path): g for path, g in compiled.per_state(grad_leaves).items()}
            grads = {name: read[name] if name in read else jax.tree.map(jnp.zeros_like, value)
                     for name, value in values.items()}
            updates, new_opt_state = optimizer.update(grads, state.opt_state, values)
            new_values = optax.apply_updates(values, updates)
            if projects:  # (a weight the step never reads is no program leaf: it stays as the update left it)
                projected = compiled.project(compiled.weight_leaves({paths[n]: v for n, v in new_values.items()
                                                                     if n in paths}), weights, frozen)
                new_values = {**new_values,
                              **{format_path(path): v for path, v in compiled.per_state(projected).items()}}
        else:  # the optimizer runs inside the scan; its state is over the weight leaves
            weights, new_opt_state, losses, final, collected, *stream = program.run_with_updates(
                weights, state_leaves, xs_leaves, targets, optimizer, state.opt_state, every, collect=True,
                traces=traces, project=(lambda leaves, start=weights: compiled.project(leaves, start, frozen))
                if projects else None, **options)
            new_values = dict(values)
            new_values.update({format_path(path): v for path, v in compiled.per_state(weights).items()})
            grads = None
        metric_weight = weight if metric_weight is None else metric_weight
        loss, logs, norms = collected_logs(losses, collected, ys, metric_weight)
        rates = state.rates
        if regularized:
            rates, measured = updated_rates(regularizers, state.rates, collected.outputs[1])
            logs = {**logs, **measured}
        # An update is applied only when the loss, what it is made from, the new weights and the new optimizer
        # state are finite: an overflowing trace gives a NaN gradient under a finite loss, an optimizer's rate of
        # inf NaN weights, a gradient of 1e20 an Adam second moment of inf (every later update zero, silently).
        made_from = jax.tree.leaves(grads if grads is not None else new_values) + (
            jax.tree.leaves(new_values) if grads is not None else []) + [
            leaf for leaf in jax.tree.leaves(new_opt_state) if jnp.issubdtype(leaf.dtype, jnp.inexact)]
        finite = jnp.isfinite(loss) & jnp.all(jnp.stack([jnp.all(jnp.isfinite(g)) for g in made_from]))
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)  # noqa: E731
        new_values, new_opt_state = keep(new_values, values), keep(new_opt_state, state.opt_state)
        # Such a batch changes nothing: the states it moved (a stateful stream's hidden states and traces, a
        # BatchNorm's running statistics, the running rates) stay where it found them, so a stream goes on
        # from before it instead of carrying its non-finite values into every later batch.
        states = keep([final[n] for n in others_at], [state_leaves[n] for n in others_at])
        new_traces = (stream or [None])[0]
        if new_traces is not None and traces is not None:
            new_traces = keep(new_traces, traces)
        if regularized:
            rates = keep(rates, state.rates)
        next_state = TrainState(new_values, new_opt_state, states, new_traces, rates)
        if placement is not None:
            state_axes, trace_axes = axes
            next_state = TrainState(placement.constrain(next_state.weights, None),
                                    placement.constrain(next_state.opt_state, None),
                                    placement.constrain(next_state.states, state_axes),
                                    None if next_state.traces is None
                                    else placement.constrain(next_state.traces, trace_axes),
                                    placement.constrain(next_state.rates, None))
        return next_state, StepResult(loss, logs, finite, grads, norms)

    return jax.jit(train_step, static_argnames="start", compiler_options=_compat.compiler_options())

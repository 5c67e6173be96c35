"""BPTT (docs/theory.md §5.5): ``jax.grad`` of the summed loss over a ``lax.scan`` of the step;
and truncated BPTT with a window of ``k`` steps.

The reference the online rules are compared with, and the benchmark baseline. Memory
grows with the sequence length (every step's residuals are kept for the backward pass);
truncated BPTT keeps one window's (the gradient of each window's loss stops at the
window's start, where the states carry on). Both are *sequence-level* algorithms:
values with a ``name`` and ``build(graph, step_loss) -> OnlineProgram``, beside the
per-weight trace rules in the registry (``registry.py``).
"""

from __future__ import annotations

from typing import Any, Callable

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from jax import lax

from .. import _compat
from ..compiler import ETraceGraph
from ..errors import ConfigError
from .online import Collected, OnlineProgram, TraceState
from .base import scalar_loss

__all__ = ["BPTT", "TBPTT", "build_bptt"]


@dataclasses.dataclass(frozen=True)
class BPTT:
    """Backpropagation through time over the whole sequence (``algo="bptt"``)."""

    name: ClassVar[str] = "bptt"

    def build(self, graph: ETraceGraph, step_loss: Callable[[Any, Any], jax.Array]) -> OnlineProgram:
        return build_bptt(graph, step_loss)

    def __str__(self) -> str:
        return self.name


@dataclasses.dataclass(frozen=True)
class TBPTT:
    """Truncated BPTT with non-overlapping windows of ``window`` steps
    (``algo=TBPTT(50)`` or ``algo="tbptt:50"``): each window's loss is differentiated
    back to the window's start only; the hidden states carry across windows. Memory
    grows with ``window``, not with the sequence; ``TBPTT(k)`` with ``k ≥ T`` is BPTT.
    A baseline for the online rules (Williams and Peng 1990)."""

    window: int
    name: ClassVar[str] = "tbptt"

    def __post_init__(self):
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ConfigError(f"TBPTT: window must be a positive int (steps), got {self.window!r}")

    def build(self, graph: ETraceGraph, step_loss: Callable[[Any, Any], jax.Array]) -> OnlineProgram:
        return build_bptt(graph, step_loss, window=self.window)

    def __str__(self) -> str:
        return f"{self.name}:{self.window}"


def build_bptt(graph: ETraceGraph, step_loss: Callable[[Any, Any], jax.Array], window: int | None = None
               ) -> OnlineProgram:
    """A program with the online programs' signature that computes the exact gradient
    (``window``: truncated at every ``window`` steps)."""
    module = graph.module
    num_outputs = len(module.output_vars)
    weight_positions = module.weight_leaf_positions
    step_fn = _compat.jaxpr_as_fun(module.closed_jaxpr)

    weights_at = set(weight_positions)
    others_at = [p for p in range(len(module.state_leaves())) if p not in weights_at]

    def run(weight_leaves, state_leaves, xs_leaves, targets, collect=False, traces=None):
        """As the online programs' ``run``; with ``traces`` (a stream) the states carry
        across calls and the gradient is truncated at the call's start (truncated BPTT),
        the step count goes on."""
        result = _run(weight_leaves, state_leaves, xs_leaves, targets, collect)
        if traces is None:
            return result
        length = jax.tree.leaves(xs_leaves)[0].shape[0]
        return result + (TraceState([], jnp.asarray(traces.t, jnp.int32) + length),)

    def scan_steps(weights, others, inputs):
        """The step over ``inputs`` (leading axis: time) from ``others``: ``(final others,
        (losses, outputs))``."""
        def body(others, inputs_t):  # the weights are closed over, not carried (copied) every step
            input_leaves, target = inputs_t
            leaves = [None] * (len(weight_positions) + len(others_at))
            for n, position in enumerate(weight_positions):
                leaves[position] = weights[n]
            for position, value in zip(others_at, others):
                leaves[position] = value
            outs = step_fn(*input_leaves, *leaves)
            outputs = jax.tree.unflatten(module.output_treedef, outs[:num_outputs])
            return [outs[num_outputs + p] for p in others_at], (scalar_loss(step_loss, outputs, target), outputs)

        return lax.scan(body, others, inputs)

    def window_total(weights, others, inputs):
        others, (losses, outputs) = scan_steps(weights, others, inputs)
        return losses.sum(), (others, losses, outputs)

    def _run(weight_leaves, state_leaves, xs_leaves, targets, collect):
        weights, start = list(weight_leaves), [state_leaves[p] for p in others_at]
        inputs = (list(xs_leaves), targets)
        length = jax.tree.leaves(xs_leaves)[0].shape[0]
        grad = jax.grad(window_total, has_aux=True)  # w.r.t. the weights: the states' history is cut
        if window is None or window >= length:
            grads, (others, losses, outputs) = grad(weights, start, inputs)
        else:
            full, tail = divmod(length, window)

            def one_window(carry, window_inputs):
                others, total = carry
                g, (others, losses, outputs) = grad(weights, others, window_inputs)
                return (others, [a + b for a, b in zip(total, g)]), (losses, outputs)

            head = jax.tree.map(lambda v: v[:full * window].reshape(full, window, *v.shape[1:]), inputs)
            zeros = [jnp.zeros_like(w) for w in weights]
            (others, grads), (losses, outputs) = lax.scan(one_window, (start, zeros), head)
            losses, outputs = jax.tree.map(lambda v: v.reshape(full * window, *v.shape[2:]), (losses, outputs))
            if tail:
                rest = jax.tree.map(lambda v: v[full * window:], inputs)
                (others, grads), (tail_losses, tail_outputs) = one_window((others, grads), rest)
                losses, outputs = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), (losses, outputs),
                                               (tail_losses, tail_outputs))
        final = list(state_leaves)
        for position, value in zip(others_at, others):
            final[position] = value
        if collect:
            return grads, losses, final, Collected(jax.lax.stop_gradient(outputs), [])
        return grads, losses, final

    return OnlineProgram(run=run)

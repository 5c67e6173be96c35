"""BPTT (docs/theory.md §5.5): ``jax.grad`` of the summed loss over a ``lax.scan`` of the step.

The reference the online rules are compared with, and the benchmark baseline. Memory
grows with the sequence length (every step's residuals are kept for the backward pass).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax

from .. import _compat
from ..compiler import ETraceGraph
from .online import Collected, OnlineProgram, TraceState
from .base import scalar_loss

__all__ = ["build_bptt"]


def build_bptt(graph: ETraceGraph, step_loss: Callable[[Any, Any], jax.Array]) -> OnlineProgram:
    """A program with the online programs' signature that computes the exact gradient."""
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

    def _run(weight_leaves, state_leaves, xs_leaves, targets, collect):
        def total(weights):
            def body(others, inputs):  # the weights are closed over, not carried (copied) every step
                input_leaves, target = inputs
                leaves = [None] * len(state_leaves)
                for n, position in enumerate(weight_positions):
                    leaves[position] = weights[n]
                for position, value in zip(others_at, others):
                    leaves[position] = value
                outs = step_fn(*input_leaves, *leaves)
                outputs = jax.tree.unflatten(module.output_treedef, outs[:num_outputs])
                return [outs[num_outputs + p] for p in others_at], (scalar_loss(step_loss, outputs, target), outputs)

            others, (losses, outputs) = lax.scan(body, [state_leaves[p] for p in others_at],
                                                 (list(xs_leaves), targets))
            final = list(state_leaves)
            for position, value in zip(others_at, others):
                final[position] = value
            return losses.sum(), (losses, final, outputs)

        grads, (losses, final, outputs) = jax.grad(total, has_aux=True)(list(weight_leaves))
        if collect:
            return grads, losses, final, Collected(jax.lax.stop_gradient(outputs), [])
        return grads, losses, final

    return OnlineProgram(run=run)

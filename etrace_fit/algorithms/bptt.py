"""BPTT (DESIGN.md §5.5): ``jax.grad`` of the summed loss over a ``lax.scan`` of the step.

The reference the online rules are compared with, and the benchmark baseline. Memory
grows with the sequence length (every step's residuals are kept for the backward pass).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
from jax import lax

from .. import _compat
from ..compiler import ETraceGraph
from .online import Collected, OnlineProgram

__all__ = ["build_bptt"]


def build_bptt(graph: ETraceGraph, step_loss: Callable[[Any, Any], jax.Array]) -> OnlineProgram:
    """A program with the online programs' signature that computes the exact gradient."""
    module = graph.module
    num_outputs = len(module.output_vars)
    weight_positions = module.weight_leaf_positions
    step_fn = _compat.jaxpr_as_fun(module.closed_jaxpr)

    def run(weight_leaves, state_leaves, xs_leaves, targets, collect=False):
        def total(weights):
            def body(leaves, inputs):
                input_leaves, target = inputs
                leaves = list(leaves)
                for n, position in enumerate(weight_positions):
                    leaves[position] = weights[n]
                outs = step_fn(*input_leaves, *leaves)
                outputs = jax.tree.unflatten(module.output_treedef, outs[:num_outputs])
                return list(outs[num_outputs:]), (step_loss(outputs, target), outputs)

            final, (losses, outputs) = lax.scan(body, list(state_leaves), (list(xs_leaves), targets))
            return losses.sum(), (losses, final, outputs)

        grads, (losses, final, outputs) = jax.grad(total, has_aux=True)(list(weight_leaves))
        if collect:
            return grads, losses, final, Collected(jax.lax.stop_gradient(outputs), [])
        return grads, losses, final

    return OnlineProgram(run=run)

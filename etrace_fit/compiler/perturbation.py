"""Pass 4 — perturbation: the step with ``h^t = ĥ^t + p`` for every hidden state.

The rewritten step takes one extra input ``p`` per hidden state, added where the new
hidden value is produced, so everything in the step that uses ``h^t`` sees it. The
gradient of a step loss with respect to ``p`` at ``p = 0`` is the learning signal
``g^t = ∂L^t/∂h^t``. Read ``graph.py`` next.
"""

from __future__ import annotations

from typing import Any

import jax

from .. import _compat
from .module_info import ModuleInfo

__all__ = ["perturbed_step"]


def perturbed_step(module: ModuleInfo) -> Any:
    """The closed jaxpr ``(*input leaves, *state leaves, *perturbations) -> (*output
    leaves, *new state leaves)``, one perturbation per hidden state (in
    ``module.hidden`` order, each shaped like its state)."""
    closed = module.closed_jaxpr
    jaxpr = closed.jaxpr
    hidden = module.hidden
    invars = set(jaxpr.invars)
    # Perturb a hidden output where it is produced; one that is a literal or an unchanged
    # input is perturbed where it leaves the step instead (nothing inside uses it as h^t).
    at_production = {}
    at_output = {}
    for k, state in enumerate(hidden):
        var = state.out_vars[0]
        if isinstance(var, _compat.Literal) or var in invars:
            at_output[k] = var
        else:
            at_production[var] = k
    output_position = {}
    cursor = len(module.output_vars)
    for state in module.states:
        output_position[state.path] = cursor
        cursor += len(state.out_vars)

    def step(*args):
        num_args = len(jaxpr.invars)
        values, perturbations = list(args[:num_args]), args[num_args:]

        def on_write(var, value):
            k = at_production.get(var) if not isinstance(var, _compat.Literal) else None
            return value if k is None else value + perturbations[k]

        outs = _compat.interpret(jaxpr, list(closed.consts), values, on_write=on_write)
        for k in at_output:
            position = output_position[hidden[k].path]
            outs[position] = outs[position] + perturbations[k]
        return outs

    avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in jaxpr.invars]
    perturbation_avals = [jax.ShapeDtypeStruct(s.in_vars[0].aval.shape, s.in_vars[0].aval.dtype) for s in hidden]
    return jax.make_jaxpr(step)(*avals, *perturbation_avals)

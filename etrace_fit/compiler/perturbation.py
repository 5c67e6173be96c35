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


def hidden_outputs(module: ModuleInfo) -> tuple[dict[Any, int], dict[int, int]]:
    """Where each hidden state ``k`` (``module.hidden`` order) gets its new value:
    ``(at_production, at_output)``. ``at_production`` maps the variable that produces
    the new value to ``k``; ``at_output`` maps ``k`` to its position among the step's
    outputs when the new value is a literal or an unchanged input (nothing inside the
    step reads it as ``h^t``)."""
    invars = set(module.jaxpr.invars)
    output_position = {}
    cursor = len(module.output_vars)
    for state in module.states:
        output_position[state.path] = cursor
        cursor += len(state.out_vars)
    at_production, at_output = {}, {}
    for k, state in enumerate(module.hidden):
        var = state.out_vars[0]
        if isinstance(var, _compat.Literal) or var in invars:
            at_output[k] = output_position[state.path]
        else:
            at_production[var] = k
    return at_production, at_output


def perturbed_step(module: ModuleInfo) -> Any:
    """The closed jaxpr ``(*input leaves, *state leaves, *perturbations) -> (*output
    leaves, *new state leaves)``, one perturbation per hidden state (in
    ``module.hidden`` order, each shaped like its state)."""
    closed = module.closed_jaxpr
    jaxpr = closed.jaxpr
    hidden = module.hidden
    at_production, at_output = hidden_outputs(module)

    def step(*args):
        num_args = len(jaxpr.invars)
        values, perturbations = list(args[:num_args]), args[num_args:]

        def on_write(var, value):
            k = at_production.get(var) if not isinstance(var, _compat.Literal) else None
            return value if k is None else value + perturbations[k]

        outs = _compat.interpret(jaxpr, list(closed.consts), values, on_write=on_write)
        for k, position in at_output.items():
            outs[position] = outs[position] + perturbations[k]
        return outs

    avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in jaxpr.invars]
    perturbation_avals = [jax.ShapeDtypeStruct(s.in_vars[0].aval.shape, s.in_vars[0].aval.dtype) for s in hidden]
    return jax.make_jaxpr(step)(*avals, *perturbation_avals)

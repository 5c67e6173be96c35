"""Facts about single equations shared by the passes: boundaries and elementwise ops."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jax import lax

from .. import _compat
from ..ops import etp_op_info

__all__ = ["carries_derivative", "cut_step", "is_boundary", "is_elementwise", "is_etp", "memory_values", "reached"]

# Primitives that act on each unit on its own (broadcasting a per-unit value over the
# batch included), so a dependency through them stays within a unit.
_ELEMENTWISE = frozenset(
    """abs acos acosh add add_any and asin asinh atan atan2 atanh broadcast_in_dim cbrt ceil clamp
    convert_element_type copy copy_p cos cosh div eq erf erf_inv erfc exp exp2
    expm1 floor ge gt imag integer_pow is_finite le log log1p logistic lt max min mul ne neg
    nextafter not or pow real reduce_precision rem round rsqrt select_n sign sin sinh sqrt square
    stop_gradient sub tan tanh xor""".split()
)


def reached(jaxpr: Any, starts: Any, after: int = -1, differentiable: bool = False) -> set:
    """Every variable computed (through any equation after index ``after``) from
    ``starts``, the starts included; ``differentiable``: not through a
    ``stop_gradient`` (what a derivative can reach)."""
    found = set(starts)
    for index, eqn in enumerate(jaxpr.eqns):
        if differentiable and eqn.primitive.name == "stop_gradient":
            continue
        if index > after and any(not isinstance(v, _compat.Literal) and v in found for v in eqn.invars):
            found.update(eqn.outvars)
    return found


def memory_values(module: Any) -> set:
    """The new values of the hidden states that carry a derivative to a later step:
    a state whose previous value the step reads, with a derivative, into its output or
    into the new value of such a state. A spike kept for a detached reset (read under
    ``stop_gradient`` only) or for recording carries none: whatever reaches it acts on
    the loss within its step alone, so its one-step gradient is exact."""
    hidden = [s for s in module.hidden if not isinstance(s.out_vars[0], _compat.Literal)]
    reach = {id(s): reached(module.jaxpr, [s.in_vars[0]], differentiable=True) - {s.in_vars[0]} for s in hidden}
    wanted = {v for v in module.output_vars if not isinstance(v, _compat.Literal)}
    carrying: list = []
    while True:
        more = [s for s in hidden if s not in carrying and reach[id(s)] & wanted]
        if not more:
            return {s.out_vars[0] for s in carrying}
        carrying += more
        wanted |= {s.out_vars[0] for s in more}


def carries_derivative(var: Any) -> bool:
    """Whether a derivative can flow through ``var``: a float, not an int or a bool (a
    comparison's result, a cond's branch index)."""
    return jnp.issubdtype(var.aval.dtype, jnp.inexact)


def is_etp(eqn: Any) -> bool:
    return etp_op_info(eqn.primitive) is not None


def is_boundary(eqn: Any) -> bool:
    """A trainable dense or conv ETP op: the compiler never looks through it."""
    info = etp_op_info(eqn.primitive)
    return info is not None and not info.transparent


def is_elementwise(eqn: Any, rules: bool = True) -> bool:
    """Whether ``eqn`` acts on each unit on its own (a custom_jvp function and its JVP rule, a custom_vjp function,
    a nested jit, a cond / while / fori_loop / checkpoint: if everything inside it does,
    :func:`_compat.per_unit_bodies`)."""
    info = etp_op_info(eqn.primitive)
    if info is not None:
        return info.transparent
    if eqn.primitive.name == "custom_jvp_call":  # its function and its JVP rule (which may mix what it does not)
        if not all(is_elementwise(inner, rules) for inner in eqn.params["call_jaxpr"].jaxpr.eqns):
            return False
        # The rule's own custom_jvp calls (a spike's rule calls the spike for its primal) are taken by their
        # function: a first derivative is all the rules take, and their rules' rules would never end.
        rule = _compat.custom_jvp_rule_jaxpr(eqn) if rules else None
        return rule is None or all(is_elementwise(inner, rules=False) for inner in rule.eqns)
    if _compat.is_custom_vjp_call(eqn):  # its forward pass; its bwd is checked by module_info
        return all(is_elementwise(inner, rules) for inner in _compat.custom_vjp_jaxpr(eqn).jaxpr.eqns)
    if _compat.is_nested_jit(eqn):
        return all(is_elementwise(inner, rules) for inner in _compat.nested_jit_jaxpr(eqn).jaxpr.eqns)
    bodies = _compat.per_unit_bodies(eqn)  # cond, while, fori_loop, checkpoint: sub-steps of a neuron
    if bodies is not None:
        return all(is_elementwise(inner, rules) for body in bodies for inner in body.eqns)
    return eqn.primitive.name in _ELEMENTWISE


def cut_step(module: Any, state_leaves: list[Any], input_leaves: list[Any], *, replace: dict[int, Any] | None = None,
             inputs_of: dict[int, Any] | None = None, outputs: list[int] | None = None) -> list[Any]:
    """Evaluate the step with every boundary op's output held constant for
    differentiation (``stop_gradient``); ``replace`` maps an equation index to the
    value its output takes instead (the ``y`` of a relation). Returns all outputs;
    ``inputs_of``'s keys (equation indices) are filled with those equations' inputs.
    ``outputs``: the positions of the outputs needed (default: all); only what they and
    ``inputs_of`` read runs (a replaced equation's inputs are not computed), and the
    other outputs are ``None``: a forward-mode pass through one state's transition then
    traces that transition, not the whole step again."""
    replace = replace or {}

    def override(index, eqn, invals):
        if inputs_of is not None and index in inputs_of:
            inputs_of[index] = list(invals)
        if index in replace:
            return [replace[index]]
        if is_boundary(eqn):
            return [lax.stop_gradient(value) for value in _compat.eval_equation(eqn, invals)]
        return None

    closed = module.closed_jaxpr
    jaxpr, wanted = closed.jaxpr, None
    if outputs is not None:
        wanted = [jaxpr.outvars[n] for n in outputs]
        for index in inputs_of or ():  # it runs, on its computed inputs
            wanted += [*jaxpr.eqns[index].invars, *jaxpr.eqns[index].outvars]
    return _compat.interpret(jaxpr, list(closed.consts), [*input_leaves, *state_leaves], override=override,
                             wanted=wanted, given=set(replace) - set(inputs_of or ()))

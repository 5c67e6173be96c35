"""``TrainState``: everything training changes, as one value, and how it meets the model.

The Trainer's jitted step maps a :class:`TrainState` to the next one; nothing is
written into the ``brainstate`` model per batch. :class:`ModelSync` moves values between
the two only when someone may look: the model is brought up to date lazily
(:meth:`ModelSync.push`) and read back when it may have been changed from outside
(:meth:`ModelSync.pull`, which keeps a weight unless the model holds another object).
:func:`traced_reset` turns the model's ``reset_all_states`` into a pure function, so a
batch's hidden states start at their initial values inside the step.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import brainstate
import jax
import jax.numpy as jnp

from .. import _compat
from ..algorithms.learner import _states_at
from ..compiler import format_path
from ..errors import ConfigError
from ..layers.base import filled

__all__ = ["ModelSync", "Reset", "TrainState", "traced_reset"]


class TrainState(NamedTuple):
    """What training changes, as one pytree:

    - ``weights``: every ParamState's value, keyed by path (``"layers.0.weight"``);
    - ``opt_state``: the optimizer's state (over ``weights``, or over the program's
      weight leaves with ``update_every``);
    - ``states``: the model's other state leaves (hidden states) where the last batch
      ended, in the compiled module's order without the weights;
    - ``traces``: a stateful trainer's eligibility traces (a ``TraceState``) carried to
      the next batch of the same streams; ``None`` when the next batch starts afresh;
    - ``rates``: per regulariser on running rates, ``({path: running sum of the
      layer's per-neuron rate}, batches seen)``; ``None`` for the others (see
      :mod:`etrace_fit.training.spiking`).
    """

    weights: dict
    opt_state: Any
    states: list | None
    traces: Any
    rates: Any = None


class Reset(NamedTuple):
    """The model's ``reset_all_states`` at one batch size as a pure function:
    ``values(weight_leaves) -> leaves`` for the ``positions`` (indices into
    :attr:`TrainState.states`) it resets. ``values`` is None when the reset reads
    something other than the weights (a random draw, the previous state): then the
    Trainer resets eagerly, every batch, as the model's code says."""

    positions: tuple[int, ...]
    values: Callable[[list], list] | None
    #: Zeros shaped like the reset values: what the step is handed at those positions
    #: when it resets them anyway (one input signature whatever the last batch was).
    placeholders: tuple = ()


def _other_positions(module: Any) -> list[int]:
    weights_at = set(module.weight_leaf_positions)
    return [n for n in range(len(module.state_leaves())) if n not in weights_at]


def check_hidden_states_reset(model: Any, batch_size: int) -> None:
    """:class:`~etrace_fit.ConfigError` naming each hidden state ``reset_all_states`` does
    not write (a layer of yours whose ``init_state`` creates it but which defines no
    ``reset_state``): it would carry from one batch, and one ``predict`` call, into the
    next, silently."""
    def reset():
        brainstate.nn.reset_all_states(model, batch_size=batch_size)

    with _states_at(model, batch_size):
        function = brainstate.transform.StatefulFunction(reset, return_only_write=False)
        function.make_jaxpr()
        written = {id(state) for state in function.get_write_states_by_cache(function.get_arg_cache_key())}
    kept = [(path, state) for path, state in model.states(brainstate.HiddenState).items() if id(state) not in written]
    if not kept:
        return
    nodes = dict(model.nodes().items())
    named = []
    for path, _ in kept:
        owner = nodes.get(tuple(path[:-1]))
        named.append(f"{format_path(path)} ({type(owner).__name__ if owner is not None else '?'})")
    raise ConfigError(f"hidden state {', '.join(named)} is not reset by reset_state, so it would carry from one batch "
                      f"(and one predict call) into the next; define reset_state(self, batch_size=None, **kwargs) "
                      f"setting it as init_state does (a layers.Neuron subclass has one), or make it a "
                      f"brainstate.LongTermState if it is meant to last")


def traced_reset(model: Any, module: Any, batch_size: int) -> Reset:
    """Trace ``brainstate.nn.reset_all_states(model, batch_size)`` once: which of the
    module's non-weight leaves it writes and, when it reads nothing but the weights,
    a pure function giving their initial values (the model is left as it was)."""
    def reset():
        brainstate.nn.reset_all_states(model, batch_size=batch_size)

    with _states_at(model, batch_size):  # traced at the batch's shapes
        function = brainstate.transform.StatefulFunction(reset, return_only_write=False)
        function.make_jaxpr()
        key = function.get_arg_cache_key()
        closed = function.get_jaxpr_by_cache(key)
        traced = function.get_states_by_cache(key)
        written = {id(state) for state in function.get_write_states_by_cache(key)}
        _, new_shapes = function.get_out_shapes_by_cache(key)
    # Where each traced state's leaves sit: among the weights or among the others.
    weight_at, other_at, cursor = {}, {}, 0
    weights = {id(info.state): info for info in module.weights}
    for info in module.states:
        count = len(info.in_vars)
        if id(info.state) not in weights:
            other_at[id(info.state)] = cursor
            cursor += count
    cursor = 0
    for info in module.weights:
        weight_at[id(info.state)] = cursor
        cursor += len(info.in_vars)
    positions, outputs, inputs, shapes = [], [], [], []  # inputs: per jaxpr input, ("weight", n) or None (unused)
    used = _compat.used_inputs(closed)
    leaf = 0
    deterministic = True
    for state, new_shape in zip(traced, new_shapes):
        count = len(jax.tree.leaves(state.value))
        new_leaves = jax.tree.leaves(new_shape)
        for n in range(count):
            if used[leaf + n]:
                if id(state) in weight_at:
                    inputs.append(("weight", weight_at[id(state)] + n))
                else:  # it reads a previous state or a random key
                    deterministic = False
                    inputs.append(None)
            else:
                inputs.append(None)
            if id(state) in written:
                if id(state) in other_at:
                    positions.append(other_at[id(state)] + n)
                    outputs.append(leaf + n)
                    shapes.append(new_leaves[n])
                elif id(state) not in weight_at:  # writes state outside the module: a random key
                    deterministic = False
        leaf += count
    placeholders = tuple(filled(0, s.shape, s.dtype) for s in shapes)  # no program compiled
    if not deterministic:
        return Reset(tuple(positions), None, placeholders)
    avals = [v.aval for v in closed.jaxpr.invars]
    function = _compat.jaxpr_as_fun(closed)

    def values(weight_leaves: list) -> list:
        args = [weight_leaves[source[1]] if source is not None else jnp.zeros(a.shape, a.dtype)
                for source, a in zip(inputs, avals)]
        new = function(*args)
        return [new[n] for n in outputs]

    return Reset(tuple(positions), values, placeholders)


def eager_reset(model: Any, module: Any, reset: Reset, batch_size: int) -> list:
    """The reset positions' initial values now, from the model's own code (a reset that
    draws random numbers draws anew)."""
    others = _other_positions(module)
    with _states_at(model, batch_size, keep_key=False):  # the draw is the point: it moves the key on
        leaves = module.state_leaves()
    return [leaves[others[n]] for n in reset.positions]


class ModelSync:
    """Keeps a :class:`TrainState` and the model's states in step, lazily.

    ``synced`` maps each weight path to the object the model's ParamState held when the
    two last agreed: a ParamState holding another object was set from outside
    (``set_weights``, a callback), and :meth:`pull` takes it.
    """

    def __init__(self, model: Any):
        self.model = model
        self.params: dict = {}  # path name -> ParamState (refreshed by refresh())
        self.synced: dict = {}
        self.pending = False  # the TrainState is ahead of the model
        self.module = None  # the compiled module the TrainState's states follow

    def refresh(self) -> None:
        """Look the model's ParamStates up again (states may have been recreated)."""
        self.params = {format_path(path): state for path, state in self.model.states(brainstate.ParamState).items()}

    def pull(self, state: TrainState | None, module: Any | None) -> TrainState:
        """``state`` with what the model holds now (after :meth:`push`): weights set
        from outside since the last sync, and (given the compiled ``module``) the
        model's other state leaves."""
        self.push(state)
        if not self.params:
            self.refresh()
        weights = dict(state.weights) if state is not None and state.weights is not None else {}
        for name, param in self.params.items():
            value = param.value
            if name not in weights or value is not self.synced.get(name):
                weights[name] = value
            self.synced[name] = value
        states = None if state is None else state.states
        if module is not None:
            leaves = module.state_leaves()
            states = [leaves[n] for n in _other_positions(module)]
            self.module = module
        if state is None:
            return TrainState(weights, None, states, None)
        return state._replace(weights=weights, states=states)

    def push(self, state: TrainState | None) -> None:
        """Write ``state``'s weights and the states its last batch ended in into the
        model, if it is ahead of it."""
        if not self.pending or state is None:
            return
        for name, param in self.params.items():
            value = state.weights[name]
            if param.value is not value:
                param.value = value
            self.synced[name] = value
        if self.module is not None and state.states is not None:
            others = iter(state.states)
            weights_at = set(self.module.weight_leaf_positions)
            cursor = 0
            for info in self.module.states:
                count = len(info.in_vars)
                values = [None if cursor + n in weights_at else next(others) for n in range(count)]
                if info.kind != "weight" and info.written:
                    info.state.value = jax.tree.unflatten(jax.tree.structure(info.state.value), values)
                cursor += count
        self.pending = False


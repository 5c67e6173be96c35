"""Pass 1 — module info: trace one step of a model and map jaxpr variables to states.

``module_info(model, *example_inputs)`` returns a :class:`ModuleInfo`: the step as a
flat closed jaxpr (nested ``jit`` calls inlined) whose inputs are the example inputs'
leaves followed by every state's leaves and whose outputs are the step's output leaves
followed by every state's new leaves, plus which states are weights, hidden states or
other. Read ``hidden_groups.py`` next.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import brainstate
import jax
import jax.numpy as jnp
import saiunit as u

from .. import _compat
from ..errors import CompilationError
from ..ops import is_etp_primitive
from ._dataflow import carries_derivative, is_elementwise, reached
from .diagnostics import Diagnostic, DiagnosticKind, Level, format_path

__all__ = ["ModuleInfo", "StateInfo", "module_info"]

WEIGHT, HIDDEN, OTHER = "weight", "hidden", "other"


@dataclasses.dataclass(frozen=True)
class StateInfo:
    """One state of the model as the step's jaxpr sees it.

    Attributes:
        path: the path brainstate gives (``model.states()`` key).
        kind: ``"weight"`` (ParamState), ``"hidden"`` (floating-point HiddenState
            written by the step) or ``"other"`` (an integer or boolean HiddenState,
            such as a refractory counter, is carried but has no trace).
        leaf_names: a name per pytree leaf of the value (``("bias", "weight")`` for a
            ``{"weight", "bias"}`` dict, ``("",)`` for an array).
        in_vars: the jaxpr input variables of the leaves.
        out_vars: the jaxpr output variables (or literals) of the new leaves.
        written: whether the step writes the state.
        unit: the saiunit unit of the value (unitless for plain arrays).
    """

    path: tuple
    kind: str
    leaf_names: tuple[str, ...]
    in_vars: tuple[Any, ...]
    out_vars: tuple[Any, ...]
    written: bool
    unit: Any
    state: Any = dataclasses.field(compare=False, repr=False)

    @property
    def name(self) -> str:
        return format_path(self.path)


@dataclasses.dataclass(frozen=True)
class ModuleInfo:
    """The traced step and its state map (see the module docstring for the layout)."""

    closed_jaxpr: Any
    input_vars: tuple[Any, ...]
    input_treedef: Any
    output_vars: tuple[Any, ...]
    output_treedef: Any
    states: tuple[StateInfo, ...]
    diagnostics: tuple[Diagnostic, ...]

    @property
    def jaxpr(self):
        return self.closed_jaxpr.jaxpr

    @property
    def weights(self) -> tuple[StateInfo, ...]:
        return tuple(s for s in self.states if s.kind == WEIGHT)

    @property
    def hidden(self) -> tuple[StateInfo, ...]:
        return tuple(s for s in self.states if s.kind == HIDDEN)

    @property
    def others(self) -> tuple[StateInfo, ...]:
        return tuple(s for s in self.states if s.kind == OTHER)

    def state(self, path: tuple) -> StateInfo:
        for info in self.states:
            if info.path == path:
                return info
        raise KeyError(f"no state at path {format_path(path)}; known: {', '.join(s.name for s in self.states)}")

    @property
    def leaf_offsets(self) -> dict[tuple, int]:
        """Position of each state's first leaf among all state leaves (the order of
        :meth:`state_leaves`, of the step's state inputs and of its new-state outputs)."""
        offsets, cursor = {}, 0
        for info in self.states:
            offsets[info.path] = cursor
            cursor += len(info.in_vars)
        return offsets

    @property
    def weight_leaf_positions(self) -> list[int]:
        """Positions of the weights' leaves among all state leaves, in ``weights`` order."""
        offsets = self.leaf_offsets
        return [offsets[w.path] + n for w in self.weights for n in range(len(w.in_vars))]

    def state_leaves(self) -> list[Any]:
        """The current values of all states' leaves, in the jaxpr's input order."""
        return [leaf for info in self.states for leaf in jax.tree.leaves(info.state.value)]

    def evaluate(self, state_leaves: Sequence[Any], *inputs: Any) -> tuple[Any, list[Any]]:
        """Run the step on explicit values: ``(outputs pytree, new state leaves)``."""
        input_leaves = jax.tree.leaves(inputs)
        outs = _compat.jaxpr_as_fun(self.closed_jaxpr)(*input_leaves, *state_leaves)
        num_outputs = len(self.output_vars)
        return jax.tree.unflatten(self.output_treedef, outs[:num_outputs]), list(outs[num_outputs:])


def _leaf_names(value: Any) -> tuple[str, ...]:
    """A name per leaf: ``""`` for a single array (or quantity), key paths otherwise."""
    if len(jax.tree.leaves(value)) == 1:
        return ("",)
    paths = jax.tree_util.tree_flatten_with_path(value)[0]
    names = tuple("/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in keypath) for keypath, _ in paths)
    return names or ("",)


def _inline_nested_jit(closed: Any, online: bool = True) -> tuple[Any, list[str]]:
    """The same computation with nested ``jit`` calls inlined, and (``online``) each
    ``custom_vjp`` function (a surrogate spike written as PyTorch users write theirs)
    made one that forward mode goes through (:func:`_compat.custom_vjp_as_jvp`); names
    of the ETP primitives that were inside nested jits."""
    inlined: list[str] = []

    def visit(jaxpr, consts, args):
        def override(index, eqn, invals):
            if online and _compat.is_custom_vjp_call(eqn):
                _check_custom_vjp(eqn, invals)
                return _compat.custom_vjp_as_jvp(eqn, invals)
            if not _compat.is_nested_jit(eqn):
                return None
            inner = _compat.nested_jit_jaxpr(eqn)
            inlined.extend(e.primitive.name for e in inner.jaxpr.eqns if is_etp_primitive(e.primitive))
            return visit(inner.jaxpr, list(inner.consts), invals)

        return _compat.interpret(jaxpr, consts, args, override=override)

    def rewritten(eqn):
        return (online and _compat.is_custom_vjp_call(eqn)) or (_compat.is_nested_jit(eqn) and any(
            map(rewritten, _compat.nested_jit_jaxpr(eqn).jaxpr.eqns)))

    if not any(_compat.is_nested_jit(eqn) or rewritten(eqn) for eqn in closed.jaxpr.eqns):
        return closed, []
    avals = [var.aval for var in closed.jaxpr.invars]
    flat = jax.make_jaxpr(lambda *args: visit(closed.jaxpr, list(closed.consts), list(args)))(
        *[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]
    )
    return flat, inlined


def _check_custom_vjp(eqn: Any, invals: list) -> None:
    """A ``CompilationError`` unless the ``custom_vjp`` call ``eqn`` is elementwise —
    its forward pass and its backward pass, over float inputs of its outputs' shape —
    which is when its VJP gives its forward-mode derivative exactly."""
    name = _compat.custom_vjp_name(eqn)
    outs = [v.aval for v in eqn.outvars]
    # a constant input (snnTorch's ATan.apply(mem, alpha) with a number for alpha) has no derivative
    varying = [i for i, v in enumerate(invals) if _compat.is_tracer(v) and jnp.issubdtype(jnp.result_type(v),
                                                                                           jnp.inexact)]
    floats = [invals[i] for i in varying]
    problem = None
    if not all(jnp.issubdtype(a.dtype, jnp.inexact) and a.shape == outs[0].shape for a in outs):
        shapes = ", ".join(f"{a.dtype}{list(a.shape)}" for a in outs)
        problem = f"its outputs are {shapes}, not float arrays of one shape"
    elif any(jnp.shape(v) != outs[0].shape for v in floats):
        shapes = ", ".join(str(list(jnp.shape(v))) for v in floats)
        problem = (f"its float inputs have shapes {shapes} and its output {list(outs[0].shape)}: a broadcast "
                   f"input's derivative is summed in its VJP")
    elif not all(is_elementwise(e) for e in _compat.custom_vjp_jaxpr(eqn).jaxpr.eqns):
        problem = "its forward pass mixes entries (it is not elementwise)"
    else:
        def pullback_of_ones(*args):
            def at(*moved):
                values = list(args)
                for i, value in zip(varying, moved):
                    values[i] = value
                return _compat.eval_equation(eqn, values)
            return jax.vjp(at, *[args[i] for i in varying])[1]([jnp.ones(a.shape, a.dtype) for a in outs])

        backward = jax.make_jaxpr(pullback_of_ones)(*invals)
        if not all(is_elementwise(e) for e in backward.jaxpr.eqns):
            problem = "its bwd mixes entries (it is not elementwise)"
    if problem:
        raise CompilationError(
            f"the step calls the jax.custom_vjp function {name}, and {problem}. The online rules need forward-mode "
            f"derivatives, which JAX does not give for a custom_vjp function; an elementwise one (a surrogate spike "
            f"of the membrane) is taken as is. Write this one with jax.custom_jvp, or use an ef.layers.Surrogate "
            f"(docs/neurons.md); algo='bptt' takes it as written")


def module_info(model: Any, *example_inputs: Any, step_fn: Any = None, online: bool = True) -> ModuleInfo:
    """Trace one step ``model(*example_inputs)`` and map its jaxpr to the model's states.

    ``step_fn``: the function traced instead of ``model`` (it calls the model and may
    return more outputs, e.g. a layer's spikes for a loss on them); the states are
    still named by their path in ``model``. ``online=False`` (for BPTT, which carries
    every state and differentiates in reverse mode): ``custom_vjp`` functions are kept
    as written and memory in a plain ``State`` is allowed.

    Raises:
        CompilationError: the step writes a ``ParamState``, a hidden state's unit,
            shape or dtype changes across the step, or states are not initialised.
        ShapeError: raised by a layer for a bad example input (names the layer).
    """
    paths = {id(state): path for path, state in model.states().items()}
    function = brainstate.transform.StatefulFunction(model if step_fn is None else step_fn, return_only_write=False)
    hidden_before = {path: state.value for path, state in model.states(brainstate.HiddenState).items()}
    try:
        with brainstate.environ.context(fit=True):  # the training step: dropout on (layers.dropout.training)
            function.make_jaxpr(*example_inputs)
    except ValueError as error:
        _raise_if_state_structure_changed(model, hidden_before, error)
        raise
    except AttributeError as error:
        if not model.states(brainstate.HiddenState):
            raise CompilationError(
                f"{type(model).__name__} has no initialised hidden states ({error}); call "
                f"brainstate.nn.init_all_states(model, batch_size=B) before compiling"
            ) from error
        raise
    key = function.get_arg_cache_key(*example_inputs)
    raw = function.get_jaxpr_by_cache(key)
    traced_states = function.get_states_by_cache(key)
    written = {id(state) for state in function.get_write_states_by_cache(key)}
    out_shapes, new_state_shapes = function.get_out_shapes_by_cache(key)

    closed, inlined = _inline_nested_jit(raw, online)
    jaxpr = closed.jaxpr
    num_inputs = len(jax.tree.leaves(example_inputs))
    num_outputs = len(jax.tree.leaves(out_shapes))
    input_vars = tuple(jaxpr.invars[:num_inputs])
    output_vars = tuple(jaxpr.outvars[:num_outputs])

    diagnostics: list[Diagnostic] = [
        Diagnostic(DiagnosticKind.IN_NESTED_JIT, f"{name} inside a nested jit was inlined", primitive=name)
        for name in inlined
    ]
    states: list[StateInfo] = []
    in_cursor, out_cursor, slices = num_inputs, num_outputs, []
    for state in traced_states:  # each state's variables in the jaxpr: its value read, its value written
        num_leaves = len(jax.tree.leaves(state.value))
        slices.append((tuple(jaxpr.invars[in_cursor: in_cursor + num_leaves]),
                       tuple(jaxpr.outvars[out_cursor: out_cursor + num_leaves])))
        in_cursor, out_cursor = in_cursor + num_leaves, out_cursor + num_leaves
    # what the loss sees, now or later: the outputs and the hidden states written (a long-term state read
    # into one of these is memory with a gradient; read only into itself it is a running statistic)
    consequences = {v for v in output_vars if not isinstance(v, _compat.Literal)} | {
        v for state, (_, outs) in zip(traced_states, slices)
        if isinstance(state, brainstate.HiddenState) and id(state) in written
        for v in outs if not isinstance(v, _compat.Literal)}
    for number, (state, new_shape) in enumerate(zip(traced_states, new_state_shapes)):
        path = paths.get(id(state), ("<external>", number))
        in_vars, out_vars = slices[number]
        is_written = id(state) in written
        if isinstance(state, brainstate.ParamState):
            kind = WEIGHT
            if is_written:
                raise CompilationError(
                    f"ParamState {format_path(path)} is written inside the step; weights may only be "
                    f"read by the model's update (keep learned values in ParamState and carried "
                    f"values in HiddenState)"
                )
        elif isinstance(state, brainstate.HiddenState) and is_written:
            _check_hidden_consistent(path, state.value, new_shape)
            kind = HIDDEN if all(jnp.issubdtype(v.aval.dtype, jnp.inexact) for v in in_vars) else OTHER
            if kind == OTHER:
                dtypes = ", ".join(sorted({str(v.aval.dtype) for v in in_vars}))
                diagnostics.append(Diagnostic(
                    DiagnosticKind.CARRIED_WITHOUT_TRACE,
                    f"HiddenState {format_path(path)} holds {dtypes} values: it is carried from step to step "
                    f"like any state, but has no gradient, so no trace follows it",
                    hidden_paths=(path,),
                ))
        else:
            kind = OTHER
            if online and is_written and isinstance(state, brainstate.LongTermState) and _plain_memory(
                    state, in_vars, out_vars, jaxpr, consequences):
                raise CompilationError(
                    f"LongTermState {format_path(path)} is memory with a gradient: the step writes it from its "
                    f"previous value and from values with a gradient (the inputs, a weight, a hidden state), and "
                    f"its value reaches the output or a hidden state. The online rules follow hidden states only, "
                    f"so the gradient through its memory would be dropped, silently. Declare it as "
                    f"brainstate.HiddenState (ef.layers.Neuron's self.hidden(...)), or write it under "
                    f"jax.lax.stop_gradient if it should carry none; algo='bptt' takes it as it is"
                )
            if online and is_written and _plain_memory(state, in_vars, out_vars, jaxpr):
                raise CompilationError(
                    f"{type(state).__name__} {format_path(path)} is carried from step to step (the step writes it "
                    f"from its previous value), but it is not a brainstate.HiddenState: the online rules follow "
                    f"hidden states only, so its memory would get no gradient through time, silently. Declare it "
                    f"as brainstate.HiddenState (memory within a sequence, reset by reset_state; "
                    f"ef.layers.Neuron's self.hidden(...) does this), or as brainstate.LongTermState if it is "
                    f"carried across batches without a gradient (running statistics, or a value written under "
                    f"jax.lax.stop_gradient); algo='bptt' takes it as it is"
                )
            if isinstance(state, brainstate.HiddenState):
                diagnostics.append(Diagnostic(
                    DiagnosticKind.STATE_MISMATCH,
                    f"HiddenState {format_path(path)} is read but never written by the step; it is "
                    f"treated as a constant, not as memory",
                    level=Level.WARNING,
                    hidden_paths=(path,),
                ))
        states.append(StateInfo(
            path=path, kind=kind, leaf_names=_leaf_names(state.value), in_vars=in_vars, out_vars=out_vars,
            written=is_written, unit=u.get_unit(state.value), state=state,
        ))

    read = {id(state) for state in traced_states}
    for path, state in model.states(brainstate.ParamState).items():
        if id(state) not in read:  # what the step never reads no algo can train: said, as Keras does
            diagnostics.append(Diagnostic(DiagnosticKind.NOT_READ, (
                f"{format_path(path)} is a ParamState that the model's step never reads: it gets no gradient under "
                f"any algo (BPTT too) and keeps its value. An initial state learned through reset_state / "
                f"init_state is not trained: every sequence starts from the states as reset, outside the step "
                f"that is differentiated. Hold a value that should not learn in a brainstate.State"),
                weight_path=path))
    if online and not any(s.kind == HIDDEN for s in states):
        raise CompilationError(
            f"{type(model).__name__} has no hidden state that its step writes: there is nothing to "
            f"learn online. Online rules need recurrent or spiking layers (brainstate.HiddenState); "
            f"for a stateless model use plain jax.grad"
        )
    if not online and not any(s.written for s in states):  # BPTT takes memory in any state the step writes
        raise CompilationError(
            f"{type(model).__name__} writes no state in its step: nothing is carried from step to step, so "
            f"there is no time to backpropagate through; for a stateless model use plain jax.grad"
        )
    output_treedef = jax.tree.structure(out_shapes)
    input_treedef = jax.tree.structure(example_inputs)
    return ModuleInfo(
        closed_jaxpr=closed, input_vars=input_vars, input_treedef=input_treedef, output_vars=output_vars,
        output_treedef=output_treedef, states=tuple(states), diagnostics=tuple(diagnostics),
    )


def _plain_memory(state: Any, in_vars: Sequence, out_vars: Sequence, jaxpr: Any, consequences: set | None = None
                  ) -> bool:
    """Whether ``state`` (written by the step, neither a hidden state nor a weight) is
    memory the online rules would miss: a floating-point ``brainstate.State`` or
    ``ShortTermState`` (not a random key) whose new value depends on its previous one and
    on something with a gradient (the inputs, a weight, another state), not through a
    ``stop_gradient``. A step counter depends on itself alone and is no such memory. A ``LongTermState`` is one only when
    ``consequences`` is given and its previous value reaches one of them (the outputs,
    the hidden states written): running statistics are written from themselves and the
    batch but read by nothing the loss sees in training. Dependence is followed through
    every equation (an equation's outputs depend on all its inputs: conservative inside
    nested ones)."""
    if isinstance(state, (brainstate.HiddenState, brainstate.random.RandomState)):
        return False
    if isinstance(state, brainstate.LongTermState) != (consequences is not None):
        return False
    if not in_vars or not all(map(carries_derivative, in_vars)):
        return False
    own = set(in_vars)
    others = {v for v in jaxpr.invars if v not in own and carries_derivative(v)}
    written = {v for v in out_vars if not isinstance(v, _compat.Literal)}
    memory = all(reached(jaxpr, sources, differentiable=True).intersection(written) for sources in (own, others))
    return memory and (consequences is None or bool(reached(jaxpr, own).intersection(consequences)))


def _check_hidden_consistent(path: tuple, old_value: Any, new_shape: Any) -> None:
    """A hidden state must keep its shape and dtype across the step (brainstate itself
    refuses a changed unit, see :func:`_raise_if_state_structure_changed`)."""
    old_leaves, new_leaves = jax.tree.leaves(old_value), jax.tree.leaves(new_shape)
    for old, new in zip(old_leaves, new_leaves):
        if tuple(old.shape) != tuple(new.shape) or old.dtype != new.dtype:
            raise CompilationError(
                f"HiddenState {format_path(path)} changes from {tuple(old.shape)} {old.dtype} to "
                f"{tuple(new.shape)} {new.dtype} across the step; a carried state must keep its "
                f"shape and dtype (was it initialised for another batch size?)"
            )


def _raise_if_state_structure_changed(model: Any, hidden_before: dict, error: ValueError) -> None:
    """brainstate refuses a step that changes a state's pytree (a unit is part of it).
    Put the original values back and say which hidden state and which units."""
    hidden_now = model.states(brainstate.HiddenState)
    changed = []
    for path, before in hidden_before.items():
        now = hidden_now[path].value
        if jax.tree.structure(now) != jax.tree.structure(before):
            changed.append((path, before, now))
            hidden_now[path].value = before
    if changed:
        path, before, now = changed[0]
        raise CompilationError(
            f"HiddenState {format_path(path)} changes unit across the step: it enters as "
            f"{u.get_unit(before)} and the step writes {u.get_unit(now)}; a carried state must keep its unit"
        ) from error

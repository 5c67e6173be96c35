"""``compile``: a model made ready for online learning, as one explicit value.

``learner = ef.compile(model, x_t, step_loss, algo="hybrid")`` traces one step, finds
the relations, chooses a rule per traced weight *once* (never again for another batch
size) and reports the choice. ``learner.grad(xs, ys)`` runs a sequence on the model's
states. ``state = learner.init(batch_size)`` and ``grads, losses, state =
learner.step(state, xs, ys)`` are the pure form: a :class:`LearnerState` value carries
the weights, hidden states and eligibility traces from one call to the next, so a long
stream can arrive in chunks (streaming) and nothing is written into the model; the pure,
jitted program per input shape lives in the learner, not in a module-level cache, so
nothing outlives it. After changing the model (a layer attribute, new states), compile
again; :meth:`Learner.is_current` tells whether that is needed. Read ``sequence.py`` for
the one-call functions built on it.
"""

from __future__ import annotations

import dataclasses
import contextlib
import itertools
import warnings
from typing import Any, Callable, Mapping, NamedTuple

import brainstate
import jax
import jax.numpy as jnp
import numpy as np

from .. import _compat
from ..compiler import DiagnosticKind, ETraceGraph, compile_graph, format_path
from ..compiler.module_info import module_info
from ..distributed import Placement, batch_axes, resolve_mesh
from ..errors import ApproximationWarning, CompilationError, ConfigError, ShapeError
from ..layers.base import Constrained
from ..ops import etp_op_info
from .base import traced_pairs
from .esd_rtrl import resolve_decay
from .hybrid import Plan, make_plan, parse_bytes
from .online import TraceState, _assemble, build_online, sized_program, temp_bytes
from .registry import check_algo, sequence_algo

__all__ = ["CompiledSequence", "Learner", "LearnerState", "compile"]
#: Compiled programs a learner keeps (one per input shape and step_loss); the oldest go first.
MAX_PROGRAMS = 16
_TRACE_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float64))


class LearnerState(NamedTuple):
    """Everything one sequence (or one chunk of a stream) starts from, as one value:
    ``weights`` ``{"layers.0.weight": value}`` (every ParamState), ``states`` the
    other state leaves in the module's order (hidden states at the batch size),
    ``traces`` each traced pair's eligibility traces and ``t`` the steps seen since
    :meth:`Learner.init`. A pytree: jit, save and replace (``state._replace(weights=...)``)
    it like any other."""

    weights: dict
    states: list
    traces: list
    t: Any


@contextlib.contextmanager
def _states_at(model: Any, batch_size: int, keep_key: bool = True):
    """The model's hidden states reset at ``batch_size`` inside the block, restored after
    (reading initial values or tracing at another batch size leaves the model as it was),
    brainstate's global random key too (``keep_key``): a random initial state drew from
    it, so a run on a mesh (which reads the states' batch axes this way) trained from
    other draws than the same run on one device. ``keep_key=False`` for a reset whose
    draw is the point (the training batch's initial states, :func:`state.eager_reset`)."""
    saved = {path: state.value for path, state in model.states().items()}
    key = brainstate.random.get_key()
    try:
        with jax.ensure_compile_time_eval():  # concrete values, also inside a user's jax.jit
            brainstate.nn.reset_all_states(model, batch_size=batch_size)
        yield
    finally:
        for path, state in model.states().items():
            if path in saved:
                state.value = saved[path]
        if keep_key:
            brainstate.random.set_key(key)


def frozen_weights(model: Any) -> dict[str, set]:
    """``{weight path: {leaf}}`` of the leaves the model's layers never train (their
    ``frozen_leaves()``: a ``LoRALinear``'s base ``W`` unless ``train_base``)."""
    paths = {id(state): format_path(path) for path, state in model.states(brainstate.ParamState).items()}
    found: dict[str, set] = {}
    for node in model.nodes().values():
        for attribute, leaf in getattr(node, "frozen_leaves", lambda: ())():
            found.setdefault(paths[id(getattr(node, attribute))], set()).add(leaf)
    return found


@dataclasses.dataclass(frozen=True)
class CompiledSequence:
    """A model's step compiled for one input shape: the graph traced at that shape, the
    plan (the learner's rules on that graph's pairs; ``None`` for BPTT), the pure
    ``program`` and its jitted ``run``.

    ``program.run(weight_leaves, state_leaves, xs_leaves, targets, collect=...)`` is
    pure; :meth:`weight_leaves`, :meth:`state_leaves`, :meth:`per_state` and
    :meth:`write_states` move values between it and the model's states.
    """

    graph: Any
    plan: Any
    program: Any
    run: Any = dataclasses.field(repr=False, default=None)
    updates: dict = dataclasses.field(default_factory=dict, repr=False)  # online_fit's jitted loops

    @property
    def module(self):
        return self.graph.module

    def weight_leaves(self, values: Mapping | None = None) -> list:
        """The program's weight leaves, from the states or from ``values`` keyed by path."""
        if values is None:
            return [leaf for s in self.module.weights for leaf in jax.tree.leaves(s.state.value)]
        return [leaf for s in self.module.weights for leaf in jax.tree.leaves(values[s.path])]

    def state_leaves(self) -> list:
        return self.module.state_leaves()

    def constrain_leaves(self, weight_leaves) -> list:
        """The weight leaves after each :class:`~etrace_fit.layers.Constrained` weight's
        constraint (Keras': applied after an optimizer update); the others as they are."""
        constrained = {s.path: s.state.constraint for s in self.module.weights if isinstance(s.state, Constrained)}
        if not constrained:
            return list(weight_leaves)
        values = self.per_state(weight_leaves)
        return self.weight_leaves({path: constrained[path](v) if path in constrained else v
                                   for path, v in values.items()})

    def project(self, weight_leaves, start, frozen: Mapping[str, set] | None = None) -> list:
        """The weight leaves after an optimizer update: :meth:`constrain_leaves`, then the
        ``frozen`` leaves (:func:`frozen_weights`) put back to ``start``'s (the leaves
        before the update), as Keras leaves a non-trainable weight alone: a zero gradient
        keeps a weight under Adam, not under a decoupled weight decay."""
        leaves = self.constrain_leaves(weight_leaves)
        if not frozen:
            return leaves
        new, old = self.per_state(leaves), self.per_state(start)
        return self.weight_leaves({path: {key: old[path][key] if key in frozen.get(format_path(path), ()) else leaf
                                          for key, leaf in value.items()} if isinstance(value, dict) else value
                                   for path, value in new.items()})

    def per_state(self, weight_leaves) -> dict:
        """Weight leaves (in ``module.weights`` order) regrouped per ParamState path."""
        out, cursor = {}, 0
        for state in self.module.weights:
            count = len(state.in_vars)
            out[state.path] = jax.tree.unflatten(jax.tree.structure(state.state.value),
                                                 weight_leaves[cursor:cursor + count])
            cursor += count
        return out

    def write_states(self, final_leaves) -> None:
        """Leave the model's written non-weight states where a run ended."""
        cursor = 0
        for state in self.module.states:
            count = len(state.in_vars)
            if state.kind != "weight" and state.written:
                state.state.value = jax.tree.unflatten(jax.tree.structure(state.state.value),
                                                       final_leaves[cursor:cursor + count])
            cursor += count


def _same_states(model: Any, graph: ETraceGraph) -> bool:
    """Whether ``graph`` still refers to the model's current state objects."""
    current = model.states()
    return all(current.get(info.path) is info.state for info in graph.module.states)


def _example_args(example: Any) -> tuple:
    return example if isinstance(example, tuple) else (example,)


@dataclasses.dataclass(frozen=True, eq=False)
class Learner:
    """A model compiled for online learning (see the module docstring).

    Attributes:
        model: the ``brainstate`` module.
        graph: what the compiler found in one step (at the example's shape).
        plan: the rule per traced weight, chosen once (``None`` for BPTT).
        algo, alpha, trace_dtype, memory_budget: the options it was compiled with.
        step_loss: ``(output_t, target_t) -> scalar`` used by :meth:`grad` (optional).
        step_fn: the function traced as one step instead of ``model`` (see :func:`compile`).
    """

    model: Any
    graph: ETraceGraph
    plan: Plan | None
    algo: Any
    alpha: float
    trace_dtype: Any
    memory_budget: int | None
    step_loss: Callable | None = None
    step_fn: Callable | None = None
    placement: Any = None  # an etrace_fit.distributed.Placement: init/step split the batch over a mesh
    _compiled: dict = dataclasses.field(default_factory=dict, repr=False)
    _notes: dict = dataclasses.field(default_factory=dict, repr=False)
    _caps: dict = dataclasses.field(default_factory=dict, repr=False)  # under_line's decisions
    _attributes: dict = dataclasses.field(default_factory=dict, repr=False)  # the layers' settings compiled in
    _nodes: list = dataclasses.field(default_factory=list, repr=False)  # layer_nodes(model), kept

    def __post_init__(self):
        object.__setattr__(self, "_nodes", layer_nodes(self.model))
        object.__setattr__(self, "_attributes", attribute_snapshot(self.model, self._nodes))

    def _replaced_layer(self) -> str | None:
        """The path of the first layer that is another object than at compile time (a
        layer replaced, ``model.layers[2] = LeakyRateReadout(...)``), or None. Walks the
        model (~0.4 ms on the demo's)."""
        for (path, kept), (_, node) in itertools.zip_longest(self._nodes, layer_nodes(self.model),
                                                               fillvalue=("<none>", None)):
            if kept is not node:
                return path
        return None

    def _check_layers(self) -> None:
        """A ``ConfigError`` naming a layer replaced since :func:`compile` (~55 µs)."""
        replaced = self._replaced_layer()
        if replaced is not None:
            raise ConfigError(f"{replaced} is not the layer object the step was compiled with (a layer replaced since, "
                              f"whose settings the compiled step does not hold); compile it again (ef.compile(model, "
                              f"...); a Trainer does at every fit, sequence_grad(model, ...) on its own)")

    def _check_attributes(self) -> None:
        """A ``ConfigError`` when a layer setting compiled into the step (a threshold, a
        time constant held as a number) changed since :func:`compile`: the programs
        would go on with the old value, silently."""
        self._check_layers()
        now = attribute_snapshot(self.model, self._nodes)
        changed = changed_setting(self._attributes, now)
        if changed is not None:
            raise ConfigError(f"{changed[0]}.{changed[1]} changed from {self._attributes.get(changed[0:2])!r} to "
                              f"{now.get(changed[0:2])!r} since the model was compiled, and the compiled step holds "
                              f"the old value; compile it again (ef.compile(model, ...); a Trainer does at every fit, "
                              f"sequence_grad(model, ...) on its own)")

    @property
    def rules(self) -> dict[str, str]:
        """``{"layers.0.weight": "d_rtrl", ...}`` for every traced weight (empty for BPTT);
        a weight whose uses got different rules (one layer called twice, under a memory
        budget) names them joined, ``"d_rtrl+esd_rtrl"``, as ``summary()`` does (the last
        use's rule alone was given)."""
        if self.plan is None:
            return {}
        found: dict[str, list[str]] = {}
        for pair, rule in zip(self.plan.pairs, self.plan.rules):
            names = found.setdefault(format_path(pair.relation.weight_path), [])
            if rule.name not in names:
                names.append(rule.name)
        return {path: "+".join(names) for path, names in found.items()}

    def approximations(self) -> dict[str, tuple[str, ...]]:
        """``{weight path: reasons}`` for every weight whose online gradient is not
        BPTT's (empty for BPTT): see :meth:`Plan.approximations`."""
        return {} if self.plan is None else self.plan.approximations()

    def report(self) -> str:
        """The compile report, the rule and trace memory per weight, and which
        gradients are approximate and why."""
        if self.plan is None:
            algo = sequence_algo(self.algo)
            what = ("exact gradients, memory grows with T" if algo.name == "bptt" else
                    f"gradients truncated every {getattr(algo, 'window', '?')} steps, memory grows with the window")
            # the compiler's notes on traces are the online rules' (a weight "approximate" under them is
            # exact here): what is said of BPTT too is a weight the step never reads, or a state it never writes
            online_only = tuple(d for d in self.graph.diagnostics
                                if d.kind not in (DiagnosticKind.NOT_READ, DiagnosticKind.STATE_MISMATCH))
            return self.graph.report(resolved=online_only) + f"\n\nalgo='{algo}': {what}"
        return self.plan.report()

    def is_current(self) -> bool:
        """Whether the model still compiles to the same step (no layer attribute such as
        a threshold changed); if not, compile it again. (Recreated states — a new
        ``init_all_states`` — are picked up by :meth:`compiled` on its own.)"""
        if changed_setting(self._attributes, attribute_snapshot(self.model, self._nodes)) is not None:
            return False  # a layer setting or brainstate.environ's
        if self._replaced_layer() is not None:  # a readout's τ is a constant the jaxpr's text does not show
            return False
        graph = self.graph
        example = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in graph.module.input_vars]
        example = jax.tree.unflatten(graph.module.input_treedef, [np.zeros(e.shape, e.dtype) for e in example])
        with _states_shaped_as(graph):  # states left at another batch size (an evaluation, a last smaller batch)
            try:
                now = module_info(self.model, *example, step_fn=self.step_fn, online=self.plan is not None)
            except Exception:  # the model no longer takes these inputs
                return False
        return str(now.closed_jaxpr) == str(graph.module.closed_jaxpr)

    def compiled(self, xs: Any, targets: Any, step_loss: Callable | None = None,
                 max_chunk: int | None = None) -> CompiledSequence:
        """The program for time-major ``xs (T, B, ...)`` and ``targets`` (compiled once
        per input shape; the plan's rules are reused at every batch size). ``max_chunk``:
        the online program's chunks take at most that many steps (``online.chunk_cap``;
        the same step and plan as without it)."""
        self._check_attributes()
        step_loss = self.step_loss if step_loss is None else step_loss
        if not callable(step_loss):
            raise ConfigError(f"step_loss must be a callable (output_t, target_t) -> scalar, got "
                              f"{type(step_loss).__name__}")
        key = (_signature(xs), _signature(targets), step_loss) + ((max_chunk,) if max_chunk is not None else ())
        entry = self._compiled.get(key)
        if entry is None:
            self._note_new_program(key)
        if entry is None or not _same_states(self.model, entry.graph):  # states recreated: trace again
            base = self._compiled.get(key[:3]) if max_chunk is not None else None
            if base is not None and _same_states(self.model, base.graph):  # the same step, traced already
                graph = base.graph
            else:
                _check_batch_axis(self.model, jax.tree.leaves(xs), online=self.plan is not None)
                example = jax.tree.map(lambda x: x[0], xs)
                # verify=False: the step was checked when the learner was compiled; another
                # input shape traces the same step
                graph = compile_graph(self.model, *_example_args(example), step_fn=self.step_fn,
                                      online=self.plan is not None, verify=False)
            if self.plan is None:
                plan, program = None, sequence_algo(self.algo).build(graph, step_loss)
            else:
                plan = self._plan_on(graph)
                program = build_online(graph, plan.pairs, plan.rules, step_loss, trace_dtype=plan.trace_dtype,
                                       sharded=self.placement is not None, feedback=plan.feedback,
                                       readout=plan.readout, max_chunk=max_chunk)
            self._compiled[key] = CompiledSequence(graph, plan, program, jax.jit(
                program.run, compiler_options=_compat.compiler_options()))
        return self._compiled[key]

    def under_line(self, compiled: CompiledSequence, xs: Any, targets: Any, step_loss: Callable | None,
                   name: Any, make: Callable[[CompiledSequence], Any], args: tuple, active: Any = None,
                   length: int | None = None) -> tuple[CompiledSequence, Any]:
        """``(compiled, fn)`` with ``fn = make(compiled)``, the jitted function a call runs
        on ``args`` (``name``, hashable, tells such functions apart), kept under
        ``online.mmap_line()`` where halving its chunk does it
        (:func:`~etrace_fit.algorithms.online.chunk_cap`; the Trainer does the same for
        its step): above the line every call page-faults its temp memory anew (D-RTRL
        on the LIF net at H = 128, B = 64, T = 200: 1.69 → 1.18× BPTT). Decided once per
        ``name``, loss and shapes of ``args``, before the first call; the check's compile
        is the one that call needs. ``active`` and ``length`` (default ``xs``'s ``T``; an
        ``update_every`` window): as ``OnlineProgram.chunk_for`` takes them.
        Inside a user's jit (``brainstate.transform.jit``; the arguments are tracers)
        nothing is checked and ``fn`` is the function ``make`` jitted, unjitted: the
        program becomes part of theirs, which takes no nested compiler options."""
        fn = make(compiled)
        if any(_compat.is_tracer(leaf) for leaf in jax.tree.leaves(args)):
            return compiled, fn.__wrapped__
        if compiled.plan is None:
            return compiled, fn
        step_loss = self.step_loss if step_loss is None else step_loss
        key = (name, _signature(args), step_loss)
        if key in self._caps:
            if self._caps[key] is None:
                return compiled, fn
            capped = self.compiled(xs, targets, step_loss, max_chunk=self._caps[key])
            return capped, make(capped)

        def build(cap):
            capped = self.compiled(xs, targets, step_loss, max_chunk=cap)
            return capped, make(capped)

        length = jnp.shape(jax.tree.leaves(xs)[0])[0] if length is None else length
        self._caps[key], program = sized_program((compiled, fn), build, lambda p: temp_bytes(p[1], *args),
                                                 compiled.program.chunk_for(length, active))
        return program

    def _note_new_program(self, key) -> None:
        """Keep at most :data:`MAX_PROGRAMS` programs (the oldest go), and warn once when a
        new program is only needed because ``step_loss`` is a new function object with
        the code of one compiled before (a lambda made in a loop): same result, a new
        compile each call."""
        code = getattr(key[2], "__code__", None)
        if code is not None and "recompiling" not in self._notes and any(
                k[:2] == key[:2] and k[2] is not key[2] and getattr(k[2], "__code__", None) is code
                for k in self._compiled):
            self._notes["recompiling"] = True
            import warnings

            warnings.warn("compiling the sequence again for a new step_loss function with the same code as one "
                          "compiled before (a lambda or closure made anew for each call?): define the loss once "
                          "and pass that same function, or compile once with ef.compile(..., step_loss) and call "
                          "learner.grad; programs are keyed by the function object", RuntimeWarning, stacklevel=4)
        while len(self._compiled) >= self.max_programs:
            self._compiled.pop(next(iter(self._compiled)))

    @property
    def max_programs(self) -> int:
        """How many programs :meth:`compiled` keeps (the oldest go): :data:`MAX_PROGRAMS`,
        or more where a Trainer's data has more batch shapes (every later ``fit``
        compiled every shape again)."""
        return self._notes.get("max_programs", MAX_PROGRAMS)

    def keep_programs(self, count: int) -> None:
        """Keep at least ``count`` programs from now on."""
        self._notes["max_programs"] = max(self.max_programs, int(count))

    def programs(self) -> list:
        """The online programs held now (one per input shape)."""
        return [compiled.program for compiled in self._compiled.values()]

    def _plan_on(self, graph: ETraceGraph) -> Plan:
        """This learner's plan on ``graph`` (the same step at another batch size)."""
        if graph is self.graph:
            return self.plan
        pairs = traced_pairs(graph)
        # Matched by weight and hidden group, not by equation: another input dtype (a float16
        # or int x after a float32 one) adds a cast equation and moves every index by one.
        mine = [(p.relation.weight_path, p.group.paths) for p in self.plan.pairs]
        if [(p.relation.weight_path, p.group.paths) for p in pairs] != mine:
            raise CompilationError("the model's step relates other weights at this input shape than at the one it "
                                   "was compiled with; compile it with an example of this shape")
        pairs = tuple(dataclasses.replace(p, readout_memory=q.readout_memory) for p, q in zip(pairs, self.plan.pairs))
        moved = {}  # the readout's equation (readout memory, e-prop's feedback) in the new step
        old_ops, new_ops = (_etp_equations(g) for g in (self.graph, graph))
        for field in ("readout", "feedback"):
            held = getattr(self.plan, field)
            if held is not None:
                at = old_ops.index(held.readout) if held.readout in old_ops else None
                index = new_ops[at] if at is not None and len(new_ops) == len(old_ops) else None
                if index is None:
                    raise CompilationError("the model's step reads its readout otherwise at this input than at the one "
                                           "it was compiled with; compile it with an example of this input")
                moved[field] = dataclasses.replace(held, readout=index)
        return dataclasses.replace(self.plan, graph=graph, pairs=pairs, **moved)

    def init(self, batch_size: int) -> LearnerState:
        """The :class:`LearnerState` a stream of ``batch_size`` sequences starts from:
        the model's current weights, its hidden states at their initial values (as
        ``reset_all_states``), zero traces, ``t = 0``. The model is left as it was."""
        _positive_int(batch_size, "batch_size")
        self._check_layers()  # a layer replaced since compile: its states are not the step's
        module = self.graph.module
        current = self.model.states()
        with _states_at(self.model, batch_size):
            leaves = [leaf for info in module.states for leaf in jax.tree.leaves(current[info.path].value)]
        weights_at = set(module.weight_leaf_positions)
        states = [leaf for position, leaf in enumerate(leaves) if position not in weights_at]
        weights = {format_path(path): param.value for path, param in self.model.states(brainstate.ParamState).items()}
        traces = [] if self.plan is None else [rule.init_traces(pair, batch_size, self.plan.trace_dtype)
                                               for pair, rule in zip(self.plan.pairs, self.plan.rules)]
        state = LearnerState(weights, states, traces, jnp.zeros((), jnp.int32))
        return state if self.placement is None else self._placed(state, batch_size)

    def _batch_axes(self, batch_size: int) -> tuple:
        """The batch axis of each hidden-state leaf and each trace leaf (None: none)."""
        key = ("axes", batch_size)
        if key not in self._notes:
            module = self.graph.module
            weights_at = set(module.weight_leaf_positions)

            def states_at(size):
                with _states_at(self.model, size):
                    leaves = module.state_leaves()
                return [jax.ShapeDtypeStruct(jnp.shape(leaf), jnp.result_type(leaf))
                        for n, leaf in enumerate(leaves) if n not in weights_at]

            def traces_at(size):
                if self.plan is None:
                    return []
                return jax.eval_shape(lambda: [rule.init_traces(pair, size, self.plan.trace_dtype)
                                               for pair, rule in zip(self.plan.pairs, self.plan.rules)])

            self._notes[key] = (batch_axes(states_at, batch_size), batch_axes(traces_at, batch_size))
        return self._notes[key]

    def _placed(self, state: LearnerState, batch_size: int) -> LearnerState:
        """``state`` on the mesh: states and traces split over the batch, the rest replicated."""
        placement = self.placement
        placement.check_batch(batch_size, f"learner: a batch of {batch_size} sequences")
        state_axes, trace_axes = self._batch_axes(batch_size)
        return LearnerState(placement.replicate(state.weights), placement.put_tree(state.states, state_axes),
                            placement.put_tree(state.traces, trace_axes), placement.replicate(state.t))

    def _hidden_state_positions(self) -> list[int]:
        """Positions in ``LearnerState.states`` of the hidden states' leaves (batch first):
        not a dropout key's or running statistics', whose first axis is no batch."""
        module = self.graph.module
        offsets, weights_at = module.leaf_offsets, set(module.weight_leaf_positions)
        others_at = [n for n in range(sum(len(s.in_vars) for s in module.states)) if n not in weights_at]
        hidden = {offsets[s.path] + k for s in module.hidden for k in range(len(s.in_vars))}
        return [i for i, n in enumerate(others_at) if n in hidden]

    def step(self, state: LearnerState, xs: Any, targets: Any, *, active: Any = None
             ) -> tuple[dict, jax.Array, LearnerState]:
        """One chunk of a stream: ``(grads, losses, next state)`` of time-major ``xs
        (T, B, ...)`` from ``state`` (pure: the model is not read or written, the same
        state gives the same result). The traces carry on, so the gradients of
        consecutive chunks add up to the gradient of the whole stream in one call
        (for BPTT, whose states carry but whose gradient stops at the chunk's start,
        to truncated BPTT). ``grads`` is keyed like ``state.weights``; ``active`` as in
        the online programs (steps without loss skip their pull-back). Runs under a
        plain ``jax.jit`` as well as under ``brainstate.transform.jit``."""
        if not isinstance(state, LearnerState):
            raise ConfigError(f"learner.step takes the LearnerState of learner.init(batch_size), got "
                              f"{type(state).__name__}")
        check_sequence(xs, targets, "learner.step")
        self._check_layers()  # a layer replaced: before anything reads the model's states (compiled checks the rest)
        pairs = 0 if self.plan is None else len(self.plan.pairs)
        if not isinstance(state.traces, (list, tuple)) or len(state.traces) != pairs:
            given = len(state.traces) if isinstance(state.traces, (list, tuple)) else type(state.traces).__name__
            raise ConfigError(f"learner.step: state.traces holds {given} traced pair(s), this learner has {pairs} "
                              f"({self.algo!r}); start a stream from this learner's init(batch_size) (a state of "
                              f"another learner, or traces left out, gave zero gradients)")
        missing = sorted({format_path(s.path) for s in self.graph.module.weights} - set(state.weights))
        if missing:
            raise ConfigError(f"learner.step: state.weights lacks {', '.join(missing)}; it holds "
                              f"{', '.join(sorted(state.weights))} (learner.init gives every weight)")
        batch = jnp.shape(jax.tree.leaves(xs)[0])[1] if jnp.ndim(jax.tree.leaves(xs)[0]) > 1 else None
        made_for = next((jnp.shape(state.states[n])[0] for n in self._hidden_state_positions()
                         if n < len(state.states) and jnp.ndim(state.states[n])), batch)
        if batch != made_for:
            raise ShapeError(f"learner.step: xs has {batch} sequences per step but the state was made for {made_for} "
                             f"(learner.init({made_for})); xs is time-major (T, B, ...)")
        self._note_changed_weights(state)
        if self.placement is not None:  # the batch (time-major: axis 1) and the state on the mesh
            state = self._placed(state, batch)
            xs = jax.tree.map(lambda a: self.placement.put(a, 1), xs)
            targets = jax.tree.map(lambda a: self.placement.put(a, 1 if jnp.ndim(a) > 1 and jnp.shape(a)[1] == batch
                                                                else None), targets)
        with _states_at(self.model, batch):
            compiled = self.compiled(xs, targets)
        module = compiled.module
        paths = {format_path(s.path): s.path for s in module.weights}
        weights = compiled.weight_leaves({paths[name]: value for name, value in state.weights.items() if name in paths})
        weights_at = list(module.weight_leaf_positions)
        others_at = [n for n in range(len(weights_at) + len(state.states)) if n not in weights_at]
        leaves = _assemble(weights_at, others_at, weights, state.states)
        if isinstance(active, str):
            raise ConfigError(f"learner.step takes active as a (T,) bool array or None, got {active!r}")
        # BPTT differentiates the whole chunk at once: steps without loss cost it nothing to skip, so
        # ``active`` (a skip of their pull-back for the online rules) is taken and has nothing to do.
        active = None if active is None or self.plan is None else jnp.asarray(active, bool)
        args = (weights, leaves, jax.tree.leaves(xs), targets, TraceState(state.traces, state.t), active)
        with _states_at(self.model, batch):
            compiled, run = self.under_line(compiled, xs, targets, None, "stream", _stream, args)
        grad_leaves, losses, final, traces = run(*args)
        per_state = compiled.per_state(grad_leaves)
        grads = {name: per_state[path] if path in per_state else jax.tree.map(jnp.zeros_like, state.weights[name])
                 for name, path in ((n, paths.get(n)) for n in state.weights)}
        states = [final[n] for n in others_at]
        self._notes["stream_weights"] = state.weights  # what the next chunk of this stream would pass on
        return grads, losses, LearnerState(state.weights, states, list(traces.traces), traces.t)

    def _note_changed_weights(self, state: LearnerState) -> None:
        """Under changing weights the traces of a followed readout memory and of a
        parameter read through a nonlinear map are approximate (as under
        ``update_every``): warn once when a stream's chunk (``t > 0``) comes with other
        weights than the last chunk handed on. Eager calls only: under a jit the values
        are not there to compare (the warning is then the user's to read in the docs)."""
        last = self._notes.get("stream_weights")
        if self.plan is None or last is None or self._notes.get("stream_warned") or any(
                isinstance(v, jax.core.Tracer) for v in (state.t, *jax.tree.leaves(state.weights))):
            return
        if int(state.t) == 0 or state.weights is last or (
                jax.tree.structure(state.weights) == jax.tree.structure(last)
                and all(a is b or np.array_equal(a, b) for a, b in zip(jax.tree.leaves(state.weights),
                                                                       jax.tree.leaves(last)))):
            return
        self._notes["stream_warned"] = True
        why = "weights changed between learner.step calls of one stream"
        warn_readout_memory_under_updates(self.plan, why, stacklevel=4)
        warn_weight_maps_under_updates(self.plan, why, stacklevel=4)

    def grad(self, xs: Any, targets: Any) -> tuple[dict, jax.Array]:
        """``(grads, losses)`` of one sequence, as :func:`etrace_fit.sequence_grad`."""
        check_sequence(xs, targets, "learner.grad")
        compiled = self.compiled(xs, targets)
        args = (compiled.weight_leaves(), compiled.module.state_leaves(), jax.tree.leaves(xs), targets)
        compiled, run = self.under_line(compiled, xs, targets, None, "grad", _run, args)
        grads_leaves, losses, final = run(*args)
        compiled.write_states(final)
        grads = compiled.per_state(grads_leaves)
        return {path: grads[path] if path in grads else jax.tree.map(jnp.zeros_like, param.value)
                for path, param in self.model.states(brainstate.ParamState).items()}, losses


def _run(compiled: CompiledSequence) -> Any:
    """The jitted sequence gradient of ``compiled`` (:meth:`Learner.grad`)."""
    return compiled.run


def _stream(compiled: CompiledSequence) -> Any:
    """The jitted chunk of a stream of ``compiled`` (:meth:`Learner.step`), made once."""
    run = compiled.updates.get("stream")
    if run is None:
        program = compiled.program

        def stream(weights, states, xs_leaves, targets, traces, active):
            options = {} if active is None else {"active": active}
            return program.run(weights, states, xs_leaves, targets, traces=traces, **options)

        run = compiled.updates["stream"] = jax.jit(stream, compiler_options=_compat.compiler_options())
    return run


def _positive_int(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be a positive int, got {value!r}")
    return value


def _signature(tree: Any) -> tuple:
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((tuple(jnp.shape(x)), jnp.result_type(x).name) for x in leaves)


def _check_batch_axis(model, xs_leaves, online: bool = True) -> None:
    """xs is (T, B, ...) and every hidden state is (B, ...): say which disagrees
    (``online``: a neuron's state without a batch axis too; BPTT takes unbatched ones)."""
    batch = jnp.shape(xs_leaves[0])[1]
    nodes = model.nodes()
    for path, state in model.states(brainstate.HiddenState).items():
        shape = tuple(jnp.shape(jax.tree.leaves(state.value)[0]))
        units = getattr(nodes.get(path[:-1]), "shape", None)  # a Neuron's units: its state is (B, *units)
        if online and isinstance(units, tuple) and len(shape) == len(units) and shape == units:
            # unbatched: (L, C) after a same-size conv read xs' axis 1 (L) as the batch, and the
            # conv's weight went to its one-step gradient under a shape warning
            raise ShapeError(
                f"sequence_grad: hidden state {format_path(path)} has shape {shape}, its layer's units, without a "
                f"batch axis: the online rules need hidden states of shape (batch, units...). Initialise states with "
                f"brainstate.nn.init_all_states(model, batch_size=B) (algo='bptt' takes unbatched ones)")
        if not shape or shape[0] != batch:
            raise ShapeError(
                f"sequence_grad: xs has shape {tuple(jnp.shape(xs_leaves[0]))}, read as time-major (T, B, ...) "
                f"with B={batch}, but hidden state {format_path(path)} has shape {shape}; expected a "
                f"leading batch axis of {batch}. Initialise states with brainstate.nn.init_all_states(model, "
                f"batch_size=B), and pass xs time-major (swap axes 0 and 1 of batch-major data)"
            )


def check_trace_dtype(trace_dtype: Any) -> Any:
    """``trace_dtype`` as a dtype (``None`` stays ``None``: the hidden states' dtype),
    or a ``ConfigError`` that says what it may be. Float64 traces need 64-bit JAX,
    without which JAX would make them float32 while the plan counts 8 bytes each."""
    if trace_dtype is None:
        return None
    try:
        dtype = jnp.dtype(trace_dtype)
    except TypeError:
        dtype = None
    if dtype is None or dtype not in _TRACE_DTYPES:  # (numpy: dtype("float64") == None)
        raise ConfigError(f"trace_dtype must be float32, bfloat16 or float64, got "
                          f"{trace_dtype if dtype is None else dtype.name!r}")
    if dtype == jnp.float64 and not jax.config.jax_enable_x64:
        raise ConfigError("trace_dtype float64 needs 64-bit JAX: call jax.config.update('jax_enable_x64', True) "
                          "before building the model (brainstate.environ.set(precision=64) does too); it is off "
                          "inside brainstate.environ.context(precision=32) and after set(precision=32)")
    return dtype


def compile(  # noqa: A001 - the public name, as ef.compile
    model: Any,
    example: Any,
    step_loss: Callable[[Any, Any], jax.Array] | None = None,
    *,
    algo: str | Mapping[str, str] = "hybrid",
    decay: float | None = None,
    rank: int | None = None,
    trace_dtype: Any = None,
    memory_budget: Any = None,
    plan_batch: int | None = None,
    warn: bool = True,
    step_fn: Callable[..., Any] | None = None,
    mesh: Any = None,
    verify: bool | None = None,
) -> Learner:
    """Compile ``model`` for online learning: trace one step, plan a rule per weight.

    Args:
        model: a ``brainstate.nn.Module`` with initialised states (batch axis first).
        example: one time step's input, ``(B, features...)`` (a tuple for several).
        step_loss: ``(output_t, target_t) -> scalar``, for :meth:`Learner.grad`.
        algo: a name of ``registry.ALGOS`` (``"hybrid"``, ``"d_rtrl"``, ``"esd_rtrl"``,
            ``"bptt"``), a rule value, or ``{path pattern: rule}``.
        decay, rank, trace_dtype, memory_budget: as in :func:`etrace_fit.sequence_grad`.
        plan_batch: the batch size the report's trace totals are shown at (default:
            the example's); the rules never depend on it.
        warn: raise one :class:`~etrace_fit.errors.ApproximationWarning` per weight
            whose online gradient is approximate.
        step_fn: the function traced as one step, ``(*inputs) -> outputs``, instead of
            ``model``: it calls ``model`` once and may return more than the model's
            output, read from its layers after the step, for a loss on hidden activity
            (``lambda x: (model(x), model.layers[0].spikes())``; ``step_loss`` then
            receives that tuple). States keep their paths in ``model``.
        mesh: as ``Trainer(mesh=...)`` (docs/scaling.md): :meth:`Learner.init` and
            :meth:`Learner.step` split the batch, hidden states and traces over the
            mesh's ``"batch"`` axis and replicate the weights.
        verify: test what the compiler calls exact on the traced step at a random
            point (docs/compiler.md, the numerical check); a weight the step
            contradicts is reported approximate. Default: for a model with a module
            class from outside etrace_fit and brainstate (a neuron of your own), or as
            the ``ETRACE_FIT_VERIFY`` environment variable says (``1`` / ``0``).

    Returns:
        a :class:`Learner`; ``print(learner.report())`` shows the plan.

    Example::

        learner = ef.compile(model, xs[0], lambda out, y: ((out - y) ** 2).sum(), algo="d_rtrl")
        grads, losses = learner.grad(xs, ys)
    """
    check_algo(algo)
    mesh = resolve_mesh(mesh)
    alpha = resolve_decay(decay, rank)
    memory_budget = parse_bytes(memory_budget)
    trace_dtype = check_trace_dtype(trace_dtype)
    if step_fn is not None and not callable(step_fn):
        raise ConfigError(f"step_fn must be a callable (*inputs) -> outputs that calls the model, got "
                          f"{type(step_fn).__name__}")
    graph = compile_graph(model, *_example_args(example), step_fn=step_fn, online=sequence_algo(algo) is None,
                          verify=verify)
    if warn:
        warn_unread(graph, stacklevel=3)
    plan = None
    if sequence_algo(algo) is None:
        group = graph.hidden_groups[0]
        batch = (group.shape[0] if group.shape else 1) if plan_batch is None else plan_batch
        dtype = jnp.dtype(group.dtype) if trace_dtype is None else trace_dtype
        plan = make_plan(graph, algo, alpha=alpha, batch=batch, trace_dtype=dtype, memory_budget=memory_budget)
        if warn:
            warn_approximations(plan, stacklevel=3)
    return Learner(model=model, graph=graph, plan=plan, algo=algo, alpha=alpha, trace_dtype=trace_dtype,
                   memory_budget=memory_budget, step_loss=step_loss, step_fn=step_fn,
                   placement=None if mesh is None else Placement(mesh))


def check_sequence(xs: Any, targets: Any, who: str) -> None:
    """A ``ShapeError`` naming ``who`` unless ``xs`` is time-major ``(T, B, ...)`` with
    ``T > 0`` and every target leaf has the same leading ``T``."""
    xs_leaves = jax.tree.leaves(xs)
    if not xs_leaves:
        raise ShapeError(f"{who}: xs is empty; expected a time-major array (T, B, ...)")
    length = jnp.shape(xs_leaves[0])[0] if jnp.ndim(xs_leaves[0]) else 0
    for leaf in xs_leaves:
        if jnp.ndim(leaf) < 2 or jnp.shape(leaf)[0] != length:
            raise ShapeError(f"{who}: xs must be time-major (T, B, ...) with one T, got shapes "
                             f"{[tuple(jnp.shape(x)) for x in xs_leaves]}")
    if length == 0:
        raise ShapeError(f"{who}: xs has no time steps (T = 0)")
    for leaf in jax.tree.leaves(targets):  # (T, ...): per-step values without a batch axis are targets too
        if jnp.ndim(leaf) < 1 or jnp.shape(leaf)[0] != length:
            raise ShapeError(f"{who}: targets must have the leading time axis T={length}, got shape "
                             f"{tuple(jnp.shape(leaf))}")


def layer_nodes(model: Any) -> list[tuple[str, Any]]:
    """``[(layer path, module)]`` of ``model`` (walking the tree takes ~0.4 ms on the
    demo's model: callers that check settings often keep this list)."""
    return [(format_path(path) or type(model).__name__, node) for path, node in model.nodes().items()]


_PLAIN = (bool, int, float, complex, str, type(None))


@contextlib.contextmanager
def _states_shaped_as(graph: ETraceGraph):
    """Within the block, every state of ``graph``'s step whose value now has other
    shapes (hidden states at another batch size) holds zeros of the traced shapes; its
    value is put back after. Tracing the step again at the graph's inputs then sees
    the graph's shapes: :meth:`Learner.is_current` found every model whose last batch
    (or an evaluation) had another size changed, and the Trainer compiled its training
    step again at every ``fit`` (2-8 s a call)."""
    swapped = []
    for info in graph.module.states:
        state = info.state
        leaves, treedef = jax.tree.flatten(state.value)
        if len(leaves) != len(info.in_vars) or all(
                jnp.shape(leaf) == tuple(var.aval.shape) for leaf, var in zip(leaves, info.in_vars)):
            continue
        swapped.append((state, state.value))
        # numpy zeros: no XLA program per shape (the value is only traced)
        state.value = jax.tree.unflatten(treedef, [np.zeros(var.aval.shape, var.aval.dtype) for var in info.in_vars])
    try:
        yield
    finally:
        for state, value in swapped:
            state.value = value


def changed_setting(compiled: dict, now: dict) -> tuple | None:
    """The first key of :func:`attribute_snapshot` whose value differs between the
    snapshot a program was ``compiled`` with and ``now`` (None: the same). An
    environment setting unset ``now`` is no change: a ``fit`` inside
    ``brainstate.environ.context(dt=1.0)`` and a ``predict`` after the block run the
    programs compiled with ``dt = 1`` (the model cannot run without one)."""
    for key in (*compiled, *now):
        if key[0] == "brainstate.environ" and key not in now:
            continue
        if not _same(compiled.get(key, _MISSING), now.get(key, _MISSING)):
            return key
    return None


_MISSING = object()


def attribute_snapshot(model: Any, nodes: list | None = None) -> dict:
    """``{(layer path, name): value}`` of every layer's public setting, and
    ``{("brainstate.environ", name): value}`` of the environment's (``dt``,
    ``precision``; but ``fit``, which the library sets while it traces): the values a
    traced step bakes in. A setting is anything but a state or a module (those are the
    step's inputs and the other layers): a number, a string, an array (compared by
    value; a numpy array is copied, since it can change in place), a surrogate or any
    other object (a dataclass by its fields, another object by its public attributes, a
    function by identity), and containers of them. A surrogate swapped in to anneal its
    slope, or a fixed time constant held as an array, changed the gradients while a
    snapshot of numbers alone saw no change. ``nodes``: :func:`layer_nodes`' list, if
    kept."""
    found = {("brainstate.environ", name): value for name, value in brainstate.environ.all().items()
             if name != "fit" and isinstance(value, _PLAIN)}
    for path, node in layer_nodes(model) if nodes is None else nodes:
        for name, value in vars(node).items():
            if name.startswith("_") or isinstance(value, (brainstate.State, brainstate.nn.Module)):
                continue
            frozen = _setting(value, 0)
            if frozen is not _SKIP:
                found[(path, name)] = frozen
    return found


_SKIP = object()  # no setting: a state, a module, a tracer


class _Setting:
    """A setting that is not a plain value, as compared between snapshots: its ``key``
    (plain values, tuples, arrays, :class:`_Ref`) by :func:`_same`, shown as ``shown``
    (made readable only when an error names it)."""

    __slots__ = ("key", "shown")

    def __init__(self, key: Any, shown: Any):
        self.key, self.shown = key, shown

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, _Setting) and _same(self.key, other.key)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return _short_repr(self.shown)


class _Ref:
    """An object compared by identity (a function, or past the depth followed)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


def _setting(value: Any, depth: int) -> Any:
    """``value`` as :func:`attribute_snapshot` keeps it (``_SKIP``: not a setting)."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (brainstate.State, brainstate.nn.Module)) or _compat.is_tracer(value):
        return _SKIP
    if isinstance(value, (np.ndarray, np.generic)):
        copy = np.array(value, copy=True)
        return _Setting(copy, copy)
    if isinstance(value, jax.Array):  # immutable: kept as it is
        return _Setting(value, value)
    if isinstance(value, (tuple, list)):
        items = tuple(_setting(v, depth + 1) for v in value)
        if all(isinstance(v, _PLAIN) for v in items) and isinstance(value, tuple):
            return items  # a plain tuple stays one (the snapshot's older form)
        return _Setting((type(value).__name__, items), value)
    if isinstance(value, dict):
        return _Setting(("dict", tuple((repr(k), _setting(v, depth + 1)) for k, v in value.items())), value)
    if depth < 3 and dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = tuple((f.name, _setting(getattr(value, f.name, None), depth + 1)) for f in dataclasses.fields(value))
        return _Setting((type(value), fields), value)
    mantissa = getattr(value, "mantissa", None)
    if mantissa is not None and hasattr(value, "unit"):  # a saiunit Quantity
        return _Setting(("Quantity", _setting(mantissa, depth + 1), str(value.unit)), value)
    if depth < 3 and not callable(value) and hasattr(value, "__dict__"):
        attributes = tuple((k, _setting(v, depth + 1)) for k, v in vars(value).items() if not k.startswith("_"))
        return _Setting((type(value), attributes), value)
    return _Setting(_Ref(value), value)


def _same(a: Any, b: Any) -> bool:
    """Whether two snapshot values are the same setting (arrays by value, NaN equal to
    NaN, :class:`_Ref` by identity)."""
    if a is b:
        return True
    if isinstance(a, _Setting) or isinstance(b, _Setting):
        return isinstance(a, _Setting) and isinstance(b, _Setting) and _same(a.key, b.key)
    if isinstance(a, _Ref) or isinstance(b, _Ref):
        return isinstance(a, _Ref) and isinstance(b, _Ref) and a.value is b.value
    arrays = (np.ndarray, np.generic, jax.Array)
    if isinstance(a, arrays) or isinstance(b, arrays):
        if not (isinstance(a, arrays) and isinstance(b, arrays)) or a.shape != b.shape or a.dtype != b.dtype:
            return False
        a, b = np.asarray(a), np.asarray(b)
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and a != a and b != b:  # NaN
        return True
    try:
        return bool(a == b)
    except Exception:  # an object whose == is not a truth value
        return False


def _short_repr(value: Any) -> str:
    """A repr for error messages, cut to one readable line."""
    try:
        text = np.array2string(np.asarray(value), threshold=8) if isinstance(value, (np.ndarray, jax.Array)) \
            else repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= 80 else text[:77] + "..."


def _etp_equations(graph: ETraceGraph) -> list[int]:
    """The indices of the step's ETP equations, in order: the same ops at any input
    dtype (a cast is no ETP op), so the k-th here is the k-th in another trace."""
    return [i for i, eqn in enumerate(graph.module.jaxpr.eqns) if etp_op_info(eqn.primitive) is not None]


def warn_readout_memory_under_updates(plan: Plan | None, why: str, stacklevel: int = 2) -> None:
    """An :class:`~etrace_fit.errors.ApproximationWarning` when ``plan``'s traces follow a
    leaky readout's memory while the weights change inside it (``why``: ``update_every``,
    a stateful stream): the memory is read through the readout weight of the current
    step, where RTRL weighs each earlier step by the readout weight it had, so the
    gradient is no longer exact (the error grows with the learning rate times the
    readout's time constant; docs/algorithms.md)."""
    if plan is None or plan.readout is None:
        return
    import warnings

    weights = ", ".join(dict.fromkeys(format_path(p.relation.weight_path) for p in plan.pairs if p.readout_memory))
    warnings.warn(f"the online gradients of {weights} are approximate with {why}: their traces follow the leaky "
                  f"readout's memory (κ = {plan.readout.kappa:.4g}) through the readout weight of the current step, "
                  f"and the updates change that weight within the memory (the error grows with the learning rate "
                  f"times the readout's time constant); a stateless readout (Linear) keeps them exact",
                  ApproximationWarning, stacklevel=stacklevel)


# Primitives between a ParamState and its op that keep the op's value linear in the parameter.
_LINEAR_CHAIN = frozenset({"add", "sub", "neg", "convert_element_type", "reshape", "transpose", "broadcast_in_dim",
                           "squeeze", "expand_dims", "copy", "copy_p", "slice", "dynamic_slice", "concatenate",
                           "pad", "rev", "reduce_sum"})


def _nonlinear_map(pair: Any, graph: ETraceGraph) -> str | None:
    """What maps ``pair``'s parameter to the value its op reads nonlinearly (a learned
    τ's ``exp(−dt/τ)``, a ``weight_fn`` other than a mask, a product of two parameters),
    or None when that map is linear (a plain or masked weight, a parameter read as it is).
    The traces are kept for the value the op reads and mapped back to the parameter
    through that function at the current parameter when a gradient is formed."""
    from ..ops.elementwise import _identity
    from ..ops.weight_fns import Chain, Masked

    relation = pair.relation
    params = graph.module.jaxpr.eqns[relation.eqn_index].params
    fn = params.get("fn")
    fn = getattr(fn, "fn", fn)  # a quantity's fn, unwrapped
    if relation.op_kind == "elementwise" and fn is not None and fn is not _identity:
        return getattr(fn, "__name__", type(fn).__name__)
    weight_fn = params.get("weight_fn")
    parts = weight_fn.fns if isinstance(weight_fn, Chain) else (weight_fn,)
    if weight_fn is not None and not all(isinstance(part, Masked) for part in parts):
        return f"weight_fn {type(weight_fn).__name__}"
    keys = [operand.key for operand in relation.operands]
    for operand in relation.operands:
        shared = keys.count(operand.key) > 1  # an operand computed from several parameters (W + A @ B)
        for primitive in operand.chain:
            if primitive.startswith("weight_fn:") or primitive in _LINEAR_CHAIN:
                continue
            if primitive in ("mul", "dot_general") and not shared:  # by a constant
                continue
            return primitive
    return None


def warn_weight_maps_under_updates(plan: Plan | None, why: str, stacklevel: int = 2) -> None:
    """An :class:`~etrace_fit.errors.ApproximationWarning` when a traced parameter reaches
    its op through a nonlinear function (:func:`_nonlinear_map`) while the weights
    change inside the traces' memory (``why``: ``update_every``, a stateful stream):
    the traces follow the function's value, mapped back to the parameter through the
    derivative at the current parameter, where RTRL weighs each earlier step by the
    derivative at the parameter it had (docs/algorithms.md). Weights already named
    approximate are left out."""
    if plan is None:
        return
    flagged = plan.approximations()
    found = {}
    for pair in plan.pairs:
        name = format_path(pair.relation.weight_path)
        what = None if name in flagged else _nonlinear_map(pair, plan.graph)
        if what is not None:
            found.setdefault(name, what)
    if not found:
        return
    named = ", ".join(f"{name} (through {what})" for name, what in found.items())
    warnings.warn(f"the online gradients of {named} are approximate with {why}: their traces follow the value the "
                  f"op reads, mapped back to the parameter through the function's derivative at the current "
                  f"parameter, and the updates change the parameter within the traces' memory (the error grows with "
                  f"the learning rate); one update per sequence keeps them exact", ApproximationWarning,
                  stacklevel=stacklevel)


def warn_unread(graph: ETraceGraph, stacklevel: int = 2) -> None:
    """One ``UserWarning`` per ``ParamState`` the model's step never reads: no algo
    trains it (Keras warns of a variable without a gradient alike)."""
    for record in graph.diagnostics:
        if record.kind is DiagnosticKind.NOT_READ:
            warnings.warn(record.message, UserWarning, stacklevel=stacklevel + 1)


def warn_approximations(plan: Plan, stacklevel: int = 2) -> None:
    """One :class:`~etrace_fit.errors.ApproximationWarning` per weight whose online
    gradient under ``plan`` is approximate, naming it and saying why."""
    import warnings

    for path, reasons in plan.approximations().items():
        warnings.warn(f"the online gradient of {path} is approximate: " + "; ".join(reasons)
                      + "; see the plan's report(), measure it with ef.gradient_fidelity, or use algo='bptt'",
                      ApproximationWarning, stacklevel=stacklevel)

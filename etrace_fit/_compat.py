"""Every use of JAX internals lives here, so a JAX upgrade touches one file.

The rest of the package imports primitives, jaxpr types and interpreter hooks from
this module only. Tested against the JAX range pinned in ``pyproject.toml``; read
``etrace_fit/ops/registry.py`` next to see how the ETP primitives use these hooks.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Collection

import jax
from jax.extend.core import (  # noqa: F401  (re-exported for the compiler)
    ClosedJaxpr,
    DropVar,
    Jaxpr,
    JaxprEqn,
    Literal,
    Primitive,
    Var,
    jaxpr_as_fun,
    jaxprs_in_params,
    new_jaxpr_eqn,
)
from jax.interpreters import ad, batching, mlir

ShapedArray = jax.core.ShapedArray
eval_jaxpr = jax.core.eval_jaxpr

#: The batch-dimension marker JAX uses for an operand that ``vmap`` does not map.
NOT_MAPPED = None

__all__ = [
    "ClosedJaxpr",
    "DropVar",
    "control_flow_operands",
    "custom_vjp_as_jvp",
    "custom_vjp_jaxpr",
    "custom_vjp_name",
    "eval_equation",
    "interpret",
    "is_custom_vjp_call",
    "per_unit_bodies",
    "is_nested_jit",
    "jaxprs_in_params",
    "live_equations",
    "nested_jit_jaxpr",
    "Jaxpr",
    "JaxprEqn",
    "Literal",
    "NOT_MAPPED",
    "Primitive",
    "ShapedArray",
    "Var",
    "eval_jaxpr",
    "is_symbolic_zero",
    "step_invariant_outputs",
    "is_tracer",
    "jaxpr_as_fun",
    "new_jaxpr_eqn",
    "used_inputs",
    "register_primitive",
    "compiler_options",
    "quick_compile_options",
    "use_compilation_cache",
]

#: XLA's copy insertion with region analysis (the GPU backends use it by default; the
#: CPU one takes it as an option of this name).
_REGION_ANALYSIS = "xla_cpu_copy_insertion_use_region_analysis"


@functools.cache
def compiler_options() -> dict[str, Any] | None:
    """The XLA options the model's programs are compiled with (``jax.jit``'s
    ``compiler_options``): training, the same for every rule and BPTT, evaluation and
    prediction; ``None`` for none.

    On CPU: copy insertion with region analysis. A loop whose step updates carried
    values that read one another (a neuron's coupled states, the slabs of a trace's
    per-unit matrix, D-RTRL's suffix product over a chunk) otherwise gets a copy of each
    such value per step. Measured 2026-11-25 (2 cores, runs alternated in one process):
    the demo's online step 27.9 → 26.3 ms a batch, the GRU's ES-D-RTRL 18.0 → 16.9 ms,
    the feed-forward LIF net's D-RTRL 4.8 → 4.5 ms, BPTT unchanged; identical results;
    compilation ~0.1 s longer; the demo model's forward pass (evaluate, predict) 2.62 →
    2.38 ms a batch. ``None`` on other backends, or when this XLA build does
    not know the option (probed once with a one-op program)."""
    if jax.default_backend() != "cpu":
        return None
    options = {_REGION_ANALYSIS: True}
    try:
        jax.jit(lambda x: x + 1, compiler_options=options).lower(1.0).compile()
    except Exception:  # an XLA without the option: its default copy insertion
        return None
    return options


@functools.lru_cache(maxsize=None)
def quick_compile_options() -> dict[str, Any] | None:
    """XLA options for a program run once, where compiling is all the cost (the
    compiler's numerical check): on CPU without XLA's fusion emitters, which compiled
    that check in 0.10–0.14 s instead of 0.23 s (2026-11-29, a 3-state step).
    ``None`` elsewhere or when this XLA does not know the option."""
    if jax.default_backend() != "cpu":
        return None
    options = {"xla_cpu_use_fusion_emitters": False}
    try:
        jax.jit(lambda x: x + 1, compiler_options=options).lower(1.0).compile()
    except Exception:  # an XLA without the option
        return None
    return options


def _host_key() -> str:
    """A name for this machine's kind of CPU: XLA compiles CPU programs for the host's
    instruction set, so a folder shared by different CPUs (a cluster's home directory)
    keeps one subfolder per kind."""
    import hashlib
    import platform

    try:
        with open("/proc/cpuinfo") as info:
            lines = [line for line in info if line.startswith(("model name", "flags", "Features"))]
    except OSError:
        lines = []
    described = "".join(dict.fromkeys(lines)) + platform.machine() + platform.processor()
    return f"{platform.machine() or 'cpu'}-{hashlib.sha256(described.encode()).hexdigest()[:12]}"


def use_compilation_cache(path: str | None) -> None:
    """Keep the compiled programs of this process under the folder ``path`` (JAX's
    persistent compilation cache; on CPU in a subfolder per kind of CPU), every program
    however quick it compiled, and read them back from there instead of compiling again:
    a later run of the same model and shapes (another seed) skips XLA's compilation.
    ``None``: no cache. Takes effect from the next compilation on, in this process (JAX
    decides whether to use its cache once, at its first compilation: the decision is
    reset here)."""
    from jax.experimental.compilation_cache import compilation_cache

    if path is not None and jax.default_backend() == "cpu":
        path = f"{path}/{_host_key()}"
    jax.config.update("jax_compilation_cache_dir", None if path is None else str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    compilation_cache.reset_cache()


def is_tracer(value: Any) -> bool:
    """True when ``value`` is a JAX tracer (an abstract value under a transformation)."""
    return isinstance(value, jax.core.Tracer)


def used_inputs(closed: ClosedJaxpr) -> list[bool]:
    """Per input of ``closed``, whether any equation or output reads it."""
    jaxpr = closed.jaxpr
    read = {id(v) for eqn in jaxpr.eqns for v in eqn.invars if isinstance(v, Var)}
    read |= {id(v) for v in jaxpr.outvars if isinstance(v, Var)}
    return [id(v) in read for v in jaxpr.invars]


def is_symbolic_zero(tangent: Any) -> bool:
    """True when ``tangent`` is JAX's symbolic zero (an input with no tangent), in a
    primitive's JVP rule or in a ``custom_jvp`` rule defined with ``symbolic_zeros=True``."""
    return type(tangent) is ad.Zero or isinstance(tangent, jax.custom_derivatives.SymbolicZero)


def register_primitive(
    name: str,
    *,
    reference: Callable[..., Any],
    abstract_eval: Callable[..., Any],
    jvp: Callable[..., Any],
    batch: Callable[..., Any],
) -> Primitive:
    """Create a single-output primitive with all the JAX rules it needs.

    ``reference`` computes the output from plain ``jax.numpy`` and serves both as the
    eager implementation (after ``abstract_eval`` has checked the operands) and, via
    ``mlir.lower_fun``, as the lowering under ``jit``.
    ``jvp(primals, tangents, **params)`` and ``batch(args, dims, **params)`` follow the
    signatures of ``ad.primitive_jvps`` and ``batching.primitive_batchers``; the JVP
    must express tangents with ordinary (transposable) ops so reverse mode works
    without a transpose rule of our own.
    """
    primitive = Primitive(name)

    def checked_reference(*args, **params):
        # Eager binds skip abstract evaluation; run it so shape errors read the same.
        abstract_eval(*args, **params)
        return reference(*args, **params)

    primitive.def_impl(checked_reference)
    primitive.def_abstract_eval(abstract_eval)
    mlir.register_lowering(primitive, mlir.lower_fun(reference, multiple_results=False))
    ad.primitive_jvps[primitive] = jvp
    batching.primitive_batchers[primitive] = batch
    return primitive


# ----------------------------------------------------------------- jaxpr interpreter
_NESTED_JIT = ("jit", "pjit", "closed_call", "core_call")


def is_nested_jit(eqn: JaxprEqn) -> bool:
    """Whether ``eqn`` calls a nested jitted function (inlinable without changing meaning)."""
    return eqn.primitive.name in _NESTED_JIT and "jaxpr" in eqn.params


def nested_jit_jaxpr(eqn: JaxprEqn) -> ClosedJaxpr:
    """The closed jaxpr a nested-jit equation calls."""
    inner = eqn.params["jaxpr"]
    return inner if isinstance(inner, ClosedJaxpr) else ClosedJaxpr(inner, ())


def eval_equation(eqn: JaxprEqn, invals: list[Any]) -> list[Any]:
    """Bind ``eqn``'s primitive on ``invals``; always returns a list of outputs."""
    bind_params = eqn.primitive.get_bind_params(eqn.params)
    with eqn.ctx.manager:
        out = eqn.primitive.bind(*invals, **bind_params)
    return list(out) if eqn.primitive.multiple_results else [out]


def is_custom_vjp_call(eqn: JaxprEqn) -> bool:
    """Whether ``eqn`` calls a ``jax.custom_vjp`` function."""
    return eqn.primitive.name == "custom_vjp_call"


def custom_jvp_rule_jaxpr(eqn: JaxprEqn) -> Jaxpr | None:
    """The JVP rule of a ``custom_jvp`` call as a jaxpr ``(primals, tangents) ->
    (primal outs, tangent outs)``, every tangent taken nonzero; ``None`` if this JAX
    keeps it in another form."""
    try:  # (JAX memoizes the traced rule: asking again costs nothing)
        jaxpr, _, _ = eqn.params["jvp_jaxpr_fun"].call_wrapped(*[False] * (len(eqn.invars) - eqn.params["num_consts"]))
    except Exception:  # another JAX's form of the rule (a thunk, a closed jaxpr)
        return None
    return jaxpr.jaxpr if isinstance(jaxpr, ClosedJaxpr) else jaxpr


def custom_vjp_name(eqn: JaxprEqn) -> str:
    """The name and place of the function a ``custom_vjp`` call wraps (``"spike at
    neurons.py:12"``), as JAX's debug info has it."""
    info = getattr(eqn.params["call_jaxpr"].jaxpr, "debug_info", None)
    return getattr(info, "func_src_info", None) or "a custom_vjp function"


def custom_vjp_jaxpr(eqn: JaxprEqn) -> ClosedJaxpr:
    """The primal computation a ``custom_vjp`` call wraps (its forward pass)."""
    return eqn.params["call_jaxpr"]


def custom_vjp_as_jvp(eqn: JaxprEqn, invals: list[Any]) -> list[Any]:
    """``eqn``, a ``custom_vjp`` call, evaluated as a ``jax.custom_jvp`` function whose
    tangent comes from the function's own VJP (its ``bwd``), so forward mode works too:
    JAX gives none for a ``custom_vjp`` function. Exact for an elementwise function of
    same-shaped float inputs (a surrogate spike): its Jacobian is diagonal, and the
    pullback of ones on output ``j`` is the diagonal of ``∂out_j / ∂in_i`` for every
    input ``i``; the caller checks that (``compiler.module_info``)."""

    def primal(*args):
        return eval_equation(eqn, list(args))

    @jax.custom_jvp
    def call(*args):
        return primal(*args)

    @call.defjvp
    def rule(primals, tangents):
        outs, pullback = jax.vjp(primal, *primals)
        tangent_outs = []
        for j, out in enumerate(outs):
            seeds = [jax.numpy.ones_like(o) if k == j else jax.numpy.zeros_like(o) for k, o in enumerate(outs)]
            total = jax.numpy.zeros_like(out)
            for diagonal, tangent in zip(pullback(seeds), tangents):
                if diagonal.dtype != jax.dtypes.float0 and tangent.dtype != jax.dtypes.float0:
                    total = total + diagonal * tangent
            tangent_outs.append(total)
        return outs, tangent_outs

    return list(call(*invals))


def interpret(
    jaxpr: Jaxpr,
    consts: list[Any],
    args: list[Any],
    *,
    override: Callable[[int, JaxprEqn, list[Any]], list[Any] | None] | None = None,
    on_write: Callable[[Any, Any], Any] | None = None,
    wanted: Collection[Any] | None = None,
    given: Collection[int] = (),
) -> list[Any]:
    """Evaluate ``jaxpr`` equation by equation, with hooks for the compiler's rewrites.

    ``override(index, eqn, invals)`` may return the equation's outputs instead of
    binding it (``None``: bind as usual). ``on_write(var, value)`` sees every value
    stored in a variable (inputs included) and returns the value to store. Traced
    under ``jax.make_jaxpr`` this produces the rewritten jaxpr.

    ``wanted``: variables (outputs or intermediates) whose values are needed; only the
    equations they depend on run, and an output that is not needed reads ``None``
    (default: all). ``given``: equations whose outputs ``override`` gives without
    reading their inputs, so what feeds them alone does not run (their ``invals`` read
    ``None`` where not computed).
    """
    env: dict[Any, Any] = {}
    live = None if wanted is None else live_equations(jaxpr, wanted, given)

    def read(var):
        return var.val if isinstance(var, Literal) else env[var]

    def peek(var):
        return var.val if isinstance(var, Literal) else env.get(var)

    def write(var, value):
        if isinstance(var, DropVar):
            return
        env[var] = on_write(var, value) if on_write is not None else value

    for var, value in zip(jaxpr.constvars, consts):
        write(var, value)
    for var, value in zip(jaxpr.invars, args):
        write(var, value)
    for index, eqn in enumerate(jaxpr.eqns):
        if live is not None and index not in live:
            continue
        invals = [peek(var) if index in given else read(var) for var in eqn.invars]
        outvals = override(index, eqn, invals) if override is not None else None
        if outvals is None:
            outvals = eval_equation(eqn, invals)
        for var, value in zip(eqn.outvars, outvals):
            write(var, value)
    return [read(var) if live is None else peek(var) for var in jaxpr.outvars]


def live_equations(jaxpr: Jaxpr, wanted: Collection[Any], given: Collection[int] = ()) -> set[int]:
    """The indices of the equations of ``jaxpr`` that the variables ``wanted`` depend
    on; a ``given`` equation's inputs are not followed (its outputs come from elsewhere)."""
    needed = {var for var in wanted if not isinstance(var, Literal)}
    live = set()
    for index in range(len(jaxpr.eqns) - 1, -1, -1):
        eqn = jaxpr.eqns[index]
        if any(var in needed for var in eqn.outvars if not isinstance(var, DropVar)):
            live.add(index)
            if index not in given:
                needed.update(var for var in eqn.invars if not isinstance(var, Literal))
    return live


# Equations that only reshape, cast or broadcast their one operand: an output made by a
# chain of them from a literal is that literal at every entry.
_FILL_PRESERVING = ("broadcast_in_dim", "convert_element_type", "reshape", "squeeze", "expand_dims", "copy", "copy_p")


def step_invariant_outputs(closed: ClosedJaxpr) -> list[tuple[bool, Any]]:
    """Per output of ``closed``: whether it depends on none of its inputs (its value is
    then fixed by the closed-over constants alone) and, if it is a literal broadcast
    (``jnp.zeros``, ``jnp.ones``, a forward-mode tangent that is one or zero at every
    entry), that literal, else ``None``. An equation counts as reading every input it
    is given (nested jaxprs are not looked into): a conservative answer."""
    jaxpr = closed.jaxpr
    varying = {id(v) for v in jaxpr.invars}
    producer = {}
    for eqn in jaxpr.eqns:
        reads = any(isinstance(v, Var) and id(v) in varying for v in eqn.invars)
        for out in eqn.outvars:
            producer[id(out)] = eqn
            if reads:
                varying.add(id(out))

    def literal(var):
        while not isinstance(var, Literal):
            eqn = producer.get(id(var))
            if eqn is None or eqn.primitive.name not in _FILL_PRESERVING or len(eqn.invars) != 1:
                return None
            var = eqn.invars[0]
        return var.val

    found = []
    for var in jaxpr.outvars:
        if isinstance(var, Literal):
            found.append((True, var.val))
        else:
            fixed = id(var) not in varying
            found.append((fixed, literal(var) if fixed else None))
    return found


#: Equations that only lay a value out anew (its numbers unchanged or converted alike):
#: two of them with the same parameters on the same input make the same value.
_LAYOUT_ONLY = frozenset(_FILL_PRESERVING) | {"transpose"}


def equal_outputs(closed: ClosedJaxpr) -> list[int]:
    """Per output of ``closed``, the first output with the same value: the same
    variable, or one made from the same variable by the same chain of layout-only
    equations (``reshape``, ``squeeze``, ``convert_element_type``, ...; the same
    primitive and parameters). Literals count as different from everything."""
    canonical: dict[int, int] = {}
    made: dict[Any, int] = {}

    def key_of(var):
        return canonical.get(id(var), id(var))

    for eqn in closed.jaxpr.eqns:
        if eqn.primitive.name not in _LAYOUT_ONLY or len(eqn.outvars) != 1 or any(
                isinstance(v, Literal) for v in eqn.invars):
            continue
        key = (eqn.primitive.name, tuple(sorted(eqn.params.items())), tuple(key_of(v) for v in eqn.invars))
        try:
            first = made.setdefault(key, id(eqn.outvars[0]))
        except TypeError:  # a parameter that cannot be hashed: not compared
            continue
        canonical[id(eqn.outvars[0])] = first
    firsts: dict[Any, int] = {}
    return [firsts.setdefault(("literal", i) if isinstance(v, Literal) else key_of(v), i)
            for i, v in enumerate(closed.jaxpr.outvars)]


def per_unit_bodies(eqn: JaxprEqn) -> list[Jaxpr] | None:
    """The inner jaxprs of a control-flow equation that acts on each unit alone when
    every equation in them does: ``cond``'s branches (the branch index is an integer:
    no derivative flows through it), ``while``'s condition and body, the body of a
    ``scan`` that stacks no output and scans over scalars only, if any (``fori_loop``,
    a neuron's sub-steps with a weight per sub-step: slices with axes could run over
    the units), a
    ``checkpoint`` (``remat``)'s body. ``None`` for any other equation."""
    name, params = eqn.primitive.name, eqn.params
    if name == "cond":
        return [branch.jaxpr for branch in params["branches"]]
    if name == "while":
        return [params["cond_jaxpr"].jaxpr, params["body_jaxpr"].jaxpr]
    if name == "scan":
        body = params["jaxpr"].jaxpr
        scanned = body.invars[params["num_consts"] + params["num_carry"]:]
        if len(eqn.outvars) != params["num_carry"] or any(var.aval.shape for var in scanned):
            return None  # stacked outputs, or slices that could run over the units
        return [body]
    if name in ("remat2", "checkpoint", "remat"):
        inner = params["jaxpr"]
        return [inner.jaxpr if isinstance(inner, ClosedJaxpr) else inner]
    return None


def control_flow_operands(eqn: JaxprEqn, inner: Jaxpr) -> list[Any] | None:
    """The outer operands bound to ``inner``'s inputs for a control-flow equation
    (``scan``, ``cond``, ``while``), or ``None`` when the mapping is unknown."""
    name = eqn.primitive.name
    if name == "cond":
        operands = list(eqn.invars[1:])
    elif name == "while":
        cond_consts = eqn.params["cond_nconsts"]
        body_consts = eqn.params["body_nconsts"]
        if inner is eqn.params["cond_jaxpr"].jaxpr:
            operands = list(eqn.invars[:cond_consts]) + list(eqn.invars[cond_consts + body_consts :])
        else:
            operands = list(eqn.invars[cond_consts:])
    else:
        operands = list(eqn.invars)
    return operands if len(operands) == len(inner.invars) else None


# ------------------------------------------------- values computed again from others
#: Primitives each of whose output entries reads only the matching entries of its
#: operands (or lays them out anew): cheap to compute again wherever their operands are.
_ELEMENTWISE = frozenset({
    "abs", "acos", "acosh", "add", "add_any", "and", "asin", "asinh", "atan", "atan2", "atanh", "broadcast_in_dim",
    "cbrt", "ceil", "clamp", "convert_element_type", "copy", "copy_p", "cos", "cosh", "div", "eq", "erf", "erf_inv",
    "erfc", "exp", "exp2", "expand_dims", "expm1", "floor", "ge", "gt", "integer_pow", "is_finite", "le", "log",
    "log1p", "logistic", "lt", "max", "min", "mul", "ne", "neg", "nextafter", "not", "or", "pow", "reduce_precision",
    "rem", "reshape", "round", "rsqrt", "select_n", "sign", "sin", "sinh", "sqrt", "square", "squeeze", "stop_gradient",
    "sub", "tan", "tanh", "transpose", "xor",
})
_CALLS = {"custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr",
          **{name: "jaxpr" for name in _NESTED_JIT}}


def _elementwise(eqn: JaxprEqn) -> bool:
    """Whether ``eqn`` is elementwise (:data:`_ELEMENTWISE`), or calls a jaxpr (a nested
    jit such as ``jnp.where``'s, a ``custom_jvp`` function such as a spike's) of such
    equations only."""
    name = eqn.primitive.name
    if name in _ELEMENTWISE:
        return len(eqn.outvars) == 1
    inner = eqn.params.get(_CALLS.get(name, ""))
    if inner is None or eqn.params.get("num_consts"):
        return False
    inner = inner.jaxpr if isinstance(inner, ClosedJaxpr) else inner
    return all(_elementwise(e) for e in inner.eqns)


def _size(var: Any) -> int:
    return int(var.aval.size) * var.aval.dtype.itemsize


def recomputed_outputs(closed: ClosedJaxpr, candidates: Collection[int]) -> tuple[list[int], list[Any]]:
    """Which of the outputs ``candidates`` of ``closed`` to compute again from fewer
    bytes: ``(outputs, sources)``, where every chosen output is a chain of elementwise
    equations (:func:`_elementwise`) of the variables ``sources`` (inputs of ``closed``
    or outputs of other equations) and of its constants, and the sources take less
    than half the outputs' bytes. A loop that stacks its outputs for a later loop can
    then stack the sources instead and let the later loop compute the outputs again (a
    neuron's Jacobian entries from its few states). Chosen by pruning, in each group of
    candidates linked by shared sources (a hidden group's): start from all of them and
    drop, while the score rises, the one whose leaving raises it most, the score being
    the outputs' bytes less twice the sources': computing an output again costs
    about as much as stacking a value more (D-RTRL on the GRU, whose five ``D`` and
    ``Df`` slabs are gate functions of four pre-activations: 1.23x slower a sequence
    recomputed, 2026-11-27). ``([], [])`` when nothing scores above zero."""
    jaxpr = closed.jaxpr
    consts = set(jaxpr.constvars)
    sources_of: dict[Any, frozenset] = {}

    def sources(var):
        if isinstance(var, Literal) or var in consts:
            return frozenset()
        return sources_of.get(var, frozenset([var]))

    for eqn in jaxpr.eqns:
        if _elementwise(eqn):
            sources_of[eqn.outvars[0]] = frozenset().union(*map(sources, eqn.invars))
    found = {i: sources(jaxpr.outvars[i]) for i in candidates if not isinstance(jaxpr.outvars[i], Literal)}
    found = {i: used for i, used in found.items() if jaxpr.outvars[i] not in used}  # not a source of its own

    def score(outputs):
        used = frozenset().union(*(found[i] for i in outputs))
        return sum(_size(jaxpr.outvars[i]) for i in outputs) - 2 * sum(map(_size, used))

    chosen = set()
    for group in _sharing(found):  # outputs that share no source are chosen apart (one hidden group's)
        while group:
            best = max(group, key=lambda i: score(group - {i}))
            if score(group - {best}) <= score(group):
                break
            group.remove(best)
        if group and score(group) > 0:
            chosen |= group
    if not chosen:
        return [], []
    used = frozenset().union(*(found[i] for i in chosen))
    order = {var: n for n, var in enumerate([*jaxpr.invars, *(v for e in jaxpr.eqns for v in e.outvars)])}
    return sorted(chosen), sorted(used, key=order.__getitem__)


def _sharing(found: dict) -> list[set]:
    """The keys of ``found`` (each with a set of sources) in groups linked by shared
    sources."""
    groups: list[tuple[set, set]] = []
    for key, used in found.items():
        linked = [g for g in groups if g[1] & used]
        keys, sources = {key}, set(used)
        for g in linked:
            keys |= g[0]
            sources |= g[1]
            groups.remove(g)
        groups.append((keys, sources))
    return [keys for keys, _ in groups]


def with_outputs(closed: ClosedJaxpr, extra: list[Any]) -> ClosedJaxpr:
    """``closed`` with the variables ``extra`` as more outputs after its own."""
    return ClosedJaxpr(closed.jaxpr.replace(outvars=[*closed.jaxpr.outvars, *extra]), closed.consts)


def derivation(closed: ClosedJaxpr, outputs: list[int], sources: list[Any]) -> ClosedJaxpr:
    """The outputs ``outputs`` of ``closed`` as a function of ``sources`` (from
    :func:`recomputed_outputs`): its equations between them, its constants closed over."""
    jaxpr = closed.jaxpr
    wanted = [jaxpr.outvars[i] for i in outputs]
    needed, given, live = set(wanted), set(sources), []
    for eqn in reversed(jaxpr.eqns):
        if any(var in needed and var not in given for var in eqn.outvars):
            live.append(eqn)
            needed.update(var for var in eqn.invars if not isinstance(var, Literal))
    # One equation per value: the step computes some of these more than once (a
    # forward-mode pass per state evaluates the neuron's transition again each time),
    # which this jaxpr need not, and JAX traces and lowers it at every use.
    seen, renamed, kept = {}, {}, []
    for eqn in live[::-1]:
        invars = [renamed.get(v, v) if isinstance(v, Var) else v for v in eqn.invars]
        try:
            key = (eqn.primitive, tuple(sorted(eqn.params.items())),
                   tuple(("literal", v.val.item() if hasattr(v.val, "item") else v.val, str(v.aval))
                         if isinstance(v, Literal) else id(v) for v in invars))
            hash(key)
        except (TypeError, ValueError):  # an unhashable parameter or literal: kept as is
            key = None
        if key is not None and key in seen and len(eqn.outvars) == len(seen[key].outvars):
            renamed.update(zip(eqn.outvars, seen[key].outvars))
            continue
        eqn = eqn.replace(invars=invars)
        if key is not None:
            seen[key] = eqn
        kept.append(eqn)
    wanted = [renamed.get(v, v) if isinstance(v, Var) else v for v in wanted]
    return ClosedJaxpr(jaxpr.replace(invars=list(sources), outvars=wanted, eqns=kept), closed.consts)

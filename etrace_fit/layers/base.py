"""What every layer needs besides its ETP ops, and the base for neurons users write.

:class:`Neuron` registers hidden states (``self.hidden("V", init=0.0)``) so a neuron
needs no ``init_state`` / ``reset_state`` of its own; :func:`time_constant`,
:func:`decay`, :func:`parameter` and :func:`read` make per-unit constants that may be
learned (through the elementwise ETP op, so the compiler traces them). The rest are
shape checks and parameter creation shared by the built-in layers. Read ``linear.py``
next for the simplest layer, ``spiking.py`` for neurons built on :class:`Neuron`.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import saiunit as u
from brainstate.nn.init import Initializer as _Initializer

from .. import _compat
from ..errors import ConfigError, ShapeError

__all__ = ["Constrained", "Decay", "MinTimeConstant", "TAU_MIN_STEPS", "Neuron", "SpikingLayer", "check_last_axis",
           "decay", "describe", "get_dt", "make_param", "make_state", "parameter", "read", "time_constant"]

Initializer = Callable[..., Any] | Any


def describe(layer: Any) -> str:
    """A short name for messages: ``LIF(size=100)`` or the module's given name."""
    name = getattr(layer, "name", None)
    summary = getattr(layer, "_summary", None)
    base = f"{type(layer).__name__}({summary})" if summary else type(layer).__name__
    return f"{base} '{name}'" if name else base


def get_dt(layer: Any) -> Any:
    """The simulation time step from ``brainstate.environ``, or a clear error."""
    try:
        return brainstate.environ.get_dt()
    except KeyError:
        raise ConfigError(
            f"{describe(layer)} needs the time step dt, and none is set. Set it with "
            f"brainstate.environ.set(dt=1.0) (or `with brainstate.environ.context(dt=1.0):`); "
            f"time constants are in the unit of dt."
        ) from None


def check_last_axis(layer: Any, x: Any, expected: int, what: str = "features") -> None:
    """Raise :class:`ShapeError` unless ``x.shape[-1] == expected``."""
    shape = tuple(jnp.shape(x))
    if len(shape) == 0 or shape[-1] != expected:
        raise ShapeError(
            f"{describe(layer)}: expected input with {expected} {what} on the last axis, "
            f"got x.shape={shape}"
        )


def make_param(initializer: Initializer, shape: Sequence[int], what: str, layer: Any) -> jax.Array:
    """A parameter array of ``shape`` in the environment's float dtype.

    ``initializer`` is a ``brainstate.nn.init`` initializer, a callable of the shape,
    or an array that broadcasts to ``shape``. One of brainstate's own initializers runs
    as one compiled program per kind, settings and shape (:func:`_compiled_initializer`),
    with the random state it would leave run op by op and its values to float rounding;
    ``ZeroInit()`` and ``Constant(number)`` are filled on the host, and so is an array
    (:func:`_constant_on_host`): no program is compiled for them.
    """
    shape = tuple(shape)
    constant = _constant_on_host(initializer, shape, brainstate.environ.dftype())
    if constant is not None:
        return constant
    compiled = _compiled_initializer(initializer, shape) if callable(initializer) else None
    try:
        if compiled is not None:
            return compiled()
        if callable(initializer):
            return _as_param(brainstate.nn.init.param(initializer, shape, allow_none=False), shape)
        return _as_param(initializer, shape)
    except _NotBroadcastable as error:
        raise ShapeError(f"{describe(layer)}: {what} must have (or broadcast to) shape {shape}, "
                         f"got shape {error.args[0]}") from None


class _NotBroadcastable(ValueError):
    """An initial value whose shape (the argument) does not broadcast to the parameter's."""


def _as_param(value: Any, shape: tuple) -> Any:
    """``value``'s mantissa broadcast to ``shape`` in the environment's float dtype, with
    its unit (none when unitless)."""
    try:
        mantissa = filled(u.get_mantissa(value), shape, brainstate.environ.dftype())
    except ValueError:
        raise _NotBroadcastable(jnp.shape(u.get_mantissa(value))) from None
    unit = u.get_unit(value) if isinstance(value, u.Quantity) else None
    return mantissa if unit is None or unit.is_unitless else u.Quantity(mantissa, unit=unit)


def filled(value: Any, shape: tuple, dtype: Any) -> jax.Array:
    """``value`` broadcast to ``shape`` as ``dtype``, made on the host with NumPy and put
    on the device when it is concrete and NumPy knows the dtype: run by JAX op by op
    outside a jit, each broadcast, cast or fill compiles a program of its own per shape
    and dtype (30–40 ms on CPU; the demo's model took 14 of them between its
    construction and its first step, 2026-11-27). A tracer stays with JAX. Raises
    ``ValueError`` when ``value`` does not broadcast to ``shape``."""
    if not _compat.is_tracer(value):
        try:
            dtype = np.dtype(dtype)
        except TypeError:  # a dtype NumPy does not know (a random key's)
            pass
        else:
            return jax.device_put(np.broadcast_to(np.asarray(value), shape).astype(dtype))
    return jnp.broadcast_to(jnp.asarray(value), shape).astype(dtype)


def _constant_on_host(initializer: Any, shape: tuple, dtype: Any) -> jax.Array | None:
    """The values of brainstate's ``ZeroInit()`` or ``Constant(number)`` (unitless) at
    ``shape``, :func:`filled` on the host, or None for any other initializer."""
    kind = type(initializer)
    if kind is brainstate.nn.init.ZeroInit and u.get_unit(initializer.unit).is_unitless:
        value = 0
    elif kind is brainstate.nn.init.Constant and isinstance(initializer.value, (int, float)) \
            and not isinstance(initializer.value, bool):
        value = initializer.value
    else:
        return None
    return filled(value, shape, dtype)


# (initializer kind, settings, random state, shape, float dtype) → the compiled initializer
_COMPILED_INITIALIZERS: dict = {}
_MAX_COMPILED_INITIALIZERS = 256


def _compiled_initializer(initializer: Any, shape: tuple) -> Callable[[], Any] | None:
    """``make_param``'s work for ``initializer`` and ``shape`` as one compiled program
    (``brainstate.transform.jit``: the random state is read and advanced as run op by
    op, so the values are the same but for rounding where the program fuses a multiply
    and an add), or None for an initializer that is not one of
    brainstate's own (a user's may draw from NumPy, which a compiled program would
    draw once) or whose settings are not hashable. Run op by op, each of an
    initializer's operations compiles a program of its own on its first shape:
    ``KaimingNormal``'s truncated normal ~24 (1 s), the demo model's construction 43
    programs in 1.8 s; compiled, 15 in 1.1 s (2026-11-27)."""
    if not isinstance(initializer, _Initializer) or type(initializer).__module__.split(".")[0] != "brainstate":
        return None
    settings = tuple(sorted((name, type(value), value) for name, value in vars(initializer).items() if name != "rng"))
    key = (type(initializer), settings, id(getattr(initializer, "rng", None)), shape,
           str(brainstate.environ.dftype()))
    try:
        found = _COMPILED_INITIALIZERS.get(key)
    except TypeError:  # a setting that is not hashable (an array)
        return None
    if found is None:
        if len(_COMPILED_INITIALIZERS) >= _MAX_COMPILED_INITIALIZERS:
            _COMPILED_INITIALIZERS.pop(next(iter(_COMPILED_INITIALIZERS)))
        # the entry keeps the initializer, and so its random state, alive: the id in
        # the key stays its own
        found = _COMPILED_INITIALIZERS[key] = brainstate.transform.jit(
            lambda: _as_param(brainstate.nn.init.param(initializer, shape, allow_none=False), shape))
    return found


def make_state(initializer: Initializer, size: Sequence[int], batch_size: int | None) -> jax.Array:
    """A hidden-state value of shape ``(batch_size, *size)`` (``size`` when unbatched)."""
    shape = tuple(size) if batch_size is None else (batch_size, *size)
    constant = _constant_on_host(initializer, shape, brainstate.environ.dftype())
    if constant is not None:
        return constant
    value = brainstate.nn.init.param(initializer, tuple(size), batch_size)
    return jnp.asarray(value, dtype=brainstate.environ.dftype())


class Decay:
    """``exp(-dt / tau)``: the per-step decay of a leaky variable with time constant tau.

    A hashable value (compared by dt's value and unit), so the elementwise ETP op that
    learns ``tau`` gets a fn that jit can cache on. ``dt`` and ``tau`` may be saiunit
    quantities of the same dimension.
    """

    def __init__(self, dt: Any):
        self.dt = dt
        try:
            self._key = (float(jnp.asarray(u.get_mantissa(dt))), u.get_unit(dt))
        except jax.errors.ConcretizationTypeError:
            # dt traced by an enclosing transformation: only equal to itself.
            self._key = (id(dt), u.get_unit(dt))

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Decay) and self._key == other._key

    def __hash__(self) -> int:
        return hash((Decay, self._key))

    def __repr__(self) -> str:
        return f"Decay(dt={self.dt})"

    def __call__(self, tau: Any) -> jax.Array:
        ratio = self.dt / tau
        if not u.get_unit(ratio).is_unitless:
            # the value, not the word "tau": ALIF's tau_a without a unit beside tau in ms was reported as tau
            mantissa = u.get_mantissa(tau)
            if isinstance(mantissa, jax.core.Tracer):  # learned: traced
                shown = f"of unit {u.get_unit(tau)}"
            else:
                values = np.unique(np.asarray(mantissa))
                shown = (f"{values[0]:g}" if values.size == 1 else f"{values.tolist()}") + (
                    f" {u.get_unit(tau)}" if not u.get_unit(tau).is_unitless else " (a plain number)")
            raise ConfigError(f"dt ({self.dt}) and the time constant {shown} must be in the same unit (give every "
                              f"time constant in dt's unit, or all as plain numbers of steps)")
        return jnp.exp(-u.get_mantissa(ratio))


def check_trailing_shape(layer: Any, x: Any, expected: tuple[int, ...]) -> None:
    """Raise :class:`ShapeError` unless ``x``'s trailing axes are ``expected`` and it has
    at most one axis more (the batch): a layer of a state ``(B, *expected)`` fed ``(B, L,
    C)`` after a conv broadcast its state to the input and failed in JAX, naming no layer."""
    shape = tuple(jnp.shape(x))
    if len(shape) > len(expected) + 1:
        units = ", ".join(map(str, expected))
        raise ShapeError(f"{describe(layer)}: expected input (batch, {units}) or ({units}), got x.shape={shape}: more "
                         f"axes than a batch and the layer's units ({units},); a layer after a convolution needs the "
                         f"positions in its size too, e.g. {type(layer).__name__}({shape[1:]})")
    if len(expected) == 1:
        check_last_axis(layer, x, expected[0])
        return
    if shape[len(shape) - len(expected):] != tuple(expected) or len(shape) < len(expected):
        raise ShapeError(f"{describe(layer)}: expected input of shape (..., {', '.join(map(str, expected))}), got x.shape={shape}")


class Constrained(brainstate.ParamState):
    """A weight with a constraint, Keras' sense: ``constraint(value) -> value`` projects
    it back after every optimizer update (the Trainer's step, ``update_every`` inside
    the sequence, ``ef.online_fit``); gradients are not changed. A layer of your own
    declares one by holding its weight as ``Constrained(value, constraint=fn)``; ``fn``
    runs inside the jitted step on the weight's value (its structure, its unit)."""

    def __init__(self, value: Any, constraint: Callable[[Any], Any], **kwargs: Any):
        super().__init__(value, **kwargs)
        if not callable(constraint):
            raise ConfigError(f"Constrained: constraint must be callable (value -> value), got {constraint!r}")
        self.constraint = constraint


class EntryConstraints:
    """The constraint of a layer's ``{"weight": W, "bias": b}`` state: each entry's own
    (Keras' ``kernel_constraint`` and ``bias_constraint``); the weight's sees ``W ⊙ mask``
    when the layer has a mask, so a norm counts the connections present only."""

    def __init__(self, constraints: dict[str, Callable[[Any], Any]], mask: Any = None):
        self.constraints, self.mask = constraints, mask

    def __call__(self, params: dict) -> dict:
        out = dict(params)
        for key, constraint in self.constraints.items():
            value = params[key]
            if key == "weight" and self.mask is not None:
                value = value * jnp.asarray(self.mask, value.dtype)
            out[key] = constraint(value)
        return out

    def __repr__(self) -> str:
        return ", ".join(f"{key}: {constraint!r}" for key, constraint in self.constraints.items())


class RowBlocks:
    """A constraint per block of rows of a weight ``(rows, out)`` (``None``: the block as
    it is): Keras' ``kernel_constraint`` on a gate's input rows and
    ``recurrent_constraint`` on its state rows, for a weight on ``[x, h]``."""

    def __init__(self, blocks: tuple[tuple[int, int, Callable[[Any], Any] | None], ...]):
        self.blocks = blocks

    def __call__(self, w: Any) -> Any:
        return jnp.concatenate([w[start:stop] if constraint is None else constraint(w[start:stop])
                                for start, stop, constraint in self.blocks], axis=0)

    def __repr__(self) -> str:
        return "RowBlocks(" + ", ".join(f"rows {a}:{b}: {c!r}" for a, b, c in self.blocks if c is not None) + ")"

    @classmethod
    def of(cls, sized: Sequence[tuple[int, Callable[[Any], Any] | None]]) -> Callable[[Any], Any] | None:
        """The constraint of a weight whose rows come in blocks of the given sizes, each
        with its constraint (or ``None``): ``None`` when no block has one, the one
        constraint when there is a single block, else a :class:`RowBlocks`."""
        if all(constraint is None for _, constraint in sized):
            return None
        if len(sized) == 1:
            return sized[0][1]
        starts = np.cumsum([0] + [size for size, _ in sized])
        return cls(tuple((int(a), int(b), c) for a, b, (_, c) in zip(starts[:-1], starts[1:], sized)))


def weight_state(layer: Any, params: dict, w_constraint: Any = None, b_constraint: Any = None,
                 mask: Any = None) -> brainstate.ParamState:
    """A layer's ``{"weight", "bias"}`` as one ``ParamState``: a :class:`Constrained` one
    when ``w_constraint`` or ``b_constraint`` is given (:func:`etrace_fit.constraints.get`:
    an instance, a Keras name or a function), projected after every update."""
    from .. import constraints

    chosen = {key: constraints.get(value, argument, describe(layer))
              for key, argument, value in (("weight", "w_constraint", w_constraint),
                                           ("bias", "b_constraint", b_constraint))}
    chosen = {key: fn for key, fn in chosen.items() if fn is not None}
    if "bias" in chosen and "bias" not in params:
        raise ConfigError(f"{describe(layer)}: b_constraint={b_constraint!r} given, but the layer has no bias "
                          f"(with_bias=False)")
    if not chosen:
        return brainstate.ParamState(params)
    return Constrained(params, constraint=EntryConstraints(chosen, mask))


#: A learned time constant is kept at or above this many steps (``dt`` times it): a
#: gradient step had taken a LIF's τ from 2 to -7.9, a decay of 1.13 a step (the loss
#: 230 -> 1011, no warning). At τ = dt/10 the decay is e^-10: no memory, and no
#: gradient to move it on.
TAU_MIN_STEPS = 0.1


class MinTimeConstant:
    """The constraint of a learned time constant: ``τ ← max(τ, TAU_MIN_STEPS · dt)``,
    ``dt`` read from ``brainstate.environ`` where it runs (in the step)."""

    def __call__(self, tau: Any) -> Any:
        floor = TAU_MIN_STEPS * brainstate.environ.get_dt()
        if isinstance(tau, u.Quantity) or isinstance(floor, u.Quantity):
            floor = u.Quantity(floor).to(u.get_unit(tau)) if isinstance(tau, u.Quantity) else u.get_mantissa(floor)
            mantissa = jnp.maximum(u.get_mantissa(tau), jnp.asarray(u.get_mantissa(floor), u.get_mantissa(tau).dtype))
            return u.Quantity(mantissa, unit=u.get_unit(tau)) if isinstance(tau, u.Quantity) else mantissa
        return jnp.maximum(tau, jnp.asarray(floor, jnp.asarray(tau).dtype))

    def __repr__(self) -> str:
        return f"MinTimeConstant(τ ≥ {TAU_MIN_STEPS:g} dt)"


def time_constant(layer: Any, tau: Any, size: int | tuple[int, ...], learn: bool, what: str = "tau") -> Any:
    """A time constant broadcast to the layer's unit shape: a :class:`Constrained`
    ``ParamState`` when learned, kept at ``τ ≥ TAU_MIN_STEPS · dt`` after every update.

    Validates ``tau > 0``. A learned time constant is read through the elementwise ETP
    op by :func:`decay_of`, so the compiler relates it to the layer's hidden group.
    """
    # Checked on the host: eager jnp ops compile a program per op and shape (filled).
    mantissa = np.asarray(u.get_mantissa(tau))
    shape = (size,) if isinstance(size, int) else tuple(size)
    try:
        mantissa = np.broadcast_to(mantissa, shape)
    except ValueError:
        raise ShapeError(f"{describe(layer)}: {what} must be a scalar or have shape {shape}, got shape {mantissa.shape}") from None
    if mantissa.dtype.kind not in "iuf" or not np.all(np.isfinite(mantissa)) or not np.all(mantissa > 0):
        raise ConfigError(f"{describe(layer)}: {what} must be a positive finite number (or one per unit), got {tau!r}")
    unit = u.get_unit(tau) if isinstance(tau, u.Quantity) else None  # (get_unit makes a list a jax array)
    value = filled(mantissa, shape, brainstate.environ.dftype())
    value = value if unit is None or unit.is_unitless else u.Quantity(value, unit=unit)
    return Constrained(value, constraint=MinTimeConstant()) if learn else value


def decay(layer: Any, tau: Any) -> jax.Array:
    """``exp(-dt / tau)`` per unit; through ``etp_elemwise_p`` when ``tau`` is learned
    (a ``ParamState`` from :func:`time_constant`), so the compiler traces it."""
    from .. import ops

    decay = Decay(get_dt(layer))
    try:
        if isinstance(tau, brainstate.ParamState):
            return ops.elementwise(tau.value, fn=decay)
        return decay(tau)
    except ConfigError as error:
        raise ConfigError(f"{describe(layer)}: {error}") from None


def parameter(layer: Any, value: Any, size: int | tuple[int, ...], learn: bool, what: str) -> Any:
    """A per-unit constant broadcast to ``size`` (a threshold, a gain, ...): a
    ``ParamState`` when ``learn``, else the array. Read it with :func:`read`."""
    shape = (size,) if isinstance(size, int) else tuple(size)
    return brainstate.ParamState(make_param(value, shape, what, layer)) if learn else make_param(value, shape, what, layer)


def training() -> bool:
    """Whether the layer is being traced for training: ``brainstate.environ``'s ``fit``
    flag, which the compiler sets while it traces the training step and evaluation
    clears (unset: evaluation). ``Dropout`` and ``BatchNorm`` read it."""
    return bool(brainstate.environ.get("fit", False))


def read(value: Any) -> Any:
    """The value of a :func:`parameter` or :func:`time_constant`: a learned one through
    the elementwise ETP op (so online rules trace it), a fixed one as it is."""
    from .. import ops

    return ops.elementwise(value.value) if isinstance(value, brainstate.ParamState) else value


@runtime_checkable
class SpikingLayer(Protocol):
    """A layer whose ``spikes()`` returns the last step's spikes ``(B, *size)`` (0 / 1,
    no gradient): what ``Trainer.record_spikes`` and the TensorBoard rasters read. A
    ``FiringRateRegularizer`` calls ``spikes(gradient=True)``: the same spikes with the
    surrogate gradient of the layer's output."""

    def spikes(self, gradient: bool = False) -> jax.Array: ...


class Neuron(brainstate.nn.Module):
    """Base class for a layer of neurons: hidden states by name, a size, and checks.

    Subclass it, call ``super().__init__(size)``, declare each hidden state with
    :meth:`hidden` and write one time step in ``update(x)``. States are created by
    ``brainstate.nn.init_all_states(model, batch_size=B)`` with shape ``(B, *size)``
    and reset by ``reset_all_states``; a floating-point state is traced by the online
    rules, an integer or boolean one (a refractory counter) is carried without a trace.

    Example::

        class QIF(ef.layers.Neuron):
            def __init__(self, n, tau=10.0, learn_tau=True):
                super().__init__(n)
                self.tau = ef.layers.time_constant(self, tau, n, learn=learn_tau)
                self.hidden("V", init=0.0)
            def update(self, x):
                a = ef.layers.decay(self, self.tau)
                self.V.value = a * self.V.value + 0.1 * self.V.value ** 2 + x
                return self.V.value
    """

    def __init__(self, size: int | Sequence[int], name: str | None = None):
        super().__init__(name=name)
        cls = type(self)
        if not any("update" in vars(k) for k in cls.__mro__ if issubclass(k, Neuron) and k is not Neuron):
            raise TypeError(f"{cls.__name__} subclasses Neuron but defines no update(x): one time step of the neuron")
        shape = tuple(size) if isinstance(size, (tuple, list)) else (size,)
        if not shape or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in shape):
            raise ConfigError(f"{cls.__name__}: size must be a positive int or a tuple of them, got {size!r}")
        self.size, self.shape = size, shape
        self.in_size = self.out_size = shape
        self._summary = f"{size}"
        self._hidden_specs: dict[str, tuple[Any, Any]] = {}

    def hidden(self, name: str, init: Any = 0.0, dtype: Any = None) -> None:
        """Declare the hidden state ``self.<name>`` of shape ``(B, *size)``.

        Args:
            name: the attribute name (``"V"``); a ``brainstate.HiddenState`` after
                ``init_all_states``.
            init: a number or array broadcast to ``size``, or a ``brainstate.nn.init``
                initializer; used at every (re)set.
            dtype: the state's dtype: the environment's float dtype by default;
                ``jnp.int32`` or ``bool`` for a counter or a flag (carried, no trace).
        """
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(f"{describe(self)}: hidden state name must be an identifier, got {name!r}")
        if name in self._hidden_specs or hasattr(self, name):
            raise ConfigError(f"{describe(self)}: '{name}' is already an attribute or a hidden state of this neuron")
        if not callable(init):
            try:
                np.broadcast_to(np.asarray(u.get_mantissa(init)), self.shape)
            except ValueError:
                raise ShapeError(f"{describe(self)}: init of hidden state '{name}' must broadcast to {self.shape}, "
                                 f"got shape {jnp.shape(init)}") from None
        self._hidden_specs[name] = (init, dtype)

    def _hidden_value(self, init: Any, dtype: Any, batch_size: int | None) -> jax.Array:
        dtype = brainstate.environ.dftype() if dtype is None else dtype
        shape = self.shape if batch_size is None else (batch_size, *self.shape)
        if callable(init):
            constant = _constant_on_host(init, shape, dtype)
            if constant is not None:
                return constant
            return jnp.asarray(brainstate.nn.init.param(init, self.shape, batch_size), dtype=dtype)
        return filled(u.get_mantissa(init), shape, dtype)

    def init_state(self, batch_size: int | None = None, **kwargs) -> None:
        for name, (init, dtype) in self._hidden_specs.items():
            setattr(self, name, brainstate.HiddenState(self._hidden_value(init, dtype, batch_size)))

    def reset_state(self, batch_size: int | None = None, **kwargs) -> None:
        for name, (init, dtype) in self._hidden_specs.items():
            getattr(self, name).value = self._hidden_value(init, dtype, batch_size)

"""Rate-based recurrent cells: :class:`VanillaRNNCell`, :class:`GRUCell`, :class:`LSTMCell`.

Every gate has its own :class:`~etrace_fit.layers.Linear` (no fused gate matrix), so
each weight's output has the shape of the hidden state it drives and the compiler can
relate it per unit. One call is one time step. Every cell takes Keras' three constraints
(:mod:`etrace_fit.constraints`), each gate's weight projected on its own after every
update: ``w_constraint`` (Keras' ``kernel_constraint``) on the rows that read the input,
``recurrent_constraint`` on the rows that read the state, ``b_constraint`` on the biases.
"""

from __future__ import annotations

from typing import Any, Callable

import brainstate
import jax
import jax.numpy as jnp
import numpy as np

from .. import constraints
from ..errors import ConfigError
from .base import RowBlocks, check_last_axis, describe, make_state
from .linear import Linear

__all__ = ["GRUCell", "LSTMCell", "MGUCell", "MinGRUCell", "MinLSTMCell", "MinimalRNNCell", "URLSTMCell",
           "VanillaRNNCell"]

_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "tanh": jnp.tanh,
    "relu": jax.nn.relu,
    "sigmoid": jax.nn.sigmoid,
    "identity": lambda v: v,
}


def _activation(name_or_fn: str | Callable, layer: str) -> Callable[[jax.Array], jax.Array]:
    if callable(name_or_fn):
        return name_or_fn
    if name_or_fn not in _ACTIVATIONS:
        raise ConfigError(f"{layer}: unknown activation {name_or_fn!r}; valid: {', '.join(_ACTIVATIONS)}")
    return _ACTIVATIONS[name_or_fn]


class _Cell(brainstate.nn.Module):
    """Shared set-up: sizes, the state initializer, and the input check."""

    _hidden_names: tuple[str, ...] = ("h",)

    #: Whether the cell has weights on its state (``recurrent_constraint`` applies to them).
    _recurrent_rows = True

    def __init__(self, in_size: int, hidden_size: int, state_init: Any, name: str | None, w_constraint: Any = None,
                 b_constraint: Any = None, recurrent_constraint: Any = None):
        super().__init__(name=name)
        for arg, value in (("in_size", in_size), ("hidden_size", hidden_size)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{type(self).__name__}: {arg} must be a positive int, got {value!r}")
        in_size, hidden_size = int(in_size), int(hidden_size)  # numpy ints as Python ones
        self.in_features, self.hidden_size = in_size, hidden_size
        self.in_size, self.out_size = (in_size,), (hidden_size,)
        self._summary = f"{in_size}, {hidden_size}"
        self._state_init = brainstate.nn.init.ZeroInit() if state_init is None else state_init
        self._constraints = {kind: constraints.get(value, argument, describe(self)) for kind, argument, value in (
            ("input", "w_constraint", w_constraint), ("recurrent", "recurrent_constraint", recurrent_constraint),
            ("bias", "b_constraint", b_constraint))}
        if self._constraints["recurrent"] is not None and not self._recurrent_rows:
            raise ConfigError(f"{describe(self)}: recurrent_constraint={recurrent_constraint!r} given, but the "
                              f"cell's weights read the input only (w_constraint constrains them)")
        self._xh = (("input", in_size), ("recurrent", hidden_size))  # a gate's weight on [x, h]

    def _linear(self, rows: tuple[tuple[str, int], ...], out_size: int, **options: Any) -> Linear:
        """One of the cell's weights, on rows of the kinds ``rows`` names in order
        (``"input"``, ``"recurrent"``), each block of rows with the cell's constraint for
        its kind (Keras' ``kernel_constraint`` and ``recurrent_constraint``)."""
        weight = RowBlocks.of([(size, self._constraints[kind]) for kind, size in rows])
        return Linear(sum(size for _, size in rows), out_size, **options, w_constraint=weight,
                      b_constraint=self._constraints["bias"])

    def _gate(self, x: Any, h: jax.Array) -> jax.Array:
        check_last_axis(self, x, self.in_features)
        return jnp.concatenate([x, h], axis=-1)

    def init_state(self, batch_size: int | None = None, **kwargs) -> None:
        for state_name in self._hidden_names:
            setattr(self, state_name, brainstate.HiddenState(make_state(self._state_init, (self.hidden_size,), batch_size)))

    def reset_state(self, batch_size: int | None = None, **kwargs) -> None:
        for state_name in self._hidden_names:
            getattr(self, state_name).value = make_state(self._state_init, (self.hidden_size,), batch_size)


class VanillaRNNCell(_Cell):
    """Elman cell ``h^t = φ([x^t, h^{t-1}] W + b)``.

    Shapes: ``x: (B, in_size)`` → ``h: (B, hidden_size)`` (``B`` optional);
    ``W: (in_size + hidden_size, hidden_size)`` in ``self.W``.

    Args:
        in_size, hidden_size: sizes.
        activation: ``"tanh"`` (default), ``"relu"``, ``"sigmoid"``, ``"identity"`` or a callable.
        w_init, b_init: initializers of ``W`` and ``b``; state_init: of ``h``.
        w_constraint, recurrent_constraint, b_constraint: projections after every update
            (:mod:`etrace_fit.constraints`) of ``W``'s input rows, its state rows and
            ``b`` (Keras' ``kernel_``, ``recurrent_`` and ``bias_constraint``); in every
            cell, each gate's weight on its own.

    Example::

        cell = VanillaRNNCell(10, 32); brainstate.nn.init_all_states(cell, batch_size=8)
        h = cell(jnp.ones((8, 10)))       # (8, 32)
        cell.h.value                      # the carried state, (8, 32)
    """

    def __init__(self, in_size: int, hidden_size: int, *, activation: str | Callable = "tanh",
                 w_init: Any = None, b_init: Any = None, state_init: Any = None, w_constraint: Any = None,
                 recurrent_constraint: Any = None, b_constraint: Any = None, name: str | None = None):
        super().__init__(in_size, hidden_size, state_init, name, w_constraint, b_constraint,
                         recurrent_constraint)
        self.activation = _activation(activation, "VanillaRNNCell")
        self.W = self._linear(self._xh, hidden_size, w_init=w_init, b_init=b_init)

    def update(self, x: Any) -> jax.Array:
        self.h.value = self.activation(self.W(self._gate(x, self.h.value)))
        return self.h.value


class GRUCell(_Cell):
    """Gated recurrent unit (Cho et al. 2014), one weight per gate::

        z = σ([x, h] W_z + b_z)              update gate
        r = σ([x, h] W_r + b_r)              reset gate
        n = tanh([x, r ⊙ h] W_h + b_h)       candidate
        h^t = (1 − z) ⊙ h^{t-1} + z ⊙ n

    Shapes: ``x: (B, in_size)`` → ``h: (B, hidden_size)``; each ``W_*`` is
    ``(in_size + hidden_size, hidden_size)``. ``W_r`` reaches ``h`` only through
    ``W_h``'s input, so the compiler relates it to nothing (weight-to-weight).

    Example::

        cell = GRUCell(10, 32); brainstate.nn.init_all_states(cell, batch_size=8)
        h = cell(jnp.ones((8, 10)))       # (8, 32)
        sorted(cell.states(brainstate.ParamState))  # W_h, W_r, W_z
    """

    def __init__(self, in_size: int, hidden_size: int, *, w_init: Any = None, b_init: Any = None,
                 state_init: Any = None, w_constraint: Any = None,
                 recurrent_constraint: Any = None, b_constraint: Any = None, name: str | None = None):
        super().__init__(in_size, hidden_size, state_init, name, w_constraint, b_constraint,
                         recurrent_constraint)
        self.W_z = self._linear(self._xh, hidden_size, w_init=w_init, b_init=b_init)
        self.W_r = self._linear(self._xh, hidden_size, w_init=w_init, b_init=b_init)
        self.W_h = self._linear(self._xh, hidden_size, w_init=w_init, b_init=b_init)

    def update(self, x: Any) -> jax.Array:
        h = self.h.value
        xh = self._gate(x, h)
        z = jax.nn.sigmoid(self.W_z(xh))
        r = jax.nn.sigmoid(self.W_r(xh))
        n = jnp.tanh(self.W_h(jnp.concatenate([x, r * h], axis=-1)))
        self.h.value = (1.0 - z) * h + z * n
        return self.h.value


class LSTMCell(_Cell):
    """Long short-term memory cell, one weight per gate::

        i = σ([x, h] W_i + b_i)   f = σ([x, h] W_f + b_f)   o = σ([x, h] W_o + b_o)
        g = tanh([x, h] W_g + b_g)
        c^t = f ⊙ c^{t-1} + i ⊙ g
        h^t = o ⊙ tanh(c^t)

    Shapes: ``x: (B, in_size)`` → ``h: (B, hidden_size)``; states ``h`` and ``c``,
    each ``(B, hidden_size)``; each ``W_*`` is ``(in_size + hidden_size, hidden_size)``.
    ``b_f`` starts at ``forget_bias`` (1.0) so memories are kept early in training,
    whatever ``b_init`` gives the other gates (Keras' ``unit_forget_bias``);
    ``forget_bias=None`` starts it from ``b_init`` as well.

    Example::

        cell = LSTMCell(10, 32); brainstate.nn.init_all_states(cell, batch_size=8)
        h = cell(jnp.ones((8, 10)))       # (8, 32)
        cell.c.value.shape                # (8, 32)
    """

    _hidden_names = ("h", "c")

    def __init__(self, in_size: int, hidden_size: int, *, w_init: Any = None, b_init: Any = None,
                 forget_bias: float | None = 1.0, state_init: Any = None, w_constraint: Any = None,
                 recurrent_constraint: Any = None, b_constraint: Any = None, name: str | None = None):
        super().__init__(in_size, hidden_size, state_init, name, w_constraint, b_constraint,
                         recurrent_constraint)
        self.W_i = self._linear(self._xh, hidden_size, w_init=w_init, b_init=b_init)
        self.W_f = self._linear(self._xh, hidden_size, w_init=w_init,
                          b_init=_forget_init(self, forget_bias, b_init))
        self.W_g = self._linear(self._xh, hidden_size, w_init=w_init, b_init=b_init)
        self.W_o = self._linear(self._xh, hidden_size, w_init=w_init, b_init=b_init)

    def update(self, x: Any) -> jax.Array:
        xh = self._gate(x, self.h.value)
        i = jax.nn.sigmoid(self.W_i(xh))
        f = jax.nn.sigmoid(self.W_f(xh))
        g = jnp.tanh(self.W_g(xh))
        o = jax.nn.sigmoid(self.W_o(xh))
        self.c.value = f * self.c.value + i * g
        self.h.value = o * jnp.tanh(self.c.value)
        return self.h.value


class URLSTMCell(_Cell):
    """UR-LSTM (Gu et al. 2020, "Improving the gating mechanism of recurrent neural
    networks"): an LSTM whose forget gate is refined by a second gate and starts from
    the uniform gate initialisation::

        f = σ([x, h] W_f + b_f)   r = σ([x, h] W_r + b_r)   o = σ([x, h] W_o + b_o)
        u = tanh([x, h] W_u + b_u)
        g = r ⊙ (1 − (1 − f)²) + (1 − r) ⊙ f²            the effective forget gate
        c^t = g ⊙ c^{t-1} + (1 − g) ⊙ u
        h^t = o ⊙ tanh(c^t)

    ``b_f`` starts at ``σ⁻¹(p)`` with ``p`` spread evenly over ``(1/max_timescale,
    1 − 1/max_timescale)`` across units (the deterministic form of the uniform
    initialisation) and ``b_r`` at ``−b_f``, so the effective gate ``g`` starts with
    memories ``1/(1 − g)`` from one step to about ``max_timescale / 2`` steps (``f``
    alone would reach ``max_timescale``; the refine gate halves the top end). Online: the gates read ``h``,
    so like the LSTM it is approximate under D-RTRL (per-unit part of the Jacobian).

    Shapes: ``x: (B, in_size)`` → ``h: (B, hidden_size)``; states ``h``, ``c``; each
    ``W_*`` is ``(in_size + hidden_size, hidden_size)``.
    """

    _hidden_names = ("h", "c")

    def __init__(self, in_size: int, hidden_size: int, *, w_init: Any = None, b_init: Any = None,
                 max_timescale: float = 1000.0, state_init: Any = None, w_constraint: Any = None,
                 recurrent_constraint: Any = None, b_constraint: Any = None, name: str | None = None):
        super().__init__(in_size, hidden_size, state_init, name, w_constraint, b_constraint,
                         recurrent_constraint)
        if isinstance(max_timescale, bool) or not isinstance(max_timescale, (int, float)) or max_timescale <= 2:
            raise ConfigError(f"URLSTMCell({in_size}, {hidden_size}): max_timescale must be a number above 2, got "
                              f"{max_timescale!r}")
        low = 1.0 / max_timescale
        p = np.linspace(low, 1.0 - low, hidden_size) if hidden_size > 1 else np.array([0.5])
        forget_bias = np.log(p / (1.0 - p)).astype(np.float64)
        self.W_f = self._linear(self._xh, hidden_size, w_init=w_init, b_init=forget_bias)
        self.W_r = self._linear(self._xh, hidden_size, w_init=w_init, b_init=-forget_bias)
        self.W_u = self._linear(self._xh, hidden_size, w_init=w_init, b_init=b_init)
        self.W_o = self._linear(self._xh, hidden_size, w_init=w_init, b_init=b_init)

    def update(self, x: Any) -> jax.Array:
        xh = self._gate(x, self.h.value)
        f = jax.nn.sigmoid(self.W_f(xh))
        r = jax.nn.sigmoid(self.W_r(xh))
        u = jnp.tanh(self.W_u(xh))
        o = jax.nn.sigmoid(self.W_o(xh))
        g = r * (1.0 - jnp.square(1.0 - f)) + (1.0 - r) * jnp.square(f)
        self.c.value = g * self.c.value + (1.0 - g) * u
        self.h.value = o * jnp.tanh(self.c.value)
        return self.h.value


class MinGRUCell(_Cell):
    """minGRU (Feng et al. 2024, "Were RNNs all we needed?"), sequential form::

        z = σ(x W_z + b_z),   h̃ = x W_h + b_h
        h^t = (1 − z) ⊙ h^{t-1} + z ⊙ h̃

    The gates read the input only, so the recurrence is elementwise: D-RTRL gives
    BPTT's gradient for both weights. Shapes: ``x: (B, in_size)`` → ``h: (B,
    hidden_size)``; ``W_z, W_h: (in_size, hidden_size)``.
    """

    _recurrent_rows = False

    def __init__(self, in_size: int, hidden_size: int, *, w_init: Any = None, b_init: Any = None,
                 state_init: Any = None, w_constraint: Any = None,
                 recurrent_constraint: Any = None, b_constraint: Any = None, name: str | None = None):
        super().__init__(in_size, hidden_size, state_init, name, w_constraint, b_constraint,
                         recurrent_constraint)
        self.W_z = self._linear((("input", in_size),), hidden_size, w_init=w_init, b_init=b_init)
        self.W_h = self._linear((("input", in_size),), hidden_size, w_init=w_init, b_init=b_init)

    def update(self, x: Any) -> jax.Array:
        check_last_axis(self, x, self.in_features)
        z = jax.nn.sigmoid(self.W_z(x))
        self.h.value = (1.0 - z) * self.h.value + z * self.W_h(x)
        return self.h.value


def _forget_init(cell: Any, forget_bias: Any, b_init: Any) -> Any:
    """The forget gate's bias initializer: ``forget_bias`` (a finite number) unless it is
    ``None``, then ``b_init``. With ``b_init`` given it was ``b_init``, ``forget_bias``
    silently dropped."""
    if forget_bias is None:
        return b_init
    if isinstance(forget_bias, bool) or not isinstance(forget_bias, (int, float, np.integer, np.floating)) \
            or not np.isfinite(forget_bias):
        raise ConfigError(f"{describe(cell)}: forget_bias must be a finite number or None (the forget gate's bias "
                          f"from b_init), got {forget_bias!r}")
    return brainstate.nn.init.Constant(float(forget_bias))


class MinLSTMCell(_Cell):
    """minLSTM (Feng et al. 2024), sequential form with normalised gates::

        f = σ(x W_f + b_f),   i = σ(x W_i + b_i),   h̃ = x W_h + b_h
        h^t = f / (f + i) ⊙ h^{t-1} + i / (f + i) ⊙ h̃

    Elementwise in ``h``: D-RTRL is exact for every weight. ``b_f`` starts at
    ``forget_bias`` whatever ``b_init`` gives the other gates (``None``: from
    ``b_init``). Shapes as :class:`MinGRUCell`.
    """

    _recurrent_rows = False

    def __init__(self, in_size: int, hidden_size: int, *, w_init: Any = None, b_init: Any = None,
                 forget_bias: float | None = 1.0, state_init: Any = None, w_constraint: Any = None,
                 recurrent_constraint: Any = None, b_constraint: Any = None, name: str | None = None):
        super().__init__(in_size, hidden_size, state_init, name, w_constraint, b_constraint,
                         recurrent_constraint)
        self.W_f = self._linear((("input", in_size),), hidden_size, w_init=w_init,
                          b_init=_forget_init(self, forget_bias, b_init))
        self.W_i = self._linear((("input", in_size),), hidden_size, w_init=w_init, b_init=b_init)
        self.W_h = self._linear((("input", in_size),), hidden_size, w_init=w_init, b_init=b_init)

    def update(self, x: Any) -> jax.Array:
        check_last_axis(self, x, self.in_features)
        f, i = jax.nn.sigmoid(self.W_f(x)), jax.nn.sigmoid(self.W_i(x))
        self.h.value = (f * self.h.value + i * self.W_h(x)) / (f + i)
        return self.h.value


class MGUCell(_Cell):
    """Minimal gated unit (Zhou et al. 2016): one forget gate::

        f = σ([x, h] W_f + b_f)
        h̃ = tanh([x, f ⊙ h] W_h + b_h)
        h^t = (1 − f) ⊙ h^{t-1} + f ⊙ h̃

    Dense recurrence (as GRU): online gradients are approximate (``W_f`` also reaches
    ``h`` through ``W_h``'s input). Shapes: each ``W_*`` is ``(in_size + hidden_size,
    hidden_size)``.
    """

    def __init__(self, in_size: int, hidden_size: int, *, w_init: Any = None, b_init: Any = None,
                 state_init: Any = None, w_constraint: Any = None,
                 recurrent_constraint: Any = None, b_constraint: Any = None, name: str | None = None):
        super().__init__(in_size, hidden_size, state_init, name, w_constraint, b_constraint,
                         recurrent_constraint)
        self.W_f = self._linear(self._xh, hidden_size, w_init=w_init, b_init=b_init)
        self.W_h = self._linear(self._xh, hidden_size, w_init=w_init, b_init=b_init)

    def update(self, x: Any) -> jax.Array:
        h = self.h.value
        f = jax.nn.sigmoid(self.W_f(self._gate(x, h)))
        candidate = jnp.tanh(self.W_h(jnp.concatenate([x, f * h], axis=-1)))
        self.h.value = (1.0 - f) * h + f * candidate
        return self.h.value


class MinimalRNNCell(_Cell):
    """MinimalRNN (Chen 2017): the input is mapped once, a gate mixes it in::

        z = tanh(x W_x + b_x)
        u = σ([h, z] W_u + b_u)
        h^t = u ⊙ h^{t-1} + (1 − u) ⊙ z

    ``W_x`` reaches ``h`` elementwise (through ``z``) and ``W_u`` through the gate; the
    gate reads ``h`` densely, so online gradients are approximate (close, as the
    recurrence is a convex mix). Shapes: ``W_x: (in_size, hidden_size)``, ``W_u:
    (2·hidden_size, hidden_size)``.
    """

    def __init__(self, in_size: int, hidden_size: int, *, w_init: Any = None, b_init: Any = None,
                 state_init: Any = None, w_constraint: Any = None,
                 recurrent_constraint: Any = None, b_constraint: Any = None, name: str | None = None):
        super().__init__(in_size, hidden_size, state_init, name, w_constraint, b_constraint,
                         recurrent_constraint)
        self.W_x = self._linear((("input", in_size),), hidden_size, w_init=w_init, b_init=b_init)
        self.W_u = self._linear((("recurrent", hidden_size), ("input", hidden_size)), hidden_size, w_init=w_init,
                                b_init=b_init)  # on [h, z]: z is made of the input

    def update(self, x: Any) -> jax.Array:
        check_last_axis(self, x, self.in_features)
        h = self.h.value
        z = jnp.tanh(self.W_x(x))
        u = jax.nn.sigmoid(self.W_u(jnp.concatenate([h, z], axis=-1)))
        self.h.value = u * h + (1.0 - u) * z
        return self.h.value

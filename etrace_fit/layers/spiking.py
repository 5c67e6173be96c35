"""Spiking neuron layers: :class:`LIF`, :class:`ALIF` and their recurrent forms.

Both integrate their input current ``x`` (usually a :class:`Linear`'s output) with an
exponential leak; time constants are in the unit of ``dt`` (``brainstate.environ``).
The neuron dynamics live in :func:`membrane_step`, shared with the spiking readout.
"""

from __future__ import annotations

from typing import Any

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import saiunit as u

from ..errors import ConfigError
from .base import Neuron, RowBlocks, check_trailing_shape, decay, describe, time_constant
from .linear import Linear
from .surrogate import Surrogate, get_surrogate

__all__ = ["ALIF", "IF", "LIF", "RecurrentALIF", "RecurrentLIF", "check_membrane_args", "membrane_step"]

_RESETS = ("soft", "hard")


def check_membrane_args(layer: str, reset: str, v_threshold: Any, v_reset: Any,
                        shape: tuple | None = None) -> tuple[Any, Any]:
    """Raise :class:`ConfigError` for an unknown reset, a threshold not above reset, a
    value with a unit (the membrane is unitless), or per-unit values (a list or array)
    that do not fit the layer's ``shape``; return ``(v_threshold, v_reset)`` as floats
    or float arrays (a list was kept as given and failed at the first step)."""
    if reset not in _RESETS:
        raise ConfigError(f"{layer}: reset must be one of {_RESETS}, got {reset!r}")
    for name, value in (("v_threshold", v_threshold), ("v_reset", v_reset)):
        if isinstance(value, u.Quantity) and not u.get_unit(value).is_unitless:
            raise ConfigError(f"{layer}: {name} must be a plain number (the membrane is unitless, in the input's "
                              f"scale), got {value!r}")
    try:
        if isinstance(v_threshold, (str, bytes)) or isinstance(v_reset, (str, bytes)):
            raise TypeError
        threshold, reset_to = (np.asarray(u.get_mantissa(v), dtype=float) for v in (v_threshold, v_reset))
    except (TypeError, ValueError):
        raise ConfigError(f"{layer}: v_threshold and v_reset must be numbers (or one per unit), got {v_threshold!r} "
                          f"and {v_reset!r}") from None
    if not (np.all(np.isfinite(threshold)) and np.all(np.isfinite(reset_to))):
        raise ConfigError(f"{layer}: v_threshold and v_reset must be finite, got {v_threshold!r} and {v_reset!r}")
    if not np.all(threshold > reset_to):
        raise ConfigError(f"{layer}: v_threshold ({v_threshold}) must exceed v_reset ({v_reset})")
    return tuple(per_unit(layer, name, value, shape)
                 for name, value in (("v_threshold", threshold), ("v_reset", reset_to)))


def per_unit(layer: str, name: str, value: np.ndarray, shape: tuple | None) -> Any:
    """``value`` as a float (one number) or a float array that broadcasts to the units
    ``shape`` (else :class:`ConfigError`: a threshold per unit of another size failed in
    the first step with JAX's broadcasting error)."""
    if value.ndim == 0:
        return float(value)
    if shape is not None:
        try:
            fits = np.broadcast_shapes(value.shape, tuple(shape)) == tuple(shape)
        except ValueError:
            fits = False
        if not fits:
            raise ConfigError(f"{layer}: {name} has shape {value.shape}, which does not fit the layer's units "
                              f"{tuple(shape)}: give one number, or one per unit")
    return value.astype(brainstate.environ.dftype())  # float64 beside a float32 membrane would widen it


def _gated(z: Any, gate: Any) -> Any:
    """``z · gate``; without a refractory period (``gate`` the number 1) ``z`` itself, so
    the step's program is unchanged."""
    return z if isinstance(gate, float) and gate == 1.0 else z * gate


def membrane_step(v, x, decay, threshold_prev, threshold, *, v_reset, reset, surrogate, detach_reset,
                  gate_prev=1.0, gate=1.0):
    """One step of a leaky integrate-and-fire membrane whose state is the potential
    *before* reset, so the step's spike is a function of the state it stores.

    ``z_prev = H(v − threshold_prev)`` is the spike the stored potential emitted last
    step; it is reset now (soft: ``v − z_prev·(threshold_prev − v_reset)``, hard:
    ``v·(1 − z_prev) + v_reset·z_prev``), then ``v_new = decay·v_reset_applied + x`` and
    ``z = H(v_new − threshold)`` (surrogate gradients). Returns ``(v_new, z, z_prev)``.

    The spike sequence equals that of the usual "integrate, fire, reset" ordering;
    only the stored value differs (pre-reset instead of post-reset). Online learning
    needs this: the step's output must depend on the hidden state the step writes.
    ``gate_prev`` / ``gate`` (1 where the neuron may fire, 0 while refractory) multiply
    the two spikes and so their surrogate gradients.
    """
    z_prev = _gated(surrogate(v - threshold_prev), gate_prev)
    z_reset = jax.lax.stop_gradient(z_prev) if detach_reset else z_prev
    if reset == "soft":
        v_after = v - z_reset * (threshold_prev - v_reset)
    else:
        v_after = v * (1.0 - z_reset) + v_reset * z_reset
    v_new = decay * v_after + x
    return v_new, _gated(surrogate(v_new - threshold), gate), z_prev


class _SpikingBase(Neuron):
    def __init__(self, size, tau, v_threshold, v_reset, reset, surrogate, surrogate_scale,
                 detach_reset, learn_tau, state_init, name, refractory=0):
        super().__init__(size, name=name)
        shape = self.shape
        v_threshold, v_reset = check_membrane_args(f"{type(self).__name__}({size})", reset, v_threshold, v_reset,
                                                   shape)
        if isinstance(refractory, bool) or not isinstance(refractory, int) or refractory < 0:
            raise ConfigError(f"{type(self).__name__}({size}): refractory must be an int >= 0 (time steps after a "
                              f"spike during which the neuron cannot fire), got {refractory!r}")
        self.refractory = refractory
        self.reset, self.v_threshold, self.v_reset = reset, v_threshold, v_reset
        self.detach_reset = detach_reset
        try:
            self.surrogate: Surrogate = get_surrogate(surrogate, surrogate_scale)
        except ConfigError as error:
            raise ConfigError(f"{type(self).__name__}({size}): {error}" + (
                " (from surrogate_scale)" if surrogate_scale is not None else "")) from None
        self.tau = time_constant(self, tau, shape, learn_tau)
        self.hidden("V", init=brainstate.nn.init.ZeroInit() if state_init is None else state_init)
        if refractory:
            # Steps the neuron stays silent, counted for the stored potential's spike:
            # an integer state, carried without an eligibility trace.
            self.hidden("refractory_steps", init=0, dtype=jnp.int32)

    def _open(self, steps: Any = None) -> Any:
        """1 where the neuron may fire (not refractory), in V's dtype; 1.0 without a
        refractory period. ``steps``: a refractory count (default: the stored one)."""
        if not self.refractory:
            return 1.0
        steps = self.refractory_steps.value if steps is None else steps
        return (steps == 0).astype(self.V.value.dtype)

    def _gates(self, v_minus_threshold_prev: Any) -> tuple[Any, Any]:
        """``(gate of the stored potential's spike, gate of this step's spike)``, and the
        refractory count moved on: set to ``refractory`` after a spike, else counted down."""
        if not self.refractory:
            return 1.0, 1.0
        gate_prev = self._open()
        fired = jax.lax.stop_gradient(self.surrogate(v_minus_threshold_prev)) * gate_prev > 0.5
        steps = jnp.where(fired, self.refractory, jnp.maximum(self.refractory_steps.value - 1, 0))
        self.refractory_steps.value = steps.astype(jnp.int32)
        return gate_prev, self._open(steps)

    def _membrane(self, v, x, decay, threshold_prev, threshold, gates=(1.0, 1.0)):
        return membrane_step(
            v, x, decay, threshold_prev, threshold, v_reset=self.v_reset, reset=self.reset,
            surrogate=self.surrogate, detach_reset=self.detach_reset, gate_prev=gates[0], gate=gates[1],
        )


class LIF(_SpikingBase):
    """Leaky integrate-and-fire neurons (one hidden state, the membrane ``V``)::

        α = exp(−dt / τ)
        z^{t−1} = H(V^{t−1} − v_threshold)            the spike emitted last step
        V_r = V^{t−1} − z^{t−1} (v_threshold − v_reset)   reset="soft"
        V_r = V^{t−1} (1 − z^{t−1}) + v_reset z^{t−1}       reset="hard"
        V^t = α V_r + x^t                                  x: input current
        z^t = H(V^t − v_threshold)                         output, surrogate gradient

    ``V`` is the potential before reset: the reset of a spike is applied at the start
    of the next step. The spikes are those of "integrate, fire, reset"; storing the
    pre-reset value makes the output a function of the stored state, which online
    learning needs.

    Shapes: ``x: (B, size)`` → spikes ``z: (B, size)`` (``B`` optional); state
    ``V: (B, size)``.

    Args:
        size: number of neurons, or a shape such as ``(L, C)`` for neurons on a
            convolution's output (states then have shape ``(B, L, C)``).
        tau: membrane time constant (scalar or per neuron, unit of ``dt``).
        v_threshold, v_reset: firing threshold and reset potential.
        reset: ``"soft"`` (subtract) or ``"hard"`` (set to ``v_reset``).
        surrogate: ``"triangle"`` (default), ``"sigmoid"``, ``"fast_sigmoid"`` or a
            :class:`~etrace_fit.layers.surrogate.Surrogate`; surrogate_scale overrides its scale.
        detach_reset: stop the gradient through the reset term.
        learn_tau: learn ``τ`` per neuron (through the elementwise ETP op).
        state_init: initializer of ``V`` (the potential before reset: a value above the
            threshold counts as a spike at step −1, reset in the first step).
        refractory: time steps after a spike during which the neuron cannot fire
            (0: none). ``V`` keeps integrating; the spike and its surrogate gradient are
            0 while refractory (e-prop's convention); an ``int32`` hidden state
            ``refractory_steps`` counts down, carried without a trace, so D-RTRL stays
            exact. A spike at step ``t`` allows the next one at ``t + refractory + 1``.

    Example::

        brainstate.environ.set(dt=1.0)
        lif = LIF(100, tau=20.0); brainstate.nn.init_all_states(lif, batch_size=8)
        z = lif(jnp.ones((8, 100)))       # spikes, (8, 100)
    """

    def __init__(self, size: int, *, tau: Any = 20.0, v_threshold: float = 1.0, v_reset: float = 0.0,
                 reset: str = "soft", surrogate: str | Surrogate = "triangle", surrogate_scale: float | None = None,
                 detach_reset: bool = False, learn_tau: bool = False, state_init: Any = None,
                 refractory: int = 0, name: str | None = None):
        super().__init__(size, tau, v_threshold, v_reset, reset, surrogate, surrogate_scale,
                         detach_reset, learn_tau, state_init, name, refractory)

    def update(self, x: Any) -> jax.Array:
        check_trailing_shape(self, x, self.shape)
        gates = self._gates(self.V.value - self.v_threshold)
        self.V.value, z, _ = self._membrane(self.V.value, x, decay(self, self.tau), self.v_threshold,
                                            self.v_threshold, gates)
        return z

    def spikes(self, gradient: bool = False) -> jax.Array:
        """The spikes of the last step, read off the stored (pre-reset) potential:
        ``(B, size)`` of 0 / 1; no gradient (for rasters and spike counts) unless
        ``gradient`` (the surrogate gradient of the step's output, for a loss on them)."""
        z = _gated(self.surrogate(self.V.value - self.v_threshold), self._open())
        return z if gradient else jax.lax.stop_gradient(z)


class IF(LIF):
    """Integrate-and-fire neurons: :class:`LIF` without leak (``α = 1``)::

        V^t = V_r + x^t,   z^t = H(V^t − v_threshold)

    with the reset ``V_r`` of the last step's spike as in :class:`LIF` (soft or hard).
    Arguments as in :class:`LIF`, without ``tau``; state ``V``.

    Example::

        brainstate.environ.set(dt=1.0)
        neurons = IF(100); brainstate.nn.init_all_states(neurons, batch_size=8)
        z = neurons(jnp.full((8, 100), 0.3))   # fires every 3-4 steps (the reset keeps the rest)
    """

    def __init__(self, size: int, *, v_threshold: float = 1.0, v_reset: float = 0.0, reset: str = "soft",
                 surrogate: str | Surrogate = "triangle", surrogate_scale: float | None = None,
                 detach_reset: bool = False, state_init: Any = None, refractory: int = 0, name: str | None = None):
        super().__init__(size, v_threshold=v_threshold, v_reset=v_reset, reset=reset, surrogate=surrogate,
                         surrogate_scale=surrogate_scale, detach_reset=detach_reset, state_init=state_init,
                         refractory=refractory, name=name)
        self.tau = float("inf")  # no leak

    def update(self, x: Any) -> jax.Array:
        check_trailing_shape(self, x, self.shape)
        gates = self._gates(self.V.value - self.v_threshold)
        self.V.value, z, _ = self._membrane(self.V.value, x, 1.0, self.v_threshold, self.v_threshold, gates)
        return z


class ALIF(_SpikingBase):
    """Adaptive LIF neurons (Bellec et al. 2018): hidden states ``V`` and ``a``::

        α = exp(−dt / τ),  ρ = exp(−dt / τ_a)
        A^{t−1} = v_threshold + β a^{t−1}            adaptive threshold
        z^{t−1} = H(V^{t−1} − A^{t−1})               the spike emitted last step
        a^t = ρ a^{t−1} + z^{t−1}
        V_r = V^{t−1} − z^{t−1} (A^{t−1} − v_reset)   reset="soft" (hard as in LIF)
        V^t = α V_r + x^t
        z^t = H(V^t − (v_threshold + β a^t))          output

    ``V`` and ``a`` update each other only per neuron: the compiler puts them in one
    hidden group of ``S = 2`` states.

    Shapes: ``x: (B, size)`` → spikes ``(B, size)``; states ``V, a: (B, size)``.

    Args:
        size, tau, v_threshold, v_reset, reset, surrogate, surrogate_scale, detach_reset, learn_tau, state_init,
            refractory: as in :class:`LIF` (a refractory neuron's suppressed spike does
            not adapt its threshold either).
        tau_a: adaptation time constant; learn_tau_a: learn it per neuron.
        beta: adaptation strength ``β``, for ``a^t = ρ a^{t−1} + z^{t−1}`` (each spike adds 1
            to ``a``): e-prop 2020's LSNN uses ``β = 1.7 (1 − ρ)/(1 − α)`` (≈ 0.017 for
            ``τ_a = 2000``, ``τ = 20``) with ``v_threshold = 0.6``; the LSNN paper's
            ``β = 1.8`` is for ``a^t = ρ a^{t−1} + (1 − ρ) z^{t−1}``, i.e. ``1.8 (1 − ρ)`` here.

    Example::

        brainstate.environ.set(dt=1.0)
        alif = ALIF(100, tau_a=200.0); brainstate.nn.init_all_states(alif, batch_size=8)
        z = alif(jnp.ones((8, 100)))      # spikes, (8, 100)
    """

    def __init__(self, size: int, *, tau: Any = 20.0, tau_a: Any = 200.0, beta: float = 0.5,
                 v_threshold: float = 1.0, v_reset: float = 0.0, reset: str = "soft",
                 surrogate: str | Surrogate = "triangle", surrogate_scale: float | None = None,
                 detach_reset: bool = False, learn_tau: bool = False, learn_tau_a: bool = False,
                 state_init: Any = None, refractory: int = 0, name: str | None = None):
        super().__init__(size, tau, v_threshold, v_reset, reset, surrogate, surrogate_scale,
                         detach_reset, learn_tau, state_init, name, refractory)
        self.tau_a = time_constant(self, tau_a, self.shape, learn_tau_a, what="tau_a")
        if isinstance(beta, bool) or np.asarray(beta).dtype.kind not in "iuf" or not np.all(np.isfinite(beta)):
            raise ConfigError(f"{type(self).__name__}({size}): beta (the adaptation strength) must be a finite "
                              f"number, got {beta!r}")
        self.beta = per_unit(f"{type(self).__name__}({size})", "beta", np.asarray(beta, dtype=float), self.shape)
        self.hidden("a", init=0.0)

    def update(self, x: Any) -> jax.Array:
        check_trailing_shape(self, x, self.shape)
        a_prev = self.a.value
        threshold_prev = self.v_threshold + self.beta * a_prev
        gates = self._gates(self.V.value - threshold_prev)
        z_prev = _gated(self.surrogate(self.V.value - threshold_prev), gates[0])
        a = decay(self, self.tau_a) * a_prev + z_prev
        self.a.value = a
        self.V.value, z, _ = self._membrane(
            self.V.value, x, decay(self, self.tau), threshold_prev, self.v_threshold + self.beta * a, gates
        )
        return z

    def spikes(self, gradient: bool = False) -> jax.Array:
        """The spikes of the last step (``V > v_threshold + β a``), as in :meth:`LIF.spikes`."""
        z = _gated(self.surrogate(self.V.value - (self.v_threshold + self.beta * self.a.value)), self._open())
        return z if gradient else jax.lax.stop_gradient(z)


class _Recurrent:
    """Input and recurrent weights in one :class:`Linear` on ``[x^t, z^{t−1}]``."""

    def _make_weights(self, in_size, w_init, b_init, with_bias, self_connections=True, w_constraint=None,
                      recurrent_constraint=None, b_constraint=None):
        if not isinstance(self.size, int):
            raise ConfigError(f"{type(self).__name__}: size must be an int (recurrent weights connect units), "
                              f"got {self.size!r}")
        if not isinstance(self_connections, bool):
            raise ConfigError(f"{type(self).__name__}: self_connections must be True or False, "
                              f"got {self_connections!r}")
        self.in_features = in_size
        self.in_size = (in_size,)
        self.self_connections = self_connections
        self._summary = f"{in_size}, {self.size}" + ("" if self_connections else ", self_connections=False")
        # Without self-connections (e-prop's networks: no autapse) the recurrent rows'
        # diagonal is cut by a fixed mask, so it stays zero under every rule.
        mask = None if self_connections else jnp.concatenate(
            [jnp.ones((in_size, self.size)), 1.0 - jnp.eye(self.size)])
        from .. import constraints

        kernel, recurrent, bias = (constraints.get(value, name, describe(self)) for name, value in (
            ("w_constraint", w_constraint), ("recurrent_constraint", recurrent_constraint),
            ("b_constraint", b_constraint)))
        if bias is not None and not with_bias:
            raise ConfigError(f"{describe(self)}: b_constraint={b_constraint!r} given, but the layer has no bias "
                              f"(with_bias=False)")
        weight = RowBlocks.of([(in_size, kernel), (self.size, recurrent)])
        self.W = Linear(in_size + self.size, self.size, w_init=w_init, b_init=b_init, with_bias=with_bias, mask=mask,
                        w_constraint=weight, b_constraint=bias)

    def update(self, x: Any) -> jax.Array:
        check_trailing_shape(self, x, self.in_size)
        z_prev = self._previous_spikes()  # with its surrogate gradient: the recurrent path is learned
        return super().update(self.W(jnp.concatenate([x, z_prev], axis=-1)))


class RecurrentLIF(_Recurrent, LIF):
    """:class:`LIF` neurons driven by their input and their own last spikes (e-prop's
    recurrent LIF network)::

        I^t = [x^t, z^{t−1}] W + b        one weight (in_size + size, size): input rows, then recurrent rows
        V^t, z^t as in LIF with input current I^t

    The compiler relates ``W`` to ``V``; because ``z^{t−1}`` feeds back through ``W``
    the online gradient keeps the per-unit part of the Jacobian (the report says so),
    for ``W`` and for every other weight into these neurons (a learned ``tau``).

    Shapes: ``x: (B, in_size)`` → spikes ``(B, size)``; state ``V: (B, size)``.

    Args:
        in_size, size: input features and neurons.
        w_init, b_init, with_bias: of the weight on ``[x, z]`` (as in :class:`Linear`).
        w_constraint, recurrent_constraint, b_constraint: projections after every update
            (:mod:`etrace_fit.constraints`; Keras' ``kernel_``, ``recurrent_`` and
            ``bias_constraint``) of the weight's input rows, its recurrent rows and the
            bias; without self-connections a norm counts the connections present.
        self_connections: ``False`` cuts each neuron's weight onto itself (the recurrent
            rows' diagonal, held at zero by a fixed mask; e-prop's networks have none).
        tau, v_threshold, v_reset, reset, surrogate, ...: as in :class:`LIF`.

    Example::

        brainstate.environ.set(dt=1.0)
        rnn = RecurrentLIF(40, 100, tau=20.0); brainstate.nn.init_all_states(rnn, batch_size=8)
        z = rnn(jnp.ones((8, 40)))        # spikes, (8, 100)
    """

    def __init__(self, in_size: int, size: int, *, w_init: Any = None, b_init: Any = None, with_bias: bool = True,
                 self_connections: bool = True, w_constraint: Any = None, recurrent_constraint: Any = None,
                 b_constraint: Any = None, **lif_options: Any):
        super().__init__(size, **lif_options)
        self._make_weights(in_size, w_init, b_init, with_bias, self_connections, w_constraint, recurrent_constraint,
                           b_constraint)

    def _previous_spikes(self) -> jax.Array:
        return _gated(self.surrogate(self.V.value - self.v_threshold), self._open())


class RecurrentALIF(_Recurrent, ALIF):
    """:class:`ALIF` neurons driven by their input and their own last spikes (e-prop's
    LSNN): ``I^t = [x^t, z^{t−1}] W + b``, then ALIF's dynamics with ``V`` and ``a``.

    Shapes: ``x: (B, in_size)`` → spikes ``(B, size)``; states ``V, a: (B, size)``.

    Args:
        in_size, size, w_init, b_init, with_bias, self_connections, w_constraint,
            recurrent_constraint, b_constraint: as in :class:`RecurrentLIF`.
        tau, tau_a, beta, ...: as in :class:`ALIF`.

    Example::

        brainstate.environ.set(dt=1.0)
        lsnn = RecurrentALIF(40, 100, tau_a=200.0); brainstate.nn.init_all_states(lsnn, batch_size=8)
        z = lsnn(jnp.ones((8, 40)))       # spikes, (8, 100)
    """

    def __init__(self, in_size: int, size: int, *, w_init: Any = None, b_init: Any = None, with_bias: bool = True,
                 self_connections: bool = True, w_constraint: Any = None, recurrent_constraint: Any = None,
                 b_constraint: Any = None, **alif_options: Any):
        super().__init__(size, **alif_options)
        self._make_weights(in_size, w_init, b_init, with_bias, self_connections, w_constraint, recurrent_constraint,
                           b_constraint)

    def _previous_spikes(self) -> jax.Array:
        return _gated(self.surrogate(self.V.value - (self.v_threshold + self.beta * self.a.value)), self._open())

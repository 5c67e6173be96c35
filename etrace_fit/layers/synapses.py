"""Synapse models: current-based synapses between a weight layer and a neuron, and
short-term plasticity on presynaptic spikes.

Every carried variable is a hidden state with an elementwise recurrence, so a weight
feeding a synapse and the neuron after it forms one hidden group whose per-unit
Jacobian is small (``S`` = the states of synapse and neuron together): D-RTRL stays
exact. Time constants are in the unit of ``dt`` and may be learned (``learn_tau``).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import saiunit as u

from ..errors import ConfigError
from .base import Neuron, check_trailing_shape, decay, time_constant

__all__ = ["AlphaSynapse", "DualExpSynapse", "ExpSynapse", "STP"]


class ExpSynapse(Neuron):
    """Exponential synapse: the current ``I`` jumps by the input and decays with ``tau``::

        α = exp(−dt / τ)
        I^t = α I^{t−1} + x^t        output I^t

    Shapes: ``x: (B, *size)`` (usually a :class:`Linear`'s output) → ``I: (B, *size)``;
    state ``I``.

    Example::

        model = ef.Sequential(Linear(40, 100), ExpSynapse(100, tau=5.0), LIF(100))
    """

    def __init__(self, size: Any, *, tau: Any = 5.0, learn_tau: bool = False, name: str | None = None):
        super().__init__(size, name=name)
        self.tau = time_constant(self, tau, self.shape, learn_tau)
        self.hidden("I", init=0.0)

    def update(self, x: Any) -> jax.Array:
        check_trailing_shape(self, x, self.shape)
        self.I.value = decay(self, self.tau) * self.I.value + x
        return self.I.value


class DualExpSynapse(Neuron):
    """Difference of exponentials (rise ``tau_rise``, decay ``tau_decay``)::

        r^t = α_r r^{t−1} + x^t,   d^t = α_d d^{t−1} + x^t
        g^t = (d^t − r^t) / (α_d − α_r)       output

    An impulse at step 0 gives ``g^t = (α_d^t − α_r^t) / (α_d − α_r)``: 0 at its own
    step, 1 at the next, then rising to a peak and decaying. ``tau_rise < tau_decay``.
    States ``r`` and ``d``.
    """

    def __init__(self, size: Any, *, tau_rise: Any = 1.0, tau_decay: Any = 5.0, learn_tau: bool = False,
                 name: str | None = None):
        super().__init__(size, name=name)
        # unit by unit, in one unit (the largest rise against the smallest decay refused
        # tau_rise=[1, 4], tau_decay=[3, 8]; jnp.asarray of 1 ms raised a bare TypeError)
        try:
            ratio = (tau_rise if isinstance(tau_rise, u.Quantity) else np.asarray(tau_rise, dtype=float)) / (
                tau_decay if isinstance(tau_decay, u.Quantity) else np.asarray(tau_decay, dtype=float))
        except (TypeError, ValueError):
            ratio = None  # not numbers or not of one shape: time_constant names which
        if ratio is not None and u.get_unit(ratio).is_unitless and not np.all(np.asarray(u.get_mantissa(ratio)) < 1):
            raise ConfigError(f"DualExpSynapse({size}): tau_rise ({tau_rise}) must be below tau_decay ({tau_decay}) "
                              f"for every unit")
        self.tau_rise = time_constant(self, tau_rise, self.shape, learn_tau, "tau_rise")
        self.tau_decay = time_constant(self, tau_decay, self.shape, learn_tau, "tau_decay")
        self.hidden("r", init=0.0)
        self.hidden("d", init=0.0)

    def update(self, x: Any) -> jax.Array:
        check_trailing_shape(self, x, self.shape)
        rise, fall = decay(self, self.tau_rise), decay(self, self.tau_decay)
        self.r.value = rise * self.r.value + x
        self.d.value = fall * self.d.value + x
        return (self.d.value - self.r.value) / (fall - rise)


class AlphaSynapse(Neuron):
    """Alpha synapse: two exponential stages with the same ``tau`` in a row::

        h^t = α h^{t−1} + x^t
        g^t = α g^{t−1} + (1 − α) h^t       output

    An impulse gives ``g = (1 − α)(t + 1) α^t``, the discrete alpha function (peak near
    ``t = τ``). States ``h`` and ``g``.
    """

    def __init__(self, size: Any, *, tau: Any = 5.0, learn_tau: bool = False, name: str | None = None):
        super().__init__(size, name=name)
        self.tau = time_constant(self, tau, self.shape, learn_tau)
        self.hidden("h", init=0.0)
        self.hidden("g", init=0.0)

    def update(self, x: Any) -> jax.Array:
        check_trailing_shape(self, x, self.shape)
        alpha = decay(self, self.tau)
        self.h.value = alpha * self.h.value + x
        self.g.value = alpha * self.g.value + (1.0 - alpha) * self.h.value
        return self.g.value


class STP(Neuron):
    """Short-term plasticity of presynaptic spikes (Tsodyks–Markram): the utilisation
    ``u`` facilitates and the resources ``x_r`` deplete at each spike ``s``::

        u⁺ = u + U (1 − u) s                     facilitation at a spike
        out = u⁺ x_r s                            the efficacy of this step's spikes
        x_r ← x_r − u⁺ x_r s                      depression
        u ← U + (u⁺ − U) exp(−dt / tau_f),   x_r ← 1 + (x_r − 1) exp(−dt / tau_d)

    Put it on spikes before the :class:`Linear` they drive: ``Sequential(LIF(n),
    STP(n), Linear(n, m), LIF(m))``. Gradients flow through ``out`` to the spikes. On
    input spikes (data) its states depend on no weight and need no trace; after a
    trained spiking layer they are a hidden group of their own, and the compile report
    says how the weights before it are traced.
    ``tau_f`` small and ``U`` large: depression; ``tau_f`` large and ``U`` small:
    facilitation. Shapes ``s: (B, *size)`` → ``(B, *size)``; states ``u``, ``x_r``.
    """

    def __init__(self, size: Any, *, U: float = 0.5, tau_f: Any = 50.0, tau_d: Any = 200.0, name: str | None = None):
        super().__init__(size, name=name)
        if not 0.0 < U <= 1.0:
            raise ConfigError(f"STP({size}): U must be in (0, 1], got {U}")
        self.U = U
        self.tau_f = time_constant(self, tau_f, self.shape, False, "tau_f")
        self.tau_d = time_constant(self, tau_d, self.shape, False, "tau_d")
        self.hidden("u", init=U)
        self.hidden("x_r", init=1.0)

    def update(self, s: Any) -> jax.Array:
        check_trailing_shape(self, s, self.shape)
        u_plus = self.u.value + self.U * (1.0 - self.u.value) * s
        out = u_plus * self.x_r.value * s
        resources = self.x_r.value - u_plus * self.x_r.value * s
        self.u.value = self.U + (u_plus - self.U) * decay(self, self.tau_f)
        self.x_r.value = 1.0 + (resources - 1.0) * decay(self, self.tau_d)
        return out

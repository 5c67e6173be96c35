"""Spiking neuron layers: :class:`LIF` and :class:`ALIF`.

Both integrate their input current ``x`` (usually a :class:`Linear`'s output) with an
exponential leak; time constants are in the unit of ``dt`` (``brainstate.environ``).
The neuron dynamics live in :func:`membrane_step`, shared with the spiking readout.
"""

from __future__ import annotations

from typing import Any

import brainstate
import jax
import jax.numpy as jnp

from ..errors import ConfigError
from ._base import check_last_axis, decay_of, make_state, time_constant
from .surrogate import Surrogate, get_surrogate

__all__ = ["ALIF", "LIF", "check_membrane_args", "membrane_step"]

_RESETS = ("soft", "hard")


def check_membrane_args(layer: str, reset: str, v_threshold: float, v_reset: float) -> None:
    """Raise :class:`ConfigError` for an unknown reset or a threshold not above reset."""
    if reset not in _RESETS:
        raise ConfigError(f"{layer}: reset must be one of {_RESETS}, got {reset!r}")
    if not v_threshold > v_reset:
        raise ConfigError(f"{layer}: v_threshold ({v_threshold}) must exceed v_reset ({v_reset})")


def membrane_step(v, x, decay, threshold, *, v_reset, reset, surrogate, detach_reset):
    """One step of a leaky integrate-and-fire membrane.

    ``v_pre = decay·v + x``; ``z = H(v_pre − threshold)`` (surrogate gradient);
    soft reset ``v = v_pre − z·(threshold − v_reset)``, hard reset
    ``v = v_pre·(1 − z) + v_reset·z``. Returns ``(new v, z)``.
    """
    v_pre = decay * v + x
    z = surrogate(v_pre - threshold)
    z_reset = jax.lax.stop_gradient(z) if detach_reset else z
    if reset == "soft":
        v_new = v_pre - z_reset * (threshold - v_reset)
    else:
        v_new = v_pre * (1.0 - z_reset) + v_reset * z_reset
    return v_new, z


class _SpikingBase(brainstate.nn.Module):
    def __init__(self, size, tau, v_threshold, v_reset, reset, surrogate, surrogate_scale,
                 detach_reset, learn_tau, state_init, name):
        super().__init__(name=name)
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ConfigError(f"{type(self).__name__}: size must be a positive int, got {size!r}")
        self.size = size
        self.in_size = self.out_size = (size,)
        self._summary = f"{size}"
        check_membrane_args(f"{type(self).__name__}({size})", reset, v_threshold, v_reset)
        self.reset, self.v_threshold, self.v_reset = reset, v_threshold, v_reset
        self.detach_reset = detach_reset
        self.surrogate: Surrogate = get_surrogate(surrogate, surrogate_scale)
        self.tau = time_constant(self, tau, size, learn_tau)
        self._state_init = brainstate.nn.init.ZeroInit() if state_init is None else state_init

    def _membrane(self, v, x, decay, threshold):
        return membrane_step(
            v, x, decay, threshold, v_reset=self.v_reset, reset=self.reset,
            surrogate=self.surrogate, detach_reset=self.detach_reset,
        )


class LIF(_SpikingBase):
    """Leaky integrate-and-fire neurons (one hidden state, the membrane ``V``)::

        α = exp(−dt / τ)
        V' = α V^{t−1} + x^t                      x: input current
        z^t = H(V' − v_threshold)                 surrogate gradient
        V^t = V' − z^t (v_threshold − v_reset)    reset="soft"
        V^t = V' (1 − z^t) + v_reset z^t          reset="hard"

    Shapes: ``x: (B, size)`` → spikes ``z: (B, size)`` (``B`` optional); state
    ``V: (B, size)``.

    Args:
        size: number of neurons.
        tau: membrane time constant (scalar or ``(size,)``, unit of ``dt``).
        v_threshold, v_reset: firing threshold and reset potential.
        reset: ``"soft"`` (subtract) or ``"hard"`` (set to ``v_reset``).
        surrogate: ``"triangle"`` (default), ``"sigmoid"``, ``"fast_sigmoid"`` or a
            :class:`~etrace_fit.layers.surrogate.Surrogate`; surrogate_scale overrides its scale.
        detach_reset: stop the gradient through the reset term.
        learn_tau: learn ``τ`` per neuron (through the elementwise ETP op).
        state_init: initializer of ``V``.

    Example::

        brainstate.environ.set(dt=1.0)
        lif = LIF(100, tau=20.0); brainstate.nn.init_all_states(lif, batch_size=8)
        z = lif(jnp.ones((8, 100)))       # spikes, (8, 100)
    """

    def __init__(self, size: int, *, tau: Any = 20.0, v_threshold: float = 1.0, v_reset: float = 0.0,
                 reset: str = "soft", surrogate: str | Surrogate = "triangle", surrogate_scale: float | None = None,
                 detach_reset: bool = False, learn_tau: bool = False, state_init: Any = None,
                 name: str | None = None):
        super().__init__(size, tau, v_threshold, v_reset, reset, surrogate, surrogate_scale,
                         detach_reset, learn_tau, state_init, name)

    def init_state(self, batch_size: int | None = None, **kwargs) -> None:
        self.V = brainstate.HiddenState(make_state(self._state_init, (self.size,), batch_size))

    def reset_state(self, batch_size: int | None = None, **kwargs) -> None:
        self.V.value = make_state(self._state_init, (self.size,), batch_size)

    def update(self, x: Any) -> jax.Array:
        check_last_axis(self, x, self.size)
        self.V.value, z = self._membrane(self.V.value, x, decay_of(self, self.tau), self.v_threshold)
        return z


class ALIF(_SpikingBase):
    """Adaptive LIF neurons (Bellec et al. 2018): hidden states ``V`` and ``a``::

        α = exp(−dt / τ),  ρ = exp(−dt / τ_a)
        A = v_threshold + β a^{t−1}               adaptive threshold
        V' = α V^{t−1} + x^t
        z^t = H(V' − A)
        V^t = V' − z^t (A − v_reset)              reset="soft" (hard as in LIF)
        a^t = ρ a^{t−1} + z^t

    ``V`` and ``a`` update each other only per neuron: the compiler puts them in one
    hidden group of ``S = 2`` states.

    Shapes: ``x: (B, size)`` → spikes ``(B, size)``; states ``V, a: (B, size)``.

    Args:
        size, tau, v_threshold, v_reset, reset, surrogate, surrogate_scale,
            detach_reset, learn_tau, state_init: as in :class:`LIF`.
        tau_a: adaptation time constant; learn_tau_a: learn it per neuron.
        beta: adaptation strength ``β``.

    Example::

        brainstate.environ.set(dt=1.0)
        alif = ALIF(100, tau_a=200.0); brainstate.nn.init_all_states(alif, batch_size=8)
        z = alif(jnp.ones((8, 100)))      # spikes, (8, 100)
    """

    def __init__(self, size: int, *, tau: Any = 20.0, tau_a: Any = 200.0, beta: float = 0.5,
                 v_threshold: float = 1.0, v_reset: float = 0.0, reset: str = "soft",
                 surrogate: str | Surrogate = "triangle", surrogate_scale: float | None = None,
                 detach_reset: bool = False, learn_tau: bool = False, learn_tau_a: bool = False,
                 state_init: Any = None, name: str | None = None):
        super().__init__(size, tau, v_threshold, v_reset, reset, surrogate, surrogate_scale,
                         detach_reset, learn_tau, state_init, name)
        self.tau_a = time_constant(self, tau_a, size, learn_tau_a, what="tau_a")
        self.beta = beta

    def init_state(self, batch_size: int | None = None, **kwargs) -> None:
        self.V = brainstate.HiddenState(make_state(self._state_init, (self.size,), batch_size))
        self.a = brainstate.HiddenState(make_state(brainstate.nn.init.ZeroInit(), (self.size,), batch_size))

    def reset_state(self, batch_size: int | None = None, **kwargs) -> None:
        self.V.value = make_state(self._state_init, (self.size,), batch_size)
        self.a.value = make_state(brainstate.nn.init.ZeroInit(), (self.size,), batch_size)

    def update(self, x: Any) -> jax.Array:
        check_last_axis(self, x, self.size)
        a = self.a.value
        threshold = self.v_threshold + self.beta * a
        self.V.value, z = self._membrane(self.V.value, x, decay_of(self, self.tau), threshold)
        self.a.value = decay_of(self, self.tau_a) * a + z
        return z

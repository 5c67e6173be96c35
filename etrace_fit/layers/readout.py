"""Stateful readouts: :class:`LeakyRateReadout` and :class:`LeakySpikeReadout`.

Both own their weight (through ``etrace_fit.ops.matmul``) and a leaky hidden state,
so their output integrates evidence over time.
"""

from __future__ import annotations

from typing import Any

import brainstate
import jax

from .. import ops
from .base import check_last_axis, decay, make_param, make_state, time_constant, weight_state
from .linear import _positive_int
from .spiking import check_membrane_args, membrane_step
from .surrogate import Surrogate, get_surrogate

__all__ = ["LeakyRateReadout", "LeakySpikeReadout"]


class _ReadoutBase(brainstate.nn.Module):
    def __init__(self, in_size, out_size, tau, w_init, b_init, with_bias, learn_tau, name, w_constraint=None,
                 b_constraint=None):
        super().__init__(name=name)
        cls = type(self).__name__
        self.in_features = _positive_int(cls, "in_size", in_size)
        self.out_features = _positive_int(cls, "out_size", out_size)
        self.in_size, self.out_size = (in_size,), (out_size,)
        self._summary = f"{in_size}, {out_size}"
        w_init = brainstate.nn.init.KaimingNormal(scale=1.0) if w_init is None else w_init
        params = {"weight": make_param(w_init, (in_size, out_size), "w_init", self)}
        if with_bias:
            params["bias"] = make_param(brainstate.nn.init.ZeroInit() if b_init is None else b_init,
                                        (out_size,), "b_init", self)
        self.weight = weight_state(self, params, w_constraint, b_constraint)
        self.tau = time_constant(self, tau, out_size, learn_tau)

    def _current(self, x):
        check_last_axis(self, x, self.in_features)
        params = self.weight.value
        return ops.matmul(x, params["weight"], params.get("bias"))


class LeakyRateReadout(_ReadoutBase):
    """Leaky integrator readout ``r^t = κ r^{t−1} + x^t W + b``, ``κ = exp(−dt/τ)``.

    Shapes: ``x: (B, in_size)`` → ``r: (B, out_size)`` (``B`` optional); hidden
    state ``r: (B, out_size)``; ``W: (in_size, out_size)`` in ``self.weight``.

    Args:
        in_size, out_size: sizes.
        tau: time constant (unit of ``dt``); learn_tau: learn it per output unit.
        w_init, b_init, with_bias, w_constraint, b_constraint: as in :class:`Linear`.

    Example::

        brainstate.environ.set(dt=1.0)
        readout = LeakyRateReadout(100, 2, tau=20.0); brainstate.nn.init_all_states(readout, batch_size=8)
        r = readout(jnp.ones((8, 100)))   # (8, 2)
    """

    def __init__(self, in_size: int, out_size: int, *, tau: Any = 20.0, w_init: Any = None, b_init: Any = None,
                 with_bias: bool = True, learn_tau: bool = False, w_constraint: Any = None,
                 b_constraint: Any = None, name: str | None = None):
        super().__init__(in_size, out_size, tau, w_init, b_init, with_bias, learn_tau, name, w_constraint,
                         b_constraint)

    def init_state(self, batch_size: int | None = None, **kwargs) -> None:
        self.r = brainstate.HiddenState(make_state(brainstate.nn.init.ZeroInit(), (self.out_features,), batch_size))

    def reset_state(self, batch_size: int | None = None, **kwargs) -> None:
        self.r.value = make_state(brainstate.nn.init.ZeroInit(), (self.out_features,), batch_size)

    def update(self, x: Any) -> jax.Array:
        current = self._current(x)
        self.r.value = decay(self, self.tau) * self.r.value + current
        return self.r.value


class LeakySpikeReadout(_ReadoutBase):
    """Spiking readout: LIF neurons (see :class:`LIF`) driven by ``x^t W + b``.

    ``V^t = α V_r + x^t W + b`` with ``V_r`` the previous potential after the reset of
    its spike, ``z^t = H(V^t − v_threshold)`` (``V`` stored before reset, as in LIF).

    Shapes: ``x: (B, in_size)`` → spikes ``(B, out_size)``; hidden state
    ``V: (B, out_size)``.

    Args:
        in_size, out_size, tau, learn_tau, w_init, b_init, with_bias, w_constraint,
            b_constraint: as in :class:`LeakyRateReadout`.
        v_threshold, v_reset, reset, surrogate, surrogate_scale, detach_reset: as in :class:`LIF`.

    Example::

        brainstate.environ.set(dt=1.0)
        readout = LeakySpikeReadout(100, 10); brainstate.nn.init_all_states(readout, batch_size=8)
        z = readout(jnp.ones((8, 100)))   # (8, 10)
    """

    def __init__(self, in_size: int, out_size: int, *, tau: Any = 20.0, v_threshold: float = 1.0,
                 v_reset: float = 0.0, reset: str = "soft", surrogate: str | Surrogate = "triangle",
                 surrogate_scale: float | None = None, detach_reset: bool = False, w_init: Any = None,
                 b_init: Any = None, with_bias: bool = True, learn_tau: bool = False, w_constraint: Any = None,
                 b_constraint: Any = None, name: str | None = None):
        super().__init__(in_size, out_size, tau, w_init, b_init, with_bias, learn_tau, name, w_constraint,
                         b_constraint)
        v_threshold, v_reset = check_membrane_args(f"LeakySpikeReadout({in_size}, {out_size})", reset, v_threshold,
                                                   v_reset, (out_size,))
        self.v_threshold, self.v_reset, self.reset = v_threshold, v_reset, reset
        self.surrogate = get_surrogate(surrogate, surrogate_scale)
        self.detach_reset = detach_reset

    def init_state(self, batch_size: int | None = None, **kwargs) -> None:
        self.V = brainstate.HiddenState(make_state(brainstate.nn.init.ZeroInit(), (self.out_features,), batch_size))

    def reset_state(self, batch_size: int | None = None, **kwargs) -> None:
        self.V.value = make_state(brainstate.nn.init.ZeroInit(), (self.out_features,), batch_size)

    def update(self, x: Any) -> jax.Array:
        self.V.value, z, _ = membrane_step(
            self.V.value, self._current(x), decay(self, self.tau), self.v_threshold, self.v_threshold,
            v_reset=self.v_reset, reset=self.reset, surrogate=self.surrogate, detach_reset=self.detach_reset,
        )
        return z

    def spikes(self, gradient: bool = False) -> jax.Array:
        """The spikes of the last step, read off the stored potential (see ``LIF.spikes``)."""
        z = self.surrogate(self.V.value - self.v_threshold)
        return z if gradient else jax.lax.stop_gradient(z)

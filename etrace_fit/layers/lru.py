"""The linear recurrent unit (LRU; Orvieto et al. 2023): a diagonal complex recurrence
kept as real and imaginary parts, so D-RTRL is exact for every weight of it."""

from __future__ import annotations

import math
from typing import Any

import brainstate
import jax
import jax.numpy as jnp
import numpy as np

from .. import ops
from ..errors import ConfigError
from .base import Neuron, check_last_axis
from .linear import Linear

__all__ = ["LRU"]


def _modulus(nu_log: jax.Array) -> jax.Array:
    """``|λ| = exp(−exp(ν))``."""
    return jnp.exp(-jnp.exp(nu_log))


class LRU(Neuron):
    """Linear recurrent unit::

        λ = exp(−exp(ν) + i exp(θ))              per unit, |λ| < 1
        h^t = λ ⊙ h^{t−1} + γ ⊙ (B x^t),          γ = √(1 − |λ|²),  B = B_re + i B_im
        y^t = Re(C h^t) + b                        one Linear on [Re h, Im h]

    The complex state is two hidden states, ``re`` and ``im``; per unit they rotate
    into each other (a 2×2 Jacobian), so the compiler makes them one group of ``S = 2``
    and D-RTRL gives BPTT's gradient for ``B``, ``ν`` and ``θ`` (``C`` reads the state
    and gets its exact one-step gradient). ``ν`` and ``θ`` are read through the
    elementwise ETP op; ``B_re``, ``B_im`` and ``C`` are :class:`Linear` layers.

    Shapes: ``x: (B, in_size)`` → ``y: (B, out_size)``; states ``re, im: (B, hidden_size)``.

    Args:
        in_size, hidden_size: input features and complex units.
        out_size: output features (default ``in_size``).
        r_min, r_max: the range of ``|λ|`` at initialisation (uniform on the ring
            between them, as in the paper); max_phase: the range of the phase.
        seed: for the initialisation of ``ν`` and ``θ`` (numpy; the Linear layers use
            brainstate's random state).

    Example::

        lru = LRU(16, 64, 10); brainstate.nn.init_all_states(lru, batch_size=8)
        y = lru(jnp.ones((8, 16)))        # (8, 10)
    """

    def __init__(self, in_size: int, hidden_size: int, out_size: int | None = None, *, r_min: float = 0.4,
                 r_max: float = 0.99, max_phase: float = 2 * math.pi, seed: int = 0, name: str | None = None):
        super().__init__(hidden_size, name=name)
        if not 0.0 <= r_min < r_max < 1.0:
            raise ConfigError(f"LRU({in_size}, {hidden_size}): need 0 <= r_min < r_max < 1, got r_min={r_min}, "
                              f"r_max={r_max}")
        out_size = in_size if out_size is None else out_size
        self.in_features, self.hidden_size, self.out_features = in_size, hidden_size, out_size
        self._summary = f"{in_size}, {hidden_size}, {out_size}"
        self.in_size, self.out_size = (in_size,), (out_size,)
        rng = np.random.default_rng(seed)
        radius = np.sqrt(rng.uniform(size=hidden_size) * (r_max ** 2 - r_min ** 2) + r_min ** 2)
        dtype = brainstate.environ.dftype()
        self.nu_log = brainstate.ParamState(jnp.asarray(np.log(-np.log(radius)), dtype))
        self.theta_log = brainstate.ParamState(jnp.asarray(np.log(max_phase * rng.uniform(size=hidden_size) + 1e-3),
                                                           dtype))
        scale = brainstate.nn.init.Normal(scale=1.0 / math.sqrt(2 * in_size))
        self.B_re = Linear(in_size, hidden_size, w_init=scale, with_bias=False)
        self.B_im = Linear(in_size, hidden_size, w_init=scale, with_bias=False)
        self.C = Linear(2 * hidden_size, out_size, w_init=brainstate.nn.init.Normal(scale=1.0 / math.sqrt(hidden_size)))
        self.hidden("re", init=0.0)
        self.hidden("im", init=0.0)

    def update(self, x: Any) -> jax.Array:
        check_last_axis(self, x, self.in_features)
        modulus = ops.elementwise(self.nu_log.value, fn=_modulus)
        phase = ops.elementwise(self.theta_log.value, fn=jnp.exp)
        gamma = jnp.sqrt(1.0 - modulus ** 2)
        cos, sin = modulus * jnp.cos(phase), modulus * jnp.sin(phase)
        re, im = self.re.value, self.im.value
        self.re.value = cos * re - sin * im + gamma * self.B_re(x)
        self.im.value = sin * re + cos * im + gamma * self.B_im(x)
        return self.C(jnp.concatenate([self.re.value, self.im.value], axis=-1))

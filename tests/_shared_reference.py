"""Reference pieces several test packages use, written independently of etrace_fit:
surrogate pseudo-derivatives, a spike function built from them, and random weights."""

from __future__ import annotations

import brainstate
import jax
import jax.numpy as jnp
import numpy as np


def sigmoid_d(v, alpha=4.0, scale=1.0):
    s = 1.0 / (1.0 + jnp.exp(-alpha * v))
    return scale * alpha * s * (1.0 - s)


def triangle_d(v, width=1.0, scale=1.0):
    return scale * jnp.maximum(0.0, 1.0 - jnp.abs(v) / width) / width


def fast_sigmoid_d(v, alpha=10.0, scale=1.0):
    return scale / (1.0 + alpha * jnp.abs(v)) ** 2


PSEUDO_DERIVATIVES = {"sigmoid": sigmoid_d, "triangle": triangle_d, "fast_sigmoid": fast_sigmoid_d}


def spike_function(deriv):
    """Heaviside ``v > 0`` whose derivative is ``deriv(v)``."""

    @jax.custom_jvp
    def spike(v):
        return (v > 0).astype(v.dtype)

    @spike.defjvp
    def _jvp(primals, tangents):
        (v,), (dv,) = primals, tangents
        return spike(v), deriv(v) * dv

    return spike


def randomize(module, seed=0, scale=1.0, bias_scale=0.5):
    """Fresh random values for every dict-valued ``ParamState`` of ``module`` (Linear,
    conv and readout weights): ``W ~ N(0, scale²/fan_in)``, ``b ~ N(0, bias_scale²)``."""
    rng = np.random.default_rng(seed)
    for _, state in sorted(module.states(brainstate.ParamState).items()):
        value = state.value
        if not isinstance(value, dict):
            continue
        new = {}
        for key in sorted(value):
            leaf = value[key]
            std = scale / np.sqrt(np.prod(leaf.shape[:-1])) if key == "weight" else bias_scale
            new[key] = jnp.asarray(rng.standard_normal(leaf.shape) * std, dtype=leaf.dtype)
        state.value = new
    return module

"""Surrogate spike functions (etrace_fit/layers/surrogate.py): Heaviside forward,
documented pseudo-derivative backward."""

from __future__ import annotations

import dataclasses

import brainstate

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from etrace_fit import layers as L
from etrace_fit.errors import ConfigError
from etrace_fit.layers import FastSigmoid, Sigmoid, Surrogate, Triangle, get_surrogate

POINTS = np.array([-3.0, -1.2, -1.0, -0.7, -0.25, -1e-3, 0.0, 1e-3, 0.3, 0.5, 0.999, 1.0, 2.0, 4.0], dtype=np.float32)


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


# documented pseudo-derivatives, in numpy (float64)
DOCUMENTED = {
    Sigmoid: lambda v, s: s.scale * s.alpha * _sigmoid(s.alpha * v) * (1.0 - _sigmoid(s.alpha * v)),
    Triangle: lambda v, s: s.scale * np.maximum(0.0, 1.0 - np.abs(v) / s.width) / s.width,
    FastSigmoid: lambda v, s: s.scale / (1.0 + s.alpha * np.abs(v)) ** 2,
}

INSTANCES = [
    Sigmoid(), Sigmoid(alpha=2.0), Sigmoid(alpha=10.0, scale=0.5),
    Triangle(), Triangle(width=0.5), Triangle(width=2.0, scale=0.3),
    FastSigmoid(), FastSigmoid(alpha=1.0), FastSigmoid(alpha=25.0, scale=2.0),
]


@pytest.mark.parametrize("surrogate", INSTANCES, ids=repr)
def test_forward_is_heaviside(surrogate):
    v = jnp.asarray(POINTS)
    z = surrogate(v)
    assert z.dtype == jnp.float32 and z.shape == v.shape
    np.testing.assert_array_equal(np.asarray(z), (POINTS > 0).astype(np.float32))
    assert float(surrogate(jnp.float32(0.0))) == 0.0  # strictly greater than zero
    assert set(np.unique(np.asarray(surrogate(jnp.linspace(-5, 5, 101))))) == {0.0, 1.0}


def _peak(s):
    """The maximum of the pseudo-derivative (at v = 0): float32 errors scale with it."""
    return {Sigmoid: lambda: s.scale * s.alpha / 4, Triangle: lambda: s.scale / s.width,
            FastSigmoid: lambda: s.scale}[type(s)]()


@pytest.mark.parametrize("surrogate", INSTANCES, ids=repr)
def test_gradient_is_documented_pseudo_derivative(surrogate):
    grad = jax.vmap(jax.grad(lambda v: surrogate(v)))(jnp.asarray(POINTS))
    assert grad.dtype == jnp.float32
    expected = DOCUMENTED[type(surrogate)](POINTS.astype(np.float64), surrogate)
    atol = 1e-6 * _peak(surrogate)
    np.testing.assert_allclose(np.asarray(grad), expected, rtol=1e-5, atol=atol)
    # .derivative is the same function
    np.testing.assert_allclose(np.asarray(surrogate.derivative(jnp.asarray(POINTS))), expected, rtol=1e-5, atol=atol)


@pytest.mark.parametrize("surrogate", INSTANCES, ids=repr)
def test_gradient_float64(surrogate):
    with brainstate.environ.context(precision=64):
        v = jnp.asarray(POINTS.astype(np.float64))
        assert surrogate(v).dtype == jnp.float64
        grad = jax.vmap(jax.grad(surrogate))(v)
        assert grad.dtype == jnp.float64
        expected = DOCUMENTED[type(surrogate)](np.asarray(v), surrogate)
        np.testing.assert_allclose(np.asarray(grad), expected, rtol=1e-9, atol=1e-12 * _peak(surrogate))


@pytest.mark.parametrize("cls", [Sigmoid, Triangle, FastSigmoid])
def test_default_values(cls):
    s = cls()
    assert s.scale == 1.0
    if cls is Triangle:
        assert s.width == 1.0
        assert float(jax.grad(s)(jnp.float32(0.0))) == pytest.approx(1.0)
    elif cls is Sigmoid:
        assert s.alpha == 4.0
        assert float(jax.grad(s)(jnp.float32(0.0))) == pytest.approx(1.0)  # alpha * 1/4
    else:
        assert s.alpha == 10.0
        assert float(jax.grad(s)(jnp.float32(0.0))) == pytest.approx(1.0)
        assert float(jax.grad(s)(jnp.float32(0.1))) == pytest.approx(0.25)


@pytest.mark.parametrize("cls", [Sigmoid, Triangle, FastSigmoid])
@pytest.mark.parametrize("scale", [0.3, 2.5])
def test_scale_multiplies_the_derivative(cls, scale):
    v = jnp.asarray(POINTS)
    base = jax.vmap(jax.grad(cls()))(v)
    scaled = jax.vmap(jax.grad(cls(scale=scale)))(v)
    np.testing.assert_allclose(np.asarray(scaled), scale * np.asarray(base), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(cls(scale=scale)(v)), np.asarray(cls()(v)))


def test_gradient_chains_and_jits():
    s = Triangle(width=1.0, scale=0.3)
    f = jax.jit(jax.grad(lambda v: jnp.sum(s(2.0 * v - 1.0) * jnp.arange(3.0))))
    v = jnp.asarray([0.5, 0.6, 2.0])
    # d/dv s(2v-1) = 2 * 0.3 * max(0, 1-|2v-1|)
    expected = 2 * 0.3 * np.maximum(0, 1 - np.abs(2 * np.asarray(v) - 1)) * np.arange(3.0)
    np.testing.assert_allclose(np.asarray(f(v)), expected, rtol=1e-6)


def test_get_surrogate_by_name():
    assert get_surrogate("sigmoid") == Sigmoid()
    assert get_surrogate("triangle") == Triangle()
    assert get_surrogate("fast_sigmoid") == FastSigmoid()
    assert get_surrogate("triangle", 0.3) == Triangle(scale=0.3)


def test_get_surrogate_instance_and_scale_override():
    s = FastSigmoid(alpha=3.0, scale=2.0)
    assert get_surrogate(s) is s
    t = get_surrogate(s, 0.5)
    assert t == FastSigmoid(alpha=3.0, scale=0.5)
    assert s.scale == 2.0  # the original is unchanged (frozen)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.scale = 1.0


def test_get_surrogate_errors():
    with pytest.raises(ConfigError) as info:
        get_surrogate("nope")
    message = str(info.value)
    assert "'nope'" in message
    for name in ("sigmoid", "triangle", "fast_sigmoid"):
        assert name in message
    with pytest.raises(ConfigError, match="Surrogate"):
        get_surrogate(lambda v: v)


def test_custom_surrogate_subclass():
    @dataclasses.dataclass(frozen=True)
    class Box(Surrogate):
        def derivative(self, v):
            return self.scale * (jnp.abs(v) < 0.5).astype(v.dtype)

    s = get_surrogate(Box(), 3.0)
    v = jnp.asarray([-1.0, -0.2, 0.2, 1.0])
    np.testing.assert_array_equal(np.asarray(s(v)), [0.0, 0.0, 1.0, 1.0])
    np.testing.assert_array_equal(np.asarray(jax.vmap(jax.grad(s))(v)), [0.0, 3.0, 3.0, 0.0])


def test_hashable_for_jit_caches():
    assert hash(Triangle(width=0.5)) == hash(Triangle(width=0.5))
    assert L.get_surrogate("sigmoid", 2.0) == Sigmoid(scale=2.0)


def test_base_class_has_no_derivative():
    with pytest.raises(NotImplementedError):
        jax.grad(Surrogate())(jnp.float32(0.5))


@pytest.mark.parametrize("make, match", [
    (lambda: Triangle(scale=0.0), r"Triangle: scale must be a positive finite number, got 0.0"),
    (lambda: Sigmoid(scale=-1.0), r"Sigmoid: scale must be a positive finite number, got -1.0"),
    (lambda: Triangle(width=0.0), r"Triangle: width must be a positive finite number, got 0.0"),
    (lambda: Sigmoid(alpha=-4.0), r"Sigmoid: alpha must be a positive finite number, got -4.0"),
    (lambda: FastSigmoid(alpha=float("nan")), r"FastSigmoid: alpha must be a positive finite number, got nan"),
    (lambda: get_surrogate("triangle", 0), r"Triangle: scale must be a positive finite number, got 0"),
    (lambda: L.LIF(8, surrogate_scale=-1.0), r"LIF\(8\): Triangle: scale must be .*\(from surrogate_scale\)"),
])
def test_a_setting_that_zeroes_or_flips_the_spike_gradient_is_refused(make, match):
    """Each was taken: a scale of 0 gave exactly zero gradients, a negative scale or
    alpha gradients pointing the wrong way (cosine -0.93), a width of 0 NaN."""
    with pytest.raises(ConfigError, match=match):
        make()

"""Stateless layers without weights or with per-feature parameters: activations,
pooling, and normalisation.

Activations and pooling have no parameters. The normalisation layers' scale and bias
are per-feature parameters read through the elementwise ETP op (``layers.read``), so
the compiler sees them and every rule trains them. Normalisation and pooling mix units:
a weight whose output passes through them before reaching a neuron's state is related
to it by the compiler as a non-elementwise path (the compile report says how it is
traced); put them on inputs, or after the recurrent layers, where that does not arise.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import brainstate
import jax
import jax.numpy as jnp

from ..errors import ConfigError, ShapeError
from .base import check_last_axis, describe, parameter, read, training

__all__ = ["ACTIVATIONS", "Activation", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveMaxPool1d",
           "AdaptiveMaxPool2d", "AvgPool1d", "AvgPool2d", "BatchNorm", "BatchNorm1d", "BatchNorm2d", "GELU",
           "GroupNorm", "LayerNorm", "LeakyReLU", "MaxPool1d",
           "MaxPool2d", "RMSNorm", "ReLU", "SiLU", "Sigmoid", "Softplus", "Tanh"]

#: The names :class:`Activation` takes (Keras' ``Activation("relu")``).
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": jax.nn.relu, "tanh": jnp.tanh, "sigmoid": jax.nn.sigmoid, "gelu": jax.nn.gelu, "silu": jax.nn.silu,
    "swish": jax.nn.silu, "softplus": jax.nn.softplus, "elu": jax.nn.elu, "selu": jax.nn.selu,
    "leaky_relu": jax.nn.leaky_relu, "softsign": jax.nn.soft_sign, "linear": lambda x: x,
}


# ------------------------------------------------------------------ activations
class Activation(brainstate.nn.Module):
    """``y = fn(x)`` elementwise: ``fn`` a name of :data:`ACTIVATIONS` (``"relu"``,
    ``"tanh"``, ``"sigmoid"``, ...) or a function of one array. The subclasses
    (:class:`ReLU`, :class:`Tanh`, ...) fix it.

    Example::

        model = ef.Sequential(Linear(10, 32), Activation("relu"), Linear(32, 2))
    """

    fn: Callable[[jax.Array], jax.Array] = staticmethod(lambda x: x)

    def __init__(self, fn: str | Callable[[jax.Array], jax.Array] | None = None, *, name: str | None = None):
        super().__init__(name=name)
        if isinstance(fn, str):
            if fn not in ACTIVATIONS:
                raise ConfigError(f"Activation: unknown activation {fn!r}; valid: {', '.join(ACTIVATIONS)}")
            self._summary = fn
            fn = ACTIVATIONS[fn]
        if fn is not None:
            if not callable(fn):
                raise ConfigError(f"Activation: fn must be a name or a callable, got {type(fn).__name__}")
            self.fn = fn

    def update(self, x: Any) -> jax.Array:
        return self.fn(x)


class ReLU(Activation):
    """``max(x, 0)``."""

    fn = staticmethod(jax.nn.relu)


class Tanh(Activation):
    """``tanh(x)``."""

    fn = staticmethod(jnp.tanh)


class Sigmoid(Activation):
    """``1 / (1 + exp(−x))``."""

    fn = staticmethod(jax.nn.sigmoid)


class GELU(Activation):
    """Gaussian error linear unit (the tanh approximation, as ``jax.nn.gelu``)."""

    fn = staticmethod(jax.nn.gelu)


class SiLU(Activation):
    """``x · σ(x)`` (swish)."""

    fn = staticmethod(jax.nn.silu)


class Softplus(Activation):
    """``log(1 + exp(x))``."""

    fn = staticmethod(jax.nn.softplus)


class LeakyReLU(Activation):
    """``x`` for ``x > 0``, else ``negative_slope · x``."""

    def __init__(self, negative_slope: float = 0.01, *, name: str | None = None):
        super().__init__(name=name)
        self.negative_slope = negative_slope

    def update(self, x: Any) -> jax.Array:
        return jax.nn.leaky_relu(x, self.negative_slope)


# ------------------------------------------------------------------ pooling
def _tuple(value: int | Sequence[int], n: int, what: str, layer: str) -> tuple[int, ...]:
    values = (value,) * n if isinstance(value, int) else tuple(value)
    if len(values) != n or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
        raise ConfigError(f"{layer}: {what} must be a positive int or {n} of them, got {value!r}")
    return values


class _Pool(brainstate.nn.Module):
    spatial: int = 1
    kind: str = "avg"

    def __init__(self, kernel_size: int | Sequence[int], stride: int | Sequence[int] | None = None,
                 padding: str = "VALID", *, name: str | None = None):
        super().__init__(name=name)
        label = type(self).__name__
        self.kernel_size = _tuple(kernel_size, self.spatial, "kernel_size", label)
        self.stride = self.kernel_size if stride is None else _tuple(stride, self.spatial, "stride", label)
        if padding not in ("VALID", "SAME"):
            raise ConfigError(f"{label}: padding must be 'VALID' or 'SAME', got {padding!r}")
        self.padding = padding
        self._summary = f"{self.kernel_size}"

    def update(self, x: Any) -> jax.Array:
        shape = tuple(jnp.shape(x))
        if len(shape) < self.spatial + 1:
            raise ShapeError(f"{describe(self)}: expected (B, {'L' if self.spatial == 1 else 'H, W'}, C) channels-last "
                             f"input, got x.shape={shape}")
        lead = len(shape) - self.spatial - 1
        window = (1,) * lead + self.kernel_size + (1,)
        strides = (1,) * lead + self.stride + (1,)
        if self.kind == "max":
            return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, window, strides, self.padding)
        total = jax.lax.reduce_window(x, 0.0, jax.lax.add, window, strides, self.padding)
        if self.padding == "VALID":
            return total / math.prod(self.kernel_size)
        counts = jax.lax.reduce_window(jnp.ones(shape[lead:], x.dtype), 0.0, jax.lax.add, window[lead:],
                                       strides[lead:], self.padding)
        return total / counts


class AvgPool1d(_Pool):
    """Average over windows of ``kernel_size`` steps along ``L``: ``(B, L, C) →
    (B, L', C)`` (channels last, as :class:`Conv1d`); ``stride`` defaults to the
    kernel size; ``padding`` ``"VALID"`` or ``"SAME"`` (averages over real entries)."""

    spatial, kind = 1, "avg"


class MaxPool1d(_Pool):
    """Maximum over windows along ``L``: ``(B, L, C) → (B, L', C)``."""

    spatial, kind = 1, "max"


class AvgPool2d(_Pool):
    """Average over ``kh × kw`` windows: ``(B, H, W, C) → (B, H', W', C)`` (NHWC, as
    :class:`Conv2d`)."""

    spatial, kind = 2, "avg"


class MaxPool2d(_Pool):
    """Maximum over ``kh × kw`` windows: ``(B, H, W, C) → (B, H', W', C)``. The
    gradient flows to the largest entry of each window."""

    spatial, kind = 2, "max"


class _AdaptivePool(brainstate.nn.Module):
    spatial: int = 1
    kind: str = "avg"

    def __init__(self, output_size: int | Sequence[int], *, name: str | None = None):
        super().__init__(name=name)
        self.output_size = _tuple(output_size, self.spatial, "output_size", type(self).__name__)
        self._summary = f"{self.output_size}"

    def update(self, x: Any) -> jax.Array:
        shape = tuple(jnp.shape(x))
        axes = "L" if self.spatial == 1 else "H, W"
        if len(shape) < self.spatial + 1:
            raise ShapeError(f"{describe(self)}: expected (B, {axes}, C) channels-last input, got x.shape={shape}")
        lead = len(shape) - self.spatial - 1
        for axis, (size, out) in enumerate(zip(shape[lead:lead + self.spatial], self.output_size)):
            if size < out:
                raise ShapeError(f"{describe(self)}: spatial axis {axis} of x.shape={shape} has {size} entries, "
                                 f"fewer than the {out} bins of output_size={self.output_size}")
        reduce = jnp.max if self.kind == "max" else jnp.mean
        for axis, out in enumerate(self.output_size):  # one spatial axis at a time (the bins are separable)
            position = lead + axis
            size = x.shape[position]
            bins = [jax.lax.slice_in_dim(x, (i * size) // out, -(-((i + 1) * size) // out), axis=position)
                    for i in range(out)]
            x = jnp.stack([reduce(b, axis=position) for b in bins], axis=position)
        return x


class AdaptiveAvgPool1d(_AdaptivePool):
    """Average over ``output_size`` bins along ``L``: ``(B, L, C) → (B, output_size, C)``
    whatever ``L`` is. Bin ``i`` covers ``[⌊iL/n⌋, ⌈(i+1)L/n⌉)`` (PyTorch's bins: they
    overlap when ``n`` does not divide ``L``)."""

    spatial, kind = 1, "avg"


class AdaptiveMaxPool1d(_AdaptivePool):
    """Maximum over ``output_size`` bins along ``L``: ``(B, L, C) → (B, output_size, C)``
    (bins as :class:`AdaptiveAvgPool1d`)."""

    spatial, kind = 1, "max"


class AdaptiveAvgPool2d(_AdaptivePool):
    """Average over an ``output_size = (h, w)`` grid of bins: ``(B, H, W, C) → (B, h, w, C)``
    whatever ``H, W`` are (bins per axis as :class:`AdaptiveAvgPool1d`). ``output_size=1``
    is global average pooling."""

    spatial, kind = 2, "avg"


class AdaptiveMaxPool2d(_AdaptivePool):
    """Maximum over an ``output_size = (h, w)`` grid of bins: ``(B, H, W, C) → (B, h, w, C)``."""

    spatial, kind = 2, "max"


# ------------------------------------------------------------------ normalisation
class _Norm(brainstate.nn.Module):
    def __init__(self, size: int, eps: float, learn_scale: bool, learn_bias: bool, name: str | None):
        super().__init__(name=name)
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ConfigError(f"{type(self).__name__}: size must be a positive int, got {size!r}")
        if not eps > 0:
            raise ConfigError(f"{type(self).__name__}({size}): eps must be positive, got {eps}")
        self.features, self.eps = size, eps
        self.in_size = self.out_size = (size,)
        self._summary = f"{size}"
        self.scale = parameter(self, 1.0, size, learn_scale, "scale")
        self.bias = parameter(self, 0.0, size, learn_bias, "bias") if learn_bias is not None else None

    def _affine(self, normed: jax.Array) -> jax.Array:
        out = normed * read(self.scale)
        return out if self.bias is None else out + read(self.bias)


class LayerNorm(_Norm):
    """``(x − mean) / √(var + eps) · scale + bias`` over the last axis (per sample and
    step, so online rules see no coupling between samples). ``scale`` and ``bias`` are
    per-feature ``ParamState``s read through the elementwise ETP op.

    Shapes: ``x: (..., size)`` → same.
    """

    def __init__(self, size: int, *, eps: float = 1e-5, learn_scale: bool = True, learn_bias: bool = True,
                 name: str | None = None):
        super().__init__(size, eps, learn_scale, learn_bias, name)

    def update(self, x: Any) -> jax.Array:
        check_last_axis(self, x, self.features)
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        return self._affine((x - mean) * jax.lax.rsqrt(var + self.eps))


class RMSNorm(_Norm):
    """``x / √(mean(x²) + eps) · scale`` over the last axis (Zhang and Sennrich 2019);
    no bias. Shapes: ``x: (..., size)`` → same."""

    def __init__(self, size: int, *, eps: float = 1e-6, learn_scale: bool = True, name: str | None = None):
        super().__init__(size, eps, learn_scale, None, name)

    def update(self, x: Any) -> jax.Array:
        check_last_axis(self, x, self.features)
        return self._affine(x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + self.eps))


class GroupNorm(_Norm):
    """``(x − mean) / √(var + eps) · scale + bias`` with the statistics of each sample
    over its spatial axes and the channels of each of ``groups`` groups (Wu and He
    2018; ``groups=1`` is LayerNorm over all feature axes, ``groups=size`` instance
    norm). Channels last: ``x: (B, ..., size)`` → same.
    """

    def __init__(self, groups: int, size: int, *, eps: float = 1e-5, learn_scale: bool = True,
                 learn_bias: bool = True, name: str | None = None):
        if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
            raise ConfigError(f"GroupNorm: groups must be a positive int, got {groups!r}")
        super().__init__(size, eps, learn_scale, learn_bias, name)
        if size % groups:
            raise ConfigError(f"GroupNorm({groups}, {size}): {size} channels do not split into {groups} groups")
        self.groups = groups
        self._summary = f"{groups}, {size}"

    def update(self, x: Any) -> jax.Array:
        check_last_axis(self, x, self.features)
        if jnp.ndim(x) < 2:
            raise ShapeError(f"{describe(self)}: expected (B, ..., {self.features}), got x.shape={tuple(jnp.shape(x))}")
        shape = jnp.shape(x)
        grouped = jnp.reshape(x, (*shape[:-1], self.groups, self.features // self.groups))
        axes = tuple(range(1, grouped.ndim - 2)) + (grouped.ndim - 1,)  # spatial axes and the group's channels
        mean = jnp.mean(grouped, axis=axes, keepdims=True)
        var = jnp.mean(jnp.square(grouped - mean), axis=axes, keepdims=True)
        return self._affine(jnp.reshape((grouped - mean) * jax.lax.rsqrt(var + self.eps), shape))


class RunningStats(brainstate.LongTermState):
    """A batch norm's running ``{"mean", "var"}`` per channel: updated by training steps,
    read in evaluation, carried across batches and saved in checkpoints."""


class BatchNorm(_Norm):
    """Keras' ``BatchNormalization`` over the last (channel) axis, one time step at a time.

    In training (``fit``) each step normalises with the statistics of its batch over
    every axis but the channels, ``(x − μ_B) / √(σ²_B + eps) · scale + bias``, and moves
    the running statistics: ``m ← momentum · m + (1 − momentum) · μ_B`` (and the same
    for the variance, unbiased as in Keras), at every step. In evaluation it uses the
    running statistics and changes nothing.

    Online gradients: the batch statistics couple the samples, and a normalisation
    mixes what the weight before it drives. The exact one-step part of that weight's
    gradient (through the statistics) is kept; its history through a neuron after the
    norm is not (the compiler names it, "… which mixes units"). Put it where nothing
    trainable feeds a neuron through it (after the recurrent layers), or measure the
    gap with ``ef.gradient_fidelity``; BPTT differentiates through everything.

    Shapes: ``x: (B, ..., size)`` → same; at least 2 samples per batch in training.

    Args:
        size: channels (the last axis).
        momentum, eps: Keras' defaults 0.99 and 1e-3.
        learn_scale, learn_bias: per-channel ``ParamState``s through the elementwise ETP op.
    """

    def __init__(self, size: int, *, momentum: float = 0.99, eps: float = 1e-3, learn_scale: bool = True,
                 learn_bias: bool = True, name: str | None = None):
        super().__init__(size, eps, learn_scale, learn_bias, name)
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0.0 <= momentum < 1.0:
            raise ConfigError(f"{type(self).__name__}({size}): momentum must be in [0, 1), got {momentum!r}")
        self.momentum = float(momentum)
        self.stats = RunningStats({"mean": jnp.zeros((size,), brainstate.environ.dftype()),
                                   "var": jnp.ones((size,), brainstate.environ.dftype())})

    def update(self, x: Any) -> jax.Array:
        check_last_axis(self, x, self.features)
        self._check_rank(x)
        stats = self.stats.value
        if not training():
            mean, var = stats["mean"].astype(x.dtype), stats["var"].astype(x.dtype)
            return self._affine((x - mean) * jax.lax.rsqrt(var + self.eps))
        axes = tuple(range(jnp.ndim(x) - 1))
        count = math.prod(jnp.shape(x)[:-1])
        if count < 2:
            raise ShapeError(f"{describe(self)}: training needs at least 2 values per channel to normalise over, got "
                             f"x.shape={tuple(jnp.shape(x))}")
        mean = jnp.mean(x, axis=axes)
        var = jnp.mean(jnp.square(x - mean), axis=axes)
        m = self.momentum
        moved = jax.lax.stop_gradient((mean, var * count / (count - 1)))
        self.stats.value = {"mean": (m * stats["mean"] + (1 - m) * moved[0]).astype(stats["mean"].dtype),
                            "var": (m * stats["var"] + (1 - m) * moved[1]).astype(stats["var"].dtype)}
        return self._affine((x - mean) * jax.lax.rsqrt(var + self.eps))

    def _check_rank(self, x: Any) -> None:
        pass


class BatchNorm1d(BatchNorm):
    """:class:`BatchNorm` of ``(B, size)`` or ``(B, L, size)`` inputs."""

    def _check_rank(self, x: Any) -> None:
        if jnp.ndim(x) not in (2, 3):
            raise ShapeError(f"{describe(self)}: expected (B, {self.features}) or (B, L, {self.features}), got "
                             f"x.shape={tuple(jnp.shape(x))}")


class BatchNorm2d(BatchNorm):
    """:class:`BatchNorm` of ``(B, H, W, size)`` inputs (channels last)."""

    def _check_rank(self, x: Any) -> None:
        if jnp.ndim(x) != 4:
            raise ShapeError(f"{describe(self)}: expected (B, H, W, {self.features}), got x.shape={tuple(jnp.shape(x))}")

"""Stateless weight layers: :class:`Linear`, :class:`Conv1d`, :class:`Conv2d`, :class:`Flatten`.

Each weight goes through an ETP op (``etrace_fit.ops``) so the compiler can see it.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import brainstate
import jax
import jax.numpy as jnp
import numpy as np

from .. import ops
from ..errors import ConfigError, ShapeError
from .base import check_last_axis, describe, make_param, weight_state

__all__ = ["Conv1d", "Conv2d", "Conv3d", "Embedding", "Flatten", "Linear", "LoRALinear", "SparseLinear"]

WeightFn = Callable[[jax.Array], jax.Array]


def _weight_fn(mask: Any, weight_fn: WeightFn | None, shape: tuple[int, ...], layer: Any) -> WeightFn | None:
    """The mask (applied first) chained with the user's weight function."""
    fns = []
    if mask is not None:
        mask_shape = tuple(jnp.shape(mask))
        try:
            jnp.broadcast_shapes(mask_shape, shape)
        except ValueError:
            raise ShapeError(f"{describe(layer)}: mask of shape {mask_shape} does not broadcast to the weight's {shape}") from None
        fns.append(ops.Masked(mask))
    if weight_fn is not None:
        if not callable(weight_fn):
            raise ConfigError(f"{describe(layer)}: weight_fn must be callable, got {type(weight_fn).__name__}")
        fns.append(weight_fn)
    if not fns:
        return None
    return fns[0] if len(fns) == 1 else ops.Chain(tuple(fns))


def _positive_int(layer_name: str, name: str, value: Any) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{layer_name}: {name} must be a positive int, got {value!r}")
    return int(value)  # a numpy int (a size computed with numpy) as a Python one


class Linear(brainstate.nn.Module):
    """Dense layer ``y = x @ weight_fn(W ⊙ mask) + b``.

    Shapes: ``x: (..., in_size)`` → ``y: (..., out_size)``; ``W: (in_size, out_size)``,
    ``b: (out_size,)``, both in one ``ParamState`` ``self.weight`` as
    ``{"weight": W, "bias": b}``.

    Args:
        in_size, out_size: feature sizes.
        w_init, b_init: initializers (``brainstate.nn.init``) or arrays.
        with_bias: whether to learn ``b``.
        mask: optional array broadcastable to ``W``; zeros cut connections.
        weight_fn: optional shape-preserving function of ``W`` (e.g. ``ops.Positive()``).
        w_constraint, b_constraint: Keras' ``kernel_constraint`` / ``bias_constraint``:
            a projection of ``W`` (of ``W ⊙ mask`` with a mask) and of ``b`` after every
            optimizer update (:mod:`etrace_fit.constraints`: ``MaxNorm(2.0)``,
            ``"non_neg"``, or a function); ``self.weight`` is then a
            :class:`~etrace_fit.layers.Constrained` state.

    Example::

        layer = Linear(40, 100)
        y = layer(jnp.ones((8, 40)))      # (8, 100)
        layer.weight.value["weight"]      # (40, 100)
    """

    def __init__(
        self,
        in_size: int,
        out_size: int,
        *,
        w_init: Any = None,
        b_init: Any = None,
        with_bias: bool = True,
        mask: Any = None,
        weight_fn: WeightFn | None = None,
        w_constraint: Any = None,
        b_constraint: Any = None,
        name: str | None = None,
    ):
        super().__init__(name=name)
        self.in_features = _positive_int("Linear", "in_size", in_size)
        self.out_features = _positive_int("Linear", "out_size", out_size)
        self._summary = f"{in_size}, {out_size}"
        self.in_size = (in_size,)
        self.out_size = (out_size,)
        shape = (in_size, out_size)
        w_init = brainstate.nn.init.KaimingNormal(scale=1.0) if w_init is None else w_init
        params = {"weight": make_param(w_init, shape, "w_init", self)}
        if with_bias:
            b_init = brainstate.nn.init.ZeroInit() if b_init is None else b_init
            params["bias"] = make_param(b_init, (out_size,), "b_init", self)
        self.weight_fn = _weight_fn(mask, weight_fn, shape, self)
        self.weight = weight_state(self, params, w_constraint, b_constraint, mask)

    def update(self, x: Any) -> Any:
        check_last_axis(self, x, self.in_features)
        params = self.weight.value
        return ops.matmul(x, params["weight"], params.get("bias"), weight_fn=self.weight_fn)


class SparseLinear(Linear):
    """Dense layer with a fixed sparse connectivity: ``y = x @ (W ⊙ M) + b`` with a
    constant 0/1 mask ``M`` (a random one with the given ``density``, or yours).

    The absent connections stay zero and get no gradient under every rule. The compiler
    sees the mask, so D-RTRL keeps its trace at the present connections only: ``B·N·S``
    numbers for ``N`` connections instead of ``B·in·out·S`` (``N`` at most half the
    matrix; the compile report's trace memory says so). The matmul itself stays dense.

    Shapes: ``x: (..., in_size)`` → ``y: (..., out_size)``; ``W: (in_size, out_size)``
    in ``self.weight`` (as :class:`Linear`'s; entries outside the mask unused), the mask
    in ``self.mask``.

    Args:
        in_size, out_size: sizes.
        density: the fraction of connections present, in ``(0, 1]``: that many
            (rounded, at least one) drawn at random with ``seed`` (numpy, so the
            pattern does not depend on brainstate's random state).
        mask: a 0/1 array of shape ``(in_size, out_size)`` instead of ``density``.
        seed: the seed of the random pattern.
        w_init: default Kaiming normal scaled to the connections present (variance
            ``1 / (density · in_size)``); b_init, with_bias, weight_fn, w_constraint,
            b_constraint: as in :class:`Linear` (a norm constraint counts the connections present).

    Example::

        layer = SparseLinear(784, 100, density=0.1)   # 10 % of the connections
        y = layer(jnp.ones((8, 784)))                  # (8, 100)
    """

    def __init__(self, in_size: int, out_size: int, *, density: float | None = None, mask: Any = None,
                 seed: int = 0, w_init: Any = None, b_init: Any = None, with_bias: bool = True,
                 weight_fn: WeightFn | None = None, w_constraint: Any = None, b_constraint: Any = None,
                 name: str | None = None):
        in_size = _positive_int("SparseLinear", "in_size", in_size)
        out_size = _positive_int("SparseLinear", "out_size", out_size)
        if (density is None) == (mask is None):
            raise ConfigError(f"SparseLinear({in_size}, {out_size}): give density or mask (one of them), got "
                              f"density={density!r}, mask={'None' if mask is None else 'an array'}")
        if mask is None:
            if isinstance(density, bool) or not isinstance(density, (int, float)) or not 0.0 < density <= 1.0:
                raise ConfigError(f"SparseLinear({in_size}, {out_size}): density must be in (0, 1], got {density!r}")
            count = max(1, round(density * in_size * out_size))
            chosen = np.random.default_rng(seed).choice(in_size * out_size, size=count, replace=False)
            mask = np.zeros(in_size * out_size, np.float32)
            mask[chosen] = 1.0
            mask = mask.reshape(in_size, out_size)
        else:
            mask = np.asarray(mask)
            if mask.shape != (in_size, out_size):
                raise ShapeError(f"SparseLinear({in_size}, {out_size}): mask must have shape {(in_size, out_size)}, "
                                 f"got {mask.shape}")
            if not np.isin(mask, (0, 1)).all():
                raise ConfigError(f"SparseLinear({in_size}, {out_size}): mask must hold 0 and 1 only")
            if not mask.any():
                raise ConfigError(f"SparseLinear({in_size}, {out_size}): mask has no connection")
            mask = mask.astype(np.float32)
        density = np.count_nonzero(mask) / mask.size
        if w_init is None:
            w_init = brainstate.nn.init.KaimingNormal(scale=1.0 / density)
        super().__init__(in_size, out_size, w_init=w_init, b_init=b_init, with_bias=with_bias, mask=mask,
                         weight_fn=weight_fn, w_constraint=w_constraint, b_constraint=b_constraint, name=name)
        self.mask, self.density = mask, density
        self._summary = f"{in_size}, {out_size}, density={self.density:.3g}"


class LoRALinear(brainstate.nn.Module):
    """Dense layer with a low-rank adapter (LoRA, Hu et al. 2021; Keras' ``lora_rank``):
    ``y = x @ (W + (alpha / rank) · A @ B) + b``.

    Shapes: ``x: (..., in_size)`` → ``y: (..., out_size)``; the base ``W: (in_size,
    out_size)`` and ``b: (out_size,)`` in ``self.weight`` as ``{"weight": W, "bias": b}``
    (as :class:`Linear`'s); the adapter ``A: (in_size, rank)`` in ``self.lora_a``
    (Kaiming-uniform, as Keras) and ``B: (rank, out_size)`` in ``self.lora_b`` (zeros:
    the layer starts as its base).

    The effective weight is one dense ETP op's weight computed from three parameters: the
    compiler traces it as one relation and every rule trains ``A`` and ``B`` through it
    (their gradients are the effective weight's, mapped back: ``∂A = s ∂W_eff Bᵀ``,
    ``∂B = s Aᵀ ∂W_eff``), exactly where the rule is exact for a ``Linear`` in the same
    place. Its traces have the effective weight's size (``in_size × out_size``): what the
    adapter saves is trainable parameters and optimizer state, not trace memory.

    Args:
        in_size, out_size: feature sizes.
        rank: the adapter's rank ``r``.
        alpha: the scale numerator (default ``rank``: scale 1, as Keras' ``lora_alpha``).
        train_base: also train ``W`` (default False: ``W`` enters through
            ``stop_gradient``, its gradient is zero; ``b`` is trained, as in Keras. Mask
            ``W`` out of an optimizer with weight decay, e.g. ``optax.masked``).
        w_init, b_init: the base's initializers (``brainstate.nn.init``) or arrays.
        with_bias: whether to learn ``b``.

    Example::

        base = Linear(40, 100)
        layer = LoRALinear.from_linear(base, rank=4)   # y equals base(x) until B moves
        layer.lora_a.value.shape, layer.lora_b.value.shape   # (40, 4), (4, 100)
    """

    def __init__(
        self,
        in_size: int,
        out_size: int,
        rank: int,
        *,
        alpha: float | None = None,
        train_base: bool = False,
        w_init: Any = None,
        b_init: Any = None,
        with_bias: bool = True,
        name: str | None = None,
    ):
        super().__init__(name=name)
        self.in_features = _positive_int("LoRALinear", "in_size", in_size)
        self.out_features = _positive_int("LoRALinear", "out_size", out_size)
        self.rank = _positive_int("LoRALinear", "rank", rank)
        if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0):
            raise ConfigError(f"LoRALinear: alpha must be a positive number, got {alpha!r}")
        self.alpha = float(rank if alpha is None else alpha)
        self.train_base = bool(train_base)
        self._summary = f"{in_size}, {out_size}, rank={rank}"
        self.in_size = (in_size,)
        self.out_size = (out_size,)
        w_init = brainstate.nn.init.KaimingNormal(scale=1.0) if w_init is None else w_init
        params = {"weight": make_param(w_init, (in_size, out_size), "w_init", self)}
        if with_bias:
            b_init = brainstate.nn.init.ZeroInit() if b_init is None else b_init
            params["bias"] = make_param(b_init, (out_size,), "b_init", self)
        self.weight = brainstate.ParamState(params)
        self.lora_a = brainstate.ParamState(make_param(brainstate.nn.init.KaimingUniform(), (in_size, rank),
                                                       "lora_a", self))
        self.lora_b = brainstate.ParamState(make_param(brainstate.nn.init.ZeroInit(), (rank, out_size), "lora_b", self))

    @classmethod
    def from_linear(cls, linear: Linear, rank: int, **kwargs: Any) -> "LoRALinear":
        """An adapter on ``linear``'s weight and bias (copied; ``linear`` is unchanged).
        A ``linear`` with a mask or a weight function is refused: the adapter would
        bypass it."""
        if not isinstance(linear, Linear):
            raise ConfigError(f"LoRALinear.from_linear takes a Linear, got {type(linear).__name__}")
        if linear.weight_fn is not None:
            raise ConfigError(f"LoRALinear.from_linear: {describe(linear)} has a mask or weight_fn, which the "
                              "adapter's A @ B would bypass")
        params = linear.weight.value
        layer = cls(linear.in_features, linear.out_features, rank, w_init=params["weight"],
                    b_init=params.get("bias"), with_bias="bias" in params, **kwargs)
        return layer

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def frozen_leaves(self) -> tuple[tuple[str, str], ...]:
        """``(state attribute, leaf)`` of the weights this layer never trains: the base
        ``W`` unless ``train_base`` (Keras counts it as a non-trainable param)."""
        return () if self.train_base else (("weight", "weight"),)

    def effective_weight(self) -> jax.Array:
        """``W + (alpha / rank) · A @ B`` (``W`` through ``stop_gradient`` unless ``train_base``)."""
        base = self.weight.value["weight"]
        base = base if self.train_base else jax.lax.stop_gradient(base)
        return base + self.scale * (self.lora_a.value @ self.lora_b.value)

    def update(self, x: Any) -> Any:
        check_last_axis(self, x, self.in_features)
        return ops.matmul(x, self.effective_weight(), self.weight.value.get("bias"))


class _ConvNd(brainstate.nn.Module):
    num_spatial: int = 0

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        *,
        stride: int | Sequence[int] = 1,
        padding: str | int | Sequence[Any] = "SAME",
        dilation: int | Sequence[int] = 1,
        w_init: Any = None,
        b_init: Any = None,
        with_bias: bool = True,
        mask: Any = None,
        weight_fn: WeightFn | None = None,
        w_constraint: Any = None,
        b_constraint: Any = None,
        name: str | None = None,
    ):
        super().__init__(name=name)
        cls = type(self).__name__
        self.in_channels = _positive_int(cls, "in_channels", in_channels)
        self.out_channels = _positive_int(cls, "out_channels", out_channels)
        kernel = (kernel_size,) * self.num_spatial if isinstance(kernel_size, int) else tuple(kernel_size)
        if len(kernel) != self.num_spatial:
            raise ConfigError(f"{cls}: kernel_size must be an int or {self.num_spatial} ints, got {kernel_size!r}")
        for k in kernel:
            _positive_int(cls, "kernel_size", k)
        self.kernel_size = kernel
        self.stride, self.padding, self.dilation = stride, padding, dilation
        self._summary = f"{in_channels}, {out_channels}, kernel_size={kernel if self.num_spatial > 1 else kernel[0]}"
        shape = (*kernel, in_channels, out_channels)
        w_init = brainstate.nn.init.KaimingNormal(scale=1.0) if w_init is None else w_init
        params = {"weight": make_param(w_init, shape, "w_init", self)}
        if with_bias:
            b_init = brainstate.nn.init.ZeroInit() if b_init is None else b_init
            params["bias"] = make_param(b_init, (out_channels,), "b_init", self)
        self.weight_fn = _weight_fn(mask, weight_fn, shape, self)
        self.weight = weight_state(self, params, w_constraint, b_constraint, mask)

    def update(self, x: Any) -> Any:
        ndim = jnp.ndim(x)
        if ndim not in (self.num_spatial + 1, self.num_spatial + 2):
            layout = {1: "(B, L, C)", 2: "(B, H, W, C)", 3: "(B, D, H, W, C)"}[self.num_spatial]
            raise ShapeError(f"{describe(self)}: expected channels-last input {layout} (batch optional), got x.shape={tuple(jnp.shape(x))}")
        check_last_axis(self, x, self.in_channels, what="channels")
        params = self.weight.value
        return ops.conv(
            x, params["weight"], params.get("bias"),
            stride=self.stride, padding=self.padding, dilation=self.dilation, weight_fn=self.weight_fn,
        )


class Conv1d(_ConvNd):
    """1-D convolution, channels last: ``y[b, l, o] = Σ_{k, c} x[b, l·s + k·d, c] W[k, c, o] + b[o]``.

    Shapes: ``x: (B, L, in_channels)`` (or ``(L, in_channels)``) →
    ``y: (B, L_out, out_channels)``; ``W: (kernel_size, in_channels, out_channels)``.

    Args:
        in_channels, out_channels, kernel_size: sizes.
        stride, padding (``"SAME"``, ``"VALID"``, int or pairs), dilation: geometry.
        w_init, b_init, with_bias, mask, weight_fn, w_constraint, b_constraint: as in :class:`Linear`
            (a norm constraint over the kernel: ``axis=(0, 1, ...)``, every axis but the last).

    Example::

        layer = Conv1d(2, 8, kernel_size=3)
        y = layer(jnp.ones((4, 100, 2)))  # (4, 100, 8)
    """

    num_spatial = 1


class Conv2d(_ConvNd):
    """2-D convolution, channels last (NHWC input, HWIO kernel).

    Shapes: ``x: (B, H, W, in_channels)`` (or without ``B``) →
    ``y: (B, H_out, W_out, out_channels)``; ``W: (KH, KW, in_channels, out_channels)``.

    Args:
        in_channels, out_channels, kernel_size (int or pair): sizes.
        stride, padding, dilation: geometry (int or one per axis).
        w_init, b_init, with_bias, mask, weight_fn, w_constraint, b_constraint: as in :class:`Linear`
            (a norm constraint over the kernel: ``axis=(0, 1, ...)``, every axis but the last).

    Example::

        layer = Conv2d(2, 16, kernel_size=3, stride=2)
        y = layer(jnp.ones((4, 34, 34, 2)))  # (4, 17, 17, 16)
    """

    num_spatial = 2


class Conv3d(_ConvNd):
    """3-D convolution, channels last (NDHWC input, DHWIO kernel): a clip of frames or
    a volume per step (event frames binned in time and space).

    Shapes: ``x: (B, D, H, W, in_channels)`` (or without ``B``) →
    ``y: (B, D_out, H_out, W_out, out_channels)``; ``W: (KD, KH, KW, in_channels, out_channels)``.

    Args:
        in_channels, out_channels, kernel_size (int or three): sizes.
        stride, padding, dilation: geometry (int or one per axis).
        w_init, b_init, with_bias, mask, weight_fn, w_constraint, b_constraint: as in :class:`Linear`
            (a norm constraint over the kernel: ``axis=(0, 1, ...)``, every axis but the last).

    Example::

        layer = Conv3d(2, 8, kernel_size=3)
        y = layer(jnp.ones((4, 5, 16, 16, 2)))  # (4, 5, 16, 16, 8)
    """

    num_spatial = 3


class Flatten(brainstate.nn.Module):
    """Flattens feature axes: ``(B, d1, ..., dk) → (B, d1·…·dk)``.

    With ``num_feature_axes=None`` every axis after the first (the batch axis) is
    flattened; with ``num_feature_axes=k`` the last ``k`` axes are, which also works on
    unbatched input.

    Example::

        flat = Flatten()
        y = flat(jnp.ones((4, 17, 17, 16)))  # (4, 4624)
    """

    def __init__(self, num_feature_axes: int | None = None, *, name: str | None = None):
        super().__init__(name=name)
        if num_feature_axes is not None:
            _positive_int("Flatten", "num_feature_axes", num_feature_axes)
        self.num_feature_axes = num_feature_axes

    def update(self, x: Any) -> Any:
        shape = tuple(jnp.shape(x))
        k = len(shape) - 1 if self.num_feature_axes is None else self.num_feature_axes
        if k < 1 or k > len(shape):
            raise ShapeError(f"{describe(self)}: cannot flatten {k} feature axes of x.shape={shape}")
        return jnp.reshape(x, (*shape[: len(shape) - k], math.prod(shape[len(shape) - k :])))


class Embedding(brainstate.nn.Module):
    """Keras' ``Embedding(input_dim, output_dim)``: integer ids → rows of a learned table,
    ``y = one_hot(ids) @ W`` through the dense ETP op, so the compiler relates ``W`` to
    the hidden states it drives like any ``Linear`` (``Embedding → LIF`` is exact under
    D-RTRL) and every rule trains it.

    Shapes: ``ids: (B, ...)`` integers in ``[0, num_embeddings)`` → ``(B, ..., features)``;
    ``W: (num_embeddings, features)`` in ``self.weight`` as ``{"weight": W}``. An id
    outside the range gives a zero row (inside a jitted step it cannot raise); the one-hot
    product costs ``num_embeddings`` multiply-adds per feature, which suits the small
    vocabularies of sequence tasks (symbols, characters, event channels).

    Args:
        num_embeddings: the number of ids (Keras' ``input_dim``).
        features: the size of each row (Keras' ``output_dim``).
        w_init: initializer or array; default uniform in ``[−0.05, 0.05]`` (Keras').
        w_constraint: Keras' ``embeddings_constraint``, a projection of ``W`` after every
            update (:mod:`etrace_fit.constraints`); ``MaxNorm(m, axis=1)`` bounds each
            row's norm, as PyTorch's ``max_norm``.

    Example::

        embed = Embedding(10, 32)
        y = embed(jnp.array([3, 7]))      # (2, 32)
    """

    def __init__(self, num_embeddings: int, features: int, *, w_init: Any = None, w_constraint: Any = None,
                 name: str | None = None):
        super().__init__(name=name)
        self.num_embeddings = _positive_int("Embedding", "num_embeddings", num_embeddings)
        self.features = _positive_int("Embedding", "features", features)
        self._summary = f"{num_embeddings}, {features}"
        self.out_size = (features,)
        w_init = brainstate.nn.init.Uniform(-0.05, 0.05) if w_init is None else w_init
        self.weight = weight_state(self, {"weight": make_param(w_init, (num_embeddings, features), "w_init", self)},
                                   w_constraint)

    def update(self, ids: Any) -> Any:
        ids = jnp.asarray(ids)
        if not jnp.issubdtype(ids.dtype, jnp.integer):
            raise ConfigError(f"{describe(self)}: ids must be integers, got {ids.dtype} (cast the inputs, e.g. "
                              f"x.astype('int32'); a float input is usually one-hot already: use Linear)")
        table = self.weight.value["weight"]
        return ops.matmul(jax.nn.one_hot(ids, self.num_embeddings, dtype=table.dtype), table)

"""``Sequential``: layers applied in order, one time step per call."""

from __future__ import annotations

from typing import Any, Iterator

import brainstate

from ..errors import ConfigError, EtraceError
from .base import describe
from .surrogate import Surrogate

__all__ = ["Sequential"]


class Sequential(brainstate.nn.Module):
    """Applies ``layers`` in order; one call is one time step of the whole stack.

    States keep their layers' paths under ``layers``: the first layer's weight is at
    ``("layers", 0, "weight")``. An error raised inside a layer is re-raised with the
    layer's index and name in front, so a shape mismatch says which layer it hit.

    Example::

        model = Sequential(Linear(40, 100), LIF(100), Linear(100, 2))
        brainstate.nn.init_all_states(model, batch_size=8)
        y = model(jnp.ones((8, 40)))      # (8, 2)
    """

    def __init__(self, *layers: Any, name: str | None = None):
        super().__init__(name=name)
        for index, layer in enumerate(layers):
            if not callable(layer):
                raise ConfigError(f"Sequential: layer {index} must be a module or a callable, got {type(layer).__name__}")
            if isinstance(layer, Surrogate):
                # layers.Sigmoid is the sigmoid *surrogate* (a 0/1 spike forward): taken for the
                # activation, every output was silently a step function
                raise ConfigError(
                    f"Sequential: layer {index} is layers.{type(layer).__name__}, a surrogate spike function "
                    f"(forward: 1 where x > 0, else 0), not an activation; for the sigmoid activation use "
                    f"layers.Activation('sigmoid'), for spiking neurons a neuron layer (layers.LIF, ...). To "
                    f"threshold on purpose, wrap it: layers.Activation(layers.{type(layer).__name__}())")
        self.layers = list(layers)

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.layers)

    def __getitem__(self, index: int) -> Any:
        return self.layers[index]

    def update(self, x: Any) -> Any:
        for index, layer in enumerate(self.layers):
            try:
                x = layer(x)
            except EtraceError as error:
                raise _located(error, index, layer) from error
        return x


def _located(error: EtraceError, index: int, layer: Any) -> EtraceError:
    """The same error with ``Sequential.layers[i]`` (nested: ``.layers[i].layers[j]``) in front."""
    inner = getattr(error, "_etrace_location", None)
    if inner is None:
        name, message = describe(layer), str(error)
        where = f"layers[{index}]" + ("" if message.startswith(name) else f" {name}:")
        original = message
    else:
        where, original = f"layers[{index}].{inner[0]}", inner[1]
    located = type(error)(f"Sequential.{where} {original}")
    located._etrace_location = (where, original)
    return located

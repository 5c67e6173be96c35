"""``LambdaCallback``: hooks from plain functions."""

from __future__ import annotations

from typing import Callable

from .base import HOOKS, Callback

__all__ = ["LambdaCallback"]


class LambdaCallback(Callback):
    """A callback whose hooks are the functions given by name.

    Args:
        **hooks: any of the hook names (``on_epoch_end=lambda epoch, logs: ...``;
            ``on_batch_begin`` / ``on_batch_end``, tf.keras' names, are the training
            batch hooks).

    Example::

        LambdaCallback(on_epoch_end=lambda epoch, logs: print(epoch, logs["loss"]))
    """

    def __init__(self, **hooks: Callable):
        unknown = sorted(set(hooks) - set(HOOKS) - set(_ALIASES))
        if unknown:
            raise ValueError(f"LambdaCallback: unknown hooks {unknown}; valid: {', '.join((*HOOKS, *_ALIASES))}")
        both = [name for name in _ALIASES if name in hooks and _ALIASES[name] in hooks]
        if both:
            raise ValueError(f"LambdaCallback: {both[0]} and {_ALIASES[both[0]]} are one hook; give one of them")
        for name, function in hooks.items():
            setattr(self, _ALIASES.get(name, name), function)


# tf.keras' LambdaCallback(on_batch_begin=, on_batch_end=): the training batch hooks
_ALIASES = {"on_batch_begin": "on_train_batch_begin", "on_batch_end": "on_train_batch_end"}

"""``LambdaCallback``: hooks from plain functions."""

from __future__ import annotations

from typing import Callable

from .base import HOOKS, Callback

__all__ = ["LambdaCallback"]


class LambdaCallback(Callback):
    """A callback whose hooks are the functions given by name.

    Args:
        **hooks: any of the hook names (``on_epoch_end=lambda epoch, logs: ...``).

    Example::

        LambdaCallback(on_epoch_end=lambda epoch, logs: print(epoch, logs["loss"]))
    """

    def __init__(self, **hooks: Callable):
        unknown = sorted(set(hooks) - set(HOOKS))
        if unknown:
            raise ValueError(f"LambdaCallback: unknown hooks {unknown}; valid: {', '.join(HOOKS)}")
        for name, function in hooks.items():
            setattr(self, name, function)

"""Memory tasks with long dependencies: the copy task (Hochreiter & Schmidhuber 1997;
Arjovsky et al. 2016), where online rules must carry information across a delay.

A sequence shows ``length`` random symbols, then ``delay`` blank steps, then a *go*
marker; over the next ``length`` steps the network must output the symbols in order.
The loss sits on those last steps only: train with ``loss_on="mask"`` and the returned
mask (``fit(x, y, mask=mask)``).
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError

__all__ = ["copy_task"]


def copy_task(num_samples: int, *, length: int = 5, delay: int = 20, num_symbols: int = 8,
              seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Trials of the copy task.

    Input channels: the ``num_symbols`` symbols one-hot, then a *blank* channel (on while
    no symbol is shown and no output is due) and the *go* marker (on at the step the
    recall starts). With ``T = 2 * length + delay + 1``:

    - steps ``0 .. length-1``: the symbols;
    - steps ``length .. length+delay-1``: blank;
    - step ``length + delay``: go;
    - steps ``length+delay+1 .. T-1``: blank; the targets are the symbols, in order.

    Returns:
        ``x: (num_samples, T, num_symbols + 2)`` float32; ``y: (num_samples, T)`` int32
        per-step targets (the symbol to output; 0 where nothing is due); ``mask:
        (num_samples, T)`` bool, True on the ``length`` output steps. Chance accuracy
        is ``1 / num_symbols``.

    Example::

        x, y, mask = copy_task(256, length=5, delay=20)
        trainer = ef.Trainer(model, loss_on="mask")
        trainer.fit(x, y, mask=mask)
    """
    for name, value, low in (("num_samples", num_samples, 1), ("length", length, 1), ("delay", delay, 0),
                             ("num_symbols", num_symbols, 2)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ConfigError(f"copy_task: {name} must be an int >= {low}, got {value!r}")
    rng = np.random.default_rng(seed)
    steps = 2 * length + delay + 1
    symbols = rng.integers(0, num_symbols, (num_samples, length))
    x = np.zeros((num_samples, steps, num_symbols + 2), np.float32)
    rows = np.arange(num_samples)[:, None]
    x[rows, np.arange(length)[None, :], symbols] = 1.0
    x[:, length:length + delay, num_symbols] = 1.0  # blank during the delay
    x[:, length + delay, num_symbols + 1] = 1.0  # go
    x[:, length + delay + 1:, num_symbols] = 1.0  # blank while recalling
    y = np.zeros((num_samples, steps), np.int32)
    y[:, length + delay + 1:] = symbols
    mask = np.zeros((num_samples, steps), bool)
    mask[:, length + delay + 1:] = True
    return x, y, mask

"""Evidence accumulation in the style of e-prop (Bellec et al. 2020), generated on the fly.

Input channels come in four equal groups: *left* cues, *right* cues, *recall*, and
background *noise*. A trial shows ``num_cues`` cues one after another, each a burst of
Poisson spikes in the left or the right group, separated by silent gaps; then a delay;
then the recall group fires and the network must say which side had more cues. Noise
channels fire at a low rate throughout. The label is 0 (left) or 1 (right).

Each cue's side is a fair coin by default. e-prop's task (its ``p_group = 0.3``) first
picks a favoured side per trial and sends each cue to the other side with probability
``minority_prob = 0.3``, so most trials are not a close call.
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError

__all__ = ["evidence_accumulation"]


def evidence_accumulation(
    num_samples: int,
    *,
    num_cues: int = 5,
    channels_per_group: int = 10,
    cue_steps: int = 20,
    gap_steps: int = 10,
    delay_steps: int = 50,
    recall_steps: int = 30,
    cue_rate: float = 0.4,
    noise_rate: float = 0.02,
    minority_prob: float = 0.5,
    lead_steps: int = 0,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Trials of the evidence-accumulation task.

    Returns:
        ``x: (num_samples, T, 4 * channels_per_group)`` float32 spikes, batch-major, with
        ``T = lead_steps + num_cues * (cue_steps + gap_steps) + delay_steps + recall_steps``
        (``lead_steps`` of noise alone before the first cue);
        ``y: (num_samples,)`` int32, 1 when more cues came on the right. ``num_cues`` is
        odd so there is no tie. ``minority_prob``: the chance that a cue goes to the
        side a trial does not favour (the favoured side drawn per trial); 0.5 (default)
        makes every cue a fair coin, e-prop uses 0.3.

    Example::

        x, y = evidence_accumulation(512, num_cues=5, seed=0)
    """
    for name, value in (("num_samples", num_samples), ("num_cues", num_cues),
                        ("channels_per_group", channels_per_group), ("cue_steps", cue_steps),
                        ("recall_steps", recall_steps)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"evidence_accumulation: {name} must be a positive int, got {value!r}")
    for name, value in (("gap_steps", gap_steps), ("delay_steps", delay_steps), ("lead_steps", lead_steps)):
        if not isinstance(value, int) or value < 0:
            raise ConfigError(f"evidence_accumulation: {name} must be a non-negative int, got {value!r}")
    if num_cues % 2 == 0:
        raise ConfigError(f"evidence_accumulation: num_cues must be odd so a side always wins, got {num_cues}")
    for name, rate in (("cue_rate", cue_rate), ("noise_rate", noise_rate), ("minority_prob", minority_prob)):
        if not 0.0 <= rate <= 1.0:
            raise ConfigError(f"evidence_accumulation: {name} must be a probability, got {rate!r}")
    rng = np.random.default_rng(seed)
    n = channels_per_group
    period = cue_steps + gap_steps
    steps = lead_steps + num_cues * period + delay_steps + recall_steps
    rates = np.zeros((num_samples, steps, 4 * n), np.float32)
    rates[:, :, 3 * n:] = noise_rate
    if minority_prob == 0.5:
        sides = rng.integers(0, 2, size=(num_samples, num_cues))  # 0 left, 1 right
    else:  # a favoured side per trial; each cue leaves it with probability minority_prob
        favoured = rng.integers(0, 2, size=(num_samples, 1))
        leaves = rng.random((num_samples, num_cues)) < minority_prob
        sides = np.where(leaves, 1 - favoured, favoured)
    for cue in range(num_cues):
        start = lead_steps + cue * period
        for side in (0, 1):
            chosen = sides[:, cue] == side
            rates[chosen, start:start + cue_steps, side * n:(side + 1) * n] = cue_rate
    rates[:, steps - recall_steps:, 2 * n:3 * n] = cue_rate
    x = (rng.random(rates.shape) < rates).astype(np.float32)
    y = (sides.sum(axis=1) > num_cues // 2).astype(np.int32)
    return x, y

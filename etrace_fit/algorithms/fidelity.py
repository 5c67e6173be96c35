"""``gradient_fidelity``: how close an online rule's gradient is to BPTT's, per weight.

The plan's report says *which* weights are approximate and why; this measures *how
much*, on a batch the user chooses: the cosine and the norm ratio of the online
gradient against BPTT's (``jax.grad`` over the same step), per ``ParamState``. The
``GradientFidelity`` callback logs it during training.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Mapping, NamedTuple

import brainstate
import jax
import numpy as np

from ..compiler import format_path
from ..errors import ApproximationWarning
from .learner import Learner, compile  # noqa: A004 - ef.compile
from .sequence import sequence_grad

__all__ = ["WeightFidelity", "gradient_fidelity"]


class WeightFidelity(NamedTuple):
    """One weight's online gradient ``g`` against BPTT's ``r``: ``cosine`` = ``g·r /
    (|g| |r|)`` and ``norm_ratio`` = ``|g| / |r|`` (both 1 when the two are equal; when
    ``r`` is zero: 1 if ``g`` is too, else cosine 0 and ratio ``inf``)."""

    cosine: float
    norm_ratio: float


def _compare(online: np.ndarray, reference: np.ndarray) -> WeightFidelity:
    g_norm, r_norm = float(np.linalg.norm(online)), float(np.linalg.norm(reference))
    if r_norm == 0.0:
        return WeightFidelity(1.0, 1.0) if g_norm == 0.0 else WeightFidelity(0.0, math.inf)
    if g_norm == 0.0:
        return WeightFidelity(0.0, 0.0)
    return WeightFidelity(float(online @ reference) / (g_norm * r_norm), g_norm / r_norm)


def _flat(tree: Any) -> np.ndarray:
    return np.concatenate([np.asarray(leaf, np.float64).ravel() for leaf in jax.tree.leaves(tree)])


def gradient_fidelity(
    model: Any,
    xs: Any,
    targets: Any,
    step_loss: Callable[[Any, Any], jax.Array] | None = None,
    algo: str | Mapping[str, str] = "hybrid",
    **options: Any,
) -> dict[str, WeightFidelity]:
    """Cosine and norm ratio of ``algo``'s gradient against BPTT's, per weight.

    Args:
        model, xs, targets, step_loss, algo: as in :func:`etrace_fit.sequence_grad`
            (``xs`` time-major ``(T, B, ...)``); ``model`` may be a :class:`Learner`
            (its rules and loss are used). Both runs start from the model's current
            hidden states, which are left as they were.
        options: ``decay``, ``rank``, ``trace_dtype``, ``memory_budget`` for ``algo``.

    Returns:
        ``{"layers.0.weight": WeightFidelity(cosine, norm_ratio), ...}`` for every
        ``ParamState`` (all leaves of a state together), in the model's order.

    Example::

        for path, f in ef.gradient_fidelity(learner, xs, ys).items():   # or (model, xs, ys, loss, algo=...)
            print(f"{path}: cosine {f.cosine:.3f}, norm ratio {f.norm_ratio:.2f}")
    """
    network = model.model if isinstance(model, Learner) else model
    if step_loss is None and isinstance(model, Learner):
        step_loss = model.step_loss
    # Every state a sequence moves (hidden states, and a dropout key or running statistics: the online run
    # drew other dropout masks than the reference's, so an exact rule read cosine 0.86), put back after each.
    held = {path: state for path, state in network.states().items() if not isinstance(state, brainstate.ParamState)}
    start = {path: state.value for path, state in held.items()}

    def run(model_or_learner, rule, **kwargs):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ApproximationWarning)  # measured here instead
                return sequence_grad(model_or_learner, xs, targets, step_loss, algo=rule, **kwargs)[0]
        finally:
            for path, state in held.items():
                state.value = start[path]

    bptt = network
    if isinstance(model, Learner) and model.step_fn is not None:  # the same traced step, under BPTT
        example = jax.tree.map(lambda x: x[0], xs)
        bptt = compile(network, example, step_loss, algo="bptt", step_fn=model.step_fn)
    # A learner compiled for BPTT takes no algo (its rule is compiled in): "hybrid", the default, says none.
    online, reference = run(model, algo, **options), run(bptt, "hybrid" if isinstance(bptt, Learner) else "bptt")
    return {format_path(path): _compare(_flat(online[path]), _flat(reference[path])) for path in reference}

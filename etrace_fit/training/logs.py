"""Logs of a ``fit``: Keras' ``History``, the ``verbose`` and ``validation_freq``
arguments, the ``*_on_batch`` results, and the model summary's table."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import brainstate
import jax
import jax.numpy as jnp
import numpy as np

from ..algorithms.hybrid import format_bytes
from ..algorithms.registry import sequence_algo
from ..compiler import format_path
from ..errors import ConfigError

__all__ = ["History", "check_verbose", "keras_result", "model_summary", "validation_schedule"]


class History:
    """Per-epoch logs of one ``fit``, as in Keras: ``history.history["loss"]`` is a list,
    one per epoch; ``history.epoch`` the epoch numbers; ``history.params`` the fit's
    ``{"verbose", "epochs", "steps"}``; ``history.model`` the trainer."""

    def __init__(self, params: Mapping | None = None, model: Any = None):
        self.history: dict[str, list[float]] = {}
        self.epoch: list[int] = []
        self.params: dict = dict(params or {})
        self.model = model
        self._this_epoch: set = set()  # the keys recorded for the last epoch

    def append(self, epoch: int, logs: Mapping[str, float]) -> None:
        self.epoch.append(epoch)
        self._this_epoch = set()
        self.add(logs)

    def add(self, logs: Mapping[str, float]) -> None:
        """Record more keys of the last epoch's logs (those its callbacks added, or set
        anew: the last epoch's value is replaced, as Keras' History, which runs after the
        other callbacks, records what they left; values that are not numbers, which a
        checkpoint could not hold, are left out)."""
        for key, value in logs.items():
            try:
                number = float(value)
            except (TypeError, ValueError):
                continue
            values = self.history.setdefault(key, [])
            if self.epoch and len(values) == len(self.epoch) and key in self._this_epoch:
                values[-1] = number
            else:
                values.append(number)
            self._this_epoch.add(key)


def check_verbose(verbose: Any) -> int:
    """Keras' ``verbose``: ``"auto"`` (= 1), 0, 1 or 2, or ``False`` / ``True`` (0 / 1, as
    Keras takes them); anything else is a ConfigError."""
    if verbose == "auto":
        return 1
    if isinstance(verbose, bool):
        return int(verbose)
    if isinstance(verbose, str) or verbose not in (0, 1, 2):
        raise ConfigError(f"verbose must be 'auto', 0 (silent), 1 (progress bar), 2 (one line per epoch) or a bool, "
                          f"got {verbose!r}")
    return int(verbose)


def validation_schedule(validation_freq: Any):
    """Keras' ``validation_freq`` as a predicate on the 0-based epoch: an int ``n``
    validates every ``n``-th epoch, a collection at the listed 1-based epochs."""
    expected = f"validation_freq must be an int >= 1 or a list of 1-based epochs (ints >= 1), got {validation_freq!r}"
    if isinstance(validation_freq, (int, np.integer)) and not isinstance(validation_freq, bool):
        validation_freq = int(validation_freq)
        if validation_freq < 1:
            raise ConfigError(expected)
        return lambda epoch: (epoch + 1) % validation_freq == 0
    if isinstance(validation_freq, (str, bytes)):  # "10" read as the epochs {1, 0}
        raise ConfigError(expected)
    try:
        entries = list(validation_freq)
    except TypeError:
        raise ConfigError(expected) from None
    if not all(isinstance(e, (int, np.integer)) and not isinstance(e, bool) and e >= 1 for e in entries):
        raise ConfigError(expected)
    listed = {int(e) for e in entries}
    return lambda epoch: epoch + 1 in listed


def keras_result(logs: dict[str, float], return_dict: bool, names: Sequence[str]) -> Any:
    """Keras' ``*_on_batch`` / ``evaluate`` result: the dict (every log, a regulariser's
    ``rate_<path>`` too), or the values of ``names`` (``metrics_names``: the loss, then
    the metrics) in that order, the loss alone when there is no metric."""
    if not isinstance(return_dict, bool):  # "yes" and "no" read as True
        raise ConfigError(f"return_dict must be True or False, got {return_dict!r}")
    if return_dict:
        return logs
    values = [logs[name] for name in names if name in logs]
    return values[0] if len(values) == 1 else values


def model_summary(model: Any, learner: Any = None, algo: Any = None) -> str:
    """The table of :meth:`Trainer.summary` (``learner``: the compiled one, or None)."""
    nodes = {path: node for path, node in model.nodes().items()}
    params = model.states(brainstate.ParamState)
    hidden = model.states(brainstate.HiddenState)
    rules, trace = {}, {}
    if learner is not None and learner.plan is not None:
        for pair, rule, size in zip(learner.plan.pairs, learner.plan.rules, learner.plan.trace_bytes(1)):
            name = format_path(pair.relation.weight_path)
            rules.setdefault(name, []).append(rule.name)
            trace[name] = trace.get(name, 0) + size
    owners = sorted({path[:-1] for path in (*params, *hidden)}, key=lambda p: [str(k) for k in p])
    rows = [("layer (type)", "params", "hidden states (per sample)", "rule", "traces / sample")]
    total_params = total_trace = 0
    for owner in owners:
        node = nodes.get(owner)
        kind = type(node).__name__ if node is not None else "?"
        count = sum(int(np.size(leaf)) for path, state in params.items() if path[:-1] == owner
                    for leaf in jax.tree.leaves(state.value))
        total_params += count
        states = ", ".join(f"{path[-1]} {tuple(np.shape(jax.tree.leaves(state.value)[0]))[1:]}"
                           for path, state in hidden.items() if path[:-1] == owner)
        names = [format_path(path) for path in params if path[:-1] == owner]
        rule = ", ".join(f"{n.rsplit('.', 1)[-1]}: {'+'.join(dict.fromkeys(rules[n]))}" for n in names if n in rules)
        if not rule and names:
            sequence = sequence_algo(algo)
            rule = str(sequence) if sequence is not None else ("(at first batch)" if learner is None else "untraced")
        size = sum(trace.get(n, 0) for n in names)
        total_trace += size
        rows.append((f"{format_path(owner) or '(model)'} ({kind})", f"{count:,}", states or "-", rule or "-",
                     format_bytes(size) if size else "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    line = lambda row: "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()  # noqa: E731
    rule_line = "-" * len(line(rows[0]))
    from .persistence import frozen_param_count, non_trainable_count

    # as Keras: running statistics and weights a layer never trains (LoRA's base) are non-trainable params
    statistics, untrained = non_trainable_count(model), frozen_param_count(model)
    out = [f'Model: "{type(model).__name__}"', rule_line, line(rows[0]), rule_line, *map(line, rows[1:]), rule_line,
           f"Total params: {total_params + statistics:,}", f"Trainable params: {total_params - untrained:,}",
           f"Non-trainable params: {statistics + untrained:,}"]
    if learner is None:
        out.append("Rules and traces: chosen at the first training batch (summary(x) compiles now)")
    elif learner.plan is None:
        out.append(f"Rules: algo='{sequence_algo(learner.algo)}' (no traces; memory grows with the "
                   f"{'sequence length' if sequence_algo(learner.algo).name == 'bptt' else 'window'})")
    else:
        out.append(f"Trace memory: {format_bytes(total_trace)} per sample "
                   f"(x batch size; {jnp.dtype(learner.plan.trace_dtype).name})")
        approximate = learner.approximations()
        out.append(f"Approximate online gradients: {', '.join(approximate)}" if approximate
                   else "Every weight gets its exact (BPTT) gradient")
    return "\n".join(out)

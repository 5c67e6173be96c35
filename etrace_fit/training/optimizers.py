"""Optimizers by Keras name: ``Trainer(model, optimizer="adam")``.

Each name maps to the optax optimizer with Keras' default learning rate, built with
``optax.inject_hyperparams`` so that ``trainer.learning_rate`` (and the learning-rate
callbacks) can read and change it. An optax ``GradientTransformation`` is used as given.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..algorithms.base import global_norm
from ..callbacks.base import checked_learning_rate
from ..errors import ConfigError

__all__ = ["OPTIMIZERS", "LearningRate", "find_hyperparams", "get_optimizer", "initial_state"]

#: Keras name → (optax factory, Keras' default learning rate).
OPTIMIZERS: dict[str, tuple[Any, float]] = {
    "adam": (optax.adam, 1e-3),
    "adamw": (optax.adamw, 1e-3),
    "adamax": (optax.adamax, 1e-3),
    "nadam": (optax.nadam, 1e-3),
    "sgd": (optax.sgd, 1e-2),
    "rmsprop": (optax.rmsprop, 1e-3),
    "adagrad": (optax.adagrad, 1e-3),
    "adadelta": (optax.adadelta, 1e-3),
    "lion": (optax.lion, 1e-3),
}


def get_optimizer(optimizer: Any, learning_rate: float | None = None) -> optax.GradientTransformation:
    """The optax optimizer for a Keras name (any case: ``"Adam"``, ``"sgd"``) at
    ``learning_rate`` (default: Keras'), or ``optimizer`` itself if it is an optax
    ``GradientTransformation``; ``None`` is ``"adam"``. Anything else is a
    :class:`ConfigError` naming the valid names."""
    if optimizer is None:
        optimizer = "adam"
    if isinstance(optimizer, str):
        name = optimizer.lower()
        if name not in OPTIMIZERS:
            raise ConfigError(f"optimizer: unknown name {optimizer!r}; valid names: {', '.join(OPTIMIZERS)}, or an "
                              f"optax GradientTransformation such as optax.adam(1e-3)")
        factory, default = OPTIMIZERS[name]
        rate = default if learning_rate is None else learning_rate
        if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not rate > 0:
            raise ConfigError(f"learning_rate must be a positive number, got {learning_rate!r}")
        return optax.inject_hyperparams(factory)(learning_rate=float(rate))
    if learning_rate is not None:
        raise ConfigError("learning_rate applies to an optimizer given by name; an optax optimizer carries its own "
                          "(optax.adam(learning_rate))")
    if not (callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None))):
        raise ConfigError(f"optimizer must be a Keras name ({', '.join(OPTIMIZERS)}) or an optax "
                          f"GradientTransformation, got {type(optimizer).__name__}")
    return optimizer


def find_hyperparams(opt_state: Any) -> dict | None:
    """The ``hyperparams`` dict of the first ``optax.inject_hyperparams`` state in
    ``opt_state`` (through chains), or None: where the learning rate can be read and set."""
    found = []

    def visit(node):
        if hasattr(node, "hyperparams") and isinstance(node.hyperparams, dict):
            found.append(node.hyperparams)
        elif isinstance(node, (tuple, list)):
            for child in node:
                visit(child)

    visit(opt_state)
    return found[0] if found else None


def initial_state(optimizer: optax.GradientTransformation, values: Any) -> Any:
    """``optimizer.init(values)`` as one compiled program. Run eagerly, each of its
    operations compiled a program of its own at the start of the first ``fit`` (Adam's
    zeros per weight shape, a schedule's value at step 0 under
    ``optax.inject_hyperparams``: ~12 one-op programs, ~0.3 s of the demo's first epoch,
    under every algo alike). An ``init`` that cannot be traced (Python control flow on
    the values, a state that is not arrays) runs eagerly, as optax allows."""
    try:
        return jax.jit(optimizer.init)(values)
    except TypeError:  # not traceable (JAX raises TypeErrors): eagerly (its own error, if any, from there)
        return optimizer.init(values)


def check_optimizer(optimizer: optax.GradientTransformation, values: Any, given: Any) -> None:
    """A :class:`ConfigError` before training when ``optimizer``'s ``update`` fails on
    weights shaped as ``values`` (traced for shapes only: nothing is compiled or run),
    as ``optax.adam("1e-2")`` does, whose string rate optax takes and the first batch
    met deep inside the jitted step. An ``init`` that cannot be traced is not probed
    (it runs eagerly, as optax allows); the update runs traced in training anyway."""
    shapes = jax.tree.map(lambda v: jax.ShapeDtypeStruct(np.shape(v), np.asarray(v).dtype), values)
    try:
        state = jax.eval_shape(optimizer.init, shapes)
    except Exception:  # an init that needs concrete values: left to the first batch
        return
    try:
        jax.eval_shape(lambda grads, state, params: optimizer.update(grads, state, params), shapes, state, shapes)
    except Exception as error:
        # optax keeps -1 * learning_rate: a rate typed "1e-2" is held as "" ("1e-2" * -1)
        hint = next((" (a hyperparameter is a string, such as a learning rate typed \"1e-2\": pass a number, "
                     "e.g. optax.adam(1e-2))" for v in _closure_strings(given) if v == "" or _is_number(v)), "")
        raise ConfigError(f"optimizer: the optax optimizer fails on the model's weights before training{hint}: "
                          f"{type(error).__name__}: {error}") from None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _closure_strings(value: Any, depth: int = 0) -> list[str]:
    """Strings among the values an optax optimizer's functions close over, through its
    chained parts (its hyperparameters: a learning rate typed as ``"1e-2"``)."""
    if isinstance(value, str):
        return [value]
    if depth > 16:
        return []
    if isinstance(value, (tuple, list)):
        return [found for item in value for found in _closure_strings(item, depth + 1)]
    found = []
    for cell in getattr(value, "__closure__", None) or () if callable(value) else ():
        try:
            found += _closure_strings(cell.cell_contents, depth + 1)
        except ValueError:  # an empty cell
            continue
    return found


class LearningRate:
    """The Trainer's optimizer state and learning rate (a part of :class:`~etrace_fit.Trainer`)."""

    def _init_optimizer(self, values: Any) -> None:
        """Create the optimizer state over ``values`` (:func:`initial_state`) and apply a
        learning rate set before it existed."""
        self.opt_state = initial_state(self.optimizer, values)
        if self._pending_learning_rate is not None:
            self.learning_rate, self._pending_learning_rate = self._pending_learning_rate, None

    def _hyperparams(self) -> dict | None:
        return find_hyperparams(self.opt_state)

    def _initial_hyperparams(self, shapes: bool = False) -> dict | None:
        """The hyperparameters the optimizer starts with, before its state exists: its
        ``init`` on no weights holds them (``None`` if it has none, or cannot say);
        ``shapes``: only their shapes (traced, nothing compiled or run)."""
        try:
            return find_hyperparams(jax.eval_shape(self.optimizer.init, {}) if shapes else self.optimizer.init({}))
        except Exception:  # an optimizer whose init needs weights
            return None

    @property
    def learning_rate(self) -> float | None:
        """The optimizer's current learning rate, when it was built with
        ``optax.inject_hyperparams`` (else None); before the first batch, the one it will
        start with (or the one set since)."""
        if self.opt_state is None:
            if self._pending_learning_rate is not None:
                return self._pending_learning_rate
            hyperparams = self._initial_hyperparams()
        else:
            hyperparams = self._hyperparams()
        if hyperparams is None or "learning_rate" not in hyperparams:
            return None
        return float(hyperparams["learning_rate"])

    @property
    def learning_rate_settable(self) -> bool:
        """Whether :attr:`learning_rate` can be read and set (an optimizer built with
        ``optax.inject_hyperparams``, as one given by name is), known before its state exists."""
        if self.opt_state is not None or self._pending_learning_rate is not None:
            return self.learning_rate is not None
        found = self._initial_hyperparams(shapes=True)
        return found is not None and "learning_rate" in found

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        value = checked_learning_rate(value, "learning_rate")
        if self.opt_state is None:
            self._pending_learning_rate = value
            return
        hyperparams = self._hyperparams()
        if hyperparams is None or "learning_rate" not in hyperparams:
            raise ConfigError("the learning rate can only be changed for an optimizer built with "
                              "optax.inject_hyperparams, e.g. optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)")
        hyperparams["learning_rate"] = jnp.asarray(value, jnp.asarray(hyperparams["learning_rate"]).dtype)


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
    """``optax.clip_by_global_norm`` with the norm of :func:`~etrace_fit.algorithms.base.global_norm`:
    optax sums float32 squares, so a gradient of norm ≳ 1.8e19 read inf and was scaled
    to a zero update, reported as clipped. The state is optax's (empty), so
    checkpoints of either read alike."""

    def update(updates, state, params=None):
        del params
        norm = global_norm(updates)
        factor = jnp.where(norm > max_norm, max_norm / norm, 1.0)
        return jax.tree.map(lambda u: (u * factor).astype(u.dtype), updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)

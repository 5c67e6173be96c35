"""The optimizer's state at the start of ``fit``: one compiled program, the same state.

``optimizer.init`` run eagerly compiled one program per operation (Adam's zeros per
weight shape, a schedule's value at step 0): ~12 programs and ~0.3 s of a first epoch.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from etrace_fit.training.optimizers import initial_state

from ._helpers import counting_compiles


def _values():
    return {"a": {"weight": jnp.ones((3, 7)), "bias": jnp.zeros((7,))}, "b": {"weight": jnp.full((7, 2), 0.5)},
            "tau": jnp.full((5,), 20.0)}


def _compiles(fn):
    with counting_compiles() as count:
        out = fn()
    return out, count[0]


def _assert_same(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = jnp.asarray(x), jnp.asarray(y)
        assert x.shape == y.shape and x.dtype == y.dtype, (x, y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_scheduled_adams_state_is_one_program_and_the_eager_state():
    """``etrace-fit train``'s optimizer (Adam under ``inject_hyperparams`` with a cosine
    schedule) over four weight shapes: one compilation (eagerly: one per shape and per
    operation of the schedule), and the state ``init`` gives eagerly, leaf for leaf."""
    values = _values()
    jax.clear_caches()
    optimizer = optax.inject_hyperparams(optax.adam)(learning_rate=optax.cosine_decay_schedule(3e-3, 480))
    state, compiles = _compiles(lambda: initial_state(optimizer, values))
    assert compiles == 1
    jax.clear_caches()
    eager, eager_compiles = _compiles(lambda: optimizer.init(values))
    assert eager_compiles > 4  # what it replaces
    _assert_same(state, eager)
    updates, _ = optimizer.update(jax.tree.map(jnp.ones_like, _values()), state, _values())  # usable as is
    assert float(jnp.abs(updates["a"]["weight"]).max()) > 0


class _Branching:
    """An optimizer whose ``init`` reads a value in Python: it cannot be traced."""

    def init(self, params):
        scale = 2.0 if float(params["a"]["weight"].sum()) > 0 else 1.0
        return {"scale": jnp.asarray(scale), "count": 0}

    def update(self, updates, state, params=None):
        return updates, state


def test_an_init_that_cannot_be_traced_runs_eagerly():
    """Python control flow on the values (a ``TracerBoolConversionError`` under ``jit``):
    the state comes from the eager ``init``, a plain ``0`` kept as given."""
    state = initial_state(_Branching(), _values())
    assert float(state["scale"]) == 2.0 and state["count"] == 0 and isinstance(state["count"], int)

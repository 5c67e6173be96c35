"""The online step's traced size grows linearly with the network's depth.

Each forward-mode pass that gives a state's ``D`` or a relation's ``Df`` evaluates only
the transitions it differentiates (``cut_step``'s ``outputs``), not the whole step
again: a pass per state and per relation over the whole step had made the traced
program grow with the square of the number of layers (dead code JAX removes before
lowering, but the time to trace it was spent: a 5-layer ALIF net's step traced and
lowered in 2.80 s, 1.83 s after).
"""

import brainstate
import jax
import jax.numpy as jnp
import pytest

import etrace_fit as ef
from etrace_fit import _compat, layers
from etrace_fit.algorithms.sequence import _prepare

B, T, I, H, O = 2, 6, 3, 5, 2
# The deeper nets' first weights shape later layers' memory: approximate, and said so.
pytestmark = pytest.mark.filterwarnings("ignore::etrace_fit.ApproximationWarning")


def _loss(out, y):
    return jnp.mean((out - y) ** 2)


def _model(depth: int, neuron: str):
    blocks = []
    for n in range(depth):
        blocks.append(layers.Linear(I if n == 0 else H, H))
        blocks.append(layers.ALIF(H, tau_a=50.0) if neuron == "alif" else layers.LIF(H))
    model = ef.Sequential(*blocks, layers.LeakyRateReadout(H, O, tau=5.0))
    brainstate.nn.init_all_states(model, batch_size=B)
    return model


def _count(jaxpr, names) -> int:
    """Equations whose primitive is in ``names``, in ``jaxpr`` and every jaxpr inside it."""
    total = 0
    for eqn in jaxpr.eqns:
        total += eqn.primitive.name in names
        for inner in _compat.jaxprs_in_params(eqn.params):
            total += _count(getattr(inner, "jaxpr", inner), names)
    return total


@pytest.mark.parametrize("neuron", ["lif", "alif"])
@pytest.mark.parametrize("rule", ["d_rtrl", "esd_rtrl"])
def test_the_traced_step_grows_linearly_with_depth(neuron, rule):
    """The exponentials (each neuron's decay) in the traced whole-sequence gradient, for
    1, 2 and 3 layers: their count grows by the same amount with each layer. A pass per
    state over the whole step adds, with each layer, one more pass over all layers."""
    counts = []
    for depth in (1, 2, 3):
        with brainstate.environ.context(dt=1.0):
            model = _model(depth, neuron)
            xs, ys = jnp.ones((T, B, I)), jnp.zeros((T, B, O))
            graph, _, _, program = _prepare(model, xs, ys, _loss, rule, None, None, None)
            weights = [leaf for s in graph.module.weights for leaf in jax.tree.leaves(s.state.value)]
            jaxpr = jax.make_jaxpr(lambda w, s, x, y: program.run(w, s, x, y))(
                weights, graph.module.state_leaves(), [xs], ys)
        counts.append(_count(jaxpr.jaxpr, {"exp", "dot_general"}))
    assert counts[2] - counts[1] == counts[1] - counts[0], counts

"""Where the online rules approximate: trainable recurrent weights (GRU, LSTM, a
recurrent LIF), a weight-to-weight gate (GRU's W_r, one-step gradient), two stateful
layers in a row, stateful readouts, and training a small task online versus BPTT.

Cosine similarities with BPTT (``brainstate.transform.grad`` over a ``for_loop``) were
measured once (float64, T = 30, B = 3, I = 4, H = 8, the seeds in the builders) and are
recorded next to the tests; each test asserts a floor ``MARGIN`` = 0.005 under its
measured value. The structural checks are exact: with the recurrent rows of the weights
on ``[x, h]`` set to zero, a GRU, an LSTM or a recurrent LIF has per-unit recurrence
only, and D-RTRL equals BPTT.
"""

from __future__ import annotations

import functools
import warnings

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import etrace_fit as ef
from etrace_fit import layers as L

from ._helpers import (B, I, N, O, T, Case, RecurrentLIF, RecurrentLIFState, assert_grads_match,
                       assert_losses_match, bptt_fn, cosine, leaves_by_name, lin, mse, online_grads, rand,
                       randomize, reference_bptt, rel_err, to_host, zero_recurrent_rows)

H = 8


def _gru():
    cell = L.GRUCell(I, H, w_init=np.zeros((I + H, H)), b_init=np.zeros(H))
    return randomize(ef.Sequential(cell, lin(H, O, 2)), seed=7, scale=1.5)


def _lstm():
    cell = L.LSTMCell(I, H, w_init=np.zeros((I + H, H)), b_init=np.zeros(H))
    return randomize(ef.Sequential(cell, lin(H, O, 2)), seed=7, scale=1.5)


def _recurrent_lif():
    return ef.Sequential(RecurrentLIF(I, H), lin(H, O, 2))


def _recurrent_lif_state():
    return ef.Sequential(RecurrentLIFState(I, H), lin(H, O, 2))


BUILDERS = {"gru": _gru, "lstm": _lstm, "recurrent_lif": _recurrent_lif, "recurrent_lif_state": _recurrent_lif_state}


@functools.lru_cache(maxsize=None)
def recurrent_case(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GRU's W_r warning is tested on its own
        return Case(BUILDERS[name], (T, B, I), (T, B, O), 64)


def quiet_run(case, algo, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return case.run(algo, **kwargs)


# cosine(online, BPTT) per leaf, measured (float64) with the previous-state learning
# signal (docs/theory.md §5.8); the values before it (signal at h^t) in the comments. The
# readout (layers.1) is exact (1.0) and checked separately. W_r is untraced (one-step
# gradient) under both rules. ES-D-RTRL equals D-RTRL on every bias: its input trace is
# then a leaky sum of ones and the factorisation is exact.
MEASURED = {
    # before: W_h 0.9649 / 0.9768, W_z 0.8806 / 0.9183 (bias / weight)
    ("gru", "d_rtrl"): {"layers.0.W_h.weight['bias']": 0.9836, "layers.0.W_h.weight['weight']": 0.9901,
                        "layers.0.W_r.weight['bias']": 0.9674, "layers.0.W_r.weight['weight']": 0.9633,
                        "layers.0.W_z.weight['bias']": 0.9515, "layers.0.W_z.weight['weight']": 0.9619},
    # before: W_h weight 0.9425, W_z weight 0.3932
    ("gru", "esd_rtrl"): {"layers.0.W_h.weight['bias']": 0.9836, "layers.0.W_h.weight['weight']": 0.9798,
                          "layers.0.W_r.weight['bias']": 0.9674, "layers.0.W_r.weight['weight']": 0.9633,
                          "layers.0.W_z.weight['bias']": 0.9515, "layers.0.W_z.weight['weight']": 0.8132},
    # before: 0.9854-0.9905
    ("lstm", "d_rtrl"): {"layers.0.W_f.weight['bias']": 0.9993, "layers.0.W_f.weight['weight']": 0.9979,
                         "layers.0.W_g.weight['bias']": 0.9968, "layers.0.W_g.weight['weight']": 0.9962,
                         "layers.0.W_i.weight['bias']": 0.9965, "layers.0.W_i.weight['weight']": 0.9958,
                         "layers.0.W_o.weight['bias']": 0.9975, "layers.0.W_o.weight['weight']": 0.9956},
    # before: weights 0.7371-0.8760
    ("lstm", "esd_rtrl"): {"layers.0.W_f.weight['bias']": 0.9993, "layers.0.W_f.weight['weight']": 0.9691,
                           "layers.0.W_g.weight['bias']": 0.9968, "layers.0.W_g.weight['weight']": 0.9734,
                           "layers.0.W_i.weight['bias']": 0.9965, "layers.0.W_i.weight['weight']": 0.9556,
                           "layers.0.W_o.weight['bias']": 0.9975, "layers.0.W_o.weight['weight']": 0.9903},
    # recurrent LIF (spike fraction 0.39): the weight on [x, z_prev] drives V through
    # itself. Before: 0.6083 / 0.6839 (D-RTRL), 0.6083 / 0.6688 (ES-D-RTRL).
    ("recurrent_lif", "d_rtrl"): {"layers.0.W.weight['bias']": 0.7050, "layers.0.W.weight['weight']": 0.7675},
    ("recurrent_lif", "esd_rtrl"): {"layers.0.W.weight['bias']": 0.7050, "layers.0.W.weight['weight']": 0.7657},
}
MARGIN = 0.005  # float64 and fixed seeds: the margin only absorbs platform rounding


@pytest.mark.parametrize("name,algo", list(MEASURED), ids=[f"{n}-{a}" for n, a in MEASURED])
def test_cosine_with_bptt_per_weight(name, algo):
    case = recurrent_case(name)
    grads, losses = quiet_run(case, algo)
    online, ref = leaves_by_name(grads), leaves_by_name(case.ref_grads)
    measured = {leaf: cosine(online[leaf], ref[leaf]) for leaf in ref}
    for leaf, value in MEASURED[(name, algo)].items():
        assert measured[leaf] > value - MARGIN, f"{leaf}: cosine {measured[leaf]:.4f}, measured before {value}"
        assert measured[leaf] < 1 - 1e-6, f"{leaf} is exact: an approximation was expected"
    assert set(MEASURED[(name, algo)]) | {"layers.1.weight['bias']", "layers.1.weight['weight']"} == set(ref)
    # the readout is exact, and the forward pass is the model's
    assert_grads_match(grads, case.ref_grads, 1e-10, only=["layers.1.weight"])
    assert_losses_match(losses, case.ref_losses, 1e-12)


def test_recurrent_lif_spikes_moderately():
    case = recurrent_case("recurrent_lif")
    spikes = case.forward(lambda x: case.model.layers[0](x))
    assert 0.05 < spikes.mean() < 0.6


def test_gru_reset_gate_warns_and_gets_the_one_step_gradient():
    """W_r reaches h only through W_h's input (weight-to-weight): a UserWarning names it
    and it gets Σ_t ∂L^t/∂W_r with h^{t-1} held, checked against a plain-jnp GRU."""
    case = recurrent_case("gru")
    with case.env():
        for algo in ("d_rtrl", "esd_rtrl"):
            brainstate.nn.reset_all_states(case.model, batch_size=B)
            with pytest.warns(UserWarning, match=r"layers\.0\.W_r\.weight is approximate.*one-step"):
                ef.sequence_grad(case.model, case.xs, case.ys, mse, algo=algo, decay=0.8)
        params = {"/".join(map(str, path)): state.value
                  for path, state in case.model.states(brainstate.ParamState).items()}
        wz, wr, wh = (params[f"layers/0/{gate}/weight"] for gate in ("W_z", "W_r", "W_h"))
        readout = params["layers/1/weight"]

        def gru_step(wr_, h, x):
            xh = jnp.concatenate([x, h], axis=-1)
            z = jax.nn.sigmoid(xh @ wz["weight"] + wz["bias"])
            r = jax.nn.sigmoid(xh @ wr_["weight"] + wr_["bias"])
            n = jnp.tanh(jnp.concatenate([x, r * h], axis=-1) @ wh["weight"] + wh["bias"])
            return (1 - z) * h + z * n

        h, h_prev, losses = jnp.zeros((B, H)), [], []
        for t in range(T):
            h_prev.append(h)
            h = gru_step(wr, h, case.xs[t])
            losses.append(mse(h @ readout["weight"] + readout["bias"], case.ys[t]))
        h_prev = jnp.stack(h_prev)

        def one_step_total(wr_):  # h^{t-1} is data, not a function of wr_
            hs = jax.vmap(lambda hp, x: gru_step(wr_, hp, x))(h_prev, case.xs)
            return jax.vmap(mse)(hs @ readout["weight"] + readout["bias"], case.ys).sum()

        expected = to_host(jax.grad(one_step_total)(wr))
    # the plain-jnp GRU is the layer's GRU
    np.testing.assert_allclose(np.asarray(losses), case.ref_losses, rtol=1e-12)
    for algo in ("d_rtrl", "esd_rtrl"):
        got = quiet_run(case, algo)[0][("layers", 0, "W_r", "weight")]
        for key in ("weight", "bias"):
            assert np.count_nonzero(got[key]) == got[key].size, (algo, key)
            assert rel_err(got[key], expected[key]) < 1e-10, (algo, key)
            assert rel_err(got[key], case.ref_grads[("layers", 0, "W_r", "weight")][key]) > 1e-2  # not BPTT


def test_library_bptt_on_gru_is_exact_and_silent():
    case = recurrent_case("gru")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # BPTT traces nothing: no one-step warning
        grads, losses = case.run("bptt")
    assert_grads_match(grads, case.ref_grads, 1e-12)
    assert_losses_match(losses, case.ref_losses, 1e-12)


@pytest.mark.parametrize("algo", ["d_rtrl", "esd_rtrl"])
def test_recurrent_lif_feeding_back_from_an_extra_state_is_the_same(algo):
    """Spikes fed back from the LIF state or from an extra HiddenState ``z`` (then
    ``(z, V)`` is one group of S = 2): the same model, the same online gradient."""
    with_state = recurrent_case("recurrent_lif_state")
    assert_grads_match(with_state.ref_grads, recurrent_case("recurrent_lif").ref_grads, 1e-12)
    assert_grads_match(quiet_run(with_state, algo)[0], quiet_run(recurrent_case("recurrent_lif"), algo)[0], 1e-10)
    with with_state.env():
        _, plan = ef.algorithms.plan_for(with_state.model, with_state.xs, with_state.ys, mse, algo=algo)
    assert [pair.num_states for pair in plan.pairs] == [2]


@pytest.mark.parametrize("name", ["gru", "lstm", "recurrent_lif", "recurrent_lif_state"])
def test_per_unit_recurrence_makes_d_rtrl_exact(name):
    """Recurrent rows of every weight on ``[x, h]`` zeroed: the state recurs only per
    unit, so D-RTRL equals BPTT for every weight (the recurrent rows included: they
    stay trainable); GRU's W_r no longer matters (its gradient is zero both ways)."""
    case = recurrent_case(name)
    cell = case.model.layers[0]
    saved = {path: state.value for path, state in cell.states(brainstate.ParamState).items()}
    try:
        with case.env():
            zero_recurrent_rows(cell, I)
            ref_grads, ref_losses = reference_bptt(case.model, case.xs, case.ys, mse, B)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                grads, losses = online_grads(case.model, case.xs, case.ys, mse, B, algo="d_rtrl")
    finally:
        for path, state in cell.states(brainstate.ParamState).items():
            state.value = saved[path]
    online, ref = leaves_by_name(grads), leaves_by_name(ref_grads)
    assert_grads_match({k: v for k, v in grads.items() if "W_r" not in k},
                       {k: v for k, v in ref_grads.items() if "W_r" not in k}, 1e-8)
    # the recurrent rows themselves get an exact, non-zero gradient
    for leaf in ref:
        if leaf.startswith("layers.0") and leaf.endswith("['weight']") and "W_r" not in leaf:
            assert np.max(np.abs(ref[leaf][I:])) > 0, leaf
        if "W_r" in leaf:
            assert np.max(np.abs(ref[leaf])) == 0 and np.max(np.abs(online[leaf])) < 1e-12, leaf
    assert_losses_match(losses, ref_losses, 1e-12)


# ---------------------------------------------------------------- two stateful layers

def _two_lif(tau2):
    def build():
        return ef.Sequential(lin(I, N, 0, 2.0), L.LIF(N, tau=10.0, surrogate="sigmoid"), lin(N, N, 4, 2.0),
                             L.LIF(N, tau=tau2, surrogate="sigmoid"), lin(N, O, 2))
    return build


# Measured cosine(D-RTRL, BPTT) of the first layer's weight (float64, T = 30): the path
# that leaves LIF 1 and comes back through LIF 2's memory is dropped, so the shorter LIF
# 2's memory the better: tau2 = 0.05 → 1.0000, 2 → 0.9862, 20 → 0.8046.
TWO_LIF_FIRST_LAYER = {0.05: 0.9999, 2.0: 0.9862, 20.0: 0.8046}


@pytest.mark.parametrize("tau2", list(TWO_LIF_FIRST_LAYER))
def test_two_lif_layers(tau2):
    case = Case(_two_lif(tau2), (T, B, I), (T, B, O), 64)
    grads, losses = case.run("d_rtrl")
    online, ref = leaves_by_name(grads), leaves_by_name(case.ref_grads)
    # the learning signal reaches the first layer through the second (not only the readout)
    first = "layers.0.weight['weight']"
    cos = cosine(online[first], ref[first])
    measured = TWO_LIF_FIRST_LAYER[tau2]
    assert cos > measured - MARGIN, f"cosine {cos:.4f}, measured before {measured}"
    if tau2 < 0.1:  # LIF 2 is nearly stateless: the first layer is nearly exact
        assert rel_err(online[first], ref[first]) < 1e-5
    # the second layer's input weight and the readout are exact (stateless readout)
    assert_grads_match(grads, case.ref_grads, 1e-8, only=["layers.2.weight", "layers.4.weight"])
    assert_losses_match(losses, case.ref_losses, 1e-12)


# ---------------------------------------------------------------- stateful readouts

def _spike_readout():
    return ef.Sequential(lin(I, N, 0, 2.0), L.LIF(N, tau=10.0, surrogate="sigmoid"),
                         L.LeakySpikeReadout(N, O, tau=5.0, w_init=rand(2, N, O, scale=2.0), surrogate="sigmoid"))


# Measured cosine(D-RTRL, BPTT) of the first layer's weight / bias (float64, T = 30): the
# spiking readout's memory (reset by its own spikes, not affine) carries LIF's influence
# into later steps, a path the online rules drop (docs/algorithms.md, "Known
# approximations"): 0.6483 / 0.7568. A leaky rate readout's memory is followed, its τ
# learned or not (tests/algorithms/test_readout_memory.py): exact there.
READOUT_FIRST_LAYER = {"spike": (_spike_readout, 0.6483, 0.7568)}


@pytest.mark.parametrize("kind", list(READOUT_FIRST_LAYER))
def test_stateful_readout(kind):
    build, weight_cos, bias_cos = READOUT_FIRST_LAYER[kind]
    case = Case(build, (T, B, I), (T, B, O), 64)
    grads, losses = case.run("d_rtrl")
    online, ref = leaves_by_name(grads), leaves_by_name(case.ref_grads)
    # the readout's own weight (and learned tau) drive its per-unit memory: exact
    assert_grads_match(grads, case.ref_grads, 1e-8, only=["layers.2."])
    cos_w = cosine(online["layers.0.weight['weight']"], ref["layers.0.weight['weight']"])
    cos_b = cosine(online["layers.0.weight['bias']"], ref["layers.0.weight['bias']"])
    assert cos_w > weight_cos - MARGIN and cos_b > bias_cos - MARGIN, (cos_w, cos_b)
    assert rel_err(online["layers.0.weight['weight']"], ref["layers.0.weight['weight']"]) > 1e-2
    assert_losses_match(losses, case.ref_losses, 1e-12)


# ---------------------------------------------------------------- training (slow)

TRAIN_B, TRAIN_T, TRAIN_H, STEPS = 8, 20, 16, 200


def _filter_task(seed):
    """Predict a low-pass filtered input: y_t = 0.7·y_{t-1} + x_t (needs memory)."""
    x = np.random.default_rng(seed).standard_normal((TRAIN_T, TRAIN_B, 1)).astype(np.float32)
    y = np.zeros_like(x)
    acc = np.zeros((TRAIN_B, 1), np.float32)
    for t in range(TRAIN_T):
        acc = 0.7 * acc + x[t]
        y[t] = acc
    return jnp.asarray(x), jnp.asarray(y)


def _train_loss(out, target):
    return jnp.mean((out - target) ** 2)


def _train(method):
    import optax

    with brainstate.environ.context(dt=1.0):
        model = ef.Sequential(L.GRUCell(1, TRAIN_H, w_init=np.zeros((1 + TRAIN_H, TRAIN_H)), b_init=np.zeros(TRAIN_H)),
                              L.Linear(TRAIN_H, 1, w_init=np.zeros((TRAIN_H, 1)), b_init=np.zeros(1)))
        randomize(model, seed=0)
        brainstate.nn.init_all_states(model, batch_size=TRAIN_B)
        params = model.states(brainstate.ParamState)
        optimizer = optax.adam(1e-2)
        opt_state = optimizer.init({path: state.value for path, state in params.items()})
        reference = bptt_fn(model, _train_loss, TRAIN_B)
        x_eval, y_eval = _filter_task(999)

        def evaluate():
            brainstate.nn.reset_all_states(model, batch_size=TRAIN_B)
            outs = brainstate.transform.for_loop(model, x_eval)
            return float(jax.vmap(_train_loss)(outs, y_eval).sum())

        initial = evaluate()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # W_r: one-step
            for step in range(STEPS):
                xs, ys = _filter_task(step)
                if method == "bptt":
                    grads, _ = reference(xs, ys)
                else:
                    brainstate.nn.reset_all_states(model, batch_size=TRAIN_B)
                    grads, _ = ef.sequence_grad(model, xs, ys, _train_loss, algo=method)
                values = {path: state.value for path, state in params.items()}
                updates, opt_state = optimizer.update(grads, opt_state, values)
                new = optax.apply_updates(values, updates)
                for path, state in params.items():
                    state.value = new[path]
            plan = None
            if method != "bptt":
                _, plan = ef.algorithms.plan_for(model, xs, ys, _train_loss, algo=method)
        return initial, evaluate(), plan


@pytest.mark.slow
def test_training_online_is_close_to_bptt():
    """GRU(1, 16) → Linear on a filtered-input task, B = 8, T = 20, 200 Adam steps.

    Measured (seed 0) summed eval loss before the previous-state signal: initial 30.78;
    BPTT 0.0803; D-RTRL 0.1096 (1.36x BPTT); hybrid then 0.2506 (ES-D-RTRL for every
    gate). Since the per-sample budget, hybrid puts every gate on D-RTRL (its traces
    fit 4 MiB per sample) and trains as D-RTRL does. Asserted: D-RTRL and hybrid ≤ 2x
    BPTT, every method below 0.05x its initial loss.
    """
    initial, bptt_final, _ = _train("bptt")
    results = {method: _train(method) for method in ("d_rtrl", "hybrid")}
    assert bptt_final < 0.05 * initial, (initial, bptt_final)
    for method, (start, final, _) in results.items():
        assert start == pytest.approx(initial)  # same initial model
        assert final < 0.05 * initial, (method, final, initial)
    assert results["d_rtrl"][1] <= 2.0 * bptt_final, (results["d_rtrl"][1], bptt_final)
    assert results["hybrid"][1] <= 2.0 * bptt_final, (results["hybrid"][1], bptt_final)
    assert {rule.name for rule in results["hybrid"][2].rules} == {"d_rtrl"}
    assert {rule.name for rule in results["d_rtrl"][2].rules} == {"d_rtrl"}

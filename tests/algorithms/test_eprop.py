"""e-prop (``algo="eprop"`` / ``EProp``), a signal replacement over the D-RTRL traces,
against e-prop's published update (Bellec et al. 2020, Methods) written out here in
numpy for a small recurrent LIF / ALIF network with a leaky readout (float64):

    ε^t = ∂h^t/∂h^{t−1} ε^{t−1} + ∂h^t/∂I^t ⊗ [x^t, z^{t−1}, 1]   (LIF: ε^t = α ε^{t−1} + [x, z, 1])
    e^t = ψ^t · ε^t,   ē^t = κ ē^{t−1} + e^t,   L^t_j = Σ_k B_jk ∂E^t/∂y^t_k
    ΔW_ji ∝ Σ_t L^t_j ē^t_ji;   readout: Σ_t ∂E^t/∂y^t_k z̄^t_j,  z̄^t = κ z̄^{t−1} + z^t

with B the readout's weights (symmetric) or a fixed random matrix. Also: the readout
gets BPTT's gradient, the report, the errors for models e-prop does not take, the
Trainer, names and resume.
"""

from __future__ import annotations

import math
import warnings

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.algorithms import EProp, d_rtrl
from etrace_fit.algorithms.online import build_online
from etrace_fit.datasets import rate_discrimination
from etrace_fit.errors import ConfigError

from ._helpers import grads_by_path, rand, reference_bptt
from _per_step import PerStep

B, T, N_IN, N = 3, 14, 4, 6
TAU, TAU_OUT, TAU_A, BETA = 8.0, 5.0, 30.0, 0.4


def loss(out, y):
    return jnp.sum((out - y) ** 2)


def build(neuron="lif", readout="leaky"):
    """A recurrent LIF or ALIF layer (detached reset: e-prop's form) and a readout, from
    numpy weights; dt = 1."""
    w = rand(1, N_IN + N, N, scale=0.9) / math.sqrt(N_IN + N) + 0.25
    options = dict(tau=TAU, detach_reset=True, w_init=w, b_init=rand(2, N, scale=0.2))
    layer = (L.RecurrentLIF(N_IN, N, **options) if neuron == "lif"
             else L.RecurrentALIF(N_IN, N, tau_a=TAU_A, beta=BETA, **options))
    w_out, b_out = rand(3, N, 2) / math.sqrt(N), rand(4, 2, scale=0.1)
    head = (L.LeakyRateReadout(N, 2, tau=TAU_OUT, w_init=w_out, b_init=b_out) if readout == "leaky"
            else L.Linear(N, 2, w_init=w_out, b_init=b_out))
    model = ef.Sequential(layer, head)
    brainstate.nn.init_all_states(model, batch_size=B)
    return model


def data():
    return jnp.asarray(rand(5, T, B, N_IN, scale=1.2, shift=0.6)), jnp.asarray(rand(6, T, B, 2))


def triangle(v):
    return np.maximum(0.0, 1.0 - np.abs(v))  # the default surrogate: width 1, scale 1


def published_eprop(model, xs, ys, neuron, kappa, feedback=None):
    """e-prop's gradients, simulated and accumulated by hand (numpy, float64)."""
    layer, head = model.layers
    W, b = (np.asarray(v) for v in (layer.W.weight.value["weight"], layer.W.weight.value["bias"]))
    W_out, b_out = (np.asarray(head.weight.value[k]) for k in ("weight", "bias"))
    Bfb = W_out if feedback is None else feedback  # (N, 2): L_j = Σ_k B_jk δy_k
    alpha, rho = math.exp(-1 / TAU), math.exp(-1 / TAU_A)
    xs, ys = np.asarray(xs), np.asarray(ys)
    V, a, y = np.zeros((B, N)), np.zeros((B, N)), np.zeros((B, 2))
    K = N_IN + N + 1
    eps_v, eps_a, ebar = np.zeros((B, K, N)), np.zeros((B, K, N)), np.zeros((B, K, N))
    zbar, onebar = np.zeros((B, N)), 0.0
    gW, gW_out, gb_out = np.zeros((K, N)), np.zeros((N, 2)), np.zeros(2)
    beta = BETA if neuron == "alif" else 0.0
    for t in range(len(xs)):
        threshold_prev = 1.0 + beta * a
        z_prev = (V - threshold_prev > 0).astype(float)
        psi_prev = triangle(V - threshold_prev)
        X = np.concatenate([xs[t], z_prev, np.ones((B, 1))], axis=1)
        a_new = rho * a + z_prev if neuron == "alif" else a
        V = alpha * (V - z_prev * threshold_prev) + X @ np.vstack([W, b[None]])  # reset detached
        a = a_new
        threshold = 1.0 + beta * a
        z = (V - threshold > 0).astype(float)
        psi = triangle(V - threshold)
        # Eligibility vectors. ALIF: e-prop's ε_a^t = ψ^{t−1} ε_v^{t−1} + (ρ − ψ^{t−1} β) ε_a^{t−1};
        # our ALIF's soft reset subtracts the adaptive threshold, so ∂V^t/∂a^{t−1} = −α β z^{t−1}.
        eps_v, eps_a = (alpha * eps_v - alpha * beta * z_prev[:, None, :] * eps_a + X[:, :, None],
                        psi_prev[:, None, :] * eps_v + (rho - psi_prev[:, None, :] * beta) * eps_a)
        e = psi[:, None, :] * (eps_v - beta * eps_a)
        ebar = kappa * ebar + e
        y = kappa * y + z @ W_out + b_out
        dy = 2 * (y - ys[t])
        Lsig = dy @ Bfb.T  # (B, N)
        gW += np.einsum("bj,bij->ij", Lsig, ebar)
        zbar, onebar = kappa * zbar + z, kappa * onebar + 1.0
        gW_out += np.einsum("bj,bk->jk", zbar, dy)
        gb_out += dy.sum(0) * onebar
    return {"W": gW[:-1], "b": gW[-1], "W_out": gW_out, "b_out": gb_out}


def ours(model, xs, ys, algo):
    brainstate.nn.reset_all_states(model, batch_size=B)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        grads, _ = ef.sequence_grad(model, xs, ys, loss, algo=algo)
    brainstate.nn.reset_all_states(model, batch_size=B)
    (_, layer), (_, head) = sorted(grads.items(), key=lambda item: str(item[0]))
    return {"W": layer["weight"], "b": layer["bias"], "W_out": head["weight"], "b_out": head["bias"]}


def env():
    return brainstate.environ.context(precision=64, dt=1.0)


def check(got, want, tol=1e-10):
    for key in want:
        np.testing.assert_allclose(np.asarray(got[key]), want[key], rtol=tol, atol=tol, err_msg=key)


@pytest.mark.parametrize("neuron", ["lif", "alif"])
@pytest.mark.parametrize("readout", ["leaky", "linear"])
def test_symmetric_eprop_is_the_published_update(neuron, readout):
    with env():
        model, (xs, ys) = build(neuron, readout), data()
        kappa = math.exp(-1 / TAU_OUT) if readout == "leaky" else 0.0
        want = published_eprop(model, xs, ys, neuron, kappa)
        assert np.abs(want["W"]).sum() > 1.0 and np.abs(want["W"][N_IN:]).sum() > 0.1  # spikes, recurrent traffic
        check(ours(model, xs, ys, "eprop"), want)


def test_random_eprop_feeds_the_error_back_through_a_fixed_matrix():
    with env():
        model, (xs, ys) = build("alif"), data()
        # The documented matrix: N(0, 1) from PRNGKey(seed), scaled by 1/sqrt(inputs), shaped like W_out.
        matrix = np.asarray(jax.random.normal(jax.random.PRNGKey(7), (N, 2), jnp.float64)) / math.sqrt(N)
        want = published_eprop(model, xs, ys, "alif", math.exp(-1 / TAU_OUT), feedback=matrix)
        check(ours(model, xs, ys, EProp(feedback="random", seed=7)), want)
        check(ours(model, xs, ys, "eprop:random:seed=7"), want)
        symmetric = published_eprop(model, xs, ys, "alif", math.exp(-1 / TAU_OUT))
        assert not np.allclose(want["W"], symmetric["W"])


def test_the_readout_gets_the_bptt_gradient_and_the_layer_a_different_one():
    with env():
        model, (xs, ys) = build("lif"), data()
        reference, _ = reference_bptt(model, xs, ys, loss, B)
        got = ours(model, xs, ys, "eprop")
        (_, ref_layer), (_, ref_head) = sorted(reference.items(), key=lambda item: str(item[0]))
        np.testing.assert_allclose(got["W_out"], ref_head["weight"], rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(got["b_out"], ref_head["bias"], rtol=1e-10, atol=1e-10)
        d_rtrl = ours(model, xs, ys, "d_rtrl")
        assert not np.allclose(got["W"], d_rtrl["W"])  # another learning signal than §5.8's
        cosine = np.vdot(got["W"], ref_layer["weight"]) / np.linalg.norm(got["W"]) / np.linalg.norm(ref_layer["weight"])
        assert cosine > 0.5, cosine


def test_a_loss_at_the_last_step_only_matches_the_published_update():
    with env():
        model, (xs, ys) = build("alif"), data()
        mask = np.zeros((T, 1, 1)); mask[-1] = 1.0
        kappa = math.exp(-1 / TAU_OUT)

        def last_loss(out, y):
            return jnp.sum(y[1] * (out - y[0]) ** 2)

        targets = (ys, jnp.broadcast_to(jnp.asarray(mask), ys.shape))
        brainstate.nn.reset_all_states(model, batch_size=B)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ef.ApproximationWarning)
            grads, _ = ef.sequence_grad(model, xs, targets, last_loss, algo="eprop")
        brainstate.nn.reset_all_states(model, batch_size=B)
        layer = grads[("layers", 0, "W", "weight")]
        # the published update with the error at the last step only: only ē^T counts
        full = published_eprop(model, xs, ys, "alif", kappa)
        head = published_eprop(model, xs[:-1], ys[:-1], "alif", kappa)
        np.testing.assert_allclose(np.asarray(layer["weight"]), full["W"] - head["W"], rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("placement, advance", [("all", "per_chunk"), ("last", "in_the_step_loop"),
                                                ("last", "per_chunk")])
def test_over_chunks_it_is_still_the_published_update(placement, advance, monkeypatch):
    """e-prop runs on D-RTRL's chunk, its ē one more trace state (``EPropRule``): over
    chunks of 4 (T = 14: three, then a last chunk of 2), with the error at every step or
    (``active="last"``, the Trainer's ``loss_on="last"``) at the last step only, the
    traces of the steps without loss advanced in the step loop or once per chunk, the
    update is still the published one."""
    if advance == "per_chunk":
        monkeypatch.setattr(d_rtrl, "STEPWISE_NUMBERS", 0)

    def masked_loss(out, target):
        return jnp.sum(target[1] * (out - target[0]) ** 2)

    with env():
        model, (xs, ys) = build("alif"), data()
        kappa = math.exp(-1 / TAU_OUT)
        mask = np.zeros((T, 1, 1)) if placement == "last" else np.ones((T, 1, 1))
        mask[-1] = 1.0
        want = published_eprop(model, xs, ys, "alif", kappa)
        if placement == "last":
            head = published_eprop(model, xs[:-1], ys[:-1], "alif", kappa)
            want = {key: want[key] - head[key] for key in want}
        targets = (ys, jnp.broadcast_to(jnp.asarray(mask), ys.shape))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ef.ApproximationWarning)
            graph, plan = ef.algorithms.plan_for(model, xs, targets, masked_loss, algo="eprop")
        program = build_online(graph, plan.pairs, plan.rules, masked_loss, trace_dtype=plan.trace_dtype, chunk=4,
                               feedback=plan.feedback)
        assert program.init_traces(B).traces[0].shape == (B, 1, 3, N_IN + N + 1, N)  # v, a and ē
        module = graph.module
        weights = [leaf for s in module.weights for leaf in jax.tree.leaves(s.state.value)]
        active = "last" if placement == "last" else None
        grads = jax.jit(lambda w, s, x, t: program.run(w, s, x, t, active=active))(
            weights, module.state_leaves(), [xs], targets)[0]
    by_path = grads_by_path(module, grads)
    (_, layer), (_, head) = sorted(by_path.items(), key=lambda item: str(item[0]))
    check({"W": layer["weight"], "b": layer["bias"], "W_out": head["weight"], "b_out": head["bias"]}, want, 1e-9)


@pytest.mark.parametrize("every", [5, 7])
def test_updates_inside_the_sequence_over_chunks_equal_the_per_step_rule(every):
    """``update_every`` (the optimizer inside the scan: traces carry across updates)
    with chunks of 4 gives the weights of the rule's per-step form (D-RTRL's ``step``
    over the ε and ē states), for windows that chunks do and do not divide."""
    with env():
        model, (xs, ys) = build("alif"), data()
        results = []
        for chunk, per_step in ((1, True), (4, False)):
            brainstate.nn.reset_all_states(model, batch_size=B)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ef.ApproximationWarning)
                graph, plan = ef.algorithms.plan_for(model, xs, ys, loss, algo="eprop")
            rules = tuple(PerStep(r) for r in plan.rules) if per_step else plan.rules
            program = build_online(graph, plan.pairs, rules, loss, trace_dtype=plan.trace_dtype, chunk=chunk,
                                   feedback=plan.feedback)
            module = graph.module
            weights = [leaf for s in module.weights for leaf in jax.tree.leaves(s.state.value)]
            optimizer = optax.sgd(0.05)
            run = jax.jit(lambda w, s, x, y, o: program.run_with_updates(w, s, x, y, optimizer, o, every))
            new, _, losses, _ = run(weights, module.state_leaves(), [xs], ys, optimizer.init(weights))
            results.append(([np.asarray(w) for w in new], np.asarray(losses)))
    (ref, ref_losses), (got, got_losses) = results
    assert any(float(np.max(np.abs(w - np.asarray(w0)))) > 1e-6 for w, w0 in zip(ref, weights))
    np.testing.assert_allclose(got_losses, ref_losses, rtol=1e-10)
    for w, r in zip(got, ref):
        np.testing.assert_allclose(w, r, rtol=1e-10, atol=1e-12)


def test_report_names_the_rule_and_why_it_is_approximate():
    with env():
        model, (xs, _) = build("lif"), data()
        with pytest.warns(ef.ApproximationWarning, match="e-prop: the learning signal is the readout's error"):
            learner = ef.compile(model, xs[0], loss, algo="eprop")
        report = learner.plan.report()
        assert "eprop" in report and f"κ = {math.exp(-1 / TAU_OUT):g}" in report
        assert learner.plan.rule_of("layers.1.weight") == ("d_rtrl",)


class SpikeBeforeReset(L.Neuron):
    """Integrate, fire, reset to zero, the spike taken before the reset (Norse's order)."""

    def __init__(self, size):
        super().__init__(size)
        self.spike = L.Sigmoid()
        self.hidden("mem")

    def update(self, x):
        mem = 0.9 * self.mem.value + x
        z = self.spike(mem - 1.0)
        self.mem.value = jnp.where(z > 0.5, 0.0, mem)
        return z


def test_models_eprop_does_not_take_are_refused_by_name():
    with env():
        deep = ef.Sequential(L.Linear(N_IN, N), L.LIF(N), L.Linear(N, N), L.LIF(N), L.Linear(N, 2))
        brainstate.nn.init_all_states(deep, batch_size=B)
        with pytest.raises(ConfigError, match=r"layers\.0\.weight drives \(layers\.1\.V\), which the readout does "
                                              r"not read.*algo='hybrid'"):
            ef.compile(deep, jnp.zeros((B, N_IN)), loss, algo="eprop")
        pooled = ef.Sequential(L.RecurrentLIF(N_IN, N), L.LayerNorm(N), L.Linear(N, 2))
        brainstate.nn.init_all_states(pooled, batch_size=B)
        with pytest.raises(ConfigError, match="through an op that mixes units"):
            ef.compile(pooled, jnp.zeros((B, N_IN)), loss, algo="eprop")
        leaky = ef.Sequential(L.RecurrentLIF(N_IN, N), L.LeakyRateReadout(N, 2, tau=jnp.array([2.0, 9.0])))
        brainstate.nn.init_all_states(leaky, batch_size=B)
        with pytest.raises(ConfigError, match=r"decay is not one number.*EProp\(kappa=...\)"):
            ef.compile(leaky, jnp.zeros((B, N_IN)), loss, algo="eprop")
        ef.compile(leaky, jnp.zeros((B, N_IN)), loss, algo=EProp(kappa=0.7), warn=False)  # given: accepted
        norse = ef.Sequential(L.Linear(N_IN, N), SpikeBeforeReset(N), L.Linear(N, 2))
        brainstate.nn.init_all_states(norse, batch_size=B)
        with pytest.raises(ConfigError, match=r"computed from no hidden state's new value.*self\.hidden\('z'\)"
                                              r".*algo='hybrid'"):  # it had said "reads the hidden groups: none"
            ef.compile(norse, jnp.zeros((B, N_IN)), loss, algo="eprop")
    for bad, message in [(dict(feedback="mirror"), "feedback must be one of"), (dict(kappa=1.0), "kappa must be"),
                         (dict(seed=1.5), "seed must be an int")]:
        with pytest.raises(ConfigError, match=message):
            EProp(**bad)
    with pytest.raises(ConfigError, match="expected 'eprop', 'eprop:random'"):
        ef.algorithms.registry.check_algo("eprop:mirror")


def test_names_round_trip():
    for value in [EProp(), EProp("random"), EProp("random", seed=3), EProp(kappa=0.5)]:
        assert ef.algorithms.registry.signal_algo(str(value)) == value
    assert "eprop" in ef.algorithms.ALGOS


def test_trainer_trains_with_eprop_saves_it_by_name_and_resumes_exactly(tmp_path):
    x, y = rate_discrimination(12, seq_len=T, num_channels=N_IN, low_rate=0.05, high_rate=0.4, seed=0)

    def weights(trainer):
        return {k: jax.tree.map(np.asarray, v) for k, v in trainer.get_weights().items()}

    with brainstate.environ.context(dt=1.0), warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.ApproximationWarning)
        trainer = ef.Trainer(build("alif"), algo="eprop:random:seed=3", optimizer=optax.adam(1e-2))
        before = weights(trainer)
        trainer.fit(x, y, batch_size=B * 2, epochs=2, verbose=0)
        assert all(np.all(np.isfinite(h)) for h in trainer.history.history["loss"])
        assert not np.allclose(before[("layers", 0, "W", "weight")]["weight"],
                               weights(trainer)[("layers", 0, "W", "weight")]["weight"])
        trainer.save(tmp_path / "run.ckpt")
        loaded = ef.Trainer.load(tmp_path / "run.ckpt", build("alif"), optimizer=optax.adam(1e-2))
        assert loaded.config["algo"] == "eprop:random:seed=3"
        trainer.fit(x, y, batch_size=B * 2, epochs=3, initial_epoch=2, verbose=0)
        loaded.fit(x, y, batch_size=B * 2, epochs=3, initial_epoch=2, verbose=0)
    jax.tree.map(np.testing.assert_array_equal, weights(loaded), weights(trainer))

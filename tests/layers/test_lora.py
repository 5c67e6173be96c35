"""LoRALinear: a dense weight made of three parameters (``W + (alpha / rank) A @ B``),
one relation for the compiler. The forward pass against numpy, every rule against BPTT
(float64; D-RTRL exact into an elementwise neuron, for ``A``, ``B``, the bias and a
trained base), the frozen base's gradient exactly zero, the report naming all three,
the Trainer leaving a frozen base untouched, and errors that name the layer."""

from __future__ import annotations

import warnings

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.errors import ConfigError

from ._helpers import check_grads_equal, randn, sequence_grads

T, B, I, N, O, R = 20, 3, 4, 6, 2, 2


def _model(train_base=False, alpha=None):
    lora = L.LoRALinear(I, N, R, alpha=alpha, train_base=train_base)
    lora.lora_b.value = randn(7, R, N)  # B starts at zero: move it so A has a gradient too
    return ef.Sequential(lora, L.LIF(N, tau=5.0, v_threshold=0.5, surrogate="sigmoid"), L.Linear(N, O))


def _data():
    rng = np.random.default_rng(0)
    return jnp.asarray(rng.normal(size=(T, B, I)) + 0.5), jnp.asarray(rng.normal(size=(T, B, O)))


def test_the_forward_pass_is_the_base_plus_the_scaled_low_rank_product():
    with brainstate.environ.context(precision=64):
        layer = L.LoRALinear(I, N, R, alpha=6.0)
        x = randn(1, B, I)
        np.testing.assert_allclose(np.asarray(layer(x)), np.asarray(x @ layer.weight.value["weight"]
                                                                    + layer.weight.value["bias"]), rtol=1e-12)
        layer.lora_b.value = randn(2, R, N)
        W = np.asarray(layer.weight.value["weight"]) + 3.0 * np.asarray(layer.lora_a.value) @ np.asarray(
            layer.lora_b.value)
        np.testing.assert_allclose(np.asarray(layer(x)), np.asarray(x) @ W + np.asarray(layer.weight.value["bias"]),
                                   rtol=1e-12)
        assert layer.lora_a.value.shape == (I, R) and layer.scale == 3.0
        base = L.Linear(I, N)
        adapted = L.LoRALinear.from_linear(base, rank=1)
        np.testing.assert_allclose(np.asarray(adapted(x)), np.asarray(base(x)), rtol=1e-12)


@pytest.mark.parametrize("train_base", [False, True])
def test_every_rule_against_bptt(train_base):
    """D-RTRL and the hybrid give BPTT's gradient for ``A``, ``B``, the bias and (when
    trained) the base; ES-D-RTRL is close; a frozen base's gradient is exactly zero
    under every rule, as under BPTT."""
    with brainstate.environ.context(precision=64, dt=1.0):
        xs, ys = _data()
        grads = {}
        for algo in ("reference", "d_rtrl", "hybrid", "esd_rtrl"):
            brainstate.random.seed(1)
            model = _model(train_base)
            brainstate.nn.init_all_states(model, batch_size=B)
            grads[algo] = sequence_grads(model, xs, ys, algo)
        reference = grads["reference"]
        base = ("layers", 0, "weight")
        if not train_base:
            for algo, grad in grads.items():
                assert not np.any(np.asarray(grad[base]["weight"])), algo
            drop = lambda g: {p: ({"bias": v["bias"]} if p == base else v) for p, v in g.items()}  # noqa: E731
            reference, d_rtrl, hybrid = drop(reference), drop(grads["d_rtrl"]), drop(grads["hybrid"])
        else:
            d_rtrl, hybrid = grads["d_rtrl"], grads["hybrid"]
        check_grads_equal(d_rtrl, reference, rtol=1e-8, atol=1e-12)
        check_grads_equal(hybrid, reference, rtol=1e-8, atol=1e-12)
        flat = lambda g: np.concatenate([np.ravel(np.asarray(v)) for v in jax.tree.leaves(g)])  # noqa: E731
        a, b = flat(grads["esd_rtrl"]), flat(grads["reference"])
        assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) > 0.9


def test_the_report_names_the_three_parameters_of_one_relation():
    with brainstate.environ.context(dt=1.0):
        model = _model()
        brainstate.nn.init_all_states(model, batch_size=B)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ef.ApproximationWarning)  # exact: no warning
            learner = ef.compile(model, jnp.ones((B, I)), algo="hybrid")
    report = learner.report()
    assert "layers.0.weight + layers.0.lora_a + layers.0.lora_b | etp_mm" in report
    for name in ("layers.0.weight", "layers.0.lora_a", "layers.0.lora_b"):
        assert learner.plan.rule_of(name) == ("d_rtrl",), name
        assert "stop_gradient" in learner.graph.explain(name) or name != "layers.0.weight"
    assert "not traced" not in report and learner.plan.approximations() == {}


def test_the_trainer_trains_the_adapter_and_leaves_a_frozen_base_alone():
    with brainstate.environ.context(dt=1.0):
        brainstate.random.seed(0)
        model = _model()
        layer = model.layers[0]
        base, a0, b0 = (np.asarray(v) for v in (layer.weight.value["weight"], layer.lora_a.value, layer.lora_b.value))
        xs, ys = _data()
        x = np.swapaxes(np.asarray(xs), 0, 1).astype(np.float32)
        y = np.swapaxes(np.asarray(ys), 0, 1).astype(np.float32)
        trainer = ef.Trainer(model, algo="hybrid", optimizer=optax.adam(1e-2), loss="mse", loss_on="all",
                             metrics=[])
        history = trainer.fit(x, y, batch_size=B, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    np.testing.assert_array_equal(np.asarray(layer.weight.value["weight"]), base)
    assert not np.allclose(np.asarray(layer.lora_a.value), a0)
    assert not np.allclose(np.asarray(layer.lora_b.value), b0)


@pytest.mark.parametrize("update_every", [None, 5])
def test_weight_decay_leaves_a_frozen_base_alone_as_keras_leaves_a_non_trainable_weight(update_every):
    """AdamW's decoupled weight decay moves every weight it is given, a zero gradient
    or not: the frozen base shrank by ``lr · wd · W`` per update (fine-tuning with AdamW
    is the usual LoRA setting). The Trainer keeps it, also between the updates inside a
    sequence; the adapter and a trained base still move."""
    with brainstate.environ.context(dt=1.0):
        xs, ys = _data()
        x = np.swapaxes(np.asarray(xs), 0, 1).astype(np.float32)
        y = np.swapaxes(np.asarray(ys), 0, 1).astype(np.float32)
        for train_base in (False, True):
            brainstate.random.seed(0)
            model = _model(train_base=train_base)
            layer = model.layers[0]
            base, bias = (np.asarray(layer.weight.value[k]) for k in ("weight", "bias"))
            trainer = ef.Trainer(model, algo="d_rtrl", optimizer=optax.adamw(1e-2, weight_decay=0.5), loss="mse",
                                 loss_on="all", metrics=[], update_every=update_every)
            trainer.fit(x, y, batch_size=B, epochs=2, verbose=0)
            moved = not np.array_equal(np.asarray(layer.weight.value["weight"]), base)
            assert moved == train_base
            assert not np.allclose(np.asarray(layer.weight.value["bias"]), bias)  # the bias is trained


def test_online_fit_with_weight_decay_leaves_a_frozen_base_alone():
    with brainstate.environ.context(dt=1.0):
        brainstate.random.seed(0)
        model = _model()
        layer = model.layers[0]
        base, a0 = np.asarray(layer.weight.value["weight"]), np.asarray(layer.lora_a.value)
        brainstate.nn.init_all_states(model, batch_size=B)
        xs, ys = _data()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ef.ApproximationWarning)
            ef.online_fit(model, xs.astype(jnp.float32), ys.astype(jnp.float32), lambda o, y: jnp.sum((o - y) ** 2),
                          optax.adamw(1e-2, weight_decay=0.5), update_every=5, algo="d_rtrl")
    np.testing.assert_array_equal(np.asarray(layer.weight.value["weight"]), base)
    assert not np.allclose(np.asarray(layer.lora_a.value), a0)


def test_bad_arguments_name_the_layer():
    with pytest.raises(ConfigError, match="LoRALinear: rank must be a positive int, got 0"):
        L.LoRALinear(I, N, 0)
    with pytest.raises(ConfigError, match="LoRALinear: alpha must be a positive number, got -1"):
        L.LoRALinear(I, N, 2, alpha=-1)
    with pytest.raises(ConfigError, match="mask or weight_fn"):
        L.LoRALinear.from_linear(L.Linear(I, N, mask=np.ones((I, N))), rank=2)
    with pytest.raises(ConfigError, match="takes a Linear, got LIF"):
        L.LoRALinear.from_linear(L.LIF(N), rank=2)

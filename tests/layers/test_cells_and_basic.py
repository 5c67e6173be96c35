"""minGRU, minLSTM, MGU, MinimalRNN, UR-LSTM, activations, pooling and normalisation: forward
passes against references written here, every rule against BPTT (float64), and the
compiler naming each approximation (a normalisation or pooling between a weight and a
neuron mixes units: it must say so, not train silently wrong)."""

from __future__ import annotations

import warnings

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.errors import ConfigError, ShapeError

from ._helpers import check_grads_equal, sequence_grads

T, B = 30, 3


def lif(size, threshold=0.5):
    return L.LIF(size, tau=5.0, v_threshold=threshold, surrogate="sigmoid")


# name: (model, input shape per step, exact under D-RTRL, ES-D-RTRL cosine bound, D-RTRL cosine bound,
#        weights the compiler must name as approximate)
MODELS = {
    "MinGRUCell": (lambda: ef.Sequential(L.MinGRUCell(3, 5), L.Linear(5, 2)), (3,), True, 0.99, 1.0, set()),
    "MinLSTMCell": (lambda: ef.Sequential(L.MinLSTMCell(3, 5), L.Linear(5, 2)), (3,), True, 0.98, 1.0, set()),
    "RMSNorm after a cell": (lambda: ef.Sequential(L.MinGRUCell(3, 5), L.RMSNorm(5), L.Linear(5, 2)), (3,), True,
                             0.99, 1.0, set()),
    "MGUCell": (lambda: ef.Sequential(L.MGUCell(3, 5), L.Linear(5, 2)), (3,), False, 0.98, 0.99,
                {"layers.0.W_f.weight", "layers.0.W_h.weight"}),
    "MinimalRNNCell": (lambda: ef.Sequential(L.MinimalRNNCell(3, 5), L.Linear(5, 2)), (3,), False, 0.97, 0.99,
                       {"layers.0.W_u.weight", "layers.0.W_x.weight"}),
    "URLSTMCell": (lambda: ef.Sequential(L.URLSTMCell(3, 5), L.Linear(5, 2)), (3,), False, 0.95, 0.99,
                   {"layers.0.W_f.weight", "layers.0.W_r.weight", "layers.0.W_u.weight", "layers.0.W_o.weight"}),
    "LayerNorm between Linear and LIF": (
        lambda: ef.Sequential(L.Linear(3, 5), L.LayerNorm(5), lif(5), L.Linear(5, 2)), (3,), False, 0.9, 0.9,
        {"layers.0.weight"}),
    "AvgPool1d between Conv1d and LIF": (
        lambda: ef.Sequential(L.Conv1d(2, 4, 3), L.AvgPool1d(2), lif((4, 4)), L.Flatten(), L.Linear(16, 2)),
        (8, 2), False, 0.9, 0.9, {"layers.0.weight"}),
    "AdaptiveAvgPool1d after LIF": (
        lambda: ef.Sequential(L.Conv1d(2, 4, 3), lif((8, 4)), L.AdaptiveAvgPool1d(3), L.Flatten(), L.Linear(12, 2)),
        (8, 2), True, 0.9, 1.0, set()),
    "AdaptiveMaxPool2d between Conv2d and LIF": (
        lambda: ef.Sequential(L.Conv2d(1, 2, 3), L.AdaptiveMaxPool2d((2, 3)), lif((2, 3, 2)), L.Flatten(),
                              L.Linear(12, 2)), (5, 6, 1), False, 0.9, 0.95, {"layers.0.weight"}),
    "MaxPool2d between Conv2d and LIF": (
        lambda: ef.Sequential(L.Conv2d(1, 2, 3), L.MaxPool2d(2), lif((2, 2, 2)), L.Flatten(), L.Linear(8, 2)),
        (4, 4, 1), False, 0.9, 0.95, {"layers.0.weight"}),
}


def grads_of(name, algo):
    make, shape, *_ = MODELS[name]
    rng = np.random.default_rng(0)
    brainstate.random.seed(1)
    model = make()
    brainstate.nn.init_all_states(model, batch_size=B)
    xs = jnp.asarray(rng.normal(size=(T, B, *shape)) + 0.5)
    ys = jnp.asarray(rng.normal(size=(T, B, 2)))
    return model, sequence_grads(model, xs, ys, algo), xs


def cosine(a, b):
    flat = lambda g: np.concatenate([np.ravel(np.asarray(v)) for v in jax.tree.leaves(g)])  # noqa: E731
    a, b = flat(a), flat(b)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("name", list(MODELS))
def test_every_rule_against_bptt_and_the_compiler_names_what_is_approximate(name):
    _, _, exact, es_bound, d_bound, approximate = MODELS[name]
    with brainstate.environ.context(precision=64, dt=1.0):
        _, reference, _ = grads_of(name, "reference")
        model, d_rtrl, xs = grads_of(name, "d_rtrl")
        _, es, _ = grads_of(name, "esd_rtrl")
        _, hybrid, _ = grads_of(name, "hybrid")
        if exact:
            check_grads_equal(d_rtrl, reference, rtol=1e-8, atol=1e-12)
            check_grads_equal(hybrid, reference, rtol=1e-8, atol=1e-12)
        else:
            assert cosine(d_rtrl, reference) >= d_bound
            assert cosine(d_rtrl, reference) < 1 - 1e-9  # really approximate: the warning is deserved
        assert cosine(es, reference) >= es_bound
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ef.ApproximationWarning)
            learner = ef.compile(model, xs[0], algo="d_rtrl")
        assert set(learner.approximations()) == approximate
        warned = {str(w.message).split(" is approximate")[0].rsplit(" ", 1)[-1] for w in caught
                  if issubclass(w.category, ef.ApproximationWarning)}
        assert warned == approximate


def test_a_normalisation_between_a_weight_and_its_neuron_is_named_in_the_reason():
    with brainstate.environ.context(precision=64, dt=1.0):
        model, _, xs = grads_of("LayerNorm between Linear and LIF", "reference")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ef.ApproximationWarning)
            learner = ef.compile(model, xs[0], algo="d_rtrl")
    reasons = " ".join(learner.approximations()["layers.0.weight"])
    assert "mixes units" in reasons and "reduce_sum" in reasons


# ------------------------------------------------------------------ forward references
def test_min_gru_and_min_lstm_follow_their_equations():
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(6, 2, 3))
    with brainstate.environ.context(precision=64, dt=1.0):
        gru, lstm = L.MinGRUCell(3, 4), L.MinLSTMCell(3, 4)
        for cell in (gru, lstm):
            brainstate.nn.init_all_states(cell, batch_size=2)
        out_gru = np.asarray(brainstate.transform.for_loop(gru, jnp.asarray(xs)))
        out_lstm = np.asarray(brainstate.transform.for_loop(lstm, jnp.asarray(xs)))
    w = lambda layer: (np.asarray(layer.weight.value["weight"]), np.asarray(layer.weight.value["bias"]))  # noqa: E731
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    h = np.zeros((2, 4))
    for t in range(6):
        (wz, bz), (wh, bh) = w(gru.W_z), w(gru.W_h)
        z = sig(xs[t] @ wz + bz)
        h = (1 - z) * h + z * (xs[t] @ wh + bh)
        np.testing.assert_allclose(out_gru[t], h, rtol=1e-12)
    h = np.zeros((2, 4))
    for t in range(6):
        (wf, bf), (wi, bi), (wh, bh) = w(lstm.W_f), w(lstm.W_i), w(lstm.W_h)
        f, i = sig(xs[t] @ wf + bf), sig(xs[t] @ wi + bi)
        h = (f * h + i * (xs[t] @ wh + bh)) / (f + i)
        np.testing.assert_allclose(out_lstm[t], h, rtol=1e-12)


def test_ur_lstm_follows_its_equations_and_starts_with_uniform_forget_gates():
    rng = np.random.default_rng(1)
    xs = rng.normal(size=(5, 2, 3))
    with brainstate.environ.context(precision=64, dt=1.0):
        cell = L.URLSTMCell(3, 4, max_timescale=100.0)
        brainstate.nn.init_all_states(cell, batch_size=2)
        out = np.asarray(brainstate.transform.for_loop(cell, jnp.asarray(xs)))
    w = lambda layer: (np.asarray(layer.weight.value["weight"]), np.asarray(layer.weight.value["bias"]))  # noqa: E731
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    (wf, bf), (wr, br), (wu, bu), (wo, bo) = w(cell.W_f), w(cell.W_r), w(cell.W_u), w(cell.W_o)
    np.testing.assert_allclose(sig(bf), np.linspace(0.01, 0.99, 4), rtol=1e-12)  # forget gates 1/100 .. 99/100
    np.testing.assert_allclose(br, -bf, rtol=1e-12)
    h, c = np.zeros((2, 4)), np.zeros((2, 4))
    for t in range(5):
        xh = np.concatenate([xs[t], h], axis=1)
        f, r, u, o = sig(xh @ wf + bf), sig(xh @ wr + br), np.tanh(xh @ wu + bu), sig(xh @ wo + bo)
        g = r * (1 - (1 - f) ** 2) + (1 - r) * f ** 2
        c = g * c + (1 - g) * u
        h = o * np.tanh(c)
        np.testing.assert_allclose(out[t], h, rtol=1e-10, atol=1e-15)
    with pytest.raises(ConfigError, match=r"URLSTMCell\(3, 4\): max_timescale must be a number above 2"):
        L.URLSTMCell(3, 4, max_timescale=1)


def test_activations_by_name_and_class():
    x = jnp.linspace(-2.0, 2.0, 9)
    np.testing.assert_allclose(L.Activation("relu")(x), jax.nn.relu(x))
    np.testing.assert_allclose(L.Tanh()(x), jnp.tanh(x))
    np.testing.assert_allclose(L.GELU()(x), jax.nn.gelu(x))
    np.testing.assert_allclose(L.SiLU()(x), x * jax.nn.sigmoid(x))
    np.testing.assert_allclose(L.LeakyReLU(0.2)(x), jnp.where(x > 0, x, 0.2 * x))
    np.testing.assert_allclose(L.Activation(jnp.sin)(x), jnp.sin(x))
    with pytest.raises(ConfigError, match="unknown activation 'relu6'; valid: relu, tanh"):
        L.Activation("relu6")


def test_pooling_against_numpy():
    x = np.random.default_rng(0).normal(size=(2, 6, 6, 3))
    avg = np.asarray(L.AvgPool2d(2)(jnp.asarray(x)))
    mx = np.asarray(L.MaxPool2d((2, 3))(jnp.asarray(x)))
    np.testing.assert_allclose(avg, x.reshape(2, 3, 2, 3, 2, 3).mean(axis=(2, 4)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(mx, x.reshape(2, 3, 2, 2, 3, 3).max(axis=(2, 4)), rtol=1e-6)
    seq = np.random.default_rng(1).normal(size=(2, 7, 3))
    same = np.asarray(L.AvgPool1d(2, padding="SAME")(jnp.asarray(seq)))
    assert same.shape == (2, 4, 3)
    np.testing.assert_allclose(same[:, -1], seq[:, -1], rtol=1e-6)  # the last window holds one real entry
    np.testing.assert_allclose(np.asarray(L.MaxPool1d(3, stride=2)(jnp.asarray(seq)))[:, 0], seq[:, :3].max(axis=1),
                               rtol=1e-6)
    with pytest.raises(ShapeError, match="AvgPool2d.*channels-last input, got x.shape=\\(6, 3\\)"):
        L.AvgPool2d(2)(jnp.ones((6, 3)))
    with pytest.raises(ConfigError, match="MaxPool1d: kernel_size must be a positive int"):
        L.MaxPool1d(0)


def _adaptive_reference(x, sizes, reduce):
    """PyTorch's adaptive pooling written out: bin i of an axis of length L covers
    [floor(i L / n), ceil((i + 1) L / n)); channels last, spatial axes 1.. ."""
    lengths = x.shape[1:1 + len(sizes)]
    out = np.empty((x.shape[0], *sizes, x.shape[-1]))
    for index in np.ndindex(*sizes):
        window = tuple(slice(int(np.floor(i * n / s)), int(np.ceil((i + 1) * n / s)))
                       for i, n, s in zip(index, lengths, sizes))
        out[(slice(None), *index)] = reduce(x[(slice(None), *window)], axis=tuple(range(1, 1 + len(sizes))))
    return out


def test_adaptive_pooling_against_numpy_for_any_input_size():
    rng = np.random.default_rng(0)
    for shape, size in (((2, 7, 5, 3), (3, 2)), ((2, 6, 6, 3), (3, 3)), ((1, 5, 4, 2), (1, 1))):
        x = rng.normal(size=shape)
        np.testing.assert_allclose(np.asarray(L.AdaptiveAvgPool2d(size)(jnp.asarray(x))),
                                   _adaptive_reference(x, size, np.mean), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(np.asarray(L.AdaptiveMaxPool2d(size)(jnp.asarray(x))),
                                   _adaptive_reference(x, size, np.max), rtol=1e-6)
    seq = rng.normal(size=(2, 10, 3))
    for size in (1, 3, 4, 10):  # 3 and 4 do not divide 10: overlapping bins
        np.testing.assert_allclose(np.asarray(L.AdaptiveAvgPool1d(size)(jnp.asarray(seq))),
                                   _adaptive_reference(seq, (size,), np.mean), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(np.asarray(L.AdaptiveMaxPool1d(size)(jnp.asarray(seq))),
                                   _adaptive_reference(seq, (size,), np.max), rtol=1e-6)
    assert L.AdaptiveAvgPool2d(1)(jnp.ones((4, 9, 9, 2))).shape == (4, 1, 1, 2)  # global average pooling
    with pytest.raises(ShapeError, match=r"AdaptiveAvgPool1d.*has 3 entries, fewer than the 4 bins"):
        L.AdaptiveAvgPool1d(4)(jnp.ones((2, 3, 5)))
    with pytest.raises(ShapeError, match=r"AdaptiveMaxPool2d.*channels-last input, got x.shape=\(6, 3\)"):
        L.AdaptiveMaxPool2d(2)(jnp.ones((6, 3)))
    with pytest.raises(ConfigError, match="AdaptiveAvgPool2d: output_size must be a positive int or 2 of them"):
        L.AdaptiveAvgPool2d((2, 0))


def test_layer_and_rms_norm_against_numpy_with_learned_scale_and_bias():
    x = np.random.default_rng(0).normal(size=(4, 5)) * 3 + 1
    with brainstate.environ.context(precision=64):
        norm = L.LayerNorm(5)
        norm.scale.value = jnp.arange(1.0, 6.0)
        norm.bias.value = jnp.full(5, 0.5)
        rms = L.RMSNorm(5, learn_scale=False)
        out, out_rms = np.asarray(norm(jnp.asarray(x))), np.asarray(rms(jnp.asarray(x)))
    expected = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * np.arange(1, 6) + 0.5
    np.testing.assert_allclose(out, expected, rtol=1e-10)
    np.testing.assert_allclose(out_rms, x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6), rtol=1e-10)
    assert set(norm.states(brainstate.ParamState)) == {("scale",), ("bias",)}
    assert not rms.states(brainstate.ParamState)
    with pytest.raises(ShapeError, match="LayerNorm\\(5\\).*5 features"):
        norm(jnp.ones((2, 4)))
    with pytest.raises(ConfigError, match="RMSNorm\\(5\\): eps must be positive"):
        L.RMSNorm(5, eps=0.0)

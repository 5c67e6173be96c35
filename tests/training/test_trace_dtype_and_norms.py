"""``Trainer(trace_dtype=...)``, the per-sample trace norms the rules report, and the
warning ``fit`` gives when they near overflow (references: numpy in float64, BPTT)."""

import warnings

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit.algorithms.d_rtrl import DRTRL
from etrace_fit.algorithms.eprop import EPropRule
from etrace_fit.algorithms.esd_rtrl import ESDRTRL
from etrace_fit.errors import ConfigError

from .test_train_step import _data, _model


def _np_norms(traces):
    flat = np.asarray(traces, np.float64).reshape(len(traces), -1)
    return np.sqrt((flat ** 2).sum(axis=1))


@pytest.mark.parametrize("scale", [1.0, 1e25, 1e-30])
def test_d_rtrl_and_eprop_trace_norms_are_per_sample_2_norms_at_any_scale(scale):
    """float32 traces of norm 1e25 read 1e25 (their squares overflow float32); 1e-30
    (squares under float32's smallest normal) reads 1e-30, not 0."""
    traces = np.random.default_rng(0).normal(size=(3, 4, 5, 2)).astype(np.float32) * np.float32(scale)
    got = np.asarray(DRTRL().trace_norm(jnp.asarray(traces), jnp.asarray(3)))
    np.testing.assert_allclose(got, _np_norms(traces), rtol=1e-6)
    # e-prop's trace norm is that of its filtered eligibility, the last state
    got = np.asarray(EPropRule(kappa=0.9).trace_norm(jnp.asarray(traces), jnp.asarray(3)))
    np.testing.assert_allclose(got, _np_norms(traces[:, :, -1:]), rtol=1e-6)


@pytest.mark.parametrize("scale", [1.0, 1e15])
def test_es_d_rtrl_trace_norm_is_the_bias_corrected_outer_products_norm(scale):
    """|ε_x ⊗ ε_f| / (1 − α^t) per sample over the patches; at 1e15 the outer product's
    entries are 1e30, whose squares overflow float32."""
    rng = np.random.default_rng(1)
    eps_x = (rng.normal(size=(3, 2, 4)) * scale).astype(np.float32)  # (B, P, K)
    eps_f = (rng.normal(size=(3, 2, 2, 5)) * scale).astype(np.float32)  # (B, P, S, O)
    outer = np.einsum("bpk,bpso->bpkso", eps_x.astype(np.float64), eps_f.astype(np.float64))
    t, alpha = 4, 0.9
    got = np.asarray(ESDRTRL(alpha).trace_norm((jnp.asarray(eps_x), jnp.asarray(eps_f)), jnp.asarray(t)))
    np.testing.assert_allclose(got, _np_norms(outer) / (1 - alpha ** t), rtol=1e-5)


def test_trace_norms_keep_zero_inf_and_nan():
    traces = jnp.asarray([[0.0, 0.0], [1.0, jnp.inf], [jnp.nan, 1.0], [3.0, -4.0]], jnp.float32)
    got = np.asarray(DRTRL().trace_norm(traces, jnp.asarray(1)))
    assert got[0] == 0 and got[1] == np.inf and np.isnan(got[2]) and got[3] == pytest.approx(5.0)


def _fitted(**options):
    x, y = _data(8)
    trainer = ef.Trainer(_model(), algo="d_rtrl", optimizer="sgd", **options)
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    return trainer


def _check(trainer, trace_norm):
    trainer._norms_warned = False
    trainer.last_gradients = None
    trainer.last_trace_norms = {"layers.0.weight": jnp.asarray([1.0, trace_norm])}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer._check_norms(2)
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def test_large_traces_warn_only_near_their_dtypes_overflow_with_the_fix():
    """A trace of norm 1e9 (what a spiking net whose reset passes a surrogate gradient
    reaches with exact gradients) does not warn; 1e30 in float32 does, naming the dtype
    and the fix, once per trainer; a limit set on the trainer is used instead."""
    trainer = _fitted()
    assert trainer._trace_norm_limit() == (pytest.approx(float(np.finfo(np.float32).max) ** 0.75), "float32")
    assert _check(trainer, 1e9) == []
    [message] = _check(trainer, 1e30)
    assert message.startswith("epoch 3: an eligibility-trace norm is 1e+30, near float32's overflow (3.4e+38): "
                              "Trainer(trace_dtype='float64') (with jax_enable_x64) holds larger traces")
    assert "grad_clip" not in message
    trainer.EXPLODING_TRACE_NORM = 1e8
    assert len(_check(trainer, 1e9)) == 1
    with warnings.catch_warnings():  # once per trainer
        warnings.simplefilter("error")
        trainer._check_norms(3)


def test_exploding_gradient_and_trace_warn_together_each_with_its_fix():
    trainer = _fitted()
    trainer.EXPLODING_GRADIENT_NORM = 1e-12
    trainer.EXPLODING_TRACE_NORM = 1e-12
    x, y = _data(8)
    with pytest.warns(RuntimeWarning) as caught:
        trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    [message] = [str(w.message) for w in caught if "norm is" in str(w.message)]
    assert "the gradient norm is" in message and "clip the gradient (Trainer(grad_clip=1.0)) or lower" in message
    assert "an eligibility-trace norm is" in message and "trace_dtype='float64'" in message


def test_bfloat16_traces_halve_the_trace_memory_and_keep_the_gradient():
    full, half = _fitted(), _fitted(trace_dtype="bfloat16")
    assert jnp.dtype(half.learner.plan.trace_dtype) == jnp.bfloat16 and half.trace_dtype == jnp.bfloat16
    assert half.learner.plan.bytes_per_sample() * 2 == full.learner.plan.bytes_per_sample()
    assert "bfloat16" in half.report()
    for path, gradient in full.last_gradients.items():
        a = np.concatenate([np.ravel(v) for v in gradient.values()]).astype(np.float64)
        b = np.concatenate([np.ravel(v) for v in half.last_gradients[path].values()]).astype(np.float64)
        assert half.last_gradients[path]["weight"].dtype == jnp.float32  # the weights' dtype
        assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) > 0.99, path
    assert not np.array_equal(a, b)  # the traces were rounded: it reached the program


def test_float64_traces_need_x64_and_match_bptt_under_it():
    with pytest.raises(ConfigError, match=r"trace_dtype float64 needs 64-bit JAX: call "
                                          r"jax.config.update\('jax_enable_x64', True\)"):
        ef.Trainer(_model(), trace_dtype="float64")
    with brainstate.environ.context(precision=64), brainstate.environ.context(precision=32):  # x64 on, then off
        with pytest.raises(ConfigError, match=r"set\(precision=64\) does too\); it is off inside "
                                              r"brainstate.environ.context\(precision=32\)"):
            ef.Trainer(_model(), trace_dtype="float64")
    x, y = _data(8)
    with brainstate.environ.context(precision=64):
        trainer = _fitted(trace_dtype=np.float64)
        assert jnp.dtype(trainer.learner.plan.trace_dtype) == jnp.float64
        for path, fidelity in trainer.gradient_fidelity(x, y).items():
            assert fidelity.cosine == pytest.approx(1.0, abs=1e-9), path
            assert fidelity.norm_ratio == pytest.approx(1.0, rel=1e-6), path
        # float64 traces warn near float64's overflow, with a fix other than float64
        assert trainer._trace_norm_limit() == (pytest.approx(float(np.finfo(np.float64).max) ** 0.75), "float64")
        assert _check(trainer, 1e200) == []
        [message] = _check(trainer, 1e250)
        assert "near float64's overflow (1.8e+308): shorter sequences" in message and "trace_dtype" not in message


@pytest.mark.parametrize("bad, shown", [("int8", "'int8'"), (jnp.int32, "'int32'"),
                                        ("half-precision", "'half-precision'")])
def test_a_bad_trace_dtype_fails_in_the_constructor(bad, shown):
    with pytest.raises(ConfigError, match=f"trace_dtype must be float32, bfloat16 or float64, got {shown}"):
        ef.Trainer(_model(), trace_dtype=bad)


def test_trace_dtype_is_saved_and_loaded(tmp_path):
    trainer = _fitted(trace_dtype="bfloat16")
    trainer.save(tmp_path / "run")
    assert trainer.config["trace_dtype"] == "bfloat16"
    loaded = ef.Trainer.load(tmp_path / "run", _model())
    assert loaded.trace_dtype == jnp.bfloat16
    assert ef.Trainer.load(tmp_path / "run", _model(), trace_dtype=None).trace_dtype is None


@pytest.mark.parametrize("algo", ["d_rtrl", "esd_rtrl"])
def test_with_the_loss_at_the_last_step_the_norms_are_of_the_traces_its_loss_reads(algo):
    """``loss_on="last"`` reports the traces the last step's gradient reads, before that
    step's input enters them (the traces after it are read by no loss and not computed):
    the traces a run over the steps before the last ends with. Labels per step for the
    second run: its loss at every step takes the same path to the end of its traces."""
    x, y = _data(8)
    steps = x.shape[1]
    norms = {}
    for loss_on, length in (("last", steps), ("all", steps - 1)):
        trainer = ef.Trainer(_model(), algo=algo, optimizer="sgd", loss_on=loss_on)
        labels = y if loss_on == "last" else np.repeat(y[:, None], length, axis=1)
        trainer.train_on_batch(x[:, :length], labels)
        norms[loss_on] = {path: np.asarray(n) for path, n in trainer.last_trace_norms.items()}
    assert norms["last"].keys() == norms["all"].keys() == {"layers.0.weight", "layers.2.weight"}
    for path in norms["last"]:
        assert np.all(norms["last"][path] > 0)
        np.testing.assert_allclose(norms["last"][path], norms["all"][path], rtol=1e-5)


def test_a_trace_dtype_under_bptt_is_refused_not_ignored():
    with pytest.raises(ConfigError, match=r"trace_dtype='bfloat16' sets the eligibility traces' dtype, but "
                                          r"algo='bptt' keeps no traces"):
        ef.Trainer(_model(), algo="bptt", trace_dtype="bfloat16")
    assert ef.Trainer(_model(), algo="d_rtrl", trace_dtype="bfloat16").trace_dtype == jnp.bfloat16


@pytest.mark.parametrize("algo, setting, value", [("bptt", "decay", 0.5), ("tbptt:5", "decay", 0.5),
                                                   ("d_rtrl", "decay", 0.5), ("eprop", "decay", 0.5),
                                                   ("bptt", "memory_budget", "1MB"),
                                                   ("d_rtrl", "memory_budget", "1MB"),
                                                   ("esd_rtrl", "memory_budget", "1MB")])
def test_a_setting_the_algo_does_not_read_is_refused_not_ignored(algo, setting, value):
    """As ``trace_dtype`` under BPTT (and the command's ``--memory-budget``): ES-D-RTRL's
    decay under BPTT or D-RTRL, and a memory budget under any algo but hybrid, were
    accepted and had no effect."""
    with pytest.raises(ConfigError, match=rf"{setting}={value!r} is .*, but algo={algo!r} does not read it \(it "
                                          rf"would be ignored\); drop it, or use algo='hybrid'"):
        ef.Trainer(_model(), algo=algo, **{setting: value})
    ef.Trainer(_model(), algo="hybrid", **{setting: value})
    if setting == "decay":
        ef.Trainer(_model(), algo="esd_rtrl", decay=value)


def test_a_checkpoint_loaded_under_an_algo_that_does_not_read_its_saved_decay_loads(tmp_path):
    """``Trainer.load(path, model, algo="bptt")`` of a hybrid run saved with a decay (to
    compare a trained model under BPTT): the saved decay is not the user's setting, and
    BPTT ignores it as it always did; a decay passed with the algo is refused."""
    x, y = _data(8)
    trainer = ef.Trainer(_model(), algo="hybrid", decay=0.5, memory_budget="1MB", optimizer="sgd")
    trainer.train_on_batch(x, y)
    trainer.save(tmp_path / "run")
    loaded = ef.Trainer.load(tmp_path / "run", _model(), algo="bptt")
    assert loaded.algo == "bptt" and loaded.decay is None and loaded.memory_budget is None
    for path, weight in trainer.get_weights().items():
        jax.tree.map(np.testing.assert_array_equal, loaded.get_weights()[path], weight)
    with pytest.raises(ConfigError, match="decay=0.5 is ES-D-RTRL's trace decay"):
        ef.Trainer.load(tmp_path / "run", _model(), algo="bptt", decay=0.5)


def test_bfloat16_traces_keep_a_slow_units_decay():
    """The signals were cast to bfloat16 with the traces: exp(-1/500) became the decay of
    τ = 256 and every τ above ~512 no decay at all, so D-RTRL's gradient of a τ = 500
    synapse's bias was 0.56x float32 BPTT's (1.17x at τ = 2000)."""
    for tau, within in ((500.0, 0.005), (2000.0, 0.01)):
        model = ef.Sequential(L.Linear(1, 1, w_init=np.ones((1, 1), np.float32)), L.ExpSynapse(1, tau=tau),
                              L.Linear(1, 1, w_init=np.ones((1, 1), np.float32)))
        brainstate.nn.init_all_states(model, batch_size=1)
        xs, ys = jnp.ones((1000, 1, 1), jnp.float32), jnp.zeros((1000, 1, 1), jnp.float32)
        grads = {}
        for algo, dtype in (("bptt", None), ("d_rtrl", "bfloat16")):
            brainstate.nn.reset_all_states(model, batch_size=1)
            g, _ = ef.sequence_grad(model, xs, ys, lambda out, y: jnp.sum(out), algo=algo, trace_dtype=dtype)
            grads[algo] = float(np.ravel(g[("layers", 0, "weight")]["bias"])[0])
        assert grads["d_rtrl"] == pytest.approx(grads["bptt"], rel=within), (tau, grads)


def test_norms_of_huge_float32_values_are_right_and_a_clip_keeps_their_direction():
    """A norm was scaled by dividing by the largest entry, which XLA turns into a product
    with its reciprocal: above 2^126 that is subnormal, flushed to zero on CPU, and a
    trace of 5e36 read a norm of 0 (no overflow warning). optax's clip summed float32
    squares: a gradient of norm 1.5e20 read inf and became a zero update."""
    import jax
    import optax

    from etrace_fit.algorithms.base import global_norm, sample_norm
    from etrace_fit.training.optimizers import clip_by_global_norm

    huge = jnp.asarray([[5e36, 1e36, 1.0], [3.0, 4.0, 0.0]], jnp.float32)
    np.testing.assert_allclose(np.asarray(jax.jit(sample_norm)(huge)), [np.hypot(5e36, 1e36), 5.0], rtol=1e-6)
    gradient = {"a": jnp.full((4,), 8e19, jnp.float32), "b": jnp.full((2,), -6e19, jnp.float32)}
    expected = np.sqrt(4 * 8e19 ** 2 + 2 * 6e19 ** 2)
    assert float(jax.jit(global_norm)(gradient)) == pytest.approx(expected, rel=1e-6)
    assert not np.isfinite(float(optax.global_norm(gradient)))  # what optax reads
    clipped, _ = jax.jit(clip_by_global_norm(1.0).update)(gradient, optax.EmptyState())
    assert float(global_norm(clipped)) == pytest.approx(1.0, rel=1e-5)
    np.testing.assert_allclose(np.asarray(clipped["a"]), 8e19 / expected, rtol=1e-5)
    small = {"a": jnp.asarray([0.3, 0.4])}  # under the limit: untouched
    np.testing.assert_array_equal(np.asarray(clip_by_global_norm(1.0).update(small, optax.EmptyState())[0]["a"]),
                                  np.asarray(small["a"]))


def test_a_gradient_that_overflows_adams_second_moment_is_not_applied():
    """A finite gradient of ~1e20 squared to inf in Adam's second moment: that update was
    zero and finite, so it counted as applied, and every later update was zero (the
    moment stayed inf), without a warning."""
    import jax

    x, y = _data(8)
    trainer = ef.Trainer(_model(), optimizer="adam", loss_on="last")
    trainer.train_on_batch(x[:4], y[:4])
    before, state = trainer.get_weights(), trainer.opt_state
    with pytest.warns(RuntimeWarning, match="optimizer state"):
        trainer.train_on_batch(x[:4], y[:4], sample_weight=np.full(4, 1e22, np.float32))
    assert trainer.skipped_batches == 1
    jax.tree.map(np.testing.assert_array_equal, trainer.get_weights(), before)
    assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(trainer.opt_state))
    jax.tree.map(np.testing.assert_array_equal, trainer.opt_state, state)
    trainer.train_on_batch(x[:4], y[:4])  # and it goes on learning
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(trainer.get_weights()),
                                                         jax.tree.leaves(before)))

"""Pass 1 — ``module_info`` (etrace_fit/compiler/module_info.py).

The traced step must be the model's step: evaluated on the current state values it
reproduces the model's own outputs and new states bit for bit. States are split by
kind with their brainstate paths, and models the compiler cannot handle are refused
with errors that name the state or layer involved.
"""

from __future__ import annotations

import brainstate
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import saiunit as u

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit import ops
from etrace_fit.compiler import DiagnosticKind, Level, module_info
from etrace_fit.errors import CompilationError, ShapeError

from ._helpers import B, I, N, O, alif_net, gru, leaf_positions, linear, lstm, prime_spiking, rand


# ------------------------------------------------------------------ custom modules


class WritesParam(brainstate.nn.Module):
    """Updates its own ParamState inside the step (not allowed)."""

    def __init__(self):
        super().__init__()
        self.gain = brainstate.ParamState(jnp.ones((N,)))
        self.h = brainstate.HiddenState(jnp.zeros((B, N)))

    def update(self, x):
        self.gain.value = self.gain.value * 1.01
        self.h.value = 0.5 * self.h.value + x * self.gain.value
        return self.h.value


class UnitChanging(brainstate.nn.Module):
    """A membrane in mV whose update divides by ms: its unit changes across the step."""

    def __init__(self):
        super().__init__()
        self.membrane = brainstate.HiddenState(jnp.asarray(rand(3, B, N)) * u.mV)

    def update(self, x):
        self.membrane.value = self.membrane.value / u.ms + x * (u.mV / u.ms)
        return x


class MixedStates(brainstate.nn.Module):
    """A weight, a written hidden state, a read-only hidden state and a written
    short-term (non-hidden) state."""

    def __init__(self):
        super().__init__()
        self.w = brainstate.ParamState(jnp.asarray(rand(0, I, N)))
        self.h = brainstate.HiddenState(jnp.asarray(rand(1, B, N)))
        self.bias_h = brainstate.HiddenState(jnp.asarray(rand(2, B, N)))
        self.count = brainstate.ShortTermState(jnp.zeros(()))

    def update(self, x):
        self.count.value = self.count.value + 1.0
        self.h.value = 0.8 * self.h.value + ops.matmul(x, self.w.value) + self.bias_h.value
        return self.h.value


@jax.jit
def _jitted_drive(x, w):
    return jnp.tanh(ops.matmul(x, w))


@jax.jit
def _doubly_jitted_drive(x, w):
    return 2.0 * _jitted_drive(x, w)


class NestedJit(brainstate.nn.Module):
    def __init__(self, helper):
        super().__init__()
        self.helper = helper
        self.w = brainstate.ParamState(jnp.asarray(rand(0, I, N)))
        self.h = brainstate.HiddenState(jnp.asarray(rand(1, B, N)))

    def update(self, x):
        self.h.value = 0.9 * self.h.value + self.helper(x, self.w.value)
        return self.h.value


# ---------------------------------------------------------------------- model zoo


def _alif_model():
    model = alif_net(learn_tau=True)
    x = jnp.asarray(rand(40, B, I))
    prime_spiking(model)
    return model, x


def _gru_model():
    return gru(), jnp.asarray(rand(41, B, I))


def _lstm_model():
    return lstm(), jnp.asarray(rand(42, B, I))


def _conv_model():
    conv = L.Conv2d(2, 3, 3, w_init=rand(43, 3, 3, 2, 3, scale=0.3), b_init=rand(44, 3, scale=0.1))
    model = L.Sequential(conv, L.Flatten(), linear(45, 4 * 4 * 3, 5), L.LIF(5, tau=4.0))
    brainstate.nn.init_all_states(model, batch_size=B)
    model.layers[3].V.value = jnp.asarray(rand(46, B, 5) * 0.5 + 0.8)
    return model, jnp.asarray(rand(47, B, 4, 4, 2))


MODELS = {
    "linear_alif_linear": _alif_model,
    "gru": _gru_model,
    "lstm": _lstm_model,
    "conv_flatten_linear_lif": _conv_model,
}


# ------------------------------------------------------------------------- tests


def test_states_split_into_weights_hidden_and_other_with_their_paths(env64):
    model, x = _alif_model()
    module = module_info(model, x)
    assert {s.path for s in module.weights} == {("layers", 0, "weight"), ("layers", 1, "tau"), ("layers", 2, "weight")}
    assert {s.path for s in module.hidden} == {("layers", 1, "V"), ("layers", 1, "a")}
    assert module.others == ()
    assert all(s.kind == "weight" and not s.written for s in module.weights)
    assert all(s.kind == "hidden" and s.written for s in module.hidden)
    linear_state = module.state(("layers", 0, "weight"))
    assert linear_state.leaf_names == ("bias", "weight")
    assert len(linear_state.in_vars) == len(linear_state.out_vars) == 2
    assert module.state(("layers", 1, "tau")).leaf_names == ("",)
    assert module.state(("layers", 1, "V")).unit == u.UNITLESS
    with pytest.raises(KeyError, match="layers.1.V"):
        module.state(("nope",))


class Millivolts(brainstate.nn.Module):
    """A weight and a membrane in mV whose unit the step keeps."""

    def __init__(self):
        super().__init__()
        self.w = brainstate.ParamState(jnp.asarray(rand(0, I, N)) * u.mV)
        self.v = brainstate.HiddenState(jnp.asarray(rand(1, B, N)) * u.mV)

    def update(self, x):
        self.v.value = 0.9 * self.v.value + ops.matmul(x, self.w.value)
        return self.v.value


def test_a_state_that_keeps_its_unit_is_compiled_on_mantissas(env64):
    model = Millivolts()
    x = jnp.asarray(rand(2, B, I))
    graph = ef.compile_graph(model, x)
    module = graph.module
    assert module.state(("v",)).unit == u.mV and module.state(("w",)).unit == u.mV
    assert [r.weight_path for r in graph.relations] == [("w",)]
    out, new = module.evaluate(module.state_leaves(), x)
    expected = model(x)
    assert np.array_equal(np.asarray(u.get_mantissa(out)), np.asarray(u.get_mantissa(expected)))


def test_read_only_hidden_and_short_term_states_are_other(env64):
    model = MixedStates()
    module = module_info(model, jnp.asarray(rand(5, B, I)))
    kinds = {s.path: (s.kind, s.written) for s in module.states}
    assert kinds == {("w",): ("weight", False), ("h",): ("hidden", True), ("bias_h",): ("other", False),
                     ("count",): ("other", True)}
    mismatch = [d for d in module.diagnostics if d.kind is DiagnosticKind.STATE_MISMATCH]
    assert len(mismatch) == 1 and mismatch[0].hidden_paths == (("bias_h",),)
    assert mismatch[0].level is Level.WARNING and "never written" in mismatch[0].message


def test_jaxpr_layout_is_inputs_then_state_leaves(env64):
    model, x = _lstm_model()
    module = module_info(model, x)
    num_leaves = len(module.state_leaves())
    assert num_leaves == sum(len(s.in_vars) for s in module.states) == 2 + 4 * 2
    assert len(module.jaxpr.invars) == 1 + num_leaves
    assert len(module.jaxpr.outvars) == 1 + num_leaves
    assert module.input_vars == (module.jaxpr.invars[0],)
    cursor = 1
    for state in module.states:
        assert state.in_vars == tuple(module.jaxpr.invars[cursor:cursor + len(state.in_vars)])
        assert state.out_vars == tuple(module.jaxpr.outvars[cursor:cursor + len(state.in_vars)])
        cursor += len(state.in_vars)


@pytest.mark.parametrize("name", list(MODELS))
def test_evaluate_reproduces_the_models_own_step_exactly(env64, name):
    model, x = MODELS[name]()
    module = module_info(model, x)
    before = module.state_leaves()
    # compiling does not change the model's states
    assert all(np.array_equal(a, b) for a, b in zip(before, module.state_leaves()))
    outputs, new_leaves = module.evaluate(before, x)
    expected_out = model(x)
    expected_new = module.state_leaves()  # the states now hold the model's own step
    assert jax.tree.structure(outputs) == jax.tree.structure(expected_out)
    for a, e in zip(jax.tree.leaves(outputs), jax.tree.leaves(expected_out)):
        assert a.shape == e.shape and a.dtype == e.dtype
        assert np.array_equal(np.asarray(a), np.asarray(e))
    assert len(new_leaves) == len(expected_new)
    for a, e in zip(new_leaves, expected_new):
        assert np.array_equal(np.asarray(a), np.asarray(e))
    # the step really moves the hidden states (the comparison above is not vacuous)
    hidden_index = [i for i, s in enumerate(module.states) if s.kind == "hidden"]
    positions = np.cumsum([0] + [len(s.in_vars) for s in module.states])
    for i in hidden_index:
        assert not np.array_equal(np.asarray(new_leaves[positions[i]]), np.asarray(before[positions[i]]))


def test_a_step_that_writes_a_param_state_is_refused_naming_it(env64):
    model = L.Sequential(linear(0, I, N), WritesParam())
    brainstate.nn.init_all_states(model, batch_size=B)
    with pytest.raises(CompilationError, match=r"ParamState layers\.1\.gain is written"):
        module_info(model, jnp.ones((B, I)))
    with pytest.raises(CompilationError, match=r"layers\.1\.gain"):
        ef.compile_graph(model, jnp.ones((B, I)))


class PlainMemory(brainstate.nn.Module):
    """A leaky integrator whose memory is a plain ``brainstate.State`` (or another
    non-hidden kind): the online rules followed no trace through it and BPTT's gradient
    differed from theirs, with no word."""

    def __init__(self, kind=brainstate.State):
        super().__init__()
        self.kind = kind

    def init_state(self, batch_size=None, **kwargs):
        self.v = self.kind(jnp.zeros((batch_size, N)))

    def reset_state(self, batch_size=None, **kwargs):
        self.v.value = jnp.zeros((batch_size, N))

    def update(self, x):
        self.v.value = 0.8 * self.v.value + x
        return jnp.tanh(self.v.value)


@pytest.mark.parametrize("kind", [brainstate.State, brainstate.ShortTermState])
def test_a_plain_state_carried_from_step_to_step_is_refused_naming_the_fix(env64, kind):
    model = L.Sequential(linear(0, I, N), L.LIF(N), PlainMemory(kind), linear(1, N, O))
    brainstate.nn.init_all_states(model, batch_size=B)
    with pytest.raises(CompilationError, match=rf"{kind.__name__} layers\.2\.v is carried from step to step .* not a "
                                               r"brainstate\.HiddenState: .* Declare it as brainstate\.HiddenState"):
        module_info(model, jnp.ones((B, I)))


class RunningMean(PlainMemory):
    """A long-term state written from itself and the batch, read by nothing the loss
    sees (running statistics), or (``stopped``) read into the output but written under
    ``stop_gradient``."""

    def __init__(self, stopped=False):
        super().__init__(brainstate.LongTermState)
        self.stopped = stopped

    def update(self, x):
        new = 0.9 * self.v.value + 0.1 * x
        self.v.value = jax.lax.stop_gradient(new) if self.stopped else new
        return jnp.tanh(x + self.v.value) if self.stopped else jnp.tanh(x)


def test_states_written_without_a_gradient_through_time_stay_allowed(env64):
    """Running statistics, a long-term state written under ``stop_gradient`` and a
    counter that depends on itself alone are not memory the rules miss; the
    ``MixedStates`` counter is one."""
    for memory in (RunningMean(), RunningMean(stopped=True)):
        model = L.Sequential(linear(0, I, N), L.LIF(N), memory, linear(1, N, O))
        brainstate.nn.init_all_states(model, batch_size=B)
        module_info(model, jnp.ones((B, I)))
    module_info(MixedStates(), jnp.ones((B, I)))


def test_a_long_term_state_used_as_memory_with_a_gradient_is_refused_and_bptt_takes_it(env64):
    """It was exempt as "long-term": D-RTRL's gradient of the first weight was 1.5 off
    BPTT's (relative), with the report calling it exact and no warning."""
    model = L.Sequential(linear(0, I, N), L.LIF(N), PlainMemory(brainstate.LongTermState), linear(1, N, O))
    brainstate.nn.init_all_states(model, batch_size=B)
    with pytest.raises(CompilationError, match=r"LongTermState layers\.2\.v is memory with a gradient: .* Declare it "
                                               r"as brainstate\.HiddenState .* jax\.lax\.stop_gradient .* "
                                               r"algo='bptt' takes it"):
        module_info(model, jnp.ones((B, I)))
    module_info(model, jnp.ones((B, I)), online=False)


def test_a_hidden_state_whose_unit_changes_is_refused_and_restored(env64):
    model = UnitChanging()
    original = model.membrane.value
    with pytest.raises(CompilationError) as info:
        ef.compile_graph(model, jnp.ones((B, N)))
    message = str(info.value)
    assert "membrane" in message and "unit" in message and "mV" in message
    value = model.membrane.value
    assert isinstance(value, u.Quantity) and u.get_unit(value) == u.mV
    assert not isinstance(u.get_mantissa(value), jax.core.Tracer)
    assert np.array_equal(np.asarray(u.get_mantissa(value)), np.asarray(u.get_mantissa(original)))


def test_a_model_without_hidden_state_is_refused(env64):
    model = L.Sequential(linear(0, I, N), linear(1, N, O))
    brainstate.nn.init_all_states(model, batch_size=B)
    with pytest.raises(CompilationError, match="no hidden state"):
        ef.compile_graph(model, jnp.ones((B, I)))


def test_an_uninitialised_model_is_refused_mentioning_init_all_states(env64):
    model = L.Sequential(linear(0, I, N), L.LIF(N))
    with pytest.raises(CompilationError, match="init_all_states"):
        ef.compile_graph(model, jnp.ones((B, I)))


def test_a_hidden_state_initialised_for_another_batch_shape_is_refused(env64):
    lif = L.LIF(N)
    brainstate.nn.init_all_states(lif)  # V: (N,), the input is batched
    with pytest.raises(CompilationError, match=r"V changes from \(4,\) float64 to \(2, 4\)"):
        ef.compile_graph(lif, jnp.ones((B, N)))


@pytest.mark.parametrize("bad_layer", [0, 2])
def test_a_wrong_feature_size_raises_shape_error_naming_layer_and_shape(env64, bad_layer):
    model = L.Sequential(linear(0, I, N), L.LIF(N), linear(1, N + 1 if bad_layer == 2 else N, O))
    brainstate.nn.init_all_states(model, batch_size=B)
    v0 = jnp.asarray(rand(9, B, N))
    model.layers[1].V.value = v0
    x = jnp.ones((B, I + 2 if bad_layer == 0 else I))
    with pytest.raises(ShapeError) as info:
        ef.compile_graph(model, x)
    message = str(info.value)
    given = f"({B}, {I + 2})" if bad_layer == 0 else f"({B}, {N})"
    name = f"Linear({I}, {N})" if bad_layer == 0 else f"Linear({N + 1}, {O})"
    assert f"layers[{bad_layer}]" in message and name in message and given in message
    # a failed trace leaves the hidden state as it was (not a leaked tracer)
    value = model.layers[1].V.value
    assert not isinstance(value, jax.core.Tracer)
    assert np.array_equal(np.asarray(value), np.asarray(v0))


@pytest.mark.parametrize("helper", [_jitted_drive, _doubly_jitted_drive], ids=["jit", "jit_in_jit"])
def test_an_etp_op_in_a_nested_jit_is_inlined(env64, helper):
    model = NestedJit(helper)
    x = jnp.asarray(rand(7, B, I))
    graph = ef.compile_graph(model, x)
    names = [eqn.primitive.name for eqn in graph.module.jaxpr.eqns]
    assert "etp_mm" in names
    assert not any(name in ("jit", "pjit", "closed_call") for name in names)
    assert [(r.primitive, r.weight_path, r.hidden_paths) for r in graph.relations] == [("etp_mm", ("w",), (("h",),))]
    nested = [d for d in graph.diagnostics if d.kind is DiagnosticKind.IN_NESTED_JIT]
    assert len(nested) == 1
    assert nested[0].level is Level.INFO and nested[0].primitive == "etp_mm"
    # inlining keeps the computation
    before = graph.module.state_leaves()
    out, new = graph.module.evaluate(before, x)
    expected = model(x)
    assert np.array_equal(np.asarray(out), np.asarray(expected))
    assert np.array_equal(np.asarray(new[leaf_positions(graph.module)[("h",)]]), np.asarray(model.h.value))


def test_a_cut_step_asked_for_some_outputs_runs_only_what_they_read(env64):
    """``cut_step(outputs=...)``: the outputs asked for equal the whole step's, bit for
    bit, the others are ``None``, and the traced evaluation holds only the equations
    those outputs depend on: with the input product's output given, the ALIF's new
    ``a`` needs no product (the readout's) and fewer equations than its new ``V``."""
    from etrace_fit.compiler._dataflow import cut_step

    model, x = _alif_model()
    module = module_info(model, x)
    leaves, inputs = module.state_leaves(), [x]
    offsets, first = module.leaf_offsets, len(module.output_vars)
    a_out, v_out = first + offsets[("layers", 1, "a")], first + offsets[("layers", 1, "V")]
    whole = cut_step(module, leaves, inputs)
    some = cut_step(module, leaves, inputs, outputs=[a_out])
    assert np.array_equal(np.asarray(some[a_out]), np.asarray(whole[a_out]))
    assert some[v_out] is None and all(value is None for value in some[:first])

    eqns = module.closed_jaxpr.jaxpr.eqns
    product = next(i for i, e in enumerate(eqns) if e.primitive.name.startswith("etp"))  # the input product
    y = jnp.zeros(eqns[product].outvars[0].aval.shape)

    def traced(outputs):
        jaxpr = jax.make_jaxpr(lambda v: cut_step(module, leaves, inputs, replace={product: v}, outputs=outputs))(y)
        return [e.primitive.name for e in jaxpr.jaxpr.eqns]

    whole_step, only_a = traced(None), traced([a_out])
    assert any(name.startswith("etp") for name in whole_step)  # the readout's product
    assert not any(name.startswith("etp") or name == "dot_general" for name in only_a), only_a
    assert len(only_a) < len(traced([v_out])) < len(whole_step)


def _vjp_neuron(spike):
    class VjpNeuron(L.Neuron):
        def __init__(self, n):
            super().__init__(n)
            self.hidden("v", init=0.0)

        def update(self, x):
            v = 0.9 * self.v.value + x
            z = spike(v)
            self.v.value = v - z
            return z

    return VjpNeuron(N)


def _custom_vjp(forward, backward):
    function = jax.custom_vjp(forward)
    function.defvjp(lambda *args: (function(*args), args), lambda args, g: backward(*args, g))
    return function


@pytest.mark.parametrize("spike, problem", [
    (_custom_vjp(lambda v: (v - v.mean(axis=-1, keepdims=True) > 0).astype(v.dtype), lambda v, g: (g,)),
     r"its forward pass mixes entries"),
    (_custom_vjp(lambda v: (v > 1.0).astype(v.dtype), lambda v, g: (g * jnp.mean(g, axis=-1, keepdims=True),)),
     r"its bwd mixes entries"),
    # a threshold that varies (a constant one has no derivative, and is taken: tests/algorithms/test_user_neurons.py)
    (lambda v: _custom_vjp(lambda v, th: (v > th).astype(v.dtype), lambda v, th, g: (g, -jnp.sum(g)))(
        v, 0.5 * jnp.mean(v)),
     rf"its float inputs have shapes \[{B}, {N}\], \[\] and its output \[{B}, {N}\]: a broadcast input's "
     r"derivative is summed"),
])
def test_a_custom_vjp_function_that_is_not_elementwise_is_refused_naming_it(env64, spike, problem):
    model = L.Sequential(linear(0, I, N), _vjp_neuron(spike), linear(1, N, O))
    brainstate.nn.init_all_states(model, batch_size=B)
    with pytest.raises(CompilationError, match=rf"the step calls the jax.custom_vjp function <lambda> at "
                                               rf".*test_module_info.py:\d+, and {problem}.* "
                                               r"Write this one with jax.custom_jvp"):
        module_info(model, jnp.ones((B, I)))


def test_an_elementwise_custom_vjp_spike_goes_through_forward_mode_as_its_own_vjp(env64):
    """The rewrite's derivative, in forward and in reverse mode, is the user's bwd (the
    exactness of the online gradients against BPTT: tests/docs/test_neurons.py)."""
    spike = _custom_vjp(lambda v: (v > 0).astype(v.dtype), lambda v, g: (g / (1.0 + 10.0 * jnp.abs(v)) ** 2,))
    model = L.Sequential(linear(0, I, N), _vjp_neuron(spike), linear(1, N, O))
    brainstate.nn.init_all_states(model, batch_size=B)
    info = module_info(model, jnp.ones((B, I)))
    assert not any(e.primitive.name == "custom_vjp_call" for e in info.closed_jaxpr.jaxpr.eqns)
    v = jnp.asarray(rand(3, B, N))
    tangent = jnp.asarray(rand(4, B, N))
    expected = tangent / (1.0 + 10.0 * jnp.abs(v)) ** 2
    from etrace_fit import _compat

    eqn = next(e for e in jax.make_jaxpr(spike)(v).jaxpr.eqns if _compat.is_custom_vjp_call(e))
    rewritten = lambda x: _compat.custom_vjp_as_jvp(eqn, [x])[0]  # noqa: E731
    np.testing.assert_allclose(jax.jvp(rewritten, (v,), (tangent,))[1], expected, rtol=1e-12)
    np.testing.assert_allclose(jax.vjp(rewritten, v)[1](tangent)[0], expected, rtol=1e-12)
    np.testing.assert_array_equal(rewritten(v), spike(v))

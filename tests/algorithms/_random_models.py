"""Random models written the way users write them, for the no-silent-approximation
invariant of ``test_random_models.py`` (not a test module).

A seed draws a model from one of two families, every choice a way users write a
neuron or wire populations:

- ``neuron``: ``front → RandomNeuron → back`` with 1–3 hidden states per unit
  (membrane, synaptic or adaptation states coupled one way or both), each state's
  decay a constant, a learned time constant, or a learned factor read through
  ``layers.read`` or raw; a threshold constant, read, raw, or raw in the reset only;
  a recurrence dense (an ETP ``Linear`` on the last spike), detached
  (``stop_gradient``) or per unit; a learned bias read or raw; a mean over the units
  subtracted or a layer-wide switch (``lax.cond``); a reset subtracting, zeroing or
  none, off the previous or new membrane, detached or not; the spike kept as a state;
  a front and back ETP ``Linear``, a plain ``x @ W``, a leaky readout or a second LIF.
- ``populations``: two LIF populations A → B with learned or fixed time constants, a
  refractory counter, a learned scalar gain read or raw, a roll of the previous
  membrane (mixes units) or a mean over the batch, A → B through a ``Linear``, a
  ``Linear`` also read transposed (a tied weight), or per unit; B → A feedback, an
  input into B, a skip, and a readout of B or of both.
- ``stack``: one or two blocks of the library's layers (LIF, ALIF, IF with a learned τ,
  a soft or hard, detached or not reset, a refractory period; a recurrent LIF or ALIF;
  an RNN cell; a synapse before a LIF; an LRU), each maybe followed by a LayerNorm or a
  tanh, and a linear, leaky-rate or leaky-spike readout.
"""

from __future__ import annotations

import brainstate
import jax
import jax.numpy as jnp
import numpy as np

import etrace_fit as ef
from etrace_fit import layers as L
from etrace_fit import ops

I, H, O = 3, 6, 2


def _normal(rng, *shape, scale=1.0):
    return rng.standard_normal(shape) * scale


def _pick(rng, options):
    return options[rng.integers(len(options))]


class PlainLinear(brainstate.nn.Module):
    """``x @ W`` with plain jnp (a ``ParamState`` no ETP op reads)."""

    def __init__(self, i, o, rng):
        super().__init__()
        self.W = brainstate.ParamState(jnp.asarray(_normal(rng, i, o, scale=1.5 / np.sqrt(i))))
        self.in_size, self.out_size = (i,), (o,)

    def update(self, x):
        return x @ self.W.value


class RandomNeuron(L.Neuron):
    def __init__(self, rng, spec):
        super().__init__(H)
        self.spec = spec
        self.surrogate = L.Sigmoid()
        for k, kind in enumerate(spec["decay"]):
            if kind == "learned_tau":
                setattr(self, f"tau{k}", L.time_constant(self, np.linspace(3.0, 8.0, H), H, learn=True))
            elif kind in ("raw", "read"):
                setattr(self, f"a{k}", L.parameter(self, np.linspace(0.5, 0.9, H), H, learn=True, what=f"a{k}"))
            self.hidden(f"s{k}")
        if spec["thr"] != "const":
            self.thr = L.parameter(self, np.linspace(0.3, 0.7, H), H, learn=True, what="threshold")
        if spec["rec"] in ("dense", "detached"):
            self.rec = L.Linear(H, H, w_init=_normal(rng, H, H, scale=0.6 / np.sqrt(H)), with_bias=False)
        elif spec["rec"] == "diag":
            self.gain = L.parameter(self, np.linspace(-0.3, 0.3, H), H, learn=True, what="gain")
        if spec["bias"] != "none":
            self.bias = L.parameter(self, np.linspace(-0.2, 0.2, H), H, learn=True, what="bias")
        if spec["spike_state"]:
            self.hidden("z")

    def decay_of(self, k):
        kind = self.spec["decay"][k]
        if kind == "const":
            return 0.8
        if kind == "learned_tau":
            return L.decay(self, getattr(self, f"tau{k}"))
        factor = getattr(self, f"a{k}")
        return factor.value if kind == "raw" else L.read(factor)

    def threshold(self, where):
        kind = self.spec["thr"]
        if kind == "const":
            return 0.5
        return self.thr.value if kind == "raw" or (kind == "mixed" and where == "reset") else L.read(self.thr)

    def update(self, x):
        spec, n = self.spec, len(self.spec["decay"])
        prev = [getattr(self, f"s{k}").value for k in range(n)]
        z_prev = self.z.value if spec["spike_state"] else self.surrogate(prev[0] - self.threshold("spike"))
        drive = x
        if spec["bias"] != "none":
            drive = drive + (self.bias.value if spec["bias"] == "raw" else L.read(self.bias))
        if spec["rec"] == "dense":
            drive = drive + self.rec(z_prev)
        elif spec["rec"] == "detached":
            drive = drive + self.rec(jax.lax.stop_gradient(z_prev))
        elif spec["rec"] == "diag":
            drive = drive + z_prev * L.read(self.gain)
        if spec["mix"] == "mean":
            drive = drive - jnp.mean(drive, axis=-1, keepdims=True)
        elif spec["mix"] == "cond":
            drive = jax.lax.cond(jnp.mean(prev[0]) > 0.3, lambda d: 0.5 * d, lambda d: d, drive)
        new = []
        for k in range(n):
            if k == 0:
                inp = drive - 0.3 * prev[n - 1] if n > 1 and spec["adapt"] else drive
            else:
                inp = 0.5 * (new[k - 1] if spec["couple_new"][k] else prev[k - 1])
            value = self.decay_of(k) * prev[k] + inp
            new.append(jnp.tanh(value) if spec["tanh"][k] else value)
        reset = self.surrogate((prev[0] if spec["reset_from"] == "prev" else new[0]) - self.threshold("spike"))
        if spec["detach_reset"]:
            reset = jax.lax.stop_gradient(reset)
        if spec["reset"] == "subtract":
            new[0] = new[0] - reset * self.threshold("reset")
        elif spec["reset"] == "zero":
            new[0] = new[0] * (1.0 - reset)
        for k in range(n):
            getattr(self, f"s{k}").value = new[k]
        z = self.surrogate((new[0] if spec["out_from"] == "new" else prev[0]) - self.threshold("spike"))
        if spec["spike_state"]:
            self.z.value = z
        return jnp.tanh(new[-1]) if spec["out"] == "tanh_last" else z


def _neuron_spec(rng):
    n = int(rng.integers(1, 4))
    return dict(
        decay=[_pick(rng, ["const", "learned_tau", "raw", "read"]) for _ in range(n)],
        thr=_pick(rng, ["const", "read", "raw", "mixed"]),
        rec=_pick(rng, ["none", "none", "dense", "detached", "diag"]),
        bias=_pick(rng, ["none", "read", "raw"]),
        mix=_pick(rng, ["none", "none", "none", "mean", "cond"]),
        adapt=bool(rng.integers(2)),
        couple_new=[bool(rng.integers(2)) for _ in range(n)],
        tanh=[bool(rng.integers(4) == 0) for _ in range(n)],
        reset=_pick(rng, ["none", "subtract", "zero"]),
        reset_from=_pick(rng, ["prev", "new"]),
        detach_reset=bool(rng.integers(2)),
        out_from=_pick(rng, ["new", "new", "prev"]),
        spike_state=bool(rng.integers(3) == 0),
        out=_pick(rng, ["spike", "spike", "tanh_last"]),
        front=_pick(rng, ["etp", "etp", "plain", "etp_tanh"]),
        back=_pick(rng, ["etp", "etp", "plain", "leaky", "lif"]),
    )


def _neuron_model(spec, rng):
    front = {"etp": lambda: [L.Linear(I, H, w_init=_normal(rng, I, H, scale=2.0 / np.sqrt(I)))],
             "plain": lambda: [PlainLinear(I, H, rng)],
             "etp_tanh": lambda: [L.Linear(I, H, w_init=_normal(rng, I, H, scale=2.0 / np.sqrt(I))), L.Tanh()],
             }[spec["front"]]()
    neuron = RandomNeuron(rng, spec)
    back = {"etp": lambda: [L.Linear(H, O, w_init=_normal(rng, H, O))],
            "plain": lambda: [PlainLinear(H, O, rng)],
            "leaky": lambda: [L.LeakyRateReadout(H, O, tau=5.0, w_init=_normal(rng, H, O))],
            "lif": lambda: [L.Linear(H, H, w_init=_normal(rng, H, H, scale=1.5 / np.sqrt(H))),
                            L.LIF(H, tau=5.0, surrogate="sigmoid"), L.Linear(H, O, w_init=_normal(rng, H, O))],
            }[spec["back"]]()
    return ef.Sequential(*front, neuron, *back)


class Population(L.Neuron):
    def __init__(self, spec, k):
        super().__init__(H)
        self.spec, self.k = spec, k
        self.surrogate = L.Sigmoid()
        self.tau = L.time_constant(self, np.linspace(3.0, 8.0, H), H, learn=spec["learn_tau"][k])
        self.hidden("V")
        if spec["refractory"][k]:
            self.hidden("count", init=0, dtype=jnp.int32)
        if spec["scalar"][k] != "none":
            self.scalar = brainstate.ParamState(jnp.asarray(1.2))

    def update(self, x):
        spec, k = self.spec, self.k
        if spec["scalar"][k] != "none":
            x = x * (ops.elementwise(self.scalar.value) if spec["scalar"][k] == "read" else self.scalar.value)
        v = L.decay(self, self.tau) * self.V.value + x
        if spec["refractory"][k]:
            v = jnp.where(self.count.value == 0, v, 0.0)
        if spec["mix"][k] == "roll":
            v = v + 0.2 * jnp.roll(self.V.value, 1, axis=-1)
        elif spec["mix"][k] == "batch_mean":
            v = v - jnp.mean(self.V.value, axis=0, keepdims=True)
        z = self.surrogate(v - 0.5)
        if spec["refractory"][k]:
            self.count.value = jnp.where(z > 0.5, 2, jnp.maximum(self.count.value - 1, 0))
        self.V.value = v - z * 0.5
        return z


class Populations(brainstate.nn.Module):
    def __init__(self, spec, rng):
        super().__init__()
        self.spec = spec
        self.into_a = L.Linear(I, H, w_init=_normal(rng, I, H, scale=2.0 / np.sqrt(I)))
        self.A, self.B = Population(spec, 0), Population(spec, 1)
        if spec["a_to_b"] != "per_unit":
            self.a_to_b = L.Linear(H, H, w_init=_normal(rng, H, H, scale=1.5 / np.sqrt(H)))
        if spec["b_to_a"]:
            self.b_to_a = L.Linear(H, H, w_init=_normal(rng, H, H, scale=0.8 / np.sqrt(H)), with_bias=False)
        if spec["into_b"]:
            self.into_b = L.Linear(I, H, w_init=_normal(rng, I, H, scale=2.0 / np.sqrt(I)), with_bias=False)
        width = H * (2 if spec["readout"] == "both" else 1)
        self.out = (L.Linear(width, O, w_init=_normal(rng, width, O)) if spec["readout_kind"] == "linear" else
                    L.LeakyRateReadout(width, O, tau=4.0, w_init=_normal(rng, width, O)))

    def update(self, x):
        spec = self.spec
        into_a = self.into_a(x)
        if spec["b_to_a"]:
            into_a = into_a + self.b_to_a(self.B.surrogate(self.B.V.value - 0.5))
        za = self.A(into_a)
        into_b = za if spec["a_to_b"] == "per_unit" else self.a_to_b(za)
        if spec["a_to_b"] == "tied":
            into_b = into_b + za @ self.a_to_b.weight.value["weight"].T
        if spec["into_b"]:
            into_b = into_b + self.into_b(x)
        zb = self.B(into_b)
        if spec["skip"]:
            zb = zb + za
        return self.out(jnp.concatenate([za, zb], axis=-1) if spec["readout"] == "both" else zb)


def _populations_spec(rng):
    return dict(
        learn_tau=[bool(rng.integers(2)) for _ in range(2)],
        refractory=[bool(rng.integers(4) == 0) for _ in range(2)],
        scalar=[_pick(rng, ["none", "none", "read", "raw"]) for _ in range(2)],
        mix=[_pick(rng, ["none", "none", "none", "roll", "batch_mean"]) for _ in range(2)],
        a_to_b=_pick(rng, ["linear", "linear", "tied", "per_unit"]),
        b_to_a=bool(rng.integers(3) == 0),
        into_b=bool(rng.integers(3) == 0),
        skip=bool(rng.integers(3) == 0),
        readout=_pick(rng, ["last", "both"]),
        readout_kind=_pick(rng, ["linear", "linear", "leaky"]),
    )


CELLS = ("GRUCell", "LSTMCell", "MGUCell", "MinGRUCell", "MinLSTMCell", "MinimalRNNCell", "URLSTMCell",
         "VanillaRNNCell")


def _stack_spec(rng):
    def block():
        kind = _pick(rng, ["lif", "alif", "if", "recurrent_lif", "recurrent_alif", "cell", "synapse", "lru"])
        return dict(kind=kind, cell=_pick(rng, CELLS), learn_tau=bool(rng.integers(2)),
                    reset=_pick(rng, ["soft", "hard"]), detach_reset=bool(rng.integers(2)),
                    refractory=int(_pick(rng, [0, 0, 2])),
                    synapse=_pick(rng, ["ExpSynapse", "AlphaSynapse", "DualExpSynapse"]),
                    after=_pick(rng, ["none", "none", "none", "layer_norm", "tanh"]))

    return dict(blocks=[block() for _ in range(int(rng.integers(1, 3)))],
                readout=_pick(rng, ["linear", "linear", "leaky_rate", "leaky_spike"]),
                readout_learn_tau=bool(rng.integers(2)))


def _stack_model(spec, rng):
    """Library layers stacked as users stack them (weights from ``rng``; the cells' from
    brainstate's initializers, seeded by the draw)."""
    layers, width = [], I
    lif = dict(tau=4.0, v_threshold=0.5, surrogate="sigmoid")
    for b in spec["blocks"]:
        neuron = dict(lif, reset=b["reset"], detach_reset=b["detach_reset"], refractory=b["refractory"])
        linear = L.Linear(width, H, w_init=_normal(rng, width, H, scale=2.0 / np.sqrt(width)),
                          b_init=_normal(rng, H, scale=0.3))
        kind = b["kind"]
        if kind == "lif":
            layers += [linear, L.LIF(H, learn_tau=b["learn_tau"], **neuron)]
        elif kind == "alif":
            layers += [linear, L.ALIF(H, tau_a=8.0, beta=0.3, learn_tau=b["learn_tau"], **neuron)]
        elif kind == "if":
            layers += [linear, L.IF(H, v_threshold=0.5, surrogate="sigmoid", reset=b["reset"],
                                    detach_reset=b["detach_reset"])]
        elif kind in ("recurrent_lif", "recurrent_alif"):
            w = _normal(rng, width + H, H, scale=1.5 / np.sqrt(width + H))
            layers.append(L.RecurrentLIF(width, H, w_init=w, **neuron) if kind == "recurrent_lif" else
                          L.RecurrentALIF(width, H, w_init=w, tau_a=8.0, beta=0.3, **neuron))
        elif kind == "cell":
            layers.append(getattr(L, b["cell"])(width, H))
        elif kind == "synapse":
            layers += [linear, getattr(L, b["synapse"])(H, learn_tau=b["learn_tau"]), L.LIF(H, **neuron)]
        else:
            layers.append(L.LRU(width, H, H, seed=int(rng.integers(1000))))
        if b["after"] == "layer_norm":
            layers.append(L.LayerNorm(H))
        elif b["after"] == "tanh":
            layers.append(L.Tanh())
        width = H
    w = _normal(rng, width, O, scale=1.0 / np.sqrt(width))
    layers.append({"linear": lambda: L.Linear(width, O, w_init=w),
                   "leaky_rate": lambda: L.LeakyRateReadout(width, O, tau=4.0, w_init=w,
                                                            learn_tau=spec["readout_learn_tau"]),
                   "leaky_spike": lambda: L.LeakySpikeReadout(width, O, tau=4.0, v_threshold=0.5,
                                                              surrogate="sigmoid", w_init=w)}[spec["readout"]]())
    return ef.Sequential(*layers)


FAMILIES = {"neuron": (_neuron_spec, _neuron_model), "populations": (_populations_spec, Populations),
            "stack": (_stack_spec, _stack_model)}


def random_model(family: str, seed: int):
    """``(spec, build)``: the choices drawn by ``seed`` and a function building the model
    (weights drawn from ``seed + 1000``, the same each call)."""
    make_spec, make_model = FAMILIES[family]
    spec = make_spec(np.random.default_rng(seed))

    def build():
        brainstate.random.seed(seed)  # the cells' and LRU's own initializers
        return make_model(spec, np.random.default_rng(seed + 1000))

    return spec, build

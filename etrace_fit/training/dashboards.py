"""What the Trainer shows about a run: spike rasters, the compile report and summary,
gradient fidelity against BPTT, and the warnings when norms explode or a spiking
readout meets a loss that cannot learn."""

from __future__ import annotations

import math
import warnings
from typing import Any

import brainstate
import jax
import jax.numpy as jnp
import numpy as np

from ..algorithms import gradient_fidelity
from ..algorithms.base import global_norm
from ..algorithms.hybrid import format_bytes
from ..algorithms.learner import compile as compile_learner
from ..compiler import format_path
from ..errors import ApproximationWarning, ConfigError, ShapeError
from .data import Arrays, Batch, batches
from .logs import model_summary
from .step import sequence_targets

__all__ = ["Dashboards"]


def _norms(gradients: Any, trace_norms: Any) -> tuple[float, float]:
    """The global gradient norm and the largest trace norm. On the host in float64
    (squares of float32 values cannot overflow there): once an epoch, on arrays of the
    weights' size, where a jitted program took 0.08 s to compile at the first epoch's
    end of every ``fit`` (the demo's, 2026-11-26). Arrays that span other processes'
    devices (a multi-host run) cannot be read on one host: one jitted program reduces
    them across processes (:func:`_global_norms`)."""
    leaves = jax.tree.leaves((gradients, trace_norms))
    if not all(getattr(leaf, "is_fully_addressable", True) for leaf in leaves):
        return tuple(float(v) for v in _global_norms(gradients, trace_norms))
    squares = sum(float(np.sum(np.square(np.asarray(leaf, np.float64)))) for leaf in jax.tree.leaves(gradients))
    traces = [float(np.max(np.asarray(norms, np.float64))) for norms in jax.tree.leaves(trace_norms)]
    return math.sqrt(squares), max(traces) if traces else 0.0


@jax.jit
def _global_norms(gradients: Any, trace_norms: Any) -> tuple[jax.Array, jax.Array]:
    """:func:`_norms` as one program (every process gets the same two numbers), the
    gradient's squares scaled so that they do not overflow (:func:`global_norm`)."""
    gradient = global_norm(gradients)
    traces = [jnp.max(n) for n in jax.tree.leaves(trace_norms)]
    return gradient, jnp.max(jnp.stack(traces)) if traces else jnp.zeros(())


class Dashboards:
    """The Trainer's views of a run (a part of :class:`~etrace_fit.Trainer`)."""

    #: A global gradient norm above this at an epoch's end makes ``fit`` warn once:
    #: plain SGD steps of that size derail training (Adam's steps do not grow with it).
    EXPLODING_GRADIENT_NORM = 1e3
    #: A per-sample eligibility-trace norm above this makes ``fit`` warn once. ``None``
    #: (default): the trace dtype's largest value to the power 3/4 (1.3e29 for float32
    #: and bfloat16), a quarter of its exponent range short of overflowing. A large
    #: trace alone is no error: floating point keeps its relative precision at any
    #: size, and spiking models whose reset passes a surrogate gradient grow traces of
    #: 1e7-1e9 with gradients that match BPTT's (the evidence task's ALIF net: cosine
    #: 1 - 3e-11 at a trace norm of 7.7e8).
    EXPLODING_TRACE_NORM: float | None = None

    def _trace_norm_limit(self) -> tuple[float, str]:
        """The trace norm ``fit`` warns above, and the trace dtype's name."""
        plan = None if self.learner is None else self.learner.plan
        dtype = jnp.dtype(jnp.float32 if plan is None else plan.trace_dtype)
        limit = self.EXPLODING_TRACE_NORM
        return (float(jnp.finfo(dtype).max) ** 0.75 if limit is None else limit), dtype.name

    def _check_norms(self, epoch: int) -> None:
        """Warn (once per trainer) when the last batch's gradient or trace norms explode,
        with the fix for each."""
        if self._norms_warned:
            return
        gradient = trace = 0.0
        if self.last_gradients is not None or self.last_trace_norms:
            gradient, trace = _norms(self.last_gradients, self.last_trace_norms)
        limit, dtype = self._trace_norm_limit()
        found = []
        if not gradient <= self.EXPLODING_GRADIENT_NORM:
            clip = getattr(self, "config", {}).get("grad_clip")
            found.append(f"the gradient norm is {gradient:.3g}: clip the gradient (Trainer(grad_clip=1.0)) or "
                         f"lower the learning rate" if clip is None else
                         f"the gradient norm before clipping is {gradient:.3g} (each update is clipped to "
                         f"grad_clip={clip:g}): lower the learning rate, or look for the weight whose gradient "
                         f"explodes (trainer.last_gradients, TensorBoard's norms/gradient per layer)")
        if not trace <= limit:
            fix = ("Trainer(trace_dtype='float64') (with jax_enable_x64) holds larger traces" if dtype != "float64"
                   else "shorter sequences (or stateful=False) and smaller recurrent weights keep them smaller")
            found.append(f"an eligibility-trace norm is {trace:.3g}, near {dtype}'s overflow "
                         f"({float(jnp.finfo(dtype).max):.3g}): {fix}")
        if found:
            self._norms_warned = True
            warnings.warn(f"epoch {epoch + 1}: {'; '.join(found)} (TensorBoard's norms/ scalars follow them)",
                          RuntimeWarning, stacklevel=4)

    def _warn_spiking_readout(self) -> None:
        """Spikes of the last step alone carry almost no gradient: say what learns."""
        from ..layers import LeakySpikeReadout

        last = self._model.layers[-1] if hasattr(self._model, "layers") and len(self._model.layers) else self._model
        if isinstance(last, LeakySpikeReadout) and self.loss_on == "last":
            warnings.warn(
                f"{type(last).__name__} emits spikes, and a loss on the last step's spikes alone barely learns "
                f"(its loss stays near ln(classes)); use loss_on='all' with loss='spike_rate_cross_entropy' or "
                f"'spike_rate_mse', or a LeakyRateReadout with loss_on='last' (see etrace_fit.training.spiking)",
                UserWarning, stacklevel=3)

    def spiking_layers(self) -> dict[str, Any]:
        """The model's layers with a ``spikes()`` method (LIF, ALIF, spiking readouts), by path."""
        return {format_path(path): node for path, node in self._model.nodes().items()
                if callable(getattr(node, "spikes", None))}

    def record_spikes(self, x: Any) -> dict[str, np.ndarray]:
        """Run one input sequence ``x`` of shape ``(T, features...)`` from reset states
        and return every spiking layer's spikes, ``{path: (T, *size)}`` of 0 / 1.

        ``ConfigError`` if the model has no spiking layer. The model's hidden states
        are left at batch size 1; the next ``fit`` / ``evaluate`` batch resets them.
        """
        layers = self.spiking_layers()
        if not layers:
            raise ConfigError(f"record_spikes: the model ({type(self._model).__name__}) has no spiking layer "
                              "(a layer with a spikes() method such as LIF or ALIF)")
        x = jnp.asarray(x)
        step_rank = self._step_input_rank()
        if x.ndim < 2 or (step_rank is not None and x.ndim != step_rank + 1):
            expected = "(time, features...)" if step_rank is None else \
                "(time, " + ", ".join(["features"] * step_rank) + ")"
            hint = "; this looks like a batch of sequences: pass one, e.g. x[0]" if step_rank is not None and \
                x.ndim == step_rank + 2 else ""
            raise ShapeError(f"record_spikes: x must be one sequence {expected}, got shape {tuple(x.shape)}{hint}")
        return {name: value[0] for name, value in self._record_batch(x[None], layers).items()}

    def _record_batch(self, xs: Any, layers: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
        """:meth:`record_spikes` of sequences ``xs (N, T, features...)`` in one call, as
        ``{path: (N, T, *size)}`` (the samples do not interact, so each one's spikes are
        its own; TensorBoard's firing statistics read eight sequences per epoch, which
        one at a time took ~0.1 s an epoch). The model's hidden states are left at
        batch size ``N``, but a stateful trainer's streams are kept (evaluate's
        ``_keeping_streams``: from a callback, the next batch continued from the
        recording's states, or failed in JAX on their batch size)."""
        with self._keeping_streams():
            return self._record_from_reset(xs, layers)

    def _record_from_reset(self, xs: Any, layers: dict[str, Any] | None) -> dict[str, np.ndarray]:
        layers = self.spiking_layers() if layers is None else layers
        xs = jnp.asarray(xs)
        self._ensure_states(xs.shape[0])
        if self._recorder is None:
            model = self._model

            @brainstate.transform.jit
            def record(xs):
                brainstate.nn.reset_all_states(model, batch_size=xs.shape[1])

                def step(x_t):
                    model(x_t)
                    return {name: layer.spikes() for name, layer in layers.items()}

                with brainstate.environ.context(fit=False):  # as evaluate runs the model
                    return brainstate.transform.for_loop(step, xs)

            self._recorder = record
        spikes = self._recorder(jnp.swapaxes(xs, 0, 1))
        return {name: np.swapaxes(np.asarray(value), 0, 1) for name, value in spikes.items()}

    def _step_input_rank(self) -> int | None:
        """How many feature axes one step's input has (from the compiled step, or the
        first layer's ``in_size``), or None when that is not known."""
        if self.learner is not None:
            return len(self.learner.graph.module.input_vars[0].aval.shape) - 1
        first = self._model.layers[0] if hasattr(self._model, "layers") and len(self._model.layers) else self._model
        size = getattr(first, "in_size", None)
        if isinstance(size, int):
            return 1
        return len(size) if isinstance(size, tuple) else None

    def gradient_fidelity(self, x: Any, y: Any = None, mask: Any = None) -> dict[str, Any]:
        """Cosine and norm ratio of this trainer's online gradient against BPTT's on one
        batch (``x`` laid out as for ``fit``, the loss placed as in training), per
        weight path: ``{"layers.0.weight": WeightFidelity(cosine, norm_ratio)}``. See
        :func:`etrace_fit.gradient_fidelity`; for ``algo="bptt"`` every value is 1."""
        xs, ys, weight = self._time_major(Batch(x, y, mask))
        self._ensure_states(xs.shape[1])
        brainstate.nn.reset_all_states(self._model, batch_size=xs.shape[1])
        rates = self._state.rates if self._state is not None and self._state.rates is not None else \
            self._initial_rates()
        targets = sequence_targets(ys, weight, self.regularizers, rates)
        if self._step_fn is None:
            return gradient_fidelity(self._model, xs, targets, self._step_loss, algo=self.algo, decay=self.decay,
                                     memory_budget=self.memory_budget, trace_dtype=self.trace_dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ApproximationWarning)  # what is measured here
            learner = compile_learner(self._model, xs[0], self._step_loss, algo=self.algo, decay=self.decay,
                                      memory_budget=self.memory_budget, trace_dtype=self.trace_dtype,
                                      step_fn=self._step_fn)
        return gradient_fidelity(learner, xs, targets)

    def summary(self, x: Any = None, print_fn: Any = print) -> str | None:
        """Keras' ``summary()``: one row per layer — its type, parameter count, hidden
        states (shape per sample) and, once compiled, the rule per weight and its trace
        memory per sample — then the totals. The rules are chosen at the first
        training batch; pass ``x`` (training data, laid out as for :meth:`fit`) to
        compile on its first samples now. Printed with ``print_fn`` and, as Keras',
        returns None (a notebook would show the text twice); ``print_fn=None``: not
        printed, returned."""
        if x is not None and self.learner is None:
            data = self._as_data(x, "x", targets=False)  # the plan is made from x alone
            if isinstance(data, Arrays):
                first = next(batches(data.x, data.y, batch_size=32, shuffle=False, mask=data.mask))
            else:
                first = next(iter(batches(data, batch_size=32, shuffle=False)))
            xs, ys, weight = self._time_major(first, False if isinstance(data, Arrays) else None)
            self._ensure_states(xs.shape[1])
            brainstate.nn.reset_all_states(self._model, batch_size=xs.shape[1])
            self._compiled(xs, ys, weight, check_memory=False)  # a batch of up to 32 the user did not ask for
        self._ensure_states(1)  # the hidden states' shapes per sample (fit resets them per batch)
        text = model_summary(self._model, self.learner, algo=self.algo)
        if print_fn is None:
            return text
        print_fn(text)
        return None

    @property
    def rules(self) -> dict[str, str]:
        """The rule per traced weight path (``{"layers.0.weight": "d_rtrl", ...}``) of
        the plan compiled on the first training batch; empty for BPTT or before ``fit``."""
        return {} if self.learner is None else self.learner.rules

    def report(self) -> str:
        """The compile report with the rule chosen per weight, its trace memory and which
        gradients are approximate (available once ``fit`` has seen a batch)."""
        if self.learner is None:
            raise ConfigError("the model is compiled on the first training batch; call fit first")
        text = self.learner.report()
        plan, last = self.learner.plan, getattr(self, "last_train_batch", None)
        if plan is not None and last and last != plan.batch:
            text += (f"\nthe last training batch had {last} samples: traces "
                     f"{format_bytes(plan.bytes_per_sample() * last)} (the totals above are at batch {plan.batch}, "
                     f"where the model was compiled; the rules do not depend on the batch)")
        if self._placement is not None:
            devices = self._placement.size
            line = (f"data parallel over {devices} devices ('batch' axis): each device holds batch / {devices} "
                    "samples' hidden states and traces")
            batch = last or self.batch_size
            if plan is not None and batch:
                local = batch // devices
                line += (f"; at batch {batch}: {local} per device, traces "
                         f"{format_bytes(plan.bytes_per_sample() * local)} per device")
            text += "\n" + line
        return text

"""Data parallelism over devices and hosts (docs/scaling.md).

A :class:`Placement` puts everything a training step touches on a
``jax.sharding.Mesh`` whose ``"batch"`` axis splits the batch: the input sequences,
targets and loss weights, the hidden states and the **eligibility traces** (all carry
the batch axis) are sharded over it; the weights, the optimizer state and the running
rates are replicated. The step stays one jitted program over global arrays, so XLA
inserts the gradient all-reduce and every loss and metric is a sum over the whole
batch, never a mean of per-device means. :func:`initialize` starts a multi-host run
(one process per host, as :func:`jax.distributed.initialize`).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from .errors import ConfigError

__all__ = ["BATCH_AXIS", "Placement", "ProcessLocal", "barrier", "initialize", "is_main_process", "make_mesh",
           "resolve_mesh"]

#: The mesh axis the batch is split over.
BATCH_AXIS = "batch"


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids: Any = None, *,
               cpu_collectives: str | None = "gloo", **kwargs: Any) -> None:
    """Join a multi-host run: :func:`jax.distributed.initialize` with the same
    arguments (all ``None`` on Slurm or Open MPI: JAX reads them from the environment),
    called once per process before anything else touches JAX. On CPU, cross-process
    collectives need an implementation: ``cpu_collectives`` (``"gloo"``, the default;
    ``None`` leaves JAX's setting) is set first. Afterwards ``Trainer(mesh="auto")``
    spans every process's devices; each process feeds its share of every batch and only
    process 0 writes logs, progress and checkpoints."""
    if cpu_collectives is not None:
        jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                               process_id=process_id, local_device_ids=local_device_ids, **kwargs)


def is_main_process() -> bool:
    """True in process 0 (the only one that writes files and prints)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process reaches the barrier ``name`` (nothing with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def make_mesh(devices: int | None = None) -> Mesh:
    """A one-axis ``"batch"`` mesh over the first ``devices`` devices (all of them,
    across processes, by default)."""
    available = jax.devices()
    if devices is None:
        devices = len(available)
    if isinstance(devices, bool) or not isinstance(devices, (int, np.integer)) or not 1 <= devices <= len(available):
        raise ConfigError(f"devices must be an int from 1 to the {len(available)} device(s) there are, got "
                          f"{devices!r}")
    return Mesh(np.array(available[:int(devices)]), (BATCH_AXIS,))


def resolve_mesh(mesh: Any) -> Mesh | None:
    """The Trainer's ``mesh`` argument as a Mesh: ``None`` (one device, no mesh),
    ``"auto"`` (every device; no mesh when there is only one), an int (that many
    devices) or a :class:`jax.sharding.Mesh` with a ``"batch"`` axis (its axes used
    as ``AxisType.Auto`` whatever their type, e.g. :func:`jax.make_mesh`'s Explicit
    ones: the same devices and axes; a ``UserWarning`` when another axis has more than
    one device, since each of them repeats the whole step); else :class:`ConfigError`."""
    if mesh is None:
        return None
    if isinstance(mesh, str):
        if mesh != "auto":
            raise ConfigError(f"mesh must be None, 'auto', a number of devices or a jax.sharding.Mesh, got {mesh!r}")
        return make_mesh() if jax.device_count() > 1 else None
    if isinstance(mesh, (int, np.integer)) and not isinstance(mesh, bool):
        return make_mesh(int(mesh))
    if not isinstance(mesh, Mesh):
        raise ConfigError(f"mesh must be None, 'auto', a number of devices or a jax.sharding.Mesh, got "
                          f"{type(mesh).__name__}")
    if BATCH_AXIS not in mesh.axis_names:
        raise ConfigError(f"the mesh has axes {tuple(mesh.axis_names)} but no {BATCH_AXIS!r} axis to split the batch "
                          f"over: build it as Mesh(devices, ({BATCH_AXIS!r},)) or use mesh='auto'")
    copies = {name: size for name, size in mesh.shape.items() if name != BATCH_AXIS and size > 1}
    if copies:
        # valid (a mesh shared with other code), but each of these axes repeats the whole step
        warnings.warn(f"the mesh's axes {copies} besides {BATCH_AXIS!r} hold copies of the same work: the batch is "
                      f"split over {BATCH_AXIS!r} alone, so its {mesh.size} devices compute as "
                      f"{mesh.shape[BATCH_AXIS]}; build Mesh(devices, ({BATCH_AXIS!r},)) to split over all of them",
                      UserWarning, stacklevel=3)
    if any(kind != AxisType.Auto for kind in mesh.axis_types):
        # jax.make_mesh's axes are Explicit by default: the step places its values by sharding
        # constraints, which Explicit axes refuse (a ShardingTypeError deep in the first step's tracing)
        mesh = Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))
    return mesh


class ProcessLocal:
    """Batches of which each process holds its own share: ``fit(ProcessLocal(batches))``
    with ``batches`` an iterable of ``(x, y)`` or ``(x, y, mask)`` batches, in every
    process the same number of batches of the same size, each process's rows being
    its part of the global batch (process ``p`` of ``P`` holds rows ``p·B/P`` to
    ``(p+1)·B/P`` of a global batch of ``B``; e.g. a reader that opens only its
    ``1/P`` of the files). The global batch is put together on the devices
    (:func:`jax.make_array_from_process_local_data`); no process reads all the data.
    Plain arrays, by contrast, are the same in every process, and each process
    transfers the rows its devices hold."""

    def __init__(self, batches: Any):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


def _batch_axis(small: Any, large: Any) -> int | None:
    """The axis where two shapes of the same leaf at different batch sizes differ."""
    differ = [n for n, (a, b) in enumerate(zip(small.shape, large.shape)) if a != b]
    return differ[0] if len(differ) == 1 and len(small.shape) == len(large.shape) else None


def batch_axes(shapes_at: Callable[[int], Any], batch: int) -> Any:
    """Per leaf of ``shapes_at(batch)`` (a pytree of shaped values), the axis that grows
    with the batch size (compared with ``shapes_at(2 * batch)``), or None."""
    small, large = shapes_at(batch), shapes_at(2 * batch)
    return jax.tree.map(_batch_axis, small, large)


class Placement:
    """Where a step's values live on ``mesh`` (see the module docstring)."""

    def __init__(self, mesh: Mesh):
        self.mesh = mesh
        self.size = int(mesh.shape[BATCH_AXIS])
        self.replicated = NamedSharding(mesh, PartitionSpec())
        self.multiprocess = jax.process_count() > 1

    def __repr__(self) -> str:
        return f"Placement({self.size} device(s) on the {BATCH_AXIS!r} axis, {jax.process_count()} process(es))"

    def sharded(self, axis: int | None, ndim: int) -> NamedSharding:
        """Split over the batch axis at ``axis`` (replicated when None)."""
        if axis is None:
            return self.replicated
        return NamedSharding(self.mesh, PartitionSpec(*([None] * axis), BATCH_AXIS))

    def check_batch(self, batch: int, what: str | None = None) -> None:
        """:class:`ConfigError` unless ``batch`` splits evenly over the devices
        (``what`` names it in the message; default ``"batch_size <batch>"``)."""
        if batch % self.size:
            lower, upper = batch // self.size * self.size, -(-batch // self.size) * self.size
            choices = f"{lower} or {upper}" if lower else f"{upper}"
            # drop_remainder applies to arrays fit splits (``what`` None), not to batches given as they are
            short = "drop_remainder=True for a short last batch" if what is None else \
                "batches cut to such sizes (drop or pad a short last one)"
            what = what or f"batch_size {batch}"
            raise ConfigError(f"{what} does not split evenly over the {self.size} devices of the mesh's "
                              f"{BATCH_AXIS!r} axis: use a batch size that is a multiple of {self.size} (e.g. "
                              f"{choices}), {short}, or fewer devices")

    def local_batch(self, batch: int) -> int:
        """Samples per device."""
        return batch // self.size

    # ------------------------------------------------------------ placing values
    def put(self, value: Any, axis: int | None) -> jax.Array:
        """``value`` (the global array, the same in every process) on the mesh, split on
        ``axis``; each process transfers only the rows its devices hold."""
        if value is None:
            return None
        sharding = self.sharded(axis, np.ndim(value))
        if isinstance(value, jax.Array) and value.sharding == sharding:
            return value
        if not self.multiprocess:
            return jax.device_put(value, sharding)
        if isinstance(value, jax.Array) and not value.is_fully_addressable:
            return jax.device_put(value, sharding)  # already global: reshard
        host = np.asarray(value)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    def from_local(self, value: Any, axis: int) -> jax.Array:
        """The global array whose rows on ``axis`` this process holds ``value`` of (in
        process order; see :class:`ProcessLocal`)."""
        host = np.asarray(value)
        return jax.make_array_from_process_local_data(self.sharded(axis, host.ndim), host)

    def put_tree(self, tree: Any, axes: Any) -> Any:
        """:meth:`put` over a pytree with its per-leaf axes (a matching pytree)."""
        leaves, treedef = jax.tree.flatten(tree)
        axis_leaves = treedef.flatten_up_to(axes) if axes is not None else [None] * len(leaves)
        return jax.tree.unflatten(treedef, [self.put(v, a) for v, a in zip(leaves, axis_leaves)])

    def replicate(self, tree: Any) -> Any:
        """Every leaf of ``tree`` on every device."""
        return jax.tree.map(lambda v: self.put(v, None), tree)

    def constrain(self, tree: Any, axes: Any) -> Any:
        """Inside a jitted function: ``tree``'s leaves kept split on their axes (None:
        replicated)."""
        leaves, treedef = jax.tree.flatten(tree)
        axis_leaves = treedef.flatten_up_to(axes) if axes is not None else [None] * len(leaves)
        return jax.tree.unflatten(treedef, [
            jax.lax.with_sharding_constraint(v, self.sharded(a, np.ndim(v))) for v, a in zip(leaves, axis_leaves)])

    def fetch(self, value: Any) -> Any:
        """A replicated or sharded array as numpy on every process (a sharded one is
        gathered across processes)."""
        if isinstance(value, jax.Array) and not value.is_fully_addressable and not value.is_fully_replicated:
            from jax.experimental import multihost_utils

            return np.asarray(multihost_utils.process_allgather(value, tiled=True))
        return np.asarray(value)


"""Spike rasters for dashboards: a labelled matplotlib figure, or a plain image.

``raster_figure`` draws the input raster beside each spiking layer's raster (time on the
x axis, channels or neurons on the y axis, each panel titled with its firing rate) and
titles the figure with the sequence's label and the model's prediction. matplotlib is an
optional extra (``pip install etrace_fit[bench]``); without it ``raster_image`` stacks
the same rasters into one grey image (white = spike, a grey row between panels).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

__all__ = ["firing_statistics", "has_matplotlib", "raster_figure", "raster_image"]


def has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _panel(values: Any) -> np.ndarray:
    """``(T, ...)`` → ``(units, T)`` of 0 / 1."""
    values = np.asarray(values)
    return (values.reshape(values.shape[0], -1).T > 0).astype(np.float32)


def raster_figure(inputs: Any, spikes: Mapping[str, Any], label: Any = None, prediction: Any = None):
    """A matplotlib ``Figure``: the input ``(T, channels...)`` and every layer's spikes
    ``{name: (T, neurons...)}`` side by side, axes labelled (``time step``; ``input
    channel`` / ``neuron``), each panel titled with its mean rate, the figure with the
    label and prediction when given."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    panels = [("input", _panel(inputs), "input channel"), *((n, _panel(s), "neuron") for n, s in spikes.items())]
    figure = Figure(figsize=(3.2 * len(panels), 3.2), layout="constrained")
    for ax, (name, raster, ylabel) in zip(figure.subplots(1, len(panels), squeeze=False)[0], panels):
        ax.imshow(raster, aspect="auto", cmap="Greys", interpolation="nearest", origin="lower",
                  extent=(-0.5, raster.shape[1] - 0.5, -0.5, raster.shape[0] - 0.5), vmin=0, vmax=1)
        ax.set_xlabel("time step")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{name} ({raster.mean():.3f} spikes/step)")
    parts = [f"label {label}" if label is not None else None,
             f"prediction {prediction}" if prediction is not None else None]
    if any(parts):
        figure.suptitle(" · ".join(p for p in parts if p))
    return figure


def raster_image(inputs: Any, spikes: Mapping[str, Any]) -> np.ndarray:
    """The rasters of :func:`raster_figure` as one ``(rows, T)`` uint8 image: the input
    on top, then each layer, separated by a grey row (the fallback without matplotlib)."""
    panels = [_panel(inputs), *(_panel(s) for s in spikes.values())]
    steps = panels[0].shape[1]
    rows = []
    for k, panel in enumerate(panels):
        if k:
            rows.append(np.full((1, steps), 0.5, np.float32))
        rows.append(panel)
    return (np.concatenate(rows) * 255).astype(np.uint8)


def firing_statistics(spikes: Any, saturated_rate: float = 0.9) -> dict[str, float]:
    """``{"rate", "silent_fraction", "saturated_fraction"}`` of spikes ``(samples, T,
    neurons...)``: spikes per neuron and step, the fraction of neurons that never fire,
    and of those firing on at least ``saturated_rate`` of the steps."""
    values = np.asarray(spikes, np.float64)
    per_neuron = (values > 0).reshape(values.shape[0], values.shape[1], -1).mean(axis=(0, 1))
    return {"rate": float(per_neuron.mean()), "silent_fraction": float(np.mean(per_neuron == 0)),
            "saturated_fraction": float(np.mean(per_neuron >= saturated_rate))}

"""Pieces shared by the fitted models of both faces: history plots and pandas prediction."""

from __future__ import annotations

from typing import Any, Sequence

from hora.errors import ConfigError


#: history entries that describe the run, not the model: not plotted unless named in ``metrics``
_NOT_METRICS = ("data_wait",)


def plot_history(history: Sequence[dict[str, float]], metrics: Sequence[str] | None = None, title: str | None = None) -> Any:
    """A matplotlib Figure with one panel per metric, training and validation curves together.

    Args:
        history: per-epoch dicts (``epoch``, ``loss``, ``val_loss``, ...).
        metrics: base names to plot (default: every metric in the history, e.g. ``loss``, ``accuracy``).

    Raises:
        ConfigError: an empty history, or a metric that is not in it.
    """
    if not history:
        raise ConfigError("the model has no training history to plot")
    from matplotlib.figure import Figure  # no pyplot: works headless, no global state

    keys = [k for k in history[0] if k not in ("epoch", "epoch_time_s", "attempt", "num_proc")]
    every = list(dict.fromkeys(k[4:] if k.startswith("val_") else k for k in keys))
    # by default the model's loss and metrics; the feed's data_wait is plotted when asked for by name
    bases = [b for b in every if b not in _NOT_METRICS]
    if metrics is not None:
        unknown = [m for m in metrics if m not in every]
        if unknown:
            raise ConfigError(f"metrics {unknown} are not in the history; it has {every}")
        bases = list(metrics)
    epochs = [int(h.get("epoch", i)) + 1 for i, h in enumerate(history)]
    fig = Figure(figsize=(4.5 * len(bases), 3.5))
    axes = fig.subplots(1, len(bases), squeeze=False)[0]
    for ax, base in zip(axes, bases):
        for key, label in ((base, "train"), (f"val_{base}", "validation")):
            values = [h.get(key) for h in history]
            if any(v is not None for v in values):
                ax.plot(epochs, [float("nan") if v is None else v for v in values], marker="o", label=label)
        ax.set_title(base)
        ax.set_xlabel("epoch")
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


__all__ = ["plot_history"]

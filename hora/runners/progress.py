"""The driver's progress bar, fed by :func:`hora.runners.report` metrics.

Only the driver renders anything. The bar follows the lowest rank that reports
(normally rank 0): ``step``/``total`` (or ``steps``) move the bar, ``epoch``/``epochs``
set its description, and every other scalar shows as a postfix (``loss=0.31``). A new
``epoch`` closes the bar of the previous one (filled, with the ``last_epoch`` metrics the
new report carries, since the driver sees only a rank's latest report) and opens the
next: one bar per epoch.
"""

from __future__ import annotations

import logging
import numbers
from typing import IO, Any

log = logging.getLogger(__name__)

_RESERVED = {"step", "total", "steps", "epoch", "epochs", "last_epoch", "resumed_at"}


class Progress:
    """A tqdm bar created on the first metrics (only when ``enabled``); ``label`` follows
    the run id in its description (``"attempt 2 of 3"`` after a relaunch), and a
    ``resumed_at`` metric adds where the run resumed: ``run (attempt 2 of 3, resumed at
    epoch 3) epoch 4/5``."""

    def __init__(self, run_id: str, enabled: bool = True, label: str | None = None) -> None:
        self.run_id = run_id
        self.label = label
        self.title = f"{run_id} ({label})" if label else run_id
        self.enabled = enabled
        self._bar: Any = None
        self._rank: int | None = None
        self._epoch: Any = None
        self.latest: dict[int, dict[str, Any]] = {}

    def update(self, rank: int, metrics: dict[str, Any]) -> None:
        """Record the latest metrics of ``rank``; redraw the bar if it follows that rank."""
        self.latest[rank] = dict(metrics)
        if self._rank is None or rank < self._rank:
            self._rank = rank
        if rank != self._rank:
            return
        log.debug("rank %d metrics: %s", rank, metrics)
        if not self.enabled:
            return
        epoch = metrics.get("epoch")
        if epoch is not None and epoch != self._epoch:
            self._next_bar(epoch, metrics.get("last_epoch"))
        total = metrics.get("total", metrics.get("steps"))
        bar = self._ensure_bar(total if isinstance(total, numbers.Number) else None)
        if isinstance(total, numbers.Number) and total != bar.total:
            bar.total = total
        step = metrics.get("step")
        if isinstance(step, numbers.Number):
            bar.n = step
        resumed = metrics.get("resumed_at")
        if resumed is not None:
            said = ", ".join(x for x in (self.label, f"resumed at epoch {resumed}") if x)
            self.title = f"{self.run_id} ({said})"
        if epoch is not None:
            epochs = metrics.get("epochs")
            bar.set_description(f"{self.title} epoch {epoch}" + (f"/{epochs}" if epochs is not None else ""), refresh=False)
        bar.set_postfix(_postfix(metrics), refresh=False)
        bar.refresh()

    def _next_bar(self, epoch: Any, last: Any) -> None:
        """Close the previous epoch's bar, filled (its last report may have been overtaken by this one)."""
        if self._bar is not None and self._epoch is not None:
            if self._bar.total:
                self._bar.n = self._bar.total
            if isinstance(last, dict):
                self._bar.set_postfix(_postfix(last), refresh=False)
            self._bar.refresh()
            self._bar.close()
            self._bar = None
        self._epoch = epoch

    def _ensure_bar(self, total: Any = None) -> Any:
        if self._bar is None:
            from tqdm.auto import tqdm

            self._bar = tqdm(desc=self.title, total=total, unit="step", dynamic_ncols=True, leave=True)
        return self._bar

    def write(self, text: str, stream: IO[str]) -> None:
        """Print a line without breaking the bar."""
        if self._bar is not None:
            from tqdm.auto import tqdm

            tqdm.write(text, file=stream)
        else:
            stream.write(text + "\n")
            stream.flush()

    def close(self) -> None:
        """Close the bar (idempotent)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _postfix(metrics: dict[str, Any]) -> dict[str, Any]:
    postfix: dict[str, Any] = {}
    for key, value in metrics.items():
        if key in _RESERVED:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Number):
            postfix[key] = str(value)
        elif isinstance(value, numbers.Integral):
            postfix[key] = value
        else:
            postfix[key] = f"{float(value):.4g}"
    return postfix


__all__ = ["Progress"]

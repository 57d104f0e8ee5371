"""The driver's console: a bar (or a plain line) per epoch, fed by :func:`hora.runners.report`.

Only the driver renders anything. The console follows the lowest rank that reports
(normally rank 0): ``step``/``total`` (or ``steps``) move the bar, ``epoch``/``epochs``
name it, ``elapsed_s`` (seconds since the epoch began, measured on the rank) and ``rows``
(rows trained so far in the epoch, all ranks) give its rate, and every other scalar shows
as a postfix (``loss=0.31``). A report with ``final=True`` ends its epoch with the epoch's
logged metrics; because the driver sees only a rank's latest report, the next epoch's
reports repeat them as ``last_epoch`` and end the previous epoch if its final report was
overtaken.

On a terminal (or in a notebook, through ``tqdm.auto``) each epoch is one tqdm bar whose
rate is the rank's (steps/s and rows/s from the steps done and the time they took), not
tqdm's redraw timing. Off a terminal each finished epoch is one plain line:
``epoch 3/15: loss=0.31 val_loss=0.42 | 2.1 s, 1234 rows/s``.
"""

from __future__ import annotations

import logging
import numbers
import shutil
import sys
from typing import IO, Any

log = logging.getLogger(__name__)

#: The fewest columns a bar keeps for its ``|████  |`` part.
MIN_BAR = 10

_RESERVED = {"step", "total", "steps", "epoch", "epochs", "last_epoch", "epochs_done", "resumed_at", "elapsed_s", "rows",
             "final"}


def _in_notebook() -> bool:
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def is_interactive(stream: IO[str] | None = None) -> bool:
    """Whether ``stream`` (default ``sys.stderr``) is a terminal or a notebook's output."""
    stream = stream if stream is not None else sys.stderr
    try:
        return bool(stream.isatty()) or _in_notebook()
    except (AttributeError, ValueError):
        return _in_notebook()


def console(text: str, stream: IO[str] | None = None) -> None:
    """Write one line of hora's console (the header and summary of a fit) to ``stream`` (stderr)."""
    stream = stream if stream is not None else sys.stderr
    try:
        stream.write(text + "\n")
        stream.flush()
    except (OSError, ValueError):
        log.debug("console closed; dropped: %s", text)


class Progress:
    """One bar (terminal) or one line (elsewhere) per epoch, created from the ranks' reports.

    Args:
        run_id: the run's id (named once, in the fit's header line, not on every bar).
        enabled: draw anything at all (``verbose >= 1``).
        label: shown before the epoch (``"attempt 2 of 3"`` after a relaunch); a
            ``resumed_at`` metric adds where the run resumed.
        stream: where bars and lines go (default ``sys.stderr``).
        interactive: bars (True) or plain lines (False); default: whether ``stream`` is
            a terminal or a notebook.
    """

    def __init__(self, run_id: str, enabled: bool = True, label: str | None = None,
                 stream: IO[str] | None = None, interactive: bool | None = None) -> None:
        self.run_id = run_id
        self.label = label
        self.enabled = enabled
        self.stream = stream
        self.interactive = is_interactive(stream) if interactive is None else interactive
        self._bar: Any = None
        self._rank: int | None = None
        self._epoch: Any = None
        self._resumed: Any = None
        self._done: set[Any] = set()
        self.latest: dict[int, dict[str, Any]] = {}
        #: the metrics each finished epoch was shown with, by epoch (1-based, as reported)
        self.shown: dict[Any, dict[str, Any]] = {}

    @property
    def title(self) -> str:
        said = ", ".join(x for x in (self.label, None if self._resumed is None else f"resumed at epoch {self._resumed}") if x)
        return f"({said}) " if said else ""

    def update(self, rank: int, metrics: dict[str, Any]) -> None:
        """Record the latest metrics of ``rank``; redraw the console if it follows that rank."""
        self.latest[rank] = dict(metrics)
        if self._rank is None or rank < self._rank:
            self._rank = rank
        if rank != self._rank:
            return
        log.debug("rank %d metrics: %s", rank, metrics)
        if not self.enabled:
            return
        if metrics.get("resumed_at") is not None:
            self._resumed = metrics["resumed_at"]
        epoch = metrics.get("epoch")
        if epoch is None:  # a user's report() without an epoch: one bar for the whole run
            if self.interactive:
                self._draw(metrics)
            return
        for done in metrics.get("epochs_done") or ():  # finished epochs whose own reports were overtaken
            if isinstance(done, dict) and done.get("epoch") not in self._done and done.get("epoch") != epoch:
                if done["epoch"] != self._epoch:
                    self._close_bar()
                self._finish(done["epoch"], {**done, "epochs": metrics.get("epochs"), "total": metrics.get("total")})
        if epoch in self._done:
            return
        if epoch != self._epoch:
            last = metrics.get("last_epoch")
            if self._epoch is not None and self._epoch not in self._done and isinstance(last, dict) and last:
                self._finish(self._epoch, {**last, "epochs": metrics.get("epochs")})
            self._close_bar()
            self._epoch = epoch
        if metrics.get("final"):
            self._finish(epoch, metrics)
        elif self.interactive:
            self._draw(metrics)

    def _describe(self, metrics: dict[str, Any], epoch: Any) -> str:
        epochs = metrics.get("epochs")
        return f"{self.title}epoch {epoch}" + (f"/{epochs}" if epochs is not None else "")

    def _draw(self, metrics: dict[str, Any]) -> None:
        total = metrics.get("total", metrics.get("steps"))
        desc = self._describe(metrics, metrics["epoch"]) if metrics.get("epoch") is not None else self.title
        bar = self._ensure_bar(total if isinstance(total, numbers.Number) else None, desc)
        if isinstance(total, numbers.Number) and total != bar.total:
            bar.total = total
        step = metrics.get("step")
        if isinstance(step, numbers.Number):
            bar.n = step
        if metrics.get("epoch") is not None:
            bar.set_description(self._describe(metrics, metrics["epoch"]), refresh=False)
        postfix = _postfix(metrics)
        rate = _rate(metrics)
        said = ", ".join([*(f"{k}={v}" for k, v in postfix.items()), *rate])
        bar.set_postfix_str(said, refresh=False)
        # the terminal's width, but never so narrow that the bar or the metrics are cut
        width = shutil.get_terminal_size((120, 24)).columns or 120
        bar.ncols = max(width, len(bar.desc) + len(said) + MIN_BAR + 30)
        bar.refresh()

    def _finish(self, epoch: Any, metrics: dict[str, Any]) -> None:
        """End ``epoch`` with its final metrics: the bar filled and closed, or one plain line."""
        self._done.add(epoch)
        postfix = _postfix(metrics)
        self.shown[epoch] = postfix
        if self.interactive:
            total = metrics.get("total") or (self._bar.total if self._bar is not None else None) or 1
            self._draw({**metrics, "epoch": epoch, "total": total, "step": total})
            self._close_bar()
            return
        said = " ".join(f"{k}={v}" for k, v in postfix.items())
        seconds = metrics.get("elapsed_s")
        tail = []
        if isinstance(seconds, numbers.Number):
            tail.append(f"{float(seconds):.1f} s")
        rows_rate = [r for r in _rate(metrics) if r.endswith("rows/s")]
        tail.extend(rows_rate)
        line = f"{self._describe(metrics, epoch)}: {said}" + (f" | {', '.join(tail)}" if tail else "")
        self._write_line(line)

    def _write_line(self, text: str) -> None:
        console(text, self.stream)

    def _ensure_bar(self, total: Any = None, desc: str | None = None) -> Any:
        if self._bar is None:
            from tqdm.auto import tqdm

            size = shutil.get_terminal_size((120, 24))
            self._bar = tqdm(desc=self.title if desc is None else desc, total=total, file=self.stream or sys.stderr, leave=True,
                             ncols=size.columns or 120, nrows=size.lines or 24, bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} "
                                                    "[{elapsed}{postfix}]")
        return self._bar

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def write(self, text: str, stream: IO[str]) -> None:
        """Print a line (a rank's output) above the bar without breaking it."""
        if self._bar is not None:
            from tqdm.auto import tqdm

            tqdm.write(text, file=stream)
        else:
            stream.write(text + "\n")
            stream.flush()

    def close(self) -> None:
        """Close the bar (idempotent). Off a terminal, a run whose last report ended no epoch
        (a user's own :func:`hora.runners.report`) ends with one line of its latest metrics."""
        self._close_bar()
        last = self.latest.get(self._rank) if self._rank is not None else None
        if self.enabled and not self.interactive and last and last.get("epoch") not in self._done:
            self.latest.pop(self._rank, None)
            step, total = last.get("step"), last.get("total", last.get("steps"))
            where = f"step {step}" + (f"/{total}" if total is not None else "") if step is not None else "metrics"
            if last.get("epoch") is not None:
                where = f"{self._describe(last, last['epoch'])} {where}"
            said = " ".join(f"{k}={v}" for k, v in _postfix(last).items())
            rate = _rate(last)
            self._write_line(f"{where}: {said}" + (f" | {', '.join(rate)}" if rate else ""))


def _rate(metrics: dict[str, Any]) -> list[str]:
    """``["12.3 steps/s", "790 rows/s"]`` from the rank's own step count, rows and time."""
    seconds = metrics.get("elapsed_s")
    if not isinstance(seconds, numbers.Number) or seconds <= 0:
        return []
    out = []
    step = metrics.get("step")
    if isinstance(step, numbers.Number) and step > 0:
        out.append(f"{step / seconds:.3g} steps/s")
    rows = metrics.get("rows")
    if isinstance(rows, numbers.Number) and rows > 0:
        out.append(f"{rows / seconds:.0f} rows/s")
    return out


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


__all__ = ["Progress", "console", "is_interactive"]


def header_line(run_id: str, num_proc: int, launcher: Any) -> str:
    """The fit's one header line: ``hora: run <id> on 2 ranks (spark)``."""
    name = launcher if isinstance(launcher, str) else getattr(launcher, "name", type(launcher).__name__)
    return f"hora: run {run_id} on {num_proc} rank{'s' if num_proc != 1 else ''} ({name})"


def summary_line(run_id: str, history: list[dict[str, Any]], checkpoints: str, logs: str) -> str:
    """The fit's one closing line: epochs, the best validation metric and its epoch, and
    where the model, the checkpoints and the TensorBoard logs are."""
    epochs = len(history)
    parts = [f"hora: run {run_id} done: {epochs} epoch{'s' if epochs != 1 else ''}"]
    val_keys = [k for k in (history[-1] if history else {}) if k.startswith("val_")]
    key = "val_loss" if "val_loss" in val_keys else (val_keys[0] if val_keys else None)
    scored = [h for h in history if key is not None and isinstance(h.get(key), numbers.Number)]
    if scored:
        higher = any(word in key for word in ("acc", "auc", "precision", "recall", "f1"))
        best = (max if higher else min)(scored, key=lambda h: h[key])
        parts.append(f"best {key}={float(best[key]):.4g} at epoch {int(best.get('epoch', 0)) + 1}")
    elif history and isinstance(history[-1].get("loss"), numbers.Number):
        parts.append(f"final loss={float(history[-1]['loss']):.4g}")
    parts.append("model: the returned model")
    parts.append(f"checkpoints: {checkpoints}")
    parts.append(f"TensorBoard logs: {logs}")
    return "; ".join(parts)


__all__ += ["header_line", "summary_line"]

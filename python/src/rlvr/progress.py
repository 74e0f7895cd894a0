"""How `Client.watch` shows a job: a tqdm bar of its steps when tqdm is importable (`tqdm.auto`:
a widget in notebooks, a text bar in terminals), else one plain line per change of state and per
few seconds of training."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from .models import Job, JobEvent

#: Plain lines of progress at most this often.
PROGRESS_EVERY_S = 5.0


def clock(at: str) -> str:
    """12:00:01 from RFC 3339 (UTC)."""
    return at[11:19] if len(at) >= 19 and at[10] == "T" else at


def state_line(event: JobEvent) -> str:
    line = f"{clock(event.at)} {event.state}"
    if event.step:
        line += f" at step {event.step}"
    if event.reason:
        line += f" — {event.reason}"
    return line


def figures(job: Job) -> dict[str, str]:
    """The latest step's figures worth showing, formatted."""
    progress = job.progress
    if progress is None:
        return {}
    shown = {}
    for value, label in ((progress.reward, "reward"), (progress.loss, "loss"), (progress.heldout, "held-out"),
                         (progress.kl, "KL")):
        if isinstance(value, (int, float)):
            shown[label] = f"{value:.4g}"
    return shown


def progress_line(job: Job) -> str:
    line = f"{clock(job.updated_at)} step {job.step}/{job.max_steps}"
    for label, value in figures(job).items():
        line += f" · {label} {value}"
    eta = job.progress.eta_s if job.progress else None
    if isinstance(eta, (int, float)):
        line += f" · ETA {int(eta)} s"
    return line


class Display:
    """Shows a followed job's events: `state`, `progress`, `reconnecting`, then `close`."""

    def __init__(self, bar: bool | None = None, out: TextIO | None = None) -> None:
        self._out = out or sys.stdout
        self._tqdm: Any = None
        self._bar: Any = None
        self._last_progress = 0.0
        if bar is not False:
            try:
                from tqdm.auto import tqdm  # type: ignore[import-untyped,unused-ignore]
            except ImportError:
                if bar:
                    raise
            else:
                self._tqdm = tqdm

    def _write(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line, file=self._out)
        else:
            print(line, file=self._out, flush=True)

    def state(self, event: JobEvent) -> None:
        self._write(state_line(event))
        if self._bar is not None:
            self._bar.set_description(event.state)

    def progress(self, job: Job) -> None:
        if self._tqdm is not None:
            if self._bar is None:
                self._bar = self._tqdm(total=job.max_steps or None, unit="step", desc=job.state,
                                       file=self._out, dynamic_ncols=True)
            self._bar.update(max(0, job.step - self._bar.n))
            self._bar.set_postfix(figures(job), refresh=True)
            return
        now = time.monotonic()
        if now - self._last_progress >= PROGRESS_EVERY_S or job.step >= job.max_steps:
            self._last_progress = now
            self._write(progress_line(job))

    def reconnecting(self, why: str, wait: float) -> None:
        # On stderr, as rlvrctl says it: stdout stays the job's own story.
        line = f"{why}; reconnecting in {wait:.1f} s"
        if self._bar is not None:
            self._bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

"""A job's report as one HTML file: its summary, its gate table and a chart per figure its metrics
have (reward, pass rate, held-out accuracy, KL, loss, completion length), drawn as inline SVG so
that a browser opens it with no network, and no plotting library is needed here. `rlvrctl
report` writes the fuller one (plots as separate files, warnings of steps without signal)."""

from __future__ import annotations

import html
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from .models import Job, MetricsLine

#: At most this many points per chart: beyond it, consecutive points are averaged.
MAX_POINTS = 2000
_WIDTH, _HEIGHT, _PAD = 640, 220, 44

#: (title, what a line gives, or None when it has no such figure)
CHARTS: list[tuple[str, Callable[[MetricsLine], float | None]]] = [
    ("Reward (batch mean)", lambda line: line.reward_mean),
    ("Pass rate", lambda line: line.passed_frac),
    ("Held-out accuracy", lambda line: (line.heldout or {}).get("accuracy")),
    ("KL to the reference", lambda line: line.kl_ref),
    ("Loss", lambda line: line.loss),
    ("Completion length (tokens)", lambda line: line.get("completion_len_mean")),
]


def _points(metrics: list[MetricsLine], figure: Callable[[MetricsLine], float | None]) -> list[tuple[float, float]]:
    points = [(float(line.step), float(value)) for line in metrics
              if isinstance(value := figure(line), (int, float))]
    points.sort()
    if len(points) > MAX_POINTS:
        size = -(-len(points) // MAX_POINTS)
        points = [(sum(p[0] for p in chunk) / len(chunk), sum(p[1] for p in chunk) / len(chunk))
                  for chunk in (points[i:i + size] for i in range(0, len(points), size))]
    return points


def _svg(title: str, points: list[tuple[float, float]], steps: tuple[float, float]) -> str:
    low, high = min(y for _, y in points), max(y for _, y in points)
    if high == low:
        low, high = low - 0.5, high + 0.5
    first, last = steps if steps[1] > steps[0] else (steps[0], steps[0] + 1)

    def at(x: float, y: float) -> str:
        px = _PAD + (x - first) / (last - first) * (_WIDTH - 2 * _PAD)
        py = _HEIGHT - _PAD - (y - low) / (high - low) * (_HEIGHT - 2 * _PAD)
        return f"{px:.1f},{py:.1f}"

    path = " ".join(at(x, y) for x, y in points)
    markers = "".join(f'<circle cx="{at(x, y).split(",")[0]}" cy="{at(x, y).split(",")[1]}" r="2.5"/>'
                      for x, y in points) if len(points) <= 40 else ""
    bottom = _HEIGHT - _PAD
    return (
        f'<figure><figcaption>{html.escape(title)}</figcaption>'
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{_HEIGHT}" role="img" '
        f'aria-label="{html.escape(title)}">'
        f'<rect x="{_PAD}" y="{_PAD}" width="{_WIDTH - 2 * _PAD}" height="{_HEIGHT - 2 * _PAD}" class="frame"/>'
        f'<text x="{_PAD - 4}" y="{_PAD + 4}" text-anchor="end">{high:.4g}</text>'
        f'<text x="{_PAD - 4}" y="{bottom}" text-anchor="end">{low:.4g}</text>'
        f'<text x="{_PAD}" y="{bottom + 16}">step {first:g}</text>'
        f'<text x="{_WIDTH - _PAD}" y="{bottom + 16}" text-anchor="end">step {last:g}</text>'
        f'<polyline points="{path}" class="line"/><g class="marks">{markers}</g></svg></figure>'
    )


def render(job: Job, metrics: list[MetricsLine]) -> str:
    """The report's HTML."""
    e = html.escape
    rows = [("Job", job.id), ("Name", job.name), ("Team", job.team), ("Model line", job.model_line),
            ("State", job.state + (f" — {job.reason}" if job.reason else "")),
            ("Steps", f"{job.step} of {job.max_steps}"), ("Submitted", job.created_at)]
    if published := job.published_version:
        rows.append(("Published", f"{published.line} version {published.version}"))
    parts = ["<!doctype html><html><head><meta charset=\"utf-8\">",
             f"<title>rlvr job {e(job.id)}</title><style>"
             "body{font-family:sans-serif;margin:2em;max-width:60em}td,th{padding:.2em .8em;text-align:left}"
             "figure{margin:1em 0}svg text{font-size:11px;fill:#444}.frame{fill:none;stroke:#ccc}"
             ".line{fill:none;stroke:#1f6feb;stroke-width:1.5}.marks{fill:#1f6feb}.fail{color:#b00}"
             "</style></head><body>", f"<h1>Job {e(job.name or job.id)}</h1><table>"]
    parts += [f"<tr><th>{e(key)}</th><td>{e(str(value))}</td></tr>" for key, value in rows]
    parts.append("</table>")
    if job.gates is not None:
        verdict = "passed" if job.gates.passed else "refused"
        parts.append(f"<h2>Gates: {verdict}</h2><table><tr><th>criterion</th><th>status</th>"
                     "<th>measured</th><th>threshold</th><th>note</th></tr>")
        for c in job.gates.criteria:
            measured = "" if c.measured is None else f"{c.measured:.4g}"
            threshold = "" if c.threshold is None else f"{c.op} {c.threshold:.4g}"
            label = {"pass": "pass", "fail": "FAIL", "not_checked": "not checked"}.get(c.status, c.status)
            cls = ' class="fail"' if c.status == "fail" else ""
            parts.append(f"<tr{cls}><td>{e(c.name)}</td><td>{e(label)}</td><td>{measured}</td>"
                         f"<td>{e(threshold)}</td><td>{e(c.note)}</td></tr>")
        parts.append("</table>")
    steps = [float(line.step) for line in metrics]
    span = (min(steps), max(steps)) if steps else (0.0, 1.0)
    parts.append("<h2>Training</h2>")
    empty = []
    for title, figure in CHARTS:
        points = _points(metrics, figure)
        if points:
            parts.append(_svg(title, points, span))
        else:
            empty.append(title)
    if empty:
        parts.append(f"<p>No data for: {e(', '.join(empty))}.</p>")
    parts.append("</body></html>\n")
    return "".join(parts)


def write(path: str | os.PathLike[str], job: Job, metrics: list[MetricsLine]) -> Path:
    """Writes the report to `path` (a file ending in .html, or else a directory that gets
    `index.html`), through a temporary file renamed into place: a reader never sees half of it."""
    path = Path(path)
    if path.suffix.lower() not in (".html", ".htm"):
        path = path / "index.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(render(job, metrics))
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise
    return path

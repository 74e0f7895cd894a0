"""`rlvr.Client`: one typed method per route of rlvrd's HTTP API, with the team's token."""

from __future__ import annotations

import os
import time
import tomllib
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Protocol

from . import download as _download
from . import report as _report
from ._http import BUSY_RETRIES, BUSY_WAIT_MAX_S, ENV_CHECK_TIMEOUT_S, REQUEST_TIMEOUT_S, Transport
from .errors import BadAnswer
from .events import follow
from .models import (
    Dataset,
    GateReport,
    Job,
    JobEvent,
    JobLog,
    JobPage,
    Manifest,
    MetricsLine,
    ModelLine,
    Plugin,
    PluginList,
    VerifyResult,
)
from .progress import Display
from .spec import read_spec_file, with_datasets

#: Where the daemon is when nothing says otherwise (rlvrctl's default).
DEFAULT_SERVER = "http://127.0.0.1:8470"
#: Most items one `POST /v1/verify` grades; `verify` sends more in requests of this many.
VERIFY_MAX_ITEMS = 256


class _ToDict(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


#: What `submit`, `dry_run` and `estimate` take: a spec as a dict, a builder, or a spec file's path.
SpecLike = Mapping[str, Any] | _ToDict | str | os.PathLike[str]


def _config_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "rlvr" / "cli.toml"


def _settings(server: str | None, token: str | None) -> tuple[str, str | None]:
    """Each of server and token from the highest place that has it, as rlvrctl reads them: the
    argument, else `RLVR_SERVER` / `RLVR_TOKEN`, else `~/.config/rlvr/cli.toml`."""
    server = server or os.environ.get("RLVR_SERVER") or None
    token = token or os.environ.get("RLVR_TOKEN") or None
    if server is None or token is None:
        try:
            with open(_config_file(), "rb") as file:
                config = tomllib.load(file)
        except (OSError, ValueError):
            config = {}
        server = server or config.get("server")
        token = token or config.get("token")
    return server or DEFAULT_SERVER, token


def _rfc3339(when: datetime | str | None) -> str | None:
    if when is None or isinstance(when, str):
        return when
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


class Client:
    """The daemon's API with one team's token. Blocking; one per thread, or shared.

        client = rlvr.Client(server="http://rlvrd:8470", token=os.environ["RLVR_TOKEN"])
        job = client.submit("job.toml")
        print(client.wait(job.id).state)

    Every refusal raises an `rlvr.ApiError` subclass carrying the API's `code`, `field` and
    `message`; no answer raises `rlvr.Unreachable`. Busy answers (429, 503 with Retry-After up to
    `busy_wait_max` seconds) are waited out `busy_retries` times first, as rlvrctl does.
    """

    def __init__(
        self,
        server: str | None = None,
        token: str | None = None,
        *,
        timeout: float = REQUEST_TIMEOUT_S,
        busy_retries: int = BUSY_RETRIES,
        busy_wait_max: float = BUSY_WAIT_MAX_S,
        on_busy: Any = None,
    ) -> None:
        server, token = _settings(server, token)
        self._http = Transport(server, token, timeout=timeout, busy_retries=busy_retries,
                               busy_wait_max=busy_wait_max, on_busy=on_busy)

    @property
    def server(self) -> str:
        return self._http.server

    def __repr__(self) -> str:  # never the token
        return f"rlvr.Client(server={self.server!r})"

    def _get(self, *segments: str, query: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._http.call("GET", segments, query=query)[1]

    def _list(self, key: str, *segments: str) -> list[dict[str, Any]]:
        """The list under `key` of a GET's answer."""
        items = self._get(*segments).get(key)
        if not isinstance(items, list):
            raise BadAnswer(f"unexpected answer from {self._http.url(segments)}: no list {key!r}")
        return items

    # ---------------------------------------------------------------- daemon

    def health(self) -> dict[str, Any]:
        """`GET /healthz`: `status` (`ok` or `degraded`), `redis`, `plugins`."""
        return self._get("healthz")

    def plugins(self) -> PluginList:
        """`GET /v1/plugins`: the loaded plugins and the refused files."""
        raw = self._get("v1", "plugins")
        return PluginList([Plugin.from_json(p) for p in raw.get("plugins", [])], raw.get("refused", []), raw)

    def openapi(self) -> dict[str, Any]:
        """`GET /v1/openapi.json`: the API's OpenAPI document."""
        return self._get("v1", "openapi.json")

    # ---------------------------------------------------------------- specs and submits

    def prepare_spec(self, spec: SpecLike, *, dry_run: bool = False) -> dict[str, Any]:
        """The spec as it will be sent: a file read, a builder built, and every local data file it
        names uploaded as the team's dataset and named `dataset:NAME@SHA256` instead. Relative
        paths are read from a spec file's directory, else from the current directory. With
        `dry_run`, each file's content is checked and kept for the spec to cite, and no dataset
        name of the team moves (`PUT /v1/datasets/{name}?dry_run=true`)."""
        if isinstance(spec, (str, os.PathLike)):
            value, base = read_spec_file(spec)
        elif hasattr(spec, "to_dict"):
            value, base = spec.to_dict(), Path.cwd()
        elif isinstance(spec, Mapping):
            value, base = dict(spec), Path.cwd()
        else:
            raise TypeError(f"spec: expected a dict, a SpecBuilder or a spec file's path, got {type(spec).__name__}")
        return with_datasets(value, base, lambda name, path: self.upload_dataset(name, path, dry_run=dry_run).ref)

    def submit(
        self,
        spec: SpecLike,
        *,
        wait: bool = False,
        idempotency_key: str | None = None,
    ) -> Job:
        """`POST /v1/jobs`: queues the spec (see `prepare_spec`) and returns the job; with `wait`,
        follows it to its end first (`wait`). The idempotency key (a fresh one by default) makes a
        repeated submit answer with the job the first one made (`job.created` false) instead of
        queueing another, so retries here never make a second job."""
        body = self.prepare_spec(spec)
        key = idempotency_key or f"rlvr-py-{uuid.uuid4().hex}"
        status, submitted = self._http.call("POST", ["v1", "jobs"], json_body=body,
                                            headers={"Idempotency-Key": key}, expect=(200, 201))
        job = self.wait(submitted["id"]) if wait else self.job(submitted["id"])
        job.created = bool(submitted.get("created", status == 201))
        return job

    def dry_run(self, spec: SpecLike) -> dict[str, Any]:
        """`POST /v1/jobs?dry_run=true`: the spec checked as a submit would check it, and
        normalised as the job record would keep it; queues nothing (local data files are
        checked and kept for it, no dataset name moves). A refused spec raises `rlvr.Invalid`
        with the field."""
        answer = self._http.call("POST", ["v1", "jobs"], query={"dry_run": True},
                                 json_body=self.prepare_spec(spec, dry_run=True))[1]
        if not isinstance(answer.get("spec"), dict):
            raise BadAnswer(f"unexpected answer from {self._http.url(['v1', 'jobs'])}: no spec")
        return dict(answer["spec"])

    def estimate(self, spec: SpecLike) -> dict[str, Any]:
        """`POST /v1/estimate`: the spec's memory on each of its devices (`memory_gb`,
        `resident_gb`, `fits`, the parts); queues nothing."""
        return self._http.call("POST", ["v1", "estimate"], json_body=self.prepare_spec(spec, dry_run=True))[1]

    def env_check(self, spec: SpecLike, episodes: int = 2) -> dict[str, Any]:
        """`POST /v1/env/check`: an `[env]` spec's first `episodes` (1–8) played against its
        environment as its rollouts would be, each as its spans (`prompt`, the `model`'s turns
        that are trained on, the `env`'s replies that are masked out), its end and the
        environment's rewards; queues nothing."""
        return self._http.call("POST", ["v1", "env", "check"], query={"episodes": episodes},
                               json_body=self.prepare_spec(spec, dry_run=True), timeout=ENV_CHECK_TIMEOUT_S)[1]

    # ---------------------------------------------------------------- jobs

    def job(self, job_id: str) -> Job:
        """`GET /v1/jobs/{id}`."""
        return Job.from_json(self._get("v1", "jobs", job_id))

    def jobs_page(
        self,
        *,
        state: str | None = None,
        since: datetime | str | None = None,
        limit: int | None = None,
        team: str | None = None,
        cursor: str | None = None,
    ) -> JobPage:
        """One page of `GET /v1/jobs`, newest first; `page.next` is the next page's cursor."""
        query = {"team": team, "state": state, "since": _rfc3339(since), "limit": limit, "cursor": cursor}
        raw = self._get("v1", "jobs", query=query)
        return JobPage([Job.from_json(job) for job in raw.get("jobs", [])], raw.get("next"), raw)

    def jobs(
        self,
        *,
        state: str | None = None,
        since: datetime | str | None = None,
        limit: int | None = None,
        team: str | None = None,
    ) -> Iterator[Job]:
        """The team's jobs, newest first, every page: `limit` is the page size. `since`: only jobs
        submitted at or after it (a datetime, naive ones read as UTC, or RFC 3339)."""
        cursor = None
        while True:
            page = self.jobs_page(state=state, since=since, limit=limit, team=team, cursor=cursor)
            yield from page.jobs
            if not page.next:
                return
            cursor = page.next

    def cancel(self, job_id: str) -> Job:
        """`DELETE /v1/jobs/{id}`: the job cancelled, or being cancelled (`cancel_requested`)."""
        return Job.from_json(self._http.call("DELETE", ["v1", "jobs", job_id])[1])

    def promote(self, job_id: str, reason: str) -> Job:
        """`POST /v1/jobs/{id}/promote` (admin tokens): publishes a refused job's candidate over
        its gates, recording `reason`."""
        body = {"force": True, "reason": reason}
        return Job.from_json(self._http.call("POST", ["v1", "jobs", job_id, "promote"], json_body=body)[1])

    def gates(self, job_id: str) -> GateReport | None:
        """The job's gate report, once it has been gated."""
        return self.job(job_id).gates

    def metrics(self, job_id: str) -> list[MetricsLine]:
        """The job's metrics, one line per step and the held-out evaluations: every window of
        `GET /v1/jobs/{id}/metrics`, from the first to the file's end."""
        lines: list[MetricsLine] = []
        since = 0
        while True:
            window = self._get("v1", "jobs", job_id, "metrics", query={"since": since})
            items, start, end, size = (window.get(key) for key in ("lines", "start", "end", "size"))
            if not isinstance(items, list) or not all(isinstance(n, int) for n in (start, end, size)):
                raise BadAnswer(f"unexpected answer from the metrics of job {job_id}: {window!r}")
            if start < since:  # cut back meanwhile (a resume): read again from the start
                lines = []
            lines.extend(MetricsLine.from_json(line) for line in items)
            if end >= size or (end <= since and start == since):
                return lines
            since = end

    def logs(self, job_id: str, *, since: int | None = None, bytes: int | None = None) -> JobLog:
        """`GET /v1/jobs/{id}/logs`: whole lines of the worker's log from byte `since` (the `end` of
        the previous answer), or its tail."""
        return JobLog.from_json(self._get("v1", "jobs", job_id, "logs", query={"since": since, "bytes": bytes}))

    def events(self, job_id: str, *, after: str | None = None) -> Iterator[JobEvent | Job]:
        """Job `job_id`'s events from the start (or after event id `after`) to its final state:
        `JobEvent` for each change of state, `Job` for each step's progress. Reconnects with
        `Last-Event-ID` when the stream drops or the daemon restarts; raises `Unreachable` after
        5 minutes without a stream."""
        return follow(self._http, job_id, after=after)

    def wait(self, job_id: str, *, timeout: float | None = None) -> Job:
        """Follows the job to its end and returns it (`job.state`: published, refused, failed or
        cancelled). `timeout` (seconds) raises `TimeoutError` when it has not ended by then
        (checked at each event or keep-alive, every 10 s at most)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for event in follow(self._http, job_id):
            if isinstance(event, JobEvent) and event.ended:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} has not ended after {timeout} s")
        return self.job(job_id)

    def watch(self, job_id: str, *, bar: bool | None = None) -> Job:
        """Follows the job to its end, showing it: a tqdm bar of its steps when tqdm is installed
        (`bar=False`: plain lines), each change of state as a line. Returns the ended job."""
        display = Display(bar)
        try:
            for event in follow(self._http, job_id, on_reconnect=display.reconnecting):
                if isinstance(event, JobEvent):
                    display.state(event)
                else:
                    display.progress(event)
        finally:
            display.close()
        return self.job(job_id)

    def report(self, job_id: str, path: str | os.PathLike[str]) -> Path:
        """Writes the job's report (summary, gate table, charts of its metrics) as one HTML file
        at `path` (ending in .html; any other path is a directory that gets `index.html`);
        returns the file."""
        return _report.write(path, self.job(job_id), self.metrics(job_id))

    # ---------------------------------------------------------------- datasets

    def upload_dataset(self, name: str, path: str | os.PathLike[str], *, dry_run: bool = False) -> Dataset:
        """`PUT /v1/datasets/{name}`: the JSONL file at `path` becomes the team's dataset `name`
        (streamed from the file, never held whole in memory). With `dry_run`, its content is
        checked and kept for a dry run's spec to cite, and the name does not move."""
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            return self._put_dataset(name, file, size, dry_run)

    def put_dataset(self, name: str, content: bytes, *, dry_run: bool = False) -> Dataset:
        """`PUT /v1/datasets/{name}` of JSONL content in memory (`dry_run` as `upload_dataset`)."""
        return self._put_dataset(name, content, len(content), dry_run)

    def _put_dataset(self, name: str, body: bytes | IO[bytes], size: int, dry_run: bool) -> Dataset:
        headers = {"Content-Length": str(size)}
        query = {"dry_run": True} if dry_run else None
        raw = self._http.call("PUT", ["v1", "datasets", name], body=body, query=query,
                              content_type="application/x-ndjson", headers=headers, expect=(200, 201))[1]
        return Dataset.from_json(raw)

    def datasets(self) -> list[Dataset]:
        """`GET /v1/datasets`: the team's datasets, by name."""
        return [Dataset.from_json(d) for d in self._list("datasets", "v1", "datasets")]

    def dataset(self, name: str) -> Dataset:
        """`GET /v1/datasets/{name}`."""
        return Dataset.from_json(self._get("v1", "datasets", name))

    def delete_dataset(self, name: str) -> None:
        """`DELETE /v1/datasets/{name}`."""
        self._http.open("DELETE", ["v1", "datasets", name]).close()

    # ---------------------------------------------------------------- model lines

    def model_lines(self) -> list[ModelLine]:
        """`GET /v1/model-lines`: the lines the team owns or was granted."""
        return [ModelLine.from_json(line) for line in self._list("lines", "v1", "model-lines")]

    def model_line(self, name: str) -> ModelLine:
        """`GET /v1/model-lines/{name}`: the line, with its published versions."""
        return ModelLine.from_json(self._get("v1", "model-lines", name))

    def put_model_line(self, name: str, **update: Any) -> ModelLine:
        """`PUT /v1/model-lines/{name}`: creates the line or changes its `readers`, `publishers`,
        `policy` (and, for admins, `owner`); keys left out stay as they are."""
        return ModelLine.from_json(self._http.call("PUT", ["v1", "model-lines", name], json_body=update)[1])

    def manifest(self, line: str, version: int | str = "latest") -> Manifest:
        """`GET /v1/model-lines/{name}/versions/{version}`: a published version's manifest
        (`version` a number or `latest`)."""
        return Manifest.from_json(self._get("v1", "model-lines", line, "versions", str(version)))

    def download(self, line: str, version: int | str, directory: str | os.PathLike[str]) -> Manifest:
        """Downloads a published version into the new `directory`: every file its manifest names,
        each checked against the manifest's SHA-256 (`rlvr.IntegrityError` otherwise), plus
        `manifest.json`. Written to a temporary directory renamed into place, so `directory`
        holds the whole, checked version or does not exist. `latest` is resolved once: the files
        are the manifest's version's even if another is published meanwhile."""
        manifest = self.manifest(line, version)
        segments = ["v1", "model-lines", line, "versions", str(manifest.version), "files"]

        def open_file(name: str) -> IO[bytes]:
            return self._http.open("GET", [*segments, name])

        _download.download_into(directory, manifest, open_file)
        return manifest

    # ---------------------------------------------------------------- graders

    def verify(
        self,
        items: list[dict[str, Any]],
        *,
        grader: dict[str, Any] | None = None,
        reward: dict[str, Any] | None = None,
    ) -> list[VerifyResult]:
        """`POST /v1/verify`: the daemon grades `items` (`{"id", "prompt", "completion",
        "reference"}`) with one grader (a `[[verifiers]]` entry, e.g. `{"plugin": "math"}`) or a
        reward (`{"graders": [...], "formula": ...}`), as the team's job would; in requests of
        256 items."""
        if (grader is None) == (reward is None):
            raise ValueError("verify: expected one of grader= or reward=")
        request: dict[str, Any] = {"grader": grader} if grader is not None else {"reward": reward}
        results: list[VerifyResult] = []
        for start in range(0, max(len(items), 1), VERIFY_MAX_ITEMS):
            request["items"] = items[start:start + VERIFY_MAX_ITEMS]
            raw = self._http.call("POST", ["v1", "verify"], json_body=request)[1]
            results += [VerifyResult.from_json(line) for line in raw["results"]]
        return results

    def validate_graders(
        self, *, grader: dict[str, Any] | None = None, reward: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """`POST /v1/graders/validate`: the grader or reward checked as a submit would, run
        nothing; the graders as a job would use them."""
        request = {"grader": grader} if grader is not None else {"reward": reward}
        return self._http.call("POST", ["v1", "graders", "validate"], json_body=request)[1]

    # ---------------------------------------------------------------- pipelines and curricula

    def submit_pipeline(self, spec: SpecLike, *, idempotency_key: str | None = None) -> dict[str, Any]:
        """`POST /v1/pipelines`: `{"id", "created"}` (each stage's local data uploaded first)."""
        key = idempotency_key or f"rlvr-py-{uuid.uuid4().hex}"
        return self._http.call("POST", ["v1", "pipelines"], json_body=self.prepare_spec(spec),
                               headers={"Idempotency-Key": key}, expect=(200, 201))[1]

    def pipeline(self, pipeline_id: str) -> dict[str, Any]:
        return self._get("v1", "pipelines", pipeline_id)

    def pipelines(self) -> list[dict[str, Any]]:
        return self._list("pipelines", "v1", "pipelines")

    def cancel_pipeline(self, pipeline_id: str) -> dict[str, Any]:
        return self._http.call("DELETE", ["v1", "pipelines", pipeline_id])[1]

    def curricula(self) -> list[dict[str, Any]]:
        """`GET /v1/curricula`: the team's curricula and those shared with it."""
        return self._list("curricula", "v1", "curricula")

    def share_curriculum(self, name: str, readers: list[str]) -> dict[str, Any]:
        return self._http.call("PUT", ["v1", "curricula", name], json_body={"readers": readers})[1]

    def refresh_curriculum(self, name: str) -> dict[str, Any]:
        return self._http.call("POST", ["v1", "curricula", name, "refresh"])[1]

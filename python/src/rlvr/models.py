"""The API's answers as typed dataclasses. Each keeps the answer as it came in `raw`, so a field
a newer daemon adds is never lost to an older client."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: The states a job never leaves.
TERMINAL_STATES = frozenset({"published", "refused", "failed", "cancelled"})


def _get(raw: dict[str, Any], key: str, default: Any = None) -> Any:
    value = raw.get(key)
    return default if value is None else value


@dataclass
class Criterion:
    """One line of a gate report."""

    name: str
    #: `pass`, `fail` or `not_checked`.
    status: str
    measured: float | None
    threshold: float | None
    #: `>=` or `<=`: how `measured` must compare with `threshold`.
    op: str
    note: str
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Criterion:
        status = raw.get("status")
        if status is None:  # reports written before `status`
            passed = raw.get("passed")
            status = "fail" if passed is False else (
                "pass" if raw.get("measured") is not None and raw.get("threshold") is not None
                else "not_checked")
        return cls(raw["name"], status, raw.get("measured"), raw.get("threshold"),
                   _get(raw, "op", ">="), _get(raw, "note", ""), raw)


@dataclass
class GateReport:
    """A job's gate report: `passed`, what it was compared with, one line per criterion."""

    passed: bool
    criteria: list[Criterion]
    baseline: dict[str, Any] | None
    #: An admin's forced promotion, when there was one.
    forced: dict[str, Any] | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> GateReport:
        return cls(bool(raw.get("passed")), [Criterion.from_json(c) for c in raw.get("criteria") or []],
                   raw.get("baseline"), raw.get("forced"), raw)

    def failed(self) -> list[Criterion]:
        return [criterion for criterion in self.criteria if criterion.status == "fail"]


@dataclass
class Progress:
    """A running job's latest step: where it is and its figures (`None` where a step has none)."""

    step: int
    max_steps: int
    reward: float | None
    loss: float | None
    kl: float | None
    heldout: float | None
    tokens_per_s: float | None
    step_s: float | None
    #: Seconds until the job ends at this run's pace, within its wall-clock budget.
    eta_s: float | None
    #: Why it may not be learning: steps whose every group was all-fail or all-pass.
    warnings: list[dict[str, Any]]
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Progress:
        return cls(_get(raw, "step", 0), _get(raw, "max_steps", 0), raw.get("reward"), raw.get("loss"),
                   raw.get("kl"), raw.get("heldout"), raw.get("tokens_per_s"), raw.get("step_s"),
                   raw.get("eta_s"), _get(raw, "warnings", []), raw)


@dataclass
class LineVersion:
    """A published version of a model line: `line:LINE@VERSION` names it to a later job."""

    line: str
    version: int

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> LineVersion:
        return cls(raw["line"], raw["version"])


@dataclass
class JobOutput:
    """What a job published: a `checkpoint` (version `version` of model line `line`, at `path`) or
    a team `dataset` (`name`, pinned to `sha256`; a later spec names it `dataset:NAME@SHA256`)."""

    kind: str
    line: str | None = None
    version: int | None = None
    path: str | None = None
    name: str | None = None
    sha256: str | None = None

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> JobOutput:
        return cls(raw["kind"], raw.get("line"), raw.get("version"), raw.get("path"), raw.get("name"),
                   raw.get("sha256"))

    @property
    def reference(self) -> str:
        """How a later spec names it: `line:LINE@VERSION` or `dataset:NAME@SHA256`."""
        if self.kind == "dataset":
            return f"dataset:{self.name}@{self.sha256}"
        return f"line:{self.line}@{self.version}"


@dataclass
class Outcome:
    """How a job's training ended: its steps, its weights' hash, held-out before and after."""

    steps: int
    weights_sha256: str
    heldout_before: float | None
    heldout_after: float | None
    #: Why it stopped before its last step, when it did.
    stopped: str | None
    #: Stopped on a stop request with its state checkpointed: it resumes.
    interrupted: bool
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Outcome:
        return cls(_get(raw, "steps", 0), _get(raw, "weights_sha256", ""), raw.get("heldout_before"),
                   raw.get("heldout_after"), raw.get("stopped"), bool(raw.get("interrupted")), raw)


@dataclass
class Job:
    """A job as `GET /v1/jobs/{id}` shows it (also a `progress` event's data)."""

    id: str
    team: str
    name: str
    model_line: str
    #: What kind of job it is (`online_groups`, `offline_sft`, `reward_model`, `distill`, …),
    #: decided at submit; None for a job submitted before the daemon recorded it.
    kind: str | None
    priority: str
    state: str
    step: int
    max_steps: int
    #: Why it is in this state (empty when nothing needs saying).
    reason: str
    created_at: str
    updated_at: str
    #: The latest step's figures once training has begun.
    progress: Progress | None
    heldout: float | None
    #: How training ended, once it has.
    result: Outcome | None
    gates: GateReport | None
    #: What it published: a checkpoint or a team dataset.
    output: JobOutput | None
    #: The model line and version it published (`output`'s, for a checkpoint).
    published_version: LineVersion | None
    cancel_requested: bool
    raw: dict[str, Any] = field(repr=False)
    #: Set by `Client.submit`: false when an earlier submit with the same idempotency key made
    #: this job. None elsewhere.
    created: bool | None = None

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Job:
        gates, progress, result = raw.get("gates"), raw.get("progress"), raw.get("result")
        published, output = raw.get("published_version"), raw.get("output")
        return cls(
            id=raw["id"], team=_get(raw, "team", ""), name=_get(raw, "name", ""),
            model_line=_get(raw, "model_line", ""), kind=raw.get("kind"),
            priority=_get(raw, "priority", ""),
            state=raw["state"], step=_get(raw, "step", 0), max_steps=_get(raw, "max_steps", 0),
            reason=_get(raw, "reason", ""), created_at=_get(raw, "created_at", ""),
            updated_at=_get(raw, "updated_at", ""),
            progress=Progress.from_json(progress) if progress else None,
            heldout=raw.get("heldout"), result=Outcome.from_json(result) if result else None,
            gates=GateReport.from_json(gates) if gates else None,
            output=JobOutput.from_json(output) if output else None,
            published_version=LineVersion.from_json(published) if published else None,
            cancel_requested=bool(raw.get("cancel_requested")), raw=raw,
        )

    @property
    def ended(self) -> bool:
        """Nothing happens to the job any more."""
        return self.state in TERMINAL_STATES


@dataclass
class JobEvent:
    """One change of a job's state (a `state` event of its stream)."""

    #: The stream entry id: where a reconnect resumes (`Last-Event-ID`).
    id: str
    at: str
    state: str
    reason: str
    step: int
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> JobEvent:
        return cls(raw["id"], _get(raw, "at", ""), raw["state"], _get(raw, "reason", ""),
                   _get(raw, "step", 0), raw)

    @property
    def ended(self) -> bool:
        return self.state in TERMINAL_STATES


@dataclass
class JobPage:
    """One answer of `GET /v1/jobs`: newest first, and the cursor of the next page (None: the
    last)."""

    jobs: list[Job]
    next: str | None
    raw: dict[str, Any] = field(repr=False)


@dataclass
class MetricsLine:
    """One line of a job's metrics: a step's figures, or a held-out evaluation. The figures a
    job logs depend on its optimizer; all of them are in `raw`."""

    step: int
    reward_mean: float | None
    passed_frac: float | None
    kl_ref: float | None
    loss: float | None
    #: A held-out evaluation's figures: `accuracy`, `reward_mean`, `completion_len_mean`,
    #: `prompts`.
    heldout: dict[str, Any] | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> MetricsLine:
        return cls(_get(raw, "step", 0), raw.get("reward_mean"), raw.get("passed_frac"),
                   raw.get("kl_ref"), raw.get("loss"), raw.get("heldout"), raw)

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)


@dataclass
class JobLog:
    """A window of whole lines of a job's worker log; ask again with `since=end` to follow."""

    start: int
    end: int
    size: int
    text: str

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> JobLog:
        return cls(raw["start"], raw["end"], raw["size"], raw["text"])


@dataclass
class Dataset:
    """A team's dataset: a name pointing at content, named in a spec as `dataset:NAME@SHA256`."""

    name: str
    sha256: str
    bytes: int
    records: int
    uploaded_at: str
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Dataset:
        return cls(raw["name"], raw["sha256"], _get(raw, "bytes", 0), _get(raw, "records", 0),
                   _get(raw, "uploaded_at", ""), raw)

    @property
    def ref(self) -> str:
        """How a spec's data field names this content: `dataset:NAME@SHA256`."""
        return f"dataset:{self.name}@{self.sha256}"


@dataclass
class ModelLine:
    """A model line: its owner, who may read and publish into it, its gate policy and its
    published versions (oldest first)."""

    name: str
    owner: str
    readers: list[str]
    publishers: list[str]
    policy: dict[str, Any]
    versions: list[int]
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ModelLine:
        return cls(raw["name"], _get(raw, "owner", ""), _get(raw, "readers", []),
                   _get(raw, "publishers", []), _get(raw, "policy", {}), _get(raw, "versions", []), raw)


@dataclass
class Manifest:
    """A published version's manifest: what trained it, its gates, and the SHA-256 of each of its
    files (`files`, by file name)."""

    job_id: str
    model_line: str
    version: int
    step: int
    weights_sha256: str
    files: dict[str, str]
    gates: GateReport | None
    spec: dict[str, Any]
    published_at: str
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Manifest:
        gates = raw.get("gates")
        return cls(raw["job_id"], raw["model_line"], raw["version"], _get(raw, "step", 0),
                   _get(raw, "weights_sha256", ""), _get(raw, "files", {}),
                   GateReport.from_json(gates) if gates else None, _get(raw, "spec", {}),
                   _get(raw, "published_at", ""), raw)


@dataclass
class Plugin:
    """A loaded plugin."""

    #: `name@version`, what jobs pin.
    id: str
    name: str
    version: str
    #: `verifier`, `optimizer` or `curriculum`.
    kind: str
    description: str
    sha256: str
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Plugin:
        return cls(raw["id"], raw["name"], raw["version"], raw["kind"], _get(raw, "description", ""),
                   _get(raw, "sha256", ""), raw)


@dataclass
class PluginList:
    """The loaded plugins, and the files the daemon refused (`{source, reason, message, at}`)."""

    plugins: list[Plugin]
    refused: list[dict[str, Any]]
    raw: dict[str, Any] = field(repr=False)


@dataclass
class VerifyResult:
    """One graded item of `POST /v1/verify`, in the items' order."""

    id: str | None
    score: float
    passed: bool
    components: dict[str, float]
    extracted: str | None
    error: str | None
    #: `name@version` of the verifier that judged it (`reward` for a formula's line).
    verifier: str
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> VerifyResult:
        return cls(raw.get("id"), raw["score"], bool(raw.get("passed")), _get(raw, "components", {}),
                   raw.get("extracted"), raw.get("error"), _get(raw, "verifier", ""), raw)

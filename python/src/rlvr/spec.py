"""Job specs on this side: a spec file read (TOML, or JSON when it ends in .json), a small builder,
and the local data files a spec names found, to be uploaded as the team's datasets before the
submit, as `rlvrctl submit` does: the daemon reads no path a spec writes, so
`train = "data/train.jsonl"` (relative to the spec file's directory) is uploaded and submitted as
`train = "dataset:train@<sha256>"`."""

from __future__ import annotations

import copy
import json
import os
import stat
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import SpecError

#: The data fields that may name local files.
DATA_KEYS = ("train", "heldout", "canaries")
#: A pipeline stage's input that is the stage before's output, not a file.
PREVIOUS = "previous"
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def read_spec_file(path: str | os.PathLike[str]) -> tuple[dict[str, Any], Path]:
    """The spec in a file as a dict, and the directory its relative data paths are read from."""
    path = Path(path)
    try:
        with open(path, "rb") as file:
            if path.suffix.lower() == ".json":
                spec = json.load(file)
            else:
                spec = tomllib.load(file)
    except OSError as error:
        raise SpecError(f"cannot read {path}: {error.strerror or error}") from None
    except ValueError as error:  # TOMLDecodeError and JSONDecodeError are ValueErrors
        kind = "JSON" if path.suffix.lower() == ".json" else "TOML"
        raise SpecError(f"{path}: not valid {kind}: {error}") from None
    if not isinstance(spec, dict):
        raise SpecError(f"{path}: expected a table of sections")
    return spec, path.resolve().parent


def dataset_name(path: str | os.PathLike[str], key: str) -> str:
    """The dataset name for a local file: its stem with anything outside the name rule replaced by
    `-` (`train.jsonl` → `train`), or the key when nothing usable is left (as rlvrctl names it)."""
    stem = Path(path).stem
    name = "".join(c if c in _NAME_CHARS else "-" for c in stem)[:64].lstrip(".")
    return name or key


@dataclass(frozen=True)
class LocalData:
    """A data field of a spec that names a local file."""

    #: Where in the spec: (`data` section's owner path, key): `("data", "train")` or
    #: `("stages.0.data", "train")`.
    field: str
    key: str
    path: Path


def _data_sections(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """A job spec's `[data]`, or each stage's of a pipeline spec (`[[stages]]`)."""
    data = spec.get("data")
    if isinstance(data, dict):
        yield "data", data
    stages = spec.get("stages")
    if isinstance(stages, list):
        for index, stage in enumerate(stages):
            if isinstance(stage, dict) and isinstance(stage.get("data"), dict):
                yield f"stages.{index}.data", stage["data"]


def local_data(spec: dict[str, Any], base: Path) -> list[LocalData]:
    """The local files `spec`'s data fields name, read relative to `base`; each must be a regular
    file (a device or a FIFO would be read until memory runs out)."""
    found = []
    for owner, data in _data_sections(spec):
        for key in DATA_KEYS:
            value = data.get(key)
            if not isinstance(value, str) or value.startswith(("dataset:", "root:")) or value == PREVIOUS:
                continue
            field = f"{owner}.{key}"
            path = base / os.path.expanduser(value)
            try:
                mode = os.stat(path).st_mode
            except OSError as error:
                raise SpecError(f"{field}: cannot read {path}: {error.strerror or error}", field) from None
            if not stat.S_ISREG(mode):
                raise SpecError(f"{field}: cannot read {path}: not a regular file", field)
            found.append(LocalData(field, key, path))
    return found


def with_datasets(
    spec: dict[str, Any], base: Path, upload: Callable[[str, Path], str]
) -> dict[str, Any]:
    """A copy of `spec` whose local data files are uploaded by `upload(name, path)` (which returns
    the `dataset:NAME@SHA256` to name instead). `spec` itself is left as it is."""
    spec = copy.deepcopy(spec)
    files = {item.field: item for item in local_data(spec, base)}
    for owner, data in _data_sections(spec):
        for key in DATA_KEYS:
            item = files.get(f"{owner}.{key}")
            if item is not None:
                data[key] = upload(dataset_name(item.path, key), item.path)
    return spec


class SpecBuilder:
    """A job spec built in code, section by section; `to_dict()` is what `Client.submit` sends.

        spec = (rlvr.SpecBuilder("arith", team="ml", model_line="tiny-arith", policy="builtin:tiny-arith")
                .data(train="data/train.jsonl", heldout="data/heldout.jsonl")
                .optimizer("grpo", group_size=4, lr=1e-3)
                .verifier("math", fallback="last")
                .section("budget", max_steps=20))

    Data paths are read relative to the directory the submit runs in. Nothing is checked here:
    `Client.dry_run` asks the daemon, which judges every field. Without `team`, the job runs for
    the team of the token that submits it.
    """

    def __init__(self, name: str, *, model_line: str, policy: str, team: str | None = None, **job: Any):
        named = {"team": team} if team is not None else {}
        self._spec: dict[str, Any] = {"job": {"name": name, **named, "model_line": model_line, **job},
                                      "model": {"policy": policy}}

    def section(self, name: str, **keys: Any) -> SpecBuilder:
        """Sets keys of a section (`[budget]`, `[rollout]`, `[gates]`, …), keeping its others."""
        self._spec.setdefault(name, {}).update(keys)
        return self

    def data(self, **keys: Any) -> SpecBuilder:
        return self.section("data", **keys)

    def optimizer(self, plugin: str, **keys: Any) -> SpecBuilder:
        return self.section("optimizer", plugin=plugin, **keys)

    def verifier(self, plugin: str, **options: Any) -> SpecBuilder:
        """Adds one `[[verifiers]]` entry."""
        self._spec.setdefault("verifiers", []).append({"plugin": plugin, **options})
        return self

    def rollout(self, **keys: Any) -> SpecBuilder:
        return self.section("rollout", **keys)

    def budget(self, **keys: Any) -> SpecBuilder:
        return self.section("budget", **keys)

    def gates(self, **keys: Any) -> SpecBuilder:
        return self.section("gates", **keys)

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self._spec)

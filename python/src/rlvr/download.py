"""A published model version downloaded into a directory: every file its manifest names, each
checked against the manifest's SHA-256 as it is written, into a temporary directory renamed into
place at the end, so the directory either holds the whole, checked version or does not exist."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from .errors import BadAnswer, IntegrityError
from .models import Manifest

MANIFEST_FILE = "manifest.json"
_CHUNK = 1 << 20


def _checked_name(name: str) -> str:
    """A manifest's file name, refused unless it is a plain name: a manifest must not write
    outside the directory (`../x`, `/etc/x`), nor over the manifest itself."""
    if (not name or name in (".", "..", MANIFEST_FILE) or "/" in name or "\\" in name or "\0" in name
            or name != os.path.basename(name)):
        raise BadAnswer(f"the manifest names a file that cannot be one: {name!r}")
    return name


def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify_files(directory: str | os.PathLike[str], manifest: Manifest | None = None) -> Manifest:
    """Checks that `directory` holds every file of `manifest` (else its own `manifest.json`) with
    the SHA-256 the manifest names; raises `IntegrityError` naming the first that does not."""
    directory = Path(directory)
    if manifest is None:
        with open(directory / MANIFEST_FILE, encoding="utf-8") as file:
            manifest = Manifest.from_json(json.load(file))
    for name, expected in sorted(manifest.files.items()):
        path = directory / _checked_name(name)
        got = sha256_file(path) if path.is_file() else "(missing)"
        if got != expected.lower():
            raise IntegrityError(name, expected, got)
    return manifest


def download_into(
    target: str | os.PathLike[str],
    manifest: Manifest,
    open_file: Callable[[str], IO[bytes]],
) -> Path:
    """Writes `manifest`'s files (each read from `open_file(name)`) and the manifest into the new
    directory `target`; nothing is left behind on failure."""
    target = Path(target)
    if target.exists():
        raise FileExistsError(f"{target}: already exists; download into a new directory")
    names = {_checked_name(name): sha for name, sha in manifest.files.items()}
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.part-", dir=target.parent))
    try:
        for name, expected in sorted(names.items()):
            digest = hashlib.sha256()
            with open_file(name) as source, open(staging / name, "wb") as sink:
                while chunk := source.read(_CHUNK):
                    digest.update(chunk)
                    sink.write(chunk)
                sink.flush()
                os.fsync(sink.fileno())
            if digest.hexdigest() != expected.lower():
                raise IntegrityError(name, expected, digest.hexdigest())
        with open(staging / MANIFEST_FILE, "w", encoding="utf-8") as file:
            json.dump(manifest.raw, file, indent=2)
            file.write("\n")
        os.chmod(staging, 0o755)
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target

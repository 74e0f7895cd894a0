#!/usr/bin/env python3
"""Lets a kept target directory serve a new clone: cargo decides whether a workspace crate is
fresh by comparing its source files' modification times with its last build, and a clone gives
every file the time of the clone, so without this every workspace crate (and every test binary)
compiles again even when not a byte changed.

  source-mtimes.py record MANIFEST   after a successful build: each tracked file's sha256 and
                                     modification time, written whole (temp file, rename)
  source-mtimes.py restore MANIFEST  before the build: each tracked file whose content is the
                                     one recorded gets its recorded time back; a changed, new or
                                     deleted file keeps the clone's time, so cargo rebuilds what
                                     depends on it. The manifest is consumed: a build that fails
                                     records none, and the next run restores nothing (it rebuilds
                                     the workspace's crates rather than trust a half-done build).

Content, not commit times, decides: a commit's time says nothing about when the kept artefacts
were built, and trusting it could pass off an old build as fresh.
"""

import hashlib
import os
import subprocess
import sys


def tracked_files(root):
    listing = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True, check=True).stdout
    for raw in listing.split(b"\0"):
        path = raw.decode("utf-8", "surrogateescape")
        # Tabs and newlines would break the manifest's lines; no source file has them.
        if path and "\t" not in path and "\n" not in path:
            yield path


def sha256(path):
    with open(path, "rb") as file:
        return hashlib.sha256(file.read()).hexdigest()


def is_plain_file(path):
    return os.path.isfile(path) and not os.path.islink(path)


def record(root, manifest):
    lines = []
    for path in tracked_files(root):
        full = os.path.join(root, path)
        if is_plain_file(full):
            lines.append(f"{sha256(full)}\t{os.stat(full).st_mtime_ns}\t{path}\n")
    partial = manifest + ".partial"
    with open(partial, "w", encoding="utf-8", errors="surrogateescape") as out:
        out.writelines(lines)
    os.replace(partial, manifest)
    print(f"recorded the content and time of {len(lines)} source files in {manifest}")


def restore(root, manifest):
    try:
        with open(manifest, encoding="utf-8", errors="surrogateescape") as file:
            entries = [line.rstrip("\n").split("\t", 2) for line in file]
    except FileNotFoundError:
        print(f"no {manifest}: the workspace's crates build again")
        return
    os.remove(manifest)
    restored = changed = 0
    for digest, mtime_ns, path in entries:
        full = os.path.join(root, path)
        if not is_plain_file(full):
            continue
        if sha256(full) == digest:
            os.utime(full, ns=(int(mtime_ns), int(mtime_ns)))
            restored += 1
        else:
            changed += 1
    print(f"{restored} source files unchanged since the kept build (their times restored), {changed} changed")


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("record", "restore"):
        sys.exit("usage: source-mtimes.py record|restore MANIFEST")
    root = subprocess.run(
        ["git", "rev-parse", "--show-toplevel"], capture_output=True, check=True, text=True
    ).stdout.strip()
    (record if sys.argv[1] == "record" else restore)(root, os.path.abspath(sys.argv[2]))


if __name__ == "__main__":
    main()

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

Directories count too: a build script that watches one (`rerun-if-changed=../examples/jobs`) is
rerun when any entry under it, the directory itself included, is newer than the last build. A
directory whose tracked entries are the ones recorded gets its recorded time back; one with an
entry added, removed or renamed keeps the clone's.

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


def tracked_directories(files):
    """Each directory holding tracked files (the root aside), with the sorted names of its tracked
    entries, files and directories."""
    entries = {}
    for path in files:
        parts = path.split("/")
        for depth in range(1, len(parts)):
            entries.setdefault("/".join(parts[:depth]), set()).add(parts[depth])
    return {directory: sorted(names) for directory, names in entries.items()}


def listing_digest(names):
    return hashlib.sha256("\0".join(names).encode("utf-8", "surrogateescape")).hexdigest()


def sha256(path):
    with open(path, "rb") as file:
        return hashlib.sha256(file.read()).hexdigest()


def is_plain_file(path):
    return os.path.isfile(path) and not os.path.islink(path)


def record(root, manifest):
    lines = []
    files = list(tracked_files(root))
    for path in files:
        full = os.path.join(root, path)
        if is_plain_file(full):
            lines.append(f"{sha256(full)}\t{os.stat(full).st_mtime_ns}\t{path}\n")
    file_count = len(lines)
    for directory, names in tracked_directories(files).items():
        full = os.path.join(root, directory)
        if os.path.isdir(full) and not os.path.islink(full):
            lines.append(f"{listing_digest(names)}\t{os.stat(full).st_mtime_ns}\t{directory}/\n")
    partial = manifest + ".partial"
    with open(partial, "w", encoding="utf-8", errors="surrogateescape") as out:
        out.writelines(lines)
    os.replace(partial, manifest)
    print(
        f"recorded the content and time of {file_count} source files and the entries and time of "
        f"{len(lines) - file_count} directories in {manifest}"
    )


def restore(root, manifest):
    try:
        with open(manifest, encoding="utf-8", errors="surrogateescape") as file:
            entries = [line.rstrip("\n").split("\t", 2) for line in file]
    except FileNotFoundError:
        print(f"no {manifest}: the workspace's crates build again")
        return
    os.remove(manifest)
    restored = changed = 0
    recorded_directories = []
    for digest, mtime_ns, path in entries:
        if path.endswith("/"):
            recorded_directories.append((digest, int(mtime_ns), path.rstrip("/")))
            continue
        full = os.path.join(root, path)
        if not is_plain_file(full):
            continue
        if sha256(full) == digest:
            os.utime(full, ns=(int(mtime_ns), int(mtime_ns)))
            restored += 1
        else:
            changed += 1
    listings = tracked_directories(tracked_files(root))
    directories_restored = directories_changed = 0
    for digest, mtime_ns, directory in recorded_directories:
        full = os.path.join(root, directory)
        if directory not in listings or os.path.islink(full) or not os.path.isdir(full):
            continue
        if listing_digest(listings[directory]) == digest:
            os.utime(full, ns=(mtime_ns, mtime_ns))
            directories_restored += 1
        else:
            directories_changed += 1
    print(
        f"{restored} source files unchanged since the kept build (their times restored), {changed} changed; "
        f"{directories_restored} directories with the same entries, {directories_changed} changed"
    )


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("record", "restore"):
        sys.exit("usage: source-mtimes.py record|restore MANIFEST")
    root = subprocess.run(
        ["git", "rev-parse", "--show-toplevel"], capture_output=True, check=True, text=True
    ).stdout.strip()
    (record if sys.argv[1] == "record" else restore)(root, os.path.abspath(sys.argv[2]))


if __name__ == "__main__":
    main()

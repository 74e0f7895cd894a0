# Sourced by the project's scripts: where the project cache is, and how to get set up.
# shellcheck shell=bash

RLVR_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RLVR_CACHE_DIR=${RLVR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rlvr}
export RLVR_CACHE_DIR

# Installs what is missing (scripts/setup.sh) and loads its env file into this shell.
rlvr_setup() {
    "$RLVR_ROOT/scripts/setup.sh"
    # shellcheck disable=SC1091
    source "$RLVR_CACHE_DIR/env.sh"
}

# A heading on stderr, with the seconds since the script started (a log then shows what each phase
# took): bold on a terminal without NO_COLOR, plain text in a log file or CI.
step() {
    if [ -t 2 ] && [ -z "${NO_COLOR:-}" ]; then
        printf '\n\033[1m== %s\033[0m  (%d s)\n' "$*" "$SECONDS" >&2
    else
        printf '\n== %s  (%d s)\n' "$*" "$SECONDS" >&2
    fi
}

# A scratch directory for a benchmark, in $work: removed when the script exits, or kept (and
# named) when $keep is 1 (`--keep`).
bench_work_dir() {
    work=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
    trap bench_work_dir_cleanup EXIT
}

# shellcheck disable=SC2317  # run by the EXIT trap
bench_work_dir_cleanup() {
    if [ "${keep:-0}" = 1 ]; then
        echo "work directory kept: $work" >&2
    else
        rm -rf "$work"
    fi
}

# pip install into the venv whose python is $1; the other arguments are pip's. Quiet, and without
# byte-compiling (--no-compile): the first import writes the .pyc of each module a test uses, while
# compiling all ~50,000 files of the peers' venvs up front cost ~170 s of CPU beside the build on a
# fresh cache (measured: 27 s of it for the MLflow venv's 9,142 files).
pip_install() {
    local python=$1
    shift
    "$python" -m pip install --quiet --disable-pip-version-check --no-compile "$@"
}

# Whether the venv python $1 has every `name==version` pin of the lock file $2 (hashed or not)
# installed at that version (read from the packages' metadata, without importing them).
pins_installed() {
    [ -x "$1" ] && "$1" - "$2" <<'PY' 2>/dev/null
import importlib.metadata as m, sys
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, version = line.split()[0].split("==")
    if m.version(name) != version:
        sys.exit(1)
PY
}

# Points CARGO_TARGET_DIR at $RLVR_CACHE_DIR/target/<key>, a target directory that later runs on
# this machine reuse (scripts/test.sh with RLVR_TARGET_CACHE=1). The key hashes what a build's
# artefacts depend on beyond the sources cargo tracks itself: the toolchain, Cargo.lock, the torch
# the binaries link, and the machine — its id and the Debian packages a build uses (the C and C++
# compilers, the linker, the C and C++ libraries, Python) — so another machine, or this one after
# one of those changed, starts from nothing and a missing install step fails there as on a fresh
# machine. Packages the build does not use stay out of the key: the first run installs Chromium
# for the web page's test after the key is taken, and hashing it made the second run on a new
# machine compile every crate again (as did installing any tool). Directories of other keys are
# removed: one cache at a time.
use_target_cache() {
    local key
    key=$(
        {
            rustc -vV
            cat "$RLVR_ROOT/Cargo.lock"
            "$RLVR_VENV/bin/python" -c 'import importlib.metadata as m; print("torch", m.version("torch"))'
            cat /etc/machine-id 2>/dev/null || hostname
            dpkg-query -W -f '${Package} ${Version}\n' 2>/dev/null \
                | grep -E '^((gcc|g\+\+|cpp|binutils|libc6|libc-dev|linux-libc-dev|libstdc\+\+|libgcc|libpython3)[^ ]*|python3(\.[0-9]+)?(-minimal|-dev|-venv)?) ' \
                || true
        } | sha256sum | cut -c1-16
    )
    mkdir -p "$RLVR_CACHE_DIR/target"
    local other
    for other in "$RLVR_CACHE_DIR"/target/*; do
        [ -d "$other" ] && [ "$(basename "$other")" != "$key" ] && rm -rf "$other"
    done
    export CARGO_TARGET_DIR=$RLVR_CACHE_DIR/target/$key
}

# Whether process $1 still runs (a zombie, dead but not yet reaped, does not count).
process_running() {
    [ -e "/proc/$1" ] && ! grep -q ') Z ' "/proc/$1/stat" 2>/dev/null
}

# Stops this shell's children whose pids are the arguments, the last first (the reverse of their
# start order): SIGTERM, and SIGKILL for whatever has not stopped after 5 seconds.
stop_in_reverse() {
    local i pid
    for ((i = $#; i >= 1; i--)); do
        pid=${!i}
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 50); do process_running "$pid" || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
}

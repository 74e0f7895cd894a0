#!/usr/bin/env bash
# Installs what rlvr needs and is missing, then writes the env file the other scripts source.
#
# Idempotent: a second run checks, finds everything in place, and takes seconds with no download.
#   - a Python venv in the project cache with torch==2.11.0 from PyPI (libtorch for tch 0.24)
#   - a second venv with schemathesis==4.32.5 from PyPI (the API's schema test runs its CLI); its
#     own, so nothing it pulls in can change the Python the binaries link
#   - redis-server from Debian's packages, when none is on PATH
#   - g++ (for the libtorch bindings), systemd-analyze (for the unit's test) and valgrind (the
#     worker's memory check), when missing
#   - cargo-nextest (scripts/test.sh's test runner) from crates.io, when cargo has none
#   - mdBook (the book in docs/) from crates.io, into the cache, when it has none
# pip byte-compiles nothing (--no-compile, as scripts/lib.sh's pip_install): a module's first import
# does it, for the modules something uses.
# The env file ($RLVR_CACHE_DIR/env.sh) exports LIBTORCH_USE_PYTORCH=1, the venv on PATH and the
# libtorch library path, so `cargo build` and the binaries find libtorch.
set -euo pipefail

TORCH_VERSION=2.11.0
SCHEMATHESIS_VERSION=4.32.5
NEXTEST_VERSION=0.9.143
MDBOOK_VERSION=0.5.4
CACHE_DIR=${RLVR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rlvr}  # keep in step with scripts/lib.sh
VENV=$CACHE_DIR/venv
SCHEMATHESIS_VENV=$CACHE_DIR/venvs/schemathesis
ENV_FILE=$CACHE_DIR/env.sh

say() { printf '[setup] %s\n' "$*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

mkdir -p "$CACHE_DIR"

# --- Python venv with torch -------------------------------------------------------------------
# The code verifier runs solutions with the system interpreter, /usr/bin/python3 (its default
# `python` key), so that one must exist even when another python3 comes first on PATH.
if [ ! -x /usr/bin/python3 ]; then
    say "no /usr/bin/python3: installing python3 and python3-venv from Debian's packages"
    as_root apt-get update -qq
    as_root apt-get install -y -qq python3 python3-venv
fi
python_bin=${RLVR_PYTHON:-$(command -v python3 || echo /usr/bin/python3)}

# Creates the venv $1 unless it has a python, installing python3-venv when `-m venv` fails.
make_venv() {
    [ -x "$1/bin/python" ] && return 0
    say "creating venv $1"
    mkdir -p "$(dirname "$1")"
    if ! "$python_bin" -m venv "$1" 2>/dev/null; then
        say "python3 -m venv failed: installing python3-venv from Debian's packages"
        as_root apt-get update -qq
        as_root apt-get install -y -qq python3-venv
        rm -rf "$1"
        "$python_bin" -m venv "$1"
    fi
}

torch_installed() {
    [ -x "$VENV/bin/python" ] &&
        [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null)" = "$TORCH_VERSION" ]
}

if torch_installed; then
    say "torch $TORCH_VERSION already in $VENV"
else
    make_venv "$VENV"
    say "installing torch==$TORCH_VERSION from PyPI into $VENV (about a minute, ~5 GB)"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile "torch==$TORCH_VERSION"
    torch_installed || { say "torch $TORCH_VERSION did not install into $VENV"; exit 1; }
fi
torch_lib=$(cd "$VENV" && echo "$VENV"/lib/python3*/site-packages/torch/lib)
[ -d "$torch_lib" ] || { say "expected libtorch under $torch_lib, found nothing"; exit 1; }

# --- Schemathesis, in a venv of its own ------------------------------------------------------------
schemathesis_installed() {
    [ -x "$SCHEMATHESIS_VENV/bin/st" ] &&
        [ "$("$SCHEMATHESIS_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("schemathesis"))' 2>/dev/null)" = "$SCHEMATHESIS_VERSION" ]
}

if schemathesis_installed; then
    say "schemathesis $SCHEMATHESIS_VERSION already in $SCHEMATHESIS_VENV"
else
    make_venv "$SCHEMATHESIS_VENV"
    say "installing schemathesis==$SCHEMATHESIS_VERSION from PyPI into $SCHEMATHESIS_VENV"
    "$SCHEMATHESIS_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile "schemathesis==$SCHEMATHESIS_VERSION"
    schemathesis_installed || { say "schemathesis $SCHEMATHESIS_VERSION did not install into $SCHEMATHESIS_VENV"; exit 1; }
fi

# --- Redis ------------------------------------------------------------------------------------
redis_bin=${RLVR_REDIS_SERVER:-$(command -v redis-server || true)}
if [ -z "$redis_bin" ] && [ -x /usr/bin/redis-server ]; then redis_bin=/usr/bin/redis-server; fi
if [ -z "$redis_bin" ]; then
    say "no redis-server found: installing it from Debian's packages"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends redis-server
    redis_bin=$(command -v redis-server || echo /usr/bin/redis-server)
fi
[ -x "$redis_bin" ] || { say "redis-server not executable at $redis_bin"; exit 1; }
say "redis-server: $redis_bin"

# --- a C++ compiler (torch-sys compiles its libtorch wrapper) --------------------------------------
if ! command -v g++ >/dev/null 2>&1; then
    say "no g++ found: installing g++ from Debian's packages (the libtorch bindings are C++)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends g++
fi

# --- systemd-analyze (the unit's test runs `systemd-analyze verify`) ------------------------------
if ! command -v systemd-analyze >/dev/null 2>&1; then
    say "no systemd-analyze found: installing systemd from Debian's packages"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends systemd
fi

# --- valgrind (the worker's training path runs under memcheck in the tests) -------------------
if ! command -v valgrind >/dev/null 2>&1; then
    say "no valgrind found: installing it from Debian's packages (the memory check of the worker)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends valgrind
fi

# --- cargo-nextest (the test runner of scripts/test.sh) -------------------------------------------
if cargo nextest --version >/dev/null 2>&1; then
    say "$(cargo nextest --version 2>/dev/null | head -n 1)"
else
    say "no cargo-nextest found: building cargo-nextest $NEXTEST_VERSION from crates.io (a few minutes, once)"
    cargo install --locked --quiet cargo-nextest --version "$NEXTEST_VERSION"
    cargo nextest --version >/dev/null 2>&1 || { say "cargo-nextest did not install"; exit 1; }
fi

# --- mdBook (the book in docs/: scripts/test.sh builds it, a test checks its links) --------------
MDBOOK=$CACHE_DIR/tools/mdbook-$MDBOOK_VERSION/bin/mdbook
if "$MDBOOK" --version >/dev/null 2>&1; then
    say "$("$MDBOOK" --version)"
else
    say "no mdbook $MDBOOK_VERSION in the cache: building it from crates.io (a few minutes, once)"
    # Without the live-reload server and the file watcher: `build` is all the scripts run.
    cargo install --locked --quiet mdbook --version "$MDBOOK_VERSION" --no-default-features \
        --features search --root "$CACHE_DIR/tools/mdbook-$MDBOOK_VERSION"
    "$MDBOOK" --version >/dev/null 2>&1 || { say "mdbook did not install"; exit 1; }
fi

# --- env file ---------------------------------------------------------------------------------
tmp=$(mktemp "$CACHE_DIR/env.sh.XXXXXX")
cat >"$tmp" <<ENV
# Written by scripts/setup.sh; sourced by scripts/test.sh and scripts/demo.sh.
export RLVR_CACHE_DIR="$CACHE_DIR"
export RLVR_VENV="$VENV"
export RLVR_REDIS_SERVER="$redis_bin"
export RLVR_SCHEMATHESIS="$SCHEMATHESIS_VENV/bin/st"
export RLVR_MDBOOK="$MDBOOK"
export LIBTORCH_USE_PYTORCH=1
export PYTHON_SYS_EXECUTABLE="$VENV/bin/python"
export PATH="$VENV/bin:\$PATH"
export LD_LIBRARY_PATH="$torch_lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
ENV
mv "$tmp" "$ENV_FILE"
say "env file: $ENV_FILE"

#!/usr/bin/env bash
# Makes OpenEnv's venv and prints its python.
#
#   $RLVR_CACHE_DIR/venvs/openenv/   engines/openenv/requirements.lock (openenv 0.10.0 and its
#                                    dependencies, hashed), installed exactly, --no-deps
#
# Environment servers run on it: an `[env]` job's sidecar, and the environments of the tests
# (`python -m uvicorn ...` over `openenv.core.env_server`). Nothing of it goes into the project
# venv. Idempotent: a second run finds every pin and prints the python at once. Progress goes to
# stderr; stdout is only the python's path.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

VENV=$RLVR_CACHE_DIR/venvs/openenv
python=$VENV/bin/python
LOCK=$RLVR_ROOT/engines/openenv/requirements.lock

installed() {
    pins_installed "$python" "$LOCK" &&
        "$python" -c "import openenv" 2>/dev/null
}

mkdir -p "$RLVR_CACHE_DIR/venvs"
exec 9>"$RLVR_CACHE_DIR/venvs/.openenv.lock"
flock 9
if installed; then
    echo "$python"
    exit 0
fi

step "OpenEnv in $VENV (engines/openenv/requirements.lock)"
rm -rf "$VENV"
/usr/bin/python3 -m venv "$VENV"
pip_install "$python" --no-deps --ignore-installed --require-hashes -r "$LOCK" >&2
installed || { echo "OpenEnv did not install into $VENV at the lock's versions" >&2; exit 1; }
echo "$python"

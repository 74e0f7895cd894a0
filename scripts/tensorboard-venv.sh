#!/usr/bin/env bash
# Makes the venv TensorBoard runs from, and prints its python.
#
#   $RLVR_CACHE_DIR/venvs/tensorboard/   scripts/tensorboard-requirements.lock (tensorboard 2.21.0
#                                        and its dependencies), installed exactly, --no-deps
#
# The jobs' event files (`<state_dir>/jobs/<id>/run/tensorboard/`) are read with it:
# `"$(dirname "$(scripts/tensorboard-venv.sh)")/tensorboard" --logdir <state_dir>/jobs`, and
# tests/tests/tensorboard.rs reads a run's files with TensorBoard's own loader. Nothing of it goes
# into the project venv. Idempotent: a second run finds every pin and prints the python at once.
# Progress goes to stderr; stdout is only the python's path.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

VENV=$RLVR_CACHE_DIR/venvs/tensorboard
python=$VENV/bin/python
LOCK=$RLVR_ROOT/scripts/tensorboard-requirements.lock

installed() {
    pins_installed "$python" "$LOCK" &&
        "$python" -c "from tensorboard.backend.event_processing import event_accumulator" 2>/dev/null
}

mkdir -p "$RLVR_CACHE_DIR/venvs"
exec 9>"$RLVR_CACHE_DIR/venvs/.tensorboard.lock"
flock 9
if installed; then
    echo "$python"
    exit 0
fi

step "TensorBoard in $VENV (scripts/tensorboard-requirements.lock)"
[ -x "$python" ] || /usr/bin/python3 -m venv "$VENV"
pip_install "$python" --no-deps -r "$LOCK" >&2
installed || { echo "tensorboard did not install into $VENV at the lock's versions" >&2; exit 1; }
echo "$python"

#!/usr/bin/env bash
# Makes the venv of the MLflow tracking server the [tracking] tests start, and prints its python.
#
#   $RLVR_CACHE_DIR/venvs/mlflow/   mlflow 3.17.2 (the full package: mlflow-skinny has no server),
#                                   scripts/mlflow-venv.lock installed exactly, --no-deps
#                                   (about 850 MB; 90 s on 2 cores from PyPI wheels)
#
# `bin/mlflow server` beside the python printed is what tests/tests/mlflow.rs runs. MLflow stays
# out of the project venv. Idempotent: a second run finds every pin and prints the python at once.
# Progress goes to stderr; stdout is only the python's path.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

VENV=$RLVR_CACHE_DIR/venvs/mlflow
python=$VENV/bin/python
LOCK=$RLVR_ROOT/scripts/mlflow-venv.lock

installed() {
    [ -x "$VENV/bin/mlflow" ] && pins_installed "$python" "$LOCK"
}

# An empty tracking database with every migration applied, made once per lock: a server started
# on a copy of it skips the migrations (measured: ready in 17.7 s instead of 32.9 s).
TEMPLATE=$VENV/empty-tracking.db
template_ready() {
    [ -f "$TEMPLATE" ] && [ "$(cat "$TEMPLATE.lock-sha256" 2>/dev/null)" = "$(sha256sum <"$LOCK")" ]
}

mkdir -p "$RLVR_CACHE_DIR/venvs"
exec 9>"$RLVR_CACHE_DIR/venvs/.mlflow.lock"
flock 9
if installed && template_ready; then
    echo "$python"
    exit 0
fi

if ! installed; then
    step "the MLflow tracking server in $VENV (scripts/mlflow-venv.lock)"
    [ -x "$python" ] || /usr/bin/python3 -m venv "$VENV"
    pip_install "$python" --no-deps -r "$LOCK" >&2
    installed || { echo "mlflow did not install into $VENV at the lock's versions" >&2; exit 1; }
fi
rm -f "$TEMPLATE" "$TEMPLATE.partial"
"$VENV/bin/mlflow" db upgrade "sqlite:///$TEMPLATE.partial" >&2
mv "$TEMPLATE.partial" "$TEMPLATE"
sha256sum <"$LOCK" >"$TEMPLATE.lock-sha256"
echo "$python"

#!/usr/bin/env bash
# Makes the Tinker SDK peer's venv and prints its python.
#
#   $RLVR_CACHE_DIR/venvs/tinker/   engines/tinker/requirements.lock (tinker 0.38.0, tinker-cookbook
#                                   0.6.1 and what its math_rl recipe imports, hashed), installed
#                                   exactly, --no-deps
#
# The Tinker SDK and the cookbook's recipes (`python -m tinker_cookbook.recipes.math_rl.train
# base_url=... env=arithmetic renderer_name=role_colon ...`) run on it against the project's
# Tinker-compatible server. torch is not in the lock: a file `zz-torch-from-rlvr-venv.pth` puts the
# project venv's site-packages ($RLVR_VENV, from scripts/setup.sh) after the venv's own, so the
# cookbook imports the project's torch (2.11.0) without a second 2 GB copy, as
# scripts/engine-venv.sh does for trl; every other package is the venv's own, at the lock's
# version, and nothing is installed into the project venv. The .pth file is written only once
# every pin is installed: until then the project venv cannot lend a missing pin, nor torch to the
# import check. Idempotent: a second run finds every pin and prints the python at once. Progress
# goes to stderr; stdout is only the python's path.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

: "${RLVR_VENV:?source \$RLVR_CACHE_DIR/env.sh (scripts/setup.sh writes it) first}"
VENV=$RLVR_CACHE_DIR/venvs/tinker
python=$VENV/bin/python
LOCK=$RLVR_ROOT/engines/tinker/requirements.lock

installed() {
    pins_installed "$python" "$LOCK" &&
        "$python" -c "import tinker, tinker_cookbook, torch" 2>/dev/null
}

mkdir -p "$RLVR_CACHE_DIR/venvs"
exec 9>"$RLVR_CACHE_DIR/venvs/.tinker.lock"
flock 9
if installed; then
    echo "$python"
    exit 0
fi

step "the Tinker SDK in $VENV (engines/tinker/requirements.lock)"
rm -rf "$VENV"
/usr/bin/python3 -m venv "$VENV"
pip_install "$python" --no-deps --ignore-installed --require-hashes -r "$LOCK" >&2
site=$("$python" -c 'import site; print(site.getsitepackages()[0])')
"$RLVR_VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])' >"$site/zz-torch-from-rlvr-venv.pth"
installed || { echo "the Tinker SDK did not install into $VENV at the lock's versions" >&2; exit 1; }
echo "$python"

#!/usr/bin/env bash
# Makes an engine's venv and prints its python.
#
#   scripts/engine-venv.sh trl   $RLVR_CACHE_DIR/venvs/engine-trl/  engines/trl/requirements.lock
#                                (the daemon's `engines.trl_python` is the python printed)
#   scripts/engine-venv.sh ray   $RLVR_CACHE_DIR/venvs/engine-ray/  engines/ray/requirements.lock
#                                (ray[default]: `bin/ray start --head` beside the python printed)
#
# Each lock is installed exactly, --no-deps. torch is not in the trl lock: a file
# `zz-torch-from-rlvr-venv.pth` puts the project venv's site-packages ($RLVR_VENV, from
# scripts/setup.sh) after the venv's own, so the engine trains on the libtorch build the native
# worker links (2.11.0, CUDA where the project venv has it) without a second 2 GB copy, and
# nothing is ever installed into the project venv; every other package is the venv's own, at the
# lock's version. Idempotent: a second run finds every pin and prints the python at once.
# Progress goes to stderr; stdout is only the python's path.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

engine=${1:-}
case "$engine" in
    trl) imports="import torch, trl" ;;
    ray) imports="import ray, ray.dashboard" ;;
    *) echo "usage: scripts/engine-venv.sh trl|ray" >&2; exit 2 ;;
esac
: "${RLVR_VENV:?source \$RLVR_CACHE_DIR/env.sh (scripts/setup.sh writes it) first}"
VENV=$RLVR_CACHE_DIR/venvs/engine-$engine
python=$VENV/bin/python
LOCK=$RLVR_ROOT/engines/$engine/requirements.lock

installed() {
    [ -x "$python" ] && "$python" - "$LOCK" "$imports" <<'PY' 2>/dev/null
import importlib.metadata as m, site, sys
own = site.getsitepackages()[0]
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, version = line.split("==")
    dist = m.distribution(name)
    # The venv's own copy, not one the .pth file lends from the project venv.
    if dist.version != version or not str(dist.locate_file("")).startswith(own):
        sys.exit(1)
exec(sys.argv[2])
PY
}

mkdir -p "$RLVR_CACHE_DIR/venvs"
exec 9>"$RLVR_CACHE_DIR/venvs/.engine-$engine.lock"
flock 9
if installed; then
    echo "$python"
    exit 0
fi

step "the $engine engine's environment in $VENV (engines/$engine/requirements.lock)"
[ -x "$python" ] || /usr/bin/python3 -m venv "$VENV"
if [ "$engine" = trl ]; then
    site=$("$python" -c 'import site; print(site.getsitepackages()[0])')
    "$RLVR_VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])' >"$site/zz-torch-from-rlvr-venv.pth"
fi
pip_install "$python" --no-deps --ignore-installed -r "$LOCK" >&2
installed || { echo "the $engine engine did not install into $VENV at the lock's versions" >&2; exit 1; }
echo "$python"

#!/usr/bin/env bash
# Makes an engine's venv and prints its python.
#
#   scripts/engine-venv.sh trl   $RLVR_CACHE_DIR/venvs/engine-trl/  engines/trl/requirements.lock
#                                engines/trl/requirements-cuda.lock on a GPU host (`nvidia-smi -L`
#                                answers; RLVR_TRL_BUILD=cpu|cuda overrides): trl with vLLM's CUDA
#                                build, hashed, for `[rollout] engine = "vllm"` (TRL's use_vllm)
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
if [ "$engine" = trl ]; then
    build=${RLVR_TRL_BUILD:-}
    if [ -z "$build" ]; then
        if nvidia-smi -L >/dev/null 2>&1; then build=cuda; else build=cpu; fi
    fi
    case "$build" in
        cpu) ;;
        cuda) LOCK=$RLVR_ROOT/engines/trl/requirements-cuda.lock; imports="$imports, vllm" ;;
        *) echo "RLVR_TRL_BUILD must be cpu or cuda, not '$build'" >&2; exit 2 ;;
    esac
fi

installed() {
    [ -x "$python" ] && "$python" - "$LOCK" "$imports" <<'PY' 2>/dev/null
import importlib.metadata as m, site, sys
own = site.getsitepackages()[0]
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, version = line.split()[0].split("==")
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

step "the $engine engine's environment in $VENV (${LOCK#"$RLVR_ROOT"/})"
# Anew: a venv of the other lock (or an interrupted install) would keep files pip --no-deps
# leaves behind.
rm -rf "$VENV"
/usr/bin/python3 -m venv "$VENV"
if [ "$engine" = trl ]; then
    site=$("$python" -c 'import site; print(site.getsitepackages()[0])')
    "$RLVR_VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])' >"$site/zz-torch-from-rlvr-venv.pth"
fi
hashes=()
if grep -q -- '--hash=' "$LOCK"; then
    hashes=(--require-hashes)
    # The CUDA lock pins setuptools (vLLM needs it): the venv's bundled copy would stay beside it,
    # and its metadata win.
    "$python" -m pip uninstall --quiet --disable-pip-version-check -y setuptools >&2
fi
pip_install "$python" --no-deps --ignore-installed "${hashes[@]}" -r "$LOCK" >&2
installed || { echo "the $engine engine did not install into $VENV at the lock's versions" >&2; exit 1; }
echo "$python"

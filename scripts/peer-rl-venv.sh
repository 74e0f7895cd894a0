#!/usr/bin/env bash
# Makes the venv the optimizer plugins' peer cross-check runs verl's loss functions in, and
# prints its python.
#
#   $RLVR_CACHE_DIR/venvs/peer-rl/   verl 0.9.1 (without its training stack: --no-deps) and what
#                                    `verl.trainer.ppo.core_algos` imports, pinned
#
# torch is not installed here: a file `zz-torch-from-rlvr-venv.pth` puts the project venv's
# site-packages ($RLVR_VENV, from scripts/setup.sh) after this venv's own, so the same torch the
# goldens were made with is used without copying 2 GB, and nothing is ever installed into the
# project venv. Idempotent: a second run finds every package at its version and prints the
# python at once. Progress goes to stderr; stdout is only the python's path.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

: "${RLVR_VENV:?source \$RLVR_CACHE_DIR/env.sh (scripts/setup.sh writes it) first}"
VENV=$RLVR_CACHE_DIR/venvs/peer-rl
python=$VENV/bin/python
PINS=(
    numpy==2.4.6
    omegaconf==2.4.0
    codetiming==1.4.0
    tensordict==0.10.0
    ray==2.60.0
    transformers==5.24.0
)

installed() {
    [ -x "$python" ] && VERL_USE_EXTERNAL_PLUGINS=none "$python" - verl==0.9.1 "${PINS[@]}" <<'PY' 2>/dev/null
import importlib.metadata as m, sys
for pin in sys.argv[1:]:
    name, version = pin.split("==")
    if m.version(name) != version:
        sys.exit(1)
import verl.trainer.ppo.core_algos  # noqa: F401
PY
}

mkdir -p "$RLVR_CACHE_DIR/venvs"
exec 9>"$RLVR_CACHE_DIR/venvs/.peer-rl.lock"
flock 9
if installed; then
    echo "$python"
    exit 0
fi

step "verl 0.9.1's loss functions in $VENV"
[ -x "$python" ] || /usr/bin/python3 -m venv "$VENV"
site=$("$python" -c 'import site; print(site.getsitepackages()[0])')
"$RLVR_VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])' >"$site/zz-torch-from-rlvr-venv.pth"
pip_install "$python" --no-deps verl==0.9.1 >&2
pip_install "$python" "${PINS[@]}" >&2
installed || { echo "verl did not install into $VENV at its pinned versions" >&2; exit 1; }
echo "$python"

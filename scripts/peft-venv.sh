#!/usr/bin/env bash
# Makes the venv the LoRA parity tests run Hugging Face PEFT in, and prints its python.
#
#   $RLVR_CACHE_DIR/venvs/peft/   peft==0.21.2 (installed --no-deps), and a .pth file that puts the
#                                 project venv's site-packages (torch 2.11.0, transformers 5.23.0,
#                                 accelerate, safetensors: scripts/setup.sh and
#                                 scripts/fetch-smollm2.sh pin them) after its own
#
# PEFT stays out of the project venv the Rust binaries link; torch is not installed a second time
# (5 GB). Idempotent: a second run finds peft at its version and prints the python at once.
# Progress goes to stderr; stdout is only the python's path.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

PEFT_VERSION=0.21.2
VENV=$RLVR_CACHE_DIR/venvs/peft
python=$VENV/bin/python

peft_installed() {
    [ -x "$python" ] &&
        [ "$("$python" -c 'import importlib.metadata as m; print(m.version("peft"))' 2>/dev/null)" = "$PEFT_VERSION" ] &&
        "$python" -c 'import peft, transformers, torch' 2>/dev/null
}

mkdir -p "$RLVR_CACHE_DIR/venvs"
exec 9>"$RLVR_CACHE_DIR/venvs/.peft.lock"
flock 9
if peft_installed; then
    echo "$python"
    exit 0
fi

step "PEFT $PEFT_VERSION in $VENV, over the project venv's torch and transformers"
# transformers and its pins come with the SmolLM2 conversion (a no-op once it is done).
"$RLVR_ROOT/scripts/fetch-smollm2.sh" >/dev/null
# shellcheck disable=SC1091
source "$RLVR_CACHE_DIR/env.sh"
[ -x "$python" ] || /usr/bin/python3 -m venv "$VENV"
purelib() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
project_site=$(purelib "$RLVR_VENV/bin/python")
echo "$project_site" >"$(purelib "$python")/rlvr-project-venv.pth"
pip_install "$python" --no-deps "peft==$PEFT_VERSION" >&2
peft_installed || { echo "peft $PEFT_VERSION did not install into $VENV" >&2; exit 1; }
echo "$python"

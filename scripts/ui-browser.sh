#!/usr/bin/env bash
# Installs what the web page's browser test (tests/tests/ui.rs) drives it with, and prints the
# node_modules directory that holds playwright-core.
#
#   /usr/bin/chromium                    Debian's chromium (apt-get, when missing)
#   node (>= 20)                         the machine's Node.js, or Debian's nodejs and npm when none
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
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    apt_install nodejs npm
fi
node_major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$node_major" -lt 20 ]; then
    echo "node $(node --version) is too old: playwright-core needs Node.js 20 or newer" >&2
    exit 1
fi

want=$(sha256sum "$LOCK" | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -f "$DIR/node_modules/playwright-core/package.json" ]; then
    echo "$DIR/node_modules"
    exit 0
fi

step "playwright-core from tests/ui/package-lock.json into $DIR"
cp "$RLVR_ROOT/tests/ui/package.json" "$LOCK" "$DIR/"
# No browser download: playwright-core has none, and the test names Debian's chromium.
(cd "$DIR" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error >&2)
echo "$want" >"$STAMP"
echo "$DIR/node_modules"

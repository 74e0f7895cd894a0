#!/usr/bin/env bash
# Every check CI runs (`.ci/run` calls exactly this): set-up, format, lints, build, all tests.
#
# On a fresh Debian machine with only the Rust toolchain it installs what is missing first
# (scripts/setup.sh). On a clean clone with torch in the cache, about 40 minutes on 2 cores
# (measured 2026-11-25: 21 min 42 s, 646 tests, on a clean clone at 212a4b7; 2026-11-28: 28 min
# 18 s, 660 tests, at 1e86386 with the engines' tests, incremental; 41 min 49 s, 691 tests, on a
# clean clone at 34baaee with the peers in the cache).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$RLVR_ROOT"

step "set-up (scripts/setup.sh)"
rlvr_setup

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (workspace, all targets)"
cargo clippy --workspace --all-targets -- -D warnings

# The peers the tests run (venvs of TRL, Ray, verl, MLflow, TensorBoard; Chromium and Playwright
# for the web page) install while the workspace builds: mostly downloads and unpacking, which the
# compiler's two cores leave room for. Each test calls its script again (idempotent, under a
# second when installed), so this only moves the wait; on a fresh cache it saves ~4 minutes.
step "peers, in the background (logs: target/peers/)"
peer_logs=$RLVR_ROOT/target/peers
mkdir -p "$peer_logs"
peer_names=()
peer_pids=()
start_peer() {
    local name=$1
    shift
    "$@" >"$peer_logs/$name.log" 2>&1 &
    peer_names+=("$name")
    peer_pids+=("$!")
}
start_peer engine-trl scripts/engine-venv.sh trl
start_peer engine-ray scripts/engine-venv.sh ray
start_peer peer-rl scripts/peer-rl-venv.sh
start_peer mlflow scripts/mlflow-venv.sh
start_peer tensorboard scripts/tensorboard-venv.sh
start_peer ui-browser scripts/ui-browser.sh

step "cargo build (binaries and plugin libraries the integration tests run)"
cargo build --workspace

step "waiting for the peers"
for i in "${!peer_pids[@]}"; do
    if ! wait "${peer_pids[$i]}"; then
        echo "installing ${peer_names[$i]} failed; its log, $peer_logs/${peer_names[$i]}.log:" >&2
        tail -n 40 "$peer_logs/${peer_names[$i]}.log" >&2
        exit 1
    fi
done

step "cargo test"
cargo test --workspace --no-fail-fast

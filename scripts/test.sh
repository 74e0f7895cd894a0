#!/usr/bin/env bash
# Every check CI runs (`.ci/run` calls exactly this): set-up, format, lints, build, all tests.
#
# On a fresh Debian machine with only the Rust toolchain it installs what is missing first
# (scripts/setup.sh). On a clean clone with torch in the cache, about 30 minutes on 2 cores
# (measured 2026-11-25: 21 min 42 s, 646 tests, on a clean clone at 212a4b7; 2026-11-28: 28 min
# 18 s, 660 tests, at 1e86386 with the engines' tests, incremental).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$RLVR_ROOT"

step "set-up (scripts/setup.sh)"
rlvr_setup

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (workspace, all targets)"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo build (binaries and plugin libraries the integration tests run)"
cargo build --workspace

step "cargo test"
cargo test --workspace --no-fail-fast

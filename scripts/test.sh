#!/usr/bin/env bash
# Every check CI runs (`.ci/run` calls it): set-up, format, lints, build, all tests.
#
#   scripts/test.sh           everything: what CI runs
#   scripts/test.sh --quick   a developer's inner loop: format, lints and build as always, then the
#                             unit tests and the fast integration tests (nextest's `quick` profile
#                             in .config/nextest.toml); no peers installed, no doc tests
#
# On a fresh Debian machine with only the Rust toolchain it installs what is missing first
# (scripts/setup.sh: torch, Redis, Schemathesis, cargo-nextest, mdBook). It builds the book in docs/
# into target/book/. Tests run under cargo-nextest, a
# process each, as many at once as .config/nextest.toml allows (the CPU-heavy ones declare the
# threads they take); JUnit lands in target/nextest/<profile>/junit.xml and the run ends by
# listing its 15 slowest tests. Measured times are in the book (docs/src/contributors/testing.md).
#
# The build goes to a kept target directory, $RLVR_CACHE_DIR/target/<key>, so runs on the same
# machine reuse what the last one compiled, whichever directory the clone is in (RLVR_TARGET_CACHE=0
# builds into ./target instead; --quick uses ./target unless RLVR_TARGET_CACHE=1). The key is the
# toolchain, Cargo.lock, the torch the build links and this machine's identity: another machine,
# or a changed toolchain, builds everything, so a missing install step still fails there. Cargo
# finds a crate fresh by its sources' paths and times, so a run builds through one fixed path, the
# link <key>/workspace to this checkout (runs take turns: a lock is held for the whole run), and
# source files whose content the kept build saw get their times back (scripts/source-mtimes.py):
# only what changed compiles.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$RLVR_ROOT"

quick=0
for arg in "$@"; do
    case $arg in
        --quick) quick=1 ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "scripts/test.sh: unknown argument '$arg' (try --help)" >&2
            exit 2
            ;;
    esac
done
profile=ci
[ "$quick" = 1 ] && profile=quick

started=$SECONDS

step "set-up (scripts/setup.sh)"
rlvr_setup

# Cargo is told where the workspace is (`--manifest-path`), so that with a kept target directory
# it sees the workspace at that directory's fixed link, not at this clone's path.
cargo_workspace=(--manifest-path "$RLVR_ROOT/Cargo.toml")
# Runs a command without the kept target directory's lock, when this run holds one.
unlocked() {
    if [ -n "${lock_fd:-}" ]; then
        "$@" {lock_fd}>&-
    else
        "$@"
    fi
}
if [ "${RLVR_TARGET_CACHE:-$((1 - quick))}" = 1 ]; then
    use_target_cache
    mkdir -p "$CARGO_TARGET_DIR"
    # One run at a time builds and tests through the link: another would repoint it mid-run. The
    # lock is this shell's alone (`unlocked` closes it for the commands it starts): a daemon a test
    # leaked must not hold it and keep every later run waiting.
    exec {lock_fd}>"$CARGO_TARGET_DIR/.run.lock"
    if ! flock -n "$lock_fd"; then
        echo "another scripts/test.sh is using $CARGO_TARGET_DIR; waiting for it to end" >&2
        flock "$lock_fd"
    fi
    ln -sfn "$RLVR_ROOT" "$CARGO_TARGET_DIR/workspace"
    cargo_workspace=(--manifest-path "$CARGO_TARGET_DIR/workspace/Cargo.toml")
    step "target directory: $CARGO_TARGET_DIR (the workspace seen at $CARGO_TARGET_DIR/workspace)"
    # A clone's files are all new to cargo; those whose content the kept build saw get that
    # build's times back, so only what changed compiles (scripts/source-mtimes.py).
    "$RLVR_VENV/bin/python" scripts/source-mtimes.py restore "$CARGO_TARGET_DIR/source-mtimes.tsv"
fi
target=${CARGO_TARGET_DIR:-$RLVR_ROOT/target}

step "cargo fmt --check"
cargo fmt "${cargo_workspace[@]}" --all -- --check

# Clippy is the compiler of the workspace's own crates in the one build below, which is how `cargo
# clippy` itself works (clippy-driver as the workspace's rustc wrapper, its arguments in
# CLIPPY_ARGS), so linting costs no check pass of its own that could not share artefacts with the
# build. Dependencies are compiled by plain rustc. The tests run with the same settings, so nextest
# reuses every artefact.
RUSTC_WORKSPACE_WRAPPER=$(rustc --print sysroot)/bin/clippy-driver
[ -x "$RUSTC_WORKSPACE_WRAPPER" ] || {
    echo "no clippy-driver in the toolchain ($RUSTC_WORKSPACE_WRAPPER): rustup component add clippy" >&2
    exit 1
}
export RUSTC_WORKSPACE_WRAPPER
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"

# The peers the tests run (venvs of TRL, Ray, vLLM, verl, MLflow, TensorBoard, the Tinker SDK, PEFT with the converted
# SmolLM2, the text metrics; Chromium and Playwright for the web page) install while the workspace
# builds: mostly downloads and unpacking, which the compiler's two cores leave room for. Each test
# calls its script again (idempotent, under a second when installed), so this only moves the wait.
peer_names=()
peer_pids=()
if [ "$quick" = 0 ]; then
    step "peers, in the background (logs: $target/peers/)"
    peer_logs=$target/peers
    mkdir -p "$peer_logs"
    start_peer() {
        local name=$1
        shift
        unlocked "$@" >"$peer_logs/$name.log" 2>&1 &
        peer_names+=("$name")
        peer_pids+=("$!")
    }
    start_peer engine-trl scripts/engine-venv.sh trl
    start_peer engine-ray scripts/engine-venv.sh ray
    start_peer vllm scripts/vllm-venv.sh
    start_peer peer-rl scripts/peer-rl-venv.sh
    start_peer mlflow scripts/mlflow-venv.sh
    start_peer tensorboard scripts/tensorboard-venv.sh
    start_peer ui-browser scripts/ui-browser.sh
    start_peer peft scripts/peft-venv.sh
    start_peer text-metrics scripts/text-metrics-venv.sh
    start_peer openenv scripts/openenv-venv.sh
    start_peer tinker scripts/tinker-venv.sh
fi

step "cargo build (every target; clippy -D warnings on the workspace's crates)"
unlocked cargo build "${cargo_workspace[@]}" --workspace --all-targets
if [ -n "${lock_fd:-}" ]; then
    "$RLVR_VENV/bin/python" scripts/source-mtimes.py record "$CARGO_TARGET_DIR/source-mtimes.tsv"
fi

step "the book: mdbook build docs (into target/book/; a test checks its links)"
"$RLVR_MDBOOK" build docs --dest-dir "$RLVR_ROOT/target/book"

if [ "${#peer_pids[@]}" -gt 0 ]; then
    step "waiting for the peers"
    for i in "${!peer_pids[@]}"; do
        if ! wait "${peer_pids[$i]}"; then
            echo "installing ${peer_names[$i]} failed; its log, $peer_logs/${peer_names[$i]}.log:" >&2
            tail -n 40 "$peer_logs/${peer_names[$i]}.log" >&2
            exit 1
        fi
    done
fi

step "cargo nextest run (profile $profile)"
# Four tests share two cores, and a worker's libtorch threads (every core, by the daemon's default)
# spin in OpenMP's barrier waiting for a sibling the other tests keep descheduled: sampled over a
# busy minute of the suite, a fifth of all CPU time was rlvr-worker inside libgomp. Waiting
# threads that sleep instead change no result, only who gets the cores.
export OMP_WAIT_POLICY=PASSIVE
status=0
unlocked cargo nextest run "${cargo_workspace[@]}" --workspace --profile "$profile" || status=$?

if [ "$quick" = 0 ]; then
    # nextest does not run doc tests.
    step "cargo test --doc"
    unlocked cargo test "${cargo_workspace[@]}" --workspace --doc --quiet || status=$?
fi

# nextest's store is the checkout's target/ ([store] in .config/nextest.toml), wherever the build goes.
junit=$RLVR_ROOT/target/nextest/$profile/junit.xml
step "the 15 slowest tests (from $junit)"
scripts/slowest-tests.py "$junit" 15 || true

step "scripts/test.sh: $((SECONDS - started)) s, $([ "$status" = 0 ] && echo "all passed" || echo "FAILED (exit $status)")"
exit "$status"

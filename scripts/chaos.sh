#!/usr/bin/env bash
# The chaos run at full size: the suite's chaos story (tests/tests/chaos.rs) with more jobs and
# more faults. Three teams' GRPO, SFT and rejection-sampling jobs (JOBS of each kind per team) and
# a two-stage pipeline run under a seeded schedule of FAULTS faults, one every 1–4 s: the daemon
# killed (-9) or stopped (SIGTERM) and restarted, a worker killed (-9) or frozen (SIGSTOP past its
# heartbeats, then SIGCONT), Redis killed (-9) and restarted from its append-only file, the state
# directory's disk (a tmpfs of the daemon's own) filled for 1.5 s. Then it
# checks that every job ended, none was lost, none ran in two workers at once or published twice,
# every published version's files are its manifest's, no version or checkpoint in the making is
# visible, every sampled dataset is its team's, and /healthz is ok; and prints the figures.
#
#   scripts/chaos.sh [--jobs JOBS] [--faults FAULTS] [--seed SEED]    (defaults: 4, 40, 1)
#
# The debug build, as scripts/test.sh builds it. Exit status: the test's (0 when nothing was lost,
# duplicated or inconsistent).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$RLVR_ROOT"

jobs=4
faults=40
seed=1
while [ $# -gt 0 ]; do
    case "$1" in
        --jobs) jobs=$2; shift 2 ;;
        --faults) faults=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        *)
            echo "usage: scripts/chaos.sh [--jobs JOBS] [--faults FAULTS] [--seed SEED]" >&2
            exit 2
            ;;
    esac
done

step "set-up (scripts/setup.sh)"
rlvr_setup
step "build (debug, every target, as scripts/test.sh)"
cargo build --workspace --all-targets
step "chaos: $jobs jobs of each kind per team, $faults faults, seed $seed"
log=${CARGO_TARGET_DIR:-$RLVR_ROOT/target}/chaos.log
started=$(date +%s)
status=0
RLVR_CHAOS_JOBS=$jobs RLVR_CHAOS_FAULTS=$faults RLVR_CHAOS_SEED=$seed \
    cargo nextest run -p rlvr-tests --no-capture -E 'test(/^chaos::/)' >"$log" 2>&1 || status=$?
# The figures, each job that did not publish, and on a failure what was lost, duplicated or
# inconsistent; the whole output stays in the log.
grep -E '^(chaos \(|  [a-z]+ [a-z]+-[0-9]+: )|panicked|^(lost|duplicated|inconsistent) |^    "' "$log" || true
echo "chaos run: $(($(date +%s) - started)) s, exit $status (the whole output: $log)"
exit "$status"

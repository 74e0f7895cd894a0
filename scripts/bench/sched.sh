#!/usr/bin/env bash
# Scheduler benchmark: how busy the devices are kept, against a first-come-first-served schedule
# that gives each job whole devices for its whole run.
#
#   1. simulated: `rlvrd simulate` on the traces in scripts/bench/traces/ (the policy itself,
#      phase durations from the trace);
#   2. live on this machine: one CPU slot (8 GB), N builtin:tiny-arith GRPO jobs through
#      `rlvrd serve` (release), each verifying through the `http` verifier against a local
#      service that takes --delay-ms per item (scripts/bench/slow_verifier.py: the CPU gap a
#      sandboxed test runner or a judge model makes). First the N jobs with 2 GB each, all
#      admitted at once and taking turns on the slot through phase grants; then the same N jobs
#      asking for the whole slot, so they run one after another (the FCFS baseline).
#      Busy fraction = the slot's rlvr_device_busy_seconds_total gained over the run / the run's
#      wall time (first submit to last job published).
#
# Usage: scripts/bench/sched.sh [--jobs N] [--steps S] [--delay-ms MS] [--no-build] [--keep]
#   defaults: N 3, S 200, MS 2: 16 items a step, verified 2 at once, make a verification gap of
#   about 20 ms against about 34 ms of device phases (rollout 7 ms, update 27 ms) per step.
#   Prints markdown tables on stdout; progress on stderr. About 1 minute after the build.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/../lib.sh"
cd "$RLVR_ROOT"

jobs=3
steps=200
delay_ms=2
build=1
keep=0
while [ $# -gt 0 ]; do
    case "$1" in
        --jobs) jobs=$2; shift 2 ;;
        --steps) steps=$2; shift 2 ;;
        --delay-ms) delay_ms=$2; shift 2 ;;
        --no-build) build=0; shift ;;
        --keep) keep=1; shift ;;
        *) echo "sched.sh: unknown argument $1 (see the header of this script)" >&2; exit 2 ;;
    esac
done

step "set-up (scripts/setup.sh)"
rlvr_setup
if [ "$build" = 1 ]; then
    step "build (release): rlvrd, rlvrctl, the grpo and http plugins"
    cargo build --release -p rlvr-daemon -p rlvr-worker -p rlvr-cli
    cargo build --release -p rlvr-optimizer-grpo -p rlvr-verifier-http
fi
bin=$RLVR_ROOT/target/release

step "1. simulated traces (rlvrd simulate)"
for trace in scripts/bench/traces/*.toml; do
    echo "#### \`rlvrd simulate --trace $trace\`"
    echo
    "$bin/rlvrd" simulate --trace "$trace"
    echo
done

work=$(mktemp -d "${TMPDIR:-/tmp}/rlvr-sched-bench.XXXXXX")
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/serve-lib.sh"

step "2. live: $jobs jobs of $steps steps on one CPU slot, verification $delay_ms ms per item"
bench_start_redis --save "" --appendonly no
python3 scripts/bench/slow_verifier.py --port-file "$work/verifier.port" --delay-ms "$delay_ms" &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/verifier.port" ] && break; sleep 0.1; done
bench_start_daemon "[api]
listen = \"127.0.0.1:0\"
[queue]
worker_threads = 1
[devices]
cpu_slots = 1
cpu_slot_memory_gb = 8
# The slow verifier listens on loopback: the operator lets graders reach it.
[outbound]
allow = [\"127.0.0.1/32\"]" librlvr_optimizer_grpo.so librlvr_verifier_http.so
server=$RLVR_SERVER

# A job spec; $2 is its [resources] section.
job() {
    bench_job "$1" "$steps" "[[verifiers]]
plugin = \"http\"
url = \"http://127.0.0.1:$(cat "$work/verifier.port")/verify\"" "$2"
}

busy() {
    curl -s "$server/metrics" | awk '/^rlvr_device_busy_seconds_total\{device="cpu:0"\}/ {print $2}'
}

# Runs $jobs jobs with the [resources] section $2; prints "<wall s> <busy s>".
run() {
    local label=$1 resources=$2 ids=() before after started ended
    before=$(busy)
    started=$(date +%s.%N)
    for n in $(seq "$jobs"); do
        job "$label-$n" "$resources" >"$work/$label-$n.toml"
        ids+=("$("$bin/rlvrctl" submit "$work/$label-$n.toml")")
    done
    for id in "${ids[@]}"; do
        if ! "$bin/rlvrctl" watch "$id" >/dev/null 2>"$work/watch.err"; then
            echo "sched.sh: job $id did not publish:" >&2
            cat "$work/watch.err" >&2
            exit 1
        fi
    done
    ended=$(date +%s.%N)
    after=$(busy)
    python3 -c "print($ended - $started, $after - $before)"
}

echo "policy: $jobs jobs of 2 GB share the slot" >&2
read -r policy_wall policy_busy < <(run shared "[resources]
memory_gb = 2")
echo "baseline: $jobs jobs take the whole slot, one after another" >&2
read -r fcfs_wall fcfs_busy < <(run whole "")

echo "#### Live: $jobs tiny-arith GRPO jobs × $steps steps on one CPU slot, verification $delay_ms ms per item"
echo
python3 - "$policy_wall" "$policy_busy" "$fcfs_wall" "$fcfs_busy" <<'PY'
import sys
pw, pb, fw, fb = map(float, sys.argv[1:])
print("| schedule | wall | slot busy | busy fraction |")
print("|---|---:|---:|---:|")
print(f"| rlvr policy (phase grants) | {pw:.1f} s | {pb:.1f} s | **{pb / pw * 100:.1f}%** |")
print(f"| FCFS, whole slot per job | {fw:.1f} s | {fb:.1f} s | {fb / fw * 100:.1f}% |")
PY

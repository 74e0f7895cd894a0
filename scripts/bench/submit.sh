#!/usr/bin/env bash
# Queue benchmark: how fast jobs get in and get going, next to what this machine's Redis can do.
# Release builds; one redis-server with configs/redis.conf's persistence (AOF, fsync every second)
# and one `rlvrd serve` with its shipped defaults (poll 250 ms, heartbeat 2 s, one CPU slot),
# except a rate limit and a per-team queue limit high enough not to throttle; the load side is
# client/examples/submit_bench.rs (through the API, with rlvr-client) and
# daemon/examples/push_bench.rs (straight into Redis).
#
#   1. latency   L jobs one after another on the idle daemon (1 step of builtin:tiny-arith, gate
#                always passes), each followed to `published`: time from sending the POST to
#                the job's `admitted` and `running` events (their Redis stream ids carry the
#                server's ms; client and server share this clock). p50 / p99 / max.
#   2. api       A submissions of a valid job (checked, recorded, event written, dispatch task
#                pushed) at concurrency 1, 8 and 32, R rounds alternating; median submits/s.
#                One long job holds the only slot, its worker stopped (SIGSTOP) so that no
#                training competes for the 2 cores: the daemon only takes submissions.
#   3. push      P dispatch tasks pushed by `rlvr_queue::dispatch::push` in chunks of 1,000
#                (the recovery sweep's bulk path) into a scratch queue, then promoted to the
#                active list; R rounds, median tasks/s.
#   4. redis-benchmark on the same server: SET at 1 and 32 clients, ZADD at 32, and SET pipelined
#                16 deep: the ceiling for one command per round trip and for batched writes.
#
# Usage: scripts/bench/submit.sh [--latency-jobs L] [--api-jobs A] [--push-tasks P]
#                                [--rounds R] [--no-build] [--keep]
#   defaults: L 100, A 2000, P 100000, R 3. Prints a markdown table on stdout; progress on
#   stderr. About 3 minutes after the build on the 2-core machine.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/../lib.sh"
cd "$RLVR_ROOT"

latency_jobs=100
api_jobs=2000
push_tasks=100000
rounds=3
build=1
keep=0
while [ $# -gt 0 ]; do
    case "$1" in
        --latency-jobs) latency_jobs=$2; shift 2 ;;
        --api-jobs) api_jobs=$2; shift 2 ;;
        --push-tasks) push_tasks=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --no-build) build=0; shift ;;
        --keep) keep=1; shift ;;
        *) echo "submit.sh: unknown argument $1 (see the header of this script)" >&2; exit 2 ;;
    esac
done

step "set-up (scripts/setup.sh)"
rlvr_setup
if [ "$build" = 1 ]; then
    step "build (release): rlvrd, rlvrctl, the grpo and math plugins, submit_bench, push_bench"
    cargo build --release -p rlvr-daemon -p rlvr-worker -p rlvr-cli
    cargo build --release -p rlvr-client --example submit_bench
    cargo build --release -p rlvr-daemon --example push_bench
    cargo build --release -p rlvr-optimizer-grpo -p rlvr-verifier-math
fi
bin=$RLVR_ROOT/target/release
bench=$bin/examples/submit_bench
push_bench=$bin/examples/push_bench

work=$(mktemp -d "${TMPDIR:-/tmp}/rlvr-submit-bench.XXXXXX")
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/serve-lib.sh"
redis_benchmark=$redis_tools/redis-benchmark

step "redis-server (configs/redis.conf) and rlvrd serve"
bench_start_redis "$RLVR_ROOT/configs/redis.conf"
bench_start_daemon "[api]
listen = \"127.0.0.1:0\"
rate_limit_per_minute = 1000000
[queue]
worker_threads = 1
[devices]
cpu_slots = 1
cpu_slot_memory_gb = 8
[tenancy]
max_queued_per_team = 100000" librlvr_optimizer_grpo.so librlvr_verifier_math.so
server=$RLVR_SERVER
token=$RLVR_TOKEN

# A job spec of N steps on the arithmetic data whose gate always passes.
job() { bench_job "$1" "$2" '[[verifiers]]
plugin = "math"
fallback = "last"' "${3:-}"; }
job short 1 >"$work/short.toml"
# The long job takes the slot's whole memory: jobs share a slot by memory, and the API phase's
# jobs must wait, not run beside it.
job long 100000 '[resources]
memory_gb = 8' >"$work/long.toml"

step "1. submit-to-running latency: $latency_jobs jobs one after another on the idle daemon"
"$bench" latency --server "$server" --token "$token" --spec "$work/short.toml" --count "$latency_jobs" \
    >"$work/latency.json"

step "2. API submissions/s: $api_jobs per run at concurrency 1, 8, 32; $rounds rounds"
long=$("$bin/rlvrctl" submit "$work/long.toml")
for _ in $(seq 600); do
    [ "$("$bin/rlvrctl" --json status "$long" | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')" = running ] && break
    sleep 0.1
done
worker=$(pgrep -f "jobs/$long/spec.json" | head -1)
[ -n "$worker" ] || { echo "submit.sh: the long job's worker is not running" >&2; tail -20 "$work/rlvrd.log" >&2; exit 1; }
kill -STOP "$worker"
pids+=("$worker")
for round in $(seq "$rounds"); do
    for concurrency in 1 8 32; do
        echo "round $round, concurrency $concurrency" >&2
        "$bench" api --server "$server" --token "$token" --spec "$work/short.toml" --count "$api_jobs" \
            --concurrency "$concurrency" >>"$work/api.jsonl"
    done
done

# Every answer was a 201 with an id; the records are there too.
jobs=$("$redis_cli" -p "$redis_port" zcard rlvr:jobs)
expected=$((latency_jobs + 1 + rounds * 3 * api_jobs))
[ "$jobs" = "$expected" ] || { echo "submit.sh: $jobs job records in Redis, expected $expected" >&2; exit 1; }

step "3. bulk push: $push_tasks dispatch tasks in chunks of 1,000; $rounds rounds"
for _ in $(seq "$rounds"); do
    "$push_bench" --redis "redis://127.0.0.1:$redis_port" --count "$push_tasks" >>"$work/push.jsonl"
done

step "4. redis-benchmark on the same server"
# One CSV row per test: "name","requests/s",...; the name gets the clients and pipelining.
redis_bench() {
    local label=$1; shift
    "$redis_benchmark" -p "$redis_port" -q --csv "$@" | sed "s/^\"\([A-Z]*\)\"/\"\1, $label\"/" >>"$work/redis.csv"
}
redis_bench "1 client" -n 100000 -c 1 -t set
redis_bench "32 clients" -n 200000 -c 32 -t set,zadd
redis_bench "32 clients, pipelined 16 deep" -n 1000000 -c 32 -P 16 -t set

python3 - "$work" <<'PY'
import csv, json, statistics, sys
work = sys.argv[1]
lat = json.load(open(f"{work}/latency.json"))
api = [json.loads(line) for line in open(f"{work}/api.jsonl")]
push = [json.loads(line) for line in open(f"{work}/push.jsonl")]
rows = [r for r in csv.reader(open(f"{work}/redis.csv")) if r and r[0] != "test"]

print("| measure | value |")
print("|---|---:|")
for key, name in (("submit_to_admitted_ms", "admitted"), ("submit_to_running_ms", "running")):
    s = lat[key]
    print(f"| submit → {name}, idle daemon ({lat['count']} jobs): p50 / p99 / max | "
          f"{s['p50']:.0f} / {s['p99']:.0f} / {s['max']:.0f} ms |")
for concurrency in sorted({r["concurrency"] for r in api}):
    runs = [r for r in api if r["concurrency"] == concurrency]
    rate = statistics.median(r["per_second"] for r in runs)
    p50 = statistics.median(r["request_ms"]["p50"] for r in runs)
    print(f"| API submits/s at concurrency {concurrency} (median of {len(runs)} × {runs[0]['count']}; "
          f"request p50 {p50:.1f} ms) | {rate:,.0f} |")
rate = statistics.median(r["push_per_second"] for r in push)
print(f"| bulk push, dispatch tasks/s (median of {len(push)} × {push[0]['count']:,}) | {rate:,.0f} |")
rate = statistics.median(r["promote_per_second"] for r in push)
print(f"| promote scheduled → active, tasks/s | {rate:,.0f} |")
for name, rps, *_ in rows:
    print(f"| redis-benchmark {name}, requests/s | {float(rps):,.0f} |")
PY

#!/usr/bin/env bash
# The soak run: many short jobs through one `rlvrd serve`, watching what the daemon holds while
# they come and go. It starts a private Redis and `rlvrd serve` in a temporary state directory
# (4 teams, each with its own token; 2 CPU slots; heartbeats every 500 ms; one libtorch thread per
# worker; each team keeps the records of its 20 newest ended jobs), uploads arithmetic data
# (`rlvrd data arith`) as each team's datasets, and scripts/bench/soak.py, through the HTTP API:
#
#   - submits N jobs round-robin from the 4 teams, each GRPO or SFT, 1 to 3 steps, on
#     builtin:tiny-arith (group_size 2, prompts_per_step 2, max_new_tokens 3), never more than
#     --in-flight of them unended at once;
#   - between submits, at random (seeded), cancels a job not ended and asks for graders' dry-runs
#     (POST /v1/verify);
#   - every --sample-s seconds samples the daemon's open fds, RSS and threads, its children (and
#     zombies among them), the entries its graders and workers left in grader-work/ and in its
#     temporary directory, the job directories under its state directory (count and size), and
#     Redis's used_memory, keys, event streams, job records and the dispatch queues' task entries
#     (apalis's meta keys, data hash, done set, workers' metadata): samples.csv;
#   - waits for every job to end and checks each one it submitted ended (none lost), then prints a
#     summary (summary.txt: jobs by end state; first, last and max of each series; the slope of each
#     over the loaded run's second half; Redis's keys by pattern; the daemon log's warnings) and
#     draws plot.svg, one chart per series.
#
# It fails (exit 1) when a job was lost (its record gone before it was seen ended, or not ended
# within 10 minutes of the last submit), or when the open fds or the threads rose by more than
# --fd-bound or --thread-bound: over the loaded run's second half (the least-squares line's rise,
# judged from 10 samples up) or from the idle daemon before the first job to the idle daemon after
# the last. It fails too when, at the end, Redis holds more job records, event streams or index
# entries than 4 teams × 20, a zombie child is left, or a dry-run graded an item wrongly.
#
# Usage: scripts/soak.sh [--jobs N] [--seed S] [--out DIR] [--in-flight K] [--sample-s S]
#                        [--fd-bound F] [--thread-bound T] [--keep]
#   defaults: N 300, S 1, DIR target/soak/<time>/, K 6 (under the 20 ended records a team keeps,
#   so a job is always seen ended before its record goes), S 3 s, F 16, T 8. --keep keeps the work
#   directory (the daemon's state directory and logs). The debug build by default
#   (RLVR_SOAK_PROFILE=release for the release build, when built); nothing is built here.
#
# The daemon's TMPDIR is a directory of its own (tmp/ in the work directory), so that the count of
# what it and its workers leave there is theirs alone. What the run writes stays under DIR
# (samples.csv, jobs.csv, summary.txt, plot.svg, rlvrd.log); everything else is stopped and removed
# on success, failure or Ctrl-C.
#
# On the 2-core machine, debug build, beside another engineer's builds: --jobs 20 took 41 s, --jobs
# 120 2 min 39 s (about 1.1 s a job, 6 unended at once); the default 300 should take about 6 minutes.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$RLVR_ROOT"

jobs=300
seed=1
out=
in_flight=6
sample_s=3
fd_bound=16
thread_bound=8
keep=0
keep_ended=20
while [ $# -gt 0 ]; do
    case "$1" in
        --jobs) jobs=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --in-flight) in_flight=$2; shift 2 ;;
        --sample-s) sample_s=$2; shift 2 ;;
        --fd-bound) fd_bound=$2; shift 2 ;;
        --thread-bound) thread_bound=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        *) echo "soak.sh: unknown argument $1 (see the header of this script)" >&2; exit 2 ;;
    esac
done
# A job's record goes once 20 newer jobs of its team ended; the driver looks at every job not
# ended once a round, so with fewer than 20 unended it sees each one ended before it goes, and a
# 404 means a lost job.
if [ "$in_flight" -ge "$keep_ended" ]; then
    echo "soak.sh: --in-flight must be below $keep_ended (the ended records a team keeps)" >&2
    exit 2
fi

# shellcheck disable=SC1091
source "$RLVR_CACHE_DIR/env.sh"
profile=${RLVR_SOAK_PROFILE:-debug}
bin=${CARGO_TARGET_DIR:-$RLVR_ROOT/target}/$profile
for exe in rlvrd rlvr-worker; do
    [ -x "$bin/$exe" ] || { echo "soak.sh: $bin/$exe is not built (cargo build, or RLVR_SOAK_PROFILE)" >&2; exit 2; }
done
redis_server=${RLVR_REDIS_SERVER:-redis-server}
redis_cli=$(dirname "$(command -v "$redis_server")")/redis-cli

out=${out:-$RLVR_ROOT/target/soak/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
out=$(cd "$out" && pwd)

work=$(mktemp -d "${TMPDIR:-/tmp}/rlvr-soak.XXXXXX")
pids=()
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    # The driver, the daemon (SIGTERM: it stops its workers), then Redis.
    stop_in_reverse "${pids[@]}"
    [ -f "$work/rlvrd.log" ] && cp "$work/rlvrd.log" "$out/rlvrd.log"
    if [ "$keep" = 1 ]; then echo "work directory kept: $work" >&2; else rm -rf "$work"; fi
    if [ "$status" -ne 0 ]; then echo "soak failed (exit $status); everything it started is stopped; see $out" >&2; fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Redis and the daemon run in sessions of their own (setsid): a Ctrl-C on the terminal reaches this
# script and the driver only, and the EXIT trap stops the daemon before Redis.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

step "private Redis and rlvrd serve ($profile build) in $work"
mkdir -p "$work/redis" "$work/state" "$work/plugins" "$work/bin" "$work/tmp"
# Copies of the binaries: a build of the tree meanwhile must not change the daemon's workers
# halfway through the run.
cp "$bin/rlvrd" "$bin/rlvr-worker" "$work/bin/"
for plugin in verifier_math optimizer_sft optimizer_grpo; do
    cp "$bin/librlvr_$plugin.so" "$work/plugins/"
done
redis_port=$(free_port)
setsid "$redis_server" --port "$redis_port" --bind 127.0.0.1 --dir "$work/redis" --save '' \
    --appendonly no --logfile "$work/redis/redis.log" &
pids+=($!)
for _ in $(seq 100); do "$redis_cli" -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done

# Four teams, each a token; the daemon keeps only their hashes, the driver reads the tokens.
teams=(ada bob cyd dee)
tokens_toml=
tokens_json="{"
for team in "${teams[@]}"; do
    token=soak-$team-$RANDOM$RANDOM
    tokens_toml+="[[auth.tokens]]
team = \"$team\"
sha256 = \"$(printf %s "$token" | sha256sum | cut -d' ' -f1)\"
admin = false
"
    tokens_json+="\"$team\": \"$token\","
done
tokens_json="${tokens_json%,}}"
printf '%s\n' "$tokens_json" >"$work/tokens.json"
chmod 600 "$work/tokens.json"

cat >"$work/rlvrd.toml" <<TOML
[daemon]
state_dir = "$work/state"
registry = "$work/registry"
[redis]
url = "redis://127.0.0.1:$redis_port"
[api]
listen = "127.0.0.1:0"
# The driver polls every job not ended once a round: more than the default 600 a minute.
rate_limit_per_minute = 100000
[plugins]
dirs = ["$work/plugins"]
[devices]
cpu_slots = 2
[queue]
poll_interval_ms = 100
heartbeat_ms = 500
missed_heartbeats = 6
worker_threads = 1
keep_ended_per_team = $keep_ended
$tokens_toml
TOML
"$work/bin/rlvrd" validate --config "$work/rlvrd.toml" >/dev/null
TMPDIR=$work/tmp RLVR_LOG=${RLVR_LOG:-info} setsid "$work/bin/rlvrd" serve --config "$work/rlvrd.toml" 2>"$work/rlvrd.log" &
daemon=$!
pids+=("$daemon")
for _ in $(seq 300); do
    [ -s "$work/state/rlvrd.addr" ] && break
    process_running "$daemon" || { cat "$work/rlvrd.log" >&2; exit 1; }
    sleep 0.1
done
[ -s "$work/state/rlvrd.addr" ] || { echo "rlvrd did not start listening" >&2; tail -20 "$work/rlvrd.log" >&2; exit 1; }
server="http://$(cat "$work/state/rlvrd.addr")"
echo "rlvrd (pid $daemon) is serving on $server" >&2

step "synthetic data (rlvrd data arith)"
"$work/bin/rlvrd" data arith --out "$work/data" --sft 200 --train 200 --heldout 20 2>/dev/null

step "soak: $jobs jobs from ${#teams[@]} teams, at most $in_flight unended; seed $seed; samples every $sample_s s"
python3 "$RLVR_ROOT/scripts/bench/soak.py" \
    --server "$server" --tokens "$work/tokens.json" --data "$work/data" \
    --daemon-pid "$daemon" --state-dir "$work/state" --tmp-dir "$work/tmp" \
    --redis-cli "$redis_cli" --redis-port "$redis_port" \
    --jobs "$jobs" --seed "$seed" --in-flight "$in_flight" --sample-s "$sample_s" \
    --keep-ended "$keep_ended" --fd-bound "$fd_bound" --thread-bound "$thread_bound" \
    --log "$work/rlvrd.log" --out "$out" &
pids+=($!)
soak_status=0
wait "${pids[-1]}" || soak_status=$?
unset 'pids[-1]'

step "stopping"
echo "kept: $out (samples.csv, jobs.csv, summary.txt, plot.svg, rlvrd.log)" >&2
exit "$soak_status"

# Sourced by the benchmarks that run `rlvrd serve` (submit.sh, sched.sh): a private Redis and
# daemon in a work directory, cleaned up on exit, and the job spec they submit.
# shellcheck shell=bash
#
# Before sourcing, set: `work` (a fresh directory), `bin` (target/release), `keep` (1 keeps
# $work). Functions add the processes they start to `pids`; the EXIT trap kills them.

pids=()
bench_cleanup() {
    for pid in "${pids[@]}"; do
        # A stopped (SIGSTOP) process must be continued to die cleanly.
        { kill -CONT "$pid"; kill -9 "$pid"; wait "$pid"; } 2>/dev/null || true
    done
    if [ "$keep" = 1 ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap bench_cleanup EXIT

redis_server=${RLVR_REDIS_SERVER:-redis-server}
# redis-cli and redis-benchmark come with redis-server (Debian's redis-tools).
redis_tools=$(dirname "$(command -v "$redis_server")")
redis_cli=$redis_tools/redis-cli

bench_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Starts redis-server with these extra arguments (persistence) on a free port: sets redis_port.
bench_start_redis() {
    redis_port=$(bench_free_port)
    mkdir -p "$work/redis"
    "$redis_server" "$@" --port "$redis_port" --bind 127.0.0.1 --dir "$work/redis" --daemonize no \
        --logfile "$work/redis.log" &
    pids+=($!)
    for _ in $(seq 100); do "$redis_cli" -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
}

# Starts `rlvrd serve` with the plugin libraries named (file names in $bin) and more config
# ($1, TOML sections); writes the arithmetic data to $work/data. Sets and exports RLVR_SERVER and
# RLVR_TOKEN (team "bench").
bench_start_daemon() {
    local extra=$1
    shift
    mkdir -p "$work/plugins" "$work/state"
    for library in "$@"; do cp "$bin/$library" "$work/plugins/"; done
    "$bin/rlvrd" data arith --out "$work/data" >/dev/null
    RLVR_TOKEN=bench-$RANDOM$RANDOM
    cat >"$work/rlvrd.toml" <<TOML
[daemon]
state_dir = "$work/state"
[redis]
url = "redis://127.0.0.1:$redis_port"
[plugins]
dirs = ["$work/plugins"]
[[auth.tokens]]
team = "bench"
sha256 = "$(printf %s "$RLVR_TOKEN" | sha256sum | cut -d' ' -f1)"
$extra
TOML
    RLVR_LOG=warn "$bin/rlvrd" serve --config "$work/rlvrd.toml" 2>"$work/rlvrd.log" &
    pids+=($!)
    for _ in $(seq 300); do [ -s "$work/state/rlvrd.addr" ] && break; sleep 0.1; done
    [ -s "$work/state/rlvrd.addr" ] || { tail -20 "$work/rlvrd.log" >&2; exit 1; }
    RLVR_SERVER=http://$(cat "$work/state/rlvrd.addr")
    export RLVR_SERVER RLVR_TOKEN
    # A spec names the team's datasets, never a server path.
    "$bin/rlvrctl" dataset put train "$work/data/train.jsonl" >/dev/null
    "$bin/rlvrctl" dataset put heldout "$work/data/heldout.jsonl" >/dev/null
}

# A GRPO job spec of team "bench" on builtin:tiny-arith and the arithmetic data, whose gate always
# passes: bench_job NAME STEPS VERIFIER-SECTION [MORE-SECTIONS].
bench_job() {
    cat <<TOML
[job]
name = "bench-$1"
team = "bench"
model_line = "bench"
seed = 7
[model]
policy = "builtin:tiny-arith"
[data]
train = "dataset:train"
heldout = "dataset:heldout"
[optimizer]
plugin = "grpo"
group_size = 4
lr = 1e-3
$3
[rollout]
prompts_per_step = 4
max_new_tokens = 5
[budget]
max_steps = $2
[eval]
max_prompts = 16
[gates]
heldout_gain_min = -1.0
refuse_reward_hacking = false
length_ratio_max = 100.0
${4:-}
TOML
}

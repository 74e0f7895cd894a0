#!/usr/bin/env bash
# The demo: set up, build, start a private Redis and `rlvrd serve` in a temporary state
# directory, show the loaded plugins, verify a few completions with `rlvrctl verify` (format, then
# math with --explain), and stop everything cleanly — no process or file left behind, on success,
# failure or Ctrl-C.
#
# First run: about 3 minutes on 2 cores (torch download, release build); later runs seconds.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$RLVR_ROOT"

step "set-up (scripts/setup.sh)"
rlvr_setup

step "build (release)"
cargo build --release -p rlvr-daemon -p rlvr-verifier-format -p rlvr-verifier-math
bin=$RLVR_ROOT/target/release

work=$(mktemp -d "${TMPDIR:-/tmp}/rlvr-demo.XXXXXX")
pids=()
# Whether a child still runs (a zombie, dead but not yet reaped, does not count).
running() {
    [ -e "/proc/$1" ] && ! grep -q ') Z ' "/proc/$1/stat" 2>/dev/null
}
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    # Stop in reverse start order: the daemon first (SIGTERM: it finishes in-flight requests),
    # then Redis; SIGKILL whatever has not stopped after 5 seconds.
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
        local pid=${pids[i]}
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 50); do running "$pid" || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$work"
    if [ "$status" -ne 0 ]; then echo "demo failed (exit $status); everything it started is stopped" >&2; fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() {
    "$RLVR_VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

step "private Redis and rlvrd serve in $work"
mkdir -p "$work/redis" "$work/state" "$work/plugins"
redis_port=$(free_port)
"$RLVR_REDIS_SERVER" --port "$redis_port" --bind 127.0.0.1 --dir "$work/redis" --save '' \
    --appendonly no --logfile "$work/redis/redis.log" &
pids+=($!)

cp "$bin/librlvr_verifier_format.so" "$bin/librlvr_verifier_math.so" "$work/plugins/"
cat >"$work/rlvrd.toml" <<TOML
[daemon]
state_dir = "$work/state"
[redis]
url = "redis://127.0.0.1:$redis_port"
[api]
listen = "127.0.0.1:0"
[plugins]
dirs = ["$work/plugins"]
TOML
"$bin/rlvrd" validate --config "$work/rlvrd.toml"
"$bin/rlvrd" serve --config "$work/rlvrd.toml" 2>"$work/rlvrd.log" &
pids+=($!)

for _ in $(seq 100); do
    [ -s "$work/state/rlvrd.addr" ] && break
    kill -0 "${pids[1]}" 2>/dev/null || { cat "$work/rlvrd.log" >&2; exit 1; }
    sleep 0.1
done
[ -s "$work/state/rlvrd.addr" ] || { echo "rlvrd did not start listening" >&2; cat "$work/rlvrd.log" >&2; exit 1; }
export RLVR_SERVER="http://$(cat "$work/state/rlvrd.addr")"
echo "rlvrd is serving on $RLVR_SERVER"

step "rlvrctl plugins"
"$bin/rlvrctl" plugins

step "rlvrctl verify --plugin format (one JSON line in, one out)"
cat >"$work/items.jsonl" <<'JSONL'
{"id": "good", "prompt": "What is 2+3?", "completion": "<think>2 plus 3 is 5.</think> 5", "reference": {}}
{"id": "no-think", "prompt": "What is 2+3?", "completion": "5", "reference": {}}
{"id": "two-blocks", "prompt": "What is 2+3?", "completion": "<think>a</think><think>b</think> 5", "reference": {}}
{"id": "answer-inside-think", "prompt": "What is 2+3?", "completion": "<think>so it is 5</think>", "reference": {}}
{"id": "broken", "prompt": "What is 2+3?", "completion": 5}
JSONL
sed 's/^/  in:  /' "$work/items.jsonl"
"$bin/rlvrctl" verify --plugin format --plugin-dir "$work/plugins" --jsonl "$work/items.jsonl" | sed 's/^/  out: /'

step "rlvrctl verify --plugin math --explain (equivalence, not string match; hedging fails)"
cat >"$work/math.jsonl" <<'JSONL'
{"id": "fraction", "completion": "<think>1/4 + 1/4</think> So the answer is $\\boxed{\\dfrac{2}{4}}$.", "reference": {"answer": "0.5"}}
{"id": "hedge", "completion": "It is $\\boxed{1}$ or maybe $\\boxed{2}$.", "reference": {"answer": "2"}}
{"id": "too-rough", "completion": "$\\boxed{0.33}$", "reference": {"answer": "\\frac{1}{3}"}}
{"id": "factorials", "completion": "$\\boxed{\\frac{1}{2006!}}$", "reference": {"answer": "\\frac{1}{2004!}"}}
JSONL
sed 's/^/  in:  /' "$work/math.jsonl"
"$bin/rlvrctl" verify --plugin math --plugin-dir "$work/plugins" --explain --jsonl "$work/math.jsonl" | sed 's/^/  out: /'

step "stopping"
echo "demo finished: rlvrd and Redis stopped, $work removed"

#!/usr/bin/env bash
# Throughput of the code verifier against the bare interpreter, as a markdown table.
#
# Trivial solutions (one assert, or one stdin/stdout pair) through `rlvrctl verify --plugin code`
# with every isolation layer on, against `python3 -c pass` spawned the same number of times at
# the same parallelism. Rounds alternate (bare, asserts, io) and the best round of each counts, so
# other load on the machine hurts both sides alike. Builds the plugin and rlvrctl first (debug by
# default; PROFILE=release for release). Takes about a minute on 2 cores.
#
#   scripts/bench/code-verifier.sh [RUNS=300] [PARALLEL=2] [ROUNDS=3]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
RUNS="${1:-300}"
PARALLEL="${2:-2}"
ROUNDS="${3:-3}"
PROFILE="${PROFILE:-debug}"
PYTHON="${PYTHON:-/usr/bin/python3}"
[ -f "$HOME/.cache/rlvr/env.sh" ] && source "$HOME/.cache/rlvr/env.sh"

# Two builds: with `--bin rlvrctl` in the same command, cargo would build no library at all.
profile_flag=()
[ "$PROFILE" = release ] && profile_flag=(--release)
cargo build --quiet "${profile_flag[@]}" -p rlvr-verifier-code
cargo build --quiet "${profile_flag[@]}" -p rlvr-cli
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}/$PROFILE"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir "$WORK/plugins"
cp "$TARGET/librlvr_verifier_code.so" "$WORK/plugins/"
"$PYTHON" - "$WORK" "$RUNS" <<'EOF'
import json, sys
work, runs = sys.argv[1], int(sys.argv[2])
with open(f"{work}/asserts.jsonl", "w") as out:
    for i in range(runs):
        item = {"id": str(i), "completion": "def f(x):\n    return x + 1\n",
                "reference": {"language": "python", "asserts": ["assert f(1) == 2"]}}
        out.write(json.dumps(item) + "\n")
with open(f"{work}/io.jsonl", "w") as out:
    for i in range(runs):
        item = {"id": str(i), "completion": "print(int(input()) + 1)",
                "reference": {"language": "python", "io": [{"stdin": "1\n", "stdout": "2\n"}]}}
        out.write(json.dumps(item) + "\n")
EOF

seconds() { # command... -> wall seconds
    local start end
    start=$(date +%s.%N)
    "$@" >/dev/null 2>"$WORK/stderr" || { cat "$WORK/stderr" >&2; exit 1; }
    end=$(date +%s.%N)
    echo "$end - $start" | bc -l
}
bare() { seq "$RUNS" | xargs -P "$PARALLEL" -I{} "$PYTHON" -c pass; }
verify() {
    "$TARGET/rlvrctl" verify --plugin code --plugin-dir "$WORK/plugins" --parallel "$PARALLEL" \
        --plugin-config "{\"max_parallel\": $PARALLEL, \"python\": \"$PYTHON\"}" --jsonl "$WORK/$1.jsonl"
}
check_all_passed() {
    verify "$1" 2>&1 >/dev/null | grep -q "$RUNS item(s) verified with code@[0-9.]*: $RUNS passed" \
        || { echo "not every $1 item passed:" >&2; verify "$1" 2>&1 >/dev/null | tail -1 >&2; exit 1; }
}
check_all_passed asserts
check_all_passed io

best_bare=999999 best_asserts=999999 best_io=999999
for _ in $(seq "$ROUNDS"); do
    t=$(seconds bare); best_bare=$(echo "if ($t < $best_bare) $t else $best_bare" | bc -l)
    t=$(seconds verify asserts); best_asserts=$(echo "if ($t < $best_asserts) $t else $best_asserts" | bc -l)
    t=$(seconds verify io); best_io=$(echo "if ($t < $best_io) $t else $best_io" | bc -l)
done
rate() { printf "%.0f" "$(echo "$RUNS / $1" | bc -l)"; }
ratio() { printf "%.2f" "$(echo "($RUNS / $1) / ($RUNS / $best_bare)" | bc -l)"; }

echo "| runs/s ($RUNS runs, $PARALLEL at once, best of $ROUNDS, $(nproc) cores) | rate | vs bare |"
echo "|---|---:|---:|"
echo "| bare \`$PYTHON -c pass\` | $(rate "$best_bare") | 1.00 |"
echo "| code verifier, asserts (sandbox + trusted evaluator) | $(rate "$best_asserts") | $(ratio "$best_asserts") |"
echo "| code verifier, io (sandbox, stdout compared) | $(rate "$best_io") | $(ratio "$best_io") |"

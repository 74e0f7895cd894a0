#!/usr/bin/env bash
# One step off policy against on policy: the learning test's recipe (tests/tests/learning.rs: an
# SFT cold start on 300 `a+b=` demonstrations, then LoRA GRPO on 2 000 prompts it has no answers
# for, the math verifier, 200 steps of 64 prompts × 8) with its rollouts on vLLM's server (the
# CPU build from scripts/vllm-venv.sh), run three ways from the same SFT checkpoint, one after the
# other, never at once:
#   native       the worker's own sampler (the reference curve)
#   vllm         vLLM, on policy: each step samples the weights of the update before it
#   vllm-off     vLLM, `off_policy_steps = 1`, `resources.devices = 2`: step t+1's prompts are
#                sampled while step t updates, from the weights before that update
# Held-out accuracy (200 unseen problems, greedy) is scored every E steps (default 25) and at the
# end; the table has each run's curve, its last 25 steps' mean reward, and its step time.
# What it answers: does one step of staleness cost learning, and what does the overlap buy.
# On 2 CPU cores the server and the trainer share the cores, so the overlap buys little time
# here; on a GPU each has a device of its own.
#
# Usage: scripts/bench/off-policy.sh [--steps N] [--eval-every E] [--threads T] [--no-build] [--keep]
#   --steps N        GRPO steps per run (default 200, tests/data/learning/grpo.toml's; the learning
#                    test runs its LoRA job 100 steps natively and 50 on vLLM)
#   --eval-every E   held-out scoring every E steps (default 25)
#   --threads T      the worker's libtorch threads and the server's (default 1, as the test)
#   --no-build       use the release worker and plugins already in target/release
#   --keep           keep the work directory (specs, data, metrics, logs)
# Prints a markdown table on stdout; progress on stderr. About 10 minutes on the 2-core machine.
#
# Example: scripts/bench/off-policy.sh --no-build
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/../lib.sh"
cd "$RLVR_ROOT"

steps=200
eval_every=25
threads=1
keep=0
build=1
command_line="scripts/bench/off-policy.sh $*"
while [ $# -gt 0 ]; do
    case $1 in
        --steps) steps=$2; shift 2 ;;
        --eval-every) eval_every=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        --no-build) build=0; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
for value in "$steps" "$eval_every" "$threads"; do
    [[ $value =~ ^[1-9][0-9]*$ ]] || { echo "error: expected a positive integer, got '$value'" >&2; exit 2; }
done

step "set-up (scripts/setup.sh)"
rlvr_setup
python=$RLVR_VENV/bin/python
load_at_start=$(cut -d' ' -f1-3 /proc/loadavg)

step "the vLLM environment (scripts/vllm-venv.sh)"
vllm_python=$(scripts/vllm-venv.sh)

if [ "$build" = 1 ]; then
    step "build (release): rlvr-worker and the grpo, sft and math plugins; rlvrd (debug) for the data"
    cargo build --release -p rlvr-worker -p rlvr-optimizer-grpo -p rlvr-optimizer-sft -p rlvr-verifier-math
    cargo build -p rlvr-daemon --bin rlvrd
fi
for file in target/release/rlvr-worker target/debug/rlvrd \
    target/release/librlvr_optimizer_grpo.so target/release/librlvr_optimizer_sft.so target/release/librlvr_verifier_math.so; do
    [ -f "$file" ] || { echo "error: $file is missing: build it (drop --no-build)" >&2; exit 1; }
done

bench_work_dir rlvr-bench-off-policy
mkdir -p "$work/plugins"
cp target/release/librlvr_optimizer_grpo.so target/release/librlvr_optimizer_sft.so \
    target/release/librlvr_verifier_math.so "$work/plugins/"

step "data: rlvrd data arith (the learning test's)"
target/debug/rlvrd data arith --seed 11 --max-operand 50 --ops + --pad --sft 300 --train 2000 --heldout 200 \
    --out "$work/data" >/dev/null

# Runs the worker on spec $1 with state dir $2 (and the rest as its extra arguments); its log
# goes to $2.log, its outcome to $2.json.
run_worker() {
    local spec=$1 state=$2
    shift 2
    if ! RLVR_LOG=info target/release/rlvr-worker run --spec "$spec" --state-dir "$state" \
        --plugin-dir "$work/plugins" --device cpu --threads "$threads" "$@" >"$state.json" 2>"$state.log"; then
        echo "error: the run of $spec failed; its log's tail:" >&2
        tail -n 30 "$state.log" >&2
        [ -f "$state/vllm/server.log" ] && tail -n 30 "$state/vllm/server.log" >&2
        keep=1
        exit 1
    fi
}

step "SFT cold start: 300 steps"
# The learning test's specs, from the files it reads (tests/tests/learning.rs).
learning=tests/data/learning
sed "s|{data}|$work/data|" "$learning/sft.toml" >"$work/sft.toml"
run_worker "$work/sft.toml" "$work/sft"
policy=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["checkpoint"])' "$work/sft.json")/model

# The learning test's LoRA GRPO job (grpo.toml with the test's LoRA changes: its `LORA` adapters
# and lr 2e-3), $steps steps, held-out every $eval_every; $1: the run's name, $2: lines added
# under [rollout] (each after a newline), $3: sections appended.
grpo_spec() {
    local out=$work/$1.toml
    sed -e "s|{data}|$work/data|" -e "s|{policy}|$policy|" -e 's|^lr = 5e-4$|lr = 2e-3|' \
        -e "s|^max_steps = 200$|max_steps = $steps|" -e 's|^\[data\]$|lora = { rank = 16, alpha = 32.0 }\n[data]|' \
        -e "s|^temperature = 0.85$|temperature = 0.85$2|" "$learning/grpo.toml" >"$out"
    printf '[eval]\nevery_steps = %s\n%s' "$eval_every" "$3" >>"$out"
    for line in 'lr = 2e-3' "max_steps = $steps" 'lora = { rank = 16, alpha = 32.0 }'; do
        grep -qxF "$line" "$out" || { echo "error: $learning/grpo.toml changed: no '$line' in $out" >&2; exit 1; }
    done
}

runs=(native vllm vllm-off)
grpo_spec native "" ""
grpo_spec vllm '\nengine = "vllm"' ""
grpo_spec vllm-off '\nengine = "vllm"\noff_policy_steps = 1' $'[resources]\ndevices = 2\n'
for run in "${runs[@]}"; do
    step "GRPO LoRA, $run: $steps steps"
    extra=()
    [ "$run" != native ] && extra=(--vllm-python "$vllm_python")
    run_worker "$work/$run.toml" "$work/$run" "${extra[@]}"
done
load_at_end=$(cut -d' ' -f1-3 /proc/loadavg)

step "results"
BENCH_COMMAND=$command_line \
BENCH_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ) \
BENCH_MACHINE="$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); load average at start $load_at_start, at end $load_at_end" \
BENCH_COMMIT="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- 2>/dev/null || echo ' (working tree modified)')" \
BENCH_SFT=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["heldout_after"])' "$work/sft.json") \
    "$python" - "$work" "${runs[@]}" <<'PY'
import json
import os
import statistics
import sys

env = os.environ
work, runs = sys.argv[1], sys.argv[2:]
curves, rows = {}, []
for run in runs:
    lines = [json.loads(line) for line in open(os.path.join(work, run, "metrics.jsonl"))]
    curves[run] = {line["step"]: line["heldout"]["accuracy"] for line in lines if line.get("heldout")}
    trained = [line for line in lines if "reward_mean" in line]
    last = trained[-25:]
    times = [line["time"]["step_s"] for line in trained[1:]]
    lags = sorted({line.get("policy_lag") for line in trained} - {None})
    gaps = [line["sampler_gap"]["max_abs"] for line in trained if line.get("sampler_gap")]
    rows.append((run, statistics.mean(line["reward_mean"] for line in last), statistics.median(times), lags, max(gaps) if gaps else None))

print("## One step off policy vs on policy: LoRA GRPO on vLLM (the learning test's job)")
print()
print(f"- command: `{env['BENCH_COMMAND']}`")
print(f"- date: {env['BENCH_DATE']}; commit {env['BENCH_COMMIT']}")
print(f"- machine: {env['BENCH_MACHINE']}")
print(f"- start: the SFT checkpoint, held-out accuracy {float(env['BENCH_SFT']):.3f}")
print()
steps = sorted(set().union(*curves.values()))
print("| held-out accuracy at step | " + " | ".join(runs) + " |")
print("|---:|" + "---:|" * len(runs))
for step in steps:
    print(f"| {step} | " + " | ".join(f"{curves[run].get(step, float('nan')):.3f}" for run in runs) + " |")
print()
print("| run | mean reward, last 25 steps | step s (median) | policy lag | sampler gap max |")
print("|---|---:|---:|---|---:|")
for run, reward, step_s, lags, gap in rows:
    gap = "—" if gap is None else f"{gap:.1e}"
    print(f"| {run} | {reward:.3f} | {step_s:.2f} | {lags or '—'} | {gap} |")
PY

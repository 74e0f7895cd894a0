#!/usr/bin/env bash
# A short real run, not a test: our worker trains SmolLM2-135M-Instruct (f32, CPU) on the
# two-digit arithmetic word problems of scripts/bench/arith_words.py for a wall-clock budget
# (default 30 minutes in all), as design.md §5 says a real run should: a cold-start SFT stage on
# worked demonstrations, then GRPO with the math verifier from its checkpoint. It reports the
# held-out accuracy of the instruct model, after SFT and after GRPO (greedy, the math verifier, all
# 200 held-out problems unless --heldout-prompts; the worker scores at step 0 and at the end of
# each stage), and the GRPO stage's learning signal.
#
# Why the SFT stage: the instruct model never writes the \boxed{} the prompts ask for (0 of 16
# sampled and 16 greedy completions, 2026-11-21) and at temperature 1 rambles past 64 tokens, so
# GRPO alone sees all-fail groups, whose advantages are all zero. The SFT stage
# (scripts/bench/sft-job.toml; --sft-minutes, default 8) trains on "a + b = c. The answer is
# \boxed{c}." demonstrations whose problems are disjoint from the held-out ones. The GRPO stage is
# scripts/bench/trainer-job.toml, the benchmark's job (8 completions per prompt, β 0.04, μ 1), with
# the rest of the budget, a checkpoint every 25 steps, and for a run that can learn in minutes:
#   max_new_tokens 128 (not 64): room for the model to explain if it still does;
#   lr 5e-6 (not 1e-6): at 1e-6 some tens of steps barely move a 135M model;
#   4 prompts per step (not 1): fewer steps, but each with more groups that carry signal.
# None of these is tuned beyond that reasoning. --sft-minutes 0 runs GRPO alone.
#
# Usage: scripts/bench/smollm2-arith.sh [--minutes M] [--sft-minutes S] [--seed S] [--state-dir DIR]
#                                       [--heldout-prompts N] [--max-new-tokens T] [--lr LR]
#                                       [--sft-lr LR] [--prompts-per-step P] [--threads T]
#   --minutes M          wall budget of both stages' training (default 30)
#   --sft-minutes S      of which the SFT stage (default 8; 0: no SFT stage)
#   --state-dir DIR      where the run is kept: DIR/sft and DIR/grpo hold each stage's state,
#                        metrics.jsonl and rollouts.jsonl (default
#                        $RLVR_CACHE_DIR/runs/smollm2-arith-<UTC time>)
#   --heldout-prompts N  score only the first N held-out problems (default all 200)
#   --max-new-tokens T, --lr LR, --prompts-per-step P   GRPO's (defaults 128, 5e-6, 4)
#   --sft-lr LR          SFT's learning rate (default 2e-5)
#   --threads T          libtorch threads of the workers (default: the cores)
# Takes the budget plus four held-out passes and start-up: about 40 minutes on 2 cores.
# A worker is killed (and the script fails) if it runs 30 minutes past its stage's budget.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/../lib.sh"
cd "$RLVR_ROOT"

minutes=30
sft_minutes=8
seed=0
state_dir=
heldout_prompts=
max_new_tokens=128
lr=5e-6
sft_lr=2e-5
prompts_per_step=4
threads=$(nproc)
while [ $# -gt 0 ]; do
    case $1 in
        --minutes) minutes=$2; shift 2 ;;
        --sft-minutes) sft_minutes=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        --state-dir) state_dir=$2; shift 2 ;;
        --heldout-prompts) heldout_prompts=$2; shift 2 ;;
        --max-new-tokens) max_new_tokens=$2; shift 2 ;;
        --lr) lr=$2; shift 2 ;;
        --sft-lr) sft_lr=$2; shift 2 ;;
        --prompts-per-step) prompts_per_step=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
for value in "$minutes" "$sft_minutes" "$seed" "$max_new_tokens" "$prompts_per_step" "$threads" ${heldout_prompts:+"$heldout_prompts"}; do
    [[ $value =~ ^[0-9]+$ ]] || { echo "error: expected a non-negative integer, got '$value'" >&2; exit 2; }
done
[ "$sft_minutes" -lt "$minutes" ] || { echo "error: --sft-minutes ($sft_minutes) must leave GRPO some of --minutes ($minutes)" >&2; exit 2; }
[ "$threads" -ge 1 ] || { echo "error: --threads must be at least 1" >&2; exit 2; }
for value in "$lr" "$sft_lr"; do
    [[ $value =~ ^[0-9.]+([eE]-?[0-9]+)?$ ]] || { echo "error: a learning rate is a number like 5e-6, got '$value'" >&2; exit 2; }
done

state_dir=${state_dir:-$RLVR_CACHE_DIR/runs/smollm2-arith-$(date -u +%Y%m%dT%H%M%SZ)}
if [ -e "$state_dir/grpo/metrics.jsonl" ] || [ -e "$state_dir/sft/metrics.jsonl" ]; then
    echo "error: $state_dir already holds a run; give another --state-dir" >&2
    exit 2
fi

step "set-up (scripts/setup.sh)"
rlvr_setup
python=$RLVR_VENV/bin/python

step "SmolLM2-135M-Instruct (scripts/fetch-smollm2.sh)"
model=$(scripts/fetch-smollm2.sh)

step "build (release): rlvrd and the sft, grpo and math plugins"
cargo build --release -p rlvr-daemon -p rlvr-worker -p rlvr-optimizer-sft -p rlvr-optimizer-grpo -p rlvr-verifier-math

run=$state_dir/run
mkdir -p "$run/plugins"
for plugin in optimizer_sft optimizer_grpo verifier_math; do
    cp "target/release/librlvr_$plugin.so" "$run/plugins/"
done

step "data: arith_words.py (seed $seed) into $run/data"
"$python" scripts/bench/arith_words.py --out "$run/data" --seed "$seed" --sft 4000

toml_string() {
    "$python" -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$1"
}

# Runs one stage's worker: $1 stage name, $2 job spec, $3 its wall budget in minutes. Fails the
# script (with the state directory named) when the worker fails or overruns by 30 minutes.
train() {
    local stage=$1 spec=$2 budget=$3
    step "$stage: rlvr-worker run for $budget minutes (state in $state_dir/$stage)"
    local limit=$((budget * 60 + 1800)) rc=0 started
    started=$(date +%s)
    timeout --kill-after=30 "$limit" \
        target/release/rlvr-worker run --spec "$spec" --state-dir "$state_dir/$stage" \
        --plugin-dir "$run/plugins" --device cpu --threads "$threads" >"$run/$stage-outcome.json" || rc=$?
    echo "$(($(date +%s) - started))" >"$run/$stage-elapsed"
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        echo "error: the $stage worker was still running $limit s after it started (budget $budget min + 30): killed" >&2
        exit 1
    elif [ "$rc" != 0 ]; then
        echo "error: the $stage worker failed (exit status $rc); state in $state_dir/$stage" >&2
        exit 1
    fi
}

# Each template with its @NAME@ placeholders filled; a line whose value is empty is dropped.
policy=$model
if [ "$sft_minutes" -gt 0 ]; then
    "$python" scripts/bench/render_job.py scripts/bench/sft-job.toml "$run/sft.toml" \
        SEED="$seed" MODEL="$(toml_string "$model")" \
        TRAIN="$(toml_string "$run/data/sft.jsonl")" HELDOUT="$(toml_string "$run/data/heldout.jsonl")" \
        MAX_NEW_TOKENS="$max_new_tokens" LR="$sft_lr" MAX_WALL_MINUTES="$sft_minutes" \
        HELDOUT_PROMPTS="$heldout_prompts"
    train sft "$run/sft.toml" "$sft_minutes"
    policy=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["checkpoint"] + "/model")' "$run/sft-outcome.json")
fi
grpo_minutes=$((minutes - sft_minutes))
"$python" scripts/bench/render_job.py scripts/bench/trainer-job.toml "$run/grpo.toml" \
    SEED="$seed" MODEL="$(toml_string "$policy")" \
    TRAIN="$(toml_string "$run/data/train.jsonl")" HELDOUT="$(toml_string "$run/data/heldout.jsonl")" \
    MAX_NEW_TOKENS="$max_new_tokens" PROMPTS_PER_STEP="$prompts_per_step" LR="$lr" \
    MAX_STEPS=1000000 MAX_WALL_MINUTES="$grpo_minutes" CHECKPOINT_EVERY=25 HELDOUT_PROMPTS="$heldout_prompts"
train grpo "$run/grpo.toml" "$grpo_minutes"

step "results"
"$python" - "$state_dir" "$minutes" "$sft_minutes" <<'PY'
import json, os, statistics, sys

state_dir, minutes, sft_minutes = sys.argv[1], sys.argv[2], int(sys.argv[3])

sys.path.insert(0, "scripts/bench")
from worker_metrics import flat  # noqa: E402


def stage(name):
    path = os.path.join(state_dir, name, "metrics.jsonl")
    lines = [flat(json.loads(line)) for line in open(path) if line.strip()]
    steps = [line for line in lines if line.get("time.step_s") is not None]
    accuracy = [(line.get("step"), line["heldout.accuracy"]) for line in lines if line.get("heldout.accuracy") is not None]
    if len(accuracy) < 2:
        sys.exit(f"{path}: expected heldout.accuracy at step 0 and at the end, found {accuracy}")
    elapsed = int(open(os.path.join(state_dir, "run", f"{name}-elapsed")).read())
    return path, steps, accuracy, elapsed


def mean_of(key, rows):
    values = [float(row[key]) for row in rows if row.get(key) is not None]
    return f"{statistics.fmean(values):.3f}" if values else "—"


print("## SmolLM2-135M-Instruct on two-digit word problems (scripts/bench/smollm2-arith.sh)")
print()
print(f"- budget {minutes} min in all, {sft_minutes} of them SFT")
if sft_minutes > 0:
    path, steps, accuracy, elapsed = stage("sft")
    print(f"- SFT: {len(steps)} steps in {elapsed / 60:.1f} min (with start-up and held-out passes), median step {statistics.median(r['time.step_s'] for r in steps):.2f} s")
    print(f"- held-out accuracy, instruct model: {accuracy[0][1]:.3f}; after SFT: {accuracy[-1][1]:.3f}")
path, steps, accuracy, elapsed = stage("grpo")
tokens = sum(int(row.get("tokens_generated") or 0) for row in steps)
print(f"- GRPO: {len(steps)} steps in {elapsed / 60:.1f} min, {tokens} completion tokens, median step {statistics.median(r['time.step_s'] for r in steps):.1f} s")
print(f"- held-out accuracy, GRPO: {accuracy[0][1]:.3f} (step {accuracy[0][0]}) → {accuracy[-1][1]:.3f} (step {accuracy[-1][0]})")
# The learning signal, whatever the worker names it: reward, all-pass/all-fail, length, KL.
head, tail = steps[:10], steps[-10:]
keys = sorted(
    {
        key
        for row in steps
        for key, value in row.items()
        if isinstance(value, (int, float)) and any(word in key for word in ("reward", "all_", "len", "kl"))
    }
)
for key in keys:
    print(f"- {key}: first 10 steps {mean_of(key, head)}, last 10 steps {mean_of(key, tail)}")
print(f"- metrics: {path}")
PY

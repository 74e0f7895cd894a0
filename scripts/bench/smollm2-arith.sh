#!/usr/bin/env bash
# A short real run, not a test: our worker trains SmolLM2-135M-Instruct (f32, CPU) with GRPO on the
# two-digit arithmetic word problems of scripts/bench/arith_words.py for a wall-clock budget
# (default 30 minutes: `[budget] max_wall_minutes`), and reports the held-out accuracy before the
# first step and at the end (the worker writes `heldout.accuracy` to metrics.jsonl at step 0 and
# at the end; greedy, the math verifier, all 200 held-out problems unless --heldout-prompts).
#
# The job is scripts/bench/trainer-job.toml, the benchmark's GRPO (8 completions per prompt,
# β 0.04, μ 1, the math verifier), with the wall budget instead of a step count, a checkpoint
# every 25 steps, and three changes for a run that can learn something in half an hour:
#   max_new_tokens 128 (not 64): SmolLM2-135M-Instruct explains before it answers; at 64 tokens
#     75–100% of its completions were cut off in the TRL runs, and a cut-off answer scores 0;
#   lr 5e-6 (not 1e-6): at 1e-6 some tens of steps barely move a 135M model;
#   one prompt per step, as the benchmark, so the budget buys as many updates as it can.
# None of these is tuned. Expect little to move: the model never wrote \boxed{} in 16 sampled
# and 16 greedy completions (256 tokens, 2026-11-21); the math verifier also reads "the answer
# is …" / "answer: …", which it does write sometimes, so groups are mostly all-fail and a few
# carry signal (design.md §5: real runs want a cold-start SFT stage, a format reward, prompts near
# the frontier). The run's point is that a real model trains end to end for half an hour:
# steps, metrics, held-out scoring, checkpoints.
#
# Usage: scripts/bench/smollm2-arith.sh [--minutes M] [--seed S] [--state-dir DIR]
#                                       [--heldout-prompts N] [--max-new-tokens T] [--lr LR]
#                                       [--prompts-per-step P]
#   --minutes M          wall budget of the training (default 30)
#   --state-dir DIR      where the worker keeps its state, metrics.jsonl and rollouts.jsonl
#                        (default $RLVR_CACHE_DIR/runs/smollm2-arith-<UTC time>; kept)
#   --heldout-prompts N  score only the first N held-out problems (default all 200)
#   --max-new-tokens T, --lr LR, --prompts-per-step P   (defaults 128, 5e-6, 1)
# Takes the budget plus the two held-out passes and start-up: about 35–45 minutes on 2 cores.
# The worker is killed (and the script fails) if it runs 30 minutes past its budget.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/../lib.sh"
cd "$RLVR_ROOT"

minutes=30
seed=0
state_dir=
heldout_prompts=
max_new_tokens=128
lr=5e-6
prompts_per_step=1
while [ $# -gt 0 ]; do
    case $1 in
        --minutes) minutes=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        --state-dir) state_dir=$2; shift 2 ;;
        --heldout-prompts) heldout_prompts=$2; shift 2 ;;
        --max-new-tokens) max_new_tokens=$2; shift 2 ;;
        --lr) lr=$2; shift 2 ;;
        --prompts-per-step) prompts_per_step=$2; shift 2 ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
for value in "$minutes" "$seed" "$max_new_tokens" "$prompts_per_step" ${heldout_prompts:+"$heldout_prompts"}; do
    [[ $value =~ ^[0-9]+$ ]] || { echo "error: expected a non-negative integer, got '$value'" >&2; exit 2; }
done
[ "$minutes" -ge 1 ] || { echo "error: --minutes must be at least 1" >&2; exit 2; }
[[ $lr =~ ^[0-9.]+([eE]-?[0-9]+)?$ ]] || { echo "error: --lr expects a number like 5e-6, got '$lr'" >&2; exit 2; }

state_dir=${state_dir:-$RLVR_CACHE_DIR/runs/smollm2-arith-$(date -u +%Y%m%dT%H%M%SZ)}
if [ -e "$state_dir/metrics.jsonl" ]; then
    echo "error: $state_dir already holds a run (metrics.jsonl); give another --state-dir" >&2
    exit 2
fi

step "set-up (scripts/setup.sh)"
rlvr_setup
python=$RLVR_VENV/bin/python

step "SmolLM2-135M-Instruct (scripts/fetch-smollm2.sh)"
model=$(scripts/fetch-smollm2.sh)

step "build (release): rlvrd and the grpo and math plugins"
cargo build --release -p rlvr-daemon -p rlvr-optimizer-grpo -p rlvr-verifier-math

mkdir -p "$state_dir/run/plugins"
run=$state_dir/run
cp target/release/librlvr_optimizer_grpo.so target/release/librlvr_verifier_math.so "$run/plugins/"

step "data: arith_words.py (seed $seed) into $run/data"
"$python" scripts/bench/arith_words.py --out "$run/data" --seed "$seed"

toml_string() {
    "$python" -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$1"
}
# trainer-job.toml with its @NAME@ placeholders filled; a line whose value is empty is dropped.
"$python" scripts/bench/render_job.py scripts/bench/trainer-job.toml "$run/job.toml" \
    SEED="$seed" MODEL="$(toml_string "$model")" \
    TRAIN="$(toml_string "$run/data/train.jsonl")" HELDOUT="$(toml_string "$run/data/heldout.jsonl")" \
    MAX_NEW_TOKENS="$max_new_tokens" PROMPTS_PER_STEP="$prompts_per_step" LR="$lr" \
    MAX_STEPS=1000000 MAX_WALL_MINUTES="$minutes" CHECKPOINT_EVERY=25 HELDOUT_PROMPTS="$heldout_prompts"
echo "job spec: $run/job.toml" >&2

step "train: rlvrd worker for $minutes minutes (state in $state_dir)"
started=$(date +%s)
limit=$((minutes * 60 + 1800))
rc=0
timeout --kill-after=30 "$limit" \
    target/release/rlvrd worker --spec "$run/job.toml" --state-dir "$state_dir" \
    --plugin-dir "$run/plugins" --device cpu || rc=$?
elapsed=$(($(date +%s) - started))
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "error: the worker was still running $limit s after it started (budget $minutes min + 30): killed" >&2
    exit 1
elif [ "$rc" != 0 ]; then
    echo "error: the worker failed (exit status $rc) after $elapsed s; state in $state_dir" >&2
    exit 1
fi

step "results"
"$python" - "$state_dir/metrics.jsonl" "$elapsed" "$minutes" <<'PY'
import json, statistics, sys

path, elapsed, minutes = sys.argv[1], int(sys.argv[2]), sys.argv[3]


def flat(record, prefix=""):
    out = {}
    for key, value in record.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


lines = [flat(json.loads(line)) for line in open(path) if line.strip()]
steps = [line for line in lines if line.get("time.step_s") is not None]
accuracy = [(line.get("step"), line["heldout.accuracy"]) for line in lines if line.get("heldout.accuracy") is not None]
if len(accuracy) < 2:
    sys.exit(f"{path}: expected heldout.accuracy at step 0 and at the end, found {accuracy}")


def mean_of(key, rows):
    values = [float(row[key]) for row in rows if row.get(key) is not None]
    return f"{statistics.fmean(values):.3f}" if values else "—"


head, tail = steps[:10], steps[-10:]
tokens = sum(int(row.get("tokens_generated") or 0) for row in steps)
print("## SmolLM2-135M-Instruct, GRPO on two-digit word problems (scripts/bench/smollm2-arith.sh)")
print()
print(f"- budget {minutes} min; worker wall time {elapsed / 60:.1f} min (with start-up and both held-out passes)")
print(f"- {len(steps)} steps, {tokens} completion tokens, median step {statistics.median(r['time.step_s'] for r in steps):.1f} s")
print(f"- held-out accuracy: {accuracy[0][1]:.3f} (step {accuracy[0][0]}) → {accuracy[-1][1]:.3f} (step {accuracy[-1][0]})")
# The learning signal, whatever the worker names it: reward, all-pass/all-fail, length, KL.
keys = sorted(
    {
        key
        for row in steps
        for key, value in row.items()
        if isinstance(value, (int, float)) and any(word in key for word in ("reward", "all_", "length", "kl"))
    }
)
for key in keys:
    print(f"- {key}: first 10 steps {mean_of(key, head)}, last 10 steps {mean_of(key, tail)}")
print(f"- metrics: {path}")
PY

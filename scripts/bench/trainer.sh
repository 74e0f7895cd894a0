#!/usr/bin/env bash
# Trainer benchmark: our worker (`rlvr-worker run`, release build, the grpo and math plugins) against
# TRL's GRPOTrainer (scripts/bench/trl_grpo.py) on the same GRPO job, one after the other in one
# run (never at once): SmolLM2-135M-Instruct (scripts/fetch-smollm2.sh), f32 on CPU, two-digit
# arithmetic word problems (scripts/bench/arith_words.py), one prompt × 8 completions of at most 64
# new tokens per step, β 0.04, μ 1, lr 1e-6. Our job is scripts/bench/trainer-job.toml filled in.
#
# Each side runs W warm-up steps and then N measured steps; medians are over the N. Per step:
#   step time         ours: time.step_s; TRL: on_step_begin -> on_step_end
#   rollout time      ours: time.rollout_s; TRL: GRPOTrainer._generate (template, generate, decode)
#   update time       step − rollout − verify, on both sides (reference and policy passes, the
#                     optimizer); ours as it reports it (time.update_s) is shown too
#   generation tok/s  ours: time.generation_tokens_per_s; TRL: completion tokens / rollout time
#   update tok/s      completion tokens of the step / update time
#   peak RSS          ours: the worker process's ru_maxrss; TRL: the Python process's ru_maxrss
# Target: our median step time ≤ 0.5× TRL's.
#
# Our worker's failure (non-zero exit, a timeout, or fewer step lines in metrics.jsonl than steps
# asked) ends the run with an error and its log tail; TRL is not run then.
#
# Usage: scripts/bench/trainer.sh [--steps N] [--warmup W] [--seed S] [--only rlvr|trl]
#                                 [--worker-timeout SECONDS] [--no-build [--bin-dir DIR]] [--keep]
#                                 [--json DIR]
#   --steps N            measured steps per side (default 10)
#   --warmup W           warm-up steps per side, not measured (default 2)
#   --only rlvr|trl      run one side; the table shows the other as —
#   --worker-timeout S   kill our worker after S seconds and fail (default 3600)
#   --threads T          libtorch/torch CPU threads on both sides (default: the cores). On a
#                        shared machine use 1: spinning thread pools collapse under contention
#   --no-build           use the release binaries and plugins already in target/release
#   --bin-dir DIR        with --no-build: take them from DIR instead
#   --keep               keep the work directory (job spec, data, metrics, TRL result, logs)
#   --json DIR           also copy each side's figures there (rlvr.json, trl.json: the medians
#                        and per-step figures of worker_metrics.py and trl_grpo.py)
# Prints a markdown table on stdout; progress on stderr. A full run (W=2, N=10) is 24 steps in
# all, plus the build and both sides' start-up; TRL's steps took 60–240 s each on the 2-core
# machine while it was busy with builds (2026-11-21), so expect from several minutes (quiet) to
# about an hour (busy).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/../lib.sh"
cd "$RLVR_ROOT"

steps=10
warmup=2
seed=0
only=
worker_timeout=3600
threads=$(nproc)
keep=0
json_dir=
bin_dir=target/release
build=1
command_line="scripts/bench/trainer.sh $*"
while [ $# -gt 0 ]; do
    case $1 in
        --steps) steps=$2; shift 2 ;;
        --warmup) warmup=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        --only) only=$2; shift 2 ;;
        --worker-timeout) worker_timeout=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        --json) json_dir=$2; shift 2 ;;
        --bin-dir) bin_dir=$2; shift 2 ;;
        --no-build) build=0; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
case $only in "" | rlvr | trl) ;; *) echo "error: --only takes rlvr or trl, got $only" >&2; exit 2 ;; esac
for value in "$steps" "$warmup" "$seed" "$worker_timeout" "$threads"; do
    [[ $value =~ ^[0-9]+$ ]] || { echo "error: expected a non-negative integer, got '$value'" >&2; exit 2; }
done
[ "$steps" -ge 1 ] || { echo "error: --steps must be at least 1" >&2; exit 2; }
total=$((warmup + steps))

step "set-up (scripts/setup.sh)"
rlvr_setup
python=$RLVR_VENV/bin/python
load_at_start=$(cut -d' ' -f1-3 /proc/loadavg)

step "SmolLM2-135M-Instruct (scripts/fetch-smollm2.sh)"
model=$(scripts/fetch-smollm2.sh)

bench_work_dir rlvr-bench-trainer

step "data: arith_words.py (seed $seed)"
"$python" scripts/bench/arith_words.py --out "$work/data" --seed "$seed"

# Runs a command with a wall-clock limit, its output on our stderr; writes {rc, wall_s,
# peak_rss_mb, timed_out} to $1 (scripts/bench/run_measured.py).
run_measured() {
    "$python" scripts/bench/run_measured.py "$@"
}

# The job spec: trainer-job.toml with its @NAME@ placeholders replaced by the TOML values given
# as NAME=VALUE; a line whose value is given empty is dropped (the key stays unset).
render_job() {
    local out=$1
    shift
    "$python" scripts/bench/render_job.py scripts/bench/trainer-job.toml "$out" "$@"
}

toml_string() {
    "$python" -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$1"
}

rlvr_json=
if [ "$only" != trl ]; then
    if [ "$build" = 1 ]; then
        step "build (release): rlvrd and the grpo and math plugins"
        cargo build --release -p rlvr-worker -p rlvr-optimizer-grpo -p rlvr-verifier-math
    fi
    mkdir -p "$work/plugins" "$work/state"
    for file in "$bin_dir/rlvr-worker" "$bin_dir/librlvr_optimizer_grpo.so" "$bin_dir/librlvr_verifier_math.so"; do
        [ -f "$file" ] || { echo "error: $file is missing: build it (drop --no-build)" >&2; exit 1; }
    done
    cp "$bin_dir/librlvr_optimizer_grpo.so" "$bin_dir/librlvr_verifier_math.so" "$work/plugins/"

    render_job "$work/job.toml" \
        SEED="$seed" MODEL="$(toml_string "$model")" \
        TRAIN="$(toml_string "$work/data/train.jsonl")" HELDOUT="$(toml_string "$work/data/heldout.jsonl")" \
        MAX_NEW_TOKENS=64 PROMPTS_PER_STEP=1 LR=1e-6 \
        MAX_STEPS="$total" MAX_WALL_MINUTES= CHECKPOINT_EVERY="$((total + 1))" HELDOUT_PROMPTS=8

    step "ours: rlvr-worker run, $warmup + $steps steps (limit ${worker_timeout} s)"
    run_measured "$work/rlvr-run.json" "$worker_timeout" \
        "$bin_dir/rlvr-worker" run --spec "$work/job.toml" --state-dir "$work/state" \
        --plugin-dir "$work/plugins" --device cpu --threads "$threads"
    rlvr_json=$work/rlvr.json
    # Medians over the measured steps, or the reason there are none (scripts/bench/worker_metrics.py).
    if ! "$python" scripts/bench/worker_metrics.py "$work/rlvr-run.json" "$work/state/metrics.jsonl" "$warmup" "$steps" >"$rlvr_json"
    then
        echo "error: see our worker's output above; job spec and state in $work (kept)" >&2
        keep=1
        exit 1
    fi
    echo "ours: median step $("$python" -c 'import json, sys; print(round(json.load(open(sys.argv[1]))["median_step_s"], 2))' "$rlvr_json") s" >&2
fi

trl_json=
if [ "$only" != rlvr ]; then
    step "TRL: GRPOTrainer (scripts/bench/trl_grpo.py), $warmup + $steps steps"
    trl_json=$work/trl.json
    # TRL in its own venv (its hashed lock; the project venv's torch), never in the project venv.
    trl_python=$(scripts/engine-venv.sh trl)
    "$trl_python" scripts/bench/trl_grpo.py --model "$model" --train "$work/data/train.jsonl" \
        --steps "$steps" --warmup "$warmup" --seed "$seed" --threads "$threads" >"$trl_json"
fi

if [ -n "$json_dir" ]; then
    mkdir -p "$json_dir"
    for file in $rlvr_json $trl_json; do cp "$file" "$json_dir/"; done
fi

step "results"
BENCH_COMMAND=$command_line \
BENCH_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ) \
BENCH_MACHINE="$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(free -g | awk '/^Mem:/ {print $2}') GiB memory; load average at start $load_at_start" \
BENCH_COMMIT="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- 2>/dev/null || echo ' (working tree modified)')" \
BENCH_RLVRD=$( ("$bin_dir/rlvr-worker" --version 2>/dev/null || echo "rlvrd (not built)") | head -n1) \
BENCH_RUSTC=$(rustc --version | cut -d' ' -f1-2) \
BENCH_WARMUP=$warmup BENCH_STEPS=$steps \
    "$python" - "$rlvr_json" "$trl_json" <<'PY'
import importlib.metadata as md
import json
import os
import sys

env = os.environ
ours, trl = (json.load(open(path)) if path else None for path in sys.argv[1:3])


def installed(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "not installed"


versions = trl["versions"] if trl else {name: installed(name) for name in ("torch", "trl", "transformers")}
rows = [
    ("median step time (s)", "median_step_s", "{:.2f}"),
    ("median rollout time (s)", "median_rollout_s", "{:.2f}"),
    ("median verify time (s)", "median_verify_s", "{:.4f}"),
    ("median update time (s) = step − rollout − verify", "median_update_s", "{:.2f}"),
    ("median update time as the worker reports it (s)", "median_reported_update_s", "{:.2f}"),
    ("median completion tokens per step", "median_tokens", "{:.0f}"),
    ("median generation tokens/s", "median_generation_tokens_per_s", "{:.1f}"),
    ("median update tokens/s", "median_update_tokens_per_s", "{:.1f}"),
    ("peak RSS (MB)", "peak_rss_mb", "{:.0f}"),
]


def value(side, key):
    return side.get(key) if side else None


print("## Trainer benchmark: rlvr worker vs TRL GRPOTrainer")
print()
print(f"- command: `{env['BENCH_COMMAND']}`")
print(f"- date: {env['BENCH_DATE']}")
print(f"- machine: {env['BENCH_MACHINE']}")
print(f"- commit: {env['BENCH_COMMIT']}")
print(
    f"- versions: {env['BENCH_RLVRD']}, {env['BENCH_RUSTC']}, torch/libtorch {versions['torch']}, "
    f"trl {versions['trl']}, transformers {versions['transformers']}"
)
print(
    "- job: SmolLM2-135M-Instruct f32 on CPU, 1 prompt × 8 completions × ≤ 64 new tokens per step, "
    f"GRPO β 0.04, μ 1, lr 1e-6; {env['BENCH_WARMUP']} warm-up + {env['BENCH_STEPS']} measured steps "
    "per side, one side after the other; medians over the measured steps"
    + (f"; TRL with {trl['torch_threads']} torch threads" if trl else "")
)
print()
print("| metric | rlvr | TRL | ratio (rlvr / TRL) |")
print("|---|---:|---:|---:|")
for label, key, fmt in rows:
    a, b = value(ours, key), value(trl, key)
    ratio = f"{a / b:.2f}×" if a is not None and b else "—"
    cells = [fmt.format(v) if v is not None else "—" for v in (a, b)]
    print(f"| {label} | {cells[0]} | {cells[1]} | {ratio} |")
print()
if ours and trl:
    ratio = ours["median_step_s"] / trl["median_step_s"]
    print(f"Target (our median step time ≤ 0.5× TRL's): {'met' if ratio <= 0.5 else 'NOT met'} ({ratio:.2f}×).")
if trl:
    print(
        f"TRL median CPU time per step: {trl['median_cpu_s']:.1f} s in {trl['median_step_s']:.1f} s of wall time "
        f"({trl['median_cpu_s'] / trl['median_step_s']:.2f} cores busy; {trl['torch_threads']} torch threads)."
    )
if ours and ours.get("heldout_accuracy"):
    print("rlvr held-out accuracy (start → end): " + " → ".join(f"{a:.3f}" for a in ours["heldout_accuracy"]))
PY

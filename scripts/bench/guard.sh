#!/usr/bin/env bash
# Speed guard: a few minutes of the trainer and per-shape benchmarks, compared with the figures
# last recorded in scripts/bench/guard.json, so that a change that makes a step more than 10%
# slower is seen in that change. Runs, on one libtorch thread (a shared machine's second core is
# noise):
#   - trainer.sh --only rlvr: SmolLM2-135M-Instruct f32 GRPO, 1 warm-up + 4 measured steps;
#   - shapes.sh: random-qwen2.5-0.5b full-f32 and lora-bf16, 32 tokens a completion, 1 + 3 steps
#     (lora-bf16 only where the CPU has bf16 arithmetic: shapes.py cpu-peak's bf16_native);
#   - shapes.py cpu-peak 1: this machine's f32 and bf16 product rates, by which each time is
#     scaled to the recorded machine's (time × rate now / rate then), so a faster or slower
#     machine, or a busier one, moves the rate and the times together.
# The fastest measured step of each (noise on a shared machine only adds time) is compared with
# its recorded one: a step time slower by more than --threshold (default 0.10) is a regression;
# its rollout and update times are shown beside it, to say where (scripts/bench/guard.py).
#
# Usage: scripts/bench/guard.sh [--record] [--warn-only] [--threshold F] [--bin-dir DIR]
#   --record      write this run's figures to scripts/bench/guard.json (after a change that is
#                 meant to change them; commit the file with it)
#   --warn-only   exit 0 on a regression (CI: the report says it; a session reads it)
#   --bin-dir DIR release binaries and plugins (default: built with `cargo build --release` into
#                 target/release, or with RLVR_TARGET_CACHE=1 into the kept target directory
#                 scripts/test.sh uses, as .ci/run does)
# Prints a markdown table on stdout, progress on stderr. Exit 1 on a regression (without
# --warn-only), 2 on a failed run or a bad argument.
set -euo pipefail
bench=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR
source "$bench/../lib.sh"
cd "$RLVR_ROOT"

record=0
warn_only=0
threshold=0.10
bin_dir=target/release
while [ $# -gt 0 ]; do
    case $1 in
        --record) record=1; shift ;;
        --warn-only) warn_only=1; shift ;;
        --threshold) threshold=$2; shift 2 ;;
        --bin-dir) bin_dir=$2; shift 2 ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
[[ $threshold =~ ^0?\.[0-9]+$ ]] || { echo "error: --threshold takes a fraction such as 0.10, got $threshold" >&2; exit 2; }

step "set-up (scripts/setup.sh)"
rlvr_setup
python=$RLVR_VENV/bin/python
if [ "$bin_dir" = target/release ]; then
    # Always the working tree's code: a stale release build would guard an older change.
    manifest=(--manifest-path "$RLVR_ROOT/Cargo.toml")
    if [ "${RLVR_TARGET_CACHE:-0}" = 1 ]; then
        # The kept target directory sees the workspace at its fixed link (scripts/test.sh).
        use_target_cache
        mkdir -p "$CARGO_TARGET_DIR"
        ln -sfn "$RLVR_ROOT" "$CARGO_TARGET_DIR/workspace"
        manifest=(--manifest-path "$CARGO_TARGET_DIR/workspace/Cargo.toml")
        bin_dir=$CARGO_TARGET_DIR/release
    fi
    step "build (release)"
    cargo build --release "${manifest[@]}" -p rlvr-daemon -p rlvr-worker -p rlvr-optimizer-grpo -p rlvr-verifier-math
fi
for file in rlvrd rlvr-worker librlvr_optimizer_grpo.so librlvr_verifier_math.so; do
    [ -f "$bin_dir/$file" ] || { echo "error: $bin_dir/$file is missing" >&2; exit 2; }
done

bench_work_dir rlvr-bench-guard
step "this machine's product rates (one thread)"
"$python" scripts/bench/shapes.py cpu-peak 1 >"$work/rates.json"
step "trainer: SmolLM2 GRPO, 1 + 4 steps"
scripts/bench/trainer.sh --only rlvr --steps 4 --warmup 1 --threads 1 --no-build --bin-dir "$bin_dir" \
    --json "$work/trainer" >/dev/null ||
    { echo "error: the trainer benchmark failed (above)" >&2; exit 2; }
# Without bf16 instructions a bf16 step is software conversion: over 17 minutes for the 1 + 3 steps
# on an AMD EPYC without AVX-512, against about 30 s recorded (shapes.py: EMULATED_BELOW).
# guard.py lists the bf16 figures as not run, and why.
runs=full-f32,lora-bf16
if [ "$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["bf16_native"])' "$work/rates.json")" != True ]; then
    runs=full-f32
    echo "this CPU has no bf16 arithmetic of its own (rates.json): the lora-bf16 shape is not run" >&2
fi
step "shapes: random-qwen2.5-0.5b $runs"
scripts/bench/shapes.sh --shapes random-qwen2.5-0.5b --runs "$runs" --steps 3 --warmup 1 \
    --max-new-tokens 32 --threads 1 --bin-dir "$bin_dir" --results "$work/shapes" >/dev/null ||
    { echo "error: the per-shape benchmark failed (above)" >&2; exit 2; }

args=("$work" "$bench/guard.json" "$threshold")
[ "$record" = 1 ] && args+=(--record "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo " with changes")")
set +e
"$python" "$bench/guard.py" "${args[@]}"
status=$?
set -e
if [ "$status" = 1 ] && [ "$warn_only" = 1 ]; then
    echo "guard: slower than recorded (above); --warn-only, so exit 0" >&2
    exit 0
fi
exit "$status"

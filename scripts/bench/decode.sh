#!/usr/bin/env bash
# The sampler's decoding throughput against the sampler of an earlier commit, on the same model,
# prompts, seeds and threads: model/examples/decode_bench.rs built at --base (the example copied
# into a git worktree of it, since it calls only `generate`) and in this checkout, each run in
# turn, twice (base, ours, ours, base), so that a drift of a noisy machine falls on both. Prints
# each binary's table (completion tokens, decoding steps, median seconds, tokens/s, ms per step,
# for T=1, top-p 0.95, a stop string that never matches, both, and greedy decoding).
#
# Usage: scripts/bench/decode.sh [--base REV] [--keep] [SOURCE PROMPTS GROUP MAX_NEW [RUNS [THREADS]]]
#   --base REV   the commit whose sampler is compared (default fee2105, the last before the
#                sampler read one thing per token from the device)
#   --keep       keep the work directory (the base's worktree)
#   SOURCE ...   decode_bench's arguments (default: SmolLM2-135M-Instruct from
#                scripts/fetch-smollm2.sh, 2 prompts × 8, 128 new tokens, 5 runs, 2 threads)
# Release builds go to target/ (this checkout's) and to the work directory's worktree.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/../lib.sh"
cd "$RLVR_ROOT"

base=fee2105
keep=0
while [ $# -gt 0 ]; do
    case "$1" in
        --base) base=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) break ;;
    esac
done
rlvr_setup
if [ $# -eq 0 ]; then
    set -- "$(scripts/fetch-smollm2.sh)" 2 8 128 5 2
fi

bench_work_dir rlvr-bench-decode
step "build: decode_bench at $base (a worktree in $work) and here"
git worktree add --detach -q "$work/base" "$base"
# The worktree goes with the work directory; git forgets it then too.
trap 'git worktree remove --force "$work/base" 2>/dev/null || true; bench_work_dir_cleanup' EXIT
cp model/examples/decode_bench.rs "$work/base/model/examples/"
(cd "$work/base" && cargo build --release -q -p rlvr-model --example decode_bench)
cargo build --release -q -p rlvr-model --example decode_bench
theirs=$work/base/target/release/examples/decode_bench
ours=target/release/examples/decode_bench

for who in base ours ours base; do
    if [ "$who" = base ]; then binary=$theirs; label="$base"; else binary=$ours; label="this checkout ($(git rev-parse --short HEAD))"; fi
    step "decode_bench: $label"
    "$binary" "$@"
done

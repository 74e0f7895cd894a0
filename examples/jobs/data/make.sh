#!/usr/bin/env bash
# Remakes every file in this folder, byte for byte (tests/tests/examples.rs checks that it does):
#
#   examples/jobs/data/make.sh [RLVRD] [OUT]     # defaults: target/debug/rlvrd, this folder
#
# The arithmetic files come from `rlvrd data arith` (seeded; nothing is downloaded): addition of
# zero-padded operands below 50 (`07+31=` -> `38`), 1,500 distinct problems in three disjoint
# slices — heldout.jsonl (200 prompts with references), train.jsonl (1,000 prompts with
# references, for the online methods), sft.jsonl (300 demonstrations).
#
# The preference pairs are made from them by the awk below, with no randomness; each problem's
# right answer is `chosen`:
#   pairs.jsonl             the first 300 problems of train.jsonl, `rejected` the answer with its
#                           last digit moved up by one (38 -> 39, 49 -> 40): a wrong sum of the
#                           same length, only the arithmetic tells them apart (dpo.toml)
#   rm-pairs.jsonl          the same 300 problems, `rejected` the answer with a 0 appended (38 ->
#                           380): ten times too large, a preference a reward model learns from
#                           scratch in a minute (rm.toml; on pairs.jsonl's, 100 steps from the
#                           SFT checkpoint left held-out pairwise accuracy at chance)
#   rm-pairs-heldout.jsonl  the first 100 problems of heldout.jsonl, rejected as rm-pairs.jsonl's
#
# And the environment example's problems (env.toml), made from the prompts with no randomness:
#   env-train.jsonl, env-heldout.jsonl  train.jsonl's and heldout.jsonl's problems, each with its
#                           operands as the reference: the environment's reset arguments
set -euo pipefail
rlvrd=${1:-target/debug/rlvrd}
out=${2:-$(dirname "$0")}

"$rlvrd" data arith --out "$out" --seed 0 --max-operand 50 --ops + --pad --sft 300 --train 1000 --heldout 200

# A prompt file's line is {"id":"…","prompt":"…","reference":{"answer":"…"}} (keys in this order,
# as rlvrd writes them): split on `"`, the id is field 4, the prompt 8, the answer 14.
# pairs FILE N RULE: the first N problems of FILE as pairs, `rejected` by RULE (next-digit or
# times-ten).
pairs() {
    awk -F'"' -v n="$2" -v rule="$3" 'NR > n { exit }
        {
            answer = $14
            if (rule == "times-ten") {
                wrong = answer "0"
            } else {
                last = substr(answer, length(answer), 1)
                wrong = substr(answer, 1, length(answer) - 1) ((last + 1) % 10)
            }
            printf "{\"id\":\"pair-%s\",\"prompt\":\"%s\",\"chosen\":\"%s\",\"rejected\":\"%s\"}\n", $4, $8, answer, wrong
        }' "$1"
}
pairs "$out/train.jsonl" 300 next-digit >"$out/pairs.jsonl"
pairs "$out/train.jsonl" 300 times-ten >"$out/rm-pairs.jsonl"
pairs "$out/heldout.jsonl" 100 times-ten >"$out/rm-pairs-heldout.jsonl"

# The environment example's problems (env.toml): each prompt of train.jsonl and heldout.jsonl with
# its operands as the reference, which is the environment's reset arguments ("07+31=" -> {"a":7,"b":31}).
problems() {
    awk -F'"' '{
            split($8, operands, /[+=]/)
            printf "{\"id\":\"%s\",\"prompt\":\"%s\",\"reference\":{\"a\":%d,\"b\":%d}}\n", $4, $8, operands[1], operands[2]
        }' "$1"
}
problems "$out/train.jsonl" >"$out/env-train.jsonl"
problems "$out/heldout.jsonl" >"$out/env-heldout.jsonl"

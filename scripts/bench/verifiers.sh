#!/usr/bin/env bash
# Verifier benchmark: our `math` plugin (release build, through `rlvrctl verify`) against
# Math-Verify 0.9.0 (PyPI, in the project venv) on the same pairs, in one run. Three sets: the 86
# Math-Verify dev cases (tests/data/verifier_math/math-dev.jsonl), our answer corpus
# (plugins/verifier-math/tests/corpus/*.jsonl: cited answer conventions and adversarial cases,
# see the plugin README) and a generated set of 1,600 pairs whose labels hold by construction
# (fractions, decimals, radicals, π, thousands separators, polynomials, intervals, sets, hedges).
# Prints a markdown table: agreement with the `expected` column (the evaluation-mode verdict,
# `fallback = "last"`, which is how Math-Verify grades), per-pair median and mean time, and total
# wall time per pair; then the corpus's agreement per category, and ours in training mode
# (`fallback = "none"`, against the corpus's `expected_none`).
#
# Ours: per-item `latency_us` of `rlvrctl verify --parallel 1` (3 runs pooled), and the wall time
# of the whole `rlvrctl` process (start, plugin load, all items) divided by the pairs.
# Math-Verify: `verify(parse(gold), parse(pred))` per pair with time.perf_counter_ns, after one
# warm-up call.
#
# Then the code verifier's throughput against the bare interpreter (scripts/bench/code-verifier.sh,
# release build), unless --quick.
#
# Usage: scripts/bench/verifiers.sh [--quick]   (--quick: the math dev set and the corpus only)
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
cd "$RLVR_ROOT"

quick=0
[ "${1:-}" = "--quick" ] && quick=1

step "set-up (scripts/setup.sh)"
rlvr_setup

step "Math-Verify 0.9.0 in $RLVR_VENV"
if ! "$RLVR_VENV/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("math-verify") != "0.9.0")' 2>/dev/null; then
    "$RLVR_VENV/bin/pip" install --quiet "math-verify==0.9.0"
fi

step "build (release): rlvrctl and the math plugin"
cargo build --release -p rlvr-cli
cargo build --release -p rlvr-verifier-math
release="${CARGO_TARGET_DIR:-$RLVR_ROOT/target}/release"

work=$(mktemp -d "${TMPDIR:-/tmp}/rlvr-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/plugins"
cp "$release/librlvr_verifier_math.so" "$work/plugins/"
dev=$RLVR_ROOT/tests/data/verifier_math/math-dev.jsonl
cat "$RLVR_ROOT"/plugins/verifier-math/tests/corpus/*.jsonl > "$work/corpus.jsonl"

step "generated set"
"$RLVR_VENV/bin/python" - "$work/generated.jsonl" <<'PY'
import json, random, sys
from fractions import Fraction

rng = random.Random(20260521)
rows = []

def add(gold, pred, expected, category):
    rows.append({"id": f"gen-{len(rows):04d}", "gold": gold, "pred": pred, "expected": expected, "category": category})

def terminating(q):
    d = q.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    return d == 1

for _ in range(100):
    a, b = rng.randint(1, 99), rng.randint(2, 99)
    q = Fraction(a, b)
    k = rng.randint(2, 9)
    add(f"$\\frac{{{q.numerator}}}{{{q.denominator}}}$", f"So the answer is $\\boxed{{\\dfrac{{{k * q.numerator}}}{{{k * q.denominator}}}}}$.", True, "fraction-scaled")
    add(f"$\\frac{{{q.numerator}}}{{{q.denominator}}}$", f"The answer is $\\boxed{{{q.numerator + 1}/{q.denominator}}}$.", False, "fraction-off")
    if terminating(q):
        add(f"$\\frac{{{q.numerator}}}{{{q.denominator}}}$", f"$\\boxed{{{float(q):.10g}}}$", True, "fraction-decimal")
    else:
        add(f"$\\frac{{{q.numerator}}}{{{q.denominator}}}$", f"$\\boxed{{{float(q):.3f}}}$", False, "fraction-coarse-decimal")

for _ in range(100):
    n = rng.randint(1000, 9_999_999)
    add(f"${n}$", f"Thus the total is $\\boxed{{{n:,}}}$.", True, "thousands")
    add(f"${n}$", f"Thus the total is $\\boxed{{{n + rng.choice([-10, 1, 9]):,}}}$.", False, "thousands-off")

for _ in range(100):
    c, s = rng.randint(2, 9), rng.choice([2, 3, 5, 6, 7, 10, 11])
    add(f"${c}\\sqrt{{{s}}}$", f"$\\boxed{{\\sqrt{{{c * c * s}}}}}$", True, "radical")
    add(f"${c}\\sqrt{{{s}}}$", f"$\\boxed{{\\sqrt{{{c * c * s + 1}}}}}$", False, "radical-off")

for _ in range(100):
    k, m = rng.randint(1, 12), rng.choice([2, 3, 4, 6, 12])
    value = k * 3.141592653589793 / m
    add(f"$\\frac{{{k}\\pi}}{{{m}}}$", f"$\\boxed{{{value:.10f}}}$", True, "pi-decimal")
    add(f"$\\frac{{{k}\\pi}}{{{m}}}$", f"$\\boxed{{{value:.2f}}}$", False, "pi-coarse")

for _ in range(100):
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    add(f"$x^2+{a + b}x+{a * b}$", f"$\\boxed{{(x+{a})(x+{b})}}$", True, "polynomial")
    add(f"$x^2+{a + b}x+{a * b}$", f"$\\boxed{{(x+{a})(x+{b + 1})}}$", False, "polynomial-off")

for _ in range(100):
    lo, hi = sorted(rng.sample(range(-20, 20), 2))
    o, c = rng.choice("(["), rng.choice(")]")
    add(f"${o}{lo},{hi}{c}$", f"$\\boxed{{{o}{lo}, {hi}{c}}}$", True, "interval")
    flipped = "[" if o == "(" else "("
    add(f"${o}{lo},{hi}{c}$", f"$\\boxed{{{flipped}{lo}, {hi}{c}}}$", False, "interval-open")

for _ in range(100):
    items = rng.sample(range(-30, 30), 3)
    shuffled = items[:]
    rng.shuffle(shuffled)
    add("$\\{" + ",".join(map(str, items)) + "\\}$", "$\\boxed{\\{" + ", ".join(map(str, shuffled)) + "\\}}$", True, "set")
    add("$\\{" + ",".join(map(str, items)) + "\\}$", "$\\boxed{\\{" + ", ".join(map(str, shuffled[:2])) + "\\}}$", False, "set-missing")

for _ in range(100):
    a, b = rng.sample(range(1, 50), 2)
    add(f"${a}$", f"It is $\\boxed{{{a}}}$ or maybe $\\boxed{{{b}}}$.", False, "hedge")

with open(sys.argv[1], "w") as out:
    for row in rows:
        out.write(json.dumps(row) + "\n")
print(f"{len(rows)} generated pairs", file=sys.stderr)
PY

# Our side: --parallel 1 so latency_us is one item on one core; 3 runs pooled.
ours() {
    local name=$1 file=$2 fallback=${3:-last}
    local best=""
    : > "$work/$name.ours.jsonl"
    for run in 1 2 3; do
        local start end
        start=$(date +%s%N)
        "$release/rlvrctl" verify --plugin-dir "$work/plugins" --plugin math \
            --plugin-config "{\"fallback\": \"$fallback\"}" --parallel 1 --jsonl "$file" > "$work/$name.run$run.jsonl" 2>/dev/null
        end=$(date +%s%N)
        local wall=$(((end - start) / 1000))
        if [ -z "$best" ] || [ "$wall" -lt "$best" ]; then best=$wall; fi
        cat "$work/$name.run$run.jsonl" >> "$work/$name.ours.jsonl"
    done
    echo "$best" > "$work/$name.ours.wall_us"
}

# Math-Verify's side.
theirs() {
    local name=$1 file=$2
    "$RLVR_VENV/bin/python" - "$file" "$work/$name.theirs.jsonl" <<'PY'
import json, sys, time
import logging
logging.disable(logging.CRITICAL)
from math_verify import parse, verify

rows = [json.loads(line) for line in open(sys.argv[1])]
# Math-Verify reads LaTeX only inside math delimiters or a box, and its documentation passes the
# gold as "$...$"; a reference.answer is bare LaTeX (`\frac{1}{2}`), so a gold with no delimiter
# is handed to it wrapped (this changes no dev verdict; on our corpus it is 169 → 206 of 237).
for row in rows:
    if not any(d in row["gold"] for d in ("$", "\\(", "\\[", "\\boxed", "####")):
        row["gold"] = "$" + row["gold"] + "$"
verify(parse(rows[0]["gold"]), parse(rows[0]["pred"]))  # warm-up
with open(sys.argv[2], "w") as out:
    wall_start = time.perf_counter_ns()
    for row in rows:
        start = time.perf_counter_ns()
        try:
            passed = bool(verify(parse(row["gold"]), parse(row["pred"])))
        except Exception:
            passed = False
        ns = time.perf_counter_ns() - start
        out.write(json.dumps({"id": row["id"], "passed": passed, "latency_us": ns / 1000}) + "\n")
    wall_us = (time.perf_counter_ns() - wall_start) / 1000
print(wall_us, file=open(sys.argv[2] + ".wall_us", "w"))
PY
}

sets=("dev:$dev" "corpus:$work/corpus.jsonl")
[ "$quick" = 1 ] || sets+=("generated:$work/generated.jsonl")
for entry in "${sets[@]}"; do
    name=${entry%%:*}
    file=${entry#*:}
    step "$name: math (ours, release)"
    ours "$name" "$file"
    step "$name: Math-Verify 0.9.0"
    theirs "$name" "$file"
done

step "corpus: math (ours, release) in training mode (fallback = none)"
ours corpus-none "$work/corpus.jsonl" none

step "results"
"$RLVR_VENV/bin/python" - "$work" "${sets[@]}" <<'PY'
import json, statistics, sys
from collections import defaultdict
work, sets = sys.argv[1], sys.argv[2:]
print("| set | verifier | pairs | agreement with `expected` | median µs/pair | mean µs/pair | wall µs/pair (whole run) |")
print("|---|---|---:|---:|---:|---:|---:|")
for entry in sets:
    name, path = entry.split(":", 1)
    expected = {}
    for line in open(path):
        row = json.loads(line)
        expected[row["id"]] = row["expected"]
    n = len(expected)
    results = {}
    for who, label in (("ours", "math (rlvr)"), ("theirs", "Math-Verify 0.9.0")):
        lines = [json.loads(l) for l in open(f"{work}/{name}.{who}.jsonl")]
        latencies = [l["latency_us"] for l in lines]
        # Agreement from the first run (all runs give the same verdicts: the verifier is deterministic).
        first = lines[:n]
        agree = sum(1 for l in first if bool(l["passed"]) == expected[l["id"]])
        wall = float(open(f"{work}/{name}.{who}.wall_us").read()) if who == "ours" else float(open(f"{work}/{name}.theirs.jsonl.wall_us").read())
        median, mean = statistics.median(latencies), statistics.fmean(latencies)
        results[who] = median
        print(f"| {name} | {label} | {n} | {agree}/{n} ({100 * agree / n:.1f}%) | {median:.1f} | {mean:.1f} | {wall / n:.1f} |")
    print(f"| {name} | speed-up (median) | | | {results['theirs'] / max(results['ours'], 0.1):.0f}× | | |")

# The corpus per category, both verifiers in evaluation mode, ours in training mode too.
rows = [json.loads(line) for line in open(f"{work}/corpus.jsonl")]
n = len(rows)
verdicts = {}
for who in ("ours", "theirs", "corpus-none.ours"):
    path = f"{work}/{who}.jsonl" if who == "corpus-none.ours" else f"{work}/corpus.{who}.jsonl"
    verdicts[who] = {l["id"]: bool(l["passed"]) for l in (json.loads(x) for x in list(open(path))[:n])}
agree = defaultdict(lambda: defaultdict(int))
for row in rows:
    cat = agree[row["category"]]
    cat["pairs"] += 1
    cat["ours"] += verdicts["ours"][row["id"]] == row["expected"]
    cat["theirs"] += verdicts["theirs"][row["id"]] == row["expected"]
    cat["none"] += verdicts["corpus-none.ours"][row["id"]] == row["expected_none"]
print()
print("| corpus category | pairs | math (rlvr), `last` | Math-Verify 0.9.0 | math (rlvr), `none` against `expected_none` |")
print("|---|---:|---:|---:|---:|")
total = defaultdict(int)
for name in sorted(agree):
    cat = agree[name]
    for k, v in cat.items():
        total[k] += v
    print(f"| {name} | {cat['pairs']} | {cat['ours']}/{cat['pairs']} | {cat['theirs']}/{cat['pairs']} | {cat['none']}/{cat['pairs']} |")
p = total["pairs"]
print(f"| **all** | {p} | {total['ours']}/{p} ({100 * total['ours'] / p:.1f}%) | {total['theirs']}/{p} ({100 * total['theirs'] / p:.1f}%) | {total['none']}/{p} ({100 * total['none'] / p:.1f}%) |")
PY

if [ "$quick" = 0 ]; then
    step "code verifier: trivial-solution runs per second against bare python3 (release)"
    PROFILE=release "$RLVR_ROOT/scripts/bench/code-verifier.sh"
fi

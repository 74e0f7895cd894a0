#!/usr/bin/env python3
"""The speed guard's comparison (scripts/bench/guard.sh runs the benchmarks).

Usage: guard.py WORK GUARD_JSON THRESHOLD [--record COMMIT]

WORK holds rates.json (shapes.py cpu-peak 1), trainer/rlvr.json (trainer.sh --json) and
shapes/*.json (shapes.sh --results). Each figure — the fastest measured step's step, rollout and
update seconds, of the trainer run and of each shape run (noise on a shared machine only adds
time, so the fastest step is the steadiest figure: the medians of two runs of one build here
differed by up to 27%) — is scaled to the recorded machine: time × this run's product rate for
its dtype / the recorded rate. On a CPU without bf16 arithmetic (rates.json's bf16_native false)
the bf16 figures are not measured: the table lists them as not run, and --record refuses (it
would drop them); any other recorded figure this run lacks cannot be judged (exit 2).
Prints a markdown table; exit 1 when a step time is slower than
its recorded value by more than THRESHOLD (a fraction; rollout and update are shown to say where),
0 otherwise. --record writes this run's figures and rates to GUARD_JSON instead (exit 0).
Stdlib only.
"""

import datetime
import json
import os
import platform
import sys

FIGURES = ("step_s", "rollout_s", "update_s")
GATED = "step_s"


class CannotRun(Exception):
    """The guard has no figures to compare: exit 2, which --warn-only does not excuse."""


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def measured(work):
    """{figure name: (seconds, the dtype whose rate scales it)} of this run."""
    figures = {}
    trainer = load(os.path.join(work, "trainer", "rlvr.json"))
    for key in FIGURES:
        figures[f"trainer smollm2-135m f32 {key}"] = (min(step[key] for step in trainer["per_step"]), "f32")
    shapes_dir = os.path.join(work, "shapes")
    # The per-run figures (shapes.sh also copies each run's worker log there, ORDER.log).
    for name in sorted(n for n in os.listdir(shapes_dir) if n.endswith(".json")):
        row = load(os.path.join(shapes_dir, name))
        if "variant" not in row:
            continue
        if row.get("status") != "ok":
            raise CannotRun(f"{row.get('shape')} {row.get('variant')}: {row.get('status')}: {row.get('detail')}")
        dtype = dtype_of(row["variant"])
        for key in FIGURES:
            figures[f"{row['shape']} {row['variant']} {key}"] = (row[f"min_{key}"], dtype)
    return figures


def dtype_of(variant):
    """The dtype whose product rate scales a shape run's times (its variant: full-f32, lora-bf16)."""
    return "bf16" if variant.endswith("bf16") else "f32"


def unmeasured(recorded, figures, rates):
    """{recorded figure not measured here: why}; CannotRun for one that should have been."""
    missing = {}
    for name in recorded:
        if name in figures:
            continue
        if dtype_of(name.split()[1]) == "bf16" and rates.get("bf16_native") is False:
            missing[name] = "not run: no bf16 arithmetic on this CPU"
        else:
            raise CannotRun(f"{name}: recorded in the guard's figures but not measured by this run")
    return missing


def main(argv):
    if len(argv) not in (3, 5) or (len(argv) == 5 and argv[3] != "--record"):
        print(__doc__, file=sys.stderr)
        return 2
    work, guard_path, threshold = argv[0], argv[1], float(argv[2])
    rates = load(os.path.join(work, "rates.json"))
    figures = measured(work)
    if len(argv) == 5:
        if rates.get("bf16_native") is False:
            raise CannotRun("this CPU has no bf16 arithmetic, so the bf16 figures were not measured: "
                            "record on a machine that has it, or the record would lose them")
        record = {
            "commit": argv[4],
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "machine": f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}",
            "rates": {dtype: rates[dtype] for dtype in ("f32", "bf16")},
            "figures": {name: seconds for name, (seconds, _) in figures.items()},
        }
        with open(guard_path, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2)
            f.write("\n")
        print(f"recorded {len(figures)} figures at {argv[4]} in {guard_path}")
        return 0
    recorded = load(guard_path)
    missing = unmeasured(recorded["figures"], figures, rates)
    print(f"Speed guard against {recorded['commit']} ({recorded['date']}); times scaled by this machine's "
          f"product rates (f32 {rates['f32'] / 1e9:.0f}, bf16 {rates['bf16'] / 1e9:.1f} GFLOP/s on one thread; "
          f"recorded {recorded['rates']['f32'] / 1e9:.0f}, {recorded['rates']['bf16'] / 1e9:.0f}).")
    if missing:
        print(f"This CPU's bf16 products run at {rates['bf16'] / rates['f32']:.3f}× its f32 rate (no bf16 "
              "instructions: software conversion), so its bf16 figures are not measured.")
    print()
    print("| figure (fastest measured step) | recorded (s) | now, scaled (s) | change |")
    print("|---|---:|---:|---:|")
    slower = []
    for name, (seconds, dtype) in figures.items():
        then = recorded["figures"].get(name)
        scaled = seconds * rates[dtype] / recorded["rates"][dtype]
        if then is None:
            print(f"| {name} | — | {scaled:.2f} | new |")
            continue
        change = scaled / then - 1
        gated = name.endswith(GATED)
        flag = " **slower**" if gated and change > threshold else ""
        print(f"| {name} | {then:.2f} | {scaled:.2f} | {change:+.1%}{flag} |")
        if gated and change > threshold:
            slower.append(name)
    for name, why in missing.items():
        print(f"| {name} | {recorded['figures'][name]:.2f} | — | {why} |")
    print()
    if slower:
        print(f"{len(slower)} step time(s) slower by more than {threshold:.0%}: {', '.join(slower)}")
        return 1
    print(f"No step time slower by more than {threshold:.0%}.")
    return 0


if __name__ == "__main__":
    # Exit 1 means slower than recorded, and only that: anything that keeps the guard from
    # judging (a failed run, a missing or unreadable figure) is 2, which CI does not excuse.
    try:
        sys.exit(main(sys.argv[1:]))
    except (CannotRun, OSError, ValueError, KeyError) as error:
        print(f"guard: cannot judge: {type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(2)

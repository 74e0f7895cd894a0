#!/usr/bin/env python3
"""The per-shape benchmark's figures and report (scripts/bench/shapes.sh runs the jobs).

Usage:
  shapes.py cpu-peak THREADS                   this CPU's measured dense rate, f32 and bf16: a
                                               product of 2048² matrices on THREADS threads (f32
                                               through oneDNN, as the worker's), best of 5
                                               (FLOP/s), as JSON, with bf16_native: false (and
                                               bf16 a 512² product's rate) where bf16 runs at
                                               under a quarter of f32 (no bf16 instructions)
  shapes.py summary OUT RUN_DIR WARMUP STEPS PEAK_FLOPS PEAK_LABEL
                                               one run's figures (RUN_DIR has run.json,
                                               outcome.json, estimate.json, meta.json and the
                                               worker's state/) as JSON in OUT
  shapes.py report RESULTS_DIR [TRL_JSON]      the markdown table of every summary in RESULTS_DIR
                                               (and TRL's run beside the shape it ran on); exit 1
                                               when a run failed

Per run (medians over the measured steps, worker_metrics.py):
  step s, rollout tokens/s      time.step_s; completion tokens / rollout time
  update tokens/s               trained tokens (prompt + completion of the step's rows) / update
                                time (step − rollout − verify)
  update MFU                    6 · N · update tokens/s / the device's dense peak for the dtype
                                (N: the model's parameters, LoRA or not: the convention of the
                                peers' reports; on a CPU the peak is the measured rate of cpu-peak)
  peak / estimate               the run's peak memory (on CUDA the worker's own figure, the
                                allocator's peak; on a CPU the process's peak RSS) against
                                `rlvrd estimate`'s total for the spec
Stdlib only, except cpu-peak (torch).
"""

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import worker_metrics  # noqa: E402
from gpu_bench import load  # noqa: E402

GB = float(1 << 30)


def cpu_peak(threads):
    import torch

    torch.set_num_threads(threads)
    # f32 through libtorch's oneDNN operator, as our worker's linear layers run (MKL's sgemm runs
    # AVX2 code on AMD processors: half of what this path reaches); bf16 through torch.mm.
    onednn = torch.ops.mkldnn._linear_pointwise
    peaks = {"f32": product_rate(onednn, 2048, torch.float32, repeats=5)}
    # bf16 by a 512² probe first: on a CPU without bf16 instructions (AVX2 only) torch.mm's bf16
    # product ran at 0.3 GFLOP/s, 300× under f32, where the 2048² best of 5 took 5 min 49 s.
    probe = product_rate(onednn, 512, torch.bfloat16, repeats=2)
    peaks["bf16_native"] = probe >= peaks["f32"] * EMULATED_BELOW
    peaks["bf16"] = product_rate(onednn, 2048, torch.bfloat16, repeats=5) if peaks["bf16_native"] else probe
    peaks["tf32"] = peaks["f32"]
    print(json.dumps(peaks))


# A CPU whose bf16 products run at under a quarter of its f32 rate has no bf16 arithmetic of its
# own: bf16 there is converted in software, and what a bf16 step takes says little about our code.
# Measured: the machine of scripts/bench/guard.json ran bf16 at 1.85× its f32 rate, an AMD EPYC
# without AVX-512 at 0.0034× (0.015× at 512²).
EMULATED_BELOW = 0.25


def product_rate(onednn, n, kind, repeats):
    """The best of `repeats` products of two n² matrices of `kind`, after one warm-up (FLOP/s)."""
    import torch

    a, b = torch.randn(n, n, dtype=kind), torch.randn(n, n, dtype=kind)
    product = (lambda: onednn(a, b, None, "none", [], "")) if kind == torch.float32 else (lambda: torch.mm(a, b))
    product()
    return 2 * n**3 / min(timed(product) for _ in range(repeats))


def timed(call):
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def summary(out, run_dir, warmup, steps, peak_flops, peak_label):
    meta = load(os.path.join(run_dir, "meta.json"), {})
    result = dict(meta)
    run = load(os.path.join(run_dir, "run.json"))
    estimate = load(os.path.join(run_dir, "estimate.json"))
    if estimate is None:
        result |= {"status": "failed", "detail": "rlvrd estimate failed: see the log"}
    elif run is None:
        result |= {"status": "skipped", "detail": meta.get("skipped", "not run")}
    else:
        state = os.path.join(run_dir, "state")
        try:
            figures = worker_metrics.summarize(
                run, os.path.join(state, "metrics.jsonl"), warmup, steps, os.path.join(state, "rollouts.jsonl")
            )
        except worker_metrics.Failed as failed:
            figures = None
            result |= {"status": "failed", "detail": str(failed)}
        if figures:
            parameters = estimate["parameters"]
            mfu = [
                6 * parameters * s["trained_tokens_per_s"] / peak_flops
                for s in figures["per_step"]
                if peak_flops and s.get("trained_tokens_per_s")
            ]
            device_peak = None
            if meta.get("device") != "cpu":
                # The allocator's peak: in the outcome of a run that ended, else (ended after its
                # last step by run_measured.py --kill-after-step) in its last step's metrics line.
                outcome = load(os.path.join(run_dir, "outcome.json"), {}) or {}
                lines = [json.loads(line) for line in open(os.path.join(state, "metrics.jsonl")) if line.strip()]
                device_peak = outcome.get("peak_memory_bytes") or max(
                    (line["peak_memory_bytes"] for line in lines if line.get("peak_memory_bytes")), default=None
                )
            peak_bytes = device_peak if device_peak else run["peak_rss_mb"] * (1 << 20)
            estimated = total_bytes(estimate["estimate"])
            result |= {
                "status": "ok",
                "parameters": parameters,
                "median_step_s": figures["median_step_s"],
                "median_rollout_s": figures["median_rollout_s"],
                "median_update_s": figures["median_update_s"],
                # The fastest measured step's figures: noise on a shared machine only adds time.
                "min_step_s": min(s["step_s"] for s in figures["per_step"]),
                "min_rollout_s": min(s["rollout_s"] for s in figures["per_step"]),
                "min_update_s": min(s["update_s"] for s in figures["per_step"]),
                "median_generation_tokens_per_s": figures["median_generation_tokens_per_s"],
                "median_trained_tokens_per_s": figures.get("median_trained_tokens_per_s"),
                "median_update_mfu": statistics.median(mfu) if mfu else None,
                "peak_label": peak_label,
                "peak_gb": peak_bytes / GB,
                "peak_measured_as": "device allocator" if device_peak else "process RSS",
                "estimate_gb": estimated / GB,
                "peak_over_estimate": peak_bytes / estimated if estimated else None,
            }
            if meta.get("cap_bytes"):
                result["cap_gb"] = meta["cap_bytes"] / GB
            if run.get("gpu_used_peak_mb"):
                # What the device counted (context, allocator's cache): the figure a co-tenant sees.
                used = run["gpu_used_peak_mb"] * (1 << 20)
                result |= {"gpu_used_gb": used / GB, "gpu_used_over_estimate": used / estimated if estimated else None}
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f)


def total_bytes(estimate):
    """An estimate's total: resident plus its largest phase (`MemoryEstimate::total_bytes`)."""
    resident = sum(part["bytes"] for part in estimate["resident"])
    phases = [sum(part["bytes"] for part in phase["parts"]) for phase in estimate["phases"]]
    return resident + max(phases, default=0)


def fmt(value, spec, missing="—"):
    return missing if value is None else format(value, spec)


def report(results_dir, trl_path=None):
    rows = [load(os.path.join(results_dir, name)) for name in sorted(os.listdir(results_dir)) if name.endswith(".json")]
    rows = [row for row in rows if row]
    rows.sort(key=lambda row: row.get("order", 0))
    # On a GPU: what nvidia-smi counted as the worker's (context and cached blocks) against the estimate.
    device_used = any(row.get("gpu_used_gb") for row in rows)
    extra = " GPU used GB | used / estimate |" if device_used else ""
    print("| shape | run | parameters | step (s) | rollout tokens/s | update tokens/s | update MFU | peak GB | estimate GB "
          f"| peak / estimate |{extra}")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if device_used else ""))
    for row in rows:
        run = row.get("variant")
        if row.get("share"):
            run = f"{run}, {row['copy']} of {row['share']} sharing"
        if row.get("status") != "ok":
            print(f"| {row.get('shape')} | {run} | {row.get('status')}: {row.get('detail')} |||||||||" + ("||" if device_used else ""))
            continue
        used = f" {fmt(row.get('gpu_used_gb'), '.2f')} | {fmt(row.get('gpu_used_over_estimate'), '.2f')} |" if device_used else ""
        print(
            f"| {row['shape']} | {run} | {row['parameters'] / 1e9:.2f} B | {fmt(row['median_step_s'], '.2f')} "
            f"| {fmt(row['median_generation_tokens_per_s'], '.1f')} | {fmt(row['median_trained_tokens_per_s'], '.1f')} "
            f"| {fmt(row['median_update_mfu'], '.1%')} | {row['peak_gb']:.2f} | {row['estimate_gb']:.2f} "
            f"| {fmt(row['peak_over_estimate'], '.2f')} |{used}"
        )
    peaks = sorted({row["peak_label"] for row in rows if row.get("peak_label")})
    if peaks:
        print()
        print(f"MFU against: {'; '.join(peaks)}. Peak memory measured as: "
              f"{', '.join(sorted({row['peak_measured_as'] for row in rows if row.get('status') == 'ok'}))}.")
    trl = load(trl_path) if trl_path else None
    ours = next((row for row in rows if row.get("trl_peer") and row.get("status") == "ok"), None)
    if trl and ours:
        print()
        print(f"Beside TRL's GRPOTrainer ({trl['versions'].get('trl')}) on the same exported weights and job "
              f"({ours['shape']}, {ours['variant']}):")
        print()
        print("| metric | rlvr | TRL | rlvr / TRL |")
        print("|---|---:|---:|---:|")
        ratio = lambda a, b: f"{a / b:.2f}×" if a and b else "—"  # noqa: E731
        trl_rollout = trl.get("median_generation_tokens_per_s")
        pairs = [
            ("step (s)", ours["median_step_s"], trl.get("median_step_s"), ".2f"),
            ("rollout (s)", ours["median_rollout_s"], trl.get("median_rollout_s"), ".2f"),
            ("update (s)", ours["median_update_s"], trl.get("median_update_s"), ".2f"),
            ("rollout tokens/s", ours["median_generation_tokens_per_s"], trl_rollout, ".1f"),
            ("peak memory (GB)", ours["peak_gb"], (trl.get("peak_rss_mb") or 0) * (1 << 20) / GB or None, ".2f"),
        ]
        for name, a, b, spec in pairs:
            print(f"| {name} | {fmt(a, spec)} | {fmt(b, spec)} | {ratio(a, b)} |")
    return 1 if any(row.get("status") == "failed" for row in rows) else 0


def main(argv):
    if len(argv) >= 2 and argv[0] == "cpu-peak":
        cpu_peak(int(argv[1]))
    elif len(argv) == 7 and argv[0] == "summary":
        out, run_dir, warmup, steps, peak, label = argv[1:]
        summary(out, run_dir, int(warmup), int(steps), float(peak) if peak else None, label or None)
    elif len(argv) in (2, 3) and argv[0] == "report":
        sys.exit(report(*argv[1:]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])

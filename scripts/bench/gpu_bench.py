#!/usr/bin/env python3
"""scripts/bench/gpu.sh's judge and reporter: reads what the script's runs left and writes one
result per part (a JSON file in the results directory), then the markdown report from them.

A run directory (gpu.sh's run_worker) holds run.json (run_measured.py's result), outcome.json
(the worker's stdout: the outcome line), worker.log (its stderr) and state/ (unless the run
shares another's state directory). A result is {"id", "status": "ok" | "failed" | "skipped",
"detail", ...}: "failed" is a check of ours that failed (gpu.sh then exits 1); "skipped" says
what was missing and how to provide it.

Subcommands (each writes RESULT, except report):
  doctor RESULT DOCTOR_JSON RC DEVICE ALLOW_CPU     prints the device the runs use; exit 2 when
                                                   CUDA cannot run and ALLOW_CPU is 0
  platform RESULT RUN DOCTOR_RESULT                job.json's platform names the device
  resume RESULT DTYPE STRAIGHT KILLED RESUMED STEPS KILL_STEP
  finite-loss RESULT RUN STEPS                     exit 0, STEPS step lines, every loss finite
  sft RESULT DTYPE RUN                             held-out accuracy before → after
  smollm2 RESULT VARIANT RUN MODEL WARMUP STEPS DOCTOR_RESULT
  hf RESULT DTYPE OUTPUT LOG RC                    hf_generate.py's line, or why there is none
  trl RESULT DTYPE OUTPUT LOG RC                   trl_grpo.py's line, or why there is none
  shapes RESULT RESULTS_DIR TABLE RC               shapes.sh's runs (its --results and --out)
  skip RESULT ID REASON                            a part not run, and why
  report RESULTS_DIR KEY=VALUE...                  the markdown report on stdout; exit 1 when a
                                                   check of ours failed
Stdlib only.
"""

import glob
import json
import math
import os
import re
import statistics
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import worker_metrics  # noqa: E402  (beside this file)

# Dense peak FLOP/s by GPU and dtype (TFLOP/s). NVIDIA H100 Tensor Core GPU datasheet
# (https://www.nvidia.com/en-us/data-center/h100/, "Technical Specifications"; its Tensor Core
# figures are with sparsity, halved here for dense): H100 SXM BF16 1,979 → 989, TF32 989 → 494,
# FP32 67; H100 PCIe BF16 1,513 → 756, TF32 756 → 378, FP32 51. The H200 (SXM) has the H100 SXM's
# figures (https://www.nvidia.com/en-us/data-center/h200/). f32 without TF32 runs on the FP32
# units; other GPUs (H100 NVL, H200 NVL, GH200, ...) get no peak: MFU "n/a".
PEAKS = [
    ("H100 PCIe", lambda name: "H100" in name and "PCIE" in name.upper(), {"bf16": 756, "tf32": 378, "f32": 51}),
    ("H100 SXM", lambda name: "H100" in name and ("HBM3" in name or "SXM" in name), {"bf16": 989, "tf32": 494, "f32": 67}),
    ("H200", lambda name: re.search(r"\bH200\b", name) is not None and "NVL" not in name, {"bf16": 989, "tf32": 494, "f32": 67}),
]

# The rows of the summary table, in order: id → label.
PARTS = {
    "doctor": "doctor: CUDA on the device",
    "platform": "a. GRPO job on the device, job.json platform",
    "resume-f32": "b. exact resume after SIGKILL, f32",
    "resume-bf16": "b. exact resume after SIGKILL, bf16",
    "temperature0": "c. temperature 0: 2 steps, finite loss",
    "sft-f32": "d. SFT f32: held-out accuracy",
    "sft-bf16": "d. SFT bf16: held-out accuracy",
    "shapes": "3. the random models at published shapes (shapes.sh)",
    "sharing": "3c. two jobs sharing the device, each capped at half",
    "smollm2-f32": "SmolLM2 GRPO f32",
    "smollm2-bf16": "SmolLM2 GRPO bf16",
    "smollm2-tf32": "SmolLM2 GRPO f32 + [model] tf32",
    "hf-f32": "peer: HF generate f32",
    "hf-bf16": "peer: HF generate bf16",
    "trl-f32": "peer: TRL GRPOTrainer f32",
    "trl-bf16": "peer: TRL GRPOTrainer bf16",
}
# Parts whose failure is a peer's, never ours.
PEERS = ("hf-", "trl-")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def write(path, result):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f)


def load(path, default=None):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return default


def jsonl(path):
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def log_reason(path):
    """The line of a log that says why a program failed: the worker's `rlvr-worker: ...` line, a
    Python traceback's last line, else the last line."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [ANSI.sub("", line).strip() for line in f if line.strip()]
    except FileNotFoundError:
        return "no log"
    for prefix in ("rlvr-worker:", "rlvrd:", "error:"):
        found = [line for line in lines if line.startswith(prefix)]
        if found:
            return found[-1]
    errors = [line for line in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", line)]
    return (errors or lines or ["empty log"])[-1][:400]


def run_failure(run_dir, expect_rc=0):
    """Why a worker run did not end as expected, or None when it did."""
    run = load(os.path.join(run_dir, "run.json"))
    if run is None:
        return "it did not run"
    if run["timed_out"]:
        return f"timed out after {run['wall_s']:.0f} s ({log_reason(os.path.join(run_dir, 'worker.log'))})"
    if run["rc"] != expect_rc:
        return f"exit status {run['rc']}: {log_reason(os.path.join(run_dir, 'worker.log'))}"
    return None


def short(sha):
    return (sha or "none")[:12]


def cmd_doctor(result_path, doctor_json, rc, device, allow_cpu):
    report = load(doctor_json)
    if report is None:
        sys.exit(f"rlvrd doctor --json gave no report (exit status {rc}); see its output above")
    torch = report.get("torch") or {}
    index = int(device.split(":")[1]) if ":" in device else 0
    gpus = [d for d in report.get("devices", []) if d.get("gpu")]
    gpu_name = None
    for gpu in gpus:
        found = re.match(r"^cuda:(\d+) \((.*)\)$", gpu.get("name", ""))
        if found and int(found.group(1)) == index:
            gpu_name = found.group(2)
    problems = list(torch.get("problems") or [])
    if report.get("torch_error"):
        problems.append(report["torch_error"])
    usable = bool(torch.get("cuda_available")) and index < int(torch.get("cuda_devices") or 0)
    if not usable:
        why = problems or [f"CUDA available: {torch.get('cuda_available')}, devices: {torch.get('cuda_devices')}"]
        if not int(allow_cpu):
            print(f"error: {device} cannot be used (rlvrd doctor):", file=sys.stderr)
            for problem in why + report.get("device_notes", []):
                print(f"  - {problem}", file=sys.stderr)
            print("  (--allow-cpu runs everything on cpu instead: a dry run)", file=sys.stderr)
            sys.exit(2)
    used = device if usable else "cpu"
    facts = {
        "gpu_name": gpu_name if usable else None,
        "device": used,
        "dry_run": not usable,
        "libtorch": torch.get("libtorch_version"),
        "libtorch_dir": torch.get("libtorch_dir"),
        "cuda_built": torch.get("cuda_built"),
        "cuda_loaded": torch.get("cuda_loaded"),
        "cuda_available": torch.get("cuda_available"),
        "cuda_devices": torch.get("cuda_devices"),
        "cuda_runtime": torch.get("cuda_runtime"),
        "cuda_driver": torch.get("cuda_driver"),
        "cudnn": torch.get("cudnn"),
        "nccl": torch.get("nccl"),
        "cublas": torch.get("cublas"),
        "cpu_matmul": torch.get("cpu_matmul"),
        "problems": problems,
        "device_notes": report.get("device_notes", []),
        "doctor_rc": int(rc),
    }
    if usable:
        detail = f"CUDA available, {torch.get('cuda_devices')} device(s); {device}: {gpu_name or 'unnamed (NVML)'}"
    else:
        detail = "no usable CUDA (" + "; ".join(why) + "): everything runs on cpu, a dry run"
    write(result_path, {"id": "doctor", "status": "ok", "detail": detail, **facts})
    print(used)


def cmd_platform(result_path, run_dir, doctor_result):
    doctor = load(doctor_result, {})
    failure = run_failure(run_dir)
    result = {"id": "platform"}
    job = load(os.path.join(run_dir, "state", "job.json"), {})
    platform = job.get("platform")
    if failure:
        result |= {"status": "failed", "detail": failure}
    elif not platform:
        result |= {"status": "failed", "detail": "job.json has no platform"}
    else:
        name = platform.get("device")
        versions = ", ".join(
            f"{label} {platform[key]}"
            for key, label in [("libtorch", "libtorch"), ("cuda_runtime", "CUDA"), ("cuda_driver", "driver"),
                               ("cublas", "cuBLAS"), ("cudnn", "cuDNN")]
            if platform.get(key)
        )
        if doctor.get("dry_run"):
            ok = name == "cpu"
            detail = f"platform `{name}` ({versions})" + ("" if ok else ": expected cpu")
        else:
            ok = bool(name) and name != "cpu" and not name.startswith("cuda:")
            detail = f"platform `{name}` ({versions})"
            if not ok:
                detail += ": does not name the GPU"
            elif doctor.get("gpu_name") and doctor["gpu_name"] != name:
                detail += f"; doctor (NVML) names it `{doctor['gpu_name']}`"
        result |= {"status": "ok" if ok else "failed", "detail": detail, "platform": platform}
    write(result_path, result)


def metrics_without_measurements(state):
    lines = jsonl(os.path.join(state, "metrics.jsonl"))
    for line in lines:
        line.pop("time", None)
        line.pop("peak_memory_bytes", None)
    return lines


def first_difference(a, b, what):
    """The first place two lists of JSON records differ, as a phrase, or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            keys = sorted(set(x) | set(y), key=str)
            differing = [k for k in keys if x.get(k) != y.get(k)]
            where = f"step {x.get('step', '?')}" if "step" in x else f"line {i + 1}"
            shown = "; ".join(f"{k}: {json.dumps(x.get(k))[:60]} vs {json.dumps(y.get(k))[:60]}" for k in differing[:3])
            return f"{what} differ first at line {i + 1} ({where}): {shown}"
    if len(a) != len(b):
        return f"{what}: {len(a)} lines straight, {len(b)} resumed"
    return None


def cmd_resume(result_path, dtype, straight, killed, resumed, steps, kill_step):
    steps, kill_step = int(steps), int(kill_step)
    result = {"id": f"resume-{dtype}"}
    failure = run_failure(straight)
    if failure:
        write(result_path, result | {"status": "failed", "detail": f"the straight run failed: {failure}"})
        return
    killed_run = load(os.path.join(killed, "run.json"), {})
    if killed_run.get("killed_at_step") != kill_step:
        why = run_failure(killed) or f"it ended before step {kill_step}'s line was seen (too fast to kill: raise the steps)"
        write(result_path, result | {"status": "failed", "detail": f"the run to kill was not killed at step {kill_step}: {why}"})
        return
    latest = open(os.path.join(killed, "latest-at-kill")).read().strip() if os.path.exists(os.path.join(killed, "latest-at-kill")) else ""
    failure = run_failure(resumed)
    if failure:
        write(result_path, result | {"status": "failed", "detail": f"the resumed run failed: {failure}"})
        return
    state_straight, state_killed = os.path.join(straight, "state"), os.path.join(killed, "state")
    a, b = load(os.path.join(straight, "outcome.json"), {}), load(os.path.join(resumed, "outcome.json"), {})
    differences = []
    if a.get("weights_sha256") != b.get("weights_sha256") or not a.get("weights_sha256"):
        differences.append(f"weights_sha256 {short(a.get('weights_sha256'))}… straight, {short(b.get('weights_sha256'))}… resumed")
    metrics_a, metrics_b = metrics_without_measurements(state_straight), metrics_without_measurements(state_killed)
    rollouts_a, rollouts_b = jsonl(os.path.join(state_straight, "rollouts.jsonl")), jsonl(os.path.join(state_killed, "rollouts.jsonl"))
    for difference in (first_difference(metrics_a, metrics_b, "metrics lines (without time)"),
                       first_difference(rollouts_a, rollouts_b, "rollout records")):
        if difference:
            differences.append(difference)
    updated = sum(1 for line in metrics_a if (line.get("grad_norm") or 0) > 0)
    setting = (f"{steps} steps, a checkpoint each, killed once step {kill_step} was logged "
               f"(LATEST then {latest or 'none'}); {updated} of {steps} steps changed the weights")
    if differences:
        detail = "DIFFERENT: " + "; ".join(differences) + f" ({setting})"
    else:
        detail = (f"identical: weights_sha256 {short(a['weights_sha256'])}…, {len(metrics_a)} metrics lines, "
                  f"{len(rollouts_a)} rollout records ({setting})")
    write(result_path, result | {"status": "failed" if differences else "ok", "detail": detail, "updated_steps": updated})


def cmd_finite_loss(result_path, run_dir, steps):
    steps = int(steps)
    result = {"id": "temperature0"}
    failure = run_failure(run_dir)
    lines = [line for line in jsonl(os.path.join(run_dir, "state", "metrics.jsonl")) if "time" in line]
    if failure:
        result |= {"status": "failed", "detail": failure}
    elif len(lines) != steps:
        result |= {"status": "failed", "detail": f"{len(lines)} step lines, expected {steps}"}
    else:
        losses = [line.get("loss") for line in lines]
        finite = all(isinstance(loss, (int, float)) and math.isfinite(loss) for loss in losses)
        shown = ", ".join("none" if loss is None else f"{loss:.4g}" for loss in losses)
        result |= {"status": "ok" if finite else "failed", "detail": f"loss {shown}" + ("" if finite else ": not finite")}
    write(result_path, result)


def cmd_sft(result_path, dtype, run_dir):
    result = {"id": f"sft-{dtype}"}
    failure = run_failure(run_dir)
    outcome = load(os.path.join(run_dir, "outcome.json"), {})
    if failure:
        result |= {"status": "failed", "detail": failure}
    elif outcome.get("heldout_before") is None or outcome.get("heldout_after") is None:
        result |= {"status": "failed", "detail": f"the outcome has no held-out accuracy: {outcome}"}
    else:
        lines = [line for line in jsonl(os.path.join(run_dir, "state", "metrics.jsonl")) if "time" in line]
        loss = lines[-1].get("loss") if lines else None
        step_s = statistics.median(line["time"]["step_s"] for line in lines) if lines else None
        detail = (f"{outcome['heldout_before']:.3f} → {outcome['heldout_after']:.3f} after {outcome.get('steps')} steps"
                  + (f"; last loss {loss:.4f}" if isinstance(loss, (int, float)) else "")
                  + (f"; median step {step_s:.3f} s" if step_s is not None else ""))
        result |= {"status": "ok", "detail": detail, "before": outcome["heldout_before"],
                   "after": outcome["heldout_after"], "last_loss": loss, "median_step_s": step_s}
    write(result_path, result)


def parameter_count(model_dir):
    """Parameters in the model's safetensors files, from their headers (no tensor is read)."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(load(index)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    total = 0
    for name in files:
        with open(os.path.join(model_dir, name), "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for key, tensor in header.items():
            if key != "__metadata__":
                total += math.prod(tensor["shape"])
    return total


def peak_flops(gpu_name, precision):
    """(which GPU, dense peak FLOP/s) for the name and precision, or (None, None)."""
    for label, matches, peaks in PEAKS:
        if gpu_name and matches(gpu_name):
            return label, peaks[precision] * 1e12
    return None, None


def cmd_smollm2(result_path, variant, run_dir, model, warmup, steps, doctor_result):
    doctor = load(doctor_result, {})
    result = {"id": f"smollm2-{variant}"}
    run = load(os.path.join(run_dir, "run.json"))
    log = os.path.join(run_dir, "worker.log")
    if variant == "tf32" and run and run["rc"] == 2 and "tf32" in log_reason(log):
        write(result_path, result | {"status": "skipped", "detail": f"the spec refuses it: {log_reason(log)}"})
        return
    failure = run_failure(run_dir)
    if failure:
        write(result_path, result | {"status": "failed", "detail": failure})
        return
    state = os.path.join(run_dir, "state")
    try:
        summary = worker_metrics.summarize(run, os.path.join(state, "metrics.jsonl"), int(warmup), int(steps),
                                           os.path.join(state, "rollouts.jsonl"))
    except worker_metrics.Failed as failed:
        write(result_path, result | {"status": "failed", "detail": str(failed)})
        return
    parameters = parameter_count(model)
    precision = {"f32": "f32", "bf16": "bf16", "tf32": "tf32"}[variant]
    gpu = (load(os.path.join(state, "job.json"), {}).get("platform") or {}).get("device") or doctor.get("gpu_name")
    peak_label, peak = peak_flops(None if doctor.get("dry_run") else gpu, precision)
    mfu = [6 * parameters * s["trained_tokens_per_s"] / peak for s in summary["per_step"]
           if peak and s.get("trained_tokens_per_s")]
    summary |= {
        "parameters": parameters,
        "peak_gpu": peak_label,
        "peak_flops": peak,
        "precision": precision,
        "median_update_mfu": statistics.median(mfu) if mfu else None,
    }
    detail = (f"median step {summary['median_step_s']:.3f} s, generation {summary['median_generation_tokens_per_s']:.0f} "
              f"tokens/s, update MFU " + (f"{summary['median_update_mfu']:.1%}" if mfu else "n/a"))
    write(result_path, result | {"status": "ok", "detail": detail, "summary": summary})


def cmd_shapes(result_path, results_dir, table_path, rc):
    """The shapes part's result, from shapes.sh's per-run summaries and its exit status."""
    rows = []
    if os.path.isdir(results_dir):
        rows = [load(os.path.join(results_dir, name)) for name in sorted(os.listdir(results_dir)) if name.endswith(".json")]
        rows = [row for row in rows if row and "variant" in row]
    counts = {status: sum(row.get("status") == status for row in rows) for status in ("ok", "skipped", "failed")}
    failed = [f"{row['shape']} {row['variant']}: {row.get('detail')}" for row in rows if row.get("status") == "failed"]
    detail = f"{counts['ok']} runs measured, {counts['skipped']} skipped (their estimate exceeds the device)"
    if failed or not rows or int(rc) != 0:
        reason = "; ".join(failed) or f"shapes.sh exited {rc}: see its output above"
        write(result_path, {"id": "shapes", "status": "failed", "detail": f"{detail}; failed: {reason}"})
        return
    ratios = [row["peak_over_estimate"] for row in rows if row.get("peak_over_estimate")]
    if ratios:
        detail += f"; peak / estimate {min(ratios):.2f}–{max(ratios):.2f}"
    write(result_path, {"id": "shapes", "status": "ok", "detail": detail, "table": table_path})


def cmd_sharing(result_path, results_dir, solo_dir, rc):
    """Two copies of one shapes run at once (shapes.sh --share 2), each held to half the device:
    both must train every step within their cap; their step times against the same run alone
    (part 3's, when it ran)."""
    rows = []
    if os.path.isdir(results_dir):
        rows = [load(os.path.join(results_dir, name)) for name in sorted(os.listdir(results_dir)) if name.endswith(".json")]
        rows = [row for row in rows if row and row.get("share")]
    failed = [f"job {row['copy']}: {row.get('detail')}" for row in rows if row.get("status") != "ok"]
    if not rows or failed or int(rc) != 0:
        skipped = load(os.path.join(results_dir, "1.json"), {}) if os.path.isdir(results_dir) else {}
        if not rows and skipped.get("status") == "skipped":
            write(result_path, {"id": "sharing", "status": "skipped", "detail": skipped.get("detail")})
            return
        reason = "; ".join(failed) or f"shapes.sh --share exited {rc}: see its output above"
        write(result_path, {"id": "sharing", "status": "failed", "detail": reason})
        return
    first = rows[0]
    share = first["share"]
    over = [row for row in rows if row["peak_gb"] > row["cap_gb"]] if all(row.get("cap_gb") for row in rows) else []
    steps = ", ".join(f"{row['median_step_s']:.2f}" for row in rows)
    peaks = ", ".join(f"{row['peak_gb']:.2f}" for row in rows)
    detail = f"{first['shape']} {first['variant']}, {share} jobs at once: step {steps} s; peak {peaks} GB"
    if first.get("cap_gb"):
        detail += f" of a {first['cap_gb']:.1f} GB cap each"
    solo = None
    if os.path.isdir(solo_dir):
        for name in sorted(os.listdir(solo_dir)):
            row = load(os.path.join(solo_dir, name)) if name.endswith(".json") else None
            if row and not row.get("share") and row.get("status") == "ok" and (row.get("shape"), row.get("variant")) == (
                    first["shape"], first["variant"]):
                solo = row
    if solo:
        together = max(row["median_step_s"] for row in rows)
        detail += (f"; alone {solo['median_step_s']:.2f} s a step: {share} steps in {together:.2f} s shared, "
                   f"{share * solo['median_step_s'] / together:.2f}× the throughput of one job alone")
    if over:
        write(result_path, {"id": "sharing", "status": "failed", "detail": detail + "; over its cap: "
                            + ", ".join(f"job {row['copy']}" for row in over)})
        return
    write(result_path, {"id": "sharing", "status": "ok", "detail": detail})


def peer_result(result_path, part, output, log, rc, missing_hint):
    line = None
    try:
        with open(output, encoding="utf-8") as f:
            lines = [l for l in f if l.strip()]
        line = json.loads(lines[-1]) if lines else None
    except (FileNotFoundError, ValueError):
        pass
    if int(rc) == 0 and line:
        return line
    if int(rc) == 3:
        write(result_path, {"id": part, "status": "skipped", "detail": f"{log_reason(log)}: {missing_hint}"})
    else:
        write(result_path, {"id": part, "status": "failed", "detail": f"exit status {rc}: {log_reason(log)}"})
    return None


def cmd_hf(result_path, dtype, output, log, rc):
    line = peer_result(result_path, f"hf-{dtype}", output, log, rc, "")
    if line:
        detail = (f"{line['median_tokens_per_s']:.0f} tokens/s ({line['sequences']} sequences × {line['new_tokens']} "
                  f"new tokens in {line['median_s']:.2f} s, median of {len(line['times_s'])})")
        write(result_path, {"id": f"hf-{dtype}", "status": "ok", "detail": detail, "hf": line})


TRL_HINT = ("pass gpu.sh --wheels DIR with the wheels of trl==1.16.0, datasets==5.2.0, dill==0.4.1 and "
            "multiprocess==0.70.19 (the book: docs/src/contributors/benchmarks.md, 'On one GPU')")


def cmd_trl(result_path, dtype, output, log, rc):
    line = peer_result(result_path, f"trl-{dtype}", output, log, rc, TRL_HINT)
    if line:
        detail = f"median step {line['median_step_s']:.3f} s, generation {line['median_generation_tokens_per_s']:.0f} tokens/s"
        write(result_path, {"id": f"trl-{dtype}", "status": "ok", "detail": detail, "trl": line})


def cmd_skip(result_path, part, reason):
    write(result_path, {"id": part, "status": "skipped", "detail": reason})


def fmt(value, spec, missing="—"):
    return missing if value is None else format(value, spec)


def cmd_report(results_dir, pairs):
    meta = dict(pair.split("=", 1) for pair in pairs)
    results = {}
    for path in sorted(glob.glob(os.path.join(results_dir, "*.json"))):
        result = load(path)
        if result:
            results[result["id"]] = result
    doctor = results.get("doctor", {})
    dry_run = doctor.get("dry_run", True)
    device_line = "cpu (dry run)" if dry_run else f"{doctor.get('gpu_name') or 'unnamed GPU'} ({doctor.get('device')})"
    out = []
    p = out.append
    p("## GPU benchmark: rlvr worker on " + ("cpu (dry run)" if dry_run else (doctor.get("gpu_name") or "a GPU")))
    p("")
    p(f"- command: `{meta.get('command', '?')}`")
    p(f"- date: {meta.get('date', '?')}")
    p(f"- device: {device_line}")
    p(f"- libtorch {doctor.get('libtorch') or '?'} ({doctor.get('libtorch_dir') or '?'}); CUDA runtime "
      f"{doctor.get('cuda_runtime') or 'none'}, driver supports {doctor.get('cuda_driver') or 'none'}, cuDNN "
      f"{doctor.get('cudnn') or 'none'}, NCCL {doctor.get('nccl') or 'none'}, cuBLAS {doctor.get('cublas') or 'none'}")
    if doctor.get("problems"):
        p(f"- doctor's problems: {'; '.join(doctor['problems'])}")
    p(f"- binaries: {meta.get('binaries', '?')}; commit {meta.get('commit', '?')}")
    p(f"- host: {meta.get('machine', '?')}")
    p(f"- python: {meta.get('python', '?')}")
    if meta.get("carried"):
        p(f"- carried to the device: {meta['carried']}")
    p("")
    p("| part | result | detail |")
    p("|---|---|---|")
    ours_failed = []
    for part in list(PARTS) + [k for k in results if k not in PARTS]:
        result = results.get(part)
        if result is None:
            continue
        status = result["status"]
        shown = {"ok": "ok", "failed": "**FAILED**", "skipped": "skipped"}[status]
        if status == "failed" and not part.startswith(PEERS):
            ours_failed.append(part)
        if status == "failed" and part.startswith(PEERS):
            shown = "peer failed"
        detail = result["detail"].replace("|", "\\|").replace("\n", " ")
        p(f"| {PARTS.get(part, part)} | {shown} | {detail} |")
    p("")

    shapes_table = None
    if meta.get("shapes_md") and os.path.exists(meta["shapes_md"]):
        with open(meta["shapes_md"], encoding="utf-8") as f:
            shapes_table = f.read().strip()
        p(shapes_table.replace("## Per-shape benchmark", "### The random models at published shapes (shapes.sh)", 1))
        p("")

    variants = [v for v in ("f32", "bf16", "tf32") if results.get(f"smollm2-{v}", {}).get("status") == "ok"]
    summaries = {v: results[f"smollm2-{v}"]["summary"] for v in variants}
    job = meta.get("smollm2_job", "")
    rows = []
    if summaries:
        p(f"### SmolLM2-135M-Instruct on the device: {job}")
        p("")
        first = next(iter(summaries.values()))
        counted = first.get("trained_tokens_counted")
        trained = ("completion tokens of the step's rows and each group's prompt once (rollouts.jsonl)"
                   if counted == "prompt + completion"
                   else "completion tokens only (the rollout records give no prompt_tokens)")
        p(f"{first['warmup_steps']} warm-up + {first['measured_steps']} measured steps; medians over the measured steps. "
          f"Update time = step − rollout − verify (the reference's and the policy's passes and AdamW). Trained tokens "
          f"= {trained}. Update MFU = 6 × {first['parameters']:,} "
          "parameters (model.safetensors; the tied embedding once, as the LM head's matmul) × trained tokens per second "
          "of update time / the GPU's dense peak for the dtype (H100 SXM and H200: bf16 989, TF32 494, FP32 67 "
          "TFLOP/s; H100 PCIe: 756, 378, 51); it leaves out the reference model's forward pass and attention's "
          "own FLOPs, so it understates the work done.")
        p("")
        headers = {"f32": "f32", "bf16": "bf16", "tf32": "f32 + tf32"}
        p("| metric | " + " | ".join(headers[v] for v in summaries) + " |")
        p("|---|" + "---:|" * len(summaries))
        rows = [
            ("median step time (s)", "median_step_s", ".3f"),
            ("median rollout time (s)", "median_rollout_s", ".3f"),
            ("median verify time (s)", "median_verify_s", ".4f"),
            ("median update time (s)", "median_update_s", ".3f"),
            ("completion tokens per step", "median_tokens", ".0f"),
            (f"trained tokens per step ({counted})", "median_trained_tokens", ".0f"),
            ("generation tokens/s", "median_generation_tokens_per_s", ",.0f"),
            ("update tokens/s (completion tokens)", "median_update_tokens_per_s", ",.0f"),
            ("update tokens/s (trained tokens)", "median_trained_tokens_per_s", ",.0f"),
        ]
        for label, key, spec in rows:
            p(f"| {label} | " + " | ".join(fmt(s.get(key), spec) for s in summaries.values()) + " |")
        p("| update MFU | " + " | ".join(
            (f"{s['median_update_mfu']:.1%} of {s['peak_flops'] / 1e12:.0f} TFLOP/s ({s['peak_gpu']})"
             if s.get("median_update_mfu") is not None else "n/a") for s in summaries.values()) + " |")
        p("| peak RSS of the worker (MB) | " + " | ".join(fmt(s.get("peak_rss_mb"), ",.0f") for s in summaries.values()) + " |")
        p("")

    peer_rows = []
    for dtype in ("f32", "bf16"):
        ours = summaries.get(dtype)
        hf = results.get(f"hf-{dtype}", {}).get("hf")
        trl = results.get(f"trl-{dtype}", {}).get("trl")
        if hf or trl:
            peer_rows.append((dtype, ours, hf, trl))
    if peer_rows:
        p("### Peers on the same batch")
        p("")
        p("| dtype | ours: generation tokens/s | HF generate tokens/s | ours / HF | ours: step (s) | TRL step (s) | ours / TRL |")
        p("|---|---:|---:|---:|---:|---:|---:|")
        for dtype, ours, hf, trl in peer_rows:
            gen = ours.get("median_generation_tokens_per_s") if ours else None
            hf_rate = hf.get("median_tokens_per_s") if hf else None
            step = ours.get("median_step_s") if ours else None
            trl_step = trl.get("median_step_s") if trl else None
            p(f"| {dtype} | {fmt(gen, ',.0f')} | {fmt(hf_rate, ',.0f')} | "
              f"{fmt(gen / hf_rate if gen and hf_rate else None, '.2f')}{'×' if gen and hf_rate else ''} | "
              f"{fmt(step, '.3f')} | {fmt(trl_step, '.3f')} | "
              f"{fmt(step / trl_step if step and trl_step else None, '.2f')}{'×' if step and trl_step else ''} |")
        p("")
        p("HF generate samples exactly the new-token budget for every sequence (min_new_tokens); ours stops a row "
          "at EOS, so compare rates. TRL runs the same job (scripts/bench/trl_grpo.py, 8 rows per micro-batch as ours).")
        versions = next((x.get("versions") for _, _, hf, trl in peer_rows for x in (trl, hf) if x), None)
        if versions:
            p("Peer versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".")
        p("")

    # What to paste into the book's GPU results (docs/src/contributors/benchmarks.md, "On one GPU").
    p("### For the book")
    p("")
    p("```markdown")
    checks = [results.get(k) for k in ("resume-f32", "resume-bf16", "temperature0", "sft-f32", "sft-bf16", "sharing")]
    p(f"Measured {meta.get('date', '?')[:10]} on {device_line}, libtorch {doctor.get('libtorch') or '?'}, CUDA runtime "
      f"{doctor.get('cuda_runtime') or 'none'} (driver {doctor.get('cuda_driver') or 'none'}), cuDNN "
      f"{doctor.get('cudnn') or 'none'}, cuBLAS {doctor.get('cublas') or 'none'}: `{meta.get('command', '?')}`")
    p("")
    if summaries:
        p(f"| SmolLM2-135M-Instruct, {job} | " + " | ".join(headers[v] for v in summaries) + " |")
        p("|---|" + "---:|" * len(summaries))
        for label, key, spec in [rows[0], rows[1], rows[3], rows[6], rows[8]]:
            p(f"| {label} | " + " | ".join(fmt(s.get(key), spec) for s in summaries.values()) + " |")
        p("| update MFU | " + " | ".join(fmt(s.get("median_update_mfu"), ".1%", "n/a") for s in summaries.values()) + " |")
        hf_cells = [results.get(f"hf-{v}", {}).get("hf") if v != "tf32" else None for v in summaries]
        if any(hf_cells):
            p("| HF generate tokens/s (same batch, every row to the budget) | "
              + " | ".join(fmt(h.get("median_tokens_per_s") if h else None, ",.0f") for h in hf_cells) + " |")
        trl_cells = [results.get(f"trl-{v}", {}).get("trl") if v != "tf32" else None for v in summaries]
        if any(trl_cells):
            p("| TRL GRPOTrainer step time (s) | "
              + " | ".join(fmt(t.get("median_step_s") if t else None, ".3f") for t in trl_cells) + " |")
            p("| step time, rlvr / TRL | " + " | ".join(
                fmt(s["median_step_s"] / t["median_step_s"] if t else None, ".2f") for s, t in zip(summaries.values(), trl_cells)) + " |")
        p("")
    if shapes_table:
        table = [line for line in shapes_table.splitlines() if line.startswith("|")]
        p("\n".join(table))
        p("")
    for result in checks:
        if result:
            p(f"- {PARTS[result['id']]}: {result['status'].upper() if result['status'] == 'failed' else result['status']} — {result['detail']}")
    if meta.get("carried"):
        p(f"- carried: {meta['carried']}; the whole run took {meta.get('total_s', '?')} s")
    p("```")
    print("\n".join(out))
    if ours_failed:
        print(f"\ngpu_bench: checks of ours failed: {', '.join(ours_failed)}", file=sys.stderr)
        sys.exit(1)


COMMANDS = {
    "doctor": (cmd_doctor, 5),
    "platform": (cmd_platform, 3),
    "resume": (cmd_resume, 7),
    "finite-loss": (cmd_finite_loss, 3),
    "sft": (cmd_sft, 3),
    "smollm2": (cmd_smollm2, 7),
    "hf": (cmd_hf, 5),
    "trl": (cmd_trl, 5),
    "skip": (cmd_skip, 3),
    "shapes": (cmd_shapes, 4),
    "sharing": (cmd_sharing, 4),
}


def main(argv):
    if argv and argv[0] == "report" and len(argv) >= 2:
        return cmd_report(argv[1], argv[2:])
    if not argv or argv[0] not in COMMANDS or len(argv) - 1 != COMMANDS[argv[0]][1]:
        sys.exit(__doc__)
    function, _ = COMMANDS[argv[0]]
    function(*argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])

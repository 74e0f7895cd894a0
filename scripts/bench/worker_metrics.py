#!/usr/bin/env python3
"""Our worker's side of a trainer benchmark, from its run and its metrics.jsonl: one JSON line.

Usage: worker_metrics.py RUN_JSON METRICS_JSONL WARMUP STEPS [--rollouts ROLLOUTS_JSONL]

RUN_JSON is run_measured.py's result for the worker. Fails (exit 1, the reason on stderr) when the
worker timed out, exited non-zero, or logged fewer step lines than WARMUP + STEPS. Per measured
step (the STEPS after the WARMUP first):
  step_s, rollout_s, verify_s   time.step_s, time.rollout_s, time.verify_s
  update_s                      step − rollout − verify (reference and policy passes, optimizer);
                                reported_update_s is time.update_s as the worker reports it
  tokens                        tokens_generated (completion tokens)
  generation_tokens_per_s       time.generation_tokens_per_s (else tokens / rollout_s)
  update_tokens_per_s           tokens / update_s
  sync_s                        time.sync_s (rollout.engine = "vllm": writing the updated weights
                                and loading them into the server; else null). The worker's
                                time.update_s leaves it out; update_s above includes it
  sampler_gap_max_abs,          sampler_gap.max_abs / .mean_abs (vLLM only, else null): how far
  sampler_gap_mean_abs          the server's log-probabilities of the sampled tokens are from the
                                trainer's
With --rollouts also, from the step's rows in rollouts.jsonl (the rows the update trained on):
  prompt_tokens, trained_tokens prompt + completion tokens of the rows, each group's prompt
                                once (its rows share one pass over it: the tokens the update
                                computes); completion tokens only when the records have no
                                prompt_tokens (trained_tokens_counted says which)
  trained_tokens_per_s          trained_tokens / update_s
and their medians. Medians are over the measured steps; max_sampler_gap_max_abs is the largest
sampler_gap.max_abs of the measured steps, all_steps_sampler_gap_max_abs of every step line.

Stdlib only. Used by trainer.sh, gpu.sh and rollout.sh.
"""

import json
import statistics
import sys


class Failed(Exception):
    """Why the worker's side has no result."""


def flat(record, prefix=""):
    out = {}
    for key, value in record.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def rows_per_step(rollouts_path):
    """{step: (prompt tokens or None, completion tokens)} summed over the step's rows, each
    group's prompt counted once (its rows share one pass over it: what the update computes);
    prompt tokens are None when a row does not give them."""
    sums = {}
    groups = set()
    with open(rollouts_path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            prompt, completion = sums.get(row["step"], (0, 0))
            row_prompt = row.get("prompt_tokens")
            group = (row["step"], row.get("group_id", row.get("completion_id")))
            if group in groups:
                row_prompt = 0
            groups.add(group)
            prompt = None if prompt is None or row_prompt is None else prompt + int(row_prompt)
            sums[row["step"]] = (prompt, completion + int(row["completion_tokens"]))
    return sums


def summarize(run, metrics_path, warmup, steps, rollouts_path=None):
    if run["timed_out"]:
        raise Failed(f"our worker did not finish within the limit (killed after {run['wall_s']:.0f} s)")
    # A run ended after its last measured step (run_measured.py --kill-after-step) did all it had to.
    if run["rc"] != 0 and run.get("killed_at_step") is None:
        raise Failed(f"our worker failed: exit status {run['rc']} after {run['wall_s']:.0f} s")
    try:
        lines = [flat(json.loads(line)) for line in open(metrics_path) if line.strip()]
    except FileNotFoundError:
        raise Failed(f"our worker wrote no {metrics_path}") from None
    step_lines = [line for line in lines if line.get("time.step_s") is not None]
    if len(step_lines) < warmup + steps:
        raise Failed(f"{metrics_path} has {len(step_lines)} step lines, expected {warmup + steps}")
    measured = step_lines[warmup : warmup + steps]
    rows = rows_per_step(rollouts_path) if rollouts_path else None

    def number(line, key):
        value = line.get(key)
        if value is None:
            raise Failed(f"{metrics_path}: step {line.get('step', '?')} has no {key}")
        return float(value)

    def optional(line, key):
        value = line.get(key)
        return None if value is None else float(value)

    per_step = []
    for line in measured:
        step = {
            "step": line.get("step"),
            "step_s": number(line, "time.step_s"),
            "rollout_s": number(line, "time.rollout_s"),
            "verify_s": number(line, "time.verify_s"),
            "reported_update_s": number(line, "time.update_s"),
            "tokens": int(number(line, "tokens_generated")),
        }
        step["update_s"] = step["step_s"] - step["rollout_s"] - step["verify_s"]
        step["sync_s"] = optional(line, "time.sync_s")
        step["sampler_gap_max_abs"] = optional(line, "sampler_gap.max_abs")
        step["sampler_gap_mean_abs"] = optional(line, "sampler_gap.mean_abs")
        reported = line.get("time.generation_tokens_per_s")
        step["generation_tokens_per_s"] = float(reported) if reported is not None else step["tokens"] / step["rollout_s"]
        step["update_tokens_per_s"] = step["tokens"] / step["update_s"] if step["update_s"] > 0 else None
        if rows is not None:
            if step["step"] not in rows:
                raise Failed(f"{rollouts_path}: no rows for step {step['step']}")
            prompt, completion = rows[step["step"]]
            step["prompt_tokens"] = prompt
            step["trained_tokens"] = completion if prompt is None else prompt + completion
            step["trained_tokens_per_s"] = step["trained_tokens"] / step["update_s"] if step["update_s"] > 0 else None
        per_step.append(step)

    def median(key):
        values = [s[key] for s in per_step if s[key] is not None]
        return statistics.median(values) if values else None

    def largest(values):
        values = [v for v in values if v is not None]
        return max(values) if values else None

    accuracy = [line["heldout.accuracy"] for line in lines if line.get("heldout.accuracy") is not None]
    summary = {
        "framework": "rlvr",
        "warmup_steps": warmup,
        "measured_steps": steps,
        "median_step_s": median("step_s"),
        "median_rollout_s": median("rollout_s"),
        "median_verify_s": median("verify_s"),
        "median_update_s": median("update_s"),
        "median_reported_update_s": median("reported_update_s"),
        "median_tokens": median("tokens"),
        "median_generation_tokens_per_s": median("generation_tokens_per_s"),
        "median_update_tokens_per_s": median("update_tokens_per_s"),
        "median_sync_s": median("sync_s"),
        "median_sampler_gap_mean_abs": median("sampler_gap_mean_abs"),
        "max_sampler_gap_max_abs": largest(s["sampler_gap_max_abs"] for s in per_step),
        "all_steps_sampler_gap_max_abs": largest(optional(line, "sampler_gap.max_abs") for line in step_lines),
        "peak_rss_mb": run["peak_rss_mb"],
        "wall_s": run["wall_s"],
        "heldout_accuracy": accuracy,
        "per_step": per_step,
    }
    if rows is not None:
        whole = all(s["prompt_tokens"] is not None for s in per_step)
        summary["trained_tokens_counted"] = "prompt + completion" if whole else "completion only"
        summary["median_prompt_tokens"] = median("prompt_tokens")
        summary["median_trained_tokens"] = median("trained_tokens")
        summary["median_trained_tokens_per_s"] = median("trained_tokens_per_s")
    return summary


def main(argv):
    rollouts = None
    if len(argv) == 6 and argv[4] == "--rollouts":
        rollouts = argv[5]
        argv = argv[:4]
    if len(argv) != 4:
        sys.exit("usage: worker_metrics.py RUN_JSON METRICS_JSONL WARMUP STEPS [--rollouts ROLLOUTS_JSONL]")
    run_path, metrics_path, warmup, steps = argv[0], argv[1], int(argv[2]), int(argv[3])
    try:
        summary = summarize(json.load(open(run_path)), metrics_path, warmup, steps, rollouts)
    except Failed as failed:
        sys.exit(str(failed))
    print(json.dumps(summary))


if __name__ == "__main__":
    main(sys.argv[1:])

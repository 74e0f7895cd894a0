#!/usr/bin/env python3
"""An engine job's memory per rank: DDP against FSDP2 (`[engine] strategy`), on CPU ranks.

Runs the worker's own entry script (engines/trl/run.py) under torchrun, as the worker does, on an
SFT contract written here (an SFT job needs no daemon: nothing is graded), for each strategy and
rank count, and reads the metrics lines the script writes: `rank_state_bytes` (the largest
rank's parameters and AdamW state at a step's end) and `peak_memory_bytes` (the largest rank's
peak resident size since its training began: on a CPU it includes the ~0.9 GB every Python
process with torch and TRL holds before any model). Prints a Markdown table.

The ranks run with glibc's mmap threshold fixed at 128 KiB (`MALLOC_MMAP_THRESHOLD_`): by
default glibc raises it as large blocks are freed, so the whole model every rank loads before
FSDP2 shards it stays in the heap, and a sharded rank's resident peak reads nearly a whole copy's
(measured on 2 ranks: 3.65 GB against DDP's 3.83 GB; with the fixed threshold 2.30 against 3.68).
The threshold makes allocations slower: read the step times of one run against each other only.
`--glibc-default` runs the ranks with glibc's own behaviour instead.

Run with the trl engine's environment (scripts/engine-venv.sh trl):

    ~/.cache/rlvr/venvs/engine-trl/bin/python scripts/bench/engine_memory.py \
        --model ~/.cache/rlvr/models/SmolLM2-135M-Instruct [--ranks 2 4] [--steps 3]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "engines", "trl", "run.py")
# What the worker maps `[engine] strategy = "fsdp2"` to (rlvr_protocol::engine::TrlFsdp::fsdp2).
FSDP2 = {
    "fsdp": True,
    "fsdp_config": {
        "version": 2,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "reshard_after_forward": True,
        "state_dict_type": "SHARDED_STATE_DICT",
    },
}


def contract(work, model, train, ranks, steps, strategy):
    keys = {
        "learning_rate": 1e-5,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "adam_beta1": 0.9,
        "adam_beta2": 0.999,
        "adam_epsilon": 1e-8,
        "max_grad_norm": 1.0,
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 1,
        "max_steps": steps,
        "save_steps": steps * 10,
        "save_total_limit": 1,
        "seed": 7,
        "bf16": False,
    }
    if strategy == "fsdp2":
        keys.update(FSDP2)
    return {
        "trainer": {"name": "sft", "keys": keys},
        "model": model,
        "train": train,
        "output_dir": os.path.join(work, "output"),
        "metrics": os.path.join(work, "metrics.jsonl"),
        "verify": {"url": "http://127.0.0.1:9/v1/verify", "reward": {"graders": []}, "token_file": "/dev/null"},
    }


def run(model, train, ranks, steps, strategy, glibc_default):
    with tempfile.TemporaryDirectory(prefix="engine-memory-") as work:
        path = os.path.join(work, "contract.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(contract(work, model, train, ranks, steps, strategy), f)
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), SCRIPT, path]
        started = time.perf_counter()
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if not glibc_default:
            env["MALLOC_MMAP_THRESHOLD_"] = "131072"
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            sys.exit(f"{strategy} on {ranks} ranks failed ({done.returncode}):\n{done.stderr[-4000:]}")
        with open(os.path.join(work, "metrics.jsonl"), encoding="utf-8") as f:
            lines = [json.loads(line) for line in f if line.strip()]
    return {
        "state": max(line["rank_state_bytes"] for line in lines),
        "peak": max(line["peak_memory_bytes"] for line in lines),
        "step": statistics.median(line["time"]["step_s"] for line in lines[1:] or lines),
        "wall": wall,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a Hugging Face directory")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--glibc-default", action="store_true", help="no fixed mmap threshold (see above)")
    args = parser.parse_args()
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(args.model)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for i in range(256):
            f.write(json.dumps({"prompt": f"What is {i} + {i}?", "completion": f" {2 * i}."}) + "\n")
        train = f.name
    print(f"model {args.model} ({config.model_type}, {config.num_hidden_layers} layers), f32, SFT, {args.steps} steps\n")
    print("| ranks | strategy | a rank's parameters + AdamW state | a rank's peak RSS | step (median) |")
    print("|---|---|---|---|---|")
    for ranks in args.ranks:
        for strategy in ("ddp", "fsdp2"):
            r = run(os.path.abspath(args.model), train, ranks, args.steps, strategy, args.glibc_default)
            print(
                f"| {ranks} | {strategy} | {r['state'] / 1e9:.3f} GB | {r['peak'] / 1e9:.2f} GB | {r['step']:.2f} s |",
                flush=True,
            )
    os.unlink(train)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""TRL's GRPOTrainer on SmolLM2-135M-Instruct with the arith_words.py problems: the reference side
of scripts/bench/trainer.sh. Prints one JSON line of results on stdout; everything else on stderr.

The job, step for step the one scripts/bench/trainer-job.toml gives our worker:
  - one prompt per step, num_generations = 8 completions of at most 64 new tokens each
    (per_device_train_batch_size 8, gradient_accumulation_steps 1, so generation_batch_size 8,
    steps_per_generation 1: one optimizer step = the 8 completions of one group);
    with --prompts-per-step P, P prompts per step: gradient_accumulation_steps P, so
    generation_batch_size 8P, generated at once, and one optimizer step over the P micro-batches
    of 8 rows (our worker's micro_batch_size 8), the loss normalised over all their tokens;
  - beta 0.04 (k3 KL to a frozen reference, in the loss), num_iterations (μ) 1, lr 1e-6 constant,
    temperature 1.0, top_p 1.0, top_k off; the loss as TRL defaults it (loss_type "dapo",
    scale_rewards "group", epsilon 0.2, Bessel std, + 1e-4), max_grad_norm 1.0, AdamW (TRL's
    Trainer defaults: betas 0.9/0.999, eps 1e-8, no weight decay);
  - CPU, float32, bf16 off, gradient checkpointing off (TRL turns both on by default), no vLLM;
    --device cuda trains on the GPU, and --dtype bf16 loads the model in bfloat16 with bf16=True
    (scripts/bench/gpu.sh);
  - prompts are conversational (one user message): TRL applies the model's chat template with the
    generation prompt, as our worker does with the same template; with --plain-prompts they are
    the text as it is (a model without a chat template: scripts/bench/shapes.sh's random ones);
  - with --fixed-length every completion is --max-new-tokens long (generate's min_new_tokens:
    no EOS before), as our worker's `[rollout] ignore_eos`;
  - reward: 1 when the completion's answer is the reference integer, else 0, the answer found
    the way our math verifier finds it (no fallback): the last \\boxed{...}, else the first number
    after the last "final answer is" / "the answer is" / "answer:" marker, up to the end of its
    sentence. So both sides see the same all-fail groups: SmolLM2 rarely boxes, but it does
    write "The answer is: 120".

Measured per optimizer step (a TrainerCallback, on_step_begin -> on_step_end: generation,
reference forward, reward, advantages, policy forward+backward, clip, AdamW step):
  rollout_s   time in GRPOTrainer._generate (chat template + tokenize, model.generate, decode)
  generate_s  time in GRPOTrainer._generate_single_turn (model.generate and the EOS mask only)
  verify_s    time in GRPOTrainer._calculate_rewards
  update_s    step_s - rollout_s - verify_s (reference forward, loss, backward, optimizer)
  tokens      completion tokens of the step (up to and including EOS: what TRL trains on)
generation tokens/s = tokens / rollout_s; update tokens/s = tokens / update_s. Medians over the
steps after the warm-up. cpu_s is the process's user+system CPU time in the step: on a quiet
machine about step_s × threads; much less means the step waited for cores. Peak RSS is the
process's ru_maxrss (policy, reference, optimizer state, activations).

Run it with the trl engine's python (`scripts/engine-venv.sh trl` makes that venv from its hashed
lock and prints it; its torch is the project venv's): it installs nothing. A missing TRL pin
(TRL_PINS) ends the run with exit 3 naming it and that script; other versions of REQUIRED end it
too, unless --any-versions (a device machine whose wheels came with gpu.sh --wheels), which only
reports them (the result has the versions used).
On CUDA each timed span starts and ends with torch.cuda.synchronize().

Usage: trl_grpo.py --model DIR --train FILE [--steps N] [--warmup W] [--seed S] [--threads T]
                   [--device cpu|cuda] [--dtype f32|bf16] [--prompts-per-step P]
                   [--max-new-tokens T] [--plain-prompts] [--fixed-length] [--any-versions]
"""

import argparse
import contextlib
import importlib.metadata as md
import json
import os
import re
import resource
import statistics
import sys
import tempfile
import time

# engines/trl/requirements.lock's versions (datasets 5.2.0 is what pip resolved for trl 1.16.0).
TRL_PINS = ["trl==1.16.0", "datasets==5.2.0"]
REQUIRED = ["transformers==5.23.0", "torch==2.11.0", "accelerate==1.15.0"]
VENV_HINT = "run this with the python `scripts/engine-venv.sh trl` prints"

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
# The math verifier's answer markers (plugins/verifier-math/src/extract.rs), longest match wins.
MARKERS = ["final answer is", "final answer:", "the answer is", "answer is", "answer:", "final answer"]


def log(message):
    print(f"trl_grpo: {message}", file=sys.stderr, flush=True)


def version_ok(spec):
    name, version = spec.split("==")
    try:
        return md.version(name).split("+")[0] == version
    except md.PackageNotFoundError:
        return False


def check_versions(any_versions=False):
    missing = [spec for spec in TRL_PINS if not version_ok(spec)]
    if missing:
        log(f"not installed here: {' '.join(missing)}: {VENV_HINT}")
        sys.exit(3)
    wrong = [spec for spec in REQUIRED if not version_ok(spec)]
    if wrong and any_versions:
        log(f"other versions than {', '.join(wrong)}: the result records the ones used")
    elif wrong:
        sys.exit(f"trl_grpo: expected {', '.join(wrong)}: {VENV_HINT}")


def first_number(text):
    """The first number in text (thousands separators allowed; 3.5 stays 3.5), or None."""
    found = NUMBER.search(text)
    return float(found.group().replace(",", "")) if found else None


def extract_answer(text):
    """The number a completion commits to: its last box, else after its last answer marker."""
    boxes = BOXED.findall(text)
    if boxes:
        box = boxes[-1].strip()
        return float(box.replace(",", "")) if NUMBER.fullmatch(box) else None
    lower = text.lower()
    found = [(lower.rfind(m) + len(m), len(m)) for m in MARKERS if lower.rfind(m) >= 0]
    if not found:
        return None
    end = max(found)[0]
    after = text[end:].lstrip(": *\n\t").split("\n\n")[0]
    sentence = re.match(r"(.*?)(\.\s|\.$|$)", after, re.S).group(1)
    return first_number(sentence)


def answer_match(completions, answer, **_):
    """1.0 when the completion's answer (extract_answer) is the reference integer, else 0.0."""
    rewards = []
    for completion, gold in zip(completions, answer, strict=True):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        rewards.append(1.0 if extract_answer(text) == int(gold) else 0.0)
    return rewards


class StepTimes:
    """Per-step accumulators the patched trainer methods add to; the callback closes each step."""

    def __init__(self):
        self.steps = []
        self.current = None

    def add(self, key, value):
        if self.current is not None:
            self.current[key] = self.current.get(key, 0.0) + value


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(times, key, method, on_result=None, sync=lambda: None):
    def wrapper(*args, **kwargs):
        sync()
        start = time.perf_counter()
        result = method(*args, **kwargs)
        sync()
        times.add(key, time.perf_counter() - start)
        if on_result is not None:
            on_result(result)
        return result

    return wrapper


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="Hugging Face model directory (scripts/fetch-smollm2.sh)")
    parser.add_argument("--train", required=True, help="train.jsonl from arith_words.py")
    parser.add_argument("--steps", type=int, default=10, help="measured steps (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up steps, not measured (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads; 0 = torch's default")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompts-per-step", type=int, default=1, help="prompts (groups) per optimizer step (default 1)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    parser.add_argument("--plain-prompts", action="store_true", help="prompts as text, no chat template")
    parser.add_argument("--fixed-length", action="store_true", help="every completion --max-new-tokens long")
    parser.add_argument(
        "--any-versions", action="store_true", help="run with other versions of REQUIRED (reported in the result)"
    )
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.prompts_per_step < 1:
        sys.exit("trl_grpo: --steps and --prompts-per-step must be ≥ 1 and --warmup ≥ 0")

    for key, value in {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "TRANSFORMERS_VERBOSITY": "error",
        "TQDM_DISABLE": "1",
        "WANDB_DISABLED": "true",
    }.items():
        os.environ.setdefault(key, value)
    check_versions(any_versions=args.any_versions)

    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("trl_grpo: --device cuda but torch.cuda.is_available() is False")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    rows = []
    with open(args.train, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            rows.append(
                {
                    "prompt": record["prompt"]
                    if args.plain_prompts
                    else [{"role": "user", "content": record["prompt"]}],
                    "answer": str(record["reference"]["answer"]),
                }
            )
    dataset = Dataset.from_list(rows)

    total_steps = args.warmup + args.steps
    times = StepTimes()

    class StepTimer(TrainerCallback):
        def on_step_begin(self, _args, state, control, **kwargs):
            sync()
            times.current = {"step": state.global_step + 1, "start": time.perf_counter(), "cpu_start": cpu_seconds()}

        def on_step_end(self, _args, state, control, **kwargs):
            sync()
            step = times.current
            step["step_s"] = time.perf_counter() - step.pop("start")
            step["cpu_s"] = cpu_seconds() - step.pop("cpu_start")
            times.steps.append(step)
            times.current = None
            log(
                f"step {step['step']}/{total_steps}: {step['step_s']:.2f} s "
                f"(CPU {step['cpu_s']:.1f} s, rollout {step.get('rollout_s', 0):.2f} s, "
                f"{step.get('tokens', 0):.0f} tokens, "
                f"reward mean {step.get('reward_mean', float('nan')):.3f})"
            )

    with tempfile.TemporaryDirectory(prefix="trl-grpo.") as output_dir:
        config = GRPOConfig(
            output_dir=output_dir,
            max_steps=total_steps,
            per_device_train_batch_size=args.group_size,
            gradient_accumulation_steps=args.prompts_per_step,
            num_generations=args.group_size,
            max_completion_length=args.max_new_tokens,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            beta=0.04,
            num_iterations=1,
            learning_rate=1e-6,
            lr_scheduler_type="constant",
            warmup_steps=0,
            use_cpu=not cuda,
            bf16=args.dtype == "bf16",
            fp16=False,
            gradient_checkpointing=False,
            use_vllm=False,
            model_init_kwargs={"dtype": dtype},
            seed=args.seed,
            data_seed=args.seed,
            report_to="none",
            logging_steps=1,
            save_strategy="no",
            disable_tqdm=True,
            dataloader_num_workers=0,
            log_completions=False,
            generation_kwargs={"min_new_tokens": args.max_new_tokens} if args.fixed_length else None,
        )
        started = time.perf_counter()
        # Trainer's PrinterCallback prints its logs on stdout: keep stdout for the result line.
        with contextlib.redirect_stdout(sys.stderr):
            trainer = GRPOTrainer(
                model=args.model,
                reward_funcs=answer_match,
                args=config,
                train_dataset=dataset,
                callbacks=[StepTimer()],
            )
            setup_s = time.perf_counter() - started

            def count_tokens(result):
                completion_ids = result[1]
                times.add("tokens", float(sum(len(ids) for ids in completion_ids)))

            def note_rewards(rewards_per_func):
                if times.current is not None:
                    times.current["reward_mean"] = float(rewards_per_func.nansum(dim=1).mean())

            trainer._generate = timed(times, "rollout_s", trainer._generate, count_tokens, sync)
            trainer._generate_single_turn = timed(times, "generate_s", trainer._generate_single_turn, sync=sync)
            trainer._calculate_rewards = timed(times, "verify_s", trainer._calculate_rewards, note_rewards, sync)
            trainer.train()

    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if len(times.steps) != total_steps:
        sys.exit(f"trl_grpo: expected {total_steps} steps, timed {len(times.steps)}")

    per_step = []
    timed_keys = ("step_s", "cpu_s", "rollout_s", "generate_s", "verify_s", "tokens")
    for timed_step in times.steps:
        step = {"step": timed_step["step"]} | {key: timed_step.get(key, 0.0) for key in timed_keys}
        step["reward_mean"] = timed_step.get("reward_mean")
        step["tokens"] = int(step["tokens"])
        step["update_s"] = step["step_s"] - step["rollout_s"] - step["verify_s"]
        step["generation_tokens_per_s"] = step["tokens"] / step["rollout_s"] if step["rollout_s"] else None
        step["update_tokens_per_s"] = step["tokens"] / step["update_s"] if step["update_s"] > 0 else None
        per_step.append(step)
    measured = per_step[args.warmup :]

    def median(key):
        values = [s[key] for s in measured if s[key] is not None]
        return statistics.median(values) if values else None

    result = {
        "framework": "trl",
        "warmup_steps": args.warmup,
        "measured_steps": args.steps,
        "median_step_s": median("step_s"),
        "median_cpu_s": median("cpu_s"),
        "median_rollout_s": median("rollout_s"),
        "median_generate_s": median("generate_s"),
        "median_verify_s": median("verify_s"),
        "median_update_s": median("update_s"),
        "median_tokens": median("tokens"),
        "median_generation_tokens_per_s": median("generation_tokens_per_s"),
        "median_update_tokens_per_s": median("update_tokens_per_s"),
        "peak_rss_mb": round(peak_rss_mb, 1),
        "setup_s": round(setup_s, 2),
        "torch_threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "dtype": args.dtype,
        "versions": {
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "accelerate": md.version("accelerate"),
            "datasets": md.version("datasets"),
            "python": sys.version.split()[0],
        },
        "config": {
            "model": args.model,
            "train": args.train,
            "completions_per_step": args.group_size,
            "prompts_per_step": args.prompts_per_step,
            "max_new_tokens": args.max_new_tokens,
            "beta": config.beta,
            "num_iterations": config.num_iterations,
            "loss_type": config.loss_type,
            "scale_rewards": config.scale_rewards,
            "epsilon": config.epsilon,
            "epsilon_high": config.epsilon_high,
            "learning_rate": config.learning_rate,
            "lr_scheduler_type": str(config.lr_scheduler_type),
            "max_grad_norm": config.max_grad_norm,
            "optim": str(config.optim),
            "seed": args.seed,
        },
        "per_step": per_step,
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

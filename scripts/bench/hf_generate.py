#!/usr/bin/env python3
"""Hugging Face `generate` throughput on the GRPO benchmark's batch: the peer of our rollout in
scripts/bench/gpu.sh. Prints one JSON line of results on stdout; everything else on stderr.

The batch is our job's: the first --prompts prompts of --train (arith_words.py's train.jsonl) in
the model's chat template with the generation prompt, each repeated --group-size times (8 × 8 =
64 sequences), left-padded; sampled with do_sample=True, temperature 1.0, top_p 1.0, top_k off,
and min_new_tokens = max_new_tokens, so every sequence gets exactly --max-new-tokens tokens (ours
stops a row at EOS: compare rates, not times). The model is loaded in --dtype on --device with
transformers' default attention; one warm-up call, then --repeats timed calls, each between
torch.cuda.synchronize() calls on CUDA. tokens/s = sequences × new tokens / seconds; the median
over the timed calls is reported.

Usage: hf_generate.py --model DIR --train FILE [--prompts 8] [--group-size 8]
                      [--max-new-tokens 256] [--dtype f32|bf16] [--device cpu|cuda]
                      [--repeats 3] [--seed 0] [--threads T]
Needs torch and transformers (any recent version: the result records them); installs nothing.
"""

import argparse
import json
import os
import statistics
import sys
import time


def log(message):
    print(f"hf_generate: {message}", file=sys.stderr, flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="Hugging Face model directory")
    parser.add_argument("--train", required=True, help="train.jsonl from arith_words.py")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads; 0 = torch's default")
    args = parser.parse_args()
    if min(args.prompts, args.group_size, args.max_new_tokens, args.repeats) < 1:
        sys.exit("hf_generate: --prompts, --group-size, --max-new-tokens and --repeats must be ≥ 1")

    for key, value in {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "TRANSFORMERS_VERBOSITY": "error",
    }.items():
        os.environ.setdefault(key, value)
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("hf_generate: --device cuda but torch.cuda.is_available() is False")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32

    prompts = []
    with open(args.train, encoding="utf-8") as f:
        for line in f:
            if len(prompts) == args.prompts:
                break
            prompts.append(json.loads(line)["prompt"])
    if len(prompts) < args.prompts:
        sys.exit(f"hf_generate: {args.train} has {len(prompts)} prompts, --prompts is {args.prompts}")

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in prompts
        for _ in range(args.group_size)
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(args.device)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(args.device).eval()
    rows, prompt_width = batch["input_ids"].shape
    log(f"{rows} sequences, prompts padded to {prompt_width} tokens, {args.max_new_tokens} new tokens, {args.dtype} on {args.device}")

    def generate():
        with torch.no_grad():
            sync()
            start = time.perf_counter()
            out = model.generate(
                **batch,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=args.max_new_tokens,
                min_new_tokens=args.max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
            sync()
            seconds = time.perf_counter() - start
        new = out.shape[1] - prompt_width
        if new != args.max_new_tokens:
            sys.exit(f"hf_generate: generated {new} new tokens per sequence, expected {args.max_new_tokens}")
        return seconds

    torch.manual_seed(args.seed)
    warmup_s = generate()
    times = [generate() for _ in range(args.repeats)]
    tokens = rows * args.max_new_tokens
    result = {
        "framework": "hf-generate",
        "sequences": rows,
        "prompt_width": prompt_width,
        "new_tokens": args.max_new_tokens,
        "dtype": args.dtype,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "warmup_s": warmup_s,
        "times_s": times,
        "median_s": statistics.median(times),
        "median_tokens_per_s": tokens / statistics.median(times),
        "attention": getattr(model.config, "_attn_implementation", None),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    for seconds in times:
        log(f"{seconds:.2f} s, {tokens / seconds:.0f} tokens/s")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

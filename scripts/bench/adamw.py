#!/usr/bin/env python3
"""AdamW's update on CPU: `torch.optim.AdamW`'s single-tensor, foreach and fused paths.

Why the worker's AdamW calls the fused kernel (model/csrc/optimizer.cpp): on SmolLM2-135M's
f32 tensors (30 layers of q/k/v/o, gate/up/down and two norms, the final norm and the tied
embedding: 134.5M parameters), with one thread, it times one `optimizer.step()` of each path
after a warm-up step, and prints the fastest of `--repeat` and the speed-up over single-tensor.
Gradients are fixed random normals; the parameters move as training would move them.

Run with the project's venv:  $RLVR_VENV/bin/python scripts/bench/adamw.py [--repeat 3] [--threads 1]
"""

import argparse
import time

import torch

HIDDEN, INTERMEDIATE, KV, LAYERS, VOCAB = 576, 1536, 192, 30, 49152


def smollm2_shapes():
    layer = [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN)]
    layer += [(INTERMEDIATE, HIDDEN), (INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE), (HIDDEN,), (HIDDEN,)]
    return [(VOCAB, HIDDEN)] + layer * LAYERS + [(HIDDEN,)]


def step_seconds(kind, shapes, repeat):
    generator = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape, generator=generator) * 0.02) for shape in shapes]
    for param in params:
        param.grad = torch.randn(param.shape, generator=generator)
    flags = {"single-tensor": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[kind]
    optimizer = torch.optim.AdamW(params, lr=1e-6, weight_decay=0.0, **flags)
    optimizer.step()  # warm-up: the state is allocated here
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        optimizer.step()
        best = min(best, time.perf_counter() - start)
    return best, sum(param.numel() for param in params)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed steps per path (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shapes = smollm2_shapes()
    print(f"torch {torch.__version__}, {args.threads} thread(s), fastest of {args.repeat} steps")
    print("| path | parameters | step (s) | speed-up |")
    print("|---|---:|---:|---:|")
    baseline = None
    for kind in ["single-tensor", "foreach", "fused"]:
        seconds, count = step_seconds(kind, shapes, args.repeat)
        baseline = baseline or seconds
        print(f"| {kind} | {count / 1e6:.1f} M | {seconds:.3f} | {baseline / seconds:.2f}× |")


if __name__ == "__main__":
    main()

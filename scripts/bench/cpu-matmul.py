#!/usr/bin/env python3
"""Float32 linear layers on CPU: libtorch's default (`linear`, MKL) against its oneDNN operator.

Why the trainer sends its float32 CPU linear layers to oneDNN (model/src/onednn.rs): for the
layer shapes of SmolLM2-135M it times, with one thread, the three products of a training step's
layer (forward x·Wᵀ, grad_x = g·W, grad_W = gᵀ·x) and the forward alone at 8 rows (a decoding
step of 8 completions), each through `torch.nn.functional.linear` / `@` (what libtorch picks: MKL
on this build) and through `torch.ops.mkldnn._linear_pointwise` (the operator our C++ layer
calls), and prints median times and the speed-up. Also the largest difference between the two
results, to show it is float rounding.

Run with the project's venv:  $RLVR_VENV/bin/python scripts/bench/cpu-matmul.py [--rows 800] [--repeat 15]
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

# (out, in) of SmolLM2-135M's projections: q/o, k/v, gate/up, down, the tied LM head.
SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)]


def median_ms(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=800, help="rows of a training product (default 800)")
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    onednn = torch.ops.mkldnn._linear_pointwise

    def ours(x, w):
        return onednn(x, w, None, "none", [], "")

    print(f"torch {torch.__version__}, 1 thread; medians of {args.repeat}")
    print()
    print("| layer (out × in) | training: fwd + 2 bwd products, BLAS ms | oneDNN ms | speed-up | decoding: 8 rows, BLAS ms | oneDNN ms | speed-up | max abs diff |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for out, inp in SHAPES:
        w = torch.randn(out, inp)
        x = torch.randn(args.rows, inp)
        g = torch.randn(args.rows, out)
        x8 = torch.randn(8, inp)
        repeat = max(3, args.repeat // 5) if out > 10_000 else args.repeat
        blas_train = median_ms(lambda: (F.linear(x, w), g @ w, g.t() @ x), repeat)
        ours_train = median_ms(lambda: (ours(x, w), ours(g, w.t()), ours(g.t(), x.t())), repeat)
        blas_decode = median_ms(lambda: F.linear(x8, w), repeat * 4)
        ours_decode = median_ms(lambda: ours(x8, w), repeat * 4)
        diff = max(
            (F.linear(x, w) - ours(x, w)).abs().max().item(),
            (g @ w - ours(g, w.t())).abs().max().item(),
            (g.t() @ x - ours(g.t(), x.t())).abs().max().item(),
        )
        print(
            f"| {out} × {inp} | {blas_train:.1f} | {ours_train:.1f} | {blas_train / ours_train:.2f}× "
            f"| {blas_decode:.3f} | {ours_decode:.3f} | {blas_decode / ours_decode:.2f}× | {diff:.1e} |"
        )


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes tests/conformance/adamw.json: the worker's AdamW and gradient clipping against PyTorch's.

Unlike make_goldens.py (formulas written from the papers), the reference here is the optimizer
the field trains with: `torch.optim.AdamW` (its fused kernel, `fused=True`, which the worker
calls) and `torch.nn.utils.clip_grad_norm_` (single-tensor, `foreach=False`), in float32 as the worker runs. Each case gives float32
parameters, a gradient per update, the hyper-parameters and the learning rate of each update;
the expected values are the parameters, both moments and the pre-clipping gradient norm after
each update. `worker/src/optim.rs` replays them.

Run with the project's venv:  $RLVR_VENV/bin/python tests/conformance/make_adamw_golden.py
"""

import json
import pathlib

import torch

HERE = pathlib.Path(__file__).resolve().parent
SHAPES = {"w": [3, 5], "b": [7]}
UPDATES = 4


def case(name, seed, *, lrs, weight_decay, max_norm, betas=(0.9, 0.999), eps=1e-8, grad_scale=1.0):
    generator = torch.Generator().manual_seed(seed)
    params = {k: torch.randn(s, generator=generator, dtype=torch.float32) for k, s in SHAPES.items()}
    grads = [
        {k: torch.randn(s, generator=generator, dtype=torch.float32) * grad_scale for k, s in SHAPES.items()}
        for _ in range(UPDATES)
    ]
    leaves = {k: torch.nn.Parameter(v.clone()) for k, v in params.items()}
    optimizer = torch.optim.AdamW(
        list(leaves.values()), lr=lrs[0], betas=betas, eps=eps, weight_decay=weight_decay, fused=True
    )
    expected = []
    for lr, grad in zip(lrs, grads):
        for group in optimizer.param_groups:
            group["lr"] = lr
        for key, leaf in leaves.items():
            leaf.grad = grad[key].clone()
        norm = torch.nn.utils.clip_grad_norm_(list(leaves.values()), max_norm, foreach=False) if max_norm > 0 else None
        if norm is None:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grad.values()]))
        optimizer.step()
        state = {key: optimizer.state[leaf] for key, leaf in leaves.items()}
        expected.append(
            {
                "grad_norm": float(norm),
                "params": {k: leaf.detach().flatten().tolist() for k, leaf in leaves.items()},
                "exp_avg": {k: s["exp_avg"].flatten().tolist() for k, s in state.items()},
                "exp_avg_sq": {k: s["exp_avg_sq"].flatten().tolist() for k, s in state.items()},
            }
        )
    return {
        "name": name,
        "config": {"beta1": betas[0], "beta2": betas[1], "eps": eps, "weight_decay": weight_decay},
        "max_norm": max_norm,
        "lrs": lrs,
        "names": list(SHAPES),  # the parameters' order, which the global norm's rounding depends on
        "shapes": SHAPES,
        "params": {k: v.flatten().tolist() for k, v in params.items()},
        "grads": [{k: g.flatten().tolist() for k, g in grad.items()} for grad in grads],
        "expected": expected,
    }


def main():
    cases = [
        case("plain", 1, lrs=[1e-3] * UPDATES, weight_decay=0.0, max_norm=0.0),
        case("weight-decay", 2, lrs=[1e-2] * UPDATES, weight_decay=0.1, max_norm=0.0),
        case("clipped", 3, lrs=[5e-3] * UPDATES, weight_decay=0.01, max_norm=1.0, grad_scale=3.0),
        case("unclipped-below-max", 4, lrs=[5e-3] * UPDATES, weight_decay=0.0, max_norm=100.0),
        case("schedule-and-betas", 5, lrs=[1e-4, 5e-4, 1e-3, 2e-4], weight_decay=0.05, max_norm=1.0, betas=(0.8, 0.95), eps=1e-6),
    ]
    document = {"generated_by": "tests/conformance/make_adamw_golden.py", "torch": torch.__version__, "cases": cases}
    path = HERE / "adamw.json"
    path.write_text(json.dumps(document) + "\n")
    print(f"{path.relative_to(HERE.parent.parent)}: {len(cases)} cases")


if __name__ == "__main__":
    main()

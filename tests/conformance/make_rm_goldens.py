#!/usr/bin/env python3
"""Writes tests/conformance/rm.json: the goldens of the `rm` optimizer (a reward model on
preference pairs).

An independent reference, written from the papers, not from the plugin's Rust and not from any
training framework: plain Python floats throughout, the loss and its gradient written out by hand.

- Bradley–Terry pairwise loss of a reward model r: loss(θ) = −E log σ(r(x, y_c) − r(x, y_r))
  (Ouyang et al., InstructGPT, arXiv:2203.02155, eq. 1; one pair at a time instead of K choose 2
  comparisons per prompt).
- With a margin m(r) the pair must clear: −log σ(r_c − r_r − m) (Touvron et al., Llama 2,
  arXiv:2307.09288, §3.2.2, eq. 2). Here m = the pair's own margin from the data + the constant
  `margin` key.

A batch's loss is the mean over its pairs; the host splits a batch into micro-batches, each
reporting its share: Σ over its pairs / (batch_sequences / 2). Rows come in pairs: row 2i is pair
i's chosen completion, row 2i + 1 its rejected one; each row's score is one number ([B, 1]); the
margins ride on both rows of their pair.

Run with the project's venv (or any Python 3):  python3 tests/conformance/make_rm_goldens.py
"""

import json
import math
import pathlib
import random

HERE = pathlib.Path(__file__).resolve().parent


def softplus(x):
    """log(1 + e^x), without overflow either way."""
    return x + math.log1p(math.exp(-x)) if x > 0 else math.log1p(math.exp(x))


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def rm(config, batch):
    constant = config.get("margin", 0.0)
    scores = [row[0] for row in batch["scores"]]
    margins = [row[0] for row in batch["margins"]]
    pairs = batch["scale"]["batch_sequences"] / 2
    loss, grads = 0.0, [0.0] * len(scores)
    gaps = []
    for pair in range(len(scores) // 2):
        c, r = 2 * pair, 2 * pair + 1
        gap = scores[c] - scores[r]
        d = gap - margins[c] - constant
        # −log σ(d) = softplus(−d); d/dd of it is −σ(−d).
        loss += softplus(-d) / pairs
        slope = sigmoid(-d) / pairs
        grads[c], grads[r] = -slope, slope
        gaps.append((scores[c], scores[r], gap))
    n = len(gaps)
    metrics = {
        "accuracy": sum(1 for _, _, gap in gaps if gap > 0) / n,
        "score_gap": sum(gap for _, _, gap in gaps) / n,
        "chosen_score": sum(c for c, _, _ in gaps) / n,
        "rejected_score": sum(r for _, r, _ in gaps) / n,
    }
    return {"loss": loss, "grad_scores": [[g] for g in grads], "loss_metrics": metrics}


def make_batch(seed, pairs, *, margins=None, ties=(), spread=1.5, batch_pairs=None):
    rng = random.Random(seed)
    scores = []
    for pair in range(pairs):
        chosen = rng.gauss(0.3, spread)
        rejected = chosen if pair in ties else rng.gauss(-0.3, spread)
        scores += [[round(chosen, 6)], [round(rejected, 6)]]
    per_pair = margins if margins is not None else [0.0] * pairs
    rows = [[m] for m in per_pair for _ in range(2)]
    sequences = 2 * (batch_pairs or pairs)
    return {
        "scores": scores,
        "margins": rows,
        "scale": {"batch_sequences": sequences, "batch_tokens": sequences, "max_new_tokens": 8},
    }


BATCHES = {
    "base": make_batch(7000, 6),
    "data_margins": make_batch(7001, 6, margins=[0.0, 0.5, 1.0, 0.0, 2.0, 0.25]),
    "ties": make_batch(7002, 4, ties=(0, 2)),
    "wide": make_batch(7003, 5, spread=25.0),  # gaps of tens: log σ must not overflow
    "single": make_batch(7004, 1, margins=[1.0]),
    # A micro-batch of a larger batch: its loss is its share of the batch's mean.
    "share": make_batch(7005, 3, batch_pairs=8),
}

CASES = [
    ("defaults", {}, "base"),
    ("margin", {"margin": 0.5}, "base"),
    ("data_margins", {}, "data_margins"),
    ("data_margins_and_margin", {"margin": 1.0}, "data_margins"),
    ("ties", {}, "ties"),
    ("wide", {}, "wide"),
    ("wide_margin", {"margin": 3.0}, "wide"),
    ("single", {}, "single"),
    ("single_margin", {"margin": 0.25}, "single"),
    ("share", {}, "share"),
]


def check_finite(value, where):
    if isinstance(value, float):
        assert math.isfinite(value), where
    elif isinstance(value, dict):
        for key, item in value.items():
            check_finite(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_finite(item, f"{where}[{index}]")


def main():
    document = {
        "plugin": "rm",
        "crate": "rlvr-optimizer-rm",
        "generated_by": "tests/conformance/make_rm_goldens.py",
        "batches": BATCHES,
        "cases": [],
    }
    for name, config, batch in CASES:
        expected = rm(config, BATCHES[batch])
        check_finite(expected, f"rm/{name}")
        document["cases"].append({"name": name, "config": config, "batch": batch, "expected": expected})
    path = HERE / "rm.json"
    path.write_text(json.dumps(document, indent=1) + "\n")
    print(f"{path.relative_to(HERE.parent.parent)}: {len(CASES)} cases")


if __name__ == "__main__":
    main()

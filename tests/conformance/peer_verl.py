#!/usr/bin/env python3
"""Runs verl's own policy-loss functions on the golden batches, for the cross-check in
tests/tests/conformance.rs (`verl_computes_the_same_losses_and_gradients`).

verl (pinned in scripts/peer-rl-venv.sh) implements three of the objectives the plugins added:
dual-clip PPO (`compute_policy_loss_vanilla`, `clip_ratio_c`), GSPO
(`compute_policy_loss_gspo`) and CISPO (`compute_policy_loss_cispo`), and the k3 KL term
(`kl_penalty(..., "low_var_kl")`) and the aggregations (`agg_loss`). This script calls those
functions, nothing re-derived, on each listed golden case's batch and its golden advantages
(float64), and prints one JSON object: for each case, the loss and the gradient with respect to
the log-probabilities. The Rust test runs the plugin on the same inputs and compares.

Mapping of keys: `clip_eps_low`/`clip_eps_high` are verl's `clip_ratio_low`/`clip_ratio_high`,
`clip_ratio_c` is verl's; verl's dual clip is always on in `vanilla`, so a case without it runs
with a `clip_ratio_c` no ratio reaches. `global_batch_info` gives verl our whole-batch
normalisers (all rows, as the plugins' `LossScale` does; verl's default counts non-empty rows).

Usage: python peer_verl.py   (run from anywhere; reads the golden files beside it)
"""

import json
import os
import pathlib
import sys

os.environ.setdefault("VERL_USE_EXTERNAL_PLUGINS", "none")

import torch  # noqa: E402
import verl  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
F64 = torch.float64

# (golden file, case, verl loss mode): the cases of the three objectives verl implements.
CASES = [
    ("grpo", "clip_ratio_c", "vanilla"),
    ("grpo", "clip_ratio_c_loose", "vanilla"),
    ("grpo", "all_pass_clip_ratio_c", "vanilla"),
    ("grpo", "empty_rows_clip_ratio_c", "vanilla"),
    ("grpo", "importance_ratio_sequence", "gspo"),
    ("grpo", "gspo", "gspo"),
    ("grpo", "gspo_token_mean", "gspo"),
    ("grpo", "empty_rows_gspo", "gspo"),
    ("grpo", "loss_cispo", "cispo"),
    ("grpo", "cispo", "cispo"),
    ("grpo", "cispo_both_bounds", "cispo"),
    ("grpo", "empty_rows_cispo", "cispo"),
    ("grpo", "defaults", "vanilla"),
    ("grpo", "dapo", "vanilla"),
]

GRPO_DEFAULTS = {"clip_eps_low": 0.2, "kl_beta": 0.04, "loss_agg": "seq-mean-token-mean"}
# Far above any ratio of the golden batches (at most about e^1.5): verl's dual clip then binds
# nowhere, which is the plugins' clip_ratio_c unset.
NO_DUAL_CLIP = 1e6


def matrix(value):
    return torch.tensor(value, dtype=F64)


def peer(plugin, case, mode, golden):
    config = {**GRPO_DEFAULTS, **case["config"]}
    assert config.get("kl_in", "loss") == "loss" and config.get("kl_estimator", "k3") == "k3", case["name"]
    assert not config.get("entropy_coef"), case["name"]
    batch = golden["batches"][case["batch"]]
    mask = matrix(batch["mask"])
    old, ref = matrix(batch["old_logprobs"]), matrix(batch["ref_logprobs"])
    advantages = matrix(case["expected"]["advantages"])
    logprobs = matrix(batch["logprobs"]).requires_grad_(True)
    low = config["clip_eps_low"]
    high = config.get("clip_eps_high") or low
    scale = batch["scale"]
    batch_info = {
        "batch_num_tokens": scale["batch_tokens"],
        "global_batch_size": scale["batch_sequences"],
        "loss_scale_factor": scale["max_new_tokens"],
    }
    actor = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=low,
        clip_ratio_low=low,
        clip_ratio_high=high,
        clip_ratio_c=config.get("clip_ratio_c") or NO_DUAL_CLIP,
        loss_agg_mode=config["loss_agg"],
        global_batch_info=batch_info,
    )
    loss_fn = core_algos.get_policy_loss_fn(mode)
    loss, _ = loss_fn(
        old_log_prob=old,
        log_prob=logprobs,
        advantages=advantages,
        response_mask=mask,
        loss_agg_mode=config["loss_agg"],
        config=actor,
    )
    if config["kl_beta"] > 0:
        kl = core_algos.kl_penalty(logprobs, ref, "low_var_kl")
        loss = loss + config["kl_beta"] * core_algos.agg_loss(kl, mask, config["loss_agg"], **batch_info)
    loss.backward()
    # Padding: verl leaves whatever its formulas give there out of the loss but not always out of
    # the gradient's zeros; the plugins' gradient is 0 there. Compare completion tokens only.
    grad = (logprobs.grad * mask).tolist()
    return {"loss": loss.item(), "grad_logprobs": grad}


def main():
    goldens = {}
    out = {"verl": verl.__version__, "torch": torch.__version__, "cases": []}
    for plugin, name, mode in CASES:
        if plugin not in goldens:
            goldens[plugin] = json.loads((HERE / f"{plugin}.json").read_text())
        golden = goldens[plugin]
        case = next(c for c in golden["cases"] if c["name"] == name)
        out["cases"].append({"plugin": plugin, "case": name, "mode": mode, **peer(plugin, case, mode, golden)})
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()

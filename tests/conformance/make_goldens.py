#!/usr/bin/env python3
"""Writes the golden files of the optimizer plugins' conformance suite (tests/conformance/*.json).

An independent reference implementation, written from the papers (see README.md in this
directory), not from any training framework and not from the plugins' Rust code. Where the Rust
side uses masks, tensors and host vectors, this side walks rows and tokens with plain Python
floats (advantages, returns, metrics) and uses torch (float64) only for the losses, so that
autograd gives their gradients.

Each file holds, for one plugin, seeded synthetic batches (every input the Rust test needs,
written out, so both sides read the same numbers) and cases: a config, the batch it runs on,
and the expected advantages, returns, loss, gradients and metrics.

Run with the project's venv:  $RLVR_VENV/bin/python tests/conformance/make_goldens.py
"""

import json
import math
import pathlib
import re
import statistics

import torch

HERE = pathlib.Path(__file__).resolve().parent
F64 = torch.float64
T = 6  # columns of every batch
MAX_NEW_TOKENS = T + 2  # the job's budget: a little more than the longest completion


# --- inputs -----------------------------------------------------------------------------------


def _matrix(generator, rows, mean, spread):
    return (mean + spread * torch.randn(rows, T, generator=generator, dtype=F64)).tolist()


def make_batch(seed, group_sizes, *, rewards=None, empty_rows=(), pairs_identical=False):
    """A batch of completions: rewards, groups, a right-padded mask and every [B, T] input.

    Padding positions hold finite junk on purpose: a plugin must ignore them.
    """
    g = torch.Generator().manual_seed(seed)
    rows = sum(group_sizes)
    group_ids = [100 + group for group, size in enumerate(group_sizes) for _ in range(size)]
    lengths = torch.randint(1, T + 1, (rows,), generator=g).tolist()
    lengths[0] = T
    for row in empty_rows:
        lengths[row] = 0
    if rewards is None:
        rewards = [round(x, 2) for x in torch.rand(rows, generator=g, dtype=F64).tolist()]
        for row in range(0, rows, 3):  # verifier-like 0/1 rewards among the graded ones
            rewards[row] = float(row % 2)
    old = (-0.1 - 2.5 * torch.rand(rows, T, generator=g, dtype=F64)).tolist()
    ref = [[o + d for o, d in zip(row, drow)] for row, drow in zip(old, _matrix(g, rows, 0.0, 0.3))]
    logprobs = [[o + d for o, d in zip(row, drow)] for row, drow in zip(old, _matrix(g, rows, 0.0, 0.35))]
    values = _matrix(g, rows, 0.3, 0.5)
    new_values = [[v + d for v, d in zip(row, drow)] for row, drow in zip(values, _matrix(g, rows, 0.0, 0.3))]
    if pairs_identical:  # DPO: each rejected row a copy of its chosen row
        for data in (old, ref, logprobs, values, new_values):
            for row in range(1, rows, 2):
                data[row] = list(data[row - 1])
        for row in range(1, rows, 2):
            lengths[row] = lengths[row - 1]
    mask = [[1.0 if t < n else 0.0 for t in range(T)] for n in lengths]
    return {
        "rewards": rewards,
        "group_ids": group_ids,
        "mask": mask,
        "old_logprobs": old,
        "ref_logprobs": ref,
        "logprobs": logprobs,
        "values": values,
        "new_values": new_values,
        "scale": {"batch_sequences": rows, "batch_tokens": sum(lengths), "max_new_tokens": MAX_NEW_TOKENS},
    }


def group_batches(seed):
    """Groups of 4, 4 and 3 and the degenerate batches: all-pass, all-fail, groups of one, and
    completions with no tokens."""
    sizes = [4, 4, 3]
    rows = sum(sizes)
    return {
        "base": make_batch(seed, sizes),
        "all_pass": make_batch(seed + 1, sizes, rewards=[1.0] * rows),
        "all_fail": make_batch(seed + 2, sizes, rewards=[0.0] * rows),
        "single": make_batch(seed + 3, [1, 1, 1]),
        "empty_rows": make_batch(seed + 4, sizes, empty_rows=(2, 9)),
        "overlong": overlong_batch(seed + 5, sizes),
    }


def overlong_batch(seed, group_sizes):
    """A batch whose budget is shorter than its longest completions, so that DAPO's length
    penalty meets every one of its three pieces (free, ramp, beyond L_max)."""
    batch = make_batch(seed, group_sizes)
    batch["scale"] = {**batch["scale"], "max_new_tokens": OVERLONG_MAX_NEW_TOKENS}
    return batch


OVERLONG_MAX_NEW_TOKENS = T - 1


# --- shared formulas ---------------------------------------------------------------------------


def lengths_of(batch):
    return [int(sum(row)) for row in batch["mask"]]


def tokens(matrix, lengths):
    """Every completion token's value, row by row."""
    return [matrix[i][t] for i, n in enumerate(lengths) for t in range(n)]


def token_mean(matrix, lengths):
    values = tokens(matrix, lengths)
    return sum(values) / max(len(values), 1)


def kl_float(estimator, logp, ref):
    """Schulman, "Approximating KL divergence" (2020), with r = p_ref / π on a sample from π."""
    log_r = ref - logp
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r * log_r
    return math.exp(log_r) - log_r - 1.0


def kl_tensor(estimator, logp, ref):
    log_r = ref - logp
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r**2
    return torch.exp(log_r) - log_r - 1.0


def std(values, kind):
    """Sample (n − 1) or population (n) std; 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    return statistics.stdev(values) if kind == "sample" else statistics.pstdev(values)


def groups_of(group_ids):
    groups, start = [], 0
    for i in range(1, len(group_ids) + 1):
        if i == len(group_ids) or group_ids[i] != group_ids[start]:
            groups.append(list(range(start, i)))
            start = i
    return groups


def uniform_group_frac(rewards, groups):
    return sum(1 for g in groups if len({rewards[i] for i in g}) == 1) / len(groups)


def reward_kl(batch, estimator, beta):
    """KL folded into the reward: β·Σ_t k(old, ref) per completion, and its metrics."""
    lengths = lengths_of(batch)
    old, ref = batch["old_logprobs"], batch["ref_logprobs"]
    per_token = [[kl_float(estimator, old[i][t], ref[i][t]) for t in range(T)] for i in range(len(old))]
    penalty = [beta * sum(per_token[i][:n]) for i, n in enumerate(lengths)]
    metrics = {"kl": token_mean(per_token, lengths), "kl_penalty": sum(penalty) / len(penalty)}
    return penalty, metrics


def repeat_rows(per_row, lengths):
    return [[per_row[i] if t < n else 0.0 for t in range(T)] for i, n in enumerate(lengths)]


def aggregate(per_token, lengths, agg, scale):
    """A micro-batch's share of the batch's loss (DAPO token-mean, GRPO seq-mean-token-mean,
    Dr. GRPO seq-mean-token-sum-norm)."""
    rows = [per_token[i, :n].sum() for i, n in enumerate(lengths)]
    if agg == "token-mean":
        return sum(rows) / max(scale["batch_tokens"], 1)
    if agg == "seq-mean-token-mean":
        return sum(r / max(n, 1) for r, n in zip(rows, lengths)) / scale["batch_sequences"]
    return sum(rows) / (scale["batch_sequences"] * scale["max_new_tokens"])


def clipped_surrogate(logp, old, adv, low, high):
    """PPO's clipped objective (Schulman et al. 2017, eq. 7), negated into a loss, per token."""
    ratio = torch.exp(logp - old)
    return -torch.min(ratio * adv, torch.clamp(ratio, 1 - low, 1 + high) * adv), ratio


def clip_metrics(ratio, adv, lengths, low, high):
    pairs = list(zip(tokens(ratio.detach().tolist(), lengths), tokens(adv, lengths)))
    n = max(len(pairs), 1)
    return {
        "clip_frac_low": sum(1 for r, a in pairs if a < 0 and r < 1 - low) / n,
        "clip_frac_high": sum(1 for r, a in pairs if a > 0 and r > 1 + high) / n,
        "ratio_mean": sum(r for r, _ in pairs) / n,
    }


def overlong_reward(length, max_tokens, buffer, factor):
    """DAPO (Yu et al. 2025, arXiv:2503.14476) §3.4, eq. 13, soft overlong punishment:
    0 up to L_max − L_cache, then ((L_max − L_cache) − |y|) / L_cache, and −1 beyond L_max."""
    if length <= max_tokens - buffer:
        value = 0.0
    elif length <= max_tokens:
        value = ((max_tokens - buffer) - length) / buffer
    else:
        value = -1.0
    return factor * value


def shape_overlong(rewards, lengths, c, batch):
    """The length penalty added to each reward, and its metrics; nothing when overlong_buffer is
    unset."""
    if c.get("overlong_buffer") is None:
        return rewards, {}
    factor = 1.0 if c.get("overlong_penalty") is None else c["overlong_penalty"]
    added = [overlong_reward(n, batch["scale"]["max_new_tokens"], c["overlong_buffer"], factor) for n in lengths]
    metrics = {
        "overlong_shaping": sum(added) / len(added),
        "overlong_frac": sum(1 for a in added if a != 0.0) / len(added),
    }
    return [r + a for r, a in zip(rewards, added)], metrics


def policy_loss(logp, old, adv, lengths, c, low, high):
    """The per-token policy loss of the options, and the ratio it clips (for the metrics).

    - PPO's clipped surrogate (Schulman et al. 2017, eq. 7) on token ratios;
    - with ``importance_ratio = "sequence"``, GSPO (Zheng et al. 2025, arXiv:2507.18071): the
      sequence ratio s_i = (π(y_i)/π_old(y_i))^(1/|y_i|) (eq. 7), carried by each token in the
      GSPO-token form s_i,t = sg[s_i]·π(y_i,t)/sg[π(y_i,t)] (eq. 13), clipped like PPO's;
    - with ``clip_ratio_c``, dual-clip PPO (Ye et al. 2020, arXiv:1912.09729, eq. 5): for A < 0 the
      objective is max(min(ρA, clip(ρ)A), c·A);
    - with ``loss = "cispo"``, CISPO (MiniMax-M1, arXiv:2506.13585, eq. 4): the clipped importance
      weight, stop-gradient, times A·log π.
    """
    rows = []
    ratios = []
    for i, n in enumerate(lengths):
        if c.get("importance_ratio", "token") == "sequence":
            log_s = (logp[i, :n] - old[i, :n]).sum() / n if n else torch.zeros((), dtype=F64)
            ratio = torch.exp(log_s.detach()) * torch.exp(logp[i, :n] - logp[i, :n].detach())
        else:
            ratio = torch.exp(logp[i, :n] - old[i, :n])
        a = adv[i, :n]
        if c.get("loss", "ppo-clip") == "cispo":
            weight = torch.clamp(ratio, 1 - low, 1 + high).detach()
            loss = -(weight * a * logp[i, :n])
        else:
            objective = torch.min(ratio * a, torch.clamp(ratio, 1 - low, 1 + high) * a)
            if c.get("clip_ratio_c") is not None:
                objective = torch.where(a < 0, torch.max(objective, c["clip_ratio_c"] * a), objective)
            loss = -objective
        pad = torch.zeros(T - n, dtype=F64)
        rows.append(torch.cat([loss, pad]))
        ratios.append(torch.cat([ratio, pad]))
    return torch.stack(rows), torch.stack(ratios)


def policy_metrics(ratio, adv, lengths, c, low, high):
    """Clip fractions: PPO's count a clip only where it binds (by the advantage's sign), CISPO's
    wherever the weight is clipped; the dual clip where A < 0 and ρ > c."""
    pairs = list(zip(tokens(ratio.detach().tolist(), lengths), tokens(adv, lengths)))
    n = max(len(pairs), 1)
    cispo = c.get("loss", "ppo-clip") == "cispo"
    metrics = {
        "clip_frac_low": sum(1 for r, a in pairs if (cispo or a < 0) and r < 1 - low) / n,
        "clip_frac_high": sum(1 for r, a in pairs if (cispo or a > 0) and r > 1 + high) / n,
        "ratio_mean": sum(r for r, _ in pairs) / n,
    }
    if c.get("clip_ratio_c") is not None:
        metrics["clip_frac_dual"] = sum(1 for r, a in pairs if a < 0 and r > c["clip_ratio_c"]) / n
    return metrics


def entropy_estimate(logp, old):
    """Per-token entropy of π from the sampled token alone: the token came from μ = π_old, so
    H(π) = E_μ[(π/μ)·(−log π)]; the estimate −(π/μ)·log π has that mean, and so does its gradient
    −(π/μ)(log π + 1)∇log π have ∇H's."""
    return -torch.exp(logp - old) * logp


def tensor(matrix):
    return torch.tensor(matrix, dtype=F64)


def backward(loss, *leaves):
    loss.backward()
    return [leaf.grad.tolist() for leaf in leaves]


# --- grpo ----------------------------------------------------------------------------------------

GRPO_DEFAULTS = {
    "scale_rewards": "group",
    "std": "sample",
    "eps": 1e-4,
    "clip_eps_low": 0.2,
    "clip_eps_high": None,
    "kl_beta": 0.04,
    "kl_estimator": "k3",
    "kl_in": "loss",
    "loss_agg": "seq-mean-token-mean",
    "loss": "ppo-clip",
    "importance_ratio": "token",
    "clip_ratio_c": None,
    "overlong_buffer": None,
    "overlong_penalty": None,
    "entropy_coef": 0.0,
}


def grpo(config, batch):
    c = {**GRPO_DEFAULTS, **config}
    high = c["clip_eps_low"] if c["clip_eps_high"] is None else c["clip_eps_high"]
    lengths = lengths_of(batch)
    groups = groups_of(batch["group_ids"])
    rewards = list(batch["rewards"])
    adv_metrics = {"uniform_group_frac": uniform_group_frac(rewards, groups)}
    rewards, overlong_metrics = shape_overlong(rewards, lengths, c, batch)
    adv_metrics.update(overlong_metrics)
    if c["kl_in"] == "reward":
        penalty, kl_metrics = reward_kl(batch, c["kl_estimator"], c["kl_beta"])
        rewards = [r - p for r, p in zip(rewards, penalty)]
        adv_metrics.update(kl_metrics)
    # DeepSeekMath §4.1.2: A_i = (r_i − mean(r)) / std(r) over the group; the eps, the batch std
    # and no division are the options of Dr. GRPO and later work.
    batch_std = std(rewards, c["std"])
    advantage = [0.0] * len(rewards)
    for group in groups:
        values = [rewards[i] for i in group]
        mean = sum(values) / len(values)
        if c["scale_rewards"] == "group":
            scale = std(values, c["std"]) + c["eps"]
        elif c["scale_rewards"] == "batch":
            scale = batch_std + c["eps"]
        else:
            scale = 1.0
        for i in group:
            advantage[i] = (rewards[i] - mean) / scale
    advantages = repeat_rows(advantage, lengths)

    logp = tensor(batch["logprobs"]).requires_grad_(True)
    old, ref, adv = tensor(batch["old_logprobs"]), tensor(batch["ref_logprobs"]), tensor(advantages)
    per_token, ratio = policy_loss(logp, old, adv, lengths, c, c["clip_eps_low"], high)
    kl = kl_tensor(c["kl_estimator"], logp, ref)
    if c["kl_in"] == "loss":
        per_token = per_token + c["kl_beta"] * kl
    entropy = entropy_estimate(logp, old)
    per_token = per_token - c["entropy_coef"] * entropy
    loss = aggregate(per_token, lengths, c["loss_agg"], batch["scale"])
    metrics = policy_metrics(ratio, advantages, lengths, c, c["clip_eps_low"], high)
    metrics["kl"] = token_mean(kl.detach().tolist(), lengths)
    metrics["entropy"] = token_mean(entropy.detach().tolist(), lengths)
    if c["importance_ratio"] == "sequence" and c["loss_agg"] == "seq-mean-token-mean" and c["kl_beta"] == 0 and c["clip_ratio_c"] is None and c["entropy_coef"] == 0:
        check_gspo_sequence_form(loss, logp, old, advantage, lengths, c["clip_eps_low"], high, batch["scale"])
    (grad,) = backward(loss, logp)
    return {
        "advantages": advantages,
        "advantage_metrics": adv_metrics,
        "loss": loss.item(),
        "grad_logprobs": grad,
        "loss_metrics": metrics,
    }


def check_gspo_sequence_form(loss, logp, old, advantage, lengths, low, high, scale):
    """GSPO's own objective (eq. 5), one term per sequence, must equal the GSPO-token form's
    value and gradient under seq-mean-token-mean (the paper's remark after eq. 14)."""
    x = logp.detach().clone().requires_grad_(True)
    terms = []
    for i, n in enumerate(lengths):
        if not n:
            continue
        s = torch.exp((x[i, :n] - old[i, :n]).sum() / n)
        terms.append(-torch.min(s * advantage[i], torch.clamp(s, 1 - low, 1 + high) * advantage[i]))
    direct = sum(terms) / scale["batch_sequences"]
    direct.backward()
    (grad,) = torch.autograd.grad(loss, logp, retain_graph=True)
    assert abs(direct.item() - loss.item()) < 1e-12, (direct.item(), loss.item())
    assert torch.allclose(grad, x.grad, atol=1e-12), "GSPO-token's gradient differs from GSPO's"


DAPO = {"clip_eps_low": 0.2, "clip_eps_high": 0.28, "kl_beta": 0.0, "loss_agg": "token-mean"}
DR_GRPO = {"scale_rewards": "none", "loss_agg": "seq-mean-token-sum-norm", "kl_beta": 0.0}
# GSPO's own setting: sequence ratio, clip ranges 3e-4 / 4e-4 (§5.1), no KL.
GSPO = {"importance_ratio": "sequence", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4, "kl_beta": 0.0}
# CISPO as MiniMax-M1 writes it: token-level normalisation, only the upper bound in play.
CISPO = {"loss": "cispo", "clip_eps_low": 0.9, "clip_eps_high": 0.28, "kl_beta": 0.0, "loss_agg": "token-mean"}
# DAPO with its overlong shaping: L_cache = 3 of the batch's L_max = 8.
DAPO_OVERLONG = {**DAPO, "overlong_buffer": 3}


def grpo_cases():
    variants = [
        ("defaults", {}),
        ("scale_rewards_batch", {"scale_rewards": "batch"}),
        ("scale_rewards_none", {"scale_rewards": "none"}),
        ("std_population", {"std": "population"}),
        ("std_sample_explicit", {"std": "sample", "scale_rewards": "group"}),
        ("eps", {"eps": 0.1}),
        ("clip_eps_low", {"clip_eps_low": 0.1}),
        ("clip_eps_high", {"clip_eps_high": 0.28}),
        ("kl_beta_zero", {"kl_beta": 0.0}),
        ("kl_beta", {"kl_beta": 0.1}),
        ("kl_estimator_k1", {"kl_estimator": "k1"}),
        ("kl_estimator_k2", {"kl_estimator": "k2"}),
        ("kl_estimator_k3", {"kl_estimator": "k3", "kl_beta": 0.2}),
        ("kl_in_reward", {"kl_in": "reward"}),
        ("kl_in_reward_k1", {"kl_in": "reward", "kl_estimator": "k1", "kl_beta": 0.1}),
        ("kl_in_reward_k2", {"kl_in": "reward", "kl_estimator": "k2", "kl_beta": 0.1}),
        ("kl_in_loss_explicit", {"kl_in": "loss", "kl_beta": 0.1}),
        ("loss_agg_token_mean", {"loss_agg": "token-mean"}),
        ("loss_agg_seq_mean_token_mean", {"loss_agg": "seq-mean-token-mean", "kl_beta": 0.1}),
        ("loss_agg_seq_mean_token_sum_norm", {"loss_agg": "seq-mean-token-sum-norm"}),
        ("dapo", DAPO),
        ("dr_grpo", DR_GRPO),
        ("importance_ratio_sequence", {"importance_ratio": "sequence"}),
        ("importance_ratio_token_explicit", {"importance_ratio": "token", "kl_beta": 0.1}),
        ("gspo", GSPO),
        ("gspo_token_mean", {**GSPO, "loss_agg": "token-mean"}),
        ("gspo_clip_ratio_c", {**GSPO, "clip_ratio_c": 1.05, "kl_beta": 0.04}),
        ("loss_cispo", {"loss": "cispo"}),
        ("loss_ppo_clip_explicit", {"loss": "ppo-clip", "clip_eps_high": 0.28}),
        ("cispo", CISPO),
        ("cispo_both_bounds", {"loss": "cispo", "clip_eps_low": 0.1, "clip_eps_high": 0.15}),
        ("clip_ratio_c", {"clip_ratio_c": 1.3}),
        ("clip_ratio_c_loose", {"clip_ratio_c": 3.0, "clip_eps_high": 0.28}),
        ("overlong_buffer", {"overlong_buffer": 4}),
        ("overlong_penalty", {"overlong_buffer": 6, "overlong_penalty": 0.5}),
        ("overlong_kl_in_reward", {"overlong_buffer": 3, "kl_in": "reward"}),
        ("dapo_overlong", DAPO_OVERLONG),
        ("entropy_coef", {"entropy_coef": 0.01}),
        ("entropy_coef_token_mean", {"entropy_coef": 0.1, "loss_agg": "token-mean"}),
        ("entropy_coef_cispo", {**CISPO, "entropy_coef": 0.05}),
    ]
    degenerate_configs = [
        ("defaults", {}),
        ("batch_population", {"scale_rewards": "batch", "std": "population"}),
        ("dr_grpo", DR_GRPO),
        ("kl_in_reward", {"kl_in": "reward"}),
        ("gspo", GSPO),
        ("cispo", CISPO),
        ("clip_ratio_c", {"clip_ratio_c": 1.3}),
        ("overlong_entropy", {"overlong_buffer": 4, "entropy_coef": 0.01}),
    ]
    cases = [(name, config, "base") for name, config in variants]
    for batch in ["all_pass", "all_fail", "single", "empty_rows"]:
        cases += [(f"{batch}_{name}", config, batch) for name, config in degenerate_configs]
    # L_max below the longest completions: the penalty's −1 beyond L_max.
    cases += [
        ("overlong_beyond_max", {"overlong_buffer": 2}, "overlong"),
        ("overlong_beyond_max_penalty", {"overlong_buffer": 1, "overlong_penalty": 0.25, "kl_in": "reward"}, "overlong"),
    ]
    return cases


# --- rloo ----------------------------------------------------------------------------------------

RLOO_DEFAULTS = {
    "kl_beta": 0.05,
    "kl_estimator": "k1",
    "clip_eps": 0.2,
    "normalize_advantages": False,
    "loss_agg": "token-mean",
    "overlong_buffer": None,
    "overlong_penalty": None,
    "entropy_coef": 0.0,
}


def rloo(config, batch):
    c = {**RLOO_DEFAULTS, **config}
    lengths = lengths_of(batch)
    groups = groups_of(batch["group_ids"])
    adv_metrics = {"uniform_group_frac": uniform_group_frac(batch["rewards"], groups)}
    penalty, kl_metrics = reward_kl(batch, c["kl_estimator"], c["kl_beta"])
    adv_metrics.update(kl_metrics)
    rewards, overlong_metrics = shape_overlong(list(batch["rewards"]), lengths, c, batch)
    adv_metrics.update(overlong_metrics)
    rewards = [r - p for r, p in zip(rewards, penalty)]
    # Ahmadian et al. 2024 eq. 6 (Kool et al. 2019): the baseline of sample i is the mean reward
    # of the other k − 1 samples; a group of one has none and no advantage.
    advantage = [0.0] * len(rewards)
    for group in groups:
        if len(group) < 2:
            continue
        for i in group:
            others = [rewards[j] for j in group if j != i]
            advantage[i] = rewards[i] - sum(others) / len(others)
    if c["normalize_advantages"]:
        mean, spread = sum(advantage) / len(advantage), std(advantage, "population")
        advantage = [(a - mean) / (spread + 1e-8) for a in advantage]
    advantages = repeat_rows(advantage, lengths)

    logp = tensor(batch["logprobs"]).requires_grad_(True)
    old, ref, adv = tensor(batch["old_logprobs"]), tensor(batch["ref_logprobs"]), tensor(advantages)
    per_token, ratio = clipped_surrogate(logp, old, adv, c["clip_eps"], c["clip_eps"])
    entropy = entropy_estimate(logp, old)
    per_token = per_token - c["entropy_coef"] * entropy
    loss = aggregate(per_token, lengths, c["loss_agg"], batch["scale"])
    metrics = clip_metrics(ratio, advantages, lengths, c["clip_eps"], c["clip_eps"])
    metrics["kl"] = token_mean(kl_tensor(c["kl_estimator"], logp, ref).detach().tolist(), lengths)
    metrics["entropy"] = token_mean(entropy.detach().tolist(), lengths)
    (grad,) = backward(loss, logp)
    return {
        "advantages": advantages,
        "advantage_metrics": adv_metrics,
        "loss": loss.item(),
        "grad_logprobs": grad,
        "loss_metrics": metrics,
    }


def rloo_cases():
    variants = [
        ("defaults", {}),
        ("kl_beta_zero", {"kl_beta": 0.0}),
        ("kl_beta", {"kl_beta": 0.2}),
        ("kl_estimator_k1", {"kl_estimator": "k1", "kl_beta": 0.1}),
        ("kl_estimator_k2", {"kl_estimator": "k2"}),
        ("kl_estimator_k3", {"kl_estimator": "k3"}),
        ("clip_eps", {"clip_eps": 0.1}),
        ("normalize_advantages", {"normalize_advantages": True}),
        ("normalize_advantages_false", {"normalize_advantages": False, "kl_beta": 0.1}),
        ("loss_agg_token_mean", {"loss_agg": "token-mean", "clip_eps": 0.3}),
        ("loss_agg_seq_mean_token_mean", {"loss_agg": "seq-mean-token-mean"}),
        ("loss_agg_seq_mean_token_sum_norm", {"loss_agg": "seq-mean-token-sum-norm"}),
        ("overlong_buffer", {"overlong_buffer": 4}),
        ("overlong_penalty", {"overlong_buffer": 6, "overlong_penalty": 0.5, "normalize_advantages": True}),
        ("entropy_coef", {"entropy_coef": 0.01}),
        ("entropy_coef_seq_mean_token_mean", {"entropy_coef": 0.1, "loss_agg": "seq-mean-token-mean"}),
    ]
    degenerate_configs = [
        ("defaults", {}),
        ("normalize_advantages", {"normalize_advantages": True}),
        ("overlong_entropy", {"overlong_buffer": 4, "entropy_coef": 0.01}),
    ]
    cases = [(name, config, "base") for name, config in variants]
    for batch in ["all_pass", "all_fail", "single", "empty_rows"]:
        cases += [(f"{batch}_{name}", config, batch) for name, config in degenerate_configs]
    cases += [("overlong_beyond_max", {"overlong_buffer": 2}, "overlong")]
    return cases


# --- ppo -----------------------------------------------------------------------------------------

PPO_DEFAULTS = {
    "gamma": 1.0,
    "lam": 0.95,
    "clip_eps": 0.2,
    "vf_clip": 0.2,
    "vf_coef": 0.1,
    "kl_beta": 0.05,
    "kl_estimator": "k1",
    "whiten_advantages": True,
    "clip_ratio_c": None,
    "overlong_buffer": None,
    "overlong_penalty": None,
    "entropy_coef": 0.0,
}


def ppo(config, batch):
    c = {**PPO_DEFAULTS, **config}
    lengths = lengths_of(batch)
    old, ref, values = batch["old_logprobs"], batch["ref_logprobs"], batch["values"]
    _, adv_metrics = reward_kl(batch, c["kl_estimator"], c["kl_beta"])
    scores, overlong_metrics = shape_overlong(list(batch["rewards"]), lengths, c, batch)
    adv_metrics.update(overlong_metrics)
    advantages = [[0.0] * T for _ in lengths]
    returns = [[0.0] * T for _ in lengths]
    for i, n in enumerate(lengths):
        # InstructGPT-style per-token reward: −β·KL on each token, the score on the last one.
        reward = [-c["kl_beta"] * kl_float(c["kl_estimator"], old[i][t], ref[i][t]) for t in range(n)]
        if n:
            reward[n - 1] += scores[i]
        # GAE (Schulman et al. 2016, eq. 16), backwards; the value after the last token is 0.
        gae = 0.0
        for t in reversed(range(n)):
            next_value = values[i][t + 1] if t + 1 < n else 0.0
            delta = reward[t] + c["gamma"] * next_value - values[i][t]
            gae = delta + c["gamma"] * c["lam"] * gae
            advantages[i][t] = gae
            returns[i][t] = gae + values[i][t]
    if c["whiten_advantages"]:
        flat = tokens(advantages, lengths)
        if flat:
            mean, spread = sum(flat) / len(flat), std(flat, "population")
            for i, n in enumerate(lengths):
                for t in range(n):
                    advantages[i][t] = (advantages[i][t] - mean) / (spread + 1e-8)

    logp = tensor(batch["logprobs"]).requires_grad_(True)
    value = tensor(batch["new_values"]).requires_grad_(True)
    old_t, ref_t, adv = tensor(old), tensor(ref), tensor(advantages)
    old_value, target = tensor(values), tensor(returns)
    pg, ratio = policy_loss(logp, old_t, adv, lengths, c, c["clip_eps"], c["clip_eps"])
    entropy = entropy_estimate(logp, old_t)
    clipped_value = torch.clamp(value, old_value - c["vf_clip"], old_value + c["vf_clip"])
    unclipped_sq, clipped_sq = (value - target) ** 2, (clipped_value - target) ** 2
    vf = 0.5 * torch.maximum(unclipped_sq, clipped_sq)
    scale = {**batch["scale"]}
    policy = pg - c["entropy_coef"] * entropy
    loss = aggregate(policy, lengths, "token-mean", scale) + c["vf_coef"] * aggregate(vf, lengths, "token-mean", scale)
    metrics = policy_metrics(ratio, advantages, lengths, c, c["clip_eps"], c["clip_eps"])
    flags = [[1.0 if cl > un else 0.0 for cl, un in zip(crow, urow)] for crow, urow in zip(clipped_sq.tolist(), unclipped_sq.tolist())]
    metrics.update(
        {
            "pg_loss": token_mean(pg.detach().tolist(), lengths),
            "vf_loss": token_mean(vf.detach().tolist(), lengths),
            "value_clip_frac": token_mean(flags, lengths),
            "kl": token_mean(kl_tensor(c["kl_estimator"], logp, ref_t).detach().tolist(), lengths),
            "entropy": token_mean(entropy.detach().tolist(), lengths),
        }
    )
    grad_logp, grad_values = backward(loss, logp, value)
    return {
        "advantages": advantages,
        "returns": returns,
        "advantage_metrics": adv_metrics,
        "loss": loss.item(),
        "grad_logprobs": grad_logp,
        "grad_values": grad_values,
        "loss_metrics": metrics,
    }


def ppo_batches(seed):
    rows = 7
    return {
        "base": make_batch(seed, [1] * rows),
        "all_pass": make_batch(seed + 1, [1] * rows, rewards=[1.0] * rows),
        "all_fail": make_batch(seed + 2, [1] * rows, rewards=[0.0] * rows),
        "single": make_batch(seed + 3, [1]),
        "empty_rows": make_batch(seed + 4, [1] * rows, empty_rows=(1, 5)),
        "overlong": overlong_batch(seed + 5, [1] * rows),
    }


def ppo_cases():
    variants = [
        ("defaults", {}),
        ("gamma", {"gamma": 0.9}),
        ("lam_zero", {"lam": 0.0}),
        ("lam_one", {"lam": 1.0}),
        ("clip_eps", {"clip_eps": 0.1}),
        ("vf_clip", {"vf_clip": 0.05}),
        ("vf_coef", {"vf_coef": 0.5}),
        ("kl_beta_zero", {"kl_beta": 0.0}),
        ("kl_beta", {"kl_beta": 0.2}),
        ("kl_estimator_k1", {"kl_estimator": "k1", "kl_beta": 0.1}),
        ("kl_estimator_k2", {"kl_estimator": "k2"}),
        ("kl_estimator_k3", {"kl_estimator": "k3"}),
        ("whiten_advantages_false", {"whiten_advantages": False}),
        ("whiten_advantages_true", {"whiten_advantages": True, "gamma": 0.95}),
        ("clip_ratio_c", {"clip_ratio_c": 1.3}),
        ("clip_ratio_c_loose", {"clip_ratio_c": 3.0, "clip_eps": 0.1}),
        ("overlong_buffer", {"overlong_buffer": 4}),
        ("overlong_penalty", {"overlong_buffer": 6, "overlong_penalty": 0.5, "whiten_advantages": False}),
        ("entropy_coef", {"entropy_coef": 0.01}),
        ("entropy_coef_dual_clip", {"entropy_coef": 0.1, "clip_ratio_c": 1.3, "kl_beta": 0.0}),
    ]
    degenerate_configs = [
        ("defaults", {}),
        ("whiten_advantages_false", {"whiten_advantages": False}),
        ("dual_overlong_entropy", {"clip_ratio_c": 1.3, "overlong_buffer": 4, "entropy_coef": 0.01}),
    ]
    cases = [(name, config, "base") for name, config in variants]
    for batch in ["all_pass", "all_fail", "single", "empty_rows"]:
        cases += [(f"{batch}_{name}", config, batch) for name, config in degenerate_configs]
    cases += [("overlong_beyond_max", {"overlong_buffer": 2, "whiten_advantages": False}, "overlong")]
    return cases


# --- dpo -----------------------------------------------------------------------------------------

DPO_DEFAULTS = {"beta": 0.1, "label_smoothing": 0.0}


def dpo(config, batch):
    c = {**DPO_DEFAULTS, **config}
    lengths = lengths_of(batch)
    logp = tensor(batch["logprobs"]).requires_grad_(True)
    ref = tensor(batch["ref_logprobs"])
    beta, ls = c["beta"], c["label_smoothing"]
    losses, chosen_rewards, rejected_rewards = [], [], []
    for pair in range(len(lengths) // 2):
        c_row, r_row = 2 * pair, 2 * pair + 1
        # Rafailov et al. 2023 eq. 7: the implicit reward of a completion is β·log π/π_ref.
        chosen = logp[c_row, : lengths[c_row]].sum() - ref[c_row, : lengths[c_row]].sum()
        rejected = logp[r_row, : lengths[r_row]].sum() - ref[r_row, : lengths[r_row]].sum()
        h = chosen - rejected
        # Conservative DPO: the labels are flipped with probability ls.
        losses.append(-(1 - ls) * torch.nn.functional.logsigmoid(beta * h) - ls * torch.nn.functional.logsigmoid(-beta * h))
        chosen_rewards.append(beta * chosen.item())
        rejected_rewards.append(beta * rejected.item())
    loss = sum(losses) / (batch["scale"]["batch_sequences"] / 2)
    n = len(losses)
    metrics = {
        "reward_accuracy": sum(1 for a, b in zip(chosen_rewards, rejected_rewards) if a > b) / n,
        "reward_margin": sum(a - b for a, b in zip(chosen_rewards, rejected_rewards)) / n,
        "chosen_reward": sum(chosen_rewards) / n,
        "rejected_reward": sum(rejected_rewards) / n,
    }
    (grad,) = backward(loss, logp)
    return {"loss": loss.item(), "grad_logprobs": grad, "loss_metrics": metrics}


def dpo_batches(seed):
    return {
        "base": make_batch(seed, [2] * 5),
        "empty_rows": make_batch(seed + 1, [2] * 5, empty_rows=(2, 7)),
        "identical": make_batch(seed + 2, [2] * 5, pairs_identical=True),
        "single": make_batch(seed + 3, [2]),
    }


def dpo_cases():
    variants = [
        ("defaults", {}),
        ("beta", {"beta": 0.5}),
        ("label_smoothing", {"label_smoothing": 0.1}),
        ("label_smoothing_beta", {"label_smoothing": 0.3, "beta": 0.05}),
    ]
    cases = [(name, config, "base") for name, config in variants]
    for batch in ["empty_rows", "identical", "single"]:
        cases += [(f"{batch}_defaults", {}, batch), (f"{batch}_label_smoothing", {"label_smoothing": 0.1}, batch)]
    return cases


# --- sft -----------------------------------------------------------------------------------------


def sft(config, batch):
    agg = config.get("loss_agg", "token-mean")
    lengths = lengths_of(batch)
    logp = tensor(batch["logprobs"]).requires_grad_(True)
    nll = -logp
    loss = aggregate(nll, lengths, agg, batch["scale"])
    metrics = {"nll": token_mean(nll.detach().tolist(), lengths)}
    (grad,) = backward(loss, logp)
    return {"loss": loss.item(), "grad_logprobs": grad, "loss_metrics": metrics}


def sft_batches(seed):
    return {
        "base": make_batch(seed, [1] * 5),
        "empty_rows": make_batch(seed + 1, [1] * 5, empty_rows=(3,)),
        "single": make_batch(seed + 2, [1]),
    }


def sft_cases():
    configs = [("defaults", {}), ("token_mean", {"loss_agg": "token-mean"}), ("seq_mean_token_mean", {"loss_agg": "seq-mean-token-mean"})]
    cases = [(name, config, "base") for name, config in configs]
    for batch in ["empty_rows", "single"]:
        cases += [(f"{batch}_{name}", config, batch) for name, config in configs[::2]]
    return cases


# --- files ---------------------------------------------------------------------------------------

ONLINE_INPUTS = ["rewards", "group_ids", "mask", "old_logprobs", "ref_logprobs", "logprobs", "scale"]
INPUTS = {
    "grpo": ONLINE_INPUTS,
    "rloo": ONLINE_INPUTS,
    "ppo": ONLINE_INPUTS + ["values", "new_values"],
    "dpo": ["mask", "ref_logprobs", "logprobs", "scale"],
    "sft": ["mask", "logprobs", "scale"],
}

PLUGINS = [
    ("grpo", grpo, group_batches(1000), grpo_cases()),
    ("rloo", rloo, group_batches(2000), rloo_cases()),
    ("ppo", ppo, ppo_batches(3000), ppo_cases()),
    ("dpo", dpo, dpo_batches(4000), dpo_cases()),
    ("sft", sft, sft_batches(5000), sft_cases()),
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


def dumps(document):
    """JSON with one line per list of numbers (a matrix row, a reward vector), for reviewable diffs."""
    text = json.dumps(document, indent=1)
    return re.sub(r"\[\s*(-?[0-9][^\[\]{}\"]*?)\s*\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]", text)


def main():
    total = 0
    for plugin, compute, batches, cases in PLUGINS:
        document = {
            "plugin": plugin,
            "crate": f"rlvr-optimizer-{plugin}",
            "generated_by": "tests/conformance/make_goldens.py",
            "torch": torch.__version__,
            "batches": {name: {key: batch[key] for key in INPUTS[plugin]} for name, batch in batches.items()},
            "cases": [],
        }
        names = set()
        for name, config, batch in cases:
            assert name not in names, name
            names.add(name)
            expected = compute(config, batches[batch])
            check_finite(expected, f"{plugin}/{name}")
            document["cases"].append({"name": name, "config": config, "batch": batch, "expected": expected})
        path = HERE / f"{plugin}.json"
        path.write_text(dumps(document) + "\n")
        print(f"{path.relative_to(HERE.parent.parent)}: {len(cases)} cases")
        total += len(cases)
    print(f"{total} cases")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Two-digit arithmetic word problems for the trainer benchmark and the SmolLM2 run.

Writes OUT/train.jsonl and OUT/heldout.jsonl in the job data format (design.md §1), and with
--sft N also OUT/sft.jsonl, N worked demonstrations for a cold start:

    {"id": "train-00000", "prompt": "Tom has 23 apples and buys 45 more. How many apples does he
     have now? Put the final answer in \\boxed{}.", "reference": {"answer": "68"}}
    {"id": "sft-0000", "prompt": "...", "completion": "23 + 45 = 68. The answer is \\boxed{68}."}

Deterministic for a given --seed (stdlib `random.Random`, no hash seeding). Addition and
subtraction of two-digit numbers (10..99; subtraction keeps a > b, so answers are positive),
each rendered through one of several templates with a random name and object. The held-out set
is disjoint from train and sft on the arithmetic itself: an (operation, a, b) triple is in one set
or another, never two, so held-out accuracy is not a memorised sum in a new sentence. With --ops -
(or +) the training and held-out prompts are of that operation alone while the demonstrations are
the same as without it, of both operations (scripts/bench/smollm2-arith.sh trains GRPO on the
operation its cold start left near the frontier).

The prompt is plain text (one user message); the trainer and TRL both wrap it in the model's
chat template. Its last sentence asks for the answer in the form the `math` verifier reads.

Usage: arith_words.py --out DIR [--train N] [--heldout N] [--sft N] [--seed S] [--ops +-|+|-]
Stdlib only.
"""

import argparse
import json
import os
import random
import sys

INSTRUCTION = "Put the final answer in \\boxed{}."

NAMES = ["Tom", "Sara", "Ali", "Mia", "Lena", "Omar", "Kenji", "Ada", "Luis", "Nora", "Ravi", "Zoe"]
# (plural noun, verb for gaining, verb for losing)
THINGS = [
    ("apples", "buys", "eats"),
    ("marbles", "finds", "loses"),
    ("stickers", "gets", "gives away"),
    ("coins", "earns", "spends"),
    ("books", "buys", "sells"),
    ("pencils", "gets", "lends out"),
    ("stamps", "buys", "trades away"),
    ("cards", "wins", "loses"),
]

# Each template: (operation, text). Placeholders: {name} {a} {b} {things} {gain} {lose}.
TEMPLATES = [
    ("+", "{name} has {a} {things} and {gain} {b} more. How many {things} does {name} have now?"),
    ("+", "A box holds {a} {things}. {name} puts {b} more {things} into it. How many {things} are in the box now?"),
    (
        "+",
        "{name} collected {a} {things} on Monday and {b} {things} on Tuesday. "
        "How many {things} did {name} collect in total?",
    ),
    ("+", "There are {a} {things} on one shelf and {b} {things} on another. How many {things} are there altogether?"),
    ("-", "{name} has {a} {things} and {lose} {b} of them. How many {things} does {name} have left?"),
    ("-", "A box holds {a} {things}. {name} takes {b} {things} out of it. How many {things} are still in the box?"),
    ("-", "{name} needs {a} {things} and already has {b}. How many more {things} does {name} need?"),
    ("-", "There were {a} {things} on a table. {name} took {b} of them away. How many {things} remain on the table?"),
]


def answer(op, a, b):
    return a + b if op == "+" else a - b


def problems(seed):
    """Every (op, a, b) with two-digit a and b (a > b for subtraction), in a seeded order."""
    triples = [("+", a, b) for a in range(10, 100) for b in range(10, 100)]
    triples += [("-", a, b) for a in range(11, 100) for b in range(10, a)]
    random.Random(seed).shuffle(triples)
    return triples


def render(rng, op, a, b):
    text = rng.choice([t for o, t in TEMPLATES if o == op])
    things, gain, lose = rng.choice(THINGS)
    question = text.format(name=rng.choice(NAMES), a=a, b=b, things=things, gain=gain, lose=lose)
    return f"{question} {INSTRUCTION}"


def demonstration(op, a, b):
    """The worked answer an SFT cold start teaches: the sum, then the answer as the prompt asks."""
    result = answer(op, a, b)
    return f"{a} {op} {b} = {result}. The answer is \\boxed{{{result}}}."


def write(path, prefix, rows, seed):
    rng = random.Random(f"{seed}:{prefix}")
    width = len(str(max(len(rows) - 1, 0)))
    with open(path, "w", encoding="utf-8") as f:
        for i, (op, a, b) in enumerate(rows):
            record = {"id": f"{prefix}-{i:0{max(width, 4)}d}", "prompt": render(rng, op, a, b)}
            if prefix == "sft":
                record["completion"] = demonstration(op, a, b)
            else:
                record["reference"] = {"answer": str(answer(op, a, b))}
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for train.jsonl and heldout.jsonl")
    parser.add_argument("--train", type=int, default=2000, help="training problems (default 2000)")
    parser.add_argument("--heldout", type=int, default=200, help="held-out problems (default 200)")
    parser.add_argument("--sft", type=int, default=0, help="demonstrations in sft.jsonl (default 0: no file)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--ops",
        choices=["+-", "+", "-"],
        default="+-",
        help="the operations of train and held-out prompts: both (default), + or - alone; demonstrations mix both",
    )
    args = parser.parse_args()

    triples = problems(args.seed)
    counts = (args.train, args.heldout, args.sft)
    if min(counts) < 0 or sum(counts) > len(triples):
        sys.exit(f"--train + --heldout + --sft must be between 0 and {len(triples)}, got {' + '.join(map(str, counts))}")
    # The seeded order's slices: held-out, then train, then the demonstrations. The demonstrations
    # are that slice whatever --ops says, so a cold start is the same with or without it; the
    # prompts are the problems of the operations asked for among all the others, in order.
    prompts_end = args.heldout + args.train
    sft = triples[prompts_end : prompts_end + args.sft]
    asked = [t for t in triples[:prompts_end] + triples[prompts_end + args.sft :] if t[0] in args.ops]
    if prompts_end > len(asked):
        sys.exit(f"--train + --heldout must be at most {len(asked)} with --ops {args.ops} and --sft {args.sft}, got {prompts_end}")
    heldout = asked[: args.heldout]
    train = asked[args.heldout : prompts_end]
    assert not set(heldout) & (set(train) | set(sft)) and not set(train) & set(sft)

    os.makedirs(args.out, exist_ok=True)
    write(os.path.join(args.out, "train.jsonl"), "train", train, args.seed)
    write(os.path.join(args.out, "heldout.jsonl"), "heldout", heldout, args.seed)
    if sft:
        write(os.path.join(args.out, "sft.jsonl"), "sft", sft, args.seed)
    print(
        f"{len(train)} train, {len(heldout)} held-out and {len(sft)} demonstration problems in {args.out}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()

"""The reference implementations the text-similarity grader must agree with.

Reads a JSON list of [input, reference] pairs on stdin; writes one JSON list with, per pair,
rapidfuzz's fuzz.ratio / 100, sacrebleu's sentence BLEU (score / 100, precisions / 100, brevity
penalty, lengths) and rouge-score's ROUGE-L and ROUGE-1 to ROUGE-5 (precision, recall, fmeasure). Run by tests/parity.rs
with the python of scripts/text-metrics-venv.sh.
"""

import json
import sys

from rapidfuzz import fuzz
from rouge_score import rouge_scorer
from sacrebleu import sentence_bleu

ROUGE_N = ["rouge1", "rouge2", "rouge3", "rouge4", "rouge5"]
scorer = rouge_scorer.RougeScorer(["rougeL"] + ROUGE_N)  # use_stemmer=False: rouge-score's default
out = []
for hypothesis, reference in json.load(sys.stdin):
    bleu = sentence_bleu(hypothesis, [reference])
    rouges = scorer.score(reference, hypothesis)
    rouge = rouges["rougeL"]
    out.append(
        {
            "fuzzy_match": fuzz.ratio(hypothesis, reference) / 100,
            "bleu": bleu.score / 100,
            "precisions": [p / 100 for p in bleu.precisions],
            "brevity_penalty": bleu.bp,
            "input_tokens": bleu.sys_len,
            "reference_tokens": bleu.ref_len,
            "rouge_l": [rouge.precision, rouge.recall, rouge.fmeasure],
            "rouge_n": [[rouges[t].precision, rouges[t].recall, rouges[t].fmeasure] for t in ROUGE_N],
        }
    )
json.dump(out, sys.stdout)

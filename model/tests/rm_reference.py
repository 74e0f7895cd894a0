"""Reference scores from Hugging Face transformers' AutoModelForSequenceClassification, for the
reward-model parity tests.

Run with the project venv's python (transformers as pinned by scripts/fetch-smollm2.sh):
  rm_reference.py make NUM_LABELS TOKENIZER_DIR OUT_DIR ITEMS_JSON
        writes a tiny random LlamaForSequenceClassification (seeded; vocabulary and special
        tokens those of TOKENIZER_DIR's tokenizer.json + tokenizer_config.json, copied into
        OUT_DIR with chat_template.jinja when there is one) with save_pretrained, then answers as
        `score` does for it
  rm_reference.py score DIR ITEMS_JSON
        scores each item, all in one batch padded on the right and again padded on the left
  rm_reference.py each COMMANDS_JSON
        a list of answers, one per command (each a list of the arguments above)
Items are texts (tokenized as `tokenizer(text)`) or [prompt, completion] pairs (the chat
template's user and assistant messages when the tokenizer has one, else prompt + completion).
Prints one JSON object on stdout: {"ids": [[...]], "right": [[logits]], "left": [[logits]]}.
Offline: nothing is fetched.
"""
import json
import os
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from transformers import AutoModelForSequenceClassification, AutoTokenizer  # noqa: E402

torch.set_num_threads(int(os.environ.get("RLVR_TORCH_THREADS", "2")))


def encode(tok, item):
    if isinstance(item, str):
        return tok(item)["input_ids"]
    prompt, completion = item
    if tok.chat_template:
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
        text = tok.apply_chat_template(messages, tokenize=False)
        return tok(text, add_special_tokens=False)["input_ids"]
    return tok(prompt + completion)["input_ids"]


def score(model_dir, items):
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = [encode(tok, item) for item in items]
    out = {"ids": ids}
    for side in ("right", "left"):
        tok.padding_side = side
        batch = tok.pad({"input_ids": ids}, padding=True, return_tensors="pt")
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        out[side] = logits.float().tolist()
    return out


def make(num_labels, tokenizer_dir, out_dir, items):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rms_norm_eps=1e-6, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, num_labels=num_labels, tie_word_embeddings=False)
    torch.manual_seed(1234 + num_labels)
    model = LlamaForSequenceClassification(config)
    # Larger weights than the default 0.02 init, so attention patterns, RoPE and the position
    # scored matter in the scores.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.5 if "embed" in name or "score" in name else 0.15)
    model.save_pretrained(out_dir, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if os.path.exists(os.path.join(tokenizer_dir, f)):
            shutil.copy(os.path.join(tokenizer_dir, f), os.path.join(out_dir, f))
    # Scores of the model as loaded back from the directory, as a user of the files would.
    return score(out_dir, items)


def answer(args):
    cmd = args[0]
    if cmd == "make":
        return make(int(args[1]), args[2], args[3], json.loads(args[4]))
    if cmd == "score":
        return score(args[1], json.loads(args[2]))
    if cmd == "each":
        # One python (and one import of transformers, seconds of it) for many answers.
        return [answer(each) for each in json.loads(args[1])]
    sys.exit(f"unknown command {cmd}")


def main():
    json.dump(answer(sys.argv[1:]), sys.stdout)


if __name__ == "__main__":
    main()

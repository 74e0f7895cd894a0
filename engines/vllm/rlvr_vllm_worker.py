"""rlvr's vLLM worker extension: load a new policy checkpoint into a running server, verifiably.

Loaded by the server with `--worker-extension-cls rlvr_vllm_worker.RlvrWorkerExtension` (this file
on PYTHONPATH); vLLM mixes the class into each worker, so its methods run in the worker processes
and are called through the dev-mode endpoint (VLLM_SERVER_DEV_MODE=1):

    POST /collective_rpc {"method": "rlvr_load_weights", "args": ["/abs/dir"]}
      -> {"results": [{"weights_path": ..., "seconds": ..., ...}]}  (one per worker)
    POST /reset_prefix_cache                                  (always, right after: see below)
    POST /collective_rpc {"method": "rlvr_weights_info"}      (the same report, nothing loaded)
    POST /collective_rpc {"method": "rlvr_load_weights_untied", "args": ["/abs/dir"]}
      (tests only: vLLM's own reload_weights, the stale output layer left as it is)

(The endpoint passes `args` and `kwargs` through as JSON strings; `{"kwargs": {"weights_path":
"/abs/dir"}}` works too.)

Why not vLLM's own `reload_weights` (written for vLLM 0.26.0, checked on the CPU build):
- On a model with tied embeddings (SmolLM2: `tie_word_embeddings`, no lm_head.weight in the
  checkpoint) `reload_weights` loads every layer and embed_tokens but leaves the output layer
  computing with the OLD weights: the layerwise reload only re-processes layers whose weights the
  checkpoint names, and on CPU the lm_head's matmul runs on a oneDNN handle packed from the weight
  at start-up (`layer.cpu_linear`), which nothing rebuilds. Log-probs then silently match "new
  layers, old lm_head" (max |diff| 3e-5 against that, 2.7 against the real new model).
  `rlvr_load_weights` re-ties lm_head.weight to embed_tokens.weight and re-runs the lm_head's
  `process_weights_after_loading`, which rebuilds the packed handle (a no-op on CUDA).
- Nothing in the reply of `reload_weights` says which weights are live. This method reports the
  directory it loaded and probes the live output layer against the live embedding. (It does not
  hash the weights: 0.3 s a sync for 0.5 GB, and the worker's check is the log-probability gap of
  what the server samples, which sees every way a sync can fail.)

Not done here, and required of the caller: `POST /reset_prefix_cache` after every reload. The
prefix cache keys KV blocks by token ids only; without a reset, prompts seen before the reload reuse
KV computed with the old weights, and their log-probs are silently stale.
"""

import os
import time

import torch


def _unwrap(module):
    """The layer under a LoRA wrapper (--enable-lora wraps lm_head and the linears)."""
    while hasattr(module, "base_layer"):
        module = module.base_layer
    return module


class RlvrWorkerExtension:
    """Methods mixed into vLLM's worker (`self` is the worker: self.model_runner, self.rank)."""

    def rlvr_load_weights(self, weights_path: str) -> dict:
        """Loads every weight from the HF directory `weights_path` (absolute; its config must be the
        served model's), re-ties and rebuilds the output layer, and returns rlvr_weights_info()
        plus the load's seconds. Serves no request meanwhile: the engine runs collective_rpc
        between steps. The caller resets the prefix cache afterwards."""
        if not os.path.isabs(weights_path) or not os.path.isdir(weights_path):
            raise ValueError(f"weights_path must be an existing absolute directory: {weights_path}")
        return self._rlvr_load(weights_path, retie=True)

    def rlvr_load_weights_untied(self, weights_path: str) -> dict:
        """vLLM's own reload_weights alone, reported the same way: the output layer of a tied model
        stays stale (for the test that shows the caller's log-prob check catches it)."""
        return self._rlvr_load(weights_path, retie=False)

    def _rlvr_load(self, weights_path: str, retie: bool) -> dict:
        if not os.path.isabs(weights_path) or not os.path.isdir(weights_path):
            raise ValueError(f"weights_path must be an existing absolute directory: {weights_path}")
        start = time.perf_counter()
        self.model_runner.reload_weights(weights_path=weights_path)
        retied = self._rlvr_retie_lm_head() if retie else False
        seconds = time.perf_counter() - start
        self._rlvr_loaded = {"weights_path": weights_path}
        info = self.rlvr_weights_info()
        info.update(seconds=round(seconds, 3), lm_head_retied=retied)
        return info

    def rlvr_weights_info(self) -> dict:
        """What is live: the directory of the last rlvr_load_weights (null before the
        first: the weights the server started with), and a probe of the output layer. The probe
        runs the live lm_head matmul on a fixed vector x and compares it with x @ embed_tokens.T
        (tied models) — `lm_head_max_abs_err` is ~1e-5 when they agree and large when the output
        layer is stale — and `lm_head_probe_sum` (sum of the live logits of x, float64) changes
        with any change of the output layer's weights. `embed_tokens_sum` is the float64 sum of the
        live embedding (the checkpoint's `model.embed_tokens.weight` summed the same way agrees to
        about 1e-9 relative)."""
        model = self.model_runner.get_model()
        loaded = getattr(self, "_rlvr_loaded", {"weights_path": None})
        info = {"rank": int(getattr(self, "rank", 0)), **loaded}
        embed, lm_head = self._rlvr_embed_and_lm_head(model)
        if embed is None or lm_head is None:
            return info
        with torch.no_grad():
            weight = embed.weight
            hidden = weight.shape[1]
            g = torch.Generator(device="cpu").manual_seed(0)
            x = torch.randn(1, hidden, generator=g, dtype=torch.float32).to(weight.device, weight.dtype)
            live = lm_head.quant_method.apply(lm_head, x).double()
            vocab = min(live.shape[-1], weight.shape[0])
            info["embed_tokens_sum"] = weight.double().sum().item()
            info["lm_head_probe_sum"] = live[..., :vocab].sum().item()
            if self._rlvr_tied(model):
                expected = (x.double() @ weight.double().T)[..., :vocab]
                info["lm_head_max_abs_err"] = (live[..., :vocab] - expected).abs().max().item()
        return info

    def _rlvr_tied(self, model) -> bool:
        config = self.model_runner.model_config.hf_config
        text = getattr(config, "get_text_config", lambda: config)()
        return bool(getattr(text, "tie_word_embeddings", False))

    @staticmethod
    def _rlvr_embed_and_lm_head(model):
        inner = getattr(model, "model", None)
        embed = getattr(inner, "embed_tokens", None) if inner is not None else None
        lm_head = getattr(model, "lm_head", None)
        return (_unwrap(embed) if embed is not None else None,
                _unwrap(lm_head) if lm_head is not None else None)

    def _rlvr_retie_lm_head(self) -> bool:
        """Points a tied model's lm_head at the live embed_tokens weight again and re-runs its
        post-load processing (on CPU: a new oneDNN handle for the matmul). False when the model
        is not tied (its lm_head.weight is in the checkpoint and reloads like any other layer)."""
        model = self.model_runner.get_model()
        embed, lm_head = self._rlvr_embed_and_lm_head(model)
        if embed is None or lm_head is None or not self._rlvr_tied(model):
            return False
        lm_head.weight = embed.weight
        process = getattr(lm_head.quant_method, "process_weights_after_loading", None)
        if process is not None:
            process(lm_head)
        return True

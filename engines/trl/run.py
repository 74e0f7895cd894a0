#!/usr/bin/env python3
"""rlvr's entry script for the trl engine: one rank of a job on a TRL trainer.

A GRPO job (GRPOTrainer), an SFT job (SFTTrainer on prompt-completion pairs) or a DPO job
(DPOTrainer on preference pairs). Started once per rank by torchrun (the worker's local launcher, or a Ray job's entrypoint) as

    python -m torch.distributed.run --nproc-per-node N engines/trl/run.py CONTRACT

CONTRACT is the job's `<run>/engine/contract.json` (`rlvr_protocol::engine::EngineContract`):
the starting model (a Hugging Face directory), the training data, the trainer and its keys as
the worker mapped them from the spec, the output directory and the metrics file, and the
daemon's POST /v1/verify with the job's graders, and the file holding the job-scoped token
(`verify.token_file`, mode 0600: never in the environment or the cluster's job record).

What it does: trains with the contract's keys; a GRPO job's rewards come from the daemon (the
job's own graders and formula, so the reward is the one a native job trains on); rank 0 appends one
metrics line per step (the fields of the native worker's `MetricsLine` TRL has, and the largest
rank's memory); checkpoints are TRL's `checkpoint-N/` in the output directory, and a start with
one there resumes from the newest; the trained model is written to `OUTPUT/final/model/`, then
`OUTPUT/final/FINISHED` (the step count) once it is whole.

With `heldout` in the contract (`engine.heldout = "engine"`) the ranks also complete the
held-out prompts (and canaries) greedily for the worker to score (`HeldoutScorer`): the starting
weights and the gates' published baseline before the first step, the held-out set every
`every_steps`, the final model after it.

With `fsdp` in the trainer's keys (`engine.strategy = "fsdp2"`) the ranks shard the model with
FSDP2 through accelerate, on CPU slots too (`allow_fsdp_on_cpu`); each rank writes its shard of a
checkpoint (torch.distributed.checkpoint), and the final model is gathered once.

A SIGTERM (the worker's stop, torchrun's forwarding of its own, Ray's stop) is honoured at the
next step end: every rank agrees on the step (an all-reduce), the trainer checkpoints there and
the process exits 75, which the worker reports as interrupted.

Exit statuses are the worker protocol's: 0 finished, 2 the job's fault (a contract or a reward
the daemon refuses), 70 transient (the daemon unreachable), 75 interrupted.
"""

import importlib.util
import json
import os
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.request

EXIT_JOB_ERROR = 2
EXIT_TRANSIENT = 70
EXIT_INTERRUPTED = 75
# In OUTPUT/final/, written after the model: the engine finished (`EngineDir::finished` in the worker).
FINISHED = "FINISHED"

# Held-out prompts a rank generates at once (rlvr_protocol::memory::EVAL_BATCH, the native
# evaluation's batch).
EVAL_BATCH = 16
# The daemon grades at most this many items a request (VerifyRequest::MAX_ITEMS).
VERIFY_BATCH = 256
# 429/503 and refused connections are retried this long before the run gives up as transient.
VERIFY_PATIENCE_S = 120.0

for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TRANSFORMERS_VERBOSITY": "error",
    "TQDM_DISABLE": "1",
    "WANDB_DISABLED": "true",
}.items():
    os.environ.setdefault(_key, _value)


class JobError(Exception):
    """The job's fault: exits 2 with the message."""


class Transient(Exception):
    """Not the job's fault (the daemon could not be reached): exits 70."""


class Interrupted(Exception):
    """Stopped before the step could end (the daemon stopped answering): exits 75 without a new
    checkpoint."""


def log(message):
    rank = os.environ.get("RANK", "0")
    print(f"trl engine rank {rank}: {message}", file=sys.stderr, flush=True)


class Verifier:
    """The job's reward, from the daemon's POST /v1/verify, a batch at a time."""

    def __init__(self, url, reward, token, stop):
        self.url = url
        self.stop = stop
        self.reward = reward
        self.token = token
        # The last batch's verdicts, for the `passed` pseudo-reward TRL logs (gathered).
        self.passed = []
        self.errors = 0
        self.timeouts = 0
        # Answers 429 or 503 (the job's grading lane full, the daemon busy), each waited out.
        self.busy = 0

    def post(self, items):
        body = json.dumps({"reward": self.reward, "items": items}).encode()
        deadline = time.monotonic() + VERIFY_PATIENCE_S
        delay = 0.5
        while True:
            request = urllib.request.Request(
                self.url,
                data=body,
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"},
            )
            try:
                with urllib.request.urlopen(request, timeout=60) as answer:
                    return json.load(answer)["results"]
            except urllib.error.HTTPError as error:
                text = error.read().decode(errors="replace")[:500]
                if error.code not in (429, 502, 503, 504):
                    raise JobError(f"POST {self.url}: {error.code}: {text}") from error
                why = f"{error.code}: {text}"
                if error.code in (429, 503):
                    self.busy += 1
                    log(f"POST {self.url}: {why}; waiting {delay:.1f} s")
            except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
                why = str(error)
            if self.stop["asked"]:
                # Stopping, and the daemon going away: leave without this step; the resume
                # starts from the last checkpoint.
                raise Interrupted(f"POST {self.url}: {why}")
            if time.monotonic() > deadline:
                raise Transient(f"POST {self.url}: gave up after {VERIFY_PATIENCE_S:.0f} s: {why}")
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def __call__(self, prompts, completions, id, reference, **_):  # noqa: A002 (TRL's column name)
        items = []
        for prompt, completion, prompt_id, ref in zip(prompts, completions, id, reference, strict=True):
            items.append(
                {
                    "id": prompt_id,
                    "prompt": text_of(prompt),
                    "completion": text_of(completion),
                    "reference": json.loads(ref),
                }
            )
        results = []
        for start in range(0, len(items), VERIFY_BATCH):
            results.extend(self.post(items[start : start + VERIFY_BATCH]))
        self.passed = [1.0 if line["passed"] else 0.0 for line in results]
        self.errors += sum(1 for line in results if line.get("error") and not line.get("timed_out"))
        self.timeouts += sum(1 for line in results if line.get("timed_out"))
        return [float(line["score"]) for line in results]


class Timer:
    """Seconds spent in wrapped calls since the last `take`, by kind."""

    def __init__(self):
        self.spent = {"rollout": 0.0, "verify": 0.0}

    def timed(self, kind, call):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.spent[kind] += time.perf_counter() - start

        return wrapper

    def take(self):
        rollout, verify = self.spent["rollout"], self.spent["verify"]
        self.spent = {"rollout": 0.0, "verify": 0.0}
        return rollout, verify


def text_of(message):
    """A prompt or completion's text: a string, or the last message of a conversation."""
    if isinstance(message, list):
        return message[-1]["content"]
    return message


def read_records(path, what, row_of):
    """`row_of(record, number)` for each JSONL record of `path`; a record it cannot read (a
    missing key, not JSON) or an empty file is the job's fault, named by file and line."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(row_of(json.loads(line), number))
            except (ValueError, KeyError) as error:
                raise JobError(f"{path}:{number}: not {what}: {error}") from error
    if not rows:
        raise JobError(f"{path}: no {what}s")
    return rows


def load_prompts(path, conversational):
    def row_of(record, number):
        prompt = record["prompt"]
        return {
            "prompt": [{"role": "user", "content": prompt}] if conversational else prompt,
            "id": str(record.get("id", number)),
            # A JSON string: the references' shapes differ, which Arrow's columns cannot.
            "reference": json.dumps(record.get("reference", {})),
        }

    return read_records(path, "a prompt record", row_of)


def watch_parent():
    """Ends this rank when its launcher is gone (killed with SIGKILL, which it cannot forward):
    an orphaned rank would hold its device for nothing."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        log("the launcher is gone: exiting")
        os._exit(EXIT_TRANSIENT)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def main():
    if len(sys.argv) != 2:
        raise JobError("usage: run.py CONTRACT")
    with open(sys.argv[1], encoding="utf-8") as f:
        contract = json.load(f)
    name, keys = contract["trainer"]["name"], dict(contract["trainer"]["keys"])
    if name not in BUILDERS:
        raise JobError(f"trainer {name!r}: this script runs {', '.join(BUILDERS)}")

    stop = {"asked": False}

    def on_sigterm(_signum, _frame):
        stop["asked"] = True
        log("SIGTERM: checkpointing at the next step end")

    signal.signal(signal.SIGTERM, on_sigterm)
    watch_parent()

    import torch
    import torch.distributed as dist
    from transformers import AutoTokenizer, TrainerCallback

    tokenizer = AutoTokenizer.from_pretrained(contract["model"])
    cuda = torch.cuda.is_available()
    output_dir = contract["output_dir"]
    # What every trainer is given besides its keys: no hub, no trackers, a checkpoint every
    # save_steps with the optimizer and RNG states (what a resume needs), one log line a step.
    common = {
        "output_dir": output_dir,
        "use_cpu": not cuda,
        "fp16": False,
        "gradient_checkpointing": False,
        "data_seed": keys["seed"],
        "report_to": "none",
        "logging_steps": 1,
        "save_strategy": "steps",
        "save_only_model": False,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "model_init_kwargs": {"dtype": torch.bfloat16 if keys["bf16"] else torch.float32},
        "ddp_backend": "nccl" if cuda else "gloo",
    }
    if keys.get("fsdp") and not cuda:
        allow_fsdp_on_cpu()
    job = BUILDERS[name](contract, keys, tokenizer, common, stop, cuda)
    metrics_path = contract["metrics"]
    # The largest rank's figures at the last step's end (below): what its line reports.
    largest = {}
    # A GRPO job's: its busy answers go into the same reduction.
    verifier = getattr(job, "verifier", None)
    scorer = HeldoutScorer(contract["heldout"], tokenizer) if contract.get("heldout") else None
    trainer = None

    class Rlvr(TrainerCallback):
        """The metrics lines (rank 0) and the agreed stop."""

        def on_train_begin(self, args, state, control, **kwargs):
            if scorer is not None:
                # The model is on the ranks' devices (sharded under FSDP2) by now.
                scorer.complete("start", scorer.every_set, trainer.model, trainer.is_fsdp_enabled)
                scorer.complete_baseline(args.device, trainer.model.dtype)
            reset_peak(cuda)

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step >= args.max_steps > 0:
                # Resumed from a checkpoint that holds every step (a kill between it and the
                # final model): its weights, loaded by now, are the final model. TRL would train
                # a step more than max_steps.
                raise AllStepsTrained()
            job.step_started = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or not logs or "loss" not in logs:
                return
            line = {"step": state.global_step}
            line.update(job.figures(logs))
            line.update(largest)
            with open(metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")

        def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
            # One collective a step, on the ranks' device (NCCL reduces CUDA tensors only): the
            # stop, and the most any rank holds.
            step = state.global_step
            if scorer is not None and scorer.every_steps and step % scorer.every_steps == 0 and step < args.max_steps:
                # Before the step's line (on_log follows), which the worker scores it into.
                scorer.complete(f"step-{step}", ["heldout"], trainer.model, trainer.is_fsdp_enabled)
            busy = verifier.busy if verifier is not None else 0
            figures = torch.tensor(
                [1 if stop["asked"] else 0, state_bytes(model, optimizer), peak_bytes(cuda), busy],
                dtype=torch.int64,
                device=args.device,
            )
            if dist.is_available() and dist.is_initialized():
                dist.all_reduce(figures, op=dist.ReduceOp.MAX)
            asked, largest["rank_state_bytes"], largest["peak_memory_bytes"], busy = figures.tolist()
            if verifier is not None:
                largest["verifier_busy"] = busy
                verifier.busy = 0
            if asked:
                stop["agreed"] = True
                control.should_save = True
                control.should_training_stop = True

    trainer = job.build([Rlvr()])
    checkpoints = sorted(name for name in os.listdir(output_dir) if re.fullmatch(r"checkpoint-\d+", name))
    if checkpoints:
        log(f"resuming from the newest of {checkpoints}")
    try:
        trainer.train(resume_from_checkpoint=True if checkpoints else None)
    except AllStepsTrained:
        log(f"the newest checkpoint holds all {trainer.args.max_steps} steps; writing it as the final model")
    if stop.get("agreed") and trainer.state.global_step < trainer.args.max_steps:
        log(f"stopped at step {trainer.state.global_step}, checkpointed")
        return EXIT_INTERRUPTED
    final = os.path.join(output_dir, "final", "model")
    if trainer.is_fsdp_enabled:
        save_gathered(trainer, final)
    else:
        trainer.save_model(final)
    if scorer is not None:
        scorer.complete("final", scorer.every_set, trainer.model, trainer.is_fsdp_enabled)
    if trainer.accelerator.is_main_process:
        tokenizer.save_pretrained(final)
        # Written last: a final model without it was cut short. The worker does not start a
        # finished engine again (resumed from its last checkpoint, TRL would train a step more).
        with open(os.path.join(output_dir, "final", FINISHED), "w", encoding="utf-8") as f:
            f.write(f"{trainer.state.global_step}\n")
            f.flush()
            os.fsync(f.fileno())
        log(f"trained {trainer.state.global_step} steps; the model is in {final}")
    return 0


def save_gathered(trainer, final):
    """An FSDP2 model's shards gathered once into rank 0's memory (every rank takes part) and
    written there as a Hugging Face directory; the sharded checkpoints stay as they are.

    torch's own gather, not accelerate's `get_state_dict` (with FSDP turned on over gloo it hands
    back the DTensor shards, and `save_pretrained` then waits on a collective only rank 0 joins:
    seen, a hang). Gathered, a tied output embedding is a copy of the input one, which
    `save_pretrained` no longer sees as tied: it is left out, as for an unsharded model."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    model = trainer.model
    state_dict = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not trainer.accelerator.is_main_process:
        return
    if getattr(model.config, "tie_word_embeddings", False):
        state_dict.pop("lm_head.weight", None)
    model.save_pretrained(final, state_dict=state_dict, is_main_process=True)


class HeldoutScorer:
    """Greedy completions of the contract's held-out prompts (and canaries), which the worker
    tokenized: each rank completes every WORLD_SIZE-th prompt, rank 0 gathers them and writes
    each set in its order, then DONE (`HeldoutContract` in rlvr_protocol::engine). The worker
    cuts and decodes them by its own sampler's rules and scores them with the job's graders.

    Sharded ranks (FSDP2) gather each layer's weights as they go: every rank runs the same
    number of batches and `generate(synced_gpus=True)` keeps them in step until the longest
    completion ends, so no rank waits in a collective the others never reach."""

    def __init__(self, spec, tokenizer):
        self.dir = spec["dir"]
        self.every_steps = spec["every_steps"]
        self.max_new_tokens = spec["max_new_tokens"]
        self.baseline_model = spec.get("baseline_model")
        self.sets = {"heldout": read_token_lines(spec["heldout"])}
        if spec.get("canaries"):
            self.sets["canaries"] = read_token_lines(spec["canaries"])
        self.every_set = list(self.sets)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos = tokenizer.eos_token_id

    def done(self, at):
        return os.path.isfile(os.path.join(self.dir, at, "DONE"))

    def complete(self, at, names, model, synced):
        """Every set of `names` completed by `model` at `at`, unless a run before this one did."""
        if self.done(at):
            return
        import torch.distributed as dist

        distributed = dist.is_available() and dist.is_initialized()
        rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
        started = time.perf_counter()
        was_training = model.training
        model.eval()
        written = {}
        for name in names:
            prompts = self.sets[name]
            mine = list(range(rank, len(prompts), world))
            # The same number of batches on every rank: a sharded rank's forward is a collective.
            per_rank = -(-len(prompts) // world)
            batches = -(-per_rank // EVAL_BATCH)
            done = {}
            for b in range(batches):
                indices = mine[b * EVAL_BATCH : (b + 1) * EVAL_BATCH]
                # A rank with no prompts left generates a stand-in row and drops it.
                rows = [prompts[i] for i in indices] or [prompts[0]]
                for index, tokens in zip(indices, self.generate(model, rows, synced and world > 1)):
                    done[index] = tokens
            if distributed:
                gathered = [None] * world
                dist.all_gather_object(gathered, done)
            else:
                gathered = [done]
            written[name] = {index: tokens for part in gathered for index, tokens in part.items()}
        model.train(was_training)
        if rank == 0:
            at_dir = os.path.join(self.dir, at)
            os.makedirs(at_dir, exist_ok=True)
            for name, completions in written.items():
                with open(os.path.join(at_dir, f"{name}.jsonl"), "w", encoding="utf-8") as f:
                    for index in range(len(self.sets[name])):
                        f.write(json.dumps({"tokens": completions[index]}) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
            # Last: the sets above are whole.
            with open(os.path.join(at_dir, "DONE"), "w", encoding="utf-8") as f:
                f.flush()
                os.fsync(f.fileno())
            counts = ", ".join(f"{len(c)} {name}" for name, c in written.items())
            log(f"held-out completions at {at}: {counts} in {time.perf_counter() - started:.1f} s")
        if distributed:
            dist.barrier()

    def generate(self, model, rows, synced):
        """Greedy ids after each prompt of `rows` (left-padded into one batch)."""
        import torch

        device = next(model.parameters()).device
        width = max(len(row) for row in rows)
        ids = torch.tensor([[self.pad] * (width - len(row)) + row for row in rows], device=device)
        mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows], device=device)
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=self.max_new_tokens,
                pad_token_id=self.pad,
                eos_token_id=self.eos,
                synced_gpus=synced,
            )
        return [sequence[width:].tolist() for sequence in out]

    def complete_baseline(self, device, dtype):
        """The gates' published baseline, loaded whole on each rank, completed, and freed."""
        if not self.baseline_model or self.done("baseline"):
            return
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(self.baseline_model, dtype=dtype).to(device)
        self.complete("baseline", self.every_set, model, synced=False)
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def read_token_lines(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["tokens"] for line in f if line.strip()]


class AllStepsTrained(Exception):
    """Raised before a step when every step is trained: TRL has loaded the checkpoint's state."""


def state_bytes(model, optimizer):
    """What this rank holds of the model at a step's end: its parameters (under FSDP2 its shard
    of each, a DTensor's local part) and its optimizer's state; gradients are freed by then."""
    import torch

    def held(tensor):
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        return local.numel() * local.element_size()

    total = sum(held(p) for p in model.parameters()) if model is not None else 0
    if optimizer is not None:
        for state in optimizer.state.values():
            total += sum(held(value) for value in state.values() if isinstance(value, torch.Tensor))
    return total


def reset_peak(cuda):
    """Starts this rank's peak over, once the model is loaded and sharded: every rank loads the
    whole model before FSDP2 shards it, and that moment would be every step's peak on a CPU."""
    if cuda:
        import torch

        torch.cuda.reset_peak_memory_stats()
        return
    try:
        # Linux resets the resident high-water mark (VmHWM) on "5" (proc(5), clear_refs).
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError as error:
        log(f"cannot reset the peak resident size; the steps' peaks include the model's loading: {error}")


def peak_bytes(cuda):
    """This rank's peak since `reset_peak`: libtorch's allocator peak on CUDA, the largest
    resident size on a CPU (VmHWM), as the native worker's `peak_memory_bytes`."""
    if cuda:
        import torch

        return int(torch.cuda.max_memory_allocated())
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def allow_fsdp_on_cpu():
    """accelerate turns FSDP on for accelerators only (a CPU run is MULTI_CPU, and the plugin is
    dropped without a word); FSDP2 itself shards over gloo on a CPU, so a CPU job runs what a
    GPU job runs. Checked with accelerate 1.15: the plugin kept, `fully_shard` applied per
    decoder layer, the steps' losses those of DDP."""
    import accelerate.state
    from accelerate.utils import DistributedType

    plain = accelerate.state.AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        plain(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None:
            self.fsdp_plugin = fsdp_plugin
        # Every `AcceleratorState()` copies the process's state over the shared one again
        # (TRL's `set_seed` makes one after the trainer's), MULTI_CPU with it: set again each time.
        if getattr(self, "fsdp_plugin", None) is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP

    accelerate.state.AcceleratorState.__init__ = init


def figures_of(logs, names):
    """The log's figures under our names (`names`: ours → TRL's), the ones TRL logged."""
    return {ours: float(logs[theirs]) for ours, theirs in names.items() if logs.get(theirs) is not None}


class GrpoJob:
    """GRPOTrainer, its rewards from the daemon's verify route."""

    def __init__(self, contract, keys, tokenizer, common, stop, cuda):
        from datasets import Dataset
        from trl.rewards import get_soft_overlong_punishment

        token_file = contract["verify"]["token_file"]
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as error:
            raise JobError(f"cannot read the job's token ({token_file}): {error}") from error
        if not token:
            raise JobError(f"{token_file} is empty: the daemon's verify route needs the job's token")
        self.contract, self.tokenizer = contract, tokenizer
        overlong = keys.pop("overlong")
        self.dataset = Dataset.from_list(load_prompts(contract["train"], tokenizer.chat_template is not None))
        self.verifier = Verifier(contract["verify"]["url"], contract["verify"]["reward"], token, stop)
        verifier = self.verifier

        def passed(completions, **_):
            """Weight 0: only so TRL gathers and logs the pass rate of the verifier's verdicts."""
            return list(verifier.passed) if len(verifier.passed) == len(completions) else [0.0] * len(completions)

        verifier.__name__ = "reward"
        passed.__name__ = "passed"
        self.reward_funcs, weights = [verifier, passed], [1.0, 0.0]
        if overlong is not None:
            length = get_soft_overlong_punishment(keys["max_completion_length"], overlong["buffer"])
            self.reward_funcs.append(length)
            weights.append(overlong["weight"])
        # Rollouts on vLLM when the job asks for it (`rollout.engine = "vllm"`: use_vllm and its
        # keys), colocated with the trainer in each rank's process; TRL's own generate otherwise.
        vllm = keys.get("use_vllm", False)
        if vllm and not cuda:
            raise JobError(
                'rollout.engine = "vllm": TRL runs vLLM colocated on CUDA devices only, and this worker has '
                'none; run the job with rollout.engine = "native" here, or on a GPU host'
            )
        if vllm and importlib.util.find_spec("vllm") is None:
            raise JobError(
                'rollout.engine = "vllm": this trl environment has no vLLM; make it on the GPU host with '
                "scripts/engine-venv.sh trl (it installs engines/trl/requirements-cuda.lock there)"
            )
        log(f"rollouts on {'vLLM (colocate)' if vllm else 'HF generate'}, {'CUDA' if cuda else 'CPU'}")
        self.args = dict(common, reward_weights=weights, log_completions=False)
        self.args.update(keys)
        self.timer = Timer()
        self.step_started = None

    def build(self, callbacks):
        from trl import GRPOConfig, GRPOTrainer

        trainer = GRPOTrainer(
            model=self.contract["model"],
            reward_funcs=self.reward_funcs,
            args=GRPOConfig(**self.args),
            train_dataset=self.dataset,
            processing_class=self.tokenizer,
            callbacks=callbacks,
        )
        # Where a step's time went (rank 0's): generation, and the daemon's grading.
        generate = getattr(trainer, "_generate", None)
        if generate is not None:
            trainer._generate = self.timer.timed("rollout", generate)
        self.verifier.post = self.timer.timed("verify", self.verifier.post)
        return trainer

    def figures(self, logs):
        line = figures_of(
            logs,
            {
                "reward_mean": "reward",
                "reward_std": "reward_std",
                "passed_frac": "rewards/passed/mean",
                "completion_len_mean": "completions/mean_length",
                "completion_len_max": "completions/max_length",
                "cut_frac": "completions/clipped_ratio",
                "entropy": "entropy",
                "kl_ref": "kl",
                "loss": "loss",
                "grad_norm": "grad_norm",
                "lr": "learning_rate",
            },
        )
        if "step_time" in logs:
            step_s = float(logs["step_time"])
            rollout_s, verify_s = self.timer.take()
            line["time"] = {
                "rollout_s": rollout_s,
                "verify_s": verify_s,
                "update_s": max(step_s - rollout_s - verify_s, 0.0),
                "step_s": step_s,
            }
        line["verifier_errors"] = self.verifier.errors
        line["verifier_timeouts"] = self.verifier.timeouts
        self.verifier.errors = self.verifier.timeouts = 0
        return line


class OfflineJob:
    """A trainer on a fixed dataset (SFT, DPO): rows a step, and the step's time, in its lines."""

    # Set by each kind: its TRL trainer's module names, how its rows are read, the args it adds,
    # and its logged figures under our names.
    trainer = config = None
    extra_args = {}
    names = {"loss": "loss", "grad_norm": "grad_norm", "lr": "learning_rate"}

    def __init__(self, contract, keys, tokenizer, common, stop, cuda):
        from datasets import Dataset

        self.contract, self.tokenizer = contract, tokenizer
        self.rows = keys["per_device_train_batch_size"] * keys["gradient_accumulation_steps"]
        self.rows *= int(os.environ.get("WORLD_SIZE", "1"))
        self.dataset = Dataset.from_list(self.load(contract["train"], tokenizer.chat_template is not None))
        self.args = dict(common, **self.extra_args)
        self.args.update(keys)
        self.step_started = None

    def build(self, callbacks):
        import trl

        return getattr(trl, self.trainer)(
            model=self.contract["model"],
            args=getattr(trl, self.config)(**self.args),
            train_dataset=self.dataset,
            processing_class=self.tokenizer,
            callbacks=callbacks,
        )

    def figures(self, logs):
        line = figures_of(logs, self.names)
        line["rows"] = self.rows
        if self.step_started is not None:
            step_s = time.perf_counter() - self.step_started
            line["time"] = {"update_s": step_s, "step_s": step_s}
        return line


class SftJob(OfflineJob):
    """SFTTrainer on prompt-completion pairs, the loss on the completions only."""

    trainer, config = "SFTTrainer", "SFTConfig"
    extra_args = {"completion_only_loss": True, "packing": False}
    names = dict(OfflineJob.names, entropy="entropy")

    def load(self, path, conversational):
        return load_demonstrations(path, conversational)

    def __init__(self, *args):
        super().__init__(*args)
        self.tokens_before = 0.0

    def figures(self, logs):
        line = super().figures(logs)
        if logs.get("num_tokens") is not None:
            # TRL counts every token the step saw, prompts too.
            line["train_tokens"] = int(float(logs["num_tokens"]) - self.tokens_before)
            self.tokens_before = float(logs["num_tokens"])
        return line


def load_demonstrations(path, conversational):
    def row_of(record, _number):
        prompt, completion = record["prompt"], record["completion"]
        if conversational:
            return {
                "prompt": [{"role": "user", "content": prompt}],
                "completion": [{"role": "assistant", "content": completion}],
            }
        return {"prompt": prompt, "completion": completion}

    return read_records(path, "a demonstration", row_of)


class DpoJob(OfflineJob):
    """DPOTrainer on preference pairs, its reference the starting policy, TRL's sigmoid loss."""

    trainer, config = "DPOTrainer", "DPOConfig"
    extra_args = {"loss_type": ["sigmoid"]}
    # The dpo plugin's own names for what TRL logs of the implicit rewards.
    names = dict(
        OfflineJob.names,
        reward_accuracy="rewards/accuracies",
        reward_margin="rewards/margins",
        chosen_reward="rewards/chosen",
        rejected_reward="rewards/rejected",
    )

    def load(self, path, conversational):
        return load_pairs(path, conversational)


def load_pairs(path, conversational):
    def row_of(record, _number):
        prompt, chosen, rejected = record["prompt"], record["chosen"], record["rejected"]
        if conversational:
            return {
                "prompt": [{"role": "user", "content": prompt}],
                "chosen": [{"role": "assistant", "content": chosen}],
                "rejected": [{"role": "assistant", "content": rejected}],
            }
        return {"prompt": prompt, "chosen": chosen, "rejected": rejected}

    return read_records(path, "a preference pair", row_of)


BUILDERS = {"grpo": GrpoJob, "sft": SftJob, "dpo": DpoJob}


def leave_process_group():
    """Waits for every rank, then destroys this rank's process group, before the interpreter's
    teardown. Left to the teardown, a rank of a finished run aborted now and then under load
    (gloo's threads destroyed while still joinable: "terminate called without an active
    exception", exit -6), and torchrun failed the run it had just trained; destroying it while
    rank 0 was still saving the model did the same (2026-11-30, a Ray-launched run): so the ranks
    first meet at a barrier, bounded on gloo so that a rank that died cannot hold the others."""
    if "torch.distributed" not in sys.modules:
        return
    dist = sys.modules["torch.distributed"]
    try:
        if dist.is_available() and dist.is_initialized():
            if dist.get_backend() == "gloo":
                import datetime

                dist.monitored_barrier(timeout=datetime.timedelta(seconds=300))
            else:
                dist.barrier()
            dist.destroy_process_group()
    except Exception as error:  # the run's own end says more than this one
        log(f"leaving the process group: {error}")


if __name__ == "__main__":
    try:
        code = main()
        leave_process_group()
        sys.exit(code)
    except JobError as error:
        log(f"error: {error}")
        sys.exit(EXIT_JOB_ERROR)
    except Transient as error:
        log(f"transient: {error}")
        sys.exit(EXIT_TRANSIENT)
    except Interrupted as error:
        log(f"stopped mid-step: {error}")
        sys.exit(EXIT_INTERRUPTED)

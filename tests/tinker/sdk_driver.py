"""The Tinker SDK (tinker==0.38.0, unmodified) driving `rlvrd serve`'s Tinker front door.

Run by tests/tests/tinker.rs with the tinker venv's python (scripts/tinker-venv.sh):

    RLVR_URL=http://127.0.0.1:PORT TINKER_API_KEY=tml-… OTHER_TINKER_KEY=tml-… TINKER_TELEMETRY=0 \
        python tests/tinker/sdk_driver.py

Each check prints one JSON line ({"check": NAME, ...figures}) and fails with an assertion that says
what differed. The model is builtin:tiny-arith (a vocabulary of 101 tokens: ids 4-100 are
characters), LoRA rank 4, seeded so that twin clients start equal.
"""

import json
import os
import signal
import time

import httpx
import numpy as np
import tinker
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto

URL = os.environ["RLVR_URL"]
KEY = os.environ["TINKER_API_KEY"]
OTHER_KEY = os.environ["OTHER_TINKER_KEY"]
BASE = "builtin:tiny-arith"


def say(check, **figures):
    print(json.dumps({"check": check, **figures}), flush=True)


def datum(tokens, **inputs):
    """A datum on `tokens`: input all but the last, targets all but the first."""
    targets = np.array(tokens[1:], dtype=np.int64)
    loss_inputs = {"target_tokens": targets}
    for name, values in inputs.items():
        loss_inputs[name] = np.asarray(values, dtype=np.float32)
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=loss_inputs)


# "12+7=19\n", "3+4=7\n", … as character ids (id = 4 + 2 + code - 0x20 for printable characters).
def ids(text):
    out = [1]  # <|bos|>
    for c in text:
        out.append(4 if c == "\t" else 5 if c == "\n" else 6 + ord(c) - 0x20)
    return out


SFT = [ids(t) for t in ["12+7=19\n", "3+4=7\n", "20+5=25\n"]]
PROBE = [datum(ids("8+8=16\n"), weights=[1.0] * 7)]


def ce_data():
    return [datum(tokens, weights=[1.0] * (len(tokens) - 1)) for tokens in SFT]


def logprobs(output, i=0):
    return output.loss_fn_outputs[i]["logprobs"].to_numpy().astype(np.float64)


def probe(client):
    """The probe's target logprobs under the client's weights now (forward only)."""
    return logprobs(client.forward(PROBE, "cross_entropy").result())


def step(client, data, lr=5e-3, loss="cross_entropy", config=None):
    fb = client.forward_backward(data, loss, config)
    opt = client.optim_step(types.AdamParams(learning_rate=lr))
    return fb.result(), opt.result()


def close(a, b, tol, what):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, f"{what}: shapes {a.shape} and {b.shape}"
    worst = float(np.max(np.abs(a - b))) if a.size else 0.0
    assert worst <= tol, f"{what}: differ by {worst} (> {tol})"
    return worst


service = tinker.ServiceClient(base_url=URL, api_key=KEY)

# --- SFT: the loss of what it trains on falls.
train = service.create_lora_training_client(BASE, rank=4, seed=7).result()
info = train.get_info()
assert info.model_data.model_name == BASE, info
losses = []
for _ in range(6):
    fb, opt = step(train, ce_data())
    losses.append(fb.metrics["loss:sum"])
assert losses[-1] < 0.8 * losses[0], f"the SFT loss did not fall: {losses}"
say("sft", losses=losses, grad_norm=opt.metrics.get("grad_norm:mean"))

# --- Each RL loss's loss:sum is its formula on the logprobs it returns.
rng = np.random.default_rng(3)
tokens = ids("6+6=12\n")
n = len(tokens) - 1
current = logprobs(train.forward([datum(tokens, weights=[1.0] * n)], "cross_entropy").result())
sampling = current + rng.normal(0.0, 0.3, n)
advantages = rng.normal(0.0, 1.0, n)
rl = [datum(tokens, logprobs=sampling, advantages=advantages)]
formulas = {
    "importance_sampling": (None, lambda lp, r: -np.sum(r * advantages)),
    "ppo": (
        {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1},
        lambda lp, r: -np.sum(np.minimum(r * advantages, np.clip(r, 0.9, 1.1) * advantages)),
    ),
    "cispo": (
        {"clip_low_threshold": 0.7, "clip_high_threshold": 1.3},
        lambda lp, r: -np.sum(np.clip(r, 0.7, 1.3) * lp * advantages),
    ),
}
# GSPO's sequence ratio averages the log-ratios of the tokens its mask marks (not the first two).
mask = np.array([0.0, 0.0] + [1.0] * (n - 2))
q32 = sampling.astype(np.float32).astype(np.float64)


def gspo(lp, r):
    s = np.exp(np.sum((lp - q32) * mask) / mask.sum())
    return -np.sum(np.minimum(s * advantages, np.clip(s, 0.9, 1.1) * advantages))


formulas["gspo"] = ({"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}, gspo)
for name, (config, formula) in formulas.items():
    data = rl
    if name == "gspo":
        data = [datum(tokens, logprobs=sampling, advantages=advantages, sequence_ratio_mask=mask)]
    out = train.forward_backward(data, name, config).result()
    lp = logprobs(out)
    expected = formula(lp, np.exp(lp - sampling.astype(np.float32).astype(np.float64)))
    got = out.metrics["loss:sum"]
    assert abs(got - expected) <= 1e-4 * max(1.0, abs(expected)), f"{name}: loss:sum {got}, formula {expected}"
    say("loss", loss=name, loss_sum=got, formula=float(expected))
train.optim_step(types.AdamParams(learning_rate=1e-3)).result()
try:
    train.forward_backward(rl, "stable_reinforce").result()
    raise AssertionError("stable_reinforce was served")
except tinker.RequestFailedError as error:
    assert "importance_sampling" in str(error), error
    say("refused", loss="stable_reinforce", error=str(error)[:200])
# That failure poisoned the client (the SDK's rule): the next checks use fresh ones.

# --- Chunked forward_backward (2 datums a chunk, the first chunk sent last) equals one call.
chunked_service = tinker.ServiceClient(base_url=URL, api_key=KEY)
whole = service.create_lora_training_client(BASE, rank=4, seed=11).result()
chunked = chunked_service.create_lora_training_client(BASE, rank=4, seed=11).result()
holder = chunked.holder
holder._client_config = holder._client_config.model_copy(
    update={"fwdbwd_max_chunk_len": 2, "parallel_fwdbwd_chunks": True}
)
five = ce_data() + [datum(ids("1+1=2\n"), weights=[1.0] * 6), datum(ids("9+9=18\n"), weights=[1.0] * 7)]
a, _ = step(whole, five)
b, _ = step(chunked, five)
assert len(b.loss_fn_outputs) == 5
loss_gap = abs(a.metrics["loss:sum"] - b.metrics["loss:sum"])
assert loss_gap <= 1e-4, (a.metrics, b.metrics)
worst = close(probe(whole), probe(chunked), 1e-5, "weights after a chunked step")
say("chunked", chunks=3, loss_gap=loss_gap, probe_gap=worst)

# --- A retried seq_id is the same request, run once.
once = service.create_lora_training_client(BASE, rank=4, seed=13).result()
twice = service.create_lora_training_client(BASE, rank=4, seed=13).result()
step(once, ce_data())
http = httpx.Client(base_url=f"{URL}/api/v1", headers={"X-API-Key": KEY}, timeout=60)


def poll(request_id):
    while True:
        answer = http.post("/retrieve_future", json={"request_id": request_id})
        assert answer.status_code == 200, answer.text
        if answer.headers["content-type"].startswith("application/x-protobuf"):
            return answer.content
        body = answer.json()
        if body.get("type") != "try_again":
            assert "error" not in body, body
            return body


request = types.ForwardBackwardRequest(
    forward_backward_input=types.ForwardBackwardInput(data=ce_data(), loss_fn="cross_entropy"),
    model_id=twice.model_id,
    seq_id=1,
)
body = forward_backward_request_to_proto(request).SerializeToString()
fb = http.post("/forward_backward", content=body, headers={"Content-Type": "application/x-protobuf"}).json()
poll(fb["request_id"])
optim = {"model_id": twice.model_id, "seq_id": 2, "adam_params": {"learning_rate": 5e-3}, "type": "optim_step"}
first = http.post("/optim_step", json=optim).json()["request_id"]
again = http.post("/optim_step", json=optim).json()["request_id"]
assert first == again, (first, again)
poll(first)
changed = dict(optim, adam_params={"learning_rate": 5e-2})
refused = http.post("/optim_step", json=changed)
assert refused.status_code == 400 and "seq_id" in refused.text, refused.text
save = {"model_id": twice.model_id, "seq_id": 3, "path": "retried", "type": "save_weights"}
saved = poll(http.post("/save_weights", json=save).json()["request_id"])
restored = service.create_training_client_from_state(saved["path"]).result()
worst = close(probe(once), probe(restored), 0.0, "a step posted twice against a step posted once")
say("retry", request_id=first, path=saved["path"], probe_gap=worst)

# --- A save under a name taken is refused unless it says overwrite (then it replaces it).
first_save = restored.save_state("dup").result().path
assert restored.save_state("dup", overwrite=True).result().path == first_save
try:
    restored.save_state("dup").result()
    raise AssertionError("a save replaced a state of the same name without overwrite")
except AssertionError:
    raise
except Exception as error:  # the SDK's BadRequestError (the client is poisoned after it)
    assert "overwrite" in str(error), repr(error)
say("overwrite", path=first_save)

# --- save_state, then a client made from it with its optimizer: the same next step.
path = train_path = None
saver = service.create_lora_training_client(BASE, rank=4, seed=17).result()
step(saver, ce_data())
train_path = saver.save_state("after-one").result().path
step(saver, ce_data())
after_saver = probe(saver)
resumed = service.create_training_client_from_state_with_optimizer(train_path).result()
step(resumed, ce_data())
worst = close(after_saver, probe(resumed), 1e-6, "the step after loading a state with its optimizer")
fresh_adam = service.create_training_client_from_state(train_path).result()
step(fresh_adam, ce_data())
differs = float(np.max(np.abs(after_saver - probe(fresh_adam))))
assert differs > 1e-6, "loading without the optimizer gave the same step: AdamW's state was not left out"
say("save_load", path=train_path, with_optimizer_gap=worst, without_optimizer_gap=differs)

# --- Samplers: a snapshot samples with the weights it was saved from.
snapshot = saver.save_weights_and_get_sampling_client()
params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=5, stop=[])
prompt = types.ModelInput.from_ints(ids("4+5="))
before = snapshot.sample(prompt, 3, params).result()
assert len(before.sequences) == 3
for sequence in before.sequences:
    assert len(sequence.tokens) == 6 and len(sequence.logprobs) == 6, sequence
for _ in range(3):
    step(saver, ce_data(), lr=5e-2)
after = snapshot.sample(prompt, 3, params).result()
assert [s.tokens for s in after.sequences] == [s.tokens for s in before.sequences]
close([s.logprobs for s in after.sequences], [s.logprobs for s in before.sequences], 1e-6, "a snapshot's samples")
later = saver.save_weights_and_get_sampling_client().sample(prompt, 3, params).result()
moved = float(np.max(np.abs(np.array([s.logprobs for s in later.sequences][0]) - before.sequences[0].logprobs)))
assert moved > 1e-3, "a snapshot after three more steps samples as the first one did: the weights did not move"
named = saver.save_weights_for_sampler("named").result().path
by_path = service.create_sampling_client(model_path=named)
by_path.sample(prompt, 1, params).result()
# A sampler on the base alone is served by a process of its own: the untrained model's samples.
base_only = service.create_sampling_client(base_model=BASE).sample(prompt, 1, params).result()
assert len(base_only.sequences[0].tokens) == 6, base_only
say("samplers", tokens=[s.tokens for s in before.sequences], moved=moved, named=named)

# --- A client whose process is killed: its next operations wait, then run after an exact resume.
victim = service.create_lora_training_client(BASE, rank=4, seed=19).result()
twin = service.create_lora_training_client(BASE, rank=4, seed=19).result()
for _ in range(3):
    step(victim, ce_data())
    step(twin, ce_data())
job = f"tinker:{victim.model_id}"
killed = []
for pid in os.listdir("/proc"):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        continue
    if b"tinker-client" in argv and job.encode() in argv:
        os.kill(int(pid), signal.SIGKILL)
        killed.append(int(pid))
assert len(killed) == 1, f"the victim's process: {killed}"
started = time.time()
step(victim, ce_data())
step(twin, ce_data())
worst = close(probe(victim), probe(twin), 0.0, "a killed client's next step against its twin's")
say("killed", pid=killed[0], resumed_in_s=round(time.time() - started, 1), probe_gap=worst)

# --- Another team's key sees nothing of this team's.
other = tinker.ServiceClient(base_url=URL, api_key=OTHER_KEY)
for what, attempt in [
    ("load", lambda: other.create_training_client_from_state(train_path).result()),
    ("sample", lambda: other.create_sampling_client(model_path=named).sample(prompt, 1, params).result()),
]:
    try:
        attempt()
        raise AssertionError(f"another team's key could {what} {train_path}")
    except AssertionError:
        raise
    except Exception as error:  # the SDK's error for a 404
        assert "not_found" in str(error) or "404" in str(error), f"{what}: {error!r}"
say("isolation", refused=["load", "sample"])

# --- For the gate bridge: an adapter trained on the problems in $ARITH_TRAIN (prompt, then the
# answer and the end of sequence; the loss on the answer only), and an untrained one.
problems = [json.loads(line) for line in open(os.environ["ARITH_TRAIN"])]
sft = []
for problem in problems:
    prompt, answer = ids(problem["prompt"]), ids(problem["reference"]["answer"])[1:] + [2]
    tokens = prompt + answer
    weights = [0.0] * (len(prompt) - 1) + [1.0] * len(answer)
    sft.append(datum(tokens, weights=weights))
gated = service.create_lora_training_client(BASE, rank=8, seed=29).result()
gate_losses = []
for i in range(int(os.environ.get("GATE_STEPS", "150"))):
    fb, _ = step(gated, sft, lr=float(os.environ.get("GATE_LR", "3e-3")))
    gate_losses.append(round(fb.metrics["loss:sum"], 2))
trained = gated.save_weights_for_sampler("trained").result().path
untrained = service.create_lora_training_client(BASE, rank=8, seed=31).result()
untrained_path = untrained.save_weights_for_sampler("untrained").result().path
say("gate_adapters", trained=trained, untrained=untrained_path, losses=gate_losses[::10])
# The victim's next request, for the test to send once this program (and its heartbeats) ended.
say("parked", model_id=victim.model_id, next_seq=victim._request_id_counter + 1)
say("done")

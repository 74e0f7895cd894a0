"""One team's Tinker SDK loop for tests/tests/tinker.rs's shared-device story: a LoRA client on
builtin:tiny-arith (seed 23), STEPS supervised steps on fixed data, then the probe's logprobs.

    RLVR_URL=… TINKER_API_KEY=tml-… STEPS=N python tests/tinker/share_driver.py

Prints {"step": i, "loss": …, "at_s": …} per step and {"probe": [...]} at the end: two teams running
it with the same STEPS end with the same probe whatever the scheduler did to either (took turns,
preempted, resumed), since each resumes exactly.
"""

import json
import os
import time

import numpy as np
import tinker
from tinker import types


def ids(text):
    return [1] + [4 if c == "\t" else 5 if c == "\n" else 6 + ord(c) - 0x20 for c in text]


def datum(tokens):
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": np.array(tokens[1:], dtype=np.int64),
            "weights": np.ones(len(tokens) - 1, dtype=np.float32),
        },
    )


data = [datum(ids(t)) for t in ["12+7=19\n", "3+4=7\n", "20+5=25\n"]]
service = tinker.ServiceClient(base_url=os.environ["RLVR_URL"], api_key=os.environ["TINKER_API_KEY"])
client = service.create_lora_training_client("builtin:tiny-arith", rank=4, seed=23).result()
started = time.time()
for step in range(int(os.environ["STEPS"])):
    fb = client.forward_backward(data, "cross_entropy")
    opt = client.optim_step(types.AdamParams(learning_rate=5e-3))
    loss = fb.result().metrics["loss:sum"]
    opt.result()
    print(json.dumps({"step": step, "loss": loss, "at_s": round(time.time() - started, 2)}), flush=True)
probe = client.forward([datum(ids("8+8=16\n"))], "cross_entropy").result()
print(json.dumps({"probe": probe.loss_fn_outputs[0]["logprobs"].tolist()}), flush=True)

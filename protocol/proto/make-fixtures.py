"""Writes protocol/src/tinker/testdata/*.bin: messages as the Tinker SDK itself encodes them
(its own request conversion, tinker 0.38.0), which rlvr_protocol::tinker's tests decode.

    "$(scripts/tinker-venv.sh)" protocol/proto/make-fixtures.py   # from the repository root
"""

import pathlib

import tinker
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.types.forward_backward_input import ForwardBackwardInput
from tinker.types.forward_backward_request import ForwardBackwardRequest
from tinker.types.tensor_data import TensorData

out = pathlib.Path("protocol/src/tinker/testdata")
out.mkdir(parents=True, exist_ok=True)

# Two datums as a training loop writes them: a prompt in two text chunks and its loss inputs
# (1-D, dense), and one whose weights are a 2-D CSR tensor (rows of 3, two cells set).
rl = tinker.Datum(
    model_input=tinker.ModelInput(chunks=[tinker.EncodedTextChunk(tokens=[5, 6]), tinker.EncodedTextChunk(tokens=[7])]),
    loss_fn_inputs={
        "target_tokens": [6, 7, 8],
        "logprobs": [-0.5, -1.25, -2.0],
        "advantages": [0.0, 1.5, 1.5],
    },
)
sparse = tinker.Datum(
    model_input=tinker.ModelInput.from_ints([1, 2]),
    loss_fn_inputs={
        "target_tokens": TensorData(data=[2, 3], dtype="int64", shape=[2]),
        "weights": TensorData(
            data=[0.25, 4.0], dtype="float32", shape=[2, 3], sparse_crow_indices=[0, 1, 2], sparse_col_indices=[2, 0]
        ),
    },
)
request = ForwardBackwardRequest(
    forward_backward_input=ForwardBackwardInput(
        data=[rl, sparse], loss_fn="ppo", loss_fn_config={"clip_low_threshold": 0.8, "clip_high_threshold": 1.2, "note": "x"}
    ),
    model_id="sess:train:0",
    seq_id=7,
)
(out / "forward_backward_request.bin").write_bytes(forward_backward_request_to_proto(request).SerializeToString(deterministic=True))
print("wrote", out / "forward_backward_request.bin")

# Answers as the SDK's own protobuf classes encode them (deterministic: map keys sorted), which
# rlvr's encoder must give byte for byte: a forward/backward output of two datums' logprobs and
# its loss, and a sample of two sequences with log-probabilities and prompt log-probabilities.
import struct

from tinker.proto import tinker_public_pb2 as pb

logprobs = [[-0.5, -1.25, -2.0], [-3.0, -0.125]]
offsets = [0]
for row in logprobs:
    offsets.append(offsets[-1] + 4 * len(row))
output = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
record = output.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=2)
field = record.fields["logprobs"]
field.data = b"".join(struct.pack(f"<{len(r)}f", *r) for r in logprobs)
field.offsets = struct.pack(f"<{len(offsets)}q", *offsets)
field.dtype = pb.DTYPE_FLOAT32
output.metrics["loss:sum"] = 6.875
output.metrics["ppo_clipped:sum"] = 1.0
(out / "forward_backward_output.bin").write_bytes(output.SerializeToString(deterministic=True))

sample = pb.SampleResponse()
for tokens, stop in (([11, 12, 2], pb.STOP_REASON_STOP), ([13, 14, 15], pb.STOP_REASON_LENGTH)):
    sequence = sample.sequences.add(stop_reason=stop, tokens=struct.pack(f"<{len(tokens)}i", *tokens))
    sequence.logprobs = struct.pack("<3f", -0.25, -1.5, -0.75)
sample.prompt_logprobs = struct.pack("<3f", float("nan"), -2.0, -0.5)
(out / "sample_response.bin").write_bytes(sample.SerializeToString(deterministic=True))
print("wrote the answers")

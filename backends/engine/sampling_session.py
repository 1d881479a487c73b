"""The SampleTokens op as its own small ONNX Runtime session over the decoder's logits buffer, on the decoder's
device: bound in place (on CUDA the logits never leave the device), the rows' parameters in, only the tokens
and the logprobs asked for out."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from .graph import ENGINE_DOMAIN, IR_VERSION, OPSET
from .host_costs import HostCosts
from .sampler import SAMPLER_INPUTS, SAMPLER_OUTPUTS, Sampled, SamplingRows

INPUT_TYPES = {
    "logits": (TensorProto.FLOAT, ["N", "V"]),
    "rows": (TensorProto.INT32, ["R"]),
    "temperature": (TensorProto.FLOAT, ["R"]),
    "top_p": (TensorProto.FLOAT, ["R"]),
    "uniform": (TensorProto.FLOAT, ["R"]),
    "mask_index": (TensorProto.INT32, ["R"]),
    "masks": (TensorProto.INT32, ["M", "W"]),
    "penalty_ids": (TensorProto.INT32, ["R", "P"]),
    "penalty_values": (TensorProto.FLOAT, ["R", "P"]),
    "logprobs": (TensorProto.INT32, ["R"]),
    "top": (TensorProto.INT64, [1]),
}
OUTPUT_TYPES = {
    "token": (TensorProto.INT64, ["R"]),
    "logprob": (TensorProto.FLOAT, ["R"]),
    "top_ids": (TensorProto.INT32, ["R", "K"]),
    "top_logprobs": (TensorProto.FLOAT, ["R", "K"]),
}


@functools.cache
def sampler_model() -> bytes:
    """One SampleTokens node, its inputs and outputs the graph's."""
    node = helper.make_node("SampleTokens", list(SAMPLER_INPUTS), list(SAMPLER_OUTPUTS), domain=ENGINE_DOMAIN)
    graph = helper.make_graph(
        [node],
        "sample_tokens",
        [helper.make_tensor_value_info(name, *INPUT_TYPES[name]) for name in SAMPLER_INPUTS],
        [helper.make_tensor_value_info(name, *OUTPUT_TYPES[name]) for name in SAMPLER_OUTPUTS],
    )
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(ENGINE_DOMAIN, 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = IR_VERSION
    return model.SerializeToString()


class SamplingSession:
    """SampleTokens over `logits` ([rows, vocab] float32, in the place the decoder writes it)."""

    def __init__(
        self,
        kernels: Path,
        providers: list,
        place: tuple[str, int],
        logits: ort.OrtValue,
        threads: int = 0,
        spinning: bool = False,
        costs: HostCosts | None = None,
    ) -> None:
        """`spinning`: its threads spin awaiting work when done (by default they sleep: spinning, they would hold
        the cores the decoder's next step needs); `costs`: where its runs are counted (the decoder's)."""
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        options.register_custom_ops_library(str(kernels))
        self.session = ort.InferenceSession(sampler_model(), options, providers=providers)
        self._logits = logits  # bound by address below: held as long as the session
        self.costs = HostCosts() if costs is None else costs
        self._binding = self.session.io_binding()
        device, device_id = place
        self._binding.bind_input("logits", device, device_id, np.float32, logits.shape(), logits.data_ptr())

    def sample(self, rows: SamplingRows) -> Sampled:
        inputs = rows.inputs()
        for name, value in inputs.items():
            self._binding.bind_cpu_input(name, value)
        self._binding.clear_binding_outputs()  # the outputs' shapes follow the rows: allocated per run
        for name in SAMPLER_OUTPUTS:
            self._binding.bind_output(name, "cpu")
        with self.costs.run(inputs.values()):
            self.session.run_with_iobinding(self._binding)
        self.costs.syncs += 1  # the tokens read back
        token, logprob, top_ids, top_logprobs = (value.numpy() for value in self._binding.get_outputs())
        return Sampled(token, logprob, top_ids, top_logprobs)

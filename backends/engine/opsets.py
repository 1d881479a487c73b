"""The ONNX opsets and custom domains the engine's graphs are written in."""

OPSET = 23
IR_VERSION = 11  # FLOAT4E2M1 needs 11; onnxruntime 1.31 loads up to 13
ENGINE_DOMAIN = "gptoss.engine"  # our ops: compiled kernels, or the graphs' model-local functions

"""The built-in gpt-oss engine on ONNX Runtime: checkpoints, graph building, KV cache and batching."""

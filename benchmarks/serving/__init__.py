"""Serving speed of token-pruned ViTs against torch.compile and ONNX Runtime CUDA graphs in one run
(`python3 -m benchmarks.serving`): see benchmarks/serving/driver.py."""

"""Test-only helpers shared by the test packages, the fuzz drivers and the benchmarks (not part of the wheel):
ONNX models of single ops, seeded op inputs, the padded reference of the pruned ViT and one closeness check."""

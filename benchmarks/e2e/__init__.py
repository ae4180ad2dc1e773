"""End-to-end throughput of token-pruned ViTs (`python3 -m benchmarks.e2e`): the driver (driver.py), cases and
variants, ONNX baselines, ORT runs, profiles and the report. Timing: raggedvit.timing; images: raggedvit.images."""

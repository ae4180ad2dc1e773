"""Pieces of scripts/bench_e2e.py: cases and variants, timing, ONNX baselines, ORT runs, profiles, report."""

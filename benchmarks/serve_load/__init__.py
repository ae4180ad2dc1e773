"""Load against a running `raggedvit serve`: N requests at concurrency C on the loopback, answers checked against a
direct ONNX Runtime run of the same images; img/s, latency percentiles and the batch sizes the server formed.

    python3 -m benchmarks.serve_load --url http://127.0.0.1:8000 --model deit_tiny.onnx --requests 256 --concurrency 8
    python3 -m benchmarks.serve_load --serve --device cpu   # the canonical run: results/serve_load_<machine>.json

Modules: `client` (the bounded load loop and its summary), `reference` (request bodies, the direct ORT answers and
the check), `server` (a `raggedvit serve` process and every process it starts), `run` (the command line).
"""

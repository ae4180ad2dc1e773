"""raggedvit benchmarks: importable modules run as `python3 -m benchmarks.<name>`; each writes one canonical result
per benchmark and machine, benchmarks/results/<name>_<GPU>.json (GPU, versions, date, commit, every measurement) and
a .png chart, overwritten in place. docs/performance.md says how to run each."""

"""raggedvit benchmarks: importable modules run as `python3 -m benchmarks.<name>`; results land in
benchmarks/results/ as JSON with the GPU, versions, date and commit."""

"""The seeded CPU-EP fuzz of the six com.raggedvit ops (test helpers, not part of the wheel): `cases` (RaggedAttention
and the shared run helpers), `linear` (the dispatch `draw_any` / `run_any` by call index), `select`, `gelu`, `norm`,
`embed`, `pos`, `attrs` (mistyped attributes and sizes near 2**63 for every op) and `driver` (child processes).
Imported as the top-level package `fuzz` with tests/custom_ops on sys.path (its conftest puts it there)."""

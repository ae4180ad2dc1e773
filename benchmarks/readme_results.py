"""The results sections of README.md and docs/performance.md, generated from the canonical result files.

    python3 -m benchmarks.readme_results            # rewrite the marked sections in place
    python3 -m benchmarks.readme_results --check    # exit 1 when a section differs from its files

A section sits between `<!-- results:NAME -->` and `<!-- /results:NAME -->`; NAME is a key of SECTIONS. Each
section is a caption naming its source file, machine and versions, one table and, where the benchmark draws one,
its chart. README.md gets the short tables (`full=False`), docs/performance.md the full ones. The tables are
functions of the JSON files in benchmarks/results/ only, so the documents cannot drift from the files
(tests/benchmarks/test_readme_results.py checks it).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.e2e.report import speedups
from benchmarks.readme_table import markdown as e2e_markdown

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path("benchmarks/results")  # relative to the repository root
GPU = "NVIDIA-H200"

# document -> whether it holds the full tables
DOCUMENTS: dict[str, bool] = {"README.md": False, "docs/performance.md": True}

KERNEL_IMPLS = (
    "raggedvit",
    "raggedvit+cls",
    "raggedvit+key_bias",
    "raggedvit+cls+key_bias",
    "padded_sdpa",
    "dense_sdpa",
    "varlen_fa",
    "nested_sdpa",
)
KERNEL_PEERS = ("padded_sdpa", "dense_sdpa", "varlen_fa", "nested_sdpa")

# benchmarks.serving variant -> label; (variant, policy flag) for the pruned ones
_SERVING_LABELS = {
    ("timm_eager", "none"): "timm eager",
    ("timm_compile", "none"): "torch.compile unpruned",
    ("ort_unpruned", "none"): "raggedvit ORT unpruned",
    ("prunedvit_eager", "topk-l2"): "PrunedViT eager, topk-l2",
    ("prunedvit_eager", "cls-mass"): "PrunedViT eager, cls-mass capacity",
    ("prunedvit_eager", "cls-mass:dead-linear"): "PrunedViT eager, cls-mass dead rows",
    ("prunedvit_compile", "topk-l2"): "torch.compile(PrunedViT) topk-l2",
    ("prunedvit_compile", "cls-mass"): "torch.compile(PrunedViT) cls-mass capacity",
    ("prunedvit_compile", "cls-mass:dead-linear"): "torch.compile(PrunedViT) cls-mass dead rows",
    ("ort_raggedvit", "topk-l2"): "**raggedvit topk-l2**",
    ("ort_raggedvit", "cls-mass"): "**raggedvit cls-mass, capacity**",
    ("ort_raggedvit", "cls-mass:dead-linear"): "**raggedvit cls-mass, dead-row blocks**",
    ("prunedvit_compile", "tome:r=8"): "torch.compile(PrunedViT) tome r=8",
    ("prunedvit_compile", "tome:r=16"): "torch.compile(PrunedViT) tome r=16",
    ("ort_raggedvit", "tome:r=8"): "**raggedvit tome r=8**",
    ("ort_raggedvit", "topk-l2:keep=0.507653"): "raggedvit topk-l2 at tome r=8's 101 tokens",
    ("ort_raggedvit", "tome:r=16"): "**raggedvit tome r=16**",
    ("ort_raggedvit", "topk-l2:keep=0.048469"): "raggedvit topk-l2 at tome r=16's 11 tokens",
}
# the README's short table: these rows only
_SERVING_SHORT = (
    ("timm_compile", "none"),
    ("ort_unpruned", "none"),
    ("prunedvit_compile", "topk-l2"),
    ("ort_raggedvit", "topk-l2"),
    ("ort_raggedvit", "cls-mass"),
    ("ort_raggedvit", "cls-mass:dead-linear"),
    ("ort_raggedvit", "tome:r=8"),
)


def _load(name: str) -> dict[str, Any]:
    return json.loads((ROOT / RESULTS / name).read_text())


def _n(x: float | None) -> str:
    """img/s or µs as printed in the tables: thousands separated from 100 up, one decimal below."""
    if x is None:
        return "—"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}"


def _chart(prefix: str, name: str, alt: str) -> list[str]:
    return ["", f"![{alt}]({prefix}{RESULTS / name})"]


def _policy_key(policy: str) -> str:
    """'cls-mass:mass=0.9:at=3,6,9:dead-linear' -> 'cls-mass:dead-linear'; 'none' -> 'none'; 'tome:r=8' ->
    'tome:r=8'; a topk-l2 keeping another fraction than 0.5 (the serving benchmark's `--tome` peers, keeping tome's
    final token count) -> 'topk-l2:keep=K'."""
    head, *fields = policy.split(":")
    if head == "tome":
        return ":".join([head, *(f for f in fields if f.startswith("r="))])
    if head == "topk-l2" and any(f.startswith("keep=") and f != "keep=0.5" for f in fields):
        return ":".join([head, *(f for f in fields if f.startswith("keep="))])
    return f"{head}:dead-linear" if policy.endswith(":dead-linear") else head


def _env_caption(env: dict[str, Any]) -> str:
    pk = env.get("packages") or {}
    gpu = (env.get("gpu") or {}).get("name")
    ort = pk.get("onnxruntime-gpu") or pk.get("onnxruntime")
    return f"{gpu}, torch {pk.get('torch')}, Triton {pk.get('triton')}, onnxruntime {ort}, timm {pk.get('timm')}"


def _provenance(full: bool, name: str, commit: str | None, date: str | None) -> str:
    src = f"`{RESULTS / name}`"
    if full and commit:
        src += f", raggedvit `{commit[:7]}`, {str(date)[:10]}"
    return src


def serving_table(data: dict[str, Any], full: bool, models: list[str] | None = None) -> list[str]:
    """Model x variant rows, img/s (ratio to torch.compile unpruned) per batch size."""
    recs = [r for r in data["records"] if r.get("status") == "ok"]
    batches = sorted({r["batch"] for r in recs})
    base = {(r["model"], r["batch"]): r["img_per_s"] for r in recs if r["variant"] == "timm_compile"}
    lines = [
        "| model | variant | " + " | ".join(f"B={b}" for b in batches) + " |",
        "|---|---|" + "---:|" * len(batches),
    ]
    for model in models or list(dict.fromkeys(r["model"] for r in recs)):
        for (variant, pol), label in _SERVING_LABELS.items():
            if not full and (variant, pol) not in _SERVING_SHORT:
                continue
            cells = []
            for b in batches:
                r = next(
                    (x for x in recs if (x["model"], x["variant"], _policy_key(x["policy"]), x["batch"])
                     == (model, variant, pol, b)),
                    None,
                )  # fmt: skip
                if r is None:
                    cells.append("")
                    continue
                ratio = "" if variant == "timm_compile" or (model, b) not in base else (
                    f" ({r['img_per_s'] / base[(model, b)]:.2f}x)"
                )  # fmt: skip
                cells.append(_n(r["img_per_s"]) + ratio)
            if any(cells):
                lines.append(f"| {model} | {label} | " + " | ".join(cells) + " |")
    return lines


def serving(full: bool, prefix: str) -> list[str]:
    name = f"serving_{GPU}.json"
    data = _load(name)
    cfg, env = data["config"], data["env"]
    lines = [
        f"img/s (ratio to torch.compile of the unpruned timm model at the same batch), {cfg['dtype']} torch, "
        f"{cfg['export_dtype']} exports run as one CUDA graph per batch, seeded weights, the sample photos tiled to "
        f"the batch, {cfg['rounds']} interleaved rounds. topk-l2 keeps 0.5 at block 4; cls-mass keeps 0.9 of the "
        "CLS attention at blocks 3, 6, 9 (capacity layout; dead-row blocks: `--ragged-linear-blocks dead-rows`). "
        + (
            "tome merges r tokens in every block (to 101 tokens with r=8, 11 with r=16). "
            if any(str(p).startswith("tome") for p in cfg.get("policies", ()))
            else ""
        )
        + f"{_env_caption(env)}; {_provenance(full, name, env.get('commit'), env.get('date'))}.",
        "",
        *serving_table(data, full),
    ]
    return lines + _chart(prefix, f"serving_{GPU}.png", "serving img/s per batch size")


def families(full: bool, prefix: str) -> list[str]:
    name = f"families/serving_{GPU}.json"
    data = _load(name)
    env = data["env"]
    recs = [r for r in data["records"] if r.get("status") == "ok"]
    batches = sorted({r["batch"] for r in recs})
    lines = [
        "The same model unpruned and pruned (topk-l2 0.5 @4), both raggedvit fp16-all exports as CUDA graphs, img/s "
        f"unpruned / pruned (ratio). {_env_caption(env)}; "
        f"{_provenance(full, name, env.get('commit'), env.get('date'))}.",
        "",
        "| model | " + " | ".join(f"B={b}" for b in batches) + " |",
        "|---|" + "---:|" * len(batches),
    ]
    for model in dict.fromkeys(r["model"] for r in recs):
        cells = []
        for b in batches:
            u = next((r for r in recs if (r["model"], r["variant"], r["batch"]) == (model, "ort_unpruned", b)), None)
            p = next((r for r in recs if (r["model"], r["variant"], r["batch"]) == (model, "ort_raggedvit", b)), None)
            cells.append(
                f"{_n(u['img_per_s'])} / {_n(p['img_per_s'])} ({p['img_per_s'] / u['img_per_s']:.2f}x)"
                if u and p
                else ""
            )
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return lines + _chart(prefix, f"families/serving_{GPU}.png", "families img/s per batch size")


def e2e(full: bool, prefix: str) -> list[str]:
    name = f"e2e_{GPU}.json"
    data = _load(name)
    caption = (
        f"{data['gpu']}, torch {data['torch']}, Triton {data['triton']}, onnxruntime {data['onnxruntime']}, "
        f"timm {data['timm']}; {_provenance(full, name, data.get('raggedvit_commit'), data.get('date'))}."
    )
    if full:
        body = e2e_markdown(data).splitlines()[2:]  # the generator's caption replaces the table's own
        while body and not body[-1]:
            body.pop()
        lines = [f"images/s, {caption}", "", *body]
        return lines + _chart(prefix, f"e2e_{GPU}.png", "end-to-end img/s per batch size")
    records = data["records"]
    policies = [p for p in data["config"]["policies"] if p != "none"]
    ratios = data.get("speedups") or speedups(records, policies)
    batches = sorted({r["batch"] for r in records})
    lines = [
        "raggedvit in ONNX Runtime (fp16-all, the faster of node by node and CUDA graph): img/s (speedup over the "
        "best unpruned peer of timm eager fp16, ORT fp16 and ORT fp16 optimized / over the best including ORT fp16 "
        f"optimized as a CUDA graph). {caption}",
        "",
        "| model | policy | " + " | ".join(f"B={b}" for b in batches) + " |",
        "|---|---|" + "---:|" * len(batches),
    ]
    for model in sorted({r["model"] for r in records}):
        for pol in policies:
            cells = []
            for b in batches:
                r = next((x for x in ratios if (x["model"], x["batch"], x["policy"]) == (model, b, pol)), None)
                v, s = (r or {}).get("ours_img_per_s"), (r or {}).get("speedup_vs_best_unpruned")
                g = (r or {}).get("speedup_vs_best_unpruned_incl_graph")
                cells.append(f"{_n(v)} ({s:.2f}x / {g:.2f}x)" if None not in (v, s, g) else "")
            lines.append(f"| {model} | {pol.split(':')[0]} | " + " | ".join(cells) + " |")
    return lines + _chart(prefix, f"e2e_{GPU}.png", "end-to-end img/s per batch size")


def kernel(full: bool, prefix: str) -> list[str]:
    name = f"kernel_{GPU}.json"
    data = _load(name)
    recs = data["records"]
    keys = sorted({(r["B"], r["L"], r["lengths"]) for r in recs}, key=lambda k: (k[2] != "uniform", k[1], k[0]))
    caption = (
        f"fp16, H={data['H']}, D={data['D']}; {data['gpu']}, torch {data['torch']}, Triton {data['triton']}; "
        f"{_provenance(full, name, None, None)}."
    )
    rows = {k: {r["impl"]: r for r in recs if (r["B"], r["L"], r["lengths"]) == k} for k in keys}
    impls = [i for i in KERNEL_IMPLS if any(r["impl"] == i for r in recs)]  # the ones this result file measured
    if full:
        lines = [
            f"GPU time / isolated-call time in µs, {caption}",
            "",
            "| B | L | lengths | bytes floor | " + " | ".join(impls) + " |",
            "|---:|---:|---|---:|" + "---:|" * len(impls),
        ]
        for (B, L, kind), row in rows.items():
            cells = [
                "—" if (r := row.get(i)) is None or r["gpu_us"] is None else f"{_n(r['gpu_us'])} / {_n(r['call_us'])}"
                for i in impls
            ]
            floor = row.get("bytes_floor", {}).get("gpu_us")
            lines.append(f"| {B} | {L} | {kind} | {_n(floor)} | " + " | ".join(cells) + " |")
    else:
        lines = [
            "GPU time in µs at L = 197 tokens (uniform: every sequence L long; ragged: random lengths in [L/2, L]), "
            + caption,
            "",
            "| B | lengths | raggedvit | best peer | peer µs | raggedvit / peer |",
            "|---:|---|---:|---|---:|---:|",
        ]
        for (B, L, kind), row in rows.items():
            if L != 197 or B == 4:
                continue
            peers = {p: row[p]["gpu_us"] for p in KERNEL_PEERS if p in row and row[p]["gpu_us"] is not None}
            best = min(peers, key=peers.get)
            ours = row["raggedvit"]["gpu_us"]
            lines.append(f"| {B} | {kind} | {_n(ours)} | {best} | {_n(peers[best])} | {ours / peers[best]:.2f} |")
    return lines + _chart(prefix, f"kernel_{GPU}.png", "kernel GPU time per shape")


def ort_op(full: bool, prefix: str) -> list[str]:
    name = f"ort_op_{GPU}.json"
    data = _load(name)
    lines = [
        f"µs per op inside ONNX Runtime graphs, fp16, H={data['H']}, D={data['D']}: gross = (t12 − t1) / 11 of "
        "chains of 12 and 1 attention blocks with identical glue; net = gross − the glue-only chain's; ragged: "
        "random lengths in [1, L], T rows in all. "
        f"{data['gpu']}, onnxruntime {data['onnxruntime']}; {_provenance(full, name, None, None)}.",
        "",
    ]
    if full:
        lines += [
            "| lengths | B | L | T | RaggedAttention gross | PackedMHA gross | ratio | RaggedAttention net "
            "| PackedMHA net | ratio |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
    else:
        lines += [
            "| lengths | B | L | T | RaggedAttention | PackedMHA | ratio |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
    for r in data["rows"]:
        g, p = r["ragged_per_op_us"], r["packed_mha_per_op_us"]
        if full:
            gn, pn = r["ragged_net_us"], r["packed_mha_net_us"]
            lines.append(
                f"| {r['mode']} | {r['B']} | {r['L']} | {r['T']} | {g:.1f} | {p:.1f} | {g / p:.2f} | {gn:.1f} "
                f"| {pn:.1f} | {gn / pn:.2f} |"
            )
        elif r["mode"] == "ragged" and r["L"] == 197:
            lines.append(f"| {r['mode']} | {r['B']} | {r['L']} | {r['T']} | {g:.1f} | {p:.1f} | {g / p:.2f} |")
    return lines + _chart(prefix, f"ort_op_{GPU}.png", "per-op µs inside ONNX Runtime")


def validate(full: bool, prefix: str) -> list[str]:
    name = f"validate_{GPU}.json"
    data = _load(name)
    lines = [
        f"`raggedvit validate --device cuda --sample-images`, deit_base_patch16_224, seeded weights, the default rule "
        f"of each export dtype; {data['gpu']}; {_provenance(full, name, None, None)}.",
        "",
        "| export | policy | judged images | max \\|Δlogit\\| judged | rule | PyTorch fp16 forward | result |",
        "|---|---|---:|---:|---|---:|---|",
    ]
    for key, rep in data["reports"].items():
        dtype, policy = key.split("_")[-2:]
        judged = [r for r in rep["rows"] if not (r.get("near_tie") or r.get("precision_tie"))]
        worst = max((r["max_abs_diff"] for r in judged), default=None)
        floor = (rep["summary"].get("precision_floor") or {}).get("torch_max_abs_diff")
        rule = "< 0.004" if dtype == "fp32" else "0.004 + 0.01 × max \\|ref\\|"
        lines.append(
            f"| {dtype} | {policy} | {len(judged)} of {len(rep['rows'])} | {worst:.1e} | {rule} | "
            f"{'—' if floor is None else f'{floor:.1e}'} | {'PASS' if rep['passed'] else 'FAIL'} |"
        )
    return lines


def cuda_graph(full: bool, prefix: str) -> list[str]:
    name = f"cuda_graph_check_{GPU}.json"
    data = _load(name)
    lines = [
        f"`python3 -m benchmarks.check_cuda_graph`, {data['model']} {data['dtype']} "
        f"(`--ragged-linear {data['ragged_linear']}`): the export replayed as a CUDA graph against the same session "
        f"run node by node; {_provenance(full, name, None, None)}.",
        "",
        "| policy | capacity layout | B | max \\|Δlogit\\| | equal token counts | replay follows new input | "
        "node by node ms | graph ms |",
        "|---|---|---:|---:|---|---|---:|---:|",
    ]
    for r in data["rows"]:
        p = r["policy"]
        lines.append(
            f"| {p['policy']} | {'yes' if r['capacity'] else 'no'} | {r['batch']} | "
            f"{r['max_abs_dlogit_graph_vs_plain']:.1e} | {'yes' if r['token_counts_equal'] else 'no'} | "
            f"{'yes' if r['replay_follows_input'] else 'no'} | {r['plain_ms']:.2f} | {r['graph_ms']:.2f} |"
        )
    return lines


def _serve_machine(r: dict[str, Any]) -> str:
    """The machine of a serve_load record: its name, and for a CPU the load average other jobs put on it."""
    c = r["config"]
    load = (r.get("load_average") or {}).get("before")
    return c["device_name"] + (f", load average {load[0]:.1f} from other jobs" if load and c["device"] == "cpu" else "")


def serve_load(full: bool, prefix: str) -> list[str]:
    """`raggedvit serve` under load (`benchmarks.serve_load --serve`), a result per machine's file, GPUs first: the
    README gets a sentence per file, the performance page the configuration and a table."""
    files = sorted((ROOT / RESULTS).glob("serve_load_*.json"), key=lambda f: (f.stem.endswith("_cpu"), f.name))
    if not files:
        raise FileNotFoundError(f"no serve_load_<machine>.json in {RESULTS}")
    records = [(f.name, _load(f.name)) for f in files]
    if not full:
        sentences = []
        for name, r in records:
            c, srv, lat = r["config"], r["server"], r["server"]["latency_ms"]
            model = str(c["timm_model"] or c["model"]).split("_patch")[0]
            sentences.append(
                f"{model} {c['prune']['policy']} ({c['dtype']}) on {_serve_machine(r)}: **{_n(srv['img_per_s'])} "
                f"img/s** served at concurrency {c['concurrency']} (mean batch {srv['mean_batch_size']} of up to "
                f"{c['max_batch_size']}; p50 / p99 latency {lat['p50'] / 1e3:.2f} / {lat['p99'] / 1e3:.2f} s), "
                f"{r['ratio']:.2f} of a direct ORT loop at B = {c['max_batch_size']} "
                f"({_n(r['direct_ort']['img_per_s'])} img/s: {_n(r['direct_ort']['before']['img_per_s'])} before the "
                f"load, {_n(r['direct_ort']['after']['img_per_s'])} after); {srv['ok'] - len(srv['mismatches'])} of "
                f"{c['requests']} answers equal direct ORT's; `{RESULTS / name}`."
            )
        return [" ".join(sentences) + " `python3 -m benchmarks.serve_load --serve` made it."]
    cfg = records[0][1]["config"]
    prune = cfg["prune"]
    lines = [
        f"`raggedvit serve` of {cfg['timm_model'] or cfg['model']} ({prune['policy']} keeping {prune['keep']} at "
        f"block {','.join(map(str, prune['prune_at']))}, seeded weights), {cfg['replicas']} replica, batches of up to "
        f"{cfg['max_batch_size']} within {cfg['batch_wait_ms']:g} ms; {cfg['requests']} requests at concurrency "
        f"{cfg['concurrency']} from the same machine after {cfg['warmup']} warm-up ones ({cfg['images']} images: the "
        "sample photos and their variants as JPEG, PNG and WebP), each answer checked against a direct ONNX Runtime "
        f"run; against a direct ORT loop at B = {cfg['max_batch_size']} on the same machine (the mean of its runs "
        "before and after the load).",
        "",
        "| machine | export | served img/s | direct ORT img/s (before / after) | served / direct | latency p50 / p90 / "
        "p99 ms | batches formed (size: count) | answers equal direct ORT | source |",
        "|---|---|---:|---:|---:|---|---|---:|---|",
    ]
    for name, r in records:
        c, srv, lat, d = r["config"], r["server"], r["server"]["latency_ms"], r["direct_ort"]
        batches = ", ".join(f"{b}: {n:g}" for b, n in srv["batches_by_size"].items())
        lines.append(
            f"| {_serve_machine(r)} | {c['dtype']} | {_n(srv['img_per_s'])} | {_n(d['img_per_s'])} "
            f"({_n(d['before']['img_per_s'])} / {_n(d['after']['img_per_s'])}) | {r['ratio']:.2f} | "
            f"{lat['p50']:.0f} / {lat['p90']:.0f} / {lat['p99']:.0f} | {batches} | "
            f"{srv['ok'] - len(srv['mismatches'])} of {c['requests']} | "
            f"{_provenance(full, name, r['env'].get('commit'), r['env'].get('date'))} |"
        )
    return lines


def sweep_folder() -> str:
    """The sweep the documents show: `raggedvit sweep --out benchmarks/results/sweep_<machine>`, a GPU's (this page's
    GPU first) when one ran, else the CPU's."""
    found = sorted(p.parent.name for p in (ROOT / RESULTS).glob("sweep_*/sweep.json"))
    gpus = [f for f in found if f != "sweep_cpu"]
    return f"sweep_{GPU}" if f"sweep_{GPU}" in gpus else (gpus or ["sweep_cpu"])[0]


def sweep(full: bool, prefix: str) -> list[str]:
    """The chart of a real `raggedvit sweep` run with its machine and settings; full: also the table of every
    point."""
    from raggedvit.sweep import SweepResult

    folder = sweep_folder()
    result = SweepResult.from_dict(_load(f"{folder}/sweep.json"))
    s, images, v = result.settings, result.settings["images"], result.settings["versions"]
    seeded = s["weights"]["source"] == "seeded"
    lines = [
        f"{s['model']}, {s['weights']['source']} weights, {images['count']} images ({images['source']}), "
        f"{s['dtype']} exports timed at batch {s['batch']} on **{s['device_name']}** ({s['device']}); torch "
        f"{v['torch']}, onnxruntime {v['onnxruntime']}, timm {v['timm']}; `{RESULTS / folder}/`."
        + (" Agreement on seeded weights says nothing about accuracy on trained ones." if seeded else "")
    ]
    if full:
        lines += ["", *result.table()]
    return lines + _chart(prefix, f"{folder}/sweep.png", f"{result.metric} against img/s, Pareto front")


def latest(benchmark: str) -> str:
    """The name (under RESULTS) of the newest GPU result file of `benchmark` (`<benchmark>_<GPU>.json`, by the date
    its environment records; CPU runs left out): the one section that shows the last run, whichever GPU ran it."""
    files = [f for f in (ROOT / RESULTS).glob(f"{benchmark}_*.json") if not f.stem.endswith("_cpu")]
    if not files:
        raise FileNotFoundError(f"no {benchmark}_<GPU>.json in {RESULTS}")
    newest = max(files, key=lambda f: (str((json.loads(f.read_text()).get("env") or {}).get("date")), f.name))
    return newest.name


def gpu_tests_lines(data: dict[str, Any], name: str, full: bool) -> list[str]:
    """The last GPU suite run (benchmarks.gpu_tests' record) in one paragraph: counts, GPU, commit, versions, and
    the failing tests when there are any."""
    s, env = data["suite"], data["env"]
    pk = env.get("packages") or {}
    ort = pk.get("onnxruntime-gpu") or pk.get("onnxruntime")
    unfinished = s.get("not_run") or []
    verdict = "**failures**" if s["failed"] or s["errors"] else "**incomplete**" if unfinished else "**all passed**"
    chunks = data.get("chunks") or []
    cut = [c for c in chunks if c.get("status") != "complete"]
    parts = f", {len(chunks)} chunk{'s' * (len(chunks) > 1)} ({len(cut)} cut)" if len(chunks) > 1 or cut else ""
    line = (
        f"Last GPU run, `{data['command']}`: {verdict}, {s['passed']} passed, {s['failed']} failed, {s['errors']} "
        f"errors, {s['skipped']} skipped, {len(unfinished)} not finished in {s['seconds']:.0f} s{parts} on "
        f"{data['gpu']}, raggedvit `{str(data['commit'])[:7]}` ({str(env.get('date'))[:10]}), torch "
        f"{pk.get('torch')}, onnxruntime {ort}; `{RESULTS / name}`."
    )
    if not full:
        return [line]
    bad = [f"- failing: `{node}`" for node in [*s["failing"], *s["erroring"]]]
    return [line, *bad, *(f"- not finished: `{node}`" for node in unfinished)]


def gpu_tests(full: bool, prefix: str) -> list[str]:
    name = latest("gpu_tests")
    return gpu_tests_lines(_load(name), name, full)


def _schedule(prune: dict[str, Any]) -> str:
    at = ",".join(str(b) for b in prune["prune_at"]) or "every block"
    amount = {"cls-mass": f"mass {prune.get('mass')}", "tome": f"r {prune.get('r')}"}.get(prune["policy"])
    return f"{amount or 'keep ' + str(prune['keep'])} at {at}" + (", fuse" if prune.get("fuse") else "")


def _verdict(rec: dict[str, Any] | None) -> str:
    if rec is None:
        return ""
    if not rec["passed"]:
        return f"**FAIL** ({rec['failures'][0]['kind']}, {rec['failure_count']} failures)"
    ties = len(rec["precision_ties"])
    ratio = rec.get("max_block_ratio")
    return f"pass, {ties} precision tie{'' if ties == 1 else 's'}" + ("" if ratio is None else f", {ratio:.2g}x floor")


def validate_study_lines(data: dict[str, Any], name: str, full: bool) -> list[str]:
    """benchmarks.validate_study's result: the totals, every clean export per dtype, every mutant per dtype."""
    t, cfg, env = data["totals"], data["config"], data["env"]
    dtypes = list(cfg["dtypes"])
    lines = [
        f"`python3 -m benchmarks.validate_study`: {len(cfg['image_names'])} images (the sample photos, then their "
        f"flips, crops and scales), seeded weights, the default rule of each export dtype, validated on "
        f"{data['device']} ({cfg['device']} EP) in {data['timing']['total_s']:.0f} s; "
        f"{_provenance(full, name, env.get('commit'), env.get('date'))}. **{t['false_failures']} false failures** in "
        f"{t['exports']} clean exports ({t['precision_ties']} precision ties listed, not judged); "
        f"**{t['mutants_missed']} mutants missed, {t['mutants_not_named']} not named** of {t['mutants']}; "
        f"{t['export_errors']} export errors.",
        "",
        "| model | policy | schedule | " + " | ".join(dtypes) + " |",
        "|---|---|---|" + "---|" * len(dtypes),
    ]
    rows: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for rec in data["exports"]:
        model = rec["model"] if not rec["case"].startswith("mutant_") else "mutation-suite control"
        rows.setdefault((model, json.dumps(rec["prune"], sort_keys=True)), {})[rec["dtype"]] = rec
    for (model, prune), recs in rows.items():
        spec = json.loads(prune)
        cap = " (capacity)" if any(r.get("capacity") for r in recs.values()) else ""
        cells = [_verdict(recs.get(d)) for d in dtypes]
        lines.append(f"| {model} | {spec['policy']}{cap} | {_schedule(spec)} | " + " | ".join(cells) + " |")
    if data["mutants"]:
        lines += ["", "| mutant | " + " | ".join(dtypes) + " |", "|---|" + "---|" * len(dtypes)]
        by: dict[str, dict[str, dict[str, Any]]] = {}
        for rec in data["mutants"]:
            by.setdefault(rec["mutant"], {})[rec["dtype"]] = rec
        for mutant, recs in by.items():
            cells = []
            for d in dtypes:
                r = recs.get(d)
                if r is None:
                    cells.append("")
                    continue
                state = ("caught" if r["named"] else "**caught, not named**") if r["caught"] else "**MISSED**"
                first = (r["first_failure"] or "").split(": ", 1)[-1]
                cells.append(f"{state}: {first[:70]}" + ("…" if len(first) > 70 else ""))
            lines.append(f"| {mutant} | " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines


def validate_study(full: bool, prefix: str) -> list[str]:
    name = latest("validate_study")
    return validate_study_lines(_load(name), name, full)


_BARS = {"gpu_time_vs_flops": "GPU time <= 1.15 x FLOPs share", "not_slower_at_b1": "not slower at B=1",
         "r16_speedup": "r=16 at 1.5x"}  # fmt: skip


def _tome_label(policy: str) -> str:
    head, *fields = policy.split(":")
    params = " ".join(fields)
    return {"none": "unpruned"}.get(head, f"{head} {params}".strip())


def tome_table(data: dict[str, Any], full: bool) -> list[str]:
    """A `benchmarks.serving --tome` file: per model, the raggedvit exports (unpruned, tome r=8 / 16, topk-l2 at the
    same final count), img/s (ratio to the unpruned export; full: and GPU µs per image) per batch, then the
    token-merging bars (`benchmarks.tome_targets`: its rows in the file)."""
    recs = [r for r in data["records"] if r.get("status") == "ok" and r["variant"] in ("ort_unpruned", "ort_raggedvit")]
    batches = sorted({r["batch"] for r in recs})
    base = {(r["model"], r["batch"]): r for r in recs if r["variant"] == "ort_unpruned"}
    lines = ["| model | export | " + " | ".join(f"B={b}" for b in batches) + " |", "|---|---|" + "---:|" * len(batches)]
    for model in dict.fromkeys(r["model"] for r in recs):
        for policy in dict.fromkeys(r["policy"] for r in recs if r["model"] == model):
            cells = []
            for b in batches:
                r = next((x for x in recs if (x["model"], x["policy"], x["batch"]) == (model, policy, b)), None)
                if r is None:
                    cells.append("")
                    continue
                unp = base.get((model, b))
                cell = _n(r["img_per_s"])
                if unp is not None and policy != "none":
                    cell += f" ({r['img_per_s'] / unp['img_per_s']:.2f}x)"
                if full and r.get("gpu_us_per_image") is not None:
                    cell += f"; {r['gpu_us_per_image']:.1f} µs"
                cells.append(cell)
            lines.append(f"| {model} | {_tome_label(policy)} | " + " | ".join(cells) + " |")
    rows = data.get("tome_targets") or []
    verdicts = [(row, name, bar) for row in rows for name, bar in row["bars"].items()]
    met = sum(bar["met"] for _, _, bar in verdicts)
    lines += ["", f"Token-merging bars: {met} of {len(verdicts)} met."]
    if full:
        for row, name, bar in verdicts:
            state = "met" if bar["met"] else "**missed**"
            lines.append(f"- {row['model']} r={row['r']} B={row['batch']}, {_BARS.get(name, name)}: {state}")
    else:
        missed = [f"{row['model']} r={row['r']} B={row['batch']} ({_BARS.get(name, name)})"
                  for row, name, bar in verdicts if not bar["met"]]  # fmt: skip
        if missed:
            lines[-1] += " Missed: " + "; ".join(missed) + "."
    return lines


def tome(full: bool, prefix: str) -> list[str]:
    """The newest `benchmarks.serving --tome` file (serving_tome_<GPU>.json), or the line saying none has run."""
    try:
        name = latest("serving_tome")
    except FileNotFoundError:
        return [
            "No GPU run of `python3 -m benchmarks.serving --tome` yet: tome r=8 and r=16 against the unpruned "
            "export and topk-l2 at the same final token count, as CUDA graphs."
        ]
    data = _load(name)
    cfg, env = data["config"], data["env"]
    caption = (
        f"img/s (ratio to the unpruned export at the same batch{'; GPU µs per image' if full else ''}), "
        f"{cfg['export_dtype']} exports as CUDA graphs, seeded weights, the sample photos tiled to the batch. tome "
        "merges r tokens in every block; topk-l2 keeps the same final count at block 4. "
        f"{_env_caption(env)}; {_provenance(full, name, env.get('commit'), env.get('date'))}."
    )
    return [caption, "", *tome_table(data, full)]


def merge_kernel_table(data: dict[str, Any]) -> list[str]:
    """A `benchmarks.merge_kernel` file: per dtype and batch, the fused kernel's and the standard-op merge's GPU time
    per call (CUDA-graph replay), the speed-up, the kernel's bandwidth and its agreement check."""
    lines = ["| dtype | B | RaggedMerge (Triton) | standard-op merge | speed-up | kernel GB/s | src equal |",
             "|---|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    recs = data["records"]
    for fused in (r for r in recs if r["impl"] == "triton_merge"):
        ref = next((r for r in recs if r["impl"] == "torch_reference" and (r["dtype"], r["B"]) == (fused["dtype"],
                    fused["B"])), None)  # fmt: skip
        us = [f"{x['gpu_us']:.1f} µs" if x and x.get("gpu_us") else "failed" for x in (fused, ref)]
        speedup = fused.get("speedup_vs_reference")
        gbps = fused.get("gbps")
        lines.append(
            f"| {fused['dtype']} | {fused['B']} | {us[0]} | {us[1]} | {f'{speedup:.1f}x' if speedup else ''} | "
            f"{f'{gbps:.0f}' if gbps else ''} | {'yes' if fused.get('src_equal') else '**no**'} |"
        )
    return lines


def merge_kernel(full: bool, prefix: str) -> list[str]:
    """The newest `benchmarks.merge_kernel` file (merge_kernel_<GPU>.json), or the line saying none has run."""
    try:
        name = latest("merge_kernel")
    except FileNotFoundError:
        return ["No GPU run of `python3 -m benchmarks.merge_kernel` yet."]
    data = _load(name)
    caption = (
        "One tome merge at deit_small shapes (n = 197, C = 384, 6 heads, r = 8, the residual fused in): GPU time per "
        f"call, CUDA-graph replay. {_env_caption(data)}; "
        f"{_provenance(full, name, data.get('commit'), data.get('date'))}."
    )
    return [caption, "", *merge_kernel_table(data)]


def gpu_runs(full: bool, prefix: str) -> list[str]:
    """The test section's GPU lines: the newest GPU suite record and the newest validation study on a GPU (or that
    none has run yet)."""
    lines = gpu_tests(full, prefix)
    try:
        study = validate_study(full, prefix)
    except FileNotFoundError:
        study = ["No GPU run of the validation study yet (`python3 -m benchmarks.validate_study --device cuda`)."]
    return [*lines, *study]


SECTIONS: dict[str, Callable[[bool, str], list[str]]] = {
    "gpu_runs": gpu_runs,
    "serving": serving,
    "families": families,
    "e2e": e2e,
    "kernel": kernel,
    "ort_op": ort_op,
    "validate": validate,
    "cuda_graph": cuda_graph,
    "sweep": sweep,
    "serve_load": serve_load,
    "tome": tome,
    "merge_kernel": merge_kernel,
}

_MARKED = re.compile(r"(<!-- results:(\w+) -->\n)(.*?)(<!-- /results:\2 -->)", re.S)


def render(text: str, full: bool, prefix: str) -> str:
    """`text` with every marked section replaced by SECTIONS[name](full, prefix); unknown names raise KeyError."""

    def one(m: re.Match[str]) -> str:
        body = "\n".join(SECTIONS[m.group(2)](full, prefix))
        return f"{m.group(1)}{body}\n{m.group(4)}"

    return _MARKED.sub(one, text)


def rendered(doc: str) -> tuple[str, str]:
    """(current text, generated text) of one document of DOCUMENTS."""
    path = ROOT / doc
    prefix = "../" * (len(Path(doc).parts) - 1)
    text = path.read_text()
    return text, render(text, DOCUMENTS[doc], prefix)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 when a document is out of date")
    args = ap.parse_args()
    stale = []
    for doc in DOCUMENTS:
        text, new = rendered(doc)
        if new != text:
            stale.append(doc)
            if not args.check:
                (ROOT / doc).write_text(new)
    verb = "out of date" if args.check else "rewritten"
    print(f"{verb}: {', '.join(stale)}" if stale else "up to date")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())

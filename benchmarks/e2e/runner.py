"""One model at one resolution: every variant x batch, each wrapped so a failure becomes a record, not a crash."""

from __future__ import annotations

import copy
import gc
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from benchmarks.e2e import onnx_baselines, ort_run
from benchmarks.e2e.cases import BASELINES, CUDA_ONLY, GRAPH, BenchConfig, ModelCase, blank_record, parse_policy
from benchmarks.e2e.profile import kernel_summary, summarize_ort_profile
from benchmarks.e2e.variants import Step, export_ragged, ort_step, torch_model_fn, torch_step
from benchmarks.e2e.varlen import VarlenAttention, pick_varlen_core
from raggedvit.exporter.checks import static_shapes
from raggedvit.images import sample_inputs, tile
from raggedvit.pruning import build_pruned_vit
from raggedvit.timing import device_sync, measure
from raggedvit.weights import load_vit

__all__ = ["CaseRunner", "log"]

T = TypeVar("T")
_DTYPES = {"fp16": torch.float16, "fp32": torch.float32}
_SETUP_RESERVE_S = 20.0  # do not start a setup step (export, session) with less time left


def log(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _short_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")[:600]


class CaseRunner:
    """Runs every selected variant of one ModelCase; emit(record) receives each record, flush() persists them."""

    def __init__(
        self,
        case: ModelCase,
        cfg: BenchConfig,
        *,
        deadline: float,
        emit: Callable[[dict[str, Any]], None],
        flush: Callable[[], None],
        profiles: list[dict[str, Any]],
        exports: list[dict[str, Any]],
    ) -> None:
        self.case, self.cfg, self.deadline = case, cfg, deadline
        self.emit, self.flush, self.profiles, self.exports = emit, flush, profiles, exports
        self.device = torch.device(cfg.device)
        self.dtype = _DTYPES[cfg.dtype]
        self.sync = device_sync(cfg.device)
        self.work = Path(tempfile.mkdtemp(prefix=f"e2e_{case.key}_"))
        self._optimized: tuple[Path, dict[str, Any]] | None = None  # (path, stats) of the optimized baseline
        self.profile_todo: tuple[Path, str] | None = None

    # ------------------------------------------------------------------ records
    def _record(self, variant: str, policy: str, batch: int, status: str, **fields: Any) -> None:
        rec = blank_record(self.case.model, self.case.img_size, policy, variant, batch, status)
        rec["timm_name"] = self.case.timm_name
        rec.update(fields)
        self.emit(rec)
        shown = f"{rec['img_per_s']:.1f} img/s ({rec['latency_ms']:.3f} ms)" if status == "ok" else status
        extra = f" tokens={rec['mean_tokens']}" if rec["mean_tokens"] else ""
        agree = f" top1={rec['top1_agree']:.2f}" if rec["top1_agree"] is not None else ""
        err = f" {rec['error'] or rec['note']}"[:200] if status != "ok" else ""
        log(f"{self.case.key} {policy} {variant} B={batch}: {shown}{agree}{extra}{err}")

    def _time_left(self) -> float:
        return self.deadline - time.time()

    def _skip_all(self, variants: list[str], policy: str, why: str, status: str = "skipped") -> None:
        for v in variants:
            for b in self.cfg.batches:
                self._record(v, policy, b, status, note=why if status == "skipped" else "", error=why)

    def _setup(self, what: str, variants: list[str], policy: str, fn: Callable[[], T]) -> T | None:
        """Run a setup step (export, session); on failure or lack of time record every (variant, batch) and
        return None."""
        if self._time_left() < _SETUP_RESERVE_S:
            self._skip_all(variants, policy, f"time budget exhausted before {what}")
            return None
        t0 = time.time()
        try:
            out = fn()
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
            traceback.print_exc()
            self._skip_all(variants, policy, f"{what} failed: {_short_error(exc)}", status="error")
            self._free()
            return None
        log(f"{self.case.key} {policy}: {what} ({time.time() - t0:.1f} s)")
        return out

    # ------------------------------------------------------------------ one measurement
    def _bench(self, variant: str, policy: str, batch: int, make: Callable[[], Step], ref: dict, note: str = ""):
        ref_top1 = ref.get(batch)
        if self._time_left() < self.cfg.warmup_s + self.cfg.target_s + 0.2:
            self._record(variant, policy, batch, "skipped", note="time budget exhausted")
            return
        try:
            run, results = make()
            cfg = self.cfg
            t = measure(
                run,
                self.sync,
                target_s=cfg.target_s,
                warmup_s=cfg.warmup_s,
                min_warmup=cfg.min_warmup,
                min_runs=cfg.min_runs,
            )
            logits, counts = results()
            top1 = logits.float().argmax(-1).cpu()
            agree = float((top1 == ref_top1).float().mean()) if ref_top1 is not None else None
            tokens = [round(v, 2) for v in counts.float().mean(0).tolist()] if counts is not None else None
            self._record(
                variant,
                policy,
                batch,
                "ok",
                latency_ms=round(t.median_ms, 4),
                img_per_s=round(batch / (t.median_ms / 1e3), 2),
                p10_ms=round(t.p10_ms, 4),
                p90_ms=round(t.p90_ms, 4),
                runs=t.runs,
                mean_tokens=tokens,
                top1_agree=agree,
                top1_ref=ref.get("name") if ref_top1 is not None else None,
                note=note,
            )
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
            traceback.print_exc()
            self._record(variant, policy, batch, "error", error=_short_error(exc), note=note)
            self._free()

    def _free(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ the case
    def run(self) -> None:
        try:
            with torch.inference_mode():
                self._run()
        finally:
            shutil.rmtree(self.work, ignore_errors=True)
            self._free()

    def _run(self) -> None:
        cfg = self.cfg
        sel = set(cfg.variants)
        loaded = self._setup("load model", list(cfg.variants), "*", self._load)
        if loaded is None:
            return
        vit, vit_dev, x32, xt = loaded
        ref_eager = {"name": "timm_eager_fp16", **self._top1({b: (lambda x=x: vit_dev(x)) for b, x in xt.items()})}

        if "timm_eager_fp16" in sel:
            for b in cfg.batches:
                self._bench("timm_eager_fp16", "none", b, lambda b=b: torch_step(vit_dev, xt[b]), {})
        self.flush()
        for variant in BASELINES[1:]:
            if variant in sel:
                self._ort_baseline(variant, vit, vit_dev, x32, ref_eager)
                self.flush()

        for text in cfg.policies:
            self._policy(text, vit, vit_dev, x32, xt)
            self.flush()
        if self.profile_todo is not None:
            self._profile(*self.profile_todo, x32)
            self.flush()

    def _load(self):
        cfg, case = self.cfg, self.case
        vit, _ = load_vit(case.timm_name, seed=0, img_size=case.img_size_arg, model_kwargs=cfg.model_kwargs or None)
        base = sample_inputs(vit)  # [n, 3, S, S] float32: the photos, as raggedvit bench times them
        self.heads, self.hidden = int(vit.blocks[0].attn.num_heads), int(vit.embed_dim)
        vit_dev = copy.deepcopy(vit).to(self.device, self.dtype).eval()
        x32 = {b: tile(base, b).to(self.device) for b in cfg.batches}
        xt = {b: x.to(self.dtype) for b, x in x32.items()}
        return vit, vit_dev, x32, xt

    def _top1(self, fns: dict[int, Callable[[], Any]]) -> dict[int, torch.Tensor]:
        out = {}
        for b, fn in fns.items():
            try:
                res = fn()
                logits = res.logits if hasattr(res, "logits") else res
                out[b] = logits.float().argmax(-1).cpu()
            except Exception as exc:  # noqa: BLE001 - agreement is then not recorded
                log(f"{self.case.key}: reference forward at B={b} failed: {_short_error(exc)}")
        return out

    def _ort_baseline(self, variant: str, vit, vit_dev, x32: dict, ref: dict) -> None:
        if variant in CUDA_ONLY and self.device.type != "cuda":
            self._skip_all([variant], "none", "needs CUDA (ORT CUDA-graph replay)")
            return
        info: dict[str, Any] = {}

        def build() -> Path:
            if variant == "ort_fp16":
                try:
                    return onnx_baselines.export_plain(vit_dev, self.work / "base_plain.onnx")
                except Exception as exc:  # noqa: BLE001 - fall back to a float32 CPU export + float16 conversion
                    traceback.print_exc()
                    info["fallback"] = f"export on {self.cfg.device} failed ({_short_error(exc)[:200]})"
                    fp32 = onnx_baselines.export_plain(vit, self.work / "base_plain_fp32.onnx")
                    return onnx_baselines.plain_fp16(fp32, self.work / "base_plain_fp16.onnx")
            if self._optimized is None:  # shared by ort_fp16_optimized and its CUDA-graph variant
                fp32 = onnx_baselines.export_fp32(vit, self.work / "base_split_fp32.onnx")
                self._optimized = onnx_baselines.optimized_fp16(
                    fp32, self.work / "base_opt_fp16.onnx", num_heads=self.heads, hidden_size=self.hidden
                )
            path, stats = self._optimized
            info.update(stats)
            return path

        path = self._setup(f"{variant} export", [variant], "none", build)
        if path is None:
            return
        parts = [f"fused={info['fused']}"] if info.get("fused") is not None else []
        if "fallback" in info:
            parts.append(f"fp32 export + float16 conversion: {info['fallback']}")
        note = "; ".join(parts)
        if info and variant != "ort_fp16_optimized_graph":
            self.exports.append({"case": self.case.key, "variant": variant, **info})
        if variant in GRAPH:  # one session per batch: ORT captures one graph per input shape
            for b in self.cfg.batches:
                make = lambda b=b: ort_step(ort_run.baseline_session(path, "cuda", cuda_graph=True), x32[b])  # noqa: E731
                self._bench(variant, "none", b, make, ref, (note + "; " if note else "") + "CUDA graph replay")
            self._free()
            return
        sess = self._setup(
            f"{variant} session", [variant], "none", lambda: ort_run.baseline_session(path, self.cfg.device)
        )
        if sess is None:
            return
        note = f"providers={sess.get_providers()}" + (f"; {note}" if note else "")
        for b in self.cfg.batches:
            self._bench(variant, "none", b, lambda b=b, s=sess: ort_step(s, x32[b]), ref, note)
        del sess
        self._free()

    def _policy(self, text: str, vit, vit_dev, x32: dict, xt: dict) -> None:
        cfg = self.cfg
        sel = [v for v in cfg.variants if v not in BASELINES]
        if not sel:
            return
        try:
            spec = parse_policy(text)
            spec.check_model(depth=len(vit.blocks), has_class_token=vit.cls_token is not None)
        except ValueError as exc:
            self._skip_all(sel, text, f"bad policy: {exc}", status="error")
            return
        ref_model = build_pruned_vit(vit_dev, spec).eval()
        ref = {"name": "torch_raggedvit", **self._top1({b: (lambda x=x: ref_model(x)) for b, x in xt.items()})}
        for variant in ("torch_raggedvit", "torch_padded_sdpa"):
            if variant in sel:
                fn = torch_model_fn(variant, vit_dev, spec)
                for b in cfg.batches:
                    self._bench(variant, text, b, lambda b=b, fn=fn: torch_step(fn, xt[b]), ref)
        if "torch_varlen" in sel:
            self._varlen(spec, text, vit_dev, xt, ref)
        if "ort_raggedvit" in sel or "ort_raggedvit_graph" in sel:
            self._ort_ragged(
                spec, text, vit, x32, ref, graph="ort_raggedvit_graph" in sel, plain="ort_raggedvit" in sel
            )

    def _varlen(self, spec, text: str, vit_dev, xt: dict, ref: dict) -> None:
        if self.device.type != "cuda" and "torch_varlen" in CUDA_ONLY:
            self._skip_all(["torch_varlen"], text, "needs CUDA (flash varlen attention has no CPU kernel)")
            return
        probe = lambda: pick_varlen_core(self.device, self.dtype)  # noqa: E731
        picked = self._setup("varlen core probe", ["torch_varlen"], text, probe)
        if picked is None:
            return
        core, note = picked
        fn = torch_model_fn("torch_varlen", vit_dev, spec, attention=VarlenAttention(core))
        note = f"core={note}; max_seqlen = static tokens per image (no host sync)"
        for b in self.cfg.batches:
            self._bench("torch_varlen", text, b, lambda b=b: torch_step(fn, xt[b]), ref, note)

    def _ort_ragged(self, spec, text: str, vit, x32: dict, ref: dict, *, graph: bool, plain: bool) -> None:
        recipe = {"model": self.case.timm_name, "benchmark": "benchmarks.e2e"}
        path = self.work / f"ragged_{self.cfg.policies.index(text)}_{spec.policy}.onnx"
        want = ["ort_raggedvit"] * plain + ["ort_raggedvit_graph"] * graph
        made = self._setup(
            "raggedvit export",
            want,
            text,
            lambda: export_ragged(vit, spec, path, dtype=self.cfg.export_dtype or self.cfg.dtype, recipe=recipe),
        )
        if made is None:
            return
        if plain:
            sess = self._setup(
                "raggedvit session", ["ort_raggedvit"], text, lambda: ort_run.ragged_session(path, self.cfg.device)
            )
            if sess is not None:
                note = f"providers={sess.get_providers()}"
                for b in self.cfg.batches:
                    self._bench("ort_raggedvit", text, b, lambda b=b, s=sess: ort_step(s, x32[b]), ref, note)
                del sess
                self._free()
        if graph:
            if self.device.type != "cuda":
                self._skip_all(["ort_raggedvit_graph"], text, "needs CUDA (ORT CUDA-graph replay)")
            elif not static_shapes(spec.to_dict()):
                why = f"{spec.policy}: data-dependent token counts (NonZero), the graph cannot be captured"
                self._skip_all(["ort_raggedvit_graph"], text, why)
            else:
                for b in self.cfg.batches:
                    make = lambda b=b: ort_step(ort_run.ragged_session(path, "cuda", cuda_graph=True), x32[b])  # noqa: E731
                    self._bench("ort_raggedvit_graph", text, b, make, ref, "CUDA graph replay (one session per batch)")
                self._free()
        if self._is_profile_case(spec):
            self.profile_todo = (path, text)  # profiled after every timing of the case (a profiler crash costs less)

    def _is_profile_case(self, spec) -> bool:
        pc = self.cfg.profile_case
        first_topk = next((p for p in self.cfg.policies if p.startswith("topk-l2")), None)
        return (
            pc is not None
            and (self.case.model, self.case.img_size) == tuple(pc)
            and spec.policy == "topk-l2"
            and first_topk is not None
            and parse_policy(first_topk) == spec
        )

    def _profile(self, path: Path, text: str, x32: dict) -> None:
        for b in self.cfg.profile_batches:
            if self._time_left() < 5.0:
                self.profiles.append({"case": self.case.key, "policy": text, "batch": b, "error": "time budget"})
                continue
            entry: dict[str, Any] = {"case": self.case.key, "policy": text, "variant": "ort_raggedvit", "batch": b}
            try:
                images = x32[b] if b in x32 else tile(x32[max(x32)], b)
                prefix = str(self.work / f"ort_profile_b{b}")
                sess = ort_run.ragged_session(path, self.cfg.device, profile_prefix=prefix)
                run, _ = ort_step(sess, images)
                warm, timed = 3, 10
                for _ in range(warm + timed):
                    self.sync()
                    run()
                self.sync()
                entry["ort"] = summarize_ort_profile(sess.end_profiling(), skip_runs=warm)
                if self.device.type == "cuda":
                    entry["gpu_kernels"] = kernel_summary(run, runs=timed)
                del sess
            except Exception as exc:  # noqa: BLE001 - recorded
                traceback.print_exc()
                entry["error"] = _short_error(exc)
            self.profiles.append(entry)
            log(f"{self.case.key} profile B={b}: {'error ' + entry['error'] if 'error' in entry else 'done'}")
        self._free()

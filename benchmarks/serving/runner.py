"""One model through every serving variant and batch: steps built per batch, timed in interleaved rounds, checked
against float32 references, profiled. Every failure becomes a record with its error text, never a crash."""

from __future__ import annotations

import copy
import gc
import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.e2e.cases import parse_policy
from benchmarks.e2e.profile import count_kernels
from benchmarks.e2e.variants import Step, torch_step
from benchmarks.serving.config import ServingConfig
from benchmarks.serving.exports import ExportJob, Exports
from benchmarks.serving.names import CUDA_ONLY, ORT, PRUNED, UNPRUNED, split_linear, timm_name
from benchmarks.serving.steps import CompiledModel, OrtExport, compiled_step, reset_dynamo
from raggedvit.images import sample_inputs, tile
from raggedvit.pruning import build_pruned_vit
from raggedvit.timing import device_sync, measure
from raggedvit.weights import load_vit

__all__ = ["ModelRun", "blank_record", "log"]

_DTYPES = {"fp16": torch.float16, "fp32": torch.float32}
Key = tuple[str, str]  # (variant, policy)


def log(msg: str) -> None:
    print(f"[serving {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")[:600]


def _tile_rows(t: torch.Tensor, batch: int) -> torch.Tensor:
    """[n, ...] -> [batch, ...] repeating the n rows in order (as raggedvit.images.tile repeats the images)."""
    reps = -(-batch // t.shape[0])
    return t.repeat(reps, *([1] * (t.dim() - 1)))[:batch]


def blank_record(model: str, variant: str, policy: str, batch: int, status: str, **fields: Any) -> dict[str, Any]:
    """One (model, variant, policy, batch) record; measured fields None until filled."""
    rec = {
        "model": model,
        "variant": variant,
        "policy": policy,
        "batch": batch,
        "status": status,
        "mode": None,
        "ms_per_batch": None,
        "img_per_s": None,
        "round_ms": None,
        "kernels_per_forward": None,
        "gpu_us_per_image": None,
        "max_abs_logit_diff": None,
        "top1_agree": None,
        "ref": None,
        "error": None,
        "note": "",
    }
    rec.update(fields)
    return rec


class ModelRun:
    """Runs every selected variant of one model; `emit(record)` receives each (model, variant, policy, batch)."""

    def __init__(
        self,
        cfg: ServingConfig,
        model: str,
        jobs: dict[str, ExportJob],
        exports: Exports,
        *,
        deadline: float,
        emit: Callable[[dict[str, Any]], None],
        info: dict[str, Any],
    ) -> None:
        self.cfg, self.model, self.jobs, self.exports = cfg, model, jobs, exports
        self.deadline, self.emit, self.info = deadline, emit, info
        self.timm_name = timm_name(model)
        self.device = torch.device(cfg.device)
        self.dtype = _DTYPES[cfg.dtype]
        self.sync = device_sync(cfg.device)
        self.cuda = self.device.type == "cuda"

    # ------------------------------------------------------------------ the keys this model records
    def keys(self) -> list[Key]:
        sel = self.cfg.variants
        keys = [(v, "none") for v in UNPRUNED if v in sel]
        return keys + [(v, p) for p in self.cfg.policies for v in PRUNED if v in sel]

    def skip_all(self, why: str, status: str = "skipped", keys: list[Key] | None = None) -> None:
        for v, p in keys if keys is not None else self.keys():
            for b in self.cfg.batches:
                self.emit(blank_record(self.model, v, p, b, status, error=why, note=why if status == "skipped" else ""))

    # ------------------------------------------------------------------ setup
    def run(self) -> None:
        try:
            with torch.inference_mode():
                self._run()
        finally:
            gc.collect()
            if self.cuda:
                torch.cuda.empty_cache()

    def _run(self) -> None:
        cfg = self.cfg
        t0 = time.perf_counter()
        vit, winfo = load_vit(self.timm_name, seed=0, model_kwargs=cfg.model_kwargs or None)
        photos = sample_inputs(vit)  # [n, 3, S, S] float32: the sample photos, as every benchmark times them
        vit_dev = copy.deepcopy(vit).to(self.device, self.dtype).eval()
        ref32 = vit.to(self.device).eval()  # float32: the logits reference
        specs = {p: parse_policy(split_linear(p)[0]) for p in cfg.policies}
        # ":linear" / ":dead-linear" policies: block GEMMs in raggedvit's ragged linear op (eager, compiled, exported)
        lin = {p: {"ragged_linear": split_linear(p)[1]} if split_linear(p)[1] else {} for p in cfg.policies}
        self.info.update(
            timm_name=self.timm_name,
            weights=winfo.to_dict(),
            images=int(photos.shape[0]),
            weight_bytes_fp16=2 * sum(p.numel() for p in vit_dev.parameters()),
        )
        x_ref = photos.to(self.device)
        self.refs: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {"none": (ref32(x_ref).float(), None)}
        for p, spec in specs.items():
            out = build_pruned_vit(ref32, spec).eval()(x_ref)
            self.refs[p] = (out.logits.float(), out.token_counts)
        self.eager: dict[Key, Any] = {("timm_eager", "none"): vit_dev}
        self.eager.update(
            {("prunedvit_eager", p): build_pruned_vit(vit_dev, s, **lin[p]).eval() for p, s in specs.items()}
        )
        self.compiled: dict[Key, CompiledModel] = {}
        if self.cuda:
            reset_dynamo()  # fresh dynamo caches per model: no recompile limit shared with the previous one
            modules = {("timm_compile", "none"): vit_dev}
            # the capacity layout: static row counts per stage, so CUDA graph trees can record every policy
            modules.update(
                {
                    ("prunedvit_compile", p): build_pruned_vit(vit_dev, s, capacity=True, **lin[p]).eval()
                    for p, s in specs.items()
                }
            )
            for key, module in modules.items():
                if key[0] in cfg.variants:
                    self.compiled[key] = CompiledModel(module, dynamic=cfg.compile_dynamic)
            self.info["compile"] = {f"{v}|{p}": m.calls for (v, p), m in self.compiled.items()}
        self.info["setup_s"] = round(time.perf_counter() - t0, 1)
        self.info["exports"] = {}
        log(f"{self.model}: models and references ready ({time.perf_counter() - t0:.0f} s)")
        for i, b in enumerate(cfg.batches):
            left = self.deadline - time.time()
            if left < 10.0:
                keys = self.keys()
                for bb in cfg.batches[i:]:
                    for v, p in keys:
                        why = "time budget exhausted before this batch"
                        self.emit(blank_record(self.model, v, p, bb, "skipped", error=why, note=why))
                return
            self._batch(b, photos)

    def _export(self, policy: str) -> dict[str, Any]:
        """The export of `policy` ("none" or a policy string), waited for on first use."""
        if policy not in self.info["exports"]:
            t0 = time.perf_counter()
            self.info["exports"][policy] = self.exports.result(self.jobs[policy])
            waited = time.perf_counter() - t0
            log(f"{self.model} [{policy}] export: {self.info['exports'][policy]} (waited {waited:.0f} s)")
        return self.info["exports"][policy]

    # ------------------------------------------------------------------ one batch size
    def _batch(self, b: int, photos: torch.Tensor) -> None:
        cfg = self.cfg
        x32 = tile(photos, b).to(self.device)
        xt = x32.to(self.dtype)
        steps: dict[Key, Step] = {}
        meta: dict[Key, dict[str, Any]] = {}
        keep: list[Any] = []  # ORT runners and sessions alive while their steps are used
        ort_last = sorted(self.keys(), key=lambda k: k[0] in ORT)  # compile while the exports finish
        for key in ort_last:
            variant, policy = key
            m = meta[key] = {"note": ""}
            if variant in CUDA_ONLY and not self.cuda:
                m["skip"] = "needs CUDA (torch.compile mode='reduce-overhead' captures CUDA graphs)"
                continue
            try:
                if key in self.eager:
                    m["mode"] = "eager"
                    steps[key] = torch_step(self.eager[key], xt)
                elif key in self.compiled:
                    cm = self.compiled[key]
                    if cm.error is not None:
                        m["error"] = f"setup: torch.compile failed {cm.error} (not retried)"
                        continue
                    m["compile"] = cm.first_call(xt, self.sync)
                    skips = sum(c["cudagraph_skips"] for c in cm.calls.values())
                    m["mode"] = "cuda_graph_trees" if skips == 0 else "inductor_no_cudagraphs"
                    steps[key] = compiled_step(cm, xt)
                else:
                    made = self._export(policy)
                    if made.get("path") is None:
                        m["error"] = f"export failed: {made.get('error')}"
                        continue
                    path, static = made["path"], bool(made.get("static_shapes"))
                    ort_run = OrtExport(path, cfg.device, b, x32, graph=self.cuda and static)
                    keep.append(ort_run)
                    m["mode"], m["ort"] = ort_run.mode, ort_run
                    if ort_run.graph_error:
                        m["note"] = f"CUDA graph failed, ran node by node: {ort_run.graph_error}"
                    elif self.cuda and not static:
                        m["note"] = "data-dependent token counts (NonZero): node by node"
                    steps[key] = ort_run.step()
            except Exception as exc:  # noqa: BLE001 - recorded
                traceback.print_exc()
                m["error"] = f"setup: {_short(exc)}"
        rounds = self._rounds(steps, meta)
        for key in self.keys():
            self._finish(key, b, steps.get(key), meta[key], rounds.get(key, []), x32)
        del steps, keep
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()

    def _rounds(self, steps: dict[Key, Step], meta: dict[Key, dict[str, Any]]) -> dict[Key, list[float]]:
        """Median ms of each step per round, steps interleaved (order reversed every other round)."""
        cfg = self.cfg
        out: dict[Key, list[float]] = {k: [] for k in steps}
        for r in range(cfg.rounds):
            order = list(steps) if r % 2 == 0 else list(reversed(steps))
            for key in order:
                if "error" in meta[key]:
                    continue
                try:
                    t = measure(
                        steps[key][0],
                        self.sync,
                        target_s=cfg.seconds,
                        warmup_s=0.0,
                        min_warmup=2,
                        min_runs=cfg.min_runs,
                    )
                    out[key].append(t.median_ms)
                    meta[key]["runs_per_round"] = t.runs
                except Exception as exc:  # noqa: BLE001 - recorded; the other variants go on
                    traceback.print_exc()
                    meta[key]["error"] = f"timing: {_short(exc)}"
        return out

    def _finish(self, key: Key, b: int, step: Step | None, m: dict[str, Any], round_ms: list[float], x32) -> None:
        variant, policy = key
        if "skip" in m:
            self.emit(blank_record(self.model, variant, policy, b, "skipped", note=m["skip"], error=m["skip"]))
            return
        rec = blank_record(self.model, variant, policy, b, "error", mode=m.get("mode"), note=m["note"])
        if "compile" in m:
            rec["compile"] = m["compile"]
        if "error" in m or step is None or not round_ms:
            rec["error"] = m.get("error", "no timing")
            self._log(rec)
            self.emit(rec)
            return
        ms = statistics.median(round_ms)
        rec.update(
            status="ok",
            ms_per_batch=round(ms, 4),
            img_per_s=round(b / ms * 1e3, 2),
            round_ms=[round(v, 4) for v in round_ms],
            runs_per_round=m.get("runs_per_round"),
        )
        try:
            rec.update(self._check(step, policy, b))
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            rec["check_error"] = _short(exc)
        if self.cuda:
            try:
                rec.update(self._profile(step, m.get("ort"), x32, b))
            except Exception as exc:  # noqa: BLE001
                traceback.print_exc()
                rec["profile_error"] = _short(exc)
        self._log(rec)
        self.emit(rec)

    # ------------------------------------------------------------------ checks and profiles
    def _check(self, step: Step, policy: str, b: int) -> dict[str, Any]:
        """Logits against the float32 reference (timm for policy none, PrunedViT otherwise), tiled to the batch;
        kept tokens against the reference's."""
        run, results = step
        run()
        self.sync()
        logits, counts = results()
        ref_logits, ref_counts = self.refs[policy]
        want = _tile_rows(ref_logits, b)
        got = logits.float().to(want.device)
        out: dict[str, Any] = {
            "ref": "timm fp32" if policy == "none" else "PrunedViT fp32",
            "max_abs_logit_diff": float((got - want).abs().max()),
            "top1_agree": float((got.argmax(-1) == want.argmax(-1)).float().mean()),
        }
        if ref_counts is not None and counts is not None:
            want_c = _tile_rows(ref_counts, b).cpu()
            got_c = counts.cpu().to(want_c.dtype)
            out["tokens_equal"] = float((got_c == want_c).all(dim=1).float().mean())
            out["mean_tokens"] = [round(v, 2) for v in got_c.float().mean(0).tolist()]
        return out

    def _profile(self, step: Step, ort_run: OrtExport | None, x32: torch.Tensor, b: int) -> dict[str, Any]:
        forwards = self.cfg.profile_forwards
        prof = count_kernels(step[0], forwards=forwards, top=self.cfg.top_kernels)
        source = "torch.profiler (CUPTI) over the timed call"
        if prof["kernels_per_forward"] == 0:
            source += "; no kernels traced (CUDA-graph replay not seen by CUPTI? try --cupti-warmup)"
        if prof["kernels_per_forward"] == 0 and ort_run is not None and ort_run.mode == "cuda_graph":
            # CUPTI may not trace replays of graphs captured before it started: count the same export's kernels
            # node by node (a replay runs the captured kernels)
            nbn, session = ort_run.node_by_node_step(x32)
            prof = count_kernels(nbn[0], forwards=forwards, top=self.cfg.top_kernels)
            source = "no kernels traced in the CUDA-graph replay; counted on a node-by-node session of the export"
            del session
        return {
            "kernels_per_forward": prof["kernels_per_forward"],
            "copies_per_forward": prof["copies_per_forward"],
            "gpu_us_per_forward": round(prof["gpu_us_per_forward"], 2),
            "gpu_us_per_image": round(prof["gpu_us_per_forward"] / b, 3),
            "kernel_source": source,
            "top_kernels": prof["top"],
        }

    def _log(self, rec: dict[str, Any]) -> None:
        head = f"{self.model} {rec['variant']} [{rec['policy']}] B={rec['batch']}"
        if rec["status"] != "ok":
            log(f"{head}: {rec['status']} {(rec['error'] or '')[:200]}")
            return
        kern = f", {rec['kernels_per_forward']:.0f} kernels" if rec.get("kernels_per_forward") is not None else ""
        diff = rec.get("max_abs_logit_diff")
        log(
            f"{head} ({rec['mode']}): {rec['img_per_s']:.1f} img/s, {rec['ms_per_batch']:.3f} ms{kern}"
            + (f", max|dlogit| {diff:.2e}" if diff is not None else "")
        )

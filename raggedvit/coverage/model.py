"""One coverage check (raggedvit.coverage): build a reduced-depth timm model, then ask the three questions.

Runs inside a child process (`python -m raggedvit.coverage.model`), so a crash or a hang costs one model, not
the run. The record is rewritten after every step: a parent that kills a hung child still reads where it was.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raggedvit.policies import get_policy

__all__ = ["MATCH_RTOL", "CHECKED_POLICIES", "check_model", "classify_names", "first_line", "reduced_model"]

MATCH_RTOL = 1e-4  # max |Δ| allowed, relative to max |reference|
SHARPEN_QK = 4.0  # q/k rows x4 (raggedvit.weights.sharpen_qk_): peaked attention, pruning decisions not ties
BATCH = 2
CHECKED_POLICIES = ("none", "topk-l2", "cls-mass")  # the policies of raggedvit.policies checked here


def first_line(e: BaseException) -> str:
    """`Type: first line of the message` (the message's first non-empty line)."""
    lines = [line for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[0].strip()}" if lines else type(e).__name__


def _specs(has_class_token: bool) -> dict[str, Any]:
    """The policies each model is checked with: none, topk-l2 keep 0.5 at block 1, cls-mass 0.9 at block 1
    when the model has a class token."""
    from raggedvit.pruning import PruneSpec

    specs = {"none": PruneSpec("none"), "topk-l2": PruneSpec("topk-l2", (1,), keep=0.5)}
    if has_class_token:
        specs["cls-mass"] = PruneSpec("cls-mass", (1,), mass=0.9)
    return specs


def _meta_model(name: str, kwargs: dict[str, Any]):
    import timm
    import torch

    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return timm.create_model(name, pretrained=False, **kwargs)


def _family(model) -> str:
    return type(model).__module__.removeprefix("timm.models.")


def _is_vit_like(model) -> bool:
    return hasattr(model, "blocks") and hasattr(model, "patch_embed")


def classify_names(names: list[str], out: Path) -> None:
    """Build each name on the meta device; append one JSON line per name to `out` (vit_like, family, class, or
    the error of the creation)."""
    with open(out, "a") as f:
        for name in names:
            row: dict[str, Any] = {"name": name}
            try:
                m = _meta_model(name, {})
                row.update(vit_like=_is_vit_like(m), family=_family(m), cls=type(m).__name__)
            except Exception as e:  # noqa: BLE001 - every failure is a result to report
                row.update(vit_like=None, error=first_line(e))
            f.write(json.dumps(row) + "\n")
            f.flush()


def _default_size(model) -> tuple[int, int]:
    """The model's input size: its patch embedding's (what PrunedViT and the export use), else its config's."""
    s = getattr(model.patch_embed, "img_size", None)
    if s is not None:
        return (int(s), int(s)) if isinstance(s, int) else (int(s[0]), int(s[1]))
    size = (getattr(model, "pretrained_cfg", None) or {}).get("input_size", (3, 224, 224))
    return int(size[-2]), int(size[-1])


def _capped_size(model, cap: int) -> tuple[int, int] | None:
    """A size at most `cap` per side (a multiple of the patch size), or None when the default already fits."""
    h, w = _default_size(model)
    if max(h, w) <= cap:
        return None
    ps = getattr(model.patch_embed, "patch_size", 1)
    ph, pw = (ps, ps) if isinstance(ps, int) else (int(ps[0]), int(ps[1]))
    return max(ph, cap // ph * ph) if h > cap else h, max(pw, cap // pw * pw) if w > cap else w


def _init_(model, seed: int) -> None:
    """Deterministic weights for a model whose storage came from to_empty: matrices and tokens N(0, 0.02²), 1-d
    gains 1, biases 0, BatchNorm statistics near (0, 1), buffers computed from the config recomputed; then the
    perturbation of raggedvit.weights (biases, norms, tokens, LayerScale) and sharpened q/k rows."""
    import torch
    from timm.models._manipulate import reinit_non_persistent_buffers
    from torch import nn

    from raggedvit.weights import perturb_biases_and_norms_, sharpen_qk_

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if p.dim() >= 2 or "token" in name or "pos_embed" in name:
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))
            elif "bias" in leaf or "beta" in leaf:
                p.zero_()
            else:  # norm weights, LayerScale gammas, other 1-d scales
                p.fill_(1.0)
        for b in model.buffers():
            if b.is_floating_point():
                b.copy_(0.02 * torch.randn(b.shape, generator=gen))
            else:
                b.zero_()
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats:  # hybrid stems
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=gen))
                m.running_var.copy_(1.0 + 0.1 * torch.rand(m.running_var.shape, generator=gen))
    reinit_non_persistent_buffers(model)  # RoPE frequencies, relative-position indices: computed from the config
    perturb_biases_and_norms_(model, seed=seed)
    sharpen_qk_(model, SHARPEN_QK)
    model.eval()


def reduced_model(
    name: str,
    *,
    depth: int,
    img_size: int,
    seed: int = 0,
    kwargs: dict[str, Any] | None = None,
    step: Callable[[str], None] = lambda stage: None,
):
    """(model, info): `name` built on the meta device, cut to its first `depth` blocks, materialised on the CPU
    with seeded weights. The model keeps its default image size unless a side exceeds `img_size` and timm
    accepts an img_size argument for it; info holds the family, class, size and whether the size was capped.
    step(stage) is called before each step ("meta build", "to_empty", "init")."""
    kwargs = dict(kwargs or {})
    step("meta build")
    model = _meta_model(name, kwargs)
    info: dict[str, Any] = {"family": _family(model), "cls": type(model).__name__}
    if not _is_vit_like(model):
        raise ValueError(f"{name} is not ViT-like (no blocks or no patch_embed)")
    size = _capped_size(model, img_size)
    if size is not None:
        try:
            model = _meta_model(name, {**kwargs, "img_size": size})
            info["size_capped"] = True
        except Exception as e:  # noqa: BLE001 - timm refuses the argument: keep the default size
            info["size_capped"] = False
            info["size_note"] = f"img_size={size[0]}x{size[1]} refused: {first_line(e)}"
    info["img_size"] = list(_default_size(model))
    blocks = model.blocks
    info["full_depth"] = len(blocks)
    model.blocks = blocks[:depth]
    step("to_empty")
    model.to_empty(device="cpu")
    step("init")
    _init_(model, seed)
    return model, info


def _compare(got, ref) -> dict[str, Any]:
    import numpy as np

    ref = np.asarray(ref, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64)
    if got.shape != ref.shape:
        return {"ok": False, "error": f"shape {list(got.shape)} != reference {list(ref.shape)}"}
    if not np.isfinite(got).all() or not np.isfinite(ref).all():
        return {"ok": False, "error": "non-finite values in the output or the reference"}
    diff, scale = float(np.abs(got - ref).max()), float(np.abs(ref).max())
    ok = diff <= MATCH_RTOL * scale
    out = {"ok": bool(ok), "max_abs_diff": diff, "max_abs_ref": scale, "rel": diff / max(scale, 1e-30)}
    if not ok:
        out["error"] = f"max |Δ| {diff:.3g} > {MATCH_RTOL:g} x max |ref| {scale:.3g}"
    return out


def _fp32_noise(vit, spec, images, got, ref32) -> dict[str, Any] | None:
    """Where ORT and PyTorch's fp32 runs differ by more than the bar: both against a float64 run of the same forward
    (timm's for policy none, PrunedViT's with the float64 attention reference otherwise). Matches when the export
    is no farther from float64 than twice PyTorch's own fp32 run; None when the float64 run keeps other counts."""
    import copy

    import numpy as np
    import torch

    from raggedvit.kernels import ragged_attention_reference
    from raggedvit.pruning import build_pruned_vit

    def attention64(qkv, cu, heads, *, scale=None, max_seqlen=None, return_cls_attn=False, **pos):
        # pos: pos_table / token_pos / grid / num_prefix of the relative-position families
        return ragged_attention_reference(qkv, cu, heads, scale=scale, return_cls_attn=return_cls_attn, **pos)

    vit64 = copy.deepcopy(vit).double()
    with torch.no_grad():
        if spec is None:
            ref64 = vit64(images.double())
        else:
            out = build_pruned_vit(vit64, spec, attention=attention64)(images.double())
            if out.token_counts.tolist() != build_pruned_vit(vit, spec)(images).token_counts.tolist():
                return None
            ref64 = out.logits
    ref64 = ref64.numpy()
    err_export = float(np.abs(np.asarray(got, np.float64) - ref64).max())
    err_torch = float(np.abs(np.asarray(ref32, np.float64) - ref64).max())
    return {"export_vs_fp64": err_export, "torch_fp32_vs_fp64": err_torch, "ok": err_export <= 2 * err_torch}


class _Record:
    """The child's result, rewritten to `path` after every step."""

    def __init__(self, data: dict[str, Any], path: Path | None) -> None:
        self.data, self.path, self.start = data, path, time.perf_counter()

    def step(self, stage: str) -> None:
        self.data["stage"] = stage
        self.save()

    def fail(self, key: str, stage: str, e: BaseException) -> None:
        self.data[key] = False
        self.data[f"{key}_error"] = f"{stage}: {first_line(e)}"
        self.keep_traceback(stage)

    def keep_traceback(self, stage: str) -> None:
        """The current exception's last frames, for the JSON details."""
        self.data.setdefault("tracebacks", {})[stage] = traceback.format_exc(limit=-12)[-4000:]

    def save(self) -> None:
        self.data["elapsed_s"] = round(time.perf_counter() - self.start, 2)
        if self.path is not None:
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps(self.data, indent=1))
            os.replace(tmp, self.path)


def check_model(
    name: str,
    *,
    depth: int = 2,
    img_size: int = 224,
    seed: int = 0,
    threads: int = 1,
    kwargs: dict[str, Any] | None = None,
    record_path: Path | None = None,
) -> dict[str, Any]:
    """The three coverage columns of one model: `runs` (check_supported passes and PrunedViT's forward runs
    for every policy), `exports` (export_onnx writes each policy's graph and ONNX Runtime loads it, CPU EP) and
    `matches` (policy none equals timm's forward; each pruning policy equals PrunedViT: token counts equal, max
    |Δ| <= MATCH_RTOL x max |reference|). A column is None when an earlier one failed; `<column>_error` holds
    the step and the first line of the exception."""
    import torch

    torch.set_num_threads(threads)
    rec = _Record({"name": name, "kwargs": kwargs or {}, "runs": None, "exports": None, "matches": None}, record_path)
    try:
        vit, info = reduced_model(name, depth=depth, img_size=img_size, seed=seed, kwargs=kwargs, step=rec.step)
        rec.data.update(info)
    except Exception as e:  # noqa: BLE001
        rec.fail("runs", rec.data["stage"], e)
        rec.data.pop("stage", None)
        rec.save()
        return rec.data
    _check_built(rec, vit, seed, threads)
    rec.data.pop("stage", None)
    rec.save()
    return rec.data


def _check_built(rec: _Record, vit, seed: int, threads: int) -> None:
    import torch

    from raggedvit.exporter import export_onnx
    from raggedvit.pruning import build_pruned_vit
    from raggedvit.pruning.families import backbone_for
    from raggedvit.runtime import create_session

    try:
        has_cls = backbone_for(vit).has_class_token
    except ValueError:
        has_cls = getattr(vit, "cls_token", None) is not None
    rec.data.update(has_class_token=has_cls, num_classes=int(getattr(vit, "num_classes", -1)))
    specs = _specs(has_cls)
    rec.data["policies"] = {p: {"spec": s.to_dict()} for p, s in specs.items()}
    h, w = rec.data["img_size"]
    images = torch.randn(BATCH, 3, h, w, generator=torch.Generator().manual_seed(seed))
    # (a) PrunedViT runs
    pruned = {}
    try:
        rec.step("check_supported")
        backbone_for(vit)
        for policy, spec in specs.items():
            rec.step(f"pruned {policy}")
            with torch.no_grad():
                pruned[policy] = build_pruned_vit(vit, spec)(images)
        rec.data["runs"] = True
    except Exception as e:  # noqa: BLE001
        rec.fail("runs", rec.data["stage"], e)
        return
    # (b) the export succeeds: written, checked, loaded by ONNX Runtime
    sessions = {}
    with tempfile.TemporaryDirectory(prefix="raggedvit-coverage-") as tmp:
        try:
            for policy, spec in specs.items():
                rec.step(f"export {policy}")
                t0 = time.perf_counter()
                path = export_onnx(vit, spec, Path(tmp) / f"{policy}.onnx", recipe={"model": rec.data["name"]})
                rec.data["policies"][policy]["export_s"] = round(time.perf_counter() - t0, 2)
                rec.step(f"ort load {policy}")
                sessions[policy] = create_session(path, "cpu", intra_op_threads=threads)
            rec.data["exports"] = True
        except Exception as e:  # noqa: BLE001
            rec.fail("exports", rec.data["stage"], e)
            return
    # (c) the export matches: none vs timm's forward, pruning policies vs PrunedViT
    try:
        rec.step("timm forward")
        with torch.no_grad():
            reference = vit(images)
        rec.data["pruned_none_vs_timm"] = _compare(pruned["none"].logits.numpy(), reference.numpy())
    except Exception as e:  # noqa: BLE001
        reference = e
        rec.keep_traceback("timm forward")
    failures = []
    for policy, session in sessions.items():
        rec.step(f"ort run {policy}")
        entry = rec.data["policies"][policy]
        try:
            outs = session.run(None, {"images": images.numpy()})
        except Exception as e:  # noqa: BLE001
            rec.keep_traceback(f"ort run {policy}")
            entry.update(ok=False, error=f"ort run: {first_line(e)}")
            failures.append(f"{policy}: {entry['error']}")
            continue
        if not get_policy(policy).prunes:
            if isinstance(reference, Exception):
                entry.update(ok=False, error=f"timm forward: {first_line(reference)}")
            else:
                entry.update(_compare(outs[0], reference.numpy()))
                ref32 = reference.numpy()
        else:
            ref = pruned[policy]
            counts, ref_counts = outs[1].tolist(), ref.token_counts.tolist()
            entry["token_counts"], entry["ref_token_counts"] = counts, ref_counts
            entry.update(_compare(outs[0], ref.logits.numpy()))
            ref32 = ref.logits.numpy()
            if counts != ref_counts:
                entry.update(ok=False, error=f"token counts {counts} != PrunedViT's {ref_counts}")
        if not entry["ok"] and "token counts" not in entry.get("error", "") and "max_abs_diff" in entry:
            try:
                rec.step(f"float64 {policy}")
                noise = _fp32_noise(vit, specs[policy] if get_policy(policy).prunes else None, images, outs[0], ref32)
            except Exception as e:  # noqa: BLE001 - the strict result stands
                noise = {"ok": False, "error": first_line(e)}
            if noise is not None:
                entry["fp32_noise"] = noise
                if noise["ok"]:
                    entry["ok"] = True
                    entry.pop("error", None)
        if not entry["ok"]:
            failures.append(f"{policy}: {entry['error']}")
    rec.data["matches"] = not failures
    if failures:
        rec.data["matches_error"] = "; ".join(failures)


def _main(argv: list[str]) -> None:
    """`python -m raggedvit.coverage.model check ARGS_JSON RECORD` or `... classify NAMES_JSON OUT`."""
    mode, args, out = argv[0], json.loads(argv[1]), Path(argv[2])
    if mode == "classify":
        classify_names(args, out)
    else:
        check_model(args.pop("name"), record_path=out, **args)


if __name__ == "__main__":
    _main(sys.argv[1:])

"""Emits the generated C++ source holding the cubins (byte arrays) and the kernel tables of cuda/launcher.h
(KernelImage: attention; LinearImage: the ragged linear kernel; SelectImage: the selection kernels; GeluImage: the
bias + GELU kernel; NormImage: the gather + LayerNorm kernel; EmbedImage: the patch embedding kernel; MergeImage: the
token merging kernel)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from raggedvit.custom_ops import _aot_embed, _aot_linear, _aot_merge, _aot_norm
from raggedvit.custom_ops._aot import AotResult

__all__ = ["build_info", "write_cubin_source"]

_KIND = {"fwd": "KernelKind::kForward", "cls": "KernelKind::kClsAttn"}
_DTYPE = {"fp32": "DType::kFloat32", "fp16": "DType::kFloat16", "bf16": "DType::kBFloat16"}
_INDEX = {"i32": "IndexType::kInt32", "i64": "IndexType::kInt64"}
# config names of _linear_config.aot_linear_configs() -> launcher.h LinearConfig (ascending tile size)
_SELECT_KERNEL = {"count": "SelectKernel::kCount", "scatter": "SelectKernel::kScatter"}
_LINEAR_CONFIG = {"small_narrow": "LinearConfig::kSmallNarrow", "small_wide": "LinearConfig::kSmallWide",
                  "large": "LinearConfig::kLarge", "xlarge": "LinearConfig::kXLarge",
                  "tma": "LinearConfig::kTma"}  # fmt: skip
_GELU_CONFIG = {"small": "GeluConfig::kSmall", "large": "GeluConfig::kLarge"}  # aot_gelu_configs() names
_EMBED_CONFIG = {"small": "EmbedConfig::kSmall", "mid": "EmbedConfig::kMid", "large": "EmbedConfig::kLarge"}


def _linear_key(r: AotResult) -> str:
    j = r.job
    return f"{j.config}/sm_{j.arch}/{j.dtype}/{j.cu_dtype}"


def linear_info(linear: Sequence[AotResult], skipped: Sequence[AotResult], rule: dict[str, int]) -> dict:
    """The ragged linear part of the build info: cubins, configs, shared memory, configs skipped per arch."""
    configs = {
        r.job.config: {k: getattr(r.job, k) for k in ("block_m", "block_n", "block_k", "group_m", "num_warps",
                                                        "num_stages", "tma", "programs_per_sm",
                                                        "epilogue_split")}
        for r in (*linear, *skipped)
    }  # fmt: skip
    return {
        "archs": sorted({r.job.arch for r in linear}),
        "dtypes": sorted({r.job.dtype for r in linear}),
        "cu_dtypes": sorted({r.job.cu_dtype for r in linear}),
        "num_cubins": len(linear),
        "cubin_bytes": sum(len(r.cubin) for r in linear),
        "rule": rule,
        "configs": configs,
        "shared_bytes": {_linear_key(r): r.shared_bytes for r in linear},
        # configs above the arch's opt-in shared memory: not shipped, the launcher falls back to a smaller one
        "skipped": {_linear_key(r): r.shared_bytes for r in skipped},
    }


def select_info(select: Sequence[AotResult]) -> dict:
    """The RaggedSelect part of the build info: archs, cubins, sort widths (WP: num_warps) and the pairwise block."""
    return {
        "archs": sorted({r.job.arch for r in select}),
        "num_cubins": len(select),
        "cubin_bytes": sum(len(r.cubin) for r in select),
        "block": sorted({r.job.block for r in select}),
        "sort_widths": {str(wp): w for wp, w in sorted({(r.job.sort_width, r.num_warps) for r in select})},
    }


def gelu_info(gelu: Sequence[AotResult]) -> dict:
    """The BiasGelu part of the build info: archs, dtypes, cubins, configs and the selection rule."""
    return {
        "archs": sorted({r.job.arch for r in gelu}),
        "dtypes": sorted({r.job.dtype for r in gelu}),
        "num_cubins": len(gelu),
        "cubin_bytes": sum(len(r.cubin) for r in gelu),
        "rule": _aot_linear.gelu_rule(),
        "configs": {r.job.config: {k: getattr(r.job, k) for k in ("block_m", "block_n", "num_warps")} for r in gelu},
    }


def norm_info(norm: Sequence[AotResult]) -> dict:
    """The GatherLayerNorm part of the build info: archs, dtypes, cu dtypes, cubins, the BLOCK_D variants and their
    configs."""
    return {
        "archs": sorted({r.job.arch for r in norm}),
        "dtypes": sorted({r.job.dtype for r in norm}),
        "cu_dtypes": sorted({r.job.cu_dtype for r in norm}),
        "num_cubins": len(norm),
        "cubin_bytes": sum(len(r.cubin) for r in norm),
        "rule": _aot_norm.norm_rule(),
        "configs": {str(r.job.block_d): {"block_r": r.job.block_r, "num_warps": r.job.num_warps} for r in norm},
    }


def embed_info(embed: Sequence[AotResult]) -> dict:
    """The PatchEmbed part of the build info: archs, image dtypes, cubins, configs, shared memory and the rule."""
    return {
        "archs": sorted({r.job.arch for r in embed}),
        "dtypes": sorted({r.job.dtype for r in embed}),
        "num_cubins": len(embed),
        "cubin_bytes": sum(len(r.cubin) for r in embed),
        "rule": _aot_embed.embed_rule(),
        "configs": {
            r.job.config: {k: getattr(r.job, k) for k in ("block_m", "block_n", "block_k", "num_warps", "num_stages")}
            for r in embed
        },  # fmt: skip
        "aligned": sorted({r.job.aligned for r in embed}),
        "shared_bytes": {
            f"{r.job.config}/sm_{r.job.arch}/{r.job.dtype}{'/aligned' if r.job.aligned else ''}": r.shared_bytes
            for r in embed
        },
    }


def merge_info(merge: Sequence[AotResult]) -> dict:
    """The RaggedMerge part of the build info: archs, dtypes, cubins, the widths (NP: num_warps), head-dim blocks and
    tiles (the rule), shared memory per variant."""
    return {
        "archs": sorted({r.job.arch for r in merge}),
        "dtypes": sorted({r.job.dtype for r in merge}),
        "num_cubins": len(merge),
        "cubin_bytes": sum(len(r.cubin) for r in merge),
        "rule": _aot_merge.merge_rule(),
        "shared_bytes": {
            f"w{r.job.width}/d{r.job.block_d}/sm_{r.job.arch}/{r.job.dtype}": r.shared_bytes for r in merge
        },
    }


def build_info(
    rows: Sequence[tuple[AotResult, int]],
    version: str,
    triton_version: str,
    linear: Sequence[AotResult] = (),
    skipped: Sequence[AotResult] = (),
    select: Sequence[AotResult] = (),
    gelu: Sequence[AotResult] = (),
    norm: Sequence[AotResult] = (),
    embed: Sequence[AotResult] = (),
    merge: Sequence[AotResult] = (),
) -> dict:
    """JSON-able summary returned by raggedvit_ort_info()['build'] (top level: attention; "linear": RaggedLinear;
    "select": RaggedSelect; "gelu": BiasGelu; "norm": GatherLayerNorm; "embed": PatchEmbed; "merge": RaggedMerge)."""
    configs: dict[str, dict] = {}
    for r, min_tokens in rows:
        j = r.job
        entry = configs.setdefault(f"{j.dtype}/d{j.block_d}/T>={min_tokens}", {})
        kind = j.kernel + ("+pos" if j.has_pos else "") + ("+key_bias" if j.has_key_bias else "")
        entry[kind] = {
            "block_m": j.block_m,
            "block_n": j.block_n,
            "num_warps": j.num_warps,
            "num_stages": j.num_stages,
        }
        entry.setdefault("shared_bytes", {})[f"{kind}/sm_{j.arch}/{j.cu_dtype}"] = r.shared_bytes
    results = list({id(r): r for r, _ in rows}.values())
    return {
        "version": version,
        "triton_version": triton_version,
        "archs": sorted({r.job.arch for r in results}),
        "dtypes": sorted({r.job.dtype for r in results}),
        "cu_dtypes": sorted({r.job.cu_dtype for r in results}),
        "head_dim_blocks": sorted({r.job.block_d for r in results}),
        "relative_position_bias": any(r.job.has_pos for r in results),
        "key_bias": any(r.job.has_key_bias for r in results),
        "min_tokens": sorted({m for _, m in rows}),
        "num_cubins": len(results),
        "num_kernel_images": len(rows),
        "cubin_bytes": sum(len(r.cubin) for r in results),
        "configs": configs,
        "linear": linear_info(linear, skipped, _aot_linear.linear_rule()),
        "select": select_info(select),
        "gelu": gelu_info(gelu),
        "norm": norm_info(norm),
        "embed": embed_info(embed),
        "merge": merge_info(merge),
    }


def _bytes_literal(data: bytes, per_line: int = 64) -> str:
    """Adjacent string literals of \\xHH escapes (compiles far faster than a brace list of integers)."""
    return "\n".join(
        '"' + "".join(f"\\x{b:02x}" for b in data[i : i + per_line]) + '"' for i in range(0, len(data), per_line)
    )


def _cpp_string(text: str) -> str:
    return 'R"RVJSON(' + text + ')RVJSON"'


def _image_table(out: list[str], name: str, rows: list[str], empty_row: str) -> None:
    """Appends `const {name}Image k{name}Images[] = {rows};` and `kNum{name}Images`. A table with no rows (a
    CPU-only build, or no kernel of that kind) holds `empty_row` instead, so the array is never empty: its arch 0
    matches no device; kNum{name}Images stays 0."""
    out.append(f"const {name}Image k{name}Images[] = {{")
    out.extend(rows or [empty_row])
    out.append("};")
    out.append(f"const size_t kNum{name}Images = {len(rows)};")


def write_cubin_source(
    path: Path,
    rows: Sequence[tuple[AotResult, int]],
    info: dict,
    linear: Sequence[AotResult] = (),
    select: Sequence[AotResult] = (),
    gelu: Sequence[AotResult] = (),
    norm: Sequence[AotResult] = (),
    embed: Sequence[AotResult] = (),
    merge: Sequence[AotResult] = (),
) -> None:
    """Writes `path`: one byte array per distinct cubin, kKernelImages (one row per (cubin, min_tokens)),
    kNumKernelImages, kLinearImages (one row per linear cubin), kNumLinearImages, the linear selection rule
    (kLinearLargeT, kLinearNarrowN), kSelectImages, kNumSelectImages, kGeluImages, kNumGeluImages, kGeluLargeM,
    kNormImages, kNumNormImages, kEmbedImages, kNumEmbedImages, kEmbedMidM, kEmbedLargeM, kMergeImages,
    kNumMergeImages and kBuildInfoJson."""
    out = [
        "// GENERATED by raggedvit/custom_ops/build.py: Triton AOT cubins of raggedvit/kernels/_kernel.py and",
        "// raggedvit/kernels/_linear_kernel.py, _select_kernel.py, _norm_kernel.py, _embed_kernel.py and",
        "// _merge_kernel.py.",
        '#include "launcher.h"',
        "",
        "namespace raggedvit::cuda {",
        "namespace {",
    ]
    index: dict[int, int] = {}
    for r in [r for r, _ in rows] + list(linear) + list(select) + list(gelu) + list(norm) + list(embed) + list(merge):
        if id(r) not in index:
            index[id(r)] = i = len(index)
            # + 1: the literal's terminating NUL (cubin_size in the table excludes it)
            out.append(f"alignas(16) const unsigned char kCubin{i}[{len(r.cubin) + 1}] =\n{_bytes_literal(r.cubin)};")
    out.append("}  // namespace\n")
    kernel_rows = []
    for r, min_tokens in rows:
        j, i = r.job, index[id(r)]
        kernel_rows.append(
            f"    {{{_KIND[j.kernel]}, {_DTYPE[j.dtype]}, {_INDEX[j.cu_dtype]}, {j.block_d}, "
            f"{'true' if j.has_pos else 'false'}, {'true' if j.has_key_bias else 'false'}, {j.arch}, {min_tokens}, "
            f'"{r.function_name}", kCubin{i}, {len(r.cubin)}, {r.shared_bytes}, {r.num_warps}, {j.block_m}, '
            f"{j.block_n}, {r.num_params}}},"
        )
    _image_table(
        out,
        "Kernel",
        kernel_rows,
        "    {KernelKind::kForward, DType::kFloat16, IndexType::kInt32, 0, false, false, 0, 0, "
        '"", nullptr, 0, 0, 0, 0, 0, 0},',
    )
    linear_rows = []
    for r in linear:
        j = r.job
        linear_rows.append(
            f"    {{{_DTYPE[j.dtype]}, {_INDEX[j.cu_dtype]}, {j.arch}, {_LINEAR_CONFIG[j.config]}, "
            f'"{r.function_name}", kCubin{index[id(r)]}, {len(r.cubin)}, {r.shared_bytes}, {r.num_warps}, '
            f"{j.block_m}, {j.block_n}, {r.num_params}, {j.block_k}, {str(j.tma).lower()}, {j.programs_per_sm}}},"
        )
    _image_table(
        out,
        "Linear",
        linear_rows,
        '    {DType::kFloat16, IndexType::kInt32, 0, LinearConfig::kSmallNarrow, "", nullptr, 0, 0, 0, 0, 0, 0, 0, '
        "false, 1},",
    )
    select_rows = [
        f'    {{{_SELECT_KERNEL[r.job.kernel]}, {r.job.arch}, "{r.function_name}", kCubin{index[id(r)]}, '
        f"{len(r.cubin)}, {r.shared_bytes}, {r.num_warps}, {r.job.sort_width}, {r.num_params}}},"
        for r in select
    ]
    _image_table(out, "Select", select_rows, '    {SelectKernel::kCount, 0, "", nullptr, 0, 0, 0, 0, 0},')
    gelu_rows = [
        f'    {{{_DTYPE[r.job.dtype]}, {r.job.arch}, {_GELU_CONFIG[r.job.config]}, "{r.function_name}", '
        f"kCubin{index[id(r)]}, {len(r.cubin)}, {r.shared_bytes}, {r.num_warps}, {r.job.block_m}, {r.job.block_n}, "
        f"{r.num_params}}},"
        for r in gelu
    ]
    _image_table(out, "Gelu", gelu_rows, '    {DType::kFloat16, 0, GeluConfig::kSmall, "", nullptr, 0, 0, 0, 0, 0, 0},')
    out.append(f"const int64_t kGeluLargeM = {_aot_linear.gelu_rule()['large_m']};")
    norm_rows = [
        f"    {{{_DTYPE[r.job.dtype]}, {_INDEX[r.job.cu_dtype]}, {r.job.arch}, {r.job.block_r}, {r.job.block_d}, "
        f'"{r.function_name}", kCubin{index[id(r)]}, {len(r.cubin)}, {r.shared_bytes}, {r.num_warps}, '
        f"{r.num_params}}},"
        for r in norm
    ]
    _image_table(out, "Norm", norm_rows, '    {DType::kFloat16, IndexType::kInt32, 0, 0, 0, "", nullptr, 0, 0, 0, 0},')
    embed_rows = [
        f"    {{{_DTYPE[r.job.dtype]}, {r.job.arch}, {_EMBED_CONFIG[r.job.config]}, "
        f'{"true" if r.job.aligned else "false"}, "{r.function_name}", '
        f"kCubin{index[id(r)]}, {len(r.cubin)}, {r.shared_bytes}, {r.num_warps}, {r.job.block_m}, {r.job.block_n}, "
        f"{r.num_params}}},"
        for r in embed
    ]
    _image_table(
        out, "Embed", embed_rows, '    {DType::kFloat32, 0, EmbedConfig::kSmall, false, "", nullptr, 0, 0, 0, 0, 0, 0},'
    )
    merge_rows = [
        f'    {{{_DTYPE[r.job.dtype]}, {r.job.arch}, {r.job.width}, {r.job.block_d}, "{r.function_name}", '
        f"kCubin{index[id(r)]}, {len(r.cubin)}, {r.shared_bytes}, {r.num_warps}, {r.num_params}}},"
        for r in merge
    ]
    _image_table(out, "Merge", merge_rows, '    {DType::kFloat16, 0, 0, 0, "", nullptr, 0, 0, 0, 0},')
    embed_rule = _aot_embed.embed_rule()
    out.append(f"const int64_t kEmbedMidM = {embed_rule['mid_m']};")
    out.append(f"const int64_t kEmbedLargeM = {embed_rule['large_m']};")
    rule = _aot_linear.linear_rule()
    out.append(f"const int64_t kLinearLargeT = {rule['large_t']};")
    out.append(f"const int64_t kLinearNarrowN = {rule['narrow_n']};")
    out.append(f"const int64_t kLinearCapacityNarrowN = {rule['capacity_narrow_n']};")
    out.append(f"const int kLinearTmaMinArch = {rule['tma_min_arch']};")
    out.append(f"const char* const kBuildInfoJson = {_cpp_string(json.dumps(info, sort_keys=True))};")
    out.append("\n}  // namespace raggedvit::cuda\n")
    path.write_text("\n".join(out))

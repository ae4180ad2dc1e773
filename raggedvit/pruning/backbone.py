"""What PrunedViT needs from one timm model family: the `Backbone` interface.

PrunedViT (packed.py) owns the pruning: the packed state, the stages, the stage diagnostics. A backbone owns
everything family-specific around it (DESIGN.md section 4): the embedding, each block on packed rows (which
may read each row's original token index: rotary rows and relative-position bias follow the kept token, never
the packed row), and the head over each image's kept rows. One backbone class per timm model class, in
`raggedvit/pruning/families/`, listed in its registry (`families.BACKBONES`, `families.backbone_for`); this module
imports no family.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar, NamedTuple

import torch
from torch import nn

from raggedvit.pruning.merge_op import MergeKeys

__all__ = ["AttentionFn", "Attended", "Backbone", "PackedState", "module_dtype"]

# Same signature and semantics as raggedvit.kernels.ragged_attention (DESIGN.md section 1):
# (qkv [T, 3*H*D], cu_seqlens [B+1], num_heads, *, scale, max_seqlen, return_cls_attn)
#   -> out [T, H*D] or (out, cls_attn [T] float32)
AttentionFn = Callable[..., "torch.Tensor | tuple[torch.Tensor, torch.Tensor]"]


def module_dtype(module: nn.Module, default: torch.dtype) -> torch.dtype:
    """The dtype of `module`'s first floating parameter (`default` for parameter-free modules).

    Export recipes (raggedvit.pruning.precision) give submodules different dtypes; the forwards cast each
    module's input to its dtype, so one forward serves fp32, fp16 and fp16-all (a same-dtype cast is no op)."""
    for p in module.parameters():
        if p.is_floating_point():
            return p.dtype
    return default


class PackedState(NamedTuple):
    """x [T, C]; cu [B+1] int64; seq_id [T] int64 (image of each row); pos [T] int64 (position within its image);
    token_index [T] int64 (original token index: prefix tokens 0..p-1, then patches in raster order; -1 for
    fused tokens)."""

    x: torch.Tensor
    cu: torch.Tensor
    seq_id: torch.Tensor
    pos: torch.Tensor
    token_index: torch.Tensor


class Attended(NamedTuple):
    """The first half of a block on packed rows: x [T, C] the residual stream after the attention (x +
    ls1(proj(attention))); cls_attn [T] float32 (each sequence's first row's attention to each row, mean over heads)
    or None; keys: where ToMe's similarity comes from (merge_op.MergeKeys: the block's qkv after q/k norm, the qkv
    bias not yet added, the head count; the merge averages the keys over heads itself) or None."""

    x: torch.Tensor
    cls_attn: torch.Tensor | None = None
    keys: MergeKeys | None = None


class Backbone:
    """A timm model seen as: embed -> blocks on packed rows -> head. Subclasses set the class attributes below
    and implement the methods; `__init__` raises ValueError (one line) for models the family cannot run.

    Attributes:
        model: the timm model (eval mode; PrunedViT registers it as a submodule, the backbone only reads it).
        num_prefix: p, leading tokens per image that no stage prunes (class / distillation / register tokens).
        has_class_token: row 0 of each image is a class token whose attention row the cls-attention policies
            (evit, cls-mass) read; False refuses those policies with a clear message.
    """

    model_classes: ClassVar[tuple[type, ...]] = ()  # the timm classes this backbone runs (and their subclasses)
    # whether `block(..., ragged_linear=True)` can run the block GEMMs with raggedvit.kernels.ragged_linear
    # (PrunedViT asks for it per block, see its `ragged_linear`; backbones without support refuse it)
    supports_ragged_linear: ClassVar[bool] = False
    # whether the backbone runs a block in two halves, `attend` then `feed_forward`, with an in-block stage between
    # them (evit's pruning: a policy whose stages run "inside" a block); backbones without them run evit without
    # fuse after the whole block and refuse fuse, saying why
    supports_halves: ClassVar[bool] = False
    # whether `attend` takes `metric` and `key_bias` (policy tome: ToMe's key similarity and proportional attention,
    # log(size)); backbones without it refuse tome, saying why
    supports_merge: ClassVar[bool] = False
    merge_refusal: ClassVar[str] = "this model family has no token merging path"

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.num_prefix = 0
        self.has_class_token = False

    @property
    def blocks(self) -> Sequence[nn.Module]:
        """The blocks a prune index counts (a stage "at i" runs before blocks[i])."""
        return self.model.blocks

    @property
    def depth(self) -> int:
        return len(self.blocks)

    @property
    def width(self) -> int:
        """C, the residual stream's width (a learned scorer's input size)."""
        return int(getattr(self.model, "embed_dim", None) or self.model.num_features)

    def tokens_per_image(self) -> int:
        """N: tokens per image entering the blocks at the model's own image size (prefix included)."""
        return int(self.model.patch_embed.num_patches) + self.num_prefix

    def stream_dtype(self, default: torch.dtype) -> torch.dtype:
        """The residual stream's dtype: the first block's norm1 (the block input's first consumer)."""
        return module_dtype(self.blocks[0].norm1, default) if len(self.blocks) else default

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """images [B, 3, H, W] -> tokens [B, N, C] (any dtype; PrunedViT casts to the stream dtype)."""
        raise NotImplementedError

    def block(
        self,
        index: int,
        state: PackedState,
        *,
        max_seqlen: int,
        return_cls_attn: bool,
        attention: AttentionFn | None,
        ragged_linear: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """blocks[index] on packed rows: state.x [T, C] -> x' [T, C] (and cls_attn [T] float32 when asked).
        ragged_linear: run the block GEMMs with the ragged linear op over the live rows [0, cu[B]) (asked only of
        backbones with supports_ragged_linear). Backbones whose `head_rows` gives rows also take `out_rows=(rows
        [R] int64, cu [B+1] int64)` (the last block only, never with return_cls_attn): every row attends as usual,
        the rest of the block runs on `rows` alone, and x' is [R, C] (cu: its images' rows).
        Backbones with supports_merge also take `key_bias` ([T] float32 added to every score of its key: ToMe's
        proportional attention, log(size)). The default runs the two halves (backbones with supports_halves)."""
        if ragged_linear:
            raise ValueError(f"{type(self).__name__} has no ragged linear path")
        att = self.attend(
            index, state, max_seqlen=max_seqlen, return_cls_attn=return_cls_attn, metric=False, attention=attention
        )
        x = self.feed_forward(index, state._replace(x=att.x))
        return (x, att.cls_attn) if return_cls_attn else x

    def attend(
        self,
        index: int,
        state: PackedState,
        *,
        max_seqlen: int,
        return_cls_attn: bool,
        metric: bool,
        attention: AttentionFn | None,
        ragged_linear: bool = False,
        key_bias: torch.Tensor | None = None,
    ) -> Attended:
        """The first half of blocks[index] (backbones with supports_halves): state.x [T, C] -> Attended: the residual
        stream after the attention [T, C], the block's cls_attn [T] float32 (return_cls_attn) and, with
        supports_merge, the block's MergeKeys (metric=True). Every row is live."""
        raise NotImplementedError

    def refuse_merge_inputs(self, metric: bool, key_bias: torch.Tensor | None, ragged_linear: bool) -> None:
        """ValueError (the family's merge refusal) when `attend` is asked for what only backbones with
        supports_merge and supports_ragged_linear give: a key metric, a key bias, the ragged linear op."""
        if metric or key_bias is not None or ragged_linear:
            raise ValueError(f"{type(self).__name__}: {self.merge_refusal}")

    def feed_forward(
        self, index: int, state: PackedState, *, ragged_linear: bool = False, dead_rows: bool = False
    ) -> torch.Tensor:
        """The second half of blocks[index]: state.x [T, C] (what an in-block stage left) -> x + MLP(x) [T, C].
        dead_rows: rows past state.cu[B] are dead (the ragged linear op does not compute them)."""
        raise NotImplementedError

    def head(self, state: PackedState, width: int) -> torch.Tensor:
        """After the last block: per-image output [B, classes] (headless: features [B, C]). width: static bound
        of every image's row count."""
        raise NotImplementedError

    def head_rows(self, state: PackedState) -> tuple[torch.Tensor, int] | None:
        """The only rows of the last block's input whose outputs the head reads, when it reads a fixed number per
        image: (rows [B*k] int64, image by image, k). PrunedViT then runs the last block past its attention on
        those rows alone (`block(..., out_rows=...)`, which such a backbone must accept) and gives `head` a state of
        k rows per image. None (the default): the head reads every row (mean / attention pooling)."""
        return None

    def half_modules(self, recipe: str) -> list[nn.Module]:
        """The submodules the export recipe `recipe` ("fp16" or "fp16-all") runs in float16
        (raggedvit.pruning.precision)."""
        if recipe == "fp16-all":
            return list(self.blocks)
        return [m for blk in self.blocks for m in (blk.attn, blk.mlp)]

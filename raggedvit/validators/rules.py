"""Pass criteria of a validation and their defaults per export dtype (DESIGN.md section 6).

- fp32 exports: max |Δlogit| < atol on every judged image (rtol 0), atol = min(0.004, FP32_LOGIT_K x the fp32
  floor's max |Δlogit| (PyTorch fp32 vs float64) + FP32_LOGIT_ATOL): set from the floor, so larger models with a
  larger fp32 error get a looser bar, never looser than the card's 0.004.
- fp16 / fp16-all exports: |Δlogit| <= atol + rtol x (the image's largest |reference logit|), atol 0.004,
  rtol 0.01 (the mixed tolerance of Polygraphy / onnxconverter-common), and a moved cls-mass cut whose reference
  margin is within the export's precision (PRECISION_TIE_ULPS fp16 ulps, relative) is a precision tie.

- every dtype, per block: an image fails when the drift of its residual stream after a block (||Δh|| / ||h|| over its
  kept rows) exceeds BLOCK_K x that block's precision floor + BLOCK_ATOL (validators/blocks.py).

No torch import: the CLI builds these before loading a reference.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from raggedvit.validators.errors import ValidationInputError

__all__ = [
    "BLOCK_ATOL",
    "BLOCK_K",
    "CARD_ATOL",
    "FP16_ULP",
    "FP32_LOGIT_ATOL",
    "FP32_LOGIT_K",
    "LOGIT_TOLERANCES",
    "PRECISION_TIE_ULPS",
    "Thresholds",
    "precision_tie_eps",
]

# export dtype -> (atol, rtol) of the default |Δlogit| rule
LOGIT_TOLERANCES: dict[str, tuple[float, float]] = {
    "fp32": (0.004, 0.0),
    "fp16": (0.004, 0.01),
    "fp16-all": (0.004, 0.01),
}
CARD_ATOL = 0.004  # the model card's |Δlogit| bar
# Per-block rule: an image fails when a block drifts over BLOCK_K x its floor + BLOCK_ATOL. k sits between the
# largest drift of a clean export and the least drift of a faulty block, relative to the floor; the absolute term
# between the largest clean fp32 drift and the least LayerNorm-eps fault (DESIGN.md section 6, docs/decisions.md).
BLOCK_K = 3.0
BLOCK_ATOL = 1e-5
# fp32 logit default: FP32_LOGIT_K x the fp32 floor's max |Δlogit| + a term above the fp32 drift that CUDA kernels
# show (docs/decisions.md, "Validation")
FP32_LOGIT_K = 4.0
FP32_LOGIT_ATOL = 1e-4
FP16_ULP = 2.0**-10  # spacing of fp16 numbers relative to the value (in [1, 2)); rounding moves a value by half that
PRECISION_TIE_ULPS = 4  # a cut margin within 4 fp16 ulps (relative) is a decision fp16 may take either way
_REDUCED = ("fp16", "fp16-all")


def precision_tie_eps(dtype: str) -> float | None:
    """Relative cut margin (cls-mass: |exclusive mass - mass| / mass) within which an export of `dtype` may move a
    cut: PRECISION_TIE_ULPS x FP16_ULP for fp16 / fp16-all, None for fp32 (a moved cut fails unless a near-tie)."""
    return PRECISION_TIE_ULPS * FP16_ULP if dtype in _REDUCED else None


@dataclass(frozen=True)
class Thresholds:
    """Pass criteria.

    Per image: max |Δlogit| < max_abs_logit when rel_logit is 0, else max |Δlogit| <= max_abs_logit + rel_logit x
    max |reference logit|; top-1 agreement >= min_top1 (fraction) over the judged images. A relative cut margin
    < tie_eps at any cut makes a near-tie (listed, not judged). precision_eps: a cut the export moved (token counts
    differ) whose reference margin is below it is a precision tie (listed, not judged); None: none.
    dtype: the export dtype whose defaults were applied; atol_default / rtol_default: max_abs_logit / rel_logit
    are that dtype's defaults (not given by the caller). logit_floor: the fp32 floor's max |Δlogit| that set an fp32
    default atol (`with_logit_floor`). block_k, block_atol: an image fails when a block's drift exceeds
    block_k x that block's floor + block_atol.
    """

    max_abs_logit: float = 0.004
    min_top1: float = 1.0
    tie_eps: float = 1e-5
    rel_logit: float = 0.0
    precision_eps: float | None = None
    dtype: str | None = None
    atol_default: bool = False
    rtol_default: bool = False
    logit_floor: float | None = None
    block_k: float = BLOCK_K
    block_atol: float = BLOCK_ATOL

    @classmethod
    def for_dtype(
        cls,
        dtype: str,
        *,
        atol: float | None = None,
        rtol: float | None = None,
        min_top1: float = 1.0,
        tie_eps: float = 1e-5,
        block_k: float | None = None,
        block_atol: float | None = None,
    ) -> Thresholds:
        """The default rule of an export `dtype` (the recipe's "dtype"); `atol` / `rtol` override its tolerances."""
        if dtype not in LOGIT_TOLERANCES:
            raise ValidationInputError(
                f"export dtype {dtype!r} has no default tolerance (expected one of {', '.join(LOGIT_TOLERANCES)})"
            )
        d_atol, d_rtol = LOGIT_TOLERANCES[dtype]
        return cls(
            max_abs_logit=d_atol if atol is None else float(atol),
            min_top1=min_top1,
            tie_eps=tie_eps,
            rel_logit=d_rtol if rtol is None else float(rtol),
            precision_eps=precision_tie_eps(dtype),
            dtype=dtype,
            atol_default=atol is None,
            rtol_default=rtol is None,
            block_k=BLOCK_K if block_k is None else float(block_k),
            block_atol=BLOCK_ATOL if block_atol is None else float(block_atol),
        )

    def with_logit_floor(self, floor_max_abs_diff: float) -> Thresholds:
        """An fp32 default atol set from the fp32 floor's max |Δlogit| (FP32_LOGIT_K x it + FP32_LOGIT_ATOL, at
        most CARD_ATOL); unchanged for other dtypes or a given atol."""
        if self.dtype != "fp32" or not self.atol_default:
            return self
        atol = min(CARD_ATOL, FP32_LOGIT_K * float(floor_max_abs_diff) + FP32_LOGIT_ATOL)
        return replace(self, max_abs_logit=atol, logit_floor=float(floor_max_abs_diff))

    def block_bar(self, floor: float) -> float:
        """The largest drift a block whose floor is `floor` may show."""
        return self.block_k * floor + self.block_atol

    def block_text(self) -> str:
        return (
            f"per block: drift ||Δh||/||h|| (kept rows) <= {self.block_k:g} x the block's {self.floor_name()} floor "
            f"+ {self.block_atol:g}"
        )

    def floor_name(self) -> str:
        return "fp16" if self.dtype in _REDUCED else "fp32"

    def bound(self, ref_max_abs_logit: float) -> float:
        """The max |Δlogit| bar of an image whose reference logits reach `ref_max_abs_logit` in magnitude."""
        return self.max_abs_logit + self.rel_logit * ref_max_abs_logit

    def passes(self, max_abs_diff: float, ref_max_abs_logit: float) -> bool:
        """The |Δlogit| criterion: strictly below an absolute bar; at most a mixed (atol + rtol) one, like allclose."""
        bar = self.bound(ref_max_abs_logit)
        return bool(max_abs_diff <= bar if self.rel_logit else max_abs_diff < bar)

    def text(self) -> str:
        """The |Δlogit| rule in words, with where atol and rtol came from."""
        rel = f" + {self.rel_logit:g} x max |reference logit|" if self.rel_logit else ""
        op = "≤" if self.rel_logit else "<"
        rule = f"max |Δlogit| {op} {self.max_abs_logit:g}{rel}"
        if self.dtype is None:
            return rule
        why = "default"
        if self.logit_floor is not None:
            why = (
                f"default: {FP32_LOGIT_K:g} x the fp32 floor {self.logit_floor:.2g} + {FP32_LOGIT_ATOL:g}, "
                f"at most the card's {CARD_ATOL:g}"
            )
        origin = [
            f"atol {self.max_abs_logit:.3g} ({why if self.atol_default else 'given'})",
            f"rtol {self.rel_logit:g} ({'default' if self.rtol_default else 'given'})",
        ]
        return f"{rule} [{', '.join(origin)} for {self.dtype} exports]"

    def tie_text(self) -> str:
        text = f"near-tie margin < {self.tie_eps:g}"
        if self.precision_eps is not None:
            eps = self.precision_eps
            text += f", precision tie: a moved cut with margin < {eps:.3g} ({eps / FP16_ULP:g} fp16 ulps)"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rule": self.text()}

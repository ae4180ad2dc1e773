"""Pass criteria of a validation and their defaults per export dtype (DESIGN.md section 6).

- fp32 exports: max |Δlogit| < atol = 0.004 on every judged image (rtol 0).
- fp16 / fp16-all exports: |Δlogit| <= atol + rtol x (the image's largest |reference logit|), atol 0.004,
  rtol 0.01 (the mixed tolerance of Polygraphy / onnxconverter-common), and a moved cls-mass cut whose reference
  margin is within the export's precision (PRECISION_TIE_ULPS fp16 ulps, relative) is a precision tie.

No torch import: the CLI builds these before loading a reference.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from raggedvit.validators.errors import ValidationInputError

__all__ = ["FP16_ULP", "LOGIT_TOLERANCES", "PRECISION_TIE_ULPS", "Thresholds", "precision_tie_eps"]

# export dtype -> (atol, rtol) of the default |Δlogit| rule
LOGIT_TOLERANCES: dict[str, tuple[float, float]] = {
    "fp32": (0.004, 0.0),
    "fp16": (0.004, 0.01),
    "fp16-all": (0.004, 0.01),
}
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
    are that dtype's defaults (not given by the caller).
    """

    max_abs_logit: float = 0.004
    min_top1: float = 1.0
    tie_eps: float = 1e-5
    rel_logit: float = 0.0
    precision_eps: float | None = None
    dtype: str | None = None
    atol_default: bool = False
    rtol_default: bool = False

    @classmethod
    def for_dtype(
        cls,
        dtype: str,
        *,
        atol: float | None = None,
        rtol: float | None = None,
        min_top1: float = 1.0,
        tie_eps: float = 1e-5,
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
        )

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
        origin = [
            f"atol {self.max_abs_logit:g} ({'default' if self.atol_default else 'given'})",
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

"""Relative position bias cases of the RaggedAttention fuzz (`fuzz.cases`): drawing the attributes grid_h,
grid_w, num_prefix and the inputs pos_table / token_pos (valid, or broken in one way), the op's contract for them
(written independently of the C++ checks), and the token_pos values (out-of-range ones are valid: class rows)."""

from __future__ import annotations

import dataclasses
import math
import random
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from fuzz.cases import Case

__all__ = ["draw_pos", "pos_attr_error", "pos_input_error", "token_pos"]

INT64_MAX = 2**63 - 1
_TORCH_INT = {"int32": torch.int32, "int64": torch.int64}
GRID_ATTRS = (1, 2, 3, 5, 14)
CRAFTED_GRID_ATTRS = (0, -1, 2**31, 2**62, 2.0)  # 0: no grid (refused with a table); 2.0 is a float
CRAFTED_NUM_PREFIX = (-1, 2**62, 1.0)
BAD_TABLE = ("rows", "cols", "flat", "scalar", "type")
BAD_TOKEN_POS = ("long", "short", "rank2", "type", "alone")


def draw_pos(rng: random.Random, c: Case) -> Case:
    """The case with relative position attributes and (mostly) inputs: valid, or broken in one way."""
    gh, gw = rng.choice(GRID_ATTRS), rng.choice(GRID_ATTRS)
    p = rng.choice((0, 1, 1, 2))
    r = rng.random()
    if r < 0.06:
        gh = rng.choice(CRAFTED_GRID_ATTRS)
    elif r < 0.12:
        gw = rng.choice(CRAFTED_GRID_ATTRS)
    elif r < 0.16:
        p = rng.choice(CRAFTED_NUM_PREFIX)
    elif r < 0.19:
        gh, gw, p = None, None, None  # no attributes at all
    H = c.num_heads if isinstance(c.num_heads, int) and 0 < c.num_heads <= 6 else 2
    R = (2 * gh - 1) * (2 * gw - 1) + 3 if all(isinstance(g, int) and 0 < g < 100 for g in (gh, gw)) else 7
    T = c.qkv_shape[0] if len(c.qkv_shape) == 2 else 5
    table_elem, table_shape = "float", (H, R)
    tp_elem, tp_shape = c.cu_elem if c.cu_elem in ("int32", "int64") else "int64", (T,)
    r = rng.random()
    if r < 0.1:  # attributes only (a node without the inputs)
        table_elem = table_shape = tp_elem = tp_shape = None
    elif r < 0.2:
        bad = rng.choice(BAD_TABLE)
        if bad == "type":
            table_elem = rng.choice(("float16", "double"))
        else:
            table_shape = {"rows": (H + 1, R), "cols": (H, R + rng.choice((-1, 1))), "flat": (H * R,), "scalar": ()}[
                bad
            ]
    elif r < 0.3:
        bad = rng.choice(BAD_TOKEN_POS)
        if bad == "type":
            tp_elem = "int32" if tp_elem == "int64" else "int64"
        elif bad == "alone":
            table_elem = table_shape = None
        else:
            tp_shape = {"long": (T + 1,), "short": (max(T - 1, 0),), "rank2": (T, 1)}[bad]
    elif r < 0.33:
        tp_elem = tp_shape = None  # pos_table alone
    return dataclasses.replace(
        c,
        grid_h=gh,
        grid_w=gw,
        num_prefix=p,
        pos_table_elem=table_elem,
        pos_table_shape=table_shape,
        token_pos_elem=tp_elem,
        token_pos_shape=tp_shape,
        token_pos_odd=rng.choice((0.0, 0.0, 0.1, 0.5, 1.0)),
    )


def pos_attr_error(c: Case) -> str | None:
    """Why the grid attributes alone make the node invalid (they are read whether or not the inputs are given)."""
    for name in ("grid_h", "grid_w", "num_prefix"):
        v = getattr(c, name)
        if v is not None and (not isinstance(v, int) or v < 0):
            return f"pos attributes: {name} = {v!r}"
    gh, gw, p = c.grid_h or 0, c.grid_w or 0, c.num_prefix or 0
    if gh > 0 and gw > 0 and ((2 * gh - 1) * (2 * gw - 1) + 3 > INT64_MAX or gh * gw + p > INT64_MAX):
        return f"pos attributes: grid {gh}x{gw} (num_prefix {p}) overflows int64"
    return None


def pos_input_error(c: Case, T: int) -> str | None:
    """Why the pos inputs make a call invalid (None without them or when they fit)."""
    if c.pos_table_elem is None and c.token_pos_elem is None:
        return None
    if (c.pos_table_elem is None) != (c.token_pos_elem is None):
        return "pos_table: one of pos_table / token_pos alone"
    if c.pos_table_elem != "float":
        return f"pos_table: type {c.pos_table_elem}"
    if c.token_pos_elem != c.cu_elem:
        return f"token_pos: type {c.token_pos_elem} vs cu_seqlens {c.cu_elem}"
    gh, gw = c.grid_h or 0, c.grid_w or 0
    if gh < 1 or gw < 1:
        return f"pos attributes: grid {c.grid_h}x{c.grid_w} with a table"
    if c.pos_table_shape != (c.num_heads, (2 * gh - 1) * (2 * gw - 1) + 3):
        return f"pos_table: shape {c.pos_table_shape}"
    if c.token_pos_shape != (T,):
        return f"token_pos: shape {c.token_pos_shape} vs T = {T}"
    return None


def token_pos(c: Case, gen: torch.Generator) -> torch.Tensor:
    """token_pos of the case's shape: in-grid values (prefix, then patches), `token_pos_odd` of them out of range."""
    n = math.prod(c.token_pos_shape)
    gh, gw, p = (v if isinstance(v, int) and 0 <= v < 2**20 else 1 for v in (c.grid_h, c.grid_w, c.num_prefix))
    values = torch.randint(0, max(p + gh * gw, 1), (n,), generator=gen)
    info = torch.iinfo(_TORCH_INT[c.token_pos_elem])
    odd = torch.tensor([-1, p + gh * gw, p + gh * gw + 7, info.max, info.min, -(2**20)])
    pick = torch.rand(n, generator=gen) < c.token_pos_odd
    values[pick] = odd[torch.randint(0, len(odd), (int(pick.sum()),), generator=gen)]
    return values.to(_TORCH_INT[c.token_pos_elem]).reshape(c.token_pos_shape)

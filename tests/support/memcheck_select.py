"""RaggedSelect calls of the torch-free CUDA-EP fuzz (tests/custom_ops/memcheck_ort_fuzz.py): numpy, onnx and
onnxruntime only. `select_rows_numpy` is the op's math written again in numpy, with cu clamped as the device
kernels clamp it (`_select_kernel._image`); on a cu that the CPU EP accepts it is the CPU EP's result too
(DESIGN.md section 3).

Each call draws B (up to 70: more than one 64-image chunk of `_select_scatter`), rows per image (0 and <= p
included), cu[0] > 0 at times, dead rows past cu[B] (NaN: never read) and uses one of a few attribute sets (width,
bound <= width, num_prefix, policy, keep, mass) drawn at the start. Kinds:
- valid: a cu the CPU EP accepts; every EP given must equal the oracle.
- clamped: cu decreasing, past T, negative, an image wider than width, or an int64 extreme; the CUDA EP clamps
  (equal to the oracle), the CPU EP must refuse.
- bad_attr: a session whose attributes the op must refuse (width < 1, bound outside [0, width], num_prefix < 0,
  policy not 0 / 1, keep or mass not finite or an int, width as a float, width past the kernels' int32 sizes or
  B * width past int64) or whose inputs have another element type.
- bad_shape: scores [T, 1], cu [1, B+1] or cu [1] (B = 0).
Count-policy scores have ties (multiples of 1/7, -0 and +0; k does not depend on them); mass-policy scores are
continuous (in [0.25, 1.25]: no share below the summation error) and redrawn while an exclusive mass lies within
MASS_MARGIN of `mass`, so float summation order (CUDA: float32 in tile order; CPU EP: double) cannot change k and
the outputs must match exactly.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

__all__ = ["SELECT_KINDS", "SelectCalls", "select_model_bytes", "select_rows_numpy"]

SELECT_OUTPUTS = ("src", "cu_new", "seq_id", "pos", "k")
SELECT_KINDS = ("valid",) * 5 + ("clamped",) * 3 + ("bad_attr", "bad_shape")
MASS_MARGIN = 4e-5  # above the float32 error bound of a sum of <= 300 shares of total 1: (n - 1) * 2**-24
_BAD_ATTRS = (  # (attribute overrides, CUDA only: the CPU EP would allocate B * width slots first)
    ({"width": 0}, False), ({"width": -3}, False), ({"bound": -1}, False), ({"bound": "width+1"}, False),
    ({"num_prefix": -1}, False), ({"policy": 2}, False), ({"policy": -1}, False), ({"keep": float("inf")}, False),
    ({"mass": float("nan")}, False), ({"keep": 1}, False), ({"width": 7.0}, False), ({"width": 2**62}, False),
    ({"width": 2**31, "bound": 1}, True), ({"elem": TensorProto.INT32}, False),
)  # fmt: skip


def select_model_bytes(attrs: dict, cu_elem: int = TensorProto.INT64) -> bytes:
    """One RaggedSelect node (attributes as typed), inputs declared without a shape: scores [T] float, cu [B+1]."""
    node = helper.make_node("RaggedSelect", ["scores", "cu"], list(SELECT_OUTPUTS), domain="com.raggedvit", **attrs)
    graph = helper.make_graph(
        [node], "memcheck_select",
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("cu", cu_elem, None)],
        [helper.make_tensor_value_info(n, TensorProto.INT64, None) for n in SELECT_OUTPUTS],
    )  # fmt: skip
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.raggedvit", 1)])
    m.ir_version = 10
    return m.SerializeToString()


def select_rows_numpy(scores: np.ndarray, cu: np.ndarray, a: dict) -> tuple[list[np.ndarray], float, np.ndarray]:
    """([src, cu_new, seq_id, pos, k], mass margin, rows read [T] bool) of RaggedSelect with attributes `a`.

    margin: the smallest |exclusive mass - mass| (float64) over patch slots with a slot ahead of them (inf for the
    count policy): below MASS_MARGIN, float summation order may decide k."""
    T, B, W, p = len(scores), len(cu) - 1, a["width"], a["num_prefix"]
    keep_all, src_all, pos_all, ks, margin = [], [], [], [], np.inf
    read = np.zeros(T, bool)
    for b in range(B):
        lo = min(max(int(cu[b]), 0), T)
        hi = min(max(int(cu[b + 1]), lo), T)
        n = min(hi - lo, W)
        read[lo + min(p, n) : lo + n] = True
        patches = n - p
        s = scores[lo + min(p, n) : lo + n].astype(np.float32) + np.float32(0)  # -0 -> +0
        order = np.argsort(-s, kind="stable")  # descending, ties: lower slot first
        if a["policy"] == 0:
            k = int(np.ceil(np.float32(patches) * np.float32(a["keep"])))
        else:
            v = s[order].astype(np.float64)
            share = v / max(v.sum(), 1e-30)
            excl = np.cumsum(share) - share
            k = int((excl < float(np.float32(a["mass"]))).sum())
            if len(excl) > 1:
                margin = min(margin, float(np.abs(excl[1:] - float(np.float32(a["mass"]))).min()))
        k = min(max(k, 1), patches)
        rank = np.empty(len(s), np.int64)
        rank[order] = np.arange(len(s))
        keep = np.zeros(W, bool)
        keep[: min(n, p)] = True
        keep[min(p, n) : n] = rank < k
        keep_all.append(keep)
        src_all.append(np.where(np.arange(W) < n, lo + np.arange(W), 0))
        pos_all.append(np.maximum(np.cumsum(keep) - 1, 0))
        ks.append(k)
    keep, src, pos = np.concatenate(keep_all), np.concatenate(src_all), np.concatenate(pos_all)
    seq = np.repeat(np.arange(B), W)
    dest = np.concatenate([np.flatnonzero(keep), np.flatnonzero(~keep)])[: B * a["bound"]]
    cu_new = np.concatenate([[0], np.cumsum([int(k.sum()) for k in keep_all])])
    outs = [src[dest], cu_new, seq[dest], pos[dest], np.array(ks)]
    return [o.astype(np.int64) for o in outs], margin, read


class SelectCalls:
    """Seeded RaggedSelect calls on `eps` ("cuda" and / or "cpu"): `call()` -> (kind, unexpected error or None)."""

    def __init__(self, rng: np.random.Generator, eps: tuple[str, ...], create_session, pool: int = 12):
        self.rng, self.eps, self.create = rng, eps, create_session
        self.attrs = [self._draw_attrs() for _ in range(pool)]
        self.sessions: dict[int, dict] = {}

    def _draw_attrs(self) -> dict:
        r = self.rng
        width = int(r.choice((1, 2, 7, 64, 65, 130, 197, 300)))
        bound = width if r.random() < 0.4 else int(r.integers(0, width + 1))
        return {"width": width, "bound": bound, "num_prefix": int(r.choice((0, 1, 1, 2, 5))),
                "policy": int(r.integers(0, 2)), "keep": float(r.choice((0.1, 0.5, 0.7, 0.99, 1.0))),
                "mass": float(r.choice((0.0, 0.5, 0.8, 0.9, 1.0)))}  # fmt: skip

    def _session(self, i: int) -> dict:
        if i not in self.sessions:
            model = select_model_bytes(self.attrs[i])
            self.sessions[i] = {ep: self.create(model, ep) for ep in self.eps}
        return self.sessions[i]

    def _inputs(self, a: dict, kind: str) -> tuple[np.ndarray, np.ndarray, dict]:
        r, W, p = self.rng, a["width"], a["num_prefix"]
        B = int(r.choice((1, 2, 3, 8, 17, 70)))
        counts = r.integers(min(p + 1, W), W + 1, B)
        few = r.random(B) < 0.1  # empty images and images of prefix rows only
        counts[few] = r.integers(0, min(p, W) + 1, int(few.sum()))
        brk = str(r.choice(("decreasing", "past_t", "negative", "too_long", "extreme"))) if kind == "clamped" else ""
        if brk == "too_long":
            counts[r.integers(0, B)] = W + int(r.integers(1, 9))
        first = int(r.integers(1, 5)) if r.random() < 0.2 else 0
        cu = np.concatenate([[first], first + np.cumsum(counts)]).astype(np.int64)
        T = int(cu[-1]) + int(r.choice((0, 0, 3, 40)))
        if brk == "decreasing":
            b = int(r.integers(0, B))
            cu[b + 1] = cu[b] - int(r.integers(1, 6))
        elif brk == "past_t":
            cu[r.integers(1, B + 1)] = T + int(r.integers(1, 1000))
        elif brk == "negative":
            cu[r.integers(0, B + 1)] = -int(r.integers(1, 1000))
        elif brk == "extreme":
            cu[r.integers(0, B + 1)] = np.iinfo(np.int64).max if r.random() < 0.5 else np.iinfo(np.int64).min
        for _ in range(100):  # mass: redraw until no exclusive mass is within MASS_MARGIN of the threshold
            if a["policy"] == 0:
                scores = (r.integers(-3, 4, T) / 7.0).astype(np.float32)
                scores[(scores == 0) & (r.random(T) < 0.5)] = -0.0
            else:
                scores = r.uniform(0.25, 1.25, T).astype(np.float32)
            want, margin, read = select_rows_numpy(scores, cu, a)
            if margin >= MASS_MARGIN:
                break
        scores[~read] = np.nan  # rows no image reads (dead rows, rows before cu[0], prefix rows)
        return scores, cu, {"want": want, "brk": brk}

    def call(self) -> tuple[str, str | None]:
        kind = str(self.rng.choice(SELECT_KINDS))
        i = int(self.rng.integers(0, len(self.attrs)))
        a = self.attrs[i]
        if kind == "bad_attr":
            return kind, self._bad_attr(a)
        scores, cu, info = self._inputs(a, kind)
        feeds = {"scores": scores, "cu": cu}
        if kind == "bad_shape":
            feeds = [{"scores": scores[:, None], "cu": cu}, {"scores": scores, "cu": cu[None]},
                     {"scores": scores, "cu": cu[:1]}][int(self.rng.integers(0, 3))]  # fmt: skip
        for ep, sess in self._session(i).items():
            refuse = kind == "bad_shape" or (kind == "clamped" and ep == "cpu")
            try:
                got = sess.run(None, feeds)
            except Exception as e:  # noqa: BLE001 - an error status is the expected outcome of invalid input
                if not refuse:
                    return kind, f"{ep}: refused ({str(e).splitlines()[0][:160]}); {_where(a, cu, scores)}"
                continue
            if refuse:
                return kind, f"{ep}: accepted {info['brk'] or kind} input; {_where(a, cu, scores)}"
            for name, g, w in zip(SELECT_OUTPUTS, got, info["want"]):
                if g.shape != w.shape or not np.array_equal(g, w):
                    return kind, f"{ep}: {name} differs from the numpy oracle; {_where(a, cu, scores)}"
        return kind, None

    def _bad_attr(self, a: dict) -> str | None:
        over, cuda_only = _BAD_ATTRS[int(self.rng.integers(0, len(_BAD_ATTRS)))]
        attrs = dict(a)
        attrs.update({k: (a["width"] + 1 if v == "width+1" else v) for k, v in over.items() if k != "elem"})
        cu_elem = over.get("elem", TensorProto.INT64)
        B = 3 if attrs["width"] == 2**62 else 1
        feeds = {"scores": np.ones(4, np.float32), "cu": np.array([0] + [4] * B, np.int64)}
        if cu_elem != TensorProto.INT64:
            feeds["cu"] = feeds["cu"].astype(np.int32)
        for ep in self.eps:
            if cuda_only and ep != "cuda":
                continue
            try:
                self.create(select_model_bytes(attrs, cu_elem), ep).run(None, feeds)
            except Exception:  # noqa: BLE001, S112 - refused when the session is created or run: expected
                continue
            return f"{ep}: accepted attributes {over} (of {a})"
        return None


def _where(a: dict, cu: np.ndarray, scores: np.ndarray) -> str:
    cu_text = cu.tolist() if cu.size <= 20 else f"{cu[:10].tolist()}...{cu[-3:].tolist()}"
    return f"attributes {a}, cu {cu_text}, T={len(scores)}"

"""com.raggedvit::RaggedMerge: CPU EP vs the one definition (merge_tokens_reference), the tie rules, determinism and
error statuses."""

from __future__ import annotations

import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto

from raggedvit.pruning.merge import merge_tokens_reference, merge_widths, merged_count
from raggedvit.runtime import create_session, run_with_iobinding
from tests.support.merge_cases import MERGE_CASES, MergeCase, make_merge_inputs, merge_attrs
from tests.support.ort_models import DTYPES, MERGE_OUTPUTS, merge_model


def run(
    inputs: dict[str, torch.Tensor | None], attrs: dict[str, int | float], threads: int = 1, **model_kw
) -> list[torch.Tensor]:
    """One RaggedMerge node on the CPU EP (absent optional inputs: None). bfloat16 runs into preallocated outputs
    (numpy has no bfloat16), the other types into outputs ORT allocates (so that bad shapes reach the op)."""
    given = {k: v for k, v in inputs.items() if v is not None}
    elem = model_kw.pop("elem", DTYPES.get(inputs["x"].dtype, TensorProto.DOUBLE))
    present = {name: name in given for name in ("qkv_bias", "size", "skip", "skip_bias")}
    model = merge_model(elem, attrs, **present, **model_kw)
    sess = create_session(model, "cpu", intra_op_threads=threads)
    if inputs["x"].dtype != torch.bfloat16:
        return [torch.from_numpy(o.numpy()) for o in run_with_iobinding(sess, given, output_device="cpu")]
    (T, C), B = inputs["x"].shape, inputs["cu"].shape[0] - 1
    n, p = T // B, int(attrs["num_prefix"])
    rows, a_rows = B * (n - merged_count(n, p, int(attrs["r"]))), B * merge_widths(n, p)[0]
    i64, f32 = torch.int64, torch.float32
    outs = dict(zip(MERGE_OUTPUTS, (torch.empty(rows, C, dtype=torch.bfloat16), torch.empty(rows),
                                    torch.empty(B + 1, dtype=i64), torch.empty(rows, dtype=i64),
                                    torch.empty(rows, dtype=f32), torch.empty(a_rows, dtype=f32))))  # fmt: skip
    run_with_iobinding(sess, given, outs)
    return list(outs.values())


def reference(inputs: dict[str, torch.Tensor | None], attrs: dict[str, int]) -> list[torch.Tensor]:
    tensors = (inputs[name] for name in ("x", "qkv", "qkv_bias", "size", "cu"))
    heads, p, r, class_token = (attrs[name] for name in ("num_heads", "num_prefix", "r", "class_token"))
    skip = {name: inputs.get(name) for name in ("skip", "skip_bias")}
    return list(merge_tokens_reference(*tensors, heads, p, r, bool(class_token), **skip))


def assert_merge_equal(got: list[torch.Tensor], ref: list[torch.Tensor], *, exact_scores: bool = False) -> None:
    """x_out within float32 rounding of the sums (float16 / bfloat16: one unit in the last place of x's type);
    size_out, cu_out and src exact; key_bias (std::log vs torch.log) and score within 1e-6 (score exact with
    exact_scores)."""
    x, ref_x = got[0], ref[0]
    assert x.dtype == ref_x.dtype and x.shape == ref_x.shape
    if x.dtype == torch.float32:
        torch.testing.assert_close(x, ref_x, rtol=1e-6, atol=1e-6)
    else:  # rounded once from float32 sums in another order: at most one step of x's type apart
        ulp = torch.finfo(x.dtype).eps * ref_x.float().abs().clamp_min(torch.finfo(x.dtype).tiny)
        assert bool(((x.float() - ref_x.float()).abs() <= ulp).all()), (x.float() - ref_x.float()).abs().max()
    for name, g, r in zip(MERGE_OUTPUTS[1:4], got[1:4], ref[1:4]):
        assert g.dtype == r.dtype, name
        torch.testing.assert_close(g, r, rtol=0, atol=0, msg=name)
    torch.testing.assert_close(got[4], ref[4], rtol=1e-6, atol=1e-6, msg="key_bias")
    tol = 0 if exact_scores else 1e-6
    torch.testing.assert_close(got[5], ref[5], rtol=tol, atol=tol, msg="score")


@pytest.mark.parametrize("case", MERGE_CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("class_token", [True, False], ids=["cls", "no-cls"])
@pytest.mark.parametrize(("bias", "size"), [(True, True), (False, False), (True, False), (False, True)],
                         ids=["bias-size", "plain", "bias", "size"])  # fmt: skip
def test_cpu_ep_equals_reference(ort_library, case: MergeCase, class_token, bias, size):
    inputs = make_merge_inputs(case, seed=len(case.name), bias=bias, size=size)
    attrs = merge_attrs(case, class_token)
    assert_merge_equal(run(inputs, attrs), reference(inputs, attrs), exact_scores=case.ties)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", [MERGE_CASES[0], MERGE_CASES[3], MERGE_CASES[-1]], ids=lambda c: c.name)
def test_half_precision_equals_reference_on_the_same_inputs(ort_library, dtype, case):
    """float16 / bfloat16 x, qkv, qkv_bias: the reference run on the same half-precision inputs (metric and sums in
    float32, x_out rounded once): x_out within one step of the type, sizes and src exact."""
    inputs = make_merge_inputs(case, seed=3, dtype=dtype)
    for class_token in (True, False):
        attrs = merge_attrs(case, class_token)
        assert_merge_equal(run(inputs, attrs), reference(inputs, attrs), exact_scores=case.ties)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("skip_bias", [True, False], ids=["skip-bias", "skip"])
@pytest.mark.parametrize("case", [MERGE_CASES[0], MERGE_CASES[4], MERGE_CASES[13]], ids=lambda c: c.name)
def test_skip_inputs_equal_the_reference(ort_library, dtype, skip_bias, case):
    """skip (and skip_bias): the rows merged are x + (skip + skip_bias), each sum rounded to x's type
    (merge.residual_rows), prefix and kept rows copied from that sum."""
    inputs = make_merge_inputs(case, seed=7, dtype=dtype, skip=True, skip_bias=skip_bias)
    for class_token in (True, False):
        attrs = merge_attrs(case, class_token)
        assert_merge_equal(run(inputs, attrs), reference(inputs, attrs), exact_scores=case.ties)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("skip_bias", [True, False], ids=["skip-bias", "skip"])
def test_skip_inputs_give_the_bits_of_the_adds_they_replace(ort_library, dtype, skip_bias):
    """The exporter's merge_residual folds Add(x, Add(skip, skip_bias)) into the node. float32: both graphs give the
    same bits on the CPU EP. float16: the op rounds each sum to float16, as the CUDA EP's float16 Adds do; the CPU
    EP has no float16 Add and runs the pair in float32 between Casts it inserts (one rounding), so x_out differs there
    by float16 rounding (sizes, src and the decisions, which read qkv only, are the same bits)."""
    case = MERGE_CASES[0]
    inputs = make_merge_inputs(case, seed=8, dtype=dtype, skip=True, skip_bias=skip_bias)
    attrs = merge_attrs(case, True)
    fused, unfused = run(inputs, attrs), run(inputs, attrs, adds=True)
    exact = MERGE_OUTPUTS if dtype == torch.float32 else MERGE_OUTPUTS[1:]
    for name, a, b in zip(MERGE_OUTPUTS, fused, unfused):
        if name in exact:
            assert a.numpy().tobytes() == b.numpy().tobytes(), name
        else:
            torch.testing.assert_close(a.float(), b.float(), rtol=2e-3, atol=2e-3)


def test_the_tie_rules_by_hand(ort_library):
    """Every key equal: each A row's best B row is B 0 (the lowest index), the A rows sort in index order (stable),
    so the first r merge into B 0; n = 7, p = 1: A = positions 2, 4, 6, B = 1, 3, 5."""
    n, H, Dh, C = 7, 2, 4, 3
    x = torch.arange(n * C, dtype=torch.float32).reshape(n, C)
    qkv = torch.ones(n, 3 * H * Dh)
    inputs = {"x": x, "qkv": qkv, "qkv_bias": None, "size": None, "cu": torch.tensor([0, n])}
    for class_token, kept in ((1, [6]), (0, [6])):
        x_out, size_out, cu_out, src, key_bias, score = run(
            inputs, {"num_heads": H, "num_prefix": 1, "r": 2, "class_token": class_token}
        )
        assert src.tolist() == [0, *kept, 1, 3, 5]
        assert size_out.tolist() == [1, 1, 3, 1, 1] and cu_out.tolist() == [0, 5]
        torch.testing.assert_close(x_out[2], (x[1] + x[2] + x[4]) / 3, rtol=1e-6, atol=0)
        assert score.tolist() == [1.0, 1.0, 1.0]
        torch.testing.assert_close(key_bias, torch.log(size_out))
    # A 1 (position 4) the least similar: A 0 and A 2 merge (most similar first), A 1 stays
    qkv[4, H * Dh : 2 * H * Dh] = torch.tensor([1.0, -1.0, 1.0, -1.0] * H)
    for class_token in (1, 0):
        src = run(inputs, {"num_heads": H, "num_prefix": 1, "r": 2, "class_token": class_token})[3]
        assert src.tolist() == [0, 4, 1, 3, 5]


def test_kept_rows_without_a_class_token_stay_in_the_matching_order(ort_library):
    """class_token 0: the kept A rows in descending-score order (ToMe's), with a class token in position order."""
    case = MERGE_CASES[2]
    inputs = make_merge_inputs(case, seed=5)
    got_cls = run(inputs, merge_attrs(case, True))[3].reshape(case.B, -1)
    got = run(inputs, merge_attrs(case, False))[3].reshape(case.B, -1)
    kept = slice(case.num_prefix, case.num_prefix + (case.n + 1) // 2 - case.r)
    assert bool((got_cls[:, kept].diff(dim=1) > 0).all())
    assert not bool((got[:, kept].diff(dim=1) > 0).all())
    assert torch.equal(got[:, kept].sort(dim=1).values, got_cls[:, kept])


def test_deterministic_bits(ort_library):
    """Same input, same bits: two runs and one and two intra-op threads (one task per image, sums in merge order)."""
    case = MERGE_CASES[0]
    inputs = make_merge_inputs(case, seed=11)
    attrs = merge_attrs(case, True)
    first = run(inputs, attrs, threads=1)
    for threads in (1, 2):
        again = run(inputs, attrs, threads=threads)
        for name, a, b in zip(MERGE_OUTPUTS, first, again):
            assert a.numpy().tobytes() == b.numpy().tobytes(), name


def test_real_sizes_and_merged_sums(ort_library):
    """Sizes > 1 (as after earlier merges) weight the average: one B row receiving several A rows."""
    case = MergeCase("many-into-one", 2, 9, 1, 4, 5, 1, 4, ties=True)
    inputs = make_merge_inputs(case, seed=0)
    inputs["qkv"][:, 4:8] = 1.0  # every key equal: A rows 0..3 all merge into B 0
    attrs = merge_attrs(case, True)
    got, ref = run(inputs, attrs), reference(inputs, attrs)
    assert_merge_equal(got, ref, exact_scores=True)
    x, size = inputs["x"][:9], inputs["size"][:9]
    rows = [1, 2, 4, 6, 8]  # B 0 and A 0..3
    want = (x[rows] * size[rows, None]).sum(0) / size[rows].sum()
    torch.testing.assert_close(got[0][1], want, rtol=1e-6, atol=1e-6)
    assert float(got[1][1]) == float(size[rows].sum())


def test_nan_keys_are_ordered_as_the_reference(ort_library):
    """A NaN in a key makes its cosines NaN: torch.max picks a NaN as the best, torch.sort puts NaN scores first; the
    op orders them the same way (a permutation, no broken sort)."""
    case = MERGE_CASES[2]
    inputs = make_merge_inputs(case, seed=1)
    HD = case.H * case.Dh
    inputs["qkv"][10, HD + 3] = float("nan")  # an A row of image 0
    inputs["qkv"][7, HD + 1] = float("nan")  # a B row of image 0
    inputs["qkv"][200, HD + 1] = float("nan")  # image 1
    for class_token in (True, False):
        attrs = merge_attrs(case, class_token)
        got, ref = run(inputs, attrs), reference(inputs, attrs)
        torch.testing.assert_close(got[3], ref[3], rtol=0, atol=0)
        torch.testing.assert_close(got[5], ref[5], rtol=1e-6, atol=1e-6, equal_nan=True)
        torch.testing.assert_close(got[0], ref[0], rtol=1e-6, atol=1e-6)


# ---- errors ---------------------------------------------------------------------------------------------------------

GOOD = {"num_heads": 2, "num_prefix": 1, "r": 2, "class_token": 1}
BAD_ATTRS = [
    ({"num_heads": 0}, "attribute 'num_heads' must be in [1, 3074457345618258602], got 0"),
    ({"num_heads": None}, "attribute 'num_heads' (int) is required"),
    ({"num_heads": 2.0}, "attribute 'num_heads' must be an int, got a float (2)"),
    ({"num_prefix": -1}, "attribute 'num_prefix' must be >= 0, got -1"),
    ({"r": -1}, "attribute 'r' must be >= 0, got -1"),
    ({"r": None}, "attribute 'r' (int) is required"),
    ({"class_token": 2}, "attribute 'class_token' must be in [0, 1], got 2"),
    ({"class_token": None}, "attribute 'class_token' (int) is required"),
]


def small_inputs(T: int = 10, B: int = 2, W: int = 12) -> dict[str, torch.Tensor | None]:
    return {"x": torch.randn(T, 3), "qkv": torch.randn(T, W), "qkv_bias": torch.randn(W), "size": torch.ones(T),
            "cu": torch.arange(B + 1) * (T // B)}  # fmt: skip


def expect_error(message: str, inputs: dict, attrs: dict | None = None, **model_kw) -> None:
    attrs = {k: v for k, v in (attrs or GOOD).items() if v is not None}
    with pytest.raises(Exception) as info:  # noqa: PT011 (ORT's status exceptions have no common base)
        run(inputs, attrs, **model_kw)
    text = str(info.value)
    for part in message.split(" && "):
        assert part in text, f"{part!r} not in {text!r}"


@pytest.mark.parametrize(("change", "message"), BAD_ATTRS, ids=lambda v: str(v)[:30])
def test_attribute_errors(ort_library, change, message):
    expect_error("RaggedMerge: " + message, small_inputs(), GOOD | change)


SHAPES = "(x shape [10, 3], qkv shape [10, 12], qkv_bias shape [12], size shape [10], cu shape [3])"
BAD_INPUTS = [
    ({"x": torch.zeros(10)}, "input 'x' must be 2-D [T, C] (x shape [10]"),
    ({"x": torch.zeros(10, 3).double(), "qkv": torch.zeros(10, 12).double(), "qkv_bias": None},
     "input 'x' must be float, float16 or bfloat16, got double (x shape [10, 3], qkv shape [10, 12], size shape"),
    ({"qkv": torch.zeros(10, 12, 1)}, "input 'qkv' must be 2-D [T, 3*H*Dh] (x shape [10, 3], qkv shape [10, 12, 1]"),
    ({"qkv": torch.zeros(8, 12)}, "input 'qkv' must have T = 10 rows (one per row of x), got 8"),
    ({"qkv": torch.zeros(10, 9)}, "input 'qkv' width 9 must be a positive multiple of 3*num_heads = 6"),
    ({"qkv": torch.zeros(10, 0)}, "input 'qkv' width 0 must be a positive multiple of 3*num_heads = 6"),
    ({"qkv_bias": torch.zeros(6)}, "input 'qkv_bias' must be 1-D [12] (qkv's width) (x shape [10, 3], qkv shape "
                                   "[10, 12], qkv_bias shape [6]"),
    ({"size": torch.ones(10, 1)}, "input 'size' must be 1-D [T] = [10]"),
    ({"cu": torch.tensor([[0, 10]])}, "input 'cu' must be 1-D [B+1] with B >= 1"),
    ({"cu": torch.tensor([0])}, "input 'cu' must be 1-D [B+1] with B >= 1"),
    ({"cu": torch.tensor([0, 3, 6, 10])},
     "T = 10 rows of x are not B = 3 images of equal length (T % B != 0) (x shape [10, 3]"),
    ({"cu": torch.tensor([0, 4, 10])}, "input 'cu' (shape [3], x rows T = 10) must be b*n with n = T / B = 5 (every "
                                       "image n rows), got cu[1] = 4 instead of 5"),
    ({"cu": torch.tensor([1, 5, 10])}, "input 'cu' (shape [3], x rows T = 10) && got cu[0] = 1 instead of 0"),
    ({"cu": torch.tensor([0, 5, 11])}, "input 'cu' (shape [3], x rows T = 10) && got cu[2] = 11 instead of 10"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "message"), BAD_INPUTS, ids=[m.split(" (")[0][:50] for _, m in BAD_INPUTS])
def test_input_errors(ort_library, change, message):
    expect_error("RaggedMerge: " + message, small_inputs() | change, any_rank=True)


SKIPPED = SHAPES[:-1] + ", skip shape [10, 3], skip_bias shape [4])"
BAD_SKIPS = [
    ({"skip": torch.zeros(10, 4)}, "input 'skip' must have x's shape [T, C] (x shape [10, 3]" + ", qkv shape"),
    ({"skip": torch.zeros(30)}, "input 'skip' must have x's shape [T, C]"),
    ({"skip_bias": torch.zeros(4)}, "input 'skip_bias' must be 1-D [3] (x's width) " + SKIPPED),
    ({"skip_bias": torch.zeros(1, 3)}, "input 'skip_bias' must be 1-D [3] (x's width)"),
    ({"skip": None}, "input 'skip_bias' is given without input 'skip'"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "message"), BAD_SKIPS, ids=[m.split(" (")[0][:50] for _, m in BAD_SKIPS])
def test_skip_input_errors(ort_library, change, message):
    inputs = small_inputs() | {"skip": torch.randn(10, 3), "skip_bias": torch.randn(3)} | change
    expect_error("RaggedMerge: " + message, inputs, any_rank=True)


def test_skip_of_another_type_than_x(ort_library):
    """As qkv_bias (test_a_float_input_of_another_type_than_x): ORT refuses a graph whose last UNDEFINED-typed input
    (here skip) does not have x_out's declared type; with a float skip_bias after it the op refuses by name."""
    half = {"skip": torch.zeros(10, 3).half()}
    expect_error("Type (tensor(float)) of output arg (x_out) && does not match expected type (tensor(float16))",
                 small_inputs() | half, elems={"skip": TensorProto.FLOAT16})  # fmt: skip
    message = f"RaggedMerge: input 'skip' has element type float16, x has float {SHAPES[:-1]}, skip shape [10, 3]"
    expect_error(message, small_inputs() | half | {"skip_bias": torch.zeros(3)}, elems={"skip": TensorProto.FLOAT16})


@pytest.mark.parametrize(
    ("change", "elems", "message"),
    [({"qkv": torch.zeros(10, 12).half()}, {"qkv": TensorProto.FLOAT16},
      "RaggedMerge: input 'qkv' has element type float16, x has float (x shape [10, 3], qkv shape [10, 12], qkv_bias "
      "shape [12], size shape [10], cu shape [3])"),
     ({"qkv_bias": torch.zeros(12).half()}, {"qkv_bias": TensorProto.FLOAT16},
      "Type (tensor(float)) of output arg (x_out) && does not match expected type (tensor(float16))")],
    ids=["qkv", "qkv_bias"],
)  # fmt: skip
def test_a_float_input_of_another_type_than_x(ort_library, change, elems, message):
    """x, qkv and qkv_bias are declared UNDEFINED (one CPU op for every float type): ORT types x_out after the last
    of them given and refuses a graph that declares x_out otherwise (qkv_bias); a mix it lets through (qkv) the op
    refuses by name."""
    expect_error(message, small_inputs() | change, elems=elems)


def test_num_prefix_beyond_the_image(ort_library):
    expect_error(f"RaggedMerge: attribute 'num_prefix' = 6 exceeds the n = T / B = 5 rows per image {SHAPES}",
                 small_inputs(), GOOD | {"num_prefix": 6})  # fmt: skip
    got = run(small_inputs(), GOOD | {"num_prefix": 5})  # p = n: nothing to merge
    assert got[3].tolist() == list(range(10)) and got[5].shape == (0,)


@pytest.mark.parametrize(
    ("change", "elems"),
    [({"size": torch.ones(10, dtype=torch.int64)}, {"size": TensorProto.INT64}),
     ({"cu": torch.tensor([0, 5, 10], dtype=torch.int32)}, {"cu": TensorProto.INT32})],
    ids=["size-int64", "cu-int32"],
)  # fmt: skip
def test_typed_inputs_are_refused_at_session_creation(ort_library, change, elems):
    """size is declared float and cu int64: ORT refuses another type, naming the input, before the kernel runs."""
    name = next(iter(elems))
    with pytest.raises((ort.capi.onnxruntime_pybind11_state.Fail, ort.capi.onnxruntime_pybind11_state.InvalidGraph,
                        ort.capi.onnxruntime_pybind11_state.InvalidArgument)) as info:  # fmt: skip
        run(small_inputs() | change, GOOD, elems=elems)
    assert name in str(info.value) and "RaggedMerge" in str(info.value)


def test_output_shapes_are_inferred(ort_library):
    """Static T and B give every output its static shape (session output metadata)."""
    import onnx

    model = onnx.load_from_string(merge_model(TensorProto.FLOAT, GOOD, qkv_bias=True, size=True))
    for vi, dims in zip(model.graph.input, ([10, 3], [10, 12], [12], [10], [3])):
        vi.type.tensor_type.ClearField("shape")
        for d in dims:
            vi.type.tensor_type.shape.dim.add().dim_value = d
    sess = create_session(model.SerializeToString(), "cpu")
    shapes = {o.name: o.shape for o in sess.get_outputs()}
    # n = 5, p = 1, r = 2: r_eff = 2, m = 3; n_A = 2
    assert shapes == {"x_out": [6, 3], "size_out": [6], "cu_out": [3], "src": [6], "key_bias": [6], "score": [4]}

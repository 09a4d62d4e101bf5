"""tensors.py: layouts, seeds, the gap pattern and the guard bands around every input."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pytest_fusion import Tensor, check_kernel, make_spec
from pytest_fusion.oracle.tensors import (
    GAP_LOW,
    GUARD_BYTES,
    Case,
    covered_bytes,
    describe_offset,
    draw_values,
    element_bits,
    gap_pattern,
    layout_geometry,
    make_inputs,
    storage_bytes,
)

SPEC = make_spec(lambda x, w: x @ w.T, inputs={"x": ("M", "K"), "w": ("N", "K")}, dims={"M": (1, 64), "K": (1, 64), "N": (1, 64)})


def case(layout: str = "contiguous", seed: int = 7, dtype: str = "float32", **dims: int) -> Case:
    return Case(dims={"M": 5, "K": 6, "N": 3, **dims}, dtype=dtype, layouts={"x": layout, "w": "contiguous"}, seed=seed)


@pytest.mark.parametrize("layout, strides, offset, extent", [
    ("contiguous", (6, 1), 0, 30), ("transposed", (1, 5), 0, 30), ("offset", (6, 1), 1, 31), ("padded", (9, 1), 0, 45),
])
def test_layout_geometry(layout: str, strides: tuple[int, ...], offset: int, extent: int) -> None:
    assert layout_geometry((5, 6), layout) == (strides, offset, extent)
    assert layout_geometry((4,), "padded") == ((2,), 0, 8)
    with pytest.raises(ValueError, match="unknown layout 'diagonal'"):
        layout_geometry((5, 6), "diagonal")


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "offset", "padded"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_inputs_sit_between_guard_bands_and_layout_never_changes_values(layout: str, dtype: str) -> None:
    x = make_inputs(SPEC, case(layout, dtype=dtype), "cpu")["x"]
    ref = make_inputs(SPEC, case("contiguous", dtype=dtype), "cpu")["x"]
    assert torch.equal(x, ref)  # same values whatever the layout
    guard = GUARD_BYTES // x.element_size()
    _, offset, extent = layout_geometry(tuple(x.shape), layout)
    assert x.storage_offset() == guard + offset
    assert x.untyped_storage().nbytes() == (2 * guard + extent) * x.element_size()
    assert x.data_ptr() % 64 == (offset * x.element_size()) % 64  # the band keeps the allocation's alignment


@pytest.mark.parametrize("layout", ["offset", "padded"])
def test_gaps_and_bands_hold_the_seeded_finite_pattern(layout: str) -> None:
    x = make_inputs(SPEC, case(layout), "cpu")["x"]
    flat = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage())
    outside = flat[~covered_bytes(x).view(-1, x.element_size())[:, 0]]
    assert outside.numel() > 2 * GUARD_BYTES // x.element_size()
    assert torch.isfinite(outside).all()
    assert (outside.abs() >= GAP_LOW).all() and (outside.abs() < 2 * GAP_LOW).all()
    assert (outside > 0).any() and (outside < 0).any()


def test_same_seed_same_bits_other_seed_other_pattern() -> None:
    a = storage_bytes(make_inputs(SPEC, case("padded", seed=3), "cpu")["x"])
    b = storage_bytes(make_inputs(SPEC, case("padded", seed=3), "cpu")["x"])
    c = storage_bytes(make_inputs(SPEC, case("padded", seed=4), "cpu")["x"])
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_gap_pattern_dtypes() -> None:
    assert torch.equal(gap_pattern(5000, torch.float16, 1), gap_pattern(5000, torch.float16, 1))
    assert not torch.equal(gap_pattern(50, torch.float32, 1), gap_pattern(50, torch.float32, 2))
    ints = gap_pattern(100, torch.int8, 1)
    assert (ints.abs() >= 63).all()
    assert gap_pattern(10, torch.bool, 1).all()
    assert gap_pattern(0, torch.float32, 1).numel() == 0


def test_describe_offset_names_where_a_byte_lies() -> None:
    x = make_inputs(SPEC, case("padded", M=2, K=3), "cpu")["x"]  # row stride 6: elements 3..5 are a gap
    start = x.storage_offset() * 4
    assert describe_offset(x, start + 4 * 4) == "element offset +4 (in a gap of its layout)"
    assert describe_offset(x, start + 9 * 4) == "element offset +9 (1 past its last element)"
    assert describe_offset(x, start - 4) == "element offset -1 (1 before its first element)"


def test_one_element_tensor_is_covered_by_its_own_bytes_only() -> None:
    t = make_inputs(SPEC, case(M=1, K=1), "cpu")["x"]
    mask = covered_bytes(t)
    assert int(mask.sum()) == t.element_size()
    assert bool(mask[t.storage_offset() * t.element_size()])


ODD_VIEWS = {
    "one int64 element, stride 2": lambda: torch.arange(2, dtype=torch.int64)[::2],
    "transposed": lambda: torch.randn(3, 5, dtype=torch.float16).t(),
    "expanded": lambda: torch.randn(1, 4).expand(3, 4),
    "offset": lambda: torch.randn(9, dtype=torch.bfloat16)[3:7],
    "zero-dim": lambda: torch.tensor(2.5, dtype=torch.float64),
    "bool, stride 3": lambda: torch.ones(7, dtype=torch.bool)[::3],
    "complex conjugate": lambda: torch.randn(3, dtype=torch.complex64).conj(),
}


@pytest.mark.parametrize("make", ODD_VIEWS.values(), ids=ODD_VIEWS.keys())
def test_element_bits_reads_any_view_the_oracle_meets(make) -> None:
    t = make()
    bits = element_bits(t)
    assert not bits.dtype.is_floating_point and bits.element_size() == t.real.element_size()
    assert bits.shape == ((*t.shape, 2) if t.is_complex() else t.shape)
    assert torch.equal(element_bits(t.clone()), bits)  # the same bits whatever the layout
    if not t.is_complex():  # a view of t's own memory, so that writes through it land in t
        assert (bits.data_ptr(), bits.stride()) == (t.data_ptr(), t.stride())


def test_element_bits_tell_nan_payloads_and_signed_zeros_apart() -> None:
    plain = torch.tensor([float("nan"), 0.0])
    other = torch.tensor([0x7FC0_0001, -(2**31)], dtype=torch.int32).view(torch.float32)  # NaN, -0.0
    assert other[0].isnan() and float(other[1]) == 0.0
    assert (element_bits(plain) != element_bits(other)).all()


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "padded"])
def test_values_drawn_ahead_make_the_same_bits(layout: str) -> None:
    # A large case draws its values before it waits for its device's lock (case_runner): the inputs
    # must be the ones drawn in one go, guard bands and gaps included, special values and all.
    from pytest_fusion.declare.spec import Tensor

    spec = make_spec(lambda x, w, q: x, inputs={"x": ("M", "K"), "w": ("N", "K"), "q": Tensor(("N",), dtype="int8")},
                     dims={"M": (1, 64), "K": (1, 64), "N": (1, 64)})
    c = Case(dims={"M": 40, "K": 33, "N": 9}, dtype="bfloat16", layouts={"x": layout}, seed=11, special=True)
    drawn = draw_values(spec, c)
    assert [(v.dtype, tuple(v.shape)) for v in drawn] == [
        (torch.bfloat16, (40, 33)), (torch.bfloat16, (9, 33)), (torch.int8, (9,))]
    at_once, ahead = make_inputs(spec, c, "cpu"), make_inputs(spec, c, "cpu", drawn)
    for name in at_once:
        assert at_once[name].stride() == ahead[name].stride()
        assert torch.equal(storage_bytes(at_once[name]), storage_bytes(ahead[name]))
    assert torch.isnan(at_once["x"]).any()  # the special values were drawn too
    zeros = make_inputs(spec, c, "cpu", [torch.zeros_like(v) for v in drawn])  # the values given are used
    assert all(not v.any() for v in zeros.values())
    assert torch.equal(storage_bytes(zeros["w"])[:GUARD_BYTES], storage_bytes(at_once["w"])[:GUARD_BYTES])


def _chunked_spec():
    from pytest_fusion.declare.spec import Tensor

    return make_spec(lambda x, w, u, q: x,
                     inputs={"x": ("M", "K"), "w": ("N", "K"), "u": Tensor(("N", "K"), bounds=(-2, 3)),
                             "q": Tensor(("N", "K"), dtype="int8")},
                     dims={"M": (1, 512), "K": (1, 512), "N": (1, 512)})


def test_a_large_input_is_drawn_in_chunks_whose_bits_never_depend_on_the_thread_count(monkeypatch) -> None:
    # Inputs past DRAW_CHUNK values are drawn chunk by chunk across threads (docs/oracle.md#drawing-in-chunks):
    # each chunk needs its own stream, fixed by the seed alone, or a replay on a machine with other
    # cores draws other inputs.
    from pytest_fusion.oracle import tensors

    monkeypatch.setattr(tensors, "DRAW_CHUNK", 256)
    spec, threads = _chunked_spec(), torch.get_num_threads()
    c = Case(dims={"M": 64, "K": 97, "N": 64}, dtype="float32", layouts={}, seed=5)  # 24 chunks and 64 values
    try:
        torch.set_num_threads(1)
        one = draw_values(spec, c)
        torch.set_num_threads(4)
        four = draw_values(spec, c)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(one, four, strict=True))
    x, w, u, q = one
    # chunk c of input i is drawn by the generator of chunk_seed(seed, i, c), the short last one too
    for i, t, scale in ((0, x, 1.0), (1, w, 97**-0.5)):
        for chunk, n in ((0, 256), (24, 64)):
            g = torch.Generator().manual_seed(tensors.chunk_seed(5, i, chunk))
            assert torch.equal(t.view(-1)[chunk * 256:chunk * 256 + n], torch.randn(n, generator=g) * scale)
    assert not torch.allclose(x.view(-1)[:256], x.view(-1)[256:512])  # every chunk its own stream
    assert not torch.allclose(x, w * 97**0.5, atol=1e-3)  # every input its own streams
    assert not torch.allclose(x, draw_values(spec, dataclasses.replace(c, seed=6))[0], atol=1e-3)
    # and the policy still holds across chunks: scales, bounds, integer range
    assert abs(float(x.mean())) < 0.05 and abs(float(x.std()) - 1) < 0.03
    assert abs(float(w.std()) * 97**0.5 - 1) < 0.03
    assert float(u.min()) >= -2 and float(u.max()) <= 3 and float(u.std()) > 1
    assert int(q.min()) == -8 and int(q.max()) == 8


def test_an_input_of_at_most_one_chunk_draws_from_the_case_generator_in_spec_order(monkeypatch) -> None:
    # The bits every case of CPU size had before chunks existed: x, then w, from one generator.
    from pytest_fusion.oracle import tensors

    c = Case(dims={"M": 8, "K": 32, "N": 4}, dtype="float32", layouts={}, seed=9)
    monkeypatch.setattr(tensors, "DRAW_CHUNK", 8 * 32)  # x fills one chunk exactly
    x, w = draw_values(SPEC, c)
    g = torch.Generator().manual_seed(9)
    assert torch.equal(x, torch.randn(8, 32, generator=g))
    assert torch.equal(w, torch.randn(4, 32, generator=g) * 32**-0.5)


def test_chunked_values_are_clamped_to_the_dtype(monkeypatch) -> None:
    # fp16 holds 65504 at most: a value drawn past it must round to the largest finite one, not inf.
    from pytest_fusion.oracle import tensors
    from pytest_fusion.declare.spec import Tensor

    monkeypatch.setattr(tensors, "DRAW_CHUNK", 256)
    spec = make_spec(lambda x, u: x, inputs={"x": Tensor(("M", "K"), scale=1e6), "u": Tensor(("M", "K"), bounds=(-1e6, 1e6))},
                     dims={"M": (1, 64), "K": (1, 64)})
    for t in draw_values(spec, Case(dims={"M": 64, "K": 33}, dtype="float16", layouts={}, seed=3)):
        assert torch.isfinite(t).all() and float(t.abs().max()) == 65504


def test_a_chunked_input_still_gets_its_special_values(monkeypatch) -> None:
    from pytest_fusion.oracle import tensors

    monkeypatch.setattr(tensors, "DRAW_CHUNK", 256)
    c = Case(dims={"M": 64, "K": 96, "N": 64}, dtype="bfloat16", layouts={}, seed=5, special=True)
    x = draw_values(_chunked_spec(), c)[0].float()
    special = torch.isnan(x) | torch.isinf(x) | ((x == 0) & torch.signbit(x))
    assert 0 < int(special.sum()) <= 1 + x.numel() // 1024


def test_a_position_drawn_twice_for_a_special_value_keeps_its_last_draw() -> None:
    # What one write after another gives; torch's indexed write of repeated positions on several
    # threads lets any of them win, which made a planted value hang on thread timing.
    from pytest_fusion.oracle.tensors import last_writes

    where, which = last_writes(torch.tensor([5, 2, 5, 7, 2, 5]), torch.tensor([0, 1, 2, 3, 0, 1]))
    assert where.tolist() == [2, 5, 7] and which.tolist() == [0, 1, 3]


@pytest.mark.parametrize("dtype, bounds, expected", [
    ("int64", None, (-8, 8)),
    ("int64", (2**63 - 4, 2**63 - 1), (2**63 - 4, 2**63 - 1)),
    ("int64", (-(2**63), -(2**63) + 3), (-(2**63), -(2**63) + 3)),
    ("int32", None, (-8, 8)),
    ("int32", (-(2**31), 2**31 - 1), (-(2**31), 2**31 - 1)),
    ("uint8", None, (0, 8)),
    ("uint8", (250, 255), (250, 255)),
])
def test_integer_inputs_draw_in_their_bounds_or_a_range_their_dtype_holds(
    dtype: str, bounds: tuple[int, int] | None, expected: tuple[int, int]
) -> None:
    # int64 once failed every case with "Overflow when unpacking long long" (its gap pattern's max + 1)
    spec = make_spec(lambda x, i: x * i, dims={"M": (1, 64)},
                     inputs={"x": ("M",), "i": Tensor(("M",), dtype=dtype, bounds=bounds)})
    for layout in ("contiguous", "offset", "padded"):
        i = make_inputs(spec, Case({"M": 64}, "float32", {"i": layout}, seed=3), "cpu")["i"]
        assert i.dtype == getattr(torch, dtype)
        assert expected[0] <= int(i.min()) and int(i.max()) <= expected[1], (layout, i)
        assert len(set(i.tolist())) > 1  # drawn, not one value
    low = torch.iinfo(getattr(torch, dtype)).max // 2
    assert (gap_pattern(50, getattr(torch, dtype), 1).to(torch.int64).abs() >= low).all()


def test_a_kernel_with_int64_int32_and_uint8_inputs_is_checked() -> None:
    spec = make_spec(
        lambda x, a, b, c: x * a + b * c,
        inputs={"x": ("M",), "a": Tensor(("M",), dtype="int64"), "b": Tensor(("M",), dtype="int32"),
                "c": Tensor(("M",), dtype="uint8", bounds=(0, 255))},
        dims={"M": (1, 32)}, dtypes=("float32",), triton=False,
    )
    check_kernel(spec, lambda x, a, b, c: x * a + b * c, max_examples=6, device="cpu")


@pytest.mark.parametrize("layout", ["contiguous", "offset", "padded", "transposed"])
def test_nan_outside_an_input_and_back(layout: str) -> None:
    from pytest_fusion.oracle.tensors import finite_outside, nan_outside, pattern_seed

    x = make_inputs(SPEC, case(layout), "cpu")["x"]
    finite = storage_bytes(x).clone()
    values = x.clone()
    nan_outside(x)
    flat = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage())
    assert torch.equal(x, values)  # the elements keep their values
    span = torch.zeros(flat.numel(), dtype=torch.bool)
    span[x.storage_offset():x.storage_offset() + (x.shape[0] - 1) * x.stride(0) + (x.shape[1] - 1) * x.stride(1) + 1] = True
    assert flat[~span].isnan().all() and not flat[span].isnan().any()  # padded row gaps stay finite
    finite_outside(x, pattern_seed(7, 0))
    assert torch.equal(storage_bytes(x), finite)

"""Edge tiers beyond the tile edges: quantization-block edges of a dim divided into blocks by a
derived size (``cdiv(K, 32)``), and the 16-bit edge 2^16 +- 1 of a dim whose range reaches it
(docs/oracle.md#the-shapes). Each planted fault is a plain-torch kernel (``triton=False``)."""

from __future__ import annotations

import pytest

from conftest import shrunk_dims
from fakes import FAKE_TIMER_CONFTEST
from pytest_fusion.declare.marker import make_spec
from pytest_fusion.property.strategies import EDGE_GRID, block_edges, edge_cases, edge_dims

BLOCK_QUANT = '''
import pytest
import pytest_fusion
import torch
import torch.nn.functional as F

BLOCK = 32


def dequant_linear(x, w, scales):
    # int8 weight, one float32 scale per block of 32 along K (the last block may be partial)
    k = w.shape[1]
    w_float = w.to(scales.dtype) * scales.repeat_interleave(BLOCK, dim=1)[:, :k]
    return F.linear(x, w_float.to(x.dtype))


def drops_the_trailing_block(x, w, scales):
    k = w.shape[1]
    whole = k // BLOCK * BLOCK  # K // 32 blocks: a trailing partial block is never read
    w_float = w[:, :whole].to(scales.dtype) * scales[:, : whole // BLOCK].repeat_interleave(BLOCK, dim=1)
    return F.linear(x[:, :whole], w_float.to(x.dtype)) if whole else x.new_zeros(x.shape[0], w.shape[0])


@pytest.mark.fused_kernel(
    reference=dequant_linear,
    inputs={"x": ("M", "K"),
            "w": pytest_fusion.Tensor(("N", "K"), dtype="int8", bounds=(-127, 127)),
            "scales": pytest_fusion.Tensor(("N", "cdiv(K, 32)"), dtype="float32", bounds=(0.5 / 127, 2 / 127))},
    dims={"M": (1, 64), "K": (16, 4096), "N": (1, 64)}, multiple_of={"K": 16},
    dtypes=("float32",), triton=False, max_examples=MAX_EXAMPLES,
    bench={"small": dict(M=4, K=48, N=8)},
)
def test_block_quant():
    return KERNEL
'''


def block_quant(kernel: str, max_examples: int = 12) -> str:
    return BLOCK_QUANT.replace("KERNEL", kernel).replace("MAX_EXAMPLES", str(max_examples))


def test_a_dropped_trailing_scale_block_is_caught_at_a_half_block(pytester: pytest.Pytester, cpu_only: None) -> None:
    pytester.makepyfile(test_quant=block_quant("drops_the_trailing_block"))
    result = pytester.runpytest("-p", "no:cacheprovider", "--hypothesis-seed=1", "-k", "not bench")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] mismatch: *elements of the output*"])
    dims = shrunk_dims(result.stdout.str())
    assert dims["K"] % 32 == 16 and dims["M"] == dims["N"] == 1, dims


def test_a_correct_block_quantized_matmul_passes_check_and_bench(pytester: pytest.Pytester, cpu_only: None) -> None:
    """The derived size works in the check, the repro, the bench case and its memory footprint."""
    pytester.makeconftest(FAKE_TIMER_CONFTEST)
    pytester.makepyfile(test_quant=block_quant("dequant_linear"))
    result = pytester.runpytest("-p", "no:cacheprovider", "--hypothesis-seed=1")
    result.assert_outcomes(passed=1)
    repro = '{"dims": {"M": 1, "K": 48, "N": 2}, "seed": 7}'
    result = pytester.runpytest("-p", "no:cacheprovider", f"--fusion-repro={repro}", "-k", "not bench")
    result.assert_outcomes(passed=1)
    result = pytester.runpytest("-p", "no:cacheprovider", '--fusion-repro={"dims": {"M": 1, "K": 40, "N": 2}, "seed": 7}',
                                "-k", "not bench")
    result.stdout.fnmatch_lines(["*dims not multiples as declared: K=40 (multiple_of 16)*"])
    result = pytester.runpytest("-p", "no:cacheprovider", "--fusion-bench", "--fusion-providers=eager",
                                "--fusion-warmup=0", "-k", "bench")
    result.assert_outcomes(passed=1)


def spec_with(dims: dict, inputs: dict, **kw):
    return make_spec(lambda *a: a[0], inputs=inputs, dims=dims, triton=False, **kw)


def test_block_edges_of_a_half_block_are_drawn_often_and_as_edge_cases() -> None:
    spec = spec_with({"M": (1, 64), "K": (16, 4096)}, {"x": ("M", "K"), "s": ("M", "cdiv(K, 32)")},
                     multiple_of={"K": 16})
    edges = edge_dims(low=16, high=4096, multiple=16, blocks=(32,))
    assert all(v % 16 == 0 for v in edges) and {16, 48, 80, 4080, 4096} <= set(edges)
    assert 48 in block_edges(low=16, high=4096, blocks=(32,), multiple=16)
    ks = [c.dims["K"] for c in edge_cases(spec, dtype="float32", max_elements=2**18, count=8)]
    assert any(k % 32 == 16 and k > 32 for k in ks), ks  # a whole block, then a half one


def test_the_16_bit_grid_edge_is_an_edge_value_only_where_the_range_reaches_it() -> None:
    assert set(EDGE_GRID) <= set(edge_dims(low=1, high=70000))
    assert not set(EDGE_GRID) & set(edge_dims(low=1, high=65534))
    spec = spec_with({"M": (1, 70000), "N": (1, 8)}, {"x": ("M", "N")})
    grid = [c.dims for c in edge_cases(spec, dtype="float32", max_elements=2**18, count=3) if c.dims["M"] > 60000]
    assert [d["M"] for d in grid] == [70000, 65535, 65536, 65537]  # the high end, then one case per grid edge
    assert all(d["N"] == 1 for d in grid if d["M"] in EDGE_GRID)  # the other dims at their low ends
    # under the interpreter's cap of 64 per dim, the grid edge is not drawn (nor is it on the CPU at all
    # for a Triton kernel: it would cost 65536 interpreted programs)
    capped = edge_cases(spec, dtype="float32", max_dim=64, count=3, above_cap=True)
    assert max(c.dims["M"] for c in capped) < 60000


ROWS_PAST_16_BITS = '''
import pytest
import torch


def scale_rows(x):
    return x * 2


def drops_rows_past_65536(x):
    out = torch.zeros_like(x)
    out[:65536] = x[:65536] * 2  # a row index kept in 16 bits: rows from 65536 on are never written
    return out


# a range just around the edge keeps the shrinks short (each case holds 65536 rows)
@pytest.mark.fused_kernel(reference=scale_rows, inputs={"x": ("M", 1)}, dims={"M": (65534, 65537)},
                          dtypes=("float32",), triton=False, special_values=False, max_examples=4)
def test_rows():
    return drops_rows_past_65536
'''


def test_rows_dropped_past_65536_are_caught_by_the_grid_edge(pytester: pytest.Pytester, cpu_only: None) -> None:
    pytester.makepyfile(test_rows=ROWS_PAST_16_BITS)
    result = pytester.runpytest("-p", "no:cacheprovider", "--hypothesis-seed=1")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] mismatch: *"])
    assert shrunk_dims(result.stdout.str())["M"] == 65537

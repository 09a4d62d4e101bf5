"""Fused kernels beyond the MLP, each declared with the fused_kernel marker (docs/examples.md):
a residual add + RMSNorm with two outputs, a softmax over the last dim, a rotary embedding that
overwrites q and k (``mutates=``), and a weight-only int8 linear whose weight and scales have
their own dtypes (``pytest_fusion.Tensor(dtype=, bounds=)``).

Dims span Llama-3-8B's (hidden 4096, 32 query and 8 key/value heads of 128, up to 8192 tokens)
and more; on the CPU the plugin caps them and the kernels run under the Triton interpreter.
``--fusion-bench`` times the bench cases, bf16, at 1 and 8192 tokens.
"""

from __future__ import annotations

import pytest
import torch

import pytest_fusion
from reference_kernels.kernels import int8_linear as int8_linear_module
from reference_kernels.kernels.int8_linear import int8_linear, int8_linear_eager
from reference_kernels.kernels.norms import add_rms_norm, add_rms_norm_eager
from reference_kernels.kernels.rotary import rotary_, rotary_eager
from reference_kernels.kernels.softmax import softmax, softmax_eager

EXAMPLES = None if torch.cuda.is_available() else 4
"""Examples per test and dtype: the plugin's default (or --fusion-examples) on a GPU; 4 under
the Triton interpreter, which takes seconds per case at the capped dims (the rotary test took
67 s per dtype at the default 25 on a 2-core CPU machine)."""

BENCH_DTYPES = ("bfloat16",)
"""Bench cases are timed in bf16, the dtype these models are served in."""


@pytest.mark.fused_kernel(
    reference=add_rms_norm_eager,
    # M tokens, N hidden: "K" would give the residual weight-like 1/sqrt(K) values.
    inputs={"x": ("M", "N"), "residual": ("M", "N"), "weight": ("N",)},
    dims={"M": (1, 8192), "N": (1, 8192)},
    constants={"eps": 1e-6},
    max_examples=EXAMPLES,
    bench={
        "llama3-8b-decode": dict(M=1, N=4096, dtypes=BENCH_DTYPES),
        "llama3-8b-prefill": dict(M=8192, N=4096, dtypes=BENCH_DTYPES),
    },
)
def test_add_rms_norm():
    """Two outputs, (normalised, new residual): the oracle checks each against golden."""
    return add_rms_norm


@pytest.mark.fused_kernel(
    reference=softmax_eager,
    inputs={"x": ("M", "N")},
    dims={"M": (1, 8192), "N": (1, 16384)},
    max_examples=EXAMPLES,
    bench={
        # Attention probabilities of Llama-3-8B at a context of 8192: one decode token's 32
        # heads, and the 8192 query rows of one head in prefill.
        "llama3-8b-decode": dict(M=32, N=8192, dtypes=BENCH_DTYPES),
        "llama3-8b-prefill": dict(M=8192, N=8192, dtypes=BENCH_DTYPES),
    },
)
def test_softmax():
    return softmax


HEAD_DIM = 128
"""Llama-3-8B's head dim, a fixed size in the shapes: the rotation pairs element i with
i + D / 2, so D must be even, which a drawn dim cannot promise."""

ANGLE = pytest_fusion.Tensor(("T", HEAD_DIM // 2), bounds=(-1.0, 1.0))
"""cos and sin tables: values in [-1, 1] as cosines and sines have, not unit normals."""


@pytest.mark.fused_kernel(
    reference=rotary_eager,
    inputs={"q": ("T", "HQ", HEAD_DIM), "k": ("T", "HK", HEAD_DIM), "cos": ANGLE, "sin": ANGLE},
    dims={"T": (1, 8192), "HQ": (1, 64), "HK": (1, 16)},
    # The kernel overwrites q and k and returns None; the out-of-place reference returns the new
    # (q, k). Each call gets its own copies of q and k, whose final values are its outputs.
    mutates=("q", "k"),
    max_examples=EXAMPLES,
    bench={
        "llama3-8b-decode": dict(T=1, HQ=32, HK=8, dtypes=BENCH_DTYPES),
        "llama3-8b-prefill": dict(T=8192, HQ=32, HK=8, dtypes=BENCH_DTYPES),
    },
)
def test_rotary_in_place():
    return rotary_


@pytest.mark.fused_kernel(
    reference=int8_linear_eager,
    inputs={
        "x": ("M", "K"),
        # Symmetric int8 weights use all of [-127, 127]; the default integer draw is [-8, 8].
        "w": pytest_fusion.Tensor(("N", "K"), dtype="int8", bounds=(-127, 127)),
        # Per-channel scales as absmax quantization gives them: max|w_fp| / 127, weights of
        # about unit size. No special values: the kernel applies the scale after the sum, so an
        # inf scale gives inf * (sum of w x) where eager sums inf * w terms of both signs (NaN).
        "scale": pytest_fusion.Tensor(("N",), dtype="float32", bounds=(0.5 / 127, 2.0 / 127), special=False),
    },
    dims={"M": (1, 8192), "K": (1, 8192), "N": (1, 16384)},
    max_examples=EXAMPLES,
    bench={
        # Llama-3-8B's up projection (4096 -> 14336): a decode token and a prefill of 8192.
        "llama3-8b-up-decode": dict(M=1, K=4096, N=14336, dtypes=BENCH_DTYPES),
        "llama3-8b-up-prefill": dict(M=8192, K=4096, N=14336, dtypes=BENCH_DTYPES),
    },
    flops=lambda M, K, N: 2 * M * K * N,
)
def test_int8_weight_linear():
    return int8_linear


def test_int8_linear_tunes_fp32_over_fma_sized_tiles_only() -> None:
    # IEEE fp32 tl.dot is unrolled into FMAs: tensor-core-sized tiles take minutes to compile
    # (docs/reference-kernels.md#configs-kept-and-why).
    module = int8_linear_module
    prune = module._configs_for_dtype
    x32, x16 = torch.empty(1, 1), torch.empty(1, 1, dtype=torch.bfloat16)
    fp32 = prune(module.CONFIGS, {"x_ptr": x32})
    assert fp32 and all(c in module.FMA_CONFIGS for c in fp32)
    for c in fp32:
        fmas = c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] * c.kwargs["BLOCK_K"] // (32 * c.num_warps)
        assert fmas <= module.MAX_FMA_PER_THREAD, c
    assert prune(module.CONFIGS, {"x_ptr": x16}) == module.MMA_CONFIGS
    assert module._int8_linear_tuned.early_config_prune is prune
    assert module.CONFIGS[0] is module.MMA_CONFIGS[0] is module.FMA_CONFIGS[0]  # what the interpreter runs


def test_softmax_float32_is_within_a_few_ulp_on_rows_spanning_80() -> None:
    # tl.exp rounds z * log2(e) to fp32 before its exp2: up to |z| 2^-24 relative, up to about 80 ulp
    # at z = -80, where the reference kernel's exp keeps the product's residual (softmax._exp).
    # What remains is one exp2 (numpy's under the interpreter, ex2.approx.ftz.f32 on the GPU), the
    # fma, the sum and the division: 3.1 ulp here. Under the interpreter this catches a broken
    # residual (62 ulp with it dropped), not a return to tl.exp and `/`, which numpy computes
    # accurately (3.8 ulp); on a GPU it catches that too. The row max is 0 so that x - max is exact:
    # shifted rows make eager and any kernel tens of ulp off (the subtraction's rounding, not exp's).
    import triton

    if not torch.cuda.is_available() and tuple(map(int, triton.__version__.split(".")[:2])) < (3, 9):
        pytest.skip("before Triton 3.9 the interpreter computes tl.fma as a rounded multiply and add")
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(8, 4096, generator=gen) * -80.0  # z from 0 down to -80 in every row
    x[:, 0] = 0.0
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = softmax(x.to(device)).cpu().double()
    golden = torch.softmax(x.double(), dim=-1)
    normal = golden > torch.finfo(torch.float32).tiny
    local_ulp = torch.exp2(torch.floor(torch.log2(golden[normal])) - 23)
    worst = float(((out[normal] - golden[normal]).abs() / local_ulp).max())
    assert worst <= 6.0, f"{worst:.1f} ulp"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy under the interpreter: inf - inf, overflow
@pytest.mark.parametrize("row", [
    [0.0, -3e38],  # z * log2(e) overflows to -inf: the residual must not turn the row into NaN
    [3e38, 0.0],
    [0.0, float("-inf")],
    [float("-inf"), float("-inf")],
    [float("inf"), 0.0],
    [float("nan"), 0.0],
])
def test_softmax_edge_rows_match_torch(row: list[float]) -> None:
    x = torch.tensor([row], dtype=torch.float32)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    expected = torch.softmax(x, dim=-1)
    torch.testing.assert_close(softmax(x.to(device)).cpu(), expected, equal_nan=True, rtol=0, atol=0)

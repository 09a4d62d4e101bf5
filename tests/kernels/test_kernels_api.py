"""Plain pytest tests of the reference kernels' launch wrappers, configs and MLP modules.

Run on the CPU under the Triton interpreter (the plugin sets TRITON_INTERPRET=1 before any test
module is imported when no CUDA device is visible) at small dims, in float16 and float32
(the interpreter computes bf16 wrongly: docs/reference-kernels.md#tests); on a GPU they run as they
are.
"""

from __future__ import annotations

import json
import os
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl

if not torch.cuda.is_available():  # without the plugin (-p no:fusion) the interpreter is still needed
    os.environ.setdefault("TRITON_INTERPRET", "1")

from reference_kernels.gemm import configs, split_tail, targets  # noqa: E402
from reference_kernels.gemm import tma as gemm_tma  # noqa: E402
from reference_kernels.kernels import dispatch, validate  # noqa: E402
from reference_kernels.kernels.eager import gated_act_eager, gated_mlp_eager, linear_act_eager, mlp_eager  # noqa: E402
from reference_kernels.kernels.gated_mlp import gated_act  # noqa: E402
from reference_kernels.kernels.linear_act import linear_act  # noqa: E402
from reference_kernels.models import shapes  # noqa: E402
from reference_kernels.models.modules import (  # noqa: E402
    FusedGatedMLP,
    FusedLinearAct,
    FusedMLP,
    activation_name,
    swap_mlps,
)
from reference_kernels.tuning import cache, pick  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = (torch.float16, torch.float32) if DEVICE == "cpu" else (torch.float16, torch.bfloat16, torch.float32)

# Relative Frobenius error against the float64 golden that a kernel rounding once to the dtype
# stays under at K <= 300 with unit-scale outputs (fp16 ulp 2^-10 ~ 1e-3, fp32 2^-23 ~ 1.2e-7).
TMA_DEVICE = DEVICE == "cpu" or torch.cuda.get_device_capability()[0] >= 9
"""Whether descriptors run here (the interpreter emulates them)."""
TARGET = targets.of_device(torch.device(DEVICE))
"""The shared-memory budget and path the kernels get here (the interpreter's: Hopper's)."""

REL_TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 2e-6}


def rel_err(out: torch.Tensor, gold: torch.Tensor) -> float:
    return ((out.double() - gold).norm() / gold.norm()).item()


def randn(*shape, dtype=torch.float32, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(DEVICE, dtype)


def linear_inputs(M, K, N, dtype, seed=0):
    return randn(M, K, dtype=dtype, seed=seed), randn(N, K, dtype=dtype, scale=K**-0.5, seed=seed + 1), randn(N, dtype=dtype, seed=seed + 2)


# ---------------------------------------------------------------------------------------------
# Input checks: each error names the argument.
# ---------------------------------------------------------------------------------------------

def _lin(**over):
    x, w, b = linear_inputs(4, 8, 6, torch.float32)
    args = dict(x=x, weight=w, bias=b, activation="relu")
    args.update(over)
    return lambda: linear_act(args["x"], args["weight"], args["bias"], args["activation"])


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: _lin(x=torch.zeros(4, 7, device=DEVICE))(), ValueError, r"weight has K = 8 .* x has K = 7"),
        (lambda: _lin(weight=torch.zeros(8, device=DEVICE))(), ValueError, r"weight must be 2-D \(N, K\)"),
        (lambda: _lin(x=torch.tensor(1.0, device=DEVICE))(), ValueError, r"x must have at least one dimension"),
        (lambda: _lin(x=torch.zeros(4, 8, dtype=torch.int32, device=DEVICE))(), TypeError, r"x has unsupported dtype torch.int32"),
        (lambda: _lin(x=torch.zeros(4, 8, dtype=torch.float64, device=DEVICE))(), TypeError, r"x has unsupported dtype torch.float64"),
        (lambda: _lin(weight=torch.zeros(6, 8, dtype=torch.float16, device=DEVICE))(), TypeError, r"mixed dtypes: weight is torch.float16 but x is torch.float32"),
        (lambda: _lin(bias=torch.zeros(5, device=DEVICE))(), ValueError, r"bias must have shape \(N,\) = \(6,\)"),
        (lambda: _lin(bias=[0.0] * 6)(), TypeError, r"bias must be a torch.Tensor or None"),
        (lambda: _lin(x=[[1.0] * 8])(), TypeError, r"x must be a torch.Tensor"),
        (lambda: _lin(activation="gelu_erf")(), ValueError, r"activation must be one of .* got 'gelu_erf'"),
        (lambda: _lin(weight=torch.zeros(6, 8, device="meta"))(), ValueError, r"weight is on meta but x is on"),
    ],
    ids=["K-mismatch", "weight-rank", "x-0d", "int-dtype", "float64", "mixed-dtypes", "bias-shape",
         "bias-not-tensor", "x-not-tensor", "unknown-activation", "devices"],
)
def test_linear_act_rejects_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_gated_act_rejects_bad_input():
    x, w, b = linear_inputs(4, 8, 6, torch.float32)
    with pytest.raises(ValueError, match=r"w_up has N = 5 but w_gate has N = 6"):
        gated_act(x, w, w[:5])
    with pytest.raises(ValueError, match=r"w_up has K = 7"):
        gated_act(x, w, w[:, :7])
    with pytest.raises(ValueError, match=r"b_up must have shape \(N,\)"):
        gated_act(x, w, w, b, b[:3])
    with pytest.raises(TypeError, match=r"mixed dtypes: w_gate is torch.float16"):
        gated_act(x, w.half(), w.half())
    with pytest.raises(ValueError, match=r"activation must be one of"):
        gated_act(x, w, w, activation="swish")


def test_cpu_tensor_without_interpreter_is_named(monkeypatch):
    monkeypatch.setattr(validate, "INTERPRET", False)
    x, w, b = (t.cpu() for t in linear_inputs(2, 4, 3, torch.float32))
    with pytest.raises(ValueError, match=r"x is on cpu: the Triton kernels need a CUDA device, or TRITON_INTERPRET=1"):
        linear_act(x, w, b)


def test_malformed_config_is_rejected():
    x, w, b = linear_inputs(2, 4, 3, torch.float32)
    with pytest.raises(TypeError, match=r"config must be a triton.Config"):
        linear_act(x, w, b, config={"BLOCK_M": 16})
    bad = configs._cfg(16, 24, 32, 4, 1)
    with pytest.raises(ValueError, match=r"BLOCK_N must be a power of two >= 16"):
        linear_act(x, w, b, config=bad)
    with pytest.raises(TypeError, match=r"config lacks BLOCK_K"):
        linear_act(x, w, b, config=triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}))
    with pytest.raises(TypeError, match=r"unknown key\(s\) FOO"):
        linear_act(x, w, b, config=triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "FOO": 1}))
    with pytest.raises(ValueError, match=r"num_warps must be a power of two in 1..32, got 3"):
        linear_act(x, w, b, config=triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}, num_warps=3))
    with pytest.raises(TypeError, match=r"TMA must be True or False"):
        linear_act(x, w, b, config=triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "TMA": 1}))
    with pytest.raises(ValueError, match=r"apply to the TMA kernels only: set TMA=True"):
        linear_act(x, w, b, config=triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "TMA_STORE": False}))
    with pytest.raises(ValueError, match=r"apply to the TMA kernels only: set TMA=True"):
        linear_act(x, w, b, config=triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "SPLIT_TAIL": True}))
    for group in (0, 2.0, True):
        with pytest.raises(ValueError, match=rf"GROUP_M must be an int >= 1 \(row-blocks per group\), got {group!r}"):
            linear_act(x, w, b, config=configs._cfg(16, 16, 16, 4, 1, group_m=group))


@pytest.mark.parametrize("group", [1, 3, configs.GROUP_M, 16])
def test_grouped_order_writes_every_tile(group):
    """Any GROUP_M writes every output tile (the output is torch.empty, so a tile no program
    computes holds garbage): 7 row-blocks (not a multiple of 3, 8 or 16, fewer than 8 and 16)
    by 5 column-blocks, tails in both."""
    M, K, N = 16 * 6 + 5, 20, 16 * 4 + 1
    x, w, b = linear_inputs(M, K, N, torch.float32)
    config = configs._cfg(16, 16, 16, 4, 1, group_m=group)
    assert configs.config_name(config).endswith(f"-g{group}" if group != configs.GROUP_M else "-s1")
    out = linear_act(x, w, b, "none", config=config)
    torch.testing.assert_close(out, torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Shapes and layouts.
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("lead", [(0,), (2, 0), (0, 3)])
def test_empty_rows_give_empty_result(lead):
    x = torch.empty(*lead, 8, device=DEVICE)
    w = randn(6, 8)
    assert linear_act(x, w, None, "gelu").shape == (*lead, 6)
    assert gated_act(x, w, w).shape == (*lead, 6)


def test_empty_n_gives_empty_result():
    x = randn(3, 8)
    w = torch.empty(0, 8, device=DEVICE)
    assert linear_act(x, w).shape == (3, 0)
    assert gated_act(x, w, w).shape == (3, 0)


def _strided(kind: str, M: int, K: int, dtype) -> torch.Tensor:
    """x (M, K) laid out as ``kind`` (values the same whatever the layout)."""
    x = randn(M, K, dtype=dtype, seed=7)
    if kind == "transposed":
        return x.t().contiguous().t()
    if kind == "padded":
        buf = torch.zeros(M, K + 5, dtype=dtype, device=DEVICE)
        buf[:, :K] = x
        return buf[:, :K]
    if kind == "offset":
        buf = torch.zeros(M * K + 3, dtype=dtype, device=DEVICE)
        view = buf[3:].view(M, K)
        view.copy_(x)
        return view
    return x


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("x_layout", ["contiguous", "transposed", "padded", "offset"])
def test_strided_inputs_match_golden(x_layout, dtype):
    M, K, N = 19, 45, 37
    x = _strided(x_layout, M, K, dtype)
    w_t = randn(K, N, dtype=dtype, scale=K**-0.5, seed=3).t()  # (N, K) view of a (K, N) buffer
    w_pad = _strided("padded", N, K, dtype) * K**-0.5
    b = randn(2 * N, dtype=dtype, seed=4)[::2]  # stride-2 bias
    assert not w_t.is_contiguous() and not b.is_contiguous()
    out = linear_act(x, w_t, b, "gelu_tanh")
    gold = linear_act_eager(x.double(), w_t.double(), b.double(), "gelu_tanh")
    assert rel_err(out, gold) < REL_TOL[dtype]
    out = gated_act(x, w_pad, w_t, b, None, "silu")
    gold = gated_act_eager(x.double(), w_pad.double(), w_t.double(), b.double(), None, "silu")
    assert rel_err(out, gold) < REL_TOL[dtype]


def test_tf32_opt_in_stays_within_its_declared_tolerance():
    # 1e-2: TF32's 10-bit mantissa (see test_reference_kernels.test_linear_tf32_opt_in); the
    # interpreter computes it in fp32, a GPU in TF32
    x, w, b = linear_inputs(33, 96, 40, torch.float32)
    gold = linear_act_eager(x.double(), w.double(), b.double(), "silu")
    assert rel_err(linear_act(x, w, b, "silu", allow_tf32=True), gold) < 1e-2
    assert rel_err(gated_act(x, w, w, activation="silu", allow_tf32=True), gated_act_eager(x.double(), w.double(), w.double())) < 1e-2


def test_leading_dims_are_flattened_and_1d_x_works():
    x3 = randn(2, 5, 24)
    w = randn(10, 24, scale=24**-0.5)
    out = linear_act(x3, w, None, "relu")
    assert out.shape == (2, 5, 10)
    assert rel_err(out, F.relu(F.linear(x3.double(), w.double()))) < REL_TOL[torch.float32]
    out1 = gated_act(x3[0, 0], w, w, activation="gelu")
    assert out1.shape == (10,)
    assert rel_err(out1, gated_act_eager(x3[0, 0].double(), w.double(), w.double(), activation="gelu")) < REL_TOL[torch.float32]


# inf * 0 -> NaN where golden is NaN too (GELU at -inf); the interpreter computes it with numpy, which warns
@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
def test_special_values_follow_pytorch_float64():
    # one row each: -inf, +inf and NaN in x; weights positive so the products keep their sign
    x = torch.tensor([[float("-inf"), 1.0], [float("inf"), 1.0], [float("nan"), 1.0], [-3.0, 1.0]], device=DEVICE)
    w = torch.tensor([[1.0, 0.5], [0.25, 2.0]], device=DEVICE)
    for act in ("none", "relu", "gelu", "gelu_tanh", "silu"):
        out = linear_act(x, w, None, act).double()
        gold = linear_act_eager(x.double(), w.double(), None, act)
        assert torch.equal(torch.isnan(out), torch.isnan(gold)), act
        finite = torch.isfinite(gold)
        assert torch.equal(torch.isinf(out), torch.isinf(gold)), act
        assert torch.allclose(out[finite], gold[finite], rtol=1e-6, atol=1e-6), act


# inf * 0 -> NaN where golden is NaN too (GELU at -inf); the interpreter computes it with numpy, which warns
@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
@pytest.mark.parametrize("config", [None, configs._cfg(16, 64, 64, 4, 2, tma=True, tma_store=False)],
                         ids=["pointer", "tmaload"])
def test_gelu_erf_for_16_bit_outputs_is_within_an_ulp_over_the_whole_range(config):
    # 16-bit outputs take the branch-free erfc form (_epilogue._gelu_erfc): every result within
    # one fp16 rounding of float64 GELU from -12 to 12 (deep negative tail, subnormals, the
    # range where libdevice's erff switches branches) and the same non-finite results.
    # the values come in as the bias of a zero GEMM (x @ w.T = 0), so non-finite ones stay alone
    vals = torch.cat([torch.linspace(-12, 12, 4093), torch.tensor([float("inf"), float("-inf"), float("nan")])])
    b = vals.to(torch.float16).to(DEVICE)
    x = torch.zeros(2, 16, dtype=torch.float16, device=DEVICE)
    w = torch.zeros(b.numel(), 16, dtype=torch.float16, device=DEVICE)
    out = linear_act(x, w, b, "gelu", config=config).double()
    gold = F.gelu(b.double()).expand(2, -1)
    # the gated kernels' epilogue: act(gate) * up with up = 1 (two weight tensors: one passed as
    # both would not pair, and the TMA config would run the pointer kernel)
    w_up = w.clone()
    if config is not None:
        assert gemm_tma.tma_ready(x, w, w_up) == TMA_DEVICE and gemm_tma.pair_layout(w, w_up) is not None
    out_gated = gated_act(x, w, w_up, b, torch.ones_like(b), "gelu", config=config).double()
    assert torch.equal(torch.isnan(out_gated), torch.isnan(out)) and torch.equal(out_gated.nan_to_num(), out.nan_to_num())
    assert torch.equal(torch.isnan(out), torch.isnan(gold)) and torch.equal(torch.isinf(out), torch.isinf(gold))
    finite = torch.isfinite(gold)
    torch.testing.assert_close(out[finite], gold[finite], rtol=2.0**-10, atol=2.0**-24)


# ---------------------------------------------------------------------------------------------
# Every autotune config, forced one by one: correctness must not depend on which one wins.
# ---------------------------------------------------------------------------------------------

def _config_id(c) -> str:
    return configs.config_name(c)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", configs.LINEAR_CONFIGS, ids=_config_id)
def test_every_linear_config(config, dtype):
    bk = config.kwargs["BLOCK_K"]
    # K = BLOCK_K + 1: one full K tile and a one-element tail; M and N cross one tile edge
    M, K, N = config.kwargs["BLOCK_M"] + 1, bk + 1, 19
    if configs.uses_tma(config):  # rows of 16-byte multiples, so the descriptors run; K keeps a tail
        K, N = bk + 8, config.kwargs["BLOCK_N"] + 8
    x, w, b = linear_inputs(M, K, N, dtype, seed=bk)
    if not configs.fits(config, dtype.itemsize, weights=1, target=TARGET):  # the GPU would fail to compile it
        with pytest.raises(ValueError, match=rf"config {configs.config_name(config)} needs about \d+ KB of shared memory"):
            linear_act(x, w, b, config=config)
        return
    if configs.uses_tma(config):
        assert gemm_tma.tma_ready(x, w) == TMA_DEVICE
    act = configs.LINEAR_CONFIGS.index(config) % 5
    act = ("none", "relu", "gelu", "gelu_tanh", "silu")[act]
    out = linear_act(x, w, b, act, config=config)
    gold = linear_act_eager(x.double(), w.double(), b.double(), act)
    eager = linear_act_eager(x, w, b, act)
    assert rel_err(out, gold) <= max(2 * rel_err(eager, gold), REL_TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", configs.GATED_CONFIGS, ids=_config_id)
def test_every_gated_config(config, dtype):
    bk = config.kwargs["BLOCK_K"]
    M, K, N = 17, 2 * bk, config.kwargs["BLOCK_N"] + 3  # K a tile multiple: the unmasked path
    if configs.uses_tma(config):
        N = config.kwargs["BLOCK_N"] + 8
    x, w, b = linear_inputs(M, K, N, dtype, seed=bk)
    if not configs.fits(config, dtype.itemsize, weights=2, target=TARGET):
        with pytest.raises(ValueError, match=rf"config {configs.config_name(config)} needs about \d+ KB of shared memory"):
            gated_act(x, w, w, config=config)
        return
    if configs.uses_tma(config):
        assert gemm_tma.tma_ready(x, w) == TMA_DEVICE
    w_up = randn(N, K, dtype=dtype, scale=K**-0.5, seed=99)
    act = ("silu", "gelu_tanh", "gelu")[configs.GATED_CONFIGS.index(config) % 3]
    out = gated_act(x, w, w_up, b, b, act, config=config)
    gold = gated_act_eager(x.double(), w.double(), w_up.double(), b.double(), b.double(), act)
    eager = gated_act_eager(x, w, w_up, b, b, act)
    assert rel_err(out, gold) <= max(2 * rel_err(eager, gold), REL_TOL[dtype])


def _weight_pair(layout: str, N: int, K: int, dtype):
    """``(w_gate, w_up, paired)`` laid out as ``layout``; ``paired``: whether they read as one
    (2, N, K) tensor (gemm_tma.pair_layout), so the TMA kernel runs."""
    g, u = randn(N, K, dtype=dtype, scale=K**-0.5, seed=5), randn(N, K, dtype=dtype, scale=K**-0.5, seed=6)
    if layout == "separate":
        return g, u, True
    if layout in ("merged", "merged-up-first"):  # one gate_up weight (2N, K), halves in either order
        halves = (g, u) if layout == "merged" else (u, g)
        w = torch.cat(halves)
        return (w[:N], w[N:], True) if layout == "merged" else (w[N:], w[:N], True)
    if layout == "up-first-nan-between":  # up lowest, gate two tensors above, NaN in the gap
        w = torch.cat([u, torch.full_like(u, float("nan")), g])
        return w[2 * N:], w[:N], True
    if layout == "padded-rows":  # both views of NaN-padded rows: the descriptor must stop at K
        pads = [torch.full((N, K + 8), float("nan"), dtype=dtype, device=DEVICE) for _ in range(2)]
        for pad, w in zip(pads, (g, u)):
            pad[:, :K] = w
        return pads[0][:, :K], pads[1][:, :K], True
    if layout == "interleaved":  # rows alternate gate, up (gate_up_proj of GPT-OSS-style weights)
        w = torch.stack([g, u], dim=1)
        return w[:, 0], w[:, 1], True
    if layout == "same-tensor":
        return g, g, False
    # strides differ: up a view of a wider buffer
    wide = torch.zeros(N, K + 8, dtype=dtype, device=DEVICE)
    wide[:, :K] = u
    return g, wide[:, :K], False


@pytest.mark.parametrize("layout", ["separate", "merged", "merged-up-first", "up-first-nan-between",
                                    "padded-rows", "interleaved", "same-tensor", "strides-differ"])
def test_gated_tma_kernel_reads_both_weights_through_one_descriptor_in_any_layout(layout, monkeypatch):
    # Two weights of one stride read as one (2, N, K) tensor, whichever lies lower in memory and
    # whatever lies between them; others run the pointer kernel. Gate and up swapped would give
    # act(up) * gate, far from the golden.
    ran = []
    for name in ("launch_tma", "launch_tiles"):
        real = getattr(dispatch, name)
        monkeypatch.setattr(dispatch, name, lambda *a, _real=real, _name=name: (ran.append(_name), _real(*a)))
    M, K, N, dtype = 40, 72, 48, torch.float16  # K: two tiles of 32 and a tail of 8
    w_gate, w_up, paired = _weight_pair(layout, N, K, dtype)
    x = randn(M, K, dtype=dtype, seed=7)
    b_gate, b_up = randn(N, dtype=dtype, seed=8), randn(N, dtype=dtype, seed=9)
    config = configs._cfg(64, 32, 32, 4, 2, tma=True, tma_store=False)
    out = gated_act(x, w_gate, w_up, b_gate, b_up, "silu", config=config)
    assert ran == ["launch_tma" if paired and TMA_DEVICE else "launch_tiles"]
    gold = gated_act_eager(x.double(), w_gate.double(), w_up.double(), b_gate.double(), b_up.double(), "silu")
    eager = gated_act_eager(x, w_gate, w_up, b_gate, b_up, "silu")
    assert rel_err(out, gold) <= max(2 * rel_err(eager, gold), REL_TOL[dtype])


def test_pair_layout_names_the_lower_tensor_and_the_gap_in_elements(monkeypatch):
    w = torch.zeros(3, 8, 16, dtype=torch.float16, device=DEVICE)
    for a, b, swapped in ((w[0], w[2], False), (w[2], w[0], True)):
        lower, gap, was_swapped = gemm_tma.pair_layout(a, b)
        assert (lower.data_ptr(), gap, was_swapped) == (w[0].data_ptr(), 2 * 8 * 16, swapped)
    assert gemm_tma.pair_layout(w[0], w[0]) is None                       # one tensor: no pair
    assert gemm_tma.pair_layout(w[0], w[1].float()) is None               # dtypes differ
    assert gemm_tma.pair_layout(w[0], w[1, :4]) is None                   # shapes differ
    narrow = torch.zeros(8, 32, dtype=torch.float16, device=DEVICE)[:, :16]
    assert gemm_tma.pair_layout(w[0], narrow) is None                     # strides differ, shapes alike
    # a GPU descriptor's strides stay below 2^40 bytes; the interpreter's are unbounded
    monkeypatch.setattr(gemm_tma, "MAX_STRIDE_BYTES", 2 * 8 * 16 * 2)
    assert (gemm_tma.pair_layout(w[0], w[2]) is None) == (DEVICE == "cuda")
    assert gemm_tma.pair_layout(w[0], w[1]) is not None


# ---------------------------------------------------------------------------------------------
# Split tail: the tiles past the last full wave split along K (reference_kernels.gemm.split_tail).
# ---------------------------------------------------------------------------------------------

def test_split_tail_plan():
    # Qwen2.5-7B gate/up at M = 128 on an H200: 296 tiles of 128 x 64, 28 K steps of 128, 132 SMs
    p = split_tail.plan(296, 28, 132)
    assert (p.dp_tiles, p.splits, p.tail_tiles, p.programs) == (264, 4, 32, 392)
    assert split_tail.plan(264, 28, 132).splits == 1            # full waves: nothing to split
    assert split_tail.plan(56, 148, 132) == split_tail.Plan(0, 2, 56)  # fewer tiles than SMs
    assert split_tail.plan(10, 3, 132).splits == 3              # at most one K step per slice
    assert split_tail.plan(200, 28, 132).splits == 1            # a tail of 68 would take 1 slice
    with pytest.raises(ValueError, match=r"tiles, k_tiles and sms >= 1, got 0, 28, 132"):
        split_tail.plan(0, 28, 132)


@triton.jit
def _schedule_census(whole, slices, k_steps, stray, num_tiles, dp_tiles, splits, k_tiles,
                     SPLIT_TAIL: tl.constexpr, PERSISTENT: tl.constexpr):
    """Counts, per output tile, what the TMA kernels' schedule gives it: whole computations,
    K slices, and K steps over those slices; ``stray`` counts whole tiles past the last."""
    pid = tl.program_id(0)
    last, step = split_tail.whole_tiles(pid, num_tiles, dp_tiles, SPLIT_TAIL, PERSISTENT)
    for tile in tl.range(pid, last, step):
        tl.atomic_add(whole + tile, 1, mask=tile < num_tiles)
        tl.atomic_add(stray, 1, mask=tile >= num_tiles)
    if SPLIT_TAIL:
        sp = split_tail.slice_program(pid, dp_tiles, num_tiles, splits, PERSISTENT)
        if sp >= 0:
            tile, slot, k_lo, k_hi = split_tail.slice_of(sp, dp_tiles, splits, k_tiles)
            tl.atomic_add(slices + tile, 1)
            tl.atomic_add(k_steps + tile, k_hi - k_lo)


@pytest.mark.parametrize("persistent", [False, True], ids=["per-tile", "persistent"])
@pytest.mark.parametrize("split_tail", [False, True], ids=["unsplit", "split-tail"])
@pytest.mark.parametrize("tiles,k_tiles,sms", [(10, 5, 4), (9, 3, 4), (2, 9, 7), (3, 7, 4), (296, 28, 132)])
def test_tma_schedule_computes_each_tile_once(monkeypatch, tiles, k_tiles, sms, split_tail, persistent):
    # The launch plan (gemm_tma.Launch.of) and the kernels' loop bounds together: every output tile
    # is either computed whole by exactly one program, or split into `splits` slices that cover
    # its K steps exactly once. A program that recomputes a tile writes the same values, so the
    # kernels' results cannot show this; it would only cost time.
    monkeypatch.setattr(gemm_tma, "wave", lambda device: sms)
    switches = {"PERSISTENT": persistent, "TMA_STORE": True, "SPLIT_TAIL": split_tail}
    launch = gemm_tma.Launch.of(torch.device(DEVICE), 16, tiles * 16, k_tiles * 16, 16, 16, 16, switches, parts=1)
    whole, slices, k_steps = (torch.zeros(tiles, dtype=torch.int32, device=DEVICE) for _ in range(3))
    stray = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    _schedule_census[launch.grid](whole, slices, k_steps, stray, tiles, launch.dp_tiles, launch.splits,
                                  k_tiles, SPLIT_TAIL=launch.switches["SPLIT_TAIL"], PERSISTENT=persistent)
    assert stray.item() == 0
    split = torch.arange(tiles, device=DEVICE) >= launch.dp_tiles
    assert whole.tolist() == (~split).int().tolist()
    assert slices.tolist() == (split.int() * launch.splits).tolist()
    assert k_steps.tolist() == (split.int() * k_tiles).tolist()
    if persistent:
        assert launch.grid[0] <= sms


SPLIT_CONFIGS = [("linear", c) for c in configs.LINEAR_CONFIGS if configs.tma_switches(c)["SPLIT_TAIL"]] + [
    ("gated", c) for c in configs.GATED_CONFIGS if configs.tma_switches(c)["SPLIT_TAIL"]]


@pytest.fixture
def poisoned_workspace(monkeypatch):
    """Every split-tail workspace starts as NaN: a slice read before it was written (an ordering
    bug on the GPU) shows as NaN, not as the same partial left there by the previous call."""
    real = split_tail.buffers

    def buffers(*args):
        workspace, counters = real(*args)
        return workspace.fill_(float("nan")), counters

    monkeypatch.setattr(split_tail, "buffers", buffers)


REPEATS = 1 if DEVICE == "cpu" else 50
"""Launches compared bit for bit per split-tail case: the interpreter runs programs in order, a
GPU in whatever order its scheduler picks."""


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["wave+2", "under-wave"])
@pytest.mark.parametrize("kernel,config", SPLIT_CONFIGS, ids=lambda v: v if isinstance(v, str) else _config_id(v))
def test_split_tail_configs_sum_their_slices(kernel, config, layout, dtype, poisoned_workspace):
    weights = 1 if kernel == "linear" else 2
    bm, bn, bk = (config.kwargs[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    sms = gemm_tma.wave(torch.device(DEVICE))
    # wave+2: two row tiles x (sms / 2 + 1) column tiles, one full wave and two tiles left;
    # under-wave: two tiles, no whole ones. Either way the split tiles are the last column of
    # tiles, split along five K steps (the last one a tail of 8), unevenly on the CPU (4 SMs).
    # Rows of 16-byte multiples, so the descriptors run.
    M, cols = (bm + 1, sms // 2 + 1) if layout == "wave+2" else (bm - 1, 2)
    N, K = cols * bn - 8, 4 * bk + 8
    launch = gemm_tma.Launch.of(torch.device(DEVICE), M, N, K, bm, bn, bk, configs.tma_switches(config), weights)
    whole = sms if layout == "wave+2" else 0
    assert launch.dp_tiles == whole and launch.splits == min(sms // 2, 5) > 1 and launch.switches["SPLIT_TAIL"]
    # one program per whole tile and slice, or persistent: one per SM (whole tiles, then a slice)
    slices = 2 * launch.splits
    assert launch.grid == ((min(sms, whole + slices),) if launch.switches["PERSISTENT"] else (whole + slices,))
    x, w, b = linear_inputs(M, K, N, dtype, seed=bk)
    if not configs.fits(config, dtype.itemsize, weights, TARGET):
        with pytest.raises(ValueError, match=rf"config {configs.config_name(config)} needs about \d+ KB"):
            linear_act(x, w, b, config=config) if kernel == "linear" else gated_act(x, w, w, config=config)
        return
    assert gemm_tma.tma_ready(x, w) == TMA_DEVICE
    if kernel == "linear":
        run = lambda: linear_act(x, w, b, "gelu", config=config)  # noqa: E731
        gold = linear_act_eager(x.double(), w.double(), b.double(), "gelu")
        eager = linear_act_eager(x, w, b, "gelu")
    else:
        w_up = randn(N, K, dtype=dtype, scale=K**-0.5, seed=99)
        run = lambda: gated_act(x, w, w_up, b, None, "silu", config=config)  # noqa: E731
        gold = gated_act_eager(x.double(), w.double(), w_up.double(), b.double(), None, "silu")
        eager = gated_act_eager(x, w, w_up, b, None, "silu")
    out = run()
    assert rel_err(out, gold) <= max(2 * rel_err(eager, gold), REL_TOL[dtype])
    # the split tiles as close as the rest (bias and activation applied once) ...
    tail = slice((cols - 1) * bn, N)
    assert rel_err(out[:, tail], gold[:, tail]) <= max(2 * rel_err(eager[:, tail], gold[:, tail]), REL_TOL[dtype])
    # ... and summed in slice order whatever order the slices finish in: the same bits every time
    for _ in range(REPEATS):
        assert torch.equal(run(), out)


def _gpu_path(monkeypatch, autotune: bool, cache_dir) -> None:
    """The GPU path's config choice, wired through the interpreter on the CPU; the tuning cache in
    ``cache_dir``, so that fake timings never reach the machine's cache."""
    monkeypatch.setenv(cache.CACHE_ENV, str(cache_dir))
    monkeypatch.setattr(pick, "INTERPRET", False)
    monkeypatch.setattr(pick, "AUTOTUNE", autotune)
    monkeypatch.setattr(pick, "_resolved", {})


def _launch_steps(config: triton.Config, M: int, N: int, K: int) -> int:
    kw = config.kwargs
    return triton.cdiv(M, kw["BLOCK_M"]) * triton.cdiv(N, kw["BLOCK_N"]) * triton.cdiv(K, kw["BLOCK_K"])


@pytest.mark.parametrize("M", [1, 17, 64])
@pytest.mark.parametrize("N", [1, 33, 64])
@pytest.mark.parametrize("K", [1, 31, 64])
def test_the_interpreter_runs_the_smallest_tiles_inside_the_cpu_dim_cap(M, N, K):
    assert configs.interpreter_config(M, N, K) is configs.INTERPRETER_CONFIG


def test_the_interpreter_takes_larger_tiles_only_past_its_step_budget():
    """A MiniLM intermediate (M=60, K=384, N=1536) would be 2304 program x K-step iterations at the
    smallest tiles; the pick takes the smallest tiles under the budget, or the largest there are."""
    picks = [configs.interpreter_config(M, N, K) for M, N, K in [(65, 64, 64), (60, 1536, 384), (8192, 8192, 8192)]]
    sizes = [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]) for c in picks]
    assert sizes[0] == (32, 64, 32) and _launch_steps(picks[0], 65, 64, 64) <= configs.INTERPRETER_PROGRAM_STEPS
    assert picks[1] is picks[2] is configs.INTERPRETER_CONFIGS[-1]
    assert all(_launch_steps(c, 60, 1536, 384) > configs.INTERPRETER_PROGRAM_STEPS for c in configs.INTERPRETER_CONFIGS)


@pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter's own tiles")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_interpreted_calls_past_the_cap_match_golden_at_the_larger_tiles(dtype, monkeypatch):
    seen = []
    real = pick.choose
    monkeypatch.setattr(dispatch, "choose", lambda *a: seen.append(real(*a)) or seen[-1])
    x, w, b = linear_inputs(70, 200, 300, dtype)  # partial tiles in M, N and K at every pick
    assert rel_err(linear_act(x, w, b, "gelu"), linear_act_eager(x.double(), w.double(), b.double(), "gelu")) < REL_TOL[dtype]
    assert rel_err(gated_act(x, w, w, b), gated_act_eager(x.double(), w.double(), w.double(), b.double())) < REL_TOL[dtype]
    assert seen and all(c is not configs.INTERPRETER_CONFIG for c in seen)


def test_untuned_path_runs_the_first_m_class_candidate(monkeypatch, tmp_path):
    _gpu_path(monkeypatch, autotune=False, cache_dir=tmp_path)
    monkeypatch.setattr(pick, "load_table", lambda slug: {})
    seen = []
    real = pick.choose
    monkeypatch.setattr(dispatch, "choose", lambda *a: seen.append(real(*a)) or seen[-1])
    x, w, b = linear_inputs(3, 40, 24, torch.float16)
    assert rel_err(linear_act(x, w, b, "gelu"), linear_act_eager(x.double(), w.double(), b.double(), "gelu")) < REL_TOL[torch.float16]
    assert rel_err(gated_act(x, w, w), gated_act_eager(x.double(), w.double(), w.double())) < REL_TOL[torch.float16]
    assert [c.kwargs["BLOCK_M"] for c in seen] == [16, 16]
    assert seen[0] is configs.candidates(configs.LINEAR_CONFIGS, 3, 2, 1, tma=True, target=TARGET)[0]


def test_tuned_table_pick_is_run_and_unknown_names_are_ignored(monkeypatch, tmp_path):
    _gpu_path(monkeypatch, autotune=False, cache_dir=tmp_path)
    x = torch.empty(300, 64, dtype=torch.float16)
    key = pick.table_key("linear", torch.float16, 300, 96, 64, tma=False)
    assert key == "linear/float16/M512/N128/K64/pointer"
    cands = configs.candidates(configs.LINEAR_CONFIGS, 300, 2, 1, tma=False, target=targets.of_device(x.device))
    want = cands[-1]
    monkeypatch.setattr(pick, "load_table", lambda slug: {key: configs.config_name(want)})
    assert pick.choose("linear", configs.LINEAR_CONFIGS, x, 96, 64, 1, False, run=None) is want
    # a name that is no candidate (a stale table) falls back to the untuned choice
    monkeypatch.setattr(pick, "_resolved", {})
    monkeypatch.setattr(pick, "load_table", lambda slug: {key: "128x128x64-w4-s9"})
    with pytest.warns(RuntimeWarning, match=r"names '128x128x64-w4-s9', which is not a candidate"):
        assert pick.choose("linear", configs.LINEAR_CONFIGS, x, 96, 64, 1, False, run=None) is cands[0]


def test_run_time_tuning_picks_the_fastest_once_per_key(monkeypatch, tmp_path):
    _gpu_path(monkeypatch, autotune=True, cache_dir=tmp_path)
    monkeypatch.setattr(pick, "load_table", lambda slug: {})
    x = torch.empty(4096, 1024, dtype=torch.float16)
    cands = configs.candidates(configs.GATED_CONFIGS, 4096, 2, 2, tma=True, target=targets.of_device(x.device))
    fastest = cands[len(cands) // 2]
    timed = []

    def fake_time(run, c):
        timed.append(c)
        return 1.0 if c is fastest else 2.0

    monkeypatch.setattr(pick, "_time_ms", fake_time)
    for m in (4096, 3000):  # same bucket: tuned once
        assert pick.choose("gated", configs.GATED_CONFIGS, x[:m], 4096, 1024, 2, True, run=None) is fastest
    assert timed == cands


def test_committed_tuned_tables_name_candidate_configs():
    tables = sorted(pick.TABLE_DIR.glob("*.json"))
    assert tables, f"no tuned table in {pick.TABLE_DIR}"
    for path in tables:
        data = json.loads(path.read_text())
        assert data["meta"]["device"] and data["meta"]["date"], path
        # the GPU it was tuned on; a table without meta.target was tuned on an H200
        t = data["meta"].get("target")
        target = targets.Target(tuple(t["capability"]), t["smem_optin"]) if t else targets.HOPPER
        for key, entry in data["picks"].items():
            kernel, dtype, m, n, k, path_kind = key.split("/")
            cfgs = configs.LINEAR_CONFIGS if kernel == "linear" else configs.GATED_CONFIGS
            weights = 1 if kernel == "linear" else 2
            itemsize = getattr(torch, dtype).itemsize
            names = {configs.config_name(c) for c in configs.candidates(cfgs, int(m[1:]), itemsize, weights, path_kind == "tma", target)}
            assert entry["config"] in names, f"{path.name}: {key} -> {entry['config']} is not a candidate"


def test_configs_fit_shared_memory_in_16_bit():
    for c in configs.LINEAR_CONFIGS:
        assert configs.fits(c, 2, weights=1, target=targets.HOPPER), _config_id(c)
    for c in configs.GATED_CONFIGS:
        assert configs.fits(c, 2, weights=2, target=targets.HOPPER), _config_id(c)
    assert len({configs.config_name(c) for c in configs.LINEAR_CONFIGS}) == len(configs.LINEAR_CONFIGS)
    assert len({configs.config_name(c) for c in configs.GATED_CONFIGS}) == len(configs.GATED_CONFIGS)


# the switches only the TMA kernel reads (PERSISTENT, TMA_STORE, SPLIT_TAIL) are set only with TMA
_SWITCHES = [dict(group_m=g) for g in (configs.GROUP_M, 16)] + [
    dict(tma=True, persistent=p, tma_store=s, split_tail=st, group_m=g)
    for p in (False, True) for s in (True, False) for st in (False, True) for g in (configs.GROUP_M, 16)
]


@pytest.mark.parametrize("switches", _SWITCHES, ids=lambda sw: _config_id(configs._cfg(16, 32, 64, 4, 3, **sw)))
def test_a_config_name_spells_its_config(switches):
    # the config tables are written as names: each name must give back the config it names,
    # every switch and its key order included (the tuned tables and the cache key on the names)
    config = configs._cfg(16, 32, 64, 4, 3, **switches)
    back = configs.config_from_name(configs.config_name(config))
    assert list(back.kwargs.items()) == list(config.kwargs.items())
    assert (back.num_warps, back.num_stages) == (config.num_warps, config.num_stages)


@pytest.mark.parametrize("name, why", [
    ("tma-128x128x64-w8", "not a config name: want"),
    ("persistent-tma-16x32x64-w4-s3", "not a config name: want"),
    ("16x32x64-w4-s3 ", "not a config name: want"),
    ("16x32x64-w4-s3-g8", "that config is named '16x32x64-w4-s3'"),
])
def test_a_malformed_config_name_is_named(name, why):
    with pytest.raises(ValueError, match=re.escape(f"{name!r} is ") + ".*" + re.escape(why)):
        configs.config_from_name(name)


# (8, 0): A100; (8, 9): L4; (12, 0): RTX 50xx; (7, 5): not in the table, given its smallest limit
OTHER_GPUS = [(8, 0), (8, 6), (8, 9), (10, 0), (12, 0), (7, 5)]


@pytest.mark.parametrize("capability", OTHER_GPUS, ids=lambda c: f"sm_{c[0]}{c[1]}")
def test_every_gpu_is_offered_only_configs_that_fit_it_on_its_path(capability):
    target = targets.for_capability(capability)
    for cfgs, weights in ((configs.LINEAR_CONFIGS, 1), (configs.GATED_CONFIGS, 2)):
        for itemsize in (2, 4):
            for m in (1, 16, 17, 128, 129, 8192):
                for tma in (True, False):
                    cands = configs.candidates(cfgs, m, itemsize, weights, tma, target)
                    assert cands, (capability, itemsize, m)
                    for c in cands:
                        assert configs.fits(c, itemsize, weights, target), (capability, configs.config_name(c))
                        assert not configs.uses_tma(c) or (tma and capability[0] >= 9), configs.config_name(c)
                        configs.check_forced(c, itemsize, weights, target)


def test_where_no_config_fits_the_first_is_offered_with_fewer_stages():
    l4 = targets.for_capability((8, 9))
    assert l4.smem_optin == 99 * 1024 and l4.smem_budget == 92 * 1024 and not l4.tma
    # 16x32x256-w4-s4 plans 96 KB in fp16: three stages (72 KB) fit the 92 KB budget
    first = configs.LINEAR_CONFIGS[0]
    assert not configs.fits(first, 2, 1, l4)
    cands = configs.candidates(configs.LINEAR_CONFIGS, 1, 2, 1, True, l4)
    assert configs.config_name(cands[0]) == "16x32x256-w4-s3"
    assert configs.shallower(first, 2, 1, l4).kwargs == first.kwargs
    assert configs.shallower(first, 4, 1, targets.Target((8, 9), 16 * 1024)) is None
    with pytest.raises(ValueError, match=r"no config fits the 1 KB .* on sm_89 with 4-byte inputs"):
        configs.candidates(configs.GATED_CONFIGS, 1, 4, 2, True, targets.Target((8, 9), 8 * 1024))


def test_a_forced_config_is_checked_against_its_gpus_shared_memory():
    big = next(c for c in configs.LINEAR_CONFIGS if configs.config_name(c) == "tma-128x256x64-w8-s3")
    configs.check_forced(big, 2, 1, targets.HOPPER)  # 208 KB of the 220
    with pytest.raises(ValueError, match=r"tma-128x256x64-w8-s3 needs about 208 KB .* the 156 KB .* on sm_80"):
        configs.check_forced(big, 2, 1, targets.for_capability((8, 0)))


def test_a_gpus_target_is_what_it_reports(monkeypatch):
    from types import SimpleNamespace

    props = {0: SimpleNamespace(major=8, minor=9, shared_memory_per_block_optin=65536),
             1: SimpleNamespace(major=8, minor=0)}  # a torch build that does not expose the limit
    monkeypatch.setattr(torch.cuda, "get_device_properties", props.__getitem__)
    targets._cuda_target.cache_clear()
    try:
        assert targets.of_device(torch.device("cuda", 0)) == targets.Target((8, 9), 65536)
        assert targets.of_device(torch.device("cuda", 1)) == targets.Target((8, 0), 166912)
        assert not targets.of_device(torch.device("cuda", 1)).tma
    finally:
        targets._cuda_target.cache_clear()
    assert targets.of_device(torch.device("cpu")) is targets.INTERPRETER == targets.HOPPER
    assert targets.HOPPER.smem_budget == 220 * 1024 and targets.HOPPER.tma
    assert targets.for_capability((12, 1)).smem_optin == targets.for_capability((7, 5)).smem_optin == 101376


def test_tuning_is_keyed_on_buckets_not_exact_sizes():
    assert {configs.bucket(m) for m in range(1, 17)} == {16}
    assert {configs.bucket(m) for m in range(17, 33)} == {32}
    assert configs.bucket(8193) == 16384
    # uncapped: Qwen2.5-7B's N = 18944 does not share Llama-3-8B's N = 14336 bucket
    assert configs.bucket(18944) == 32768 != configs.bucket(14336)
    # decode picks 16-row tiles only, prefill never does; TMA configs only when the inputs allow
    decode = configs.candidates(configs.LINEAR_CONFIGS, 1, 2, 1, tma=True, target=targets.HOPPER)
    prefill = configs.candidates(configs.LINEAR_CONFIGS, 8192, 2, 1, tma=False, target=targets.HOPPER)
    assert decode and all(c.kwargs["BLOCK_M"] == 16 for c in decode)
    assert any(configs.uses_tma(c) for c in decode)
    assert prefill and all(c.kwargs["BLOCK_M"] >= 64 and not configs.uses_tma(c) for c in prefill)
    # fp32 drops configs whose pipeline does not fit, but never leaves nothing
    fp32 = configs.candidates(configs.GATED_CONFIGS, 8192, 4, 2, tma=True, target=targets.HOPPER)
    assert fp32 and all(configs.fits(c, 4, 2, targets.HOPPER) for c in fp32)
    assert configs.candidates(configs.GATED_CONFIGS, 1, 4, 2, tma=True, target=targets.HOPPER)


def test_tma_path_needs_aligned_contiguous_rows():
    x = torch.empty(8, 64, dtype=torch.float16, device=DEVICE)
    assert gemm_tma.tma_ready(x, x[:, :40]) == (DEVICE == "cpu" or torch.cuda.get_device_capability()[0] >= 9)
    assert not gemm_tma.tma_ready(x, x.t())                 # last stride not 1
    assert not gemm_tma.tma_ready(torch.empty(8, 60, dtype=torch.float16, device=DEVICE))  # 120-byte rows
    assert not gemm_tma.tma_ready(x[:, 1:])                 # base off 16-byte alignment


# ---------------------------------------------------------------------------------------------
# Modules: built from a model's own MLP blocks, weights shared, output unchanged.
# ---------------------------------------------------------------------------------------------

class Conv1D(nn.Module):
    """transformers' GPT-2 Conv1D: weight stored (in, out), y = x @ W + b."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * nx**-0.5)
        self.bias = nn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], self.nf)


class NewGELUActivation(nn.Module):
    """transformers' GPT-2 activation: gelu with the tanh approximation."""

    def forward(self, x):
        return F.gelu(x, approximate="tanh")


class QuickGELUActivation(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


class GPT2MLP(nn.Module):
    def __init__(self, h, i):
        super().__init__()
        self.c_fc, self.c_proj, self.act, self.dropout = Conv1D(i, h), Conv1D(h, i), NewGELUActivation(), nn.Dropout(0.1)

    def forward(self, x):
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class LlamaMLP(nn.Module):
    def __init__(self, h, i, act=None):
        super().__init__()
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)
        self.act_fn = act if act is not None else nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class BertIntermediate(nn.Module):
    def __init__(self, h, i):
        super().__init__()
        self.dense = nn.Linear(h, i)
        self.intermediate_act_fn = nn.GELU()

    def forward(self, x):
        return self.intermediate_act_fn(self.dense(x))


class Block(nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.norm = nn.LayerNorm(mlp_width := 32)
        self.mlp = mlp
        self.width = mlp_width

    def forward(self, x):
        return x + self.mlp(self.norm(x))


def _model():
    torch.manual_seed(0)
    return nn.Sequential(
        Block(LlamaMLP(32, 48)),
        Block(LlamaMLP(32, 48, nn.GELU(approximate="tanh"))),
        Block(GPT2MLP(32, 48)),
        nn.Sequential(BertIntermediate(32, 48), nn.Linear(48, 32)),
    ).to(DEVICE).eval()


def test_swap_mlps_shares_weights_and_keeps_output():
    model = _model()
    x = torch.randn(3, 5, 32, device=DEVICE)
    with torch.no_grad():
        before = model(x)
    keys = set(model.state_dict())
    ptrs = {k: v.data_ptr() for k, v in model.state_dict().items()}
    n_params = sum(p.numel() for p in model.parameters())

    assert swap_mlps(model) == 4
    assert isinstance(model[0].mlp, FusedGatedMLP) and model[0].mlp.activation == "silu"
    assert isinstance(model[1].mlp, FusedGatedMLP) and model[1].mlp.activation == "gelu_tanh"
    assert isinstance(model[2].mlp, FusedMLP) and model[2].mlp.activation == "gelu_tanh"
    assert isinstance(model[3][0], FusedLinearAct) and model[3][0].activation == "gelu"
    # shared, not copied: same keys, same storage, no new parameters
    assert set(model.state_dict()) == keys
    assert {k: v.data_ptr() for k, v in model.state_dict().items()} == ptrs
    assert sum(p.numel() for p in model.parameters()) == n_params
    with torch.no_grad():
        after = model(x)
    assert rel_err(after, before.double()) < 2e-6
    assert swap_mlps(model) == 0  # fused blocks are not swapped again


def test_gpt2_conv1d_weight_is_read_transposed_in_place():
    mlp = GPT2MLP(32, 48).to(DEVICE).eval()
    fused = FusedMLP.from_module(mlp)
    assert fused.c_fc.weight is mlp.c_fc.weight  # the same Parameter
    x = torch.randn(7, 32, device=DEVICE)
    with torch.no_grad():
        assert rel_err(fused(x), mlp(x).double()) < 2e-6


def test_down_projection_choice_gives_same_result():
    mlp = LlamaMLP(32, 48).to(DEVICE).eval()
    x = torch.randn(9, 32, device=DEVICE)
    with torch.no_grad():
        a = FusedGatedMLP.from_module(mlp, down="torch")(x)
        b = FusedGatedMLP.from_module(mlp, down="triton")(x)
        ref = gated_mlp_eager(x.double(), mlp.gate_proj.weight.double(), mlp.up_proj.weight.double(), mlp.down_proj.weight.double())
    assert rel_err(a, ref) < 2e-6 and rel_err(b, ref) < 2e-6
    with pytest.raises(ValueError, match=r"down must be one of"):
        FusedGatedMLP.from_module(mlp, down="cublas")


def test_unknown_activation_is_named():
    mlp = LlamaMLP(8, 16, QuickGELUActivation())
    with pytest.raises(ValueError, match=r"unsupported activation QuickGELUActivation"):
        FusedGatedMLP.from_module(mlp)
    model = nn.Sequential(Block.__new__(Block))
    nn.Module.__init__(model[0])
    model[0].mlp = mlp
    with pytest.raises(ValueError, match=r"QuickGELUActivation"):
        swap_mlps(model)
    assert swap_mlps(model, strict=False) == 0 and model[0].mlp is mlp


@pytest.mark.parametrize(
    "act, name",
    [(nn.SiLU(), "silu"), (nn.GELU(), "gelu"), (nn.GELU(approximate="tanh"), "gelu_tanh"), (nn.ReLU(), "relu"),
     (NewGELUActivation(), "gelu_tanh"), (type("PytorchGELUTanh", (nn.Module,), {})(), "gelu_tanh"),
     (type("GELUActivation", (nn.Module,), {})(), "gelu"), (F.silu, "silu")],
)
def test_activation_name(act, name):
    assert activation_name(act) == name


def test_not_an_mlp_is_named():
    with pytest.raises(ValueError, match=r"Linear is not a recognised Linear-act-Linear MLP"):
        FusedMLP.from_module(nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"missing gate_proj, up_proj, down_proj, act_fn"):
        FusedGatedMLP.from_module(nn.Linear(2, 2))


def test_mlp_functions_match_eager():
    M, H, I = 11, 24, 40
    x = randn(M, H)
    w1, b1 = randn(I, H, scale=H**-0.5, seed=1), randn(I, seed=2)
    w2, b2 = randn(H, I, scale=I**-0.5, seed=3), randn(H, seed=4)
    from reference_kernels.models.modules import gated_mlp, mlp

    gold = mlp_eager(x.double(), w1.double(), b1.double(), w2.double(), b2.double(), activation="gelu")
    assert rel_err(mlp(x, w1, b1, w2, b2, activation="gelu"), gold) < 2e-6
    gold = gated_mlp_eager(x.double(), w1.double(), w1.double(), w2.double(), activation="silu")
    assert rel_err(gated_mlp(x, w1, w1, w2, activation="silu"), gold) < 2e-6


# ---------------------------------------------------------------------------------------------
# The shape catalog.
# ---------------------------------------------------------------------------------------------

def test_catalog_holds_the_design_shapes():
    table = {(s.slug, s.hidden, s.intermediate, s.kind, s.activation, s.bias) for s in shapes.CATALOG}
    assert ("seed-geglu", 768, 3072, "gated", "gelu_tanh", False) in table
    assert ("llama3-8b", 4096, 14336, "gated", "silu", False) in table
    assert ("minilm", 384, 1536, "plain", "gelu", True) in table
    assert shapes.SEED_GEGLU.tokens == (8192,)
    cases = shapes.bench_cases(shapes.select(kind="gated", activation="silu"))
    assert len(cases) == 3 * len(shapes.TOKENS)
    assert cases["llama3-70b-M8192"] == dict(M=8192, K=8192, N=28672, dtypes=("bfloat16", "float16"))
    with pytest.raises(ValueError, match=r"kind must be 'plain' or 'gated'"):
        shapes.select(kind="moe")

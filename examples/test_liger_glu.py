"""pytest-fusion applied to kernels this project did not write: Liger-Kernel's SwiGLU and GeGLU.

Liger (``liger-kernel`` on PyPI) fuses the gated activation of a SwiGLU / GeGLU MLP,
``act(gate) * up``, into one Triton kernel per row, behind a ``torch.autograd.Function``:
``LigerSiLUMulFunction`` (silu) and ``LigerGELUMulFunction`` (gelu, tanh approximation). The
eager references below are what a Llama / Gemma MLP computes between its projections.

Run: ``python3 -m pytest examples/test_liger_glu.py`` (correctness) and add ``--fusion-bench`` on
a GPU to time the bench cases against eager and torch.compile. Under the Triton interpreter (no
GPU) Liger's kernels do not run; each test is then skipped with the interpreter's error as the
reason (see examples/interpreter.py). What the plugin finds: docs/reference-kernels.md, "Liger-Kernel".
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from examples.interpreter import probe_or_skip
from pytest_fusion import check_inputs
from reference_kernels.kernels.eager import gated_act_eager, gated_mlp_eager
from reference_kernels.models.modules import gated_mlp
from reference_kernels.models.shapes import gated_flops, gated_mlp_flops

swiglu_ops = pytest.importorskip("liger_kernel.ops.swiglu", reason="liger-kernel not installed")
geglu_ops = pytest.importorskip("liger_kernel.ops.geglu", reason="liger-kernel not installed")


def silu_mul(gate, up):
    """Eager SwiGLU activation: ``silu(gate) * up``; gate, up: (M, N); returns (M, N)."""
    return F.silu(gate) * up


def gelu_tanh_mul(gate, up):
    """Eager GeGLU activation (tanh GELU, as Gemma): ``gelu_tanh(gate) * up``; (M, N) -> (M, N)."""
    return F.gelu(gate, approximate="tanh") * up


def liger_swiglu(gate, up):
    """Liger's fused SwiGLU forward; gate, up: (M, N) -> (M, N) in their dtype."""
    return swiglu_ops.LigerSiLUMulFunction.apply(gate, up)


def liger_geglu(gate, up):
    """Liger's fused GeGLU (tanh) forward; gate, up: (M, N) -> (M, N) in their dtype."""
    return geglu_ops.LigerGELUMulFunction.apply(gate, up)


def _probe(kernel):
    # A tiny call first: under the interpreter the whole test is skipped with its error, instead
    # of every Hypothesis example crashing the same way.
    probe_or_skip(kernel, torch.ones(2, 8), torch.ones(2, 8))
    return kernel


# Real intermediate sizes N (reference_kernels/shapes.py's CATALOG); M = tokens. Elementwise kernels are
# memory-bound, so the plugin's default bytes (inputs + output) gives the GB/s that matters.
SWIGLU_BENCH = {
    "llama3-8b-decode": dict(M=1, N=14336),
    "llama3-8b-m1024": dict(M=1024, N=14336),
    "llama3-8b-m8192": dict(M=8192, N=14336),
    "qwen2.5-7b-m8192": dict(M=8192, N=18944),
}
GEGLU_BENCH = {
    "seed-blog-m8192": dict(M=8192, N=3072),
    "gemma-2b-decode": dict(M=1, N=16384),
    "gemma-2b-m8192": dict(M=8192, N=16384),
}
BENCH_DTYPES = ("bfloat16", "float16")

# N up to Llama-3-70B's 28672; Liger takes one row per program with BLOCK_SIZE = next_pow2(N),
# so N = 1 and non-powers of two exercise its masking.
GLU_DIMS = {"M": (1, 8192), "N": (1, 28672)}


@pytest.mark.fused_kernel(
    reference=silu_mul,
    inputs={"gate": ("M", "N"), "up": ("M", "N")},
    dims=GLU_DIMS,
    dtypes=("float16", "bfloat16", "float32"),
    special_values=True,
    bench={name: {**dims, "dtypes": BENCH_DTYPES} for name, dims in SWIGLU_BENCH.items()},
)
def test_liger_swiglu():
    return _probe(liger_swiglu)


@pytest.mark.fused_kernel(
    reference=gelu_tanh_mul,
    inputs={"gate": ("M", "N"), "up": ("M", "N")},
    dims=GLU_DIMS,
    dtypes=("float16", "bfloat16", "float32"),
    special_values=True,
    bench={name: {**dims, "dtypes": BENCH_DTYPES} for name, dims in GEGLU_BENCH.items()},
)
def test_liger_geglu():
    return _probe(liger_geglu)


# --- backward (the marker's backward=True) -------------------------------------------------------
# Liger's backward kernels store d_gate and d_up into the storage of the gate and up tensors saved
# in forward (swiglu.py / geglu.py: tl.store(a_ptr ...), tl.store(b_ptr ...)), to save memory in
# training. When the caller's gate/up are contiguous, forward saves them without a copy, so the
# caller's tensors come back overwritten with gradients: the backward check, which holds every
# input bitwise unchanged through the backward, fails it. When they are not contiguous, Liger's
# ensure_contiguous copies them and the copies, saved for backward, take the gradients: a second
# backward over the graph (retain_graph=True) would read gradients as activations, so the check
# fails that too unless the spec declares retain_graph=False. These tests pin both findings (they
# fail if Liger stops doing it).


@pytest.mark.parametrize("kernel, reference", [(liger_swiglu, silu_mul), (liger_geglu, gelu_tanh_mul)],
                         ids=["swiglu", "geglu"])
def test_liger_backward_writes_into_its_inputs(kernel, reference):
    from pytest_fusion import Case, InputMutated, make_inputs, make_spec

    device = "cuda" if torch.cuda.is_available() else "cpu"
    probe_or_skip(kernel, torch.ones(2, 8), torch.ones(2, 8))
    spec = make_spec(reference, inputs={"gate": ("M", "N"), "up": ("M", "N")},
                     dims={"M": (4, 4), "N": (96, 96)}, backward=True)
    case = Case(dims={"M": 4, "N": 96}, dtype="float32", layouts={}, seed=0)
    inputs = list(make_inputs(spec, case, device).values())
    written = r"wrote into input 'gate' .*'up' .*; backward\); a backward must leave"
    with pytest.raises(InputMutated, match=written):
        check_inputs(spec, kernel, inputs)


def test_liger_backward_consumes_what_its_forward_saved():
    """Transposed (non-contiguous) gate and up: Liger's copies, not the caller's tensors, take the
    gradients. A spec that keeps retain_graph=True fails it naming the saved tensor; with
    retain_graph=False the gradients are checked against golden's, and pass."""
    from pytest_fusion import Case, SavedTensorMutated, make_inputs, make_spec

    device = "cuda" if torch.cuda.is_available() else "cpu"
    probe_or_skip(liger_swiglu, torch.ones(2, 8), torch.ones(2, 8))
    common = dict(inputs={"gate": ("M", "N"), "up": ("M", "N")}, dims={"M": (4, 4), "N": (96, 96)},
                  backward=True)
    layouts = {"gate": "transposed", "up": "transposed"}
    case = Case(dims={"M": 4, "N": 96}, dtype="float32", layouts=layouts, seed=0)
    spec = make_spec(silu_mul, **common)
    inputs = list(make_inputs(spec, case, device).values())
    with pytest.raises(SavedTensorMutated, match="wrote into saved tensor 0 of LigerSiLUMulFunctionBackward"):
        check_inputs(spec, liger_swiglu, inputs)
    found = check_inputs(make_spec(silu_mul, **common, retain_graph=False), liger_swiglu, inputs)[0]
    assert len(found) == 3 and all(c.mismatches == 0 for c in found)  # the output, d_gate, d_up


# Liger's own MLPs (LigerSwiGLUMLP, LigerGEGLUMLP) feed the Function the outputs of the gate and up
# projections, intermediates nobody else reads, and run one backward per forward: the marker says
# so with retain_graph=False. Declared that way, as x -> act(x W_gate^T) * (x W_up^T) with cuBLAS
# projections, the marker checks Liger's gradients of x, W_gate and W_up against the float64
# golden's and times forward + backward (the -fwdbwd cases) at the shapes tests/oracle/test_backward.py
# times this project's fused gate/up kernel at.

LIGER_ACTS = {"silu": swiglu_ops.LigerSiLUMulFunction, "gelu_tanh": geglu_ops.LigerGELUMulFunction}


def liger_gated_act(x, w_gate, w_up, activation="silu"):
    """Liger's gated activation as its MLP applies it: ``Liger(act)(x @ w_gate.T, x @ w_up.T)``.

    x: (M, K); w_gate, w_up: (N, K); returns (M, N) in x's dtype, with Liger's backward kernel
    behind it. ``activation``: "silu" (LigerSiLUMulFunction) or "gelu_tanh" (LigerGELUMulFunction).
    """
    return LIGER_ACTS[activation].apply(F.linear(x, w_gate), F.linear(x, w_up))


def _probe_gated(activation):
    x, w = torch.ones(2, 8), torch.ones(8, 8)
    probe_or_skip(liger_gated_act, x, w, w, activation=activation)
    return liger_gated_act


LIGER_BACKWARD = dict(
    reference=gated_act_eager,
    inputs={"x": ("M", "K"), "w_gate": ("N", "K"), "w_up": ("N", "K")},
    dims={"M": (1, 2048), "K": (1, 4096), "N": (1, 16384)},
    dtypes=("float16", "bfloat16", "float32"),
    backward=True,
    retain_graph=False,
    flops=gated_flops,
)


@pytest.mark.fused_kernel(
    **LIGER_BACKWARD, constants={"activation": "silu"},
    bench={"llama3-8b-m1024": dict(M=1024, K=4096, N=14336, dtypes=("bfloat16",))},
)
def test_liger_swiglu_backward():
    """Liger's SwiGLU with its gradients (Llama-3-8B's 4096 -> 14336 on a GPU bench)."""
    return _probe_gated("silu")


@pytest.mark.fused_kernel(
    **LIGER_BACKWARD, constants={"activation": "gelu_tanh"},
    bench={"gemma-2b-m1024": dict(M=1024, K=2048, N=16384, dtypes=("bfloat16",))},
)
def test_liger_geglu_backward():
    """Liger's GeGLU (tanh) with its gradients (Gemma-2B's 2048 -> 16384 on a GPU bench)."""
    return _probe_gated("gelu_tanh")


# --- the host launcher under the autograd.Function ----------------------------------------------
# liger_kernel.ops exports swiglu_forward, the launcher the Function calls after its
# ensure_contiguous. The launcher passes the *output's* row stride for gate, up and output alike,
# so an input with a padded leading dimension is read at the wrong rows. The plugin's "padded"
# layout finds it; Hypothesis shrinks it to M=2, N=1 with only `up` padded.


def liger_swiglu_launcher(gate, up):
    """liger_kernel.ops.swiglu.swiglu_forward(gate, up) -> its output c (M, N)."""
    return swiglu_ops.swiglu_forward(gate, up)[2]


def test_liger_launcher_reads_padded_rows_at_the_wrong_stride():
    from pytest_fusion import Case, KernelMismatch, check_case, make_spec

    device = "cuda" if torch.cuda.is_available() else "cpu"
    probe_or_skip(liger_swiglu_launcher, torch.ones(2, 8), torch.ones(2, 8))
    spec = make_spec(silu_mul, inputs={"gate": ("M", "N"), "up": ("M", "N")}, dims={"M": (8, 8), "N": (40, 40)})
    padded = Case(dims={"M": 8, "N": 40}, dtype="float32", layouts={"gate": "contiguous", "up": "padded"}, seed=0)
    with pytest.raises(KernelMismatch, match=r"layouts  gate: contiguous \(shape 8x40, strides \(40, 1\), offset 0\)\n"
                                             r" +up: padded \(shape 8x40, strides \(43, 1\), offset 0\)"):
        check_case(spec, liger_swiglu_launcher, padded, device=device)
    # the same values contiguous pass: the stride, not the arithmetic, is wrong
    check_case(spec, liger_swiglu_launcher, Case(dims=padded.dims, dtype="float32", layouts={}, seed=0), device=device)


# --- the seed blog's GeGLU MLP: this project's fused kernel against Liger's ---------------------
# Liger's LigerGEGLUMLP computes down(LigerGELUMul(gate(x), up(x))): cuBLAS projections around its
# fused activation. The fused kernel here (reference_kernels.kernels.gated_mlp) computes gate and up in one
# GEMM with the activation in the epilogue. Benchmark mode times both against eager and compile,
# so the seed MLP's speedup over Liger's GeGLU can be read off.


def liger_geglu_mlp(x, w_gate, w_up, w_down, activation="gelu_tanh"):
    """Liger-Kernel's GeGLU MLP forward; x (M, K), w_gate and w_up (N, K), w_down (K, N) -> (M, K)."""
    if activation != "gelu_tanh":
        raise ValueError(f"Liger's GeGLU is gelu_tanh only, got activation={activation!r}")
    return F.linear(liger_geglu(F.linear(x, w_gate), F.linear(x, w_up)), w_down)


@pytest.mark.fused_kernel(
    reference=gated_mlp_eager,
    inputs={"x": ("M", "K"), "w_gate": ("N", "K"), "w_up": ("N", "K"), "w_down": ("K", "N")},
    dims={"M": (1, 1024), "K": (1, 1024), "N": (1, 4096)},
    dtypes=("bfloat16",),
    constants={"activation": "gelu_tanh"},
    bench={"seed-blog": dict(M=8192, K=768, N=3072)},
    providers={"liger": liger_geglu_mlp},
    flops=gated_mlp_flops,
)
def test_seed_geglu_mlp_against_liger():
    """The seed blog's GeGLU MLP (M = 64 x 128, 768 -> 3072, bf16): fused kernel vs Liger."""
    return gated_mlp

"""Faults of the classes a looser default budget let through, one per class, each failing with its
kind and a shrunk case that points at it (docs/oracle.md#what-each-default-catches). Every run uses
default settings; only Hypothesis' seed is fixed (``--hypothesis-seed``) so that the run is
reproducible: how often other seeds catch each fault is not measured here.

Plain-torch kernels are marked ``triton=False``, so on the CPU they run at the element budget
(K up to 4096) rather than under the 64-per-dim interpreter cap.
"""

from __future__ import annotations

import pytest

from conftest import failure_reports, interpreter_loops, shrunk_dims

SEED = "--hypothesis-seed=1"


def shrunk_failure(pytester: pytest.Pytester, name: str, source: str, lines: list[str]) -> dict[str, int]:
    """The shrunk dims of the one test in ``source`` (written as ``name``.py), run at
    :data:`SEED`, after asserting that it failed and that its output matches ``lines``."""
    pytester.makepyfile(**{name: source})
    result = pytester.runpytest("-p", "no:cacheprovider", SEED)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(lines)
    return shrunk_dims(result.stdout.str())

LINEAR = '''
import math
import pytest
import torch
import torch.nn.functional as F


def linear(x, weight):
    return F.linear(x, weight)


def fp16_accumulating_linear(x, weight):
    # A GEMM whose accumulator is float16: each 16-wide k-step (one tl.dot) is summed in fp32 and
    # added into a float16 accumulator, as `acc = tl.zeros(..., tl.float16)` does in Triton.
    acc = torch.zeros(x.shape[0], weight.shape[0], dtype=torch.float16, device=x.device)
    for k0 in range(0, x.shape[1], 16):
        acc = (acc.float() + x[:, k0:k0 + 16].float() @ weight[:, k0:k0 + 16].float().T).half()
    return acc


@pytest.mark.fused_kernel(reference=linear, inputs={"x": ("M", "K"), "weight": ("N", "K")},
                          dims={"M": (1, 64), "K": (1, 4096), "N": (1, 64)}, dtypes=("float16",), triton=False)
def test_fp16_accumulation():
    return fp16_accumulating_linear
'''


def test_fp16_accumulation_in_a_float16_test_is_caught(pytester: pytest.Pytester, cpu_only: None) -> None:
    dims = shrunk_failure(pytester, "test_acc", LINEAR, [
        "*[[]pytest-fusion] mismatch: * elements of the output outside the error budget*",
        "*budget  *eager's error here*ulp of float16*"])
    # The error grows with K (docs/oracle.md#float16-accumulation-measured): shrinking keeps K long
    # and M, N small.
    assert dims["K"] >= 256 and dims["M"] * dims["N"] <= 64 * 64, dims


GEGLU = '''
import pytest
import torch
import torch.nn.functional as F


def geglu(x, w_gate, w_up):
    return F.gelu(F.linear(x, w_gate), approximate="tanh") * F.linear(x, w_up)


def tanh_of_exponentials(z):
    e = torch.exp(2 * z)
    return (e - 1) / (e + 1)  # inf / inf = NaN once 2z passes float32's exp range (|gate| > ~10)


def fused_geglu(x, w_gate, w_up):
    gate = (x.float() @ w_gate.float().T)
    up = (x.float() @ w_up.float().T)
    inner = 0.7978845608028654 * (gate + 0.044715 * gate ** 3)
    return (0.5 * gate * (1 + tanh_of_exponentials(inner)) * up).to(x.dtype)


@pytest.mark.fused_kernel(reference=geglu, inputs={"x": ("M", "K"), "w_gate": ("N", "K"), "w_up": ("N", "K")},
                          dims={"M": (1, 256), "K": (1, 256), "N": (1, 256)}, dtypes=("float32",), triton=False,
                          special_values=False)  # on, an inf gate already shows it: this isolates the tier
def test_geglu():
    return fused_geglu
'''


def test_geglu_overflowing_for_a_large_gate_is_caught(pytester: pytest.Pytester) -> None:
    # Either value tier reaches a gate past ~10: normals at amplitude 30 with one K term, or the
    # exact tier's dyadic values summed over a few (the Hypothesis profile decides which shrinks first)
    lines = {"budget": ["*[[]pytest-fusion] mismatch: * outside the error budget*", "*amplitude: 30*",
                        "*NaN/inf misplaced: [1-9]*"],
             "exact": ["*[[]pytest-fusion] mismatch: exact values: *", "*values: exact*", "*kernel=nan*"]}
    pytester.makepyfile(test_geglu=GEGLU)
    result = pytester.runpytest("-p", "no:cacheprovider", SEED)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    tier = "exact" if "mismatch: exact values" in out else "budget"
    result.stdout.fnmatch_lines(lines[tier])
    dims = shrunk_dims(out)
    assert dims["M"] == 1 and dims["N"] <= 8 and dims["K"] <= (1 if tier == "budget" else 8), dims


RELU = '''
import pytest
import torch
import torch.nn.functional as F


def linear_relu(x, weight):
    return F.relu(F.linear(x, weight))


def fused(x, weight):
    y = x @ weight.T
    return torch.where(y > 0, y, 0.0)  # max(y, 0) as tl.maximum computes it: NaN > 0 is false, NaN -> 0


@pytest.mark.fused_kernel(reference=linear_relu, inputs={"x": ("M", "K"), "weight": ("N", "K")},
                          dims={"M": (1, 256), "K": (1, 256), "N": (1, 256)}, dtypes=("float32",), triton=False)
def test_relu():
    return fused
'''


def test_relu_mapping_nan_to_zero_is_caught_by_default(pytester: pytest.Pytester) -> None:
    dims = shrunk_failure(pytester, "test_relu", RELU,
                          ["*[[]pytest-fusion] mismatch:*", "*special values: yes*", "*NaN/inf misplaced: [1-9]*"])
    # Where the NaN is planted is drawn from the case's seed, so the smallest failing case can need a
    # second output element (M=1 K=1 N=2 with the guard bands' own random stream); never more.
    assert dims["M"] == dims["K"] == 1 and dims["N"] <= 2


TF32 = '''
import pytest
import torch
import torch.nn.functional as F

torch.set_float32_matmul_precision("medium")  # the test process lowers its own precision


def linear(x, weight):
    return F.linear(x, weight)


def tf32(t):
    # Round to nearest on 10 mantissa bits, as a tensor core reads fp32 operands in TF32 mode.
    bits = t.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32).view(t.shape)


def fused(x, weight):
    return (tf32(x).double() @ tf32(weight).double().T).float()


@pytest.mark.fused_kernel(reference=linear, inputs={"x": ("M", "K"), "weight": ("N", "K")},
                          dims={"M": (1, 64), "K": (1, 64), "N": (1, 64)}, dtypes=("float32",), triton=False)
def test_tf32():
    return fused


def test_zz_precision_left_as_the_process_set():
    assert torch.get_float32_matmul_precision() == "medium"
    assert torch.backends.mkldnn.matmul.fp32_precision == "bf16"
'''


def test_tf32_operands_under_lowered_process_precision_are_caught(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_tf32=TF32)
    # In a subprocess: the module lowers the precision of the process it is imported in.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", SEED, "-p", "no:randomly")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] mismatch:*", "*budget  *ulp of float32*"])
    dims = shrunk_dims(result.stdout.str())
    assert max(dims.values()) == 1, dims  # one product of TF32-rounded operands is already off


BUCKET = '''
import pytest
import torch
import torch.nn.functional as F


def linear(x, weight, bias):
    return F.linear(x, weight, bias)


def dispatching_linear(x, weight, bias):
    out = x @ weight.T + bias
    if 128 < x.shape[0] <= 256:  # the variant tuned for the 256-row bucket adds the bias twice
        out = out + bias
    return out


@pytest.mark.fused_kernel(reference=linear, inputs={"x": ("M", "K"), "weight": ("N", "K"), "bias": ("N",)},
                          dims={"M": (1, 2048), "K": (1, 2048), "N": (1, 2048)}, dtypes=("float32",), triton=False)
def test_bucket():
    return dispatching_linear
'''


def test_wrong_variant_for_one_power_of_two_bucket_is_caught(pytester: pytest.Pytester) -> None:
    dims = shrunk_failure(pytester, "test_bucket", BUCKET, ["*[[]pytest-fusion] mismatch:*"])
    assert dims["M"] == 129 and dims["K"] == 1 and dims["N"] == 1, dims  # the bucket's first row count


@interpreter_loops
def test_triton_path_above_the_interpreter_cap_runs_once(fusion_pytester: pytest.Pytester, cpu_only: None) -> None:
    from fakes import TEST_FILE

    fusion_pytester.makepyfile(test_kernel=TEST_FILE.format(fault="large_m", activation="gelu_tanh", special=True)
                               .replace('"M": (1, 4096), "K": (1, 4096), "N": (1, 4096)',
                                        '"M": (1, 4096), "K": (1, 64), "N": (1, 64)')
                               .replace('dtypes=("float16", "float32")', 'dtypes=("float32",)'))
    result = fusion_pytester.runpytest("-p", "no:cacheprovider", SEED)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] mismatch:*", "*Found by an edge case*"])
    out = failure_reports(result.stdout.str())
    dims = shrunk_dims(out)
    assert dims == {"M": 65, "K": 1, "N": 1}, dims  # just above the cap of 64, every other dim at its low end

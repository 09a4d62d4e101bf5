"""Eager parity (``eager_parity=True``): the kernel's output must be eager's, bit for bit.

Eager is the reference run in the test dtype, as :func:`pytest_fusion.oracle.golden.run_reference`
computes it. Parity is for elementwise and normalisation kernels written to replace eager exactly
(a fused bias + GELU, an RMSNorm): there a kernel that keeps an fp32 intermediate where eager rounds
to bf16 first is within the error budget, often closer to golden than eager, and still changes
every downstream number of a model whose outputs were validated against eager.

It does not fit a kernel containing a GEMM: cuBLAS, CUTLASS and Triton each pick their own
summation order (tile sizes, split-K, atomics) by shape and device, so eager's bits are not a
contract even between two eager runs on different GPUs; the error budget is the check there. A
normalisation kernel reduces too (a row's sum of squares): parity holds for it only where it
reproduces eager's reduction, which is what such a kernel promises when it asks for parity.

Parity adds to the error budget, never replaces it: the budget runs first and still reports a
kernel far from golden as a mismatch against golden, and what it measures (the ulps per output)
is recorded as without parity. A kernel bitwise equal to eager always meets the budget (which
allows eager's own error at each element, and NaN/inf where eager has them), so parity only
tightens it.

Equality is of bits, so ``-0.0`` differs from ``0.0`` (eager's sign of zero is part of what an
exact replacement returns), with one exception decided here: NaN equals NaN at the same place
whatever its sign and payload (torch does not specify NaN payloads, and x86, CUDA and Triton
produce different default NaNs for the same invalid operation).
"""

from __future__ import annotations

import torch

from pytest_fusion.oracle.failures import EagerMismatch, FailureMessages
from pytest_fusion.oracle.tensors import element_bits


def _ordered(t: torch.Tensor) -> torch.Tensor:
    """Each float's bits as an int64 that orders like the float (sign-magnitude to two's
    complement): the difference of two such ints is their distance in ulps (+-0.0 both map to 0)."""
    bits = element_bits(t).to(torch.int64)
    sign_bit = 1 << (8 * t.element_size() - 1)
    magnitude = bits & (sign_bit - 1)
    return torch.where(bits < 0, -magnitude, magnitude)


def differing(kernel: torch.Tensor, eager: torch.Tensor) -> torch.Tensor:
    """A bool tensor of ``kernel``'s shape: where its bits differ from ``eager``'s (same shape and
    dtype), NaN at the same place counting as equal whatever its payload."""
    if not kernel.dtype.is_floating_point:
        return kernel != eager
    diff = element_bits(kernel) != element_bits(eager)
    return diff & ~(kernel.isnan() & eager.isnan())


def check_parity(
    kernel: torch.Tensor, eager: torch.Tensor, where: str, call: str, fail: FailureMessages
) -> None:
    """Raise :class:`EagerMismatch` unless ``kernel`` is bitwise ``eager`` (NaN == NaN at the same
    place). Both have the output's shape and dtype (the oracle checked that first).

    The message names ``where`` (``"output"`` or ``"output i"``), the count of differing elements,
    the first one in row-major order with both values, their bits and their distance in ulps of
    the output dtype.
    """
    diff = differing(kernel, eager)
    count = int(diff.sum())
    if not count:
        return
    flat = int(diff.reshape(-1).nonzero()[0, 0])
    index = [int(i) for i in torch.unravel_index(torch.tensor(flat), kernel.shape)]
    k, e = kernel.reshape(-1)[flat], eager.reshape(-1)[flat]
    detail = f"  first    {index}: kernel={float(k):.8g} eager={float(e):.8g}"
    if kernel.dtype.is_floating_point:
        width = 2 * kernel.element_size()
        hexes = [f"0x{int(element_bits(v)) & ((1 << 4 * width) - 1):0{width}x}" for v in (k, e)]
        if k.isnan() or e.isnan():
            distance = "NaN against a number"
        else:
            ulps = int(_ordered(k.reshape(1))[0] - _ordered(e.reshape(1))[0])
            distance = f"{ulps:+d} ulp of {str(kernel.dtype).removeprefix('torch.')}"
        detail += f" (bits {hexes[0]} vs {hexes[1]}): {distance}"
    detail += (
        "\n  parity   eager_parity=True: the kernel must return eager's bits in the test dtype"
        " (NaN == NaN at the same place; -0.0 != 0.0)"
    )
    raise fail(
        EagerMismatch,
        f"{count} of {kernel.numel()} elements of the {where} differ from eager's bits ({call})",
        detail,
    )

"""When the TMA (tensor-descriptor) path can run, and the host-side descriptors it needs.

Hopper's TMA unit copies a tile between global and shared memory from a descriptor of the whole
tensor (base, shape, strides, tile shape), zero-filling reads past the edges and clipping writes.
Its rules (CUDA driver API, cuTensorMapEncodeTiled): a 16-byte aligned base, the last stride 1,
every other stride a multiple of 16 bytes. Tensors that break them run the pointer kernel instead.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton

from reference_kernels.gemm import split_tail, targets
from reference_kernels.gemm.targets import INTERPRET

try:  # Triton >= 3.4 (host-side descriptors); absent: the pointer kernels only
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton
    TensorDescriptor = None


@functools.cache
def num_sms(index: int) -> int:
    """Streaming multiprocessors of CUDA device ``index``: the grid of a persistent kernel."""
    return torch.cuda.get_device_properties(index).multi_processor_count


INTERPRETER_SMS = 4
"""SMs the launch plans assume under the interpreter (any count is correct): a persistent
kernel launches this many programs, and a split-tail launch splits tiles past multiples of it."""


def wave(device: torch.device) -> int:
    """Programs that run at once in the launch plans: the SM count of a CUDA device,
    :data:`INTERPRETER_SMS` elsewhere."""
    return INTERPRETER_SMS if device.type != "cuda" else num_sms(device.index or 0)


@dataclasses.dataclass(frozen=True)
class Launch:
    """Grid, compile-time switches and split-tail arguments of one TMA kernel launch (see
    :meth:`of`)."""

    grid: tuple[int]
    switches: dict[str, bool]
    dp_tiles: int
    splits: int
    workspace: torch.Tensor | None
    counters: torch.Tensor | None

    @classmethod
    def of(
        cls,
        device: torch.device,
        M: int,
        N: int,
        K: int,
        block_m: int,
        block_n: int,
        block_k: int,
        switches: dict[str, bool],
        parts: int,
    ) -> Launch:
        """How a config with TMA ``switches`` (configs.tma_switches) runs an M x N x K GEMM:
        one program per BLOCK_M x BLOCK_N output tile; with ``PERSISTENT`` at most one per SM
        (each walks several tiles); with ``SPLIT_TAIL`` the tiles past the last full wave split
        along K (:func:`reference_kernels.gemm.split_tail.plan`), with a workspace for ``parts`` fp32
        accumulators per slice: one program per whole tile and per slice, or with ``PERSISTENT``
        too one per SM, each walking its whole tiles and then taking one slice. When the plan
        splits nothing, SPLIT_TAIL is switched off and workspace and counters are None (unused
        by the kernel)."""
        tiles = triton.cdiv(M, block_m) * triton.cdiv(N, block_n)
        sms = wave(device)
        if switches["SPLIT_TAIL"]:
            p = split_tail.plan(tiles, triton.cdiv(K, block_k), sms)
            if p.splits > 1:
                ws, counters = split_tail.buffers(p, parts, block_m, block_n, device)
                # persistent: one program per SM (dp_tiles is a multiple of sms and the tail has
                # at most sms slices, so each program walks dp_tiles / sms tiles, then one slice)
                programs = min(sms, p.programs) if switches["PERSISTENT"] else p.programs
                return cls((programs,), switches, p.dp_tiles, p.splits, ws, counters)
        switches = {**switches, "SPLIT_TAIL": False}
        if switches["PERSISTENT"]:
            return cls((max(1, min(sms, tiles)),), switches, tiles, 1, None, None)
        return cls((tiles,), switches, tiles, 1, None, None)


def tma_ready(*tensors: torch.Tensor) -> bool:
    """Whether every tensor (2-D) can be read or written through a TMA descriptor on its device:
    Triton has host descriptors, the GPU runs the TMA kernels (targets.supports_tma: sm_90 or
    newer; or the interpreter runs), the last stride is 1, the row stride a multiple of 16 bytes,
    the base 16-byte aligned."""
    if TensorDescriptor is None:
        return False
    t0 = tensors[0]
    if t0.device.type == "cuda":
        if not targets.of_device(t0.device).tma:
            return False
    elif not INTERPRET:
        return False
    for t in tensors:
        size = t.element_size()
        if t.stride(1) != 1 or (t.stride(0) * size) % 16 or t.data_ptr() % 16:
            return False
    return True


def descriptor(t: torch.Tensor, block: list[int]):
    """A host TMA descriptor of the 2-D tensor ``t`` moving ``block``-shaped tiles."""
    return TensorDescriptor.from_tensor(t, block)


MAX_STRIDE_BYTES = 1 << 40
"""TMA's bound on a stride (cuTensorMapEncodeTiled: strides are multiples of 16 bytes below 2^40)."""


def pair_layout(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, int, bool] | None:
    """How two 2-D tensors read as one 3-D tensor ``pair`` with ``pair[0]``, ``pair[1]`` the
    lower- and higher-addressed of them: ``(lower, gap, swapped)``, ``gap`` the distance between
    their bases in elements (the pair dimension's stride), ``swapped`` True when ``b`` is the
    lower one. Any two distinct tensors of one dtype, shape and strides qualify (separate
    allocations, the halves of a merged gate_up weight, its interleaved rows), as long as on a
    GPU the gap stays below :data:`MAX_STRIDE_BYTES` (under the interpreter nothing bounds it);
    None for any other two. A descriptor over a pair reads only the two tensors' own elements
    (TMA clips each coordinate at its extent: 2, rows, cols), never the memory between them.

    Call after :func:`tma_ready` (16-byte aligned bases, so the gap is a multiple of 16 bytes)."""
    if a.dtype != b.dtype or a.shape != b.shape or a.stride() != b.stride():
        return None
    lower, higher, swapped = (a, b, False) if b.data_ptr() >= a.data_ptr() else (b, a, True)
    gap = higher.data_ptr() - lower.data_ptr()
    if gap == 0 or (lower.device.type == "cuda" and gap >= MAX_STRIDE_BYTES):
        return None
    return lower, gap // lower.element_size(), swapped


def pair_descriptor(a: torch.Tensor, b: torch.Tensor, block: list[int]):
    """``(descriptor, swapped)``: a host TMA descriptor of the (2, rows, cols) pair of ``a`` and
    ``b`` (:func:`pair_layout`, which must not be None) moving ``[2, *block]`` tiles, both
    tensors' ``block`` tiles at one position in one copy.

    Raises:
        ValueError: the tensors do not pair."""
    layout = pair_layout(a, b)
    if layout is None:
        raise ValueError("pair_descriptor: the tensors do not read as one (2, rows, cols) tensor")
    lower, gap, swapped = layout
    rows, cols = lower.shape
    return TensorDescriptor(lower, [2, rows, cols], [gap, lower.stride(0), 1], [2, *block]), swapped

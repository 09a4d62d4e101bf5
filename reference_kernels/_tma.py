"""When the TMA (tensor-descriptor) path can run, and the host-side descriptors it needs.

Hopper's TMA unit copies a tile between global and shared memory from a descriptor of the whole
tensor (base, shape, strides, tile shape), zero-filling reads past the edges and clipping writes.
Its rules (CUDA driver API, cuTensorMapEncodeTiled): a 16-byte aligned base, the last stride 1,
every other stride a multiple of 16 bytes. Tensors that break them run the pointer kernel instead.
"""

from __future__ import annotations

import functools

import torch
import triton

from reference_kernels.configs import INTERPRET

try:  # Triton >= 3.4 (host-side descriptors); absent: the pointer kernels only
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton
    TensorDescriptor = None


@functools.lru_cache(maxsize=None)
def _device_has_tma(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


@functools.lru_cache(maxsize=None)
def num_sms(index: int) -> int:
    """Streaming multiprocessors of CUDA device ``index``: the grid of a persistent kernel."""
    return torch.cuda.get_device_properties(index).multi_processor_count


INTERPRETER_SMS = 4
"""Programs a persistent kernel launches under the interpreter (any count is correct)."""


def grid(device: torch.device, M: int, N: int, block_m: int, block_n: int, persistent: bool) -> tuple[int]:
    """Programs a TMA kernel launches: one per BLOCK_M x BLOCK_N output tile, or for a
    persistent kernel at most one per SM (each then walks several tiles)."""
    tiles = triton.cdiv(M, block_m) * triton.cdiv(N, block_n)
    if not persistent:
        return (tiles,)
    sms = INTERPRETER_SMS if device.type != "cuda" else num_sms(device.index or 0)
    return (max(1, min(sms, tiles)),)


def tma_ready(*tensors: torch.Tensor) -> bool:
    """Whether every tensor (2-D) can be read or written through a TMA descriptor on its device:
    Triton has host descriptors, the GPU is sm_90 or newer (or the interpreter runs), the last
    stride is 1, the row stride a multiple of 16 bytes, the base 16-byte aligned."""
    if TensorDescriptor is None:
        return False
    t0 = tensors[0]
    if t0.device.type == "cuda":
        if not _device_has_tma(t0.device.index or 0):
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

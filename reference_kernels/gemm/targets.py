"""What a GPU architecture gives the reference kernels: the launch path and the shared memory.

Two rules, each in one place:

- the path: :func:`supports_tma` decides from the compute capability whether the TMA kernels
  (tensor descriptors, and wgmma or tcgen05 behind them) can run, or every config runs the
  pointer kernel; :func:`reference_kernels.gemm.tma.tma_ready` and
  :func:`reference_kernels.gemm.configs.candidates` both ask it.
- the budget: :attr:`Target.smem_budget`, the bytes a config's pipeline
  (:func:`reference_kernels.gemm.configs.smem_bytes`) may plan for: the per-block opt-in limit of the
  GPU less :data:`SMEM_MARGIN_BYTES`.

A CUDA device's target is its own capability and the limit it reports (:func:`of_device`);
:func:`for_capability` gives a capability's target from the table, for GPUs that are not here
(tests/kernels/arch_compile.py compiles the kernels for each).
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from pytest_fusion.machine.devices import interpreter_active

INTERPRET = interpreter_active()
"""True when the Triton interpreter runs the kernels (read once, at import, as Triton does)."""

SMEM_OPTIN_BYTES: dict[tuple[int, int], int] = {
    (8, 0): 166912,  # A100, A30: 163 KB
    (8, 6): 101376,  # A10, A40, RTX 30xx: 99 KB
    (8, 7): 166912,  # Jetson Orin: 163 KB
    (8, 9): 101376,  # L4, L40, RTX 40xx: 99 KB
    (9, 0): 232448,  # H100, H200: 227 KB
    (10, 0): 232448,  # B200: 227 KB
    (12, 0): 101376,  # RTX 50xx: 99 KB
}
"""Shared memory one block may opt in to, in bytes, by compute capability (major, minor): the
CUDA C++ Programming Guide's technical specifications per compute capability ("maximum amount
of shared memory per thread block"), what the device reports as
``cudaDevAttrMaxSharedMemoryPerBlockOptin`` and Triton checks a compiled kernel's
``metadata.shared`` against when it loads it."""

SMEM_MARGIN_BYTES = 7 * 1024
"""Bytes of a target's limit left out of the budget for what configs.smem_bytes does not count:
the barriers and layout conversions Triton adds (227 - 7 = 220 KB on sm_90)."""


def supports_tma(capability: tuple[int, int]) -> bool:
    """Whether a GPU of compute capability ``capability`` (major, minor) runs the TMA kernels:
    the TMA unit came with Hopper (sm_90); before it every config runs the pointer kernel."""
    return capability[0] >= 9


@dataclasses.dataclass(frozen=True)
class Target:
    """A GPU the kernels run on, or compile for.

    Attributes:
        capability: compute capability (major, minor), e.g. (9, 0) for an H100.
        smem_optin: shared memory one block may opt in to, in bytes.
    """

    capability: tuple[int, int]
    smem_optin: int

    @property
    def name(self) -> str:
        """``sm_<major><minor>``, e.g. ``sm_90``."""
        return f"sm_{self.capability[0]}{self.capability[1]}"

    @property
    def tma(self) -> bool:
        """Whether the TMA kernels run here (:func:`supports_tma`)."""
        return supports_tma(self.capability)

    @property
    def smem_budget(self) -> int:
        """Bytes of shared memory a config's pipeline may plan for: the opt-in limit less
        :data:`SMEM_MARGIN_BYTES`."""
        return self.smem_optin - SMEM_MARGIN_BYTES


def for_capability(capability: tuple[int, int]) -> Target:
    """The target of a GPU of compute capability ``capability`` (major, minor), its limit from
    :data:`SMEM_OPTIN_BYTES`; a capability the table lacks gets the table's smallest (99 KB)."""
    capability = (int(capability[0]), int(capability[1]))
    return Target(capability, SMEM_OPTIN_BYTES.get(capability, min(SMEM_OPTIN_BYTES.values())))


HOPPER = for_capability((9, 0))
"""sm_90 (H100, H200): the GPUs the configs and the committed tuned table were made on."""

INTERPRETER = HOPPER
"""The target under the Triton interpreter (CPU tensors): Hopper's, since the interpreter
emulates the tensor descriptors and a config is checked there as an H100 would run it."""


def of_device(device: torch.device) -> Target:
    """The target a tensor on ``device`` runs on: a CUDA device's own capability and the opt-in
    limit it reports (the table's where this torch build does not expose it); for any other
    device (the interpreter's CPU tensors) :data:`INTERPRETER`."""
    if device.type != "cuda":
        return INTERPRETER
    return _cuda_target(device.index or 0)


@functools.cache
def _cuda_target(index: int) -> Target:
    props = torch.cuda.get_device_properties(index)
    capability = (props.major, props.minor)
    # torch's name for cudaDeviceProp::sharedMemPerBlockOptin; the table's value without it
    reported = int(getattr(props, "shared_memory_per_block_optin", 0) or 0)
    return Target(capability, reported or for_capability(capability).smem_optin)

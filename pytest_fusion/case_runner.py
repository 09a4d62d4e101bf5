"""Running one property's cases through the oracle: a failing case runs again at once (a failure
that does not repeat is kept apart, not raised), a large case on a GPU waits for its device's
large-case lock, and the memory a case leaves cached goes back to the driver, so xdist workers
sharing one GPU do not run it out of memory; declared dims whose largest case cannot fit on the
GPU are refused before any case runs."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from contextlib import AbstractContextManager
from typing import Any, Callable, Mapping

from pytest_fusion.devices import large_case_lock
from pytest_fusion.oracle import (
    FusionFailure,
    NondeterminismWarning,
    NondeterministicFailure,
    check_case,
    describe_case,
)
from pytest_fusion.spec import FusionUsageError, KernelSpec
from pytest_fusion.strategies import bounded_shapes, largest_dims
from pytest_fusion.tensors import Case, draw_values, shape_of, torch_dtype

RELEASE_CACHED_BYTES = 2**30
"""A case that leaves more than this much CUDA memory reserved by torch's caching allocator gives
it back to the driver (``torch.cuda.empty_cache``). A full-size case holds tens of GB (an
M=8192 K=8192 N=28672 gated MLP with its float64 golden held about 40 GB on an H200), and xdist
workers sharing one GPU would otherwise each keep their peak reserved between cases and run the
others out of memory. Below 1 GiB the cache is kept: small cases reuse it."""


LARGE_CASE_ELEMENTS = 2**27
"""A case on a GPU whose largest tensor (an input, or a matrix over two of its dims, as the outputs
of an (M, K) x (N, K) kernel are) holds more than this many elements (1 GiB in float64) runs holding
its device's large-case lock (:func:`pytest_fusion.devices.large_case_lock`), so that xdist workers
sharing one GPU run one such case at a time. The float64 golden makes a case take several times its
inputs' size: an M=8192 K=8192 N=28672 gated MLP held about 40 GB on an H200, and three workers
running such cases at once ran it out of memory."""


def largest_tensor_elements(spec: KernelSpec, case: Case) -> int:
    """Elements of ``case``'s largest tensor: each input, and each matrix over two of its dims (an
    output the spec does not declare), at the case's dims."""
    size = lambda s: int(s) if isinstance(s, int) else case.dims[s]  # noqa: E731
    return max((math.prod(size(s) for s in shape) for shape in bounded_shapes(spec)), default=0)


def is_large_case(spec: KernelSpec, case: Case, device: str) -> bool:
    """Whether ``case`` runs on a CUDA device holding its large-case lock (:data:`LARGE_CASE_ELEMENTS`)."""
    return str(device).startswith("cuda") and largest_tensor_elements(spec, case) > LARGE_CASE_ELEMENTS


def large_case_guard(spec: KernelSpec, case: Case, device: str) -> AbstractContextManager[None]:
    """The device's large-case lock when :func:`is_large_case`, else a no-op."""
    if is_large_case(spec, case, device):
        return large_case_lock(device, holder=describe_case(case).splitlines()[0])
    return contextlib.nullcontext()


GOLDEN_FLOAT_BYTES = 8
"""The golden runs on the kernel's device on float64 copies of the floating inputs (integer and
bool inputs stay as they are; ``reference_runs.upcast``): 8 bytes per floating input element."""


def device_memory_bytes(device: str) -> int:
    """Total memory of CUDA device ``device`` in bytes (``cudaDeviceProp.totalGlobalMem``)."""
    import torch

    return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)


def golden_input_bytes(spec: KernelSpec, dims: Mapping[str, int]) -> int:
    """Bytes of the golden's copies of ``spec``'s inputs at ``dims`` (:data:`GOLDEN_FLOAT_BYTES` per
    floating element, an integer or bool input's own size per element)."""
    total = 0
    for t in spec.inputs.values():
        dtype = torch_dtype(t.dtype) if t.dtype else None  # None: the test dtype, a float
        size = GOLDEN_FLOAT_BYTES if dtype is None or dtype.is_floating_point else dtype.itemsize
        total += size * math.prod(shape_of(t, dims))
    return total


def check_fits(spec: KernelSpec, device: str, *, max_dim: int | None = None,
               max_elements: int | None = None) -> None:
    """Refuse, before any case runs, declared dims whose largest drawable case
    (:func:`~pytest_fusion.strategies.largest_dims` under the same caps) cannot be checked on CUDA
    device ``device``: the golden's copies of its inputs alone (:func:`golden_input_bytes`) exceed
    the device's memory. Such a case would run the GPU out of memory, or stall first while its
    float32 values are drawn on the host (M=K=200000, 160 GB of them, had not finished after two
    minutes on an H200). A no-op on the CPU, whose draws are capped (``check.size_limits``).

    Raises:
        FusionUsageError: naming the case's dims, its bytes and the device's, and the two remedies.
    """
    if not str(device).startswith("cuda"):
        return
    dims = largest_dims(spec, max_dim=max_dim, max_elements=max_elements)
    need, total = golden_input_bytes(spec, dims), device_memory_bytes(device)
    if need > total:
        at = " ".join(f"{k}={v}" for k, v in dims.items())
        raise FusionUsageError(
            f"the declared dims reach a case too large to check on {device}: at {at} the golden's "
            f"float64 copies of the inputs alone take {need / 1e9:.1f} GB of the device's "
            f"{total / 1e9:.1f} GB. Declare smaller dims, or cap every drawn dim with --fusion-max-dim "
            "(check_kernel's max_dim)."
        )


def release_cached_memory(device: str) -> None:
    """Return the CUDA caching allocator's unused blocks to the driver when ``device`` is a CUDA
    device and more than :data:`RELEASE_CACHED_BYTES` are reserved."""
    if not str(device).startswith("cuda"):
        return
    import torch

    if torch.cuda.is_available() and torch.cuda.memory_reserved(device) > RELEASE_CACHED_BYTES:
        torch.cuda.empty_cache()


@dataclasses.dataclass
class CaseRunner:
    """Checks one property's cases through the oracle (:func:`oracle.check_case`) and keeps what it
    saw: cases whose two calls differed bitwise, failures that did not repeat, and the case of each
    failure it raised."""

    spec: KernelSpec
    kernel: Callable[..., Any]
    device: str
    repro: Callable[[Case], str] | None = None
    every_config: bool = False
    nondeterministic: list[Case] = dataclasses.field(default_factory=list)
    flaky: list[FusionFailure] = dataclasses.field(default_factory=list)
    # id of each failure raised -> its case
    failed_cases: dict[int, Case] = dataclasses.field(default_factory=dict)
    checked: int = 0

    def run_case(self, case: Case) -> None:
        """Check ``case`` once, holding the large-case lock where it needs it, noting nondeterminism.
        A large case draws its values on the host first: the lock is for the device's memory, and
        other workers' cases use the device meanwhile."""
        values = draw_values(self.spec, case) if is_large_case(self.spec, case, self.device) else None
        with large_case_guard(self.spec, case, self.device):
            try:
                if not check_case(
                    self.spec, self.kernel, case, device=self.device, repro=self.repro, warn=False,
                    every_config=self.every_config, values=values,
                ).deterministic:
                    self.nondeterministic.append(case)
            finally:
                release_cached_memory(self.device)

    def check(self, case: Case) -> None:
        """Check ``case``; a failing case runs again at once, and its first failure is raised only
        when it fails again (else it goes to :attr:`flaky`)."""
        self.checked += 1
        try:
            self.run_case(case)
        except FusionFailure as first:
            try:
                self.run_case(case)
            except FusionFailure:
                self.failed_cases[id(first)] = case
                raise first from None
            self.flaky.append(first)

    def report(self) -> None:
        """After a search that raised nothing: :class:`NondeterministicFailure` when a failure did not
        repeat, else a :class:`NondeterminismWarning` at run_property's caller when a case's two calls
        differed."""
        if self.flaky:
            first = self.flaky[0]
            raise NondeterministicFailure(
                f"[pytest-fusion] {NondeterministicFailure.kind}: a case failed, and the same case run "
                f"again passed ({len(self.flaky)} such case(s) in {self.checked}); the failure depends on "
                "something outside the case (timing, state an earlier call left behind, uninitialised "
                "memory). First failure:\n" + str(first)
            )
        if self.nondeterministic:  # warned once here, outside Hypothesis' runs of the property
            warnings.warn(
                NondeterminismWarning(
                    "two runs of the kernel on the same inputs differ bitwise in "
                    f"{len(self.nondeterministic)} of {self.checked} cases (pass deterministic=True to fail "
                    "on it); first:\n"
                    f"{describe_case(self.nondeterministic[0])}"
                ),
                stacklevel=3,
            )

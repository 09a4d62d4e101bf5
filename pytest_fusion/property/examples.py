"""Running one property's cases through the oracle: a failing case runs again at once (a failure
that does not repeat is kept apart, not raised), each case on a GPU is admitted against its
device's free memory (:mod:`pytest_fusion.oracle.memory`) and the memory it leaves cached goes back to
the driver, so xdist workers sharing one GPU do not run it out of memory; declared dims whose
largest case cannot fit on the GPU even alone are refused before any case runs."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable

from pytest_fusion.declare.spec import FusionUsageError, KernelSpec
from pytest_fusion.oracle import memory
from pytest_fusion.oracle.case import check_case, describe_case
from pytest_fusion.oracle.failures import FusionFailure, NondeterminismWarning, NondeterministicFailure
from pytest_fusion.oracle.tensors import Case, draw_values, torch_dtype
from pytest_fusion.property.strategies import largest_dims

RELEASE_CACHED_BYTES = 2**30
"""A case that leaves more than this much CUDA memory reserved by torch's caching allocator gives
it back to the driver (``torch.cuda.empty_cache``). A full-size case holds tens of GB
(docs/oracle.md#large-cases-on-a-gpu), and xdist workers sharing one GPU would otherwise each keep
their peak reserved between cases, memory that the others' admission
(:mod:`pytest_fusion.oracle.memory`) cannot use. Below 1 GiB the cache is kept: small cases reuse it."""

DRAW_FIRST_BYTES = 2**30
"""A case whose footprint passes this draws its values on the host before it queues for its
device's memory: that draw is seconds of CPU work at full dims, which need not wait."""


def check_fits(spec: KernelSpec, device: str, *, max_dim: int | None = None,
               max_elements: int | None = None) -> None:
    """Refuse, before any case runs, declared dims whose largest drawable case
    (:func:`~pytest_fusion.property.strategies.largest_dims` under the same caps, contiguous) cannot be
    checked on CUDA device ``device`` even alone: its footprint
    (:func:`pytest_fusion.oracle.memory.case_bytes`) exceeds the device's memory less the admission's
    headroom (:func:`pytest_fusion.oracle.memory.fits_alone`).
    Such a case would run the GPU out of memory, or stall first while its float32 values are drawn
    on the host (docs/oracle.md#large-cases-on-a-gpu). A no-op on the CPU, whose draws are capped
    (``check.size_limits``), and for a reference that cannot be traced (its cases run alone).

    Raises:
        FusionUsageError: naming the case's dims, its bytes and the device's, and the two remedies.
    """
    if not str(device).startswith("cuda"):
        return
    dims = largest_dims(spec, max_dim=max_dim, max_elements=max_elements)
    dtype = max(spec.dtypes, key=lambda d: torch_dtype(d).itemsize)
    need = memory.case_bytes(spec, Case(dims=dims, dtype=dtype, layouts={}, seed=0), device)
    total = memory.device_total_bytes(device)
    if need is not None and not memory.fits_alone(need, total):
        at = " ".join(f"{k}={v}" for k, v in dims.items())
        raise FusionUsageError(
            f"the declared dims reach a case too large to check on {device}: at {at} ({dtype}) the "
            f"check holds about {need / 1e9:.1f} GB at its peak (inputs, their float64 golden, eager, "
            f"both kernel calls' outputs and the comparison) of the device's {total / 1e9:.1f} GB. "
            "Declare smaller dims, or cap every drawn dim with --fusion-max-dim (check_kernel's max_dim)."
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
    """Checks one property's cases through the oracle (:func:`pytest_fusion.oracle.case.check_case`)
    and keeps what it saw: cases whose two calls differed bitwise, failures that did not repeat, and
    the case of each failure it raised."""

    spec: KernelSpec
    kernel: Callable[..., Any]
    device: str
    repro: Callable[[Case], str] | None = None
    every_config: bool = False
    notify: Callable[[str], None] | None = None
    """Told when a case queues long for its device's memory (``memory.admitted``'s ``notify``)."""
    nondeterministic: list[Case] = dataclasses.field(default_factory=list)
    flaky: list[FusionFailure] = dataclasses.field(default_factory=list)
    # id of each failure raised -> its case
    failed_cases: dict[int, Case] = dataclasses.field(default_factory=dict)
    checked: int = 0
    cases: list[Case] = dataclasses.field(default_factory=list)
    """Every case checked, in order (the config tier picks the smallest)."""

    def run_case(self, case: Case) -> None:
        """Check ``case`` once, admitted to its device's memory (:mod:`pytest_fusion.oracle.memory`),
        noting nondeterminism. A large case draws its values on the host first: the admission is
        for the device's memory, and other workers' cases use the device meanwhile."""
        need = memory.case_bytes(self.spec, case, self.device)
        values = draw_values(self.spec, case) if need is None or need > DRAW_FIRST_BYTES else None
        holder = describe_case(case, self.spec).splitlines()[0].strip()
        with memory.admitted(self.device, need, holder=holder, notify=self.notify):
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
        self.cases.append(case)
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
            failure = NondeterministicFailure(
                f"[pytest-fusion] {NondeterministicFailure.kind}: a case failed, and the same case run "
                f"again passed ({len(self.flaky)} such case(s) in {self.checked}); the failure depends on "
                "something outside the case (timing, state an earlier call left behind, uninitialised "
                "memory). First failure:\n" + str(first)
            )
            failure.case, failure.repro = first.case, first.repro
            raise failure
        if self.nondeterministic:  # warned once here, outside Hypothesis' runs of the property
            warnings.warn(
                NondeterminismWarning(
                    "two runs of the kernel on the same inputs differ bitwise in "
                    f"{len(self.nondeterministic)} of {self.checked} cases (pass deterministic=True to fail "
                    "on it); first:\n"
                    f"{describe_case(self.nondeterministic[0], self.spec)}"
                ),
                stacklevel=3,
            )

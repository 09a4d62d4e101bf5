"""The config tier: once a property's search has passed, its smallest cases are checked again with
each config of the kernel's autotuned Triton kernels pinned in turn, within a time budget.

The autotuner runs one config per shape, its pick, so a bug in a tile config it does not pick on
this GPU (a gated-GEMM epilogue duplicating rows at one tile size, a quantized matmul dropping the
last K scale block at one BLOCK_K) is never checked. ``--fusion-all-configs`` checks every config
at every case; this tier checks them on ``declare.spec.CONFIG_TIER_CASES`` small cases, the configs
in rotation from where the previous run stopped (``pytest_fusion.plugin.config_tier`` keeps the
place), so successive runs cover them all, each within its budget. A failure names its config
and replays with ``--fusion-all-configs``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Iterator, Sequence

from pytest_fusion.declare.spec import CONFIG_TIER_CASES, KernelSpec
from pytest_fusion.oracle import autotune
from pytest_fusion.oracle.case import check_case
from pytest_fusion.oracle.tensors import Case


@dataclasses.dataclass
class ConfigTier:
    """One test's config tier in one dtype: its budget and place in the rotation, then what ran.

    ``budget_s``: seconds for the first case's configs (at least one config runs; the other cases
    check the same configs); ``offset``: the config index the rotation starts at; ``repro``: the
    repro of a case checked at every config (``--fusion-all-configs``).
    """

    budget_s: float
    offset: int = 0
    repro: Callable[[Case], str] | None = None
    checked: list[int] = dataclasses.field(default_factory=list)
    """Indices of the configs checked, in the order they ran."""
    total: int = 0
    """Configs of the autotuned kernels (the most any one has); 0: no autotuned kernel ran."""

    @property
    def next_offset(self) -> int:
        """Where the next run's rotation starts: after the last config checked here."""
        return (self.offset + len(self.checked)) % self.total if self.total else self.offset

    def run(self, spec: KernelSpec, kernel: Callable[..., Any], cases: Sequence[Case], *,
            device: str) -> None:
        """Check the ``CONFIG_TIER_CASES`` smallest distinct ``cases`` with configs pinned
        (module docstring).

        Raises:
            pytest_fusion.oracle.failures.FusionFailure: a case fails at a pinned config (the
                message names it, ``autotune <kernel>: config i of n``).
        """
        if not autotune.config_count():
            return  # the search's last case ran no autotuned kernel: nothing to pin
        for n, case in enumerate(smallest(cases, CONFIG_TIER_CASES)):
            check_case(spec, kernel, case, device=device, repro=self.repro, warn=False,
                       configs=self._rotation if n == 0 else lambda total: list(self.checked))

    def _rotation(self, total: int) -> Iterator[int]:
        self.total = total
        self.offset %= max(total, 1)
        start = time.perf_counter()
        for step in range(total):
            if self.checked and time.perf_counter() - start >= self.budget_s:
                return
            index = (self.offset + step) % total
            self.checked.append(index)
            yield index


def smallest(cases: Sequence[Case], count: int) -> list[Case]:
    """The ``count`` distinct cases with the fewest elements (the product of their dims); of equal
    ones, the first drawn."""
    distinct: dict[str, Case] = {}
    for case in cases:
        distinct.setdefault(repr(case), case)
    return sorted(distinct.values(), key=lambda c: math.prod(c.dims.values()))[:count]

"""``--fusion-cold-start``: each provider's first call of a bench case timed in fresh processes,
with empty compile caches (cold) and with the caches those filled (warm), and the kernel's
figures gated against the stored ones (:mod:`pytest_fusion.gate.cold_start`).

Why: the bench process's own first-call seconds (``ProviderResult.cold_start_s``) depend on what
ran before it in that process and on the Triton and Inductor caches earlier runs left on disk, so
they are neither the cold start a user meets after changing the kernel (a compile and autotune
from nothing) nor the warm start every later process pays (cache hits, module loads).

The rule: after a bench case is timed and gated, it runs twice more as the replay's child
(:func:`pytest_fusion.plugin.replay.child_record`: the case's node id alone, nothing saved or
reported), one round each, ``TRITON_CACHE_DIR`` and ``TORCHINDUCTOR_CACHE_DIR`` set to new empty
folders for the first (cold) and to the same, now filled, folders for the second (warm). Each
child's record's ``cold_start_s`` per provider is the figure: ``BenchRecord.cold_start =
{provider: {"cold_s", "warm_s"}}``. In a child (:data:`CHILD_ENV`) the kernel's figure is its very
first call (:class:`FirstCall`): the oracle's check of the bench inputs, which runs before the
timing and so takes the kernel's JIT compile and autotune; torch.compile's is its compilation
(``measure.providers``), eager's its first timed call (eager compiles nothing). A child that
records nothing fails a case with stored figures (the gate never fails open) and leaves a note
on any other. Costs two pytest start-ups and two compiles per
case: on demand only.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pytest

from pytest_fusion.gate.cold_start import cold_start_verdict
from pytest_fusion.plugin.config import FusionConfig
from pytest_fusion.plugin.replay import child_record

if TYPE_CHECKING:
    from pytest_fusion.gate.comparable import StoredCase
    from pytest_fusion.measure.record import BenchRecord

CACHE_ENV = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")
"""The compile caches a cold child starts empty: Triton's kernels and autotune results, Inductor's
FX graphs, kernels and autotune results."""

CHILD_ENV = "PYTEST_FUSION_COLD_START_CHILD"
"""Set to 1 in a cold-start child: its bench items time the kernel's first call (:class:`FirstCall`)."""

CHILD_SETTINGS: dict[str, Any] = {"rounds": 1, "min_time_s": 0.0, "max_rounds": None, "warmup": 0}
"""A child's timing: its first calls are the figure, so one round and no warm-up."""


def in_child() -> bool:
    """Whether this process is a cold-start child (:data:`CHILD_ENV`)."""
    return os.environ.get(CHILD_ENV) == "1"


class FirstCall:
    """``kernel`` with its first call timed: ``seconds``, wall time from before the call to after
    the device finished it (``torch.cuda.synchronize`` on a CUDA ``device``), None before it ran."""

    def __init__(self, kernel: Callable[..., Any], device: str) -> None:
        self.kernel = kernel
        self.device = device
        self.seconds: float | None = None
        self.__name__ = getattr(kernel, "__name__", "kernel")

    def _sync(self) -> None:
        if str(self.device).startswith("cuda"):
            import torch

            torch.cuda.synchronize(self.device)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.seconds is not None:
            return self.kernel(*args, **kwargs)
        self._sync()
        t0 = time.perf_counter()
        out = self.kernel(*args, **kwargs)
        self._sync()
        self.seconds = time.perf_counter() - t0
        return out


def with_first_call(rec: BenchRecord, first: FirstCall) -> BenchRecord:
    """``rec`` whose kernel ``cold_start_s`` is ``first``'s seconds (a cold-start child's record)."""
    if first.seconds is None or "kernel" not in rec.providers:
        return rec
    kernel = dataclasses.replace(rec.providers["kernel"], cold_start_s=first.seconds)
    return dataclasses.replace(rec, providers={**rec.providers, "kernel": kernel})


def measure(
    config: pytest.Config, cfg: FusionConfig, item: pytest.Item, key: tuple[str, str, str]
) -> tuple[dict[str, dict[str, float]] | None, str]:
    """``({provider: {"cold_s", "warm_s"}}, "")`` of bench item ``item`` (record ``key``) from a cold
    and then a warm child (the module docstring), or ``(None, why not)``."""
    with tempfile.TemporaryDirectory(prefix="pytest-fusion-cold-start-") as tmp:
        env = {name: str(Path(tmp, name.lower())) for name in CACHE_ENV} | {CHILD_ENV: "1"}
        runs = []
        for which in ("cold", "warm"):
            rec, why = child_record(config, cfg, item, key, env=env, **CHILD_SETTINGS)
            if rec is None:
                return None, f"the {which} process: {why}"
            runs.append(rec)
    cold, warm = runs
    return {
        p: {"cold_s": cold.providers[p].cold_start_s, "warm_s": warm.providers[p].cold_start_s}
        for p in cold.providers if p in warm.providers
    }, ""


def with_cold_start(
    config: pytest.Config, cfg: FusionConfig, item: pytest.Item, rec: BenchRecord, stored: StoredCase | None
) -> BenchRecord:
    """``rec`` with its :func:`measure`-d figures and the rule's verdict on them against ``stored``
    (:func:`~pytest_fusion.gate.cold_start.cold_start_verdict`: a reason fails the record), or
    with a note saying why they were not measured."""
    figures, why = measure(config, cfg, item, rec.key)
    if figures is None and stored is not None and stored.cold_start:  # the gate never fails open
        return dataclasses.replace(rec, status="fail",
                                   reasons=[*rec.reasons, f"cold start not measured: {why}"])
    if figures is None:
        return dataclasses.replace(rec, notes=[*rec.notes, f"cold start not measured: {why}"])
    reasons, notes = cold_start_verdict(figures, stored=None if stored is None else stored.cold_start,
                                        tolerance=cfg.cold_start_tolerance)
    return dataclasses.replace(
        rec, cold_start=figures, status="fail" if reasons else rec.status,
        reasons=[*rec.reasons, *reasons], notes=[*rec.notes, *notes],
    )

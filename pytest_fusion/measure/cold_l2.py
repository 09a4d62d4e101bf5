"""Whether a GPU timing's L2 cache is truly cold: the bytes its timer reads between two timed calls
(the L2 flush, :meth:`pytest_fusion.measure.timers.CudaGraphTimer.flush_l2`) must exceed the
device's L2 size, or lines of the last call's data (its weights, its inputs) survive into the next
timed span and the kernel is timed partly warm, faster than a call meeting cold data.

The rule: cold when ``flush_bytes > l2_bytes`` (:class:`ColdL2`). ``flush_bytes`` is the timer's
``flush_bytes`` attribute (:class:`~pytest_fusion.measure.timers.CudaGraphTimer`:
``timers.L2_FLUSH_BYTES``, 256 MiB; a ``pytest_fusion_make_timer`` timer may set its own); a timer
without one flushes nothing the run knows of and is not checked (the CPU timer: a CPU's caches are
not flushed between timed calls, by design, ``measure.peaks``). ``l2_bytes`` is
``torch.cuda.get_device_properties(device).L2_cache_size`` (:func:`device_l2_bytes`; 50 MiB on an
H100 or H200).

The input sets rotated between samples (``measure.recompute.InputSets``, ``measure.rounds.Rotation``)
add nothing here: each set is copied into the very tensors the providers read, before the flush,
so the rotation moves no footprint of its own through the L2; the flush alone leaves it cold.

What a record says (:func:`check`'s result, through ``bench.api.bench_case``):
``BenchRecord.l2 = {"l2_bytes", "flush_bytes", "cold"}``, and the same three in its ``env`` as
``l2_bytes``, ``l2_flush_bytes`` and ``l2_cold``, so a baseline entry keeps them (the schema lets
an entry's environment hold further strings, numbers and booleans: no schema change). A flush not
larger than the L2 also warns (:class:`L2NotCold`) and adds :meth:`ColdL2.note` to the record's
notes; nothing fails on it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

MIB = 1 << 20


class L2NotCold(UserWarning):
    """A timer's L2 flush is not larger than the device's L2 (:meth:`ColdL2.note` says by how much)."""


def device_l2_bytes(device: str) -> int | None:
    """The L2 cache size of CUDA device ``device`` in bytes
    (``torch.cuda.get_device_properties(device).L2_cache_size``); None for another device, when
    no CUDA device is visible, or when the driver reports none (0)."""
    if not str(device).startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    size = int(torch.cuda.get_device_properties(torch.device(device)).L2_cache_size)
    return size or None


@dataclasses.dataclass(frozen=True)
class ColdL2:
    """A timer's flush against the device's L2, both in bytes (module docstring)."""

    l2_bytes: int
    flush_bytes: int

    @property
    def cold(self) -> bool:
        """Whether the flush reads more bytes than the L2 holds."""
        return self.flush_bytes > self.l2_bytes

    def to_dict(self) -> dict[str, Any]:
        """``BenchRecord.l2``: ``{"l2_bytes", "flush_bytes", "cold"}``."""
        return {"l2_bytes": self.l2_bytes, "flush_bytes": self.flush_bytes, "cold": self.cold}

    def env(self) -> dict[str, Any]:
        """The environment fields of a record and its baseline entry: ``l2_bytes``,
        ``l2_flush_bytes``, ``l2_cold``."""
        return {"l2_bytes": self.l2_bytes, "l2_flush_bytes": self.flush_bytes, "l2_cold": self.cold}

    def note(self) -> str:
        """The record's note and the warning's text for a flush that leaves the L2 warm ("" when cold)."""
        if self.cold:
            return ""
        return (f"L2 not cold between timed calls: the timer's flush reads {self.flush_bytes / MIB:.4g} MiB, "
                f"the device's L2 holds {self.l2_bytes / MIB:.4g} MiB, so part of the last call's data "
                f"stays in the L2 and the kernel is timed partly warm; a timer's flush must read more "
                f"than the L2 (its flush_bytes)")


def check(timer: Any, device: str, l2_bytes: int | None = None) -> ColdL2 | None:
    """``timer``'s flush (its ``flush_bytes``) against the L2 of ``device`` (``l2_bytes``, default
    :func:`device_l2_bytes`); None when the timer has no flush or the device's L2 is unknown
    (a CPU). Warns :class:`L2NotCold` when the flush is not larger than the L2."""
    flush = getattr(timer, "flush_bytes", None)
    if flush is None:
        return None
    size = device_l2_bytes(device) if l2_bytes is None else l2_bytes
    if size is None:
        return None
    state = ColdL2(int(size), int(flush))
    if not state.cold:
        import warnings

        warnings.warn(state.note(), L2NotCold, stacklevel=2)
    return state

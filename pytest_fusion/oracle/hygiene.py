"""Memory hygiene around a kernel's calls: what it writes besides its outputs' elements.

Policy (docs/oracle-hygiene.md): tensors the kernel allocates are poisoned (a NaN with
its own payload, integers 0x7F..) and followed by a guard band; inputs sit between guard bands
with their layout gaps filled by a finite pattern (:mod:`pytest_fusion.oracle.tensors`), and their whole
allocation must come back bitwise unchanged; a changed guard or gap is an "out-of-bounds write".
Before the last call the bytes around each floating input hold NaN instead
(``tensors.nan_outside``), so a read past an input shows as NaN in that call's output.
The kernel is called twice on the same inputs (:mod:`pytest_fusion.oracle.case`); the two calls'
outputs must not share memory.

Each ``check_*`` function raises its failure through a
:class:`~pytest_fusion.oracle.failures.FailureMessages` and returns None when all is well;
:func:`mismatch_detail` says, under a mismatch, whether its worst element still holds the poison.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Collection, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pytest_fusion.oracle.budget import Comparison, ExactComparison, fast_intrinsic_hint, indices_text
from pytest_fusion.oracle.failures import FailureMessages, InputMutated, OutOfBoundsWrite, OutputAliased
from pytest_fusion.oracle.tensors import (
    GUARD_BYTES,
    covered_bytes,
    describe_offset,
    element_bits,
    storage_bytes,
)

POISON_BITS = {
    torch.float16: 0x7E5A,
    torch.bfloat16: 0x7FDA,
    torch.float32: 0x7FCADEAD,
    torch.float64: 0x7FF8DEADDEADDEAD,
}
"""The quiet NaN that :class:`PoisonAllocations` writes, per dtype: its payload tells an element
the kernel never wrote from a NaN it computed (arithmetic yields the default NaN, 0x7FC00000 in
float32, and NVIDIA GPUs never propagate payloads)."""

GUARD_BYTE = 0xA5
"""Every byte of the guard band after a tensor the kernel allocates: 0xA5A5 is neither a NaN nor
a round number in any dtype, so no plausible stray write leaves it unchanged."""

def is_poison(t: torch.Tensor, index: tuple[int, ...]) -> bool:
    """Whether element ``index`` of ``t`` still holds :data:`POISON_BITS` (was never written)."""
    bits = POISON_BITS.get(t.dtype)
    if bits is None:
        return False
    value = int(element_bits(t[index]).item())
    return value & ((1 << (8 * t.element_size())) - 1) == bits


@dataclasses.dataclass
class Allocation:
    """A tensor made by an ``empty``-family op while :class:`PoisonAllocations` was active: its
    whole block (``nbytes`` of storage, then a :data:`GUARD_BYTES` guard band), and what was asked."""

    block: torch.Tensor
    nbytes: int
    shape: tuple[int, ...]
    dtype: torch.dtype

    def guard_changed(self) -> int | None:
        """The first changed byte of the guard band, counted from the end of the storage, or None."""
        guard = self.block[self.nbytes :]
        bad = (guard != GUARD_BYTE).nonzero()
        return int(bad[0]) if bad.numel() else None


class PoisonAllocations(TorchDispatchMode):
    """While active, every tensor created by ``torch.empty``-family ops is filled with a NaN
    carrying :data:`POISON_BITS` (integers: their max value), so elements a kernel never writes
    fail the check; and (``guard=True``) is placed at the start of a larger block whose last
    :data:`GUARD_BYTES` hold :data:`GUARD_BYTE`, checked after the call (:attr:`allocations`).
    The tensor starts where the block starts, so it is exactly as aligned as torch's own
    allocation (512 bytes from the CUDA caching allocator; TMA paths see no change).

    What it cannot see: allocations that bypass the dispatcher (inside C++ extensions, and the
    buffers Inductor's generated code allocates with its own ``empty_strided`` calls).

    A dispatch mode rather than ``torch.use_deterministic_algorithms`` + fill_uninitialized_memory:
    that switch changes which algorithms the kernel and torch may use."""

    FACTORIES = {
        "empty.memory_format",
        "empty_strided.default",
        "empty_like.default",
        "new_empty.default",
        "new_empty_strided.default",
        "empty.out",
    }

    def __init__(self, guard: bool = True) -> None:
        super().__init__()
        self.guard = guard
        self.allocations: list[Allocation] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func._opname + "." + func._overloadname
        if not isinstance(out, torch.Tensor) or name not in self.FACTORIES:
            return out
        with torch.no_grad():
            if self.guard and name != "empty.out" and type(out) is torch.Tensor and out.device.type != "meta":
                out = self._guarded(out)
            if out.dtype in POISON_BITS:
                element_bits(out).fill_(_signed(POISON_BITS[out.dtype], out.element_size()))
            elif out.dtype.is_floating_point or out.dtype.is_complex:
                out.fill_(float("nan"))
            elif out.dtype == torch.bool:
                out.fill_(True)
            else:
                out.fill_(torch.iinfo(out.dtype).max)
        return out

    def _guarded(self, out: torch.Tensor) -> torch.Tensor:
        nbytes = out.untyped_storage().nbytes()
        block = torch.empty(nbytes + GUARD_BYTES, dtype=torch.uint8, device=out.device)
        block[nbytes:].fill_(GUARD_BYTE)
        view = torch.empty(0, dtype=out.dtype, device=out.device)
        view.set_(block.untyped_storage(), out.storage_offset(), out.shape, out.stride())
        self.allocations.append(Allocation(block, nbytes, tuple(out.shape), out.dtype))
        return view


def _signed(bits: int, size: int) -> int:
    return bits - (1 << (8 * size)) if bits >= 1 << (8 * size - 1) else bits


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the byte ranges of ``a`` and ``b`` overlap (same allocation, overlapping span)."""
    if a.device != b.device or not a.numel() or not b.numel():
        return False

    def span(t: torch.Tensor) -> tuple[int, int]:
        start = t.data_ptr()
        extent = sum((d - 1) * abs(st) for d, st in zip(t.shape, t.stride(), strict=True)) + 1
        return start, start + extent * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def nan_cause(
    kernel: float | None, golden: float | None, kernel_output: torch.Tensor, index: Sequence[int],
    outside_nan: bool = False, inputs_nan: bool = False,
) -> str:
    """Why an element the kernel returned as NaN (``kernel`` at ``index``, golden ``golden``) may be
    NaN, for the mismatch's element line, or "": it still holds the poison NaN of a tensor the
    kernel allocated (an unwritten element), or ``outside_nan``: this call ran with NaN around the
    inputs (``tensors.nan_outside``) after a call that passed without, so a NaN where golden is
    finite hints at a read outside an input; ``inputs_nan``: an input's own elements held NaN
    (special values)."""
    if kernel is None or not math.isnan(kernel):
        return ""
    if is_poison(kernel_output, tuple(index)):
        return (" (NaN where golden is finite: an unwritten element? it holds the poison NaN of"
                " a tensor the kernel allocated)")
    if outside_nan and golden is not None and math.isfinite(golden):
        held = "" if inputs_nan else " and no input element is NaN"
        return (f" (the output went NaN where golden is finite{held}: in this call the bytes before and"
                " after each floating input hold NaN, and the call before, with finite ones there,"
                " passed; did the kernel read outside an input, past its end or before its start?)")
    return ""


def mismatch_detail(
    c: Comparison, kernel_output: torch.Tensor, outside_nan: bool = False, inputs_nan: bool = False
) -> str:
    """The lines of a mismatch's message under its headline: the worst element (and
    :func:`nan_cause` where it is NaN), its budget, the misplaced NaN/inf count and the
    fast-intrinsic hint where it applies."""
    cause = ""
    if c.worst_index is not None:
        cause = nan_cause(c.kernel, c.golden, kernel_output, c.worst_index, outside_nan, inputs_nan)
    return (
        f"  worst    {list(c.worst_index or ())}: kernel={c.kernel:.6g} golden={c.golden:.6g} "
        f"eager={c.eager:.6g} |err|={c.abs_error:.3g} = {c.ulps:.1f} ulp{cause}\n"
        f"  budget   {c.budget_text} (here {c.budget:.3g})\n"
        f"  NaN/inf misplaced: {c.nonfinite_mismatches}"
        f"{fast_intrinsic_hint(c, kernel_output.dtype)}"
    )


def exact_detail(
    c: ExactComparison, kernel_output: torch.Tensor, outside_nan: bool = False, inputs_nan: bool = False
) -> str:
    """The lines of an exact-tier mismatch's message under its headline: why the output is exact,
    the rows and columns that differ, rows (columns) holding another of golden's, the first
    differing element (and :func:`nan_cause` where it is NaN)."""
    index = c.first_index or ()
    unwritten = nan_cause(c.kernel, c.golden, kernel_output, index, outside_nan, inputs_nan)
    lines = [
        "  exact    every input holds small dyadic values and eager's output equals golden exactly, so a "
        "kernel summing the same products in any order gets every element exactly (no error budget)",
    ]
    if c.row_count:
        lines.append(f"  rows     {indices_text(c.rows, c.row_count)}")
    if c.col_count:
        lines.append(f"  columns  {indices_text(c.cols, c.col_count)}")
    lines += [f"  moved    {m}" for m in c.moved]
    lines.append(f"  first    {list(index)}: kernel={c.kernel:.6g} golden={c.golden:.6g}{unwritten}")
    return "\n".join(lines)


def check_allocation_guards(
    allocations: Sequence[Allocation], out: tuple[Any, ...], call: str, fail: FailureMessages
) -> None:
    """Raise :class:`OutOfBoundsWrite` at the first of ``allocations`` whose guard band changed,
    naming the output it became (or a workspace the kernel did not return)."""
    for alloc in allocations:
        offset = alloc.guard_changed()
        if offset is None:
            continue
        owner = next(
            (
                f"output {i}"
                for i, k in enumerate(out)
                if isinstance(k, torch.Tensor) and k.untyped_storage().data_ptr() == alloc.block.data_ptr()
            ),
            None,
        )
        what = owner or "a tensor it allocated and did not return (a workspace?)"
        size = torch.empty((), dtype=alloc.dtype).element_size()
        raise fail(
            OutOfBoundsWrite,
            f"the kernel wrote past the end of {what} ({call}), shape {alloc.shape} "
            f"{str(alloc.dtype).replace('torch.', '')}: byte {offset} of the "
            f"{GUARD_BYTES}-byte guard band after its storage (element offset "
            f"+{(alloc.nbytes + offset) // size} from the storage's start)",
        )


def check_input_storage(
    names: Sequence[str],
    inputs: Sequence[torch.Tensor],
    before: Sequence[torch.Tensor],
    call: str,
    fail: FailureMessages,
    mutable: Collection[str] = (),
    hint: str = "an in-place kernel declares it in the marker's mutates=",
) -> None:
    """Raise :class:`InputMutated` when inputs' elements differ from their bytes ``before`` the
    call (inputs named in ``mutable``, a spec's ``mutates``, may change there), naming every such
    input, its message ending with ``hint``; else :class:`OutOfBoundsWrite` when an input's guard
    bands or layout gaps do."""
    written: list[str] = []
    stray: tuple[str, torch.Tensor, torch.Tensor] | None = None  # the first input written outside
    for name, t, old in zip(names, inputs, before, strict=True):
        now = storage_bytes(t)
        if torch.equal(old, now):
            continue
        changed = old != now
        inside = covered_bytes(t)
        if name not in mutable and bool((changed & inside).any()):
            n = int((changed & inside).view(-1, t.element_size()).any(1).sum())
            written.append(f"input {name!r} ({n} of {t.numel()} elements changed")
        if stray is None and bool((changed & ~inside).any()):
            stray = (name, t, changed & ~inside)
    if written:
        parts = [w + ")" for w in written[:-1]] + [f"{written[-1]}; {call})"]
        which = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
        raise fail(InputMutated, f"the kernel wrote into {which}; {hint}")
    if stray is not None:
        name, t, outside = stray
        first = int(outside.nonzero()[0])
        raise fail(
            OutOfBoundsWrite,
            f"the kernel wrote outside input {name!r} ({call}), shape {tuple(t.shape)} strides "
            f"{tuple(t.stride())}: {describe_offset(t, first)}, "
            f"{int(outside.view(-1, t.element_size()).any(1).sum())} element(s) changed "
            "in its guard bands and layout gaps",
        )


def check_outputs_not_reused(
    out: tuple[Any, ...],
    earlier_calls: Sequence[tuple[Any, ...]],
    inputs: Sequence[torch.Tensor],
    call: str,
    fail: FailureMessages,
) -> None:
    """Raise :class:`OutputAliased` when an output of this call shares memory with an output of an
    earlier call (outputs that are views of an input are left alone)."""
    for i, k in enumerate(out):
        if any(shares_memory(k, t) for t in inputs):
            continue  # an output that is a view of an input is the input's business
        for m, earlier in enumerate(earlier_calls):
            j = next((j for j, e in enumerate(earlier) if shares_memory(k, e)), None)
            if j is not None:
                raise fail(
                    OutputAliased,
                    f"output aliases an earlier result: output {i} of {call} shares memory with "
                    f"output {j} of call {m + 1}, so this call overwrote that result (an output "
                    "buffer reused across calls; allocate it per call)",
                )


def output_view_note(
    out: tuple[Any, ...], inputs: Sequence[torch.Tensor], allocations: Sequence[Allocation], kernel: str
) -> str | None:
    """What an :class:`~pytest_fusion.oracle.failures.OutputViewWarning` says when an output is a
    view into a larger buffer the kernel allocated, else None: ``kernel``, the output's shape,
    strides and storage offset (elements), the storage's size and how many of its bytes no output
    covers. Outputs sharing one storage count together (one workspace split into several outputs
    is covered by them all); an output that shares memory with an input is the input's business;
    a guarded allocation counts without its guard band (:class:`PoisonAllocations`)."""
    covered: dict[int, torch.Tensor] = {}
    first: dict[int, tuple[int, torch.Tensor]] = {}
    for i, k in enumerate(out):
        if not isinstance(k, torch.Tensor) or not k.numel() or any(shares_memory(k, t) for t in inputs):
            continue
        ptr = k.untyped_storage().data_ptr()
        mask = covered_bytes(k)
        covered[ptr] = covered[ptr] | mask if ptr in covered else mask
        first.setdefault(ptr, (i, k))
    for ptr, mask in covered.items():
        i, k = first[ptr]
        size = next((a.nbytes for a in allocations if a.block.data_ptr() == ptr), mask.numel())
        outside = size - int(mask[:size].sum())
        if outside > 0:
            return (
                f"{kernel}: output {i} (shape {tuple(k.shape)}, strides {tuple(k.stride())}, storage offset "
                f"{k.storage_offset()}) is a view into a larger buffer the kernel allocated: a storage of "
                f"{size} bytes, {outside} of them outside every output, which stay allocated while the "
                "caller holds the output; return a tensor of its own (.clone(), or allocate the output's "
                "exact shape), or declare output_views=True in the marker if that is intended"
            )
    return None

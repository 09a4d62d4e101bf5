"""Stream-K schedule of the TMA kernels: every program streams the same number of K steps.

A GEMM of T output tiles and Kt K steps per tile is T x Kt units of work (one K step of one
tile). Stream-K (Osama et al., PPoPP 2023) launches one program per SM and gives program p the
units [p U / P, (p + 1) U / P) of the U = T x Kt units in tile-major order, so every SM reads the
same share of the operands whatever T is, where one program per tile runs ceil(T / P) waves:
Llama-3-8B's gate/up at decode is 224 tiles of 16 x 64 on 132 SMs, two waves of which the
second is 70% full, so the whole kernel streams the weights at about 224 / 264 of the rate the
full waves reach (the split tail, :mod:`reference_kernels._split_tail`, splits nothing there:
a tail of 92 tiles would get one slice each).

A program's range covers whole tiles and at most two pieces of tiles (its first and its last);
a tile is then shared by the consecutive programs whose ranges meet it. Each piece's program
stores its fp32 partial accumulators in its own workspace slot (2 per program: first piece,
last piece) and counts itself in on the tile's counter; the program that arrives last sums the
tile's pieces in program order (the same bits whatever the arrival order), applies the epilogue
and writes the tile. No program waits for another, so the schedule cannot deadlock however the
hardware schedules the programs.

The cost: the pieces' partials (at most 2 P x accumulators x BLOCK_M x BLOCK_N x 4 bytes, 2 MB
for a gated decode kernel on 132 SMs, written and read once, mostly in L2), and one zero fill of
T counters per call.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from reference_kernels._split_tail import slot_ptrs


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a stream-K launch divides ``tiles`` x ``k_tiles`` units among ``programs``."""

    tiles: int
    k_tiles: int
    programs: int

    @property
    def units(self) -> int:
        return self.tiles * self.k_tiles

    def units_of(self, p: int) -> range:
        """The units of program ``p`` (as the kernel computes them, :func:`unit_range`)."""
        return range(p * self.units // self.programs, (p + 1) * self.units // self.programs)


def plan(tiles: int, k_tiles: int, sms: int) -> Plan:
    """One program per SM, or one per unit when there are fewer units than SMs.

    Raises:
        ValueError: an argument < 1.
    """
    if min(tiles, k_tiles, sms) < 1:
        raise ValueError(f"plan needs tiles, k_tiles and sms >= 1, got {tiles}, {k_tiles}, {sms}")
    return Plan(tiles=tiles, k_tiles=k_tiles, programs=min(sms, tiles * k_tiles))


def owner(u: int, programs: int, units: int) -> int:
    """The program whose range holds unit ``u``: the largest p with p U / P <= u, which is
    ceil((u + 1) P / U) - 1 (host twin of the kernel's :func:`_owner`, for the tests)."""
    return ((u + 1) * programs - 1) // units


def buffers(plan_: Plan, parts: int, block_m: int, block_n: int, device: torch.device):
    """``(workspace, counters)`` of one launch: fp32 room for two pieces of ``parts``
    accumulators per program (uninitialised: a slot is written before it is read) and one zeroed
    int32 counter per tile, allocated per call as the split tail's are
    (:func:`reference_kernels._split_tail.buffers`)."""
    slots = 2 * plan_.programs
    workspace = torch.empty(slots * parts * block_m * block_n, dtype=torch.float32, device=device)
    counters = torch.zeros(plan_.tiles, dtype=torch.int32, device=device)
    return workspace, counters


@triton.jit
def unit_range(pid, programs, units):
    """``[start, end)``: the units of program ``pid`` (int64: T x Kt x P can pass 2^31)."""
    start = pid.to(tl.int64) * units // programs
    end = (pid.to(tl.int64) + 1) * units // programs
    return start, end


@triton.jit
def _owner(u, programs, units):
    return ((u + 1) * programs - 1) // units


@triton.jit
def piece_slot(p, tile, programs, units, k_tiles):
    """Workspace slot of program ``p``'s piece of ``tile``: 2p for the first tile of its range,
    2p + 1 for its last."""
    first_tile = (p * units // programs) // k_tiles
    return 2 * p + (tile != first_tile).to(tl.int64)


@triton.jit
def piece(tile, start, end, k_tiles):
    """``(k_lo, k_hi, whole)``: the K steps of ``tile`` in the range [start, end) (int32, as
    descriptor offsets must be), and whether they are all of the tile's."""
    k_lo = tl.maximum(start - tile * k_tiles, 0).to(tl.int32)
    k_hi = tl.minimum(end - tile * k_tiles, k_tiles).to(tl.int32)
    return k_lo, k_hi, (k_lo == 0) & (k_hi == k_tiles)


@triton.jit
def arrive_piece(counters, tile, programs, units, k_tiles):
    """Count this program's piece in on ``tile``; True for the last of the tile's programs to
    arrive. Call after storing the piece in its slot (:func:`piece_slot`) with
    :func:`reference_kernels._split_tail.store_partial`;
    the ordering is the split tail's (:func:`reference_kernels._split_tail.arrive`)."""
    pieces = _owner((tile + 1) * k_tiles - 1, programs, units) - _owner(tile * k_tiles, programs, units) + 1
    tl.debug_barrier()  # every thread's partial stored before the one atomic below
    arrived = tl.atomic_add(counters + tile, 1, sem="acq_rel", scope="gpu")
    return arrived == pieces - 1


@triton.jit
def sum_pieces(
    workspace,
    tile,
    programs,
    units,
    k_tiles,
    part,
    PARTS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Sum of accumulator ``part`` over the pieces of ``tile``, in program order, read past L1
    (``.cg``: other SMs wrote them during this launch)."""
    first = _owner(tile * k_tiles, programs, units)
    last = _owner((tile + 1) * k_tiles - 1, programs, units)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for p in range(first, last + 1):
        slot = piece_slot(p, tile, programs, units, k_tiles)
        acc += tl.load(slot_ptrs(workspace, slot, part, PARTS, BLOCK_M, BLOCK_N), cache_modifier=".cg")
    return acc

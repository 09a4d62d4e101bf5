"""Split-tail schedule of the TMA kernels: whole tiles for the full waves, K slices for the rest.

With one program per output tile, T tiles on S SMs run in ceil(T / S) waves and the last wave holds
only T mod S tiles: Qwen2.5-7B's gate/up at M = 128 is 296 tiles of 128 x 64 on the H200's 132 SMs,
2 full waves and a third with 32 tiles, 100 SMs idle while 32 read the last 11% of the weights
(what splitting them gained: docs/reference-kernels.md#configs-kept-and-why). Split-tail launches
the full waves' tiles as usual and splits each of the remaining tiles along K into ``splits``
slices, one program each, so the last wave fills the GPU too: the "data-parallel + Stream-K" hybrid
of Osama et al. (Stream-K, PPoPP 2023), with the leftover tiles cut into equal K slices instead of
streamed across programs. With PERSISTENT too, the grid is one program per SM: each walks its share
of the whole tiles in one flattened loop (the next tile's loads pipelined under this one's
epilogue, no program launch or pipeline fill between them), then takes one slice.

Each slice program stores its fp32 partial accumulators in a workspace slot, then counts itself
in on its tile's counter (one atomic add); the program that arrives last sums the tile's slots in
slice order (so the result is the same bits whatever the arrival order), applies the epilogue and
writes the tile. No program waits for another, so the schedule cannot deadlock whatever order
the hardware runs the programs in.

The extra traffic is the partials: tail tiles x splits x accumulators x BLOCK_M x BLOCK_N x 4
bytes written and read once (8 MB for Qwen's gate/up at M = 128, against 272 MB of weights),
mostly served from L2.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a split-tail launch divides ``tiles`` output tiles.

    Attributes:
        dp_tiles: tiles computed whole, one program each (programs 0 .. dp_tiles - 1).
        splits: K slices per remaining tile (1: no split, every tile whole).
        tail_tiles: tiles split along K, ``splits`` programs each.
    """

    dp_tiles: int
    splits: int
    tail_tiles: int

    @property
    def programs(self) -> int:
        """The launch grid's size."""
        return self.dp_tiles + self.tail_tiles * self.splits


def plan(tiles: int, k_tiles: int, sms: int) -> Plan:
    """Split the tiles of the last partial wave along K so that it occupies about ``sms``
    programs: ``splits = min(sms // tail, k_tiles)`` with ``tail = tiles mod sms`` (all tiles
    when fewer than ``sms``). No split when the waves are full or a split would be one slice.

    Args:
        tiles: output tiles of the launch, >= 1. k_tiles: K steps per tile (cdiv(K, BLOCK_K)),
            >= 1. sms: programs that run at once, taken as one per SM (a config small enough for
            two per SM then splits tails that would already have run in the same wave).

    Raises:
        ValueError: an argument < 1.
    """
    if min(tiles, k_tiles, sms) < 1:
        raise ValueError(f"plan needs tiles, k_tiles and sms >= 1, got {tiles}, {k_tiles}, {sms}")
    tail = tiles % sms
    splits = min(sms // tail, k_tiles) if tail else 1
    if splits == 1:
        return Plan(dp_tiles=tiles, splits=1, tail_tiles=0)
    return Plan(dp_tiles=tiles - tail, splits=splits, tail_tiles=tail)


def buffers(plan_: Plan, parts: int, block_m: int, block_n: int, device: torch.device):
    """``(workspace, counters)`` of one launch: fp32 room for every slice's ``parts``
    accumulators (uninitialised: each slot is written before it is read) and one zeroed int32
    counter per split tile. Allocated per call (stream-ordered by PyTorch's caching allocator;
    under CUDA-graph capture the zero fill is captured too and runs on every replay), so
    concurrent launches never share counters. The cost: one small fill kernel per call."""
    slots = max(1, plan_.tail_tiles * plan_.splits)
    workspace = torch.empty(slots * parts * block_m * block_n, dtype=torch.float32, device=device)
    counters = torch.zeros(max(1, plan_.tail_tiles), dtype=torch.int32, device=device)
    return workspace, counters


@triton.jit
def whole_tiles(pid, num_tiles, dp_tiles, SPLIT_TAIL: tl.constexpr, PERSISTENT: tl.constexpr):
    """``(last, step)``: program ``pid`` computes the whole tiles ``range(pid, last, step)``.
    One program per tile: tile ``pid`` alone, or none when ``pid`` is a slice program
    (>= dp_tiles). Persistent: every ``num_programs``-th tile from ``pid`` on. Without
    SPLIT_TAIL every tile is whole (``dp_tiles`` unused)."""
    if SPLIT_TAIL:
        if PERSISTENT:
            last, step = dp_tiles, tl.num_programs(0)
        else:
            last, step = tl.minimum(pid + 1, dp_tiles), 1
    else:
        last, step = num_tiles, tl.num_programs(0)
    return last, step


@triton.jit
def slice_program(pid, dp_tiles, tiles, splits, PERSISTENT: tl.constexpr):
    """The tail program number (the ``pid`` of :func:`slice_of`, >= dp_tiles) that program
    ``pid`` runs after its whole tiles, or -1 when it takes no slice. One program per tile
    (the grid is :attr:`Plan.programs`): programs from dp_tiles on are the slices. Persistent
    (one program per SM, each walking its whole tiles first, in a loop the compiler pipelines
    across tile boundaries): program p takes slice p, when there is one."""
    if PERSISTENT:
        sp = dp_tiles + pid
    else:
        sp = pid
    return tl.where((sp >= dp_tiles) & (sp < dp_tiles + (tiles - dp_tiles) * splits), sp, -1)


@triton.jit
def slice_of(pid, dp_tiles, splits, k_tiles):
    """``(tile, slot, k_lo, k_hi)`` of tail program ``pid`` (>= dp_tiles): the tile it works on,
    its workspace slot, and its K steps [k_lo, k_hi) (slices differ by at most one step)."""
    slot = pid - dp_tiles
    tile = dp_tiles + slot // splits
    s = slot % splits
    k_lo = s * k_tiles // splits
    k_hi = (s + 1) * k_tiles // splits
    return tile, slot, k_lo, k_hi


@triton.jit
def _slot_ptrs(workspace, slot, part, PARTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    base = (slot.to(tl.int64) * PARTS + part) * (BLOCK_M * BLOCK_N)
    offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    return workspace + base + offs


@triton.jit
def store_partial(workspace, slot, part, acc, PARTS: tl.constexpr):
    """Write fp32 accumulator number ``part`` (of PARTS) of workspace ``slot``."""
    BLOCK_M: tl.constexpr = acc.shape[0]
    BLOCK_N: tl.constexpr = acc.shape[1]
    tl.store(_slot_ptrs(workspace, slot, part, PARTS, BLOCK_M, BLOCK_N), acc)


@triton.jit
def arrive(counters, slot, splits):
    """Count this program's slice in on its tile; True for the program that arrives last.
    Call after :func:`store_partial`: the barrier and the release half of the atomic make this
    program's stores visible to the last one, whose acquire half orders its reads of the slots
    after them."""
    tl.debug_barrier()  # every thread's partial stored before the one atomic below
    arrived = tl.atomic_add(counters + slot // splits, 1, sem="acq_rel", scope="gpu")
    return arrived == splits - 1


@triton.jit
def sum_partials(
    workspace, slot, splits, part, PARTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    """Sum of accumulator ``part`` over the slots of ``slot``'s tile, in slice order. The loads
    bypass L1 (``.cg``): other SMs wrote the slots during this launch."""
    first = slot - slot % splits
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(splits):
        acc += tl.load(_slot_ptrs(workspace, first + s, part, PARTS, BLOCK_M, BLOCK_N), cache_modifier=".cg")
    return acc

"""Hypothesis strategies for fused-kernel cases: dims with edge tiers, dtypes, layouts, seeds.

Each public strategy takes keyword-only bounds, validates them up front and returns a
``SearchStrategy``. Tensors are never drawn element by element: a case carries a seed and
:func:`pytest_fusion.oracle.tensors.make_inputs` builds the tensors from it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping, Sequence

from hypothesis import strategies as st

from pytest_fusion.declare import sizes
from pytest_fusion.declare.spec import DEFAULT_TILES, LAYOUTS, SUPPORTED_DTYPES, FusionUsageError, KernelSpec
from pytest_fusion.oracle.tensors import AMPLITUDES, Case

EDGE_PRIMES = (2, 3, 5, 7, 13, 31, 61, 127, 251, 509, 1021, 2039, 4093, 8191, 16381)
"""Primes at or just under powers of two: no tile divides them, so every tile loop has a tail."""

EDGE_NON_POWERS_OF_TWO = (3, 6, 12, 24, 48, 96, 192, 384, 768, 1536, 3072, 6144, 12288)
"""3 * 2**i: sizes real models use (768, 3072) that power-of-two tiles do not divide evenly."""


def powers_of_two(low: int, high: int) -> list[int]:
    """``2**k`` and ``2**k + 1`` in [low, high]: the boundaries of power-of-two dispatch buckets
    (a kernel choosing its variant by ``next_power_of_2(M)`` changes path between them)."""
    out = []
    for k in range(max(high, 1).bit_length() + 1):
        out += [v for v in (2**k, 2**k + 1) if low <= v <= high]
    return out


EDGE_GRID = (2**16 - 1, 2**16, 2**16 + 1)
"""The 16-bit edge: CUDA's grid dims y and z hold at most 65535 blocks, and a row or block index
kept in 16 bits wraps at 65536, so a kernel launching one program per row along grid y, or
indexing rows in 16 bits, breaks at one of these. Edge values of every dim whose range reaches
them, and one edge case each (:func:`edge_cases`)."""


def snap(low: int, high: int, multiple: int = 1) -> tuple[int, int]:
    """[low, high] narrowed to its multiples of ``multiple``: the first and the last; when none
    lies in it, the first multiple above ``low`` twice (a declared multiple wins over a cap)."""
    lo = -(-low // multiple) * multiple
    return lo, max(lo, high // multiple * multiple)


def _nearest_multiples(values: set[int], multiple: int) -> set[int]:
    """Each of ``values`` as the multiples of ``multiple`` just below and just above it."""
    if multiple == 1:
        return values
    return {m for v in values for m in (v // multiple * multiple, -(-v // multiple) * multiple)}


def block_sizes(spec: KernelSpec, symbol: str) -> tuple[int, ...]:
    """The quantization blocks ``symbol`` is divided by in ``spec``'s derived sizes (the 32 of a
    ``cdiv(K, 32)`` scales input, the 2 of a ``K // 2`` packed one), ascending
    (:func:`pytest_fusion.declare.sizes.divisors`)."""
    found: set[int] = set()
    for t in spec.inputs.values():
        for entry in t.shape:
            found |= sizes.divisors(entry).get(symbol, set())
    return tuple(sorted(found))


def block_edges(*, low: int, high: int, blocks: Sequence[int], multiple: int = 1) -> list[int]:
    """The block-edge tier of a dim divided into blocks of each size ``B`` of ``blocks``,
    ascending: ``j B`` (whole blocks), ``j B + 1`` (a one-element tail), ``j B + B // 2`` (a half
    block: a multiple of 16 but not of 32 for B = 32) and ``j B + B - 1`` (one short), for
    ``j`` = 0..3 and the two largest whole-block counts in range; as multiples of ``multiple``
    (the nearest), clipped to [low, high]. A kernel that drops a trailing partial block, or reads
    its scale from the wrong block, fails at one of them."""
    lo, hi = snap(low, high, multiple)
    values: set[int] = set()
    for b in blocks:
        top = hi // b
        for j in {0, 1, 2, 3, top - 1, top}:
            if j >= 0:
                values.update(j * b + r for r in (0, 1, b // 2, b - 1))
    return sorted(v for v in _nearest_multiples(values, multiple) if lo <= v <= hi)


def edge_dims(
    *, low: int, high: int, tiles: Sequence[int] = DEFAULT_TILES, multiple: int = 1,
    blocks: Sequence[int] = (),
) -> list[int]:
    """The edge tier of one dim, ascending: ``low``, 1, every tile size ``t`` and ``t +- 1``,
    powers of two and ``2**k + 1`` (:func:`powers_of_two`), :data:`EDGE_PRIMES`,
    :data:`EDGE_NON_POWERS_OF_TWO`, :data:`EDGE_GRID`, the block edges of ``blocks``
    (:func:`block_edges`) and ``high``, clipped to [low, high]; with ``multiple``, each as the
    multiples of it just below and above, within the multiples in [low, high] (:func:`snap`).

    Raises:
        FusionUsageError: ``low < 1`` or ``high < low``.
    """
    if low < 1 or high < low:
        raise FusionUsageError(f"edge_dims needs 1 <= low <= high, got low={low}, high={high}")
    values = {low, high, 1, *EDGE_PRIMES, *EDGE_NON_POWERS_OF_TWO, *EDGE_GRID, *powers_of_two(low, high)}
    for t in tiles:
        values.update((t - 1, t, t + 1))
    values.update(block_edges(low=low, high=high, blocks=blocks))
    lo, hi = snap(low, high, multiple)
    return sorted({lo, hi} | {v for v in _nearest_multiples(values, multiple) if lo <= v <= hi})


def dim_values(
    *, low: int, high: int, tiles: Sequence[int] = DEFAULT_TILES, multiple: int = 1,
    blocks: Sequence[int] = (),
) -> st.SearchStrategy[int]:
    """One dim in [low, high] (a multiple of ``multiple``): half the time from :func:`edge_dims`,
    else uniform; with ``blocks``, a third each from the edge tier, the block edges
    (:func:`block_edges`) and uniform.

    Shrinks towards ``low`` (the edge list is tried first and is ascending).
    """
    edges = edge_dims(low=low, high=high, tiles=tiles, multiple=multiple, blocks=blocks)
    lo, hi = snap(low, high, multiple)
    if multiple == 1:
        uniform = st.integers(min_value=lo, max_value=hi)
    else:
        uniform = st.integers(min_value=lo // multiple, max_value=hi // multiple).map(lambda u: u * multiple)
    near_blocks = block_edges(low=low, high=high, blocks=blocks, multiple=multiple)
    if not near_blocks:
        return st.one_of(st.sampled_from(edges), uniform)
    return st.one_of(st.sampled_from(edges), st.sampled_from(near_blocks), uniform)


def _dim(spec: KernelSpec, symbol: str, low: int, high: int) -> st.SearchStrategy[int]:
    """:func:`dim_values` of ``symbol`` in [low, high] with ``spec``'s tiles, multiple and blocks."""
    return dim_values(low=low, high=high, tiles=spec.tiles_for(symbol), multiple=spec.multiple_for(symbol),
                      blocks=block_sizes(spec, symbol))


def _edges(spec: KernelSpec, symbol: str, low: int, high: int) -> list[int]:
    """:func:`edge_dims` of ``symbol`` in [low, high] with ``spec``'s tiles, multiple and blocks."""
    return edge_dims(low=low, high=high, tiles=spec.tiles_for(symbol), multiple=spec.multiple_for(symbol),
                     blocks=block_sizes(spec, symbol))


def capped_range(low: int, high: int, max_dim: int | None) -> tuple[int, int]:
    """[low, high] clipped to ``max_dim`` (never below ``low``): the CPU/interpreter cap."""
    if max_dim is None or max_dim <= 0:
        return low, high
    return low, max(low, min(high, max_dim))


def bounded_shapes(spec: KernelSpec) -> list[tuple[str | int, ...]]:
    """The symbolic shapes an element bound applies to: every input's, and every matrix over two of
    the dims (an output such as M x N, which the spec does not declare)."""
    dims = list(spec.dims)
    pairs = [(a, b) for i, a in enumerate(dims) for b in dims[i + 1 :]]
    return [tuple(t.shape) for t in spec.inputs.values()] + pairs


def element_cap(
    spec: KernelSpec, symbol: str, chosen: Mapping[str, int], max_elements: int | None
) -> int | None:
    """The largest size ``symbol`` may take so that no input, and no matrix over ``symbol`` and one
    other dim (an output such as M x N, which the spec does not declare), holds more than
    ``max_elements`` elements, given the sizes ``chosen`` so far (symbols not chosen yet count at
    their low end); None when unbounded. A derived size (``"cdiv(K, 32)"``) counts at its value."""
    if not max_elements:
        return None
    at = {s: chosen.get(s, spec.dims[s][0]) for s in spec.dims}
    cap = None
    for shape in bounded_shapes(spec):
        using = [e for e in shape if symbol in sizes.symbols(e)]
        if not using:
            continue
        rest = max(math.prod(sizes.size(e, at) for e in shape if e not in using), 1)

        def fits(v: int, using: list[sizes.Entry] = using, rest: int = rest) -> bool:
            return math.prod(sizes.size(e, {**at, symbol: v}) for e in using) * rest <= max_elements

        limit = _largest(fits)
        cap = limit if cap is None else min(cap, limit)
    return cap


def _largest(fits: Callable[[int], bool], top: int = 2**62) -> int:
    """The largest ``v`` in [0, ``top``] with ``fits(v)`` (``fits`` monotone: true up to a point),
    0 when none: an exponential then a binary search."""
    if not fits(1):
        return 0
    low, high = 1, 2
    while high < top and fits(high):
        low, high = high, high * 2
    high = min(high, top)
    if fits(high):
        return high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def _limit(
    spec: KernelSpec, symbol: str, chosen: Mapping[str, int], max_dim: int | None, max_elements: int | None
) -> tuple[int, int]:
    lo, hi = capped_range(*spec.dims[symbol], max_dim)
    cap = element_cap(spec, symbol, chosen, max_elements)
    return snap(lo, hi if cap is None else max(lo, min(hi, cap)), spec.multiple_for(symbol))


def largest_dims(
    spec: KernelSpec, *, max_dim: int | None = None, max_elements: int | None = None
) -> dict[str, int]:
    """Every dim at the high end a draw can reach: its declared high, capped to ``max_dim`` and, in
    declaration order as :func:`dims` draws them, so that no input exceeds ``max_elements``."""
    chosen: dict[str, int] = {}
    for sym in spec.dims:
        chosen[sym] = _limit(spec, sym, chosen, max_dim, max_elements)[1]
    return chosen


def dims(
    spec: KernelSpec, *, max_dim: int | None = None, max_elements: int | None = None
) -> st.SearchStrategy[dict[str, int]]:
    """A ``{symbol: size}`` draw for every symbol in ``spec.dims``, each capped to ``max_dim`` and,
    in declaration order, so that no input tensor exceeds ``max_elements`` elements."""
    if not max_elements:
        per_symbol = {}
        for sym, (lo, hi) in spec.dims.items():
            per_symbol[sym] = _dim(spec, sym, *capped_range(lo, hi, max_dim))
        return st.fixed_dictionaries(per_symbol)

    @st.composite
    def budgeted(draw: st.DrawFn) -> dict[str, int]:
        chosen: dict[str, int] = {}
        for sym in spec.dims:
            chosen[sym] = draw(_dim(spec, sym, *_limit(spec, sym, chosen, max_dim, max_elements)))
        return chosen

    return budgeted()


def layouts_for(rank: int, allowed: Sequence[str] | None = None) -> tuple[str, ...]:
    """Layouts that mean something for a tensor of ``rank`` (``transposed`` needs rank >= 2)."""
    names = tuple(allowed) if allowed is not None else LAYOUTS
    return tuple(name for name in names if rank >= 2 or name != "transposed") or ("contiguous",)


def layouts(spec: KernelSpec) -> st.SearchStrategy[dict[str, str]]:
    """A layout per tensor input; shrinks towards ``contiguous``."""
    return st.fixed_dictionaries(
        {name: st.sampled_from(layouts_for(len(t.shape), t.layouts)) for name, t in spec.inputs.items()}
    )


def dtypes(*, allowed: Sequence[str] = SUPPORTED_DTYPES) -> st.SearchStrategy[str]:
    """A test dtype name from ``allowed`` (default float16, bfloat16, float32)."""
    bad = [d for d in allowed if d not in SUPPORTED_DTYPES]
    if bad or not allowed:
        raise FusionUsageError(f"dtypes: unsupported {bad or 'empty list'}; choose from {SUPPORTED_DTYPES}")
    return st.sampled_from(tuple(allowed))


def seeds() -> st.SearchStrategy[int]:
    """A 32-bit seed for the tensor generator; shrinks towards 0."""
    return st.integers(min_value=0, max_value=2**32 - 1)


EXACT_SHARE = 4
"""One finite case in this many is drawn in the exact value tier (:attr:`tensors.Case.exact`)."""


def cases(
    spec: KernelSpec, *, dtype: str, max_dim: int | None = None, max_elements: int | None = None
) -> st.SearchStrategy[Case]:
    """Full cases for ``spec`` in one ``dtype``: dims (see :func:`dims`), layouts, seed, and either
    the activations' amplitude (:data:`tensors.AMPLITUDES`, shrinking towards 1) or, unless the
    spec opts out, planted special values (in half the cases, so the numeric check still sees
    finite outputs). Special values come at amplitude 1 only: with activations of tens a
    saturating activation's float64 reference rounds to exactly 0 and gives 0 * inf = NaN where a
    kernel that computes the tiny true value gives inf (docs/oracle.md#the-values). One case
    without special values in :data:`EXACT_SHARE` takes the exact value tier instead of the
    amplitude (:attr:`tensors.Case.exact`); a failure shrinks into the exact tier where that tier
    reproduces it, so its message names the rows and columns that differ."""
    amplitudes = st.sampled_from(AMPLITUDES.get(dtype, (1.0,)))
    plain = st.tuples(st.just(False), amplitudes)
    values = st.one_of(plain, st.tuples(st.just(True), st.just(1.0))) if spec.special_values else plain
    # The exact tier first, so a failure it reproduces shrinks into it (which rows, not a budget)
    exact = st.sampled_from((True,) + (False,) * (EXACT_SHARE - 1))

    def case(dims: dict[str, int], layouts: dict[str, str], seed: int, special_amplitude: tuple[bool, float],
             exact: bool) -> Case:
        special, amplitude = special_amplitude
        exact = exact and not special
        return Case(dims=dims, dtype=dtype, layouts=layouts, seed=seed, special=special,
                    amplitude=1.0 if exact else amplitude, exact=exact)

    # by keyword, so that a Hypothesis that prints how it built a failing case names each field
    return st.builds(
        case,
        dims=dims(spec, max_dim=max_dim, max_elements=max_elements),
        layouts=layouts(spec),
        seed=seeds(),
        special_amplitude=values,
        exact=exact,
    )


EDGE_CASES = 8
"""Each dim takes at least this many distinct edge values across the edge cases, where its range
has that many."""


def spread(values: Sequence[int], count: int) -> list[int]:
    """Up to ``count`` distinct entries of the ascending ``values``, evenly spaced by index, first
    and last included."""
    if len(values) <= count:
        return list(values)
    return sorted({values[round(i * (len(values) - 1) / (count - 1))] for i in range(count)})


def edge_picks(
    low: int, high: int, tiles: Sequence[int], multiple: int = 1, blocks: Sequence[int] = ()
) -> list[int]:
    """The values one dim walks through in the edge cases, in order: its low end, the first tile
    size + 1, its high end, for each block size ``B`` of ``blocks`` one block and a half and one
    block and one (``B + B // 2``, ``B + 1``: a whole block, then a trailing partial one), the first
    size of every power-of-two bucket (``2**k + 1``) in range, then more of its edge tier until it
    has :data:`EDGE_CASES` values (where the range allows). With ``multiple``, each pick is the
    first multiple at or above it."""
    edges = edge_dims(low=low, high=high, tiles=tiles, multiple=multiple, blocks=blocks)
    lo, hi = edges[0], edges[-1]

    def up(v: int) -> int:
        return -(-v // multiple) * multiple

    # just past a tile; with a multiple, the first multiple past a tile that lies above the low end
    first = lo if multiple == 1 else lo + 1
    above_tile = [up(t + 1) for t in sorted(tiles) if first <= up(t + 1) <= hi]
    picks = [lo, above_tile[0] if above_tile else edges[len(edges) // 2], hi]
    picks += [up(v) for b in blocks for v in (b + b // 2, b + 1) if lo <= up(v) <= hi]
    picks += [up(v) for v in powers_of_two(low, high) if (v % 2 == 1 or v == 2) and lo <= up(v) <= hi]
    picks = list(dict.fromkeys(picks))
    for v in spread(edges, len(edges)):
        if len(picks) >= EDGE_CASES:
            break
        if v not in picks:
            picks.insert(3 + (len(picks) - 3) // 2, v)  # keep the buckets spread over the cases
    return picks


def edge_cases(
    spec: KernelSpec,
    *,
    dtype: str,
    max_dim: int | None = None,
    max_elements: int | None = None,
    count: int | None = None,
    above_cap: bool = False,
) -> list[Case]:
    """Cases always tried before random ones (contiguous where the input allows it, else its first
    declared layout; seed 0, no special values).

    Case ``j`` sets every dim to the ``j``-th of its :func:`edge_picks` (cycling when a dim has
    fewer): case 0 every dim at its low end, case 1 at the first tile size + 1, case 2 at its
    (capped) high, then through the block edges and the power-of-two buckets, so a variant chosen
    per bucket runs once per bucket. Cases from 3 on cycle the amplitudes of ``dtype``. Sizes are
    clipped, in declaration order, to ``max_elements`` per tensor (the largest edge value under the
    cap). ``count`` limits the number of these cases (default: as many as the longest picks list).

    Then, always: case 1 (else 0) once more in the exact value tier (:attr:`tensors.Case.exact`);
    with ``above_cap`` (Triton kernels under the interpreter), one case per symbol whose range
    exceeds ``max_dim``: that symbol at ``min(high, 2 * max_dim + 1)``, above the cap and past the
    next power-of-two bucket, every other dim at its low end, so a large-dim path runs at least
    once at a bounded cost; and one case per value of :data:`EDGE_GRID` and symbol whose range
    (under the caps, the other dims at their low ends) reaches it, the other dims at their low
    ends.
    """
    per_sym = {
        sym: edge_picks(*capped_range(lo, hi, max_dim), spec.tiles_for(sym), spec.multiple_for(sym),
                        block_sizes(spec, sym))
        for sym, (lo, hi) in spec.dims.items()
    }
    n = max((len(p) for p in per_sym.values()), default=1)
    if count is not None:
        n = min(n, count)
    amplitudes = AMPLITUDES.get(dtype, (1.0,))
    # Contiguous where the declaration allows it, else the first layout it allows.
    allowed = {name: layouts_for(len(t.shape), t.layouts) for name, t in spec.inputs.items()}
    contiguous = {name: "contiguous" if "contiguous" in ok else ok[0] for name, ok in allowed.items()}
    out: list[Case] = []

    def add(dims_: dict[str, int], amplitude: float = 1.0, exact: bool = False) -> None:
        case = Case(dims=dims_, dtype=dtype, layouts=dict(contiguous), seed=0, amplitude=amplitude,
                    exact=exact)
        if case not in out:
            out.append(case)

    for j in range(n):
        chosen: dict[str, int] = {}
        for sym, picks in per_sym.items():
            want = picks[j % len(picks)]
            lo, hi = _limit(spec, sym, chosen, max_dim, max_elements)
            fits = [v for v in _edges(spec, sym, lo, hi) if v <= want]
            chosen[sym] = fits[-1] if fits else lo
        add(chosen, amplitudes[(j - 2) % len(amplitudes)] if j >= 3 else 1.0)
    if out:
        add(dict(out[min(1, len(out) - 1)].dims), exact=True)
    lows = {s: snap(lo, hi, spec.multiple_for(s))[0] for s, (lo, hi) in spec.dims.items()}
    if above_cap and max_dim:
        for sym, (lo, hi) in spec.dims.items():
            if hi > max_dim:
                add({**lows, sym: snap(max(lo, min(hi, 2 * max_dim + 1)), hi, spec.multiple_for(sym))[0]})
    for sym, (_, declared_high) in spec.dims.items():
        if declared_high < EDGE_GRID[0]:
            continue
        lo, hi = _limit(spec, sym, lows, max_dim, max_elements)
        for v in EDGE_GRID:
            at = snap(v, v + spec.multiple_for(sym) - 1, spec.multiple_for(sym))[0]
            if lo <= at <= hi:
                add({**lows, sym: at})
    return out


def smaller_cases(spec: KernelSpec, case: Case) -> list[Case]:
    """Candidates for shrinking a failing edge case, simplest first: the same dims in the exact
    value tier (a failure it reproduces names its rows and columns), amplitude 1, then, per symbol
    in order, each edge value of its declared range below its current size, ascending."""
    out = []
    if not case.exact:
        out.append(dataclasses.replace(case, exact=True, special=False, amplitude=1.0))
    if case.amplitude != 1.0:
        out.append(dataclasses.replace(case, amplitude=1.0))
    for sym, (lo, _) in spec.dims.items():
        size = case.dims[sym]
        for v in _edges(spec, sym, lo, size):
            if v < size:
                out.append(dataclasses.replace(case, dims={**case.dims, sym: v}))
    return out

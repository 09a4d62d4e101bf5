"""Build a kernel's input tensors from a drawn case: dims, dtype, layouts and one seed.

Tensors are made from the seed on the target device (never element by element through
Hypothesis), so a case is reproducible from its printed fields alone.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import torch

from pytest_fusion.declare import sizes
from pytest_fusion.declare.spec import KernelSpec, Tensor

SPECIAL_VALUES = (float("nan"), float("inf"), float("-inf"), -0.0)

AMPLITUDES = {"float16": (1.0, 30.0, 2.0**14), "bfloat16": (1.0, 30.0), "float32": (1.0, 30.0)}
"""Standard deviations the activations (the first floating input) are drawn with, per test dtype.

1: unit-variance activations; 30: activations of tens, as real models' hidden states reach
(a GeGLU gate past about 10.5 is where an unclamped tanh of exponentials overflows);
2**14 (float16 only): outputs of a unit-gain layer reach the neighbourhood of float16's largest
finite value 65504 (3.5 standard deviations is 57344), where overflow handling shows."""


@dataclasses.dataclass(frozen=True)
class Case:
    """One drawn test case. Every field is printed on failure and suffices to rebuild the inputs.

    Attributes:
        dims: size of each shape symbol, e.g. ``{"M": 17, "K": 1, "N": 63}``.
        dtype: test dtype name (``"float16"``, ``"bfloat16"``, ``"float32"``).
        layouts: memory layout of each tensor input (see ``spec.LAYOUTS``).
        seed: seed of the torch generator the values are drawn from.
        special: whether NaN, +-inf and -0.0 were planted in the inputs.
        amplitude: standard deviation of the first floating input (the activations), one of
            :data:`AMPLITUDES`; 1 for bench inputs.
        exact: the exact value tier: every floating input holds small dyadic values
            (:func:`exact_values`) instead of normals, so a GEMM-like output is exact in any
            summation order and must equal golden (docs/oracle.md#the-exact-value-tier).
    """

    dims: Mapping[str, int]
    dtype: str
    layouts: Mapping[str, str]
    seed: int
    special: bool = False
    amplitude: float = 1.0
    exact: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The case as the JSON a repro takes (``exact`` only when set)."""
        out = {
            "dims": dict(self.dims),
            "dtype": self.dtype,
            "layouts": dict(self.layouts),
            "seed": self.seed,
            "special": self.special,
            "amplitude": self.amplitude,
        }
        if self.exact:
            out["exact"] = True
        return out


def torch_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16``; raises ValueError for an unknown name."""
    dt = getattr(torch, name.replace("torch.", ""), None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown torch dtype {name!r}")
    return dt


def shape_of(tensor: Tensor, dims: Mapping[str, int]) -> tuple[int, ...]:
    """``tensor``'s shape at ``dims``: each entry a dims symbol's size, a fixed size or a size derived
    from the dims (:func:`pytest_fusion.declare.sizes.size`)."""
    return tuple(sizes.size(s, dims) for s in tensor.shape)


def value_scale(
    name: str, tensor: Tensor, dims: Mapping[str, int], first: bool, amplitude: float = 1.0
) -> float:
    """Standard deviation of ``name``'s values (see :class:`spec.Tensor`); ``amplitude`` scales the
    first input (the activations) unless the tensor fixes its own ``scale``."""
    if tensor.scale is not None:
        return tensor.scale
    if not first and "K" in tensor.shape and "K" in dims:
        return 1.0 / math.sqrt(dims["K"])
    return amplitude if first else 1.0


GUARD_BYTES = 256
"""Size of the guard band before and after every input's storage (and after every output the
kernel allocates, see :class:`pytest_fusion.oracle.hygiene.PoisonAllocations`). 256 bytes keeps a view
that starts after the band as aligned as the allocation itself (the CUDA caching allocator hands
out 512-byte aligned blocks), so 16-byte TMA alignment and vectorised paths stay as they are."""

GAP_LOW = 4096.0
"""Gap and guard values are +-GAP_LOW x [1, 2): finite in every float dtype (fp16 max 65504),
far larger than any drawn input, so one such value in a dot product is a mismatch, while
``0 * value`` stays 0 for code that loads them into zero-weighted lanes."""

_PATTERN_PERIOD = 1021
"""The gap pattern repeats with this (prime) period: drawing it per element would cost a second
randn over a 235M-element weight at full ranges; a prime period never lines up with a row."""


def gap_pattern(numel: int, dtype: torch.dtype, seed: int, device: str = "cpu") -> torch.Tensor:
    """``numel`` filler values for the gaps and guard bands of an input, derived from ``seed``.

    Floats: ``+-GAP_LOW * (1 + u)`` with ``u`` uniform in [0, 1) and a random sign; integers:
    uniform in the upper half of the dtype's magnitude range with a random sign; bool: True.
    The same (numel, dtype, seed) gives the same bits on every device.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed % 2**63)
    n = min(numel, _PATTERN_PERIOD)
    if dtype == torch.bool:
        block = torch.ones(n, dtype=torch.bool)
    elif dtype.is_floating_point:
        sign = torch.randint(0, 2, (n,), generator=gen).to(torch.float32) * 2 - 1
        block = (sign * GAP_LOW * (1 + torch.rand(n, generator=gen))).to(dtype)
    else:
        info = torch.iinfo(dtype)
        low = info.max // 2
        if info.max < 2**63 - 1:
            block = torch.randint(low, info.max + 1, (n,), generator=gen, dtype=torch.int64)
        else:  # int64: max + 1 does not fit the bound randint takes; random_'s open end is max
            block = torch.empty(n, dtype=torch.int64).random_(low, None, generator=gen)
        if info.min < 0:
            block = block * (torch.randint(0, 2, (n,), generator=gen) * 2 - 1)
        block = block.to(dtype)
    block = block.to(device)
    if numel <= n:
        return block[:numel].clone()
    return block.repeat(-(-numel // n))[:numel]


def layout_geometry(shape: tuple[int, ...], layout: str) -> tuple[tuple[int, ...], int, int]:
    """Element strides, storage offset and storage extent (elements) of ``shape`` laid out as
    ``layout`` describes (see ``spec.LAYOUTS``), before guard bands.

    Raises:
        ValueError: an unknown layout.
    """

    def contiguous(s: tuple[int, ...]) -> tuple[int, ...]:
        strides, acc = [], 1
        for d in reversed(s):
            strides.append(acc)
            acc *= max(d, 1)
        return tuple(reversed(strides))

    numel = math.prod(shape)
    if layout == "contiguous" or not shape or (layout == "transposed" and len(shape) < 2):
        return contiguous(shape), 0, numel
    if layout == "transposed":
        swapped = (*shape[:-2], shape[-1], shape[-2])
        st = list(contiguous(swapped))
        st[-1], st[-2] = st[-2], st[-1]
        return tuple(st), 0, numel
    if layout == "offset":
        return contiguous(shape), 1, numel + 1
    if layout == "padded":
        if len(shape) == 1:
            return (2,), 0, 2 * shape[0]
        padded = (*shape[:-1], shape[-1] + 3)
        return contiguous(padded), 0, math.prod(padded)
    raise ValueError(f"unknown layout {layout!r}")


def guard_elements(dtype: torch.dtype) -> int:
    """Elements of ``dtype`` in one guard band (:data:`GUARD_BYTES`)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return -(-GUARD_BYTES // itemsize)


def _strided_storage(
    shape: tuple[int, ...], layout: str, dtype: torch.dtype, device: str, seed: int
) -> torch.Tensor:
    """A tensor of ``shape`` laid out in memory as ``layout`` describes, inside one allocation
    that also holds a guard band of :data:`GUARD_BYTES` before and after it. Every element of the
    allocation, guard bands and layout gaps included, holds :func:`gap_pattern` (``seed``) until
    the caller writes the tensor's values."""
    strides, offset, extent = layout_geometry(shape, layout)
    guard = guard_elements(dtype)
    flat = gap_pattern(guard + extent + guard, dtype, seed, device)
    return flat.as_strided(shape, strides, guard + offset)


_SAME_WIDTH_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def element_bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements as signed integers of their own width (int8, int16, int32 or int64), of
    ``t``'s shape: two tensors' element bits are equal exactly where their bits are (NaN payloads
    told apart, ``-0.0 != 0.0``). What every bitwise comparison of the oracle looks at.

    A view of ``t``'s memory (writes through it land in ``t``) for any strides: non-contiguous,
    zero-stride (expanded), offset, one element with stride 2 (a reinterpretation at the same
    width never needs the unit last stride a byte view does). A complex tensor gives its real and
    imaginary parts as a last dim of 2; a conjugate or negative view is resolved first, into a copy.
    """
    t = t.detach().resolve_conj().resolve_neg()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.view(_SAME_WIDTH_INT[t.element_size()])


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """The whole allocation under ``t`` (guard bands and gaps included) as a flat uint8 tensor
    sharing its memory: what a bitwise before/after comparison of an input looks at."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def covered_bytes(t: torch.Tensor) -> torch.Tensor:
    """A bool mask over :func:`storage_bytes` (``t``): True at the bytes of ``t``'s own elements."""
    size = t.element_size()
    n = t.untyped_storage().nbytes() // size
    mask = torch.zeros(n, dtype=torch.bool, device=t.device)
    if t.numel():
        mask.as_strided(t.shape, t.stride(), t.storage_offset()).fill_(True)
    return mask.repeat_interleave(size)


def describe_offset(t: torch.Tensor, byte: int) -> str:
    """Where byte ``byte`` of ``t``'s allocation lies relative to ``t``'s elements, e.g.
    ``"element offset +12 (3 past its last element)"``; offsets count elements of ``t``'s dtype
    from its first element."""
    size = t.element_size()
    rel = byte // size - t.storage_offset()
    if rel < 0:
        where = f"{-rel} before its first element"
    else:
        last = (
            sum((d - 1) * s for d, s in zip(t.shape, t.stride(), strict=True) if d > 0) if t.numel() else -1
        )
        where = f"{rel - last} past its last element" if rel > last else "in a gap of its layout"
    return f"element offset {rel:+d} ({where})"


OUTSIDE_NAN_BITS = {
    torch.float16: 0x7E3C,
    torch.bfloat16: 0x7FC5,
    torch.float32: 0x7FC0FACE,
    torch.float64: 0x7FF8FACEFACEFACE,
}
"""The quiet NaN :func:`nan_outside` writes around an input, per dtype: a payload apart from the
default NaN and from the poison of allocated outputs (``hygiene.POISON_BITS``); other floating
dtypes get the default NaN."""


def _outside(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The elements of ``t``'s allocation before its first element and after its last one, as two
    flat views of ``t``'s dtype."""
    flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())
    first = t.storage_offset()
    span = sum((d - 1) * s for d, s in zip(t.shape, t.stride(), strict=True)) + 1 if t.numel() else 0
    return flat[:first], flat[first + span:]


def finite_outside(t: torch.Tensor, seed: int) -> None:
    """Undo :func:`nan_outside` on input ``t`` of a case, whose pattern seed is ``seed``
    (:func:`pattern_seed`): the elements before and after it hold :func:`gap_pattern` again."""
    if not t.dtype.is_floating_point:
        return
    flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())
    pattern = gap_pattern(flat.numel(), t.dtype, seed, str(t.device))
    before, after = _outside(t)
    with torch.no_grad():
        before.copy_(pattern[:before.numel()])
        after.copy_(pattern[flat.numel() - after.numel():])


def nan_outside(t: torch.Tensor) -> None:
    """Fill the elements of ``t``'s allocation before its first element and after its last one
    (its guard bands and the offset layout's leading gap) with :data:`OUTSIDE_NAN_BITS`, in place;
    the gaps between rows of the padded layout keep their finite pattern (torch's own CPU bf16
    GEMM loads them into zero-weighted lanes). A no-op for a tensor that is not floating-point.
    Only for tensors in an allocation of their own (:func:`make_inputs`): it writes outside ``t``."""
    if not t.dtype.is_floating_point:
        return
    bits = OUTSIDE_NAN_BITS.get(t.dtype)
    with torch.no_grad():
        for part in _outside(t):
            if bits is None:
                part.fill_(float("nan"))
            else:
                element_bits(part).fill_(bits)  # sign bit clear: the bits fit the signed view


def pattern_seed(seed: int, index: int) -> int:
    """Seed of the gap pattern of input number ``index`` in a case drawn with ``seed``: its own
    stream, so the pattern never changes the drawn values."""
    return (seed * 1_000_003 + index * 7919 + 0x5F3759DF) % 2**63


INTEGER_BOUNDS = (-8, 8)
"""Values of an integer input that declares no ``bounds``: small enough that an integer GEMM's
sums stay exact in any accumulator."""


DRAW_CHUNK = 1 << 22
"""Inputs of more values than this are drawn in chunks of this many values, chunk ``c`` of input
``i`` from its own generator (:func:`chunk_seed`), the chunks spread over ``torch.get_num_threads()``
Python threads (each chunk's own ops may use torch's threads too): one serial stream takes seconds
at full dims (docs/oracle.md#drawing-in-chunks). The values never depend on the number of threads.
Smaller inputs draw from the case's one generator, in the spec's order; a chunked input does not
advance it, so the inputs after it draw as if it were not there."""


def chunk_seed(seed: int, index: int, chunk: int) -> int:
    """Seed of chunk ``chunk`` of input number ``index`` of a case drawn with ``seed``
    (:data:`DRAW_CHUNK`): numpy's ``SeedSequence`` of the three, cut to the 32 bits torch's CPU
    generator (mt19937) keeps of a seed, so two chunks share a stream with probability 2^-32."""
    import numpy as np

    state = np.random.SeedSequence([seed % 2**64, index, chunk]).generate_state(1, np.uint64)
    return int(state[0]) & 0xFFFF_FFFF


def _fill(
    values: torch.Tensor, fill: Callable[[torch.Tensor, torch.Generator], None], gen: torch.Generator,
    seed: int, index: int,
) -> torch.Tensor:
    """``fill(flat, generator)`` applied in place to contiguous ``values``: once with ``gen`` when
    it holds at most :data:`DRAW_CHUNK` values, else per chunk with the chunk's own generator,
    chunks in parallel (torch ops release the GIL)."""
    flat = values.view(-1)
    if flat.numel() <= DRAW_CHUNK:
        fill(flat, gen)
        return values
    from concurrent.futures import ThreadPoolExecutor

    def one(chunk: int) -> None:
        part = flat[chunk * DRAW_CHUNK:(chunk + 1) * DRAW_CHUNK]
        fill(part, torch.Generator(device="cpu").manual_seed(chunk_seed(seed, index, chunk)))

    chunks = -(-flat.numel() // DRAW_CHUNK)
    with ThreadPoolExecutor(max_workers=max(1, min(torch.get_num_threads(), chunks))) as pool:
        list(pool.map(one, range(chunks)))
    return values


EXACT_INTEGERS = (-2, -1, 1, 2)
"""The values of a floating input without ``bounds`` in the exact tier: no zero (a zero weight
would make two different rows of x give the same output row), small enough that a sum of
K = 64 products of two of them (at most 256) is an integer every supported dtype holds exactly,
bfloat16's 8 significant bits included."""

EXACT_STEPS = 8
"""A bounded floating input's exact values lie on a grid of at least this many steps of a power of
two inside its bounds (:func:`exact_values`)."""


def exact_values(bounds: tuple[float, float] | None, numel: int, gen: torch.Generator) -> torch.Tensor:
    """``numel`` float32 values of the exact tier, drawn with ``gen``: without ``bounds``, uniform
    over :data:`EXACT_INTEGERS`; with them, uniform over the multiples of the largest power of two
    ``2**e`` that puts at least :data:`EXACT_STEPS` of them in [low, high] (a scale in
    (0.5/127, 2/127) takes 3..8 x 2**-9: at most 3 significant bits). Products and sums of such
    values are exact in any order while they stay within the dtype's significand."""
    if bounds is None:
        choices = torch.tensor(EXACT_INTEGERS, dtype=torch.float32)
    else:
        low, high = (float(b) for b in bounds)
        if high <= low:
            return torch.full((numel,), low, dtype=torch.float32)
        step = 2.0 ** math.floor(math.log2((high - low) / EXACT_STEPS))
        first, last = math.ceil(low / step), math.floor(high / step)
        choices = torch.arange(first, last + 1, dtype=torch.float64).mul_(step).to(torch.float32)
    return choices[torch.randint(len(choices), (numel,), generator=gen)]


def _float_values(
    name: str, tensor: Tensor, shape: tuple[int, ...], case: Case, index: int, gen: torch.Generator,
    dtype: torch.dtype,
) -> torch.Tensor:
    """float32 values of floating input number ``index``: uniform in its ``bounds``, else normal with
    :func:`value_scale` standard deviation; clamped to ``dtype``'s finite range. In the exact tier
    (``case.exact``), :func:`exact_values` instead."""
    big = torch.finfo(dtype).max
    if case.exact:
        bounds = tensor.bounds

        def fill(t: torch.Tensor, g: torch.Generator) -> None:
            t.copy_(exact_values(bounds, t.numel(), g))
    elif tensor.bounds is not None:
        low, high = (float(b) for b in tensor.bounds)

        def fill(t: torch.Tensor, g: torch.Generator) -> None:
            t.uniform_(0.0, 1.0, generator=g).mul_(high - low).add_(low).clamp_(-big, big)
    else:
        scale = value_scale(name, tensor, case.dims, first=(index == 0), amplitude=case.amplitude)

        def fill(t: torch.Tensor, g: torch.Generator) -> None:
            t.normal_(generator=g).mul_(scale).clamp_(-big, big)

    return _fill(torch.empty(shape, dtype=torch.float32), fill, gen, case.seed, index)


def integer_bounds(dtype: torch.dtype) -> tuple[int, int]:
    """The values an integer input of ``dtype`` that declares no ``bounds`` draws from:
    :data:`INTEGER_BOUNDS` cut to what ``dtype`` holds (uint8: [0, 8], not a -8 that wraps to 248);
    bool: :data:`INTEGER_BOUNDS` as before, cast to True except at 0."""
    if dtype == torch.bool:
        return INTEGER_BOUNDS
    info = torch.iinfo(dtype)
    return max(INTEGER_BOUNDS[0], int(info.min)), min(INTEGER_BOUNDS[1], int(info.max))


def _integer_values(
    tensor: Tensor, shape: tuple[int, ...], case: Case, index: int, gen: torch.Generator, dtype: torch.dtype
) -> torch.Tensor:
    """int64 values of integer input number ``index`` (of ``dtype``): uniform in its ``bounds``,
    else in :func:`integer_bounds`, both ends included."""
    low, high = (int(b) for b in (tensor.bounds or integer_bounds(dtype)))
    top = high + 1 if high < 2**63 - 1 else None  # random_'s end is exclusive, and None means int64's max

    def fill(t: torch.Tensor, g: torch.Generator) -> None:
        t.random_(low, top, generator=g)

    return _fill(torch.empty(shape, dtype=torch.int64), fill, gen, case.seed, index)


def last_writes(where: torch.Tensor, which: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(where, which)`` with each position of ``where`` once, keeping its last ``which``: what
    ``flat[where] = v[which]`` gives one write after another. Positions drawn with replacement
    repeat (a 4M-value input has about two repeats), and torch's indexed write of repeated
    positions on several threads lets any of them win, so the planted value would hang on
    thread timing."""
    import numpy as np

    # np.unique's first occurrences in the reversed order are the last ones in the original
    positions, first = np.unique(where.numpy()[::-1], return_index=True)
    return torch.from_numpy(positions.copy()), which.flip(0)[torch.from_numpy(first)]


def make_inputs(
    spec: KernelSpec, case: Case, device: str, values: list[torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """The kernel's tensor inputs for ``case``, in the spec's order, on ``device``.

    Floating inputs are normal with :func:`value_scale` standard deviation (the first one scaled by
    ``case.amplitude``), drawn in float32, clamped to their dtype's finite range and rounded once
    to it (uniform in ``bounds`` where the input declares them); integer inputs are uniform in
    their ``bounds``, else in :func:`integer_bounds`. With ``case.special``,
    ``1 + numel // 1024`` elements of each tensor that allows it become NaN, +inf, -inf or -0.0:
    sparse enough that most outputs of a GEMM (where one NaN spoils a whole row) stay finite.
    Values are written into the storage layout after drawing, so the layout never changes a value.
    Each tensor sits in its own allocation between two guard bands (:data:`GUARD_BYTES`); the
    bands and the gaps of the padded and offset layouts hold :func:`gap_pattern`, derived from
    the seed, so a kernel reading them computes the same wrong value every time.

    In the exact tier (``case.exact``) floating inputs hold :func:`exact_values` instead, and
    column 0 of each one of rank >= 2 without ``bounds`` holds its rows' ids (:func:`_row_ids`).

    ``values``: :func:`draw_values` ``(spec, case)`` drawn earlier (the same bits as drawing here).

    Raises:
        ValueError: an unknown layout or dtype name.
    """
    values = draw_values(spec, case) if values is None else values
    out: dict[str, torch.Tensor] = {}
    for i, (name, v) in enumerate(zip(spec.inputs, values, strict=True)):
        layout = case.layouts.get(name, "contiguous")
        storage = _strided_storage(tuple(v.shape), layout, v.dtype, device, seed=pattern_seed(case.seed, i))
        storage.copy_(v)
        out[name] = storage
    return out


def draw_values(spec: KernelSpec, case: Case) -> list[torch.Tensor]:
    """The values of ``case``'s inputs (:func:`make_inputs`), on the host, contiguous, in the spec's
    order and each input's dtype: the half of making inputs that costs at full dims (seconds,
    :data:`DRAW_CHUNK`), done before a large case waits for its device
    (:mod:`pytest_fusion.property.examples`). The bits depend on ``case`` and on the CPU vector path
    torch's kernels take (``ATEN_CPU_CAPABILITY``: its non-vector ``default`` draws normals about an
    ulp apart in float32 from AVX2 and AVX-512), never on the device or the number of threads."""
    gen = torch.Generator(device="cpu").manual_seed(case.seed)
    test_dtype = torch_dtype(case.dtype)
    out: list[torch.Tensor] = []
    for i, (name, tensor) in enumerate(spec.inputs.items()):
        shape = shape_of(tensor, case.dims)
        dtype = torch_dtype(tensor.dtype) if tensor.dtype else test_dtype
        if dtype.is_floating_point:
            values = _float_values(name, tensor, shape, case, i, gen, dtype)
            if case.special and tensor.special and values.numel():
                n_special = 1 + values.numel() // 1024
                where = torch.randint(values.numel(), (n_special,), generator=gen)
                which = torch.randint(len(SPECIAL_VALUES), (n_special,), generator=gen)
                where, which = last_writes(where, which)
                flat = values.view(-1)
                flat[where] = torch.tensor(SPECIAL_VALUES, dtype=torch.float32)[which]
            if case.exact and tensor.bounds is None and values.dim() >= 2 and values.numel():
                _row_ids(values)
        else:
            values = _integer_values(tensor, shape, case, i, gen, dtype)
        out.append(values.to(dtype))
    return out


def _row_ids(values: torch.Tensor) -> None:
    """Write each row's id into column 0 of an exact-tier input, in place: row ``i`` (along dim -2)
    holds ``EXACT_INTEGERS[i % 4]`` there, so rows next to each other always differ (a kernel
    writing row 0's result into row 1 cannot match golden by chance)."""
    rows = values.shape[-2]
    ids = torch.tensor(EXACT_INTEGERS, dtype=values.dtype)[torch.arange(rows) % len(EXACT_INTEGERS)]
    values[..., :, 0] = ids

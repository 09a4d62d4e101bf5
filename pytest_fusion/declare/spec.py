"""What a fused kernel promises: the declarative spec behind ``@pytest.mark.fused_kernel``.

Plain Python, no torch import: the data types (:class:`KernelSpec`, :class:`Tensor`,
:class:`BenchCase`) and the policy defaults. :mod:`pytest_fusion.declare.marker` validates the marker's
arguments into a :class:`KernelSpec`; the oracle, the strategies and the bench read it.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Mapping

SUPPORTED_DTYPES = ("float16", "bfloat16", "float32")
"""Test dtypes a spec may declare (the dtype of the floating inputs and of the output)."""

ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4}
"""Bytes per element of each supported dtype (the ``itemsize`` passed to a ``bytes`` callable)."""

FLOAT_INPUT_DTYPES = (
    "float16", "bfloat16", "float32", "float64",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
)
"""Floating dtypes an input may declare as its own (:attr:`Tensor.dtype`): torch's names."""

INTEGER_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "uint8": (0, 2**8 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
}
"""Integer dtypes an input may declare as its own, with the values each can hold (what
:attr:`Tensor.bounds` is checked against: a value outside would wrap around when cast)."""

INPUT_DTYPES = FLOAT_INPUT_DTYPES + tuple(INTEGER_RANGES) + ("bool",)
"""Every dtype name :attr:`Tensor.dtype` accepts."""

DEFAULT_TILES = (16, 32, 64, 128)
"""Tile sizes whose neighbours (t - 1, t, t + 1) are edge dims when the spec names none.

They are the block sizes Triton matmul kernels commonly use (the Triton matmul tutorial's
autotune configs use 32, 64, 128 and 256 on each axis; 16 is the smallest tl.dot block)."""

DEFAULT_ERROR_MULTIPLE = 2.0
"""Kernel error may be this multiple of eager's own error against golden at each element
(docs/oracle.md#the-error-budget)."""

DEFAULT_ULPS = 4.0
"""Plus this many ulps of the output dtype at each golden element's magnitude."""

DEFAULT_MAX_EXAMPLES = 25
"""Hypothesis examples per (kernel, dtype) when neither the spec nor the command line says."""

DEFAULT_CPU_MAX_DIM = 64
"""Triton kernels on the CPU run under the interpreter, so every dim is capped to this: the
interpreter runs each program instance in Python, so an 8192-wide dim would take minutes per
example. One case per symbol still goes above it (:func:`strategies.edge_cases`)."""

DEFAULT_TOLERANCE = 0.05
"""Gate tolerance: a case fails when its speedup falls below the stored one by more than 5%
(docs/timing-and-gate.md#the-gate)."""


CONFIG_TIER_CASES = 2
"""How many of a passing search's cases the config tier checks at each autotune config pinned: the
smallest (fewest elements) first (``pytest_fusion.property.config_tier``)."""

CONFIG_TIER_BUDGET_S = 10.0
"""The config tier's seconds per test and dtype on a GPU by default (each pinned config compiles
once there); under the Triton interpreter the tier is off unless a budget is given."""

EXPLORE_BUDGET_S = 60.0
"""Default seconds the slow-shape search (``--fusion-explore``, ``pytest_fusion.bench.explore``) may
spend per test and dtype (new shapes' checks, compiles, tunes and timings all count). A shape
started before the budget ends is finished, so a run overshoots by at most one shape's cost."""

EXPLORE_EXAMPLES = 20
"""Default cap on new shapes the slow-shape search times, and again on those its shrink times:
each is a torch.compile (seconds on a GPU) and maybe a tune, so the cap bounds the cost where the
budget is large."""


LAYOUTS = ("contiguous", "transposed", "offset", "padded")
"""Memory layouts an input may be drawn in.

- ``contiguous``: row-major, storage offset 0.
- ``transposed``: the last two dims swapped in memory (a ``.t()`` / ``.mT`` view); 1-D: contiguous.
- ``offset``: a slice of a larger buffer, storage offset > 0 (misaligned by one element).
- ``padded``: leading dimension larger than the row (2-D+: rows padded; 1-D: stride 2).
"""


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""``torch.compile`` modes (``default`` passes ``mode=None``), as torch.compile documents them."""


def compile_name(mode: str) -> str:
    """The provider name of ``torch.compile`` in ``mode``: ``compile`` for the default mode, else
    ``compile-<mode>`` (``compile-max-autotune-no-cudagraphs``)."""
    return "compile" if mode == "default" else f"compile-{mode}"


def compile_mode_of(name: str) -> str | None:
    """The ``torch.compile`` mode a provider name stands for (:func:`compile_name`'s inverse), or
    None when ``name`` is not a compile provider."""
    modes = {compile_name(m): m for m in COMPILE_MODES}
    return modes.get(name)


def is_builtin(name: str) -> bool:
    """Whether ``name`` is the kernel, ``eager`` or a compile provider in any mode: names a
    marker's extra provider may not take."""
    return name in ("kernel", "eager") or compile_mode_of(name) is not None


class FusionUsageError(ValueError):
    """A fused_kernel marker or API call is malformed; the message names the argument."""


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One tensor input of a kernel, when a bare shape tuple is not enough.

    Args:
        shape: symbolic shape, e.g. ``("N", "K")``; an int stands for a fixed size, and a size
            may be derived from the dims: ``("N", "cdiv(K, 32)")`` (one scale per block of 32),
            ``("2*d", "K")`` (a packed gate/up weight), ``("N", "K // 2")`` (two int4 values per
            byte). Derived sizes take integers, dims symbols, ``+ - * //``, parentheses and
            ``cdiv(a, b)``, nothing else (:mod:`pytest_fusion.declare.sizes`); a divisor such as
            the 32 of ``cdiv(K, 32)`` makes K's block edges an edge tier.
        dtype: the tensor's own dtype (``"int8"``, ``"float8_e4m3fn"``, ``"float32"`` for scales);
            ``None`` means the test dtype.
        scale: standard deviation of the normal values; ``None`` means ``1/sqrt(K)`` for an
            input other than the first whose shape names ``K`` (a weight, as nn.Linear initialises
            it, keeping outputs near unit variance for any K), else 1. Integer dtypes draw
            uniformly from [-8, 8] (cut to the dtype's range: uint8 [0, 8]) unless ``bounds``
            says otherwise.
        layouts: the memory layouts Hypothesis may draw for it (see :data:`LAYOUTS`);
            ``None`` means all that apply to its rank.
        special: whether special values (NaN, +-inf, -0.0; on by default, see the marker's
            ``special_values``) may be planted in it.
        bounds: ``(low, high)``: draw the values uniformly from [low, high] instead (integer
            dtypes: every integer in it, e.g. ``(-127, 127)`` for symmetric int8 weights; floats:
            e.g. ``(0.5 / 127, 2 / 127)`` for positive per-channel scales, ``(-1, 1)`` for
            cos/sin tables). ``scale`` and the activations' amplitude then do not apply.
    """

    shape: tuple[str | int, ...]
    dtype: str | None = None
    scale: float | None = None
    layouts: tuple[str, ...] | None = None
    special: bool = True
    bounds: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))
        if self.layouts is not None:
            object.__setattr__(self, "layouts", tuple(self.layouts))
        if self.bounds is not None and isinstance(self.bounds, list):
            object.__setattr__(self, "bounds", tuple(self.bounds))


@dataclasses.dataclass(frozen=True)
class BenchCase:
    """A named shape timed by ``--fusion-bench``: fixed dims and the dtypes to time it in.

    ``flops`` (floating-point operations of one call) and ``bytes`` (``{dtype: bytes one call
    must move}``) are the spec's ``flops``/``bytes`` callables evaluated once, when the spec is
    made; None / a missing dtype: unknown (the bench then counts inputs + outputs once).
    """

    name: str
    dims: Mapping[str, int]
    dtypes: tuple[str, ...]
    flops: float | None = None
    bytes: Mapping[str, float] = dataclasses.field(default_factory=dict)
    backward: bool = False
    """Time forward + backward (the marker's ``backward=True`` adds one such case per declared
    case, named with :data:`FWDBWD_SUFFIX`; :func:`backward_cases`)."""


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """A validated ``fused_kernel`` declaration. Build it with
    :func:`pytest_fusion.declare.marker.make_spec`; the fields are the marker's arguments
    (:func:`pytest_fusion.declare.marker.fused_kernel`)."""

    reference: Callable[..., Any]
    inputs: Mapping[str, Tensor]
    dims: Mapping[str, tuple[int, int]]
    dtypes: tuple[str, ...] = SUPPORTED_DTYPES
    constants: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    mutates: tuple[str, ...] = ()
    tiles: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    multiple_of: Mapping[str, int] = dataclasses.field(default_factory=dict)
    atol: float | None = None
    rtol: float | None = None
    error_multiple: float = DEFAULT_ERROR_MULTIPLE
    ulps: float = DEFAULT_ULPS
    special_values: bool = True
    deterministic: bool = False
    eager_parity: bool = False
    backward: bool = False
    retain_graph: bool = True
    poison: bool = True
    output_views: bool = False
    triton: bool = True
    fp32_precision: str = "ieee"
    device: str | None = None
    max_examples: int | None = None
    bench: tuple[BenchCase, ...] = ()
    flops: Callable[..., float] | None = None
    bytes: Callable[..., float] | None = None
    providers: Mapping[str, Callable[..., Any]] = dataclasses.field(default_factory=dict)
    min_speedup: Mapping[str, float] = dataclasses.field(default_factory=dict)
    tolerance: float | None = None

    def tiles_for(self, symbol: str) -> tuple[int, ...]:
        """Tile sizes whose neighbours are edge dims for ``symbol``."""
        return self.tiles.get(symbol, DEFAULT_TILES)

    def multiple_for(self, symbol: str) -> int:
        """What every drawn size of ``symbol`` is a multiple of (1: any size)."""
        return self.multiple_of.get(symbol, 1)


FWDBWD_SUFFIX = "-fwdbwd"
"""The name of a bench case's forward + backward twin is the case's name with this suffix."""


def backward_cases(bench: tuple[BenchCase, ...]) -> tuple[BenchCase, ...]:
    """``bench`` followed by each case's forward + backward twin: same dims and dtypes, named
    ``<case>-fwdbwd``, with no flops or bytes figure (the spec's count one forward call).

    Raises:
        FusionUsageError: a declared case already has a twin's name.
    """
    names = {c.name for c in bench}
    twins = tuple(BenchCase(c.name + FWDBWD_SUFFIX, c.dims, c.dtypes, backward=True) for c in bench)
    clash = [t.name for t in twins if t.name in names]
    if clash:
        raise FusionUsageError(
            f"bench declares {clash[0]!r}, the name backward=True gives the forward + backward timing "
            f"of {clash[0][: -len(FWDBWD_SUFFIX)]!r}: rename it"
        )
    return (*bench, *twins)


def check_tolerance(value: Any) -> float:
    """The one rule for a gate tolerance (marker, option, fixture, gate): a number in [0, 1).

    Raises:
        FusionUsageError: anything else (a ValueError), e.g. ``5`` meant as 5%.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise FusionUsageError(f"tolerance must be a fraction in [0, 1), got {value!r} (0.05 = 5%)")
    return float(value)


def call_with_dims(fn: Callable[..., float], dims: Mapping[str, int], **extra: Any) -> float:
    """Call ``fn`` with the dims (and ``extra``) it names in its signature; used for flops/bytes."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return float(fn(**dims, **extra))
    return float(fn(**{k: v for k, v in {**dims, **extra}.items() if k in params}))

"""What a fused kernel promises: the declarative spec behind ``@pytest.mark.fused_kernel``.

Plain Python, no torch import: the plugin builds a :class:`KernelSpec` from the marker's keyword
arguments at collection time, and the oracle, the strategies and the bench read it.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
from typing import Any, Callable, Mapping, Union

SUPPORTED_DTYPES = ("float16", "bfloat16", "float32")
"""Test dtypes a spec may declare (the dtype of the floating inputs and of the output)."""

DEFAULT_TILES = (16, 32, 64, 128)
"""Tile sizes whose neighbours (t - 1, t, t + 1) are edge dims when the spec names none.

They are the block sizes Triton matmul kernels commonly use (the Triton matmul tutorial's
autotune configs use 32, 64, 128 and 256 on each axis; 16 is the smallest tl.dot block)."""

DEFAULT_ERROR_MULTIPLE = 2.0
"""Kernel error may be this multiple of eager's own worst error against golden (DESIGN.md)."""

DEFAULT_ULPS = 4.0
"""Plus this many ulps of the output dtype at each golden element's magnitude."""


LAYOUTS = ("contiguous", "transposed", "offset", "padded")
"""Memory layouts an input may be drawn in.

- ``contiguous``: row-major, storage offset 0.
- ``transposed``: the last two dims swapped in memory (a ``.t()`` / ``.mT`` view); 1-D: contiguous.
- ``offset``: a slice of a larger buffer, storage offset > 0 (misaligned by one element).
- ``padded``: leading dimension larger than the row (2-D+: rows padded; 1-D: stride 2).
"""


class FusionUsageError(ValueError):
    """A fused_kernel marker or API call is malformed; the message names the argument."""


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One tensor input of a kernel, when a bare shape tuple is not enough.

    Args:
        shape: symbolic shape, e.g. ``("N", "K")``; an int stands for a fixed size.
        dtype: the tensor's own dtype (``"int8"``, ``"float8_e4m3fn"``, ``"float32"`` for scales);
            ``None`` means the test dtype.
        scale: standard deviation of the normal values; ``None`` means ``1/sqrt(K)`` for an
            input other than the first whose shape names ``K`` (a weight, as nn.Linear initialises
            it, keeping outputs near unit variance for any K), else 1. Integer dtypes draw
            uniformly from [-8, 8].
        layouts: the memory layouts Hypothesis may draw for it (see :data:`LAYOUTS`);
            ``None`` means all that apply to its rank.
        special: whether special values (NaN, +-inf, -0.0; on by default, see the marker's
            ``special_values``) may be planted in it.
    """

    shape: tuple[Union[str, int], ...]
    dtype: str | None = None
    scale: float | None = None
    layouts: tuple[str, ...] | None = None
    special: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))
        if self.layouts is not None:
            object.__setattr__(self, "layouts", tuple(self.layouts))


@dataclasses.dataclass(frozen=True)
class BenchCase:
    """A named shape timed by ``--fusion-bench``: fixed dims and the dtypes to time it in."""

    name: str
    dims: Mapping[str, int]
    dtypes: tuple[str, ...]


MARKER_ARGS = {
    "reference": "eager PyTorch callable computing what the kernel must compute (required)",
    "inputs": "{name: shape tuple or pytest_fusion.Tensor}: the tensor arguments, in call order",
    "dims": "{symbol: (low, high)}: inclusive ranges Hypothesis draws each shape symbol from",
    "dtypes": "test dtypes, a subset of float16, bfloat16, float32 (default: all three)",
    "constants": "{name: value}: non-tensor keyword arguments passed to kernel and reference",
    "tiles": "{symbol: (sizes...)} or (sizes...): tile sizes whose +-1 neighbours are edge dims",
    "atol": "explicit absolute tolerance against golden (replaces the error-budget policy)",
    "rtol": "explicit relative tolerance against golden (replaces the error-budget policy)",
    "error_multiple": "kernel error may be this multiple of eager's worst error (default 2)",
    "ulps": "plus this many ulps of the output dtype at golden's magnitude (default 4)",
    "special_values": "plant NaN, +-inf and -0.0 in inputs, in half the drawn cases (default True; False "
                      "opts out, e.g. for a kernel documented to require finite inputs)",
    "deterministic": "fail when two runs on the same inputs differ bitwise (default: warn)",
    "poison": "fill tensors the kernel allocates with NaN / 0x7F.. before it writes (default True)",
    "triton": "the kernel runs Triton code: skip bf16 under the interpreter (default True)",
    "device": "'cuda' or 'cpu' (default: cuda when visible, else cpu)",
    "max_examples": "Hypothesis examples for this test (default: --fusion-examples)",
    "bench": "{case: {symbol: size, 'dtypes': (...)}}: shapes timed by --fusion-bench",
    "flops": "callable(**dims) -> floating-point operations of one call (for TFLOP/s)",
    "bytes": "callable(**dims, itemsize) -> bytes one call must move (default: inputs + outputs)",
    "baselines": "{name: callable}: extra providers timed beside eager and compile",
    "min_speedup": "float (against eager) or {provider: float} (eager, compile or a baselines name): speedup floor whatever the baseline",
    "tolerance": "gate tolerance for this kernel, a fraction in [0, 1): 0.05 = 5% (default --fusion-tolerance)",
}

MARKER_SIGNATURE = (
    "fused_kernel(reference, *, inputs, dims, dtypes=('float16', 'bfloat16', 'float32'), "
    "constants=None, tiles=None, atol=None, rtol=None, error_multiple=2.0, ulps=4.0, "
    "special_values=True, deterministic=False, poison=True, triton=True, device=None, "
    "max_examples=None, bench=None, flops=None, bytes=None, baselines=None, "
    "min_speedup=None, tolerance=None)"
)


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """A validated ``fused_kernel`` declaration. Build it with :func:`make_spec`."""

    reference: Callable[..., Any]
    inputs: Mapping[str, Tensor]
    dims: Mapping[str, tuple[int, int]]
    dtypes: tuple[str, ...] = SUPPORTED_DTYPES
    constants: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    tiles: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    atol: float | None = None
    rtol: float | None = None
    error_multiple: float = DEFAULT_ERROR_MULTIPLE
    ulps: float = DEFAULT_ULPS
    special_values: bool = True
    deterministic: bool = False
    poison: bool = True
    triton: bool = True
    device: str | None = None
    max_examples: int | None = None
    bench: tuple[BenchCase, ...] = ()
    flops: Callable[..., float] | None = None
    bytes: Callable[..., float] | None = None
    baselines: Mapping[str, Callable[..., Any]] = dataclasses.field(default_factory=dict)
    min_speedup: Mapping[str, float] = dataclasses.field(default_factory=dict)
    tolerance: float | None = None

    def tiles_for(self, symbol: str) -> tuple[int, ...]:
        """Tile sizes whose neighbours are edge dims for ``symbol``."""
        return self.tiles.get(symbol, DEFAULT_TILES)


def _check_dim_range(symbol: str, rng: Any) -> tuple[int, int]:
    if (
        not isinstance(rng, (tuple, list))
        or len(rng) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in rng)
    ):
        raise FusionUsageError(f"dims[{symbol!r}] must be a (low, high) pair of ints, got {rng!r}")
    lo, hi = rng
    if lo < 1 or hi < lo:
        raise FusionUsageError(f"dims[{symbol!r}] = {rng!r}: need 1 <= low <= high")
    return int(lo), int(hi)


def _check_dtypes(where: str, dtypes: Any) -> tuple[str, ...]:
    if isinstance(dtypes, str):
        dtypes = (dtypes,)
    out = []
    for d in dtypes:
        name = str(d).replace("torch.", "")
        if name not in SUPPORTED_DTYPES:
            raise FusionUsageError(
                f"{where}: unsupported dtype {d!r}; choose from {', '.join(SUPPORTED_DTYPES)}"
            )
        out.append(name)
    if not out:
        raise FusionUsageError(f"{where}: no dtype given")
    return tuple(out)


def _did_you_mean(word: str, choices: Any) -> str:
    """`` (did you mean 'X'?)`` when one of ``choices`` equals ``word`` but for case, or is close to
    it (difflib's ratio >= 0.6, which one-letter symbols never reach), else ``""``."""
    choices = [str(c) for c in choices]
    close = [c for c in choices if c.lower() == word.lower()] or difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _positive(name: str, value: Any, allow_zero: bool = False) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
        raise FusionUsageError(f"{name} must be a number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise FusionUsageError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return float(value)


def _check_tolerance(value: Any) -> float:
    """The marker's gate tolerance, validated by the gate's own rule (``gate.check_tolerance``)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise FusionUsageError(f"tolerance must be a fraction such as 0.05 (= 5%), got {value!r}")
    # Imported here: gate pulls in numpy (through bench.stats), which the plugin's import path avoids.
    from pytest_fusion.gate import check_tolerance

    try:
        return check_tolerance(value)
    except ValueError as exc:
        raise FusionUsageError(f"{exc} (0.05 = 5%)") from None


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    """``fn``'s signature, or None where Python cannot tell (some builtins and C extensions)."""
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _check_work_fn(name: str, fn: Any, dims: Mapping[str, Any], extra: tuple[str, ...], bench: list[BenchCase]) -> None:
    """``flops``/``bytes`` must be callable with the dims (and ``extra``) as :func:`call_with_dims`
    passes them, and give a finite number >= 0 on every bench case."""
    if not callable(fn):
        raise FusionUsageError(f"{name} must be a callable of the dims, got {fn!r}")
    sig = _signature(fn)
    if sig is None:
        return
    known = [*dims, *extra]
    for param in sig.parameters.values():
        if param.kind is param.POSITIONAL_ONLY and param.default is param.empty:
            raise FusionUsageError(
                f"{name}: parameter {param.name!r} is positional-only; dims are passed by keyword ({', '.join(known)})")
        if (param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY) and param.default is param.empty
                and param.name not in known):
            raise FusionUsageError(
                f"{name} needs {param.name!r}, which is not a dims symbol{_did_you_mean(param.name, known)}; "
                f"it is called with {', '.join(known)}"
            )
    for case in bench:
        extra_values = {e: 2 for e in extra}  # itemsize: any positive int shows the callable works
        try:
            value = call_with_dims(fn, case.dims, **extra_values)
        except Exception as exc:  # the user's callable: report what it raised, naming the case
            raise FusionUsageError(f"{name} raised {type(exc).__name__}: {exc} on bench[{case.name!r}]") from None
        if not math.isfinite(value) or value < 0:
            raise FusionUsageError(f"{name} gave {value!r} on bench[{case.name!r}]: need a finite number >= 0")


def _check_baseline_fn(name: str, fn: Any, inputs: Mapping[str, Tensor], constants: Mapping[str, Any]) -> None:
    """A bench provider is called as the kernel is, ``fn(*inputs, **constants)``: check that binds."""
    if name in ("kernel", "eager", "compile") or not callable(fn):
        raise FusionUsageError(f"baselines[{name!r}] must be a callable under a name other than kernel/eager/compile")
    sig = _signature(fn)
    if sig is None:
        return
    try:
        sig.bind(*inputs, **constants)
    except TypeError as exc:
        call = ", ".join([*inputs, *(f"{k}=..." for k in constants)])
        raise FusionUsageError(
            f"baselines[{name!r}] cannot be called as the kernel is, {name}({call}): {exc}"
        ) from None


def make_spec(reference: Any = None, /, **kwargs: Any) -> KernelSpec:
    """Validate ``fused_kernel`` arguments and return a :class:`KernelSpec`.

    ``reference`` may be given positionally or by keyword. See :data:`MARKER_ARGS` for the
    arguments.

    Raises:
        FusionUsageError: an unknown argument, a shape symbol missing from ``dims`` or one no
            input uses, a malformed range, dtype, tolerance or bench case, a tolerance outside
            [0, 1), a ``min_speedup`` for a provider that is not timed, a ``flops``/``bytes``
            callable that needs a parameter other than the dims (or fails on a bench case), a
            baseline that cannot be called as the kernel is. The message names the argument.
    """
    if reference is None:
        reference = kwargs.pop("reference", None)
    elif "reference" in kwargs:
        raise FusionUsageError("reference given both positionally and by keyword")
    unknown = sorted(set(kwargs) - set(MARKER_ARGS))
    if unknown:
        hints = [f"{u} -> {m[0]}?" for u in unknown if (m := difflib.get_close_matches(u, MARKER_ARGS, n=1))]
        raise FusionUsageError(
            f"unknown fused_kernel argument(s) {', '.join(unknown)}"
            + (f" (did you mean: {', '.join(hints)})" if hints else "")
            + f"; accepted: {', '.join(MARKER_ARGS)}"
        )
    if reference is None or not callable(reference):
        raise FusionUsageError(f"reference must be a callable (the eager PyTorch code), got {reference!r}")

    raw_inputs = kwargs.get("inputs")
    if not isinstance(raw_inputs, Mapping) or not raw_inputs:
        raise FusionUsageError("inputs must be a non-empty {name: shape} mapping")
    raw_dims = kwargs.get("dims")
    if not isinstance(raw_dims, Mapping):
        raise FusionUsageError("dims must be a {symbol: (low, high)} mapping")
    dims = {str(s): _check_dim_range(str(s), r) for s, r in raw_dims.items()}

    inputs: dict[str, Tensor] = {}
    for name, decl in raw_inputs.items():
        t = decl if isinstance(decl, Tensor) else Tensor(tuple(decl)) if isinstance(decl, (tuple, list)) else None
        if t is None:
            raise FusionUsageError(f"inputs[{name!r}] must be a shape tuple or pytest_fusion.Tensor, got {decl!r}")
        for sym in t.shape:
            if isinstance(sym, str):
                if sym not in dims:
                    raise FusionUsageError(
                        f"inputs[{name!r}] uses shape symbol {sym!r}, which is missing from dims "
                        f"(declared: {', '.join(dims) or 'none'}){_did_you_mean(sym, dims)}"
                    )
            elif not isinstance(sym, int) or isinstance(sym, bool) or sym < 0:
                raise FusionUsageError(f"inputs[{name!r}] has a bad size {sym!r}: use a dims symbol or an int >= 0")
        if t.layouts is not None:
            bad = [l for l in t.layouts if l not in LAYOUTS]
            if bad:
                raise FusionUsageError(f"inputs[{name!r}]: unknown layout(s) {bad}; choose from {', '.join(LAYOUTS)}")
        inputs[str(name)] = t

    used = [s for t in inputs.values() for s in t.shape if isinstance(s, str)]
    unused = [s for s in dims if s not in used]
    if unused:
        # A symbol no input uses is never drawn into a tensor: a typo, or an input left out.
        sym = unused[0]
        raise FusionUsageError(
            f"dims declares {', '.join(repr(u) for u in unused)}, which no input uses "
            f"(inputs use: {', '.join(dict.fromkeys(used)) or 'no symbols'})"
            + _did_you_mean(sym, dict.fromkeys(used))
        )

    dtypes = _check_dtypes("dtypes", kwargs.get("dtypes", SUPPORTED_DTYPES))

    tiles_arg = kwargs.get("tiles")
    tiles: dict[str, tuple[int, ...]] = {}
    if tiles_arg is not None:
        items = tiles_arg.items() if isinstance(tiles_arg, Mapping) else ((s, tiles_arg) for s in dims)
        for sym, sizes in items:
            sizes = (sizes,) if isinstance(sizes, int) else tuple(sizes)
            if sym not in dims or not all(isinstance(v, int) and v >= 1 for v in sizes):
                raise FusionUsageError(f"tiles[{sym!r}] = {sizes!r}: need a dims symbol and ints >= 1")
            tiles[sym] = sizes

    atol, rtol = kwargs.get("atol"), kwargs.get("rtol")
    if (atol is None) != (rtol is None):
        raise FusionUsageError("give atol and rtol together (as torch.testing.assert_close does), or neither")
    if atol is not None:
        atol, rtol = _positive("atol", atol, True), _positive("rtol", rtol, True)

    bench_arg = kwargs.get("bench") or {}
    if not isinstance(bench_arg, Mapping):
        raise FusionUsageError("bench must be a {case name: {symbol: size}} mapping")
    bench = []
    for case_name, case_dims in bench_arg.items():
        if not isinstance(case_dims, Mapping):
            raise FusionUsageError(f"bench[{case_name!r}] must be a {{symbol: size}} mapping")
        case_dims = dict(case_dims)
        case_dtypes = dtypes
        if "dtypes" in case_dims or "dtype" in case_dims:
            case_dtypes = _check_dtypes(f"bench[{case_name!r}] dtypes", case_dims.pop("dtypes", None) or case_dims.pop("dtype"))
        missing = sorted(set(dims) - set(case_dims))
        extra = sorted(set(case_dims) - set(dims))
        if missing or extra:
            raise FusionUsageError(
                f"bench[{case_name!r}] must give every dims symbol once: "
                + (f"missing {missing} " if missing else "")
                + (f"unknown {extra}" if extra else "")
            )
        for sym, size in case_dims.items():
            if not isinstance(size, int) or size < 1:
                raise FusionUsageError(f"bench[{case_name!r}][{sym!r}] must be an int >= 1, got {size!r}")
        bench.append(BenchCase(str(case_name), dict(case_dims), case_dtypes))

    # The bench-only arguments below are otherwise first used under --fusion-bench, after the
    # correctness items passed: checked here so that a mistake is a collection error.
    constants = kwargs.get("constants") or {}
    if not isinstance(constants, Mapping):
        raise FusionUsageError(f"constants must be a {{name: value}} mapping, got {constants!r}")
    for fn_name, extra in (("flops", ()), ("bytes", ("itemsize",))):
        if kwargs.get(fn_name) is not None:
            _check_work_fn(fn_name, kwargs[fn_name], dims, extra, bench)

    baselines_arg = kwargs.get("baselines") or {}
    if not isinstance(baselines_arg, Mapping):
        raise FusionUsageError(f"baselines must be a {{name: callable}} mapping, got {baselines_arg!r}")
    baselines = {str(name): fn for name, fn in baselines_arg.items()}
    for name, fn in baselines.items():
        _check_baseline_fn(name, fn, inputs, constants)

    ms = kwargs.get("min_speedup")
    if ms is None:
        min_speedup: dict[str, float] = {}
    elif isinstance(ms, Mapping):
        min_speedup = {str(p): _positive(f"min_speedup[{p!r}]", v) for p, v in ms.items()}
    else:
        min_speedup = {"eager": _positive("min_speedup", ms)}
    providers = ["eager", "compile", *baselines]
    for p, floor in min_speedup.items():
        if p not in providers:
            # The runner notes a floor for an untimed provider and moves on: a typo would never be checked.
            raise FusionUsageError(
                f"min_speedup names provider {p!r}, which is not one{_did_you_mean(p, providers)}; "
                f"providers: {', '.join(providers)}"
            )
        if not math.isfinite(floor):
            raise FusionUsageError(f"min_speedup[{p!r}] must be finite, got {floor!r}")

    device = kwargs.get("device")
    if device is not None and str(device).split(":")[0] not in ("cuda", "cpu"):
        raise FusionUsageError(f"device must be 'cuda' or 'cpu', got {device!r}")
    max_examples = kwargs.get("max_examples")
    if max_examples is not None and (not isinstance(max_examples, int) or max_examples < 1):
        raise FusionUsageError(f"max_examples must be an int >= 1, got {max_examples!r}")
    tolerance = kwargs.get("tolerance")
    if tolerance is not None:
        tolerance = _check_tolerance(tolerance)

    return KernelSpec(
        reference=reference,
        inputs=inputs,
        dims=dims,
        dtypes=dtypes,
        constants=dict(constants),
        tiles=tiles,
        atol=atol,
        rtol=rtol,
        error_multiple=_positive("error_multiple", kwargs.get("error_multiple", DEFAULT_ERROR_MULTIPLE), True),
        ulps=_positive("ulps", kwargs.get("ulps", DEFAULT_ULPS), True),
        special_values=bool(kwargs.get("special_values", True)),
        deterministic=bool(kwargs.get("deterministic", False)),
        poison=bool(kwargs.get("poison", True)),
        triton=bool(kwargs.get("triton", True)),
        device=None if device is None else str(device),
        max_examples=max_examples,
        bench=tuple(bench),
        flops=kwargs.get("flops"),
        bytes=kwargs.get("bytes"),
        baselines=baselines,
        min_speedup=min_speedup,
        tolerance=tolerance,
    )


def call_with_dims(fn: Callable[..., float], dims: Mapping[str, int], **extra: Any) -> float:
    """Call ``fn`` with the dims (and ``extra``) it names in its signature; used for flops/bytes."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return float(fn(**dims, **extra))
    return float(fn(**{k: v for k, v in {**dims, **extra}.items() if k in params}))

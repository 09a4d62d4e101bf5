"""The ``fused_kernel`` marker's arguments: one signature (:func:`fused_kernel`) and one
validator per argument, giving a :class:`~pytest_fusion.spec.KernelSpec`.

``inspect.signature(fused_kernel)`` is the marker's help text, and binding the marker's arguments
to it is what reports an unknown or missing one. Each validator checks type and range and names
the argument in its :class:`~pytest_fusion.spec.FusionUsageError`. Plain Python, no torch import.
"""

from __future__ import annotations

import difflib
import inspect
import math
import re
from typing import Any, Callable, Mapping, Sequence

from pytest_fusion.spec import (
    DEFAULT_ERROR_MULTIPLE,
    DEFAULT_ULPS,
    ITEMSIZE,
    LAYOUTS,
    SUPPORTED_DTYPES,
    BenchCase,
    FusionUsageError,
    KernelSpec,
    Tensor,
    call_with_dims,
    check_tolerance,
)

MAX_BENCH_DIM = 2**31 - 1
"""Largest bench size: Triton's program ids and default index arithmetic are 32-bit ints."""

DEVICE_PATTERN = re.compile(r"cpu|cuda(:\d+)?")

RENAMED = {"baselines": "providers"}
"""Former argument names, hinted at when used."""


def fused_kernel(
    reference: Callable[..., Any],
    *,
    inputs: Mapping[str, Any],
    dims: Mapping[str, tuple[int, int]],
    dtypes: Sequence[str] = SUPPORTED_DTYPES,
    constants: Mapping[str, Any] | None = None,
    tiles: Mapping[str, Sequence[int]] | Sequence[int] | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    error_multiple: float = DEFAULT_ERROR_MULTIPLE,
    ulps: float = DEFAULT_ULPS,
    special_values: bool = False,
    deterministic: bool = False,
    poison: bool = True,
    triton: bool = True,
    device: str | None = None,
    max_examples: int | None = None,
    bench: Mapping[str, Mapping[str, Any]] | None = None,
    flops: Callable[..., float] | None = None,
    bytes: Callable[..., float] | None = None,
    providers: Mapping[str, Callable[..., Any]] | None = None,
    min_speedup: float | Mapping[str, float] | None = None,
    tolerance: float | None = None,
) -> KernelSpec:
    """``@pytest.mark.fused_kernel(...)``: validate the arguments into a KernelSpec.

    Args:
        reference: eager PyTorch callable computing what the kernel must compute.
        inputs: ``{name: shape tuple or pytest_fusion.Tensor}``: the tensor arguments, in call order.
        dims: ``{symbol: (low, high)}``: inclusive ranges Hypothesis draws each shape symbol from.
        dtypes: test dtypes, a subset of float16, bfloat16, float32.
        constants: ``{name: value}``: non-tensor keyword arguments passed to kernel and reference.
        tiles: ``{symbol: (sizes...)}`` or ``(sizes...)``: tile sizes whose +-1 neighbours are edge dims.
        atol, rtol: explicit tolerances against golden, given together (replace the error budget).
        error_multiple: kernel error may be this multiple of eager's worst error against golden.
        ulps: plus this many ulps of the output dtype at golden's magnitude.
        special_values: plant NaN, +-inf and -0.0 in inputs (a bool).
        deterministic: fail when two runs on the same inputs differ bitwise (False: warn).
        poison: fill tensors the kernel allocates with NaN / 0x7F.. before it writes.
        triton: the kernel runs Triton code: bf16 is skipped under the interpreter.
        device: ``"cuda"``, ``"cuda:N"`` or ``"cpu"`` (None: cuda when visible, else cpu).
        max_examples: Hypothesis examples for this test (None: --fusion-examples).
        bench: ``{case: {symbol: size, "dtypes": (...)}}``: shapes timed by --fusion-bench.
        flops: ``callable(**dims)`` -> floating-point operations of one call (for TFLOP/s).
        bytes: ``callable(**dims, itemsize)`` -> bytes one call must move (None: inputs + outputs).
        providers: ``{name: callable}``: extra providers timed beside eager and compile.
        min_speedup: float (against eager) or ``{provider: float}``: a floor whatever the baseline.
        tolerance: gate tolerance for this kernel, a fraction in [0, 1) (None: --fusion-tolerance).

    Raises:
        FusionUsageError: the first bad argument, named.
    """
    args = dict(locals())
    done: dict[str, Any] = {}
    for name in ORDER:
        done[name] = VALIDATORS[name](args[name], done)
    if (done["atol"] is None) != (done["rtol"] is None):
        raise FusionUsageError("give atol and rtol together (as torch.testing.assert_close does), or neither")
    return KernelSpec(**done)


def signature_text() -> str:
    """``fused_kernel(reference, *, inputs, dims, dtypes=(...), ...)``: the signature without types."""
    sig = inspect.signature(fused_kernel)
    params = [p.replace(annotation=p.empty) for p in sig.parameters.values()]
    return "fused_kernel" + str(sig.replace(parameters=params, return_annotation=sig.empty))


def make_spec(*args: Any, **kwargs: Any) -> KernelSpec:
    """Bind ``args``/``kwargs`` to :func:`fused_kernel` and validate them.

    Raises:
        FusionUsageError: an unknown argument (with the closest known name), a missing one, or
            any argument :func:`fused_kernel` rejects.
    """
    sig = inspect.signature(fused_kernel)
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as exc:
        problem = f"{exc}; the marker's signature is {signature_text()}"
        known = list(sig.parameters)
        unknown = [k for k in kwargs if k not in known]
        if unknown:
            hints = [
                f"{u} -> {RENAMED.get(u) or m[0]}?"
                for u in unknown
                if u in RENAMED or (m := difflib.get_close_matches(u, known, n=1))
            ]
            problem = (
                f"unknown fused_kernel argument(s) {', '.join(unknown)}"
                + (f" (did you mean: {', '.join(hints)})" if hints else "")
                + f"; accepted: {', '.join(known)}"
            )
        raise FusionUsageError(problem) from None
    return fused_kernel(*bound.args, **bound.kwargs)


# ---- validators: (value, the arguments validated so far) -> the KernelSpec field ---------------


def did_you_mean(word: str, choices: Any) -> str:
    """`` (did you mean 'X'?)`` when one of ``choices`` equals ``word`` but for case, or is close to
    it (difflib's ratio >= 0.6, which one-letter symbols never reach), else ``""``."""
    choices = [str(c) for c in choices]
    close = [c for c in choices if c.lower() == word.lower()] or difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def number(name: str, value: Any, allow_zero: bool = True) -> float:
    """A finite real number > 0 (or >= 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise FusionUsageError(f"{name} must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise FusionUsageError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return float(value)


def optional_number(name: str) -> Callable[[Any, dict[str, Any]], float | None]:
    return lambda value, done: None if value is None else number(name, value)


def flag(name: str) -> Callable[[Any, dict[str, Any]], bool]:
    """A bool: a string such as ``"no"`` or ``"False"`` would read as True."""

    def check(value: Any, done: dict[str, Any]) -> bool:
        if not isinstance(value, bool):
            raise FusionUsageError(f"{name} must be True or False, got {value!r}")
        return value

    return check


def mapping(name: str, value: Any, what: str, empty: bool = True) -> Mapping[Any, Any]:
    value = {} if value is None and empty else value
    if not isinstance(value, Mapping) or (not empty and not value):
        raise FusionUsageError(
            f"{name} must be a {'non-empty ' if not empty else ''}{what} mapping, got {value!r}"
        )
    return value


def check_reference(value: Any, done: dict[str, Any]) -> Callable[..., Any]:
    if not callable(value):
        raise FusionUsageError(f"reference must be a callable (the eager PyTorch code), got {value!r}")
    return value


def check_dims(value: Any, done: dict[str, Any]) -> dict[str, tuple[int, int]]:
    out = {}
    for symbol, rng in mapping("dims", value, "{symbol: (low, high)}").items():
        if not isinstance(rng, (tuple, list)) or len(rng) != 2 or not all(is_int(v) for v in rng):
            raise FusionUsageError(f"dims[{symbol!r}] must be a (low, high) pair of ints, got {rng!r}")
        if rng[0] < 1 or rng[1] < rng[0]:
            raise FusionUsageError(f"dims[{symbol!r}] = {rng!r}: need 1 <= low <= high")
        out[str(symbol)] = (int(rng[0]), int(rng[1]))
    return out


def check_input(name: str, decl: Any, dims: Mapping[str, Any]) -> Tensor:
    t = decl if isinstance(decl, Tensor) else Tensor(tuple(decl)) if isinstance(decl, (tuple, list)) else None
    if t is None:
        raise FusionUsageError(
            f"inputs[{name!r}] must be a shape tuple or pytest_fusion.Tensor, got {decl!r}"
        )
    for sym in t.shape:
        if isinstance(sym, str) and sym not in dims:
            raise FusionUsageError(
                f"inputs[{name!r}] uses shape symbol {sym!r}, which is missing from dims "
                f"(declared: {', '.join(dims) or 'none'}){did_you_mean(sym, dims)}"
            )
        if not isinstance(sym, str) and (not is_int(sym) or sym < 0):
            raise FusionUsageError(
                f"inputs[{name!r}] has a bad size {sym!r}: use a dims symbol or an int >= 0"
            )
    bad = [layout for layout in t.layouts or () if layout not in LAYOUTS]
    if bad:
        raise FusionUsageError(f"inputs[{name!r}]: unknown layout(s) {bad}; choose from {', '.join(LAYOUTS)}")
    return t


def check_inputs(value: Any, done: dict[str, Any]) -> dict[str, Tensor]:
    dims = done["dims"]
    inputs = {
        str(n): check_input(str(n), d, dims)
        for n, d in mapping("inputs", value, "{name: shape}", False).items()
    }
    used = [s for t in inputs.values() for s in t.shape if isinstance(s, str)]
    unused = [s for s in dims if s not in used]
    if unused:  # never drawn into a tensor: a typo, or an input left out
        raise FusionUsageError(
            f"dims declares {', '.join(repr(u) for u in unused)}, which no input uses "
            f"(inputs use: {', '.join(dict.fromkeys(used)) or 'no symbols'})"
            + did_you_mean(unused[0], dict.fromkeys(used))
        )
    return inputs


def dtype_names(where: str, value: Any) -> tuple[str, ...]:
    values = (value,) if isinstance(value, str) or not isinstance(value, (tuple, list, set)) else value
    out = []
    for d in values:
        name = str(d).replace("torch.", "")
        if name not in SUPPORTED_DTYPES:
            raise FusionUsageError(
                f"{where}: unsupported dtype {d!r}; choose from {', '.join(SUPPORTED_DTYPES)}"
            )
        out.append(name)
    if not out:
        raise FusionUsageError(f"{where}: no dtype given")
    return tuple(out)


def check_tiles(value: Any, done: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    if value is None:
        return {}
    items = value.items() if isinstance(value, Mapping) else ((s, value) for s in done["dims"])
    tiles = {}
    for sym, sizes in items:
        sizes = (sizes,) if is_int(sizes) else tuple(sizes)
        if sym not in done["dims"] or not all(is_int(v) and v >= 1 for v in sizes):
            raise FusionUsageError(f"tiles[{sym!r}] = {sizes!r}: need a dims symbol and ints >= 1")
        tiles[sym] = sizes
    return tiles


def check_device(value: Any, done: dict[str, Any]) -> str | None:
    if value is not None and not (isinstance(value, str) and DEVICE_PATTERN.fullmatch(value)):
        raise FusionUsageError(f"device must be 'cuda', 'cuda:N' or 'cpu', got {value!r}")
    return value


def check_max_examples(value: Any, done: dict[str, Any]) -> int | None:
    if value is not None and (not is_int(value) or value < 1):
        raise FusionUsageError(f"max_examples must be an int >= 1, got {value!r}")
    return value


def check_bench_case(name: str, value: Any, done: dict[str, Any]) -> BenchCase:
    case_dims = dict(mapping(f"bench[{name!r}]", value, "{symbol: size}", False))
    dtypes = done["dtypes"]
    if "dtypes" in case_dims or "dtype" in case_dims:
        dtypes = dtype_names(
            f"bench[{name!r}] dtypes", case_dims.pop("dtypes", None) or case_dims.pop("dtype")
        )
    missing, extra = sorted(set(done["dims"]) - set(case_dims)), sorted(set(case_dims) - set(done["dims"]))
    if missing or extra:
        raise FusionUsageError(
            f"bench[{name!r}] must give every dims symbol once: "
            + (f"missing {missing} " if missing else "")
            + (f"unknown {extra}" if extra else "")
        )
    for sym, size in case_dims.items():
        if not is_int(size) or size < 1:
            raise FusionUsageError(f"bench[{name!r}][{sym!r}] must be an int >= 1, got {size!r}")
        if size > MAX_BENCH_DIM:
            raise FusionUsageError(
                f"bench[{name!r}][{sym!r}] = {size} exceeds {MAX_BENCH_DIM} (32-bit indexing)"
            )
    return BenchCase(str(name), case_dims, dtypes)


def check_bench(value: Any, done: dict[str, Any]) -> tuple[BenchCase, ...]:
    bench = mapping("bench", value, "{case name: {symbol: size}}")
    return tuple(check_bench_case(str(n), v, done) for n, v in bench.items())


def work_function(name: str, fn: Any, dims: Mapping[str, Any], extra: tuple[str, ...]) -> None:
    """``flops``/``bytes`` must be callable with the dims (and ``extra``) as
    :func:`~pytest_fusion.spec.call_with_dims` passes them."""
    if not callable(fn):
        raise FusionUsageError(f"{name} must be a callable of the dims, got {fn!r}")
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # some builtins and C extensions: Python cannot tell
        return
    known = [*dims, *extra]
    for p in params:
        if p.kind is p.POSITIONAL_ONLY and p.default is p.empty:
            raise FusionUsageError(
                f"{name}: parameter {p.name!r} is positional-only; dims are passed by keyword "
                f"({', '.join(known)})"
            )
        if (
            p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and p.default is p.empty
            and p.name not in known
        ):
            raise FusionUsageError(
                f"{name} needs {p.name!r}, which is not a dims symbol"
                f"{did_you_mean(p.name, known)}; it is called with {', '.join(known)}"
            )


def work_value(name: str, fn: Callable[..., float], case: BenchCase, **extra: Any) -> float:
    """``fn`` on one bench case: a finite number >= 0, else an error naming the case."""
    try:
        value = call_with_dims(fn, case.dims, **extra)
    except Exception as exc:  # the user's callable: report what it raised, naming the case
        raise FusionUsageError(f"{name} raised {type(exc).__name__}: {exc} on bench[{case.name!r}]") from None
    if not math.isfinite(value) or value < 0:
        raise FusionUsageError(f"{name} gave {value!r} on bench[{case.name!r}]: need a finite number >= 0")
    return value


def check_flops(value: Any, done: dict[str, Any]) -> Callable[..., float] | None:
    """Checked and evaluated once per bench case here (stored in ``BenchCase.flops``): a mistake is
    a collection error, not a failure after the correctness items passed."""
    if value is not None:
        work_function("flops", value, done["dims"], ())
        done["bench"] = tuple(
            BenchCase(c.name, c.dims, c.dtypes, work_value("flops", value, c), c.bytes) for c in done["bench"]
        )
    return value


def check_bytes(value: Any, done: dict[str, Any]) -> Callable[..., float] | None:
    """As :func:`check_flops`, per dtype of each case (``BenchCase.bytes``)."""
    if value is not None:
        work_function("bytes", value, done["dims"], ("itemsize",))
        done["bench"] = tuple(
            BenchCase(
                c.name,
                c.dims,
                c.dtypes,
                c.flops,
                {d: work_value("bytes", value, c, itemsize=ITEMSIZE[d]) for d in c.dtypes},
            )
            for c in done["bench"]
        )
    return value


def check_constants(value: Any, done: dict[str, Any]) -> dict[str, Any]:
    return dict(mapping("constants", value, "{name: value}"))


def check_providers(value: Any, done: dict[str, Any]) -> dict[str, Callable[..., Any]]:
    """An extra provider is called as the kernel is, ``fn(*inputs, **constants)``: check that binds."""
    providers = {str(n): fn for n, fn in mapping("providers", value, "{name: callable}").items()}
    for name, fn in providers.items():
        if name in ("kernel", "eager", "compile") or not callable(fn):
            raise FusionUsageError(
                f"providers[{name!r}] must be a callable under a name other than kernel/eager/compile"
            )
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            continue
        try:
            sig.bind(*done["inputs"], **done["constants"])
        except TypeError as exc:
            call = ", ".join([*done["inputs"], *(f"{k}=..." for k in done["constants"])])
            raise FusionUsageError(
                f"providers[{name!r}] cannot be called as the kernel is, {name}({call}): {exc}"
            ) from None
    return providers


def check_min_speedup(value: Any, done: dict[str, Any]) -> dict[str, float]:
    if value is None:
        return {}
    floors = (
        {str(p): number(f"min_speedup[{p!r}]", v, False) for p, v in value.items()}
        if isinstance(value, Mapping)
        else {"eager": number("min_speedup", value, False)}
    )
    timed = ["eager", "compile", *done["providers"]]
    for p in floors:
        if p not in timed:  # a floor for an untimed provider would never be checked
            raise FusionUsageError(
                f"min_speedup names provider {p!r}, which is not one{did_you_mean(p, timed)}; "
                f"providers: {', '.join(timed)}"
            )
    return floors


VALIDATORS: dict[str, Callable[[Any, dict[str, Any]], Any]] = {
    "reference": check_reference,
    "dims": check_dims,
    "inputs": check_inputs,
    "dtypes": lambda value, done: dtype_names("dtypes", value),
    "constants": check_constants,
    "tiles": check_tiles,
    "atol": optional_number("atol"),
    "rtol": optional_number("rtol"),
    "error_multiple": lambda value, done: number("error_multiple", value),
    "ulps": lambda value, done: number("ulps", value),
    "special_values": flag("special_values"),
    "deterministic": flag("deterministic"),
    "poison": flag("poison"),
    "triton": flag("triton"),
    "device": check_device,
    "max_examples": check_max_examples,
    "bench": check_bench,
    "flops": check_flops,
    "bytes": check_bytes,
    "providers": check_providers,
    "min_speedup": check_min_speedup,
    "tolerance": lambda value, done: None if value is None else check_tolerance(value),
}
"""One validator per argument, run in this order (each may read the ones before it)."""

ORDER = tuple(VALIDATORS)

"""Argument validators shared by the marker (:mod:`pytest_fusion.declare.marker`) and the ``fusion``
fixture: numbers, flags, mappings, dtypes, bench cases and their ``flops``/``bytes`` work. Each
raises :class:`~pytest_fusion.declare.spec.FusionUsageError` naming the argument. Plain Python."""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

from pytest_fusion.declare.sizes import size as size_at
from pytest_fusion.declare.spec import ITEMSIZE, SUPPORTED_DTYPES, BenchCase, FusionUsageError, call_with_dims

MAX_BENCH_DIM = 2**31 - 1
"""Largest bench size: Triton's program ids and default index arithmetic are 32-bit ints."""


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
        multiple = done.get("multiple_of", {}).get(sym, 1)
        if size % multiple:
            raise FusionUsageError(
                f"bench[{name!r}][{sym!r}] = {size} is not a multiple of {multiple} (multiple_of)"
            )
    for inp, t in done["inputs"].items():  # a derived size must be >= 0 at the case's dims
        for entry in t.shape:
            size_at(entry, case_dims, f"bench[{name!r}], inputs[{inp!r}]")
    return BenchCase(str(name), case_dims, dtypes)


def check_bench(value: Any, done: dict[str, Any]) -> tuple[BenchCase, ...]:
    bench = mapping("bench", value, "{case name: {symbol: size}}")
    return tuple(check_bench_case(str(n), v, done) for n, v in bench.items())


def work_function(name: str, fn: Any, dims: Mapping[str, Any], extra: tuple[str, ...]) -> None:
    """``flops``/``bytes`` must be callable with the dims (and ``extra``) as
    :func:`~pytest_fusion.declare.spec.call_with_dims` passes them."""
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

"""The ``fused_kernel`` marker's declared inputs: the ``dims`` ranges, each input's shape, layouts,
own dtype and value bounds, the inputs an in-place kernel may write (``mutates``) and the tile
sizes of the edge cases. One validator per argument, as :mod:`pytest_fusion.declare.marker` calls them:
``(value, the arguments validated so far) -> the KernelSpec field``; each raises
:class:`~pytest_fusion.declare.spec.FusionUsageError` naming the argument. Plain Python, no torch import.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from pytest_fusion.declare import sizes
from pytest_fusion.declare.arguments import did_you_mean, is_int, mapping
from pytest_fusion.declare.spec import INPUT_DTYPES, INTEGER_RANGES, LAYOUTS, FusionUsageError, Tensor


def check_dims(value: Any, done: dict[str, Any]) -> dict[str, tuple[int, int]]:
    out = {}
    for symbol, rng in mapping("dims", value, "{symbol: (low, high)}").items():
        if not isinstance(rng, (tuple, list)) or len(rng) != 2 or not all(is_int(v) for v in rng):
            raise FusionUsageError(f"dims[{symbol!r}] must be a (low, high) pair of ints, got {rng!r}")
        if rng[0] < 1 or rng[1] < rng[0]:
            raise FusionUsageError(f"dims[{symbol!r}] = {rng!r}: need 1 <= low <= high")
        out[str(symbol)] = (int(rng[0]), int(rng[1]))
    return out


def validate_input(name: str, decl: Any, dims: Mapping[str, Any]) -> Tensor:
    """Input ``name``'s declaration (a shape tuple or a :class:`Tensor`) as a :class:`Tensor`;
    FusionUsageError naming the input for a symbol missing from ``dims``, a bad size or layout, or a
    bad dtype or bounds (:func:`check_input_dtype`)."""
    t = decl if isinstance(decl, Tensor) else Tensor(tuple(decl)) if isinstance(decl, (tuple, list)) else None
    if t is None:
        raise FusionUsageError(
            f"inputs[{name!r}] must be a shape tuple or pytest_fusion.Tensor, got {decl!r}"
        )
    where = f"inputs[{name!r}]"
    for entry in t.shape:
        if isinstance(entry, str):
            named = (entry,) if sizes.is_symbol(entry) else sizes.parse(entry, where)
            for sym in named:
                if sym not in dims:
                    used = "shape symbol" if named == (entry,) else f"in size {entry!r} the symbol"
                    raise FusionUsageError(
                        f"{where} uses {used} {sym!r}, which is missing from dims "
                        f"(declared: {', '.join(dims) or 'none'}){did_you_mean(sym, dims)}"
                    )
        elif not is_int(entry) or entry < 0:
            raise FusionUsageError(
                f"{where} has a bad size {entry!r}: use a dims symbol, an int >= 0 or a size derived "
                "from the dims such as 'cdiv(K, 32)'"
            )
    for end in (0, 1):  # a derived size must be >= 0 at both ends of the declared ranges
        at = {s: rng[end] for s, rng in dims.items()}
        for entry in t.shape:
            sizes.size(entry, at, where)
    bad = [layout for layout in t.layouts or () if layout not in LAYOUTS]
    if bad:
        raise FusionUsageError(f"inputs[{name!r}]: unknown layout(s) {bad}; choose from {', '.join(LAYOUTS)}")
    return check_input_dtype(name, t)


def check_input_dtype(name: str, t: Tensor) -> Tensor:
    """``t`` with its own dtype spelt as torch names it (``torch.int8`` -> ``"int8"``) and its
    ``bounds`` checked; FusionUsageError naming the input otherwise."""
    dtype = None if t.dtype is None else str(t.dtype).replace("torch.", "")
    if dtype is not None and dtype not in INPUT_DTYPES:
        raise FusionUsageError(
            f"inputs[{name!r}] declares dtype {t.dtype!r}, which is not a tensor dtype an input may "
            f"have{did_you_mean(dtype, INPUT_DTYPES)}; choose from {', '.join(INPUT_DTYPES)} "
            "(None: the test dtype)"
        )
    if t.bounds is not None:
        check_bounds(name, t.bounds, dtype)
    return dataclasses.replace(t, dtype=dtype)


def check_bounds(name: str, bounds: Any, dtype: str | None) -> None:
    """Nothing; FusionUsageError unless ``bounds`` is a (low, high) pair, low <= high, of ints
    inside the dtype's range for an integer input, of finite numbers otherwise."""
    ints = dtype in INTEGER_RANGES

    def fits(v: Any) -> bool:
        if ints:
            return is_int(v)
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    pair = isinstance(bounds, tuple) and len(bounds) == 2 and all(map(fits, bounds))
    if not pair or bounds[0] > bounds[1]:
        kind = "ints" if ints else "finite numbers"
        raise FusionUsageError(
            f"inputs[{name!r}]: bounds must be a (low, high) pair of {kind}, low <= high, got {bounds!r}"
        )
    if dtype in INTEGER_RANGES:
        low, high = INTEGER_RANGES[dtype]
        if not low <= bounds[0] <= bounds[1] <= high:
            raise FusionUsageError(
                f"inputs[{name!r}]: bounds {bounds!r} exceed what {dtype} holds {(low, high)}"
            )


def validate_inputs(value: Any, done: dict[str, Any]) -> dict[str, Tensor]:
    """The marker's ``inputs`` as ``{name: Tensor}`` in call order (:func:`validate_input` each);
    FusionUsageError also when a symbol of ``dims`` is used by no input."""
    dims = done["dims"]
    inputs = {
        str(n): validate_input(str(n), d, dims)
        for n, d in mapping("inputs", value, "{name: shape}", False).items()
    }
    used = [s for t in inputs.values() for entry in t.shape for s in sizes.symbols(entry)]
    unused = [s for s in dims if s not in used]
    if unused:  # never drawn into a tensor: a typo, or an input left out
        raise FusionUsageError(
            f"dims declares {', '.join(repr(u) for u in unused)}, which no input uses "
            f"(inputs use: {', '.join(dict.fromkeys(used)) or 'no symbols'})"
            + did_you_mean(unused[0], dict.fromkeys(used))
        )
    return inputs


def check_mutates(value: Any, done: dict[str, Any]) -> tuple[str, ...]:
    """Names of inputs the kernel may write into: each one of ``inputs``, once."""
    names = (value,) if isinstance(value, str) else value
    if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) for n in names):
        raise FusionUsageError(f"mutates must be a tuple of input names, got {value!r}")
    inputs = done["inputs"]
    for n in names:
        if n not in inputs:
            raise FusionUsageError(
                f"mutates names {n!r}, which is not one of the inputs{did_you_mean(n, inputs)}; "
                f"inputs: {', '.join(inputs)}"
            )
    if len(set(names)) != len(names):
        raise FusionUsageError(f"mutates names an input twice: {tuple(names)!r}")
    return tuple(names)


def check_tiles(value: Any, done: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    if value is None:
        return {}
    items = value.items() if isinstance(value, Mapping) else ((s, value) for s in done["dims"])
    tiles = {}
    for sym, given in items:
        given = (given,) if is_int(given) else tuple(given)
        if sym not in done["dims"] or not all(is_int(v) and v >= 1 for v in given):
            raise FusionUsageError(f"tiles[{sym!r}] = {given!r}: need a dims symbol and ints >= 1")
        tiles[sym] = given
    return tiles


def check_multiple_of(value: Any, done: dict[str, Any]) -> dict[str, int]:
    """``{symbol: m}``: every drawn size of ``symbol`` is a multiple of ``m`` (a kernel that needs
    K % 16 == 0); FusionUsageError unless each symbol is one of ``dims``, ``m`` an int >= 1, and a
    multiple of ``m`` lies in the symbol's declared range."""
    dims = done["dims"]
    out = {}
    for sym, m in mapping("multiple_of", value, "{symbol: int}").items():
        if sym not in dims:
            raise FusionUsageError(
                f"multiple_of names {sym!r}, which is not one of dims{did_you_mean(str(sym), dims)}; "
                f"dims: {', '.join(dims)}"
            )
        if not is_int(m) or m < 1:
            raise FusionUsageError(f"multiple_of[{sym!r}] must be an int >= 1, got {m!r}")
        low, high = dims[sym]
        if -(-low // m) * m > high:
            raise FusionUsageError(
                f"multiple_of[{sym!r}] = {m}: no multiple of {m} lies in dims[{sym!r}] = {(low, high)}"
            )
        out[str(sym)] = int(m)
    return out

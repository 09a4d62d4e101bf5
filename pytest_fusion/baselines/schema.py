"""The baseline file's format: its schema, the checks a loaded file must pass, and its text
both ways (parse with duplicate keys refused, canonical dump). The format itself is documented in
:mod:`pytest_fusion.baselines.store`; this module does no file I/O.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

from pytest_fusion.declare.spec import FusionUsageError

SCHEMA_VERSION = 2
READABLE_SCHEMAS = (1, 2)
"""Schemas :func:`pytest_fusion.baselines.store.load` reads; schema 1 is upgraded in memory
(:func:`migrate`)."""


def bad(path: Path, problem: str) -> FusionUsageError:
    """The error for a baseline file at ``path`` that cannot be used, naming the problem."""
    return FusionUsageError(f"baseline file {path}: {problem} (fix or delete it; it was not changed)")


def _positive_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _non_negative(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _size(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _scalar(x: Any) -> bool:
    return x is None or isinstance(x, (str, int, float))


def _check_provider(path: Path, where: str, p: str, v: Any) -> None:
    """One stored provider ``{ms, speedup, low, high}``: positive numbers, ``low <= high``."""
    if not isinstance(v, dict) or not (_positive_number(v.get("ms")) and _positive_number(v.get("speedup"))):
        raise bad(path, f"{where}.providers[{p!r}] needs positive numbers 'ms' and 'speedup', got {v!r}")
    for bound in ("low", "high"):  # the saved interval; null when it was not known
        if v.get(bound) is not None and not _positive_number(v[bound]):
            raise bad(
                path,
                f"{where}.providers[{p!r}].{bound} must be a positive number or null, got {v[bound]!r}",
            )
    if v.get("low") is not None and v.get("high") is not None and v["low"] > v["high"]:
        raise bad(path, f"{where}.providers[{p!r}] has low {v['low']!r} > high {v['high']!r}")


def _validate_entry(path: Path, where: str, entry: Any) -> None:
    """Every field :func:`pytest_fusion.baselines.store.stored_case` and the gate read, with the type
    they need (extra keys are left alone, so a newer pytest-fusion's additions do not break an
    older reader)."""
    if not isinstance(entry, dict):
        raise bad(path, f"{where} must be an object, got {type(entry).__name__}")
    if not _positive_number(entry.get("kernel_ms")):
        raise bad(path, f"{where}.kernel_ms must be a positive number, got {entry.get('kernel_ms')!r}")
    dims = entry.get("dims")
    if dims is not None and not (isinstance(dims, dict) and all(_size(v) for v in dims.values())):
        raise bad(path, f"{where}.dims must be an object of sizes {{symbol: int >= 0}}, got {dims!r}")
    env = entry.get("env")
    if env is not None and not (isinstance(env, dict) and all(_scalar(v) for v in env.values())):
        raise bad(path, f"{where}.env must be an object of strings, numbers or null, got {env!r}")
    provs = entry.get("providers")
    if not isinstance(provs, dict):
        raise bad(path, f"{where}.providers must be an object {{provider: {{ms, speedup, low, high}}}}")
    for p, v in provs.items():
        _check_provider(path, where, p, v)
    _check_accuracy(path, where, entry.get("accuracy"))
    _check_cold_start(path, where, entry.get("cold_start"))


def _check_cold_start(path: Path, where: str, cold: Any) -> None:
    """The optional ``cold_start`` figures (:mod:`pytest_fusion.gate.cold_start`): absent or null in
    entries saved without ``--fusion-cold-start`` (no schema change, as for ``accuracy``), else
    ``{provider: {"cold_s": number >= 0, "warm_s": number >= 0}}``."""
    if cold is None:
        return
    ok = isinstance(cold, dict) and all(
        isinstance(v, dict) and _non_negative(v.get("cold_s")) and _non_negative(v.get("warm_s"))
        for v in cold.values()
    )
    if not ok:
        raise bad(path, f"{where}.cold_start must be {{provider: {{'cold_s': number >= 0, "
                        f"'warm_s': number >= 0}}}}, got {cold!r}")


def _check_accuracy(path: Path, where: str, acc: Any) -> None:
    """The optional ``accuracy`` figure (:mod:`pytest_fusion.gate.drift`): absent or null in entries
    saved before it was recorded (no schema change: older readers leave the extra key alone),
    else ``{"budget_used": number >= 0, "ulps": number >= 0 or null}``."""
    if acc is None:
        return
    ok = isinstance(acc, dict) and _non_negative(acc.get("budget_used"))
    if not (ok and (acc.get("ulps") is None or _non_negative(acc["ulps"]))):
        raise bad(
            path,
            f"{where}.accuracy must be {{'budget_used': number >= 0, 'ulps': number >= 0 or null}}, "
            f"got {acc!r}",
        )


def validate(path: Path, data: Any) -> dict[str, Any]:
    """``data`` parsed from the file at ``path``, checked against the schema and migrated to the
    current one (:func:`migrate`); raises FusionUsageError naming the file and the problem."""
    if not isinstance(data, dict):
        raise bad(path, f"top level must be an object, got {type(data).__name__}")
    if data.get("schema") not in READABLE_SCHEMAS:
        raise bad(
            path,
            f"schema is {data.get('schema')!r}, this pytest-fusion reads schema "
            f"{' and '.join(map(str, READABLE_SCHEMAS))}",
        )
    cases = data.get("cases")
    if not isinstance(cases, dict):
        raise bad(path, "'cases' must be an object {kernel: {case: {dtype: entry}}}")
    for kernel, by_case in cases.items():
        if not isinstance(by_case, dict):
            raise bad(path, f"cases[{kernel!r}] must be an object")
        for case, by_dtype in by_case.items():
            if not isinstance(by_dtype, dict):
                raise bad(path, f"cases[{kernel!r}][{case!r}] must be an object")
            for dtype, entry in by_dtype.items():
                _validate_entry(path, f"cases[{kernel!r}][{case!r}][{dtype!r}]", entry)
    # The file name picks the device; a "device" naming another one means the file was copied or
    # renamed, and gating (or saving into) it would mix two devices' timings.
    if data.get("device") != path.stem:
        raise bad(
            path,
            f"'device' is {data.get('device')!r} but this file holds baselines for {path.stem!r} "
            f"(a file copied from another device? a file renamed to this device's name on purpose "
            f"needs its 'device' set to {path.stem!r})",
        )
    return migrate(data)


def migrate(data: dict[str, Any]) -> dict[str, Any]:
    """A validated file's data in the current schema (schema 1 -> 2: the keys stay, see
    :mod:`pytest_fusion.baselines.store`; only ``schema`` changes). Returns ``data`` itself, updated."""
    data["schema"] = SCHEMA_VERSION
    return data


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json`` object hook: the plain decoder keeps the last of two equal keys, which would drop
    a stored entry without a word (two merged branches each adding one)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def parse(path: Path, text: str) -> Any:
    """The JSON value of ``text`` (the file at ``path``), not yet validated.

    Raises:
        FusionUsageError: not JSON, a key twice in one object, or nested too deeply.
    """
    problem: str
    try:
        return json.loads(text, object_pairs_hook=_reject_duplicates)
    except json.JSONDecodeError as exc:
        problem = f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    except _DuplicateKey as exc:
        problem = f"has the key {exc.key!r} twice in one object (a bad merge?); keep one of them"
    except RecursionError:
        problem = "is nested too deeply to parse (not a baseline file)"
    # raised outside the except clauses: one message, no chained traceback
    raise bad(path, problem) from None


def dumps(data: Mapping[str, Any]) -> str:
    """Canonical text of a baseline file: sorted keys, 2-space indent, trailing newline."""
    return json.dumps(data, indent=2, sort_keys=True) + "\n"

"""Which kernel call a dead process was in: a record file of this process's own, written before
each kernel call and removed after it.

A kernel that corrupts the host heap or dereferences a bad pointer kills its process ("Fatal
Python error: Aborted", a segfault) before any report is written. The file it leaves behind names
the test, the call and the case with its repro: the xdist controller puts it into its "worker
crashed" report, and the next run in the same directory reports an earlier process's record
(``pytest_fusion.plugin.crash_report``). Nothing is recorded until :func:`activate` names a file.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Iterator

_state: dict[str, Any] = {"path": None, "test": None}


def activate(path: Path | None) -> Path | None:
    """Record kernel calls into ``path`` from now on (None: record nothing); returns the path
    recorded into before, for a nested run to restore."""
    before, _state["path"] = _state["path"], path
    return before


def set_test(nodeid: str | None) -> None:
    """The test (pytest node id) the following kernel calls belong to."""
    _state["test"] = nodeid


@contextlib.contextmanager
def kernel_call(call: str, case: str) -> Iterator[None]:
    """Around one kernel call: the record names ``call`` (``"call 1 of 2"``, ``"backward"``) and
    ``case`` (the failure footer: dims, dtype, layouts, seed, repro) while it runs; a call that
    returns or raises removes it, a dead process leaves it."""
    path = _state["path"]
    if path is None:
        yield
        return
    record = {"test": _state["test"], "call": call, "case": case}
    try:
        path.write_text(json.dumps(record))
    except OSError:  # a full or read-only temp dir must not fail the check itself
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()


def read(path: Path) -> dict[str, Any] | None:
    """The record at ``path``, or None where there is none (or it is not one: cut short by the crash)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "call" in record else None


def describe(record: dict[str, Any]) -> str:
    """The record as a report says it: the test, the call, then the case's lines."""
    test = record.get("test") or "a test"
    lines = [f"[pytest-fusion] the process died inside a kernel call: {test}, {record.get('call')}"]
    case = str(record.get("case") or "").strip("\n")
    return "\n".join([*lines, case] if case else lines)

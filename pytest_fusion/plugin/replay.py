"""A gate failure that rests on timing alone is replayed in a fresh process before it is reported.

Why: a process's own state moves a kernel's time and no re-measure inside the process samples it
(where its buffers landed in memory, its compile builds, its clocks at start), by more than the
intervals inside one process (docs/timing-and-gate.md, "The gate", "Replayed in a fresh process
before failing"). asv times each benchmark in two processes for the same reason; this replays only
what would fail.

The rule: a case whose gate verdict is a speedup below its threshold or floor, or an interval too
noisy to judge (``BenchRecord.replayable``), is run again as ``python -m pytest <node id>`` in a
child process with this run's resolved settings (``config.REPLAY_SETTINGS_ENV``), and the child's
verdict is the case's. A case that fails in both says so with both measurements; a pass says what
the first process measured. Nothing else is replayed: a wrong result, accuracy drift, an implausible
throughput, a case not comparable with its entry or new under ``--fusion-strict`` are the same in
any process. Not in a ``--fusion-save`` run (it re-baselines whatever the verdict), nor inside a
replay, nor with ``--fusion-replay=off``.

The child writes nothing of the user's: no cache (``-p no:cacheprovider``), no baseline, no report
but its own temporary JSON, no ``$GITHUB_STEP_SUMMARY``; the ini file's ``addopts`` are dropped
(they may name report files or xdist), the command line's ``-p`` plugins are passed on. A child
that cannot run, records nothing, timed the case another way or failed it on something other
than timing leaves the first verdict standing (the failure, with a note saying why it was not
replayed); so do the cases past :data:`MAX_REPLAYS` in one process. The child runs the case
alone: a slowdown that only the cases before it bring about passes there.

The child's command and environment (:func:`child_command`, :func:`child_env`) also run
``--fusion-sanitize``'s child, one check case under compute-sanitizer (``pytest_fusion.plugin.sanitize``),
and ``--fusion-cold-start``'s, one bench case with empty or warm compile caches
(:func:`child_record`, ``pytest_fusion.plugin.cold_start``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import pytest

from pytest_fusion.plugin import progress
from pytest_fusion.plugin.config import REPLAY_SETTINGS_ENV, FusionConfig

if TYPE_CHECKING:
    from pytest_fusion.measure.record import BenchRecord

REPLAY_TIMEOUT_S = 900.0
"""Most seconds a child may take: far above a cold bench case's set-up, so only a hung child hits
it (docs/timing-and-gate.md, "Replay cost")."""

MAX_REPLAYS = 8
"""Most cases one process replays. A run failing more is more likely a real regression than
per-process variation, and each replay costs a pytest start-up and the case's set-up again
(docs/timing-and-gate.md, "Replay cost"): past this the first verdicts stand, each with a note
saying so."""

_DROPPED_ENV = (
    "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID",
    "GITHUB_STEP_SUMMARY",
)
"""The parent's variables the child must not see: its options (the child gets the resolved ones),
xdist's worker identity (the child is no worker; ``CUDA_VISIBLE_DEVICES`` as the worker pinned it
is kept, so the child times on the same GPU) and the step summary the parent writes."""

_CHILD_OVERRIDES: dict[str, Any] = {
    "cases": None, "save": False, "json": None, "markdown": None, "plot": None, "benchmark_json": None,
    "explore": False, "repro": None, "replay": "off", "sanitize": None, "cold_start": False,
}
"""Settings of a child: its one node id selects the case, and it saves, reports, replays and
sanitizes nothing (a replay's child writes its own temporary JSON, :func:`child_env`'s override)."""


def should_replay(cfg: FusionConfig, record: BenchRecord) -> bool:
    """Whether ``record``'s failure is replayed: the gate marked it as resting on timing alone
    (``BenchRecord.replayable``), and this run replays (the module docstring's rule)."""
    return record.replayable and cfg.replay == "on" and not cfg.save


def plugin_args(args: Sequence[str]) -> list[str]:
    """The ``-p NAME`` / ``-pNAME`` options of a command line, as ``["-p", NAME, ...]``: a plugin the
    user loaded there (a timer hook, fixtures) must load in the child too."""
    out: list[str] = []
    it = iter(args)
    for a in it:
        if a == "-p":
            name = next(it, None)
            if name is not None:
                out += ["-p", name]
        elif a.startswith("-p") and len(a) > 2 and not a.startswith("--"):
            out += ["-p", a[2:]]
    return out


def _target(item: pytest.Item) -> str:
    """The item as a command-line argument that works from the rootdir whatever the item's place:
    its file's path and the node id's names after it (a file outside the rootdir has a node id
    starting with ``::``, which pytest refuses as an argument)."""
    names = item.nodeid.split("::")[1:]
    return "::".join([str(item.path), *names])


def child_command(config: pytest.Config, item: pytest.Item) -> list[str]:
    """``python -m pytest <item>`` as a child process runs it: from the rootdir, with the parent's
    ini file and ``-p`` plugins, no cache, no ini ``addopts`` (the module docstring)."""
    cmd = [sys.executable, "-m", "pytest", _target(item), "-p", "no:cacheprovider", "-o", "addopts=", "-q",
           "--rootdir", str(config.rootpath), *plugin_args(config.invocation_params.args)]
    if config.inipath is not None:
        cmd += ["-c", str(config.inipath)]
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        cmd += ["-p", "pytest_fusion.plugin.hookimpls"]
    return cmd


def child_env(cfg: FusionConfig, **overrides: Any) -> dict[str, str]:
    """The environment of a child process: the parent's less :data:`_DROPPED_ENV`, and ``cfg`` with
    :data:`_CHILD_OVERRIDES`, then ``overrides`` (fields of :class:`FusionConfig`), as the child's
    settings (:data:`~pytest_fusion.plugin.config.REPLAY_SETTINGS_ENV`, which the child reads in
    place of its options)."""
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
    env[REPLAY_SETTINGS_ENV] = json.dumps({**dataclasses.asdict(cfg), **_CHILD_OVERRIDES, **overrides})
    return env


def child_record(
    config: pytest.Config, cfg: FusionConfig, item: pytest.Item, key: tuple[str, str, str],
    env: Mapping[str, str] | None = None, **overrides: Any,
) -> tuple[BenchRecord | None, str]:
    """Run bench item ``item`` in a child process (:func:`child_command`, :func:`child_env` with
    ``overrides``, then ``env``'s variables): the child's record of ``key`` and ``""``, or None and
    why there is none."""
    from pytest_fusion.measure.record import BenchRecord

    with tempfile.TemporaryDirectory(prefix="pytest-fusion-replay-") as tmp:
        out = Path(tmp, "records.json")
        child = {**child_env(cfg, **overrides, json=str(out)), **(env or {})}
        try:
            done = subprocess.run(child_command(config, item), cwd=config.rootpath, env=child,
                                  capture_output=True, text=True, timeout=REPLAY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None, f"the child process ran past {REPLAY_TIMEOUT_S:g} s"
        except OSError as exc:
            return None, f"the child process did not start ({exc})"
        records = json.loads(out.read_text())["records"] if out.exists() else []
        for d in records:
            rec = BenchRecord.from_dict(d)
            if rec.key == key:
                return rec, ""
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        return None, f"the child process (exit {done.returncode}) recorded no such case: " + " | ".join(tail)


def _unlike(first: BenchRecord, child: BenchRecord) -> str:
    """Why ``child`` cannot stand for ``first``'s measurement ("" when it can): timed by another
    method (a timer plugin the child did not load), or failed on something other than timing (not
    comparable, say), which is not the question a replay asks."""
    if child.method != first.method:
        return f"the child process timed with {child.method!r}, this one with {first.method!r}"
    if child.status == "fail" and not child.replayable:
        return "the child process failed on something other than timing: " + "; ".join(child.reasons)
    return ""


def _speedups(rec: BenchRecord) -> str:
    parts = [f"kernel {rec.kernel_ms:.4g} ms"]
    parts += [f"{s.speedup:.3f}x over {p}" for p, s in rec.speedups().items()]
    return ", ".join(parts)


def replay(config: pytest.Config, cfg: FusionConfig, item: pytest.Item, first: BenchRecord) -> BenchRecord:
    """The verdict of ``first`` (a record failing on timing alone, :func:`should_replay`) after
    running ``item`` again in a fresh process: the child's record when it ran and timed the same
    way, with a note on the first process's measurement (and, when the child failed too, a reason
    saying the failure replayed); else ``first`` with a note saying why it was not replayed.
    Says so as the child starts (:mod:`pytest_fusion.plugin.progress`): a replay costs a pytest
    start-up and the case's set-up again."""
    import torch

    progress.of(config)(
        f"{item.nodeid}: failed the gate on timing alone ({'; '.join(first.reasons)}); replaying it in a "
        f"fresh process (up to {REPLAY_TIMEOUT_S:g} s)"
    )
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the child allocates its own copy of the case's tensors
    child, why = child_record(config, cfg, item, first.key)
    why = why or ("" if child is None else _unlike(first, child))
    if why or child is None:
        return dataclasses.replace(first, notes=[*first.notes, f"not replayed in a fresh process: {why}"])
    if child.status == "fail":
        again = f"replayed in a fresh process, which failed too (the first: {_speedups(first)})"
        return dataclasses.replace(
            child,
            reasons=[*child.reasons, again],
            notes=[*child.notes, "replayed in a fresh process: this record is the replay's"],
        )
    reasons = "; ".join(first.reasons)
    earlier = f"the first process failed the gate (kernel {first.kernel_ms:.4g} ms; {reasons})"
    return dataclasses.replace(
        child, notes=[*child.notes, f"replayed in a fresh process, which passed; {earlier}"]
    )

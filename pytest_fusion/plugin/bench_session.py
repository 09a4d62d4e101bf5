"""The bench session: one per pytest run in bench mode. It holds what the run's bench cases share
(the loaded baseline files, environments, timers, measured peaks, settings; each case is timed by
:mod:`pytest_fusion.plugin.bench_item`), collects their records (from this process or, under
pytest-xdist, from the workers' reports), then checks for stale entries, saves the baselines and
writes the reports once, on the controller.

torch loads only when a bench case runs.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_fusion.declare.spec import FusionUsageError
from pytest_fusion.plugin import config as fusion_config
from pytest_fusion.plugin.config import FusionConfig

if TYPE_CHECKING:
    from pytest_fusion.bench.timed_case import BenchSettings
    from pytest_fusion.measure.record import BenchRecord
    from pytest_fusion.measure.timers import Timer

KEY = pytest.StashKey["BenchSession"]()

DECLARED_OUTPUT = "pytest_fusion_declared"
"""Key of a worker's collected declarations in pytest-xdist's ``workeroutput``."""


MAX_NAMED_CASES = 10
"""Most bench case names a warning about ``--fusion-cases`` lists (the rest are counted)."""


def unmatched_cases_warning(
    cfg: FusionConfig, declared: dict[str, list[tuple[str, str]]], *, timed_none: bool
) -> list[str]:
    """A line naming the ``--fusion-cases`` globs that match no bench case the collected tests
    declare (``declared``: ``{test id: [(case, dtype), ...]}``, ``items.declared_bench_cases``)
    and the first :data:`MAX_NAMED_CASES` case names that exist, in declaration order; no line when
    every glob matches one. ``timed_none``: the run timed no bench case at all."""
    pairs = [pair for cases in declared.values() for pair in cases]
    unmatched = cfg.unmatched_cases(pairs)
    if not unmatched:
        return []
    names = list(dict.fromkeys(case for case, _ in pairs))
    more = f" and {len(names) - MAX_NAMED_CASES} more" if len(names) > MAX_NAMED_CASES else ""
    exist = (f"their bench cases: {', '.join(names[:MAX_NAMED_CASES])}{more} (a glob matches "
             "'<case>' or '<case>-<dtype>')" if names else "they declare no bench case")
    none = ", so no bench case was timed" if timed_none else ""
    globs = ",".join(unmatched)
    return [f"--fusion-cases {globs} matched no bench case of the collected tests{none}; {exist}"]


class BenchSession:
    """Per-device baselines in, records out (see the module docstring); what the run's bench cases
    share, for :mod:`pytest_fusion.plugin.bench_item`."""

    def __init__(self, config: pytest.Config, cfg: FusionConfig) -> None:
        self.config = config
        self.cfg = cfg
        self.baseline_dir: Path = cfg.baseline_path(config.rootpath)
        self.records: list[BenchRecord] = []
        self.errors: list[str] = []
        self.saved: list[str] = []
        self.peaks: dict[tuple[str, str], dict[str, float]] = {}  # measured peaks, measure.peaks.cached_peaks
        self.peaks_remeasured: set[tuple[str, str]] = set()  # (slug, dtype), see bench_item._peaks_for
        # {test id: [(case, dtype)]} of the collected fused_kernel tests and the number of bench
        # items (items.declared_bench_cases); on the controller of an xdist run, from the workers.
        self.declared: dict[str, list[tuple[str, str]]] = {}
        self.bench_items = 0
        self.stale: list[str] = []
        self.warnings: list[str] = []  # said in the summary, not failed (check_stale)
        self.started = 0  # bench cases this process began (plugin.bench_item's progress line)
        self.replays = 0  # cases this process sent to a fresh one (pytest_fusion.plugin.replay.MAX_REPLAYS)
        self._stores: dict[str, dict[str, Any] | None] = {}
        self._envs: dict[str, dict[str, Any]] = {}
        self._timers: dict[str, Timer] = {}
        self.absent: dict[str, str] = {}  # {slug: device name} whose file was absent before the save

    @property
    def is_worker(self) -> bool:
        return hasattr(self.config, "workerinput")

    def stored(self, slug: str) -> dict[str, Any] | None:
        """The loaded baseline file for ``slug`` (None when absent); raises FusionUsageError."""
        if slug not in self._stores:
            from pytest_fusion.baselines import store

            self._stores[slug] = store.load(store.baseline_path(self.baseline_dir, slug))
        return self._stores[slug]

    def env(self, device: str, method: str) -> dict[str, Any]:
        """This run's environment on ``device`` timed by ``method`` (``baselines.environment``), once each."""
        if f"{device}/{method}" not in self._envs:
            from pytest_fusion.baselines.environment import current_env

            self._envs[f"{device}/{method}"] = current_env(
                device, method, rootdir=str(self.config.rootpath), baseline_dir=str(self.baseline_dir)
            )
        return self._envs[f"{device}/{method}"]

    def timer(self, device: str) -> Timer:
        """A ``pytest_fusion_make_timer`` hook's timer, else one default timer per device for the
        session (a CUDA timer holds a 256 MB flush buffer)."""
        custom = self.config.hook.pytest_fusion_make_timer(config=self.config, device=device)
        if custom is not None:
            return custom
        if device not in self._timers:
            from pytest_fusion.measure.timers import default_timer

            self._timers[device] = default_timer(device, self.cfg.cpu_clock)
        return self._timers[device]

    def settings(self) -> BenchSettings:
        """The run's bench settings, from its configuration."""
        from pytest_fusion.bench.timed_case import BenchSettings

        c = self.cfg
        return BenchSettings(
            rounds=c.rounds,
            warmup=c.warmup,
            min_time_s=c.min_time_s,
            max_rounds=c.max_rounds,
            providers=c.providers,
            compile_mode=c.compile_mode,
            compile_builds=c.compile_builds,
            tolerance=c.tolerance,
            strict=c.strict,
        )

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        from pytest_fusion.measure.record import USER_PROPERTY, BenchRecord

        for key, value in report.user_properties:
            if key == USER_PROPERTY and isinstance(value, dict):
                self.records.append(BenchRecord.from_dict(value))

    def save(self) -> None:
        """Merge the saveable records into each device's baseline file (:func:`outputs.saveable`
        says which and why not); a file that cannot be written is an error, the others are still
        written."""
        from pytest_fusion.baselines import store
        from pytest_fusion.plugin import outputs

        by_slug, errors = outputs.saveable(self.records)
        self.errors += errors
        for slug, recs in sorted(by_slug.items()):
            try:
                path = store.save(self.baseline_dir, slug, recs)
                self.saved.append(f"{path} ({len(recs)} case(s) saved)")
            except (FusionUsageError, OSError) as exc:
                self.errors.append(f"not saved: {exc}")

    def write_reports(self) -> None:
        """The report files (:func:`outputs.write_reports`); one that cannot be written is one
        error line naming its option, and the others are still written."""
        from pytest_fusion.plugin import outputs

        self.errors += outputs.write_reports(self.cfg, self.records)

    # ---- stale entries: the collected tests' declared cases in, stale stored entries out ----------

    def declare(self, declared: dict[str, list[tuple[str, str]]], bench_items: int) -> None:
        """Take the run's collected ``fused_kernel`` tests and their declared bench cases
        (``items.declared_bench_cases``, after deselection); a worker of an xdist run sends them to
        the controller with its end (:class:`XdistDeclarations`)."""
        self.declared, self.bench_items = declared, bench_items
        workeroutput = getattr(self.config, "workeroutput", None)  # an xdist worker's
        if workeroutput is not None:
            workeroutput[DECLARED_OUTPUT] = {"declared": declared, "bench_items": bench_items}

    def check_stale(self) -> None:
        """List stored entries of collected tests that no longer declare them (a renamed or removed
        case; ``store.stale_entries``) and entries whose test file is gone
        (``store.orphaned_entries``), both through ``store.stale_with_reasons``, the rule the
        ``prune`` command of ``python3 -m pytest_fusion.baselines`` drops by, and name that command
        once per file; ``--fusion-strict`` fails them, and a ``--fusion-cases`` that selected no
        bench case of the collected tests; without it, such a ``--fusion-cases`` (or one of its globs
        that matches no declared case) is a warning in the summary
        (:func:`unmatched_cases_warning`)."""
        from pytest_fusion.baselines import store

        c = self.cfg
        if c.strict and c.cases and self.declared and not self.bench_items:
            self.errors.append(
                f"--fusion-cases {','.join(c.cases)} matched no bench case of the collected tests "
                f"(--fusion-strict)"
            )
        elif c.cases and self.declared:
            self.warnings += unmatched_cases_warning(c, self.declared, timed_none=not self.bench_items)
        for slug in sorted(set(self._stores) | {r.device for r in self.records}):
            try:
                data = self.stored(slug)
            except FusionUsageError:
                continue  # already reported by every bench item of that device
            path = store.baseline_path(self.baseline_dir, slug)
            advice = {
                store.UNDECLARED: "; delete the entry or restore the case",
                store.ORPHANED: ": a renamed file's cases are new under their new id; "
                                "move the entry or delete it",
            }
            stale = store.stale_with_reasons(self.declared, data, self.config.rootpath)
            moved = store.moved_files(self.declared, data, self.config.rootpath)
            for (kernel, case, dtype), why in stale:
                old = kernel.partition("::")[0]
                hint = advice[why]
                if old in moved:
                    hint = (f"; its test is collected from {moved[old]}: "
                            f"{store.rename_command(path, old, moved[old])} moves the file's entries there")
                line = f"stale baseline entry in {path}: {kernel} [{case}-{dtype}] ({why}{hint})"
                if c.strict:
                    self.errors.append(line + " (--fusion-strict)")
                else:
                    self.stale.append(line)
            if stale:
                command = f"python3 -m pytest_fusion.baselines prune {shlex.quote(str(path))}"
                self.stale.append(f"{command} lists the stale entries of {path.name} and why; "
                                  f"add --write to drop them")

    def absent_files(self) -> dict[str, str]:
        """``{slug: device name}`` of this run's devices whose baseline file does not exist."""
        from pytest_fusion.baselines import store

        names: dict[str, str] = {}
        for rec in self.records:
            names.setdefault(rec.device, str((rec.env or {}).get("device") or ""))
        return {s: n for s, n in names.items() if not store.baseline_path(self.baseline_dir, s).exists()}

    def absent_file_notes(self) -> list[str]:
        """A line per device of :attr:`absent` when the directory holds other files: the one an
        older pytest-fusion named this device by (``store.legacy_file``: how to adopt it) and
        the other devices' files, so that a run finding no baselines says why its cases are new."""
        from pytest_fusion.baselines import store

        lines = []
        for slug, name in sorted(self.absent.items()):
            path = store.baseline_path(self.baseline_dir, slug)
            old = store.legacy_file(self.baseline_dir, slug, name=name) if name else None
            others = store.other_device_files(self.baseline_dir, slug)
            others = [f for f in others if old is None or f != old.name]
            if old is None and not others:
                continue
            line = f"no baseline file for this device ({path.name}) in {self.baseline_dir}"
            if old is not None:
                line += (
                    f"; {old.name} is named by the device's model name alone, as older pytest-fusions "
                    f"named CPU baseline files, so it may hold another machine's timings and is not read. "
                    f"If it was saved on this machine (its entries' env.date and env.commit say when), "
                    f"rename it: git mv {old} {path}, then set its \"device\" to \"{slug}\""
                )
                if path.exists():
                    line += (
                        f" (this run's --fusion-save wrote {path.name} with this run's cases alone: to keep "
                        f"{old.name}'s entries instead, delete {path.name} first, and save again after the "
                        f"rename)"
                    )
            if others:
                line += f"; files exist for other devices: {', '.join(others)}"
            lines.append(line + ". Cases are reported as new.")
        return lines

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.is_worker:
            return
        self.check_stale()
        self.absent = self.absent_files()  # before the save creates them
        if self.records:
            if self.cfg.save:
                self.save()
            self.write_reports()
        if self.errors and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.is_worker or not (self.records or self.errors or self.stale or self.warnings):
            return
        from pytest_fusion.report import files as report

        tr = terminalreporter
        tr.section("pytest-fusion bench")
        # A gate failure's reasons are its test's failure report; printed here too only where
        # pytest prints no failure reports (--tb=no), so that each is printed once.
        reasons = tr.config.option.tbstyle == "no"
        wide = tr.verbosity > 0  # -v: every column
        for line in report.terminal_lines(self.records, wide=wide, reasons=reasons):
            tr.write_line(line)
        for line in self.absent_file_notes():
            tr.write_line(f"pytest-fusion: {line}", yellow=True)
        for line in self.saved:
            tr.write_line(f"pytest-fusion: baseline written: {line}")
        for line in self.stale:
            tr.write_line(f"pytest-fusion: {line}", yellow=True)
        for line in self.warnings:
            tr.write_line(f"pytest-fusion: WARNING {line}", yellow=True)
        for err in self.errors:
            tr.write_line(f"pytest-fusion: ERROR {err}", red=True)


class XdistDeclarations:
    """On the controller of a pytest-xdist run, which collects nothing itself: the declarations
    each worker collected (:meth:`BenchSession.declare`), merged into the bench session as the
    workers end. Registered only when xdist is loaded (its hook exists only then)."""

    def __init__(self, bench: BenchSession) -> None:
        self.bench = bench

    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        out = getattr(node, "workeroutput", {}).get(DECLARED_OUTPUT)
        if out:  # every worker collects every test: their declarations agree
            self.bench.declared.update({k: [tuple(c) for c in v] for k, v in out["declared"].items()})
            self.bench.bench_items = max(self.bench.bench_items, out["bench_items"])


def start(config: pytest.Config) -> BenchSession:
    """The run's bench session, registered as a plugin (for its hooks) on first use: in
    ``pytest_configure`` under ``--fusion-bench``, or by a bench case's first call."""
    s = config.stash.get(KEY, None)
    if s is None:
        s = config.stash[KEY] = BenchSession(config, fusion_config.of(config))
        config.pluginmanager.register(s, "pytest-fusion-bench")
        if config.pluginmanager.hasplugin("xdist") and not s.is_worker:
            config.pluginmanager.register(XdistDeclarations(s), "pytest-fusion-xdist-declarations")
    return s

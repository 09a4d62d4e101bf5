"""What a bench session leaves behind at the end of a run: which records are saved into the
baseline files (and why the others are not), and the report files. Called by
:class:`pytest_fusion.plugin.bench_session.BenchSession` on the controller, once."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Iterable

from pytest_fusion.plugin.config import STEP_SUMMARY_ENV, FusionConfig

if TYPE_CHECKING:
    from pytest_fusion.measure.record import BenchRecord


def saveable(records: Iterable[BenchRecord]) -> tuple[dict[str, list[BenchRecord]], list[str]]:
    """``({device slug: records to save}, [why each other record is not saved])``.

    An implausible record (a timing the device cannot produce) is never saved. A record too noisy
    to judge would be as useless for judging later runs: not saved, whether it had a baseline (and
    failed) or is new (and passed); nor is one with no provider besides the kernel
    (``store.check_saveable``). A record that failed the gate otherwise is saved:
    --fusion-save means "re-baseline from this run"."""
    from pytest_fusion.baselines import store

    by_slug: dict[str, list[BenchRecord]] = {}
    errors: list[str] = []
    for rec in records:
        if rec.implausible:  # a timing the device cannot produce
            errors.append(
                f"not saved, implausible: {rec.kernel} [{rec.case}-{rec.dtype}] "
                f"({'; '.join(rec.implausible)})"
            )
            continue
        if rec.noisy:
            errors.append(
                f"not saved, too noisy to judge: {rec.kernel} [{rec.case}-{rec.dtype}] "
                f"(its stored entry, if any, is unchanged; re-run on a quieter machine or "
                f"with more --fusion-rounds / --fusion-min-time)"
            )
            continue
        try:
            store.check_saveable(rec)
        except ValueError as exc:
            errors.append(f"not saved: {exc}")
            continue
        by_slug.setdefault(rec.device, []).append(rec)
    return by_slug, errors


def write_reports(cfg: FusionConfig, recs: list[BenchRecord]) -> list[str]:
    """Write JSON, Markdown (also to ``$GITHUB_STEP_SUMMARY``), plots and pytest-benchmark JSON,
    each on its own; returns one error line per report that could not be written
    (``report.ReportError``, or matplotlib missing), naming its option."""
    from pytest_fusion.report import files as report

    c = cfg
    writers: list[tuple[str, str | None, Callable[[str], Any]]] = [
        ("--fusion-json", c.json, lambda p: report.write_json(p, recs)),
        (
            f"${STEP_SUMMARY_ENV}",
            os.environ.get(STEP_SUMMARY_ENV),
            lambda p: report.write_markdown(p, recs, append=True),
        ),
        ("--fusion-markdown", c.markdown, lambda p: report.write_markdown(p, recs)),
        ("--fusion-plot", c.plot, lambda p: report.write_plots(p, recs)),
        ("--fusion-benchmark-json", c.benchmark_json, lambda p: report.write_benchmark_json(p, recs)),
    ]
    errors = []
    for option, path, write in writers:
        if not path:
            continue
        try:
            write(path)
        except report.ReportError as exc:
            errors.append(f"{option}: {exc}")
        except ImportError as exc:
            errors.append(f"{option} needs matplotlib ({exc})")
    return errors

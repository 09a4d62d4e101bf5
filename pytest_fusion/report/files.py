"""Reports of a bench run's records: terminal table, JSON, Markdown, PNG plots, pytest-benchmark JSON.

Every function takes the run's :class:`~pytest_fusion.measure.record.BenchRecord` list and nothing
else, so each report shows exactly the measured numbers. Times in ms, cold start in s, memory in
MiB, throughput in TFLOP/s and GB/s.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from pytest_fusion.gate.drift import UNSTORED_NOTE
from pytest_fusion.measure import power
from pytest_fusion.measure.record import BenchRecord
from pytest_fusion.measure.timers import SYNC_METHOD


class ReportError(OSError):
    """A report file could not be written; the message names the report, the path and why.
    Every ``write_*`` function raises it (never a bare OSError), so a caller writing several
    reports can report this one and go on with the others."""


@contextlib.contextmanager
def _writing(what: str, path: str | os.PathLike[str]) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        problem = f"{what} {os.fspath(path)!r} could not be written: {exc.strerror or exc}"
    else:
        return
    raise ReportError(problem)  # outside the except clause: one message, no chained traceback


PLOT_X_DIM = "M"
"""Plots put this dim (tokens) on the x axis; a kernel without it uses its first dim."""


def by_kernel(records: Iterable[BenchRecord]) -> OrderedDict[str, list[BenchRecord]]:
    """Records grouped by kernel, kernels and cases in sorted order."""
    groups: OrderedDict[str, list[BenchRecord]] = OrderedDict()
    for rec in sorted(records, key=lambda r: r.key):
        groups.setdefault(rec.kernel, []).append(rec)
    return groups


def provider_names(records: Sequence[BenchRecord]) -> list[str]:
    """Providers other than the kernel, eager and compile first, then extras by name."""
    names = {n for r in records for n in r.providers if n != "kernel"}
    return [n for n in ("eager", "compile") if n in names] + sorted(names - {"eager", "compile"})


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _ratio(v: float | None) -> str:
    """A speedup to three significant digits at most two decimals (1.37, 26.6, 268): a wild
    interval of a noisy provider keeps the column as narrow as a tight one."""
    if v is None:
        return "-"
    return f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}" if abs(v) < 100 else f"{v:.0f}"


def _speedup(rec: BenchRecord, p: str) -> str:
    pr = rec.providers.get(p)
    if pr is None or pr.speedup is None:
        return "-"
    return f"{_ratio(pr.speedup)}x [{_ratio(pr.low)}, {_ratio(pr.high)}]"


def _per_provider(rec: BenchRecord, order: Sequence[str], value: Any, fmt: str) -> str:
    cells = [_f(value(rec.providers[p]) if p in rec.providers else None, fmt) for p in order]
    return "-" if all(c == "-" for c in cells) else "/".join(cells)


def rows(records: Sequence[BenchRecord]) -> tuple[list[str], list[list[str]]]:
    """Header and cell strings of the summary table for ``records`` (one kernel's or all).

    Columns: case, dtype, the kernel's median ms and its host latency (a synchronized call with
    launch overhead), each provider's median ms, the speedup over each with its 95% interval,
    the kernel's TFLOP/s and GB/s, % of the device's peak (FLOP/s when flops are known, else
    bandwidth), peak memory and cold start of the kernel and each provider (``/``-separated, in
    the order kernel, providers...), and the gate's verdict (:func:`_verdict`). With
    ``--fusion-cold-start`` figures in any record, a column of the kernel's and torch.compile's
    cold and warm starts in fresh processes (``plugin.cold_start``) comes before the verdict.
    """
    provs = provider_names(records)
    order = ["kernel", *provs]
    who = "/".join(order)
    fresh = [p for p in ("kernel", "compile") if any(p in (r.cold_start or {}) for r in records)]
    header = [
        "case",
        "dtype",
        "kernel ms",
        "host ms",
        *(f"{p} ms" for p in provs),
        *(f"vs {p}" for p in provs),
        "TFLOP/s",
        "GB/s",
        "% peak",
        f"peak MiB {who}",
        f"cold s {who}",
        *([f"cold/warm s {', '.join(fresh)}"] if fresh else []),
        "gate",
    ]
    out = []
    for r in records:
        k = r.providers["kernel"]
        pct = r.pct_peak_flops if r.pct_peak_flops is not None else r.pct_peak_bw
        out.append(
            [
                r.case,
                r.dtype,
                f"{k.median_ms:.4f}",
                f"{k.host_ms:.4f}",
                *(_f(r.providers[p].median_ms if p in r.providers else None, ".4f") for p in provs),
                *(_speedup(r, p) for p in provs),
                _f(r.tflops, ".2f"),
                _f(r.gbps, ".1f"),
                _f(pct, ".1f"),
                _per_provider(
                    r, order, lambda p: None if p.peak_bytes is None else p.peak_bytes / 2**20, ".1f"
                ),
                _per_provider(r, order, lambda p: p.cold_start_s, ".3f"),
                *([_fresh_starts(r, fresh)] if fresh else []),
                _verdict(r),
            ]
        )
    return header, out


def _fresh_starts(r: BenchRecord, providers: Sequence[str]) -> str:
    """``"12.41/0.93, 31.02/2.10"``: each provider's cold and warm start in s, ``-`` where missing."""
    figures = r.cold_start or {}
    cells = []
    for p in providers:
        f = figures.get(p)
        cells.append(f"{_f(f.get('cold_s'), '.2f')}/{_f(f.get('warm_s'), '.2f')}" if f else "-")
    return ", ".join(cells)


def _verdict(r: BenchRecord) -> str:
    """The gate cell: the status, marked ``cuda-sync`` (a provider could not be captured: the case
    was timed by :data:`~pytest_fusion.measure.timers.SYNC_METHOD`) and ``power-capped``
    (``bench.power.marker``: the device held its clock down during timing)."""
    synced = r.method in (SYNC_METHOD, "cuda-sync")  # "cuda-sync": records of the memset flush
    marks = [m for m in ("cuda-sync" if synced else "", power.marker(r.power)) if m]
    return r.status + (f" ({', '.join(marks)})" if marks else "")


NARROW_COLUMNS = ("case", "dtype", "kernel ms", "TFLOP/s", "GB/s", "% peak", "gate")
"""Columns of the default terminal table, with every ``vs <provider>`` speedup: with eager and
compile and a case name of 16 characters the rows are 110 characters wide, under the 120 of a
wide terminal. Provider times, host latency, peak memory and cold start are in the wide table
(``pytest -v``), the JSON and the Markdown."""


def _narrow(header: list[str], body: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    keep = [i for i, h in enumerate(header) if h in NARROW_COLUMNS or h.startswith("vs ")]
    return [header[i] for i in keep], [[row[i] for i in keep] for row in body]


def _timed_on(rec: BenchRecord) -> str:
    """``"<device>, <timing method>"``: the same heading in every report, the clock named."""
    return f"{rec.device}, {rec.providers['kernel'].method}"


def terminal_lines(records: Iterable[BenchRecord], wide: bool = False, reasons: bool = True) -> list[str]:
    """The terminal summary: per kernel a fixed-width table, then failure reasons and notes.

    Args:
        wide: every column of :func:`rows` (``pytest -v``); else :data:`NARROW_COLUMNS` and the
            speedups.
        reasons: a ``FAIL`` line per gate failure reason. The plugin leaves them out where each
            failing test's own report already prints them (its verdict stays in the ``gate``
            column), so a failure is printed once.
    """
    lines: list[str] = []
    grouped = by_kernel(records)
    for kernel, recs in grouped.items():
        header, body = rows(recs)
        if not wide:
            header, body = _narrow(header, body)
        widths = [max(len(c) for c in col) for col in zip(header, *body, strict=True)]
        lines.append(f"{kernel}  ({_timed_on(recs[0])})")
        lines.append("  " + "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
        for row in body:
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
        for r in recs:
            for msg in r.reasons if reasons else ():
                lines.append(f"  FAIL {r.case}-{r.dtype}: {msg}")
            for msg in r.review:
                lines.append(f"  REVIEW {r.case}-{r.dtype}: {msg}")
            notes = [n for n in r.notes if n != UNSTORED_NOTE]  # said once, below
            for msg in notes + [f"{n}: {p.note}" for n, p in r.providers.items() if p.note]:
                lines.append(f"  note {r.case}-{r.dtype}: {msg}")
        lines.append("")
    unstored = any(UNSTORED_NOTE in r.notes for recs in grouped.values() for r in recs)
    return lines + ([f"note: {UNSTORED_NOTE}", ""] if unstored else [])


def markdown(records: Iterable[BenchRecord]) -> str:
    """A Markdown summary (for ``$GITHUB_STEP_SUMMARY``): one table per kernel."""
    parts = ["## pytest-fusion bench\n"]
    for kernel, recs in by_kernel(records).items():
        header, body = rows(recs)
        parts.append(f"### `{kernel}` ({_timed_on(recs[0])})\n")
        parts.append("| " + " | ".join(header) + " |")
        parts.append("|" + "---|" * len(header))
        for row in body:
            parts.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
        fails = [f"- **{r.case}-{r.dtype}**: {m}" for r in recs for m in r.reasons]
        parts.extend(fails)
        parts.extend(f"- review **{r.case}-{r.dtype}**: {m}" for r in recs for m in r.review)
        parts.append("")
    return "\n".join(parts) + "\n"


def write_json(path: str | os.PathLike[str], records: Iterable[BenchRecord]) -> Path:
    """All records as ``{"schema": 1, "records": [...]}`` (sorted by kernel, case, dtype).

    Raises:
        ReportError: ``path`` cannot be written (a directory, an unwritable place)."""
    p = Path(path)
    data = {"schema": 1, "records": [r.to_dict() for r in sorted(records, key=lambda r: r.key)]}
    with _writing("JSON report", p):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf8")
    return p


def write_markdown(
    path: str | os.PathLike[str], records: Iterable[BenchRecord], append: bool = False
) -> Path:
    """Write (or append, as ``$GITHUB_STEP_SUMMARY`` wants) :func:`markdown` to ``path``.

    Raises:
        ReportError: ``path`` cannot be written.
    """
    p = Path(path)
    text = markdown(records)
    with _writing("Markdown summary", p):
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "a" if append else "w", encoding="utf8") as f:
            f.write(text)
    return p


def plot_series(records: Iterable[BenchRecord]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Plot data: ``{kernel: {series label: [(x, speedup), ...] sorted by x}}``.

    x is the case's :data:`PLOT_X_DIM` (else its first dim); one series per provider, dtype and
    the values of the other dims, labelled ``"vs eager, float16, K=768 N=3072"``.
    """
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for kernel, recs in by_kernel(records).items():
        series: dict[str, list[tuple[int, float]]] = {}
        for r in recs:
            xdim = PLOT_X_DIM if PLOT_X_DIM in r.dims else next(iter(r.dims))
            rest = " ".join(f"{k}={v}" for k, v in sorted(r.dims.items()) if k != xdim)
            for p, pr in r.providers.items():
                if pr.speedup is None:
                    continue
                label = f"vs {p}, {r.dtype}" + (f", {rest}" if rest else "")
                series.setdefault(label, []).append((int(r.dims[xdim]), float(pr.speedup)))
        out[kernel] = {k: sorted(v) for k, v in sorted(series.items())}
    return out


def _file_stem(kernel: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in kernel).strip("_")


def write_plots(
    directory: str | os.PathLike[str], records: Iterable[BenchRecord]
) -> dict[Path, dict[str, list[tuple[int, float]]]]:
    """One PNG per kernel in ``directory``: speedup against M (log x), a line per series.

    Returns:
        ``{png path: the series drawn in it}`` (:func:`plot_series`).

    Raises:
        ImportError: matplotlib is not installed (``pip install pytest-fusion[plot]``).
        ReportError: the directory or a PNG cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = Path(directory)
    with _writing("plot directory", d):
        d.mkdir(parents=True, exist_ok=True)
    drawn: dict[Path, dict[str, list[tuple[int, float]]]] = {}
    for kernel, series in plot_series(records).items():
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, pts in series.items():
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, marker="o", label=label)
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (tokens)")
        ax.set_ylabel("speedup (provider ms / kernel ms)")
        ax.set_title(kernel, fontsize=9)
        if series:
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = d / f"{_file_stem(kernel)}.png"
        try:
            with _writing("plot", path):
                fig.savefig(path, dpi=100)
        finally:
            plt.close(fig)
        drawn[path] = series
    return drawn


def benchmark_json(records: Iterable[BenchRecord]) -> dict[str, Any]:
    """The records in pytest-benchmark's JSON format (``pytest-benchmark compare`` reads it).

    One benchmark per (case, dtype, provider); ``stats`` over the per-round GPU (or CPU) times in
    seconds, computed by ``pytest_benchmark.stats.Stats``; the speedup and timing method go in
    ``extra_info``. pytest-benchmark's own fixture times host wall clock; these are device times.
    """
    from datetime import datetime, timezone

    from pytest_benchmark import __version__
    from pytest_benchmark.plugin import pytest_benchmark_generate_machine_info
    from pytest_benchmark.stats import Stats
    from pytest_benchmark.utils import get_commit_info

    benches = []
    for r in sorted(records, key=lambda r: r.key):
        test = r.kernel.split("::")[-1]
        for p, pr in r.providers.items():
            stats = Stats()
            for ms in pr.samples_ms:
                stats.update(ms / 1e3)
            sd = stats.as_dict()
            sd["data"] = list(stats.data)
            sd["iterations"] = 1
            benches.append(
                {
                    "group": f"{r.kernel}[{r.case}-{r.dtype}]",
                    "name": f"{test}[bench-{r.case}-{r.dtype}-{p}]",
                    "fullname": f"{r.kernel}[bench-{r.case}-{r.dtype}-{p}]",
                    "params": {"case": r.case, "dtype": r.dtype, "provider": p},
                    "param": f"{r.case}-{r.dtype}-{p}",
                    "extra_info": {
                        "dims": r.dims,
                        "speedup": pr.speedup,
                        "low": pr.low,
                        "high": pr.high,
                        "method": pr.method,
                        "host_ms": pr.host_ms,
                        "device": r.device,
                    },
                    "options": {
                        "timer": pr.method,
                        "rounds": r.rounds,
                        "warmup": True,
                        "disable_gc": False,
                        "max_time": None,
                        "min_time": None,
                    },
                    "stats": sd,
                }
            )
    return {
        "machine_info": pytest_benchmark_generate_machine_info(),
        "commit_info": get_commit_info(),
        "benchmarks": benches,
        "datetime": datetime.now(timezone.utc).isoformat(),
        "version": __version__,
    }


def write_benchmark_json(path: str | os.PathLike[str], records: Iterable[BenchRecord]) -> Path:
    """:func:`benchmark_json` into ``path``; raises :class:`ReportError` when it cannot be written."""
    p = Path(path)
    text = json.dumps(benchmark_json(records), indent=2) + "\n"
    with _writing("pytest-benchmark JSON", p):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf8")
    return p

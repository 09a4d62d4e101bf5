"""A baseline file across its git history: each case's speedups (over eager and over torch.compile)
and kernel time against the commits that changed the file, as a Markdown table and PNG plots.

``python3 -m pytest_fusion history [BASELINE.json ...] [--out DIR]`` (default: every
``baselines/*.json`` under the current directory, into ``baseline-history/``) writes, per file,
``<device>-history.md`` (:func:`markdown`), ``<device>-history.png`` (each kernel's geometric
means) and ``<device>-history-<test>.png`` (each case of one test) (:func:`write_plots`; PNGs
need matplotlib, ``pip install 'pytest-fusion[plot]'``: without it the Markdown is still written
and the command says so and exits 1).

Where the figures come from: the commits ``git log --follow`` lists for the file (renames
followed), oldest first, and the file's text at each (``git show <commit>:<path>``), parsed and
checked by :mod:`pytest_fusion.baselines.schema` and upgraded to the current schema as
:func:`pytest_fusion.baselines.store.load` upgrades it (:func:`~pytest_fusion.baselines.schema.validate`).
A commit whose file does not parse or validate is listed with its problem and draws nothing; the
working tree's uncommitted changes are not read. Speedup is the stored provider time over kernel
time (> 1: the kernel is faster); kernel time in ms, as stored.

Marks, per entry ``(test id, case, dtype)`` and commit (:func:`case_points`):

- ``new``: the entry first appears; ``removed``: it is gone from the file;
- ``re-saved``: it differs from the previous commit's entry (a ``--fusion-save`` rewrote it); an
  entry the commit left as it was carries its values on, unmarked;
- ``<field> a -> b``: a field of :data:`TIMING_KEYS` (how the entry was timed; an entry without
  ``method`` was timed by ``gate.comparable.DEFAULT_METHOD``) or of :data:`DEVICE_KEYS` (what it
  was timed on) changed, so the figures on either side are not comparable;
  ``file device a -> b``: the file's own ``device`` changed (a file renamed to another device).

A field recorded on one side only (saved before it was recorded) is no change.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from pytest_fusion.baselines.schema import SCHEMA_VERSION, parse, validate
from pytest_fusion.declare.spec import FusionUsageError
from pytest_fusion.gate.comparable import DEFAULT_METHOD

PLOTTED = ("eager", "compile")
"""The providers whose speedups the table and the plots show (the brief's two baselines of every
case; a marker's extra providers are in the file, not drawn)."""

TIMING_KEYS = ("method", "l2_flush_bytes")
"""Stored environment fields that say how an entry was timed (``baselines.environment``; the
L2 flush's bytes since ``measure.cold_l2``)."""

DEVICE_KEYS = ("device", "capability")
"""Stored environment fields that name the device an entry was timed on."""

CHANGE_FIELDS = (*TIMING_KEYS, *DEVICE_KEYS, "file")
"""The first word of a change mark (``method a -> b``...); the plots draw a line where one is."""

DEFAULT_OUT = "baseline-history"
"""The directory :func:`main` writes into without ``--out``."""

Key = tuple[str, str, str]
"""``(test id, case, dtype)``: one entry of a baseline file."""


class HistoryError(Exception):
    """The history cannot be read: no git, a file outside a git work tree, or one never committed."""


@dataclasses.dataclass(frozen=True)
class Revision:
    """The baseline file at one commit.

    Attributes:
        commit: the full hash; ``short``: its first 7 characters.
        date: the committer date (ISO 8601, as git prints ``%cI``).
        subject: the commit message's first line.
        path: the file's path in the repository at this commit (``git log --follow`` renames).
        data: the file, validated and in the current schema; None when it is unreadable.
        schema: the ``schema`` the commit stored (before the upgrade), None when unreadable.
        problem: why ``data`` is None ("" when it is not).
    """

    commit: str
    date: str
    subject: str
    path: str
    data: Mapping[str, Any] | None
    schema: Any = None
    problem: str = ""

    @property
    def short(self) -> str:
        return self.commit[:7]

    def entries(self) -> dict[Key, Mapping[str, Any]]:
        """``{(test id, case, dtype): entry}`` ({} when unreadable)."""
        if self.data is None:
            return {}
        return {
            (kernel, case, dtype): entry
            for kernel, cases in self.data["cases"].items()
            for case, by_dtype in cases.items()
            for dtype, entry in by_dtype.items()
        }


@dataclasses.dataclass(frozen=True)
class Point:
    """One entry at one commit (``index`` into the revisions, oldest 0): its kernel time (ms) and
    speedups as stored, None after ``removed``; and the marks of the module docstring."""

    index: int
    kernel_ms: float | None
    speedups: Mapping[str, float]
    marks: tuple[str, ...] = ()


def _git(args: Sequence[str], cwd: Path) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        raise HistoryError(f"git {' '.join(args[:2])} did not run ({exc})") from None
    if done.returncode != 0:
        raise HistoryError(f"git {' '.join(args[:2])} failed: {done.stderr.strip() or done.returncode}")
    return done.stdout


def _log(top: Path, rel: str) -> list[tuple[str, str, str, str, str]]:
    """``[(commit, date, subject, status, path at that commit), ...]``, newest first."""
    out = _git(["log", "--follow", "--format=%x1e%H%x1f%cI%x1f%s", "--name-status", "--", rel], top)
    rows = []
    name = rel
    for record in out.split("\x1e")[1:]:
        header, _, body = record.partition("\n")
        commit, date, subject = header.split("\x1f", 2)
        changes = [line.split("\t") for line in body.splitlines() if "\t" in line]
        status = changes[0][0] if changes else ""
        if changes:
            name = changes[0][-1]  # a rename lists old and new: the file is the new one here
        rows.append((commit, date, subject, status, name))
        if status.startswith(("R", "C")):
            name = changes[0][1]  # older commits knew it by its old name
    return rows


def revisions(path: str | os.PathLike[str]) -> list[Revision]:
    """The baseline file ``path`` at every commit that changed it, oldest first (module docstring).

    Raises:
        HistoryError: git is missing, ``path`` is not in a git work tree, or no commit holds it.
    """
    p = Path(path).resolve()
    try:
        top = Path(_git(["rev-parse", "--show-toplevel"], p.parent).strip())
        rel = p.relative_to(top.resolve()).as_posix()
        log = _log(top, rel)
    except HistoryError as exc:
        raise HistoryError(f"{path}: {exc}") from None
    if not log:
        raise HistoryError(f"{path}: no commit holds this file (is it committed?)")
    out = []
    for commit, date, subject, status, name in reversed(log):
        if status.startswith("D"):
            out.append(Revision(commit, date, subject, name, None, problem="the commit deleted the file"))
            continue
        try:
            text = _git(["show", f"{commit}:{name}"], top)
            raw = parse(Path(name), text)
            stored = raw.get("schema") if isinstance(raw, dict) else None
            data = validate(Path(name), raw)
        except (HistoryError, FusionUsageError) as exc:
            out.append(Revision(commit, date, subject, name, None, problem=str(exc)))
            continue
        out.append(Revision(commit, date, subject, name, data, stored))
    return out


def _field(entry: Mapping[str, Any], key: str) -> Any:
    env = entry.get("env") or {}
    if key == "method":
        return env.get("method", DEFAULT_METHOD)
    return env.get(key)


def _changes(old: Mapping[str, Any], new: Mapping[str, Any], keys: Sequence[str]) -> list[str]:
    """``"a -> b"`` for each of ``keys`` recorded in both entries' environments with other values."""
    out = []
    for k in keys:
        a, b = _field(old, k), _field(new, k)
        if a is not None and b is not None and a != b:
            out.append(f"{k} {a} -> {b}")
    return out


def _speedups(entry: Mapping[str, Any]) -> dict[str, float]:
    return {p: float(v["speedup"]) for p, v in entry.get("providers", {}).items()}


def case_points(revs: Sequence[Revision]) -> dict[Key, list[Point]]:
    """Each entry's :class:`Point` at every readable revision from its first, sorted by key: the
    values stored there and the marks of the module docstring (an unreadable revision adds no
    point and breaks no comparison: the next readable one is compared with the last readable)."""
    points: dict[Key, list[Point]] = {}
    last: dict[Key, Mapping[str, Any]] = {}
    last_device: Any = None
    for i, rev in enumerate(revs):
        if rev.data is None:
            continue
        device = rev.data.get("device")
        moved = [f"file device {last_device} -> {device}"] if last_device not in (None, device) else []
        last_device = device
        now = rev.entries()
        for key, entry in now.items():
            before = last.get(key)
            if before is None:
                marks = ["new"]
            else:
                marks = ["re-saved"] if before != entry else []
                marks += _changes(before, entry, CHANGE_FIELDS[:-1]) + moved
            points.setdefault(key, []).append(
                Point(i, float(entry["kernel_ms"]), _speedups(entry), tuple(marks)))
        for key in set(last) - set(now):
            points[key].append(Point(i, None, {}, ("removed",)))
        last = dict(now)
    return dict(sorted(points.items()))


def is_change(mark: str) -> bool:
    """Whether ``mark`` (of a :class:`Point`) says a timing or device field changed."""
    return mark.split(" ", 1)[0] in CHANGE_FIELDS


def geomean(values: Iterable[float]) -> float | None:
    """The geometric mean of positive ``values`` (None for none)."""
    logs = [math.log(v) for v in values]
    return math.exp(sum(logs) / len(logs)) if logs else None


def _fmt(x: float | None, spec: str, suffix: str = "") -> str:
    return "-" if x is None else format(x, spec) + suffix


def _summary_rows(revs: Sequence[Revision], points: Mapping[Key, list[Point]]) -> list[list[str]]:
    at: dict[int, list[Point]] = {}
    for pts in points.values():
        for p in pts:
            at.setdefault(p.index, []).append(p)
    rows = []
    for i, rev in enumerate(revs):
        if rev.data is None:
            rows.append([str(i + 1), f"`{rev.short}`", rev.date[:10], "-", "-", "-", "-", "-", "-", "-",
                         f"unreadable: {rev.problem}"])
            continue
        here = [p for p in at.get(i, []) if p.kernel_ms is not None]
        count = {m: sum(m in p.marks for p in at.get(i, [])) for m in ("new", "re-saved", "removed")}
        means = [geomean(p.speedups[name] for p in here if name in p.speedups) for name in PLOTTED]
        methods = sorted({str(_field(e, "method")) for e in rev.entries().values()})
        changed = sorted({m for p in here for m in p.marks if is_change(m)})
        if rev.schema != SCHEMA_VERSION:
            changed.insert(0, f"schema {rev.schema} read as {SCHEMA_VERSION}")
        rows.append([str(i + 1), f"`{rev.short}`", rev.date[:10], str(len(here)), str(count["new"]),
                     str(count["re-saved"]), str(count["removed"]),
                     *(_fmt(m, ".3f", "x") for m in means), ", ".join(methods), "; ".join(changed)])
    return rows


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def summary_table(revs: Sequence[Revision], points: Mapping[Key, list[Point]] | None = None) -> list[str]:
    """The Markdown table of the revisions, one row each: entries, how many were new, re-saved and
    removed, the geometric mean speedup of the entries over each :data:`PLOTTED` provider, the
    timing methods stored, and the timing, device and schema changes."""
    points = case_points(revs) if points is None else points
    header = ["#", "commit", "date", "entries", "new", "re-saved", "removed",
              *(f"vs {p} (geomean)" for p in PLOTTED), "method", "changes"]
    return _table(header, _summary_rows(revs, points))


def case_table(revs: Sequence[Revision], key: Key, pts: Sequence[Point]) -> list[str]:
    """The Markdown rows of one entry: one per commit that marked it (new, re-saved, removed,
    timing or device changed)."""
    header = ["#", "commit", "kernel ms", *(f"vs {p}" for p in PLOTTED), "marks"]
    rows = [
        [str(p.index + 1), f"`{revs[p.index].short}`", _fmt(p.kernel_ms, ".5g"),
         *(_fmt(p.speedups.get(name), ".3f", "x") for name in PLOTTED), ", ".join(p.marks)]
        for p in pts if p.marks
    ]
    return _table(header, rows)


def markdown(path: str, revs: Sequence[Revision]) -> str:
    """The whole report of one file: the revisions (:func:`summary_table`), then per test each
    entry's marked commits (:func:`case_table`)."""
    points = case_points(revs)
    span = f"{revs[0].date[:10]} .. {revs[-1].date[:10]}" if revs else ""
    lines = [
        f"# History of `{path}`",
        "",
        f"{len(revs)} commit(s) changed the file ({span}; `git log --follow`), oldest first. Speedup: "
        "the stored provider time over the kernel's (> 1: the kernel is faster); geometric means over "
        "the entries holding that provider. Marks: `new`, `re-saved` (the entry differs from the "
        "commit before), `removed`, and `<field> a -> b` where a timing field "
        f"({', '.join(TIMING_KEYS)}) or a device field ({', '.join(DEVICE_KEYS)}) changed (figures "
        "on either side are not comparable).",
        "",
        *summary_table(revs, points),
    ]
    kernel = None
    for key, pts in points.items():
        if key[0] != kernel:
            kernel = key[0]
            lines += ["", f"## `{kernel}`"]
        lines += ["", f"### {key[1]} {key[2]}", "", *case_table(revs, key, pts)]
    return "\n".join(lines) + "\n"


def _stem(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text).strip("_")


def _changes_at(points: Mapping[Key, list[Point]]) -> dict[int, list[str]]:
    """``{revision index: the timing and device changes marked there}``, for the plots' lines."""
    out: dict[int, set[str]] = {}
    for pts in points.values():
        for p in pts:
            for m in p.marks:
                if is_change(m):
                    out.setdefault(p.index, set()).add(m)
    return {i: sorted(v) for i, v in sorted(out.items())}


def _axes_style(axes: Sequence[Any], revs: Sequence[Revision], changes: Mapping[int, list[str]]) -> None:
    """Commits on the shared x axis; a dashed line at each timing change, dotted at a device change
    alone, labelled on the top panel."""
    for ax in axes:
        for i, marks in changes.items():
            style = "--" if any(m.split(" ", 1)[0] in TIMING_KEYS for m in marks) else ":"
            ax.axvline(i, color="tab:red", linestyle=style, linewidth=1.0)
    for i, marks in changes.items():
        axes[0].annotate("; ".join(marks), (i, 1.0), xycoords=("data", "axes fraction"), fontsize=6,
                         rotation=90, va="top", ha="right", color="tab:red")
    axes[-1].set_xticks(range(len(revs)))
    axes[-1].set_xticklabels([r.short for r in revs], rotation=60, fontsize=7, family="monospace")
    axes[-1].set_xlabel("commit (oldest first)")


def _styles(labels: Sequence[str]) -> dict[str, dict[str, Any]]:
    """A colour per case and a line style per dtype (labels ``"<case> <dtype>"``), so that the 30
    lines of one test stay apart: matplotlib's ``tab20`` colours (its default cycle has 10)."""
    import matplotlib

    colours = matplotlib.colormaps["tab20"]
    split = {label: label.rsplit(" ", 1) for label in labels}
    cases = sorted({parts[0] for parts in split.values()})
    dtypes = sorted({parts[-1] for parts in split.values()})
    dashes = ["-", "--", ":", "-."]
    return {label: {"color": colours(cases.index(parts[0]) % 20),
                    "linestyle": dashes[dtypes.index(parts[-1]) % len(dashes)]}
            for label, parts in split.items()}


def _draw(plt: Any, title: str, series: Mapping[str, list[Point]], revs: Sequence[Revision],
          changes: Mapping[int, list[str]], *, relative: bool = False) -> Any:
    """A figure of three panels, speedup over each :data:`PLOTTED` provider and kernel time, a line
    per series (steps: a carried value holds until the next re-save), a dot where it was saved."""
    fig, axes = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    styles = _styles(list(series)) if not relative else {label: {} for label in series}
    for label, pts in series.items():
        shown = [p for p in pts if p.kernel_ms is not None]
        for ax, name in zip(axes, [*PLOTTED, None], strict=True):
            values = [(p, p.kernel_ms if name is None else p.speedups.get(name)) for p in shown]
            drawn = [(p, y) for p, y in values if y is not None]
            if not drawn:
                continue
            (line,) = ax.plot([p.index for p, _ in drawn], [y for _, y in drawn], drawstyle="steps-post",
                              linewidth=1.0, label=label, **styles[label])
            saved = [(p.index, y) for p, y in drawn if p.marks]
            if saved:
                ax.plot(*zip(*saved, strict=True), "o", markersize=3, color=line.get_color())
    for ax, name in zip(axes[: len(PLOTTED)], PLOTTED, strict=True):
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_ylabel(f"speedup vs {name}")
    axes[2].set_yscale("log")
    axes[2].set_ylabel("kernel time / first" if relative else "kernel ms")
    _axes_style(axes, revs, changes)
    axes[0].set_title(title, fontsize=9)
    if series:
        axes[0].legend(fontsize=6, ncol=1 + len(series) // 12, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def _kernel_means(points: Mapping[Key, list[Point]], n: int) -> dict[str, list[Point]]:
    """Per test: a point per revision with the geometric means over its entries there of each
    provider's speedup and of kernel time over the entry's first stored kernel time."""
    by_kernel: dict[str, dict[Key, list[Point]]] = {}
    for key, pts in points.items():
        by_kernel.setdefault(key[0], {})[key] = pts
    out: dict[str, list[Point]] = {}
    for kernel, entries in by_kernel.items():
        means = []
        for i in range(n):
            here = [(pts[0].kernel_ms, p) for pts in entries.values() for p in pts
                    if p.index == i and p.kernel_ms is not None]
            if not here:
                continue
            ratio = geomean(p.kernel_ms / first for first, p in here if first and p.kernel_ms)
            speed = {name: geomean(p.speedups[name] for _, p in here if name in p.speedups)
                     for name in PLOTTED}
            marked = any(p.marks for _, p in here)
            means.append(Point(i, ratio, {k: v for k, v in speed.items() if v is not None},
                               ("re-saved",) if marked else ()))
        out[kernel.split("::")[-1]] = means
    return out


def write_plots(directory: str | os.PathLike[str], slug: str, revs: Sequence[Revision]) -> list[Path]:
    """``<slug>-history.png`` (each test's geometric means, :func:`_kernel_means`) and
    ``<slug>-history-<test>.png`` per test (each entry a line) in ``directory``; returns the paths.

    Raises:
        ImportError: matplotlib is not installed.
        OSError: a PNG cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    points = case_points(revs)
    changes = _changes_at(points)
    figures = [(d / f"{slug}-history.png", f"{slug}: geometric mean per test",
                _kernel_means(points, len(revs)), True)]
    kernels = sorted({k[0] for k in points})
    for kernel in kernels:
        series = {f"{k[1]} {k[2]}": pts for k, pts in points.items() if k[0] == kernel}
        figures.append((d / f"{slug}-history-{_stem(kernel.split('::')[-1])}.png", kernel, series, False))
    written = []
    for path, title, series, relative in figures:
        fig = _draw(plt, title, series, revs, changes, relative=relative)
        try:
            fig.savefig(path, dpi=100, bbox_inches="tight")
        finally:
            plt.close(fig)
        written.append(path)
    return written


def main(argv: Sequence[str]) -> int:
    """``python3 -m pytest_fusion history [BASELINE.json ...] [--out DIR]`` (module docstring):
    0 when every report was written, 1 when a file has no readable history, a report could not be
    written or matplotlib is missing (the Markdown is written all the same), 2 on bad usage."""
    ap = argparse.ArgumentParser(
        prog="python3 -m pytest_fusion history",
        description="Speedups and kernel times of baseline files across their git history.")
    ap.add_argument("files", nargs="*", metavar="BASELINE.json",
                    help="baseline files (default: baselines/*.json under the current directory)")
    ap.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                    help=f"directory for the Markdown and PNG files (default: {DEFAULT_OUT}/)")
    args = ap.parse_args(list(argv))
    files = args.files or sorted(str(p) for p in Path("baselines").glob("*.json"))
    if not files:
        print("error: no baseline files in baselines/; name one: python3 -m pytest_fusion history "
              "baselines/<device>.json", file=sys.stderr)
        return 1
    status = 0
    for f in files:
        try:
            revs = revisions(f)
        except HistoryError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 1
            continue
        slug = Path(f).stem
        out = Path(args.out)
        try:
            out.mkdir(parents=True, exist_ok=True)
            md = out / f"{slug}-history.md"
            md.write_text(markdown(f, revs), encoding="utf8")
        except OSError as exc:
            print(f"error: {f}: the report could not be written to {out}: {exc}", file=sys.stderr)
            status = 1
            continue
        print(f"{f}: {len(revs)} commit(s); wrote {md}")
        try:
            pngs = write_plots(out, slug, revs)
        except ImportError:
            print("error: no PNG drawn: matplotlib is not installed (pip install 'pytest-fusion[plot]'); "
                  f"the Markdown table is in {md}", file=sys.stderr)
            status = 1
            continue
        except OSError as exc:
            print(f"error: {f}: a PNG could not be written to {out}: {exc}", file=sys.stderr)
            status = 1
            continue
        for png in pngs:
            print(f"{f}: wrote {png}")
    return status

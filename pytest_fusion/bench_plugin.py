"""The bench half of the plugin: options, bench items, the gate as test outcomes, and reports.

``plugin.py`` calls :func:`addoption`, :func:`configure`, :func:`enabled`, :func:`selected` and
:func:`run_bench_item`; the ``fusion`` fixture calls :func:`bench_call`. Timing, statistics, the
gate and the files live in plain-Python modules (``bench``, ``gate``, ``baselines``, ``report``);
this module reads options and moves records. torch loads only when a bench item runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import glob
import math
import os
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pytest

from pytest_fusion import options
from pytest_fusion.locks import DEFAULT_TIMING_LOCK_TIMEOUT_S
from pytest_fusion.options import resolve

# Option dest names (also the ini keys).
BENCH = "fusion_bench"
PROVIDERS = "fusion_providers"
COMPILE_MODE = "fusion_compile_mode"
ROUNDS = "fusion_rounds"
MIN_TIME = "fusion_min_time"
MAX_ROUNDS = "fusion_max_rounds"
WARMUP = "fusion_warmup"
CASES = "fusion_cases"
SAVE = "fusion_save"
BASELINE_DIR = "fusion_baseline_dir"
TOLERANCE = "fusion_tolerance"
STRICT = "fusion_strict"
JSON = "fusion_json"
MARKDOWN = "fusion_markdown"
PLOT = "fusion_plot"
BENCHMARK_JSON = "fusion_benchmark_json"
CPU_CLOCK = "fusion_cpu_clock"
LOCK_TIMEOUT = "fusion_lock_timeout"

DEFAULT_TOLERANCE = 0.05
DEFAULT_BASELINE_DIR = "baselines"
STEP_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"


# ---- argparse types: a bad value is a usage error at parse time ---------------------------------

def boolean(text: str) -> bool:
    """argparse/ini type: true/false, 1/0, yes/no, on/off."""
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def tolerance(text: str) -> float:
    """argparse type: a fraction in [0, 1), e.g. 0.05 for 5%."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction such as 0.05, got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1) (0.05 = 5%), got {value}")
    return value


def seconds(text: str) -> float:
    """argparse type: a finite number of seconds >= 0, e.g. 0.05."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds such as 0.05, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds >= 0, got {value}")
    return value


def provider_list(text: str) -> tuple[str, ...]:
    """argparse type: ``all`` or comma-separated provider names, e.g. ``eager,liger``."""
    names = tuple(n.strip() for n in str(text).split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError("expected 'all' or comma-separated provider names")
    if "all" in names and len(names) > 1:
        raise argparse.ArgumentTypeError("'all' cannot be combined with other provider names")
    bad = [n for n in names if not re.fullmatch(r"[A-Za-z_][\w.-]*", n)]
    if bad:
        raise argparse.ArgumentTypeError(f"bad provider name(s) {bad}")
    return names


def compile_mode(text: str) -> str:
    """argparse type: a torch.compile mode (``default`` = mode=None)."""
    from pytest_fusion.bench.providers import COMPILE_MODES

    if text not in COMPILE_MODES:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(COMPILE_MODES)}, got {text!r}")
    return text


def cpu_clock(text: str) -> str:
    """argparse type: ``wall`` or ``process`` (see ``bench.timing.CPU_CLOCKS``)."""
    from pytest_fusion.bench.timing import CPU_CLOCKS

    if text not in CPU_CLOCKS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(CPU_CLOCKS)}, got {text!r}")
    return text


def case_globs(text: str) -> tuple[str, ...]:
    """argparse type: comma-separated globs matched against ``<case>`` or ``<case>-<dtype>``."""
    globs = tuple(g.strip() for g in str(text).split(",") if g.strip())
    if not globs:
        raise argparse.ArgumentTypeError("expected comma-separated case-name globs, e.g. 'decode*,gpt2-*'")
    return globs


_OPTIONS: list[tuple[str, str, dict[str, Any], str]] = [
    ("--fusion-bench", BENCH, {"action": "store_true"}, "time the bench cases of fused_kernel tests against eager, torch.compile and extra baselines, and gate them against the stored baseline (ini: true/false)"),
    ("--fusion-providers", PROVIDERS, {"type": provider_list, "metavar": "LIST"}, "providers timed beside the kernel: 'all' (default: eager, compile and the marker's baselines) or e.g. 'eager,liger'"),
    ("--fusion-compile-mode", COMPILE_MODE, {"type": compile_mode, "metavar": "MODE"}, "torch.compile mode of the compile provider: default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs (default: default)"),
    ("--fusion-rounds", ROUNDS, {"type": options.positive_int, "metavar": "N"}, "minimum timed rounds per case, each provider once per round in rotating order (default 30)"),
    ("--fusion-min-time", MIN_TIME, {"type": seconds, "metavar": "SECONDS"}, "add rounds until every provider's samples sum to this many seconds, so a microsecond kernel's median rests on as much time as a slow one's; 0 = exactly --fusion-rounds (default 0.05)"),
    ("--fusion-max-rounds", MAX_ROUNDS, {"type": options.positive_int, "metavar": "N"}, "most rounds --fusion-min-time may lead to; must be >= --fusion-rounds (default 1000, or --fusion-rounds when that is larger)"),
    ("--fusion-warmup", WARMUP, {"type": options.non_negative_int, "metavar": "N"}, "untimed warm-up calls per provider after the cold-start call (default 5)"),
    ("--fusion-cpu-clock", CPU_CLOCK, {"type": cpu_clock, "metavar": "wall|process"}, "clock of CPU timings: wall (perf_counter, default) or process (CPU time of the process: steady on a shared runner, but blind to multi-thread speedups)"),
    ("--fusion-cases", CASES, {"type": case_globs, "metavar": "GLOBS"}, "time only bench cases whose '<case>' or '<case>-<dtype>' matches one of these comma-separated globs"),
    ("--fusion-save", SAVE, {"action": "store_true"}, "merge this run's measurements into baselines/<device>.json (atomically)"),
    ("--fusion-baseline-dir", BASELINE_DIR, {"metavar": "DIR"}, "directory of the baseline files (default: baselines/ under the rootdir)"),
    ("--fusion-tolerance", TOLERANCE, {"type": tolerance, "metavar": "FRACTION"}, "a case fails when its speedup < stored x (1 - FRACTION); a marker's tolerance wins (default 0.05)"),
    ("--fusion-strict", STRICT, {"action": "store_true"}, "fail bench cases that have no stored baseline (for CI) instead of reporting them as new"),
    ("--fusion-json", JSON, {"metavar": "PATH"}, "write every bench record to this JSON file"),
    ("--fusion-markdown", MARKDOWN, {"metavar": "PATH"}, f"write the Markdown summary here (it is appended to ${STEP_SUMMARY_ENV} whenever that is set)"),
    ("--fusion-plot", PLOT, {"metavar": "DIR"}, "write a PNG per kernel of speedup against M into DIR (needs matplotlib)"),
    ("--fusion-lock-timeout", LOCK_TIMEOUT, {"type": seconds, "metavar": "SECONDS"}, f"how long a bench case waits for another process timing on the same device (per-user lock) before it fails naming the holder (default {DEFAULT_TIMING_LOCK_TIMEOUT_S:g})"),
    ("--fusion-benchmark-json", BENCHMARK_JSON, {"metavar": "PATH"}, "write GPU (or CPU) times in pytest-benchmark's JSON format, for `pytest-benchmark compare`"),
]


def addoption(parser: pytest.Parser, group: Any) -> None:
    """Add the bench options to ``group`` and each as an ini key named like its dest."""
    for flag, dest, kwargs, help_text in _OPTIONS:
        group.addoption(flag, dest=dest, default=None, help=help_text, **kwargs)
        parser.addini(dest, help_text)


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    """The bench options after precedence (CLI > ini > default), resolved once per session."""

    bench: bool
    providers: tuple[str, ...] | None
    compile_mode: str
    rounds: int
    warmup: int
    min_time_s: float
    max_rounds: int
    cases: tuple[str, ...] | None
    save: bool
    baseline_dir: Path
    tolerance: float
    strict: bool
    json: str | None
    markdown: str | None
    plot: str | None
    benchmark_json: str | None
    cpu_clock: str = "wall"
    lock_timeout_s: float = DEFAULT_TIMING_LOCK_TIMEOUT_S


DECLARED_OUTPUT = "pytest_fusion_declared"
"""Key of a worker's collected declarations in xdist's ``workeroutput``."""

OPTIONS_KEY = pytest.StashKey[BenchOptions]()
SESSION_KEY = pytest.StashKey["BenchSession"]()


def read_options(config: pytest.Config) -> BenchOptions:
    """The one place each bench setting's source is decided: CLI, else ini, else default.

    ``max_rounds`` given (CLI or ini) below ``rounds`` is an error; left at its default it is
    raised to ``rounds``, since asking for N rounds must not need a second option.

    Raises:
        pytest.UsageError: an ini value fails the same validation as the command line's, or
            max_rounds < rounds.
    """
    from pytest_fusion.bench.runner import DEFAULT_MAX_ROUNDS, DEFAULT_MIN_TIME_S, DEFAULT_ROUNDS, DEFAULT_WARMUP

    def get(dest: str, default: Any, convert: Callable[[str], Any] = str) -> Any:
        return resolve(config, dest, default=default, convert=convert)

    base = get(BASELINE_DIR, None)
    providers = get(PROVIDERS, ("all",), provider_list)
    rounds = get(ROUNDS, DEFAULT_ROUNDS, options.positive_int)
    max_rounds = get(MAX_ROUNDS, None, options.positive_int)
    if max_rounds is None:
        max_rounds = max(DEFAULT_MAX_ROUNDS, rounds)
    elif max_rounds < rounds:
        raise pytest.UsageError(
            f"pytest-fusion: --fusion-max-rounds (or ini {MAX_ROUNDS}) is {max_rounds}, below "
            f"--fusion-rounds ({rounds}): the cap on rounds must be at least their minimum")
    return BenchOptions(
        bench=bool(get(BENCH, False, boolean)),
        providers=None if providers == ("all",) else providers,
        compile_mode=get(COMPILE_MODE, "default", compile_mode),
        rounds=rounds,
        warmup=get(WARMUP, DEFAULT_WARMUP, options.non_negative_int),
        min_time_s=get(MIN_TIME, DEFAULT_MIN_TIME_S, seconds),
        max_rounds=max_rounds,
        cases=get(CASES, None, case_globs),
        save=bool(get(SAVE, False, boolean)),
        baseline_dir=Path(config.rootpath, base) if base else Path(config.rootpath, DEFAULT_BASELINE_DIR),
        tolerance=get(TOLERANCE, DEFAULT_TOLERANCE, tolerance),
        strict=bool(get(STRICT, False, boolean)),
        json=get(JSON, None),
        markdown=get(MARKDOWN, None),
        plot=get(PLOT, None),
        benchmark_json=get(BENCHMARK_JSON, None),
        cpu_clock=get(CPU_CLOCK, "wall", cpu_clock),
        lock_timeout_s=get(LOCK_TIMEOUT, DEFAULT_TIMING_LOCK_TIMEOUT_S, seconds),
    )


def _options(config: pytest.Config) -> BenchOptions:
    opts = config.stash.get(OPTIONS_KEY, None)
    if opts is None:
        opts = config.stash[OPTIONS_KEY] = read_options(config)
    return opts


def enabled(config: pytest.Config) -> bool:
    """Whether bench items are generated (``--fusion-bench`` or ini ``fusion_bench = true``)."""
    return _options(config).bench


def selected(config: pytest.Config, case: Any, dtype: str) -> bool:
    """Whether ``--fusion-cases`` selects this bench case (all when not given)."""
    globs = _options(config).cases
    if globs is None:
        return True
    return any(fnmatch.fnmatchcase(case.name, g) or fnmatch.fnmatchcase(f"{case.name}-{dtype}", g) for g in globs)


# ---- one GPU per xdist worker, one timing per device at a time ----------------------------------

def visible_gpus() -> list[str]:
    """CUDA device ids visible to this process, judged without importing torch (which would fix
    ``CUDA_VISIBLE_DEVICES`` for the process once CUDA initialises)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
    return sorted((p[len("/dev/nvidia"):] for p in glob.glob("/dev/nvidia[0-9]*")), key=int)


def pin_worker(config: pytest.Config) -> str | None:
    """On an xdist worker with several GPUs visible, keep one: ``gwN`` gets the N-th (mod count).

    Returns the device id kept, or None when nothing was changed (no xdist, <= 1 GPU). The worker
    id comes from ``config.workerinput`` or, before that exists (``pytest_load_initial_conftests``,
    the point at which no conftest can have touched CUDA yet), from ``$PYTEST_XDIST_WORKER``,
    which xdist sets before the worker's config is made.
    """
    workerinput = getattr(config, "workerinput", None) or {}
    worker = workerinput.get("workerid") or os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return None
    gpus = visible_gpus()
    if len(gpus) <= 1:
        return None
    index = int(re.sub(r"\D", "", str(worker)) or 0)
    chosen = gpus[index % len(gpus)]
    os.environ["CUDA_VISIBLE_DEVICES"] = chosen
    return chosen


def device_lock(device: str, *, timeout: float = DEFAULT_TIMING_LOCK_TIMEOUT_S, holder: str = "") -> Any:
    """An inter-process lock for ``device`` (:func:`pytest_fusion.locks.timing_lock`: per user,
    waits ``timeout`` seconds, then fails naming the holder), so that two xdist workers sharing a
    GPU, or the CPU, never time at the same moment."""
    from pytest_fusion.locks import timing_lock

    if str(device).startswith("cuda"):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        index = str(device).partition(":")[2] or "0"
        ids = [d.strip() for d in visible.split(",") if d.strip()]
        ident = "gpu-" + (ids[int(index)] if index.isdigit() and int(index) < len(ids) else index)
    else:
        ident = "cpu"
    return timing_lock(ident, timeout=timeout, holder=holder)


def configure(config: pytest.Config) -> None:
    """Resolve options, pin an xdist worker to its GPU, and register the bench session in bench mode."""
    opts = config.stash[OPTIONS_KEY] = read_options(config)
    if not opts.bench:
        return
    pin_worker(config)
    session = BenchSession(config, opts)
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(session, "pytest-fusion-bench")


# ---- the session: per-device baselines in, records out -------------------------------------------

class BenchSession:
    """Collects records (from this process or, under xdist, from the workers' reports), then saves
    the baselines and writes the reports once, on the controller."""

    def __init__(self, config: pytest.Config, opts: BenchOptions) -> None:
        self.config = config
        self.opts = opts
        self.records: list[Any] = []
        self._stores: dict[str, Any] = {}
        self._envs: dict[str, dict[str, Any]] = {}
        self._timers: dict[str, Any] = {}
        self.peaks: dict[Any, Any] = {}  # measured device peaks, see bench.peaks.cached_peaks
        self.errors: list[str] = []
        self.saved: list[str] = []
        # {test id: [(case, dtype)]} of the collected fused_kernel tests and the number of bench
        # items (plugin.declared_bench_cases); on the controller of an xdist run, from the workers.
        self.declared: dict[str, list[tuple[str, str]]] = {}
        self.bench_items = 0
        self.stale: list[str] = []

    @property
    def is_worker(self) -> bool:
        return hasattr(self.config, "workerinput")

    def stored(self, slug: str) -> Any:
        """The loaded baseline file for ``slug`` (None when absent); raises FusionUsageError."""
        if slug not in self._stores:
            from pytest_fusion import baselines

            self._stores[slug] = baselines.load(baselines.baseline_path(self.opts.baseline_dir, slug))
        return self._stores[slug]

    def env(self, device: str, method: str) -> dict[str, Any]:
        key = f"{device}/{method}"
        if key not in self._envs:
            from pytest_fusion import baselines

            self._envs[key] = baselines.current_env(device, method, str(self.config.rootpath),
                                                    str(self.opts.baseline_dir))
        return self._envs[key]

    def default_timer(self, device: str) -> Any:
        """One default timer per device for the session (a CUDA timer holds a 256 MB flush buffer)."""
        if device not in self._timers:
            from pytest_fusion.bench import timing

            self._timers[device] = timing.default_timer(device, self.opts.cpu_clock)
        return self._timers[device]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        from pytest_fusion.bench.record import USER_PROPERTY, BenchRecord

        for key, value in report.user_properties:
            if key == USER_PROPERTY:
                self.records.append(BenchRecord.from_dict(value))

    # ---- glue for stale entries (issue 19): collected declarations in, stale entries out --------

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        from pytest_fusion.plugin import declared_bench_cases

        self.declared, self.bench_items = declared_bench_cases(session.items)
        if self.is_worker:  # sent to the controller with the worker's end (pytest_testnodedown)
            self.config.workeroutput[DECLARED_OUTPUT] = {"declared": self.declared, "bench_items": self.bench_items}

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        out = getattr(node, "workeroutput", {}).get(DECLARED_OUTPUT)
        if out:  # every worker collects every test: their declarations agree
            self.declared.update({k: [tuple(c) for c in v] for k, v in out["declared"].items()})
            self.bench_items = max(self.bench_items, out["bench_items"])

    def _check_stale(self) -> None:
        """List stored entries of collected tests that no longer declare them; --fusion-strict
        fails them, and a --fusion-cases that selected no bench case."""
        from pytest_fusion import baselines
        from pytest_fusion.spec import FusionUsageError

        if self.opts.strict and self.opts.cases and self.declared and not self.bench_items:
            self.errors.append(f"--fusion-cases {','.join(self.opts.cases)} matched no bench case of the "
                               f"collected tests (--fusion-strict)")
        for slug in sorted(set(self._stores) | {r.device for r in self.records}):
            try:
                data = self.stored(slug)
            except FusionUsageError:
                continue  # already reported by every bench item of that device
            path = baselines.baseline_path(self.opts.baseline_dir, slug)
            for kernel, case, dtype in baselines.stale_entries(self.declared, data):
                line = (f"stale baseline entry in {path}: {kernel} [{case}-{dtype}] (the test no longer "
                        f"declares this case; delete the entry or restore the case)")
                (self.errors if self.opts.strict else self.stale).append(
                    line + (" (--fusion-strict)" if self.opts.strict else ""))

    def _write_reports(self) -> None:
        """Each report on its own: one that cannot be written is one error line, the rest are
        still written."""
        from pytest_fusion import report

        writers: list[tuple[Callable[[], Any], str]] = []
        if self.opts.json:
            writers.append((lambda: report.write_json(self.opts.json, self.records), "--fusion-json"))
        md_target = os.environ.get(STEP_SUMMARY_ENV)
        if md_target:
            writers.append((lambda: report.write_markdown(md_target, self.records, append=True), f"${STEP_SUMMARY_ENV}"))
        if self.opts.markdown:
            writers.append((lambda: report.write_markdown(self.opts.markdown, self.records), "--fusion-markdown"))
        if self.opts.plot:
            writers.append((lambda: report.write_plots(self.opts.plot, self.records), "--fusion-plot"))
        if self.opts.benchmark_json:
            writers.append((lambda: report.write_benchmark_json(self.opts.benchmark_json, self.records),
                            "--fusion-benchmark-json"))
        for write, option in writers:
            try:
                write()
            except report.ReportError as exc:
                self.errors.append(f"{option}: {exc}")
            except ImportError as exc:
                self.errors.append(f"{option} needs matplotlib ({exc})")

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.is_worker:
            return
        self._check_stale()
        if self.records:
            self._save_and_report()
        if self.errors and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _save_and_report(self) -> None:
        from pytest_fusion import baselines
        from pytest_fusion.spec import FusionUsageError

        if self.opts.save:
            # A record too noisy to judge would be as useless for judging later runs: not saved,
            # whether it had a baseline (and failed) or is new (and passed). The rest of the file
            # is still written. A record that failed the gate otherwise is saved: --fusion-save
            # means "re-baseline from this run".
            by_slug: dict[str, list[Any]] = {}
            for rec in self.records:
                if rec.noisy:
                    self.errors.append(
                        f"not saved, too noisy to judge: {rec.kernel} [{rec.case}-{rec.dtype}] "
                        f"(its stored entry, if any, is unchanged; re-run on a quieter machine or "
                        f"with more --fusion-rounds / --fusion-min-time)")
                    continue
                try:
                    baselines.check_saveable(rec)
                except ValueError as exc:
                    self.errors.append(f"not saved: {exc}")
                    continue
                by_slug.setdefault(rec.device, []).append(rec)
            for slug, recs in sorted(by_slug.items()):
                try:
                    path = baselines.save(self.opts.baseline_dir, slug, recs)
                    self.saved.append(f"{path} ({len(recs)} case(s) saved)")
                except (FusionUsageError, OSError) as exc:
                    self.errors.append(f"not saved: {exc}")
        self._write_reports()

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.is_worker:
            return
        from pytest_fusion import baselines, report

        tr = terminalreporter
        if not self.records and not self.errors and not self.stale:
            return
        tr.section("pytest-fusion bench")
        for line in report.terminal_lines(self.records):
            tr.write_line(line)
        for slug in sorted({r.device for r in self.records}):
            path = baselines.baseline_path(self.opts.baseline_dir, slug)
            others = baselines.other_device_files(self.opts.baseline_dir, slug)
            if not path.exists() and others:
                tr.write_line(
                    f"pytest-fusion: no baseline file for this device ({path.name}) in {self.opts.baseline_dir}; "
                    f"files exist for other devices: {', '.join(others)}. Cases are reported as new.",
                    yellow=True,
                )
        for line in self.saved:
            tr.write_line(f"pytest-fusion: baseline written: {line}")
        for line in self.stale:
            tr.write_line(f"pytest-fusion: {line}", yellow=True)
        for err in self.errors:
            tr.write_line(f"pytest-fusion: ERROR {err}", red=True)


def _session(config: pytest.Config) -> BenchSession:
    s = config.stash.get(SESSION_KEY, None)
    if s is None:  # bench_call from a fixture without --fusion-bench registered nothing
        s = BenchSession(config, _options(config))
        config.stash[SESSION_KEY] = s
    return s


# ---- timing one case ---------------------------------------------------------------------------

def _device_for(spec_device: str | None) -> str:
    if spec_device:
        return spec_device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _work(value: Any, dims: Mapping[str, int], **extra: Any) -> float | None:
    if value is None:
        return None
    if callable(value):
        from pytest_fusion.spec import call_with_dims

        return call_with_dims(value, dims, **extra)
    return float(value)


def _bench(
    item: pytest.Item, *, kernel_id: str, case: str, dtype: str, dims: Mapping[str, int], device: str,
    kernel: Callable[..., Any], reference: Callable[..., Any], inputs: Sequence[Any],
    constants: Mapping[str, Any] | None, baselines_: Mapping[str, Callable[..., Any]] | None,
    flops: float | None, nbytes: float | None, min_speedup: Mapping[str, float] | None,
    tolerance_: float | None,
) -> Any:
    from pytest_fusion import baselines
    from pytest_fusion.bench import peaks as _peaks
    from pytest_fusion.bench import runner
    from pytest_fusion.bench.record import USER_PROPERTY
    from pytest_fusion.spec import FusionUsageError

    config = item.config
    sess = _session(config)
    opts = sess.opts
    timer = config.hook.pytest_fusion_make_timer(config=config, device=device) or sess.default_timer(device)
    slug = baselines.device_slug(device)
    # pytest.fail outside the except clause: raised inside it, the message is printed again under
    # "During handling of the above exception, another exception occurred".
    try:
        data = sess.stored(slug)
    except FusionUsageError as exc:
        bad_file: str | None = str(exc)
    else:
        bad_file = None
    if bad_file:
        pytest.fail(bad_file, pytrace=False)
    stored = baselines.stored_case(data, kernel_id, case, dtype)
    settings = runner.Settings(rounds=opts.rounds, warmup=opts.warmup, min_time_s=opts.min_time_s,
                               max_rounds=opts.max_rounds, providers=opts.providers,
                               compile_mode=opts.compile_mode, tolerance=opts.tolerance, strict=opts.strict)
    env = sess.env(device, timer.method)
    from pytest_fusion.locks import LockTimeout

    bad_value: str | None = None
    try:
        with device_lock(device, timeout=opts.lock_timeout_s, holder=item.nodeid):
            peaks = None
            # % of peak only on a GPU: a CPU's "peak" from one torch matmul in fp16 is far below what a
            # kernel computing in fp32 reaches (seen: 5637% of a 0.0027 TFLOP/s fp16 CPU "peak").
            if (flops is not None or nbytes is not None) and str(device).startswith("cuda"):
                peaks = _peaks.cached_peaks(getattr(config, "cache", None), slug, device, dtype, timer, sess.peaks)
            try:
                rec = runner.run_case(
                    kernel_id=kernel_id, case=case, dtype=dtype, dims=dims, device_slug=slug,
                    kernel=kernel, reference=reference, inputs=inputs, timer=timer, settings=settings,
                    constants=constants, baselines=baselines_, flops=flops, nbytes=nbytes,
                    min_speedup=min_speedup, tolerance=tolerance_, stored=stored, peaks=peaks, env=env,
                    where=str(baselines.baseline_path(opts.baseline_dir, slug)),
                )
            except ValueError as exc:
                bad_value = f"{item.nodeid}: {exc}"
    except LockTimeout as exc:  # only the wait raises it: the body catches its own errors above
        bad_value = f"{item.nodeid}: not timed: {exc}"
    if bad_value:
        pytest.fail(bad_value, pytrace=False)
    item.user_properties.append((USER_PROPERTY, rec.to_dict()))
    if rec.status == "fail":
        pytest.fail(f"{kernel_id} [{case}-{dtype}] failed the performance gate:\n  " + "\n  ".join(rec.reasons),
                    pytrace=False)
    return rec


def run_bench_item(item: pytest.Item, spec: Any, kernel: Callable[..., Any], case: Any, dtype: str) -> Any:
    """Time one bench case of a ``fused_kernel`` test, gate it and record it (see module docstring).

    Skips a Triton kernel when no CUDA device is visible (interpreter timings are not kernel
    timings) and a ``device="cuda"`` kernel likewise. Fails the test with the gate's reasons.
    """
    import torch

    from pytest_fusion import baselines
    from pytest_fusion.oracle import FusionFailure, check_inputs, describe_case
    from pytest_fusion.tensors import Case, make_inputs, torch_dtype

    if not torch.cuda.is_available():
        if spec.triton:
            pytest.skip("bench of a Triton kernel needs a CUDA device: timings under the Triton "
                        "interpreter are not kernel timings (a kernel with no Triton code: mark it "
                        "triton=False to time it on the CPU)")
        if spec.device and str(spec.device).startswith("cuda"):
            pytest.skip(f"bench needs a CUDA device (the kernel declares device={spec.device!r}); none is visible")
    device = _device_for(spec.device)
    bench_case = Case(dims=case.dims, dtype=dtype, layouts={}, seed=0)
    inputs = make_inputs(spec, bench_case, device)
    # A kernel wrong at this shape must not be timed, let alone saved as a baseline: check it once
    # on the very inputs that will be timed.
    try:
        check_inputs(spec, kernel, list(inputs.values()), context=describe_case(bench_case))
    except FusionFailure as exc:
        failure = f"not timed: the kernel fails its correctness check at bench case {case.name!r}\n{exc}"
    else:
        failure = None
    if failure:
        pytest.fail(failure, pytrace=False)
    itemsize = torch_dtype(dtype).itemsize
    return _bench(
        item, kernel_id=baselines.test_id(item.nodeid, f"bench-{case.name}-{dtype}"), case=case.name, dtype=dtype, dims=case.dims, device=device, kernel=kernel,
        reference=spec.reference, inputs=tuple(inputs.values()), constants=spec.constants,
        baselines_=spec.baselines, flops=_work(spec.flops, case.dims),
        nbytes=_work(spec.bytes, case.dims, itemsize=itemsize), min_speedup=spec.min_speedup,
        tolerance_=spec.tolerance,
    )


def bench_call(
    item: pytest.Item, name: str, kernel: Callable[..., Any], inputs: Sequence[Any], *,
    reference: Callable[..., Any], baselines: Mapping[str, Callable[..., Any]] | None = None,
    constants: Mapping[str, Any] | None = None, flops: Any = None, bytes: Any = None,
    min_speedup: float | Mapping[str, float] | None = None, tolerance: float | None = None,
    dims: Mapping[str, int] | None = None,
) -> Any:
    """Time ``kernel(*inputs, **constants)`` as bench case ``name`` of ``item`` and gate it.

    Args:
        inputs: tensors, all on one device (it is the timing device); the first floating one's
            dtype names the case's dtype.
        flops, bytes: numbers, or callables of ``dims``; ``bytes`` None means inputs + outputs.
        min_speedup: a floor against eager, or ``{provider: floor}``.
        dims: sizes (ints >= 0) shown in reports and plots and stored with the baseline; a
            stored entry with other dims fails the gate until re-saved (default
            ``{"M": inputs[0].shape[0]}``).

    Returns:
        The :class:`~pytest_fusion.bench.record.BenchRecord`.

    Raises:
        pytest.fail.Exception: the gate failed, or bad arguments (named).
    """
    tensors = [t for t in inputs if hasattr(t, "dtype")]
    if not tensors:
        pytest.fail(f"fusion.bench({name!r}): inputs must contain at least one tensor", pytrace=False)
    floating = [t for t in tensors if t.dtype.is_floating_point] or tensors
    dtype = str(floating[0].dtype).replace("torch.", "")
    device = str(tensors[0].device)
    if dims is None:
        dims = {"M": int(tensors[0].shape[0])} if tensors[0].dim() else {}
    # Sizes are stored in the baseline and compared by the gate: anything else would be saved into
    # a file that the next run's load refuses.
    if not isinstance(dims, Mapping) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in dims.values()):
        pytest.fail(f"fusion.bench({name!r}): dims must be a {{symbol: int >= 0}} mapping, got {dims!r}",
                    pytrace=False)
    if isinstance(min_speedup, (int, float)):
        min_speedup = {"eager": float(min_speedup)}
    if tolerance is not None:
        try:
            tolerance = float(tolerance)
            from pytest_fusion.gate import check_tolerance

            check_tolerance(tolerance)
        except ValueError as exc:
            pytest.fail(f"fusion.bench({name!r}): {exc}", pytrace=False)
    return _bench(
        item, kernel_id=item.nodeid, case=name, dtype=dtype, dims=dict(dims), device=device, kernel=kernel, reference=reference,
        inputs=tuple(inputs), constants=constants, baselines_=baselines, flops=_work(flops, dims),
        nbytes=_work(bytes, dims), min_speedup=min_speedup, tolerance_=tolerance,
    )

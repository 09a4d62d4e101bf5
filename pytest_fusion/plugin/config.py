"""The run's settings: one frozen :class:`FusionConfig`, resolved once per session from the
command line, else the environment, else the ini file, else the default.

Every option is one :class:`Option` row of :data:`OPTIONS`: its flag, the :class:`FusionConfig`
field it fills, the converter that validates it (the same for all four sources) and a help text
whose default is read from the field, so the two cannot disagree. No torch import here: this
module is on the plugin's import path.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable

import pytest

from pytest_fusion.declare.spec import (
    COMPILE_MODES,
    CONFIG_TIER_BUDGET_S,
    CONFIG_TIER_CASES,
    DEFAULT_CPU_MAX_DIM,
    DEFAULT_MAX_EXAMPLES,
    DEFAULT_TOLERANCE,
    EXPLORE_BUDGET_S,
    EXPLORE_EXAMPLES,
)
from pytest_fusion.gate.cold_start import COLD_START_FLOOR_S, COLD_START_TOLERANCE
from pytest_fusion.gate.rule import REMEASURE_FACTOR
from pytest_fusion.machine.locks import DEFAULT_TIMING_LOCK_TIMEOUT_S
from pytest_fusion.measure.timers import CPU_CLOCKS
from pytest_fusion.measure.timing import (
    DEFAULT_MAX_ROUNDS,
    DEFAULT_MIN_TIME_S,
    DEFAULT_ROUNDS,
    DEFAULT_WARMUP,
)
from pytest_fusion.plugin.option_types import (
    boolean,
    case_globs,
    choice,
    non_negative_int,
    positive_int,
    provider_list,
    repro_case,
    seconds,
    tolerance,
)

INTERPRET_ENV = "PYTEST_FUSION_INTERPRET"
INTERPRET_CHOICES = ("auto", "on", "off")
REPLAY_ENV = "PYTEST_FUSION_REPLAY"
REPLAY_SETTINGS_ENV = "PYTEST_FUSION_REPLAY_OF"
"""Environment variable of a child process (a replayed case's, ``pytest_fusion.plugin.replay``, or a
sanitized one's, ``pytest_fusion.plugin.sanitize``): the parent run's :class:`FusionConfig` as JSON,
which the child uses in place of its own options (:func:`read`)."""
STEP_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"
SANITIZE_TOOLS = ("memcheck", "racecheck", "initcheck")
"""The compute-sanitizer tools ``--fusion-sanitize`` runs (``pytest_fusion.plugin.sanitize``)."""
DEFAULT_BASELINE_DIR = "baselines"


# ---- the configuration ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FusionConfig:
    """Every pytest-fusion setting after precedence (CLI > environment > ini > default)."""

    interpret: str = "auto"
    examples: int | None = None
    max_dim: int | None = None
    repro: dict[str, Any] | None = None
    all_configs: bool = False
    config_budget_s: float | None = None
    bench: bool = False
    providers: tuple[str, ...] | None = None
    compile_mode: str = "default"
    compile_builds: int | None = None
    rounds: int = DEFAULT_ROUNDS
    min_time_s: float = DEFAULT_MIN_TIME_S
    max_rounds: int | None = None
    warmup: int = DEFAULT_WARMUP
    cpu_clock: str = "wall"
    cases: tuple[str, ...] | None = None
    save: bool = False
    baseline_dir: str = DEFAULT_BASELINE_DIR
    tolerance: float = DEFAULT_TOLERANCE
    strict: bool = False
    json: str | None = None
    markdown: str | None = None
    plot: str | None = None
    benchmark_json: str | None = None
    lock_timeout_s: float = DEFAULT_TIMING_LOCK_TIMEOUT_S
    explore: bool = False
    explore_budget_s: float = EXPLORE_BUDGET_S
    explore_examples: int = EXPLORE_EXAMPLES
    replay: str = "on"
    sanitize: str | None = None
    cold_start: bool = False
    cold_start_tolerance: float = COLD_START_TOLERANCE

    def selects(self, case: str, dtype: str) -> bool:
        """Whether ``--fusion-cases`` selects bench case ``case`` in ``dtype`` (all when not given)."""
        if self.cases is None:
            return True
        return any(_case_matches(g, case, dtype) for g in self.cases)

    def unmatched_cases(self, declared: Iterable[tuple[str, str]]) -> tuple[str, ...]:
        """The ``--fusion-cases`` globs that select none of the ``declared`` ``(case, dtype)``
        pairs, in the option's order (none when it is not given)."""
        pairs = list(declared)
        return tuple(g for g in self.cases or () if not any(_case_matches(g, c, d) for c, d in pairs))

    def baseline_path(self, rootpath: Path) -> Path:
        """The baseline directory, relative paths taken from the rootdir."""
        return Path(rootpath, self.baseline_dir)


def _case_matches(glob: str, case: str, dtype: str) -> bool:
    """Whether one ``--fusion-cases`` glob matches bench case ``case`` in ``dtype``: as ``<case>``
    or as ``<case>-<dtype>``."""
    return fnmatch.fnmatchcase(case, glob) or fnmatch.fnmatchcase(f"{case}-{dtype}", glob)


DEFAULTS = FusionConfig()


@dataclasses.dataclass(frozen=True)
class Option:
    """One setting: ``--fusion-<flag>``, ini key and option dest ``fusion_<field with _>``."""

    flag: str
    field: str
    convert: Callable[[str], Any]
    help: str
    metavar: str | None = None
    env: str | None = None
    ini: bool = True

    @property
    def dest(self) -> str:
        return "fusion_" + self.flag.replace("-", "_")

    @property
    def switch(self) -> bool:
        return self.convert is boolean

    def help_text(self) -> str:
        return self.help.format(default=getattr(DEFAULTS, self.field))


OPTIONS = (
    Option(
        "interpret",
        "interpret",
        choice(INTERPRET_CHOICES),
        "run Triton kernels under the Triton interpreter: auto (default) turns it on when no CUDA "
        f"device is visible; also ${INTERPRET_ENV} and ini fusion_interpret.",
        "auto|on|off",
        INTERPRET_ENV,
    ),
    Option(
        "examples",
        "examples",
        positive_int,
        f"Hypothesis examples per fused_kernel test and dtype (default {DEFAULT_MAX_EXAMPLES}; a marker's "
        "max_examples wins).",
        "N",
    ),
    Option(
        "max-dim",
        "max_dim",
        non_negative_int,
        f"cap every drawn dim at N (default on the CPU: {DEFAULT_CPU_MAX_DIM} for Triton kernels, which "
        "the interpreter runs slowly; for triton=False kernels 2**18 elements per tensor instead); 0 "
        "removes every cap.",
        "N",
    ),
    Option(
        "repro",
        "repro",
        repro_case,
        "re-run exactly one case, as printed by a failure, instead of drawing cases.",
        "JSON",
        ini=False,
    ),
    Option(
        "all-configs",
        "all_configs",
        boolean,
        "check every config of each autotuned Triton kernel at every case, each pinned in turn "
        "(default: the autotuner's own pick on a GPU, the first config under the interpreter, and "
        "the config tier, --fusion-config-budget; ini: true/false).",
    ),
    Option(
        "config-budget",
        "config_budget_s",
        seconds,
        f"seconds per test and dtype for the config tier: once the search passes, its {CONFIG_TIER_CASES} "
        "smallest cases are checked at each autotune config pinned, in rotation from where the last run "
        f"stopped (default {CONFIG_TIER_BUDGET_S:g} on a GPU, 0 = off under the Triton interpreter)",
        "SECONDS",
    ),
    Option(
        "bench",
        "bench",
        boolean,
        "time the bench cases of fused_kernel tests against eager, torch.compile and extra providers, "
        "and gate them against the stored baseline (ini: true/false)",
    ),
    Option(
        "providers",
        "providers",
        provider_list,
        "providers timed beside the kernel: 'all' (default: eager, compile and the marker's providers) "
        "or e.g. 'eager,liger'; 'compile-<mode>' adds torch.compile in another mode, e.g. "
        "'eager,compile,compile-max-autotune-no-cudagraphs'",
        "LIST",
    ),
    Option(
        "compile-mode",
        "compile_mode",
        choice(COMPILE_MODES),
        f"torch.compile mode of the compile provider: {', '.join(COMPILE_MODES)} (default: {{default}}); "
        "a mode other than default is timed and stored as provider 'compile-<mode>'",
        "MODE",
    ),
    Option(
        "compile-builds",
        "compile_builds",
        positive_int,
        "independent torch.compile builds per compile provider, the fastest timed (default: 2 on a GPU, "
        "where Inductor's autotuning makes builds of one reference differ by several percent; 1 on the CPU)",
        "N",
    ),
    Option(
        "rounds",
        "rounds",
        positive_int,
        "minimum timed rounds per case, each provider once per round in rotating order (default {default})",
        "N",
    ),
    Option(
        "min-time",
        "min_time_s",
        seconds,
        "add rounds until every provider's samples sum to this many seconds, so a microsecond kernel's "
        "median rests on as much time as a slow one's; 0 = exactly --fusion-rounds (default {default})",
        "SECONDS",
    ),
    Option(
        "max-rounds",
        "max_rounds",
        positive_int,
        f"most rounds --fusion-min-time may lead to; must be >= --fusion-rounds "
        f"(default {DEFAULT_MAX_ROUNDS}, "
        "or --fusion-rounds when that is larger). A re-measure (a case too noisy to judge or below "
        f"its threshold) takes {REMEASURE_FACTOR}x each of --fusion-rounds, --fusion-min-time and this cap",
        "N",
    ),
    Option(
        "warmup",
        "warmup",
        non_negative_int,
        "untimed warm-up calls per provider after the cold-start call (default {default})",
        "N",
    ),
    Option(
        "cpu-clock",
        "cpu_clock",
        choice(tuple(CPU_CLOCKS)),
        "clock of CPU timings: wall (perf_counter, default) or process (CPU time of the process: steady "
        "on a shared runner, but blind to multi-thread speedups)",
        "wall|process",
    ),
    Option(
        "cases",
        "cases",
        case_globs,
        "time only bench cases whose '<case>' or '<case>-<dtype>' matches one of these comma-separated globs",
        "GLOBS",
    ),
    Option(
        "save", "save", boolean, "merge this run's measurements into baselines/<device>.json (atomically)"
    ),
    Option(
        "baseline-dir",
        "baseline_dir",
        str,
        "directory of the baseline files (default: {default}/ under the rootdir)",
        "DIR",
    ),
    Option(
        "tolerance",
        "tolerance",
        tolerance,
        "a case fails when its speedup < stored x (1 - FRACTION); a marker's tolerance wins "
        "(default {default})",
        "FRACTION",
    ),
    Option(
        "strict",
        "strict",
        boolean,
        "fail bench cases that have no stored baseline (for CI) instead of reporting them as new",
    ),
    Option("json", "json", str, "write every bench record to this JSON file", "PATH"),
    Option(
        "markdown",
        "markdown",
        str,
        f"write the Markdown summary here (it is appended to ${STEP_SUMMARY_ENV} whenever that is set)",
        "PATH",
    ),
    Option(
        "plot", "plot", str, "write a PNG per kernel of speedup against M into DIR (needs matplotlib)", "DIR"
    ),
    Option(
        "lock-timeout",
        "lock_timeout_s",
        seconds,
        "how long a bench case waits for another process timing on the same device (a per-user lock) "
        "before it fails naming the holder (default {default:g})",
        "SECONDS",
    ),
    Option(
        "benchmark-json",
        "benchmark_json",
        str,
        "write GPU (or CPU) times in pytest-benchmark's JSON format, for `pytest-benchmark compare`",
        "PATH",
    ),
    Option(
        "replay",
        "replay",
        choice(("on", "off")),
        "on (default): a case failing the gate on timing alone runs again in a fresh process, whose "
        "verdict stands (pytest_fusion.plugin.replay); off: the first verdict stands; also "
        f"${REPLAY_ENV} and ini fusion_replay.",
        "on|off",
        REPLAY_ENV,
    ),
    Option(
        "sanitize",
        "sanitize",
        choice(SANITIZE_TOOLS),
        "run a failing check case again (with -k or a node id, every selected check item too) under NVIDIA's "
        "compute-sanitizer with this tool, in a fresh process with PyTorch's caching allocator off, and put "
        "its first reports in the failure (pytest_fusion.plugin.sanitize); needs a CUDA GPU and "
        "compute-sanitizer",
        "|".join(SANITIZE_TOOLS),
        ini=False,
    ),
    Option("cold-start", "cold_start", boolean, "with --fusion-bench: time each provider's first call of "
           "each bench case in two fresh processes, with empty Triton and Inductor caches (cold) and then "
           "with the caches the first filled (warm), recorded beside the speedups "
           "(pytest_fusion.plugin.cold_start); with a stored figure, the kernel's are gated "
           "(--fusion-cold-start-tolerance)"),
    Option("cold-start-tolerance", "cold_start_tolerance", tolerance, "allowed growth of the kernel's cold "
           "and warm start over the stored ones, a fraction (default {default:g}), and at least "
           f"{COLD_START_FLOOR_S:g} s (pytest_fusion.gate.cold_start)", "FRACTION"),
    Option("explore", "explore", boolean, "add an explore item per fused_kernel test and dtype: search the "
           "declared dims for the shape with the lowest speedup over each provider and print a bench= entry "
           "for it (timed like --fusion-bench; nothing gated or saved)"),
    Option("explore-budget", "explore_budget_s", seconds, "seconds each explore item may spend, compiles and "
           "tunes of new shapes included (default {default:g})", "SECONDS"),
    Option("explore-examples", "explore_examples", positive_int, "most new shapes an explore item times "
           "searching, and again shrinking (default {default})", "N"),
)
OPTION = {o.field: o for o in OPTIONS}


def addoptions(parser: pytest.Parser) -> None:
    """Add every option to the ``fusion`` group and, but for ``--fusion-repro`` and
    ``--fusion-sanitize`` (one run's requests, not a project's settings), as an ini key."""
    group = parser.getgroup("fusion", "pytest-fusion: fused-kernel correctness and benchmarks")
    for o in OPTIONS:
        kwargs: dict[str, Any] = (
            {"action": "store_true"} if o.switch else {"type": o.convert, "metavar": o.metavar}
        )
        group.addoption(f"--fusion-{o.flag}", dest=o.dest, default=None, help=o.help_text(), **kwargs)
        if o.ini:
            parser.addini(o.dest, o.help_text())


def resolve(config: pytest.Config, option: Option) -> Any:
    """The value of ``option``: the command line, else its environment variable, else its ini key,
    else the :class:`FusionConfig` default. Environment and ini values pass through the option's
    converter, so they are validated as the command line's are.

    Raises:
        pytest.UsageError: an environment or ini value the converter rejects, naming where it came from.
    """
    cli = config.getoption(option.dest, default=None)
    if cli is None:  # before pytest_configure only the early parse has it (load_initial_conftests)
        cli = getattr(getattr(config, "known_args_namespace", None), option.dest, None)
    if cli is not None:
        return cli
    sources = []
    if option.env and os.environ.get(option.env, "").strip():
        sources.append((f"environment variable {option.env}", os.environ[option.env]))
    ini = config.getini(option.dest) if option.ini else None
    if ini not in (None, "", []):
        sources.append((f"ini option {option.dest}", str(ini)))
    for where, raw in sources:
        try:
            return option.convert(raw)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise pytest.UsageError(f"pytest-fusion: bad value {raw!r} in {where}: {exc}") from None
    return getattr(DEFAULTS, option.field)


def read(config: pytest.Config) -> FusionConfig:
    """Resolve every option once (:func:`resolve`).

    Raises:
        pytest.UsageError: a bad environment or ini value, ``max_rounds`` below ``rounds``,
            ``save`` or ``cold_start`` without ``bench``, or a replay's settings variable that holds none
            (:func:`replayed_settings`).
    """
    replayed = replayed_settings()  # a replay's child runs with the failing run's settings
    if replayed is not None:
        return replayed
    cfg = FusionConfig(**{o.field: resolve(config, o) for o in OPTIONS})
    if cfg.save and not cfg.bench:  # else it saved nothing, said nothing and exited 0
        raise pytest.UsageError(
            "pytest-fusion: --fusion-save (or ini fusion_save) stores what a --fusion-bench run measures, "
            "and this run measures nothing: add --fusion-bench"
        )
    if cfg.cold_start and not cfg.bench:
        raise pytest.UsageError(
            "pytest-fusion: --fusion-cold-start (or ini fusion_cold_start) times the first calls of bench "
            "cases, and this run times none: add --fusion-bench"
        )
    if cfg.max_rounds is not None and cfg.max_rounds < cfg.rounds:
        raise pytest.UsageError(
            f"pytest-fusion: --fusion-max-rounds (or ini fusion_max_rounds) is {cfg.max_rounds}, below "
            f"--fusion-rounds ({cfg.rounds}): the cap on rounds must be at least their minimum"
        )
    return cfg


def replayed_settings() -> FusionConfig | None:
    """The settings a replayed case's child runs with (:data:`REPLAY_SETTINGS_ENV`), None in any
    other process.

    Raises:
        pytest.UsageError: the variable holds no settings of this pytest-fusion (set by hand?).
    """
    raw = os.environ.get(REPLAY_SETTINGS_ENV)
    if not raw:
        return None
    try:
        fields = json.loads(raw)
        for name in ("providers", "cases"):
            if fields.get(name) is not None:
                fields[name] = tuple(fields[name])
        return FusionConfig(**fields)
    except (TypeError, ValueError) as exc:
        raise pytest.UsageError(
            f"pytest-fusion: ${REPLAY_SETTINGS_ENV} is set but holds no pytest-fusion settings ({exc}); it "
            "is meant only for the child process of a replayed gate failure or of --fusion-sanitize: unset it"
        ) from None


KEY = pytest.StashKey[FusionConfig]()


def of(config: pytest.Config) -> FusionConfig:
    """The session's :class:`FusionConfig` (resolved in ``pytest_configure``; resolved here when a
    plugin loaded late asks first)."""
    cfg = config.stash.get(KEY, None)
    if cfg is None:
        cfg = config.stash[KEY] = read(config)
    return cfg

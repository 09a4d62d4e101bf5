"""The pytest plugin: the ``fused_kernel`` marker, the ``fusion`` fixture and their options.

A thin shell: specs come from :mod:`pytest_fusion.spec`, the property test from
:mod:`pytest_fusion.check`, timing and the gate from :mod:`pytest_fusion.bench_plugin`. Nothing
heavy is imported at import time: torch and triton load when a marked test runs.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pytest

from pytest_fusion import bench_plugin, interpreter, options
from pytest_fusion.spec import MARKER_SIGNATURE, BenchCase, FusionUsageError, KernelSpec, make_spec

if TYPE_CHECKING:
    from pytest_fusion.fixture import Fusion
    from pytest_fusion.tensors import Case

PARAM = "_fusion_item"
"""Pseudo-fixture by which a marked test is parametrized into its check and bench items."""

MARKER_HELP = (
    f"{MARKER_SIGNATURE}: check the kernel the test returns against `reference` over "
    "Hypothesis-drawn dims, dtypes and layouts (one item per dtype); with --fusion-bench also time "
    "each `bench` case against eager and torch.compile and gate it against baselines/. "
    "Arguments: pytest_fusion.spec.MARKER_ARGS."
)


@dataclasses.dataclass(frozen=True)
class CheckItem:
    """A correctness item: the property test in one dtype."""

    dtype: str

    @property
    def id(self) -> str:
        return self.dtype


@dataclasses.dataclass(frozen=True)
class BenchItem:
    """A benchmark item: one bench case in one dtype."""

    case: BenchCase
    dtype: str

    @property
    def id(self) -> str:
        return f"bench-{self.case.name}-{self.dtype}"


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """Settings resolved once per session (CLI > env > ini > default)."""

    interpreter: str
    max_examples: int | None
    max_dim: int | None
    repro: dict[str, Any] | None


SETTINGS_KEY = pytest.StashKey[RunSettings]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fusion", "pytest-fusion: fused-kernel correctness and benchmarks")
    group.addoption(
        "--fusion-interpret", dest=options.INTERPRET, type=options.interpret_mode, default=None,
        metavar="auto|on|off",
        help="run Triton kernels under the Triton interpreter: auto (default) turns it on when no "
        f"CUDA device is visible; also ${options.INTERPRET_ENV} and ini {options.INTERPRET}.",
    )
    group.addoption(
        "--fusion-examples", dest=options.EXAMPLES, type=options.positive_int, default=None, metavar="N",
        help="Hypothesis examples per fused_kernel test and dtype (default 25; a marker's "
        "max_examples wins).",
    )
    group.addoption(
        "--fusion-max-dim", dest=options.MAX_DIM, type=options.non_negative_int, default=None, metavar="N",
        help="cap every drawn dim at N when the kernel runs on the CPU (default 64: the Triton "
        "interpreter is slow); 0 removes the cap.",
    )
    group.addoption(
        "--fusion-repro", dest=options.REPRO, default=None, metavar="JSON",
        help="re-run exactly one case, as printed by a failure, instead of drawing cases.",
    )
    parser.addini(options.INTERPRET, "Triton interpreter: auto, on or off (default auto)")
    parser.addini(options.EXAMPLES, "Hypothesis examples per fused_kernel test and dtype")
    parser.addini(options.MAX_DIM, "cap on drawn dims for kernels run on the CPU (0: none)")
    bench_plugin.addoption(parser, group)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_fusion import hooks

    pluginmanager.add_hookspecs(hooks)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    # Runs before any conftest.py is imported: the last moment TRITON_INTERPRET can take effect,
    # and the safe moment to pin an xdist worker to its GPU (no conftest has initialised CUDA yet).
    bench_plugin.pin_worker(early_config)
    mode = options.resolve(early_config, options.INTERPRET, default="auto",
                           convert=options.interpret_mode, env=options.INTERPRET_ENV)
    early_config.stash[SETTINGS_KEY] = RunSettings(interpreter.apply(mode), None, None, None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)
    early = config.stash.get(SETTINGS_KEY, None)
    if early is None:  # plugin loaded late (e.g. -p from a conftest): too late to switch Triton
        early = RunSettings(interpreter.apply("auto"), None, None, None)
    repro_text = config.getoption(options.REPRO, None)
    repro = None
    if repro_text:
        from pytest_fusion import repro as _repro

        try:
            repro = _repro.parse(repro_text)
        except ValueError as exc:
            raise pytest.UsageError(f"--fusion-repro: not a case printed by pytest-fusion: {exc}") from None
    config.stash[SETTINGS_KEY] = RunSettings(
        interpreter=early.interpreter,
        max_examples=options.resolve(config, options.EXAMPLES, default=None, convert=options.positive_int),
        max_dim=options.resolve(config, options.MAX_DIM, default=None, convert=options.non_negative_int),
        repro=repro,
    )
    bench_plugin.configure(config)


def pytest_report_header(config: pytest.Config) -> str | None:
    settings = config.stash.get(SETTINGS_KEY, None)
    return f"pytest-fusion: {settings.interpreter}" if settings else None


def spec_of(item_or_definition: Any) -> KernelSpec | None:
    """The validated spec of a ``fused_kernel`` test, or None for an unmarked one.

    Raises:
        pytest.fail.Exception: a malformed marker (a clean error naming the argument, no traceback).
    """
    mark = item_or_definition.get_closest_marker("fused_kernel")
    if mark is None:
        return None
    try:
        return make_spec(*mark.args, **mark.kwargs)
    except (FusionUsageError, TypeError) as exc:  # TypeError: e.g. two positional arguments
        problem = str(exc)
    # Failing outside the except block keeps the report to the one message (no chained traceback).
    pytest.fail(f"{item_or_definition.nodeid}: bad @pytest.mark.fused_kernel: {problem}", pytrace=False)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    spec = spec_of(metafunc.definition)
    if spec is None:
        return
    from pytest_fusion.check import INTERPRETER_BF16_REASON, interpreter_active

    params = []
    for dtype in spec.dtypes:
        marks = []
        if dtype == "bfloat16" and spec.triton and interpreter_active():
            marks.append(pytest.mark.skip(reason=INTERPRETER_BF16_REASON))
        params.append(pytest.param(CheckItem(dtype), id=CheckItem(dtype).id, marks=marks))
    if bench_plugin.enabled(metafunc.config):
        for case in spec.bench:
            for dtype in case.dtypes:
                if bench_plugin.selected(metafunc.config, case, dtype):
                    params.append(pytest.param(BenchItem(case, dtype), id=BenchItem(case, dtype).id))
    metafunc.fixturenames.append(PARAM)
    metafunc.parametrize(PARAM, params)


def declared_bench_cases(items: list[pytest.Item]) -> tuple[dict[str, list[tuple[str, str]]], int]:
    """For the items of a run (after deselection): ``{test id: [(case, dtype), ...]}`` of every
    ``fused_kernel`` test among them, with all the bench cases its marker declares (whatever
    ``--fusion-cases`` picked), and the number of bench items. The input of
    :func:`pytest_fusion.baselines.stale_entries`."""
    from pytest_fusion.baselines import test_id

    declared: dict[str, list[tuple[str, str]]] = {}
    n_bench = 0
    for item in items:
        param = getattr(item, "callspec", None) and item.callspec.params.get(PARAM)
        if not isinstance(param, (CheckItem, BenchItem)):
            continue
        n_bench += isinstance(param, BenchItem)
        key = test_id(item.nodeid, param.id)
        if key not in declared:
            spec = spec_of(item)
            declared[key] = [(c.name, d) for c in (spec.bench if spec else ()) for d in c.dtypes]
    return declared, n_bench


def repro_target(item: pytest.Item) -> str:
    """How to name ``item`` on a command line run where the user ran pytest.

    Node ids are relative to the rootdir, which need not be the invocation directory: the file
    part is made relative to the invocation directory when the file lies under it; otherwise the
    command is prefixed with ``cd <rootdir> &&``, where the node id resolves.
    """
    nodeid = item.nodeid
    invocation = Path(item.config.invocation_params.dir)
    path, sep, rest = nodeid.partition("::")
    try:
        relative = Path(item.path).relative_to(invocation).as_posix()
    except ValueError:
        return f"cd {shlex.quote(str(item.config.rootpath))} && pytest {shlex.quote(nodeid)}"
    return f"pytest {shlex.quote(relative + sep + rest)}"


def _repro_snippet(item: pytest.Function) -> Callable[[Case], str]:
    target = repro_target(item)

    def snippet(case: Case) -> str:
        payload = json.dumps(case.as_dict(), sort_keys=True)
        return f"    {target} --fusion-repro={shlex.quote(payload)}"

    return snippet


def _kernel_of(item: pytest.Function) -> Any:
    argnames = item._fixtureinfo.argnames  # the test function's own arguments (fixtures)
    kernel = item.obj(**{name: item.funcargs[name] for name in argnames})
    if not callable(kernel):
        pytest.fail(
            f"{item.nodeid}: a fused_kernel test must return the kernel under test (a callable), "
            f"got {kernel!r}",
            pytrace=False,
        )
    return kernel


def _repro_case(item: pytest.Function, spec: KernelSpec, payload: dict[str, Any], dtype: str) -> "Case":
    """The ``--fusion-repro`` case for this test, or a clean failure naming what does not fit."""
    from pytest_fusion.repro import case_for

    try:
        return case_for(payload, spec, dtype)
    except ValueError as exc:
        problem = str(exc)
    pytest.fail(f"{item.nodeid}: --fusion-repro does not fit this test: {problem}", pytrace=False)


def failure_text(exc: BaseException) -> str:
    """The failure's message and its notes (Hypothesis' 'Falsifying example' among them)."""
    notes = [n for n in getattr(exc, "__notes__", []) if "reproduce_failure" not in n]
    return "\n".join([str(exc), *notes])


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    param = getattr(pyfuncitem, "callspec", None) and pyfuncitem.callspec.params.get(PARAM)
    if not isinstance(param, (CheckItem, BenchItem)):
        return None
    spec = spec_of(pyfuncitem)
    assert spec is not None
    kernel = _kernel_of(pyfuncitem)
    if isinstance(param, BenchItem):
        bench_plugin.run_bench_item(pyfuncitem, spec, kernel, param.case, param.dtype)
        return True

    from pytest_fusion.check import DEFAULT_CPU_MAX_DIM, default_device, run_property, skip_reason
    from pytest_fusion.oracle import FusionFailure, check_case

    settings = pyfuncitem.config.stash[SETTINGS_KEY]
    device = default_device(spec)
    reason = skip_reason(spec, param.dtype, device)
    if reason:
        pytest.skip(reason)
    max_dim = settings.max_dim
    if max_dim is None and device == "cpu":
        max_dim = DEFAULT_CPU_MAX_DIM
    repro = _repro_snippet(pyfuncitem)
    failure = None
    try:
        if settings.repro is not None:
            check_case(spec, kernel, _repro_case(pyfuncitem, spec, settings.repro, param.dtype),
                       device=device, repro=repro)
        else:
            run_property(
                spec, kernel, dtype=param.dtype, device=device, max_dim=max_dim or None,
                max_examples=settings.max_examples, database_key=pyfuncitem.nodeid.encode(), repro=repro,
            )
    except FusionFailure as exc:
        failure = failure_text(exc)
    if failure is not None:  # outside the except block: the report is the message, not a chain
        pytest.fail(failure, pytrace=False)
    return True


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    skipped = [r for r in terminalreporter.stats.get("skipped", [])
               if isinstance(r.longrepr, tuple) and "triton issue 11584" in str(r.longrepr[2])]
    if skipped:
        terminalreporter.write_line(
            f"pytest-fusion: {len(skipped)} bfloat16 check(s) skipped under the Triton interpreter "
            "(triton issue 11584): they are not passed; run on a GPU to check them.", yellow=True)


@pytest.fixture
def fusion(request: pytest.FixtureRequest) -> "Fusion":
    """The oracle and the bench for hand-written tests: ``fusion.assert_close(actual, reference,
    *inputs)``, ``fusion.check(kernel, reference, *inputs)``, ``fusion.bench(name, kernel, *inputs,
    reference=...)``. See :class:`pytest_fusion.fixture.Fusion`."""
    from pytest_fusion.fixture import Fusion

    return Fusion(request.node)

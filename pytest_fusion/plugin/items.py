"""The test items of a ``fused_kernel`` test: its spec, its parametrization into check and bench
items, and how each runs. The plugin's hooks call these; nothing here is a hook.
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import pytest

from pytest_fusion.declare.marker import make_spec, signature_text
from pytest_fusion.declare.spec import BenchCase, FusionUsageError, KernelSpec
from pytest_fusion.machine import devices
from pytest_fusion.plugin import config as fusion_config
from pytest_fusion.plugin import config_tier, progress
from pytest_fusion.plugin.fixture import repro_target

if TYPE_CHECKING:
    from pytest_fusion.measure.record import BenchRecord
    from pytest_fusion.oracle.tensors import Case

PARAM = "_fusion_item"
"""Pseudo-fixture by which a marked test is parametrized into its check and bench items."""

MARKER_HELP = (
    f"{signature_text()}: check the kernel the test returns against `reference` over Hypothesis-drawn "
    "dims, dtypes and layouts (one item per dtype); with --fusion-bench also time each `bench` case "
    "against eager and torch.compile and gate it against baselines/. Arguments: "
    "help(pytest_fusion.fused_kernel)."
)


@dataclasses.dataclass(frozen=True)
class _DtypeItem:
    """An item of the whole test in one dtype; its id is :attr:`ID_PREFIX` and the dtype. A base
    only: the hooks dispatch on each subclass, neither of which is the other."""

    ID_PREFIX: ClassVar[str] = ""

    spec: KernelSpec
    dtype: str

    @property
    def id(self) -> str:
        """The item's parameter id (pytest-fusion's own part of its node id)."""
        return self.ID_PREFIX + self.dtype


@dataclasses.dataclass(frozen=True)
class CheckItem(_DtypeItem):
    """A correctness item: the property test in one dtype (id: the dtype)."""


@dataclasses.dataclass(frozen=True)
class BenchItem:
    """A benchmark item: one bench case in one dtype."""

    spec: KernelSpec
    case: BenchCase
    dtype: str

    @property
    def id(self) -> str:
        """The item's parameter id (pytest-fusion's own part of its node id)."""
        return f"bench-{self.case.name}-{self.dtype}"


@dataclasses.dataclass(frozen=True)
class ExploreItem(_DtypeItem):
    """A slow-shape search item (``--fusion-explore``): the test's dims searched in one dtype
    (id: ``explore-<dtype>``)."""

    ID_PREFIX: ClassVar[str] = "explore-"


def spec_of(node: Any) -> KernelSpec | None:
    """The validated spec of a ``fused_kernel`` test, or None for an unmarked one.

    Raises:
        pytest.fail.Exception: a malformed marker (a clean error naming the argument, no traceback).
    """
    mark = node.get_closest_marker("fused_kernel")
    if mark is None:
        return None
    try:
        return make_spec(*mark.args, **mark.kwargs)
    except (FusionUsageError, TypeError) as exc:  # TypeError: e.g. a non-iterable where a tuple goes
        problem = str(exc)
    # Failing outside the except block keeps the report to the one message (no chained traceback).
    pytest.fail(f"{node.nodeid}: bad @pytest.mark.fused_kernel: {problem}", pytrace=False)


def parametrize(metafunc: pytest.Metafunc) -> None:
    """Parametrize a marked test into one check item per dtype, under ``--fusion-bench`` one bench
    item per selected case and dtype, and under ``--fusion-explore`` one explore item per dtype.
    The spec is built here, once per test function."""
    spec = spec_of(metafunc.definition)
    if spec is None:
        return
    from pytest_fusion.property.check import skip_reason

    device = devices.default_device(spec.device)
    params = []
    for dtype in spec.dtypes:
        # Decided here, as a mark, so that the skip is reported at the user's test, not in this file.
        reason = skip_reason(spec, dtype, device)
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        item = CheckItem(spec, dtype)
        params.append(pytest.param(item, id=item.id, marks=marks))
    cfg = fusion_config.of(metafunc.config)
    if cfg.bench:
        benched = [
            BenchItem(spec, case, dtype)
            for case in spec.bench
            for dtype in case.dtypes
            if cfg.selects(case.name, dtype)
        ]
        params += [pytest.param(b, id=b.id) for b in benched]
    if cfg.explore:
        params += [pytest.param(e, id=e.id) for e in (ExploreItem(spec, d) for d in spec.dtypes)]
    metafunc.fixturenames.append(PARAM)
    metafunc.parametrize(PARAM, params)


def param_of(item: pytest.Item) -> CheckItem | BenchItem | ExploreItem | None:
    """The check, bench or explore item ``item`` was parametrized with, or None for another test."""
    callspec = getattr(item, "callspec", None)
    param = callspec.params.get(PARAM) if callspec is not None else None
    return param if isinstance(param, (CheckItem, BenchItem, ExploreItem)) else None


def test_id_of_item(item: pytest.Item, param: CheckItem | BenchItem | ExploreItem) -> str:
    """The test id of ``item``, the key of the test's baseline entries: its node id without
    ``param``'s id (:func:`pytest_fusion.baselines.store.test_id_of_node`)."""
    from pytest_fusion.baselines.store import test_id_of_node

    return test_id_of_node(item.nodeid, param.id)


def declared_bench_cases(items: list[pytest.Item]) -> tuple[dict[str, list[tuple[str, str]]], int]:
    """For the items of a run (after deselection): ``{test id: [(case, dtype), ...]}`` of every
    ``fused_kernel`` test among them, with all the bench cases its marker declares (whatever
    ``--fusion-cases`` picked), and the number of bench items. The input of
    :func:`pytest_fusion.baselines.store.stale_entries`."""
    declared: dict[str, list[tuple[str, str]]] = {}
    n_bench = 0
    for item in items:
        param = param_of(item)
        if param is None:
            continue
        n_bench += isinstance(param, BenchItem)
        key = test_id_of_item(item, param)
        if key not in declared:
            declared[key] = [(c.name, d) for c in param.spec.bench for d in c.dtypes]
    return declared, n_bench


def repro_snippet(item: pytest.Item, spec: KernelSpec, all_configs: bool = False) -> Callable[[Case], str]:
    """The repro line of a failing case of ``item``: ``python3 -m pytest <node id>
    --fusion-repro='<payload>'`` (:func:`~pytest_fusion.plugin.fixture.repro_target`), the payload's
    dims in the order ``spec`` declares them (:func:`pytest_fusion.property.repro.dumps`), with
    ``--fusion-all-configs`` when ``all_configs``."""
    from pytest_fusion.property.repro import dumps

    target = repro_target(item)
    extra = " --fusion-all-configs" if all_configs else ""

    def snippet(case: Case) -> str:
        return f"    {target} --fusion-repro={shlex.quote(dumps(case.as_dict(), spec))}{extra}"

    return snippet


def kernel_of(item: pytest.Function) -> Callable[..., Any]:
    """Call the test function (with its fixtures): it returns the kernel under test."""
    argnames = item._fixtureinfo.argnames  # the test function's own arguments (fixtures)
    kernel = item.obj(**{name: item.funcargs[name] for name in argnames})
    if not callable(kernel):
        pytest.fail(
            f"{item.nodeid}: a fused_kernel test must return the kernel under test (a callable), "
            f"got {kernel!r}",
            pytrace=False,
        )
    return kernel


def failure_text(exc: BaseException) -> str:
    """The failure's message and its notes (Hypothesis' 'Falsifying example' among them)."""
    notes = [n for n in getattr(exc, "__notes__", []) if "reproduce_failure" not in n]
    return "\n".join([str(exc), *notes])


def repro_case(item: pytest.Item, spec: KernelSpec, payload: dict[str, Any], dtype: str) -> Case:
    """The ``--fusion-repro`` case for this test (:func:`pytest_fusion.property.repro.case_for`).

    Raises:
        pytest.fail.Exception: the payload does not fit the test (dims outside the declared
            ranges, unknown inputs or layouts, too many elements), naming what does not fit.
    """
    from pytest_fusion.property.repro import case_for

    try:
        return case_for(payload, spec, dtype)
    except ValueError as exc:
        problem = str(exc)
    pytest.fail(f"{item.nodeid}: --fusion-repro does not fit this test: {problem}", pytrace=False)


def run_check(item: pytest.Function, param: CheckItem, kernel: Callable[..., Any]) -> None:
    """The property test of one dtype (or the one case ``--fusion-repro`` names) and its config tier
    (:mod:`pytest_fusion.plugin.config_tier`), and with ``--fusion-sanitize`` a failing or named
    one run again under compute-sanitizer (:mod:`pytest_fusion.plugin.sanitize`)."""
    from pytest_fusion.oracle.case import check_case
    from pytest_fusion.oracle.failures import FusionFailure
    from pytest_fusion.property.check import run_property, size_limits
    from pytest_fusion.property.config_tier import ConfigTier

    cfg = fusion_config.of(item.config)
    spec = param.spec
    device = devices.default_device(spec.device)
    max_dim, max_elements = size_limits(spec, device, cfg.max_dim)
    repro = repro_snippet(item, spec, cfg.all_configs)
    tier_s = config_tier.budget_s(cfg, device)
    tier = (ConfigTier(tier_s, config_tier.offset(item.config, item.nodeid), repro_snippet(item, spec, True))
            if tier_s > 0 else None)
    failure, failed_case, usage = None, None, False
    try:
        if cfg.repro is not None:
            case = repro_case(item, spec, cfg.repro, param.dtype)
            check_case(spec, kernel, case, device=device, repro=repro, every_config=cfg.all_configs)
        else:
            run_property(
                spec,
                kernel,
                dtype=param.dtype,
                device=device,
                max_dim=max_dim,
                max_elements=max_elements,
                max_examples=cfg.examples,
                database_key=item.nodeid.encode(),
                repro=repro,
                every_config=cfg.all_configs,
                config_tier=tier,
                notify=lambda line: progress.of(item.config)(f"{item.nodeid}: {line}"),
            )
            if tier is not None and tier.total:
                config_tier.record(item, tier)
    except FusionFailure as exc:
        failure, failed_case = failure_text(exc), exc.case
    except FusionUsageError as exc:  # declared dims too large for the device (check_fits)
        failure, usage = f"{item.nodeid}: {exc}", True
    if cfg.sanitize is not None and not usage:
        from pytest_fusion.plugin.sanitize import outcome

        failure = outcome(item, cfg, failure, failed_case, spec)
    if failure is not None:  # outside the except block: the report is the message, not a chain
        pytest.fail(failure, pytrace=False)


def skip_untimeable(spec: KernelSpec) -> None:
    """Nothing; skips the running item when no CUDA device is visible and the kernel is a Triton
    kernel (interpreter timings are not kernel timings) or declares ``device="cuda"``."""
    import torch

    if not torch.cuda.is_available():
        if spec.triton:
            from pytest_fusion.property.check import TRITON_BENCH_REASON

            pytest.skip(TRITON_BENCH_REASON)
        if spec.device and spec.device.startswith("cuda"):
            pytest.skip(
                f"bench needs a CUDA device (the kernel declares device={spec.device!r}); none is visible"
            )


def run_bench(item: pytest.Function, param: BenchItem, kernel: Callable[..., Any]) -> BenchRecord:
    """Time one bench case, gate it and record it (:func:`pytest_fusion.plugin.bench_item.bench`).

    Skips a Triton kernel when no CUDA device is visible (interpreter timings are not kernel
    timings) and a ``device="cuda"`` kernel likewise.
    """
    from pytest_fusion.plugin import bench_item

    spec = param.spec
    skip_untimeable(spec)
    device = devices.default_device(spec.device)
    return bench_item.bench(item, spec, kernel, param.case, param.dtype, device,
                            kernel_id=test_id_of_item(item, param))

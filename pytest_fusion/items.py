"""The test items of a ``fused_kernel`` test: its spec, its parametrization into check and bench
items, and how each runs. The plugin's hooks call these; nothing here is a hook.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pytest

from pytest_fusion import config as fusion_config
from pytest_fusion import devices
from pytest_fusion.marker import make_spec, signature_text
from pytest_fusion.spec import BenchCase, FusionUsageError, KernelSpec

if TYPE_CHECKING:
    from pytest_fusion.tensors import Case

PARAM = "_fusion_item"
"""Pseudo-fixture by which a marked test is parametrized into its check and bench items."""

MARKER_HELP = (
    f"{signature_text()}: check the kernel the test returns against `reference` over Hypothesis-drawn "
    "dims, dtypes and layouts (one item per dtype); with --fusion-bench also time each `bench` case "
    "against eager and torch.compile and gate it against baselines/. Arguments: "
    "help(pytest_fusion.fused_kernel)."
)


@dataclasses.dataclass(frozen=True)
class CheckItem:
    """A correctness item: the property test in one dtype."""

    spec: KernelSpec
    dtype: str


@dataclasses.dataclass(frozen=True)
class BenchItem:
    """A benchmark item: one bench case in one dtype."""

    spec: KernelSpec
    case: BenchCase
    dtype: str


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
    """Parametrize a marked test into one check item per dtype and, under ``--fusion-bench``, one
    bench item per selected case and dtype. The spec is built here, once per test function."""
    spec = spec_of(metafunc.definition)
    if spec is None:
        return
    from pytest_fusion.check import skip_reason

    device = devices.default_device(spec.device)
    params = []
    for dtype in spec.dtypes:
        # Decided here, as a mark, so that the skip is reported at the user's test, not in this file.
        reason = skip_reason(spec, dtype, device)
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        params.append(pytest.param(CheckItem(spec, dtype), id=dtype, marks=marks))
    cfg = fusion_config.of(metafunc.config)
    if cfg.bench:
        params += [
            pytest.param(BenchItem(spec, case, dtype), id=f"bench-{case.name}-{dtype}")
            for case in spec.bench
            for dtype in case.dtypes
            if cfg.selects(case.name, dtype)
        ]
    metafunc.fixturenames.append(PARAM)
    metafunc.parametrize(PARAM, params)


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


def repro_snippet(item: pytest.Item, all_configs: bool = False) -> Callable[[Case], str]:
    target = repro_target(item)
    extra = " --fusion-all-configs" if all_configs else ""

    def snippet(case: Case) -> str:
        payload = json.dumps(case.as_dict(), sort_keys=True)
        return f"    {target} --fusion-repro={shlex.quote(payload)}{extra}"

    return snippet


def kernel_of(item: pytest.Function) -> Any:
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


def run_check(item: pytest.Function, param: CheckItem, kernel: Callable[..., Any]) -> None:
    """The property test of one dtype (or the one case ``--fusion-repro`` names)."""
    from pytest_fusion.check import run_property, size_limits
    from pytest_fusion.oracle import FusionFailure, check_case
    from pytest_fusion.tensors import Case

    cfg = fusion_config.of(item.config)
    spec = param.spec
    device = devices.default_device(spec.device)
    max_dim, max_elements = size_limits(spec, device, cfg.max_dim)
    repro = repro_snippet(item, cfg.all_configs)
    failure = None
    try:
        if cfg.repro is not None:
            r = cfg.repro
            case = Case(
                dims=r["dims"],
                dtype=param.dtype,
                layouts=r.get("layouts", {}),
                seed=int(r["seed"]),
                special=bool(r.get("special", False)),
                amplitude=float(r.get("amplitude", 1.0)),
            )
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
            )
    except FusionFailure as exc:
        failure = failure_text(exc)
    if failure is not None:  # outside the except block: the report is the message, not a chain
        pytest.fail(failure, pytrace=False)


def run_bench(item: pytest.Function, param: BenchItem, kernel: Callable[..., Any]) -> Any:
    """Time one bench case, gate it and record it (:meth:`pytest_fusion.session.BenchSession.bench`).

    Skips a Triton kernel when no CUDA device is visible (interpreter timings are not kernel
    timings) and a ``device="cuda"`` kernel likewise.
    """
    import torch

    from pytest_fusion import session

    spec = param.spec
    if not torch.cuda.is_available():
        if spec.triton:
            from pytest_fusion.check import TRITON_BENCH_REASON

            pytest.skip(TRITON_BENCH_REASON)
        if spec.device and spec.device.startswith("cuda"):
            pytest.skip(
                f"bench needs a CUDA device (the kernel declares device={spec.device!r}); none is visible"
            )
    device = devices.default_device(spec.device)
    return session.start(item.config).bench(item, spec, kernel, param.case, param.dtype, device)

"""The timed providers of a bench case: the kernel, ``eager``, ``compile`` and named extras.

Each provider becomes a zero-argument call ``fn(*inputs, **constants)`` on one fixed set of inputs.
A torch.compile provider's name carries its mode (:func:`compile_name`): ``compile`` is the default
mode and ``compile-max-autotune-no-cudagraphs`` that mode, so a baseline entry stored under one mode
is never gated against another, and one run can time several modes side by side.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
import warnings
from typing import Any, Callable, Iterator, Mapping, Sequence

from pytest_fusion.declare.spec import COMPILE_MODES, compile_mode_of, compile_name


@dataclasses.dataclass
class Providers:
    """Calls to time, plus what was learnt building them.

    Attributes:
        calls: ``{name: zero-argument call}``, the kernel first.
        cold_start_s: first-call seconds already measured (the compile provider's compilation).
        notes: ``{name: note}`` (compile fallback, recompiles, graph breaks, a failed compile).
    """

    calls: dict[str, Callable[[], Any]]
    cold_start_s: dict[str, float]
    notes: dict[str, str]
    compile_graphs: int | None = None
    """Dynamo graphs compiled once the compile provider was warm (to count later recompiles)."""
    rivals: dict[str, list[Callable[[], Any]]] = dataclasses.field(default_factory=dict)
    """``{compile provider: its further independent builds}`` (``compile_builds`` > 1), each a
    zero-argument call like ``calls[name]``; the caller times them and keeps the fastest
    (``bench.timed_case``)."""

    def recompiles_since_warmup(self) -> int:
        """Graphs Dynamo compiled after warm-up: recompiles inside timing (0 without compile)."""
        if self.compile_graphs is None:
            return 0
        return dynamo_counts()[0] - self.compile_graphs


def add_note(notes: dict[str, str], name: str, note: str) -> None:
    """Nothing; appends ``note`` to ``notes[name]`` ("; " between notes)."""
    notes[name] = "; ".join(x for x in (notes.get(name, ""), note) if x)


def select(
    requested: Sequence[str] | None, extras: Sequence[str], compile_mode: str = "default"
) -> list[str]:
    """Providers to time beside the kernel: ``requested`` (None: all) among eager, compile in
    ``compile_mode``, the extras, and compile in any other mode when asked for by name.

    Raises:
        ValueError: a requested name is neither built in nor one of ``extras``.
    """
    known = ["eager", compile_name(compile_mode), *extras]
    if requested is None:
        return known
    unknown = [p for p in requested if p not in known and p != "kernel" and compile_mode_of(p) is None]
    if unknown:
        offered = [*known, *(compile_name(m) for m in COMPILE_MODES if compile_name(m) not in known)]
        raise ValueError(f"unknown provider(s) {unknown}; this case offers {offered}")
    other_modes = [p for p in requested if p not in known and p != "kernel"]
    return [p for p in known if p in requested] + list(dict.fromkeys(other_modes))


def dynamo_counts() -> tuple[int, int]:
    """(graphs compiled, graph breaks) so far in this process, from torch._dynamo's counters."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"]), int(sum(counters["graph_break"].values()))


class _DropUntracedTrace(logging.Filter):
    """Drops records of torch's ``torch.__trace`` logger (structured-trace events, empty messages
    whose payload rides in ``extra``). Without ``$TORCH_TRACE`` they have no destination of
    their own; where they reach the root logger, pytest's log capture prints empty "DEBUG
    torch.__trace" lines under each failed bench item (docs/timing-and-gate.md, "torch's noise in
    pytest's output")."""

    def filter(self, record: logging.LogRecord) -> bool:
        return False


_DROP_TRACE = _DropUntracedTrace()


@contextlib.contextmanager
def quiet_torch_compile() -> Iterator[None]:
    """torch.compile without torch's own noise in the user's pytest output.

    - Importing Inductor imports ``torch.utils.mkldnn``, whose class bodies call the deprecated
      ``torch.jit.script_method``: DeprecationWarnings that are not the user's to fix. They are
      ignored inside this block only, as is the warning that an independent build's
      ``force_disable_caches`` turns off Dynamo's profile-guided cache.
    - The structured-trace logger is filtered for the process (once) unless ``$TORCH_TRACE`` asks
      for traces, see :class:`_DropUntracedTrace`.
    """
    if not os.environ.get("TORCH_TRACE"):
        trace_log = logging.getLogger("torch.__trace")
        if _DROP_TRACE not in trace_log.filters:
            trace_log.addFilter(_DROP_TRACE)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.", category=DeprecationWarning)
        # An independent build (force_disable_caches) turns Dynamo's profile-guided cache off: said once.
        warnings.filterwarnings("ignore", message="dynamo_pgo force disabled", category=UserWarning)
        yield


REDUCE_OVERHEAD_OFF_CUDA = (
    "mode reduce-overhead without CUDA tensors: its CUDA graphs apply to CUDA devices only, so this is "
    "Inductor's default code"
)
"""The note of a ``compile-reduce-overhead`` provider timed on CPU tensors (Inductor skips CUDA
graphs for a CPU graph)."""


def make_compiled(
    reference: Callable[..., Any],
    mode: str,
    call: Callable[[Callable[..., Any]], Any],
    warmup: int,
    *,
    reset: bool = True,
    independent: bool = False,
) -> tuple[Callable[..., Any], float, str]:
    """A fresh ``torch.compile(reference)``, compiled and warmed on this case's inputs.

    ``torch._dynamo.reset()`` runs first (``reset``): Dynamo caches compiled code per Python code
    object, not per ``torch.compile`` wrapper, so without it a second case of the same reference
    would reuse (or recompile, and turn dynamic) the first case's code. The price: other
    torch.compile'd code recompiles at its next call (during its own warm-up, never inside timed
    rounds). A case's second compile provider passes ``reset=False``: a reset would throw away the
    first one's code, which would then recompile inside its timed rounds; entries of two modes
    live side by side in the code object's cache, told apart by their backend.

    ``independent``: a build that shares nothing with earlier ones: it compiles a trampoline with
    a code object of its own (a new Dynamo cache, beside the earlier builds' live entries) under
    Inductor's ``force_disable_caches`` (no FX-graph or autotune cache hit), so that Inductor's
    autotuning runs again (docs/timing-and-gate.md, "Compile builds").

    Args:
        call: invokes a function on the case's inputs, e.g. ``lambda f: f(*inputs, **constants)``.

    Returns:
        (compiled function, cold start s of the first call, note: fallback/recompiles/graph breaks).
    """
    import torch

    with quiet_torch_compile(), _without_caches(independent):
        if reset:
            torch._dynamo.reset()
        # Dynamo's counters are per process (reset() keeps them): this case's figures are deltas.
        graphs_before, breaks_before = dynamo_counts()
        target = _own_code(reference) if independent else reference
        compiled = torch.compile(target, mode=None if mode == "default" else mode, dynamic=False)
        t0 = time.perf_counter()
        call(compiled)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        cold = time.perf_counter() - t0
        graphs_after_first, _ = dynamo_counts()
        for _ in range(warmup):
            call(compiled)
        graphs, breaks = dynamo_counts()
    notes = []
    if graphs_after_first == graphs_before:
        notes.append("torch.compile fell back to eager (no graph compiled)")
    if graphs > graphs_after_first:
        notes.append(f"{graphs - graphs_after_first} recompile(s) during warm-up")
    if breaks > breaks_before:
        notes.append(f"{breaks - breaks_before} graph break(s)")
    return compiled, cold, "; ".join(notes)


def _own_code(reference: Callable[..., Any]) -> Callable[..., Any]:
    """A function calling ``reference`` whose code object is new: Dynamo keeps compiled code on
    the code object of the frame it compiles, so a build of this function finds no earlier one."""

    def entry(*args: Any, **kwargs: Any) -> Any:
        return reference(*args, **kwargs)

    entry.__code__ = entry.__code__.replace()  # a copy: a distinct object with an empty cache
    return entry


@contextlib.contextmanager
def _without_caches(active: bool) -> Iterator[None]:
    """Inductor's ``force_disable_caches`` set inside the block when ``active``."""
    if not active:
        yield
        return
    import torch._inductor.config as inductor_config

    with inductor_config.patch(force_disable_caches=True):
        yield


def make_providers(
    kernel: Callable[..., Any],
    reference: Callable[..., Any],
    inputs: Sequence[Any],
    *,
    constants: Mapping[str, Any] | None = None,
    extras: Mapping[str, Callable[..., Any]] | None = None,
    requested: Sequence[str] | None = None,
    compile_mode: str = "default",
    warmup: int = 3,
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
    compile_builds: int = 1,
) -> Providers:
    """Build the zero-argument calls for one case (see :class:`Providers`).

    A torch.compile that raises is left out with a note rather than failing the case: the
    kernel's gate against the other providers still holds. ``wrap``: applied to every provider's
    function before it is bound, the compile provider's after ``torch.compile`` of the reference
    (a forward + backward case times ``wrap(torch.compile(reference))``, whose first call also
    compiles the backward graph). ``compile_builds``: independent builds of each compile provider
    (:func:`make_compiled`); the first is ``calls[name]``, the others go to ``rivals[name]``. A
    further build that fails is left out with a note.

    Raises:
        ValueError: an unknown requested provider or compile mode, or ``compile_builds`` < 1.
    """
    if compile_mode not in COMPILE_MODES:
        raise ValueError(f"unknown compile mode {compile_mode!r}; choose from {', '.join(COMPILE_MODES)}")
    if compile_builds < 1:
        raise ValueError(f"compile_builds must be >= 1, got {compile_builds}")
    consts = dict(constants or {})
    args = tuple(inputs)
    extras = dict(extras or {})

    wrapped = wrap or (lambda fn: fn)

    def bind(fn: Callable[..., Any]) -> Callable[[], Any]:
        call = wrapped(fn)
        return lambda: call(*args, **consts)

    calls: dict[str, Callable[[], Any]] = {"kernel": bind(kernel)}
    cold: dict[str, float] = {}
    notes: dict[str, str] = {}
    rivals: dict[str, list[Callable[[], Any]]] = {}
    graphs: int | None = None
    for name in select(requested, list(extras), compile_mode):
        mode = compile_mode_of(name)
        if name == "eager":
            calls[name] = bind(reference)
        elif mode is not None:
            builds, failed = _compile_builds(reference, mode, lambda f: wrapped(f)(*args, **consts), warmup,
                                             compile_builds, reset=graphs is None)
            if builds:
                compiled, cold[name], note, _ = builds[0]
                calls[name], graphs = bind(compiled), builds[-1][3]
                if note:
                    notes[name] = note
                if len(builds) > 1:
                    rivals[name] = [bind(build[0]) for build in builds[1:]]
            if failed:
                add_note(notes, name, failed)
            if builds and mode == "reduce-overhead" and not any(getattr(a, "is_cuda", False) for a in args):
                add_note(notes, name, REDUCE_OVERHEAD_OFF_CUDA)
        else:
            calls[name] = bind(extras[name])
    return Providers(calls, cold, notes, graphs, rivals)


def _compile_builds(
    reference: Callable[..., Any],
    mode: str,
    call: Callable[[Callable[..., Any]], Any],
    warmup: int,
    builds: int,
    *,
    reset: bool,
) -> tuple[list[tuple[Callable[..., Any], float, str, int]], str | None]:
    """Up to ``builds`` builds of ``reference`` (:func:`make_compiled`; the first may reset Dynamo,
    the others are independent), each with Dynamo's graph count after it, and the note of the build
    that failed, if one did: the builds after a failed one are not tried (a reference torch.compile
    cannot handle is a finding, not a crash)."""
    made: list[tuple[Callable[..., Any], float, str, int]] = []
    for build in range(builds):
        try:
            compiled, seconds, note = make_compiled(reference, mode, call, warmup, reset=reset and not made,
                                                    independent=build > 0)
        except Exception as exc:
            failed = f"{type(exc).__name__}: {str(exc)[:160]}"
            return made, (f"torch.compile failed, not timed ({failed})" if build == 0
                          else f"independent build {build + 1} failed, not timed ({failed})")
        made.append((compiled, seconds, note, dynamo_counts()[0]))
    return made, None

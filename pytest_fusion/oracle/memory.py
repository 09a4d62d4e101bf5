"""Device memory as a budget: the bytes one check (or bench case) holds at its peak, known before it
runs, and one admission rule that lets work onto a GPU only when that GPU's free memory holds it.

- :func:`check_footprint`: a case's peak bytes on its device. The inputs (their whole allocations:
  layout gaps and guard bands), the copies the oracle keeps of them, the reference's three runs
  (golden in float64, eager, magnitude) traced on the ``meta`` device with their intermediates,
  both kernel calls' outputs with a workspace allowance, and the comparison's float64
  temporaries; with ``backward=True`` the three autograd runs and the kernel's gradients too.
  A reference that cannot run on ``meta`` (a data-dependent op) has no footprint: its case is
  admitted alone.
- :func:`admitted`: the admission of one piece of work on a CUDA device. Workers sharing a GPU
  (xdist workers, other pytest processes of the same user) queue in a ledger file beside the
  timing locks (:func:`pytest_fusion.machine.locks.lock_dir`); the first in line enters when its bytes,
  plus every admitted piece's, fit the device's free memory less a headroom, or when nothing is
  admitted (so a case that fits the card runs, alone, and nothing waits for ever). Work below
  :data:`TINY_BYTES` skips the ledger: the headroom holds it.

The rule counts an admitted piece's bytes as not yet allocated even when they are (free memory
already shows them): it may hold a case back that would fit, never let one in that would not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

GiB = 2**30

TINY_BYTES = 128 * 2**20
"""Work below this many bytes is not queued: each worker runs one case at a time, and 16 workers'
tiny cases (2 GiB) fit in :data:`HEADROOM_MIN_BYTES`."""

HEADROOM_MIN_BYTES = 2 * GiB
HEADROOM_FRACTION = 0.04
"""Free memory an admission leaves untouched: the larger of these, for tiny cases that are not
queued, other workers' CUDA contexts growing, and the caching allocator's rounding."""

ALLOCATOR_SLACK = 1.10
ALLOCATOR_SLACK_BYTES = 256 * 2**20
"""A footprint on a CUDA device is scaled by this and this added: torch's caching allocator rounds
blocks up (to 2 MiB segments for large ones) and fragments between them."""

COMPARE_F64_TEMPORARIES = 16
"""Float64 temporaries of one chunk's size that :func:`pytest_fusion.oracle.budget.compare` holds at its
peak (its inputs upcast, golden rounded to the dtype, error, spacing, bound and the masks);
tests/oracle/test_memory.py measures the real figure and fails when it grows past this."""

COMPARE_CHUNKED_F64_TEMPORARIES = 5
"""Float64 values per output element that a chunked comparison holds besides one chunk's
temporaries: eager's error ratio over the whole output and its percentile's selection."""


def compare_bytes(numel: int) -> int:
    """Peak bytes of :func:`pytest_fusion.oracle.budget.compare` on an output of ``numel`` elements."""
    from pytest_fusion.oracle.budget import COMPARE_CHUNK_ELEMENTS

    chunk = min(numel, COMPARE_CHUNK_ELEMENTS)
    whole = COMPARE_CHUNKED_F64_TEMPORARIES * numel if numel > COMPARE_CHUNK_ELEMENTS else 0
    return 8 * (COMPARE_F64_TEMPORARIES * chunk + whole)

STORAGE_CHECK_TEMPORARIES = 3
"""Bytes per input-allocation byte that the input-storage check holds at once (the byte mask of
the tensor's own elements, its expansion, the comparison with the copy; ``hygiene``)."""

POLL_S = 0.05
"""How often a queued worker looks at the ledger again."""


# -- the footprint -------------------------------------------------------------------------------


class _PeakTracker:
    """Live and peak bytes of the storages that torch ops create under it (any device, ``meta``
    included; storages that existed before, such as the inputs', are not counted). A storage is
    counted once however many views share it, and leaves the count when it is freed."""

    def __init__(self, known: Sequence[Any] = ()) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        tracker = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                tracker._note(out)
                return out

        self.mode = Mode()
        self.live = 0
        self.peak = 0
        self._sizes: dict[int, int] = {}
        for t in known:
            self._known(t)

    def _known(self, t: Any) -> None:
        import torch

        if isinstance(t, torch.Tensor):
            self._sizes.setdefault(t.untyped_storage()._cdata, 0)

    def _note(self, out: Any) -> None:
        import torch

        if isinstance(out, (tuple, list)):
            for o in out:
                self._note(o)
            return
        if not isinstance(out, torch.Tensor):
            return
        storage = out.untyped_storage()
        key = storage._cdata
        if key in self._sizes:
            return
        nbytes = int(storage.nbytes())
        self._sizes[key] = nbytes
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)

    def __enter__(self) -> _PeakTracker:
        self.mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.mode.__exit__(*exc)


@dataclasses.dataclass(frozen=True)
class Footprint:
    """A case's peak bytes on its device, by part (before :data:`ALLOCATOR_SLACK`).

    Attributes:
        inputs: the inputs' whole allocations, and the oracle's copy of each.
        reference: the reference's golden, eager and magnitude runs at their peak, outputs kept.
        kernel: both calls' outputs, with a workspace allowance of one call's outputs.
        transient: the largest of the comparison's and the input check's temporaries.
        backward: with ``backward=True``, the three autograd runs and the kernel's gradients.
    """

    inputs: int
    reference: int
    kernel: int
    transient: int
    backward: int = 0

    @property
    def total(self) -> int:
        return self.inputs + self.reference + self.kernel + self.transient + self.backward

    def device_bytes(self) -> int:
        """What to admit on a CUDA device: :attr:`total` with the caching allocator's slack (none
        for tiny work, which is not queued)."""
        if self.total < TINY_BYTES:
            return self.total
        return int(self.total * ALLOCATOR_SLACK) + ALLOCATOR_SLACK_BYTES

    def describe(self) -> str:
        parts = ", ".join(f"{f.name} {getattr(self, f.name) / 1e9:.2f}" for f in dataclasses.fields(self))
        return f"{self.total / 1e9:.2f} GB ({parts})"


def meta_inputs(spec: Any, case: Any) -> list[Any]:
    """``case``'s inputs on the ``meta`` device, each in an allocation shaped as
    :func:`pytest_fusion.oracle.tensors.make_inputs` makes it (layout gaps and guard bands): no memory,
    the same shapes, strides and storage sizes."""
    import torch

    from pytest_fusion.oracle.tensors import guard_elements, layout_geometry, shape_of, torch_dtype

    out = []
    for name, t in spec.inputs.items():
        shape = shape_of(t, case.dims)
        dtype = torch_dtype(t.dtype) if t.dtype else torch_dtype(case.dtype)
        strides, offset, extent = layout_geometry(shape, case.layouts.get(name, "contiguous"))
        guard = guard_elements(dtype)
        flat = torch.empty(guard + extent + guard, dtype=dtype, device="meta")
        out.append(flat.as_strided(shape, strides, guard + offset))
    return out


def _nbytes(t: Any) -> int:
    return int(t.untyped_storage().nbytes())


def _tensors(values: Sequence[Any]) -> list[Any]:
    import torch

    return [v for v in values if isinstance(v, torch.Tensor)]


def meta_like(inputs: Sequence[Any]) -> list[Any]:
    """Tensors on the ``meta`` device with the shapes, strides, offsets and storage sizes of
    ``inputs`` (non-tensors unchanged)."""
    import torch

    out = []
    for t in inputs:
        if isinstance(t, torch.Tensor):
            flat = torch.empty(t.untyped_storage().nbytes() // t.element_size(), dtype=t.dtype, device="meta")
            t = flat.as_strided(t.shape, t.stride(), t.storage_offset())
        out.append(t)
    return out


def check_footprint(
    spec: Any, case: Any, *, n_calls: int = 2, backward: bool | None = None
) -> Footprint | None:
    """The peak bytes of checking ``spec``'s kernel on ``case``
    (:func:`pytest_fusion.oracle.case.check_case`),
    or None when the reference cannot be traced on the ``meta`` device: :func:`footprint` of
    :func:`meta_inputs`."""
    return footprint(spec, meta_inputs(spec, case), n_calls=n_calls, backward=backward)


def footprint(
    spec: Any, inputs: Sequence[Any], *, n_calls: int = 2, backward: bool | None = None
) -> Footprint | None:
    """The peak bytes of checking ``spec``'s kernel on ``inputs`` (``meta`` tensors shaped as the
    real ones: :func:`meta_inputs`, :func:`meta_like`) with ``n_calls`` kernel calls
    (:func:`pytest_fusion.oracle.case.check_inputs`; ``backward``, None: ``spec.backward``), or None
    when the reference cannot be traced on ``meta`` (it raised there: a data-dependent op, a
    Python scalar read from a tensor, an op without a meta kernel).

    The reference's runs are traced op by op (their intermediates freed as torch frees them); the
    kernel's memory is inferred from the reference's outputs, as the oracle requires them to match.
    """
    import torch

    from pytest_fusion.oracle import inplace
    from pytest_fusion.oracle.backward import autograd, floating_inputs
    from pytest_fusion.oracle.golden import magnitudes, run_reference, upcast
    from pytest_fusion.oracle.tensors import GUARD_BYTES

    inputs = list(inputs)
    stored = sum(_nbytes(t) for t in _tensors(inputs))
    mutated = inplace.positions(spec)
    reference = inplace.with_outputs(spec.reference, mutated, copy=True) if mutated else spec.reference
    try:
        with _PeakTracker(known=inputs) as tracker:
            _, eager, _ = run_reference(reference, inputs, spec.constants)
        ref_peak = tracker.peak
        outputs = _tensors(eager)
        bwd = 0
        if spec.backward if backward is None else backward:
            wanted = floating_inputs(inputs)
            grads = [torch.empty_like(o) if o.dtype.is_floating_point else None for o in outputs]
            tensors = _tensors(inputs)
            with _PeakTracker(known=inputs) as tracker:
                autograd(spec.reference, [upcast(t) for t in inputs], spec.constants,
                         [None if g is None else upcast(g) for g in grads], wanted)
                autograd(spec.reference, [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs],
                         spec.constants, grads, wanted)
                autograd(spec.reference, [magnitudes(t) for t in inputs], spec.constants,
                         [None if g is None else upcast(g.abs()) for g in grads], wanted)
            # the kernel's forward and backward (as large as eager's), its gradients, the
            # watched copies of what the forward saved, and each gradient's comparison
            biggest = max((t.numel() for t in tensors), default=0)
            bwd = 2 * tracker.peak + 2 * stored + compare_bytes(biggest)
    except Exception:  # noqa: BLE001 - any failure to trace means "unknown", never a failed check
        return None
    out_bytes = sum(_nbytes(o) + GUARD_BYTES for o in outputs)
    copies = stored + (n_calls * sum(_nbytes(inputs[i]) for i in mutated) if mutated else 0)
    largest_out = max((o.numel() for o in outputs), default=0)
    largest_in = max((_nbytes(t) for t in _tensors(inputs)), default=0)
    return Footprint(
        inputs=stored + copies,
        reference=ref_peak,
        kernel=(n_calls + 1) * out_bytes,
        transient=max(compare_bytes(largest_out), STORAGE_CHECK_TEMPORARIES * largest_in),
        backward=bwd,
    )


# -- admission -----------------------------------------------------------------------------------


DeviceMemory = Callable[[], tuple[int, int]]
"""``() -> (free bytes this process may use, total bytes)`` of one device."""


def cuda_memory(device: str) -> DeviceMemory:
    """The probe of CUDA device ``device``: free memory (``cudaMemGetInfo``) plus what this
    process's caching allocator holds unused (it reuses that before asking the driver), and the
    device's total memory."""

    def probe() -> tuple[int, int]:
        import torch

        dev = torch.device(device)
        free, total = torch.cuda.mem_get_info(dev)
        cached = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
        return int(free) + int(cached), int(total)

    return probe


def headroom(total: int) -> int:
    """Bytes an admission leaves free on a device of ``total`` bytes (:data:`HEADROOM_FRACTION`,
    at least :data:`HEADROOM_MIN_BYTES`)."""
    return max(HEADROOM_MIN_BYTES, int(HEADROOM_FRACTION * total))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


@dataclasses.dataclass
class Ledger:
    """The queue and the admitted work of one device, in a JSON file guarded by a file lock.

    Entries: ``{"ticket", "pid", "bytes", "holder", "since", "admitted"}``; an entry whose process
    is gone is dropped by the next reader, so a killed worker never holds memory it does not use.
    """

    path: Path

    def _lock(self) -> Any:
        from filelock import FileLock

        return FileLock(str(self.path.with_suffix(".lock")))

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf8"))
        except (OSError, ValueError):
            return {"next": 0, "entries": []}
        if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
            return {"next": 0, "entries": []}
        entries = [e for e in data["entries"] if isinstance(e, dict)]
        data["entries"] = [e for e in entries if _alive(int(e.get("pid", -1)))]
        return data

    def _write(self, data: Mapping[str, Any]) -> None:
        from pytest_fusion.machine.atomic import replace_text

        replace_text(self.path, json.dumps(data, indent=1))

    @contextlib.contextmanager
    def update(self) -> Iterator[dict[str, Any]]:
        """The ledger's content under its lock, written back after the ``with`` body."""
        with self._lock():
            data = self._read()
            yield data
            self._write(data)


_held = threading.local()
"""Whether this thread holds an admission: a check inside an admitted bench case (or a case
inside an admitted check) is already counted."""


@dataclasses.dataclass(frozen=True)
class Waited:
    """How an admission went: seconds queued and what was admitted meanwhile at its last look."""

    seconds: float
    ahead: tuple[str, ...]


@contextlib.contextmanager
def admission(
    ledger: Ledger,
    need: int,
    probe: DeviceMemory,
    *,
    holder: str = "",
    on_wait: Callable[[Waited], None] | None = None,
    wait_report_s: float = 10.0,
) -> Iterator[Waited]:
    """Hold ``need`` bytes of a device for the ``with`` body (the module's rule), queued in
    ``ledger`` first come, first served; ``probe`` reads the device's memory. ``on_wait`` is
    called once when the wait passes ``wait_report_s`` seconds, naming the holders ahead."""
    if holding():
        yield Waited(0.0, ())
        return
    start = time.monotonic()
    with ledger.update() as data:
        ticket = int(data.get("next", 0))
        data["next"] = ticket + 1
        data["entries"].append(dict(ticket=ticket, pid=os.getpid(), bytes=int(need), holder=holder,
                                    since=time.time(), admitted=False))
    reported = False
    ahead: tuple[str, ...] = ()
    try:
        while True:
            with ledger.update() as data:
                entries = data["entries"]
                mine = next((e for e in entries if e["ticket"] == ticket), None)
                if mine is None:  # dropped by a reader that saw this pid dead: impossible while alive
                    mine = dict(ticket=ticket, pid=os.getpid(), bytes=int(need), holder=holder,
                                since=time.time(), admitted=False)
                    entries.append(mine)
                earlier = [e for e in entries if not e["admitted"] and e["ticket"] < ticket]
                inside = [e for e in entries if e["admitted"]]
                if not earlier:
                    free, total = probe()
                    taken = sum(int(e["bytes"]) for e in inside)
                    if not inside or need + taken <= free - headroom(total):
                        mine["admitted"] = True
                        break
                ahead = tuple(f"{e['holder'] or 'pid ' + str(e['pid'])} ({int(e['bytes']) / 1e9:.1f} GB)"
                              for e in inside + earlier)
            waited = time.monotonic() - start
            if on_wait is not None and not reported and waited > wait_report_s:
                on_wait(Waited(waited, ahead))
                reported = True
            time.sleep(POLL_S)
        _held.active = True
        try:
            yield Waited(time.monotonic() - start, ahead)
        finally:
            _held.active = False
    finally:
        with ledger.update() as data:
            data["entries"] = [e for e in data["entries"] if e["ticket"] != ticket]


@contextlib.contextmanager
def _counted() -> Iterator[Waited]:
    """Tiny work, let in without the ledger but marked as held, so that the checks inside it do
    not trace their footprint again (:func:`holding`)."""
    if holding():
        yield Waited(0.0, ())
        return
    _held.active = True
    try:
        yield Waited(0.0, ())
    finally:
        _held.active = False


def ledger_for(device: str) -> Ledger:
    """The ledger of CUDA ``device``, beside its timing lock (one per GPU as CUDA_VISIBLE_DEVICES
    names it, so workers pinned to one GPU share it)."""
    from pytest_fusion.machine.devices import device_ident
    from pytest_fusion.machine.locks import lock_dir

    return Ledger(lock_dir() / f"memory-{device_ident(device)}.json")


WAIT_NOTICE_S = 10.0
"""Seconds a case queues for device memory before :func:`admitted` says so (its ``notify``)."""


def wait_notice(device: str, need: int, holder: str, waited: Waited) -> str:
    """The line of a case queued for ``need`` bytes of ``device``'s memory, with what is ahead of it."""
    ahead = ", ".join(waited.ahead) or "nothing (the device's free memory is short)"
    who = f"{holder}: " if holder else ""
    return (f"{who}queued {waited.seconds:.0f} s for {need / 1e9:.1f} GB of {device}'s memory; "
            f"admitted or ahead: {ahead}")


def admitted(
    device: str, need: int | None, *, holder: str = "", notify: Callable[[str], None] | None = None,
) -> contextlib.AbstractContextManager[Waited]:
    """Hold ``need`` bytes of ``device`` for the ``with`` body (:func:`admission`). A no-op off
    CUDA and below :data:`TINY_BYTES`; ``need`` None (a footprint that could not be traced)
    waits until nothing else is admitted on the device, as a case that takes all of it.
    ``notify``: called with :func:`wait_notice`'s line once the wait passes :data:`WAIT_NOTICE_S`."""
    if not str(device).startswith("cuda"):
        return contextlib.nullcontext(Waited(0.0, ()))
    if need is not None and need < TINY_BYTES:
        return _counted()
    probe = cuda_memory(device)
    if need is None:
        need = probe()[1]
    bytes_ = need
    on_wait = None if notify is None else (lambda w: notify(wait_notice(device, bytes_, holder, w)))
    return admission(ledger_for(device), need, probe, holder=holder, on_wait=on_wait,
                     wait_report_s=WAIT_NOTICE_S)


def holding() -> bool:
    """Whether this thread holds an admission now (work inside it is already counted)."""
    return bool(getattr(_held, "active", False))


def case_bytes(spec: Any, case: Any, device: str) -> int | None:
    """The bytes ``case``'s check holds at its peak on ``device``, the caching allocator's slack
    included (:func:`check_footprint`); 0 off CUDA (nothing is admitted there); None when the
    reference cannot be traced (the case is then admitted alone)."""
    if not str(device).startswith("cuda"):
        return 0
    found = check_footprint(spec, case)
    return None if found is None else found.device_bytes()


def admitted_inputs(
    spec: Any, inputs: Sequence[Any], *, n_calls: int, backward: bool | None, holder: str = ""
) -> contextlib.AbstractContextManager[Waited]:
    """:func:`admitted` for checking ``spec``'s kernel on ``inputs`` already made
    (:func:`footprint` of them), on their device; a no-op inside an admission and off CUDA."""
    device = next((str(t.device) for t in _tensors(inputs)), "cpu")
    if holding() or not device.startswith("cuda"):
        return contextlib.nullcontext(Waited(0.0, ()))
    found = footprint(spec, meta_like(inputs), n_calls=n_calls, backward=backward)
    return admitted(device, None if found is None else found.device_bytes(), holder=holder)


def bench_bytes(spec: Any, case: Any, dtype: str, device: str, *, input_sets: int) -> int | None:
    """The bytes bench case ``case`` (a :class:`~pytest_fusion.declare.spec.BenchCase`) holds at its peak
    on ``device``: its check on the timed inputs, the further input sets rotated through while
    timing (``input_sets`` in all: ``bench.timing.INPUT_SETS``), and each provider's outputs and
    intermediates as large as the reference's own (the CUDA graphs keep them); 0 off CUDA, None
    when the reference cannot be traced."""
    if not str(device).startswith("cuda"):
        return 0
    from pytest_fusion.oracle.tensors import Case

    drawn = Case(dims=dict(case.dims), dtype=dtype, layouts={}, seed=0)
    found = check_footprint(spec, drawn, backward=case.backward)
    if found is None:
        return None
    inputs = sum(_nbytes(t) for t in _tensors(meta_inputs(spec, drawn)))
    providers = 3 + len(getattr(spec, "providers", ()) or ())
    extra = input_sets * inputs + providers * (found.kernel + found.reference)
    return found.device_bytes() + int(extra * ALLOCATOR_SLACK)


def device_total_bytes(device: str) -> int:
    """Total memory of CUDA device ``device`` in bytes (``cudaDeviceProp.totalGlobalMem``)."""
    import torch

    return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)


def fits_alone(need: int, total: int) -> bool:
    """Whether ``need`` bytes can run on a device of ``total`` bytes with nothing else on it but
    the headroom (:func:`headroom`)."""
    return need <= total - headroom(total)

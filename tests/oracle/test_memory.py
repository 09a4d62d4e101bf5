"""Device memory as a budget (pytest_fusion.oracle.memory): footprints that bound what a check really
holds, and an admission that holds work back while the device's free memory would not hold it."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pytest_fusion import make_spec

from pytest_fusion.oracle import memory
from pytest_fusion.oracle.budget import compare
from pytest_fusion.oracle.case import check_inputs
from pytest_fusion.oracle.tensors import Case, make_inputs

GB = 10**9


def linear_gelu(x, weight, bias):
    return F.gelu(F.linear(x, weight, bias), approximate="tanh")


def swiglu(x, w_gate, w_up):
    return F.silu(F.linear(x, w_gate)) * F.linear(x, w_up)


def add_rows_(out, x):  # in place, as fused add + norm kernels are
    out.add_(x)


SPECS = {
    "linear-gelu": (linear_gelu, {"x": ("M", "K"), "weight": ("N", "K"), "bias": ("N",)},
                    {"M": 200, "K": 384, "N": 320}, {}),
    "swiglu": (swiglu, {"x": ("M", "K"), "w_gate": ("N", "K"), "w_up": ("N", "K")},
               {"M": 300, "K": 64, "N": 700}, {}),
    "in-place": (add_rows_, {"out": ("M", "N"), "x": ("M", "N")}, {"M": 500, "N": 300}, {"mutates": ("out",)}),
}


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "padded", "offset"])
@pytest.mark.parametrize("name", list(SPECS))
def test_the_footprint_bounds_what_a_check_really_holds(name: str, layout: str, backward: bool) -> None:
    # The real check on the CPU, every storage torch creates counted (the meta trace's own
    # tracker, on real tensors): the footprint, made before the check, must not be below it.
    reference, inputs, dims, extra = SPECS[name]
    if backward and extra.get("mutates"):
        pytest.skip("an in-place kernel has no backward")
    spec = make_spec(reference, inputs=inputs, dims={k: (1, 1024) for k in dims}, dtypes=("float32",),
                     triton=False, backward=backward, **extra)
    case = Case(dims=dims, dtype="float32", layouts={n: layout for n in inputs}, seed=3)
    estimate = memory.check_footprint(spec, case)
    assert estimate is not None
    with memory._PeakTracker() as measured:
        check_inputs(spec, reference, list(make_inputs(spec, case, "cpu").values()), warn=False)
    assert measured.peak > 0
    assert estimate.total >= measured.peak, (estimate.describe(), measured.peak)
    assert estimate.total <= 4 * measured.peak, (estimate.describe(), measured.peak)  # a bound, not a guess


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_compare_holds_no_more_float64_temporaries_than_the_footprint_counts(dtype: torch.dtype) -> None:
    n = 1 << 18
    golden = torch.randn(n, dtype=torch.float64)
    kernel, eager = golden.to(dtype), golden.to(dtype)
    kernel[::997] = float("nan")
    with memory._PeakTracker(known=[golden, kernel, eager]) as tracked:
        compare(kernel, golden, eager, magnitude=golden.abs(), terms=64, error_multiple=2.0, ulps=2.0)
    assert tracked.peak / (8 * n) <= memory.COMPARE_F64_TEMPORARIES


def test_the_golden_keeps_integer_inputs_integer() -> None:
    from pytest_fusion.declare.spec import Tensor

    def dequant(q, scale):
        return q.to(scale.dtype) * scale

    spec = make_spec(dequant, inputs={"q": Tensor(("M", "K"), dtype="int8"), "scale": ("K",)},
                     dims={"M": (1, 4096), "K": (1, 4096)}, dtypes=("float16",), triton=False)
    found = memory.check_footprint(spec, Case({"M": 4096, "K": 4096}, "float16", {}, 0))
    assert found is not None
    # golden and magnitude each hold an f64 output of 4096^2 (134 MB) and an f64 copy of q's
    # values made by the reference itself, never an 8-byte upcast of q before the call
    assert found.reference < 6 * 8 * 4096**2


def test_a_reference_that_cannot_run_on_meta_has_no_footprint() -> None:
    def data_dependent(x):
        return x[x > 0].sum() * torch.ones_like(x)

    spec = make_spec(data_dependent, inputs={"x": ("M",)}, dims={"M": (1, 64)}, triton=False)
    assert memory.check_footprint(spec, Case({"M": 64}, "float32", {}, 0)) is None
    assert memory.case_bytes(spec, Case({"M": 64}, "float32", {}, 0), "cpu") == 0  # nothing admitted on a CPU


class FakeCard:
    """A GPU of ``total`` bytes whose used memory the test sets (other workers' allocations)."""

    def __init__(self, total: int) -> None:
        self.total, self.used = total, 0

    def probe(self) -> tuple[int, int]:
        return self.total - self.used, self.total


def enter_in_thread(ledger: memory.Ledger, need: int, card: FakeCard, events: list[str], name: str,
                    release: threading.Event) -> threading.Thread:
    def work() -> None:
        with memory.admission(ledger, need, card.probe, holder=name):
            events.append(f"{name} in")
            card.used += need
            release.wait(10)
            card.used -= need
        events.append(f"{name} out")

    thread = threading.Thread(target=work)
    thread.start()
    return thread


def wait_for(events: list[str], item: str, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while item not in events and time.monotonic() < deadline:
        time.sleep(0.01)
    return item in events


def test_admission_holds_a_worker_back_until_the_cards_free_memory_holds_its_case(tmp_path: Path) -> None:
    card = FakeCard(80 * GB)  # an H100; headroom 3.2 GB
    ledger = memory.Ledger(tmp_path / "memory-gpu-0.json")
    events: list[str] = []
    release_a, release_b, release_c = threading.Event(), threading.Event(), threading.Event()
    a = enter_in_thread(ledger, 40 * GB, card, events, "a", release_a)
    assert wait_for(events, "a in")
    # 40 more would not fit beside a's 40 (free 40, less the headroom): b waits
    b = enter_in_thread(ledger, 40 * GB, card, events, "b", release_b)
    time.sleep(0.5)
    assert "b in" not in events
    release_a.set()
    assert wait_for(events, "b in")  # a gone: b's case fits the free memory now
    assert events.index("a out") < events.index("b in")
    # b's 40 GB are allocated and still counted as its own: 10 more wait, never an OOM
    c = enter_in_thread(ledger, 10 * GB, card, events, "c", release_c)
    time.sleep(0.3)
    assert "c in" not in events  # 40 (b) + 10 > 40 free - 3.2: held back, never an OOM
    release_b.set()
    assert wait_for(events, "c in")
    release_c.set()
    for t in (a, b, c):
        t.join(5)
    assert memory.Ledger(ledger.path)._read()["entries"] == []


def test_admission_lets_work_in_together_while_it_fits(tmp_path: Path) -> None:
    card = FakeCard(141 * GB)
    ledger = memory.Ledger(tmp_path / "memory-gpu-0.json")
    events: list[str] = []
    release = threading.Event()
    threads = [enter_in_thread(ledger, 20 * GB, card, events, f"w{i}", release) for i in range(2)]
    # not yet allocated when the second looks (the count is the need, not the used memory)
    assert wait_for(events, "w0 in") and wait_for(events, "w1 in")
    release.set()
    for t in threads:
        t.join(5)


def test_a_case_that_fits_the_card_alone_is_never_held_back_for_ever(tmp_path: Path) -> None:
    card = FakeCard(24 * GB)
    card.used = 6 * GB  # other processes' contexts and caches, outside the ledger
    ledger = memory.Ledger(tmp_path / "memory-gpu-0.json")
    events: list[str] = []
    release = threading.Event()
    release.set()
    t = enter_in_thread(ledger, 20 * GB, card, events, "big", release)
    assert wait_for(events, "big out")  # nothing admitted: it runs alone rather than wait for ever
    t.join(5)


def test_admission_is_first_come_first_served(tmp_path: Path) -> None:
    card = FakeCard(80 * GB)
    ledger = memory.Ledger(tmp_path / "memory-gpu-0.json")
    events: list[str] = []
    release_a, release_big, release_small = threading.Event(), threading.Event(), threading.Event()
    a = enter_in_thread(ledger, 30 * GB, card, events, "a", release_a)
    assert wait_for(events, "a in")
    big = enter_in_thread(ledger, 60 * GB, card, events, "big", release_big)
    time.sleep(0.3)
    small = enter_in_thread(ledger, 1 * GB, card, events, "small", release_small)
    time.sleep(0.3)
    assert "small in" not in events  # it would fit, but the large case came first: no starvation
    release_a.set()
    assert wait_for(events, "big in")
    release_big.set()
    assert wait_for(events, "small in")
    release_small.set()
    for t in (a, big, small):
        t.join(5)


def test_a_dead_workers_entry_holds_nothing(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    ledger = memory.Ledger(tmp_path / "memory-gpu-0.json")
    with ledger.update() as data:
        data["entries"].append(dict(ticket=0, pid=int(gone.stdout), bytes=70 * GB, holder="killed",
                                    since=0.0, admitted=True))
        data["next"] = 1
    card = FakeCard(80 * GB)
    with memory.admission(ledger, 60 * GB, card.probe) as waited:
        assert waited.seconds < 2


def test_admission_between_processes(tmp_path: Path) -> None:
    # Two real processes on one faked 80 GB card: the second waits while the first holds 50 GB.
    script = f"""
import sys, time
from pathlib import Path
from pytest_fusion.oracle import memory
ledger = memory.Ledger(Path({str(tmp_path)!r}) / "memory-gpu-0.json")
start = time.monotonic()
with memory.admission(ledger, 50 * 10**9, lambda: (80 * 10**9, 80 * 10**9)):
    print("in", round(time.monotonic() - start, 2), flush=True)
    time.sleep(float(sys.argv[1]))
"""
    env = {"PYTHONPATH": str(Path(__file__).parents[2]), "PATH": "/usr/bin:/bin"}
    first = subprocess.Popen([sys.executable, "-c", script, "2"], stdout=subprocess.PIPE, text=True, env=env)
    assert first.stdout is not None and first.stdout.readline().startswith("in")
    second = subprocess.run([sys.executable, "-c", script, "0"], capture_output=True, text=True, env=env,
                            timeout=60)
    first.wait(30)
    assert second.returncode == 0, second.stderr
    assert float(second.stdout.split()[1]) >= 1.0  # held back for most of the first one's 2 s


def test_tiny_work_on_a_gpu_is_marked_held_so_its_checks_trace_nothing_again() -> None:
    # check_case and check_inputs skip their own footprint trace while holding() is true
    with memory.admitted("cuda:0", memory.TINY_BYTES - 1):
        assert memory.holding()
    assert not memory.holding()
    with memory.admitted("cpu", 10**12):  # off CUDA nothing is admitted or held
        assert not memory.holding()


def test_nested_work_inside_an_admission_is_not_counted_twice(tmp_path: Path) -> None:
    card = FakeCard(80 * GB)
    ledger = memory.Ledger(tmp_path / "memory-gpu-0.json")
    with memory.admission(ledger, 70 * GB, card.probe):
        assert memory.holding()
        with memory.admission(ledger, 70 * GB, card.probe) as inner:  # would wait for ever if counted
            assert inner.seconds == 0.0
    assert not memory.holding()


def test_waiting_is_reported_with_who_holds_the_memory(tmp_path: Path) -> None:
    card = FakeCard(80 * GB)
    ledger = memory.Ledger(tmp_path / "memory-gpu-0.json")
    events: list[str] = []
    release = threading.Event()
    holder = enter_in_thread(ledger, 60 * GB, card, events, "test_big[bfloat16]", release)
    assert wait_for(events, "test_big[bfloat16] in")
    reports: list[memory.Waited] = []
    threading.Timer(0.6, release.set).start()
    with memory.admission(ledger, 30 * GB, card.probe, on_wait=reports.append, wait_report_s=0.2):
        pass
    holder.join(5)
    assert len(reports) == 1 and reports[0].ahead == ("test_big[bfloat16] (60.0 GB)",)


def test_admitted_says_once_when_a_case_queues_past_the_notice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    card = FakeCard(80 * GB)
    ledger = memory.Ledger(tmp_path / "memory-gpu-0.json")
    monkeypatch.setattr(memory, "cuda_memory", lambda device: card.probe)
    monkeypatch.setattr(memory, "ledger_for", lambda device: ledger)
    monkeypatch.setattr(memory, "WAIT_NOTICE_S", 0.05)
    inside, release = threading.Event(), threading.Event()
    lines: list[str] = []

    def big() -> None:
        with memory.admission(ledger, 60 * GB, card.probe, holder="test_big[bfloat16]"):
            card.used = 60 * GB
            inside.set()
            release.wait(10)
            card.used = 0

    holder = threading.Thread(target=big)
    holder.start()
    assert inside.wait(10)

    def notify(line: str) -> None:
        lines.append(line)
        release.set()

    with memory.admitted("cuda:0", 30 * GB, holder="test_q[float16]", notify=notify):
        pass
    holder.join(10)
    assert lines == ["test_q[float16]: queued 0 s for 30.0 GB of cuda:0's memory; admitted or ahead: "
                     "test_big[bfloat16] (60.0 GB)"]


def test_declared_dims_too_large_for_the_card_even_alone_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_fusion.property import examples
    from pytest_fusion.declare.spec import FusionUsageError

    spec = make_spec(linear_gelu, inputs={"x": ("M", "K"), "weight": ("N", "K"), "bias": ("N",)},
                     dims={"M": (1, 8192), "K": (1, 8192), "N": (1, 28672)}, dtypes=("bfloat16",))
    monkeypatch.setattr(memory, "device_total_bytes", lambda device: 24 * GB)
    with pytest.raises(FusionUsageError, match=r"at M=8192 K=8192 N=28672 \(bfloat16\) the check holds about "
                                               r"\d+\.\d GB at its peak .* of the device's 24.0 GB"):
        examples.check_fits(spec, "cuda:0")
    monkeypatch.setattr(memory, "device_total_bytes", lambda device: 80 * GB)
    examples.check_fits(spec, "cuda:0")  # fits an 80 GB card alone


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fault", ["none", "scattered", "nonfinite", "atol"])
def test_compare_in_chunks_gives_the_one_pass_result(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype,
                                                     fault: str) -> None:
    # Large outputs are compared chunk by chunk (bounded temporaries); every field of the result,
    # the worst element and the budget's text included, must be what one pass gives.
    from pytest_fusion.oracle import budget

    gen = torch.Generator().manual_seed(7)
    golden = torch.randn(37, 53, generator=gen, dtype=torch.float64) * 30
    golden[3, 5] = float("nan")
    eager = golden.to(dtype)
    kernel = eager.clone()  # what eager does passes; the faults below fail
    if fault == "scattered":
        kernel[[4, 20, 36], [0, 17, 52]] += 5
    if fault == "nonfinite":
        kernel[[30, 31], [1, 2]] = float("inf")
    kw = dict(magnitude=golden.abs() * 1.5, terms=64, error_multiple=2.0, ulps=4.0)
    if fault == "atol":
        kw.update(atol=1e-2, rtol=1e-2)
    one_pass = compare(kernel.t().contiguous().t(), golden, eager, **kw)
    monkeypatch.setattr(budget, "COMPARE_CHUNK_ELEMENTS", 97)  # 21 chunks, the last one short
    chunked = compare(kernel.t().contiguous().t(), golden, eager, **kw)
    assert repr(chunked) == repr(one_pass)  # repr: NaN fields compare equal
    assert (one_pass.mismatches > 0) == (fault in ("scattered", "nonfinite")), one_pass


def test_compare_of_a_large_output_holds_a_chunks_temporaries_not_the_outputs() -> None:
    from pytest_fusion.oracle import budget

    n = 4 * budget.COMPARE_CHUNK_ELEMENTS // 16
    golden = torch.randn(n, dtype=torch.float64)
    kernel, eager = golden.to(torch.float16), golden.to(torch.float16)
    budget_was = budget.COMPARE_CHUNK_ELEMENTS
    try:
        budget.COMPARE_CHUNK_ELEMENTS = n // 8
        with memory._PeakTracker(known=[golden, kernel, eager]) as tracked:
            compare(kernel, golden, eager, terms=64, error_multiple=2.0, ulps=2.0)
    finally:
        budget.COMPARE_CHUNK_ELEMENTS = budget_was
    # the eager ratios of the whole output (one float64 each, then their percentile), plus chunks
    assert tracked.peak / (8 * n) <= memory.COMPARE_CHUNKED_F64_TEMPORARIES

"""One case through the public bench API (pytest_fusion.bench_case) with a scripted timer:
re-measure, notes, throughput."""

import dataclasses

import pytest
import torch

from pytest_fusion import BenchSettings as Settings
from pytest_fusion.measure.recompute import InputSets
from pytest_fusion import bench_case, judge, make_spec
from pytest_fusion.bench.api import default_bytes
from pytest_fusion.declare.spec import BenchCase
from pytest_fusion.measure.timers import GRAPH_METHOD, SYNC_METHOD
from pytest_fusion.gate.comparable import StoredCase, StoredProvider

from fakes import ScriptedTimer


SPREAD = [0.7 + 0.6 * ((i * 7) % 37) / 36 for i in range(37)]
X = torch.ones(4, 8)


def case(timer, flops=None, min_speedup=None, fp32_precision="ieee", **kw):
    spec = make_spec(torch.relu, inputs={"x": (4, 8)}, dims={}, min_speedup=min_speedup,
                     fp32_precision=fp32_precision)
    args = dict(kernel_id="k", slug="dev", device="cpu", inputs=(X,), timer=timer,
                settings=Settings(rounds=10, warmup=0, min_time_s=0.0, providers=("eager",)))
    args.update(kw)
    return bench_case(spec, torch.relu, BenchCase("c", {"M": 4}, ("float32",), flops=flops), "float32", **args)


def test_noisy_new_case_is_remeasured_and_noted_not_failed():
    timer = ScriptedTimer({"kernel": SPREAD, "eager": 2.0})
    rec = case(timer)
    assert rec.status == "new" and rec.rounds == 40
    assert timer.prepared == ["kernel", "eager", "kernel", "eager"]  # measured twice
    assert any("not gated; a baseline saved from it would be as noisy" in n for n in rec.notes)


def test_noisy_gated_case_fails_after_remeasure():
    stored = StoredCase(1.0, {"eager": StoredProvider(2.0, 2.0)})
    rec = case(ScriptedTimer({"kernel": SPREAD, "eager": 2.0}), stored=stored)
    assert rec.status == "fail" and "too noisy to judge" in rec.reasons[0] and "after 40 rounds" in rec.reasons[0]


def test_an_entry_of_another_timing_method_sends_no_case_to_a_re_measure():
    """A stored entry that cannot judge the run (another method: after an upgrade, every entry
    timed with the memset flush) is no reason to measure again: the case fails as not comparable
    after one measurement."""
    stored = StoredCase(1.0, {"eager": StoredProvider(3.0, 3.0)}, env={"method": "cuda-graph"})
    timer = ScriptedTimer({"kernel": 0.5, "eager": 1.0})  # 2.0x, below the stored 3.0x
    rec = case(timer, stored=stored)
    assert timer.prepared == ["kernel", "eager"] and not rec.remeasured
    assert rec.status == "fail" and rec.reasons[0].startswith(
        "not comparable: the baseline entry was timed by cuda-graph, this run by scripted")


def test_quiet_case_is_measured_once_with_throughput_and_peaks():
    timer = ScriptedTimer({"kernel": 0.5, "eager": 1.0})
    rec = case(timer, flops=1e9, peaks={"tflops": 4.0, "gbps": 100.0})
    assert timer.prepared == ["kernel", "eager"] and rec.rounds == 10
    assert rec.tflops == pytest.approx(2.0) and rec.pct_peak_flops == pytest.approx(50.0)
    assert rec.bytes == 2 * X.nbytes  # default: input + output once
    assert rec.gbps == pytest.approx(2 * X.nbytes / 0.5e-3 / 1e9)
    assert rec.pct_peak_bw == pytest.approx(100.0 * rec.gbps / 100.0)


def test_a_float32_case_is_bounded_by_the_tf32_peak_only_when_the_marker_declares_tf32():
    peaks = {"tflops": 4.0, "tflops_tf32": 40.0}  # 1e10 FLOP in 1 ms: 10 TFLOP/s
    ieee = case(ScriptedTimer({"kernel": 1.0, "eager": 2.0}), flops=1e10, peaks=peaks)
    assert ieee.status == "fail" and ieee.implausible
    assert "of the measured matmul peak (tflops 4 TFLOP/s" in ieee.reasons[0]
    tf32 = case(ScriptedTimer({"kernel": 1.0, "eager": 2.0}), flops=1e10, peaks=peaks, fp32_precision="tf32")
    assert tf32.status == "new" and not tf32.implausible


def test_an_implausible_case_is_not_replayed_even_when_its_speedup_fell():
    # The speedup fell below the stored 3.0x (a failure on timing alone), but the throughput is one the
    # device cannot produce in any process: the record says so, and the replay reads only the record.
    from pytest_fusion.plugin.config import FusionConfig
    from pytest_fusion.plugin.replay import should_replay

    stored = StoredCase(1.0, {"eager": StoredProvider(3.0, 3.0)})
    slower = case(ScriptedTimer({"kernel": 1.0, "eager": 2.0}), stored=stored)
    assert slower.status == "fail" and slower.replayable and should_replay(FusionConfig(), slower)
    rec = case(ScriptedTimer({"kernel": 1.0, "eager": 2.0}), stored=stored, flops=1e10, peaks={"tflops": 4.0})
    assert rec.status == "fail" and rec.implausible
    assert not rec.replayable and not should_replay(FusionConfig(), rec)


def test_time_floor_sets_the_records_rounds_and_scales_on_remeasure():
    # kernel 0.5 ms, eager 2 ms: the kernel needs 20 ms / 0.5 ms = 40 rounds to reach the floor.
    floor = Settings(rounds=10, warmup=0, min_time_s=0.02, max_rounds=1000, providers=("eager",))
    rec = case(ScriptedTimer({"kernel": 0.5, "eager": 2.0}), settings=floor)
    assert rec.rounds == 40 and len(rec.providers["kernel"].samples_ms) == len(rec.providers["eager"].samples_ms) == 40
    # Too noisy: the re-measure gets REMEASURE_FACTOR (4) x rounds, floor and cap: 80 ms of a
    # kernel averaging 1 ms over SPREAD's 37-sample cycle takes about 80 rounds.
    rec = case(ScriptedTimer({"kernel": SPREAD, "eager": 2.0}), settings=floor)
    assert 75 <= rec.rounds <= 85 and len(rec.providers["kernel"].samples_ms) == rec.rounds
    assert any(f"re-measured with {rec.rounds} rounds" in n for n in rec.notes)
    capped = dataclasses.replace(floor, max_rounds=15)
    rec = case(ScriptedTimer({"kernel": SPREAD, "eager": 2.0}), settings=capped)
    assert rec.rounds == 60  # the cap scaled too: 4 x 15


def test_default_cap_never_undercuts_the_minimum():
    from pytest_fusion.measure.timing import DEFAULT_MAX_ROUNDS

    assert Settings().round_cap == DEFAULT_MAX_ROUNDS
    assert Settings(rounds=DEFAULT_MAX_ROUNDS + 1).round_cap == DEFAULT_MAX_ROUNDS + 1
    assert Settings(rounds=5, max_rounds=7).round_cap == 7
    with pytest.raises(ValueError, match="max_rounds"):  # an explicit cap below the minimum
        case(ScriptedTimer({"kernel": 1.0, "eager": 1.0}), settings=Settings(rounds=10, max_rounds=5, providers=("eager",)))


def test_floor_for_untimed_provider_is_noted():
    rec = case(ScriptedTimer({"kernel": 0.5, "eager": 1.0}), min_speedup={"compile": 1.2})
    assert any("min_speedup for compile not checked" in n for n in rec.notes)


def test_unknown_provider_is_an_error():
    with pytest.raises(ValueError, match="unknown provider"):
        case(ScriptedTimer({"kernel": 1.0}), settings=Settings(providers=("liger",)))


def test_default_bytes_counts_tuples():
    a, b = torch.ones(3), torch.ones(2, 2, dtype=torch.float16)
    assert default_bytes((a,), (b, a)) == 12 + 8 + 12


def test_compile_provider_is_fresh_per_case_and_flags_graph_breaks():
    from pytest_fusion.measure.providers import make_providers

    def with_break(t):
        scale = 1.0 if t.sum().item() > -1e30 else 2.0  # .item() breaks the Dynamo graph
        return torch.relu(t) * scale

    first = make_providers(torch.relu, with_break, (torch.ones(4, 4),), requested=("compile",), warmup=1)
    second = make_providers(torch.relu, with_break, (torch.ones(8, 8),), requested=("compile",), warmup=1)
    for built in (first, second):
        assert set(built.calls) == {"kernel", "compile"}
        assert built.cold_start_s["compile"] > 0
        assert "graph break" in built.notes["compile"]
        assert "recompile" not in built.notes["compile"]  # its own compiled code, not the other case's
    assert torch.equal(second.calls["compile"](), torch.ones(8, 8))
    assert second.recompiles_since_warmup() == 0


def test_compile_notes_count_this_case_only():
    """Dynamo's counters are per process: a later case must not inherit an earlier case's graph
    breaks, and a reference that compiles no graph is a fallback even after others compiled."""
    from pytest_fusion.measure.providers import make_providers

    def with_break(t):
        scale = 1.0 if t.sum().item() > -1e30 else 2.0
        return torch.relu(t) * scale

    make_providers(torch.relu, with_break, (torch.ones(4, 4),), requested=("compile",), warmup=1)
    clean = make_providers(torch.relu, lambda t: torch.relu(t) + 1, (torch.ones(4, 4),), requested=("compile",), warmup=1)
    assert "graph break" not in clean.notes.get("compile", "")
    nothing = make_providers(torch.relu, lambda t: t, (torch.ones(4, 4),), requested=("compile",), warmup=1)
    assert "fell back to eager" in nothing.notes["compile"]  # an identity compiles no graph


def test_two_compile_modes_are_timed_side_by_side_without_recompiling():
    from pytest_fusion.measure.providers import make_providers

    x = torch.randn(8, 8)
    built = make_providers(torch.relu, lambda t: torch.relu(t) * 2, (x,),
                           requested=("eager", "compile", "compile-max-autotune-no-cudagraphs"), warmup=1)
    assert list(built.calls) == ["kernel", "eager", "compile", "compile-max-autotune-no-cudagraphs"]
    for name in ("compile", "compile-max-autotune-no-cudagraphs"):
        assert built.cold_start_s[name] > 0
        for _ in range(3):
            assert torch.equal(built.calls[name](), torch.relu(x) * 2)
    assert built.recompiles_since_warmup() == 0  # neither mode's code evicted the other's


def test_reduce_overhead_on_cpu_tensors_says_it_has_no_cuda_graphs():
    from pytest_fusion.measure.providers import REDUCE_OVERHEAD_OFF_CUDA, make_providers

    x = torch.randn(8, 8)
    built = make_providers(torch.relu, lambda t: torch.relu(t) * 2, (x,),
                           requested=("compile", "compile-reduce-overhead"), warmup=1)
    assert built.notes.get("compile-reduce-overhead") == REDUCE_OVERHEAD_OFF_CUDA
    assert "compile" not in built.notes
    assert torch.equal(built.calls["compile-reduce-overhead"](), torch.relu(x) * 2)


def test_further_compile_builds_are_independent_and_leave_the_first_live():
    """A second build has its own Dynamo cache (a graph compiled again, not the first one's) and
    Inductor's caches off while it compiles and autotunes; both builds stay callable after it."""
    import torch._inductor.config as inductor_config

    from pytest_fusion.measure.providers import dynamo_counts, make_providers

    x = torch.randn(8, 8)
    graphs_before = dynamo_counts()[0]
    built = make_providers(torch.relu, lambda t: torch.relu(t) * 3, (x,), requested=("compile",),
                           warmup=1, compile_builds=2)
    assert dynamo_counts()[0] - graphs_before == 2  # two graphs: no build reused the other's code
    assert len(built.rivals["compile"]) == 1
    for call in (built.calls["compile"], *built.rivals["compile"]):
        assert torch.equal(call(), torch.relu(x) * 3)
    assert built.recompiles_since_warmup() == 0 and "recompile" not in built.notes.get("compile", "")
    with pytest.raises(ValueError, match="compile_builds must be >= 1"):
        make_providers(torch.relu, torch.relu, (x,), compile_builds=0)

    seen = []

    def spy_compile(fn, **kwargs):
        def run(*args, **kw):
            seen.append((fn is not torch.relu, inductor_config.force_disable_caches))
            return fn(*args, **kw)

        return run

    import pytest_fusion.measure.providers as providers

    mp = pytest.MonkeyPatch()
    mp.setattr(torch, "compile", spy_compile)
    try:
        spied = providers.make_providers(torch.relu, torch.relu, (x,), requested=("compile",), warmup=0,
                                         compile_builds=3)
    finally:
        mp.undo()
    # The first call of each build: later builds compile a function of their own, caches off.
    assert seen == [(False, False), (True, True), (True, True)]
    assert len(spied.rivals["compile"]) == 2


class BuildTimer(ScriptedTimer):
    """Times a compile build by what its call returns (the build's ms), other providers as scripted."""

    def prepare(self, name, fn):
        self.prepared.append(name)
        if name == "compile":
            ms = float(fn())
            return lambda: ms
        return super().prepare(name, fn)


def test_the_fastest_compile_build_is_timed_and_a_spread_is_noted():
    from pytest_fusion.bench import timed_case as case_timing
    from pytest_fusion.measure.providers import Providers

    def built(*build_ms):
        calls = {"kernel": lambda: 1.0, "compile": lambda: build_ms[0]}
        return Providers(calls, {"compile": 0.1}, {}, None, {"compile": [lambda m=m: m for m in build_ms[1:]]})

    settings = Settings(rounds=5, warmup=0, min_time_s=0.0)
    sets = InputSets((X,), [(X,)])
    spread = built(2.0, 1.6, 1.9)
    case_timing._keep_fastest_builds(spread, BuildTimer({}), settings, sets)
    assert spread.calls["compile"]() == 1.6
    assert spread.notes["compile"] == "fastest of 3 independent builds kept (medians 2, 1.6, 1.9 ms)"
    close = built(1.0, 1.01)
    case_timing._keep_fastest_builds(close, BuildTimer({}), settings, sets)
    assert close.calls["compile"]() == 1.0 and "compile" not in close.notes  # within the replay noise


def test_compile_builds_default_to_two_on_a_gpu_only():
    from pytest_fusion.bench.timed_case import GPU_COMPILE_BUILDS, default_compile_builds

    class OnGpu:
        is_cuda = True

    assert default_compile_builds((X, 3)) == 1
    assert default_compile_builds((X, OnGpu())) == GPU_COMPILE_BUILDS == 2


def test_a_compile_mode_is_its_own_provider_name():
    from pytest_fusion.measure.providers import select

    assert select(None, ["liger"]) == ["eager", "compile", "liger"]
    assert select(None, [], "max-autotune") == ["eager", "compile-max-autotune"]
    assert select(("compile-reduce-overhead", "eager"), []) == ["eager", "compile-reduce-overhead"]
    with pytest.raises(ValueError, match="compile-max-autotune-no-cudagraphs"):  # the offer names the modes
        select(("compile-fast",), [])
    with pytest.raises(pytest_fusion_usage_error(), match="compile-<mode>"):
        make_spec(torch.relu, inputs={"x": ("M",)}, dims={"M": (1, 4)},
                  providers={"compile-max-autotune": torch.relu})


def pytest_fusion_usage_error():
    from pytest_fusion.declare.spec import FusionUsageError

    return FusionUsageError


class CountingTimer:
    """CPU timer stand-in for the peaks: every prepared call runs and counts as 1 ms."""

    method = "counting"

    def __init__(self) -> None:
        self.prepared: list[str] = []

    def prepare(self, name, fn):
        self.prepared.append(name)
        return lambda: (fn(), 1.0)[1]


def test_peaks_are_measured_once_per_session_without_a_cache():
    from pytest_fusion.measure import peaks

    timer, memo = CountingTimer(), {}
    expected = 2.0 * peaks.CPU_COPY_BYTES / 1e-3 / 1e9  # bytes read and written in 1 ms
    first = peaks.cached_peaks(None, timer, slug="cpu-test", device="cpu", dtype="float32", memo=memo)
    first["gbps"] = -1.0  # the caller's copy, not the memo's
    second = peaks.cached_peaks(None, timer, slug="cpu-test", device="cpu", dtype="float32", memo=memo)
    second["gbps"] = -1.0
    third = peaks.cached_peaks(None, timer, slug="cpu-test", device="cpu", dtype="float32", memo=memo)
    assert timer.prepared == ["peak-matmul", "peak-copy", "peak-read"]
    assert third["gbps"] == pytest.approx(expected)
    assert third["read_gbps"] == pytest.approx(expected / 2)  # bytes read once in 1 ms
    peaks.cached_peaks(None, timer, slug="cpu-test", device="cpu", dtype="float64", memo=memo)  # another dtype: measured
    assert timer.prepared[3:] == ["peak-matmul", "peak-matmul", "peak-copy", "peak-read"]  # float32 and float64


class DictCache(dict):
    """pytest's config.cache interface over a dict."""

    def set(self, key, value):
        self[key] = value


def test_peaks_cached_under_the_copy_engine_key_are_measured_again():
    from pytest_fusion.measure import peaks

    timer = CountingTimer()
    sub = f"float32/{timer.method}"
    cache = DictCache({"pytest_fusion/peaks/cpu-test": {sub: {"tflops": 1.0, "gbps": 2.0}}})
    value = peaks.cached_peaks(cache, timer, slug="cpu-test", device="cpu", dtype="float32")
    assert timer.prepared == ["peak-matmul", "peak-copy", "peak-read"] and value["gbps"] != 2.0
    assert cache["pytest_fusion/peaks-v3/cpu-test"][sub] == value
    later = CountingTimer()
    again = peaks.cached_peaks(cache, later, slug="cpu-test", device="cpu", dtype="float32")
    assert later.prepared == [] and again == value  # read from the cache, not measured


def test_judge_gates_a_record_without_pytest():
    rec = case(ScriptedTimer({"kernel": 1.0, "eager": 2.0}))  # speedup 2.0, no baseline: new
    assert rec.status == "new"
    held = judge(rec, StoredCase(1.0, {"eager": StoredProvider(2.0, 2.0)}), tolerance=0.05)
    assert held.status == "pass" and held.reasons == []
    fell = judge(rec, StoredCase(1.0, {"eager": StoredProvider(2.5, 2.5)}), tolerance=0.05)
    assert fell.status == "fail" and "speedup over eager 2.000" in fell.reasons[0]
    assert rec.status == "new"  # the record judged is a copy
    assert judge(rec, None, strict=True).status == "fail"


class FallbackTimer:
    """Captures every provider but ``eager`` (its prepare says so), and offers prepare_synced."""

    method = "graph-ish"

    def __init__(self):
        self.synced = []

    def sync(self):
        pass

    def peak_memory(self, name, fn):
        return None

    def prepare(self, name, fn):
        def run():
            fn()
            return 1.0

        run.method = "cuda-events" if name == "eager" else "graph-ish"
        if name == "eager":
            run.note = "graph capture failed (RuntimeError: test)"
        return run

    def prepare_synced(self, name, fn):
        self.synced.append(name)

        def run():
            fn()
            return 2.0

        run.method = SYNC_METHOD
        return run


def test_one_timing_method_per_case_when_a_provider_cannot_be_captured():
    from pytest_fusion.measure.timing import measure

    timer = FallbackTimer()
    out = measure({"kernel": lambda: None, "eager": lambda: None}, timer, rounds=3, warmup=0)
    assert timer.synced == ["kernel", "eager"]
    assert {t.method for t in out.values()} == {SYNC_METHOD} and out["kernel"].samples_ms == [2.0] * 3
    assert out["eager"].note.startswith("graph capture failed (RuntimeError: test); every provider timed with "
                                        "device-wide synchronisation: eager could not be captured")


def test_the_gpu_timers_flush_writes_nothing_into_the_l2():
    """CudaGraphTimer flushes the L2 by reading 256 MB: a write (do_bench's memset) leaves the L2
    dirty and the next timed span pays the write-back (docs/timing-and-gate.md). Built on the CPU
    here, where the flush is the same tensor op."""
    from pytest_fusion.measure.timers import L2_FLUSH_BYTES, CudaGraphTimer

    timer = CudaGraphTimer("cpu")
    assert timer.flush.numel() * timer.flush.element_size() == L2_FLUSH_BYTES
    timer.flush.fill_(7)
    timer.flush_l2()
    assert bool((timer.flush == 7).all()) and timer.method == GRAPH_METHOD


def test_inputs_rotate_before_every_sample_and_the_timed_output_is_verified():
    import torch

    from pytest_fusion.measure.timers import CpuTimer
    from pytest_fusion.measure.recompute import InputSets, NotRecomputed, check_recomputed
    from pytest_fusion.measure.timing import measure

    x = torch.arange(4.0)
    sets = InputSets([x], [[x + 10], [x + 20]])
    seen = []

    def kernel():
        seen.append(float(x[0]))
        return x * 2

    checked = []

    def verify(timed):
        checked.extend((i, out.tolist()) for i, out in timed)

    measure({"kernel": kernel}, ScriptedTimer({"kernel": 1.0}), rounds=4, warmup=0, inputs=sets, verify=verify)
    assert checked == [] and float(x[0]) == 0.0  # a timer that never calls: nothing to verify; set 0 restored
    seen.clear()
    measure({"kernel": kernel}, CpuTimer(min_sample_s=0.0), rounds=4, warmup=0, inputs=sets, verify=verify)
    assert {0.0, 10.0, 20.0} <= set(seen)  # every set met during timing
    # four consecutive timed calls, on sets 1, 2, 0, 1, each output its own
    assert checked == [(1, [20.0, 22.0, 24.0, 26.0]), (2, [40.0, 42.0, 44.0, 46.0]), (0, [0.0, 2.0, 4.0, 6.0]),
                       (1, [20.0, 22.0, 24.0, 26.0])]
    with pytest.raises(NotRecomputed, match="output not recomputed during timing.*timed call 2 of 2"):
        check_recomputed([(1, 1e-3), (2, 1.0)], 1e-3)  # stale on the second call
    with pytest.raises(NotRecomputed, match="timed call 1 of 2"):
        check_recomputed([(1, 1.0), (2, 1e-3)], 1.0)  # stale on the first, and on the fresh call: the best judges
    check_recomputed([(1, 0.03), (2, 0.02)], 0.01)  # within 4x of the best
    check_recomputed([(1, 0.009), (2, 0.0)], 0.0)  # under the floor, though the best is exact


def test_cpu_calls_see_new_values_every_call():
    """A kernel memoizing by value (a checksum of a few elements) returned the right result for
    each of the three sets without computing it; per-call loads now roll each set's floating
    values by the count of loads (InputSets.advance), so a memo keyed on values misses; ints
    stay put, and set 0 is back as it was after the rounds."""
    import torch

    from pytest_fusion.measure.timers import CpuTimer
    from pytest_fusion.measure.recompute import InputSets
    from pytest_fusion.measure.timing import measure

    x, idx = torch.arange(1.0, 129.0), torch.arange(4)
    original = x.clone()
    sets = InputSets([x, idx], [[x + 1000, idx], [x + 2000, idx]])
    seen = []

    def kernel():
        seen.append((tuple(x[:4].tolist()), tuple(idx.tolist())))
        return x * 2

    measure({"kernel": kernel}, CpuTimer(min_sample_s=0.0), rounds=300, warmup=0, inputs=sets)
    timed = [v for v, _ in seen[-300:]]  # the rounds' calls (no verify: none after them)
    assert len(set(timed)) == 300  # no fingerprint twice in 300 calls
    assert {i for _, i in seen} == {(0, 1, 2, 3)}  # an int input is not rolled
    assert torch.equal(x, original)


def test_implausible_bounds_tell_read_mostly_kernels_apart():
    from pytest_fusion.measure.peaks import implausible

    peaks = {"tflops": 100.0, "gbps": 1000.0, "read_gbps": 1500.0}
    assert implausible(129.0, 1140.0, peaks, read_mostly=False) == []
    (line,) = implausible(131.0, None, peaks, read_mostly=False)
    assert "131 TFLOP/s is 131% of the measured matmul peak (tflops 100" in line
    fp32 = {**peaks, "tflops_tf32": 400.0}  # a float32 case on a GPU: the IEEE peak bounds unless TF32 is declared
    (line,) = implausible(200.0, None, fp32, read_mostly=False)
    assert "200 TFLOP/s is 200% of the measured matmul peak (tflops 100" in line
    assert implausible(200.0, None, fp32, read_mostly=False, fp32_precision="tf32") == []
    (line,) = implausible(600.0, None, fp32, read_mostly=False, fp32_precision="tf32")
    assert "(tflops_tf32 400 TFLOP/s" in line
    (line,) = implausible(None, 1200.0, peaks, read_mostly=False)
    assert "of the measured copy bandwidth" in line
    assert implausible(None, 1200.0, peaks, read_mostly=True) == []  # a reduction may out-read a copy
    assert implausible(None, 1200.0, peaks, read_mostly=False, bound_bandwidth=False) == []  # CPU


def test_sub_floor_timings_are_refused():
    from pytest_fusion.measure.stats import check_times

    check_times("kernel", [1e-5, 1.0])
    for bad in (1e-300, 0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="not positive, finite and >= 1e-05 ms"):
            check_times("kernel", [1.0, bad])


def test_a_graph_replay_is_verified_though_it_calls_no_python():
    """A CUDA-graph replay runs the captured kernel without calling its Python function: its output
    (the one captured) is still verified on set 1. The replay below repeats what a caching kernel's
    graph does, a copy of the result from capture time, so the verified output is set 0's."""
    import torch

    from pytest_fusion.measure.recompute import InputSets
    from pytest_fusion.measure.timing import measure

    x = torch.arange(4.0)
    sets = InputSets([x], [[x + 10], [x + 20]])
    captured = {}

    class ReplayTimer:
        method = GRAPH_METHOD

        def sync(self):
            pass

        def peak_memory(self, name, fn):
            return None

        def prepare(self, name, fn):
            captured[name] = fn()  # capture: the one Python call; replays only re-run its copy

            def replay():
                return 1.0

            replay.method = GRAPH_METHOD
            return replay

    checked = []
    measure({"kernel": lambda: x * 2}, ReplayTimer(), rounds=3, warmup=0, inputs=sets,
            verify=lambda timed: checked.extend((i, out.tolist()) for i, out in timed))
    # sets 1, 2, 0, 1 loaded in turn, the stale captured output judged each time
    assert checked == [(i, [0.0, 2.0, 4.0, 6.0]) for i in (1, 2, 0, 1)]


@pytest.mark.parametrize("clock, threads, noted", [("process", 2, True), ("process", 1, False), ("wall", 2, False)])
def test_the_process_clock_beside_several_torch_threads_is_said(clock, threads, noted, recwarn):
    from pytest_fusion.measure.timers import CpuTimer

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rec = case(CpuTimer(min_sample_s=0.0, clock=clock))
    finally:
        torch.set_num_threads(before)
    said = [n for n in rec.notes if "intra-op threads" in n]
    assert bool(said) is noted, rec.notes
    assert any("intra-op threads" in str(w.message) for w in recwarn) is noted
    if noted:
        assert f"torch's {threads} intra-op threads" in said[0] and "torch.set_num_threads(1)" in said[0]


def test_a_re_measure_past_the_round_cap_says_its_rule_and_keeps_to_it():
    # The time floor takes the first measurement to its cap of 100 rounds; the re-measure's 4x floor
    # and 4x cap take it to 400: more than --fusion-max-rounds, as its line says before it starts.
    lines = []
    settings = Settings(rounds=10, warmup=0, min_time_s=0.5, max_rounds=100, providers=("eager",))
    rec = case(ScriptedTimer({"kernel": SPREAD, "eager": 2.0}), settings=settings, notify=lines.append)
    assert lines == ["re-measuring with 4x the rounds in reverse provider order: the first measurement "
                     "(100 rounds) was too noisy to judge; 4x each of the minimum rounds, time floor and round "
                     "cap: at least 40 rounds, more until every provider's samples sum to 2 s, at most 400"]
    assert rec.rounds == 400 and any("re-measured with 400 rounds" in n for n in rec.notes), rec.notes
    lines.clear()
    settings = Settings(rounds=10, warmup=0, min_time_s=0.005, max_rounds=100, providers=("eager",))
    rec = case(ScriptedTimer({"kernel": SPREAD, "eager": 2.0}), settings=settings, notify=lines.append)
    assert "more until every provider's samples sum to 0.02 s, at most 400" in lines[0], lines
    assert 40 <= rec.rounds < 400, rec.rounds  # the floor, not the cap, decided


def test_a_re_measure_is_told_as_it_starts_and_a_steady_case_tells_nothing():
    lines = []
    case(ScriptedTimer({"kernel": SPREAD, "eager": 2.0}), notify=lines.append)
    assert lines == ["re-measuring with 4x the rounds in reverse provider order: the first measurement "
                     "(10 rounds) was too noisy to judge; 4x the minimum rounds: 40 rounds, with no time floor"]
    lines.clear()
    stored = StoredCase(1.0, {"eager": StoredProvider(3.0, 3.0)})  # 2x now: below its threshold
    case(ScriptedTimer({"kernel": 1.0, "eager": 2.0}), stored=stored, notify=lines.append)
    assert lines == ["re-measuring with 4x the rounds in reverse provider order: the first measurement "
                     "(10 rounds) was below its threshold; 4x the minimum rounds: 40 rounds, with no time floor"]
    lines.clear()
    case(ScriptedTimer({"kernel": 1.0, "eager": 2.0}), notify=lines.append)
    assert lines == []

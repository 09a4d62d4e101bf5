"""``--fusion-bench`` end to end through pytester: options, skips, the gate as outcomes, files."""

import json
import re
import textwrap
from pathlib import Path

import pytest

# In-process pytester runs drop modules first imported inside them from sys.modules afterwards;
# torch cannot be imported twice in one process (the second import crashes), so import it here.
import torch  # noqa: F401
import triton  # noqa: F401

import pytest_fusion.plugin.bench_session  # noqa: F401
from pytest_fusion.measure.timers import GRAPH_METHOD
from fakes import FAKE_TIMER_CONFTEST, KERNEL_TEST, bench, saved, set_times, write_project


def test_without_flag_nothing_is_timed(pytester):
    write_project(pytester, times={"kernel": 1.0, "eager": 2.0})
    result = pytester.runpytest_inprocess("--collect-only", "-q")
    assert "bench-" not in result.stdout.str()
    result = pytester.runpytest_inprocess("--collect-only", "-q", "--fusion-bench")
    result.stdout.fnmatch_lines(["*test_relu_linear[[]bench-small-float32[]]*"])


def test_fusion_cases_selects_by_glob(pytester):
    write_project(pytester, bench="{'decode': dict(M=1, K=8, N=8), 'prefill': dict(M=64, K=8, N=8)}")
    result = pytester.runpytest_inprocess("--collect-only", "-q", "--fusion-bench", "--fusion-cases=dec*")
    out = result.stdout.str()
    assert "bench-decode-float32" in out and "bench-prefill" not in out
    result = pytester.runpytest_inprocess("--collect-only", "-q", "--fusion-bench", "--fusion-cases=nothing,prefill-float32")
    out = result.stdout.str()
    assert "bench-prefill-float32" in out and "bench-decode" not in out


def test_cpu_kernel_timed_with_summary_and_triton_kernel_skipped(pytester, cpu_only):
    write_project(pytester, fake=False)
    pytester.makepyfile(test_triton=textwrap.dedent(
        """
        import pytest, torch
        @pytest.mark.fused_kernel(reference=torch.relu, inputs={"x": ("M",)}, dims={"M": (1, 64)},
                                  dtypes=("float32",), bench={"one": dict(M=64)})
        def test_triton_relu():
            return torch.relu
        """))
    pytester.makepyfile(test_cuda_only=textwrap.dedent(
        """
        import pytest, torch
        @pytest.mark.fused_kernel(reference=torch.relu, inputs={"x": ("M",)}, dims={"M": (1, 64)},
                                  dtypes=("float32",), triton=False, device="cuda", bench={"one": dict(M=64)})
        def test_cuda_relu():
            return torch.relu
        """))
    result = bench(pytester, "--fusion-rounds=5", "--fusion-warmup=1", "-rs", "-v")  # -v: the wide table
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(["*SKIPPED*bench needs a CUDA device (the kernel declares device='cuda')*"])
    result.stdout.fnmatch_lines([
        "*pytest-fusion bench*",
        "test_kernel.py::test_relu_linear*perf_counter*",
        "*case*dtype*kernel ms*eager ms*vs eager*TFLOP/s*cold s*gate*",
        "*small*float32*x [[]*new*",
    ])
    skipped = pytester.runpytest_inprocess("--fusion-bench", "-k", "triton_relu and bench", "-rs")
    skipped.stdout.fnmatch_lines(["*SKIPPED*interpreter are not kernel timings*"])


def test_gate_through_pytest_with_fake_timer(pytester):
    write_project(pytester, times={"kernel": 1.0, "eager": 2.0})
    bench(pytester, "--fusion-save").assert_outcomes(passed=1)
    data, path = saved(pytester)
    entry = data["cases"]["test_kernel.py::test_relu_linear"]["small"]["float32"]
    assert entry["kernel_ms"] == 1.0 and entry["providers"]["eager"]["speedup"] == 2.0

    set_times(pytester, kernel=1.0, eager=1.9)  # exactly stored x (1 - 0.05)
    bench(pytester).assert_outcomes(passed=1)

    set_times(pytester, kernel=1.0, eager=1.899)  # just below: the baseline got faster
    result = bench(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*failed the performance gate*",
        "*speedup over eager 1.899*< 1.900 = stored 2.000 x (1 - 0.05)*the baseline (eager) got faster*"
        "kernel 1 ms (was 1 ms, +0.0%), eager 1.899 ms (was 2 ms, -5.0%)*",
    ])

    set_times(pytester, kernel=1.1, eager=2.0)  # the kernel got slower
    result = bench(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*the kernel got slower (judged from absolute times): kernel 1.1 ms (was 1 ms, +10.0%)*"])
    assert bench(pytester, "--fusion-tolerance=0.1").ret == 0  # 1.818 >= 2 x 0.9: passes

    spread = [0.7 + 0.6 * ((i * 7) % 37) / 36 for i in range(37)]  # uniform 0.7..1.3 ms, shuffled
    set_times(pytester, kernel=spread, eager=2.0)  # too noisy to judge, even re-measured
    result = bench(pytester, "--fusion-rounds=10", "--fusion-min-time=0", "--fusion-save")  # 10 rounds, then 4 x 10
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*too noisy to judge*wide > tolerance 5.0% after 40 rounds*",
                                 "*ERROR not saved, too noisy to judge: test_kernel.py::test_relu_linear [[]small-float32[]]*"])
    assert path.read_text() == json.dumps(data, indent=2, sort_keys=True) + "\n"  # the noisy run was not saved


def test_a_gate_failure_is_printed_once_with_every_traceback_style(pytester, monkeypatch):
    # Under CI pytest's short summary repeats every failure's whole message: that repeat is pytest's.
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("BUILD_NUMBER", raising=False)
    write_project(pytester, times={"kernel": 1.0, "eager": 2.0})
    bench(pytester, "--fusion-save").assert_outcomes(passed=1)
    set_times(pytester, kernel=1.2, eager=2.0)
    reason = "the kernel got slower (judged from absolute times): kernel 1.2 ms (was 1 ms, +20.0%)"
    for tb in ("auto", "short", "line", "no"):  # --tb=no prints no failure report: the summary says it
        result = bench(pytester, f"--tb={tb}")
        result.assert_outcomes(failed=1)
        out = result.stdout.str()
        assert out.count(reason) == 1, (tb, out)
        result.stdout.fnmatch_lines(["*pytest-fusion bench*", "*small*float32*1.67x*fail*"])


def test_a_faster_compile_build_fails_only_a_slower_kernel_or_a_changed_environment(pytester):
    """torch.compile's builds of one reference differ (a faster build failed an unchanged kernel:
    docs/timing-and-gate.md, "The gate"): in the environment the baseline was saved in, a compile
    provider faster than stored is judged by the kernel's own time; after an upgrade it is a
    faster baseline and fails as one."""
    gpu = {"__method__": GRAPH_METHOD}  # builds differ on a GPU only
    write_project(pytester, times={"kernel": 1.0, "eager": 2.0, "compile": 2.2, **gpu})  # a slow build saved
    with_compile = ("--fusion-providers=eager,compile",)
    bench(pytester, *with_compile, "--fusion-save").assert_outcomes(passed=1)
    data, path = saved(pytester)

    set_times(pytester, kernel=1.0, eager=2.0, compile=2.0, **gpu)  # a faster build, the kernel unchanged
    result = bench(pytester, *with_compile)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*compile timed 2 ms against 2.2 ms stored, in the same environment: another build of the same "
        "code, so the stored speedup 2.200 is re-based onto this run's build (2.000) and the kernel's own "
        "time is judged: 1 ms (was 1 ms, +0.0%); not re-based, 2.000 < 2.090 would have failed*",
    ])
    assert "re-measured" not in result.stdout.str()  # the first measurement was judged re-based too

    set_times(pytester, kernel=1.1, eager=2.2, compile=2.0, **gpu)  # the kernel 10% slower, eager too
    result = bench(pytester, *with_compile)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*speedup over compile 1.818*< 1.900 = re-based stored 2.000 x (1 - 0.05); the kernel got slower "
        "(the stored speedup re-based onto this run's faster compile build): kernel 1.1 ms (was 1 ms, +10.0%), "
        "compile 2 ms (was 2.2 ms, -9.1%)*",
    ])

    entry = data["cases"]["test_kernel.py::test_relu_linear"]["small"]["float32"]
    entry["env"]["torch"] = "2.10.0"  # saved before an upgrade
    path.write_text(json.dumps(data))
    set_times(pytester, kernel=1.0, eager=2.0, compile=2.0, **gpu)
    result = bench(pytester, *with_compile)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*speedup over compile 2.000*< 2.090 = stored 2.200 x (1 - 0.05); the baseline (compile) got faster*",
    ])


def test_a_provider_kept_by_a_smaller_save_blames_the_kernel_it_was_timed_with(pytester):
    """A save with fewer providers keeps the stored others (their speedups still hold the kernel to
    the time they were measured with), beside the new kernel time. A slowed kernel re-saved with
    eager alone, then gated with both, must not read "the baseline (unfused) got faster": the
    message names the kernel and the time that speedup was timed against
    (docs/timing-and-gate.md, "Blame from absolute times")."""
    both = ("--fusion-providers=eager,unfused",)
    write_project(pytester, times={"kernel": 1.0, "eager": 2.0, "unfused": 2.1})
    bench(pytester, *both, "--fusion-save").assert_outcomes(passed=1)
    set_times(pytester, kernel=1.5, eager=2.0, unfused=2.4)  # the kernel 50% slower
    bench(pytester, "--fusion-save").assert_outcomes(failed=1)  # eager alone: fails, and is saved
    data, _ = saved(pytester)
    entry = data["cases"]["test_kernel.py::test_relu_linear"]["small"]["float32"]
    assert entry["kernel_ms"] == 1.5 and entry["providers"]["unfused"] == {
        "ms": 2.1, "speedup": 2.1, "low": 2.1, "high": 2.1}  # kept, timed against the 1 ms kernel

    result = bench(pytester, *both)
    result.assert_outcomes(failed=1)
    lines = [x for x in result.stdout.lines if "speedup over unfused" in x]
    assert lines and not any("the baseline (unfused) got faster" in x for x in lines)
    assert ("the kernel got slower (judged from absolute times: the stored speedup over unfused was "
            "measured against the kernel at 1 ms, and a later save that did not time unfused kept it "
            "beside its own kernel time, 1.5 ms): kernel 1.5 ms (was 1 ms, +50.0%), "
            "unfused 2.4 ms (was 2.1 ms, +14.3%)") in lines[0]


def test_on_the_cpu_a_faster_compile_is_not_re_based(pytester):
    """The CPU builds one compile of a reference, so a faster compile time there is the machine's
    speed moving, not another build; re-based, a slower kernel would pass (docs/timing-and-gate.md,
    "The gate")."""
    write_project(pytester, times={"kernel": 1.0, "eager": 2.0, "compile": 2.2, "__method__": "process_time"})
    with_compile = ("--fusion-providers=compile",)
    bench(pytester, *with_compile, "--fusion-save").assert_outcomes(passed=1)
    # The machine ran 30% faster this time, the kernel slowed by as much: kernel 1.0 ms, compile
    # 1.54 ms. Re-based, the kernel's own time (1.0 ms against 1.0 stored) would pass.
    set_times(pytester, kernel=1.0, compile=2.2 * 0.7, __method__="process_time")
    result = bench(pytester, *with_compile)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*speedup over compile 1.540*< 2.090 = stored 2.200 x (1 - 0.05)*"])
    assert "re-based" not in result.stdout.str()


def test_min_speedup_and_strict(pytester):
    pytester.makeconftest(FAKE_TIMER_CONFTEST)
    set_times(pytester, kernel=1.0, eager=1.2)
    pytester.makepyfile(test_floor=textwrap.dedent(
        """
        import pytest, torch
        @pytest.mark.fused_kernel(reference=torch.relu, inputs={"x": ("M",)}, dims={"M": (1, 64)},
                                  dtypes=("float32",), triton=False, bench={"one": dict(M=64)},
                                  min_speedup=1.5)
        def test_floor():
            return torch.relu
        """))
    result = bench(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*speedup over eager 1.200 is below min_speedup 1.500*"])
    set_times(pytester, kernel=1.0, eager=2.0)
    bench(pytester).assert_outcomes(passed=1)  # new case passes
    result = bench(pytester, "--fusion-strict")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*no baseline for this case in*--fusion-strict*"])


def test_real_cpu_timing_kernel_3x_slower_fails_unchanged_passes(pytester, monkeypatch, cpu_only):
    write_project(pytester, bench="{'mid': dict(M=256, K=256, N=256)}", fake=False)
    # Process time, one torch thread: this 2-core machine is shared, so wall-clock samples of a
    # preempted process are too noisy to judge, and OpenMP workers spin-waiting would count as
    # process time (measure.timers.CPU_CLOCKS). Two baselines, so the blame rests on speedups alone.
    args = ("--fusion-rounds=15", "--fusion-warmup=2", "--fusion-tolerance=0.25", "--fusion-cpu-clock=process",
            "--fusion-providers=eager,unfused")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        bench(pytester, *args, "--fusion-save").assert_outcomes(passed=1)
        bench(pytester, *args).assert_outcomes(passed=1)
        monkeypatch.setenv("SLOWDOWN", "3")
        result = bench(pytester, *args)
    finally:
        torch.set_num_threads(threads)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*failed the performance gate:",
                                 "*speedup over eager*the kernel got slower (the speedups over every provider fell)*"])


def test_corrupted_baseline_is_a_clear_error_and_never_overwritten(pytester):
    write_project(pytester, times={"kernel": 1.0, "eager": 2.0})
    bench(pytester, "--fusion-save").assert_outcomes(passed=1)
    data, path = saved(pytester)
    path.write_text('{"schema": 1, "cases": {')  # a save killed by hand-editing
    result = bench(pytester, "--fusion-save")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*baseline file {path}: is not valid JSON (Expecting*line 1 column*"])
    assert path.read_text() == '{"schema": 1, "cases": {'


def test_missing_baseline_dir_is_created_and_other_devices_named_once(pytester, cpu_only):
    write_project(pytester, bench="{'a': dict(M=8, K=8, N=8), 'b': dict(M=16, K=8, N=8)}",
                  times={"kernel": 1.0, "eager": 2.0})
    other = pytester.path / "perf" / "nvidia-h200.json"
    other.parent.mkdir()
    other.write_text(json.dumps({"schema": 1, "device": "nvidia-h200", "cases": {}}))
    result = bench(pytester, "--fusion-baseline-dir=perf")
    result.assert_outcomes(passed=2)
    assert result.stdout.str().count("files exist for other devices: nvidia-h200.json") == 1
    result = bench(pytester, "--fusion-baseline-dir=deep/new/dir", "--fusion-save")
    result.assert_outcomes(passed=2)
    (path,) = (pytester.path / "deep" / "new" / "dir").glob("*.json")
    assert sorted(json.loads(path.read_text())["cases"]["test_kernel.py::test_relu_linear"]) == ["a", "b"]


def test_a_file_under_the_cpus_model_name_alone_is_named_never_read_nor_changed(pytester, cpu_only):
    from pytest_fusion.machine import devices

    write_project(pytester, times={"kernel": 1.0, "eager": 2.0})
    new = pytester.path / "baselines" / f"{devices.device_slug('cpu')}.json"
    old = new.with_name(f"{devices.legacy_slug(devices.cpu_model())}.json")
    bench(pytester, "--fusion-save").assert_outcomes(passed=1)
    data = json.loads(new.read_text())
    data["device"] = old.stem  # as an older pytest-fusion saved it, maybe on another machine
    data["cases"]["test_kernel.py::test_relu_linear"]["small"]["float32"]["providers"]["eager"].update(
        speedup=10.0, low=9.9, high=10.1)  # read as this machine's, it would fail this run's 2x
    new.unlink()
    old.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    old_bytes = old.read_bytes()
    (pytester.path / "baselines" / "nvidia-h200.json").write_text(
        json.dumps({"schema": 2, "device": "nvidia-h200", "cases": {}}))

    result = bench(pytester)
    result.assert_outcomes(passed=1)  # as new: the old file was not read
    out = result.stdout.str()
    assert out.count(f"no baseline file for this device ({new.name})") == 1
    result.stdout.fnmatch_lines([
        f"*{old.name} is named by the device's model name alone*may hold another machine's timings and is not "
        f"read. If it was saved on this machine*rename it: git mv {old} {new}, then set its \"device\" to "
        f"\"{new.stem}\"; files exist for other devices: nvidia-h200.json. Cases are reported as new."])
    assert old.read_bytes() == old_bytes and not new.exists()

    result = bench(pytester, "--fusion-save")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*git mv {old} {new}*(this run's --fusion-save wrote {new.name} with this "
                                 f"run's cases alone: to keep {old.name}'s entries instead, delete {new.name} first*"])
    assert old.read_bytes() == old_bytes and json.loads(new.read_text())["device"] == new.stem

    new.unlink()  # the message's steps: the old file adopted as this machine's is gated against
    old.rename(new)
    new.write_text(new.read_text().replace(f'"device": "{old.stem}"', f'"device": "{new.stem}"'))
    result = bench(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*speedup over eager 2.000*< 9.405 = stored interval's low end 9.900*"])
    assert "is named by the device's model name alone" not in result.stdout.str()


def test_xdist_two_workers_all_records_saved_once(pytester):
    pytest.importorskip("xdist")
    cases = ", ".join(f"'c{i}': dict(M={8 * (i + 1)}, K=8, N=8)" for i in range(5))
    write_project(pytester, bench="{" + cases + "}", times={"kernel": 1.0, "eager": 2.0})
    result = pytester.runpytest_subprocess("-n", "2", "--fusion-bench", "--fusion-providers=eager",
                                           "-k", "bench", "--fusion-save", "--fusion-json=out.json",
                                           "--fusion-benchmark-json=pb.json")
    result.assert_outcomes(passed=5)
    data, _ = saved(pytester)
    assert sorted(data["cases"]["test_kernel.py::test_relu_linear"]) == ["c0", "c1", "c2", "c3", "c4"]
    records = json.loads((pytester.path / "out.json").read_text())["records"]
    assert sorted(r["case"] for r in records) == ["c0", "c1", "c2", "c3", "c4"]
    assert result.stdout.str().count("baseline written") == 1
    pb = json.loads((pytester.path / "pb.json").read_text())  # works where pytest-benchmark's fixture is off
    assert len(pb["benchmarks"]) == 10


def test_pin_worker_picks_one_gpu_per_worker(monkeypatch):
    from types import SimpleNamespace

    from pytest_fusion.machine.devices import pin_worker, visible_gpus

    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    assert visible_gpus() == ["4", "5", "6"]
    assert pin_worker(SimpleNamespace()) is None  # not an xdist worker: untouched
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")  # before workerinput exists (early hook)
    assert pin_worker(SimpleNamespace()) == "6"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert pin_worker(SimpleNamespace(workerinput={"workerid": "gw4"})) == "5"  # 4 mod 3 = 1
    assert visible_gpus() == ["5"]
    assert pin_worker(SimpleNamespace(workerinput={"workerid": "gw0"})) is None  # one GPU left: kept


def test_device_lock_is_exclusive_per_device(monkeypatch, tmp_path):
    import tempfile

    from pytest_fusion.machine.devices import device_lock
    from pytest_fusion.machine.locks import LockTimeout

    # A private lock directory: under xdist another worker may be timing on the real cpu lock.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    with device_lock("cpu", timeout=5, holder="a"):
        with pytest.raises(LockTimeout):
            with device_lock("cpu", timeout=0.05, holder="b"):
                pass
        with device_lock("cuda:0", timeout=0.05, holder="c"):  # another device's lock is free
            pass


@pytest.mark.parametrize(
    "args, message",
    [
        (["--fusion-tolerance=1.5"], "*--fusion-tolerance*fraction in [[]0, 1)*"),
        (["--fusion-rounds=0"], "*--fusion-rounds*integer >= 1*"),
        (["--fusion-compile-mode=fast"], "*--fusion-compile-mode*expected one of default*"),
        (["--fusion-compile-builds=0"], "*--fusion-compile-builds*integer >= 1*"),
        (["--fusion-providers=all,eager"], "*--fusion-providers*cannot be combined*"),
        (["--fusion-min-time=-0.1"], "*--fusion-min-time*seconds >= 0, got -0.1*"),
        (["--fusion-min-time=50ms"], "*--fusion-min-time*expected seconds such as 0.05, got '50ms'*"),
        (["--fusion-max-rounds=0"], "*--fusion-max-rounds*integer >= 1*"),
        (["--fusion-rounds=40", "--fusion-max-rounds=20"],
         "*--fusion-max-rounds (or ini fusion_max_rounds) is 20, below --fusion-rounds (40)*"),
        (["--fusion-save"], "*--fusion-save (or ini fusion_save) stores what a --fusion-bench run measures*"),
    ],
)
def test_bad_option_values_are_usage_errors(pytester, args, message):
    result = pytester.runpytest_inprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_time_floor_sets_the_recorded_rounds(pytester):
    write_project(pytester, times={"kernel": 1.0, "eager": 2.0})

    def rounds(*args):
        bench(pytester, "--fusion-rounds=5", "--fusion-json=out.json", *args).assert_outcomes(passed=1)
        (rec,) = json.loads((pytester.path / "out.json").read_text())["records"]
        assert {len(p["samples_ms"]) for p in rec["providers"].values()} == {rec["rounds"]}
        return rec["rounds"]

    assert rounds("--fusion-min-time=0") == 5
    assert rounds("--fusion-min-time=0.02") == 20  # the 1 ms kernel needs 20 rounds for 20 ms
    assert rounds() == 50  # default floor 0.05 s
    assert rounds("--fusion-max-rounds=30") == 30
    pytester.makeini("[pytest]\nfusion_min_time = 0.012\n")
    assert rounds() == 12
    assert rounds("--fusion-min-time=0.008") == 8  # the command line wins over the ini
    # A minimum above the default cap of 1000 raises the cap rather than erroring.
    assert rounds("--fusion-rounds=1001", "--fusion-min-time=0") == 1001
    pytester.makeini("[pytest]\nfusion_max_rounds = 3\n")
    result = pytester.runpytest_inprocess("--fusion-rounds=4")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*fusion_max_rounds) is 3, below --fusion-rounds (4)*"])
    pytester.makeini("[pytest]\nfusion_min_time = -1\n")
    result = pytester.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bad value '-1' in ini option fusion_min_time*seconds >= 0*"])


def test_ini_options_and_cli_precedence(pytester):
    write_project(pytester, times={"kernel": 1.0, "eager": 1.85})
    pytester.makeini("[pytest]\nfusion_bench = true\nfusion_providers = eager\nfusion_tolerance = 0.1\n"
                     "fusion_baseline_dir = perf\n")
    (pytester.path / "perf").mkdir()
    set_times(pytester, kernel=1.0, eager=2.0)
    assert pytester.runpytest_inprocess("-k", "bench", "--fusion-save").ret == 0
    assert (pytester.path / "perf").glob("*.json")
    set_times(pytester, kernel=1.0, eager=1.85)  # -7.5%: inside the ini's 10%, outside the CLI's 5%
    pytester.runpytest_inprocess("-k", "bench").assert_outcomes(passed=1)
    pytester.runpytest_inprocess("-k", "bench", "--fusion-tolerance=0.05").assert_outcomes(failed=1)
    pytester.makeini("[pytest]\nfusion_tolerance = lots\n")
    result = pytester.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bad value 'lots' in ini option fusion_tolerance*"])


def test_fusion_fixture_bench_call(pytester):
    pytester.makeconftest(FAKE_TIMER_CONFTEST)
    set_times(pytester, kernel=1.0, eager=3.0)
    pytester.makepyfile(test_hand=textwrap.dedent(
        """
        import torch

        def test_hand_written(fusion):
            x = torch.randn(32, 16)
            rec = fusion.bench("relu-32", torch.relu, x, reference=lambda t: torch.clamp(t, min=0),
                               flops=32 * 16, min_speedup=2.0, triton=False)
            assert rec.case == "relu-32" and rec.dtype == "float32" and rec.dims == {"M": 32}
            assert rec.providers["eager"].speedup == 3.0
        """))
    pytester.runpytest_inprocess("--fusion-bench", "--fusion-providers=eager").assert_outcomes(passed=1)
    pytester.runpytest_inprocess().assert_outcomes(skipped=1)


def test_fusion_fixture_bench_call_refuses_dims_a_baseline_cannot_hold(pytester):
    pytester.makeconftest(FAKE_TIMER_CONFTEST)
    set_times(pytester, kernel=1.0, eager=3.0)
    pytester.makepyfile(test_hand=textwrap.dedent(
        """
        import torch

        def test_float_dims(fusion):
            fusion.bench("relu", torch.relu, torch.randn(4), reference=torch.relu, dims={"M": 4.5}, triton=False)
        """))
    result = pytester.runpytest_inprocess("--fusion-bench", "--fusion-providers=eager", "--fusion-save")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*fusion.bench('relu'): dims must be a {symbol: int >= 0} mapping, got {'M': 4.5}*"])
    assert not (pytester.path / "baselines").exists()


def test_report_files_are_the_runs_records(pytester, monkeypatch):
    from pytest_fusion.report import files as report
    from pytest_fusion.measure.record import BenchRecord

    write_project(pytester, bench="{'a': dict(M=8, K=8, N=8), 'b': dict(M=32, K=8, N=8)}",
                  times={"kernel": 1.0, "eager": 2.5})
    summary = pytester.path / "step_summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = bench(pytester, "--fusion-json=out/r.json", "--fusion-markdown=out/r.md", "--fusion-plot=out/plots",
                   "--fusion-benchmark-json=out/b.json")
    result.assert_outcomes(passed=2)
    out = pytester.path / "out"
    records = [BenchRecord.from_dict(d) for d in json.loads((out / "r.json").read_text())["records"]]
    assert [(r.case, r.providers["eager"].speedup) for r in records] == [("a", 2.5), ("b", 2.5)]
    md = report.markdown(records)
    assert (out / "r.md").read_text() == md
    assert summary.read_text() == "earlier step\n" + md  # appended, not replaced
    (png,) = (out / "plots").glob("*.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    bench_json = json.loads((out / "b.json").read_text())
    assert sorted(b["name"] for b in bench_json["benchmarks"]) == [
        "test_relu_linear[bench-a-float32-eager]", "test_relu_linear[bench-a-float32-kernel]",
        "test_relu_linear[bench-b-float32-eager]", "test_relu_linear[bench-b-float32-kernel]"]


def test_kernel_wrong_at_the_bench_shape_is_not_timed_or_saved(pytester):
    write_project(pytester, times={"kernel": 1.0, "eager": 2.0})
    src = (pytester.path / "test_kernel.py").read_text()
    (pytester.path / "test_kernel.py").write_text(src.replace(".clamp_min_(0)\n    for", ".clamp_min_(0) * 1.01\n    for"))
    result = bench(pytester, "--fusion-save")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*not timed: the kernel fails its correctness check at bench case 'small'*",
                                 "*[[]pytest-fusion] mismatch:*"])
    assert not (pytester.path / "baselines").exists() or not list((pytester.path / "baselines").glob("*.json"))


PER_CASE_TIMER = FAKE_TIMER_CONFTEST + textwrap.dedent(
    """
    current = {}

    def pytest_runtest_setup(item):
        current["nodeid"] = item.nodeid

    def pytest_fusion_make_timer(config, device):  # times.json: {case name: {provider: times}}
        times = json.loads(pathlib.Path(config.rootpath, "times.json").read_text())
        (case,) = [c for c in times if f"[bench-{c}-" in current["nodeid"]]
        return FakeTimer(times[case])
    """
)


def failures_section(result):
    """The FAILURES section only: under CI=true pytest repeats each message in the short summary."""
    out = result.stdout.str()
    return out.split("= FAILURES =", 1)[-1].split("short test summary info", 1)[0]


def test_noisy_new_case_is_not_saved_and_the_rest_is(pytester):
    pytester.makeconftest(PER_CASE_TIMER)
    pytester.makepyfile(test_kernel=KERNEL_TEST.replace(
        "BENCH", "{'steady': dict(M=16, K=8, N=8), 'noisy': dict(M=32, K=8, N=8)}"))
    spread = [0.7 + 0.6 * ((i * 7) % 37) / 36 for i in range(37)]  # uniform 0.7..1.3 ms, shuffled
    set_times(pytester, steady={"kernel": 1.0, "eager": 2.0}, noisy={"kernel": spread, "eager": 2.0})
    result = bench(pytester, "--fusion-rounds=10", "--fusion-min-time=0", "--fusion-save")
    result.assert_outcomes(passed=2)  # new cases are not gated, noisy or not
    assert result.ret != 0  # but the save asked for was refused for one of them
    result.stdout.fnmatch_lines([
        "*note noisy-float32: too noisy to judge*after 40 rounds (not gated; *--fusion-save will not store it)",
        "*note noisy-float32: new case: no baseline in *; too noisy for --fusion-save to record it",
        "*baseline written: *(1 case(s) saved)",
        "*ERROR not saved, too noisy to judge: test_kernel.py::test_relu_linear [[]noisy-float32[]]*",
    ])
    assert "steady-float32: new case: no baseline in" in result.stdout.str()
    data, path = saved(pytester)
    assert sorted(data["cases"]["test_kernel.py::test_relu_linear"]) == ["steady"]

    # Once quiet, the new case is saved beside the kept one, and the run succeeds.
    set_times(pytester, steady={"kernel": 1.0, "eager": 2.0}, noisy={"kernel": 1.0, "eager": 3.0})
    result = bench(pytester, "--fusion-rounds=10", "--fusion-min-time=0", "--fusion-save")
    result.assert_outcomes(passed=2)
    assert result.ret == 0
    data, _ = saved(pytester)
    assert sorted(data["cases"]["test_kernel.py::test_relu_linear"]) == ["noisy", "steady"]


def test_stored_case_with_a_noisy_new_provider_is_not_saved(pytester):
    write_project(pytester, times={"kernel": 1.0, "eager": 2.0})
    bench(pytester, "--fusion-save").assert_outcomes(passed=1)  # eager only
    data, path = saved(pytester)
    before = path.read_text()
    spread = [1.4 + 1.2 * ((i * 7) % 37) / 36 for i in range(37)]  # uniform 1.4..2.6 ms, shuffled
    set_times(pytester, kernel=1.0, eager=2.0, unfused=spread)
    result = bench(pytester, "--fusion-rounds=10", "--fusion-min-time=0", "--fusion-save",
                   "--fusion-providers=eager,unfused")
    result.assert_outcomes(passed=1)  # eager is gated and steady; unfused has no baseline to judge
    result.stdout.fnmatch_lines([
        "*note small-float32: too noisy to judge: speedup over unfused*(not gated; *--fusion-save will not store it)",
        "*ERROR not saved, too noisy to judge: test_kernel.py::test_relu_linear [[]small-float32[]]*",
    ])
    assert path.read_text() == before


def test_changed_dims_under_the_same_case_name_fail_until_re_saved(pytester):
    write_project(pytester, times={"kernel": 1.0, "eager": 2.0})
    bench(pytester, "--fusion-save").assert_outcomes(passed=1)
    data, path = saved(pytester)
    data["cases"]["test_kernel.py::test_relu_linear"]["small"]["float32"]["dims"] = {"M": 999}
    path.write_text(json.dumps(data))
    result = bench(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*failed the performance gate:",
        "*the baseline entry was measured at dims {M=999} but this case now runs at {K=32, M=16, N=32}: "
        "not compared*re-save it with --fusion-save",
    ])
    bench(pytester, "--fusion-save").assert_outcomes(failed=1)  # fails once more, and stores the new dims
    data, _ = saved(pytester)
    assert data["cases"]["test_kernel.py::test_relu_linear"]["small"]["float32"]["dims"] == {"K": 32, "M": 16, "N": 32}
    bench(pytester).assert_outcomes(passed=1)


@pytest.mark.parametrize("corrupt", ["env", "json"])
def test_corrupt_entry_is_one_clear_message_and_never_overwritten(pytester, corrupt):
    write_project(pytester, times={"kernel": 1.0, "eager": 2.0})
    bench(pytester, "--fusion-save").assert_outcomes(passed=1)
    data, path = saved(pytester)
    if corrupt == "env":
        data["cases"]["test_kernel.py::test_relu_linear"]["small"]["float32"]["env"] = [1, 2, 3]
        content = json.dumps(data)
        message = (f"baseline file {path}: cases['test_kernel.py::test_relu_linear']['small']['float32'].env "
                   f"must be an object of strings, numbers or null, got [1, 2, 3] (fix or delete it; it was not changed)")
    else:
        content = '{"schema": 1, "cases": {'
        message = f"baseline file {path}: is not valid JSON (Expecting property name"
    path.write_text(content)
    result = bench(pytester, "--fusion-save")
    result.assert_outcomes(failed=1)
    failures = failures_section(result)
    assert failures.count(message) == 1, failures
    assert "During handling" not in failures and "direct cause" not in failures
    assert "Traceback" not in failures and "TypeError" not in failures
    assert path.read_text() == content


FIRST_PROCESS_TIMES = textwrap.dedent(
    """
    import os, pathlib

    _make_timer = pytest_fusion_make_timer

    def pytest_fusion_make_timer(config, device):
        '''times.json in the first process that asks (its pid kept in first.pid), replay.json in any
        other: a kernel slow in one process only, as a memory placement or a clock can make it.'''
        first = pathlib.Path(config.rootpath, "first.pid")
        if not first.exists():
            first.write_text(str(os.getpid()))
        timer = _make_timer(config, device)
        other = pathlib.Path(config.rootpath, "replay.json")
        if timer is not None and first.read_text() != str(os.getpid()) and other.exists():
            timer.times = json.loads(other.read_text())
            timer.method = timer.times.pop("__method__", timer.method)
        return timer
    """
)


def test_a_failure_on_timing_alone_is_replayed_in_a_fresh_process_whose_verdict_stands(pytester):
    pytester.makeconftest(FAKE_TIMER_CONFTEST + FIRST_PROCESS_TIMES)
    write_project(pytester, times={"kernel": 1.0, "eager": 2.0}, fake=False)
    bench(pytester, "--fusion-save").assert_outcomes(passed=1)
    data, path = saved(pytester)
    set_times(pytester, kernel=1.2, eager=2.0)  # this process: the kernel 20% slower
    (pytester.path / "replay.json").write_text(json.dumps({"kernel": 1.0, "eager": 2.0}))  # a fresh one: not

    result = bench(pytester, "--fusion-replay=on", "--fusion-json=report.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([  # said as the child starts: it takes a pytest start-up and the set-up again
        "pytest-fusion: test_kernel.py::test_relu_linear[[]bench-small-float32[]]: failed the gate on timing "
        "alone (speedup over eager 1.667*); replaying it in a fresh process (up to 900 s)",
    ])
    note = ("*replayed in a fresh process, which passed; the first process failed the gate (kernel 1.2 ms; "
            "speedup over eager 1.667*< 1.900*the kernel got slower*")
    result.stdout.fnmatch_lines([note])
    (record,) = json.loads((pytester.path / "report.json").read_text())["records"]
    assert record["status"] == "pass" and record["providers"]["kernel"]["median_ms"] == 1.0  # the replay's

    (pytester.path / "replay.json").write_text(json.dumps({"kernel": 1.2, "eager": 2.0}))  # slow in both
    result = bench(pytester, "--fusion-replay=on")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*failed the performance gate:",
        "*speedup over eager 1.667*< 1.900*the kernel got slower*kernel 1.2 ms (was 1 ms, +20.0%)*",
        "*replayed in a fresh process, which failed too (the first: kernel 1.2 ms, 1.667x over eager)*",
    ])

    (pytester.path / "replay.json").write_text(json.dumps({"kernel": 1.0, "eager": 2.0}))
    result = bench(pytester, "--fusion-replay=off")  # the first verdict stands
    result.assert_outcomes(failed=1)
    result.stdout.no_fnmatch_line("*replayed in a fresh process*")
    result.stdout.no_fnmatch_line("*replaying it in a fresh process*")
    assert path.read_text() == json.dumps(data, indent=2, sort_keys=True) + "\n"  # no child wrote the file


def test_a_replay_that_cannot_run_leaves_the_failure_standing_and_says_why(pytester, monkeypatch):
    write_project(pytester, times={"kernel": 1.0, "eager": 2.0})
    bench(pytester, "--fusion-save").assert_outcomes(passed=1)
    set_times(pytester, kernel=1.2, eager=2.0)
    monkeypatch.setattr("pytest_fusion.plugin.replay.REPLAY_TIMEOUT_S", 0.01)  # the child never gets to time
    result = bench(pytester, "--fusion-replay=on")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*not replayed in a fresh process: the child process ran past 0.01 s*"])


def test_a_replay_settings_variable_set_by_hand_is_a_usage_error_naming_it(pytester, monkeypatch):
    write_project(pytester)
    monkeypatch.setenv("PYTEST_FUSION_REPLAY_OF", '{"no_such_setting": 1}')
    result = pytester.runpytest_inprocess("--collect-only", "-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*$PYTEST_FUSION_REPLAY_OF is set but holds no pytest-fusion settings*unset it*"])


def test_a_replay_timed_another_way_or_capped_leaves_the_first_verdict_with_a_note(pytester, monkeypatch):
    pytester.makeconftest(FAKE_TIMER_CONFTEST + FIRST_PROCESS_TIMES)
    write_project(pytester, times={"kernel": 1.0, "eager": 2.0}, fake=False)
    bench(pytester, "--fusion-save").assert_outcomes(passed=1)
    set_times(pytester, kernel=1.2, eager=2.0)
    # The child times with another timer (as when a -p timer plugin did not load there): its pass
    # or its "not comparable" would answer another question, so the first verdict stands.
    (pytester.path / "replay.json").write_text(json.dumps({"kernel": 1.0, "eager": 2.0, "__method__": "other"}))
    result = bench(pytester, "--fusion-replay=on")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*not replayed in a fresh process: the child process timed with 'other', "
                                 "this one with 'fake'*"])

    monkeypatch.setattr("pytest_fusion.plugin.replay.MAX_REPLAYS", 0)  # past the cap: no child at all
    (pytester.path / "replay.json").write_text(json.dumps({"kernel": 1.0, "eager": 2.0}))
    result = bench(pytester, "--fusion-replay=on")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*not replayed in a fresh process: 0 cases already were in this process*"])


def test_the_child_gets_the_command_line_plugins_and_an_argument_that_works_outside_the_rootdir(tmp_path):
    from types import SimpleNamespace

    from pytest_fusion.plugin import replay

    assert replay.plugin_args(["-p", "mytimer", "-pother", "--fusion-bench", "-k", "bench", "-p"]) == [
        "-p", "mytimer", "-p", "other"]
    outside = SimpleNamespace(nodeid="::test_k[bench-small-float32]", path=tmp_path / "test_k.py")
    assert replay._target(outside) == f"{tmp_path / 'test_k.py'}::test_k[bench-small-float32]"
    inside = SimpleNamespace(nodeid="sub/test_k.py::TestK::test_k[x]", path=tmp_path / "sub" / "test_k.py")
    assert replay._target(inside) == f"{tmp_path / 'sub' / 'test_k.py'}::TestK::test_k[x]"


def test_the_readmes_cpu_gate_settings_are_ini_keys_that_take_effect(pytester):
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    block = re.search(r"A CPU runner's gate\s+settings.*?```toml\n(.*?)```", readme, re.S).group(1)
    write_project(pytester, times={"kernel": 1.0, "eager": 2.0, "compile": 2.0})
    pytester.makepyprojecttoml(block)
    args = ("--fusion-bench", "--fusion-warmup=0", "-k", "bench", "-p", "no:randomly")
    result = pytester.runpytest_inprocess(*args, "--fusion-save")
    assert result.ret == 0
    assert "vs compile" not in result.stdout.str()  # fusion_providers: eager alone
    set_times(pytester, kernel=1.0, eager=1.85)  # -7.5%: inside fusion_tolerance's 10%, outside the default 5%
    pytester.runpytest_inprocess(*args).assert_outcomes(passed=1)

"""The gate never fails open and never loses data (docs/gate-safety.md): provider gaps, concurrent
saves, stale cases, test ids, malformed files, repro payloads, report errors, the timing lock,
crashes and hangs. Each section names the item of the contract it guards."""

import glob
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest

from pytest_fusion import make_spec

from pytest_fusion.baselines import store as baselines
from pytest_fusion.baselines import schema

from pytest_fusion.gate import rule
from pytest_fusion.gate import comparable

from pytest_fusion.machine import locks

from pytest_fusion.property import repro
from pytest_fusion.measure.stats import Speedup
from pytest_fusion.declare.spec import FusionUsageError

from fakes import FAKE_TIMER_CONFTEST
from fakes import record

KERNEL = "tests/test_k.py::test_k"


# A project whose test ids, cases and providers each test sets: the kernel is a torch function
# timed by the fake timer of test_bench_plugin (times.json: ms per provider).
PROJECT_TEST = textwrap.dedent(
    """
    import os, time
    import pytest, torch

    def reference(x, w):
        return torch.relu(x @ w.t())

    def unfused(x, w):
        return torch.relu(torch.matmul(x, w.t()))

    def kernel(x, w):
        if os.environ.get("FUSION_CRASH") == "NAME":
            os._exit(int(os.environ.get("FUSION_CRASH_CODE", "0")))
        if os.environ.get("FUSION_HANG") == "NAME":
            time.sleep(600)
        return torch.mm(x, w.t()).clamp_min_(0)

    @pytest.mark.fused_kernel(
        reference=reference,
        inputs={"x": ("M", "K"), "w": ("N", "K")},
        dims=DIMS,
        dtypes=("float32",),
        triton=False,
        bench=BENCH,
        providers={"unfused": unfused},
    )
    def test_NAME():
        return kernel
    """
)


SMALL_DIMS = '{"M": (1, 64), "K": (1, 64), "N": (1, 64)}'
"""The project's declared dims: the checks of runs without ``-k bench`` draw up to them on a GPU,
where nothing caps a drawn dim."""


def kernel_file(name="k", bench="{'small': dict(M=16, K=32, N=32)}", dims=SMALL_DIMS):
    return PROJECT_TEST.replace("NAME", name).replace("BENCH", bench).replace("DIMS", dims)


def project(pytester, times=None, **files):
    pytester.makeconftest(FAKE_TIMER_CONFTEST)
    (pytester.path / "times.json").write_text(json.dumps(times or {"kernel": 1.0, "eager": 2.0, "unfused": 2.0}))
    for path, text in (files or {"test_k.py": kernel_file()}).items():
        p = pytester.path / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def bench(pytester, *args):
    return pytester.runpytest_inprocess("--fusion-bench", "--fusion-providers=eager", "--fusion-warmup=0",
                                        "--fusion-rounds=5", "--fusion-min-time=0", "-k", "bench",
                                        "-p", "no:randomly", *args)


def stored(pytester, slug=None):
    (path,) = (pytester.path / "baselines").glob("*.json")
    return json.loads(path.read_text())


def speedup(s):
    return Speedup(s, s * 0.99, s * 1.01, 1.0, s)


# ---- 1. nothing comparable is a failure; save keeps what it did not re-measure --------------------

def test_gate_fails_when_no_stored_provider_was_timed():
    stored_eager = comparable.StoredCase(1.0, {"eager": comparable.StoredProvider(2.0, 2.0)})
    v = rule.verdict({"compile": speedup(0.04)}, stored_eager, tolerance=0.05)
    assert v.failed and v.reasons[0].startswith("not comparable: the baseline has speedups over eager, this run timed compile")
    v = rule.verdict({}, stored_eager, tolerance=0.05)
    assert v.failed and "no provider was timed beside the kernel" in v.reasons[0]
    v = rule.verdict({}, None, tolerance=0.05)  # a new case timed alone has nothing to gate either
    assert v.failed and "no provider was timed" in v.reasons[0]
    empty = comparable.StoredCase(1.0, {})  # an entry saved before saves refused it
    assert rule.verdict({"eager": speedup(0.04)}, empty, tolerance=0.05).failed
    assert rule.verdict({"eager": speedup(2.0), "compile": speedup(1.0)}, stored_eager, tolerance=0.05).status == "pass"


def test_provider_gaps_fail_end_to_end(pytester):
    project(pytester)
    result = bench(pytester, "--fusion-save", "--fusion-providers=kernel")  # nothing to compare with
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*not comparable: no provider was timed beside the kernel*",
                                 "*not saved: *no provider besides the kernel was timed*"])
    assert not (pytester.path / "baselines").exists() or not list((pytester.path / "baselines").glob("*.json"))
    bench(pytester, "--fusion-save").assert_outcomes(passed=1)  # an eager-only baseline
    set_times = {"kernel": 50.0, "eager": 2.0, "unfused": 2.0}  # the kernel 50x slower
    (pytester.path / "times.json").write_text(json.dumps(set_times))
    result = bench(pytester, "--fusion-providers=unfused")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*not comparable: the baseline has speedups over eager, this run timed unfused*"])


def test_resave_with_a_subset_of_providers_keeps_the_others(tmp_path):
    baselines.save(tmp_path, "dev", [record(providers={"eager": 2.0, "unfused": 3.0})])
    baselines.save(tmp_path, "dev", [record(kernel_ms=0.5, providers={"eager": 2.0})])
    provs = baselines.load(tmp_path / "dev.json")["cases"][KERNEL]["c1"]["float32"]["providers"]
    assert provs["eager"]["speedup"] == 4.0 and provs["unfused"]["speedup"] == 3.0
    baselines.save(tmp_path, "dev", [record(providers={"eager": 2.0}, dims={"M": 32})])  # reshaped
    provs = baselines.load(tmp_path / "dev.json")["cases"][KERNEL]["c1"]["float32"]["providers"]
    assert list(provs) == ["eager"]
    with pytest.raises(ValueError, match="no provider besides the kernel"):
        baselines.save(tmp_path, "dev", [record(case="alone", providers={})])
    assert "alone" not in baselines.load(tmp_path / "dev.json")["cases"][KERNEL]


# ---- 2. concurrent saves both land; killed saves' temp files are removed ----------------------------

TRIALS = 20


def _save_in_trials(side, root, barrier):
    for trial in range(TRIALS):
        barrier.wait()
        baselines.save(os.path.join(root, str(trial)), "dev", [record(case=f"side{side}")])


def test_two_processes_saving_at_once_keep_both_sides(tmp_path):
    ctx = multiprocessing.get_context("spawn")  # the test process holds torch: no fork
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_save_in_trials, args=(side, str(tmp_path), barrier)) for side in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    for trial in range(TRIALS):
        cases = baselines.load(tmp_path / str(trial) / "dev.json")["cases"][KERNEL]
        assert sorted(cases) == ["side0", "side1"], f"trial {trial} lost a side: {sorted(cases)}"


def test_two_pytest_runs_saving_at_once_keep_both_kernels(pytester):
    project(pytester, **{"test_a.py": kernel_file("a"), "test_b.py": kernel_file("b")})
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--fusion-bench", "--fusion-save",
            "--fusion-providers=eager", "--fusion-warmup=0", "--fusion-rounds=5", "--fusion-min-time=0",
            "-k", "bench", "-q"]
    procs = [subprocess.Popen(args + [f"test_{n}.py"], cwd=pytester.path, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for n in "ab"]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert all("baseline written" in o for o in outs)
    assert sorted(stored(pytester)["cases"]) == ["test_a.py::test_a", "test_b.py::test_b"]


def test_a_killed_saves_temp_files_are_removed_by_the_next_save(tmp_path):
    baselines.save(tmp_path, "dev", [record()])
    left = [tmp_path / f".dev.json.killed{i}.tmp" for i in range(3)]
    for p in left:
        p.write_text("{half a file")
    other = tmp_path / ".other.json.x.tmp"  # another file's: not this save's business
    other.write_text("")
    baselines.save(tmp_path, "dev", [record(case="c2")])
    assert not any(p.exists() for p in left) and other.exists()
    assert sorted(baselines.load(tmp_path / "dev.json")["cases"][KERNEL]) == ["c1", "c2"]


# ---- 3. stale entries --------------------------------------------------------------------------

def test_stale_entries_are_the_collected_tests_undeclared_cases():
    data = {"cases": {"a.py::t": {"old": {"float32": {}}, "kept": {"float32": {}, "float16": {}}},
                      "b.py::t": {"old": {"float32": {}}}}}
    declared = {"a.py::t": [("kept", "float32"), ("new", "float32")]}  # b.py::t not collected
    assert baselines.stale_entries(declared, data) == [("a.py::t", "kept", "float16"), ("a.py::t", "old", "float32")]
    assert baselines.stale_entries({}, data) == [] and baselines.stale_entries(declared, None) == []


def test_a_renamed_case_lists_its_stale_entry_and_strict_fails_it(pytester):
    project(pytester, **{"test_k.py": kernel_file(), "test_other.py": kernel_file("other")})
    bench(pytester, "--fusion-save").assert_outcomes(passed=2)
    (pytester.path / "test_k.py").write_text(kernel_file(bench="{'tiny': dict(M=16, K=32, N=32)}"))
    (pytester.path / "test_other.py").write_text(kernel_file("other", bench="{'tiny': dict(M=16, K=32, N=32)}"))
    line = "*stale baseline entry in *: test_k.py::test_k [[]small-float32[]] (the test no longer declares*"
    result = bench(pytester, "test_k.py")  # test_other.py not collected: its entry does not count
    result.assert_outcomes(passed=1)
    assert result.ret == 0
    result.stdout.fnmatch_lines([line])
    assert "test_other" not in result.stdout.str().split("pytest-fusion bench")[-1].split("stale")[-1]
    result = bench(pytester, "test_k.py", "--fusion-strict", "--fusion-cases=tiny")
    result.stdout.fnmatch_lines([line.replace("declares*", "declares*--fusion-strict*")])
    assert result.ret != 0
    # --fusion-cases deselects cases, not tests: the unselected declared case is not stale.
    result = bench(pytester, "test_k.py", "-k", "bench and not other")
    result.stdout.no_fnmatch_line("*test_other.py::test_other*stale*")


def test_a_renamed_test_file_lists_its_old_entries_and_strict_fails_them(pytester):
    # Renamed, a file's cases are new under their new ids and pass as new; its old entries are
    # never collected again, so without this a rename reset the gate without a word.
    project(pytester, **{"test_k.py": kernel_file()})
    bench(pytester, "--fusion-save").assert_outcomes(passed=1)
    (pytester.path / "test_k.py").rename(pytester.path / "test_renamed.py")
    line = ("*stale baseline entry in *: test_k.py::test_k [[]small-float32[]] (its test file no longer "
            "exists; its test is collected from test_renamed.py: python3 -m pytest_fusion.baselines rename "
            "* test_k.py test_renamed.py moves the file's entries there)*")
    result = bench(pytester)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([line])
    result = bench(pytester, "--fusion-strict")
    result.stdout.fnmatch_lines([line.replace("there)*", "there)*--fusion-strict*")])
    assert result.ret != 0
    (pytester.path / "test_renamed.py").write_text(kernel_file().replace("def test_k(", "def test_other("))
    result = bench(pytester)  # the test is collected nowhere: nothing to rename to
    result.stdout.fnmatch_lines(["*stale baseline entry in *: test_k.py::test_k [[]small-float32[]] (its test file "
                                 "no longer exists: a renamed file's cases are new under their new id*"])


def test_under_xdist_the_controller_lists_the_workers_stale_entries(pytester):
    # The controller collects nothing: the workers send their declared cases (session.DECLARED_OUTPUT).
    pytest.importorskip("xdist")
    project(pytester)
    bench(pytester, "--fusion-save").assert_outcomes(passed=1)
    (pytester.path / "test_k.py").write_text(kernel_file(bench="{'tiny': dict(M=16, K=32, N=32)}"))
    result = pytester.runpytest_subprocess("-n", "2", "--fusion-bench", "--fusion-providers=eager",
                                           "--fusion-warmup=0", "--fusion-rounds=5", "--fusion-min-time=0",
                                           "--fusion-strict", "-k", "bench", "-p", "no:randomly")
    result.stdout.fnmatch_lines(["*ERROR stale baseline entry in *: test_k.py::test_k [[]small-float32[]]*--fusion-strict*"])
    assert result.ret != 0
    result = pytester.runpytest_subprocess("-n", "2", "--fusion-bench", "--fusion-cases=nomatch*",
                                           "--fusion-strict", "--fusion-examples=1", "-p", "no:randomly")
    result.stdout.fnmatch_lines(["*ERROR --fusion-cases nomatch* matched no bench case of the collected tests*"])
    assert result.ret != 0


def test_fusion_cases_matching_nothing_is_an_error_under_strict(pytester, cpu_only):
    project(pytester)
    result = pytester.runpytest_inprocess("--fusion-bench", "--fusion-cases=nomatch*", "--fusion-strict",
                                          "--fusion-examples=1", "-p", "no:randomly")
    result.stdout.fnmatch_lines(["*ERROR --fusion-cases nomatch* matched no bench case of the collected tests (--fusion-strict)*"])
    assert result.ret != 0
    result = pytester.runpytest_inprocess("--fusion-bench", "--fusion-cases=nomatch*", "--fusion-examples=1",
                                          "-p", "no:randomly")
    assert result.ret == 0


def test_fusion_cases_matching_nothing_is_a_warning_naming_the_cases_without_strict(pytester, cpu_only):
    def run(*args):  # the checks too: a run deselecting every item declares no test
        return pytester.runpytest_inprocess("--fusion-bench", "--fusion-providers=eager", "--fusion-warmup=0",
                                            "--fusion-rounds=5", "--fusion-min-time=0", "--fusion-examples=1",
                                            "-p", "no:randomly", *args)

    many = "{" + ", ".join(f"'c{i:02}': dict(M=16, K=32, N=32)" for i in range(12)) + "}"
    project(pytester, **{"test_k.py": kernel_file(), "test_many.py": kernel_file("many", bench=many)})
    result = run("--fusion-cases=nomatch*")
    result.assert_outcomes(passed=2)
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "pytest-fusion: WARNING --fusion-cases nomatch* matched no bench case of the collected tests, so no "
        "bench case was timed; their bench cases: small, c00, c01, c02, c03, c04, c05, c06, c07, c08 and 3 "
        "more (a glob matches '<case>' or '<case>-<dtype>')",
    ])
    # one glob of two matching nothing is said too; the other's case is timed
    result = run("test_k.py", "--fusion-cases=small-float32,smal")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["pytest-fusion: WARNING --fusion-cases smal matched no bench case of the "
                                 "collected tests; their bench cases: small (a glob *"])
    result = run("test_k.py", "--fusion-cases=small")
    result.assert_outcomes(passed=2)
    result.stdout.no_fnmatch_line("*WARNING*")
    # under --fusion-strict it stays an error, said once
    result = run("--fusion-cases=nomatch*", "--fusion-strict")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*ERROR --fusion-cases nomatch* matched no bench case of the collected tests "
                                 "(--fusion-strict)"])
    result.stdout.no_fnmatch_line("*WARNING*")


# ---- 4. entries keyed by the real test id; schema-1 files migrate ---------------------------------

def test_test_id_keeps_brackets_in_the_path_and_user_parameters():
    assert baselines.test_id_of_node("suite[v2]/t.py::test_k[bench-small-float32]", "bench-small-float32") == "suite[v2]/t.py::test_k"
    assert baselines.test_id_of_node("t.py::C::test_k[relu-bench-s-float16]", "bench-s-float16") == "t.py::C::test_k[relu]"
    assert baselines.test_id_of_node("t.py::test_k[x]", "bench-s-float16") == "t.py::test_k[x]"


def test_kernels_in_a_bracketed_directory_keep_separate_entries(pytester):
    project(pytester, **{"suite[v2]/test_a.py": kernel_file("k"), "suite[v2]/test_b.py": kernel_file("k"),
                         "test_p.py": kernel_file("p").replace("def test_p():", "@pytest.mark.parametrize('act', ['relu', 'gelu'])\ndef test_p(act):")})
    bench(pytester, "--fusion-save").assert_outcomes(passed=4)
    assert sorted(stored(pytester)["cases"]) == ["suite[v2]/test_a.py::test_k", "suite[v2]/test_b.py::test_k",
                                                 "test_p.py::test_p[gelu]", "test_p.py::test_p[relu]"]
    result = bench(pytester, "--fusion-strict")  # every one finds its own entry
    result.assert_outcomes(passed=4)


def test_schema_1_files_load_and_upgrade_without_touching_numbers(tmp_path):
    path = baselines.save(tmp_path, "dev", [record()])
    old = json.loads(path.read_text())
    old["schema"] = 1
    path.write_text(schema.dumps(old))
    assert baselines.load(path)["cases"] == old["cases"]
    out = subprocess.run([sys.executable, "-m", "pytest_fusion.baselines", str(path)], capture_output=True, text=True)
    assert out.returncode == 0 and "upgraded to schema 2" in out.stdout
    new = json.loads(path.read_text())
    assert new["schema"] == 2 and new["cases"] == old["cases"]
    assert baselines.upgrade(path) is False


COMMITTED = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "..", "baselines", "*.json")))


def test_both_gpus_have_a_committed_baseline():
    assert {"nvidia-h200.json", "nvidia-h100-80gb-hbm3.json"} <= {os.path.basename(p) for p in COMMITTED}


@pytest.mark.parametrize("path", COMMITTED, ids=os.path.basename)
def test_committed_baseline_is_current_schema(path):
    assert json.loads(open(path).read())["schema"] == schema.SCHEMA_VERSION
    assert baselines.load(path)["cases"]


# ---- 5. duplicate keys, dangling links, deep nesting --------------------------------------------

def test_duplicate_keys_are_refused(tmp_path):
    path = baselines.save(tmp_path, "dev", [record()])
    text = path.read_text().replace('"c1": {', '"c1": {"float16": {}, "float16": {}, ', 1)
    path.write_text(text)
    with pytest.raises(FusionUsageError, match="has the key 'float16' twice in one object"):
        baselines.load(path)
    with pytest.raises(FusionUsageError):
        baselines.save(tmp_path, "dev", [record()])
    assert path.read_text() == text


def test_a_dangling_symlink_is_refused_and_nothing_is_created(tmp_path):
    outside = tmp_path / "outside" / "dev.json"
    (tmp_path / "outside").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "dev.json").symlink_to(outside)
    with pytest.raises(FusionUsageError, match="is a symlink to .*which does not exist"):
        baselines.save(tmp_path / "b", "dev", [record()])
    with pytest.raises(FusionUsageError, match="dangling link"):
        baselines.load(tmp_path / "b" / "dev.json")
    assert not outside.exists()


def test_deep_nesting_is_a_clear_error(tmp_path):
    path = tmp_path / "dev.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(FusionUsageError, match="nested too deeply"):
        baselines.load(path)


# ---- 6. --fusion-repro is validated -------------------------------------------------------------

@pytest.mark.parametrize("payload, problem", [
    ('{"dims": {"M": "8"}, "seed": 1}', "dims must be an object {symbol: int >= 0}"),
    ('{"dims": {"M": 8}, "seed": 1.5}', "seed must be an int"),
    ('{"dims": {"M": 8}, "seed": 1, "layouts": {"x": "diagonal"}}', "unknown layout(s) ['diagonal']"),
    ('{"dims": {"M": 8}, "seed": 1, "special": "yes"}', "special must be true or false"),
    ('{"dims": {"M": 8}, "seed": 1, "sead": 2}', "unknown field(s) sead"),
    ('[' * 100_000, "not JSON"),
])
def test_repro_types_are_checked(payload, problem):
    with pytest.raises(ValueError) as exc:
        repro.parse(payload)
    assert problem in str(exc.value)


def test_repro_ranges_layouts_and_size_are_checked():
    spec = make_spec(lambda x, w: x, inputs={"x": ("M", "K"), "w": ("N", "K")},
                     dims={"M": (1, 10**6), "K": (1, 10**6), "N": (1, 64)}, dtypes=("float32",))
    ok = repro.case_for({"dims": {"M": 3, "K": 4, "N": 5}, "seed": 7, "layouts": {"w": "padded"}}, spec, "float32")
    assert ok.dims == {"M": 3, "K": 4, "N": 5} and ok.layouts == {"w": "padded"} and ok.seed == 7
    for payload, problem in [
        ({"dims": {"M": 3, "K": 4, "N": 65}, "seed": 1}, "N=65 (declared 1..64)"),
        ({"dims": {"M": 3, "K": 4}, "seed": 1}, "missing N"),
        ({"dims": {"M": 3, "K": 4, "N": 5, "Q": 1}, "seed": 1}, "not declared Q"),
        ({"dims": {"M": 3, "K": 4, "N": 5}, "seed": 1, "layouts": {"y": "padded"}}, "'y', which is not an input"),
        ({"dims": {"M": 10**5, "K": 10**5, "N": 1}, "seed": 1}, "above the cap"),
    ]:
        with pytest.raises(ValueError) as exc:
            repro.case_for(payload, spec, "float32")
        assert problem in str(exc.value)


def test_bad_repro_end_to_end_is_a_message_not_a_traceback(pytester):
    # Declared up to 200000 so that the too-large repro below is in range and refused for its size.
    project(pytester, **{"test_k.py": kernel_file(dims='{"M": (1, 200000), "K": (1, 200000), "N": (1, 64)}')})
    result = pytester.runpytest_inprocess('--fusion-repro={"dims": {"M": "x"}, "seed": 1}')
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--fusion-repro: not a case printed by pytest-fusion: dims must be*"])
    result = pytester.runpytest_inprocess('--fusion-repro={"dims": {"M": 100000, "K": 100000, "N": 2}, "seed": 1}')
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*--fusion-repro does not fit this test: dims {*} make 1e+10 input elements, above the cap*"])
    result = pytester.runpytest_inprocess('--fusion-repro={"dims": {"M": 3, "K": 4, "N": 99}, "seed": 1}')
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*dims outside the declared ranges: N=99 (declared 1..64)*"])
    assert "Traceback" not in result.stdout.str()
    pytester.runpytest_inprocess('--fusion-repro={"dims": {"M": 3, "K": 4, "N": 5}, "seed": 1}').assert_outcomes(passed=1)


# ---- 7. a report that cannot be written is one error; the rest are written -------------------------

def test_report_failures_are_one_line_each_and_the_rest_is_written(pytester, monkeypatch):
    project(pytester)
    (pytester.path / "adir").mkdir()
    (pytester.path / "afile").write_text("")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(pytester.path / "afile" / "summary.md"))
    result = bench(pytester, "--fusion-save", "--fusion-json=adir", f"--fusion-markdown={pytester.path / 'ok.md'}",
                   "--fusion-benchmark-json=bm.json")
    out = result.stdout.str()
    result.stdout.fnmatch_lines([
        "*pytest-fusion bench*",
        "*small*",
        "*baseline written*",
        "*ERROR --fusion-json: JSON report 'adir' could not be written: Is a directory*",
        "*ERROR $GITHUB_STEP_SUMMARY: Markdown summary '*afile/summary.md' could not be written: *",
    ])
    assert "Traceback" not in out and result.ret != 0
    assert (pytester.path / "ok.md").read_text().strip() and json.loads((pytester.path / "bm.json").read_text())
    assert stored(pytester)["cases"]


# ---- 8. per-user timing lock with a timeout naming the holder ---------------------------------------

def test_timing_lock_is_per_user_and_a_timeout_names_the_holder(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a private lock directory, left in tmp_path
    assert locks.lock_dir().name == f"pytest-fusion-{os.getuid()}"
    assert oct(locks.lock_dir().stat().st_mode & 0o777) == "0o700"
    ident = f"test-{os.getpid()}"
    with locks.timing_lock(ident, timeout=5, holder="tests/a.py::test_a"):
        start = time.perf_counter()
        with pytest.raises(locks.LockTimeout, match=rf"waited 0.2 s for the {ident} timing lock .* held by pid {os.getpid()} \(tests/a.py::test_a\)"):
            with locks.timing_lock(ident, timeout=0.2):
                pass
        assert time.perf_counter() - start < 3
    with locks.timing_lock(ident, timeout=0.2):  # released: free again
        pass
    monkeypatch.setattr(os, "getuid", lambda: 4242)
    assert locks.lock_dir().name == "pytest-fusion-4242"


def test_a_timing_lock_wait_is_said_once_past_the_notice_and_again_when_it_ends(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(locks, "WAIT_NOTICE_S", 0.05)
    lines: list[str] = []
    said = threading.Event()

    def notify(line):
        lines.append(line)
        said.set()

    waiter_done = threading.Event()

    def wait_for_it():
        with locks.timing_lock("dev", timeout=30, holder="b", notify=notify):
            waiter_done.set()

    with locks.timing_lock("dev", timeout=5, holder="tests/a.py::test_a"):
        waiter = threading.Thread(target=wait_for_it)
        waiter.start()
        assert said.wait(10)
        assert not waiter_done.is_set()  # still waiting while it says so
    waiter.join(10)
    assert waiter_done.is_set()
    first, last = lines
    assert first.startswith("waiting for the dev timing lock ") and "up to 30 s in all" in first
    assert "held by pid " in first and "(tests/a.py::test_a) since " in first
    assert last.startswith("took the dev timing lock after ")

    lines.clear()
    with locks.timing_lock("dev", timeout=30, notify=notify):  # free: nothing said
        pass
    with locks.timing_lock("dev", timeout=5), pytest.raises(locks.LockTimeout, match="held by pid"):
        with locks.timing_lock("dev", timeout=0.04, notify=notify):  # gives up before the notice
            pass
    assert lines == []


def test_path_locks_of_many_files_share_a_bounded_set_of_lock_files(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    for i in range(200):  # as many baseline files as a test suite's temporary directories
        with locks.path_lock(tmp_path / f"run{i}" / "baselines" / "dev.json", timeout=5):
            pass
    made = sorted(p.name for p in locks.lock_dir().iterdir())
    assert 1 < len(made) <= locks.PATH_LOCK_BUCKETS, made
    same = locks.path_lock(tmp_path / "run0" / "baselines" / "dev.json", timeout=0.2)
    from filelock import Timeout

    with same, pytest.raises(Timeout):  # one file's lock still excludes
        with locks.path_lock(tmp_path / "run0" / "baselines" / "dev.json", timeout=0.2):
            pass


def test_a_reentrant_timing_lock_hold_passes_inside_this_threads_hold_only(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a private lock directory
    with locks.timing_lock("dev", timeout=5, holder="outer"):
        with locks.timing_lock("dev", timeout=0.1, reentrant=True):
            with locks.timing_lock("dev", timeout=0.1, reentrant=True):
                pass
        with pytest.raises(locks.LockTimeout, match=r"held by pid \d+ \(outer\)"):  # still held; not reentrant
            with locks.timing_lock("dev", timeout=0.1):
                pass
        other: list[BaseException] = []

        def in_another_thread():
            try:
                with locks.timing_lock("dev", timeout=0.1, reentrant=True):
                    pass
            except locks.LockTimeout as exc:
                other.append(exc)

        t = threading.Thread(target=in_another_thread)
        t.start()
        t.join()
        assert other, "another thread passed the lock"
    assert locks._held == {}
    with locks.timing_lock("dev", timeout=0.1):  # released
        pass


def test_a_busy_device_fails_the_case_naming_the_holder(pytester, cpu_only):
    project(pytester)
    with locks.timing_lock("cpu", holder="someone/else.py::test_hung"):
        result = bench(pytester, "--fusion-lock-timeout=0.2")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*not timed: waited 0.2 s for the cpu timing lock*held by pid*(someone/else.py::test_hung)*"])


# ---- 9. crashes and hangs under pytest-xdist --------------------------------------------------------

CRASH_TESTS = textwrap.dedent(
    """
    import os, time
    import pytest

    def test_a_crash():
        os._exit(0)  # a kernel that ends the process, reporting success

    @pytest.mark.timeout(2, method="thread")
    def test_b_hang():
        time.sleep(600)  # a kernel that never returns

    def test_c_fine():
        pass
    """
)


def test_under_xdist_a_crash_or_hang_is_that_cases_failure_and_the_run_goes_on(pytester):
    # Plain tests: the contract is xdist's and pytest-timeout's, whatever the test runs, and
    # workers that import no torch restart in about a second.
    pytest.importorskip("xdist")
    pytest.importorskip("pytest_timeout")
    pytester.makepyfile(test_crash=CRASH_TESTS)
    start = time.perf_counter()
    result = pytester.runpytest_subprocess("-n", "1", "-p", "no:randomly", "-p", "no:cacheprovider")
    assert time.perf_counter() - start < 300  # the 600 s sleep was cut by the timeout
    result.stdout.fnmatch_lines_random(["*worker 'gw*' crashed while running 'test_crash.py::test_a_crash'*",
                                        "*worker 'gw*' crashed while running 'test_crash.py::test_b_hang'*"])
    result.assert_outcomes(passed=1, failed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # os._exit(0) did not read as success


def test_compile_builds_are_each_timed_before_the_fastest_is_measured(pytester):
    project(pytester, times={"kernel": 1.0, "eager": 2.0, "compile": 1.5})  # its timer logs each prepare
    for builds, compile_prepares in (("1", 1), ("3", 4)):  # each build timed alone, then the case
        (pytester.path / "prepared.txt").write_text("")
        bench(pytester, "--fusion-providers=eager,compile", f"--fusion-compile-builds={builds}").assert_outcomes(passed=1)
        prepared = (pytester.path / "prepared.txt").read_text().split()
        assert prepared.count("compile") == compile_prepares and prepared.count("kernel") == 1, prepared


def test_each_compile_mode_is_stored_and_gated_under_its_own_name(pytester):
    mode = "compile-reduce-overhead"  # cheap on the CPU, where it has no CUDA graphs to capture
    project(pytester, times={"kernel": 1.0, "eager": 2.0, "compile": 1.5, mode: 1.2})
    bench(pytester, f"--fusion-providers=eager,compile,{mode}", "--fusion-save").assert_outcomes(passed=1)
    (entry,) = stored(pytester)["cases"]["test_k.py::test_k"]["small"].values()
    assert {p: v["speedup"] for p, v in entry["providers"].items()} == {"eager": 2.0, "compile": 1.5, mode: 1.2}
    # --fusion-compile-mode renames the compile provider: judged against the entry of its own mode
    # (1.2 stored; against compile's entry, 1.5, the threshold would read 1.425).
    (pytester.path / "times.json").write_text(json.dumps({"kernel": 1.3, "eager": 2.6, "compile": 1.5, mode: 1.2}))
    result = bench(pytester, "--fusion-providers=all", "--fusion-compile-mode=reduce-overhead")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*speedup over {mode} 0.923*< 1.140 = stored 1.200 x (1 - 0.05)*"])

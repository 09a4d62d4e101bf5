"""Cold start as a gated figure: the kernel's first call in fresh processes with empty (cold) and
filled (warm) Triton and Inductor caches, stored beside the speedups and failing the case when it
grows past the stored one by more than its tolerance and floor."""

import json
import textwrap

import pytest

import pytest_fusion.plugin.bench_session  # noqa: F401  (imported before in-process pytester runs)
from pytest_fusion.baselines import store
from pytest_fusion.gate.cold_start import COLD_START_FLOOR_S, UNSTORED_NOTE, cold_start_verdict

from fakes import FAKE_TIMER_CONFTEST, assert_malformed_entry_field_refused

# The kernel's first call in a process sleeps COLD seconds when its "compile cache" (a file in
# $TRITON_CACHE_DIR) is empty and WARM seconds when an earlier process filled it: a JIT compile
# from nothing and a cache hit, at seconds the test sets.
COLD_TEST = textwrap.dedent(
    """
    import os, pathlib, time
    import pytest, torch

    first = [True]

    def kernel(x):
        if first[0]:
            first[0] = False
            cache = pathlib.Path(os.environ.get("TRITON_CACHE_DIR") or os.environ["NO_CACHE_DIR"])
            hit = (cache / "kernel.bin").exists()
            time.sleep(float(os.environ["WARM" if hit else "COLD"]))
            cache.mkdir(parents=True, exist_ok=True)
            (cache / "kernel.bin").write_text("compiled")
        return torch.relu(x)

    @pytest.mark.fused_kernel(reference=torch.relu, inputs={"x": ("M",)}, dims={"M": (1, 64)},
                              dtypes=("float32",), triton=False, bench={"one": dict(M=64)})
    def test_relu():
        return kernel
    """
)
KEY = ("test_cold.py::test_relu", "one", "float32")


def test_the_rule_fails_growth_past_tolerance_and_floor_and_notes_the_rest():
    stored = {"kernel": {"cold_s": 8.0, "warm_s": 0.2}, "compile": {"cold_s": 1.0, "warm_s": 0.5}}
    assert cold_start_verdict({"kernel": {"cold_s": 8.0, "warm_s": 0.2}}, stored=stored) == ([], [])
    reasons, notes = cold_start_verdict({"kernel": {"cold_s": 10.5, "warm_s": 0.2}}, stored=stored)
    assert len(reasons) == 1 and "kernel cold start (empty Triton and Inductor caches) 10.5 s, stored 8 s" in reasons[0]
    reasons, notes = cold_start_verdict({"kernel": {"cold_s": 9.9, "warm_s": 0.2}}, stored=stored)
    assert reasons == [] and notes == ["kernel cold start (empty Triton and Inductor caches) 9.9 s, stored 8 s "
                                       "(fails above 10 s)"]
    # A warm start of 0.2 s may grow by the floor (1 s) whatever the tolerance; past it, it fails.
    assert cold_start_verdict({"kernel": {"cold_s": 8.0, "warm_s": 0.2 + COLD_START_FLOOR_S * 0.9}},
                              stored=stored)[0] == []
    reasons, _ = cold_start_verdict({"kernel": {"cold_s": 8.0, "warm_s": 0.2 + COLD_START_FLOOR_S * 1.1}},
                                    stored=stored)
    assert len(reasons) == 1 and reasons[0].startswith("kernel warm start")
    # Only the kernel is gated: torch.compile's first call moves with torch.
    assert cold_start_verdict({"kernel": {"cold_s": 8.0, "warm_s": 0.2}, "compile": {"cold_s": 60.0, "warm_s": 9.0}},
                              stored=stored) == ([], [])
    assert cold_start_verdict({"kernel": {"cold_s": 10.5, "warm_s": 0.2}}, stored=stored, tolerance=0.5)[0] == []
    assert cold_start_verdict({"kernel": {"cold_s": 1.0, "warm_s": 0.1}}, stored=None) == ([], [UNSTORED_NOTE])
    assert cold_start_verdict(None, stored=stored) == ([], [])


def test_the_figures_round_trip_through_save_and_load_and_a_resave_without_them_keeps_them(tmp_path):
    from fakes import record

    rec = record()
    rec.cold_start = {"kernel": {"cold_s": 4.123456789, "warm_s": 0.25}, "eager": {"cold_s": 0.01, "warm_s": 0.01}}
    path = store.save(tmp_path, "dev", [rec])
    stored = store.stored_case(store.load(path), kernel=rec.kernel, case=rec.case, dtype=rec.dtype)
    assert stored is not None and stored.cold_start == {"kernel": {"cold_s": 4.1235, "warm_s": 0.25},
                                                        "eager": {"cold_s": 0.01, "warm_s": 0.01}}
    store.save(tmp_path, "dev", [record()])
    stored = store.stored_case(store.load(path), kernel=rec.kernel, case=rec.case, dtype=rec.dtype)
    assert stored is not None and stored.cold_start["kernel"]["cold_s"] == 4.1235


@pytest.mark.parametrize("bad", [{"kernel": {"cold_s": -1, "warm_s": 0.1}}, {"kernel": {"cold_s": 1.0}},
                                 {"kernel": 3.0}, [1.0]])
def test_a_malformed_figure_is_refused_naming_it_and_the_file_is_kept(tmp_path, bad):
    assert_malformed_entry_field_refused(tmp_path, "cold_start", bad)


def bench(pytester, monkeypatch, cold, warm, *args):
    monkeypatch.setenv("COLD", str(cold))
    monkeypatch.setenv("WARM", str(warm))
    return pytester.runpytest_inprocess("--fusion-bench", "--fusion-providers=eager", "--fusion-warmup=0",
                                        "--fusion-cold-start", "--fusion-json=report.json", "-k", "bench", "-p", "no:randomly",
                                        *args)


def test_cold_and_warm_start_are_measured_in_fresh_processes_saved_and_gated(pytester, monkeypatch):
    pytester.makeconftest(FAKE_TIMER_CONFTEST)
    pytester.makepyfile(test_cold=COLD_TEST)
    (pytester.path / "times.json").write_text(json.dumps({"kernel": 1.0, "eager": 2.0}))
    monkeypatch.setenv("NO_CACHE_DIR", str(pytester.path / "no-cache"))  # this process's own first call

    bench(pytester, monkeypatch, 3.0, 0.2, "--fusion-save").assert_outcomes(passed=1)
    (rec,) = json.loads((pytester.path / "report.json").read_text())["records"]
    figures = rec["cold_start"]["kernel"]
    # The cold child found its cache empty and the warm child the one it filled: 2.8 s apart, less
    # the difference of the rest of a first call (the process's first op through the oracle), which
    # a loaded 2-core machine has moved by a second
    assert figures["cold_s"] >= 3.0 and figures["warm_s"] >= 0.2, figures
    assert figures["cold_s"] - figures["warm_s"] > 1.4, figures
    assert set(rec["cold_start"]) == {"kernel", "eager"}
    (path,) = (pytester.path / "baselines").glob("*.json")
    saved = json.loads(path.read_text())["cases"][KEY[0]][KEY[1]][KEY[2]]
    assert saved["cold_start"]["kernel"]["cold_s"] == pytest.approx(figures["cold_s"], rel=1e-4)

    bench(pytester, monkeypatch, 3.0, 0.2).assert_outcomes(passed=1)  # the same kernel
    result = bench(pytester, monkeypatch, 3.0 + 4.0, 0.2)  # its compile 4 s slower
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*failed the performance gate:*",
                                 "*kernel cold start (empty Triton and Inductor caches) * s, stored * s: "
                                 "above * s (+25%, at least +1 s)*"])
    assert "warm start" not in result.stdout.str().split("failed the performance gate:")[1].split("\n")[1]


def test_cold_start_needs_bench(pytester):
    pytester.makepyfile(test_cold=COLD_TEST)
    result = pytester.runpytest_inprocess("--fusion-cold-start")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*--fusion-cold-start * times the first calls of bench cases*add --fusion-bench*"])

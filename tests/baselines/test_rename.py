"""``python3 -m pytest_fusion.baselines rename FILE OLD NEW``: a moved test file or renamed test
keeps its entries, numbers untouched; what would overwrite or match nothing is refused unchanged;
prune keeps a moved file's entries and a bench run names the rename, never dropping them."""

import json
import shlex
import subprocess
import sys

import pytest

from pytest_fusion.baselines import store
from pytest_fusion.declare.spec import FusionUsageError
import fakes
from fakes import record


def rename(cwd, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest_fusion.baselines", "rename", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def saved(tmp_path):
    return store.save(tmp_path, "dev", [record(case="a", kernel="old/t.py::test_x"),
                                        record(case="b", kernel="old/t.py::test_y"),
                                        record(case="a", kernel="keep.py::test_z")])


def test_a_moved_file_takes_every_test_id_and_renaming_back_restores_the_bytes(tmp_path) -> None:
    path = saved(tmp_path)
    before = path.read_bytes()
    cases = json.loads(before)["cases"]
    out = rename(tmp_path, str(path), "old/t.py", "new/t.py")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"{path}: old/t.py::test_x -> new/t.py::test_x",
                                       f"{path}: old/t.py::test_y -> new/t.py::test_y"]
    after = store.load(path)["cases"]
    assert after == {"new/t.py::test_x": cases["old/t.py::test_x"], "new/t.py::test_y": cases["old/t.py::test_y"],
                     "keep.py::test_z": cases["keep.py::test_z"]}
    assert store.rename_tests(path, "new/t.py", "old/t.py") == {"new/t.py::test_x": "old/t.py::test_x",
                                                                "new/t.py::test_y": "old/t.py::test_y"}
    assert path.read_bytes() == before


def test_a_renamed_test_moves_alone_and_merges_with_other_cases(tmp_path) -> None:
    path = saved(tmp_path)
    assert store.rename_tests(path, "old/t.py::test_x", "old/t.py::test_y") == {"old/t.py::test_x": "old/t.py::test_y"}
    assert sorted(store.load(path)["cases"]["old/t.py::test_y"]) == ["a", "b"]
    assert "old/t.py::test_x" not in store.load(path)["cases"]


def test_a_clash_an_unknown_name_and_a_corrupt_file_are_refused_unchanged(tmp_path) -> None:
    path = saved(tmp_path)
    store.rename_tests(path, "keep.py::test_z", "k2.py::test_z")
    store.save(tmp_path, "dev", [record(case="a", kernel="keep.py::test_z")])
    before = path.read_bytes()
    with pytest.raises(FusionUsageError, match=r"already holds k2.py::test_z \[a-float32\]: renaming would overwrite"):
        store.rename_tests(path, "keep.py", "k2.py")
    out = rename(tmp_path, str(path), "nope.py", "x.py")
    assert out.returncode == 1
    assert "no test id or test file in it is 'nope.py' (its test files: k2.py, keep.py, old/t.py)" in out.stderr
    assert rename(tmp_path, str(path), "x.py").returncode == 2
    assert path.read_bytes() == before
    path.write_text("{")
    with pytest.raises(FusionUsageError, match="is not valid JSON"):
        store.rename_tests(path, "keep.py", "k3.py")
    assert path.read_text() == "{"


def test_moved_files_needs_the_tests_collected_from_one_other_file(tmp_path) -> None:
    data = {"cases": {"gone.py::test_a": {}, "gone.py::test_b": {}, "lost.py::test_c": {}, "split.py::test_d": {},
                      "split.py::test_e": {}}}
    declared = {"moved/gone.py::test_a": [], "two.py::test_d": [], "three.py::test_e": []}
    assert store.moved_files(declared, data, tmp_path) == {"gone.py": "moved/gone.py"}
    (tmp_path / "gone.py").write_text("")  # the file still exists: not moved
    assert store.moved_files(declared, data, tmp_path) == {}


def test_prune_keeps_a_moved_files_entries_and_a_bench_run_names_the_rename(pytester: pytest.Pytester) -> None:
    fakes.write_project(pytester, times={"kernel": 1.0, "eager": 2.0})
    fakes.bench(pytester, "--fusion-save").assert_outcomes(passed=1)
    _, path = fakes.saved(pytester)
    pytester.mkdir("kernels")
    (pytester.path / "test_kernel.py").rename(pytester.path / "kernels" / "test_kernel.py")
    before = path.read_bytes()
    command = store.rename_command(path, "test_kernel.py", "kernels/test_kernel.py")

    refused = subprocess.run([sys.executable, "-m", "pytest_fusion.baselines", "prune", str(path), "--write"],
                             cwd=pytester.path, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 1 and "they moved: keep their entries with" in refused.stderr, refused.stderr
    assert command in refused.stderr and path.read_bytes() == before

    result = fakes.bench(pytester)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*stale baseline entry in *: test_kernel.py::test_relu_linear *(its test file no "
                                 f"longer exists; its test is collected from kernels/test_kernel.py: {command} "
                                 f"moves the file's entries there)*"])
    pytester.makepyfile(test_other="def test_q():\n    pass\n")  # one test file still there: no refusal
    other = record(case="c", kernel="test_other.py::test_q")
    other.device = path.stem
    store.save(path.parent, path.stem, [other])
    kept = subprocess.run([sys.executable, "-m", "pytest_fusion.baselines", "prune", str(path), "--write"],
                          cwd=pytester.path, capture_output=True, text=True, timeout=300)
    assert kept.returncode == 0, kept.stderr
    assert any(line.startswith("  keep test_kernel.py::test_relu_linear [") and
               line.endswith(", but its test is collected from kernels/test_kernel.py") for line in kept.stdout.splitlines())
    assert command in kept.stdout and "0 of 2 entries stale" in kept.stdout
    assert store.load(path)["cases"]["test_kernel.py::test_relu_linear"] == json.loads(before)["cases"][
        "test_kernel.py::test_relu_linear"]

    done = subprocess.run(shlex.split(command), cwd=pytester.path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    again = fakes.bench(pytester)
    again.stdout.no_fnmatch_line("*stale baseline entry*")
    again.stdout.no_fnmatch_line("*new case*")

"""``python3 -m pytest_fusion.baselines prune FILE``: a dry run lists a file's stale entries and why,
``--write`` drops exactly those, atomically, from that one device's file; a corrupt file, a failing
collection and the wrong rootdir are refused with nothing changed."""

import json
import subprocess
import sys
import textwrap

import pytest

from pytest_fusion.baselines import store
from pytest_fusion.declare.spec import FusionUsageError
import fakes
from fakes import record

KERNEL_FILE = textwrap.dedent(
    """
    import pytest, torch

    @pytest.mark.fused_kernel(reference=torch.relu, inputs={"x": ("M",)}, dims={"M": (1, 8)},
                              dtypes=("float32",), triton=False, bench={"tiny": dict(M=8)})
    def test_NAME():
        return torch.relu
    """
)

ENTRIES = [  # (test id, case, dtype) saved into every file
    ("test_k.py::test_k", "tiny", "float32"),  # declared: kept
    ("test_k.py::test_k", "small", "float32"),  # a removed case
    ("test_k.py::test_k", "tiny", "float16"),  # a removed dtype
    ("test_o.py::test_o", "old", "float32"),  # stale, but only when test_o.py is collected
    ("gone.py::test_g", "c1", "float32"),  # its test file is gone
]


def project(pytester: pytest.Pytester) -> dict:
    """test_k.py and test_o.py, and the same entries in baselines/dev.json and baselines/other.json."""
    pytester.makepyfile(test_k=KERNEL_FILE.replace("NAME", "k"), test_o=KERNEL_FILE.replace("NAME", "o"))
    files = {}
    for slug in ("dev", "other"):
        recs = [record(case=c, kernel=k, dtype=d) for k, c, d in ENTRIES]
        for r in recs:
            r.device = slug
        files[slug] = store.save(pytester.path / "baselines", slug, recs)
    return files


def prune(cwd, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest_fusion.baselines", "prune", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def entries(path) -> set:
    data = json.loads(path.read_text())
    return {(k, c, d) for k, cases in data["cases"].items() for c, by in cases.items() for d in by}


def test_prune_lists_then_drops_the_stale_entries_of_its_own_file_only(pytester: pytest.Pytester) -> None:
    files = project(pytester)
    before = {slug: path.read_bytes() for slug, path in files.items()}
    dry = prune(pytester.path, "baselines/dev.json")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        f"baselines/dev.json: 4 of 5 entries stale (2 fused_kernel test(s) collected under {pytester.path})",
        "  would drop test_k.py::test_k [small-float32]: the test no longer declares this case",
        "  would drop test_k.py::test_k [tiny-float16]: the test no longer declares this case",
        "  would drop test_o.py::test_o [old-float32]: the test no longer declares this case",
        "  would drop gone.py::test_g [c1-float32]: its test file no longer exists",
        "dry run: nothing changed; run again with --write to drop them",
    ]
    assert {slug: path.read_bytes() for slug, path in files.items()} == before  # a dry run writes nothing

    # test_o.py not collected: its entry cannot be judged and stays.
    done = prune(pytester.path, "baselines/dev.json", "--write", "--", "test_k.py")
    assert done.returncode == 0, done.stderr
    assert "baselines/dev.json: 3 entries dropped, 2 kept" in done.stdout
    assert entries(files["dev"]) == {("test_k.py::test_k", "tiny", "float32"), ("test_o.py::test_o", "old", "float32")}
    assert files["other"].read_bytes() == before["other"]  # another device's file is never touched
    assert store.load(files["dev"])["device"] == "dev"  # still a valid file of its device

    again = prune(pytester.path, "baselines/dev.json", "--write", "--", "-k", "test_k")
    assert again.returncode == 0 and "0 of 2 entries stale" in again.stdout, again.stdout + again.stderr
    assert entries(files["dev"]) == {("test_k.py::test_k", "tiny", "float32"), ("test_o.py::test_o", "old", "float32")}


def test_prune_refuses_a_corrupt_file_a_failing_collection_and_the_wrong_rootdir(pytester: pytest.Pytester) -> None:
    files = project(pytester)
    before = files["dev"].read_bytes()

    pytester.makepyfile(test_broken="def test_x(:\n")
    failed = prune(pytester.path, "baselines/dev.json", "--write")
    assert failed.returncode == 1, failed.stdout
    assert "error: collecting the tests failed" in failed.stderr and "test_broken.py" in failed.stderr
    assert files["dev"].read_bytes() == before
    (pytester.path / "test_broken.py").unlink()

    sub = pytester.mkdir("sub")  # no ini file: the rootdir is sub/, where no test id resolves
    wrong = prune(sub, "../baselines/dev.json", "--write")
    assert wrong.returncode == 1, wrong.stdout
    assert f"none of the test files of ../baselines/dev.json exists under the rootdir {sub}" in wrong.stderr
    assert files["dev"].read_bytes() == before

    files["dev"].write_text(before.decode()[:-20])
    corrupt = prune(pytester.path, "baselines/dev.json", "--write")
    assert corrupt.returncode == 1 and "is not valid JSON" in corrupt.stderr, corrupt.stderr
    assert files["dev"].read_text() == before.decode()[:-20]
    missing = prune(pytester.path, "baselines/nope.json")
    assert missing.returncode == 1 and "baselines/nope.json: does not exist" in missing.stderr


def test_drop_entries_removes_exactly_those_and_empties_nothing_else(tmp_path) -> None:
    path = store.save(tmp_path, "dev", [record(case="a"), record(case="b"), record(case="a", kernel="t.py::t")])
    kept = json.loads(path.read_text())["cases"]["tests/test_k.py::test_k"]["b"]
    dropped = store.drop_entries(path, [("t.py::t", "a", "float32"), ("tests/test_k.py::test_k", "a", "float32"),
                                        ("tests/test_k.py::test_k", "gone", "float32")])  # the last not in the file
    assert dropped == [("t.py::t", "a", "float32"), ("tests/test_k.py::test_k", "a", "float32")]
    assert json.loads(path.read_text())["cases"] == {"tests/test_k.py::test_k": {"b": kept}}  # emptied objects gone
    text = path.read_text()
    assert store.drop_entries(path, [("t.py::t", "a", "float32")]) == [] and path.read_text() == text
    path.write_text("{")
    with pytest.raises(FusionUsageError, match="is not valid JSON"):
        store.drop_entries(path, [("tests/test_k.py::test_k", "b", "float32")])
    assert path.read_text() == "{"


def test_the_upgrade_command_keeps_its_bare_form_and_gets_a_name(tmp_path) -> None:
    path = store.save(tmp_path, "dev", [record()])
    for args in ([str(path)], ["upgrade", str(path)]):
        out = subprocess.run([sys.executable, "-m", "pytest_fusion.baselines", *args], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0 and f"{path}: already schema 2" in out.stdout, out.stderr
    usage = subprocess.run([sys.executable, "-m", "pytest_fusion.baselines"], capture_output=True, text=True,
                           timeout=120)
    assert usage.returncode == 2 and "prune FILE [--write]" in usage.stderr


def test_a_bench_runs_stale_listing_names_the_command_that_drops_what_it_listed(pytester: pytest.Pytester) -> None:
    fakes.write_project(pytester, bench="{'small': dict(M=16, K=32, N=32), 'big': dict(M=32, K=32, N=32)}",
                        times={"kernel": 1.0, "eager": 2.0})
    fakes.bench(pytester, "--fusion-save").assert_outcomes(passed=2)
    (pytester.path / "test_kernel.py").write_text(
        fakes.KERNEL_TEST.replace("BENCH", "{'small': dict(M=16, K=32, N=32)}"))  # 'big' removed
    _, path = fakes.saved(pytester)
    result = fakes.bench(pytester)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*stale baseline entry in *: test_kernel.py::test_relu_linear [[]big-float32[]] (the test no longer "
        "declares this case; *",
        f"pytest-fusion: python3 -m pytest_fusion.baselines prune {path} lists the stale entries of "
        f"{path.name} and why; add --write to drop them",
    ])
    done = prune(pytester.path, str(path), "--write")  # the command as the summary names it
    assert done.returncode == 0, done.stderr
    assert f"  drop test_kernel.py::test_relu_linear [big-float32]: {store.UNDECLARED}" in done.stdout.splitlines()
    assert entries(path) == {("test_kernel.py::test_relu_linear", "small", "float32")}
    fakes.bench(pytester).stdout.no_fnmatch_line("*stale baseline entry*")  # the summary lists nothing any more

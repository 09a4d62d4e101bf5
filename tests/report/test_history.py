"""``python3 -m pytest_fusion history``: a baseline file read back from every commit that saved it."""

import dataclasses
import os
import subprocess
import sys

import pytest

from pytest_fusion.__main__ import main as fusion_main
from pytest_fusion.baselines import store
from pytest_fusion.report import history
from fakes import record


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git work tree in ``tmp_path`` whose commits need no user configuration."""
    for who in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{who}_NAME", "t")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "t@example.com")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "no-gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    git(tmp_path, "init", "-q")
    return tmp_path


def git(cwd, *args, date=None):
    env_date = {} if date is None else {"GIT_COMMITTER_DATE": date, "GIT_AUTHOR_DATE": date}
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          env={**os.environ, **env_date}).stdout.strip()


def commit(cwd, message, date):
    git(cwd, "add", "-A")
    git(cwd, "commit", "-q", "-m", message, date=date)
    return git(cwd, "rev-parse", "HEAD")


def env(method="cuda-graph", device="NVIDIA H100 PCIe"):
    return {"method": method, "device": device, "capability": "9.0"}


def timed(case, kernel_ms, eager_ms, compile_ms, **env_fields):
    rec = record(case=case, kernel_ms=kernel_ms, providers={"eager": eager_ms, "compile": compile_ms})
    return dataclasses.replace(rec, env=env(**env_fields))


@pytest.fixture
def three_saves(repo):
    """Three commits of ``baselines/dev.json``, each written by ``store.save``: c1 and c2 new; c1
    re-saved (faster kernel) with c2 kept as it was; c1 re-timed by another method and c2 on a
    device reporting another name."""
    d = repo / "baselines"
    store.save(d, "dev", [timed("c1", 1.0, 2.0, 1.5), timed("c2", 0.5, 0.6, 0.55)])
    first = commit(repo, "first save", "2026-01-01T10:00:00+00:00")
    store.save(d, "dev", [timed("c1", 0.8, 2.0, 1.5)])
    second = commit(repo, "c1 faster", "2026-01-02T10:00:00+00:00")
    store.save(d, "dev", [timed("c1", 0.8, 2.4, 1.6, method="cuda-graph-clean-l2"),
                          timed("c2", 0.5, 0.7, 0.55, device="NVIDIA H100 80GB HBM3")])
    third = commit(repo, "new method", "2026-01-03T10:00:00+00:00")
    return d / "dev.json", [first, second, third]


def test_every_commit_of_the_file_is_read_oldest_first(three_saves):
    path, commits = three_saves
    revs = history.revisions(path)
    assert [r.commit for r in revs] == commits
    assert [r.date[:10] for r in revs] == ["2026-01-01", "2026-01-02", "2026-01-03"]
    assert [r.subject for r in revs] == ["first save", "c1 faster", "new method"]
    assert all(r.data is not None and not r.problem for r in revs)


def test_each_case_is_drawn_from_what_each_save_stored(three_saves):
    path, _ = three_saves
    points = history.case_points(history.revisions(path))
    c1, c2 = points[("tests/test_k.py::test_k", "c1", "float32")], points[("tests/test_k.py::test_k", "c2", "float32")]
    assert [p.kernel_ms for p in c1] == [1.0, 0.8, 0.8]
    assert [p.speedups["eager"] for p in c1] == pytest.approx([2.0, 2.5, 3.0])
    assert [p.speedups["compile"] for p in c1] == pytest.approx([1.5, 1.875, 2.0])
    assert c1[0].marks == ("new",)
    assert c1[1].marks == ("re-saved",)
    assert c1[2].marks == ("re-saved", "method cuda-graph -> cuda-graph-clean-l2")
    # c2 was not in the second save: carried unchanged, so not re-saved
    assert [p.speedups["eager"] for p in c2] == pytest.approx([1.2, 1.2, 1.4])
    assert c2[1].marks == ()
    assert c2[2].marks == ("re-saved", "device NVIDIA H100 PCIe -> NVIDIA H100 80GB HBM3")


def test_the_markdown_names_each_commit_and_change(three_saves):
    path, commits = three_saves
    md = history.markdown("baselines/dev.json", history.revisions(path))
    rows = [line for line in md.splitlines() if line.startswith("| ") and line[2].isdigit()]
    summary = rows[:3]
    for i, (row, sha) in enumerate(zip(summary, commits, strict=True), start=1):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[:2] == [str(i), f"`{sha[:7]}`"]
    third = [c.strip() for c in summary[2].strip("|").split("|")]
    assert third[3:7] == ["2", "0", "2", "0"]  # entries, new, re-saved, removed
    assert "method cuda-graph -> cuda-graph-clean-l2" in third[-1]
    assert "NVIDIA H100 PCIe -> NVIDIA H100 80GB HBM3" in third[-1]
    second = [c.strip() for c in summary[1].strip("|").split("|")]
    assert second[5] == "1"  # only c1 was re-saved
    assert second[7] == f"{(2.5 * 1.2) ** 0.5:.3f}x"  # geomean of c1 and c2 over eager
    assert "| 2 | `%s` | 0.8 | 2.500x | 1.875x | re-saved |" % commits[1][:7] in md


def test_the_command_writes_markdown_and_png(three_saves, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path, _ = three_saves
    out = tmp_path / "out"
    assert fusion_main(["history", str(path), "--out", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["dev-history-test_k.png", "dev-history.md", "dev-history.png"]
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "3 commit(s)" in capsys.readouterr().out


def test_without_matplotlib_the_markdown_is_written_and_the_command_says_why(three_saves, tmp_path,
                                                                              monkeypatch, capsys):
    path, _ = three_saves
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    out = tmp_path / "out"
    assert history.main([str(path), "--out", str(out)]) == 1
    assert "matplotlib is not installed (pip install 'pytest-fusion[plot]')" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["dev-history.md"]


def test_a_schema_1_commit_is_read_as_the_current_schema(repo):
    d = repo / "baselines"
    path = store.save(d, "dev", [timed("c1", 1.0, 2.0, 1.5)])
    path.write_text(path.read_text().replace('"schema": 2', '"schema": 1'))  # as an older tool wrote it
    commit(repo, "schema 1", "2026-01-01T10:00:00+00:00")
    assert store.main([str(path)]) == 0  # python -m pytest_fusion.baselines: upgraded in place
    commit(repo, "upgraded", "2026-01-02T10:00:00+00:00")
    revs = history.revisions(path)
    assert [r.schema for r in revs] == [1, 2]
    assert [r.data["schema"] for r in revs] == [2, 2]
    (points,) = history.case_points(revs).values()
    assert [p.marks for p in points] == [("new",), ()]  # an upgrade rewrites no entry
    assert "schema 1 read as 2" in history.markdown("dev.json", revs)


def test_a_renamed_file_keeps_its_history(three_saves, repo):
    path, commits = three_saves
    (repo / "perf").mkdir()
    git(repo, "mv", "baselines", "perf/baselines")
    moved = commit(repo, "moved", "2026-01-04T10:00:00+00:00")
    revs = history.revisions(repo / "perf" / "baselines" / "dev.json")
    assert [r.commit for r in revs] == [*commits, moved]
    assert [r.path for r in revs] == ["baselines/dev.json"] * 3 + ["perf/baselines/dev.json"]


def test_an_unreadable_commit_is_listed_with_its_problem(three_saves, repo):
    path, commits = three_saves
    path.write_text(path.read_text().replace('"kernel_ms": 0.8', '"kernel_ms": -1'))
    commit(repo, "broken by hand", "2026-01-04T10:00:00+00:00")
    revs = history.revisions(path)
    assert revs[-1].data is None and "kernel_ms must be a positive number" in revs[-1].problem
    assert len(history.case_points(revs)[("tests/test_k.py::test_k", "c2", "float32")]) == 3
    assert "unreadable: baseline file" in history.markdown("dev.json", revs)


def test_a_file_without_history_is_a_clear_error(repo, tmp_path, capsys, monkeypatch):
    (repo / "README").write_text("a repository with a commit, but not of the baseline file")
    commit(repo, "readme", "2026-01-01T10:00:00+00:00")
    d = repo / "baselines"
    path = store.save(d, "dev", [timed("c1", 1.0, 2.0, 1.5)])
    with pytest.raises(history.HistoryError, match="no commit holds this file"):
        history.revisions(path)
    assert history.main([str(path), "--out", str(tmp_path / "out")]) == 1
    assert "no commit holds this file" in capsys.readouterr().err
    outside = tmp_path.parent / f"{tmp_path.name}-outside" / "not-a-repo.json"
    outside.parent.mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(outside.parent.parent))
    with pytest.raises(history.HistoryError, match="not-a-repo.json: git rev-parse"):
        history.revisions(outside)

"""The machine-wide tuning cache of the reference kernels (reference_kernels/tuning/cache.py and
the pick that reads and fills it, reference_kernels/tuning/pick.py): a key the
committed table lacks is tuned once per machine, and every later process reads the pick.

All on the CPU: the GPU path's choice is wired with ``pick.INTERPRET`` off, a fake timing that
counts its calls, the cache and the lock directory under tmp_path."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import triton

from pytest_fusion.machine import devices, locks
from reference_kernels.gemm import configs, targets
from reference_kernels.tuning import cache, pick
from reference_kernels.tuning.tuner import cli
from reference_kernels.tuning.tuner import table as tune_table

ROOT = Path(__file__).resolve().parents[2]

M, N, K = 300, 96, 64
"""One call's dims: linear, float16, pointer path (bucket M512/N128/K64)."""
KEY = pick.table_key("linear", torch.float16, M, N, K, False)
CANDS = configs.candidates(configs.LINEAR_CONFIGS, M, 2, 1, tma=False, target=targets.of_device(torch.device("cpu")))
FASTEST = CANDS[-1]
"""The fake timing's winner: not the first candidate, which tuning off would run."""


def fake_time_ms(config: triton.Config) -> float:
    return 1.0 if configs.config_name(config) == configs.config_name(FASTEST) else 2.0


def choose(m: int = M) -> triton.Config:
    x = torch.empty(m, K, dtype=torch.float16)
    return pick.choose("linear", configs.LINEAR_CONFIGS, x, N, K, 1, False, run=lambda c: None)


@pytest.fixture
def timed(monkeypatch, tmp_path) -> list[str]:
    """The GPU path's choice on the CPU, the cache in tmp_path/cache, no committed table (an empty
    tmp_path/tuned), a private lock directory; returns the configs timed, by name, in order."""
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(pick, "INTERPRET", False)
    monkeypatch.setattr(pick, "AUTOTUNE", True)
    monkeypatch.setattr(pick, "_resolved", {})
    monkeypatch.setattr(cache, "_warned", set())
    (tmp_path / "tuned").mkdir()
    monkeypatch.setattr(pick, "TABLE_DIR", tmp_path / "tuned")
    (tmp_path / "locks").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "locks"))  # xdist workers time on the real cpu lock
    pick.load_table.cache_clear()
    calls: list[str] = []

    def fake(run, config):
        calls.append(configs.config_name(config))
        return fake_time_ms(config)

    monkeypatch.setattr(pick, "_time_ms", fake)
    yield calls
    pick.load_table.cache_clear()
    cache.kernel_source_hash.cache_clear()


def new_process(monkeypatch) -> None:
    """What a fresh process starts with: nothing resolved, no warning given."""
    monkeypatch.setattr(pick, "_resolved", {})
    monkeypatch.setattr(cache, "_warned", set())


def cache_file() -> Path:
    return cache.cache_path(torch.device("cpu"))[0]


# ---- one process tunes, another reads ------------------------------------------------------------

CHILD = """
import os, sys, time
from pathlib import Path
import torch
from reference_kernels.gemm import configs, targets
from reference_kernels.tuning import pick

pick.INTERPRET = False
pick.TABLE_DIR = Path(sys.argv[1])
log, ready, others = Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
cands = configs.candidates(configs.LINEAR_CONFIGS, {M}, 2, 1, False, targets.of_device(torch.device("cpu")))

def fake_time(run, config):
    with log.open("a") as f:
        f.write(f"{{os.getpid()}} {{time.monotonic()}} start\\n")
    time.sleep(0.05)
    with log.open("a") as f:
        f.write(f"{{os.getpid()}} {{time.monotonic()}} end\\n")
    return 1.0 if config is cands[-1] else 2.0

pick._time_ms = fake_time
(ready / str(os.getpid())).touch()
deadline = time.monotonic() + 60
while len(list(ready.iterdir())) < others and time.monotonic() < deadline:  # start together
    time.sleep(0.01)
x = torch.empty({M}, {K}, dtype=torch.float16)
print(configs.config_name(pick.choose("linear", configs.LINEAR_CONFIGS, x, {N}, {K}, 1, False, run=None)))
""".format(M=M, N=N, K=K)


def start_children(tmp_path: Path, n: int) -> list[subprocess.Popen]:
    ready = tmp_path / "ready"
    ready.mkdir(exist_ok=True)
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        TRITON_INTERPRET="1",  # the kernels' modules import as on the CPU; the child turns pick.INTERPRET off
        REFERENCE_KERNELS_AUTOTUNE="1",
        TMPDIR=str(tmp_path / "locks"),
    )
    args = [str(tmp_path / "tuned"), str(tmp_path / "timings.log"), str(ready), str(n)]
    return [
        subprocess.Popen([sys.executable, "-c", CHILD, *args], env=env, cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(n)
    ]


def outputs(procs: list[subprocess.Popen]) -> list[str]:
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(out.strip())
    return outs


def timings(tmp_path: Path) -> list[list[str]]:
    log = tmp_path / "timings.log"
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def test_a_second_process_reads_the_pick_without_timing(timed, tmp_path):
    assert choose() is FASTEST
    assert timed == [configs.config_name(c) for c in CANDS]
    data = json.loads(cache_file().read_text())
    assert data["picks"] == {KEY: configs.config_name(FASTEST)}
    assert data["parts"]["triton"] == triton.__version__ and data["parts"]["device"] == "cpu"
    assert cache_file().name.startswith("cpu-")

    assert outputs(start_children(tmp_path, 1)) == [configs.config_name(FASTEST)]
    assert timings(tmp_path) == []


def test_two_processes_started_at_once_tune_a_key_once_between_them(timed, tmp_path):
    picks = outputs(start_children(tmp_path, 2))
    assert picks == [configs.config_name(FASTEST)] * 2
    rows = timings(tmp_path)
    assert len({pid for pid, _, _ in rows}) == 1, "both processes timed"
    assert len(rows) == 2 * len(CANDS)
    assert json.loads(cache_file().read_text())["picks"] == {KEY: configs.config_name(FASTEST)}


def test_tuning_waits_for_another_process_timing_on_the_device(timed, tmp_path, monkeypatch):
    """Another process's bench case holds the device's timing lock: tuning starts after it lets go."""
    started = tmp_path / "started"
    holder = (
        "import sys, time\nfrom pathlib import Path\nfrom pytest_fusion.machine import devices\n"
        "with devices.device_lock('cpu', holder='bench'):\n"
        "    Path(sys.argv[1]).touch()\n    time.sleep(1.0)\n    print(time.monotonic())\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path / "locks"))
    proc = subprocess.Popen([sys.executable, "-c", holder, str(started)], env=env, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert started.exists()
    timed_at = []
    fake = pick._time_ms
    monkeypatch.setattr(pick, "_time_ms", lambda run, c: timed_at.append(time.monotonic()) or fake(run, c))
    assert choose() is FASTEST
    out, _ = proc.communicate(timeout=60)
    assert timed_at and min(timed_at) >= float(out)  # CLOCK_MONOTONIC is one clock for all processes


# ---- what invalidates the cache ----------------------------------------------------------------------

def test_another_triton_version_tunes_again(timed, monkeypatch):
    assert choose() is FASTEST
    first, version = cache_file(), triton.__version__
    monkeypatch.setattr(triton, "__version__", "0.0.0+other")
    new_process(monkeypatch)
    assert choose() is FASTEST
    assert len(timed) == 2 * len(CANDS)
    assert cache_file() != first and first.exists()
    assert json.loads(cache_file().read_text())["parts"]["triton"] == "0.0.0+other"
    monkeypatch.setattr(triton, "__version__", version)  # the first version's file is still read
    new_process(monkeypatch)
    assert choose() is FASTEST and len(timed) == 2 * len(CANDS)


def test_a_changed_kernel_source_tunes_again(timed, monkeypatch, tmp_path):
    copies = []
    for src in cache.KERNEL_SOURCES:
        copies.append(tmp_path / src.name)
        copies[-1].write_bytes(src.read_bytes())
    monkeypatch.setattr(cache, "KERNEL_SOURCES", tuple(copies))
    cache.kernel_source_hash.cache_clear()
    assert choose() is FASTEST
    new_process(monkeypatch)
    assert choose() is FASTEST and len(timed) == len(CANDS)  # same sources: read from the cache
    first = cache_file()
    copies[0].write_text(copies[0].read_text() + "\n# changed\n")
    cache.kernel_source_hash.cache_clear()  # a new process hashes the sources anew
    new_process(monkeypatch)
    assert choose() is FASTEST
    assert len(timed) == 2 * len(CANDS)
    assert cache_file() != first


def test_the_fingerprint_covers_the_devices_name_and_capability(monkeypatch):
    ident = {0: ("NVIDIA H100 80GB HBM3", "9.0"), 1: ("NVIDIA H100 80GB HBM3", "9.0"), 2: ("NVIDIA H200", "9.0")}
    monkeypatch.setattr(cache, "_cuda_identity", lambda i: ident[i])
    parts = [cache.fingerprint_parts(torch.device("cuda", i)) for i in range(3)]
    assert parts[0]["device"] == "NVIDIA H100 80GB HBM3" and parts[0]["capability"] == "9.0"
    assert cache.fingerprint(parts[0]) == cache.fingerprint(parts[1]) != cache.fingerprint(parts[2])
    assert cache.fingerprint(parts[0]) != cache.fingerprint(dict(parts[0], capability="10.0"))


def _module_file(name: str) -> Path | None:
    """The file of module ``name`` (``reference_kernels.gemm.tma``), or None for no module."""
    base = ROOT.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def test_kernel_sources_cover_what_the_kernels_import_from_reference_kernels():
    seen: set[Path] = set()
    todo = ["reference_kernels.kernels.gated_mlp", "reference_kernels.kernels.linear_act"]
    while todo:
        name = todo.pop()
        path = _module_file(name)
        assert path is not None, name
        if path in seen or name.startswith("reference_kernels.tuning"):  # the pick, not the kernels' code
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("reference_kernels"):
                # ``from reference_kernels.gemm import targets`` names a module; ``from ...tma import Launch`` a name
                subs = [f"{node.module}.{a.name}" for a in node.names if _module_file(f"{node.module}.{a.name}")]
                todo += subs or [node.module]
    code = {p for p in seen if p.name != "__init__.py"}  # the folders' docstrings shape no kernel
    assert set(cache.KERNEL_SOURCES) == code


# ---- a damaged or stale cache ------------------------------------------------------------------------

DAMAGE = {
    "not JSON": lambda data: "{not json",
    "not an object": lambda data: "[]",
    "another schema": lambda data: json.dumps(dict(data, schema=cache.CACHE_SCHEMA + 1)),
    "another fingerprint": lambda data: json.dumps(dict(data, fingerprint="0" * 64)),
    "picks not names": lambda data: json.dumps(dict(data, picks={KEY: {"config": data["picks"][KEY]}})),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_corrupt_or_foreign_cache_file_warns_and_is_retuned(timed, monkeypatch, damage):
    assert choose() is FASTEST
    cache_file().write_text(DAMAGE[damage](json.loads(cache_file().read_text())))
    new_process(monkeypatch)
    with pytest.warns(RuntimeWarning, match=rf"tuning cache {cache_file()} is not a tuning cache"):
        assert choose() is FASTEST
    assert len(timed) == 2 * len(CANDS)
    assert json.loads(cache_file().read_text())["picks"] == {KEY: configs.config_name(FASTEST)}


def test_a_cache_entry_that_is_not_a_candidate_is_retuned(timed, monkeypatch):
    assert choose() is FASTEST
    data = json.loads(cache_file().read_text())
    data["picks"][KEY] = "128x128x64-w4-s9"
    cache_file().write_text(json.dumps(data))
    new_process(monkeypatch)
    with pytest.warns(RuntimeWarning, match=r"names '128x128x64-w4-s9', which is not a candidate config; tuning again"):
        assert choose() is FASTEST
    assert len(timed) == 2 * len(CANDS)
    assert json.loads(cache_file().read_text())["picks"][KEY] == configs.config_name(FASTEST)


def test_an_unwritable_cache_warns_once_and_tunes_per_process(timed, monkeypatch, tmp_path):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "a-file" / "cache"))  # its parent is a file
    with pytest.warns(RuntimeWarning, match=r"could not be written .*tuned once per process instead") as rec:
        assert choose() is FASTEST
        assert choose(5000) is not None  # a second key: tuned, no second warning
    assert [str(w.message) for w in rec if issubclass(w.category, RuntimeWarning)] == [str(rec[0].message)]
    assert len(timed) > len(CANDS)


# ---- precedence ---------------------------------------------------------------------------------------

def test_the_committed_table_wins_over_the_cache(timed, monkeypatch, tmp_path):
    assert choose() is FASTEST
    table_pick = CANDS[1]
    (tmp_path / "tuned" / "cpu.json").write_text(
        json.dumps({"meta": {}, "picks": {KEY: {"config": configs.config_name(table_pick)}}})
    )
    pick.load_table.cache_clear()
    new_process(monkeypatch)
    assert choose() is table_pick
    assert len(timed) == len(CANDS)


def test_autotune_off_reads_the_cache_and_tunes_nothing(timed, monkeypatch):
    assert choose() is FASTEST
    before = cache_file().read_text()
    new_process(monkeypatch)
    monkeypatch.setattr(pick, "AUTOTUNE", False)
    assert choose() is FASTEST
    other = choose(5000)  # a key the cache lacks: the first candidate, not timed, not cached
    assert other is configs.candidates(configs.LINEAR_CONFIGS, 5000, 2, 1, tma=False, target=targets.of_device(torch.device("cpu")))[0]
    assert len(timed) == len(CANDS)
    assert cache_file().read_text() == before


def test_the_interpreter_reads_no_cache(timed, monkeypatch):
    monkeypatch.setattr(pick, "INTERPRET", True)
    assert choose(16) is configs.INTERPRETER_CONFIG
    assert timed == [] and not cache_file().exists()


# ---- the timing lock, held by this process already -----------------------------------------------------

def test_a_kernel_first_called_inside_a_bench_cases_lock_tunes_without_waiting(timed, monkeypatch, recwarn):
    monkeypatch.setattr(locks, "DEFAULT_TIMING_LOCK_TIMEOUT_S", 0.5)  # a self-deadlock ends in 0.5 s, warned
    with devices.device_lock("cpu", timeout=5, holder="tests/bench.py::case"):
        assert choose() is FASTEST
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
    assert json.loads(cache_file().read_text())["picks"] == {KEY: configs.config_name(FASTEST)}


# ---- the export: python3 -m reference_kernels.tune --from-cache ---------------------------------------

def test_from_cache_writes_a_table_load_table_reads_back(timed, monkeypatch, tmp_path):
    assert choose() is FASTEST
    assert choose(5000) is not None
    cached = json.loads(cache_file().read_text())["picks"]
    assert len(cached) == 2
    out = tmp_path / "out"
    out.mkdir()
    path = tune_table.write_cache_table(str(out), "cpu")
    assert path == str(out / "cpu.json")
    meta = json.loads(Path(path).read_text())["meta"]
    assert meta["cache"] == str(cache_file()) and meta["device"] == "cpu"
    assert meta["torch"] == torch.__version__ and meta["triton"] == triton.__version__ and meta["date"]
    assert "triton.testing.do_bench" in meta["note"] and "not the tuner" in meta["note"]
    monkeypatch.setattr(pick, "TABLE_DIR", out)
    pick.load_table.cache_clear()
    assert pick.load_table("cpu") == cached


def test_from_cache_refuses_an_empty_cache_naming_the_file(timed, tmp_path):
    with pytest.raises(SystemExit, match=rf"no tuned picks in {cache_file()} \(no such file"):
        tune_table.write_cache_table(str(tmp_path), "cpu")
    cache_file().parent.mkdir(parents=True)
    cache_file().write_text("{not json")
    with pytest.warns(RuntimeWarning), pytest.raises(SystemExit, match=r"no tuned picks in .* \(no picks"):
        tune_table.write_cache_table(str(tmp_path), "cpu")


def test_from_cache_on_the_command_line(monkeypatch, tmp_path, capsys):
    written = []
    monkeypatch.setattr(cli, "write_cache_table", lambda out: written.append(out) or f"{out}/x.json")
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["tune", "--from-cache"])
    cli.main()
    assert written == [str(tmp_path)]
    assert f"table {tmp_path}/x.json" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["tune", "--from-cache", "--smoke"])
    with pytest.raises(SystemExit):
        cli.parse_args()
    assert "--from-cache times nothing" in capsys.readouterr().err

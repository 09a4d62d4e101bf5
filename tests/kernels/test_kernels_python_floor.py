"""The reference kernels and their tuner use nothing newer than the oldest Python pyproject.toml's
``requires-python`` admits, checked under that Python when one is installed (skipped otherwise; CI's
guard is mypy with ``python_version`` at the same floor). tests/kernels/python_floor.py reads the sources
without importing them, so the check needs no torch there; where that Python has torch and triton
too, the tuner's modules are imported and its command parses its arguments."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKER = Path(__file__).with_name("python_floor.py")
TUNER = ["cli", "cases", "correctness", "regimes", "sweep", "table"]


def floor() -> tuple[int, int]:
    """The oldest Python pyproject.toml admits: ``requires-python = ">=3.10"`` -> (3, 10)."""
    text = (ROOT / "pyproject.toml").read_text()
    found = re.search(r'^requires-python\s*=\s*">=\s*(\d+)\.(\d+)"', text, re.M)
    assert found, "pyproject.toml states no requires-python floor"
    return int(found[1]), int(found[2])


def find_python(version: tuple[int, int]) -> str | None:
    """An installed interpreter of ``version``: ``pythonX.Y`` on PATH, or pyenv's build of it."""
    name = f"python{version[0]}.{version[1]}"
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    builds = sorted(glob.glob(f"{pyenv}/versions/{version[0]}.{version[1]}.*/bin/{name}"))
    for exe in [shutil.which(name), *builds]:
        if not exe:
            continue
        try:
            out = subprocess.run([exe, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                                 text=True, timeout=60)
        except OSError:
            continue
        if out.returncode == 0 and out.stdout.split() == [str(v) for v in version]:
            return exe
    return None


@pytest.fixture(scope="module")
def oldest() -> tuple[tuple[int, int], str]:
    version = floor()
    exe = find_python(version)
    if exe is None:
        pytest.skip(f"no Python {version[0]}.{version[1]} (requires-python's floor) is installed here; "
                    "mypy's python_version checks the same floor")
    return version, exe


def check(exe: str, paths: list[Path]) -> dict:
    run = subprocess.run([exe, str(CHECKER), *map(str, paths)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def test_the_check_names_what_the_oldest_python_lacks(oldest, tmp_path):
    version, exe = oldest
    if version >= (3, 11):
        pytest.skip("the planted features came with Python 3.11")
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import concurrent.futures as cf\n"
        "import sys\n"
        "from typing import Self\n"
        "pool = cf.ProcessPoolExecutor(max_workers=1, max_tasks_per_child=1)\n"
        "if sys.version_info >= (3, 11):\n"
        "    pool = cf.ProcessPoolExecutor(max_workers=1, max_tasks_per_child=1)\n"
        "else:\n"
        "    pool = cf.ProcessPoolExecutor(max_workers=1)\n"
    )
    syntax = tmp_path / "syntax.py"
    syntax.write_text("try:\n    pass\nexcept* ValueError:\n    pass\n")
    found = check(exe, [planted, syntax])
    assert found["python"] == list(version)
    assert found["problems"][:2] == [
        f"{planted}:3: typing has no Self in this Python",
        f"{planted}:4: concurrent.futures.ProcessPoolExecutor() takes no max_tasks_per_child= in this Python",
    ]
    assert len(found["problems"]) == 3
    assert found["problems"][2].startswith(f"{syntax}:3: syntax this Python does not parse")


def test_reference_kernels_use_nothing_newer_than_the_oldest_python(oldest):
    version, exe = oldest
    found = check(exe, sorted((ROOT / "reference_kernels").rglob("*.py")))
    assert found["python"] == list(version)
    assert found["problems"] == []


def test_the_tuner_imports_and_parses_its_arguments_on_the_oldest_python(oldest):
    version, exe = oldest
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    has = subprocess.run([exe, "-c", "import torch, triton"], capture_output=True, text=True, env=env,
                         timeout=300)
    if has.returncode:
        pytest.skip(f"Python {version[0]}.{version[1]} here has no torch or triton "
                    f"({has.stderr.strip().splitlines()[-1]}): the source check above stands in")
    mods = "; ".join(f"import reference_kernels.tuning.tuner.{m}" for m in TUNER)
    imported = subprocess.run([exe, "-c", mods], capture_output=True, text=True, env=env, timeout=300)
    assert imported.returncode == 0, imported.stderr[-3000:]
    helped = subprocess.run([exe, "-m", "reference_kernels.tune", "--help"], capture_output=True, text=True,
                            env=env, timeout=300)
    assert helped.returncode == 0 and "--from-cache" in helped.stdout, helped.stderr[-3000:]


def test_this_python_is_not_below_the_floor():
    assert sys.version_info[:2] >= floor()

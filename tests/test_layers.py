"""The layer order written in pytest_fusion/__init__.py holds: every import in pytest_fusion and
reference_kernels, those inside functions included, runs from a higher layer to a lower one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import pytest_fusion

ROOT = Path(pytest_fusion.__file__).parent.parent
PYTEST_LAYER_FIRST_ROW = 8
"""Rows from this one on are the pytest layer, which reference_kernels must not import."""


def layer_rows() -> list[list[str]]:
    """The numbered rows of the package docstring: ``N. ``mod``, ``mod``: ...``; a row's module list
    may wrap onto the next lines (it ends at the row's first colon)."""
    rows = re.findall(r"^(\d+)\. (.*?):", pytest_fusion.__doc__ or "", flags=re.M | re.S)
    assert [int(n) for n, _ in rows] == list(range(1, len(rows) + 1)), rows
    return [re.findall(r"``([\w.]+)``", names) for _, names in rows]


def rank() -> dict[str, tuple[int, int]]:
    """``{module: (row, position in the total order)}`` for pytest_fusion's modules."""
    order = [m for row in layer_rows() for m in row]
    row_of = {m: i + 1 for i, row in enumerate(layer_rows()) for m in row}
    return {f"pytest_fusion.{m}": (row_of[m], order.index(m)) for m in order}


def modules(package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] in ("__init__", "__main__"):
            parts = parts[:-1] if parts[-1] == "__init__" else parts
        out[".".join(parts)] = path
    return out


def imports(path: Path, name: str) -> set[str]:
    """Every module ``path`` imports (absolute names), at any depth of its syntax tree."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".")[: -node.level] if not path.name == "__init__.py" else name.split(".")
                base = ".".join(pkg + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return found


def own(target: str, known: dict[str, tuple[int, int]]) -> str | None:
    """The layered module ``target`` names (``pytest_fusion.bench.timing.measure`` -> its module)."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def test_every_module_of_pytest_fusion_has_a_layer():
    known = rank()
    unplaced = [m for m in modules("pytest_fusion") if m not in known and m not in ("pytest_fusion",
                                                                                    "pytest_fusion.bench")]
    assert not unplaced, f"modules missing from the layer list in pytest_fusion/__init__.py: {unplaced}"


def test_imports_run_downward_only():
    known = rank()
    upward = []
    for name, path in modules("pytest_fusion").items():
        if name not in known:
            continue
        for target in imports(path, name):
            assert not target.startswith("reference_kernels"), f"{name} imports {target}"
            mod = own(target, known)
            if mod and known[mod][1] >= known[name][1] and mod != name:
                upward.append(f"{name} (row {known[name][0]}) imports {mod} (row {known[mod][0]})")
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_reference_kernels_import_only_the_plain_core():
    known = rank()
    bad = []
    for name, path in modules("reference_kernels").items():
        for target in imports(path, name):
            mod = own(target, known)
            if target == "pytest_fusion":  # the package: its names load lazily from their modules
                continue
            if target.startswith("pytest_fusion") and (mod is None or known[mod][0] >= PYTEST_LAYER_FIRST_ROW):
                bad.append(f"{name} imports {target}")
    assert not bad, bad


def test_the_walk_sees_imports_inside_functions(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from pytest_fusion.plugin import pytest_configure\n")
    assert "pytest_fusion.plugin" in imports(src, "pytest_fusion.gate")


@pytest.mark.parametrize("switch, on", [("1", True), ("true", True), ("ON", True), ("0", False),
                                        ("false", False), ("off", False), ("", False)])
def test_one_truthiness_rule_for_triton_interpret(monkeypatch, switch, on):
    from pytest_fusion import devices

    monkeypatch.setenv("TRITON_INTERPRET", switch)
    assert devices.interpreter_active() is on
    assert devices.env_flag("TRITON_INTERPRET") is on

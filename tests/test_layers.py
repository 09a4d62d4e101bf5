"""The folder order written in pytest_fusion/__init__.py, and each folder's module order, hold: every
import in pytest_fusion and reference_kernels, those inside functions included, runs from a higher
layer to a lower one."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import pytest_fusion

ROOT = Path(pytest_fusion.__file__).parent.parent
PLUGIN_FOLDER = "plugin"
DEMO_TESTS = "pytest_fusion.demo.test_demo"
"""The pytest layer, which reference_kernels must not import."""


def folders() -> list[str]:
    """The numbered rows of the package docstring, ``N. ``folder``: ...``, in order."""
    rows = re.findall(r"^(\d+)\. ``(\w+)``:", pytest_fusion.__doc__ or "", flags=re.M)
    assert [int(n) for n, _ in rows] == list(range(1, len(rows) + 1)), rows
    return [folder for _, folder in rows]


def folder_modules(folder: str) -> list[str]:
    """The modules a folder's docstring lists, lowest first (``Modules, lowest first ...: ``a``, ...``)."""
    doc = importlib.import_module(f"pytest_fusion.{folder}").__doc__ or ""
    listed = re.search(r"Modules, lowest first[^:]*:(.*?)\.\s*$", doc, flags=re.S)
    assert listed, f"pytest_fusion/{folder}/__init__.py lists no module order"
    return re.findall(r"``(\w+)``", listed.group(1))


def rank() -> dict[str, tuple[int, int]]:
    """``{module: (folder's row, position in the total order)}``; a folder itself ranks first in it."""
    order: list[tuple[str, int]] = []
    for row, folder in enumerate(folders(), start=1):
        order.append((f"pytest_fusion.{folder}", row))
        order += [(f"pytest_fusion.{folder}.{m}", row) for m in folder_modules(folder)]
    return {name: (row, i) for i, (name, row) in enumerate(order)}


def upward(known: dict[str, tuple[int, int]], found: dict[str, set[str]]) -> list[str]:
    """The imports of ``found`` (``{module: modules it imports}``) that run from a lower rank to a
    higher one, or into reference_kernels."""
    bad = []
    for name, targets in found.items():
        for target in targets:
            if target.startswith("reference_kernels"):
                bad.append(f"{name} imports {target}")
                continue
            mod = own(target, known)
            if mod and mod != name and known[mod][1] >= known[name][1] and not name.startswith(mod + "."):
                bad.append(f"{name} (folder {known[name][0]}) imports {mod} (folder {known[mod][0]})")
    return sorted(bad)


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
    """The layered module ``target`` names (``pytest_fusion.measure.timing.measure`` -> its module)."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def package_imports(known: dict[str, tuple[int, int]]) -> dict[str, set[str]]:
    """``{module: what it imports}`` for pytest_fusion's ranked modules, less the demo's test file:
    a user's test shipped with the demo, it imports reference_kernels as users do."""
    return {name: imports(path, name) for name, path in modules("pytest_fusion").items()
            if name in known and name != DEMO_TESTS}


def test_every_module_of_pytest_fusion_has_a_place():
    known = rank()
    unplaced = [m for m in modules("pytest_fusion") if m not in known and m != "pytest_fusion"
                and not m.endswith(".__main__")]
    assert not unplaced, f"modules missing from their folder's module order: {unplaced}"
    on_disk = sorted(p.name for p in (ROOT / "pytest_fusion").iterdir() if (p / "__init__.py").exists())
    assert on_disk == sorted(folders()), "folders on disk and in pytest_fusion/__init__.py differ"


def test_imports_run_downward_only():
    known = rank()
    bad = upward(known, package_imports(known))
    assert not bad, "imports from a lower layer to a higher one:\n" + "\n".join(bad)


@pytest.mark.parametrize("importer, target", [
    ("pytest_fusion.oracle.budget", "pytest_fusion.plugin.config"),  # a folder below
    ("pytest_fusion.oracle.tensors", "pytest_fusion.oracle.case"),  # later in its own folder
    ("pytest_fusion.machine.devices", "pytest_fusion.oracle.memory"),  # the lowest folder reaching up
    ("pytest_fusion.gate.rule", "reference_kernels.gemm.configs"),
])
def test_a_planted_upward_import_is_reported(importer, target):
    known = rank()
    found = package_imports(known)
    assert not upward(known, found)
    found[importer] = found[importer] | {target}
    assert upward(known, found) and importer in upward(known, found)[0]


def test_reference_kernels_import_only_the_plain_core():
    known = rank()
    bad = []
    for name, path in modules("reference_kernels").items():
        for target in imports(path, name):
            mod = own(target, known)
            if target == "pytest_fusion":  # the package: its names load lazily from their modules
                continue
            if target.startswith("pytest_fusion") and (mod is None or mod.startswith(f"pytest_fusion.{PLUGIN_FOLDER}")):
                bad.append(f"{name} imports {target}")
    assert not bad, bad


def test_the_walk_sees_imports_inside_functions(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from pytest_fusion.plugin.hookimpls import pytest_configure\n")
    assert "pytest_fusion.plugin.hookimpls" in imports(src, "pytest_fusion.gate.rule")


@pytest.mark.parametrize("switch, on", [("1", True), ("true", True), ("ON", True), ("0", False),
                                        ("false", False), ("off", False), ("", False)])
def test_one_truthiness_rule_for_triton_interpret(monkeypatch, switch, on):
    from pytest_fusion.machine import devices

    monkeypatch.setenv("TRITON_INTERPRET", switch)
    assert devices.interpreter_active() is on
    assert devices.env_flag("TRITON_INTERPRET") is on


def top_level_names(path: Path) -> set[str]:
    """Names a module defines itself (functions, classes, assignments, those under a top-level
    ``if``/``try`` included), not those it imports."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        for sub in [node, *(ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [])]:
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(sub.name)
            elif isinstance(sub, (ast.Assign, ast.AnnAssign)):
                targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def test_each_public_name_loads_from_the_module_that_defines_it():
    found = modules("pytest_fusion")
    elsewhere = {name: module for name, module in pytest_fusion._EXPORTS.items()
                 if name not in top_level_names(found[module])}
    assert not elsewhere, f"public names exported from a module that only imports them: {elsewhere}"


def test_no_name_is_imported_from_a_module_that_only_imports_it():
    """One home per name: ``from pytest_fusion.m import n`` names the module defining ``n`` (or
    ``n`` is a submodule of the package ``m``), across the package, its tests and the kernels."""
    found = modules("pytest_fusion")
    homes = {name: top_level_names(path) for name, path in found.items()}
    second_homes = []
    for path in [*ROOT.glob("pytest_fusion/**/*.py"), *ROOT.glob("reference_kernels/**/*.py"),
                 *ROOT.glob("tests/**/*.py"), *ROOT.glob("examples/**/*.py"), ROOT / "conftest.py"]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.ImportFrom) and node.module in homes and node.module != "pytest_fusion"):
                continue
            for alias in node.names:
                if alias.name not in homes[node.module] and f"{node.module}.{alias.name}" not in found:
                    second_homes.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {alias.name} "
                                        f"from {node.module}")
    assert not second_homes, "\n".join(second_homes)

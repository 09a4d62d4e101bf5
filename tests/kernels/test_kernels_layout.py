"""The folder order written in reference_kernels/__init__.py holds: every import inside
reference_kernels, those inside functions included, goes to the module's own folder or to a folder
listed before it; every module has a folder; the folders' ``__init__`` files hold only their
docstring (the kernels' sources are what the tuning cache hashes, tuning.cache.KERNEL_SOURCES)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import reference_kernels

PACKAGE = Path(reference_kernels.__file__).parent
TOP = ("reference_kernels", "reference_kernels.tune")
"""The package (its public names) and the tuner's command: above every folder."""


def rows() -> list[str]:
    """The numbered rows of the package docstring, ``N. ``folder``: ...``, as module prefixes, in order."""
    found = re.findall(r"^(\d+)\. ``([\w.]+)``:", reference_kernels.__doc__ or "", flags=re.M)
    assert [int(n) for n, _ in found] == list(range(1, len(found) + 1)), found
    return [f"reference_kernels.{folder}" for _, folder in found]


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ["reference_kernels", *path.relative_to(PACKAGE).with_suffix("").parts]
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def rank(name: str, order: list[str]) -> int | None:
    """The row of module ``name``: the longest row prefix it falls under (None: no row)."""
    best = None
    for i, prefix in enumerate(order):
        inside = name == prefix or name.startswith(prefix + ".")
        if inside and (best is None or len(prefix) > len(order[best])):
            best = i
    return best


def imports(path: Path) -> set[str]:
    """The reference_kernels modules ``path`` imports (``from m import n`` names ``m.n`` where that
    is a module), at any depth of its syntax tree."""
    known = modules()
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            subs = {f"{node.module}.{a.name}" for a in node.names} & set(known)
            found |= subs or {node.module}
    return {m for m in found if m.split(".")[0] == "reference_kernels"}


def upward(found: dict[str, set[str]], order: list[str]) -> list[str]:
    """The imports of ``found`` (``{module: modules it imports}``) that go to a later folder."""
    bad = []
    for name, targets in found.items():
        here = rank(name, order)
        for target in targets:
            there = rank(target, order)
            if here is not None and (there is None or there > here):
                folder = "-" if there is None else there + 1
                bad.append(f"{name} (folder {here + 1}) imports {target} (folder {folder})")
    return sorted(bad)


def test_every_module_has_a_folder():
    order = rows()
    unplaced = [m for m in modules() if m not in TOP and rank(m, order) is None]
    assert not unplaced, f"modules in no folder of reference_kernels/__init__.py: {unplaced}"
    on_disk = sorted(f"reference_kernels.{p.name}" for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    assert on_disk == sorted(r for r in order if r.count(".") == 1)


def test_imports_go_to_the_same_folder_or_an_earlier_one():
    found = {name: imports(path) for name, path in modules().items()}
    bad = upward(found, rows())
    assert not bad, "imports from a folder to a later one:\n" + "\n".join(bad)


@pytest.mark.parametrize("importer, target", [
    ("reference_kernels.gemm.tma", "reference_kernels.kernels.validate"),  # the lowest folder reaching up
    ("reference_kernels.tuning.pick", "reference_kernels.tuning.tuner.table"),  # the pick, below the kernels
    ("reference_kernels.kernels.linear_act", "reference_kernels.models.shapes"),
])
def test_a_planted_upward_import_is_reported(importer, target):
    found = {name: imports(path) for name, path in modules().items()}
    found[importer] = found[importer] | {target}
    bad = upward(found, rows())
    assert len(bad) == 1 and bad[0].startswith(importer + " "), bad


def test_the_walk_sees_imports_inside_functions(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from reference_kernels.tuning.tuner import cli\n")
    assert imports(src) == {"reference_kernels.tuning.tuner.cli"}


def test_folder_inits_hold_only_their_docstring():
    for name, path in modules().items():
        if path.name != "__init__.py" or name in TOP:
            continue
        body = ast.parse(path.read_text()).body
        first = body[0] if body else None
        docstring_only = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
        assert len(body) == 1 and docstring_only, name

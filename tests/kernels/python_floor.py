"""Check source files against the standard library of the Python running this script, without
importing them (so it runs where torch and triton are not installed): run it with the oldest Python
that pyproject.toml's ``requires-python`` admits. Prints one JSON object: the Python version and
the problems found, each ``path:line: what``.

    python3.10 tests/kernels/python_floor.py reference_kernels/tuning/tuner/*.py

What it finds, for every file: syntax this Python cannot parse (``ast.parse`` with its
``feature_version``); a name imported from a standard-library module that this Python's module
lacks (``from typing import Self``); an attribute chain off an imported standard-library module that
does not resolve here (``datetime.UTC``); and a keyword argument that the standard-library callable
it is passed to does not take here (``ProcessPoolExecutor(max_tasks_per_child=1)``, Python 3.11).
Code under an ``if`` on ``sys.version_info`` that is false here (``if sys.version_info >= (3, 11):``)
is not checked, nor its ``else`` when the test is true. Standard library only: it runs on any
Python the package supports.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import sys
from pathlib import Path
from typing import Any

_MISSING = object()


def _stdlib(module: str) -> bool:
    return module.split(".")[0] in sys.stdlib_module_names


def _resolve(dotted: str) -> Any:
    """The object ``dotted`` names (``concurrent.futures.ProcessPoolExecutor``) in this Python,
    importing its module part; :data:`_MISSING` when it does not exist."""
    parts = dotted.split(".")
    obj: Any
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name, _MISSING)
            if obj is _MISSING:
                return _MISSING
        return obj
    return _MISSING


def _chain(node: ast.expr) -> list[str] | None:
    """``["cf", "process", "BrokenProcessPool"]`` for ``cf.process.BrokenProcessPool``; None for
    anything but a name followed by attributes."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(names)]


def _version_test(test: ast.expr) -> bool | None:
    """The value here of an ``if`` test that compares ``sys.version_info`` (None for any other)."""
    if not (isinstance(test, ast.Compare) and _chain(test.left) == ["sys", "version_info"]):
        return None
    return bool(eval(compile(ast.Expression(test), "<version test>", "eval"), {"sys": sys}))


def problems(path: Path) -> list[str]:
    """What in ``path`` this Python's parser or standard library does not have (module docstring)."""
    try:
        tree = ast.parse(path.read_text(), str(path), feature_version=sys.version_info[:2])
    except SyntaxError as exc:
        return [f"{path}:{exc.lineno}: syntax this Python does not parse: {exc.msg}"]
    aliases: dict[str, str] = {}  # local name -> the standard-library object it names
    found: list[str] = []

    def imported(node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                if _stdlib(a.name):
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif node.module and not node.level and _stdlib(node.module):
            for a in node.names:
                if a.name != "*" and _resolve(f"{node.module}.{a.name}") is _MISSING:
                    found.append(f"{path}:{node.lineno}: {node.module} has no {a.name} in this Python")
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"

    def dotted(node: ast.expr) -> str | None:
        names = _chain(node)
        if not names or names[0] not in aliases:
            return None
        return ".".join([aliases[names[0]], *names[1:]])

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If):
            here = _version_test(node.test)
            if here is not None:
                kept: list[ast.stmt] = node.body if here else node.orelse
                for stmt in kept:
                    visit(stmt)
                return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imported(node)
        elif isinstance(node, ast.Attribute) and not isinstance(getattr(node, "parent", None), ast.Attribute):
            name = dotted(node)
            if name and _resolve(name) is _MISSING:
                found.append(f"{path}:{node.lineno}: {name} is not in this Python")
        elif isinstance(node, ast.Call):
            name = dotted(node.func) if isinstance(node.func, (ast.Name, ast.Attribute)) else None
            target = _resolve(name) if name else _MISSING
            if target is not _MISSING and callable(target):
                try:
                    params = inspect.signature(target).parameters
                except (TypeError, ValueError):  # a builtin without a signature
                    params = None
                if params is not None and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
                    for kw in node.keywords:
                        if kw.arg is not None and kw.arg not in params:
                            found.append(f"{path}:{node.lineno}: {name}() takes no {kw.arg}= in this Python")
        for child in ast.iter_child_nodes(node):
            child.parent = node  # type: ignore[attr-defined]
            visit(child)

    visit(tree)
    return found


def main(argv: list[str]) -> None:
    found = [p for arg in argv for p in problems(Path(arg))]
    print(json.dumps({"python": list(sys.version_info[:2]), "problems": found}))


if __name__ == "__main__":
    main(sys.argv[1:])

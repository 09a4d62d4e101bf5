"""The entries of a declared shape: a dims symbol (``"K"``), a fixed size (``16``), or a size derived
from the dims (``"2*d"`` for a packed gate/up weight, ``"cdiv(K, 32)"`` for one scale per block of
32, ``"K // 2"`` for two int4 values per byte).

A derived size is parsed with :mod:`ast` and only this grammar is accepted: non-negative integer
literals, dims symbols, ``+``, ``-``, ``*``, ``//``, parentheses and ``cdiv(a, b)`` (``-(-a // b)``,
Triton's name for the ceiling division). Nothing is ever passed to ``eval``: anything else (a
call of another function, ``**``, ``/``, an attribute, a float) is refused with a
:class:`~pytest_fusion.declare.spec.FusionUsageError` naming the declaration and the bad token.
Plain Python, no torch import.
"""

from __future__ import annotations

import ast
import functools
from typing import Mapping

from pytest_fusion.declare.spec import FusionUsageError

Entry = str | int
"""One entry of a declared shape, as :class:`~pytest_fusion.declare.spec.Tensor` holds it."""

_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//"}
_FUNCTIONS = ("cdiv",)


def is_symbol(entry: Entry) -> bool:
    """Whether ``entry`` is a bare dims symbol (``"K"``), not a fixed size or an expression."""
    return isinstance(entry, str) and entry.isidentifier()


def _bad(where: str, text: str, token: str, why: str) -> FusionUsageError:
    return FusionUsageError(
        f"{where} has a bad size {text!r}: {why} at {token!r}; a derived size may use dims symbols, "
        "integers, + - * //, parentheses and cdiv(a, b)"
    )


@functools.lru_cache(maxsize=1024)
def _tree(text: str) -> ast.expr:
    """The parsed expression of ``text`` (checked by :func:`parse`)."""
    return ast.parse(text.strip(), mode="eval").body


def parse(text: str, where: str) -> tuple[str, ...]:
    """Check the derived size ``text`` against the grammar (module docstring); the dims symbols it
    names, in order of appearance.

    Raises:
        FusionUsageError: a syntax error or a token outside the grammar, naming ``where`` (the
            declaration, e.g. ``inputs['scales']``) and the token.
    """
    try:
        tree = _tree(text)
    except SyntaxError as exc:
        token = (exc.text or text)[max((exc.offset or 1) - 1, 0):].strip() or text
        raise _bad(where, text, token, f"not an expression ({exc.msg})") from None
    names: list[str] = []

    def walk(node: ast.AST) -> None:
        segment = ast.get_source_segment(text.strip(), node) or text
        if isinstance(node, ast.BinOp):
            if type(node.op) not in _OPERATORS:
                op = segment
                if hasattr(node.left, "end_col_offset") and hasattr(node.right, "col_offset"):
                    op = text.strip()[node.left.end_col_offset:node.right.col_offset].strip()
                raise _bad(where, text, op, "operator not allowed")
            walk(node.left)
            walk(node.right)
        elif isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else None
            if name not in _FUNCTIONS or node.keywords or len(node.args) != 2:
                raise _bad(where, text, segment, "only cdiv(a, b) may be called")
            for arg in node.args:
                walk(arg)
        elif isinstance(node, ast.Name):
            names.append(node.id)
        elif isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int):
                raise _bad(where, text, segment, "only non-negative integer literals are allowed")
        else:
            raise _bad(where, text, segment, f"{type(node).__name__.lower()} not allowed")

    walk(tree)
    return tuple(dict.fromkeys(names))


def symbols(entry: Entry) -> tuple[str, ...]:
    """The dims symbols ``entry`` names (none for a fixed size); ``entry`` as :func:`parse` checked it."""
    if isinstance(entry, int):
        return ()
    if is_symbol(entry):
        return (entry,)
    return parse(entry, "a shape")


def _value(node: ast.AST, dims: Mapping[str, int]) -> int:
    if isinstance(node, ast.Constant):
        return int(node.value)  # type: ignore[arg-type]  # parse() admits int literals only
    if isinstance(node, ast.Name):
        return int(dims[node.id])
    if isinstance(node, ast.Call):
        a, b = (_value(arg, dims) for arg in node.args)
        return -(-a // b)
    assert isinstance(node, ast.BinOp)
    a, b = _value(node.left, dims), _value(node.right, dims)
    if isinstance(node.op, ast.Add):
        return a + b
    if isinstance(node.op, ast.Sub):
        return a - b
    if isinstance(node.op, ast.Mult):
        return a * b
    return a // b


def size(entry: Entry, dims: Mapping[str, int], where: str = "a shape") -> int:
    """The size ``entry`` stands for at ``dims`` (every symbol it names must be in ``dims``).

    Raises:
        FusionUsageError: the size is negative, or divides by zero, there (naming ``where``).
    """
    if isinstance(entry, int):
        return int(entry)
    if is_symbol(entry):
        return int(dims[entry])
    try:
        value = _value(_tree(entry), dims)
    except ZeroDivisionError:
        value = None
    if value is None or value < 0:
        at = " ".join(f"{s}={dims[s]}" for s in symbols(entry))
        what = "divides by zero" if value is None else f"is {value}"
        raise FusionUsageError(f"{where}: size {entry!r} {what} at {at}; a size must be an int >= 0")
    return value


def divisors(entry: Entry) -> dict[str, set[int]]:
    """``{symbol: block sizes}`` that ``entry`` divides a symbol by: ``c`` of ``cdiv(K, c)`` and of
    ``K // c`` where ``K`` is a bare symbol and ``c`` a literal > 1 (the quantization block of
    ``cdiv(K, 32)`` scales, the 2 of ``K // 2`` packed int4 bytes). The edge tiers put such a
    symbol at the block's edges (:mod:`pytest_fusion.property.strategies`)."""
    if isinstance(entry, int) or is_symbol(entry):
        return {}
    out: dict[str, set[int]] = {}
    for node in ast.walk(_tree(entry)):
        pair = None
        if isinstance(node, ast.Call) and len(node.args) == 2:
            pair = node.args
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv):
            pair = [node.left, node.right]
        if pair and isinstance(pair[0], ast.Name) and isinstance(pair[1], ast.Constant):
            block = int(pair[1].value)  # type: ignore[arg-type]
            if block > 1:
                out.setdefault(pair[0].id, set()).add(block)
    return out

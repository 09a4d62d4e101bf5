"""Sizes derived from the dims in a declared shape (pytest_fusion.declare.sizes): the grammar, and
the errors naming the declaration and the bad token."""

from __future__ import annotations

import pytest

from pytest_fusion.declare import sizes
from pytest_fusion.declare.marker import make_spec
from pytest_fusion.declare.spec import FusionUsageError, Tensor
from pytest_fusion.oracle.tensors import shape_of


@pytest.mark.parametrize(("text", "value"), [("2*d", 6), ("cdiv(K, 32)", 2), ("K // 2", 16), ("(K + 1) // 2", 17),
                                             ("d - 1", 2)])
def test_derived_sizes_evaluate(text: str, value: int) -> None:
    assert sizes.size(text, {"d": 3, "K": 33}) == value


@pytest.mark.parametrize(("text", "token"), [
    ("K ** 2", "'**'"), ("K / 2", "'/'"), ("__import__('os').system('x')", "only cdiv(a, b) may be called"),
    ("K.real", "'K.real'"), ("1.5 * K", "'1.5'"), ("max(K, 2)", "'max(K, 2)'"), ("-K", "'-K'"),
])
def test_anything_outside_the_grammar_is_refused_naming_the_input_and_token(text: str, token: str) -> None:
    with pytest.raises(FusionUsageError, match=r"inputs\['scales'\] has a bad size") as info:
        make_spec(lambda x, s: x, inputs={"x": ("N", "K"), "scales": ("N", text)}, dims={"N": (1, 4), "K": (1, 64)})
    assert token in str(info.value)


def test_unknown_symbols_and_negative_sizes_are_refused() -> None:
    with pytest.raises(FusionUsageError, match=r"in size 'cdiv\(Q, 32\)' the symbol 'Q', which is missing"):
        make_spec(lambda x, s: x, inputs={"x": ("N", "K"), "s": ("N", "cdiv(Q, 32)")}, dims={"N": (1, 4), "K": (1, 64)})
    with pytest.raises(FusionUsageError, match=r"size 'K - 8' is -7 at K=1"):
        make_spec(lambda x, s: x, inputs={"x": ("N", "K"), "s": ("N", "K - 8")}, dims={"N": (1, 4), "K": (1, 64)})


def test_a_derived_shape_builds() -> None:
    assert shape_of(Tensor(("2*d", "cdiv(K, 32)")), {"d": 5, "K": 48}) == (10, 2)
    assert sizes.divisors("cdiv(K, 32)") == {"K": {32}} and sizes.divisors("K // 2") == {"K": {2}}

"""Converters of option values (argparse types, also applied to environment and ini values by
:func:`pytest_fusion.plugin.config.resolve`): a bad value is a usage error naming the option."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import Any

from pytest_fusion.declare.spec import check_tolerance
from pytest_fusion.property import repro


def int_at_least(minimum: int) -> Callable[[str], int]:
    """argparse type factory: an int >= ``minimum``, else an ArgumentTypeError saying so."""

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    return convert


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    """argparse type factory: one of ``choices`` (case and spaces ignored)."""

    def convert(text: str) -> str:
        value = str(text).strip().lower()
        if value not in choices:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(choices)}, got {text!r}")
        return value

    return convert


def boolean(text: str) -> bool:
    """argparse/ini type: true/false, 1/0, yes/no, on/off."""
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def tolerance(text: str) -> float:
    """argparse type: a fraction in [0, 1), e.g. 0.05 for 5% (``spec.check_tolerance``)."""
    try:
        return check_tolerance(float(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a fraction such as 0.05: {exc}") from None


def seconds(text: str) -> float:
    """argparse type: a finite number of seconds >= 0, e.g. 0.05."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds such as 0.05, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds >= 0, got {value}")
    return value


def provider_list(text: str) -> tuple[str, ...] | None:
    """argparse type: ``all`` (None: every provider) or comma-separated names, e.g. ``eager,liger``."""
    names = tuple(n.strip() for n in str(text).split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError("expected 'all' or comma-separated provider names")
    if "all" in names and len(names) > 1:
        raise argparse.ArgumentTypeError("'all' cannot be combined with other provider names")
    bad = [n for n in names if not re.fullmatch(r"[A-Za-z_][\w.-]*", n)]
    if bad:
        raise argparse.ArgumentTypeError(f"bad provider name(s) {bad}")
    return None if names == ("all",) else names


def case_globs(text: str) -> tuple[str, ...]:
    """argparse type: comma-separated globs matched against ``<case>`` or ``<case>-<dtype>``."""
    globs = tuple(g.strip() for g in str(text).split(",") if g.strip())
    if not globs:
        raise argparse.ArgumentTypeError("expected comma-separated case-name globs, e.g. 'decode*,gpt2-*'")
    return globs


def repro_case(text: str) -> dict[str, Any]:
    """argparse type: a case as a failure prints it, its fields type-checked (:func:`repro.parse`;
    the dims' ranges are checked per test, by :func:`repro.case_for`)."""
    try:
        return repro.parse(text)
    except ValueError as exc:
        problem = str(exc)
    raise argparse.ArgumentTypeError(f"not a case printed by pytest-fusion: {problem}")

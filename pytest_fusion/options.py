"""Option names and the one rule for where a setting comes from: CLI > environment > ini > default.

No torch import here: this module is on the plugin's import path.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Callable

import pytest

INTERPRET = "fusion_interpret"
EXAMPLES = "fusion_examples"
MAX_DIM = "fusion_max_dim"
REPRO = "fusion_repro"
ALL_CONFIGS = "fusion_all_configs"

INTERPRET_ENV = "PYTEST_FUSION_INTERPRET"
INTERPRET_CHOICES = ("auto", "on", "off")


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
"""argparse type: an int >= 1."""

non_negative_int = int_at_least(0)
"""argparse type: an int >= 0 (0 switches a cap off)."""


def interpret_mode(text: str) -> str:
    """argparse type: auto, on or off."""
    value = text.strip().lower()
    if value not in INTERPRET_CHOICES:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(INTERPRET_CHOICES)}, got {text!r}")
    return value


def boolean(text: str) -> bool:
    """argparse type: true/false, yes/no, on/off or 1/0."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def resolve(
    config: pytest.Config,
    name: str,
    *,
    default: Any,
    convert: Callable[[str], Any] = str,
    env: str | None = None,
) -> Any:
    """The value of setting ``name``: the command line (dest ``name``), else the environment
    variable ``env``, else the ini key ``name``, else ``default``. Values from the environment and
    the ini file pass through ``convert`` (an argparse type), so they are validated the same way.

    Raises:
        pytest.UsageError: an environment or ini value ``convert`` rejects, naming where it came from.
    """
    cli = config.getoption(name, default=None)
    if cli is None:  # before pytest_configure only the early parse has it (load_initial_conftests)
        cli = getattr(getattr(config, "known_args_namespace", None), name, None)
    if cli is not None:
        return cli
    sources = []
    if env and os.environ.get(env, "").strip():
        sources.append((f"environment variable {env}", os.environ[env]))
    ini = config.getini(name)
    if ini not in (None, "", []):
        sources.append((f"ini option {name}", str(ini)))
    for where, raw in sources:
        try:
            return convert(raw)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise pytest.UsageError(f"pytest-fusion: bad value {raw!r} in {where}: {exc}") from None
    return default

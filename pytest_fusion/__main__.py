"""``python3 -m pytest_fusion COMMAND``: ``demo`` runs the main job on shipped kernels; ``history``
draws baseline files across their git history (:mod:`pytest_fusion.report.history`)."""

from __future__ import annotations

import sys

COMMANDS = {"demo": "pytest_fusion.demo.run", "history": "pytest_fusion.report.history"}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python3 -m pytest_fusion {{{','.join(COMMANDS)}}} [options]", file=sys.stderr)
        return 2
    import importlib

    return int(importlib.import_module(COMMANDS[argv[0]]).main(argv[1:]))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

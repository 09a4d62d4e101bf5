"""``python3 -m pytest_fusion.baselines``: the baseline files' commands (``--help`` lists them).

- ``[upgrade] FILE...``: rewrite baseline files in the current schema
  (:func:`pytest_fusion.baselines.store.main`);
- ``prune FILE [--write] [-- PYTEST_ARGS...]``: list a file's stale entries, drop them with
  ``--write`` (:func:`pytest_fusion.plugin.prune.main`: it collects the tests, so it lives in the
  pytest layer; this command line sits above every folder);
- ``rename FILE OLD NEW``: move a renamed test's or test file's entries to the new name
  (:func:`pytest_fusion.baselines.store.rename_main`).
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    if argv[:1] == ["prune"]:
        from pytest_fusion.plugin.prune import main as prune

        return prune(argv[1:])
    from pytest_fusion.baselines.store import main as upgrade
    from pytest_fusion.baselines.store import rename_main

    if argv[:1] == ["rename"]:
        return rename_main(argv[1:])

    return upgrade(argv[1:] if argv[:1] == ["upgrade"] else argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

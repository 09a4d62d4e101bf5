"""Replace a file's content atomically, as an editor would leave it: a temporary file beside the
target, fsync, ``os.replace``; an existing file keeps its permission bits, a new one gets the
default mode. Used for the baseline files (:func:`pytest_fusion.baselines.store.save`)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


def _default_mode() -> int:
    """``0o666 & ~umask``: the mode ``open(path, "w")`` gives a new file (mkstemp's is 0o600).
    Python 3.11 has no way to read the umask without setting it, so set it and put it back."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def _tmp_prefix(target: Path) -> str:
    return f".{target.name}."


def remove_stale_temps(target: Path) -> list[Path]:
    """Remove the temporary files a killed :func:`replace_text` of ``target`` left beside it;
    returns them. Call only under the file's lock: a live write's own temporary file exists only
    while it holds it."""
    removed = []
    for tmp in target.parent.glob(_tmp_prefix(target) + "*.tmp"):
        try:
            tmp.unlink()
            removed.append(tmp)
        except FileNotFoundError:
            pass
    return removed


def replace_text(target: Path, text: str) -> None:
    """Write ``text`` to ``target`` through a temporary file beside it, fsync, os.replace; the
    target's permission bits are kept (a new file gets ``0o666 & ~umask``)."""
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = _default_mode()
    fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(target), suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise

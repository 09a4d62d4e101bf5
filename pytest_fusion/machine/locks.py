"""Inter-process locks (:mod:`filelock`) in a per-user directory of the temp dir.

One directory per user, ``<tempdir>/pytest-fusion-<uid>/``: a lock file created by one user's run
cannot make another user's run fail to open it (a machine-wide lock file is owned by whoever made
it first, and the next user's open raises PermissionError), and one user's stuck run cannot block
another user's. The price: two users timing on one device at once are not kept apart.

- :func:`timing_lock`: one timing per device at a time (xdist workers sharing a GPU or the CPU);
  the holder writes who it is beside the lock; a waiter says so once its wait passes
  :data:`WAIT_NOTICE_S` (``notify``: who holds it, since when) and again when it gets the lock,
  and one that gives up after ``timeout`` seconds raises :class:`LockTimeout` naming that holder.
  A ``reentrant`` hold passes at once where this thread already holds the lock (a kernel tuned at
  its first call inside a bench case's timing).
- :func:`path_lock`: a lock for one file of the user's (a baseline file), keyed by its real path.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

if TYPE_CHECKING:
    from filelock import FileLock

DEFAULT_TIMING_LOCK_TIMEOUT_S = 600.0
"""How long a bench case waits for another process timing on its device: far longer than one case
takes to time, so only a holder that is stopped or hung (a kernel that never returns) runs it out,
and then the waiting runs fail with the holder's name instead of blocking for good."""


WAIT_NOTICE_S = 5.0
"""Seconds a waiter for a timing lock waits before it says so (:func:`timing_lock`'s ``notify``):
longer than a small case takes to time, so a waiter behind one says nothing, while one behind
a large case, a hung kernel or another run is told within seconds who it waits for."""


class LockTimeout(RuntimeError):
    """A lock stayed held beyond the timeout; the message names the lock and its holder."""


def user_id() -> str:
    """The user's id for lock paths: the uid where there is one, else the login name."""
    getuid = getattr(os, "getuid", None)
    if getuid is not None:
        return str(getuid())
    import getpass

    return getpass.getuser()


def lock_dir() -> Path:
    """``<tempdir>/pytest-fusion-<uid>/``, created with mode 0o700 (readable by its user only)."""
    d = Path(tempfile.gettempdir()) / f"pytest-fusion-{user_id()}"
    d.mkdir(mode=0o700, exist_ok=True)
    return d


PATH_LOCK_BUCKETS = 16
"""Path locks share this many lock files, chosen by a hash of the real path: a lock file cannot be
deleted safely while another process may hold it, so one file per path would pile up (one per
temporary directory a test suite saves into). Two paths in one bucket only wait for each other's
save, which takes milliseconds."""


def path_lock(path: str | os.PathLike[str], timeout: float) -> FileLock:
    """A :class:`filelock.FileLock` for the file at ``path`` (by its real path; one of
    :data:`PATH_LOCK_BUCKETS` lock files), waiting at most ``timeout`` seconds (``filelock.Timeout``
    after that)."""
    from filelock import FileLock

    bucket = int(hashlib.sha1(os.path.realpath(path).encode()).hexdigest(), 16) % PATH_LOCK_BUCKETS
    return FileLock(str(lock_dir() / f"file-{bucket:02d}.lock"), timeout=timeout)


def _holder_path(lock_file: Path) -> Path:
    return lock_file.with_suffix(".holder")


def _holder(lock_file: Path) -> str:
    """Who holds ``lock_file``, as its holder wrote it (pid, test id, since when), or "unknown"."""
    try:
        return _holder_path(lock_file).read_text(encoding="utf8").strip() or "unknown"
    except OSError:
        return "unknown"


_held: dict[tuple[str, int], int] = {}
"""Timing locks this process holds, by (ident, thread id): how many ``with`` bodies hold each."""


@contextlib.contextmanager
def timing_lock(
    ident: str,
    *,
    timeout: float = DEFAULT_TIMING_LOCK_TIMEOUT_S,
    holder: str = "",
    reentrant: bool = False,
    notify: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """Hold the timing lock of device ``ident`` (``"cpu"``, ``"gpu-0"``) for the ``with`` body.

    Args:
        timeout: seconds to wait for it (a negative value waits for ever).
        holder: who is timing (a test id), written beside the lock with the pid and the time, for
            the message of a waiter that gives up.
        reentrant: where this thread already holds the lock, hold it again at once (the holder's
            name is kept). Off (the default), a nested hold waits as another process's would: each
            hold opens the lock file anew, and a file lock is held per open file.
        notify: called with a line once the wait passes :data:`WAIT_NOTICE_S` seconds (the lock,
            its holder as the holder wrote it: pid, test id, since when; how long it waited and
            will wait) and with another when the lock is taken after such a notice.

    Raises:
        LockTimeout: the lock stayed held for ``timeout`` seconds; names the holder.
    """
    key = (ident, threading.get_ident())
    if reentrant and _held.get(key):
        _held[key] += 1
        try:
            yield
        finally:
            _held[key] -= 1
        return

    from filelock import FileLock, Timeout

    lock_file = lock_dir() / f"timing-{ident}.lock"
    lock = FileLock(str(lock_file), timeout=timeout)
    start = time.monotonic()
    acquired, noticed = False, False
    first_wait = timeout if notify is None or 0 <= timeout <= WAIT_NOTICE_S else WAIT_NOTICE_S
    try:
        lock.acquire(timeout=first_wait)
        acquired = True
    except Timeout:
        if first_wait != timeout:  # the notice, then the rest of the wait
            assert notify is not None
            rest = "for ever" if timeout < 0 else f"up to {timeout:g} s in all"
            notify(f"waiting for the {ident} timing lock {lock_file}: held by {_holder(lock_file)}; waited "
                   f"{time.monotonic() - start:.0f} s, waits {rest}")
            noticed = True
            try:
                lock.acquire(timeout=-1 if timeout < 0 else max(0.0, timeout - (time.monotonic() - start)))
                acquired = True
            except Timeout:
                pass
    who = "" if acquired else _holder(lock_file)
    if noticed and acquired and notify is not None:
        notify(f"took the {ident} timing lock after {time.monotonic() - start:.0f} s")
    if not acquired:  # raised outside the except clause: one message, no chained traceback
        raise LockTimeout(
            f"waited {timeout:g} s for the {ident} timing lock {lock_file}, held by {who}; a hung "
            f"kernel keeps it until its process ends (end that process, or raise the timeout)"
        )
    _held[key] = _held.get(key, 0) + 1
    try:
        when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        _holder_path(lock_file).write_text(
            f"pid {os.getpid()} ({holder or 'pytest-fusion'}) since {when}\n", encoding="utf8"
        )
        yield
    finally:
        _held[key] -= 1
        if not _held[key]:
            del _held[key]
        lock.release()

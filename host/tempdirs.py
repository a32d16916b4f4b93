"""The host's temporary folders, in the system's (tempfile.gettempdir()): each is named for its job and the process
that made it (`specmesh-JOB-PID-XXXXXXXX`), and a new one first removes those of processes that no longer run. A
process ends its folders itself (a `with`, or atexit), also on Ctrl-C, SIGTERM and SIGHUP (host/stops.py); one
killed outright (SIGKILL, the kernel's OOM killer) cannot, and its folders were left for good.

    folder(job)   a TemporaryDirectory: removed when its `with` ends (at the process's exit, if a stop broke in)
    made(job)     a folder that lives until the process ends (removed then by atexit, by its maker only: a child
                  forked from it, which runs the same atexit, leaves it to the parent still using it)
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

# a left folder: its maker's pid, after the job's name (which may hold hyphens; mkdtemp's own part holds none)
_LEFT = re.compile(r"^specmesh-.+-(\d+)-[^-]+$")
# a folder younger than this is kept whatever its pid says: a process in another pid namespace that shares this
# temporary folder (a container's) has pids this one cannot see
MIN_AGE_S = 3600.0


def folder(job: str) -> tempfile.TemporaryDirectory:
    """A temporary folder for `job` (a short name: "flash", "romfs"), removed when its `with` block ends."""
    sweep()
    return _Folder(job)


class _Folder(tempfile.TemporaryDirectory):
    """folder()'s: one whose removal at its `with`'s end was broken into (a second Ctrl-C as the first stops the
    command) is removed at the process's exit, as a made() one is; TemporaryDirectory forgets the folder as its
    removal begins, and it was left whole."""

    def __init__(self, job: str):
        super().__init__(prefix=_prefix(job))
        self._at_exit = functools.partial(_remove, Path(self.name), os.getpid())
        atexit.register(self._at_exit)

    def cleanup(self) -> None:
        super().cleanup()
        atexit.unregister(self._at_exit)  # (the partial is this folder's own: equal to no other)


def made(job: str) -> Path:
    """A temporary folder for `job` that lives as long as this process."""
    sweep()
    out = Path(tempfile.mkdtemp(prefix=_prefix(job)))
    atexit.register(_remove, out, os.getpid())
    return out


def _remove(path: Path, maker: int) -> None:
    """Remove `path` at exit in the process that made it; a forked child inherits the atexit hook, and running it
    there removed folders its parent still used (a virtual board's stand-in modules: the parent's next VM could
    not start)."""
    if os.getpid() == maker:
        shutil.rmtree(path, ignore_errors=True)


def _prefix(job: str) -> str:
    return "specmesh-%s-%d-" % (job, os.getpid())


@functools.cache
def sweep() -> None:
    """Remove, once a process, the specmesh folders whose maker no longer runs."""
    root = Path(tempfile.gettempdir())
    now = time.time()
    for path in root.glob("specmesh-*"):
        m = _LEFT.match(path.name)
        if m is None or not _gone(int(m.group(1))):
            continue
        try:
            if now - path.stat().st_mtime < MIN_AGE_S or not path.is_dir():
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)


def _gone(pid: int) -> bool:
    """Whether no process `pid` runs (one of another user's still does: it cannot be signalled, but it is there)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False

"""Atomic file writes: a file specmesh writes is its old content or its new one, never half of either.

Everything the host writes that a Ctrl-C, a `kill` or a power cut could interrupt goes through here:
model files, stats JSON, bench output, calibrations, checkpoints, keys, the virtual boards' host-side
files. The content goes to a hidden temporary file in the target's folder, is flushed to disk, then
renamed over the target (rename(2) replaces a file atomically within a file system); an interrupted
write leaves the old file and at most a `.NAME.*.part` file beside it. A board's own files are written
the same way by host/provision/flash.py (a temporary name, its hash checked, then a rename on the board).

    replacing(path, "w"|"wb", perms=None)  context manager: a file object whose content replaces `path`
                                            when the block ends without an exception (OSError at once
                                            for a device or a FIFO: never replaced by a file)
    write_bytes(path, data) / write_text(path, text)
    create(path, data, perms=0o600)        a new file only (FileExistsError if `path` exists), atomically
    unwritable(path) -> str | None         why `path` cannot be written (checked before long work), or None

A file the user names for output (`--stats-json FILE`) is written the Unix way, as a shell's `>` would:
    write_output(path, text)               `-`: stdout; an open descriptor (/dev/stdout, /dev/fd/N): written
                                            through it; a device, pipe or FIFO: written straight; a symlink:
                                            followed; a regular file or a new path: replaced atomically
    output_problem(path) -> str | None     why write_output cannot write `path`, or None (a FIFO is not opened,
                                            so not waited for; beside a file, a temporary file is made and removed)
    descriptor(path) -> int | None         the open descriptor /dev/stdin, /dev/fd/N or /proc/self/fd/N names
    overwrites(path, inputs) -> Path|None  the input file an output `path` names (refused before any work), or None

A file the user names for input (a key file, a calibration) is read once, from a regular file or the shell:
    unreadable_kind(path) -> str | None    "a FIFO, a device or a socket" for one (never opened: a FIFO without
                                            a writer would be waited for forever, /dev/zero read until memory
                                            runs out, a serial port reset by its opening), else None; an open
                                            descriptor's name (`<(...)`, /dev/stdin) is read as it is
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


def _default_perms(path: Path) -> int:
    """The mode an ordinary new file gets (the umask applied), or the mode of the file being replaced."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _mkstemp(path: Path) -> tuple[int, str]:
    """A new hidden temporary file beside `path` (its descriptor and name): where `path`'s content is written."""
    return tempfile.mkstemp(prefix="." + path.name + ".", suffix=".part", dir=path.parent)


@contextlib.contextmanager
def _temp(path: Path, mode: str, perms: int, encoding: str | None) -> Iterator[tuple[IO[Any], str]]:
    fd, tmp = _mkstemp(path)
    try:
        os.fchmod(fd, perms)
        with os.fdopen(fd, mode, encoding=encoding) as f:
            yield f, tmp
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def replacing(path: str | os.PathLike, mode: str = "wb", perms: int | None = None,
              encoding: str | None = None) -> Iterator[IO[Any]]:
    """A file to write whose content replaces `path` once the block ends; `path` is untouched if the block
    raises (or the process dies) first. `perms`: the file's mode (default: the replaced file's, else the
    umask's)."""
    path = Path(path)
    _regular_or_new(path)
    if "b" not in mode and encoding is None:
        encoding = "utf-8"
    with _temp(path, mode, _default_perms(path) if perms is None else perms, encoding) as (f, tmp):
        yield f
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _regular_or_new(path: Path) -> None:
    """OSError unless `path` is a regular file, a symlink (itself replaced) or nothing yet: a device or a FIFO
    named as a file to replace (`--out /dev/full`) is never replaced by one, which root's rename would do."""
    try:
        kind = stat.S_IFMT(os.lstat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return
    if kind not in (stat.S_IFREG, stat.S_IFLNK, stat.S_IFDIR):  # a folder: rename's own IsADirectoryError
        raise OSError(errno.EINVAL, "not a regular file (a device, a FIFO or a socket): give a file's name", str(path))


def write_bytes(path: str | os.PathLike, data: bytes, perms: int | None = None) -> None:
    with replacing(path, "wb", perms) as f:
        f.write(data)


def write_text(path: str | os.PathLike, text: str, perms: int | None = None) -> None:
    with replacing(path, "w", perms) as f:
        f.write(text)


def create(path: str | os.PathLike, data: bytes, perms: int = 0o600) -> None:
    """Write `data` to the new file `path`, atomically; FileExistsError if it exists (never overwritten)."""
    path = Path(path)
    with _temp(path, "wb", perms, None) as (f, tmp):
        f.write(data)
    try:
        os.link(tmp, path)  # fails if `path` exists: the check and the creation are one step
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def unwritable(path: str | os.PathLike) -> str | None:
    """Why a file cannot be written at `path` (one phrase: a missing folder, a folder, no permission), or
    None; what `replacing` needs: a folder that exists and takes new files."""
    path = Path(path)
    folder = path.parent
    if path.is_dir():
        return "it is a folder"
    if not folder.is_dir():
        above = next((p for p in (folder, *folder.parents) if p.exists()), None)  # a file on the way: no folder
        return "%s is a file, not a folder" % above if above is not None and not above.is_dir() else \
            "folder %s does not exist" % folder
    if not os.access(folder, os.W_OK | os.X_OK):
        return "no permission to write in %s" % folder
    return None


STDOUT = "-"
# the names of an already open descriptor: written through it (bash treats them so), never reopened, which
# would truncate a file that stdout is redirected to, or replaced
_FD_PATH = re.compile(r"^/(?:dev/fd|proc/self/fd)/(\d+)$")
_FD_NAMES = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}


def descriptor(path: str) -> int | None:
    """The descriptor a path such as /dev/stdout or /dev/fd/3 names, or None for any other path."""
    if path in _FD_NAMES:
        return _FD_NAMES[path]
    match = _FD_PATH.match(path)
    return int(match.group(1)) if match else None


def unreadable_kind(path: str | os.PathLike) -> str | None:
    """What `path` is where it is no input file to read (module docstring), else None (a missing path or a folder
    too: open()'s own error says those)."""
    if descriptor(os.fspath(path)) is not None:
        return None
    try:
        kind = stat.S_IFMT(os.stat(path).st_mode)
    except OSError:  # missing, in a folder it may not look into, a name too long: open() says which
        return None
    return None if kind in (stat.S_IFREG, stat.S_IFDIR) else "a FIFO, a device or a socket"


def _kind(path: str) -> int | None:
    """The file type bits of what `path` names after its symlinks (None: nothing there yet)."""
    try:
        return stat.S_IFMT(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):  # NotADirectoryError: a file on the way (README.md/x.json)
        return None


def output_problem(path: str | os.PathLike) -> str | None:
    """Why `write_output` cannot write `path` (one phrase), or None."""
    path = os.fspath(path)
    if path == STDOUT:
        return None
    if not path:
        return "an empty name (give a file, or - for stdout)"
    fd = descriptor(path)
    if fd is not None:
        try:
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        except OSError:
            return "descriptor %d is not open" % fd
        return None if flags & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR) else "descriptor %d is not open for writing" % fd
    kind = _kind(path)
    if kind == stat.S_IFDIR:
        return "it is a folder"
    if kind is not None and kind != stat.S_IFREG:
        return None if os.access(path, os.W_OK) else "no permission to write it"
    real = Path(os.path.realpath(path))
    return unwritable(real) or _uncreatable(real)


def overwrites(path: str | os.PathLike, inputs: list) -> Path | None:
    """The file of `inputs` (what the command reads; None entries skipped) that the output `path` names, or None: a
    slip of tab completion (`--stats-json models/target.spm`) replaced a model with the output, and the next run
    refused it as corrupt."""
    path = os.fspath(path)
    if path == STDOUT or not os.path.isfile(path):
        return None
    return next((Path(f) for f in inputs if f and os.path.isfile(f) and os.path.samefile(path, f)), None)


def _uncreatable(path: Path) -> str | None:
    """Why no temporary file can be made beside `path` (a folder such as /proc that takes no new files, whatever
    its permissions say), or None; the file made is removed at once."""
    try:
        fd, tmp = _mkstemp(path)
    except OSError as e:
        return "cannot create a file in %s (%s)" % (path.parent, e.strerror or e)
    os.close(fd)
    os.unlink(tmp)
    return None


def write_output(path: str | os.PathLike, text: str) -> None:
    """Write `text` (UTF-8) to the output file `path` the Unix way (module docstring); OSError if it cannot."""
    path = os.fspath(path)
    if path == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    fd = descriptor(path)
    if fd is not None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # what was printed before comes first
        data = text.encode("utf-8")
        while data:
            data = data[os.write(fd, data):]
        return
    kind = _kind(path)
    if kind is not None and kind != stat.S_IFREG:  # a device, pipe or FIFO: it takes the bytes as they come
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return
    write_text(os.path.realpath(path), text)  # a symlink's target is replaced, the link stays

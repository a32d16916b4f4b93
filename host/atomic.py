"""Atomic file writes: a file specmesh writes is its old content or its new one, never half of either.

Everything the host writes that a Ctrl-C, a `kill` or a power cut could interrupt goes through here:
model files, stats JSON, bench output, calibrations, checkpoints, keys, the virtual boards' host-side
files. The content goes to a hidden temporary file in the target's folder, is flushed to disk, then
renamed over the target (rename(2) replaces a file atomically within a file system); an interrupted
write leaves the old file and at most a `.NAME.*.part` file beside it. A board's own files are written
the same way by host/provision/flash.py (a temporary name, its hash checked, then a rename on the board).

    replacing(path, "w"|"wb", perms=None)  context manager: a file object whose content replaces `path`
                                            when the block ends without an exception
    write_bytes(path, data) / write_text(path, text)
    create(path, data, perms=0o600)        a new file only (FileExistsError if `path` exists), atomically
    unwritable(path) -> str | None         why `path` cannot be written (checked before long work), or None
"""

from __future__ import annotations

import contextlib
import os
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


@contextlib.contextmanager
def _temp(path: Path, mode: str, perms: int, encoding: str | None) -> Iterator[tuple[IO[Any], str]]:
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".part", dir=path.parent)
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
        return "folder %s does not exist" % folder
    if not os.access(folder, os.W_OK | os.X_OK):
        return "no permission to write in %s" % folder
    return None

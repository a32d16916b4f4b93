"""Deployment keys: the file `specmesh keygen` writes, `specmesh flash --key-file` provisions onto a
board, and `specmesh run --key-file` signs every frame with (shared/codec.py `Auth`; docs/security.md).

A key file holds one key as hex, 16 to 64 bytes (32 to 128 hex digits; surrounding whitespace and a
UTF-8 BOM, which some Windows editors write, are ignored). It is a regular file, or a descriptor the shell
opened (`--key-file <(pass show mesh.key)`: the key never on disk); a FIFO, a device or a socket is refused
unopened. Errors name the file and never quote its content, so a key cannot leak into a terminal log. One
that other users may read is used, with a warning on stderr (ssh refuses such a private key; a key here can
be changed on the boards only by flashing them).
"""

from __future__ import annotations

import codecs
import contextlib
import os
import secrets
import shlex
import stat
import string
import sys
from pathlib import Path

from specmesh.host import atomic

MIN_BYTES = 16
MAX_BYTES = 64  # HMAC-SHA256's block: a longer key would be hashed down anyway
NEW_BYTES = 32
FILE_MAX_BYTES = 4096  # a key's hex and room for whitespace around it; more is not read (a --key-file <(yes))


HEX_DIGITS = frozenset(string.hexdigits)
# how a board keyed with a lost key is flashed again: a keyed board takes no flash without its key, so only its flash
# erased (said here and by flash's key-mismatch line)
ERASE = "esptool erase_flash, then write MicroPython again"
# what to do with a key file cut short or edited: the boards hold the whole key, so only that key works, or a new one
# flashed onto every board once its flash is erased (a keyed board takes no flash without its key: a new key flashed
# onto it was refused, the way this said to go)
_RECOPY = ("copy the key file the boards were flashed with again; where it is lost, erase each keyed board's flash "
           "(%s: a keyed board takes no flash without its key) and flash a new key (specmesh keygen) onto every board"
           % ERASE)

# what to do with another file given as the key file (a calibration, models/vocab.bin)
_OTHER_FILE = "a key file must hold the key as hex digits only: give the one the boards were flashed with (specmesh " \
    "keygen wrote it)"


class KeyFileError(Exception):
    """A key file that cannot be read or used; the message is one line without the key."""


def load_key(path: str | Path) -> bytes:
    """The key in `path`: a regular file, or a descriptor the shell opened (`--key-file <(pass show mesh.key)`)."""
    kind = atomic.unreadable_kind(path)
    if kind:
        raise KeyFileError("key file %s is not a regular file (%s): give the file that holds the key" % (path, kind))
    try:
        with open(path, "rb") as f:
            raw = f.read(FILE_MAX_BYTES + 1)
            mode = os.fstat(f.fileno()).st_mode
        if len(raw) > FILE_MAX_BYTES:
            raise KeyFileError("key file %s is over %d bytes; a key has %d to %d (as hex)"
                               % (path, FILE_MAX_BYTES, MIN_BYTES, MAX_BYTES))
        text = raw.removeprefix(codecs.BOM_UTF8).decode("ascii", "replace").strip()  # a byte past ASCII: U+FFFD
    except FileNotFoundError:
        if os.path.islink(path):  # keygen refuses the link as there already: "make one" was a loop
            raise KeyFileError("key file %s links to %s, which is not there (a drive not mounted?): make the key file "
                               "it links to reachable, or give the key file itself" % (path, os.readlink(path))) \
                from None
        make = ("make one with `specmesh keygen --key-file %s`" % path if str(path) != atomic.STDOUT else  # a file
                "`-` is no stream here: give the key's file, or /dev/stdin for a key piped in")  # keygen refuses -
        raise KeyFileError("key file %s does not exist (%s)" % (path, make)) from None
    except IsADirectoryError:  # it said "cannot read key file DIR: Is a directory", and no way on
        raise KeyFileError("key file %s is a folder: name the key's file in it" % path) from None
    except OSError as e:
        raise KeyFileError("cannot read key file %s: %s" % (path, e.strerror or e)) from None
    words = text.split()
    if len(words) > 1 and all(set(w) <= HEX_DIGITS for w in words):  # bytes.fromhex would skip the whitespace: two keys as one
        lines = len(text.splitlines())
        raise KeyFileError("key file %s holds %d %s: it must hold one key, its hex digits on one line" % (
            path, *((lines, "lines") if lines > 1 else (len(words), "words separated by spaces"))))
    if text and set(text) <= HEX_DIGITS and len(text) % 2:  # a copy cut short: it said "hex digits only"
        raise KeyFileError("key file %s holds an odd number of hex digits (%d), so not whole: %s"
                           % (path, len(text), _RECOPY))
    try:
        key = bytes.fromhex(text)
    except ValueError:  # it said so, and no way on: an edit or a flipped bit (a digit become another letter, or a
        # byte past ASCII) is a character or two, another file given for it (a calibration, models/vocab.bin) more
        if sum(c not in HEX_DIGITS for c in text) > 2:
            raise KeyFileError("key file %s holds no key (not hex digits): %s" % (path, _OTHER_FILE)) from None
        raise KeyFileError("key file %s must hold the key as hex digits only: %s" % (path, _RECOPY)) from None
    if not MIN_BYTES <= len(key) <= MAX_BYTES:
        raise KeyFileError("key file %s holds %d bytes; a key has %d to %d: %s"
                           % (path, len(key), MIN_BYTES, MAX_BYTES, _RECOPY))
    if stat.S_ISREG(mode) and mode & 0o044:
        print("specmesh: warning: key file %s can be read by other users (mode %04o): run `chmod 600 %s`"
              % (path, stat.S_IMODE(mode), shlex.quote(str(path))), file=sys.stderr)
    return key


def new_key_file(path: str | Path) -> list[Path]:
    """Write a new random key to `path`, readable by its owner only, atomically; never overwrites a file, nor writes
    to stdout (`-`), an open descriptor, a device, a FIFO or a socket.
    Missing folders under the user's home are made, each owner-only (as ~/.specmesh/ of docs/security.md), and
    returned, outermost first (removed again where no key is written); one elsewhere (a typo such as
    /nonexist/k.key) is refused rather than made."""
    if not str(path).strip():
        raise KeyFileError("--key-file is empty: give the new key's file, e.g. ~/.specmesh/mesh.key")
    stream = _stream(os.path.expanduser(str(path)))  # not Path(): it makes "./-", a file named "-", the name of stdout
    if stream:  # `-` made a file named "-", /dev/null was "exists already", /dev/fd/1 "No such file or directory"
        raise KeyFileError("--key-file %s is %s: keygen writes the key to a new owner-only file only: "
                           "give its name, e.g. ~/.specmesh/mesh.key" % (path, stream))
    names_folder = str(path).endswith(("/", os.sep))  # Path() drops the slash: "keys/" would become a file "keys"
    path = Path(path).expanduser()
    _check_cwd(path)
    made: list[Path] = []
    try:
        # one at a time (mkdir(parents=True) gives all but the last the umask's mode, 0755), each noted once made
        for folder in _folders_to_make(path, names_folder):
            if _made(folder):
                made.append(folder)
        atomic.create(path, (secrets.token_hex(NEW_BYTES) + "\n").encode("ascii"), perms=0o600)
    except BaseException as e:  # no key written (a full disk, a Ctrl-C): the folders made for it go too
        for folder in reversed(made):
            with contextlib.suppress(OSError):  # rmdir: one that something else has put a file in meanwhile stays
                folder.rmdir()
        if isinstance(e, FileExistsError):
            raise KeyFileError(_there_already(path)) from None
        if isinstance(e, OSError):  # a name too long, a folder that takes no files, a full disk
            raise KeyFileError("cannot create %s: %s" % (path, e.strerror or e)) from None
        raise
    return made


def _check_cwd(path: Path) -> None:
    """KeyFileError for a relative `path` where the current folder was deleted (a shell still in a folder removed
    since it went there): no file can be made in it, which the write said as a raw "No such file or directory"."""
    if path.is_absolute():
        return
    try:
        os.getcwd()
    except FileNotFoundError:
        was = os.environ.get("PWD")
        raise KeyFileError("cannot create %s: the current folder%s was deleted: cd to a folder that exists and run "
                           "keygen again, or give the key's full path, e.g. ~/.specmesh/mesh.key"
                           % (path, " (%s)" % was if was else "")) from None


def _there_already(path: Path) -> str:
    """The line for a new key's `path` that is there already (never overwritten). An empty file holds no key to use
    (a `touch` first, as some do for a secret's file): "use it as it is" was no way on for it."""
    if path.is_file() and path.stat().st_size == 0:
        return ("%s exists already and is empty (no key in it): remove it and run keygen again, or give another "
                "--key-file" % path)
    return ("%s exists already: keygen never overwrites a key (boards flashed with it need it): use it as it is, or "
            "give another --key-file" % path)


def _made(folder: Path) -> bool:
    """Make `folder` owner-only; False where another process made it meanwhile (not keygen's to remove)."""
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        return False
    return True


def _stream(name: str) -> str | None:
    """What `name` is where it names no file a key can be written to (stdout, an open descriptor, a device, a FIFO or
    a socket), or None."""
    if name == atomic.STDOUT:
        return "stdout"
    if atomic.descriptor(name) is not None:
        return "an open descriptor"
    return atomic.unreadable_kind(name)


def _folders_to_make(path: Path, names_folder: bool) -> list[Path]:
    """The folders new_key_file makes for `path`, outermost first (none: its folder is there); KeyFileError for a `path` that cannot be a new
    file: a folder, or one under a file or under a missing folder outside the home. OSError where a name cannot be
    looked up (too long)."""
    if path.is_dir():
        raise KeyFileError("%s is a folder: give the new key's file in it, e.g. %s" % (path, path / "mesh.key"))
    if names_folder:
        raise KeyFileError("%s/ ends in a slash, as a folder's name: give the new key's file, e.g. %s"
                           % (path, path / "mesh.key"))
    if path.parent.is_dir():
        return []
    above = next((p for p in path.parents if p.exists()), None)
    if above is not None and not above.is_dir():  # mkdir would fail with EEXIST, read as "exists already"
        raise KeyFileError("%s is a file, not a folder: give the new key's file in a folder" % above)
    home = Path.home().resolve()
    if home not in path.parent.resolve().parents:
        raise KeyFileError("folder %s does not exist: make it first, or give a path under your home (keygen makes "
                           "a folder such as ~/.specmesh/ itself)" % path.parent)
    return [p for p in reversed(path.parents) if not p.exists()]

"""What virtual boards answer for `os.uname()` and `os.statvfs()` (host/emulator/mpy/os.py calls in here).

Kept out of os.py, which every VM imports at boot (see there why this module is named `uname`).

- `uname()`: the board's answer (sysname "esp32", the board class's machine string), which the unix
  port lacks;
- `statvfs()`: a board whose flash is a host folder reports a filesystem of its board class's size
  (VBOARD_FS_BYTES: 2 MiB on a classic ESP32, 6 MiB on the S3) less the 4 KiB blocks its files take,
  instead of the host disk's figures; the read-only stand-ins at /.emu are no part of the board and
  report an empty filesystem, which `mpremote df` leaves out. A littlefs flash image answers as is, and
  so does another mount (the ROMFS at /rom), whose files are no part of the flash's either.
"""

import sys
from collections import namedtuple

import uos as _builtin  # the built-in os (a u-prefixed name never finds os.py, which wraps it and imports this)
import vfs

_BLOCK = 4096
_EMU = "/.emu"
_uname_result = namedtuple("uname_result", ("sysname", "nodename", "release", "version", "machine"))


def uname():
    v = sys.implementation.version
    release = "%d.%d.%d" % (v[0], v[1], v[2])
    return _uname_result("esp32", "esp32", release, "v%s on virtual board" % release,
                         _builtin.getenv("VBOARD_MACHINE") or "Generic ESP32 module with ESP32")


def _blocks(path, mounts):
    """4 KiB blocks the files and folders under `path` take, as a flash filesystem would count them."""
    n = 1
    for entry in _builtin.ilistdir(path):
        child = (path.rstrip("/") + "/" + entry[0]) if path != "/" else "/" + entry[0]
        if child in mounts:
            continue
        if entry[1] & 0x4000:
            n += _blocks(child, mounts)
        else:
            n += (_builtin.stat(child)[6] + _BLOCK - 1) // _BLOCK
    return n


def statvfs(path):
    full = path if path.startswith("/") else _builtin.getcwd().rstrip("/") + "/" + path
    if full == _EMU or full.startswith(_EMU + "/"):
        return (_BLOCK, _BLOCK, 0, 0, 0, 0, 0, 0, 0, 255)
    mounts = [m[1] for m in vfs.mount() if m[1] != "/"]
    size = _builtin.getenv("VBOARD_FS_BYTES")
    if _builtin.getenv("VBOARD_IMAGE") or not size or [m for m in mounts if (full + "/").startswith(m + "/")]:
        return _builtin.statvfs(path)
    total = int(size) // _BLOCK
    free = max(0, total - _blocks("/", mounts))
    return (_BLOCK, _BLOCK, total, free, free, 0, 0, 0, 0, 255)

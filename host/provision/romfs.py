"""A board's ROMFS partition (https://docs.micropython.org/en/latest/reference/romfs.html), over the
mpremote transport that host/provision/flash.py holds: the probe of its size, the image that holds a
model file, the board's SHA-256 of what the partition holds, and writing an image into it.

A port hands out its partition (`vfs.rom_ioctl(2, 0)`) as one of two things, and both are served as
`mpremote romfs deploy` serves them: a buffer (the writes go through `vfs.rom_ioctl` ops 3-5, the last
of which mounts the new image; stm32, rp2, a virtual board), or a block device with `ioctl` and
`writeblocks` that is also a buffer (the esp32 port's `esp32.Partition`; /rom is mounted at the next
boot). The write loop is ours, not mpremote's `_do_romfs_deploy`: that is a CLI command, which wants
the CLI's state, prints to stdout, exits the process on an error and reports no progress.
"""

from __future__ import annotations

import base64
import contextlib
import io
import shutil
from collections.abc import Callable
from pathlib import Path

from specmesh.host import tempdirs

ROM_DIR = "/rom"  # where the firmware mounts the partition's image
CHUNK = 4096  # bytes per write, as mpremote's deploy: the board compiles one line of ~5.5 KB per chunk

# Board code for flash.py's probe: `rom`, the partition's size in bytes (0: none, or no ROMFS support).
PROBE = (
    "try:\n import vfs\n d = vfs.rom_ioctl(2, 0) if vfs.rom_ioctl(1) > 0 else b''\n"
    " rom = d.ioctl(4, 0) * d.ioctl(5, 0) if hasattr(d, 'ioctl') else len(d)\n"
    "except Exception:\n rom = 0\n"
    "d = None\n"
)


class RomfsError(RuntimeError):
    """The board refused a ROMFS operation; the message is one line."""


def image(model: Path) -> bytes:
    """A ROMFS image holding the file `model` alone, at /rom/<its name> (mpremote's `make_romfs`)."""
    from mpremote.romfs import make_romfs

    try:
        model.name.encode("ascii")
    except UnicodeEncodeError:
        raise RomfsError(f"ROMFS file names are ASCII: rename {model.name!r}") from None
    with tempdirs.folder("romfs") as tmp:
        shutil.copyfile(model, Path(tmp) / model.name)
        with contextlib.redirect_stdout(io.StringIO()):  # make_romfs prints the tree it builds
            return make_romfs(tmp, mpy_cross=False)


def digest(transport, size: int) -> bytes:
    """SHA-256 of the partition's first `size` bytes, computed on the board over the mapped flash."""
    return transport.eval(
        "__import__('hashlib').sha256(memoryview(__import__('vfs').rom_ioctl(2, 0))[:%d]).digest()" % size)


def write(transport, data: bytes, progress: Callable[[int], None] | None = None) -> None:
    """Write the image `data` into partition 0 (unmounting /rom first); `progress(bytes written)`."""
    transport.exec("import vfs\nfrom binascii import a2b_base64\ntry:\n vfs.umount('/rom')\nexcept OSError:\n pass\n"
                   "dev = vfs.rom_ioctl(2, 0)")
    block = transport.eval("dev.ioctl(5, 0) if hasattr(dev, 'ioctl') else 0")
    if block:  # a block device: erase the blocks the image spans, then write into them
        for n in range(-(-len(data) // block)):
            transport.exec("dev.ioctl(6, %d)" % n)
        chunk = min(CHUNK, block)
    else:
        least = transport.eval("vfs.rom_ioctl(3, 0, %d)" % len(data))  # prepare (erase); the smallest write
        if least < 0:
            raise RomfsError(f"the board cannot prepare its ROMFS partition for {len(data)} bytes (error {-least})")
        chunk = max(CHUNK, least)
    for off in range(0, len(data), chunk):
        piece = data[off : off + chunk].ljust(chunk, b"\0")
        buf = "a2b_base64(%r)" % base64.b64encode(piece).decode()
        if block:
            transport.exec("dev.writeblocks(%d, %s, %d)" % (off // block, buf, off % block))
        elif isinstance(err := transport.eval("vfs.rom_ioctl(4, 0, %d, %s)" % (off, buf)), int) and err < 0:
            raise RomfsError(f"the board refused a ROMFS write at offset {off} (error {-err})")
        if progress is not None:
            progress(min(off + chunk, len(data)))
    if not block:
        transport.exec("vfs.rom_ioctl(5, 0)")  # writing done: the board mounts the new image
    transport.exec("dev = None")

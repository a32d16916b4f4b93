"""A virtual board's ROMFS partition: `vfs.rom_ioctl` for the board's code, and the image mounted at /rom.

On a board the partition is memory-mapped flash; here it is one bytearray that the shim (_vboard.py)
allocates first at VM start (a Partition, VBOARD_ROMFS_PORT=esp32, for the esp32 port's way) and fills
from a host file, the supervisor adding its bytes to the VM's
heap. The unix port has `vfs.VfsRom` but no `vfs.rom_ioctl`, and a built-in module cannot be shadowed
by a file, so `install` hooks `builtins.__import__`: `import vfs` in the board's code gets a stand-in
whose `rom_ioctl` serves the partition (ops 1-5, what `mpremote romfs deploy` uses) and whose other
attributes are the real module's. Writes go to the bytearray and to the host file (which the shim
opens before it mounts the flash at /); op 5, writing done, mounts the new image.
"""

import builtins

import vfs
from micropython import const

_EINVAL = const(22)
_BLOCK = const(4096)  # the flash's erase block


def mount(part):
    """Mount the partition's image at /rom, if it holds one (a board does at boot and after a deploy)."""
    try:
        vfs.umount("/rom")
    except OSError:
        pass
    if part[:3] == b"\xd2\xcd\x31":
        try:
            vfs.mount(vfs.VfsRom(part), "/rom")
        except OSError:  # a damaged image: no /rom, as on a board
            pass


class _Vfs:
    def __init__(self, part, file):
        self._part = part
        self._file = file

    def __getattr__(self, name):
        return getattr(vfs, name)

    def rom_ioctl(self, op, *args):
        part = self._part
        if op == 1:  # number of partitions
            return 1
        if not args or args[0] != 0:
            return -_EINVAL
        if op == 2:  # the partition
            return memoryview(part)
        if op == 3 and 0 <= args[1] <= len(part):  # prepare to write nbytes: erase the blocks they span
            erased = memoryview(b"\xff" * _BLOCK)
            self._write(((off, erased[: len(part) - off]) for off in range(0, args[1], _BLOCK)))
            return 4  # the smallest write
        if op == 4 and 0 <= args[1] and args[1] + len(args[2]) <= len(part):  # write buf at offset
            self._write(((args[1], args[2]),))
            return 0
        if op == 5:  # writing done
            mount(part)
            return 0
        return -_EINVAL

    def _write(self, pieces):
        view = memoryview(self._part)
        for off, buf in pieces:
            view[off : off + len(buf)] = buf
            self._file.seek(off)
            self._file.write(buf)


class Partition(bytearray):
    """The esp32 port's ROMFS partition (ports/esp32/esp32_partition.c mp_vfs_rom_ioctl): `vfs.rom_ioctl` serves
    ops 1 and 2 only, op 2 handing out this `esp32.Partition`: the mapped flash as a buffer, and a block device
    (readblocks, writeblocks, ioctl 4 block count, 5 block size, 6 erase) that the host writes through; the new
    image is mounted at the next boot. Its bytes are the partition; writes also go to the host file."""

    file = None

    def readblocks(self, block, buf, off=0):
        start = block * _BLOCK + off
        buf[:] = memoryview(self)[start:start + len(buf)]

    def writeblocks(self, block, buf, off=0):
        start = block * _BLOCK + off
        memoryview(self)[start:start + len(buf)] = buf
        self.file.seek(start)
        self.file.write(buf)

    def ioctl(self, op, arg):
        if op == 4:
            return len(self) // _BLOCK
        if op == 5:
            return _BLOCK
        if op == 6:
            self.writeblocks(arg, b"\xff" * _BLOCK)
            return 0
        return 0


class _Esp32Vfs(_Vfs):
    def rom_ioctl(self, op, *args):
        if op == 1:
            return 1
        if op == 2 and args and args[0] == 0:
            return self._part
        return -_EINVAL


def install(part, file):
    """Give the board's code `vfs.rom_ioctl` over `part` (kept in the open host `file`; a Partition: the esp32
    port's way); mount /rom."""
    if isinstance(part, Partition):
        part.file = file
        stand_in = _Esp32Vfs(part, file)
    else:
        stand_in = _Vfs(part, file)
    real = builtins.__import__

    def hook(name, *args):
        module = real(name, *args)
        return stand_in if name == "vfs" else module

    builtins.__import__ = hook
    mount(part)

"""Virtual board firmware: boots a board's flash and speaks MicroPython's REPL protocol on stdio.

Runs inside the unix-port VM of a virtual board (started by host/emulator/board.py). It mounts the
board's flash at `/` (a host directory, or a littlefs image when the board has a fixed flash size),
mounts the stand-in modules read-only at `/.emu`, loads the board's ROMFS partition if it has one
(_vrom.py: `vfs.rom_ioctl`, the image at /rom), runs `boot.py` then (friendly mode only) `main.py`,
then serves the friendly and raw REPL (raw-paste included) the way shared/runtime/pyexec.c does.

Ctrl-C arrives as SIGINT (the supervisor turns byte 0x03 into a signal), i.e. as KeyboardInterrupt:
inside user code it interrupts it, inside a read it counts as the Ctrl-C character.
A soft reset or `machine.reset()` exits the VM with a code the supervisor turns into a reboot.
"""

import gc
import os
import sys

import micropython
from micropython import const

_EXIT_SOFT = const(64)  # reboot into the friendly REPL (boot.py, main.py)
_EXIT_SOFT_RAW = const(65)  # reboot into the raw REPL (boot.py only)
_EXIT_HARD = const(66)  # machine.reset(): reboot like a power cycle
_HARD_RESET = const(0x5EB007)  # SystemExit value raised by the stand-in machine.reset()
_WINDOW = const(512)  # raw-paste flow-control window

# The ROMFS partition (a host file, VBOARD_ROMFS), allocated first, in one block, before anything can
# fragment the heap: on a board it is memory-mapped flash, and the supervisor adds its bytes to the heap.
_ROMFS = os.getenv("VBOARD_ROMFS")
_rom = ((__import__("_vrom").Partition if os.getenv("VBOARD_ROMFS_PORT") == "esp32" else bytearray)(os.stat(_ROMFS)[6])
        if _ROMFS else None)
_ready_fd = os.getenv("VBOARD_READY_FD")
_ready_file = open(int(_ready_fd), "wb") if _ready_fd else None
_out = sys.stdout.buffer
_in = sys.stdin.buffer
_g = {"__name__": "__main__"}


def _w(s):
    _out.write(s)


def _ready(state):
    """Tell the supervisor whether a Ctrl-C may be sent now (b"R") or must wait for the next boot (b"X")."""
    if _ready_file is not None:
        _ready_file.write(state)


def _getc():
    try:
        c = _in.read(1)
    except KeyboardInterrupt:
        return 3
    if not c:
        sys.exit(0)  # the supervisor closed stdin: power off
    return c[0]


class _Reset(Exception):
    pass


class _FileBlockDev:
    """A flash chip: a host file of fixed size, in 4 KiB erase blocks (extended block protocol)."""

    def __init__(self, path):
        self.f = open(path, "r+b")
        self.f.seek(0, 2)
        self.n = self.f.tell() // 4096

    def readblocks(self, block, buf, off=0):
        self.f.seek(block * 4096 + off)
        self.f.readinto(buf)

    def writeblocks(self, block, buf, off=0):
        self.f.seek(block * 4096 + off)
        self.f.write(buf)

    def ioctl(self, op, arg):
        if op == 4:  # block count
            return self.n
        if op == 5:  # block size
            return 4096
        if op == 6:  # erase
            return 0
        return None


def _mount():
    image = os.getenv("VBOARD_IMAGE")
    if image:
        dev = _FileBlockDev(image)
        try:
            vfs = os.VfsLfs2(dev)
        except OSError:
            os.VfsLfs2.mkfs(dev)
            vfs = os.VfsLfs2(dev)
    else:
        vfs = os.VfsPosix(os.getenv("VBOARD_FLASH"))
    emu = os.VfsPosix(os.getenv("VBOARD_EMU"))
    rom_file = open(_ROMFS, "r+b") if _rom is not None else None  # opened while the host's / is mounted
    os.umount("/")
    os.mount(vfs, "/")
    os.mount(emu, "/.emu", readonly=True)
    os.chdir("/")
    sys.path[:] = ["", ".frozen", "/lib", "/.emu"]
    if _rom is not None:  # as a board with ROMFS: the partition's image at /rom, and on the import path
        rom_file.readinto(_rom)
        __import__("_vrom").install(_rom, rom_file)
        sys.path[2:2] = ["/rom", "/rom/lib"]


def _print_exc(e):
    # Drop this shim's frames so tracebacks read like a board's.
    import io

    buf = io.StringIO()
    sys.print_exception(e, buf)
    for line in buf.getvalue().split("\n"):
        if line and "_vboard" not in line:
            _w(line.encode() + b"\r\n")


def _execute(src, mode, eof):
    """Run source in the board's globals; eof: print the raw REPL's two 0x04 markers."""
    err = None
    try:
        exec(compile(src, "<stdin>", mode), _g)
    except SystemExit as e:
        if eof:
            _w(b"\x04\x04")
        raise _Reset(_EXIT_HARD if e.args and e.args[0] == _HARD_RESET else _EXIT_SOFT)
    except BaseException as e:  # noqa: BLE001 - a REPL reports everything, KeyboardInterrupt included
        err = e
    micropython.kbd_intr(3)
    if eof:
        _w(b"\x04")
    if err is not None:
        _print_exc(err)
    if eof:
        _w(b"\x04")


def _run_file(name):
    try:
        os.stat(name)
    except OSError:
        return
    with open(name) as f:
        src = f.read()
    _execute(src, "exec", False)
    del src
    gc.collect()


def _raw_paste():
    _w(b"R\x01" + bytes((_WINDOW & 0xFF, _WINDOW >> 8, 1)))
    buf = bytearray()
    remain = _WINDOW
    while True:
        c = _getc()
        if c == 4:
            break
        if c == 3:
            _w(b"\x04")
            return
        buf.append(c)
        remain -= 1
        if remain == 0:
            _w(b"\x01")
            remain = _WINDOW
    _w(b"\x04")
    _execute(bytes(buf), "exec", True)


def _raw_repl():
    """Returns when the host asks for the friendly REPL (Ctrl-B)."""
    _w(b"raw REPL; CTRL-B to exit\r\n>")
    line = bytearray()
    while True:
        c = _getc()
        if c == 1:
            if len(line) == 2 and line[0] == 5:
                if line[1] == 0x41:
                    _raw_paste()
                else:
                    _w(b"R\x00")
                line = bytearray()
                _w(b">")
                continue
            line = bytearray()
            _w(b"raw REPL; CTRL-B to exit\r\n>")
        elif c == 2:
            _w(b"\r\n")
            return
        elif c == 3:
            line = bytearray()
        elif c == 4:
            _w(b"OK")
            if not line:
                _w(b"\r\n")
                raise _Reset(_EXIT_SOFT_RAW)
            src = bytes(line)
            line = bytearray()
            _execute(src, "exec", True)
            _w(b">")
        else:
            line.append(c)


def _banner():
    v = sys.implementation.version
    _w(
        b"MicroPython v%d.%d.%d on virtual board; %s with unix port\r\n"
        b'Type "help()" for more information.\r\n' % (v[0], v[1], v[2], os.getenv("VBOARD_NAME").encode())
    )


def _friendly_repl():
    """Returns when the host asks for the raw REPL (Ctrl-A)."""
    _banner()
    lines = []
    line = bytearray()
    _w(b">>> ")
    while True:
        c = _getc()
        if c == 1:
            _w(b"\r\n")
            return
        if c == 2:
            _w(b"\r\n")
            _banner()
            lines, line = [], bytearray()
        elif c == 3:
            _w(b"\r\n")
            lines, line = [], bytearray()
        elif c == 4 and not line and not lines:
            _w(b"\r\n")
            raise _Reset(_EXIT_SOFT)
        elif c == 5:
            _w(b"\r\npaste mode; Ctrl-C to cancel, Ctrl-D to finish\r\n=== ")
            src = _paste()
            if src is not None:
                _execute(src, "exec", False)
            lines, line = [], bytearray()
        elif c == 13 or c == 10 or c == 4:
            _w(b"\r\n")
            text = bytes(line).decode()
            line = bytearray()
            if c != 4 and text.strip() and (lines or text.rstrip().endswith(":")):
                lines.append(text)  # a compound statement goes on, auto-indented as on a board
                indent = len(text) - len(text.lstrip()) + (4 if text.rstrip().endswith(":") else 0)
                line = bytearray(b" " * indent)
                _w(b"... " + line)
                continue
            if lines:
                text = "\n".join(lines) + "\n"
                lines = []
            if text.strip():
                _execute(text, "single", False)
        elif c == 8 or c == 127:
            if line:
                line.pop()
                _w(b"\x08 \x08")
            continue
        elif c >= 32:
            line.append(c)
            _w(bytes((c,)))
            continue
        else:
            continue
        _w(b"... " if lines else b">>> ")


def _paste():
    buf = bytearray()
    while True:
        c = _getc()
        if c == 3:
            _w(b"\r\n")
            return None
        if c == 4:
            _w(b"\r\n")
            return bytes(buf)
        buf.append(c)
        _w(b"\r\n=== " if c == 13 else bytes((c,)))


def _modules():
    """Importable names of the precompiled modules on the flash (top level and packages)."""
    names = []
    for entry in os.ilistdir("/"):
        name, kind = entry[0], entry[1]
        if kind == 0x4000 and not name.startswith("."):
            try:
                os.stat("/%s/__init__.mpy" % name)
            except OSError:
                continue
            names.append(name)
            for sub in os.listdir("/" + name):
                if sub.endswith(".mpy") and sub != "__init__.mpy":
                    names.append(name + "." + sub[:-4])
        elif name.endswith(".mpy"):
            names.append(name[:-4])
    return names


def _builtins():
    """Import the stand-ins of modules a board has built in (C code in its firmware, off its heap): the VM's
    heap is sized with them loaded (the "measure" footprint), so a program never pays for them."""
    for name in ("network", "espnow", "machine"):
        try:
            __import__(name)
        except BaseException:  # noqa: BLE001 - a stand-in that cannot load takes no heap
            pass


def main():
    mode = os.getenv("VBOARD_MODE")
    _mount()
    _builtins()
    if mode == "measure":  # the supervisor sizes the VM heap by this shim's own footprint (and the GC's tables)
        gc.collect()
        _w(b"%d %d\n" % (gc.mem_alloc(), gc.mem_alloc() + gc.mem_free()))
        return
    if mode == "measure-code":  # ... and by the heap the flashed .mpy modules take once imported, and the
        gc.collect()  # stand-ins of modules a board has built in (C code in its firmware, no heap there)
        before = gc.mem_alloc()
        for name in _modules() + ["network", "espnow", "machine"]:
            try:
                __import__(name)
            except BaseException:  # noqa: BLE001 - a module that cannot load takes no heap
                pass
        gc.collect()
        _w(b"%d\n" % (gc.mem_alloc() - before))
        return
    raw = mode == "raw"
    try:
        _ready(b"R")
        _run_file("boot.py")
        if not raw:
            _run_file("main.py")
        while True:
            try:
                if raw:
                    _raw_repl()
                    raw = False
                else:
                    _friendly_repl()
                    raw = True
            except KeyboardInterrupt:
                _w(b"\r\n")
    except _Reset as r:
        try:
            _ready(b"X")
            if r.args[0] != _EXIT_HARD:
                _w(b"MPY: soft reboot\r\n")
        except KeyboardInterrupt:
            pass
        sys.exit(r.args[0])


main()

"""A virtual board: a MicroPython unix-port VM behind a pseudo-terminal, with reboots emulated.

The host side of the pty is held here; pyserial and `mpremote` open the other side (`board.port`)
like /dev/ttyUSB0. A bridge thread copies bytes both ways: byte 0x03 from the host becomes SIGINT
to the VM (Ctrl-C: KeyboardInterrupt in running code, the Ctrl-C character in the REPL shim), and
everything else goes to the VM's stdin. The VM runs host/emulator/mpy/_vboard.py (the REPL shim);
when it exits with a reboot code (soft reset, machine.reset()) the supervisor starts a fresh VM on
the same pty and flash, so the host sees one board that rebooted.

A board whose console is a UART (a classic ESP32: UART0 through its module's USB-UART bridge) can model that
console's input (`console_ring`, off by default, so that flashing is not paced): the bytes arrive at the
console's baud rate in the UART FIFO's interrupt-sized pieces, into one 260-byte stdin ring (ports/esp32/
mphalport.c stdin_ringbuf_array) that holds 259 (py/ringbuf.h keeps a slot free); the interrupt handler drops
every byte that finds it full (ports/esp32/uart.c uart_irq_handler: ringbuf_put's result is not looked at).
The ring is the VM's stdin pipe: the bytes in it that the VM has not read are the ring's fill.

VMs run in their own session, die with the host process (PR_SET_PDEATHSIG, forked on threads that live as long as
it: popen_vm), and are killed by `stop()`, by `atexit`, or by the pytest fixture's teardown.
"""

from __future__ import annotations

import atexit
import concurrent.futures.thread  # noqa: F401 - at-fork hooks registered before any fork: see FORK_HOOKED
import ctypes
import errno
import fcntl
import logging  # noqa: F401 - at-fork hooks registered before any fork: see FORK_HOOKED
import math
import os
import queue
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
import tty
import weakref
from functools import cache
from pathlib import Path

from specmesh.host import atomic, layout, stops, tempdirs
from specmesh.host.boardclasses import CONSOLE_RING, BoardClass, board_class
from specmesh.host.mpycross import CompileError, compile_py

# The stdlib modules that register at-fork hooks when first imported. A thread forks the VMs (the _Spawner's;
# subprocess with preexec_fn runs the hooks); one of these imported meanwhile by another thread (a lazy import of the
# run) would have its after-fork hook run without its before-fork one: "Exception ignored in _releaseLock ...
# RuntimeError: cannot release un-acquired lock", about 1 run in 60. Imported above, before any board starts.
FORK_HOOKED = ("logging", "concurrent.futures.thread")
MPY_DIR = Path(__file__).with_name("mpy")
EXIT_SOFT, EXIT_SOFT_RAW, EXIT_HARD = 64, 65, 66  # must match _vboard.py
_LIVE: weakref.WeakSet[VirtualBoard] = weakref.WeakSet()


def running_here(port: str) -> VirtualBoard | None:
    """The virtual board this process runs (a run's, a test's) whose port is `port`, or None: the boards of another
    process, a `specmesh emulate`, are host/bus/ports.py emulated's to tell."""
    real = os.path.realpath(port)
    return next((b for b in list(_LIVE) if b.port and os.path.realpath(b.port) == real), None)


# A board's state as its supervisor shows it on its pty, for another process that holds the port (a flash of a `specmesh
# emulate`'s board, a run's discovery of one: it cannot see wait_ready's signal, which this process reads): the pty's
# window size, set on its master side (TIOCSWINSZ, VirtualBoard._show) and read on the port's (TIOCGWINSZ, Shown). A
# side channel that is the port's own, needs no file and ends with it; no bytes of it reach the board's console.
# ws_xpixel SHOWN_MARK says that the size is a state (a pty's own is 0 0 0 0), ws_row the boot (1 to 65535, then 1
# again: `boots`), ws_col BOOTING (not up yet: a Ctrl-C waits) or UP (its shim said it is up), at most SHOW_S late. A
# board that cannot run again is given up by its emulate (host/cli _say_failed), which closes its port.
SHOWN_MARK, BOOTING, UP = 0x534D, 1, 2
SHOW_S = 0.05
WINSIZE = "4H"


class Shown:
    """The state a `specmesh emulate`'s board shows on its port (`fd`: a descriptor of it, held open): what a flash or a
    run in another process waits on as VirtualBoard.wait_ready does in the emulate's (`boots`, `wait_ready`)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def read(self) -> tuple[int, int] | None:
        """(boot, state) as shown, or None where the port shows none (a pty of no specmesh emulate's); OSError where
        the port is gone (its emulate ended)."""
        _, _, mark, _ = size = struct.unpack(WINSIZE, fcntl.ioctl(self.fd, termios.TIOCGWINSZ, bytes(8)))
        return (size[0], size[1]) if mark == SHOWN_MARK else None

    @property
    def boots(self) -> int:
        """The boot shown; 0 where none is or the port is gone (wait_ready then says why)."""
        try:
            shown = self.read()
        except OSError:
            return 0
        return shown[0] if shown else 0

    def wait_ready(self, after: int = 0, limit: float | None = None) -> str | None:
        """VirtualBoard.wait_ready on another process's board: None once a VM of another boot than `after` (0: any)
        is up, else why not in words."""
        limit = VM_START_S if limit is None else limit
        deadline = time.monotonic() + limit
        while True:
            try:
                shown = self.read()
            except OSError:
                return "its port closed: its specmesh emulate ended or gave the board up (its output says why): start " \
                       "the emulate again"
            if shown is not None and shown[1] == UP and shown[0] != after:
                return None
            if time.monotonic() > deadline:
                return f"its VM did not come up within {limit:g} s: stop its specmesh emulate and start it again"
            time.sleep(0.005)


def shown(fd: int) -> Shown | None:
    """The state shown on the port that `fd` holds open, or None where it shows none (another pty)."""
    board = Shown(fd)
    try:
        return board if board.read() is not None else None
    except OSError:
        return None


class BoardError(RuntimeError):
    """A virtual board could not start or keep running."""


class Hung(BoardError):
    """A board whose first VM never said it was up within its start's limit, nothing else wrong (it did not exit, the
    board was not stopped): it hung before its shim was up (VirtualBoard.start); `why`: wait_ready's words."""

    def __init__(self, name: str, why: str):
        super().__init__(f"{name}: {why}")
        self.why = why


class FolderInUse(BoardError):
    """A virtual board's flash folder is held by another process (`holder`: its pid, or None)."""

    def __init__(self, folder: Path, holder: int | None):
        super().__init__("virtual board folder %s is in use by another specmesh%s" % (
            folder, " (pid %d)" % holder if holder is not None else ""))
        self.holder = holder


def hold_folder(folder: Path) -> int:
    """Hold `folder` (a board's flash) for this process: a second one on the same folder is refused (FolderInUse)
    rather than writing over this one's board. An advisory lock on FOLDER.lock beside it, holding this pid (the
    flash folder is the board's file system); the kernel drops it when the returned descriptor is closed or this
    process ends, however it ends, so a killed process leaves nothing to clean."""
    import fcntl

    path = folder.with_name(folder.name + ".lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        raise FolderInUse(folder, int(holder) if holder.isdigit() else None) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, b"%d\n" % os.getpid(), 0)
    except OSError:  # a full disk: the folder is not held, and the caller says why
        os.close(fd)
        raise
    return fd


class FlashResized(BoardError):
    """A board's flash folder holds a flash image of another size than this start's: the start would replace it
    with an empty one, its files lost (VirtualBoard.start), which a folder the user keeps (emulate --dir) must
    not have done to it; or this start has no image size (a folder flash: `wanted` None), and the board would
    start on the folder, showing the image as a file and none of the files in it. `size`: the image's bytes."""

    def __init__(self, name: str, image: Path, size: int, wanted: int | None):
        asked = ("a folder flash asked for (no --flash-kb: the board would not see its files)" if wanted is None else
                 "not the %d KiB asked for (starting it would erase it)" % (wanted // 1024))
        super().__init__("%s's flash %s is %d KiB, %s: give --flash-kb %d to keep its files, or another --dir"
                         % (name, image, size // 1024, asked, size // 1024))


def check_flash_size(vb: VirtualBoard) -> None:
    """FlashResized if `vb`'s flash folder holds an image that its start would replace (another size; an empty
    one holds no files) or leave unseen (a folder flash)."""
    image = vb.flash_dir / "flash.img"
    if not image.is_file():
        return
    size = image.stat().st_size
    if size and size != vb.flash_bytes:  # empty: an earlier specmesh's start killed as it made the image
        raise FlashResized(vb.name, image, size, vb.flash_bytes)


class FlashDamaged(BoardError):
    """A module on a virtual board's flash does not load: it hangs the VM's import (a truncated .mpy does), as
    an interrupted flash of a specmesh before host/provision/flash.py wrote files under a temporary name left."""


MEASURE_S = 20  # longest the flashed modules may take to import when the VM heap is sized
# longest a running VM may take to say it is up (its shim's ready signal, wait_ready): start()'s limit, a flash's wait
# for a reboot (host/provision/flash.py open_board), and how long a Ctrl-C that came while the VM (re)booted waits for
# it. A wait ends when the signal comes, at once when the VM cannot start or keeps exiting (failed), and only then on
# this clock, which is there for a VM that hangs before its shim is up. A start takes about 0.1 s of CPU, so only a
# VM given under 0.2% of a CPU for the whole minute reaches it. It was 10 s, a start's whole allowance: a VM held back
# past it failed `make run` ("the VM did not start", a flash's "did not come back from a soft reset within 10 s")
VM_START_S = 60.0


def micropython_binary() -> str:
    found = layout.micropython_binary()
    if not found:
        raise BoardError("the micropython binary is missing: run `make setup`")
    return found


@cache
def standin_dir() -> str:
    """The shim and stand-in modules, compiled once per host process to x64 .mpy (less VM heap)."""
    out = tempdirs.made("vboard")
    for src in sorted(MPY_DIR.glob("*.py")):
        try:
            compile_py(src, out / (src.stem + ".mpy"), march="x64")
        except CompileError as e:
            raise BoardError(str(e)) from None
    return str(out)


MEASURE_HEAP = 4 << 20  # -X heapsize= of the VMs that measure the shim (room for a ROMFS partition)


@cache
def _shim_heap(romfs_bytes: int) -> tuple[int, float]:
    """(heap bytes the REPL shim holds at the prompt, VM heap size per usable heap byte: the GC's
    allocation tables take the rest), with an erased ROMFS partition of `romfs_bytes` (0: none)."""
    with tempdirs.folder("measure") as tmp:
        flash = Path(tmp) / "flash"
        flash.mkdir()
        env = {"MICROPYPATH": standin_dir(), "VBOARD_EMU": standin_dir(), "VBOARD_FLASH": str(flash),
               "VBOARD_MODE": "measure", "VBOARD_NAME": "measure"}
        if romfs_bytes:
            env["VBOARD_ROMFS"] = str(_erased(Path(tmp) / "flash.romfs", romfs_bytes))
        out = run_vm([micropython_binary(), "-X", f"heapsize={MEASURE_HEAP}", "-c", "import _vboard"], timeout=30,
                     env=env)
    try:
        alloc, usable = (int(v) for v in out.split()[-2:])
    except ValueError:
        raise BoardError(f"the REPL shim does not start: {out.decode(errors='replace')[-200:]}") from None
    return alloc, MEASURE_HEAP / usable


def shim_footprint() -> int:
    """Heap bytes the REPL shim itself holds at the prompt; added to the VM heap so that a program
    sees the board class's heap free, as on the real board."""
    return _shim_heap(0)[0]


def romfs_heap(romfs_bytes: int) -> int:
    """VM heap a ROMFS partition of `romfs_bytes` takes: the bytearray holding it, its `vfs.rom_ioctl`
    stand-in, and the GC's allocation tables for both. Added to the VM heap: on a board the partition
    is memory-mapped flash, so a program still sees the board class's heap free."""
    if not romfs_bytes:
        return 0
    alloc, per_byte = _shim_heap(romfs_bytes)
    return math.ceil((alloc - shim_footprint()) * per_byte)


def _erased(path: Path, size: int) -> Path:
    """A flash partition of `size` bytes, erased (0xff), unless `path` already is one of that size."""
    if not path.is_file() or path.stat().st_size != size:
        atomic.write_bytes(path, b"\xff" * size)
    return path


try:  # resolved here, once: a preexec_fn must not dlopen (a lock another thread may hold at fork)
    _PRCTL = ctypes.CDLL(None).prctl
except (OSError, AttributeError):
    _PRCTL = None


def _die_with_parent() -> None:
    """preexec_fn of a VM: SIGKILL it when its parent dies (PR_SET_PDEATHSIG). The kernel's "parent" here is the
    thread that forked it, not the process: popen_vm forks only on threads that live as long as the process."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)


class _Spawner:
    """The one thread that forks the VMs asked for on other threads than the main one, and lives as long as the
    process. PR_SET_PDEATHSIG fires when the forking *thread* ends (prctl(2)), so a VM forked on a short-lived thread
    (a board started and flashed beside others, host/provision/cluster.py _side_by_side; a caller's own thread) was
    SIGKILLed as that thread ended, and its board rebooted ("VM exited with code -9; rebooting"). The main thread
    forks its own (it lives as long as the process, and only there may a Ctrl-C arrive mid-fork: popen_vm). Chosen
    over a child that watches its parent process (a pipe it polls): the VM is MicroPython or QEMU, which poll no
    pipe, so that would take a wrapper process per VM; forking here keeps PDEATHSIG, which the kernel delivers even
    when the host is SIGKILLed. A process forked from this one (os.fork) has no such thread: it starts its own."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Fork] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="vboard-spawner", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def popen(self, args: list[str], kwargs: dict) -> subprocess.Popen[bytes]:
        """subprocess.Popen(args, preexec_fn=_die_with_parent, **kwargs), forked on this thread; what it raised, raised
        here."""
        job = _Fork(args, kwargs)
        self._jobs.put(job)
        job.done.wait()
        if job.error is not None:
            raise job.error
        assert job.proc is not None
        return job.proc

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job.proc = subprocess.Popen(job.args, preexec_fn=_die_with_parent, **job.kwargs)
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                job.error = e
            job.done.set()


class _Fork:
    """One VM's Popen asked of the _Spawner: its arguments, then its Popen or what Popen raised."""

    def __init__(self, args: list[str], kwargs: dict) -> None:
        self.args, self.kwargs = args, kwargs
        self.done = threading.Event()
        self.proc: subprocess.Popen[bytes] | None = None
        self.error: BaseException | None = None


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def _the_spawner() -> _Spawner:
    """The process's _Spawner, started on first use (again in a forked child, where its thread is not)."""
    global _spawner
    with _spawner_lock:
        if _spawner is None or not _spawner.alive():
            _spawner = _Spawner()
        return _spawner


def popen_vm(args: list[str], **kwargs) -> subprocess.Popen[bytes]:
    """subprocess.Popen(args, **kwargs) of a VM (or QEMU), which dies with the process (_die_with_parent): forked on
    the main thread when called there, else on the _Spawner's. Its preexec_fn makes the fork run the at-fork hooks,
    logging's among them, so on the main thread a stop signal is held meanwhile (stops.held)."""
    if threading.current_thread() is not threading.main_thread():
        return _the_spawner().popen(args, kwargs)
    proc: subprocess.Popen[bytes] | None = None
    try:
        with stops.held():
            proc = subprocess.Popen(args, preexec_fn=_die_with_parent, **kwargs)
        return proc
    except KeyboardInterrupt:  # the stop held while it forked: a VM no one holds, ended here
        if proc is not None:
            proc.kill()
            proc.wait()
        raise


def run_vm(args: list[str], timeout: float, input: bytes | None = None, **kwargs) -> bytes:
    """The stdout of a VM that popen_vm starts and that runs to its end, as subprocess.run(args, input=input,
    capture_output=True, timeout=timeout) gives it (no `input`: stdin is /dev/null); TimeoutExpired (the VM killed)
    once `timeout` seconds passed."""
    with popen_vm(args, stdin=subprocess.DEVNULL if input is None else subprocess.PIPE, stdout=subprocess.PIPE,
                  stderr=subprocess.PIPE, **kwargs) as proc:
        try:
            out, _ = proc.communicate(input, timeout=timeout)
        except BaseException:
            proc.kill()
            raise
    return out


FLASH_BLOCK = 4096  # the littlefs image's erase block (host/emulator/mpy/_vboard.py)
UART_BAUD = 115200  # the UART0 REPL's speed, fixed on the stock builds (ports/esp32/uart.c uart_stdout_init)
UART_IRQ_BYTES = 120  # RXFIFO_FULL_THR (SOC_UART_FIFO_LEN - 8, ports/esp32/uart.c): bytes per interrupt
FLASH_KB_RANGE = (8, 16384)  # littlefs needs two blocks; ESP32 modules carry at most 16 MB of flash


class VirtualBoard:
    """One virtual board. `start()` it (or use `with`), hand `port` to pyserial or mpremote."""

    def __init__(
        self,
        flash_dir: str | os.PathLike,
        board: str | BoardClass = "esp32",
        *,
        name: str = "vboard",
        mac: str = "02:00:00:00:00:01",
        radio: tuple[str, int] | None = None,
        mtu: int = 250,
        flash_bytes: int | None = None,
        romfs_bytes: int | None = None,
        frozen_code: bool = True,
        romfs_port: str = "",
    ) -> None:
        self.board = board if isinstance(board, BoardClass) else board_class(board)
        self.flash_dir = Path(flash_dir)
        self.name = name
        self.mac = mac
        self.radio = radio
        self.mtu = mtu
        self.flash_bytes = flash_bytes  # None: the flash is the directory itself; else a littlefs image
        # the ROMFS partition's size (None: the board class's; 0: none, as on a build without ROMFS); it is
        # the host file `romfs_path`, beside the flash folder, and survives reboots as the flash does
        self.romfs_bytes = self.board.romfs_bytes if romfs_bytes is None else romfs_bytes
        # True: the heap that the flashed .mpy modules take once imported is added to the VM's, as if
        # that code were frozen into the board's firmware (in flash, off the heap); this is also what
        # makes up for the 64-bit unix port's objects being twice an ESP32's. The board class's heap
        # is then what data (model, KV cache, buffers) gets, as the node's budget assumes.
        self.frozen_code = frozen_code
        # "esp32": its ROMFS partition is served as the esp32 port serves it (an esp32.Partition block device,
        # host/emulator/mpy/_vrom.py); "": as a buffer written through vfs.rom_ioctl ops 3-5 (stm32, rp2, qemu)
        self.romfs_port = romfs_port
        self._code_heap: tuple[object, int] | None = None
        self.port = ""
        self.boots = 0
        self.dropped_output = 0
        # the UART console's stdin ring (module docstring): its size in bytes (0: the host's bytes go to the
        # VM at once, as over USB), settable while the board runs (`model_console`); `dropped_input` counts drops
        self.console_ring = 0
        self.dropped_input = 0
        self._stalled_since: float | None = None
        self._shown: tuple[int, int] | None = None  # (boot, state) shown on the pty (_show)
        self._master = self._slave = -1
        self._stdin_r = self._stdin_w = -1  # one pipe for every VM generation, like a UART's RX line
        self._proc: subprocess.Popen[bytes] | None = None
        self._ready_fd = -1  # read end of the running VM's "may I send Ctrl-C" pipe
        self._ready = False
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self.failed: str | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> VirtualBoard:
        """Start the board's first VM and wait for it to be up (`timeout` s at most; None: VM_START_S, read now):
        BoardError where it does not come up, Hung where it hangs."""
        self.flash_dir.mkdir(parents=True, exist_ok=True)
        self.flash_dir.chmod(0o700)  # a board's flash may hold its deployment key (docs/security.md)
        if self.flash_bytes is not None:
            image = self.flash_dir / "flash.img"
            if not image.exists() or image.stat().st_size != self.flash_bytes:
                with atomic.replacing(image, "wb") as f:  # a start killed meanwhile leaves no empty image
                    f.truncate(self.flash_bytes)
        if self.romfs_bytes:
            _erased(self.romfs_path, self.romfs_bytes)
        self._master, self._slave = os.openpty()
        tty.setraw(self._slave)
        os.set_blocking(self._master, False)
        self._stdin_r, self._stdin_w = os.pipe()
        os.set_blocking(self._stdin_w, False)
        self._show()  # BOOTING, before anyone can see the port
        self.port = os.ttyname(self._slave)
        _LIVE.add(self)
        self._spawn("friendly")
        for target in (self._pump_in, self._pump_out, self._show_state):
            t = threading.Thread(target=target, name=f"{self.name}-{target.__name__}", daemon=True)
            t.start()
            self._threads.append(t)
        why = self.wait_ready(limit=timeout)  # the shim is up: the board boots boot.py/main.py from here
        if why is not None:
            hung = not self.failed and not self._stopping.is_set()
            self.stop()
            if hung:
                raise Hung(self.name, why)
            raise BoardError(why if why.startswith(self.name + ": ") else f"{self.name}: {why}")  # _cannot_start's
        return self

    def wait_ready(self, after: int = 0, limit: float | None = None) -> str | None:
        """Wait for the board's VM to say it is up (its shim's ready signal): the first VM started after `after` boots
        (`boots`: a reboot's next VM). None once it has; else why not, in words: the VM cannot start or keeps
        exiting (`failed`, said at once), the board was stopped, or the VM ran `limit` s (None: VM_START_S) without
        saying it."""
        limit = VM_START_S if limit is None else limit
        deadline = time.monotonic() + limit
        while True:
            if self.failed:
                return self.failed
            if self._stopping.is_set():
                return "the board was stopped"
            if self.boots > after and self.pid is not None and self._vm_ready():  # not one that crashed since
                return None
            if time.monotonic() > deadline:
                return f"its VM did not come up within {limit:g} s"
            time.sleep(0.005)

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            proc = self._proc
        if proc is not None:
            _kill(proc)
        for t in self._threads:
            t.join(timeout=5)
        if self._proc is not None:
            _kill(self._proc)  # a reboot may have raced with the stop
        for fd in (self._master, self._slave, self._stdin_r, self._stdin_w, self._ready_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._master = self._slave = self._stdin_r = self._stdin_w = self._ready_fd = -1
        _LIVE.discard(self)

    def __enter__(self) -> VirtualBoard:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def model_console(self) -> None:
        """From now on, a UART-console class's input goes through its stdin ring (module docstring)."""
        if self.board.ring_drops:
            self.console_ring = CONSOLE_RING

    @property
    def romfs_path(self) -> Path:
        """The host file holding the board's ROMFS partition: `<flash folder>.romfs`."""
        return self.flash_dir.with_name(self.flash_dir.name + ".romfs")

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    # -- the VM ----------------------------------------------------------------------------------

    def _env(self, mode: str) -> dict[str, str]:
        emu = standin_dir()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "MICROPYPATH": emu,
            "VBOARD_EMU": emu,
            "VBOARD_FLASH": str(self.flash_dir.resolve()),
            "VBOARD_MODE": mode,
            "VBOARD_NAME": f"{self.board.description} ({self.name})",
            "VBOARD_MACHINE": self.board.machine,
            "VBOARD_CLOCK_HZ": str(int(self.board.stock_clock_hz)),
            "VBOARD_FS_BYTES": str(self.board.flash_fs_bytes),
            "VBOARD_MAC": self.mac,
            "VBOARD_MTU": str(self.mtu),
        }
        if self.flash_bytes is not None:
            env["VBOARD_IMAGE"] = str((self.flash_dir / "flash.img").resolve())
        if self.romfs_bytes:
            env["VBOARD_ROMFS"] = str(self.romfs_path.resolve())
            env["VBOARD_ROMFS_PORT"] = self.romfs_port
        if self.radio is not None:
            env["VBOARD_RADIO"] = f"{self.radio[0]}:{self.radio[1]}"
        return env

    def _spawn(self, mode: str) -> None:
        ready_r, ready_w = os.pipe()
        os.set_blocking(ready_r, False)
        env = self._env(mode)
        env["VBOARD_READY_FD"] = str(ready_w)
        try:
            if not self.flash_dir.is_dir():  # removed under a running board (rm -rf build/vboards)
                raise FileNotFoundError(errno.ENOENT, "no such folder", str(self.flash_dir))
            code = self.code_heap() if self.frozen_code else 0
            env["VBOARD_CODE_HEAP"] = str(code)  # the flasher's probe leaves it out of the heap a model may take
            heap = self.board.heap_bytes + shim_footprint() + romfs_heap(self.romfs_bytes) + code
            proc = popen_vm(
                [micropython_binary(), "-X", f"heapsize={heap}", "-c", "import _vboard"],
                stdin=self._stdin_r,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=self.flash_dir,
                env=env,
                start_new_session=True,
                pass_fds=(ready_w,),
                bufsize=0,
                umask=0o077,  # what the board writes (its key file among them) is its owner's only
            )
        except OSError as e:
            os.close(ready_r)
            raise self._cannot_start(e) from None
        finally:
            os.close(ready_w)
        with self._lock:
            if self._ready_fd >= 0:
                os.close(self._ready_fd)
            self._ready_fd, self._ready = ready_r, False
            self._proc = proc
            self.boots += 1

    def code_heap(self) -> int:
        """Heap bytes the flashed .mpy modules take once imported (measured in a VM, cached until the
        flash changes)."""
        key = self._flash_signature()
        if self._code_heap is not None and self._code_heap[0] == key:
            return self._code_heap[1]
        env = self._env("measure-code")
        try:
            out = run_vm([micropython_binary(), "-c", "import _vboard"], timeout=MEASURE_S, env=env,
                         cwd=self.flash_dir)  # a host killed meanwhile leaves no VM behind
        except subprocess.TimeoutExpired:
            raise FlashDamaged("%s: a module on its flash (%s) does not load within %d s: a half-written file"
                               % (self.name, self.flash_dir, MEASURE_S)) from None
        try:
            value = int(out.split()[-1])
        except (ValueError, IndexError):
            value = 0
        self._code_heap = (key, value)
        return value

    def _flash_signature(self) -> object:
        if self.flash_bytes is not None:
            st = (self.flash_dir / "flash.img").stat()
            return (st.st_size, st.st_mtime_ns)
        sig = []
        for path in sorted(self.flash_dir.glob("*.mpy")) + sorted(self.flash_dir.glob("*/*.mpy")):
            st = path.stat()
            sig.append((str(path), st.st_size, st.st_mtime_ns))
        return tuple(sig)

    def _vm_ready(self) -> bool:
        with self._lock:
            try:
                state = os.read(self._ready_fd, 64)
            except (BlockingIOError, OSError):
                state = b""
            if state:
                self._ready = state.endswith(b"R")
            return self._ready

    def _show(self) -> None:
        """Show the board's state on its pty (SHOWN_MARK), where it changed."""
        boot = (self.boots - 1) % 0xFFFF + 1
        state = UP if self.pid is not None and self._vm_ready() else BOOTING
        if (boot, state) != self._shown:
            try:
                fcntl.ioctl(self._master, termios.TIOCSWINSZ, struct.pack(WINSIZE, boot, state, SHOWN_MARK, 0))
            except OSError:  # closed by a stop meanwhile
                return
            self._shown = (boot, state)

    def _show_state(self) -> None:
        """The thread that keeps the state shown on the pty (_show) until the board stops."""
        while not self._stopping.wait(SHOW_S):
            self._show()

    def _pump_in(self) -> None:
        """Host -> VM: 0x03 becomes SIGINT, the rest goes to stdin."""
        while not self._stopping.is_set():
            try:
                ready, _, _ = select.select([self._master], [], [], 0.1)
                if not ready:
                    continue
                data = os.read(self._master, 4096)
            except OSError as e:
                if e.errno in (errno.EAGAIN, errno.EIO):
                    time.sleep(0.01)  # EIO: no one holds the port open right now
                    continue
                return
            parts = data.split(b"\x03")
            for i, part in enumerate(parts):
                if i:
                    self._interrupt()
                if part:
                    self._to_vm(part)

    def _interrupt(self) -> None:
        """Ctrl-C: SIGINT to the VM once its shim says it is ready for one (not while it boots or
        reboots; the Ctrl-C waits for the next boot). A VM whose program turned Ctrl-C off
        (micropython.kbd_intr(-1): SIGINT no longer caught) gets the byte instead, as a board does."""
        start = time.monotonic()
        while not self._stopping.is_set() and not self.failed and time.monotonic() < start + VM_START_S:
            proc = self._proc
            # In order: input sent before the Ctrl-C is read first (a soft reset it may hold must not be
            # overtaken), unless the program is not reading it.
            if time.monotonic() < start + 0.1 and _unread(self._stdin_r):
                time.sleep(0.002)
                continue
            if proc is not None and proc.poll() is None and self._vm_ready():
                time.sleep(0.01)  # a VM that just read a reset is leaving: let it say so
                if self._proc is not proc or not self._vm_ready():
                    continue
                if not _catches_sigint(proc.pid):
                    break
                try:
                    proc.send_signal(signal.SIGINT)
                    return
                except ProcessLookupError:
                    pass
            time.sleep(0.002)
        self._to_vm(b"\x03")

    def _to_vm(self, data: bytes) -> None:
        """Into the VM's stdin; waits while the program is not reading (a full pipe), until stopped. With a
        console ring: at the UART's pace, dropping what finds the ring full."""
        if self.console_ring:
            self._to_ring(data)
            return
        view = memoryview(data)
        while view and not self._stopping.is_set():
            try:
                view = view[os.write(self._stdin_w, view):]
            except BlockingIOError:
                select.select([], [self._stdin_w], [], 0.1)
            except OSError:
                return

    def _to_ring(self, data: bytes) -> None:
        """The UART console's receive path: an interrupt per UART_IRQ_BYTES at UART_BAUD (10 bits a byte) puts
        each byte into the ring if it has room, else drops it."""
        for at in range(0, len(data), UART_IRQ_BYTES):
            if self._stopping.is_set():
                return
            piece = data[at:at + UART_IRQ_BYTES]
            time.sleep(len(piece) * 10 / UART_BAUD)
            room = max(0, self.console_ring - 1 - _unread(self._stdin_r))
            try:
                os.write(self._stdin_w, piece[:room])
            except OSError:
                return
            self.dropped_input += len(piece) - min(room, len(piece))

    def _pump_out(self) -> None:
        """VM -> host, and the reboot loop: a VM that exits with a reboot code is started again."""
        quick_deaths = 0
        while not self._stopping.is_set():
            proc = self._proc
            assert proc is not None and proc.stdout is not None
            started = time.monotonic()
            while True:
                chunk = proc.stdout.read(4096)
                if not chunk:
                    break
                self._to_host(chunk)
            code = proc.wait()
            proc.stdout.close()
            if self._stopping.is_set():
                return
            crashed = self._crashed(code)
            quick_deaths = quick_deaths + 1 if crashed and time.monotonic() - started < 0.5 else 0
            if quick_deaths >= 5:
                self.failed = f"the VM keeps exiting at start (exit code {code})"
                self._to_host(f"\r\n[{self.name}: {self.failed}]\r\n".encode())
                return
            self._reboot(code)
            if self.failed:
                return

    def _crashed(self, code: int) -> bool:
        """Whether a VM that exited with `code` crashed (rather than rebooted on purpose)."""
        return code not in (EXIT_SOFT, EXIT_SOFT_RAW, EXIT_HARD, -signal.SIGINT)

    def _reboot(self, code: int) -> None:
        """Start the VM again after it exited with `code`; a VM that cannot start leaves the board failed."""
        try:
            self._start_again(code)
        except BoardError as e:
            self.failed = str(e)
            self._to_host(f"\r\n[{self.failed}]\r\n".encode())

    def _start_again(self, code: int) -> None:
        """The VM's next start after it exited with `code`; BoardError where it cannot start."""
        if code == EXIT_SOFT_RAW:
            self._spawn("raw")
        elif code in (EXIT_SOFT, EXIT_HARD, -signal.SIGINT):
            self._spawn("friendly")  # -SIGINT: Ctrl-C while kbd_intr was disabled: a reset
        else:
            self._to_host(f"\r\n[{self.name}: VM exited with code {code}; rebooting]\r\n".encode())
            self._spawn("friendly")

    def _cannot_start(self, e: OSError) -> BoardError:
        """The error of a VM that could not start (`e`): most often its flash folder removed under the running board
        (rm -rf build/vboards), where no VM starts again."""
        if self.flash_dir.is_dir():
            return BoardError("%s: cannot start its VM: %s" % (self.name, e))
        return BoardError("%s: its flash folder %s is gone (deleted while the board ran?): run again, which flashes it "
                          "afresh" % (self.name, self.flash_dir))

    def _to_host(self, data: bytes) -> None:
        """Write to the pty. Output no one reads for a second is dropped from then on (like a UART with
        no listener), so a board printing to an unread port does not stall."""
        view = memoryview(data)
        while view and not self._stopping.is_set():
            try:
                view = view[os.write(self._master, view):]
                self._stalled_since = None
            except BlockingIOError:
                now = time.monotonic()
                if self._stalled_since is None:
                    self._stalled_since = now
                if now - self._stalled_since > 1.0:
                    self.dropped_output += len(view)
                    return
                select.select([], [self._master], [], 0.05)
            except OSError:
                return


def _unread(fd: int) -> int:
    buf = bytearray(4)
    try:
        fcntl.ioctl(fd, termios.FIONREAD, buf)
    except OSError:
        return 0
    return int.from_bytes(buf, sys.byteorder)


def _catches_sigint(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    except OSError:
        pass
    return False


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


@atexit.register
def _stop_all() -> None:
    for board in list(_LIVE):
        board.stop()

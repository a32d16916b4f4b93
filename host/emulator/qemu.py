"""A virtual RV32 board: MicroPython's own RV32 machine code under QEMU, behind a pseudo-terminal.

`QemuBoard` is a `VirtualBoard` (host/emulator/board.py: the pty, the bridge threads, the reboot loop) whose
VM is `qemu-system-riscv32` running the project's firmware (rv32/firmware.elf, MicroPython v1.28.0's qemu
port with the board files of rv32/port) with `-icount shift=0`: one executed instruction is one nanosecond
of the guest's clock, so the node's instruction counts (firmware/cpucount.py) are exact and deterministic.
The board's flash folder holds its two flash partitions as host files, which survive a reset as flash
does: `flash.img` (the littlefs filesystem, the class's filesystem size) and `romfs.img` (the ROMFS
partition, loaded into guest memory and read in place). The heap is the board class's, written into the
guest's config block before it starts (rv32/port/vboard.h). Bytes go to the UART as they are (a Ctrl-C
is the firmware's to see, as on a board); `machine.reset()` ends QEMU and the supervisor starts it again
on the same pty, a power cycle.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from specmesh.host.emulator.board import BoardError, VirtualBoard, _die_with_parent, _erased
from specmesh.host.layout import ROOT

FIRMWARE = ROOT / "rv32" / "firmware.elf"
QEMU = "qemu-system-riscv32"
INSTALL_QEMU = "install QEMU: sudo apt-get install qemu-system-misc (README: With boards)"
# rv32/port/vboard.h: the config block and the ROMFS partition's address in guest memory
CONFIG_ADDR = 0x80F00000
CONFIG_MAGIC = 0x46434256
ROMFS_ADDR = 0x81000000


def qemu_binary() -> str:
    found = shutil.which(QEMU)
    if not found:
        raise BoardError(f"{QEMU} is missing: {INSTALL_QEMU}")
    return found


def qemu_command(heap_bytes: int, romfs_bytes: int, firmware: Path = FIRMWARE) -> list[str]:
    """The QEMU command line of a board (run in its flash folder, where flash.img and romfs.img are)."""
    words = (CONFIG_MAGIC, heap_bytes, romfs_bytes)
    cmd = [qemu_binary(), "-machine", "virt", "-m", "64M", "-bios", "none", "-display", "none", "-monitor", "none",
           "-semihosting-config", "enable=on,target=native", "-icount", "shift=0", "-serial", "stdio",
           "-kernel", str(firmware)]
    for i, word in enumerate(words):
        cmd += ["-device", "loader,addr=%#x,data=%#x,data-len=4" % (CONFIG_ADDR + 4 * i, word)]
    if romfs_bytes:
        cmd += ["-device", "loader,file=romfs.img,addr=%#x,force-raw=on" % ROMFS_ADDR]
    return cmd


class QemuBoard(VirtualBoard):
    """One virtual RV32 board of `board`'s class (esp32c3, esp32c6). `start()` it, hand `port` to mpremote."""

    def __init__(self, flash_dir, board="esp32c3", **kwargs) -> None:
        super().__init__(flash_dir, board, **kwargs)
        if not self.board.qemu:
            raise BoardError(f"{self.board.name} is an Xtensa board: QEMU runs the RV32 classes only")
        if self.flash_bytes is None:
            self.flash_bytes = self.board.flash_fs_bytes
        self.frozen_code = False  # the heap is the class's, as on the board: the node's code takes its share

    @property
    def romfs_path(self) -> Path:
        return self.flash_dir / "romfs.img"

    def start(self, timeout: float = 10.0) -> QemuBoard:
        if not FIRMWARE.is_file():
            raise BoardError(f"{FIRMWARE} is missing: run `make rv32-firmware`")
        qemu_binary()
        super().start(timeout)
        return self

    def _spawn(self, mode: str) -> None:
        cmd = qemu_command(self.board.heap_bytes, self.romfs_bytes)
        if self.romfs_bytes:
            _erased(self.romfs_path, self.romfs_bytes)
        log = open(self.flash_dir / "qemu.log", "wb")  # QEMU's own messages, off the board's console
        try:
            proc = subprocess.Popen(cmd, stdin=self._stdin_r, stdout=subprocess.PIPE, stderr=log,
                                    cwd=self.flash_dir, start_new_session=True, preexec_fn=_die_with_parent, bufsize=0)
        finally:
            log.close()
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
        return code != 0  # machine.reset() exits QEMU with 0 (semihosting)

    def _reboot(self, code: int) -> None:
        if code:
            why = (self.flash_dir / "qemu.log").read_text(errors="replace").strip().splitlines()
            self._to_host(f"\r\n[{self.name}: QEMU exited with code {code}: {why[-1] if why else '?'}; "
                          "rebooting]\r\n".encode())
        self._spawn("friendly")

    def code_heap(self) -> int:
        return 0

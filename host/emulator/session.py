"""A set of virtual boards sharing one virtual radio: what `specmesh emulate` and the test fixture start."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from specmesh.host import tempdirs
from specmesh.host.emulator import VirtualBoard, make_board
from specmesh.host.emulator.board import check_flash_size, hold_folder
from specmesh.host.emulator.radio import RadioConfig, RadioHub


def board_mac(index: int) -> str:
    """Locally administered, unicast MACs: 02:53:4d:00:00:01, ... (0x53 0x4d: "SM")."""
    return "02:53:4d:00:%02x:%02x" % ((index + 1) >> 8, (index + 1) & 0xFF)


class Emulation(contextlib.ExitStack):
    """`n` boards of `board` class with flash folders under `root` (a temporary folder if None)."""

    def __init__(
        self,
        n: int,
        board: str = "esp32",
        root: str | Path | None = None,
        radio: RadioConfig | None = None,
        flash_bytes: int | None = None,
        romfs_bytes: int | None = None,
        qemu: bool = False,
    ) -> None:
        """`romfs_bytes`: each board's ROMFS partition (None: its class's; 0: none, as stock firmware). `qemu`: an
        Xtensa class's boards run its machine code under QEMU (an RV32 class's always do), off the radio."""
        super().__init__()
        self.n = n
        self.board = board
        self.root = root
        self.radio_config = radio or RadioConfig()
        self.flash_bytes = flash_bytes
        self.romfs_bytes = romfs_bytes
        self.qemu = qemu
        self.hub: RadioHub | None = None
        self.boards: list[VirtualBoard] = []

    def __enter__(self) -> Emulation:
        super().__enter__()
        try:
            root = Path(self.root) if self.root else Path(self.enter_context(tempdirs.folder("boards")))
            self.hub = self.enter_context(RadioHub(self.radio_config))
            boards = []
            for i in range(self.n):
                (root / f"board{i}").parent.mkdir(parents=True, exist_ok=True)
                self.callback(os.close, hold_folder(root / f"board{i}"))  # another emulate's: FolderInUse
                vb = make_board(root / f"board{i}", self.board, self.qemu, name=f"board{i}", mac=board_mac(i),
                                radio=None if self.qemu else self.hub.address, mtu=self.radio_config.mtu,
                                flash_bytes=self.flash_bytes, romfs_bytes=self.romfs_bytes)
                check_flash_size(vb)  # an earlier run's flash of another size: FlashResized, before any board starts
                boards.append(vb)
            for vb in boards:
                self.enter_context(vb)
                self.boards.append(vb)
        except BaseException:
            self.close()
            raise
        return self

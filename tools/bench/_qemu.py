"""The board side of the RV32 and Xtensa benchmarks: tools/bench/_board_probe.py run on a flashed virtual board.

A virtual board of the class (host/emulator/qemu.py: its own machine code under QEMU -icount shift=0, where
time.ticks_cpu() counts executed instructions) is flashed with the verifier and the target (its flash kept
between runs in build/vboards/bench-<class>), and runs the probe over the raw REPL; what the probe prints is
the figures both sections print.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from specmesh.host.layout import ROOT, TARGET_FILE

PROBE = Path(__file__).with_name("_board_probe.py")


@contextmanager
def flashed(board_class: str, folder: Path | None = None) -> Iterator[Any]:
    """A started virtual `board_class` board flashed with the verifier and the target (its flash in `folder`,
    by default build/vboards/bench-<class>), in the raw REPL with the node not started: the mpremote transport
    to it, closed and the board stopped after."""
    from specmesh.host.emulator.qemu import QemuBoard
    from specmesh.host.provision.flash import flash, open_board

    name = "bench-" + board_class
    board = QemuBoard(folder or ROOT / "build" / "vboards" / name, board_class, name=name)
    board.start()
    try:
        flash(board.port, "verifier", ROOT / "models" / TARGET_FILE, progress=False, reset=False,
              board_class=board_class)
        # the raw REPL's soft reset restarts the board's QEMU, which first measures the code heap of the
        # flash as it is now (host/emulator/qemu.py code_heap): seconds on a loaded machine, not open_board's 5
        transport = open_board(board.port, timeout=30)
        try:
            yield transport
        finally:
            transport.close()
    finally:
        board.stop()


def probe(board_class: str, units: bool = False, timeout: float = 900) -> dict:
    """The probe's figures from a flashed virtual `board_class` board (with the native kernels' units for
    tools/bench/xtensa.py's fit when `units`)."""
    with flashed(board_class) as transport:
        out, err = transport.exec_raw(PROBE.read_text() + "\nmain(units_too=%r)\n" % units, timeout=timeout)
    if err:
        raise RuntimeError("the probe failed on the board: %s" % err.decode(errors="replace").strip().splitlines()[-1])
    return ast.literal_eval(out.decode().strip().splitlines()[-1])

"""Emulator benchmark: time to start a virtual board, to run one mpremote command, and to flash it.

    python -m specmesh.tools.bench emulator

Emulation figures (this machine, the unix-port VM), not a real board's: a real ESP32 boots in about a
second and copies files at the speed of its USB serial link. Rows: start (VM up, shim ready) per board
class; one `mpremote exec` (connect, soft reset, raw-paste exec, exit); flashing the drafter onto a
fresh classic-ESP32 board (compile firmware/ + shared/, copy, SHA-256 check, reset) and reflashing it
unchanged; the verifier onto a fresh ESP32-S3 board. The shipped models are used when present, else a
placeholder of the same size class.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from specmesh.host import tempdirs
from specmesh.host.emulator import VirtualBoard
from specmesh.host.layout import DRAFTER_FILE, TARGET_FILE
from specmesh.host.provision.flash import ROOT, flash

MPREMOTE = str(Path(sys.executable).with_name("mpremote"))


def _model(role: str, tmp: Path) -> Path:
    path = ROOT / "models" / (DRAFTER_FILE if role == "drafter" else TARGET_FILE)
    if path.exists():
        return path
    out = tmp / path.name
    out.write_bytes(os.urandom(40_000 if role == "drafter" else 1_000_000))
    return out


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run() -> dict:
    results: dict = {}
    with tempdirs.folder("bench") as tmp_name:
        tmp = Path(tmp_name)
        for cls in ("esp32", "esp32s3"):
            starts = []
            for i in range(5):
                vb = VirtualBoard(tmp / f"start-{cls}-{i}", cls)
                starts.append(_timed(vb.start))
                vb.stop()
            results[f"start_{cls}_s"] = statistics.median(starts)
        with VirtualBoard(tmp / "exec", "esp32") as vb:
            execs = [_timed(lambda: subprocess.run([MPREMOTE, "connect", vb.port, "exec", "pass"],
                                                   capture_output=True, timeout=30, check=True))
                     for _ in range(5)]
            results["mpremote_exec_s"] = statistics.median(execs)
        for role, cls in (("drafter", "esp32"), ("verifier", "esp32s3")):
            model = _model(role, tmp)
            with VirtualBoard(tmp / f"flash-{role}", cls) as vb:
                report = None

                def once() -> None:
                    nonlocal report
                    report = flash(vb.port, role, model, progress=False)

                results[f"flash_{role}_s"] = _timed(once)
                results[f"flash_{role}_bytes"] = report.bytes_written
                results[f"reflash_{role}_s"] = _timed(once)
    rows = [
        ("start esp32 board (median of 5)", f"{results['start_esp32_s'] * 1000:.0f} ms"),
        ("start esp32s3 board (median of 5)", f"{results['start_esp32s3_s'] * 1000:.0f} ms"),
        ("mpremote exec 'pass' (median of 5)", f"{results['mpremote_exec_s'] * 1000:.0f} ms"),
    ]
    for role in ("drafter", "verifier"):
        kb = results[f"flash_{role}_bytes"] / 1024
        rows.append((f"flash {role} ({kb:.0f} KiB)", f"{results[f'flash_{role}_s']:.2f} s "
                     f"({kb / results[f'flash_{role}_s']:.0f} KiB/s)"))
        rows.append((f"reflash {role}, unchanged", f"{results[f'reflash_{role}_s']:.2f} s"))
    width = max(len(r[0]) for r in rows)
    print("virtual boards (emulation figures, this machine)")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    return results

"""The node's own Python per request, in instructions: a virtual ESP32-C3 (MicroPython's RV32 code under QEMU,
`-icount shift=0`: time.ticks_cpu() counts executed instructions) decodes request lines and encodes reply lines
with shared/codec.py as a node does (the CRC-16 in Python: MicroPython's binascii has no crc_hqx), for payloads of
two sizes; a fixed part and one per frame byte fit both (host/projection/hardware.py NODE_FRAME_INSNS,
NODE_FRAME_BYTE_INSNS keep the figures). A drafter's n-gram lookups are tools/ngram_cost.py's.

    python -m specmesh.tools.frame_cost
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from specmesh.host import tempdirs
from specmesh.host.layout import ROOT
from specmesh.tools import last_line, run_tool

SIZES = (100, 400)
SCRIPT = """
import gc, time
from shared import codec
T, D = time.ticks_cpu, time.ticks_diff
def count(f, n=10):
    gc.collect()
    t = T()
    for _ in range(n):
        f()
    return D(T(), t) // n
base = count(lambda: None)
for size in %r:
    payload = bytes(size)
    line = codec.encode_line(codec.encode(5, payload, seq=3))
    print(size, count(lambda: codec.decode(codec.decode_line(line[1:-1]))) - base,
          count(lambda: codec.encode_line(codec.encode(5, payload, None, None, 3, 0, True))) - base)
""" % (SIZES,)


def measure() -> dict[int, tuple[int, int]]:
    """{payload bytes: (instructions to decode the request line, to encode the reply line)}."""
    from specmesh.host.emulator import make_board

    mpremote = str(Path(sys.executable).with_name("mpremote"))
    with tempdirs.folder("frame-cost") as tmp:
        script = Path(tmp) / "frame_cost.py"
        script.write_text(SCRIPT)
        board = make_board(Path(tmp) / "c3", "esp32c3").start()
        try:
            out = subprocess.run([mpremote, "connect", board.port, "mount", str(ROOT), "run", str(script)],
                                 capture_output=True, text=True, timeout=300)
        finally:
            board.stop()
    if out.returncode:
        raise SystemExit("frame_cost: the virtual ESP32-C3 did not run the count: %s" % last_line(out.stderr))
    rows = [line.split() for line in out.stdout.splitlines() if line.split() and line.split()[0].isdigit()]
    return {int(r[0]): (int(r[1]), int(r[2])) for r in rows}


def fit(counts: dict[int, tuple[int, int]]) -> tuple[float, float]:
    """(fixed instructions a request and its reply, instructions per frame byte) through the two sizes."""
    (a, (da, ea)), (b, (db, eb)) = sorted(counts.items())
    per_byte = ((db - da) + (eb - ea)) / 2 / (b - a)
    return da + ea - 2 * a * per_byte, per_byte


def main(argv: list[str] | None = None) -> None:
    # no options: `--help` or a stray argument must not start the board and its minute of counting
    argparse.ArgumentParser(prog="python -m specmesh.tools.frame_cost", description=__doc__.split("\n\n")[0]
                            ).parse_args(argv)
    counts = measure()
    for size, (dec, enc) in sorted(counts.items()):
        print("payload %4d B: decode %7d, encode %7d instructions" % (size, dec, enc))
    fixed, per_byte = fit(counts)
    print("fixed %.0f instructions a request and reply, %.0f per frame byte" % (fixed, per_byte))


if __name__ == "__main__":
    run_tool("frame_cost", main)

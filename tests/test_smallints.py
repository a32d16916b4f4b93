"""Integer intermediates under 2^30 in what a board runs per token: on a 32-bit port a small int has 31 bits
(py/mpconfig.h MICROPY_OBJ_REPR_A; py/smallint.h), and every value at or above 2^30 is a heap-allocated long. The
PRNG's hash keeps its state in 16-bit halves (shared/prng.py _draw): checked here line by line under CPython, and
by the heap itself on a virtual ESP32-C3 (QEMU, 31-bit small ints; opt-in: -m rv32)."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from specmesh.shared import codec, prng
from tests.conftest import ROOT, require_rv32
from tests.emulator_util import MPREMOTE

LIMIT = 1 << 30
ARGS = {"seed", "pos", "purpose", "attempt"}  # inputs, modulo 2^32: only their 16-bit pieces are computed with


def _largest_local(func, calls) -> int:
    """The largest int any local of `func` held (its arguments left out), over `calls` (argument tuples)."""
    code = func.__code__
    top = [0]

    def trace(frame, event, _arg):
        if frame.f_code is not code:
            return None
        for name, value in frame.f_locals.items():
            if name not in ARGS and isinstance(value, int) and value > top[0]:
                top[0] = value
        return trace

    sys.settrace(trace)
    try:
        for args in calls:
            func(*args)
    finally:
        sys.settrace(None)
    return top[0]


def test_the_prng_computes_under_2_to_the_30():
    rng = random.Random(5)
    calls = [(rng.getrandbits(32), rng.getrandbits(24), rng.randrange(1, 4), rng.getrandbits(8), 0xFFFF, 0xFFFF)
             for _ in range(2000)]
    assert _largest_local(prng._draw, calls) < LIMIT
    assert _largest_local(codec.crc16_py, [(bytes(rng.getrandbits(8) for _ in range(64)),) for _ in range(50)]) < LIMIT


ALLOC = """
import gc
from shared import prng, codec
def alloc(f, n=20):
    gc.collect()
    gc.disable()
    a = gc.mem_alloc()
    for i in range(n):
        f(i)
    b = gc.mem_alloc()
    gc.enable()
    return b - a
data = bytes(range(64))
print(alloc(lambda i: prng.uniform(0xDEADBEEF, i, 2, 500)), alloc(lambda i: prng.uniform(12345, i, 3, 1 << 20)),
      alloc(lambda i: codec.crc16_py(data)))
"""


@pytest.mark.rv32
def test_a_32_bit_board_allocates_nothing_per_draw(tmp_path):
    """Before: 2.4 KB per draw on the RV32 board (each 32-bit product a long); now none (a seed of 2^30 or more
    is a long itself: its two 16-bit pieces are taken without keeping one)."""
    require_rv32()
    from specmesh.host.emulator import make_board

    script = tmp_path / "alloc.py"
    script.write_text(ALLOC)
    board = make_board(tmp_path / "c3", "esp32c3").start()
    try:
        out = subprocess.run([MPREMOTE, "connect", board.port, "mount", str(ROOT), "run", str(script)],
                             capture_output=True, text=True, timeout=120)
    finally:
        board.stop()
    assert out.returncode == 0, out.stderr
    big_seed, small_seed, crc = (int(v) for v in out.stdout.split()[-3:])
    assert small_seed == 0 and crc == 0
    assert big_seed < 20 * 128  # the seed's two pieces: about 70 bytes a draw, against 2.4 KB before

"""The MicroPython that benchmarks run (host/projection/mpy/: `specmesh bench`'s board script and the timing
harness it shares with tools/bench/_mp_kernels.py) is code like firmware/: it compiles for the boards'
architectures, and the harness and the script run under the real VM. Running the whole script on a flashed
virtual board is tests/test_boardbench.py's."""

import json
import subprocess
from pathlib import Path

import pytest

from specmesh.host.mpycross import compile_py
from specmesh.host.projection import boardbench

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(boardbench.MPY.glob("*.py"))


@pytest.mark.parametrize("march", ["xtensawin", "rv32imc"])
def test_board_scripts_compile_for_the_boards(tmp_path, march):
    assert {p.name for p in SCRIPTS} == {"boardbench.py", "timing.py"}
    for src in SCRIPTS:
        compile_py(src, tmp_path / (src.stem + ".mpy"), march=march)
        assert (tmp_path / (src.stem + ".mpy")).stat().st_size > 0


def test_the_harness_times_per_call_and_batches_fast_calls(micropython):
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from timing import best\n"
            "calls = [0]\n"
            "def f():\n    calls[0] += 1\n"
            "us = best(f, (), 3)\n"
            "n = calls[0]\n"
            "calls[0] = 0\n"
            "one = best(f, (), 2, 0, 0)\n"
            "print(us, n, one, calls[0])\n" % str(boardbench.MPY))
    out = subprocess.run([micropython, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    us, n, one, single = out.stdout.split()
    assert 0 < float(us) < 2000 and int(n) > 3 * 8  # many calls per timing: each timing lasts >= 2 ms
    assert float(one) >= 0 and int(single) == 3  # batch 0: a warm-up call, then one call per timing


def test_the_script_sent_to_a_board_inlines_the_harness_and_calls_main(micropython, tmp_path):
    text = boardbench.script(reps=1)
    assert boardbench.TIMING_IMPORT not in text and "def best(" in text
    assert text.rstrip().splitlines()[-1].startswith("print(main(1, ")
    # under the VM from the firmware's folder: kernels, engine and shared/ as a board holds them
    (tmp_path / "bench.py").write_text(text.replace("('drafter', 'target')", "()"))  # the kernels only
    out = subprocess.run([micropython, "-X", "heapsize=4M", str(tmp_path / "bench.py")], capture_output=True,
                         text=True, timeout=120, env={"MICROPYPATH": "%s:%s" % (ROOT / "firmware", ROOT)})
    assert out.returncode == 0, out.stderr
    measured = json.loads(out.stdout.splitlines()[-1])
    assert set(boardbench.modeled()) <= set(measured) and measured["stream"][0] > 0

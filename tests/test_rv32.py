"""Virtual ESP32-C3 boards (MicroPython's RV32 machine code under QEMU, host/emulator/qemu.py): what `make test-rv32`
runs besides the HIL suite (tests/test_hil.py). A native kernel call executes the same instructions every time,
and a whole pass nearly so; `specmesh run` on two C3s prints the host's text (greedy: plain decoding's; seeded: the
host back-ends' with the same seed), with both boards on the native kernels and their instructions per token in
the stats; `--project esp32c3` prices the measured instructions; a pipeline of five C3 stages gives the single
verifier's tokens.
"""

import ast
import os
import shutil
import signal
import time

import pytest

from specmesh.host.boardclasses import BOARD_CLASSES
from specmesh.host.projection.hardware import ESP32C3, RV32_CPI
from specmesh.host.provision.cluster import Cluster
from tests.conftest import (PAIR_SAMPLINGS, ROOT, assert_five_stages_give_the_single_verifiers_tokens,
                            assert_pair_prints_the_hosts_text, require_rv32, run_stats)

pytestmark = pytest.mark.rv32
MODELS = ROOT / "models"
# Board code, counted by the board: the native matmul (64 x 172, one position) 6 times, then the same
# one-position pass 8 times in a row from the same cached state, then a pass of five.
REPEAT = """
import time, engine
from array import array
T, D = time.ticks_cpu, time.ticks_diff
e = engine.Engine('/rom/target.spm', 5, True, 96)
w = bytearray(64 * 172)
x = array('i', range(173))
p = array('i', range(16 + 64))
p[0], p[1], p[2], p[3] = 64, 172, 1, 0
mm = array('i', range(6))
for i in range(6):
    t = T()
    e.kern.matmul(w, x, 0, p)
    mm[i] = D(T(), t)
mv = memoryview(array('H', range(1, 11)))
e.forward(mv[0:4], 0)
one, five = mv[4:5], mv[4:9]
out = array('i', range(9))
for i in range(9):
    e.rollback(4)
    t = T()
    e.forward(five if i == 8 else one, 4)
    out[i] = D(T(), t)
print((e.kernels, list(mm), list(out)))
"""


@pytest.fixture(autouse=True)
def _rv32():
    require_rv32()


def test_a_kernel_call_counts_the_same_instructions_every_time_and_a_pass_nearly(tmp_path):
    from specmesh.tools.bench._qemu import flashed

    with flashed("esp32c3", tmp_path / "c3") as transport:
        out, err = transport.exec_raw(REPEAT, timeout=120)
    assert not err, err
    kernels, matmul, passes = ast.literal_eval(out.decode().strip().splitlines()[-1])
    assert kernels == "native"
    warm = matmul[1:]  # the first call also settles the call path
    assert len(set(warm)) == 1 and 4 * 64 * 172 < warm[0] < 6 * 64 * 172  # exact: 4-6 per MAC
    # The whole pass interprets engine.py between the kernels: its count moves by a few hundredths of a percent
    # to about one percent with the heap's history (measured; not with the data), never with QEMU's timing.
    ones = passes[:8]
    assert max(ones) - min(ones) <= 0.01 * min(ones), ones
    assert passes[8] > 2 * min(ones)  # five positions take more than twice one


def test_a_c3_boards_code_counts_as_frozen_so_its_class_heap_is_free_for_data(tmp_path):
    """With every flashed module imported (what the node loads), a virtual C3 still has its class's heap free, less
    the GC's own tables and the REPL's (under 10%): its code comes on top, as if frozen into the firmware, as the
    planning that refuses a stage count counts it (host/boardclasses.py; was: the code took about 101 KB of the
    class heap, and a stage count the planning accepted was refused by the node after every board had booted)."""
    from specmesh.host.emulator.qemu import MEASURE_CODE
    from specmesh.tools.bench._qemu import flashed

    heap = BOARD_CLASSES["esp32c3"].heap_bytes
    with flashed("esp32c3", tmp_path / "c3") as transport:
        out, err = transport.exec_raw(MEASURE_CODE + "print('FREE', gc.mem_free())\n", timeout=120)
    assert not err, err
    lines = dict(line.split() for line in out.decode().strip().splitlines())
    assert int(lines["CODEHEAP"]) > 50_000  # the node's code: about 100 KB of RV32 bytecode and objects
    assert 0.9 * heap < int(lines["FREE"]) < heap


# Board code: the verifier role as a C3 verifier holds it (`specmesh flash`: 80 positions, kmax 5), one sampled
# session, and the most heap bytes one VERIFY of 4 drafts allocates, with the GC off during each.
VERIFY_ALLOC = """
import gc, engine, roles
e = engine.Engine('/rom/target.spm', %d, True, %d)
st = {}
for k in ('compute_ms', 'passes', 'positions', 'verified', 'accepted'):
    st[k] = 0
v = roles.Verifier(e, st)
v.begin(7, 800, 8, 0, 0, -1, [1, 400, 30, 7])
ents = [(t, [t, (t + 1) %% 512], [60000, 5536]) for t in (12, 300, 5, 9)]
most = 0
for i in range(6):
    gc.collect()
    gc.disable()
    a = gc.mem_alloc()
    v.verify(v.length, ents)
    b = gc.mem_alloc()
    gc.enable()
    most = max(most, b - a)
gc.collect()
print((e.kernels, gc.mem_free(), most))
"""


def test_a_sampled_verify_allocates_no_table_on_a_c3(tmp_path):
    """On the 32-bit board (31-bit small ints), a sampled verify of 4 drafts builds its 5 rows' tables in the role's
    buffers, and no weight's product becomes a long (rule.quantize): a few hundred bytes, where one 512-entry
    table alone is 2 KB (before: about 16 KB a verify, and a C3 verifier node refused it with E_MEMORY)."""
    from specmesh.host.provision.flash import SMALL_VERIFIER_CTX, SMALL_VERIFIER_KMAX
    from specmesh.tools.bench._qemu import flashed

    with flashed("esp32c3", tmp_path / "c3") as transport:
        out, err = transport.exec_raw(VERIFY_ALLOC % (SMALL_VERIFIER_KMAX, SMALL_VERIFIER_CTX), timeout=120)
    assert not err, err
    kernels, free, most = ast.literal_eval(out.decode().strip().splitlines()[-1])
    assert kernels == "native" and free > 0
    assert most < 1024, most


@PAIR_SAMPLINGS
def test_two_c3_boards_print_the_hosts_text_on_native_kernels(tmp_path, sampling):
    assert_pair_prints_the_hosts_text("esp32c3", "esp32c3", sampling, tmp_path, "c3")


def test_project_esp32c3_prices_the_measured_instructions(tmp_path):
    stats = run_stats("--verifier", "virtual:esp32c3", "--plain", "--project", "esp32c3", tmp_path=tmp_path, name="proj")
    p = stats["projection"]
    per_pass = p["instructions_per_pass"]["verifier"]["1"]
    assert p["compute"] == "measured instructions (qemu)"
    assert p["plain_terms_s"]["compute"] == pytest.approx(per_pass * RV32_CPI.value / ESP32C3.clock_hz.value, rel=1e-3)
    assert p["plain_terms_s"]["weights_flash"] == pytest.approx(276192 / ESP32C3.flash_map_bps.value, rel=0.01)
    assert p["plain_tokens_per_s"] == pytest.approx(p["tokens_per_s"]) and p["plain_tokens_per_s"] > 0


def test_a_pipeline_of_five_c3_stages_gives_the_single_verifiers_tokens(tmp_path):
    assert_five_stages_give_the_single_verifiers_tokens("esp32c3", tmp_path)


def test_a_c3_pair_plans_gamma_on_the_instructions_its_boards_execute(tmp_path):
    """gamma auto under --project esp32c3 is fed the measured projection (the boards' STATS), not QEMU's wall
    clock: it plans drafting ahead for it; the C3 drafts with its class's heap drafter, reading no flash."""
    stats = run_stats("--drafter", "virtual:esp32c3", "--verifier", "virtual:esp32c3", "--project", "esp32c3",
                 tmp_path=tmp_path, name="pair")
    p = stats["projection"]
    assert stats["gamma_costs"] == "projected esp32c3" and p["drafter"] == "esp32c3 board"
    assert stats["drafter_model"].endswith(BOARD_CLASSES["esp32c3"].drafter) and p["ready_rounds"] > 0
    assert p["instructions_per_pass"]["drafter"]["1"] > 0 and p["pipelined_drafting"]


def test_stages_too_few_for_a_c6s_heap_say_what_to_choose_instead(tmp_path):
    """A slice the board's heap cannot hold is refused (the flasher's check against the board's free heap, else the
    node's E_MEMORY); a virtual board's line names the flags that fit (host/boardclasses.py VIRTUAL_TOO_SMALL), not
    a flash command. (`specmesh run` refuses such a --stages count before any board boots: tests/test_preflight.py.)"""
    from specmesh.host.backends import BackendError
    from specmesh.host.boardclasses import VIRTUAL_TOO_SMALL

    with Cluster("serial", MODELS, tmp_path / "vboards") as c, pytest.raises(BackendError) as e:
        c.pipeline(2, "esp32c6")
    assert "stage" in str(e.value) and "(esp32c6)" in str(e.value) and "heap" in str(e.value)
    assert str(e.value).endswith("; " + VIRTUAL_TOO_SMALL["stage"]) or str(e.value).endswith(": " + VIRTUAL_TOO_SMALL[
        "stage"])


def test_a_c3_board_whose_flash_folder_is_deleted_as_it_runs_is_failed_with_one_line(tmp_path):
    """QEMU killed after its folder went (rm -rf build/vboards): the board's restart read the folder's qemu.log and
    died with a FileNotFoundError traceback in its thread, the board left neither running nor failed (so
    `specmesh emulate` could not say so). Now it is failed with the unix-port board's line."""
    from specmesh.host.emulator.qemu import QemuBoard

    vb = QemuBoard(tmp_path / "c3", "esp32c3", name="c3").start()
    try:
        shutil.rmtree(vb.flash_dir)
        os.kill(vb.pid, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while vb.failed is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert vb.failed == ("c3: its flash folder %s is gone (deleted while the board ran?): run again, which flashes "
                             "it afresh" % vb.flash_dir)
    finally:
        vb.stop()

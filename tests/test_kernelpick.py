"""The node's kernel choice (firmware/kernelpick.py): the self-test's stored checksums are the reference
kernels' outputs and every kernel module passes them; a flashed node runs the native module and says so in
HELLO; a node whose native module is corrupt falls back to viper, says why on its console and in HELLO, and
generates the very same tokens."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from specmesh.host.layout import TARGET_FILE
from specmesh.shared import messages as m
from tests.conftest import ROOT
from specmesh.tools.nodeproc import NodeProc, flash, generate
from specmesh.tools.testmodels import random_model

sys.path.insert(0, str(ROOT / "firmware"))  # selftest and refkernels are board modules (top-level names)
import refkernels
import selftest

PROMPT = [1, 17, 42, 8, 5]


def test_stored_checks_are_the_reference_kernels_outputs():
    assert selftest.checksums(refkernels) == selftest.CHECKS
    assert selftest.run(refkernels) is None


def test_a_kernel_that_differs_fails_the_self_test():
    class Off:  # the reference kernels, embed's rounding off by one in one element
        def __getattr__(self, name):
            return getattr(refkernels, name)

        @staticmethod
        def embed(dst, w, ms, p):
            refkernels.embed(dst, w, ms, p)
            dst[p[2] + 3] += 1

    assert selftest.run(Off()) == "embed"


def test_native_and_viper_kernels_pass_under_micropython(micropython):
    code = ("import sys; sys.path[:0] = ['firmware', '.']\nimport kernels, refkernels, selftest, kernelpick\n"
            "import native.x64 as nat\nimport json\n"
            "print(json.dumps([selftest.checksums(k) for k in (nat, kernels, refkernels)] + [kernelpick.pick()[1]]))")
    out = subprocess.run([micropython, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    *sums, picked = json.loads(out.stdout.strip().splitlines()[-1])
    assert sums == [selftest.CHECKS] * 3
    assert picked == "native"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("models") / TARGET_FILE
    random_model(path, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden=48, vocab=96, max_seq=64, seed=5)
    return str(path)


def _rounding_constant(data: bytes) -> int:
    """Offset of bit 16 of the first imm32 0x2000 in the x64 module's code (rope's `+ 8192` rounding): the
    flip makes it 0x12000, which moves every rounded value by 4, and changes no control flow."""
    at = data.find(b"\x00\x20\x00\x00")
    assert at > 0, "no imm32 0x2000 in native/x64.mpy: pick another byte for this test"
    return at + 2


CORRUPTIONS = {
    "self-test": (lambda data: _rounding_constant(data), "native/x64.mpy fails its self-test ("),
    "load": (lambda data: 1, "native/x64.mpy does not load: "),  # the .mpy version byte
}


def _node(micropython, board, model):
    return NodeProc(micropython, board, {"role": "verifier", "node_id": 1, "model": model, "kmax": 4}, flashed=True)


@pytest.mark.parametrize("damage", list(CORRUPTIONS))
def test_a_corrupt_native_module_falls_back_to_viper_and_says_why(micropython, tmp_path, model, damage):
    boards = {}
    for name in ("good", "bad"):
        boards[name] = tmp_path / name
        boards[name].mkdir()
        flash(boards[name])
    where, reason = CORRUPTIONS[damage]
    module = boards["bad"] / "native" / "x64.mpy"
    data = bytearray(module.read_bytes())
    data[where(data)] ^= 1
    module.write_bytes(data)
    tokens = {}
    for name, board in boards.items():
        node = _node(micropython, board, model)
        try:
            kernels = node.call(m.HELLO, expect=m.HELLO)[9]
            tokens[name] = generate(None, node, PROMPT, 24, 0, 0.0, 7, 1, 64)
            console = b"\n".join(node.text).decode()
        finally:
            node.close()
        if name == "good":
            assert kernels == "native" and "native" not in console
        else:
            assert kernels.startswith("viper (" + reason) and kernels.endswith(")")
            assert "specmesh: " + reason in console and "; not used" in console
    assert tokens["bad"] == tokens["good"]


def test_a_board_without_the_module_runs_viper_and_says_so(micropython, tmp_path, model):
    board = tmp_path / "b"
    board.mkdir()
    flash(board)
    shutil.rmtree(board / "native")
    node = _node(micropython, board, model)
    try:
        assert node.call(m.HELLO, expect=m.HELLO)[9] == "viper (no native/x64.mpy)"
        assert not any(b"native" in line for line in node.text)  # nothing wrong: no console note
    finally:
        node.close()


def test_a_board_whose_viper_kernels_do_not_import_runs_plain_python_and_the_same_tokens(micropython, tmp_path, model):
    """The last fallback: no native module, and kernels.mpy does not import (here one built for another
    architecture, as on a port whose build has no viper): the plain-Python kernels run, HELLO says so, and the
    tokens are viper's."""
    kernels, tokens = {}, {}
    for name in ("viper", "python"):
        board = tmp_path / name
        board.mkdir()
        flash(board)
        shutil.rmtree(board / "native")
        if name == "python":
            other = tmp_path / "armv7m"
            other.mkdir()
            flash(other, "armv7m")
            shutil.copy(other / "kernels.mpy", board / "kernels.mpy")
        node = _node(micropython, board, model)
        try:
            kernels[name] = node.call(m.HELLO, expect=m.HELLO)[9]
            tokens[name] = generate(None, node, PROMPT, 24, 0, 0.0, 7, 1, 64)
        finally:
            node.close()
    assert kernels == {"viper": "viper (no native/x64.mpy)", "python": "python (no native/x64.mpy)"}
    assert tokens["python"] == tokens["viper"]


def test_a_module_that_stopped_the_board_is_not_tried_again(micropython, tmp_path, model):
    """The self-test's mark left behind (a board reset while it ran): viper, and the board says why."""
    board = tmp_path / "b"
    board.mkdir()
    flash(board)
    node = _node(micropython, board, model)
    try:
        assert node.call(m.HELLO, expect=m.HELLO)[9] == "native"
    finally:
        node.close()
    assert not (board / "native" / ".selftest").exists()  # a self-test that ends takes its mark away
    (board / "native" / ".selftest").write_bytes(b"")
    node = _node(micropython, board, model)
    try:
        kernels = node.call(m.HELLO, expect=m.HELLO)[9]
        console = b"\n".join(node.text).decode()
    finally:
        node.close()
    why = "native/x64.mpy stopped the board in its self-test; flash the node again to retry"
    assert kernels == "viper (%s)" % why and "specmesh: " + why in console


def test_on_the_esp32_port_a_module_that_fails_its_self_test_frees_its_iram_by_a_soft_reset(micropython, tmp_path,
                                                                                              model):
    """ports/esp32/main.c commits native code to IRAM and frees it only at soft reset (esp_native_code_free_all):
    a module that fails its self-test would keep its IRAM, and viper (native code too) might not fit. With the
    esp32 module present (the stand-in), the board keeps why in the mark and soft-resets; its next boot runs viper
    and says why, and does not reset again."""
    board = tmp_path / "b"
    board.mkdir()
    flash(board)
    module = board / "native" / "x64.mpy"
    data = bytearray(module.read_bytes())
    data[_rounding_constant(data)] ^= 1
    module.write_bytes(data)
    env = {"MICROPYPATH": ".frozen:%s" % (ROOT / "host" / "emulator" / "mpy")}
    cfg = {"role": "verifier", "node_id": 1, "model": model, "kmax": 4}
    first = NodeProc(micropython, board, cfg, flashed=True, env=env)
    try:
        assert first.proc.wait(timeout=60) == 0  # SystemExit: the soft reset (a board boots main.py again)
    finally:
        first.close()
    mark = (board / "native" / ".selftest").read_text()
    assert mark.startswith("native/x64.mpy fails its self-test (") and mark.endswith("a soft reset freed its IRAM")
    node = NodeProc(micropython, board, cfg, flashed=True, env=env)
    try:
        kernels = node.call(m.HELLO, expect=m.HELLO)[9]
        assert kernels == "viper (%s)" % mark
        assert node.proc.poll() is None
    finally:
        node.close()

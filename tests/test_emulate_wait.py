"""A `specmesh emulate`'s board whose VM a loaded host holds back, flashed and run from another process: its VM is
waited for as that of a board the flashing process runs (tests/test_flash.py), by the state its emulate shows on the
port (host/emulator/board.py Shown), not timed out as a silent real board; a VM that never comes up is said in one
line."""

import contextlib
import functools
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from emulator_util import appears, gated_vm, open_port, read_until
from specmesh.host.backends import BackendError
from specmesh.host.bus import ports
from specmesh.host.emulator import board as board_mod
from specmesh.host.provision import cluster
from specmesh.host.provision import flash as flash_module

# `specmesh emulate` with its VMs gated (GATED_VM: emulator_util.gated_vm's stand-in); its command line names specmesh
# and emulate, as ports.emulated finds an emulate's process by
EMULATE = ("import os, sys\nfrom specmesh.host.emulator import board\n"
           "board.micropython_binary = lambda: os.environ['GATED_VM']\n"
           "from specmesh.host.cli import main\nsys.exit(main(sys.argv[1:]))")
HOLD_S = 3.0  # a hold past the clocks the test shortens to HOLD_S - 1 (an up VM's answer takes milliseconds of CPU)
OLD_CLOCK_S = 11.5  # when an emulate's silent board was said silent before: 10 s for its REPL, then a HELLO's 1.5 s


@pytest.fixture
def gated_emulate(tmp_path):
    """A `specmesh emulate` process with one board whose VMs wait at gates after the first boot's: (the process, its
    board's port, started, open), as gated_vm's."""
    vm, started, gate = gated_vm(tmp_path)
    (gate / "0").touch()  # the emulate's own start
    proc = subprocess.Popen([sys.executable, "-c", EMULATE, "emulate", "--boards", "1", "--dir", str(tmp_path / "b")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=dict(os.environ, GATED_VM=str(vm)))
    try:
        lines = [proc.stdout.readline() for _ in range(2)]
        assert lines[1].startswith("board0  /dev/"), (lines, proc.stderr.read() if proc.poll() is not None else "")
        port = lines[1].split()[1]
        assert ports.emulated(port)
        yield proc, port, started, gate
    finally:
        with contextlib.suppress(OSError):
            for n in range(10):
                (gate / str(n)).touch()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def _reboot(port: str, started, n: int) -> None:
    """Soft-reset the board at its REPL: its next VM, number `n`, starts and is held at its gate."""
    with open_port(port) as ser:
        ser.write(b"\x04")
        read_until(ser, b"soft reboot\r\n")
    appears(started / str(n))


def _kill_vm(proc: subprocess.Popen, port: str, started, n: int) -> None:
    """Kill the running VM of the emulate `proc`'s board on `port` (a crash): the emulate boots the board again, in VM
    `n`, held at its gate; returns once the port shows that boot (Shown: up to SHOW_S after it starts)."""
    vms = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert len(vms) == 1, vms
    fd = os.open(port, os.O_RDWR | os.O_NOCTTY)
    try:
        shown = board_mod.Shown(fd)
        before = shown.boots
        os.kill(int(vms[0]), signal.SIGKILL)
        appears(started / str(n))
        for _ in range(3000):
            if shown.boots != before:
                return
            time.sleep(0.01)
        raise AssertionError(f"the port still shows boot {before}")
    finally:
        os.close(fd)


def _held_then_let_through(worker: threading.Thread, outcome: list, started, gate, holds: dict[int, float]) -> None:
    """Hold each VM n of `holds`, as it starts, for holds[n] seconds, past the worker's clocks, then let it through: the
    worker waits on, it does not end (with `outcome`)."""
    for n, hold in holds.items():
        appears(started / str(n))
        time.sleep(hold)
        assert worker.is_alive(), f"VM {n} held: the worker ended: {outcome}"
        (gate / str(n)).touch()


def _connecting(port: str, outcome: list) -> threading.Thread:
    """A thread, not started, that connects to the drafter board on `port` as a run does and appends to `outcome` the
    back-end, or the exception it met (said by the test's assertion)."""

    def run() -> None:
        try:
            with cluster.connect(port, "drafter") as drafter:
                outcome.append(drafter)
        except Exception as e:  # noqa: BLE001 - said by the test's assertion
            outcome.append(e)

    return threading.Thread(target=run, daemon=True)


def test_an_emulate_board_slow_to_boot_is_flashed_and_run(gated_emulate, monkeypatch):
    """A flash met an emulate's board rebooting with a clock of its own (10 s, mpremote's too): a VM start past it
    failed the flash ("the board is silent", after 11.5 s), as it failed a run's discovery (a first HELLO, a soft
    reset, a HELLO of 10 s). Both wait now for the VM they meet booting and each one that their soft reset starts, held
    here past their clocks (10 s; REPL_S and discover's, shortened), then time an up VM as a real board's; the flash
    waits for the one its reset into the node starts too."""
    proc, port, started, gate = gated_emulate
    monkeypatch.setattr(flash_module, "REPL_S", HOLD_S - 1)
    _reboot(port, started, 1)
    outcome: list = []

    def flash() -> None:
        try:
            outcome.append(flash_module.flash(port, "drafter", progress=False))
        except Exception as e:  # noqa: BLE001 - said by the assertion below
            outcome.append(e)

    worker = threading.Thread(target=flash, daemon=True)
    worker.start()
    # the VM it met booting, past the clock that timed it before; the one its soft reset started; the node's
    _held_then_let_through(worker, outcome, started, gate, {1: OLD_CLOCK_S + 1.5, 2: HOLD_S, 3: HOLD_S})
    worker.join(timeout=300)
    assert outcome and not isinstance(outcome[0], Exception), outcome
    _kill_vm(proc, port, started, 4)  # the node's VM ends: the board boots again, held for the run below
    monkeypatch.setattr(cluster, "FIRST_HELLO_S", HOLD_S - 1)
    monkeypatch.setattr(cluster, "discover", functools.partial(cluster.discover, deadline=HOLD_S - 1))
    outcome.clear()
    worker = _connecting(port, outcome)
    worker.start()
    _held_then_let_through(worker, outcome, started, gate, {4: HOLD_S})
    worker.join(timeout=120)
    assert outcome and not isinstance(outcome[0], Exception), outcome


def test_an_emulate_board_whose_vm_never_comes_up_fails_a_flash_and_a_run_in_one_line(gated_emulate, monkeypatch,
                                                                                       capsys):
    """A VM that hangs before it is up (its gate never opened) ends the flash and the run's discovery in one line each,
    once VM_START_S (shortened here) has passed: no hang, no traceback; as does its emulate ending meanwhile."""
    proc, port, started, _ = gated_emulate
    monkeypatch.setattr(board_mod, "VM_START_S", HOLD_S)
    _reboot(port, started, 1)
    line = f"{port}: the virtual board is not up: its VM did not come up within {HOLD_S:g} s: stop its specmesh " \
           "emulate and start it again"
    from specmesh.host import cli

    begun = time.monotonic()
    assert cli.main(["flash", "--port", port, "--role", "drafter"]) == 1
    assert time.monotonic() - begun < HOLD_S + 20
    err = capsys.readouterr().err
    assert err == f"specmesh flash: error: {line}\n", err
    begun = time.monotonic()
    with pytest.raises(BackendError) as e, cluster.connect(port, "drafter"):
        pass
    assert time.monotonic() - begun < HOLD_S + 20
    assert str(e.value) == line
    monkeypatch.setattr(board_mod, "VM_START_S", 600.0)
    outcome: list = []
    worker = threading.Thread(target=lambda: outcome.append(cli.main(["flash", "--port", port, "--role", "drafter"])),
                              daemon=True)
    worker.start()
    time.sleep(HOLD_S)  # the flash waits for the VM
    assert worker.is_alive(), outcome
    proc.send_signal(signal.SIGTERM)
    worker.join(timeout=60)
    assert outcome == [1]
    err = capsys.readouterr().err
    assert err == (f"specmesh flash: error: {port}: the virtual board is not up: its port closed: its specmesh emulate "
                   "ended or gave the board up (its output says why): start the emulate again\n"), err


def test_a_run_waits_for_the_reboot_of_its_soft_reset_however_late_the_board_takes_its_keys(gated_emulate,
                                                                                           monkeypatch):
    """A run's discovery of an emulate's board at its REPL (flashed with --no-reset) soft-resets it and asks again; it
    looked for the reset's reboot 0.6 s after its keys, and an emulate that had not taken them by then (stopped here, as
    a loaded host holds it back) still showed the old VM up: the HELLO's clock ran through the next VM's start, held
    here past it. It waits now for the next boot's VM, then times the HELLO."""
    from specmesh.host.bus.links import SerialLink

    proc, port, started, gate = gated_emulate
    (gate / "1").touch()  # the flash's soft reset
    flash_module.flash(port, "drafter", progress=False, reset=False)
    monkeypatch.setattr(cluster, "FIRST_HELLO_S", HOLD_S - 2)
    monkeypatch.setattr(cluster, "discover", functools.partial(cluster.discover, deadline=HOLD_S - 1))
    reset = threading.Event()  # the reset's last key went
    write_raw = SerialLink.write_raw

    def keys(link, data: bytes) -> None:
        write_raw(link, data)
        if data == cluster.SOFT_RESET[-1]:
            reset.set()

    monkeypatch.setattr(SerialLink, "write_raw", keys)
    outcome: list = []
    worker = _connecting(port, outcome)
    proc.send_signal(signal.SIGSTOP)  # the emulate takes no key until the reset's have been sent, and looked past
    try:
        worker.start()
        assert reset.wait(timeout=60), outcome
        time.sleep(1.0)
    finally:
        proc.send_signal(signal.SIGCONT)
    _held_then_let_through(worker, outcome, started, gate, {2: HOLD_S})  # the VM the reset started
    worker.join(timeout=120)
    assert outcome and not isinstance(outcome[0], Exception), outcome


def test_a_keyed_flash_ends_the_node_of_an_emulate_board_slow_to_boot(gated_emulate, tmp_path):
    """A keyed node takes no Ctrl-C: a flash with its key first ends it with a signed RESET, after a HELLO of 1.5 s,
    which an emulate's board whose VM was booting (held here past it) left unanswered: the node ran on, deaf to the
    flash's Ctrl-C ("did not answer with its REPL"). That HELLO's clock now starts once the VM is up."""
    from specmesh.host.provision.keys import load_key, new_key_file

    proc, port, started, gate = gated_emulate
    new_key_file(tmp_path / "k")
    key = load_key(str(tmp_path / "k"))
    for n in (1, 2, 4, 5, 6):  # the flashes' soft resets and nodes, and the RESET's reboot
        (gate / str(n)).touch()
    flash_module.flash(port, "drafter", key=key, progress=False)
    _kill_vm(proc, port, started, 3)  # its node's VM ends: the board boots again, its VM held
    outcome: list = []

    def flash() -> None:
        try:
            outcome.append(flash_module.flash(port, "drafter", key=key, progress=False))
        except Exception as e:  # noqa: BLE001 - said by the assertion below
            outcome.append(e)

    worker = threading.Thread(target=flash, daemon=True)
    worker.start()
    _held_then_let_through(worker, outcome, started, gate, {3: HOLD_S})
    worker.join(timeout=300)
    assert outcome and not isinstance(outcome[0], Exception), outcome

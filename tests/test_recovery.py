"""The recovery paths the docs promise, each walked: a planted truncated module on a virtual board's flash
(docs/emulator.md: started afresh, with a line saying so), a board left at the REPL (a soft reset brings the
node back), two runs on one flash folder (a lock: the second is told, nothing collides), a flash stopped midway
(one line saying what to do, and the same command completes it)."""

import signal

import pytest

from specmesh.host.emulator import board as board_mod
from specmesh.host.layout import DRAFTER_FILE
from specmesh.host.provision.cluster import Cluster
from specmesh.host.stops import Stopped


def test_a_truncated_module_on_a_virtual_boards_flash_is_healed_with_a_line(models, tmp_path, monkeypatch):
    with Cluster("serial", models, tmp_path) as c:
        c.start("drafter")
    codec = tmp_path / "drafter" / "shared" / "codec.mpy"
    codec.write_bytes(codec.read_bytes()[:300])  # what an interrupted copy of an older specmesh left
    monkeypatch.setattr(board_mod, "MEASURE_S", 8)  # the hang is told from a slow import by this deadline
    lines = []
    with Cluster("serial", models, tmp_path, say=lines.append) as c:
        drafter = c.backend("drafter")
        assert drafter.info.get("model", "").endswith(DRAFTER_FILE)
    assert any("does not load" in line and "starting it with an empty flash" in line for line in lines), lines
    assert len(codec.read_bytes()) > 300  # flashed whole again


def test_a_dead_espnow_verifier_is_replaced_by_the_cpu_and_the_table_names_both(models, tmp_path):
    """The verifier board behind the gateway dies mid-run: the CPU verifier takes over on the committed prefix,
    the text is the one the CPU alone gives, and the stats name the verifier that finished and the dead one."""
    from specmesh.host.backends import BackendError, LocalVerifier, SessionParams
    from specmesh.host.cli.output import _took_over
    from specmesh.host.decode.gamma import GammaController
    from specmesh.host.decode.orchestrator import Observer, generate
    from specmesh.host.layout import TARGET_FILE

    params = SessionParams(temperature=0.0)
    prompt = [5, 17, 3]
    cpu = LocalVerifier(models / TARGET_FILE)
    want = generate(prompt, cpu, None, params, 24).tokens
    with Cluster("espnow", models, tmp_path) as c:
        verifier, drafter = c.backend("verifier"), c.backend("drafter")
        for bus in c.buses:
            bus.deadline = 3.0  # the dead board is given up on sooner than a run's 30 s
        class KillAfterTwo(Observer):
            rounds = 0

            def shown(self, accepted, emitted):
                self.rounds += 1
                if self.rounds == 2:
                    c.boards["verifier"].stop()

            def fallback(self):
                return LocalVerifier(models / TARGET_FILE)

        result = generate(prompt, verifier, drafter, params, 24, GammaController(fixed=2),
                          KillAfterTwo(fails_over=True))
    assert result.tokens == want
    assert list(result.failed) == ["verifier"] and result.failed["verifier"].name == verifier.name
    assert isinstance(result.failed["verifier"].error, BackendError) and len(result.failovers) == 1
    assert "cpu took over" in result.failovers[0]
    assert result.failovers[0].count(verifier.name) == 1, result.failovers  # its failure's "NAME: " not said again
    stats = {"verifier": "cpu", "failed": {"verifier": verifier.name}}
    assert _took_over(stats, "verifier") == "cpu, which took over from %s (it failed)" % verifier.name


def test_a_flash_folder_deleted_while_the_board_boots_is_one_line_and_the_next_run_flashes_afresh(
        models, tmp_path, monkeypatch, capfd):
    """rm -rf build/vboards while a board boots: no thread's traceback, one line naming the folder, and the next
    start flashes the board again."""
    import shutil

    from specmesh.host.backends import BackendError
    from specmesh.host.provision import flash as flash_mod

    real = flash_mod.flash_checked

    def deleting_first(port, *args, **kwargs):
        shutil.rmtree(tmp_path / "drafter")  # the VM reboots into the raw REPL meanwhile: its folder is gone
        return real(port, *args, **kwargs)

    monkeypatch.setattr(flash_mod, "flash_checked", deleting_first)
    with pytest.raises(BackendError) as e, Cluster("serial", models, tmp_path) as c:
        c.start("drafter")
    assert str(e.value) == ("virtual drafter board: its flash folder %s was deleted while it booted: run again (it is "
                            "flashed afresh)" % (tmp_path / "drafter"))
    assert "Traceback" not in capfd.readouterr().err
    monkeypatch.setattr(flash_mod, "flash_checked", real)
    with Cluster("serial", models, tmp_path) as c:
        assert c.backend("drafter").info["model"].endswith(DRAFTER_FILE)


def test_a_virtual_board_frozen_before_its_flash_is_told_to_run_again_not_to_be_reset(models, tmp_path, monkeypatch):
    """A virtual board whose VM stops answering (stopped with SIGSTOP: a stalled VM) is silent to the flash; a real
    board would be reset by its owner, a virtual one has no reset button or plug: the line says to run again,
    which starts its VM afresh."""
    import os
    import signal

    from specmesh.host.backends import BackendError
    from specmesh.host.provision import flash as flash_mod

    real = flash_mod.flash_checked

    def freezing_first(port, *args, **kwargs):
        vm = next(b for b in board_mod._LIVE if b.port == port)
        os.kill(vm.pid, signal.SIGSTOP)  # the cluster's stop kills it (SIGKILL ends a stopped process)
        return real(port, *args, **kwargs)

    monkeypatch.setattr(flash_mod, "flash_checked", freezing_first)
    with pytest.raises(BackendError) as e, Cluster("serial", models, tmp_path) as c:
        c.start("drafter")
    assert str(e.value).startswith("virtual drafter board: /dev/")
    assert ": the board is silent: nothing came back within " in str(e.value)
    assert str(e.value).endswith(": its VM stopped answering: run again (a virtual board is started afresh)")
    assert "reset" not in str(e.value)



@pytest.mark.parametrize("hangs", ["its start", "the flash's soft reset"])
def test_a_virtual_board_whose_vm_hangs_before_it_is_up_costs_one_wait_and_one_line(models, tmp_path, monkeypatch,
                                                                                   capfd, hangs):
    """A VM that hangs before its shim says it is up (alive, never ready: held at its gate here) was waited for, the
    flash's soft reset's, for VM_START_S (60 s; shortened here) and then once more by the flash the cluster tries again
    for a node that missed its Ctrl-C: 2 minutes before the line, which said nothing to do. Now one wait, no second
    flash, one line that says what to do."""
    from emulator_util import gated_vm
    from specmesh.host.backends import BackendError
    from specmesh.host.provision import flash as flash_mod
    from specmesh.host.provision.cluster import VIRTUAL_HUNG

    (tmp_path / "gate").mkdir()
    vm, _, gate = gated_vm(tmp_path / "gate")  # VM 0: the board's start; 1: the flash's soft reset
    monkeypatch.setattr(board_mod, "micropython_binary", lambda: str(vm))
    if hangs != "its start":
        (gate / "0").touch()
    monkeypatch.setattr(board_mod, "VM_START_S", 2.0)
    real, flashes = flash_mod.flash_checked, []
    monkeypatch.setattr(flash_mod, "flash_checked", lambda *a, **k: (flashes.append(a), real(*a, **k))[1])
    with pytest.raises(BackendError) as e, Cluster("serial", models, tmp_path / "boards") as c:
        c.start("drafter")
    assert str(e.value) == "virtual drafter board: its VM did not come up within 2 s: " + VIRTUAL_HUNG
    assert len(flashes) == (0 if hangs == "its start" else 1)
    assert "Traceback" not in capfd.readouterr().err


def test_two_runs_on_one_flash_folder_the_second_is_told_and_the_first_is_untouched(models, tmp_path):
    """A lock per board folder: the second run is refused in one line naming the folder and the process holding
    it; once the first ends (even killed: the kernel drops the lock) the folder is free."""
    import os
    import subprocess
    import sys

    from specmesh.host.backends import BackendError
    from tests.conftest import ROOT

    code = ("import sys, time\nfrom pathlib import Path\nfrom specmesh.host.provision.cluster import Cluster\n"
            "c = Cluster('serial', Path(sys.argv[1]), Path(sys.argv[2]))\nc._lock(Path(sys.argv[2]) / 'drafter')\n"
            "print('holding', flush=True)\ntime.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(models), str(tmp_path)], cwd=ROOT,
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"holding\n"
        with pytest.raises(BackendError) as e, Cluster("serial", models, tmp_path) as c:
            c.start("drafter")
        assert str(e.value) == ("virtual board folder %s is in use by another specmesh run (pid %d): wait for it to "
                                "end, or give this one its own folder (SPECMESH_VBOARDS=DIR)"
                                % (tmp_path / "drafter", holder.pid))
        assert not (tmp_path / "drafter" / "models").exists()  # nothing was flashed over the other run's board
    finally:
        holder.kill()
        holder.wait()
    with Cluster("serial", models, tmp_path) as c:
        c.start("drafter")
    assert os.listdir(tmp_path / "drafter" / "models")


@pytest.mark.parametrize("left", [b"{not json", b"\xff\xfe", b"[1]"])
def test_a_board_config_that_does_not_read_is_flashed_whole_again(models, tmp_path, left):
    """A virtual board's specmesh.json that is not a JSON object (a hand edit, a disk that filled) is the host's own
    to rewrite, as the flash does on a real board: the board starts and its config is whole again (every run failed
    with the parser's words: 'Expecting property name ...', \"'utf-8' codec can't decode ...\", 'pop expected ...')."""
    import json

    (tmp_path / "drafter").mkdir()
    (tmp_path / "drafter" / "specmesh.json").write_bytes(left)
    with Cluster("serial", models, tmp_path) as c:
        c.start("drafter")
    cfg = json.loads((tmp_path / "drafter" / "specmesh.json").read_text())
    assert cfg["role"] == "drafter" and cfg["model"].endswith(".spm")


def test_a_flash_folder_the_host_cannot_write_is_one_line_naming_it(models, tmp_path, monkeypatch):
    """SPECMESH_VBOARDS (or build/vboards/) on a read-only or full disk, or under a file: one line naming the board's
    folder, why, and what to do, before a board starts (it was the errno's words alone: '[Errno 28] No space left on
    device', with no folder named)."""
    import errno

    from specmesh.host import atomic
    from specmesh.host.backends import BackendError

    (tmp_path / "file").write_text("")
    with pytest.raises(BackendError) as e, Cluster("serial", models, tmp_path / "file") as c:
        c.start("drafter")
    assert str(e.value).startswith("virtual drafter board: cannot write its flash folder %s (" % (tmp_path / "file" /
                                                                                                  "drafter"))
    assert str(e.value).endswith("): make room or allow writing there, or set SPECMESH_VBOARDS to a folder that can "
                                 "be written")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic, "write_text", full)
    with pytest.raises(BackendError) as e, Cluster("serial", models, tmp_path / "vb") as c:
        c.start("drafter")
    assert "cannot write its flash folder %s (No space left on device)" % (tmp_path / "vb" / "drafter") in str(e.value)
    assert not board_mod._LIVE


def test_a_full_host_disk_is_named_as_the_hosts_not_the_boards(models, tmp_path, monkeypatch):
    """A virtual board's flash is a host folder: when the host's disk has no room for the model, the line says
    to free the host's disk (the board would say 'board filesystem is full')."""
    import collections

    from specmesh.host.backends import BackendError
    from specmesh.host.provision import cluster as cluster_mod
    from specmesh.host.provision import flash as flash_mod

    def full(port, *args, **kwargs):
        raise flash_mod.FlashError("board filesystem is full while writing /models/drafter.spm.part (40000 bytes)")

    monkeypatch.setattr(flash_mod, "flash_checked", full)
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(cluster_mod.shutil, "disk_usage", lambda path: usage(1 << 30, (1 << 30) - 8192, 8192))
    with pytest.raises(BackendError) as e, Cluster("serial", models, tmp_path) as c:
        c.start("drafter")
    assert str(e.value).startswith("virtual drafter board: the host's disk holding %s is full (8 KiB free, about "
                                   % (tmp_path / "drafter"))
    assert str(e.value).endswith("free space there, or set SPECMESH_VBOARDS to a folder on another disk")


def test_a_board_left_at_the_repl_is_soft_reset_into_its_node(virtual_board, models, monkeypatch):
    """`specmesh flash --no-reset` (or `specmesh console`) leaves the board at its REPL: the next connect soft-
    resets it once its first HELLO went unanswered for FIRST_HELLO_S (2 s), not for the whole of discover's deadline,
    and its node answers. That deadline raised from 10 s to 60 s, a connect that waited it out before the reset is
    unmistakable, however long a loaded machine's node takes to boot (it asserted 8 s)."""
    import time

    from specmesh.host.provision import cluster
    from specmesh.host.provision.flash import flash

    wait_s = 60.0
    real = cluster.discover
    monkeypatch.setattr(cluster, "discover", lambda bus, deadline=wait_s, role="drafter|verifier": real(bus, deadline,
                                                                                                          role))
    vb = virtual_board()
    flash(vb.port, "drafter", models / DRAFTER_FILE, progress=False, reset=False)
    t0 = time.monotonic()
    with cluster.connect(vb.port, "drafter") as drafter:
        assert drafter.info["model"].endswith(DRAFTER_FILE)
    assert time.monotonic() - t0 < wait_s


def test_a_board_left_in_the_raw_repl_by_an_interrupted_flash_is_named_half_flashed(virtual_board, models):
    """An interrupted `specmesh flash` leaves the board in the raw REPL with the "flashing" mark: after the soft
    reset its console says half-flashed, and that is the line, with the command that finishes the flash."""
    import json

    from specmesh.host.backends import BackendError
    from specmesh.host.provision.cluster import connect
    from specmesh.host.provision.flash import flash, open_board

    vb = virtual_board()
    flash(vb.port, "drafter", models / DRAFTER_FILE, progress=False)
    cfg = vb.flash_dir / "specmesh.json"
    cfg.write_text(json.dumps(dict(json.loads(cfg.read_text()), flashing="drafter")))
    open_board(vb.port).close()  # what the interrupted flash held: the raw REPL, never left
    with pytest.raises(BackendError) as e, connect(vb.port, "drafter"):
        pass
    assert "the board was left half-flashed" in str(e.value)
    assert "`specmesh flash --port %s --role drafter`" % vb.port in str(e.value)


def test_the_next_flash_of_a_half_flashed_board_completes_it_and_sweeps_its_part_files(virtual_board, models):
    """A flash interrupted mid-copy leaves the "flashing" mark and a `.part` file: the next flash says it completes
    the interrupted one, removes what it left half-written, and the board then starts its node."""
    import json

    from specmesh.host.provision.cluster import connect
    from specmesh.host.provision.flash import flash, summary

    vb = virtual_board()
    flash(vb.port, "drafter", models / DRAFTER_FILE, progress=False)
    cfg = vb.flash_dir / "specmesh.json"
    cfg.write_text(json.dumps(dict(json.loads(cfg.read_text()), flashing="drafter")))
    left = vb.flash_dir / "models" / (DRAFTER_FILE + ".part")
    left.write_bytes(b"half a model")
    report = flash(vb.port, "drafter", models / DRAFTER_FILE, progress=False)
    assert report.resumed == "drafter" and "left half-flashed" in summary(report, 1.0)
    assert not list(vb.flash_dir.rglob("*.part"))
    assert "flashing" not in json.loads(cfg.read_text())
    with connect(vb.port, "drafter"):
        pass


@pytest.mark.parametrize("upgrade", [False, True])
def test_a_flash_interrupted_among_the_modules_leaves_no_main_py_that_imports_a_mix(virtual_board, models, tmp_path,
                                                                                    monkeypatch, upgrade):
    """Ctrl-C while a flash writes the node's modules (a first flash, or one whose node imports a name a module not
    written yet gains): the next run says to flash the board. main.py was there and imported what was missing, so
    the run said 'not a specmesh node even after a soft reset: it printed SyntaxError' every time."""
    from specmesh.host.backends import BackendError
    from specmesh.host.provision import flash as flash_mod
    from specmesh.host.provision.cluster import connect

    vb = virtual_board()
    sources = list(flash_mod.node_sources())
    if upgrade:
        flash_mod.flash(vb.port, "drafter", models / DRAFTER_FILE, progress=False, sources=sources)
        changed = {"node.py": "\nfrom shared.rule import GAINED\n", "rule.py": "\nGAINED = 1\n"}
        for i, (src, dest) in enumerate(sources):
            if src.name in changed:
                (tmp_path / src.name).write_text(src.read_text() + changed[src.name])
                sources[i] = (tmp_path / src.name, dest)
    stopped_sending(monkeypatch, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        flash_mod.flash(vb.port, "drafter", models / DRAFTER_FILE, progress=False, sources=sources)
    with pytest.raises(BackendError) as e, connect(vb.port, "drafter"):
        pass
    assert "`specmesh flash --port %s --role drafter`" % vb.port in str(e.value)
    assert "no specmesh firmware" in str(e.value), e.value


def test_modules_with_fork_hooks_are_imported_before_any_board_forks_a_vm():
    """A board's thread forks its VMs while the main thread may import lazily: a module registering at-fork hooks
    imported in between ran its after-fork hook alone ('cannot release un-acquired lock', 1 run in 60)."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = ("import sys\nimport specmesh.host.emulator.board as b\n"
            "print(all(name in sys.modules for name in b.FORK_HOOKED))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout == "True\n"


def test_a_drafter_board_lost_mid_run_leaves_plain_decoding_and_one_table_line_for_its_stats(models):
    """The drafter board dies after the first round of a mesh's generation (what `run`, `chat` and `serve` share):
    plain decoding finishes the greedy text the cpu back-ends give, the fail-over is one line, and the board that
    cannot report its stats is a "stats unavailable" line in the table (docs/run.md), not a failed run."""
    from specmesh import Mesh
    from specmesh.host.cli.output import format_table

    with Mesh(drafter="cpu", verifier="cpu", models=models, gamma="2") as mesh:
        want = mesh.generate("The cat", 16, temperature=0.0)
    warned = []
    with Mesh(drafter="virtual", verifier="cpu", models=models, gamma="2", say=[].append,
              warn=warned.append) as mesh:
        boards = mesh._setup.cluster().boards
        got = mesh.complete(mesh.encode("The cat"), mesh.request(16, temperature=0.0),
                            on_piece=lambda piece: boards["drafter"].stop())
    assert got.token_ids == want.token_ids and got.text == want.text
    (line,) = warned
    assert "going on with plain decoding" in line
    (drafter,) = [b for b in got.stats["boards"] if b["role"] == "drafter"]
    assert "error" in drafter
    table = format_table(got.stats)
    assert "stats unavailable: %s" % drafter["error"][:20] in table


@pytest.mark.parametrize("stop, status, says", [(KeyboardInterrupt(), 130, "interrupted"),
                                                (Stopped(signal.SIGTERM), 143, "stopped by SIGTERM")])
def test_a_stopped_flash_says_the_board_may_be_half_flashed_and_the_same_command_completes_it(
        virtual_board, models, monkeypatch, capsys, stop, status, says):
    """Ctrl-C (or `kill`) while `specmesh flash` writes the node's modules: one line that says what the board may be
    left as and what to do (it said only "specmesh flash: interrupted"); the same command then completes the flash."""
    import json

    from specmesh.host import cli
    from specmesh.host.provision import flash as flash_mod

    vb = virtual_board()
    argv = ["flash", "--port", vb.port, "--role", "drafter", "--model", str(models / DRAFTER_FILE)]
    send = stopped_sending(monkeypatch, stop)
    assert cli.main(argv) == status
    err = capsys.readouterr().err
    assert err == ("specmesh flash: %s: the board on %s may be left half-flashed: run the same `specmesh flash` again "
                   "to complete it\n" % (says, vb.port)), err
    monkeypatch.setattr(flash_mod, "_send", send)
    assert cli.main(argv) == 0
    assert "left half-flashed (an interrupted flash as drafter): now complete" in capsys.readouterr().out
    assert "flashing" not in json.loads((vb.flash_dir / "specmesh.json").read_text())


def stopped_sending(monkeypatch, stop: BaseException):
    """The flash's file writes (flash._send) raising `stop` at the node's /shared/rule.mpy, a file part-way through its
    modules; returns the real _send, to put back."""
    from specmesh.host.provision import flash as flash_mod

    send = flash_mod._send

    def stopped(transport, dest, *args):
        if dest == "/shared/rule.mpy":
            raise stop
        send(transport, dest, *args)

    monkeypatch.setattr(flash_mod, "_send", stopped)
    return send


@pytest.mark.parametrize("emulated, erase", [(False, "erase its flash (esptool erase_flash)"),
                                             (True, "stop its specmesh emulate and start one with an empty --dir")])
def test_a_keyed_board_reset_while_half_flashed_is_told_to_be_erased_not_flashed_again(virtual_board, models,
                                                                                       monkeypatch, emulated, erase):
    """A keyed board whose flash was interrupted once its modules were in place (here while its model was written)
    and that was then reset (a pulled cable) boots to the half-flashed note with Ctrl-C off, as a keyed node: no
    REPL, so no flash can finish it, with or without the key. `specmesh flash --key-file` told it "finish it with
    `specmesh flash --port P --role drafter`", the very command that had failed; now it says the key keeps the
    console shut and what does help (erase the flash, then flash with --key-file)."""
    import json
    import time

    import serial

    from specmesh.host.provision import flash as flash_mod
    from specmesh.host.provision.flash import FlashError, flash

    key = bytes(range(32))
    model = models / DRAFTER_FILE
    vb = virtual_board("esp32s3")
    flash(vb.port, "drafter", model, key=key, progress=False)
    (vb.flash_dir / "models" / DRAFTER_FILE).write_bytes(b"an older model")  # the one file the next flash writes
    send = flash_mod._send

    def stopped(transport, dest, *args):
        if dest == "/models/" + DRAFTER_FILE:
            raise KeyboardInterrupt
        send(transport, dest, *args)

    monkeypatch.setattr(flash_mod, "_send", stopped)
    with pytest.raises(KeyboardInterrupt):
        flash(vb.port, "drafter", model, key=key, progress=False)
    monkeypatch.setattr(flash_mod, "_send", send)
    assert json.loads((vb.flash_dir / "specmesh.json").read_text())["flashing"] == "drafter"
    with serial.Serial(vb.port, 115200, timeout=1) as ser:  # the interrupted flash left the raw REPL: a power cycle
        ser.write(b"\x02")
        time.sleep(0.3)
        ser.write(b"import machine; machine.reset()\r\n")
        time.sleep(1.0)
    monkeypatch.setattr(flash_mod.ports, "emulated", lambda port: emulated)  # a `specmesh emulate`'s board, or not
    with pytest.raises(FlashError) as e:
        flash(vb.port, "drafter", model, key=key, progress=False)
    assert str(e.value) == (
        "%s: the board was left half-flashed by an interrupted flash and holds a deployment key, so its console takes "
        "no Ctrl-C and no flash can finish it: %s, then specmesh flash --port %s --role drafter --key-file F"
        % (vb.port, erase, vb.port))


def test_a_runs_keyed_virtual_board_left_half_flashed_is_told_to_remove_its_flash_folder(models, tmp_path):
    """The same on a run's own virtual board (`specmesh run --key-file` stopped while it flashed the model): the
    run's line names its flash folder, a build folder, to remove; no esptool or emulate serves it."""
    import json

    from specmesh.host.backends import BackendError

    key = bytes(range(32))
    with Cluster("serial", models, tmp_path, key=key) as c:
        c.start("drafter")
    cfg = tmp_path / "drafter" / "specmesh.json"  # what a run stopped once the modules were in place leaves
    cfg.write_text(json.dumps(dict(json.loads(cfg.read_text()), flashing="drafter")))
    with pytest.raises(BackendError) as e, Cluster("serial", models, tmp_path, key=key) as c:
        c.start("drafter")
    assert str(e.value).startswith("virtual drafter board: /dev/") and str(e.value).endswith(
        ": the board was left half-flashed by an interrupted flash and holds a deployment key, so its console takes "
        "no Ctrl-C and no flash can finish it: remove its flash folder %s and run again" % (tmp_path / "drafter"))

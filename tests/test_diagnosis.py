"""Diagnose, don't guess: `specmesh run` on a board's port tells a key mismatch (each way round), a board left
half-flashed, a board that answers but is no specmesh node, and a port where nothing answers apart, each in
one line that says what to do, at once where the board answers: told by its answer, not by a timer run out (the
tests that say so raise every timer the first HELLO could wait out to WAIT_S, `_patient`, so that waiting one out is
unmistakable however loaded the machine is)."""

import contextlib
import json
import os
import re
import shutil
import time
import tty

import pytest

from specmesh.host.layout import DRAFTER_FILE, TARGET_FILE
from specmesh.host import cli
from specmesh.host.bus.links import SerialLink
from specmesh.host.bus.proxy import Bus
from specmesh.host.backends import BackendError
from specmesh.host.provision import cluster
from specmesh.host.provision.cluster import discover
from specmesh.host.provision.keys import new_key_file
from specmesh.shared.messages import HALF_FLASHED
from specmesh.shared.modelfile import HEADER_SIZE, parse_header
from specmesh.tools.testmodels import random_model
from tests.test_engine_modelio import END, FIELDS, flip

from emulator_util import follow_flash_commands, open_port, read_until


WAIT_S = 60.0  # `_patient`'s timers: a run that waited one out took this long, one told at once a few seconds


@contextlib.contextmanager
def _patient():
    """Every timer a run's first HELLO could wait out raised to WAIT_S: its wait (cluster.FIRST_HELLO_S, 2 s, then
    discover's own after a soft reset, 10 s) and its resending (the bus's initial_rto, 3 s, after which a call finds
    its link's error). A run that took less than WAIT_S was told by the board's answer: `took < 2.0` asserted that
    too, and a loaded machine's run took 6 s."""
    real_discover, real_open = cluster.discover, cluster._open

    def _open(*args, **kwargs):
        bus = real_open(*args, **kwargs)
        bus.initial_rto = WAIT_S
        return bus

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cluster, "FIRST_HELLO_S", WAIT_S)
        mp.setattr(cluster, "discover", lambda bus, deadline=WAIT_S, role="drafter|verifier": real_discover(
            bus, deadline, role))
        mp.setattr(cluster, "_open", _open)
        yield


def _run(models, port, *extra, patient=False):
    """`specmesh run` with the board on `port` as the drafter: (its exit status, the seconds it took); `patient`: with
    the first HELLO's timers raised (_patient)."""
    t0 = time.monotonic()
    with _patient() if patient else contextlib.nullcontext():
        rc = cli.main(["run", "--models", str(models), "--drafter", port, "--verifier", "cpu", "--quiet",
                       "--max-tokens", "4", *extra])
    return rc, time.monotonic() - t0


def _keyed_drafter(virtual_board, models, tmp_path, capsys):
    """A virtual drafter board flashed with key A: (board, its flash command, key A's file, another key B's file)."""
    key_a, key_b = tmp_path / "a.key", tmp_path / "b.key"
    new_key_file(key_a)
    new_key_file(key_b)
    vb = virtual_board()
    flash = ["flash", "--port", vb.port, "--role", "drafter", "--model", str(models / DRAFTER_FILE)]
    assert cli.main([*flash, "--key-file", str(key_a)]) == 0
    capsys.readouterr()
    return vb, flash, key_a, key_b


def test_a_key_mismatch_is_named_at_once_each_way_round(virtual_board, models, tmp_path, capsys):
    vb, flash, key_a, key_b = _keyed_drafter(virtual_board, models, tmp_path, capsys)
    for extra, why in ((["--key-file", str(key_b)], "the board signs with another deployment key than this run's"),
                       ([], "the board signs its frames: it holds a deployment key, and this run has none")):
        rc, took = _run(models, vb.port, *extra, patient=True)
        err = capsys.readouterr().err
        assert rc == 2 and took < WAIT_S, (rc, took, err)
        assert err.count("\n") == 1 and "key mismatch" in err and why in err
        assert key_a.read_text().strip() not in err and key_b.read_text().strip() not in err  # never the key
        time.sleep(0.3)  # a node answers one refusal per 250 ms
    assert cli.main([*flash, "--key-file", str(key_a), "--no-key"]) == 0  # a keyed node is ended by its key only
    capsys.readouterr()
    rc, took = _run(models, vb.port, "--key-file", str(key_a), patient=True)
    err = capsys.readouterr().err
    assert rc == 2 and took < WAIT_S and "the board holds no deployment key, and this run signs with --key-file" in err
    rc, _ = _run(models, vb.port)  # and with the keys agreeing it runs
    assert rc == 0, capsys.readouterr().err


def test_another_keys_mismatch_names_the_two_flashes_that_change_the_key(virtual_board, models, tmp_path, capsys):
    """A board keyed with A, run with key B: the line said to flash B onto it (`specmesh flash ... --key-file FILE`),
    which a board keyed with A refuses (it takes no flash without A); it names the flash that removes A with A, then
    the one that gives it B, and those two, followed, make the run with B go through."""
    vb, flash, key_a, key_b = _keyed_drafter(virtual_board, models, tmp_path, capsys)
    rc, _ = _run(models, vb.port, "--key-file", str(key_b))
    err = capsys.readouterr().err
    base = "specmesh flash --port %s --role drafter" % vb.port
    assert rc == 2 and re.findall(r"`(specmesh flash [^`]*)`", err) == [
        base + " --key-file ITS_KEY --no-key", base + " --key-file FILE"], err
    time.sleep(0.3)  # a node answers one refusal per 250 ms
    assert cli.main([*flash, "--key-file", str(key_b)]) == 2  # B alone is refused: the old line's advice
    capsys.readouterr()
    for key, command in ((key_a, base + " --key-file ITS_KEY --no-key"), (key_b, base + " --key-file FILE")):
        argv = command.replace("ITS_KEY", str(key)).replace("FILE", str(key)).split()[1:]
        assert cli.main([*argv, "--model", str(models / DRAFTER_FILE)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    rc, _ = _run(models, vb.port, "--key-file", str(key_b))
    assert rc == 0, capsys.readouterr().err


def test_a_keyed_node_up_again_after_the_flash_ended_it_is_ended_again(virtual_board, models, tmp_path, capsys,
                                                                          monkeypatch):
    """Two flashes of a keyed board at once: the second waits for the port, and gets it as the first resets the board
    into its node, which starts after the second's signed RESET went unanswered; the node then took no Ctrl-C, and the
    flash said "the virtual board did not answer with its REPL (its VM is stuck ...): restart specmesh emulate". The
    node that answers the flash's key is ended again, and the flash goes through (here: the first RESET lost)."""
    from specmesh.host.provision import flash as flash_module

    vb, flash, key_a, _ = _keyed_drafter(virtual_board, models, tmp_path, capsys)
    real, ends = flash_module.leave_node, []

    def first_lost(*args, **kwargs):
        ends.append(args[0])
        if len(ends) > 1:
            real(*args, **kwargs)

    monkeypatch.setattr(flash_module, "leave_node", first_lost)
    assert cli.main([*flash, "--key-file", str(key_a)]) == 0, capsys.readouterr().err
    assert ends == [vb.port, vb.port]
    rc, _ = _run(models, vb.port, "--key-file", str(key_a))
    assert rc == 0, capsys.readouterr().err


def test_a_key_mismatch_names_the_role_the_board_is_wanted_for(virtual_board, models, tmp_path, capsys):
    """The flash command a key mismatch gives named the role as the literal ROLE ('specmesh flash --port P --role ROLE
    --key-file ITS_KEY --no-key'), though run (--drafter PORT) and flash (--role drafter) knew it: now they name it."""
    vb, flash, key_a, key_b = _keyed_drafter(virtual_board, models, tmp_path, capsys)
    fix = "`specmesh flash --port %s --role drafter --key-file ITS_KEY --no-key`" % vb.port
    rc, _ = _run(models, vb.port)
    err = capsys.readouterr().err
    assert rc == 2 and fix in err and "ROLE" not in err, err
    time.sleep(0.3)  # a node answers one refusal per 250 ms
    assert cli.main([*flash, "--key-file", str(key_b)]) == 2
    err = capsys.readouterr().err
    assert fix in err and "ROLE" not in err, err


def test_a_flash_with_another_key_than_the_boards_is_told_so(virtual_board, models, tmp_path, capsys):
    """flash --key-file B onto a board keyed with A: it said 'this run has none' (the probe's HELLO went unsigned).
    A key file that cannot be used, nothing written: a usage error (2), as run's key mismatch is; it was 1, a flash
    failed while working (bench's the same)."""
    vb, flash, key_a, key_b = _keyed_drafter(virtual_board, models, tmp_path, capsys)
    assert cli.main([*flash, "--key-file", str(key_b)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the board holds another deployment key than this --key-file" in err, err
    assert err.endswith("; where its key is lost, erase its flash: esptool erase_flash, then write MicroPython "
                        "again)\n")
    assert key_a.read_text().strip() not in err and key_b.read_text().strip() not in err  # never the key
    # bench told a keyed board's owner to 'pass its key with --key-file', a flag it did not take
    bench = ["bench", "--port", vb.port, "--out", str(tmp_path / "cal.json")]
    assert cli.main(bench) == 2 and "key mismatch: the board signs its frames" in capsys.readouterr().err
    assert cli.main([*bench, "--key-file", str(key_a)]) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "cal.json").read_text())["board"]["port"] == vb.port
    rc, _ = _run(models, vb.port, "--key-file", str(key_a))  # its node started again after, with its key
    assert rc == 0, capsys.readouterr().err


def _reboot(vb) -> None:
    """Reboot a virtual board as its reset button does: Ctrl-C ends the node, Ctrl-D at the REPL resets; each waited
    for, up to its "soft reboot", not slept on (a loaded machine's board, given 0.5 s, was still booting when the run's
    HELLO came)."""
    with contextlib.closing(open_port(vb.port)) as ser:
        ser.write(b"\x03")
        read_until(ser, b">>> ", timeout=60)
        ser.write(b"\x04")
        read_until(ser, b"soft reboot", timeout=60)


def test_a_half_flashed_board_is_named_with_the_command_that_finishes_it(virtual_board, models, capsys):
    """The board is flashed with --no-reset and then reset by its REPL's Ctrl-D alone. Flashed with the reset and
    rebooted with `_reboot`, the run's first HELLO now and then went to the REPL (its SyntaxError, 60 s waited out): the
    flash's Ctrl-D reached the board after the flash returned (no longer: host/provision/flash.py reset_into_node waits
    for the boot it starts), so `_reboot` read the prompt that came before it as its
    Ctrl-C's and sent its Ctrl-D at once, while its Ctrl-C waited for the VM that reset started (host/emulator/board.py
    VirtualBoard._interrupt) and reached it only after it had said it was half-flashed (what `_reboot` waited for):
    config.repeat's readline, interrupted, took the Ctrl-D sent behind it, and the board stayed at its REPL."""
    vb = virtual_board()
    flash = ["flash", "--port", vb.port, "--role", "drafter", "--model", str(models / DRAFTER_FILE)]
    assert cli.main([*flash, "--no-reset"]) == 0  # left at its REPL, in the VM that flashed it: no reset in flight
    # what an interrupted flash leaves: the config written first says "flashing" (host/provision/flash.py)
    cfg_path = vb.flash_dir / "specmesh.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps(dict(cfg, flashing="drafter")))
    with contextlib.closing(open_port(vb.port)) as ser:
        ser.write(b"\x04")  # Ctrl-D at that REPL: a soft reset, read after the flash's last bytes, in order
        read_until(ser, HALF_FLASHED.encode(), timeout=60)  # said at boot, then for every line it receives
    capsys.readouterr()
    rc, took = _run(models, vb.port, patient=True)
    err = capsys.readouterr().err
    assert rc == 2 and took < WAIT_S and err.count("\n") == 1, (rc, took, err)
    assert "left half-flashed" in err and "specmesh flash --port %s --role drafter" % vb.port in err
    assert cli.main(flash) == 0
    assert "left half-flashed (an interrupted flash as drafter): now complete" in capsys.readouterr().out
    assert "flashing" not in json.loads(cfg_path.read_text())
    assert _run(models, vb.port)[0] == 0


def test_an_unflashed_board_is_told_to_be_flashed_for_its_role(virtual_board, models, capsys):
    """A bare MicroPython (no specmesh firmware) given as --drafter: one line saying so with the command for that
    role; it quoted the REPL's 'SyntaxError: invalid syntax' (the HELLO frames read as Python) as what it printed."""
    vb = virtual_board()
    rc, _ = _run(models, vb.port)
    assert (rc, capsys.readouterr().err) == (2, "specmesh run: error: the board on %s has no specmesh firmware "
                                             "(a soft reset leaves it at MicroPython's REPL): run `specmesh flash "
                                             "--port %s --role drafter --model %s`\n" % (vb.port, vb.port,
                                                                                         models / DRAFTER_FILE))
    (vb.flash_dir / "main.py").write_text("raise ValueError('boom')\n")  # a program of its own, failing at boot
    with contextlib.closing(SerialLink(vb.port)) as link, pytest.raises(BackendError) as e:
        discover(Bus(link), deadline=1.0)
    assert "no specmesh firmware" not in str(e.value) and "answers, but not as a specmesh node" in str(e.value)


def test_a_drafter_board_given_as_the_verifier_is_told_the_ports_may_be_swapped(virtual_board, models, capsys):
    """The two boards' ports given in the wrong order: the line says to swap them before it says to reflash (which,
    on a classic ESP32 drafter, cannot hold the target, and on an S3 overwrites a good drafter)."""
    vb = virtual_board()
    assert cli.main(["flash", "--port", vb.port, "--role", "drafter", "--model", str(models / DRAFTER_FILE)]) == 0
    capsys.readouterr()
    rc = cli.main(["run", "--models", str(models), "--drafter", "cpu", "--verifier", vb.port, "--quiet", "-n", "4"])
    assert (rc, capsys.readouterr().err) == (2, "specmesh run: error: %s is flashed as a drafter, not a verifier; if "
                                             "the ports are swapped, give it as --drafter %s, else flash it: `specmesh "
                                             "flash --port %s --role verifier --model %s`\n" % (
                                                 vb.port, vb.port, vb.port, models / TARGET_FILE))


def test_a_verifier_board_running_another_build_of_the_target_is_refused_before_any_text(virtual_board, models,
                                                                                         tmp_path, capsys):
    """A verifier flashed from another build of target.spm (the same name, other weights): its HELLO's model crc is
    not that of the --models file, whose model the run's cpu fail-over and copied drafts would run (a fail-over
    would change the text's model half-way). One line naming the board, both builds and the flash command, before
    any text; with the folder it was flashed from as --models it runs."""
    other = tmp_path / "other"
    other.mkdir()
    for name in ("tokenizer.bin", DRAFTER_FILE):
        shutil.copy(models / name, other / name)
    crc = {other: random_model(other / TARGET_FILE, dim=32, n_layers=2, hidden=64, vocab=512, max_seq=128,
                               seed=99).crc,
           models: parse_header((models / TARGET_FILE).read_bytes()[:HEADER_SIZE]).crc}
    assert crc[models] != crc[other]
    vb = virtual_board("esp32s3")
    assert cli.main(["flash", "--port", vb.port, "--role", "verifier", "--model", str(other / TARGET_FILE)]) == 0
    capsys.readouterr()
    run = ["run", "--drafter", "cpu", "--verifier", vb.port, "--quiet", "-n", "4"]
    assert cli.main([*run, "--models", str(models)]) == 2
    path = models / TARGET_FILE
    assert capsys.readouterr() == ("", "specmesh run: error: the verifier on %s runs another build of target.spm (crc32 "
                                   "%08x, not the %08x of %s, which this run fails over to and copies drafts "
                                   "from): flash it with this run's file (`specmesh flash --port %s --role verifier "
                                   "--model %s`) or give this run the file it was flashed from (its folder as "
                                   "--models)\n" % (vb.port, crc[other], crc[models], path, vb.port, path))
    assert cli.main([*run, "--models", str(other)]) == 0


def test_drafter_and_verifier_boards_running_other_builds_are_named_in_one_line(virtual_board, models, tmp_path,
                                                                                capsys):
    """Both boards flashed from one --models folder, the run given another whose target and drafter are other builds:
    the line named the verifier only, and the drafter once the verifier was flashed again (a second failed run). One
    line now names both, each with its flash command; the commands it gives make the run go through."""
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(models / "tokenizer.bin", other / "tokenizer.bin")
    random_model(other / TARGET_FILE, dim=32, n_layers=2, hidden=64, vocab=512, max_seq=128, seed=98)
    random_model(other / DRAFTER_FILE, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden=32, vocab=512, max_seq=128,
                 seed=97)
    vb, vd = virtual_board("esp32s3"), virtual_board("esp32s3")
    for board, role, name in ((vb, "verifier", TARGET_FILE), (vd, "drafter", DRAFTER_FILE)):
        assert cli.main(["flash", "--port", board.port, "--role", role, "--model", str(models / name)]) == 0
    capsys.readouterr()
    run = ["run", "--models", str(other), "--drafter", vd.port, "--verifier", vb.port, "--quiet", "-n", "4"]
    assert cli.main(run) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, (out, err)
    assert "error: the verifier on %s runs another build of target.spm" % vb.port in err
    assert "; the drafter on %s runs another build of drafter.spm" % vd.port in err
    follow_flash_commands(err, ["specmesh flash --port %s --role %s --model %s" % (board.port, role, other / name)
                                for board, role, name in ((vb, "verifier", TARGET_FILE), (vd, "drafter", DRAFTER_FILE))],
                          run, capsys)


def test_a_drafter_board_of_another_vocabulary_is_told_the_flash_command_that_fixes_it(virtual_board, models,
                                                                                       tmp_path, capsys):
    """A drafter board flashed with a drafter of another tokenizer: the line said to give the run one with
    --draft-model, which changes the host's file, not what the board runs (the next run said the same). It names the
    flash command that puts the run's drafter (checked against the target) on the board, which makes the run go."""
    mine = tmp_path / "mine.spm"
    random_model(mine, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden=32, vocab=256, max_seq=128, seed=5)
    vd = virtual_board("esp32s3")
    assert cli.main(["flash", "--port", vd.port, "--role", "drafter", "--model", str(mine)]) == 0
    capsys.readouterr()
    run = ["run", "--models", str(models), "--drafter", vd.port, "--verifier", "cpu", "--quiet", "-n", "4"]
    assert cli.main(run) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, (out, err)
    assert "the drafter on %s (mine.spm) has a vocabulary of 256 tokens, the target's has 512" % vd.port in err
    command = "specmesh flash --port %s --role drafter --model %s" % (vd.port, models / DRAFTER_FILE)
    assert err.endswith(": flash it with this run's drafter, made with the target's tokenizer (`%s`), or --plain\n"
                        % command), err
    assert cli.main(command.split()[1:]) == 0
    capsys.readouterr()
    assert cli.main(run) == 0, capsys.readouterr().err


def test_a_keyed_board_running_another_build_is_told_the_flash_command_with_the_key_file(virtual_board, models,
                                                                                         tmp_path, capsys):
    """A keyed run (--key-file) on a keyed board flashed from another build: the flash command named had no
    --key-file, and a keyed board takes no flash without its key (that command failed). It now has it."""
    key = tmp_path / "k.key"
    new_key_file(key)
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(models / "tokenizer.bin", other / "tokenizer.bin")
    shutil.copy(models / DRAFTER_FILE, other / DRAFTER_FILE)
    random_model(other / TARGET_FILE, dim=32, n_layers=2, hidden=64, vocab=512, max_seq=128, seed=98)
    vb = virtual_board("esp32s3")
    assert cli.main(["flash", "--port", vb.port, "--role", "verifier", "--model", str(models / TARGET_FILE),
                     "--key-file", str(key)]) == 0
    capsys.readouterr()
    run = ["run", "--models", str(other), "--drafter", "cpu", "--verifier", vb.port, "--key-file", str(key), "--quiet",
           "-n", "4"]
    assert cli.main(run) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, (out, err)
    [command] = re.findall(r"`(specmesh flash [^`]*)`", err)
    assert command == "specmesh flash --port %s --role verifier --key-file FILE --model %s" % (vb.port,
                                                                                               other / TARGET_FILE)
    assert cli.main(command.replace("FILE", str(key), 1).split()[1:]) == 0
    capsys.readouterr()
    assert cli.main(run) == 0, capsys.readouterr().err


@pytest.mark.parametrize("role, flag", [("drafter", "--draft-model"), ("verifier", "--model")])
def test_a_board_flashed_with_a_file_of_another_name_is_told_the_flag_that_gives_the_run_it(role, flag, virtual_board,
                                                                                          models, tmp_path, capsys):
    """`specmesh flash --model mine.spm`, then `specmesh run` on a --models folder: the line said to give the run the
    file the board was flashed from as "its folder as --models", where the run reads that role's own name
    (drafter.spm, target.spm), not mine.spm: following it failed on that folder. It now names the flag that gives
    the run that file, and the run given it goes through."""
    mine = tmp_path / "mine.spm"
    if role == "drafter":
        random_model(mine, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden=32, vocab=512, max_seq=128, seed=5)
    else:
        random_model(mine, dim=32, n_layers=2, hidden=64, vocab=512, max_seq=128, seed=5)
    vb = virtual_board("esp32s3")
    assert cli.main(["flash", "--port", vb.port, "--role", role, "--model", str(mine)]) == 0
    capsys.readouterr()
    ports = {"drafter": "cpu", "verifier": "cpu", role: vb.port}
    run = ["run", "--models", str(models), "--drafter", ports["drafter"], "--verifier", ports["verifier"], "--quiet",
           "-n", "4", "--temperature", "0"]
    assert cli.main(run) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, (out, err)
    assert "the %s on %s runs mine.spm, not %s" % (role, vb.port, DRAFTER_FILE if role == "drafter" else TARGET_FILE) \
        in err
    assert err.endswith("or give this run the file it was flashed from (%s FILE, FILE its mine.spm)\n" % flag), err
    assert cli.main([*run, flag, str(mine)]) == 0, capsys.readouterr().err


def test_a_flipped_top_bit_of_each_header_field_is_said_as_a_corrupt_file_on_a_board_and_on_the_host(
        virtual_board, models, tmp_path, capsys):
    """The drafter's file with one header field's top bit flipped, on a classic ESP32 board's flash (the node in its
    heap) and in the host's --models folder: `specmesh run` says so in one line, status 2. Past magic and version
    (each its own line), the line says the file is corrupt (the header's check or the CRC), never that the model does
    not fit: n_layers' flip (32,770 layers) was a MemoryError on the board, said as "does not fit"."""
    vb = virtual_board("esp32")
    # left at its REPL (--no-reset), its prompt read by the flash: `_reboot`'s first Ctrl-C meets no reset and no
    # banner still in flight (the half-flashed test above)
    assert cli.main(["flash", "--port", vb.port, "--role", "drafter", "--model", str(models / DRAFTER_FILE),
                     "--no-reset"]) == 0
    on_board = vb.flash_dir / "models" / DRAFTER_FILE
    good = on_board.read_bytes()
    host = tmp_path / "host"
    shutil.copytree(models, host)
    said = {}
    for field in FIELDS:
        bad = flip(good, END[field] - 1, 0x80)
        on_board.write_bytes(bad)
        _reboot(vb)
        (host / DRAFTER_FILE).write_bytes(bad)
        for where, args in (("board", [str(models), vb.port]), ("host", [str(host), "cpu"])):
            capsys.readouterr()
            rc = cli.main(["run", "--models", args[0], "--drafter", args[1], "--verifier", "cpu", "--quiet", "-n",
                           "4"])
            out, err = capsys.readouterr()
            assert (rc, out, err.count("\n")) == (2, "", 1), (field, where, rc, out, err)
            assert "does not fit" not in err, (field, where, err)
            said[field, where] = err
    for field in FIELDS[2:]:
        assert "the file is corrupt" in said[field, "board"], (field, said[field, "board"])
        assert "fails its CRC check: the file is corrupt" in said[field, "host"], (field, said[field, "host"])
    assert "model header says %d tensor bytes, not its shape's: the file is corrupt" % (
        parse_header(good[:HEADER_SIZE]).body_len) in said["n_layers", "board"]
    for where in ("board", "host"):
        assert "not a specmesh model file" in said["magic", where]
    # "model" said once, and one thing to do: the board's copy flashed again (flash checks the host's file first, and
    # says to re-export it where that is what is wrong); it said "model 'x': model file version" and "the file is
    # corrupt, re-export it; flash it"
    flash = "flash it: `specmesh flash --port %s --role drafter --model %s`\n" % (vb.port, models / DRAFTER_FILE)
    assert said["version", "board"] == ("specmesh run: error: %s did not start as a drafter: cannot load model %r: "
                                        "version 32770 is not supported (this build reads 1 to 2); %s"
                                        % (vb.port, "models/" + DRAFTER_FILE, flash))
    assert said["version", "host"] == ("specmesh run: error: model file %s: version 32770 is not supported (this build "
                                       "reads 1 to 2), re-export it\n" % (host / DRAFTER_FILE))
    for field in FIELDS[2:]:
        board = said[field, "board"]
        assert board.endswith("; " + flash) and "re-export" not in board, (field, board)
    assert said["n_layers", "board"].endswith("not its shape's: the file is corrupt; " + flash)
    on_board.write_bytes(good)
    _reboot(vb)
    assert _run(models, vb.port)[0] == 0, capsys.readouterr().err


def test_silence_is_told_apart_from_an_answer_that_is_no_node(virtual_board):
    """A board at the MicroPython REPL (no node flashed) answers with text; a port where no one is there stays
    silent; another device sends bytes that are no frame."""
    vb = virtual_board()
    with contextlib.ExitStack() as stack:
        link = SerialLink(vb.port)
        stack.callback(link.close)
        with pytest.raises(BackendError, match="has no specmesh firmware .*: run `specmesh flash --port .* --role "
                                               "drafter\\|verifier`"):
            discover(Bus(link), deadline=1.0)
    for junk in (b"", b"\x00\xff\x13garbage\x80\n" * 4):
        main, other = os.openpty()
        tty.setraw(other)
        try:
            with contextlib.closing(SerialLink(os.ttyname(other))) as link:
                os.write(main, junk)
                with pytest.raises(BackendError) as e:
                    discover(Bus(link), deadline=1.0)
        finally:
            os.close(main)
            os.close(other)
        if junk:
            assert "bytes that are no specmesh frame" in str(e.value) and "another device" in str(e.value)
        else:
            assert "nothing came back within 1 s: is a board on this port, powered and running?" in str(e.value)


class _NoSession:
    """A request to a node that restarted: refused "no session" (error 2), as every one is here."""

    def result(self):
        from specmesh.host.bus.proxy import NodeError
        from specmesh.shared import messages as m

        raise NodeError(1, m.E_STATE, "no session")


VIRTUAL_ADVICE = ("to watch a board like it, start one with `specmesh emulate`, flash it as a drafter (`specmesh flash "
                  "--port PORT --role drafter`) and open `specmesh console PORT`")


@pytest.mark.parametrize("name, said, line", [
    ("/dev/ttyUSB0", [], "/dev/ttyUSB0 keeps losing its session: check its console (mpremote connect /dev/ttyUSB0)"),
    # the run's own virtual board was told "mpremote connect virtual:drafter(esp32)", no port mpremote knows
    ("virtual:drafter(esp32)", ["MPY: soft reboot", "MemoryError: memory allocation failed", " "],
     "virtual:drafter(esp32) keeps losing its session: its VM restarts (its console's last line: 'MemoryError: memory "
     "allocation failed'); " + VIRTUAL_ADVICE),
    ("virtual:drafter(esp32)", [], "virtual:drafter(esp32) keeps losing its session: its VM restarts; " + VIRTUAL_ADVICE),
])
def test_a_board_that_keeps_losing_its_session_is_told_where_to_look(name, said, line):
    """A node that answers "no session" again right after it was begun again on the committed stream: one line
    that fits the board, a port's console for a port, what the run saw of a virtual board's console for one."""
    import collections
    from types import SimpleNamespace

    from specmesh.host.backends import SessionParams
    from specmesh.host.backends.board import BoardDrafter
    from specmesh.shared import messages as m

    board = BoardDrafter.__new__(BoardDrafter)  # without its HELLO: every request of this proxy is refused
    link = SimpleNamespace(text=collections.deque(said))
    board.proxy = SimpleNamespace(node=1, bus=SimpleNamespace(peer=1, link=link), start=lambda *_: _NoSession())
    board.name, board.params, board.resyncs = name, SessionParams(), 0
    board.known, board.held, board._pending, board._begun, board._unbegun = [5], [5], None, None, None
    with pytest.raises(BackendError) as e:
        board._call(m.STATS)
    assert str(e.value) == line and board.resyncs == 1

"""A board flashed from other files than this specmesh's: flashed, then specmesh updated (a `git pull` that changed
firmware/ or shared/, maybe the wire format), then run against the board still running the old node.

`specmesh flash` stamps the id of the files it flashes into the node's FW_VERSION, which its HELLO reports as fw
(host/provision/flash.py firmware_id); `specmesh run` compares it with this checkout's before it makes the board's
back-end (host/provision/cluster.py check_firmware), and `specmesh bench` the board's node.mpy with the one this
checkout flashes (boardbench.py). A board flashed from other files, or before the id existed ("specmesh-node 0.1"), is
one line naming its port and the flash command, before any text; several such boards (drafter and verifier, a
pipeline's stages) are named in that one line, each with its command. The boards here are virtual ones behind ptys,
flashed as `specmesh flash` flashes a real one, from a modified copy of this checkout's node, or with its node.py
compiled as a specmesh before the id compiled it.
"""

import re
import shutil

import pytest

from specmesh.host import cli
from specmesh.host.backends import BackendError
from specmesh.host.backends.modelio import as_version_1
from specmesh.host.layout import DRAFTER_FILE, ROOT, TARGET_FILE
from specmesh.host.provision import cluster
from specmesh.host.mpycross import compile_py
from specmesh.host.provision.flash import FW_LINE, FlashError, build, firmware_id, flash, node_sources
from specmesh.shared import messages as m
from specmesh.tools.testmodels import random_model

from emulator_util import follow_flash_commands

# (file, text, what replaces it): a node like this checkout's but for one change; None: this checkout's node with
# node.py compiled unstamped, as a specmesh flashed it before the id ("specmesh-node 0.1"; it ran, and nothing said
# that the board ran other files than the host's)
STALE = {
    "flashed before the id": None,
    # another wire format: VERDICT's fields the other way round (the run began its text, then ended "verifier PORT
    # returned an impossible verdict (176, 1) for 0 drafts")
    "another wire format": ("shared/messages.py", 'struct.pack("<Bh", n_accepted, token)',
                            'struct.pack("<hB", token, n_accepted)'),
    # a HELLO of another layout, one byte longer, which this host's unpack_hello refuses
    "another HELLO layout": ("shared/messages.py", "_str_bytes(kernels) + 15)", "_str_bytes(kernels) + 16)"),
}


def node_copy(root, change=None, native=False):
    """This checkout's firmware/ and shared/ copied under `root` (with firmware/native/ where `native`), `change`
    made; their (file, board path) as `flash` takes them."""
    skip = shutil.ignore_patterns("__pycache__", *(() if native else ("native",)))
    for folder in ("firmware", "shared"):
        shutil.copytree(ROOT / folder, root / folder, ignore=skip)
    if change is not None:
        path, old, new = change
        text = (root / path).read_text()
        assert old in text, "the node no longer holds %r: update STALE" % old
        (root / path).write_text(text.replace(old, new))
    return list(node_sources(root))


def flash_stale(vb, model, root, change, role="verifier", **options):
    """Flash board `vb` as `role` (`options`: flash's node_id, layers) with `model` and a node other than this
    checkout's (`change`, STALE's), left at its REPL as `flash --no-reset` leaves it (the next run or bench resets
    it)."""
    if change is not None:
        flash(vb.port, role, model, sources=node_copy(root, change), progress=False, reset=False, **options)
        return
    report = flash(vb.port, role, model, progress=False, reset=False, **options)
    compile_py(ROOT / "firmware" / "node.py", vb.flash_dir / "node.mpy", march=report.board.arch, source_name="node.py")


def run_argv(models, verifier, drafter="cpu"):
    return ["run", "--models", str(models), "--drafter", drafter, "--verifier", verifier, "-n", "8", "--temperature",
            "0", "--prompt", "Once upon a time"]


def refused_in_one_line(argv, capsys) -> str:
    """`specmesh run argv`'s stderr, once it has exited 2 with one line there and nothing on stdout."""
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, (out, err)
    return err


@pytest.mark.parametrize("change", STALE.values(), ids=list(STALE))
def test_a_board_flashed_from_other_files_is_told_to_flash_again_before_any_text(models, virtual_board, tmp_path,
                                                                                capsys, change):
    vb = virtual_board("esp32s3")
    flash_stale(vb, models / TARGET_FILE, tmp_path / "old", change)
    err = refused_in_one_line(run_argv(models, vb.port), capsys)
    assert "the verifier board on %s runs a node flashed from other files than this specmesh's" % vb.port in err
    # with the run's model file where a flash without --model would put the shipped one (the run after it then
    # refused the board as running another build of target.spm)
    command = "specmesh flash --port %s --role verifier --model %s" % (vb.port, models / TARGET_FILE)
    assert err.endswith("flash it again: `%s`\n" % command), err
    # the command it names makes the board this specmesh's: the run goes through
    assert cli.main(command.split()[1:]) == 0
    capsys.readouterr()
    assert cli.main(run_argv(models, vb.port)) == 0, capsys.readouterr().err


def test_every_stale_board_of_a_run_is_named_in_one_line(models, virtual_board, tmp_path, capsys):
    """Drafter and verifier boards both flashed from other files: the run named the verifier only, and the drafter
    once the verifier was flashed again (a second failed run). Both are named now, each with its flash command."""
    vb, vd = virtual_board("esp32s3"), virtual_board("esp32s3")
    flash_stale(vb, models / TARGET_FILE, tmp_path / "old", STALE["another HELLO layout"])
    flash_stale(vd, models / DRAFTER_FILE, tmp_path / "old2", STALE["flashed before the id"], "drafter")
    argv = run_argv(models, vb.port, vd.port)
    err = refused_in_one_line(argv, capsys)
    assert "the boards on %s (verifier), %s (drafter) run nodes flashed from other files" % (vb.port, vd.port) in err
    assert "(%s: its HELLO is not one this specmesh reads, %s says 'specmesh-node 0.1'; " % (vb.port, vd.port) in err
    follow_flash_commands(err, ["specmesh flash --port %s --role verifier --model %s" % (vb.port, models / TARGET_FILE),
                                "specmesh flash --port %s --role drafter --model %s" % (vd.port, models / DRAFTER_FILE)],
                          argv, capsys)  # they make the boards this specmesh's


def test_a_stale_drafter_beside_a_verifier_on_another_build_is_named_in_the_same_line(models, virtual_board, tmp_path,
                                                                                      capsys):
    """The verifier's board runs another build of the run's target, the drafter's a node flashed from other files: the
    line named the verifier alone (the drafter was then connected), and the drafter only once the verifier was
    flashed again. Both are in the one line now, each with its flash command."""
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(models / "tokenizer.bin", other / "tokenizer.bin")
    shutil.copy(models / DRAFTER_FILE, other / DRAFTER_FILE)
    random_model(other / TARGET_FILE, dim=32, n_layers=2, hidden=64, vocab=512, max_seq=128, seed=98)
    vb, vd = virtual_board("esp32s3"), virtual_board("esp32s3")
    flash(vb.port, "verifier", models / TARGET_FILE, progress=False)
    flash_stale(vd, models / DRAFTER_FILE, tmp_path / "old", STALE["flashed before the id"], "drafter")
    argv = run_argv(other, vb.port, vd.port)
    err = refused_in_one_line(argv, capsys)
    assert "error: the drafter board on %s runs a node flashed from other files" % vd.port in err  # stale ones first
    assert "; the verifier on %s runs another build of target.spm" % vb.port in err
    assert re.findall(r"`(specmesh flash [^`]*)`", err) == [
        "specmesh flash --port %s --role drafter --model %s" % (vd.port, other / DRAFTER_FILE),
        "specmesh flash --port %s --role verifier --model %s" % (vb.port, other / TARGET_FILE)], err


def test_a_drafter_on_another_build_beside_a_stale_verifier_is_named_in_the_same_line(models, virtual_board, tmp_path,
                                                                                      capsys):
    """The verifier's board flashed from other files, the drafter's from another build of the run's drafter: the line
    named the verifier alone (the drafter's build went unchecked), and the drafter only once the verifier was flashed
    again. Both are in the one line now; the commands it names make the run go through."""
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(models / "tokenizer.bin", other / "tokenizer.bin")
    shutil.copy(models / TARGET_FILE, other / TARGET_FILE)
    random_model(other / DRAFTER_FILE, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden=32, vocab=512, max_seq=128,
                 seed=97)
    vb, vd = virtual_board("esp32s3"), virtual_board("esp32s3")
    flash_stale(vb, models / TARGET_FILE, tmp_path / "old", STALE["another wire format"])
    flash(vd.port, "drafter", models / DRAFTER_FILE, progress=False)
    argv = run_argv(other, vb.port, vd.port)
    err = refused_in_one_line(argv, capsys)
    assert "error: the verifier board on %s runs a node flashed from other files" % vb.port in err
    assert "; the drafter on %s runs another build of drafter.spm" % vd.port in err
    follow_flash_commands(err, ["specmesh flash --port %s --role %s --model %s" % (board.port, role, other / name)
                                for board, role, name in ((vb, "verifier", TARGET_FILE), (vd, "drafter", DRAFTER_FILE))],
                          argv, capsys)


def test_every_stale_stage_board_is_named_with_its_layers_and_node_id(models, virtual_board, tmp_path, capsys):
    """`--verifier P1,P2` on stage boards both flashed from other files: each is named, its command with its layers
    and, where it is not the default (10), its node id: flashed again without it, stage 2 became node 10."""
    boards = [virtual_board("esp32") for _ in range(2)]
    for i, vb in enumerate(boards):
        flash_stale(vb, models / TARGET_FILE, tmp_path / ("old%d" % i), STALE["another wire format"], "stage",
                    node_id=10 + i, layers=(i, i + 1))
    argv = run_argv(models, ",".join(vb.port for vb in boards))
    err = refused_in_one_line(argv, capsys)
    assert "the boards on %s (stage), %s (stage) run nodes" % (boards[0].port, boards[1].port) in err
    assert ("flash each again: `specmesh flash --port %s --role stage --layers 0:1 --model %s`; `specmesh flash --port %s "
            "--role stage --layers 1:2 --node-id 11 --model %s`\n" % (boards[0].port, models / TARGET_FILE,
                                                                     boards[1].port, models / TARGET_FILE)) in err


def test_a_stale_stage_board_is_named_beside_another_stages_other_failure(models, virtual_board, tmp_path, capsys):
    """`--verifier P1,P2`: stage 1's board flashed from other files, stage 2's port a board without the node (no
    answer). The line named stage 2's failure alone: flashed, the run then stopped on stage 1. Both are in the one
    line now, the stale one first, each with its flash command."""
    stale, bare = virtual_board("esp32"), virtual_board("esp32")
    flash_stale(stale, models / TARGET_FILE, tmp_path / "old", STALE["another wire format"], "stage", layers=(0, 1))
    argv = run_argv(models, "%s,%s" % (stale.port, bare.port))
    err = refused_in_one_line(argv, capsys)
    assert "error: the stage board on %s runs a node flashed from other files" % stale.port in err
    assert "; the board on %s has no specmesh firmware" % bare.port in err
    follow_flash_commands(err, ["specmesh flash --port %s --role stage --layers %s --model %s" % (
        port, layers, models / TARGET_FILE) for port, layers in ((stale.port, "0:1"), (bare.port, "1:2 --node-id 11"))],
        argv, capsys)  # they make the pipeline go


def test_a_stale_drafter_is_named_beside_its_pipelines_failures_in_the_same_line(models, virtual_board, tmp_path,
                                                                                 capsys):
    """`--verifier P1,P2` failing (stage 1's board flashed from other files, stage 2's port a board without the node)
    beside a drafter board flashed from other files: the line was the pipeline's alone, the drafter named only once
    the stages were flashed. All three are in the one line now, the stale ones first, each with its flash command."""
    stale, bare, vd = virtual_board("esp32"), virtual_board("esp32"), virtual_board("esp32s3")
    flash_stale(stale, models / TARGET_FILE, tmp_path / "old", STALE["another wire format"], "stage", layers=(0, 1))
    flash_stale(vd, models / DRAFTER_FILE, tmp_path / "old2", STALE["flashed before the id"], "drafter")
    argv = run_argv(models, "%s,%s" % (stale.port, bare.port), vd.port)
    err = refused_in_one_line(argv, capsys)
    assert "error: the boards on %s (stage), %s (drafter) run nodes flashed from other files" % (stale.port, vd.port) \
        in err
    assert "; the board on %s has no specmesh firmware" % bare.port in err
    follow_flash_commands(err, ["specmesh flash --port %s --role stage --layers 0:1 --model %s" % (stale.port,
                                                                                                  models / TARGET_FILE),
                                "specmesh flash --port %s --role drafter --model %s" % (vd.port, models / DRAFTER_FILE),
                                "specmesh flash --port %s --role stage --layers 1:2 --node-id 11 --model %s" % (
                                    bare.port, models / TARGET_FILE)],
                          argv, capsys)  # they make the run go


def test_a_stale_drafter_is_named_beside_its_single_verifier_boards_failure_in_the_same_line(models, virtual_board,
                                                                                           tmp_path, capsys):
    """The pipeline's case (above) with one verifier board: its port a board without the node, beside a drafter board
    flashed from other files. The line was the verifier's alone, the drafter named only once the verifier was flashed
    (a second failed run). Both are in the one line now, the stale one first, as a pipeline's failures are."""
    bare, vd = virtual_board("esp32s3"), virtual_board("esp32s3")
    flash_stale(vd, models / DRAFTER_FILE, tmp_path / "old", STALE["flashed before the id"], "drafter")
    argv = run_argv(models, bare.port, vd.port)
    err = refused_in_one_line(argv, capsys)
    assert "error: the drafter board on %s runs a node flashed from other files" % vd.port in err
    assert "; the board on %s has no specmesh firmware" % bare.port in err
    follow_flash_commands(err, ["specmesh flash --port %s --role drafter --model %s" % (vd.port, models / DRAFTER_FILE),
                                "specmesh flash --port %s --role verifier --model %s" % (bare.port,
                                                                                        models / TARGET_FILE)],
                          argv, capsys)  # they make the run go


def test_auto_skips_a_board_whose_hello_it_cannot_read_and_says_why(models, virtual_board, tmp_path, capsys,
                                                                    monkeypatch):
    """`--verifier auto` asks each ESP32 USB port's board for its role: a HELLO of another layout ended the run with
    unpack_hello's "payload has 1 trailing bytes", naming no board; it is now a board to flash again, named in the
    line."""
    from specmesh.host.bus import ports

    vb = virtual_board("esp32s3")
    flash(vb.port, "verifier", models / TARGET_FILE, sources=node_copy(tmp_path / "old", STALE["another HELLO layout"]),
          progress=False)
    monkeypatch.setattr(ports, "esp_ports", lambda: [(vb.port, "virtual")])
    assert cli.main(run_argv(models, "auto")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "%s runs a node whose HELLO this specmesh cannot read: flash it again" % vb.port in err


def test_the_id_changes_with_any_flashed_file_and_only_with_them(tmp_path):
    """The id is of what a flash copies: this checkout's node, firmware/ and shared/, and its native modules. It takes
    the place of node.py's FW_VERSION value, whose length it has (the node's heap stays what the budget tests
    measure)."""
    assert (ROOT / "firmware" / "node.py").read_text().count(FW_LINE) == 1
    assert len(firmware_id()) == len(FW_LINE.split('"')[1])
    assert firmware_id(root=tmp_path) != firmware_id()
    node_copy(tmp_path / "same", native=True)
    assert firmware_id(root=tmp_path / "same") == firmware_id()
    (tmp_path / "same" / "models").mkdir()  # not flashed with the node: not in its id
    (tmp_path / "same" / "models" / "notes.txt").write_text("x")
    assert firmware_id(root=tmp_path / "same") == firmware_id()
    node_copy(tmp_path / "comment", ("firmware/roles.py", '"""', '"""A comment. '), native=True)
    assert firmware_id(root=tmp_path / "comment") != firmware_id()
    node_copy(tmp_path / "native", native=True)
    (tmp_path / "native" / "firmware" / "native" / "x64.mpy").write_bytes(b"M\x06")
    assert firmware_id(root=tmp_path / "native") != firmware_id()


def test_a_node_py_without_the_line_the_id_is_stamped_in_is_refused_by_flash(tmp_path):
    """A node.py whose FW_VERSION line is not FW_LINE would be flashed unstamped, and every run would then refuse the
    board it flashed: flash says so instead, before any board is touched."""
    (tmp_path / "node.py").write_text('FW_VERSION = "specmesh-node 0.2"\n')
    with pytest.raises(FlashError, match="node.py has no line 'FW_VERSION = \"specmesh-node 0.1\"'"):
        build("x64", tmp_path / "out", iter([(tmp_path / "node.py", "/node.py")]))


def _hello(fw):
    return m.pack_hello(fw, "esp32", m.ROLE_STAGE, "models/target.spm", 512, 128, 9, 1, 1, "viper", 0)


def test_a_stale_stage_or_keyed_board_is_told_the_flash_command_it_needs(tmp_path):
    """A stage's command keeps its layers (flash needs them); a keyed run's, the key file (a keyed board takes no
    flash without it); a run on other models, its file. This checkout's id passes."""
    cluster.check_firmware(_hello(firmware_id()), "p", "stage", "stage --layers 1:2")
    with pytest.raises(BackendError, match=r"the stage board on p .*\(it says 'specmesh-node 0.1', this specmesh's is "
                                           r"'specmesh-[0-9a-f]{8}'\).*`specmesh flash --port p --role stage "
                                           r"--layers 1:2 --key-file FILE`$"):
        cluster.check_firmware(_hello("specmesh-node 0.1"), "p", "stage", "stage --layers 1:2", key=b"k" * 32)
    with pytest.raises(BackendError, match=r"\(its HELLO is not one this specmesh reads\)"):
        cluster.check_firmware(_hello(firmware_id()) + b"\0", "p", "stage", "stage --layers 1:2")
    # the run's model file where a flash without --model would not put it; none where it would (the shipped target,
    # a drafter from the shipped folder: its board class's, or the one its HELLO names there)
    for model, said in ((ROOT / "models" / TARGET_FILE, "`specmesh flash --port p --role stage --layers 1:2`"),
                        (tmp_path / TARGET_FILE, "`specmesh flash --port p --role stage --layers 1:2 --model %s`"
                         % (tmp_path / TARGET_FILE))):
        with pytest.raises(BackendError, match=re.escape(said) + "$"):
            cluster.check_firmware(_hello("specmesh-node 0.1"), "p", "stage", "stage --layers 1:2", model=model)
    with pytest.raises(BackendError, match=r"--role drafter`$"):
        cluster.check_firmware(_hello("specmesh-node 0.1"), "p", "drafter", "drafter", model=ROOT / "models" / "x.spm")
    # a stage board given alone as the verifier (a pipeline of one stage) is told to stay a stage: --role verifier
    # would have made it a verifier, which a classic ESP32 cannot hold
    with pytest.raises(BackendError, match=r"the stage board on p .*`specmesh flash --port p --role stage --layers "
                                           r"0:N`$"):
        cluster.check_firmware(_hello("specmesh-node 0.1"), "p", "verifier", "verifier")
    with pytest.raises(BackendError, match=r"`specmesh flash --port p --role stage --layers 0:5`$"):  # the target's
        cluster.check_firmware(_hello("specmesh-node 0.1"), "p", "verifier", "verifier", model=ROOT / "models" / TARGET_FILE)


def test_bench_of_a_board_flashed_from_other_files_says_to_flash_it_again(virtual_board, tmp_path, capsys):
    """`specmesh bench` times the board's own engine and kernels with this specmesh's script: a node flashed from other
    files is told to be flashed again first, before the benchmark runs."""
    vb = virtual_board("esp32s3")
    flash_stale(vb, ROOT / "models" / TARGET_FILE, tmp_path / "old", STALE["flashed before the id"])
    rc = cli.main(["bench", "--port", vb.port, "--out", str(tmp_path / "c.json")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert "flash it again with `specmesh flash --port %s --role verifier`, then bench it" % vb.port in err
    assert not (tmp_path / "c.json").exists()


def test_bench_of_a_stale_stage_board_keeps_its_layers_and_node_id(virtual_board, tmp_path, capsys):
    """A stage board of a pipeline's later place (node id 11) flashed from other files: bench's command kept its layers
    but not its node id, so the board it flashed again became node 10."""
    vb = virtual_board("esp32s3")
    flash_stale(vb, ROOT / "models" / TARGET_FILE, tmp_path / "old", STALE["flashed before the id"], "stage",
                node_id=11, layers=(1, 2))
    rc = cli.main(["bench", "--port", vb.port, "--out", str(tmp_path / "c.json")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert "flash it again with `specmesh flash --port %s --role stage --layers 1:2 --node-id 11`, then bench it" % (
        vb.port) in err


def test_bench_of_a_stale_board_names_the_model_it_holds(models, virtual_board, tmp_path, capsys):
    """bench's command had no --model: flashed so, a board that held another model than the one a flash without
    --model puts there lost it (the bench then timed another). A shipped file of another name is named; a model of the
    user's, whose host file the host cannot know, is FILE with what it stands for. Flashed as told, the bench runs."""
    own, shipped = virtual_board("esp32s3"), virtual_board("esp32s3")
    flash_stale(own, models / TARGET_FILE, tmp_path / "old", STALE["flashed before the id"])
    other = ROOT / "models" / "drafter-esp32.spm"  # not the S3's default drafter (drafter.spm)
    flash_stale(shipped, other, tmp_path / "old2", STALE["flashed before the id"], "drafter")
    out = str(tmp_path / "c.json")
    assert cli.main(["bench", "--port", own.port, "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert ("flash it again with `specmesh flash --port %s --role verifier --model FILE` (FILE: the model file its "
            "models/target.spm was flashed from; without --model the flash puts this specmesh's shipped one there), "
            "then bench it" % own.port) in err
    assert cli.main(["bench", "--port", shipped.port, "--out", out]) == 2
    err = capsys.readouterr().err
    command = "specmesh flash --port %s --role drafter --model %s" % (shipped.port, other)
    assert "flash it again with `%s`, then bench it" % command in err
    assert cli.main(command.split()[1:]) == 0
    capsys.readouterr()
    assert cli.main(["bench", "--port", shipped.port, "--out", out]) == 0, capsys.readouterr().err
    # flashed before version 2: the board holds the version 1 file of a shipped model, which is that model
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / other.name).write_bytes(as_version_1(other.read_bytes()))
    flash_stale(shipped, tmp_path / "v1" / other.name, tmp_path / "old3", STALE["flashed before the id"], "drafter")
    assert cli.main(["bench", "--port", shipped.port, "--out", out]) == 2
    assert "flash it again with `%s`, then bench it" % command in capsys.readouterr().err

"""Real stage boards on serial ports (`specmesh run --verifier PORT1,PORT2,...`, host/provision/stageports.py).

A stage node reports its layers [a, b) in STATS (firmware/stage.py), which is how the host learns each board's place
in the pipeline. The user's workflow, on virtual boards behind ptys as `specmesh emulate` starts them: `specmesh flash
--role stage --layers A:B` on each, then `specmesh run --verifier PTY1,PTY2` gives plain decoding's greedy text; the
ports out of layer order, a board that is no stage, stages that do not tile the target and flags that do not go with
real stages are each one line.
"""

import json
import shutil

import pytest

from specmesh.host import cli
from specmesh.host.backends import BackendError
from specmesh.host.provision import stageports
from specmesh.shared import messages as m
from specmesh.tools.nodeproc import NodeProc, flash
from specmesh.tools.testmodels import random_model

RUN = ["--drafter", "cpu", "-n", "16", "--temperature", "0", "--prompt", "Once upon a time"]


def test_a_stage_node_reports_its_layers_in_stats(micropython, models, tmp_path):
    board = tmp_path / "board"
    board.mkdir()
    flash(board)
    node = NodeProc(micropython, board, {"role": "stage", "model": str(models / "target.spm"), "layers": [1, 2]},
                    flashed=True, env={"MICROPYPATH": ".frozen:" + str(board)})
    try:
        assert node.call(m.HELLO)[2] == m.ROLE_STAGE, node.text
        stats = dict(node.call(m.STATS)[0])
        assert (stats["layer_a"], stats["layer_b"]) == (1, 2)
    finally:
        node.close()


@pytest.fixture(scope="module")
def stage_vboards(models, tmp_path_factory):
    """Two virtual classic ESP32s flashed as `specmesh flash` flashes them: the 2-layer test target's stages 0:1 and
    1:2 (node ids 10, 11)."""
    from specmesh.host.emulator import VirtualBoard

    root = tmp_path_factory.mktemp("stageboards")
    boards = [VirtualBoard(root / ("vb%d" % i), "esp32", name="vb%d" % i) for i in range(2)]
    try:
        for i, vb in enumerate(boards):
            vb.start()
            assert cli.main(["flash", "--port", vb.port, "--role", "stage", "--layers", "%d:%d" % (i, i + 1),
                             "--model", str(models / "target.spm"), "--node-id", str(10 + i)]) == 0
        yield boards
    finally:
        for vb in boards:
            vb.stop()


@pytest.fixture(scope="module")
def stage_boards(stage_vboards):
    """The two stage boards' ports."""
    return [vb.port for vb in stage_vboards]


def run(models, tmp_path, *argv) -> tuple[int, dict | None]:
    path = tmp_path / "stats.json"
    path.unlink(missing_ok=True)
    rc = cli.main(["run", "--models", str(models), "--quiet", "--stats-json", str(path), *argv])
    return rc, json.loads(path.read_text()) if rc == 0 else None


def test_run_on_real_stage_boards_gives_plain_decodings_text(models, stage_boards, tmp_path, capsys):
    rc, want = run(models, tmp_path, "--plain", "--verifier", "cpu", *RUN[2:])
    assert rc == 0, capsys.readouterr().err
    rc, got = run(models, tmp_path, "--verifier", ",".join(stage_boards), *RUN)
    assert rc == 0, capsys.readouterr().err
    assert got["text"] == want["text"] and got["tokens"] == 16
    assert got["pipeline"]["layers"] == ["0:1", "1:2"]
    assert [b["role"] for b in got["boards"] if b["role"] == "stage"] == ["stage", "stage"]


def test_the_python_api_takes_the_same_stage_ports(models, stage_boards, tmp_path, capsys):
    """`Mesh(verifier="PTY1,PTY2")` (serve's and chat's mesh): the same text, and the stage boards' context as its."""
    from specmesh import Mesh

    rc, want = run(models, tmp_path, "--plain", "--verifier", "cpu", *RUN[2:])
    assert rc == 0, capsys.readouterr().err
    with Mesh(drafter="cpu", verifier=",".join(stage_boards), models=str(models)) as mesh:
        assert mesh.context == min(s.max_seq for s in mesh._lanes[0].verifier.stages)
        assert mesh.generate("Once upon a time", max_tokens=16).text == want["text"]


def generate_with_a_stage_stopped(mesh, vb):
    """A generation on `mesh`'s pipeline with the VM of its stage board `vb` stopped (as a board hung in a loop) and
    resumed after; the stages' reply deadline shortened from a real board's 30 s to 1 s for the test."""
    import os
    import signal

    for stage in mesh._lanes[0].verifier.stages:
        stage.proxy.bus.deadline = 1.0
    os.kill(vb.pid, signal.SIGSTOP)
    try:
        return mesh.generate("Once upon a time", max_tokens=16)
    finally:
        os.kill(vb.pid, signal.SIGCONT)


def test_a_stage_board_that_stalls_mid_run_is_not_asked_for_its_stats(models, stage_vboards, tmp_path, capsys):
    """A stage board that stopped answering (its VM stopped, as a board hung in a loop): the cpu verifier took over
    and kept the text, then the run's stats asked the silent board for its own, holding the finished run back by
    another reply deadline (30 s). Now its entry says it was not asked. The mesh's next generation (serve's next
    request, chat's next turn), on the cpu verifier, raised AttributeError pricing the pipeline's projection on it."""
    from specmesh import Mesh

    rc, want = run(models, tmp_path, "--plain", "--verifier", "cpu", *RUN[2:])
    assert rc == 0, capsys.readouterr().err
    warned: list[str] = []
    with Mesh(drafter="cpu", verifier=",".join(vb.port for vb in stage_vboards), models=str(models),
              warn=warned.append, say=warned.append) as mesh:
        assert mesh.generate("Once upon a time", max_tokens=16).text == want["text"]
        got = generate_with_a_stage_stopped(mesh, stage_vboards[1])
        after = mesh.generate("Once upon a time", max_tokens=16)  # serve's next request, chat's next turn
    assert got.text == want["text"] and got.stats["verifier"] == "cpu", warned
    port = stage_vboards[1].port
    assert any("stage 2 of 2 (layers 1:2, %s) stopped answering" % port in w and "; check that board (its power and "
               "cable; `specmesh console %s` shows what it prints)" % port in w for w in warned), warned
    errors = [b.get("error") for b in got.stats["boards"] if b["role"] == "stage"]
    assert errors == [None, "failed during the run, not asked"], got.stats["boards"]
    # its fail-over's line alone: it said the stage also stopped answering at the text's end, and that the next
    # generation, on the cpu verifier, would ask it again
    assert not any("at the text's end" in w for w in warned), warned
    assert after.text == want["text"] and after.stats["verifier"] == "cpu"


def test_a_pipeline_the_cpu_verifier_replaced_verifies_again_once_its_stage_answers(models, stage_vboards, tmp_path,
                                                                                   capsys):
    """A long-lived mesh (serve, chat, the Python API) whose pipeline on real stage boards failed over to the cpu
    verifier when a stage stopped answering kept the cpu verifier for its whole life, though the stage went on (a
    board that hung for a while, a hub's hiccup). Now its later generations ask the stage HELLO again, beside their
    text: once it answers, the pipeline verifies again, after one line, with the same text."""
    from specmesh import Mesh
    from specmesh.host.cli.session import REJOINED

    rc, want = run(models, tmp_path, "--plain", "--verifier", "cpu", *RUN[2:])
    assert rc == 0, capsys.readouterr().err
    warned: list[str] = []
    with Mesh(drafter="cpu", verifier=",".join(vb.port for vb in stage_vboards), models=str(models),
              warn=warned.append, say=[].append) as mesh:
        (lane,) = mesh._lanes
        pipeline = lane.verifier
        replaced = generate_with_a_stage_stopped(mesh, stage_vboards[0])
        done = []
        while len(done) < 6 and (not done or done[-1].stats["verifier"] != pipeline.name):
            done.append(mesh.generate("Once upon a time", max_tokens=16))
            gone = lane.gone.get("verifier")
            if gone is not None and gone.asking is not None:
                gone.asking.join(30)
    assert [d.text for d in [replaced, *done]] == [want["text"]] * (1 + len(done))
    assert replaced.stats["verifier"] == "cpu" and replaced.stats["failed"] == {"verifier": pipeline.name}
    back = done[-1]
    assert back.stats["verifier"] == pipeline.name and back.stats["failovers"] == [], back.stats
    assert back.stats["pipeline"]["layers"] == ["0:1", "1:2"]
    assert len(warned) == 2 and "stage 1 of 2 (layers 0:1, %s) stopped answering" % stage_vboards[0].port in warned[0]
    assert warned[1] == REJOINED["verifier"] % pipeline.name, warned


def test_one_stage_board_holding_the_whole_target_verifies_alone_and_is_found_by_auto(models, stage_boards,
                                                                                      virtual_board, tmp_path, capsys,
                                                                                      monkeypatch):
    """A stage board flashed `--layers 0:2` (the whole 2-layer target) given as `--verifier PORT`, or found by
    `--verifier auto`: it was told it "is flashed as a stage, not a verifier" (and auto that no board verifies); now it
    is a pipeline of one stage, with plain decoding's greedy text. Auto finding several stage boards names them."""
    from specmesh.host.bus import ports

    rc, want = run(models, tmp_path, "--plain", "--verifier", "cpu", *RUN[2:])
    assert rc == 0, capsys.readouterr().err
    whole = virtual_board()
    assert cli.main(["flash", "--port", whole.port, "--role", "stage", "--layers", "0:2", "--model",
                     str(models / "target.spm")]) == 0
    capsys.readouterr()
    monkeypatch.setattr(ports, "esp_ports", lambda: [(whole.port, "virtual")])
    for verifier in (whole.port, "auto"):
        rc, got = run(models, tmp_path, "--verifier", verifier, *RUN)
        assert rc == 0, capsys.readouterr().err
        assert got["text"] == want["text"] and got["pipeline"]["layers"] == ["0:2"] and got["context"] == 128
        assert got["verifier"] == "pipeline(1 stage: %s)" % whole.port  # (it said "1 stages")
    monkeypatch.setattr(ports, "esp_ports", lambda: [(p, "virtual") for p in stage_boards])
    rc, _ = run(models, tmp_path, "--verifier", "auto", *RUN)
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "the stage boards on %s verify as a pipeline: give their ports in layer order, --verifier %s" % (
        ", ".join(stage_boards), ",".join(stage_boards)) in err


def test_kernels_and_calibration_go_by_the_board_found_on_a_single_port(models, virtual_board, tmp_path, capsys):
    """`--verifier PORT` whose board is a stage holding the whole target is a pipeline of one stage, but --kernels and
    --calibration went by the flag: --kernels was refused as pricing no projection (the pipeline projects itself),
    and --calibration with --project was taken and priced nothing (a pipeline's projection takes no rates). They go by
    the board found now; a board there that verifies alone still needs --project for --kernels."""
    whole, alone = virtual_board(), virtual_board("esp32s3")
    for vb, role in ((whole, ["stage", "--layers", "0:2"]), (alone, ["verifier"])):
        assert cli.main(["flash", "--port", vb.port, "--role", *role, "--model", str(models / "target.spm")]) == 0
    capsys.readouterr()
    rc, got = run(models, tmp_path, "--verifier", whole.port, "--kernels", "viper", *RUN)
    assert rc == 0, capsys.readouterr().err
    assert got["pipeline"]["layers"] == ["0:2"] and got["projection"]["kernels"].startswith("viper"), got["projection"]
    cal = tmp_path / "c.json"
    cal.write_text(json.dumps({"format": "specmesh-calibration", "version": 1, "board": {"machine": "S3 devkit"},
                               "seconds_per_unit": {"matmul_1": 1e-9}}))
    for port, flags, said in (
            (whole.port, ["--project", "esp32s3", "--calibration", str(cal)],
             "--calibration prices a single verifier board: the board on %s is a stage board, a pipeline of one stage, "
             "projected from its stage's derived rates, which take no calibration: drop --calibration" % whole.port),
            (alone.port, ["--kernels", "viper"],
             "--kernels viper chooses the kernels a projection prices: add --project esp32s3 (the board on %s verifies "
             "alone, no stage board's pipeline, which projects itself)" % alone.port)):
        rc, _ = run(models, tmp_path, "--verifier", port, *flags, *RUN)
        err = capsys.readouterr().err
        assert rc == 2 and err == "specmesh run: error: %s\n" % said, err


def test_one_stage_board_of_several_given_alone_is_told_to_give_them_all(models, stage_boards, tmp_path, capsys):
    """`--verifier PORT` naming one stage board of a pipeline: it said to flash it as a verifier (overwriting a good
    stage); now one line says which layers it holds and to give every stage board's port."""
    rc, _ = run(models, tmp_path, "--verifier", stage_boards[1], *RUN)
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "%s is a stage board holding layers 1:2 of the target's 2: give all the stage boards' ports, in layer order, " \
           "as --verifier PORT1,PORT2,..." % stage_boards[1] in err, err


def test_stage_ports_out_of_layer_order_are_one_line_with_the_order(models, stage_boards, tmp_path, capsys):
    rc, _ = run(models, tmp_path, "--verifier", ",".join(reversed(stage_boards)), *RUN)
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "not given in layer order" in err and "give --verifier %s" % ",".join(stage_boards) in err


def test_a_board_that_is_no_stage_is_one_line_saying_what_to_flash(models, stage_boards, virtual_board, tmp_path,
                                                                   capsys):
    bare = virtual_board()  # MicroPython without the node
    rc, _ = run(models, tmp_path, "--verifier", "%s,%s" % (stage_boards[0], bare.port), *RUN)
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "`specmesh flash --port %s --role stage --layers 1:2 --node-id 11 --model %s`" % (bare.port,
                                                                                          models / "target.spm") in err


def test_a_keyed_board_of_another_role_is_told_the_flash_command_of_its_place(models, tmp_path, capsys):
    """A keyed run's second stage given a board flashed as the verifier: the wrong-role line's command was `--role
    stage --layers 1:2`, which a keyed board refuses (no key file), gave node id 10 (stage 2's is 11) and the shipped
    target (the run's is another build). It names all three now; flashed so, the run goes through."""
    from specmesh.host.emulator import VirtualBoard
    from specmesh.host.provision.keys import new_key_file

    key = tmp_path / "k"
    new_key_file(key)
    boards = [VirtualBoard(tmp_path / ("vb%d" % i), cls, name="vb%d" % i) for i, cls in enumerate(("esp32", "esp32s3"))]
    try:
        for vb in boards:
            vb.start()
        for vb, role in ((boards[0], ["stage", "--layers", "0:1"]), (boards[1], ["verifier"])):
            assert cli.main(["flash", "--port", vb.port, "--role", *role, "--model", str(models / "target.spm"),
                             "--key-file", str(key)]) == 0
        capsys.readouterr()
        argv = ["--key-file", str(key), "--verifier", "%s,%s" % (boards[0].port, boards[1].port), *RUN]
        rc, _ = run(models, tmp_path, *argv)
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1, err
        command = "specmesh flash --port %s --role stage --layers 1:2 --node-id 11 --key-file FILE --model %s" % (
            boards[1].port, models / "target.spm")
        assert "%s is flashed as a verifier, not a stage" % boards[1].port in err
        assert err.endswith("else flash it: `%s`\n" % command), err
        assert cli.main(command.replace("FILE", str(key)).split()[1:]) == 0
        capsys.readouterr()
        rc, stats = run(models, tmp_path, *argv)
        assert rc == 0, capsys.readouterr().err
        assert stats["pipeline"]["layers"] == ["0:1", "1:2"]
    finally:
        for vb in boards:
            vb.stop()


def test_a_stage_running_another_build_is_told_the_flash_command_with_its_layers(models, stage_boards, tmp_path,
                                                                              capsys):
    """Stage boards whose model is another build of target.spm: the flash command that fixes each keeps its layers
    (`specmesh flash --role stage` needs them; the advice lacked them) and its node id where it is not the default;
    one line names every such board (it named the first only)."""
    other = tmp_path / "other"
    other.mkdir()
    for name in ("tokenizer.bin", "drafter.spm"):
        shutil.copy(models / name, other / name)
    random_model(other / "target.spm", dim=32, n_layers=2, hidden=64, vocab=512, max_seq=128, seed=99)
    rc, _ = run(other, tmp_path, "--verifier", ",".join(stage_boards), *RUN)
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "runs another build of target.spm" in err
    assert "`specmesh flash --port %s --role stage --layers 0:1 --model %s`" % (stage_boards[0], other / "target.spm") \
        in err
    assert "`specmesh flash --port %s --role stage --layers 1:2 --node-id 11 --model %s`" % (
        stage_boards[1], other / "target.spm") in err


@pytest.mark.parametrize("layers, said", [
    ([(0, 1), (0, 2)], "layers 0:1 are on two stages (b (layers 0:2), and a (layers 0:1) before it): flash the "
                       "stages to split the target's 2 layers, e.g. `specmesh flash --port b --role stage --layers 1:2 "
                       "--node-id 11`"),
    ([(0, 1), (2, 2)], "layers 1:2 are on no stage (b (layers 2:2) starts at layer 2)"),
    ([(1, 2), (0, 1)], "not given in layer order (a (layers 1:2), b (layers 0:1)): give --verifier b,a"),
    ([(0, 1), (1, 1)], "layers 1:2 of the target's 2 are on no stage (the last, b (layers 1:1), ends at layer 1)"),
    ([(0, 1), (1, 3)], "b (layers 1:3) ends past the target's 2 layers"),
])
def test_stages_that_do_not_tile_the_target_are_named_with_the_fix(layers, said):
    assert said in stageports.tiling_problem(["a", "b"], layers, 2)


def test_more_stage_boards_than_layers_is_one_line():
    said = stageports.tiling_problem(["a", "b", "c"], [(0, 1), (1, 2), (1, 2)], 2)
    assert "at most 2 stage boards" in said


def test_a_stage_board_flashed_before_stages_said_their_layers_is_told_to_flash_again():
    with pytest.raises(BackendError, match=r"flash it again with this specmesh: `specmesh flash --port p --role stage "
                                           r"--layers 1:2 --node-id 11`"):
        stageports._layers({"positions": 0}, "p", 1, (1, 2))


@pytest.mark.parametrize("argv, said", [
    (["--stages", "2", "--verifier", "/dev/ttyUSB0,/dev/ttyUSB1"],
     "--stages N starts its own virtual stage boards; --verifier /dev/ttyUSB0,/dev/ttyUSB1 runs the stage boards"),
    (["--transport", "espnow", "--verifier", "/dev/ttyUSB0,/dev/ttyUSB1"], "--transport espnow"),
    (["--verifier", "/dev/ttyUSB0,stage2"], "'stage2' is not a serial port: give the stage boards' serial ports"),
    (["--verifier", "auto,/dev/ttyUSB1"], "`auto` finds one board, not a pipeline's stages"),
    (["--verifier", "/dev/ttyUSB0,"], "'' is not a serial port"),
    (["--drafter", "/dev/ttyUSB0,/dev/ttyUSB1"], "a list of ports is a pipeline's stage boards, which verify"),
    (["--verifier", "/dev/ttyUSB0,u0"], "--verifier (stage 1) /dev/ttyUSB0 and --verifier (stage 2) /dev/ttyUSB0 are "
                                        "one port: one board plays one role; give each stage its own board's port"),
    (["--verifier", "/dev/ttyUSB0,/dev/ttyUSB1", "--drafter", "/dev/ttyUSB1"], "are one port"),
    (["--verifier", "/dev/nonexistent-a,/dev/nonexistent-b"], "--verifier (stage 1): cannot open /dev/nonexistent-a"),
])
def test_flags_that_do_not_go_with_real_stage_boards_are_one_line(models, tmp_path, capsys, argv, said):
    rc = cli.main(["run", "--models", str(models), "--drafter", "cpu", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert said in err


def test_a_keyed_stage_run_without_its_key_is_told_the_flash_command_with_its_layers(models, tmp_path, capsys):
    """A stage board flashed with a deployment key, given in a list without it: the key mismatch's flash command
    names the stage's role and layers (`--role stage --layers 0:1`), which `flash` needs, not a bare role."""
    from specmesh.host.emulator import VirtualBoard
    from specmesh.host.provision.keys import new_key_file

    new_key_file(tmp_path / "k")
    boards = [VirtualBoard(tmp_path / ("vb%d" % i), "esp32", name="vb%d" % i) for i in range(2)]
    try:
        for vb in boards:
            vb.start()
        assert cli.main(["flash", "--port", boards[0].port, "--role", "stage", "--layers", "0:1", "--model",
                         str(models / "target.spm"), "--key-file", str(tmp_path / "k")]) == 0
        capsys.readouterr()
        rc, _ = run(models, tmp_path, "--verifier", "%s,%s" % (boards[0].port, boards[1].port))
    finally:
        for vb in boards:
            vb.stop()
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert "key mismatch" in err and "--role stage --layers 0:1 --key-file ITS_KEY" in err, err


def test_a_keyed_stage_flashed_with_another_key_is_told_the_flash_command_with_its_layers(models, tmp_path, capsys):
    """`specmesh flash --role stage --layers 0:1` onto a stage board keyed with another key (or with none given):
    the flash command the key mismatch gives keeps the layers, which `flash --role stage` needs (it said `--role
    stage --key-file ITS_KEY --no-key`, which flash refuses)."""
    from specmesh.host.emulator import VirtualBoard
    from specmesh.host.provision.keys import new_key_file

    for name in ("a", "b"):
        new_key_file(tmp_path / name)
    vb = VirtualBoard(tmp_path / "vb", "esp32", name="vb").start()
    flash = ["flash", "--port", vb.port, "--role", "stage", "--layers", "0:1", "--model", str(models / "target.spm")]
    try:
        assert cli.main([*flash, "--key-file", str(tmp_path / "a")]) == 0
        capsys.readouterr()
        for other in (["--key-file", str(tmp_path / "b")], []):
            assert cli.main([*flash, *other]) == 2
            err = capsys.readouterr().err
            assert "key mismatch" in err and "--role stage --layers 0:1 --key-file ITS_KEY --no-key" in err, err
    finally:
        vb.stop()

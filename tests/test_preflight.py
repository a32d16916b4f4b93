"""Checks before anything starts (host/cli/preflight.py, `specmesh emulate` flags): a corrupt model, an
over-long prompt, a missing port, emulator flags out of range. Each is one line on stderr, exit status 2,
before any back-end is made, and no virtual board is started (the default back-ends are virtual boards)."""

import os
import re
import shutil
from pathlib import Path

import pytest

from specmesh.host import cli
from specmesh.host.cli.preflight import unknown_backend
from specmesh.host.cli.session import Setup
from specmesh.host.emulator import board
from specmesh.host.layout import DRAFTER_FILE, HOST_DRAFTER_FILE, TARGET_FILE
from specmesh.shared.modelfile import HEADER_SIZE
from specmesh.tools.testmodels import random_model

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def models(tmp_path):
    d = tmp_path / "models"
    d.mkdir()
    shutil.copy(ROOT / "models" / "tokenizer.bin", d / "tokenizer.bin")
    random_model(d / TARGET_FILE, vocab=512, max_seq=64, seed=1)
    random_model(d / DRAFTER_FILE, vocab=512, max_seq=32, seed=2)
    return d


@pytest.fixture
def no_board_starts(monkeypatch):
    """Fails the test if a virtual board is started; checks that none is left running."""

    def refuse(self, *args, **kwargs):
        raise AssertionError("a virtual board was started before the checks failed")

    monkeypatch.setattr(board.VirtualBoard, "start", refuse)
    yield
    assert not board._LIVE


def one_line_status_2(capsys, argv):
    """`argv`'s stderr: one line, exit status 2, and no back-end made before it (Setup.make: a board booted, an engine
    process started, a model loaded). That was 'within 1 s' (or more, where a check waits for a port's lock or imports
    uvicorn), which a loaded machine can exceed."""
    made = []
    real = Setup.make

    def make(self, kind, name, batched=False):
        made.append((kind, name))
        return real(self, kind, name, batched)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Setup, "make", make)
        rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert not made, "back-ends made before the check: %s" % made
    return err


def damage_crc(b):
    return b[:HEADER_SIZE + 40] + bytes([b[HEADER_SIZE + 40] ^ 0x55]) + b[HEADER_SIZE + 41:]


@pytest.mark.parametrize("name, damage, reason", [
    (TARGET_FILE, damage_crc, "fails its CRC check"),
    # a flipped rope_theta (the header is inside the CRC since version 2): it ran, exit 0, and gave garbage text
    (TARGET_FILE, lambda b: b[:32] + bytes([b[32] ^ 1]) + b[33:], "fails its CRC check"),
    (DRAFTER_FILE, lambda b: b[:8] + bytes([b[8] ^ 1]) + b[9:], "fails its CRC check"),  # dim: not the shape's
    (DRAFTER_FILE, lambda b: b[:-100], "is truncated"),
    (TARGET_FILE, lambda b: b"GGUF" + b[4:], "not a specmesh model file"),
    (TARGET_FILE, lambda b: b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head></html>\n",  # a download that saved a web page: it said no fix
     "is not a specmesh model file (bad magic b'<!DO'): copy it again, or convert the model (models/MODEL_CARD.md: "
     "python -m specmesh.tools.llama2c_import)"),
    (DRAFTER_FILE, lambda b: b[:HEADER_SIZE - 1], "truncated"),
    (TARGET_FILE, lambda b: b + b[HEADER_SIZE:HEADER_SIZE + 10],  # a copy appended to twice: it said no fix
     "has 10 unexpected trailing bytes: the file is corrupt, copy or export it again"),
])
def test_a_corrupt_model_is_named_with_its_reason(models, capsys, no_board_starts, name, damage, reason):
    path = models / name
    path.write_bytes(damage(path.read_bytes()))
    err = one_line_status_2(capsys, ["run", "--models", str(models), "--max-tokens", "4"])
    assert str(path) in err and reason in err


def test_an_over_long_prompt_is_refused_before_the_boards_start(models, capsys, no_board_starts):
    err = one_line_status_2(capsys, ["run", "--models", str(models), "--prompt", "Once upon a time " * 100])
    assert "the prompt is" in err and "target model's context holds 64 (target.spm)" in err
    assert "Once upon" not in capsys.readouterr().out  # the prompt was not echoed either
    assert err.endswith("shorten the prompt from --prompt\n")
    assert "is at least " in err  # its bytes alone say so (Tokenizer.least_tokens): it was not encoded
    err = one_line_status_2(capsys, ["run", "--models", str(models), "--prompt", "Once upon a time " * 17])
    assert "the prompt is 70 tokens" in err  # under that bound: encoded, and counted exactly


@pytest.mark.parametrize("prompt", ["", "Once"])
def test_a_target_whose_context_holds_one_token_is_the_models_fault(models, capsys, no_board_starts, prompt):
    """The start token alone fills it: an empty prompt was told 'the prompt is at least 1 tokens but the target
    model's context holds 1 (target.spm): shorten the prompt from --prompt', which no prompt can."""
    random_model(models / TARGET_FILE, vocab=512, max_seq=1, seed=1)
    err = one_line_status_2(capsys, ["run", "--models", str(models), "--prompt", prompt])
    assert err == ("specmesh run: error: the target model's context holds 1 token (target.spm): it must hold the start "
                   "token and one generated token at least; give a target model with a longer context\n")


def test_an_over_long_prompt_from_a_file_names_the_file(models, tmp_path, capsys, no_board_starts):
    story = tmp_path / "story.txt"
    story.write_text("Once upon a time " * 100)
    err = one_line_status_2(capsys, ["run", "--models", str(models), "--prompt-file", str(story)])
    assert err.endswith("shorten the prompt from --prompt-file %s\n" % story)


def test_only_the_targets_context_limits_the_prompt(models, capsys):
    """Past the drafter's context (32) rounds are plain: a prompt of 32..63 tokens runs."""
    from specmesh.host.decode.tokenizer import Tokenizer

    prompt = "Once upon a time " * 9
    n = len(Tokenizer.from_llama2c(models / "tokenizer.bin").encode(prompt))
    assert 32 <= n < 64
    rc = cli.main(["run", "--models", str(models), "--verifier", "cpu", "--drafter", "cpu", "--quiet",
                   "--max-tokens", "2", "--prompt", prompt])
    assert rc == 0, capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--drafter", "--verifier"])
def test_a_missing_port_is_refused_before_the_other_board_boots(models, capsys, no_board_starts, flag):
    err = one_line_status_2(capsys, ["run", "--models", str(models), flag, "/dev/ttyNOPE"])
    assert "cannot open /dev/ttyNOPE: no such port" in err and flag in err


def test_every_missing_port_is_named_in_the_one_line(models, capsys, no_board_starts):
    """`--drafter u0 --verifier a0` with neither there named the verifier's alone: the run fixed for it then failed on
    the drafter's."""
    err = one_line_status_2(capsys, ["run", "--models", str(models), "--drafter", "/dev/ttyNOPE1", "--verifier",
                                     "/dev/ttyNOPE2"])
    assert "--verifier: cannot open /dev/ttyNOPE2: no such port" in err
    assert "; --drafter: cannot open /dev/ttyNOPE1: no such port" in err


def test_a_port_someone_holds_is_busy(models, capsys, no_board_starts):
    import os
    import pty

    master, slave = pty.openpty()
    try:
        import serial

        with serial.Serial(os.ttyname(slave), exclusive=True):
            # (a refused lock is tried again for LOCK_RETRY_S before the port counts as busy)
            err = one_line_status_2(capsys, ["run", "--models", str(models), "--drafter", os.ttyname(slave)])
    finally:
        os.close(master)
        os.close(slave)
    assert "busy" in err


def test_a_device_that_is_no_serial_port_says_so(models, capsys, no_board_starts):
    err = one_line_status_2(capsys, ["run", "--models", str(models), "--drafter", "/dev/null"])
    assert "cannot open /dev/null: not a serial port (ESP32 USB ports here:" in err


@pytest.mark.parametrize("other", [str, lambda port: port.replace("/pts/", "/pts/../pts/")])
def test_one_port_given_to_both_roles_is_refused_before_it_is_opened(models, capsys, no_board_starts, other):
    """The same board as --drafter and --verifier (by one name, or two, as /dev/serial/by-id links give): one line
    naming the mistake; it said the board was flashed as the other role and to flash it again, over a good board."""
    import pty

    master, slave = pty.openpty()
    port = os.ttyname(slave)
    try:
        err = one_line_status_2(capsys, ["run", "--models", str(models), "--drafter", port, "--verifier", other(port)])
    finally:
        os.close(master)
        os.close(slave)
    assert "--drafter %s and --verifier %s are one port: one board plays one role" % (port, other(port)) in err


def test_an_unknown_backend_is_refused_before_the_verifier_boots(models, capsys, no_board_starts):
    err = one_line_status_2(capsys, ["run", "--models", str(models), "--drafter", "nope"])
    assert "--drafter nope: not a serial port nor one of" in err


def test_boards_are_chosen_through_the_one_registry():
    """`virtual` and every serial-port name are back-ends of both roles in the registry's tables, as `cpu` is."""
    from specmesh.host import backends
    from specmesh.host.cli import registry

    for kind, table in (("verifier", registry.VERIFIERS), ("drafter", registry.DRAFTERS)):
        assert registry.factory(kind, "virtual") is table["virtual"]
        for port in ("/dev/ttyUSB0", "COM3", "auto", "rfc2217://lab:4000"):
            assert registry.factory(kind, port) is table[backends.PORT]
        assert registry.factory(kind, "cpu") is table["cpu"] and registry.factory(kind, "nope") is None
    known = unknown_backend("drafter", "nope").split("nor one of ")[1].split(", ")
    assert "virtual" in known and "cpu" in known and backends.PORT not in known


@pytest.mark.parametrize("flags, message", [
    (["--loss", "2"], "--loss is a probability"),
    (["--duplicate", "-0.1"], "--duplicate is a probability"),
    (["--reorder", "1"], "--reorder is a probability"),
    (["--flash-kb", "1"], "--flash-kb must be a multiple of 4 in 8..16384"),
    (["--flash-kb", "10"], "--flash-kb must be"),
    (["--delay-ms", "-5"], "--delay-ms must be in 0..10000"),
    (["--boards", "0"], "--boards must be in 1..64, not 0"),
    (["--board", "virtual:esp32", "--radio-loss", "0.1"], "--radio-loss acts on the virtual radio, which QEMU boards"),
    (["--board", "esp32c3", "--reorder", "0.1", "--delay-ms", "5"], "act on the virtual radio, which QEMU boards (--board esp32c3)"),
    (["--board", "esp32c3", "--mtu", "1470"], "--mtu acts on the virtual radio, which QEMU boards (--board esp32c3)"),
    (["--board", "virtual:esp32s3", "--seed", "7"], "--seed acts on the virtual radio, which QEMU boards"),
])
def test_emulator_flags_out_of_range(capsys, no_board_starts, flags, message):
    err = one_line_status_2(capsys, ["emulate", *flags])
    assert err.startswith("specmesh emulate: error: ") and message in err


@pytest.mark.parametrize("below, why", [
    ("f/boards", "cannot make --dir {tmp}/f/boards: {tmp}/f is a file, not a folder: give another --dir"),
    ("a" * 300, "cannot make --dir {tmp}/%s: File name too long: give another --dir" % ("a" * 300)),
    ("ro", "--dir {tmp}/ro: no permission to write in {tmp}/ro: give another --dir"),
    ("", "--dir is empty: give a folder, or leave --dir out for a temporary one"),
])
def test_emulate_dir_that_cannot_hold_the_boards_is_a_usage_error(capsys, no_board_starts, tmp_path, monkeypatch,
                                                                   below, why):
    """Found before a board starts, as every flag of emulate is: it was an errno line (status 1) from the first
    board's mkdir or lock file ('[Errno 36] File name too long: ...')."""
    (tmp_path / "f").write_text("x")
    (tmp_path / "ro").mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: real_access(p, mode) and os.fspath(p) != str(tmp_path / "ro"))
    err = one_line_status_2(capsys, ["emulate", "--dir", str(tmp_path / below) if below else ""])
    assert err == "specmesh emulate: error: %s\n" % why.format(tmp=tmp_path)


@pytest.mark.parametrize("flags, fix", [
    (["--flash-kb", "128"], "not the 128 KiB asked for (starting it would erase it): give --flash-kb 64 to keep its "
                            "files, or another --dir"),
    (["--board", "virtual:esp32c3"], "not the 1536 KiB asked for (starting it would erase it): give --flash-kb 64 to "
                                     "keep its files, or another --dir"),  # a QEMU board's flash: its class's size
    # no --flash-kb: the board started on the folder, its files unseen inside the image (a flash.img file at /)
    ([], "a folder flash asked for (no --flash-kb: the board would not see its files): give --flash-kb 64 to keep "
         "its files, or another --dir"),
])
def test_emulate_never_erases_a_kept_flash_of_another_size(capsys, no_board_starts, tmp_path, flags, fix):
    """`emulate --dir D --flash-kb 64`, files copied on, then `--flash-kb 128` (or a QEMU class, whose flash is its
    class's size) on the same D: the board started on a new, empty image, its files gone without a word; or with no
    --flash-kb on the same D: the board started empty, its files in the image it did not mount."""
    (tmp_path / "board0").mkdir()
    image = tmp_path / "board0" / "flash.img"
    image.write_bytes(bytes(range(256)) * 256)  # 64 KiB, standing for a littlefs image with files on it
    err = one_line_status_2(capsys, ["emulate", "--boards", "2", "--dir", str(tmp_path), *flags])
    assert err == "specmesh emulate: error: board0's flash %s is 64 KiB, %s\n" % (image, fix)
    assert image.read_bytes() == bytes(range(256)) * 256


@pytest.mark.parametrize("drafter, words", [
    (dict(vocab=96), "has a vocabulary of 96 tokens, the target's has 512"),
    (dict(vocab=512, tokenizer_id=0x1234), "was made with another tokenizer than the target (tokenizer id 00001234"),
])
def test_a_drafter_for_another_vocabulary_or_tokenizer_is_refused_before_any_board(models, tmp_path, capsys,
                                                                                  no_board_starts, drafter, words):
    """Checked against the target before anything is flashed or generated: the virtual drafter board would be
    flashed with it and decode plainly, the CPU drafter would fail with a token id out of range mid-text."""
    from specmesh.shared.modelfile import Header
    from specmesh.tools.testmodels import random_tensors, write_model

    if "tokenizer_id" in drafter:  # the target names its tokenizer too: a llama2.c import's CRC of its vocab
        named = Header(32, 2, 4, 2, 64, 512, 64, tokenizer_id=0xBEEF)
        write_model(models / TARGET_FILE, named, random_tensors(named, 1))
    h = Header(16, 1, 2, 1, 32, drafter["vocab"], 32, tokenizer_id=drafter.get("tokenizer_id", 0))
    other = write_model(tmp_path / "other.spm", h, random_tensors(h, 3))
    assert other.vocab == drafter["vocab"]
    for backend in ("virtual", "cpu"):
        err = one_line_status_2(capsys, ["run", "--models", str(models), "--verifier", "cpu", "--drafter", backend,
                                         "--draft-model", str(tmp_path / "other.spm")])
        assert words in err and "--plain" in err


def _llama2c_tokenizer(pieces: list[bytes]) -> bytes:
    import struct

    return struct.pack("<i", max(map(len, pieces))) + b"".join(struct.pack("<fi", 0.0, len(p)) + p for p in pieces)


@pytest.mark.parametrize("change, words", [
    (lambda p: p[:300], "tokenizer.bin holds 300 tokens but the target model (target.spm) has a vocabulary of 512"),
    (lambda p: p + [b" Once upon"], "tokenizer.bin holds 513 tokens but the target model"),
    (lambda p: p[:-1] + [b"zz"], "is not the tokenizer the target model (target.spm) was made with (its tokenizer id"),
])
def test_a_tokenizer_that_is_not_the_models_is_refused_before_any_board(models, capsys, no_board_starts, change,
                                                                        words):
    """A tokenizer.bin of another model: one line before anything starts. With fewer tokens the run printed the
    prompt, then 'list index out of range'; with more, 'token id out of range [0, 512)' from the boards; with the
    same count but other pieces, text in the wrong words. The tokenizer id is checked where the header records one."""
    from specmesh.host.decode.tokenizer import byte_pieces, pack_vocab, read_llama2c_tokenizer, vocab_id
    from specmesh.shared.modelfile import Header
    from specmesh.tools.testmodels import random_tensors, write_model

    pieces = read_llama2c_tokenizer(models / "tokenizer.bin")[0]
    named = Header(32, 2, 4, 2, 64, 512, 64, tokenizer_id=vocab_id(pack_vocab(byte_pieces(pieces))))
    write_model(models / TARGET_FILE, named, random_tensors(named, 1))
    for args in (["--plain"], ["--drafter", "cpu"]):
        cli.main(["run", "--models", str(models), "--verifier", "cpu", "-n", "2", "--quiet", *args])  # its own: fine
    capsys.readouterr()
    (models / "tokenizer.bin").write_bytes(_llama2c_tokenizer(change(pieces)))
    err = one_line_status_2(capsys, ["run", "--models", str(models), "--verifier", "cpu", "--drafter", "cpu"])
    assert words in err and "put the model's own tokenizer.bin in the --models folder" in err


@pytest.mark.parametrize("name", ["target.spm", "tokenizer.bin"])
def test_a_shipped_file_missing_from_the_models_folder_says_where_the_shipped_one_is(models, capsys, no_board_starts,
                                                                                     name):
    """It said 'run `make train`', which distils the drafters and makes neither the target nor the tokenizer."""
    from specmesh.host.layout import MODELS

    (models / name).unlink()
    err = one_line_status_2(capsys, ["run", "--models", str(models), "--verifier", "cpu", "--drafter", "cpu"])
    assert err == ("specmesh run: error: %s is missing from %s: copy it there from the shipped models (%s), or give "
                   "the folder that holds it with --models\n" % (name, models, MODELS))


def test_a_folder_holds_the_drafter_its_backend_runs_not_drafter_spm(models, capsys, no_board_starts):
    """A --models folder with drafter-host.spm and no drafter.spm serves --drafter cpu, which reads only that file
    (it was refused: 'drafter.spm is missing', naming a file the run never reads); a drafter board's class falls
    back to drafter.spm, so without it that one is named."""
    (models / DRAFTER_FILE).rename(models / HOST_DRAFTER_FILE)
    assert cli.main(["run", "--models", str(models), "--verifier", "cpu", "--drafter", "cpu", "-n", "2", "--quiet"]) == 0
    capsys.readouterr()
    err = one_line_status_2(capsys, ["run", "--models", str(models), "--verifier", "cpu", "--drafter", "virtual:esp32s3"])
    assert "drafter.spm is missing from %s" % models in err


def test_a_drafter_board_running_another_vocabulary_is_refused_before_any_text(models):
    """A board flashed earlier (by hand, with another model) says its vocabulary in HELLO: refused then."""
    from types import SimpleNamespace

    from specmesh.host.backends.modelio import check_model_file
    from specmesh.host.cli.config import UsageError
    from specmesh.host.cli.session import _check_running_drafter

    from specmesh.shared import messages as m

    target = check_model_file(models / TARGET_FILE)[0]
    given = models / DRAFTER_FILE
    board = SimpleNamespace(name="/dev/ttyUSB0", info={"model": "/models/old.spm", "vocab": 96}, role=m.ROLE_DRAFTER,
                            proxy=SimpleNamespace(node=1), flash_role=lambda: "--role drafter")
    with pytest.raises(UsageError, match="the drafter on /dev/ttyUSB0 \\(old.spm\\) has a vocabulary of 96 tokens"):
        _check_running_drafter(board, target, given)
    _check_running_drafter(SimpleNamespace(name="u0", info={"model": "/models/x.spm", "vocab": 512}), target, given)


def test_a_board_running_another_build_is_refused_and_an_older_firmwares_is_not_checked(models):
    """HELLO's model crc against the file the host takes each board's model for: every pipeline stage's the target; a
    drafter's the file its HELLO names where it lies beside the given one, else the given one. An older firmware's
    HELLO has no crc (read as 0): not checked, as before. (A verifier on a port: tests/test_diagnosis.py.)"""
    from types import SimpleNamespace

    from specmesh.host.backends.modelio import check_model_file
    from specmesh.host.cli.session import _wrong_builds, running_file
    from specmesh.host.provision.flash import NODE_ID
    from specmesh.shared.board import ROLES
    from specmesh.shared import messages as m

    def board(name, role, model, crc, node=None):
        return SimpleNamespace(name=name, role=role, info={"model": model, "model_crc": crc},
                               proxy=SimpleNamespace(node=node or NODE_ID[ROLES[role]]),
                               flash_role=lambda: "--role " + ROLES[role])

    target = check_model_file(models / TARGET_FILE)[0]
    pipeline = SimpleNamespace(stages=[board("virtual:stage%d(esp32)" % i, m.ROLE_STAGE, "/models/target.spm", crc)
                                       for i, crc in enumerate((target.crc, target.crc ^ 1))])
    [said] = _wrong_builds(pipeline, models / TARGET_FILE, target)
    assert re.fullmatch("the stage on virtual:stage1\\(esp32\\) runs another build of target.spm \\(crc32 %08x, "
                        "not the %08x of .*: run again \\(a virtual board is flashed afresh\\)"
                        % (target.crc ^ 1, target.crc), said), said
    pipeline.stages[1].info["model_crc"] = 0  # a firmware flashed before HELLO said its model's crc
    assert _wrong_builds(pipeline, models / TARGET_FILE, target) == []
    # a real stage keeps its node id where it is not the default (flashed again without it, it became node 10)
    stage = board("/dev/ttyUSB2", m.ROLE_STAGE, "/models/target.spm", target.crc ^ 1, node=11)
    [said] = _wrong_builds(stage, models / TARGET_FILE, target)
    assert "`specmesh flash --port /dev/ttyUSB2 --role stage --node-id 11 --model %s`" % (models / TARGET_FILE) in said

    given = models / DRAFTER_FILE
    old = random_model(models / "old.spm", vocab=512, max_seq=32, seed=5)
    drafter = board("/dev/ttyUSB0", m.ROLE_DRAFTER, "/rom/old.spm", old.crc)
    assert running_file(drafter, given) == models / "old.spm"
    assert _wrong_builds(drafter, running_file(drafter, given), old) == []
    drafter.info["model"] = "/rom/gone.spm"  # a file this folder lacks: taken for the given one, not its build
    assert running_file(drafter, given) == given
    [said] = _wrong_builds(drafter, given, check_model_file(given)[0])
    assert re.match("the drafter on /dev/ttyUSB0 runs gone.spm, not drafter.spm .*whose n-gram table and costs this "
                    "run takes for it\\): flash it with this run's file \\(`specmesh flash --port /dev/ttyUSB0 --role "
                    "drafter --model %s`\\)" % re.escape(str(given)), said), said


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_stages_that_do_not_fit_the_class_heap_are_refused_before_any_board(capsys, no_board_starts, stages):
    """The shipped target's 5 layers on classic ESP32 stages: only 5 stages fit (a stage of 2 layers needs
    134 KiB of its class heap's 109 KiB); refused before flashing, naming the stage and the fix (was: found after up to 29 s
    of flashing, by the node)."""
    from specmesh.host.boardclasses import BOARD_CLASSES

    err = one_line_status_2(capsys, ["run", "--stages", str(stages), "--drafter", "cpu"])
    heap_kib = BOARD_CLASSES["esp32"].heap_bytes // 1024
    assert "--stages %d: stage " % stages in err and "KiB of heap, an esp32 board has %d KiB" % heap_kib in err
    assert err.endswith("--stages 5, the fewest whose stages fit, or stage boards with PSRAM: --verifier "
                        "virtual:esp32s3\n")


def test_a_prompt_past_a_stage_boards_context_is_refused_before_any_board(capsys, no_board_starts):
    """A classic ESP32 stage keeps 128 positions of the target's 512: a prompt of 128 or more was refused only after
    every board had booted ("the prompt has 184 tokens but the context holds 128", no fix); now before, with it."""
    prompt = "Once upon a time, there was a little girl. " * 14
    err = one_line_status_2(capsys, ["run", "--stages", "5", "--drafter", "cpu", "--prompt", prompt])
    assert err.endswith("but an esp32 stage board's context holds 128: shorten the prompt from --prompt, or stage "
                        "boards with PSRAM: --verifier virtual:esp32s3\n")


@pytest.mark.parametrize("cls", ["esp32c3", "esp32c6"])
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_stages_that_do_not_fit_a_c3s_heap_are_refused_before_any_board(capsys, no_board_starts, cls, stages):
    """A C3's (and C6's) heap is the split heap's first 64 KiB area grown once, 2 x 64,000 bytes, the node's code
    frozen: a stage of two layers (134 KiB) does not fit, so only 5 stages do; refused before any board boots,
    naming the fix (was: 3 and 4 stages passed this check on a 203,264-byte heap, and after about 80 s of booting
    and flashing the first C3 node said the slice does not fit)."""
    err = one_line_status_2(capsys, ["run", "--stages", str(stages), "--drafter", "cpu", "--verifier",
                                     "virtual:" + cls])
    assert "--stages %d: stage " % stages in err and "KiB of heap, an %s board has 125 KiB" % cls in err
    assert err.endswith("--stages 5, the fewest whose stages fit, or stage boards with PSRAM: --verifier "
                        "virtual:esp32s3\n")


def test_every_stage_of_the_shipped_split_fits_where_the_nodes_load_them():
    """The planning rule against what the stage nodes hold: 5 classic ESP32 or C3 stages, and any split on S3s."""
    from specmesh.host.backends.modelio import check_model_file
    from specmesh.host.boardclasses import BOARD_CLASSES, stage_heap_need
    from specmesh.host.cli.session import plan_stages

    target = check_model_file(ROOT / "models" / TARGET_FILE)[0]
    plan_stages(target, 5, "esp32")
    plan_stages(target, 5, "esp32c3")
    for n in range(1, 6):
        plan_stages(target, n, "esp32s3")
    assert stage_heap_need(target, BOARD_CLASSES["esp32"], (0, 1)) < BOARD_CLASSES["esp32"].heap_bytes


@pytest.fixture
def serve_extra():
    pytest.importorskip("uvicorn", reason="specmesh serve needs the `serve` extra: pip install -e '.[dev]'")


def test_serve_refuses_a_port_out_of_range_before_any_board_boots(models, capsys, no_board_starts, serve_extra):
    err = one_line_status_2(capsys, ["serve", "--models", str(models), "--port", "99999"])
    assert "--port must be in 0..65535" in err


def test_serve_on_a_port_in_use_says_so_before_any_board_boots(models, capsys, no_board_starts, serve_extra):
    import socket

    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        err = one_line_status_2(capsys, ["serve", "--models", str(models), "--port", str(port)])
    assert "port %d on 127.0.0.1 is in use" % port in err and "--port N" in err


def test_serve_on_an_address_not_of_this_machine_says_so(models, capsys, no_board_starts, serve_extra):
    err = one_line_status_2(capsys, ["serve", "--models", str(models), "--host", "192.0.2.1"])  # TEST-NET-1
    assert "--host 192.0.2.1: not an address of this machine" in err


def test_serve_on_an_empty_host_says_what_it_takes(models, capsys, no_board_starts, serve_extra):
    """It said "--host : not an address of this machine (Name or service not known)"."""
    err = one_line_status_2(capsys, ["serve", "--models", str(models), "--host", ""])
    assert err == "specmesh serve: error: --host needs an address or a name (127.0.0.1: this machine only, 0.0.0.0: " \
                  "every interface)\n"


@pytest.mark.parametrize("flag, instead", [("--prompt", "a request's body carries the prompt"),
                                           ("--prompt-file", "a request's body carries the prompt"),
                                           ("--stats-json", "each response carries its stats, in its specmesh field"),
                                           ("--quiet", "serve prints no text or stats table (its log holds its "
                                                       "start-up lines and faults)")])
def test_serve_s_help_lists_no_flag_it_refuses(models, capsys, no_board_starts, serve_extra, flag, instead):
    """`serve --help` listed run's --prompt, -f, --stats-json and --quiet, each of which serve then refused ("belongs
    to one generation"); they are out of its help and still refused in that one line, which says what serve has in
    the flag's place: it said "a request's body carries it" of all four, though no body carries a stats file or
    --quiet."""
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    assert flag not in capsys.readouterr().out
    value = [] if flag == "--quiet" else ["x"]
    err = one_line_status_2(capsys, ["serve", "--models", str(models), flag, *value])
    assert err == "specmesh serve: error: %s belongs to one generation: %s (drop it)\n" % (flag, instead)


def test_serve_refuses_no_color_which_colours_nothing_there(models, capsys, no_board_starts, serve_extra):
    """`serve --help` listed run's --no-color ("never colour the streamed text") and serve took it and did nothing:
    it streams no text to a terminal. It is out of serve's help, and refused in one line that says why."""
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    assert "--no-color" not in capsys.readouterr().out
    err = one_line_status_2(capsys, ["serve", "--models", str(models), "--no-color"])
    assert err.startswith("specmesh serve: error: --no-color colours nothing here: serve writes no text to a terminal")
    assert err.endswith(": drop it\n")


def resolving(monkeypatch, name, *addresses):
    """socket.getaddrinfo with `name` resolving to `addresses` (IPv4 or IPv6 literals, in that order)."""
    import socket

    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host != name:
            return real(host, port, *args, **kwargs)
        return [entry for address in addresses for entry in real(address, port, *args, **kwargs)]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def ipv6_loopback() -> bool:
    import socket

    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        return False
    return True


def test_serve_listens_on_every_address_of_its_host_on_one_port(monkeypatch):
    """`--host localhost` where it is ::1 and 127.0.0.1 (host/cli/serve.py `listen`): a socket on each, on the
    port the first drew (was: only the first address, so a client trying the other was refused)."""
    import socket

    from specmesh.host.cli.serve import listen

    if not ipv6_loopback():
        pytest.skip("this machine cannot bind ::1 (IPv6 is off)")
    resolving(monkeypatch, "dual.test", "::1", "127.0.0.1")
    sockets = listen("dual.test", 0)
    try:
        assert [s.family for s in sockets] == [socket.AF_INET6, socket.AF_INET]
        port = sockets[0].getsockname()[1]
        assert port and sockets[1].getsockname()[1] == port
        for family, address in ((socket.AF_INET6, "::1"), (socket.AF_INET, "127.0.0.1")):
            with socket.socket(family) as client:  # the backlog completes the handshake: no accept() needed
                client.settimeout(5)
                client.connect((address, port))
    finally:
        for s in sockets:
            s.close()


def test_serve_leaves_out_an_address_this_machine_lacks_among_others(monkeypatch):
    from specmesh.host.cli.serve import listen

    resolving(monkeypatch, "partly.test", "192.0.2.1", "127.0.0.1")  # TEST-NET-1: no machine's address
    sockets = listen("partly.test", 0)
    try:
        assert [s.getsockname()[0] for s in sockets] == ["127.0.0.1"]
    finally:
        for s in sockets:
            s.close()


def test_serve_on_a_port_in_use_on_one_address_closes_what_it_bound(monkeypatch):
    """The port is free on ::1 and taken on 127.0.0.1: one line naming it, and ::1's socket is not left open."""
    import socket

    from specmesh.host.cli.config import UsageError
    from specmesh.host.cli.serve import listen

    if not ipv6_loopback():
        pytest.skip("this machine cannot bind ::1 (IPv6 is off)")
    resolving(monkeypatch, "dual.test", "::1", "127.0.0.1")
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        with pytest.raises(UsageError, match="port %d on dual.test is in use" % port):
            listen("dual.test", port)
        socket.create_server(("::1", port), family=socket.AF_INET6).close()  # free again: nothing left bound


def test_serve_on_port_0_draws_again_when_a_later_address_has_the_drawn_port_taken(monkeypatch):
    """Port 0 on two addresses: when the port the first drew is taken on the second, both are drawn again."""
    import errno
    import socket

    from specmesh.host.cli import serve

    real = socket.create_server
    calls = []

    def create_server(address, **kwargs):
        calls.append(address)
        if len(calls) == 2:  # the second address, first draw: another program holds that port there
            raise OSError(errno.EADDRINUSE, "Address already in use")
        return real(address, **kwargs)

    if not ipv6_loopback():
        pytest.skip("this machine cannot bind ::1 (IPv6 is off)")
    resolving(monkeypatch, "twice.test", "127.0.0.1", "::1")
    monkeypatch.setattr(serve.socket, "create_server", create_server)
    sockets = serve.listen("twice.test", 0)
    try:
        assert [a[0] for a in calls] == ["127.0.0.1", "::1", "127.0.0.1", "::1"]
        assert calls[0][1] == calls[2][1] == 0 and calls[3][1] == sockets[0].getsockname()[1]
        assert [s.getsockname()[:2] for s in sockets] == [("127.0.0.1", calls[3][1]), ("::1", calls[3][1])]
    finally:
        for s in sockets:
            s.close()


def test_serve_takes_a_bracketed_ipv6_host_and_names_a_port_given_with_the_host(models, capsys, no_board_starts,
                                                                                  serve_extra):
    """`--host [::1]` (as the banner's address writes it) said "not an address of this machine (Name or service not
    known)", and `--host 127.0.0.1:8080` the same, neither saying what to do."""
    from specmesh.host.cli.config import UsageError
    from specmesh.host.cli.serve import listen, url

    try:
        sockets = listen("[::1]", 0)
    except UsageError as e:  # a machine without IPv6 has no ::1: then the brackets are what is checked
        assert "[::1]: not an address of this machine (127.0.0.1" in str(e), e
        sockets = []
    for sock in sockets:
        assert sock.getsockname()[0] == "::1"
        sock.close()
    assert url("[::1]", 80) == url("::1", 80) == "http://[::1]:80/"
    for host, port in (("127.0.0.1:8080", "8080"), ("[::1]:80", "80")):
        err = one_line_status_2(capsys, ["serve", "--models", str(models), "--host", host])
        assert err == "specmesh serve: error: --host %s: give the address alone, and the port with --port %s\n" % (
            host, port), err


@pytest.mark.parametrize("broken", ["drafter.ngt", "target.ngt"])
def test_a_broken_ngram_table_is_refused_before_any_board(models, capsys, no_board_starts, broken):
    """The drafter's n-gram table, and the target's beside a drafter with one (whose chains the decode loop copies),
    is read and checked before anything starts: a broken one (here the first bytes of another file) was refused only
    after both virtual boards had booted and the drafter board had been flashed with the drafter's."""
    from specmesh.tools import ngram as builder

    good = builder.table_bytes({(1, 2): 7, (3, 4, 5): 9}, 2, 4)
    for name in ("drafter.ngt", "target.ngt"):
        (models / name).write_bytes(b"GGUF" + good[4:] if name == broken else good)
    err = one_line_status_2(capsys, ["run", "--models", str(models), "--max-tokens", "4"])
    assert err.startswith("specmesh run: error: n-gram table %s: not a specmesh n-gram table" % (models / broken))
    # a damaged copy is copied again first: rebuilding takes long, and builds the shipped folder's tables only
    assert "copy it again, rebuild it (python -m specmesh.tools.ngram) or delete it" in err
    # a drafter board on a port may run another model than the folder's (its HELLO names it): its table is read then
    err = one_line_status_2(capsys, ["run", "--models", str(models), "--drafter", "/dev/ttyUSB97"])
    assert "n-gram table" not in err and "/dev/ttyUSB97" in err


@pytest.mark.parametrize("damage, words", [
    (lambda b: b[:3000], "tokenizer.bin is not a llama2.c tokenizer.bin (truncated or corrupt)"),
    (lambda b: b"", "tokenizer.bin is not a llama2.c tokenizer.bin (truncated or corrupt)"),
    (lambda b: b[:100], "tokenizer.bin holds 7 tokens: a llama2.c tokenizer has 3 specials and 256 byte tokens"),
])
def test_a_tokenizer_cut_short_says_what_to_do(models, capsys, no_board_starts, damage, words):
    """A tokenizer.bin cut short (a half-finished copy, an empty file) was named with what is wrong and no fix."""
    from specmesh.host.layout import MODELS

    path = models / "tokenizer.bin"
    path.write_bytes(damage(path.read_bytes()))
    for command in ("run", "chat", "serve"):
        err = one_line_status_2(capsys, [command, "--models", str(models), "--verifier", "cpu", "--drafter", "cpu"])
        assert err == "specmesh %s: error: %s%s: copy the models' own tokenizer.bin there again (the shipped one is in " \
            "%s)\n" % (command, str(models) + os.sep, words, MODELS), err


@pytest.mark.parametrize("name", ["target.spm", "tokenizer.bin"])
def test_a_folder_in_a_files_place_is_said_as_one(models, capsys, no_board_starts, name):
    """A folder where the file should be (an unpacked archive, a `mkdir` typo) was said to be missing, with the advice
    to copy the file there, which puts it inside the folder and changes nothing."""
    from specmesh.host.layout import MODELS

    (models / name).unlink()
    (models / name).mkdir()
    err = one_line_status_2(capsys, ["run", "--models", str(models), "--verifier", "cpu", "--drafter", "cpu"])
    assert err == ("specmesh run: error: %s is a folder, not a file: remove it, then copy the file there from the "
                   "shipped models (%s), or give the folder that holds it with --models\n" % (models / name, MODELS))


@pytest.mark.parametrize("version", [1, 2])
def test_a_flipped_tokenizer_id_in_the_targets_header_names_the_target(models, capsys, no_board_starts, version):
    """A version 1 header is outside the CRC, so a flipped byte in the target's tokenizer id passes the file's checks;
    with the tokenizer and the drafter agreeing, the target is the odd one out. It was said as a drafter made with
    another tokenizer, to be replaced ('give a drafter trained with the target's tokenizer'). A version 2 file's CRC
    refuses it."""
    from specmesh.host.decode.tokenizer import byte_pieces, pack_vocab, read_llama2c_tokenizer, vocab_id
    from specmesh.shared.modelfile import Header
    from specmesh.host.backends.modelio import as_version_1
    from specmesh.tools.testmodels import random_tensors, write_model

    tid = vocab_id(pack_vocab(byte_pieces(read_llama2c_tokenizer(models / "tokenizer.bin")[0])))
    for path, h, seed in ((models / TARGET_FILE, Header(32, 2, 4, 2, 64, 512, 64, tokenizer_id=tid), 1),
                          (models / DRAFTER_FILE, Header(16, 1, 2, 1, 32, 512, 32, tokenizer_id=tid), 2)):
        write_model(path, h, random_tensors(h, seed))
    b = bytearray((models / TARGET_FILE).read_bytes())
    if version == 1:
        b = bytearray(as_version_1(bytes(b)))
    b[24] ^= 0x10  # the low byte of the header's tokenizer id
    (models / TARGET_FILE).write_bytes(bytes(b))
    err = one_line_status_2(capsys, ["run", "--models", str(models), "--verifier", "cpu", "--drafter", "virtual"])
    if version == 2:
        assert err == ("specmesh run: error: model file %s fails its CRC check: the file is corrupt, copy or export it "
                       "again\n" % (models / TARGET_FILE))
        return
    assert err == ("specmesh run: error: the target model %s records tokenizer id %08x, but tokenizer.bin and the "
                   "drafter %s have %08x: its header is corrupt or it was made with another tokenizer: copy it again, "
                   "or give the tokenizer and the drafter made with it\n" % (models / TARGET_FILE, tid ^ 0x10,
                                                                              models / DRAFTER_FILE, tid))


@pytest.mark.parametrize("victim", [TARGET_FILE, "tokenizer.bin", "prompt.txt", "card.json"])
def test_stats_json_over_a_file_the_run_reads_is_refused(models, tmp_path, capsys, no_board_starts, monkeypatch,
                                                         victim):
    """`--stats-json models/target.spm` (a slip of tab completion) replaced the model with the stats after a run that
    went well, and the next run refused the model as 'not a specmesh model file'; refused before anything starts,
    the file kept. `--stats-json models/card.json` (the model card's data, read for gamma auto's prior: here a copy)
    was written over, and every specmesh command after failed with a traceback."""
    from specmesh.host.provision import drafters

    (tmp_path / "prompt.txt").write_text("Once upon a time")
    (tmp_path / "card.json").write_bytes(drafters.CARD.read_bytes())
    monkeypatch.setattr(drafters, "CARD", tmp_path / "card.json")
    path = (tmp_path if victim in ("prompt.txt", "card.json") else models) / victim
    before = path.read_bytes()
    err = one_line_status_2(capsys, ["run", "--models", str(models), "--verifier", "cpu", "--drafter", "cpu",
                                     "--prompt-file", str(tmp_path / "prompt.txt"), "--stats-json", str(path)])
    assert err == ("specmesh run: error: --stats-json %s would overwrite %s, which this run reads: give the stats "
                   "another file\n" % (path, victim))
    assert path.read_bytes() == before


@pytest.mark.parametrize("text", [None, "", "{", '{"tokens": 4}', '{"drafters": {"drafter.spm": {"width": 64}}}'])
def test_an_unreadable_model_card_is_one_line_where_it_is_read(models, tmp_path, capsys, no_board_starts, monkeypatch,
                                                                text):
    """models/card.json missing, empty, cut short or replaced (a `specmesh bench --out models/card.json`) failed every
    specmesh command, --help and keygen too, on import with a traceback (KeyError: 'drafters'); now run and flash,
    which read it (gamma auto's prior, the drafter flash names), refuse to start in one line naming it, and the rest
    work on."""
    from specmesh.host.provision import drafters

    card = tmp_path / "card.json"
    if text is not None:
        card.write_text(text)
    shipped, line = drafters.read_card(card)
    assert shipped == {} and line.startswith("%s, the model card's data, cannot be read (" % card)
    assert line.endswith("): restore it (`git checkout models/card.json` in a checkout of specmesh, else install "
                         "specmesh again)")
    assert drafters.read_card(drafters.CARD)[1] is None  # the shipped one reads
    monkeypatch.setattr(drafters, "UNREADABLE", line)
    err = one_line_status_2(capsys, ["run", "--models", str(models), "--verifier", "cpu", "--drafter", "cpu"])
    assert err == "specmesh run: error: %s\n" % line
    assert cli.main(["flash", "--port", "/dev/ttyNOPE", "--role", "drafter"]) == 2
    assert capsys.readouterr().err == "specmesh flash: error: %s\n" % line
    assert cli.main(["keygen", "--key-file", str(tmp_path / "k")]) == 0


def test_a_damaged_model_card_is_read_on_import_without_a_traceback(models):
    """The same through the import, in a process of its own whose models/card.json reads as a cut-off `{`."""
    import subprocess
    import sys

    code = ("import pathlib, sys\n"
            "real = pathlib.Path.read_text\n"
            "pathlib.Path.read_text = lambda self, *a, **k: '{' if self.name == 'card.json' else real(self, *a, **k)\n"
            "from specmesh.host import cli\n"
            "sys.exit(cli.main(['run', '--models', %r, '--verifier', 'cpu', '--drafter', 'cpu']))\n" % str(models))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("specmesh run: error: ") and "card.json, the model card's data, cannot be read (" \
        "JSONDecodeError" in done.stderr and done.stderr.count("\n") == 1, done.stderr


@pytest.mark.parametrize("name, drafter", [(HOST_DRAFTER_FILE, "cpu"), ("drafter-esp32.spm", "virtual")])
def test_a_folder_in_a_class_drafters_place_is_refused_not_passed_over(models, capsys, no_board_starts, name,
                                                                        drafter):
    """A folder named drafter-host.spm or drafter-esp32.spm was taken for no file there: the run drafted with
    drafter.spm instead (on a classic ESP32 board from its ROMFS, slower), saying nothing."""
    from specmesh.host.layout import MODELS

    (models / name).mkdir()
    err = one_line_status_2(capsys, ["run", "--models", str(models), "--verifier", "cpu", "--drafter", drafter])
    assert err == ("specmesh run: error: %s is a folder, not a file: remove it, then copy the file there from the "
                   "shipped models (%s), or give the folder that holds it with --models\n" % (models / name, MODELS))

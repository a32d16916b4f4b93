"""`specmesh bench --port PORT` (host/projection/boardbench.py) on a virtual ESP32-S3 flashed as a verifier, and
`specmesh run --project esp32s3 --calibration FILE` pricing its projection with what it wrote."""

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specmesh.host import cli
from specmesh.host.layout import TARGET_FILE
from specmesh.host.projection.calibration import Rates
from specmesh.host.projection.costmodel import TERMS, pass_work
from specmesh.host.projection.hardware import ESP32S3
from specmesh.host.provision.flash import flash
from specmesh.shared.modelfile import HEADER_SIZE, parse_header

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    from specmesh.host.emulator import VirtualBoard

    vb = VirtualBoard(tmp_path_factory.mktemp("s3"), "esp32s3", name="calib").start()
    try:
        yield vb
    finally:
        vb.stop()


def test_a_board_without_the_node_is_told_to_flash_first(board, tmp_path, capsys):
    rc = cli.main(["bench", "--port", board.port, "--out", str(tmp_path / "c.json")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err  # found before any work: as run says it
    assert "has no specmesh node: flash it first (specmesh flash --port %s --role verifier)" % board.port in err
    assert not (tmp_path / "c.json").exists()


def test_a_virtual_board_is_named_by_its_class_not_the_host_vm(board):
    """The probe named a virtual S3 by its unix-port VM's build ("linux [GCC 14.2.1] version ..."), which `specmesh
    bench` printed and wrote into the calibration as the board; it is now the board's own name, as on a board."""
    from specmesh.host.boardclasses import BOARD_CLASSES
    from specmesh.host.provision.flash import close, open_board, probe

    transport = open_board(board.port, virtual=True)
    try:
        assert probe(transport).machine == BOARD_CLASSES["esp32s3"].machine
    finally:
        close(transport)


def test_bench_measures_every_term_and_run_projects_with_it(board, models, tmp_path, capsys):
    flash(board.port, "verifier", ROOT / "models" / TARGET_FILE, progress=False)  # returns with its node up
    path = tmp_path / "cal.json"
    boots = board.boots
    assert cli.main(["bench", "--port", board.port, "--out", str(path)]) == 0
    # the bench returns once the board's node is up again after its reset (its second boot: the first opened the raw
    # REPL), as a flash does: what runs next meets the node, not the old VM with the reset still to come
    assert board.boots == boots + 2 and board.wait_ready(after=boots + 1, limit=0) is None, (boots, board.boots)
    out = capsys.readouterr().out
    assert "written to %s" % path in out
    data = json.loads(path.read_text())
    held = set(TERMS) - {"weights_flash"}  # a PSRAM board keeps its model there, none on a ROMFS to time
    assert set(data["seconds_per_unit"]) == held
    assert all(v > 0 for v in data["seconds_per_unit"].values())
    assert data["board"]["platform"] == "linux" and data["board"]["arch"] == "x64"
    assert data["board"]["class"] == "esp32s3"  # what a run checks against the class it projects
    # every rate is timed on its own (kernels, and the engine's calls through kernels that return at once): each
    # whole pass is measured and projected with exactly the rates written, the pass's work times each term's rate
    # (how near they land depends on the machine's load, so it is not checked here)
    head = parse_header((ROOT / "models" / TARGET_FILE).read_bytes()[:HEADER_SIZE])
    for label, k, ctx in (("target token", 1, 33), ("target verify of 5", 5, 37)):
        c = data["check"][label]
        projected = 1e6 * sum(v * data["seconds_per_unit"][t] for t, v in pass_work(head, k, ctx).items())
        assert c["measured_us"] > 0 and c["projected_us"] == pytest.approx(projected, rel=1e-9)
        assert "%s: measured %.0f us, projected with these rates %.0f us" % (
            label, c["measured_us"], c["projected_us"]) in out
    assert 0 < data["check"]["interpreted calls between kernels, share of the target token"] < 1
    # a virtual board runs the kernels far faster than a 240 MHz Xtensa core: its calibration would project that
    # speed onto an S3, so it is refused for one, in one line
    stats_file = tmp_path / "stats.json"
    assert cli.main(["run", "--models", str(models), "--drafter", "cpu", "--verifier", "cpu", "--quiet", "--project",
                     "esp32s3", "--calibration", str(path)]) == 2
    err = capsys.readouterr().err
    assert "was measured on a virtual board (" in err and "not on an esp32s3: measure one with `specmesh bench" in err
    # the same file as an S3 writes it (its board fields): the run prices the projection with its rates
    data["board"].update(platform="esp32", arch="xtensawin", machine="Generic ESP32S3 module with ESP32S3")
    path.write_text(json.dumps(data))
    rates = Rates.load(path, ESP32S3)
    assert rates.measured == held and "calibrated on" in rates.source
    assert rates.seconds["matmul_1"] < Rates.derived(ESP32S3).seconds["matmul_1"] / 10
    rc = cli.main(["run", "--models", str(models), "--drafter", "cpu", "--verifier", "cpu", "--max-tokens", "12",
                   "--project", "esp32s3", "--calibration", str(path), "--stats-json", str(stats_file)])
    assert rc == 0
    table = capsys.readouterr().err.splitlines()  # the table is on stderr
    at = next(i for i, x in enumerate(table) if x.startswith("projection rates"))
    wrapped = itertools.takewhile(lambda x: x.startswith(" " * 10), table[at + 1:])  # the value's lines past 100
    line = " ".join([table[at]] + [x.strip() for x in wrapped])
    assert line.split(None, 2)[2].startswith("calibrated on") and "%d of %d terms measured" % (len(held), len(TERMS)) in line
    calibrated = json.loads(stats_file.read_text())["projection"]
    assert cli.main(["run", "--models", str(models), "--drafter", "cpu", "--verifier", "cpu", "--max-tokens", "12",
                     "--quiet", "--project", "esp32s3", "--stats-json", str(stats_file)]) == 0
    derived = json.loads(stats_file.read_text())["projection"]
    assert derived["rates"] == "derived (host/projection/hardware.py)"
    assert calibrated["plain_tokens_per_s"] > derived["plain_tokens_per_s"]


@pytest.mark.parametrize("out", ["-", "/dev/stdout"])
def test_a_calibration_to_stdout_is_its_json_alone(board, capfd, out):
    """`specmesh bench --out -` wrote the calibration's JSON to stdout and its report after it, so `| jq` read "Extra
    data"; the report now goes to stderr, as run's with --stats-json -."""
    flash(board.port, "verifier", ROOT / "models" / TARGET_FILE, progress=False)  # as the test above left it
    capfd.readouterr()
    assert cli.main(["bench", "--port", board.port, "--out", out]) == 0
    said = capfd.readouterr()
    assert set(json.loads(said.out)["seconds_per_unit"]) >= {"matmul_1", "engine"}
    assert "calibration of %s " % board.port in said.err and "target token: measured" in said.err


def _flashed_and_benched(tmp_path, capsys, role: str, *flags: str) -> tuple[str, dict]:
    """A virtual classic ESP32 flashed `--role role` (and `flags`) by the CLI, then benched: what both printed, and
    the calibration written."""
    from specmesh.host.emulator import VirtualBoard

    vb = VirtualBoard(tmp_path / "esp32", "esp32", name=role).start()
    try:
        assert cli.main(["flash", "--port", vb.port, "--role", role, *flags]) == 0
        path = tmp_path / "cal.json"
        assert cli.main(["bench", "--port", vb.port, "--out", str(path)]) == 0, capsys.readouterr().err
    finally:
        vb.stop()
    return capsys.readouterr().out, json.loads(path.read_text())


def test_bench_of_a_classic_esp32_drafter_board_times_its_drafter(tmp_path, capsys):
    """The board script timed a whole token only of models/drafter.spm or target.spm (or /rom/ ones): on a classic
    ESP32 drafter board, which runs models/drafter-esp32.spm, it timed no token and no `engine` rate, said nothing,
    and wrote a calibration without them. It now times the model specmesh.json names; its stream buffer, which
    the script's own code left no free block for, is halved until one holds it (was a MemoryError)."""
    out, data = _flashed_and_benched(tmp_path, capsys, "drafter")
    assert "drafter-esp32.spm" in out
    assert data["seconds_per_unit"]["engine"] > 0
    assert data["measured"]["drafter"][1] == "2 layers x 40 dim, vocab 512"  # drafter-esp32.spm
    c = data["check"]["drafter token"]
    assert "drafter token: measured %.0f us, projected with these rates %.0f us" % (
        c["measured_us"], c["projected_us"]) in out
    assert "term                 measured  derived esp32" in out  # the class's own rates (it said "derived S3")


def test_bench_of_a_pipeline_stage_board_times_its_stage_pass(tmp_path, capsys):
    """On a board flashed --role stage the board script timed no token (its config names no drafter or target): the
    calibration had no `engine` rate and no whole-pass check, and nothing said why. It now times the stage's own pass
    of one position through its layers (without the classifier), and the same through the stubs."""
    out, data = _flashed_and_benched(tmp_path, capsys, "stage", "--layers", "3:5")  # a stage's board class
    assert data["seconds_per_unit"]["engine"] > 0
    assert data["measured"]["stage"][1:] == ["5 layers x 64 dim, vocab 512", data["measured"]["stage"][2], [3, 5]]
    head = parse_header((ROOT / "models" / TARGET_FILE).read_bytes()[:HEADER_SIZE])
    c = data["check"]["stage pass of layers 3:5"]
    work = pass_work(head, 1, 33, (3, 5), classifier=False)
    projected = 1e6 * sum(v * data["seconds_per_unit"][t] for t, v in work.items())
    assert c["measured_us"] > 0 and c["projected_us"] == pytest.approx(projected, rel=1e-9)
    assert "stage pass of layers 3:5: measured %.0f us, projected with these rates %.0f us" % (
        c["measured_us"], c["projected_us"]) in out
    assert 0 < data["check"]["interpreted calls between kernels, share of the stage pass"] < 1


def test_bench_of_a_half_flashed_board_says_to_finish_the_flash(tmp_path, capsys):
    """A board left half-flashed (its config marked "flashing", the model the flash had removed not written yet) was
    benched with its config's model: "the benchmark failed on the board: OSError: [Errno 2] ENOENT", status 1, and
    no way on. It is now told as run tells it, with the flash that finishes it, before the benchmark runs."""
    from specmesh.host.emulator import VirtualBoard

    vb = VirtualBoard(tmp_path / "s3", "esp32s3", name="half").start()
    try:
        flash(vb.port, "verifier", ROOT / "models" / TARGET_FILE, progress=False, reset=False)
        config = vb.flash_dir / "specmesh.json"  # what a flash interrupted while it wrote the model leaves
        config.write_text(json.dumps(dict(json.loads(config.read_text()), flashing="verifier")))
        (vb.flash_dir / "models" / TARGET_FILE).unlink()
        rc = cli.main(["bench", "--port", vb.port, "--out", str(tmp_path / "c.json")])
    finally:
        vb.stop()
    assert rc == 2 and capsys.readouterr().err == (
        "specmesh bench: error: %s: the board was left half-flashed (a `specmesh flash` was interrupted); finish it "
        "with `specmesh flash --port %s --role verifier`, then bench it\n" % (vb.port, vb.port))
    assert not (tmp_path / "c.json").exists()


def test_a_model_the_heap_left_no_room_for_is_said_not_timed():
    """Where the board script could not load the node's model beside its own code (its MemoryError: "no heap"), the
    report said nothing of it: no token line, no engine rate, and a user could not tell why. It now says so."""
    from specmesh.host.projection.boardbench import modeled, rates, report

    measured = {name: 10.0 for name in modeled()} | {"stream": [4096, 50.0], "stage": "no heap"}
    s, check = rates(measured)
    result = {"board": {"port": "/dev/ttyUSB0", "machine": "ESP32", "micropython": "1.28.0"}, "seconds_per_unit": s,
              "measured": measured, "check": check, "class": "esp32"}
    lines = report(result, "c.json")
    assert "engine" not in s and check == {}
    assert ("stage pass: not timed: the heap left no room for the model beside the benchmark's code, so the engine "
            "rate is the derived one") in lines


@pytest.mark.parametrize("content, message", [
    (None, "not found: write one with `specmesh bench --port PORT --out FILE`"),
    # was "is not valid JSON (IsADirectoryError)", then "cannot be read: Is a directory" (no way on)
    ("FOLDER", "is a folder: name the calibration file in it (the one `specmesh bench --out FILE` wrote)"),
    # a device: was read as it comes ("is not valid JSON" of /dev/null; /dev/zero until memory ran out)
    ("/dev/null", "is not a regular file (a FIFO, a device or a socket): give the file `specmesh bench` wrote"),
    ("{not json", "is not valid JSON"),
    ('{"format": "other"}', "is not a specmesh calibration"),
    ('{"format": "specmesh-calibration", "version": 1, "seconds_per_unit": {"matmul_1": -1}}',
     "has no valid seconds_per_unit"),
    ('{"format": "specmesh-calibration", "version": 1, "seconds_per_unit": {"warp": 1e-9}}',
     "has no valid seconds_per_unit"),
    ('{"format": "specmesh-calibration", "version": 1, "seconds_per_unit": {"matmul_1": 1e308}}',
     "has no valid seconds_per_unit (terms: matmul_1"),  # its sums were inf, the stats JSON's NaN
    ('{"format": "specmesh-calibration", "version": 1, "seconds_per_unit": {"matmul_1": 1e-9}, "board": [1]}',
     "has a board that is not an object"),  # was "'list' object has no attribute 'get'"
])
def test_a_missing_or_corrupt_calibration_is_one_line_and_status_2(models, tmp_path, capsys, content, message):
    path = tmp_path / "cal.json"
    if content == "FOLDER":
        path.mkdir()
    elif content == "/dev/null":
        path = content
    elif content is not None:
        path.write_text(content)
    rc = cli.main(["run", "--models", str(models), "--drafter", "cpu", "--verifier", "cpu", "--quiet",
                   "--project", "esp32s3", "--calibration", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "calibration file %s %s" % (path, message) in err


def test_a_fifo_as_the_calibration_is_refused_at_once(models, tmp_path):
    """A FIFO named as --calibration (or --drafter-calibration) was waited for forever, no writer coming: now one
    line naming it, status 2, before it is opened."""
    fifo = tmp_path / "cal.json"
    os.mkfifo(fifo)
    for flag in ("--calibration", "--drafter-calibration"):
        out = subprocess.run([sys.executable, "-m", "specmesh.host.cli", "run", "--models", str(models), "--quiet",
                              "--verifier", "cpu", "--project", "esp32s3", flag, str(fifo)], cwd=ROOT,
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        assert (out.returncode, out.stderr) == (2, "specmesh run: error: calibration file %s is not a regular file (a "
                                                   "FIFO, a device or a socket): give the file `specmesh bench` wrote\n"
                                                % fifo)


def test_a_drafter_calibration_from_a_virtual_board_names_its_own_flag(models, tmp_path, capsys):
    """`specmesh bench` on a virtual board, given as --drafter-calibration: the line said 'or drop --calibration',
    a flag the command did not have."""
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"format": "specmesh-calibration", "version": 1, "seconds_per_unit": {"matmul_1": 1e-9},
                                "board": {"platform": "linux", "arch": "x64", "machine": "virtual"}}))
    rc = cli.main(["run", "--models", str(models), "--verifier", "cpu", "--quiet", "--project", "esp32s3",
                   "--drafter-calibration", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.endswith("not on an esp32: measure one with `specmesh bench --port PORT` on a flashed esp32, "
                        "or drop --drafter-calibration\n"), err


def test_calibration_without_a_projection_is_refused(models, tmp_path, capsys):
    rc = cli.main(["run", "--models", str(models), "--drafter", "cpu", "--verifier", "cpu", "--quiet",
                   "--calibration", str(tmp_path / "c.json")])
    assert rc == 2 and "--calibration prices a projection: add --project esp32s3" in capsys.readouterr().err


def test_a_calibration_for_a_pipeline_is_refused(models, tmp_path, capsys):
    """run --stages N --project esp32s3 --calibration FILE projected the pipeline exactly as without the file (its
    projection takes no rates), and nothing said so."""
    (tmp_path / "c.json").write_text(json.dumps({"format": "specmesh-calibration", "version": 1, "board": {
        "machine": "S3 devkit"}, "seconds_per_unit": {"matmul_1": 1e-9}}))
    rc = cli.main(["run", "--models", str(models), "--stages", "2", "--quiet", "--project", "esp32s3",
                   "--calibration", str(tmp_path / "c.json")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.endswith(
        "--calibration prices a single verifier board: a pipeline (--stages, or --verifier PORT1,PORT2,...) is "
        "projected from its stages' derived rates, which take no calibration: drop --calibration\n"), err


def test_a_partial_calibration_keeps_the_derived_rates_of_the_other_terms(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"format": "specmesh-calibration", "version": 1, "board": {"machine": "S3 devkit"},
                                "seconds_per_unit": {"matmul_1": 1e-9}}))
    rates, derived = Rates.load(path, ESP32S3), Rates.derived(ESP32S3)
    assert rates.seconds["matmul_1"] == 1e-9 and rates.measured == {"matmul_1"}
    assert {t: v for t, v in rates.seconds.items() if t != "matmul_1"} == {
        t: v for t, v in derived.seconds.items() if t != "matmul_1"}
    assert rates.source.startswith("calibrated on S3 devkit (") and "1 of %d terms measured" % len(TERMS) in rates.source


def test_a_drafter_calibration_prices_the_drafter_board_and_says_so(tmp_path):
    from specmesh.host.backends.modelio import check_model_file
    from specmesh.host.boardclasses import ESP32
    from specmesh.host.layout import MODELS
    from specmesh.host.projection.hardware import BOARDS
    from specmesh.host.projection.rounds import Projector

    path = tmp_path / "drafter-cal.json"
    path.write_text(json.dumps({"format": "specmesh-calibration", "version": 1, "board": {"machine": "ESP32 devkit"},
                                "seconds_per_unit": {"matmul_1": 1e-7}}))
    target = check_model_file(MODELS / TARGET_FILE)[0]
    drafter = check_model_file(MODELS / ESP32.drafter)[0]
    derived = Projector(target, drafter, drafter_board=ESP32.name)
    calibrated = Projector(target, drafter, drafter_board=ESP32.name, drafter_rates=Rates.load(path, BOARDS["esp32"]))
    assert calibrated.draft_pass(40) > derived.draft_pass(40)  # its matmuls measured slower than derived
    assert calibrated.plain_round(40) == derived.plain_round(40)  # the verifier keeps its own rates
    assert calibrated.drafter_rates.source.startswith("calibrated on ESP32 devkit")


@pytest.mark.parametrize("extra, message", [
    ([], "--drafter-calibration prices a projection: add --project esp32s3"),
    (["--project", "esp32s3", "--drafter", "cpu"], "--drafter-calibration prices a drafter board"),
])
def test_a_drafter_calibration_needs_a_projected_drafter_board(models, tmp_path, capsys, extra, message):
    rc = cli.main(["run", "--models", str(models), "--verifier", "cpu", "--quiet", *extra,
                   "--drafter-calibration", str(tmp_path / "c.json")])
    assert rc == 2 and message in capsys.readouterr().err


def test_a_calibration_goes_where_a_shells_redirection_would(tmp_path):
    """--out names an output as `>` does (host/atomic.py write_output): a symlink stays a link to the file written, a
    device is written, never replaced by a file (bench --out /dev/full made /dev/full a file), and its failure is an
    OSError, which bench says in one line."""
    import os
    import stat

    from specmesh.host.projection.calibration import write

    real, link = tmp_path / "real.json", tmp_path / "link.json"
    link.symlink_to(real)
    write(link, {"name": "esp32s3"}, {}, {}, {})
    assert link.is_symlink() and json.loads(real.read_text())["board"] == {"name": "esp32s3"}
    with pytest.raises(OSError) as e:
        write("/dev/full", {}, {}, {}, {})
    assert e.value.errno == 28 and stat.S_ISCHR(os.stat("/dev/full").st_mode)


@pytest.mark.parametrize("flag, drafter", [("--calibration", "cpu"), ("--drafter-calibration", "virtual")])
def test_a_calibration_of_another_class_with_the_same_arch_is_refused(models, tmp_path, capsys, flag, drafter):
    """A classic ESP32's calibration given for an S3 (or an S3's for the classic ESP32 drafter board): both are
    xtensawin, so the arch check passed it and the run priced the S3 with the ESP32's measured rates, saying only
    "calibrated on Generic ESP32 module". The class `specmesh bench` writes is checked: one line, status 2."""
    board, cls, want = ({"machine": "Generic ESP32 module with ESP32", "class": "esp32"}, "esp32", "esp32s3") \
        if flag == "--calibration" else ({"machine": "Generic ESP32S3 module with ESP32S3", "class": "esp32s3"},
                                         "esp32s3", "esp32")
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"format": "specmesh-calibration", "version": 1, "seconds_per_unit": {"matmul_1": 1e-7},
                                "board": dict(board, platform="esp32", arch="xtensawin")}))
    assert cli.main(["run", "--models", str(models), "--verifier", "cpu", "--drafter", drafter, "--quiet", "--project",
                     "esp32s3", flag, str(path)]) == 2
    err = capsys.readouterr().err
    assert err == ("specmesh run: error: calibration file %s was measured on an %s board (%s), not on an %s: measure "
                   "one with `specmesh bench --port PORT` on a flashed %s, or drop %s\n"
                   % (path, cls, board["machine"], want, want, flag)), err


def test_a_model_damaged_on_the_board_tells_to_flash_it_again(board, tmp_path, capsys):
    """The board's copy of its model, damaged on its filesystem since the flash: the bench failed with the board's
    'the file is corrupt, copy it again' and no way to do that; it now names the flash that does (status 1, as every
    benchmark the board fails)."""
    flash(board.port, "verifier", ROOT / "models" / TARGET_FILE, progress=False)
    on_board = board.flash_dir / "models" / TARGET_FILE
    b = bytearray(on_board.read_bytes())
    b[len(b) // 2] ^= 0x20
    on_board.write_bytes(bytes(b))
    try:
        assert cli.main(["bench", "--port", board.port, "--out", str(tmp_path / "c.json")]) == 1
        assert capsys.readouterr().err == (
            "specmesh bench: error: the benchmark failed on the board: ModelFileError: model file fails its CRC check: "
            "the file is corrupt, copy it again; flash it again: `specmesh flash --port %s --role verifier`\n"
            % board.port)
        assert not (tmp_path / "c.json").exists()
    finally:
        b[len(b) // 2] ^= 0x20
        on_board.write_bytes(bytes(b))

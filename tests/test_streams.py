"""host/cli/streams.py: a write to stdout that fails (a full disk behind `>`, here /dev/full) ends `specmesh` and
every tool with one line naming stdout and status 1, whether Python buffers stdout (a user's shell) or not
(PYTHONUNBUFFERED=1); a reader that left stays quiet (tests/test_bench_report.py, tests/test_cli_run.py)."""

import os
import subprocess
import sys

import pytest

from specmesh.host import atomic, cli
from specmesh.host.cli.streams import writing_stdout
from specmesh.host.layout import ROOT


def _run(argv: list[str], buffered: bool, stdout: int) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONUNBUFFERED", "SPECMESH_DEBUG")}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    done = subprocess.run([sys.executable, "-m", *argv], stdout=stdout, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                          env=env, timeout=120)
    return done.returncode, done.stderr


def _to_full(argv: list[str], buffered: bool) -> tuple[int, str]:
    with open("/dev/full", "w") as full:
        return _run(argv, buffered, full.fileno())


def _to_a_reader_gone(argv: list[str], buffered: bool) -> tuple[int, str]:
    """`specmesh ... | true`: stdout a pipe whose reader closed it before the first write."""
    read, write = os.pipe()
    os.close(read)
    try:
        return _run(argv, buffered, write)
    finally:
        os.close(write)


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_a_tool_and_specmesh_writing_to_a_full_device_say_stdout_in_one_line(tmp_path, buffered):
    """`bench codec > /dev/full` said "bench: [Errno 28] No space left on device", as if a file it reads were at
    fault; `specmesh --version > /dev/full` was an OSError traceback (buffered: "Exception ignored", status 120)."""
    assert _to_full(["specmesh.tools.bench", "codec", "--report", str(tmp_path)], buffered) == (
        1, "bench: error: cannot write to stdout: No space left on device\n")
    assert _to_full(["specmesh", "--version"], buffered) == (
        1, "specmesh: error: cannot write to stdout: No space left on device\n")


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_help_to_a_full_device_is_one_line_too(buffered):
    """`specmesh --help > /dev/full` with PYTHONUNBUFFERED=1 said nothing and exited 0, the help lost: argparse
    ignores its write's OSError; buffered, the flush after it failed (one line, 1). Now both say so."""
    for argv, who in ((["specmesh", "--help"], "specmesh"), (["specmesh", "run", "--help"], "specmesh run"),
                      (["specmesh.tools.bench", "--help"], "bench")):
        assert _to_full(argv, buffered) == (1, "%s: error: cannot write to stdout: No space left on device\n" % who), argv


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_help_to_a_reader_that_left_is_quiet_and_141(buffered):
    """`PYTHONUNBUFFERED=1 specmesh --help | true` exited 0, as if the help had been read: argparse ignores its
    write's BrokenPipeError, and only a full device's failure was kept for its exit; buffered, the flush after it
    failed (quiet, 141). Now both are 141, as `specmesh run ... | true` is."""
    for argv in (["specmesh", "--help"], ["specmesh", "run", "--help"], ["specmesh.tools.bench", "--help"]):
        assert _to_a_reader_gone(argv, buffered) == (141, ""), argv


def test_what_print_left_in_the_buffer_fails_inside_the_command_not_at_exit(monkeypatch, capsys):
    monkeypatch.delenv("SPECMESH_DEBUG", raising=False)
    with open("/dev/full", "w") as full:  # buffered: print() succeeds, the flush fails
        monkeypatch.setattr(sys, "stdout", full)
        assert writing_stdout("tool", lambda: print("figures") or 0) == 1
        assert sys.stdout is full
    assert capsys.readouterr().err == "tool: error: cannot write to stdout: No space left on device\n"


def test_a_reader_that_left_is_quiet(monkeypatch, capsys):
    def leaves() -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("specmesh.host.cli.streams.stdout_to_devnull", lambda: None)
    assert writing_stdout("tool", leaves) == 141 and capsys.readouterr().err == ""


def test_json_sent_to_stdout_fails_as_stdout_does(monkeypatch, capsys):
    """`run --stats-json - | jq` whose reader left said 'specmesh run: error: cannot write -: Broken pipe', status 1,
    and at a full disk 'cannot write -: ...' (bench --out - the same): the write's OSError met the handler of a file
    the command names. Now stdout's: quiet and 141, or one line naming stdout and 1."""
    run = ["specmesh", "run", "--drafter", "cpu", "--verifier", "cpu", "-n", "4", "--quiet", "--stats-json", "-"]
    text = "Once upon a time, there was a\n"  # on stderr: stdout holds the JSON alone
    assert _to_a_reader_gone(run, buffered=False) == (141, text)
    assert _to_full(run, buffered=True) == (1, text + "specmesh run: error: cannot write to stdout: No space left on "
                                            "device\n")
    monkeypatch.delenv("SPECMESH_DEBUG", raising=False)
    monkeypatch.setattr("specmesh.host.projection.boardbench.bench", lambda _port, out, **_: atomic.write_output(out, "{}"))
    with open("/dev/full", "w") as full:
        monkeypatch.setattr(sys, "stdout", full)
        assert cli.main(["bench", "--port", "loop://", "--out", "-"]) == 1
    assert capsys.readouterr().err == "specmesh bench: error: cannot write to stdout: No space left on device\n"

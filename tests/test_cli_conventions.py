"""The command line's conventions (host/cli/flags.py, host/cli/run.py, host/cli/__init__.py): the text alone on
stdout, stats and progress on stderr (`--quiet` silences them), `--stats-json -` the JSON on stdout instead of
the text; llama.cpp's spellings as aliases; an unknown flag gets its subcommand's usage and a suggestion."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from specmesh.host import cli
from specmesh.host.cli.flags import add_arguments

ROOT = Path(__file__).resolve().parent.parent


def parse(*argv: str) -> dict:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return vars(p.parse_args(list(argv)))


def test_every_llama_cpp_spelling_is_an_alias_of_the_long_flag(tmp_path):
    short = parse("-m", "t.spm", "-md", "d.spm", "-p", "Hi", "-n", "7", "-s", "3", "--temp", "0.5", "-r", ".",
                  "-r", "!", "--draft-max", "4")
    long = parse("--model", "t.spm", "--draft-model", "d.spm", "--prompt", "Hi", "--max-tokens", "7", "--seed", "3",
                 "--temperature", "0.5", "--stop", ".", "--stop", "!", "--draft-max", "4")
    assert short == long
    assert parse("--model-draft", "d.spm", "--n-predict", "7", "--reverse-prompt", ".") == parse(
        "--draft-model", "d.spm", "--max-tokens", "7", "--stop", ".")
    assert parse("-f", "p.txt") == parse("--file", "p.txt") == parse("--prompt-file", "p.txt")


def _run(models, *argv, **kw):
    return subprocess.run([sys.executable, "-m", "specmesh", "run", "--models", str(models), "--verifier", "cpu",
                           "--drafter", "cpu", "--no-color", *argv], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, **kw)


def test_text_on_stdout_stats_on_stderr_quiet_and_json_on_stdout_only_when_asked(models, tmp_path):
    (tmp_path / "p.txt").write_text("The cat\n")
    stats_file = tmp_path / "s.json"
    done = _run(models, "-f", str(tmp_path / "p.txt"), "-n", "12", "--temp", "0.7", "-s", "5", "--draft-max", "3",
                "--stats-json", str(stats_file))
    stats = json.loads(stats_file.read_text())
    assert done.returncode == 0 and done.stdout == "The cat" + stats["text"] + "\n"
    assert "tokens / verification" in done.stderr and stats["seed"] == 5 and stats["temperature"] == 0.7
    assert max(int(g) for g in stats["gamma_hist"]) <= 3
    quiet = _run(models, "-p", "The cat", "-n", "12", "--temp", "0.7", "-s", "5", "--draft-max", "3", "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout == done.stdout
    as_json = _run(models, "-p", "The cat", "-n", "12", "--temp", "0.7", "-s", "5", "--draft-max", "3", "--stats-json", "-",
                   "--quiet")
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["token_ids"] == stats["token_ids"]


def test_the_story_alone_lands_in_the_file_stdout_is_sent_to(tmp_path):
    """The issue's command as written, on the default virtual boards and the shipped models."""
    out = tmp_path / "out.txt"
    with out.open("w") as f:
        done = subprocess.run([sys.executable, "-m", "specmesh", "run", "-p", "Once upon a time", "-n", "32",
                               "--stats-json", str(tmp_path / "s.json")], stdout=f, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    text = json.loads((tmp_path / "s.json").read_text())["text"]
    assert out.read_text() == "Once upon a time" + text + "\n" and len(text.split()) > 10
    assert "tokens / s" in done.stderr and "booting" in done.stderr


@pytest.mark.parametrize("argv, usage, hint", [
    (["run", "--temprature", "1"], "usage: specmesh run ", "; did you mean --temperature?"),
    (["run", "--draft-modle", "x"], "usage: specmesh run ", "; did you mean --draft-model?"),
    (["chat", "--seeed", "1"], "usage: specmesh chat ", "; did you mean --seed?"),
    (["emulate", "--bords", "2"], "usage: specmesh emulate ", "; did you mean --boards?"),
    (["run", "--json", "x"], "usage: specmesh run ", "; did you mean --stats-json?"),
    (["run", "--zzzz"], "usage: specmesh run ", ""),
    # a bare word: the flag whose value it is
    (["run", "Once", "upon"], "usage: specmesh run ", "; did you mean --prompt 'Once upon'?"),
    (["run", "esp32s3"], "usage: specmesh run ", "; did you mean --project esp32s3?"),
    (["bench", "/dev/ttyUSB0"], "usage: specmesh bench ", "; did you mean --port /dev/ttyUSB0?"),
    (["bench", "u0"], "usage: specmesh bench ", "; did you mean --port u0?"),  # mpremote's name for /dev/ttyUSB0
    (["emulate", "3"], "usage: specmesh emulate ", "; did you mean --boards 3?"),
    (["chaos", "lossy-serial"], "usage: specmesh chaos ", "; did you mean --profile lossy-serial?"),
    # a port, but of which role: both offered, neither guessed
    (["run", "/dev/ttyUSB0"], "usage: specmesh run ",
     "; did you mean --verifier /dev/ttyUSB0 or --drafter /dev/ttyUSB0?"),
    (["chat", "COM3"], "usage: specmesh chat ", "; did you mean --verifier COM3 or --drafter COM3?"),
    (["run", "a0"], "usage: specmesh run ", "; did you mean --verifier a0 or --drafter a0?"),  # not --prompt a0
    (["serve", "/dev/ttyACM0"], "usage: specmesh serve ",  # not its --port: that is the TCP one
     "; did you mean --verifier /dev/ttyACM0 or --drafter /dev/ttyACM0?"),
    # a required flag mistyped: its closest spelling, where argparse said only "required: --role"
    (["flash", "--roel", "drafter"], "usage: specmesh flash ", "; did you mean --role?"),
    (["keygen", "--keyfile", "k"], "usage: specmesh keygen ", "; did you mean --key-file?"),
    (["keygen", "my.key"], "usage: specmesh keygen ", "; did you mean --key-file my.key?"),  # its one required flag
    (["flash", "nosuch"], "usage: specmesh flash ", ""),  # not --role nosuch: no such role
])
def test_an_unknown_flag_gets_the_subcommand_s_usage_and_the_closest_flag(capsys, argv, usage, hint):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(usage)
    assert err.splitlines()[-1] == "specmesh %s: error: unrecognized arguments: %s%s" % (argv[0], " ".join(argv[1:]),
                                                                                       hint)


@pytest.mark.parametrize("argv, flag", [(["flash"], "--role"), (["flash", "--port", "u0"], "--role"),
                                        (["keygen"], "--key-file")])
def test_a_required_flag_left_out_is_still_named(capsys, argv, flag):
    """Required flags are checked after the unknown ones (so a mistyped one gets its closest spelling): one left out
    is named as argparse named it, status 2, before any work."""
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("usage: specmesh %s " % argv[0])
    assert err.splitlines()[-1] == "specmesh %s: error: the following arguments are required: %s" % (argv[0], flag)


@pytest.mark.parametrize("flag", ["--models", "--prompt-file", "--model", "--draft-model", "--key-file", "--calibration",
                                  "--drafter-calibration"])
def test_an_empty_path_is_refused_not_read_as_this_folder(flag, capsys):
    """`--models "$DIR"` with DIR unset: Path("") is ".", which was read as the models folder without a word."""
    with pytest.raises(SystemExit) as e:
        parse(flag, "")
    err = capsys.readouterr().err
    assert e.value.code == 2 and "is empty: give a path" in err
    assert any("argument %s" % name in err for name in (flag, "-m", "-md", "-f"))  # argparse names the first spelling


def _fails(monkeypatch, where: str, error: Exception) -> None:
    """`where` ("module:name"), the work a command calls, raises `error` when called."""
    module, name = where.split(":")

    def raises(*_a, **_k):
        raise error

    monkeypatch.setattr("%s.%s" % (module, name), raises)


@pytest.mark.parametrize("argv, where, make", [
    (["flash", "--port", "loop://", "--role", "drafter"], "specmesh.host.provision.flash:flash_checked", "FlashError"),
    (["bench", "--port", "loop://", "--out", "-"], "specmesh.host.projection.boardbench:bench", "FlashError"),
    (["emulate", "--boards", "1"], "specmesh.host.emulator.session:Emulation", "BoardError"),
    (["chaos", "--profile", "lossy-serial"], "specmesh.host.cli.chaos:run", "BackendError"),
])
def test_a_failure_while_working_says_error_as_a_usage_error_does(monkeypatch, capsys, argv, where, make):
    """Status 1 is the failure, "error:" every failure's word: flash, bench, emulate and chaos said theirs bare
    ('specmesh flash: PORT: the board stopped answering ...'), run, chat and serve (and their usage errors, 2) with
    "error:", so a script's `grep error:` missed the one that broke off a flash."""
    from specmesh.host.backends import BackendError
    from specmesh.host.emulator import BoardError
    from specmesh.host.provision.flash import FlashError

    error = {"FlashError": FlashError, "BoardError": BoardError, "BackendError": BackendError}[make]("it broke")
    _fails(monkeypatch, where, error)
    assert cli.main(argv) == 1
    assert capsys.readouterr().err.splitlines()[-1] == "specmesh %s: error: it broke" % argv[0]


@pytest.mark.parametrize("argv, usage", [(["help"], "usage: specmesh [-h]"), (["help", "run"], "usage: specmesh run "),
                                         (["help", "chat"], "usage: specmesh chat ")])
def test_help_as_a_command_is_the_help_flag(capsys, argv, usage):
    """`specmesh help [COMMAND]` (git's and pip's spelling) was "invalid choice: 'help'": it is `--help`, status 0."""
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 0 and capsys.readouterr().out.startswith(usage)


@pytest.mark.parametrize("argv, needed", [(["flash", "--help"], " --role {drafter,verifier,stage}\n"),
                                          (["keygen", "-h"], " --key-file F\n"), (["help", "flash"], " --role ")])
def test_help_shows_a_required_flag_as_required(capsys, argv, needed):
    """The usage of `flash --help` read `[--role {drafter,verifier,stage}]` and keygen's `[--key-file F]`, as if
    optional (the parse that checks required flags after unknown ones had them unrequired while --help printed);
    --role had no help line either."""
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    out = capsys.readouterr().out
    usage = out.split("\n\n")[0]
    assert e.value.code == 0 and needed.rstrip("\n") in usage and "[" + needed.strip() not in usage
    if argv[0] == "flash" or argv[1:] == ["flash"]:
        assert "what the board does: drafter, verifier, or stage" in out

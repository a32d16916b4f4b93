"""The tools' command lines (python -m specmesh.tools.NAME) as a user meets them where a dependency is missing:
one line saying what to install, never a traceback; and the name each gives itself."""

import os
import subprocess
import sys

import pytest

from specmesh.host.layout import DRAFTER_FILE, MODELS
from tests.conftest import ROOT

COMMANDS = sorted(p.stem for p in (ROOT / "tools").glob("*.py") if "\n    run_tool(" in p.read_text())
MODULES = {"modeldefs", "nodeproc", "reference", "testmodels"}  # imported by the tools and tests; no commands
NEEDS_TORCH = {"export", "train", "train_all"}


def test_a_tool_whose_virtual_board_needs_qemu_says_what_to_install_in_one_line(tmp_path):
    """frame_cost counts on a virtual ESP32-C3 under QEMU: without qemu-system-riscv32 on the PATH it was the
    emulator's BoardError as a traceback."""
    env = dict(os.environ, PATH=str(tmp_path))  # an empty folder: no qemu-system-riscv32 (python is named in full)
    done = subprocess.run([sys.executable, "-m", "specmesh.tools.frame_cost"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (1, "frame_cost: qemu-system-riscv32 is missing: install QEMU: sudo "
                                                 "apt-get install qemu-system-misc (README: With boards)\n")



def test_a_stray_argument_to_frame_cost_is_a_usage_error_not_a_run(tmp_path):
    """frame_cost took no arguments and looked at none: `--help` or a typo started the virtual board's count (here,
    with no QEMU on the PATH, said it was missing)."""
    env = dict(os.environ, PATH=str(tmp_path))
    for argv, status, says in ((["--help"], 0, "usage: python -m specmesh.tools.frame_cost [-h]"),
                               (["-n", "3"], 2, "error: unrecognized arguments: -n 3")):
        done = subprocess.run([sys.executable, "-m", "specmesh.tools.frame_cost", *argv], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == status and says in done.stdout + done.stderr, done


@pytest.mark.parametrize("name", COMMANDS)
def test_a_tools_usage_names_the_command_a_user_types(name):
    """`python -m specmesh.tools.export --help` said "usage: export.py ...", a name no shell runs (argparse takes the
    file's); every tool's usage now starts with the command that runs it."""
    if name in NEEDS_TORCH:
        pytest.importorskip("torch", reason="%s needs PyTorch: without it, it says how to install it" % name)
    done = subprocess.run([sys.executable, "-m", "specmesh.tools." + name, "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m specmesh.tools.%s " % name), done.stdout.splitlines()[:1]


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")  # run as __main__ where tests imported it
@pytest.mark.parametrize("name", COMMANDS)
def test_a_tools_help_says_what_every_flag_is(name, monkeypatch):
    """--help listed flags with no word of what they take (export's --model and --out, modelcard's --prompts and --new,
    train's --lr, --seed and --steps, fuzz's --seed, ...): each now has its line."""
    import argparse
    import runpy

    if name in NEEDS_TORCH:
        pytest.importorskip("torch", reason="%s needs PyTorch: without it, it says how to install it" % name)

    class Parsed(Exception):
        pass

    def parse_args(self, *args, **kwargs):  # the parser main() built, before it runs anything
        raise Parsed(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
    with pytest.raises(Parsed) as got:
        runpy.run_module("specmesh.tools." + name, run_name="__main__")  # as `python -m` runs it
    assert [a.option_strings or a.dest for a in got.value.args[0]._actions if not a.help] == []


class _Board:
    """A virtual board that starts and stops at once (the tools' mpremote run is what fails here)."""
    port = "/dev/null"

    def start(self):
        return self

    def stop(self):
        pass


@pytest.mark.parametrize("stderr, said", [("Traceback (most recent call last):\n  ...\nOSError: [Errno 28] ENOSPC\n",
                                           "OSError: [Errno 28] ENOSPC"), ("", "no output")])
def test_a_virtual_board_that_did_not_run_the_count_is_one_plain_line(monkeypatch, stderr, said):
    """frame_cost and ngram_cost said "the virtual esp32 did not run the lookups: ['OSError: ...']" (a list's repr,
    "[]" where the board said nothing), without the tool's name; now the board's last line, or "no output"."""
    from specmesh.host import emulator
    from specmesh.tools import frame_cost, ngram_cost

    monkeypatch.setattr(emulator, "make_board", lambda *a, **k: _Board())
    failed = subprocess.CompletedProcess([], 1, "", stderr)
    for tool in (frame_cost, ngram_cost):
        monkeypatch.setattr(tool.subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(SystemExit) as e:
        frame_cost.measure()
    assert e.value.code == "frame_cost: the virtual ESP32-C3 did not run the count: %s" % said
    with pytest.raises(SystemExit) as e:
        ngram_cost.measure("esp32", ROOT / "models" / "drafter-esp32.ngt", [(1, [1, 2])])
    assert e.value.code == "ngram_cost: the virtual esp32 did not run the lookups: %s" % said


@pytest.mark.parametrize("name", sorted(MODULES))
@pytest.mark.parametrize("torch", ["blocked", "as installed"])
def test_a_module_that_is_no_command_says_so_in_one_line(name, torch, tmp_path):
    """`python -m specmesh.tools.reference` (nodeproc, testmodels) did nothing and exited 0; modeldefs without PyTorch
    was an ImportError traceback. Each says in one line what it is and what to run instead (modeldefs without PyTorch:
    how to install it, as the tools that need it do), status 1."""
    from specmesh.host.backends.torch_backend import INSTALL_HINT

    block = "sys.modules['torch'] = None; " if torch == "blocked" else ""
    code = ("import runpy, sys; %ssys.argv = ['%s']\n"
            "runpy.run_module('specmesh.tools.%s', run_name='__main__', alter_sys=True)" % (block, name, name))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    torchless = name == "modeldefs" and (torch == "blocked" or not _has_torch())
    said = INSTALL_HINT if torchless else "a module the tools and tests import, not a command: "
    assert (done.returncode, done.stdout, done.stderr.count("\n")) == (1, "", 1) and said in done.stderr, done.stderr
    assert done.stderr.startswith(name + ": ")


def _has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def test_modelcard_reads_the_shipped_models_wherever_it_is_run_from(tmp_path, monkeypatch):
    """--models defaulted to "models" of the folder it was run in: from any other it said "modelcard: [Errno 2] No
    such file or directory: 'models/tokenizer.bin'"; it is the package's models folder, as the other tools read."""
    from specmesh.host.layout import MODELS
    from specmesh.tools import modelcard

    read = []
    monkeypatch.setattr(modelcard, "measure", lambda a: read.append(a.models) or {})
    monkeypatch.chdir(tmp_path)
    assert modelcard.main(["--json", str(tmp_path / "card.json")]) == 0
    assert read == [MODELS] and (MODELS / "tokenizer.bin").is_file()


@pytest.mark.parametrize("argv, missing", [
    (["llama2c_import", "{tmp}/gone.bin", "--out", "{tmp}/x.spm"], "{tmp}/gone.bin"),  # its own handler
    (["xtensa_loops", "--kernels", "{tmp}/gone.py"], "{tmp}/gone.py"),  # run_tool's
    (["modelcard", "--models", "{tmp}", "--json", "{tmp}/card.json"], "{tmp}/tokenizer.bin"),  # a folder lacking it
])
def test_a_missing_file_is_named_without_pythons_errno_form(tmp_path, argv, missing):
    """A file a tool reads that is not there said "llama2c_import: [Errno 2] No such file or directory: '/x.bin'";
    now "llama2c_import: /x.bin: No such file or directory", as the commands say it."""
    argv = [a.format(tmp=tmp_path) for a in argv]
    done = subprocess.run([sys.executable, "-m", "specmesh.tools." + argv[0], *argv[1:]], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (1, "%s: %s: No such file or directory\n" % (
        argv[0], missing.format(tmp=tmp_path))), done.stderr


@pytest.mark.parametrize("models, says", [("{tmp}/gone", "no such folder"),
                                          ("{tmp}/file", "not a folder: give the folder that holds the model files")])
def test_modelcard_names_a_models_folder_that_is_none(tmp_path, models, says):
    """`modelcard --models /gone` said "/gone/tokenizer.bin: No such file or directory", its first file's, not that the
    folder was the typo; now run's line for it, before anything is read, nothing written."""
    (tmp_path / "file").write_text("")
    models = models.format(tmp=tmp_path)
    done = subprocess.run([sys.executable, "-m", "specmesh.tools.modelcard", "--models", models, "--json",
                           str(tmp_path / "card.json")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (2, "modelcard: --models %s: %s (the shipped models are in %s)\n" % (
        models, says, MODELS)), done.stderr
    assert not (tmp_path / "card.json").exists()


@pytest.mark.parametrize("argv", [
    ["ngram", "--drafter", "{tmp}", "--workers", "1"],  # main's own handler (tools.said)
    ["ngram", "--text", "{tmp}", "--drafter", str(MODELS / DRAFTER_FILE), "--workers", "1"],
    ["llama2c_import", "{tmp}", "--out", "{tmp}/x.spm"],  # its own handler
])
def test_a_folder_where_a_tool_reads_a_file_says_what_to_give(tmp_path, argv):
    """A folder given where a tool reads a file said "ngram: /tmp/x: Is a directory", and no way on; now it is said as
    the commands say it (`--model DIR: a folder: name the model file in it`), one line, status 1."""
    argv = [a.format(tmp=tmp_path) for a in argv]
    done = subprocess.run([sys.executable, "-m", "specmesh.tools." + argv[0], *argv[1:]], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (1, "%s: %s is a folder, not a file: name a file (or replace the folder "
                                              "with it)\n" % (argv[0], tmp_path)), \
        done.stderr


@pytest.mark.parametrize("argv", [
    ["export", "--model", "x=y.pt", "--out"], ["ngram", "--drafter"], ["ngram", "--text"], ["modelcard", "--models"],
    ["modelcard", "--variants"], ["modelcard", "--json"], ["ngram_cost", "--model"], ["xtensa_loops", "--kernels"],
    ["llama2c_import", "m.bin", "--out"], ["llama2c_import", "m.bin", "--out", "m.spm", "--tokenizer"],
    ["llama2c_import", "m.bin", "--out", "m.spm", "--tokenizer", "t.bin", "--vocab-out"],
    ["bench", "codec", "--report"],  # wrote report.md and the plots into the folder it was run in
    *(["train", "--shape", "d40l2kv1", "--out", "ck", flag] for flag in ("--teacher", "--tokenizer", "--heldout",
                                                                          "--openings", "--init")),
])
def test_an_empty_path_given_to_a_tool_is_refused(argv, tmp_path):
    """An empty path (an unset shell variable's `--out "$DIR"`) was read as the current folder: export said "--out . has
    no vocab.bin ...", ngram and train ".: Is a directory" (train once it had made its --out), modelcard "--json .
    cannot be written: it is a folder" or "--variants: no summary.json"; each now says the flag is empty, as the
    commands do (host/cli/flags.py a_path), before any work."""
    if argv[0] in NEEDS_TORCH:
        pytest.importorskip("torch", reason="%s needs PyTorch: without it, it says how to install it" % argv[0])
    done = subprocess.run([sys.executable, "-m", "specmesh.tools." + argv[0], *argv[1:], ""], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.splitlines()[-1] == (
        "python -m specmesh.tools.%s: error: argument %s: is empty: give a path (an unset shell variable?)"
        % (argv[0], argv[-1])), done.stderr
    assert list(tmp_path.iterdir()) == []

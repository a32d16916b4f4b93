"""What llama.cpp users reach for in `specmesh run`: the prompt from stdin or a file, stop strings, model
files named one by one, prefill and decode timed apart (host/cli/run.py, host/decode/stopstrings.py)."""

import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specmesh.host.layout import DRAFTER_FILE, HOST_DRAFTER_FILE, TARGET_FILE
from specmesh.host import cli
from specmesh.host.cli.output import GREEN, RESET, TokenStream
from specmesh.host.cli.run import add_arguments, run
from specmesh.host.decode.stopstrings import StopScan, StopStrings

ROOT = Path(__file__).resolve().parent.parent


def args(models, *extra):
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(["--models", str(models), "--drafter", "cpu", "--verifier", "cpu", *extra])


def test_stop_strings_end_the_text_before_the_first_one_and_hold_back_what_may_begin_one():
    s = StopStrings(["The end", "."])
    assert s.cut("once. The end.") == 4 and s.cut("no stop here") is None
    assert s.showable("a story, Th") == len("a story, ")  # "Th" may become "The end"
    assert s.showable("it was The e") == len("it was ") and s.showable("The cat") == len("The cat")
    assert s.showable("abc") == 3 and not StopStrings([""]) and StopStrings(["x"])


@pytest.mark.parametrize("terminal", [True, False])
def test_a_line_said_mid_text_at_a_terminal_comes_on_a_line_of_its_own(monkeypatch, terminal):
    """A fail-over's line said while the text streams to the same terminal ran into the story ("there
    wasspecmesh: ..."): the text's open line is ended first, on the terminal only; a text going to a file is left as
    it is, and a line said after the text's end adds no blank line."""
    from specmesh.host.cli.output import Printer

    class Out(io.StringIO):
        def isatty(self):
            return terminal

    said: list[str] = []
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    out = Out()
    printer = Printer(out, color=False)
    say = printer.own_line(said.append)
    printer.show([("Once upon a time", False)])
    say("drafter dropped")
    printer.show([(", there", False)])
    printer.end()
    say("a board stopped answering")
    assert out.getvalue() == ("Once upon a time\n, there\n" if terminal else "Once upon a time, there\n")
    assert said == ["drafter dropped", "a board stopped answering"]


def test_the_stream_holds_back_a_possible_stop_string_and_ends_before_a_whole_one():
    pieces = {1: b"a", 2: b"b", 3: b"c", 4: b"d"}
    buf = io.StringIO()
    s = TokenStream(StopScan(StopStrings(["bcd", "bd"]), pieces.__getitem__), buf, color=True)
    s.write([1], [2])
    assert buf.getvalue() == GREEN + "a" + RESET  # "b" may begin a stop string: held back
    s.write([], [3])
    assert buf.getvalue() == GREEN + "a" + RESET  # "bc" still may
    s.write([4], [1])  # "bcd": the text ends before it, nothing more is shown
    s.write([1], [1])
    s.finish()
    assert buf.getvalue() == GREEN + "a" + RESET + "\n" and s.scan.stopped and s.scan.kept == 1  # "a" alone
    held = io.StringIO()
    s = TokenStream(StopScan(StopStrings(["bd"]), pieces.__getitem__), held)
    s.write([1, 2], [3])  # "abc": the "b" turned out not to begin "bd"
    s.write([], [2])
    s.finish()  # the end of the stream shows what was held back
    assert held.getvalue() == "abcb\n"


def test_greedy_text_with_stop_strings_is_a_prefix_of_the_text_without(models, capsys):
    whole = run(args(models, "--max-tokens", "40", "--quiet", "--gamma", "3"), io.StringIO())["text"]
    stop, later = whole[12:14], whole[20:22]  # two stop strings from the text: the earlier one ends it
    assert whole.find(stop) < whole.find(later)
    out = io.StringIO()
    cut = run(args(models, "--max-tokens", "40", "--stop", later, "--stop", stop), out)
    assert cut["text"] == whole[:whole.find(stop)] and whole.startswith(cut["text"])
    assert cut["stop"] == "stop" and cut["tokens"] <= 40
    assert out.getvalue() == "Once upon a time" + cut["text"] + "\n"
    plain = run(args(models, "--max-tokens", "40", "--quiet", "--plain", "--stop", stop), io.StringIO())
    assert plain["text"] == cut["text"]  # with or without a drafter, the same text
    rc = cli.main(["run", "--models", str(models), "--drafter", "cpu", "--verifier", "cpu", "--stop", stop])
    assert rc == 0 and re.search(r"\nstopped by +a --stop string \(the text ends before it\)\n",
                                 capsys.readouterr().err)


def test_the_prompt_comes_from_stdin_or_a_file_without_its_final_newline(models, tmp_path, monkeypatch):
    given = run(args(models, "--max-tokens", "8", "--quiet", "--prompt", "The cat sat"), io.StringIO())
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"The cat sat\n")))
    piped = run(args(models, "--max-tokens", "8", "--quiet", "--prompt", "-"), io.StringIO())
    (tmp_path / "p.txt").write_bytes(b"The cat sat\r\n\n")
    filed = run(args(models, "--max-tokens", "8", "--quiet", "--prompt-file", str(tmp_path / "p.txt")),
                io.StringIO())
    assert piped["token_ids"] == filed["token_ids"] == given["token_ids"]
    assert piped["prompt_tokens"] == given["prompt_tokens"]
    # a Windows editor's file starts with a byte order mark: it went into the context as 3 byte tokens, and into
    # the text printed before the story
    (tmp_path / "p.txt").write_bytes(b"\xef\xbb\xbfThe cat sat\r\n")
    out = io.StringIO()
    marked = run(args(models, "--max-tokens", "8", "--quiet", "--prompt-file", str(tmp_path / "p.txt")), out)
    assert marked["prompt_tokens"] == given["prompt_tokens"] and out.getvalue().startswith("The cat sat")


def test_a_prompt_piped_in_through_a_non_blocking_stdin_is_read_to_its_end(models, monkeypatch):
    """A parent that leaves the pipe non-blocking (node's child_process does): read() gave back the bytes written
    so far (here "The cat"), or None before any ('object of type NoneType has no len()', status 2)."""
    import os
    import threading
    import time

    r, w = os.pipe()
    os.set_blocking(r, False)
    os.write(w, b"The cat")

    def rest():
        time.sleep(0.5)
        os.write(w, b" sat\n")
        os.close(w)

    writer = threading.Thread(target=rest)
    writer.start()
    monkeypatch.setattr(sys, "stdin", open(r, closefd=True))
    try:
        piped = run(args(models, "--max-tokens", "8", "--quiet", "--prompt", "-"), io.StringIO())
    finally:
        writer.join()
        sys.stdin.close()
    given = run(args(models, "--max-tokens", "8", "--quiet", "--prompt", "The cat sat"), io.StringIO())
    assert piped["token_ids"] == given["token_ids"] and piped["prompt_tokens"] == given["prompt_tokens"]


@pytest.mark.parametrize("setup, extra, message", [
    (None, ["--prompt", "x", "--prompt-file", "p.txt"], "give --prompt or --prompt-file, not both"),
    (None, ["--prompt-file", "nope.txt"], "cannot read the prompt from nope.txt: No such file or directory"),
    (None, ["--prompt-file", "."], "--prompt-file .: a folder: name the prompt's file in it"),  # "Is a directory"
    (b"caf\xe9 au lait", ["--prompt-file", "p.txt"],  # said as --prompt's is
     "the prompt in p.txt is not UTF-8 text: byte 0xe9 at offset 3 of its 12 bytes; save it in UTF-8"),
    (None, ["--prompt-file", "/dev/zero"], "the prompt in /dev/zero is over 16 MiB, more than any model's context "
                                            "holds: shorten it"),  # read to its end before: memory ran out
    (None, ["--model", "nope.spm"], "--model nope.spm: no such file"),
    (None, ["--draft-model", "nope.spm"], "--draft-model nope.spm: no such file"),
    (None, ["--model", "."], "--model .: a folder: name the model file in it"),
    (None, ["--draft-model", "/dev/null"], "--draft-model /dev/null: not a regular file"),
])
def test_a_bad_prompt_or_model_file_is_one_line_and_status_2(models, tmp_path, monkeypatch, capsys, setup, extra,
                                                              message):
    monkeypatch.chdir(tmp_path)
    if setup is not None:
        (tmp_path / "p.txt").write_bytes(setup)
    rc = cli.main(["run", "--models", str(models), "--drafter", "cpu", "--verifier", "cpu", *extra])
    err = capsys.readouterr().err
    assert rc == 2 and err == "specmesh run: error: %s\n" % message


def test_model_files_named_one_by_one(models, tmp_path):
    shutil.copy(models / TARGET_FILE, tmp_path / "story.spm")
    shutil.copy(models / DRAFTER_FILE, tmp_path / "small.spm")
    only_tokenizer = tmp_path / "tok"
    only_tokenizer.mkdir()
    shutil.copy(models / "tokenizer.bin", only_tokenizer / "tokenizer.bin")
    default = run(args(models, "--max-tokens", "12", "--quiet", "--gamma", "2"), io.StringIO())
    named = run(args(only_tokenizer, "--max-tokens", "12", "--quiet", "--gamma", "2", "--model",
                     str(tmp_path / "story.spm"), "--draft-model", str(tmp_path / "small.spm")), io.StringIO())
    assert named["token_ids"] == default["token_ids"] and named["alpha"] == default["alpha"]
    assert named["drafter_model"] == "small.spm"
    with pytest.raises(Exception, match="drafter.spm is missing from"):  # the folder alone lacks the models
        run(args(only_tokenizer, "--quiet"), io.StringIO())


def test_the_host_drafter_runs_drafter_host_spm_where_the_folder_has_it(models, tmp_path):
    from specmesh.tools.testmodels import random_model

    with_host = tmp_path / "with_host"
    shutil.copytree(models, with_host)
    random_model(with_host / HOST_DRAFTER_FILE, dim=16, n_layers=2, n_heads=2, n_kv_heads=1, hidden=32, vocab=512,
                 max_seq=128, seed=23)
    own = run(args(with_host, "--max-tokens", "12", "--quiet", "--gamma", "2"), io.StringIO())
    older = run(args(models, "--max-tokens", "12", "--quiet", "--gamma", "2"), io.StringIO())  # a folder without it
    assert own["drafter_model"] == HOST_DRAFTER_FILE and older["drafter_model"] == DRAFTER_FILE
    assert own["token_ids"] == older["token_ids"]  # the target decides every token, whichever drafter drafts
    board = run(args(with_host, "--max-tokens", "4", "--quiet", "--gamma", "2", "--drafter", "virtual"), io.StringIO())
    assert board["drafter_model"] != HOST_DRAFTER_FILE  # a board runs its class's drafter, never the host's


def test_prefill_and_decode_are_timed_apart_in_the_stats_and_the_table(models, tmp_path, capsys):
    path = tmp_path / "s.json"
    rc = cli.main(["run", "--models", str(models), "--drafter", "cpu", "--verifier", "cpu", "--max-tokens", "30",
                   "--gamma", "3", "--stats-json", str(path)])
    stats = json.loads(path.read_text())
    out = capsys.readouterr().err  # the table
    assert rc == 0 and 0 < stats["prefill_s"] < stats["wall_s"]
    assert stats["decode_s"] == pytest.approx(stats["wall_s"] - stats["prefill_s"])
    assert 0 < stats["decode_tokens"] < stats["tokens"]  # the first round committed at least one token
    assert stats["decode_tokens_per_s"] == pytest.approx(stats["decode_tokens"] / stats["decode_s"])
    assert stats["prefill_tokens_per_s"] == pytest.approx(stats["prompt_tokens"] / stats["prefill_s"])
    assert re.search(r"\nprefill s +[0-9.e-]+ \(%d prompt tokens, " % stats["prompt_tokens"], out)
    assert re.search(r"\ndecode tokens / s +[0-9.e+]+ \(%d tokens in " % stats["decode_tokens"], out)


def test_the_table_says_one_decoded_token_as_one(models, capsys):
    """`--plain -n 2` decodes one token after the first round's: the table said "(1 tokens in 0.0006 s)"."""
    assert cli.main(["run", "--models", str(models), "--plain", "--verifier", "cpu", "--max-tokens", "2"]) == 0
    assert re.search(r"\ndecode tokens / s +[0-9.e+]+ \(1 token in ", capsys.readouterr().err)


def test_the_table_says_one_re_prime_and_one_round_as_one(models, tmp_path):
    """The drafter window's and the projected drafting ahead's rows said "1 re-primes", "1 rounds" and "1 rounds'
    drafts ready": a run's own stats, with those rows' figures at one."""
    from specmesh.host.cli.output import format_table

    out = tmp_path / "stats.json"
    assert cli.main(["run", "--models", str(models), "--plain", "--verifier", "cpu", "--max-tokens", "2",
                     "--stats-json", str(out)]) == 0
    stats = json.loads(out.read_text())
    stats["drafter_window"] = {"reprimes": 1, "keep": 1, "context": 48, "first_reprime_token": 40,
                               "after_first_reprime": {"drafting_rounds": 1, "rounds": 1, "tokens_per_verification": 2.0}}
    stats["projection"] = {"hardware": "esp32s3", "tokens_per_s": 80.0, "speedup_vs_plain": 1.2, "plain_tokens_per_s": 70.0,
                           "rates": "-", "kernels": "native", "pipelined_drafting": True, "ready_rounds": 1,
                           "ahead_drafts": 1, "ahead_overrun_s": 0.001}
    table = " ".join(format_table(stats).split())  # (a long value wraps onto lines of its own)
    assert "1 re-prime on the stream's last 1 token (context 48), from token 40 on: 1 of 1 round drafted" in table
    assert "drafts ready for 1 round, 1 draft made beside a verify" in table


def test_a_prompt_piped_in_with_a_stop_string_prints_one_sentence():
    """The issue's example, on the shipped models (the cpu verifier keeps it quick; `make run`'s virtual
    boards give the same text: the verifier decides every token)."""
    done = subprocess.run([sys.executable, "-m", "specmesh.host.cli", "run", "--prompt", "-", "--plain", "--stop", ".",
                           "--max-tokens", "64", "--verifier", "cpu"], input="Once upon a time\n",
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first == "Once upon a time, there was a little girl named Lily"

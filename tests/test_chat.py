"""`specmesh chat` (host/cli/chat.py): turns continue one context, kept until it fills, then one line."""

import argparse
import io
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specmesh.host.layout import TARGET_FILE
from specmesh.host import cli
from specmesh.host.backends import LocalVerifier, SessionParams
from specmesh.host.cli.chat import chat
from specmesh.host.cli.run import add_arguments
from specmesh.host.decode.orchestrator import generate
from specmesh.host.decode.tokenizer import BOS, Tokenizer
from specmesh.tools.testmodels import random_model
from tests.conftest import CTRL_C_OFF_THE_READ, LINUX_PROC, until_sleeping

ROOT = Path(__file__).resolve().parent.parent


def args(models, *extra):
    p = argparse.ArgumentParser()
    add_arguments(p)
    drafter = [] if "--plain" in extra else ["--drafter", "cpu"]  # --plain with a drafter named: a note line
    return p.parse_args(["--models", str(models), *drafter, "--verifier", "cpu", *extra])


def _chat_at_its_first_prompt(models, **popen) -> tuple[subprocess.Popen, int, bytes]:
    """A chat on the host's back-ends at a new terminal (a pty: its stdin and stdout), read until its first prompt:
    the process, the terminal's end to type on and what it showed. `popen`: more of Popen's arguments."""
    import os
    import pty
    import select

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "specmesh.host.cli", "chat", "--models", str(models), "--verifier",
                             "cpu", "--drafter", "cpu", "--max-tokens", "4"], stdin=slave, stdout=slave,
                            stderr=subprocess.PIPE, cwd=ROOT, **popen)
    os.close(slave)
    seen = b""
    end = time.monotonic() + 60
    while not seen.endswith(b"> ") and time.monotonic() < end and proc.poll() is None:
        if select.select([master], [], [], 0.2)[0]:
            seen += os.read(master, 4096)
    return proc, master, seen


def test_each_turn_continues_the_whole_context(models):
    out = io.StringIO()
    assert chat(args(models, "--max-tokens", "12", "--gamma", "3"), iter(["The cat", "Then a dog"]), out) == 0
    first, second = out.getvalue().splitlines()
    tok = Tokenizer.from_llama2c(models / "tokenizer.bin")
    target = LocalVerifier(models / TARGET_FILE)
    params = SessionParams(eos=BOS)
    context = tok.encode("The cat")
    one = generate(context, target, None, params, 12).tokens  # plain decoding: the same text, lossless
    context += one + tok.encode("Then a dog", bos=False)
    two = generate(context, target, None, params, 12).tokens
    assert first == "The cat" + tok.decode(one) and second == "Then a dog" + tok.decode(two)
    alone = io.StringIO()
    chat(args(models, "--max-tokens", "12", "--gamma", "3"), iter(["Then a dog"]), alone)
    assert alone.getvalue() != "Then a dog" + tok.decode(two) + "\n"  # the first turn mattered


def test_a_full_context_ends_the_session_with_one_line(tmp_path, capsys):
    shutil.copy(ROOT / "models" / "tokenizer.bin", tmp_path / "tokenizer.bin")
    random_model(tmp_path / TARGET_FILE, vocab=512, max_seq=24, seed=5)
    turns = ["one two", "three four", "five six", "seven eight", "nine ten"]
    rc = chat(args(tmp_path, "--plain", "--max-tokens", "6"), iter(turns), io.StringIO())
    err = capsys.readouterr().err
    assert rc == 0 and err.startswith("specmesh chat: the context is full (") and err.count("\n") == 1
    assert "of 24 positions" in err or "(24 positions)" in err



def test_a_line_longer_than_any_context_is_skipped_with_one_line_and_the_session_goes_on(tmp_path, capsys):
    shutil.copy(ROOT / "models" / "tokenizer.bin", tmp_path / "tokenizer.bin")
    random_model(tmp_path / TARGET_FILE, vocab=512, max_seq=24, seed=5)
    out = io.StringIO()
    turns = ["one", "two " * 100_000, "two " * 30, "three"]
    assert chat(args(tmp_path, "--plain", "--max-tokens", "4"), iter(turns), out) == 0
    err = capsys.readouterr().err.splitlines()
    # a 400 kB line refused by its size (Tokenizer.least_tokens), not encoded; a shorter one by its tokens
    assert len(err) == 2 and err[0].startswith("specmesh chat: that line is at least ")
    assert re.fullmatch(r"specmesh chat: that line is \d+ tokens and the context holds 24: skipped, type a shorter "
                        r"one", err[1])
    assert [line.split()[0] for line in out.getvalue().splitlines()] == ["one", "three"]


def test_chat_from_a_pipe_with_an_opening_turn_and_a_stop_string():
    done = subprocess.run([sys.executable, "-m", "specmesh.host.cli", "chat", "--verifier", "cpu", "--drafter", "cpu",
                           "--prompt", "Once upon a time", "--stop", ".", "--max-tokens", "40"],
                          input="She smiled\n", capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "Once upon a time, there was a little girl named Lily"
    assert len(lines) == 2 and lines[1].startswith("She smiled") and "." not in lines[1]


def test_chat_refuses_stdin_as_its_first_turn_and_run_only_flags(models, capsys):
    assert cli.main(["chat", "--models", str(models), "--verifier", "cpu", "--prompt", "-"]) == 2
    assert "chat reads its turns from stdin" in capsys.readouterr().err
    assert cli.main(["chat", "--models", str(models), "--verifier", "cpu", "--stats-json", "s.json"]) == 2
    assert capsys.readouterr().err == ("specmesh chat: error: chat prints each turn's text and no stats: drop "
                                       "--stats-json (specmesh run takes it)\n")


def test_a_file_s_byte_order_mark_is_no_part_of_its_first_turn():
    """`chat < turns.txt` from a Windows editor: the mark went into the first turn's context as byte tokens."""
    from specmesh.host.cli.chat import _lines

    piped = io.TextIOWrapper(io.BytesIO(b"\xef\xbb\xbfThe cat\r\nThe dog\n"), encoding="utf-8")
    assert list(_lines(piped)) == ["The cat", "The dog"]


def test_a_line_typed_on_a_terminal_that_is_not_utf8_is_skipped_too(monkeypatch, capsys):
    """A terminal's stdin hands bytes that are not UTF-8 to input() as surrogates (surrogateescape, as under
    C.UTF-8): 'caf\\xe9' ended the whole chat, status 2, with "'utf-8' codec can't encode character '\\udce9'"."""
    from specmesh.host.cli.chat import _lines

    typed = iter(["caf\udce9 time", "The dog"])

    def type_a_line(prompt=""):
        try:
            return next(typed)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", type_a_line)
    terminal = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    monkeypatch.setattr(terminal, "isatty", lambda: True)
    assert list(_lines(terminal)) == ["The dog"]
    assert capsys.readouterr().err == ("> specmesh chat: that line is not UTF-8 text (byte 0xe9 at offset 3): skipped, "
                                       "type it in UTF-8\n> > \n")  # the prompts: stdout is no terminal here; the
    # last one's line ended at the end of the turns


def test_typed_at_a_terminal_into_a_file_the_file_holds_the_story_and_the_prompt_stays_off_it(models):
    """`specmesh chat > story.txt` at a terminal: input() wrote each prompt into the file (a stdout that is no
    terminal) and the turns typed were left out of it (echoed only where stdin is not a terminal): the story
    read '>  was a big, red ball'. The prompt goes to stderr then, and the turns into the file with the text."""
    import os
    import pty

    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "specmesh.host.cli", "chat", "--models", str(models),
                                 "--verifier", "cpu", "--drafter", "cpu", "--max-tokens", "4", "--no-color"],
                                stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
        os.close(slave)
        os.write(master, b"The cat\n\x04")  # a line, then Ctrl-D at the next prompt (canonical mode)
        out, err = proc.communicate(timeout=120)
    finally:
        os.close(master)
    assert proc.returncode == 0, err
    assert out.decode().startswith("The cat") and ">" not in out.decode() and out.decode().count("\n") == 1, out
    assert err.decode() == "> > \n", err  # the last prompt's line ended at Ctrl-D


def test_a_stdin_left_non_blocking_is_waited_on_not_read_as_the_end(models):
    """A parent that hands chat a non-blocking pipe (node's child_process does): readline() returned b"" (EAGAIN)
    at the first turn not yet written, read as EOF, and the chat ended with status 0 before it came."""
    import fcntl
    import os

    r, w = os.pipe()
    fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_NONBLOCK)
    proc = subprocess.Popen([sys.executable, "-m", "specmesh.host.cli", "chat", "--models", str(models), "--verifier",
                             "cpu", "--drafter", "cpu", "--max-tokens", "4", "--no-color", "--prompt", "The cat"],
                            stdin=r, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    os.close(r)
    first = proc.stdout.readline()  # the opening turn's text: chat reads stdin next
    time.sleep(1.0)  # and finds nothing there yet
    try:
        os.write(w, b"The dog\n")
    except BrokenPipeError:  # it had ended already
        pass
    os.close(w)
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert first.startswith(b"The cat") and rest.startswith(b"The dog") and rest.count(b"\n") == 1, (first, rest)


def test_arrow_keys_at_a_terminal_edit_the_line_not_the_story(models):
    """At a terminal chat reads with input()'s line editing: without readline an arrow key's escape sequence
    ('\\x1b[D') was typed into the turn, and the model continued 'The cat^[[D^[[C'. Left then right is the same
    line as typed without them: the same continuation as a pipe's 'The cat'."""
    import os
    import pty
    import select

    cmd = [sys.executable, "-m", "specmesh.host.cli", "chat", "--models", str(models), "--verifier", "cpu",
           "--drafter", "cpu", "--max-tokens", "8", "--no-color"]
    piped = subprocess.run(cmd, input=b"The cat\n", capture_output=True, cwd=ROOT, timeout=120)
    assert piped.returncode == 0 and piped.stdout.startswith(b"The cat"), piped.stderr
    continuation = piped.stdout[len(b"The cat"):].rstrip(b"\n")
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=subprocess.PIPE, cwd=ROOT)
    os.close(slave)
    seen = b""
    try:
        os.write(master, b"The cat\x1b[D\x1b[C\n")
        end = time.monotonic() + 30
        while b"> " not in seen.partition(continuation)[2] and time.monotonic() < end and proc.poll() is None:
            if select.select([master], [], [], 0.2)[0]:  # the continuation, then the next turn's prompt
                seen += os.read(master, 4096)
        os.write(master, b"\x04")  # Ctrl-D at the prompt ends the chat
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert continuation in seen, (continuation, seen)


def test_a_line_that_is_not_utf8_is_skipped_with_one_line_and_the_session_goes_on(models):
    done = subprocess.run([sys.executable, "-m", "specmesh.host.cli", "chat", "--models", str(models), "--verifier",
                           "cpu", "--drafter", "cpu", "--max-tokens", "4"],
                          input=b"The cat\ncaf\xe9\nThe dog\n", capture_output=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.decode() == ("specmesh chat: that line is not UTF-8 text (byte 0xe9 at offset 3): skipped, type "
                                    "it in UTF-8\n")
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 2 and lines[0].startswith("The cat") and lines[1].startswith("The dog")


def test_a_line_without_end_ends_the_chat_with_one_line_and_status_1(models):
    # stdin from /dev/zero: one endless line, read whole before (memory ran out: "error: MemoryError", status 2)
    with open("/dev/zero", "rb") as zero:
        done = subprocess.run([sys.executable, "-m", "specmesh.host.cli", "chat", "--models", str(models), "--verifier",
                               "cpu", "--drafter", "cpu", "--max-tokens", "4"], stdin=zero, capture_output=True,
                              cwd=ROOT, timeout=120)
    assert done.returncode == 1 and done.stdout == b""
    assert done.stderr.decode() == ("specmesh chat: error: a line on stdin is over 16 MiB, more than any context holds: "
                                    "the chat ends; feed it lines of text\n")


def test_chat_s_help_lists_no_flag_it_refuses_nor_run_s_opening_prompt(models, capsys):
    """`chat --help` listed run's --stats-json, --project, --quiet, --calibration and --drafter-calibration, which chat
    refuses, and said its --prompt defaulted to 'Once upon a time' (chat has no opening turn unless given one); and
    `chat --calibration F` said 'add --project esp32s3', which chat then refused: 'drop --project'."""
    with pytest.raises(SystemExit):
        cli.main(["chat", "--help"])
    shown = capsys.readouterr().out
    for flag in ("--stats-json", "--project", "--quiet", "--calibration", "--drafter-calibration"):
        assert flag not in shown, flag
    assert "Once upon a time" not in shown and "the first turn" in shown
    for flag in ("--calibration", "--drafter-calibration"):
        assert cli.main(["chat", "--models", str(models), "--verifier", "cpu", flag, "cal.json"]) == 2
        assert capsys.readouterr().err == ("specmesh chat: error: chat prints each turn's text and no stats: drop %s "
                                           "(specmesh run takes it)\n" % flag)


def test_ctrl_c_at_the_prompt_ends_the_chat_with_one_line_and_status_130(models):
    """docs/run.md's exit status for a Ctrl-C (130, one line), at the prompt of a chat typed at a terminal: the turn
    before it kept whole on stdout, no traceback."""
    import os
    import pty
    import select
    import signal

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "specmesh.host.cli", "chat", "--models", str(models), "--verifier",
                             "cpu", "--drafter", "cpu", "--max-tokens", "4", "--no-color"],
                            stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    os.close(slave)
    said = b""
    try:
        os.write(master, b"The cat\n")
        end = time.monotonic() + 60
        while said.count(b"> ") < 2 and time.monotonic() < end and proc.poll() is None:  # the next turn's prompt
            if select.select([proc.stderr], [], [], 0.2)[0]:
                said += os.read(proc.stderr.fileno(), 4096)
        proc.send_signal(signal.SIGINT)  # what the terminal sends for Ctrl-C
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert proc.returncode == 130, said + err
    assert said + err == b"> > specmesh chat: interrupted\n"
    assert out.startswith(b"The cat") and out.count(b"\n") == 1, out


@LINUX_PROC
@pytest.mark.parametrize("where", ["terminal", "prompt on stderr", "pipe"])
def test_a_ctrl_c_that_the_read_of_a_turn_missed_still_ends_the_chat(models, where):
    """A Ctrl-C whose signal interrupted no read (it came just before the read began) ends the chat as one at the
    prompt does (status 130, one line), wherever the turns come from: a terminal (readline's input(),
    the prompt on stdout), one whose prompt goes to stderr, or a pipe."""
    import os
    import pty
    import select
    import signal

    master, slave = pty.openpty()
    fed, feed = os.pipe()  # (a pipe of its own: communicate() would close a Popen's stdin, ending the turns)
    proc = subprocess.Popen([sys.executable, "-c", CTRL_C_OFF_THE_READ, "chat", "--models", str(models), "--verifier",
                             "cpu", "--drafter", "cpu", "--max-tokens", "4", "--no-color"],
                            stdin=fed if where == "pipe" else slave,
                            stdout=slave if where == "terminal" else subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    os.close(slave)
    os.close(fed)
    # what shows that the first turn ended and the next is read: a terminal's second prompt, else the turn's line
    shown, mark, count = ((master, b"> ", 2) if where == "terminal" else (proc.stdout.fileno(), b"\n", 1)
                          if where == "pipe" else (proc.stderr.fileno(), b"> ", 2))
    said = b""
    try:
        os.write(feed if where == "pipe" else master, b"The cat\n")
        end = time.monotonic() + 60
        while said.count(mark) < count and time.monotonic() < end and proc.poll() is None:
            if select.select([shown], [], [], 0.2)[0]:
                said += os.read(shown, 4096)
        until_sleeping(proc, end)  # in the read, which the signal does not interrupt
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
        os.close(feed)
    assert said.count(mark) == count, said
    on_stderr = where == "prompt on stderr"  # (its prompts read above)
    assert proc.returncode == 130, err
    assert (said if on_stderr else b"") + err == (b"> > " if on_stderr else b"") + b"specmesh chat: interrupted\n"


# `python -c CTRL_C_IN_INPUT ARGS...`: `specmesh ARGS...` with a Ctrl-C raised in the first Python code that input()
# runs (a profile hook, which says so on stderr): input() calls stdout's fileno and flush, and clears what they raise
CTRL_C_IN_INPUT = ("import os, signal, sys\n"
                   "inside = []\n"
                   "def hook(frame, event, arg):\n"
                   "    if event == 'c_call' and arg is input:\n"
                   "        inside.append(arg)\n"
                   "    elif event == 'call' and inside:\n"
                   "        sys.setprofile(None)\n"
                   "        os.write(2, b'(a Ctrl-C in %s)' % frame.f_code.co_name.encode())\n"
                   "        os.kill(os.getpid(), signal.SIGINT)\n"
                   "sys.setprofile(hook)\n"
                   "from specmesh.host.cli import main\n"
                   "sys.exit(main(sys.argv[1:]))\n")


@LINUX_PROC
@pytest.mark.parametrize("where", ["terminal", "prompt on stderr"])
def test_a_ctrl_c_while_input_begins_is_not_swallowed(models, where):
    """A Ctrl-C whose handler ran in Python code that input() called before it read (stdout's fileno and flush, which
    were writing_stdout's guard's) was cleared by input(): the chat sat at its prompt, nothing said, until killed (once
    in a loaded `make test`). input() now runs none of ours before it reads; the Ctrl-C (the hook's, else the test's at
    the prompt) ends the chat with status 130 and one line."""
    import os
    import pty
    import select
    import signal

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", CTRL_C_IN_INPUT, "chat", "--models", str(models), "--verifier",
                             "cpu", "--drafter", "cpu", "--max-tokens", "4", "--no-color"], stdin=slave,
                            stdout=slave if where == "terminal" else subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    os.close(slave)
    shown = master if where == "terminal" else proc.stderr.fileno()  # where the prompt is
    said = b""
    try:
        end = time.monotonic() + 60
        while b"> " not in said and time.monotonic() < end and proc.poll() is None:
            if select.select([shown], [], [], 0.2)[0]:
                said += os.read(shown, 4096)
        until_sleeping(proc, end)  # in its read
        os.set_blocking(proc.stderr.fileno(), False)
        said = (said if where != "terminal" else b"") + (proc.stderr.read() or b"")
        if b"(a Ctrl-C in " not in said:
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert proc.returncode == 130, said + err
    told = re.sub(rb"\(a Ctrl-C in \w+\)", b"", said + err)
    assert told == (b"" if where == "terminal" else b"> ") + b"specmesh chat: interrupted\n"


def test_an_empty_line_continues_the_story_where_the_last_turn_stopped(models):
    """An empty line adds nothing to the context: the model goes on from where it stopped, so (greedy) three turns
    of 6 tokens, the last two empty, are the text of one turn of 18 (docs/run.md)."""
    out, whole = io.StringIO(), io.StringIO()
    assert chat(args(models, "--max-tokens", "6", "--no-color"), iter(["The little dog", "", ""]), out) == 0
    assert chat(args(models, "--max-tokens", "18", "--no-color"), iter(["The little dog"]), whole) == 0
    assert len(out.getvalue().splitlines()) == 3 and out.getvalue().replace("\n", "") == whole.getvalue().rstrip("\n")


def test_a_turn_the_model_ends_at_once_says_so(capsys):
    """The shipped model, told the same line again and again, ends the story at once from the fifth turn: the turn
    showed the line and nothing after it, without a word (the serve audit's finding). One line says so each time."""
    line = "The dog ran to the park and played with a ball all day long."
    out = io.StringIO()
    assert chat(args(ROOT / "models", "--max-tokens", "30", "--no-color"), iter([line] * 6), out) == 0
    said = "specmesh chat: the model ended the story there, with no reply (its end-of-story token): type something " \
           "new, or start a new chat"
    shown = out.getvalue().splitlines()
    assert shown[-2:] == [line, line] and capsys.readouterr().err.count(said) >= 2  # the last two turns: no reply


def test_ctrl_d_typed_at_a_terminal_while_a_reply_runs_ends_the_chat_after_it(models):
    """A Ctrl-D typed while a reply runs (here: the opening turn's, before any prompt) is the end of the turns, as at
    the prompt: GNU readline, which turns the terminal's canonical mode off to read, got it as a 0 byte and dropped
    it, so the chat sat at its next prompt. Now: the reply whole, status 0, nothing on stderr."""
    import os
    import pty

    master, slave = pty.openpty()  # the user's terminal: the prompt and the text on it, so readline edits the line
    os.write(master, b"\x04")  # typed at once: the terminal holds it, in canonical mode, until chat reads
    proc = subprocess.Popen([sys.executable, "-m", "specmesh.host.cli", "chat", "--models", str(models), "--verifier",
                             "cpu", "--drafter", "cpu", "--max-tokens", "4", "--no-color", "--prompt", "The cat"],
                            stdin=slave, stdout=slave, stderr=subprocess.PIPE, cwd=ROOT)
    os.close(slave)
    try:
        _, err = proc.communicate(timeout=60)
        seen = os.read(master, 65536)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert (proc.returncode, err) == (0, b""), seen
    assert seen.startswith(b"The cat") and b"> " not in seen, seen


def test_ctrl_d_at_the_prompt_ends_its_line(models):
    """Ctrl-D at a terminal's prompt ended the chat with the prompt's line open ('> '), so the shell's own prompt came
    after ours on the same line; now the line is ended first. Status 0, nothing on stderr."""
    import os
    import select

    proc, master, seen = _chat_at_its_first_prompt(models)
    try:
        os.write(master, b"\x04")
        _, err = proc.communicate(timeout=60)
        while select.select([master], [], [], 0.5)[0]:
            try:
                seen += os.read(master, 4096)
            except OSError:  # (the terminal's other end closed: all read)
                break
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert (proc.returncode, err, seen) == (0, b"", b"> \r\n")


def test_a_terminal_closed_under_nohup_ends_the_chat_quietly(models):
    """The terminal closed at the prompt of a chat that ignores SIGHUP (nohup): the turns end there, status 0, nothing
    said; ending the prompt's line at that end (a Ctrl-D's) must not fail on the terminal gone ('cannot write to
    stdout: Input/output error', status 2)."""
    import os
    import signal

    proc, master, seen = _chat_at_its_first_prompt(models, preexec_fn=lambda: signal.signal(signal.SIGHUP,
                                                                                              signal.SIG_IGN))
    os.close(master)  # the terminal closes
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (proc.returncode, err) == (0, b""), (seen, err)


def test_a_terminal_that_closed_while_a_reply_ran_is_left_to_input():
    """Asked after a reply whether a Ctrl-D waits at the terminal, a terminal that closed meanwhile (under nohup)
    raised termios.error ('Input/output error': the chat's end a failure, status 2); it is no end typed ahead, and
    input() then finds the end of the turns, as before."""
    import os
    import pty

    from specmesh.host.cli.chat import _ended_ahead

    master, slave = pty.openpty()
    os.close(master)
    try:
        assert _ended_ahead(slave) is False
    finally:
        os.close(slave)


def test_a_stage_that_stalls_ends_its_turn_and_the_next_turn_asks_it_again(models, capsys):
    """`--stages`: a stage board that stalled (its VM stopped: a board hung, a USB hub's hiccup) ended the chat,
    though serve's next request asks such a stage HELLO again (pipeline.REVIVE_S). Now the turn it stalled in ends
    with one line, the next turn asks it again and, once it answers, goes on with the text a chat that never stalled
    gives; turns that end with it still silent end the chat with status 1. The line said a run's "run again", then
    that the next turn asks again: it says only what is true in a chat."""
    import os
    import signal

    from specmesh.host.cli.chat import _turns
    from specmesh.host.cli.run import check_args
    from specmesh.host.cli.session import Mesh

    p = argparse.ArgumentParser()
    add_arguments(p)
    flags = ["--models", str(models), "--drafter", "cpu", "--max-tokens", "8", "--gamma", "2", "--temperature", "0"]
    want = io.StringIO()
    assert chat(p.parse_args([*flags, "--verifier", "cpu"]), iter(["Once upon a time", " there"]), want) == 0
    out = io.StringIO()
    with Mesh.from_config(check_args(p.parse_args([*flags, "--stages", "2"])), say=[].append, warn=[].append) as mesh:
        vm = mesh._setup.cluster().boards["stage1"].pid

        def turns():
            yield "Once upon a time"
            for stage in mesh._lanes[0].verifier.stages:
                stage.proxy.bus.deadline = 1.0  # the 30 s a board gets, shortened for the test
            os.kill(vm, signal.SIGSTOP)
            yield " there"
            os.kill(vm, signal.SIGCONT)
            yield ""  # the next turn, an empty line: the model goes on where the context ends
            os.kill(vm, signal.SIGSTOP)
            yield " again"

        try:
            rc = _turns(mesh, turns(), False, out, True)
        finally:
            os.kill(vm, signal.SIGCONT)
    err = capsys.readouterr().err.splitlines()
    assert rc == 1, err  # the last turn's stage still silent
    assert len(err) == 2, err
    for line in err:
        assert line.startswith("specmesh chat: stage 2 of 2 (layers 1:2, virtual:stage1(esp32)) stopped answering"), line
        assert line.endswith("; this turn's reply is not kept, and the next turn asks the stage again (type a line, "
                             "or an empty one to go on)"), line
        assert "run again" not in line, line  # a run's fix (pipeline.py stalled): in a chat, the next turn asks again
    lines = out.getvalue().splitlines()
    assert lines[0] == want.getvalue().splitlines()[0]
    assert lines[2] == want.getvalue().splitlines()[1][len(" there"):]  # after the stall, the stalled turn's context


@pytest.mark.parametrize("role", ["drafter", "verifier"])
def test_a_board_silent_at_a_reply_s_end_is_one_line_and_the_next_turn_falls_back_without_asking_it(models, capsys,
                                                                                                    monkeypatch, role):
    """A drafter or verifier board that stopped answering at a reply's end (its VM stopped as the stats were asked)
    had only its stats row say so, no line, and the next turn sent it BEGIN and its first DRAFT or VERIFY, which waited
    out the whole 30 s deadline before the fall-back. Now the turn ends with one line, and the next turn asks the board
    HELLO first (END_S): answering, it serves that turn as before; still silent, it is sent nothing more and the turn
    falls back at once (plain decoding, the cpu verifier), the text the same."""
    from specmesh.host.backends.board import END_S
    from specmesh.host.cli.chat import _turns
    from specmesh.host.cli.run import check_args
    from specmesh.host.cli.session import Mesh
    from specmesh.shared import messages as m
    from tests.emulator_util import StopsAtTheEnd

    p = argparse.ArgumentParser()
    add_arguments(p)
    flags = ["--models", str(models), "--max-tokens", "8", "--gamma", "2", "--temperature", "0"]
    said = ["Once upon a time", " there", " again"]
    want = io.StringIO()
    assert chat(p.parse_args([*flags, "--drafter", "cpu", "--verifier", "cpu"]), iter(said), want) == 0
    capsys.readouterr()
    other = "verifier" if role == "drafter" else "drafter"
    config = check_args(p.parse_args([*flags, "--" + role, "virtual", "--" + other, "cpu"]))
    warned: list[str] = []
    out = io.StringIO()
    with Mesh.from_config(config, say=[].append, warn=warned.append) as mesh:
        board = StopsAtTheEnd(mesh, role, monkeypatch)

        def turns():
            board.mark()
            board.stop_at_end = True
            yield said[0]  # the board stops as its stats are asked
            board.resume()  # and goes on before the next turn: asked HELLO, it serves it
            board.mark()
            yield said[1]  # it stops at this one's end again
            board.stop_at_end = False
            board.mark()
            yield said[2]  # still silent: asked HELLO alone, and the turn falls back

        try:
            assert _turns(mesh, turns(), False, out, True) == 0
        finally:
            board.resume()
    err = capsys.readouterr().err.splitlines()
    assert out.getvalue() == want.getvalue()  # the text stands
    line = ("specmesh chat: %s stopped answering at the text's end (the text is whole; its stats are missing): the "
            "next turn asks it again first and %s if it is still silent"
            % (board.board.name, "goes on with plain decoding" if role == "drafter" else "the cpu verifier takes over"))
    assert err == [line, line], err  # once after each turn it stopped at, then the fall-back's line alone
    first, second, third = board.each()
    assert first[-1] == m.STATS and second[:2] == [m.HELLO, m.BEGIN], board.sent
    assert (m.DRAFT_REQ if role == "drafter" else m.VERIFY_REQ) in second and second[-1] == m.STATS, board.sent
    assert third == [m.HELLO], board.sent  # no BEGIN, no DRAFT or VERIFY waiting out its deadline, no STATS
    assert [s["failovers"] for s in board.stats[:2]] == [[], []] and board.stats[1][role] == board.board.name
    (failover,) = board.stats[2]["failovers"]
    assert warned == [failover] and board.stats[2]["failed"] == {role: board.board.name}, warned
    assert failover.startswith("%s %s failed (stopped answering at the last text's end (node %d did not answer STATS "
                               "within %.0f s" % (role, board.board.name, board.board.proxy.node, END_S)), failover
    assert ") and did not answer HELLO within %.0f s at this one's start either): " % END_S in failover, failover
    assert failover.count(board.board.name) == 1, failover  # the line names the board once (it said it twice)


def test_a_stage_silent_at_a_reply_s_end_is_one_line_and_the_next_turn_asks_it_again(models, capsys, monkeypatch):
    """`--stages`: a stage board silent at a reply's end (its VM stopped as the stats were asked) is one line after that
    turn, which says what a chat does next: no board replaces a stage, so the next turn, the stage still silent, ends
    with the stage's line (pipeline.REVIVE_S), and the turn after it, the stage answering again, goes on."""
    from specmesh.host.cli.chat import _turns
    from specmesh.host.cli.run import check_args
    from specmesh.host.cli.session import Mesh
    from specmesh.shared import messages as m
    from tests.emulator_util import StopsAtTheEnd

    p = argparse.ArgumentParser()
    add_arguments(p)
    flags = ["--models", str(models), "--drafter", "cpu", "--max-tokens", "8", "--gamma", "2", "--temperature", "0"]
    with Mesh.from_config(check_args(p.parse_args([*flags, "--stages", "2"])), say=[].append, warn=[].append) as mesh:
        board = StopsAtTheEnd(mesh, "verifier", monkeypatch, name="stage1")

        def turns():
            board.stop_at_end = True
            yield "Once upon a time"
            board.stop_at_end = False
            board.mark()
            yield " there"  # still silent: the turn ends with its line
            board.resume()
            board.mark()
            yield " again"  # it answers: the turn goes on

        try:
            assert _turns(mesh, turns(), False, io.StringIO(), True) == 0
        finally:
            board.resume()
    err = capsys.readouterr().err.splitlines()
    assert err[0] == ("specmesh chat: virtual:stage1(esp32) stopped answering at the text's end (the text is whole; its "
                      "stats are missing): the next turn asks it again first and fails with its line (no board "
                      "replaces a stage) if it is still silent"), err
    assert len(err) == 2 and err[1].startswith("specmesh chat: stage 2 of 2 (layers 1:2, virtual:stage1(esp32)) "
                                               "stopped answering: at the text's end"), err
    silent, answering = board.each()
    assert silent == [m.HELLO] and answering[:2] == [m.HELLO, m.BEGIN] and m.STAGE in answering, board.sent
    assert [s["failovers"] for s in board.stats] == [[], []]  # the first turn's and the last's: the text went on


def test_a_real_board_silent_at_a_reply_s_end_is_to_be_checked_too():
    """The line of a real board (a port: no new mesh starts it afresh) says, besides what the next turn does, what to
    check; a virtual board's needs nothing done (the test above)."""
    from specmesh.host.cli.session import stopped_line

    row = {"name": "/dev/ttyUSB0", "role": "verifier", "error": "stopped answering at the text's end: node 2 did not "
                                                                "answer STATS within 5 s"}
    assert stopped_line([row], "turn") == (
        "/dev/ttyUSB0 stopped answering at the text's end (the text is whole; its stats are missing): the next turn "
        "asks it again first and the cpu verifier takes over if it is still silent; check that board (its power and "
        "cable; `specmesh console /dev/ttyUSB0` shows what it prints)")
    assert stopped_line([{**row, "error": "failed during the run, not asked"}], "turn") is None


class _CtrlCAtPieces:
    """chat's Printer, whose show() sends this process `at[n]` Ctrl-Cs (SIGINT) as it shows its piece n (counted over
    the whole chat; 0: the first turn's own text): keys pressed while a reply runs, at a known round."""

    def __init__(self, at: dict[int, int]):
        import os
        import signal

        from specmesh.host.cli.output import Printer

        shown = iter(range(1_000_000))

        class Pressing(Printer):
            def show(self, segments):
                super().show(segments)
                for _ in range(at.get(next(shown), 0)):
                    os.kill(os.getpid(), signal.SIGINT)  # (each handled before the next is sent)

        self.printer = Pressing


def test_a_ctrl_c_typed_while_a_reply_runs_ends_that_reply_and_the_chat_goes_on(models, monkeypatch, capsys):
    """At a terminal, a Ctrl-C while a reply runs ends the reply after its round, with one line, and the chat goes on:
    what was shown is kept in the context, so (greedy) an empty line next goes on from where the reply stopped, the
    two turns' text the start of one turn's uninterrupted. It ended the whole chat, its context lost."""
    from specmesh.host.cli import chat as chat_module

    monkeypatch.setattr(chat_module, "Printer", _CtrlCAtPieces({1: 1}).printer)  # the first reply's first round
    out, whole = io.StringIO(), io.StringIO()
    a = args(models, "--max-tokens", "40", "--gamma", "2", "--no-color")
    assert chat(a, iter(["The little dog", ""]), out, typed=True) == 0
    err = capsys.readouterr().err
    assert err == ("specmesh chat: reply stopped (Ctrl-C): type a line, or an empty one to go on; Ctrl-C at the prompt "
                   "or Ctrl-D leaves\n")
    first, second = out.getvalue().splitlines()
    assert first.startswith("The little dog") and len(first) < len(second) + len("The little dog")
    monkeypatch.undo()
    assert chat(args(models, "--max-tokens", "80", "--gamma", "2", "--no-color"), iter(["The little dog"]), whole) == 0
    assert whole.getvalue().startswith(first + second)


@pytest.mark.parametrize("typed", [True, False])
def test_a_second_ctrl_c_in_one_reply_or_a_piped_chat_s_first_ends_the_chat(models, monkeypatch, typed):
    """A Ctrl-C that the reply did not end at (pressed again, the reply stuck), or any Ctrl-C in a chat fed by a pipe
    or a file (a script's), raises KeyboardInterrupt: the chat ends, as run does (130, one line: main)."""
    from specmesh.host.cli import chat as chat_module

    monkeypatch.setattr(chat_module, "Printer", _CtrlCAtPieces({1: 2 if typed else 1}).printer)
    with pytest.raises(KeyboardInterrupt):
        chat(args(models, "--max-tokens", "40", "--gamma", "2", "--no-color"), iter(["The little dog", "x"]),
             io.StringIO(), typed=typed)

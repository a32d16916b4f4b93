"""`specmesh chat`: an interactive session on `specmesh run`'s back-ends and flags: each line typed joins
the context, the model continues it (speculatively, as `run` does, up to --max-tokens a turn, ending
before a --stop string; an empty line adds nothing, so the model goes on from where it stopped), and the
context is kept across turns until it fills; then one line says so and the session ends. --prompt or
--prompt-file, when given, is the first turn. The stories model has no chat template: a turn's text is
appended to the story as typed. At a terminal, a Ctrl-C while a reply runs ends that reply after its round (what it
showed is kept in the context) and the chat goes on; one at the prompt, or a second in the same reply, ends the chat,
as any Ctrl-C does in a chat fed by a pipe (a script's).

Each turn begins the back-ends on the whole context (BEGIN carries it), so a board that restarted between
turns loses nothing; the gamma controller keeps what it learned across turns. The turns run on one `Mesh`
(host/cli/session.py), as `run` does: a verifier that fails is replaced by the `cpu` one (one line on stderr)
and the session goes on with it; a drafter that fails is dropped (one line) and the turns go on plainly. A pipeline's
stage that stops answering (`--stages`: no board replaces it) ends its turn with one line, the reply so far not kept;
the next turn asks the stage HELLO first (host/backends/pipeline.py REVIVE_S, as serve's next request does) and goes
on where it answers, else fails the same way; turns that end with the stage still silent end the chat with status 1.
A board that stops answering at a reply's end (its stats unanswered, END_S) is one line after that turn; the next turn
asks it HELLO first (END_S) and goes on with it where it answers, else fails over at once as above, its DRAFT or VERIFY
not sent (a stage: its turn ends as above).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import select
import sys
import threading

from specmesh.host.cli.config import BOM, PROMPT_MAX_BYTES, blocking
from specmesh.host.cli.flags import hide
from specmesh.host.cli.output import Printer
from specmesh.host.cli.run import UsageError, add_arguments, check_args, failed
from specmesh.host.cli.session import GenerationFailed, Mesh, gamma_controller, say_on_stderr, stopped_line
from specmesh.host.cli.streams import stdout_to_devnull, unguarded
from specmesh.host.stops import awake, first_interrupt_sets

PROMPT = "> "
# run's flags that chat refuses (it prints no stats table, JSON or projection, which these ask for or price): each
# still parsed, to be refused in one line, and left out of chat's help
RUN_ONLY = ("stats_json", "project", "quiet", "calibration", "drafter_calibration")


class LineTooLong(Exception):
    """A line on stdin over PROMPT_MAX_BYTES: no context holds it, and its end may never come (/dev/zero), so
    the session ends on it (status 1) rather than read on."""


def add_parser(sub) -> None:
    p = sub.add_parser("chat", help="an interactive session: each line continues the story, the context kept "
                                    "across turns until it fills")
    add_arguments(p)
    hide(p, RUN_ONLY)
    for action in p._actions:  # (argparse has no public list of a parser's actions)
        if action.dest == "prompt":  # no opening turn unless given, and stdin holds the turns
            action.help = "the first turn (default: none, the turns are read from stdin)"
        elif action.dest == "prompt_file":
            action.help = "read the first turn from file F (UTF-8)"
        elif action.dest == "kernels":  # (run's help says "with --project", which chat refuses)
            action.help = ("with --stages: the board kernels the stages' costs are priced with, which gamma auto plans "
                           "from (default native: the xtensawin module; viper: the MicroPython-only engine)")
    p.set_defaults(func=main)


def main(a: argparse.Namespace) -> int:
    try:
        # a turn typed at a terminal is on it already; into a file or a pipe it goes with the text, as a piped one
        return chat(a, _lines(), sys.stdout, echo=not (sys.stdin.isatty() and sys.stdout.isatty()),
                    typed=sys.stdin.isatty())
    except BrokenPipeError:
        raise
    except LineTooLong as e:
        print("specmesh chat: error: %s" % e, file=sys.stderr)
        return 1
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - every failure is one line for the user
        return failed("chat", e)


def _lines(stdin=None):
    """The turns typed: input() with a prompt on a terminal, else stdin's lines (read as bytes, each decoded on
    its own, a leading byte order mark dropped); EOF ends them. A line that is not UTF-8 is skipped with one line saying so: the session goes on."""
    stdin = stdin or sys.stdin
    tty = stdin.isatty()
    if tty and sys.stdout.isatty():  # input()'s line editing: without it an arrow key's escape sequence (\x1b[D)
        try:  # was typed into the turn
            import readline  # noqa: F401
        except ImportError:  # a Python built without it
            pass
    blocking(stdin)  # left non-blocking by a parent, a turn not yet written would read as the end of the turns
    while True:
        try:
            # a terminal's bytes that are not UTF-8 come from input() as surrogates (stdin's surrogateescape, as
            # under C.UTF-8), which no tokenizer encodes: turned back into the bytes typed, to be told as a pipe's.
            # GNU readline (stdout a terminal too) drops a lead byte that no continuation follows (caf\xe9) before
            # input() sees it, and its echo shows the line without it: what is seen is what is sent
            with awake():  # a Ctrl-C that came just before the read began is not lost (the chat sat at its prompt)
                line = _typed().encode("utf-8", "surrogateescape") if tty else \
                    stdin.buffer.readline(PROMPT_MAX_BYTES + 1)
            if not tty:
                if not line:
                    return
                if len(line) > PROMPT_MAX_BYTES:
                    raise LineTooLong("a line on stdin is over %d MiB, more than any context holds: the chat ends; "
                                      "feed it lines of text" % (PROMPT_MAX_BYTES >> 20))
            line = line.decode("utf-8")
        except EOFError:
            return
        except UnicodeDecodeError as e:
            print("specmesh chat: that line is not UTF-8 text (byte 0x%02x at offset %d): skipped, type it in UTF-8"
                  % (e.object[e.start], e.start), file=sys.stderr, flush=True)
            continue
        yield line.removeprefix(BOM).rstrip("\r\n")  # a file's mark, or each one's of files joined by cat


def _typed() -> str:
    """A line typed at the terminal, after the prompt where its user sees it: on stdout when that is the terminal
    too (input()'s line editing), else on stderr: `chat > story.txt` would put the prompts in the story."""
    at = sys.stdout if sys.stdout.isatty() else sys.stderr
    if at is sys.stdout and _ended_ahead(sys.stdin.fileno()):
        raise EOFError
    try:
        # (unguarded: input() clears what stdout's methods raise, and writing_stdout's guard would run them in Python,
        # where a Ctrl-C is raised)
        if at is sys.stdout:  # with readline's line editing (_lines imports it)
            return unguarded(input, PROMPT)
        print(PROMPT, end="", file=sys.stderr, flush=True)
        return unguarded(input)
    except EOFError:  # Ctrl-D at the prompt: the line ended, so that the shell's prompt is not put after ours
        try:
            print(file=at, flush=True)
        except OSError:  # the terminal closed (under nohup): no line to end, and stdout's unwritten end goes nowhere
            if at is sys.stdout:
                stdout_to_devnull()
        raise


def _ended_ahead(fd: int) -> bool:
    """Whether a Ctrl-D typed at the terminal `fd` while a reply ran waits there, with nothing typed before it (then
    read: the end of the turns). GNU readline reads with the terminal's canonical mode off, where a Ctrl-D that the
    terminal took as the end of input while the mode was on reads as a 0 byte, which readline drops: the chat sat at
    its prompt, the end asked for lost. A pending end of input is what the terminal says is readable while it counts
    no byte to read (FIONREAD leaves the end out); a line typed ahead is left to readline, which edits it as typed."""
    try:
        import fcntl  # POSIX only, as GNU readline is
        import termios
    except ImportError:
        return False
    try:
        canonical = termios.tcgetattr(fd)[3] & termios.ICANON
    except termios.error:  # the terminal closed (under nohup, while the reply ran): input() finds the end
        return False
    if not canonical or not select.select([fd], [], [], 0)[0]:
        return False
    count = bytearray(4)
    fcntl.ioctl(fd, termios.FIONREAD, count)
    return int.from_bytes(count, sys.byteorder) == 0 and os.read(fd, 1) == b""


def chat(a: argparse.Namespace, lines, out, echo: bool = True, typed: bool = False) -> int:
    """Run the turns `lines` gives, each shown before its continuation when `echo` (a terminal has shown
    it already); returns the exit status (0 also when the context filled). `typed`: the turns are typed at a
    terminal, where a Ctrl-C while a reply runs ends that reply and the chat goes on (a piped chat's ends it)."""
    opening = a.prompt is not None or a.prompt_file is not None
    if a.prompt == "-":
        raise UsageError("chat reads its turns from stdin: give the first turn as --prompt TEXT or --prompt-file F")
    for dest in RUN_ONLY:
        if getattr(a, dest):
            raise UsageError("chat prints each turn's text and no stats: drop --%s (specmesh run takes it)"
                             % dest.replace("_", "-"))
    config = check_args(a)
    with Mesh.from_config(config, say=say_on_stderr(), warn=say_on_stderr()) as mesh:
        return _turns(mesh, itertools.chain([config.prompt] if opening else [], lines), opening, out, echo, typed)


def _turns(mesh: Mesh, turns, opening: bool, out, echo: bool, typed: bool = False) -> int:
    """The chat on `mesh`: one lane for the whole session, and one gamma controller learning across turns."""
    config, tok = mesh.config, mesh.tok
    printer = Printer(out, color=config.color)
    if mesh.warn is not None:  # a fail-over's line mid-reply on a line of its own
        mesh.warn = printer.own_line(mesh.warn)
    with mesh.lane() as lane:
        controller = gamma_controller(config, lane.drafter)
        context: list[int] = []
        for i, line in enumerate(turns):
            least = tok.least_tokens(line)  # the line alone, from BOS: one too long by its bytes is not encoded
            new = tok.encode(line, bos=not context) if least < mesh.context else []
            alone = len(new) + bool(context) if new else least
            if alone >= mesh.context:  # no chat could take it: skipped, the session goes on
                print("specmesh chat: that line is %s%d tokens and the context holds %d: skipped, type a shorter one"
                      % ("" if new else "at least ", alone, mesh.context), file=sys.stderr, flush=True)
                continue
            if len(context) + len(new) >= mesh.context:
                print("specmesh chat: the context is full (%d of %d positions; this turn needs %d more): start a new "
                      "chat" % (len(context), mesh.context, len(new)), file=sys.stderr)
                return 0
            context += new
            if echo or (i == 0 and opening):
                printer.show([(line, False)])
            stalled = None
            stop = threading.Event()  # a Ctrl-C typed while the reply runs, at a terminal: the reply ends there
            try:
                with first_interrupt_sets(stop) if typed else contextlib.nullcontext():
                    done = mesh.complete(context, on_piece=lambda p: printer.show(p.segments), cancel=stop,
                                         controller=controller, lane=lane)
            except GenerationFailed:
                stalled = mesh.stalled(again=True)  # its line, less a run's "run again": this chat asks again
                if stalled is None:  # no later turn mends it: the chat ends on its line
                    raise
            finally:
                printer.end()
            if stalled is not None:  # a stage that stopped answering: the next turn asks it HELLO (REVIVE_S) first
                print("specmesh chat: %s; this turn's reply is not kept, and the next turn asks the stage again (type a "
                      "line, or an empty one to go on)" % stalled, file=sys.stderr, flush=True)
                continue
            stopped = stopped_line(done.stats["boards"], "turn")  # a board silent at the reply's end
            if stopped:
                print("specmesh chat: " + stopped, file=sys.stderr, flush=True)
            context += done.token_ids  # with a stop string, the tokens whose text ends before it
            if done.stop == "cancelled":  # what was shown is kept, as a reply of its own
                print("specmesh chat: reply stopped (Ctrl-C): type a line, or an empty one to go on; Ctrl-C at the "
                      "prompt or Ctrl-D leaves", file=sys.stderr, flush=True)
            if done.stop == "eos" and not done.token_ids:  # the turn showed no reply, and an empty line gets none
                print("specmesh chat: the model ended the story there, with no reply (its end-of-story token): type "
                      "something new, or start a new chat", file=sys.stderr, flush=True)
            if done.stop == "context":
                print("specmesh chat: the context is full (%d positions): start a new chat" % mesh.context,
                      file=sys.stderr)
                return 0
    return 1 if mesh.failed else 0  # the turns ended with the stage still silent

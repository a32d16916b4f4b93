"""A `specmesh` command's Ctrl-C before it runs: from the first of our code a command runs (`import specmesh`), while
its modules still import, a Ctrl-C ends it with the shell's 130 and nothing said, not the interpreter's
KeyboardInterrupt traceback. This module imports only modules built into the interpreter (_signal, sys), so that it
takes over within a millisecond of our first statement; host/stops.py takes over once the command runs (and once
it ran, ignores a Ctrl-C while Python exits)."""

import _signal  # type: ignore[import-not-found]  # signal's C half (no stub): `import signal` imports enum first
import sys

# the commands that run until they are stopped, which a script starts in its background and ends with `kill -INT`:
# they take a Ctrl-C even where they inherited it ignored (a background job of a shell script does), else the
# signal is lost (serve's uvicorn takes it only once it serves, its boards booted), and the script waits for good
RUN_UNTIL_STOPPED = ("emulate", "serve")
# the modules `python -m` runs as the `specmesh` command (a tool, `python -m specmesh.tools.NAME`, is not it)
COMMAND_MODULES = ("specmesh", "specmesh.host.cli")
SCRIPT = "specmesh"  # the console script's name (pyproject.toml [project.scripts])


def exit_quietly(_signum: int, _frame) -> None:
    """The Ctrl-C handler until the command runs: status 130, nothing said. SystemExit, not os._exit: a `finally` on
    the way still runs."""
    raise SystemExit(130)


def quiet_until_it_runs(argv: list[str]) -> None:
    """Until stops.stoppable runs the command `argv` (sys.argv: its modules importing, numpy's taking a few tenths of a
    second), a Ctrl-C ends the process with status 130 and nothing said. A Ctrl-C the process inherited ignored (a
    script's background job) stays ignored, but for a command that runs until stopped (RUN_UNTIL_STOPPED); SIGTERM
    and SIGHUP keep their default, which ends the process at once and silently: nothing to clean up before the
    command runs."""
    inherited = _signal.getsignal(_signal.SIGINT)
    if inherited is _signal.default_int_handler or (inherited == _signal.SIG_IGN and _command(argv) in RUN_UNTIL_STOPPED):
        _signal.signal(_signal.SIGINT, exit_quietly)


def quiet_from_the_first_import() -> None:
    """quiet_until_it_runs from `import specmesh`, the first of our code that the `specmesh` console script and
    `python -m specmesh...` (the command, a tool) run; a program that imports specmesh otherwise keeps its Ctrl-C.
    Under -m the interpreter holds sys.argv[0] at "-m" while it imports the packages above the module it runs, and
    sys.orig_argv names that module (`-m NAME` or `-mNAME`) just before sys.argv's arguments; the console script's
    sys.argv[0] is its path (pip's launcher on Windows: NAME.exe or NAME-script.pyw)."""
    argv = getattr(sys, "argv", [])  # (an embedded interpreter may have none)
    if argv[:1] == ["-m"]:
        module = sys.orig_argv[-len(argv)].removeprefix("-m")
        if module.partition(".")[0] == "specmesh":
            quiet_until_it_runs(argv if module in COMMAND_MODULES else [])
    elif argv and argv[0].replace("\\", "/").rpartition("/")[2].removesuffix(".exe").removesuffix(
            "-script.pyw") == SCRIPT:
        quiet_until_it_runs(argv)


def _command(argv: list[str]) -> str:
    """The command `argv` (sys.argv) names: its first word that is no flag ("" for none)."""
    return next((a for a in argv[1:] if not a.startswith("-")), "")

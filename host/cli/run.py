"""`specmesh run`: set up the drafter and verifier back-ends, generate, stream the text, print the stats.

The arguments become one checked, frozen `RunConfig` (host/cli/config.py) before anything starts; the rest
of the run reads that. Back-ends by name, each made through the tables of host/cli/registry.py: `cpu` (numpy engine on the host), `torch-cpu`,
`gpu`, `virtual` or `virtual:CLASS` (a virtual board started and flashed for this run,
host/provision/cluster.py), `pipeline` (`--stages N`), or a serial port of a flashed board. `--plain` decodes with the verifier alone
(the baseline). Every user error is one line on stderr and exit status 2; a failure during generation is
one line and status 1.
A verifier that fails mid-run is replaced by the `cpu` one and a drafter that fails leaves the stream
on plain decoding (host/decode/orchestrator.py): one line on stderr, the text goes on unchanged.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from specmesh.host.atomic import STDOUT
from specmesh.host.cli.config import RunConfig, UsageError
from specmesh.host.cli.flags import add_arguments
from specmesh.host.cli.output import OutputLost, Printer, format_table, write_stats_json
from specmesh.host.cli.session import GenerationFailed, Mesh, one_line, say_on_stderr, stopped_line
from specmesh.host.cli.streams import STDOUTS, stdout_to_devnull, writing_stdout
from specmesh.host.stops import Stopped, say_stopped


def check_args(a: argparse.Namespace) -> RunConfig:
    """The run's configuration from its arguments, checked (UsageError: one line); `a` is left as it is. A flag
    given that changes nothing is said in one line on stderr."""
    config = RunConfig.from_args(a)
    for note in config.notes:
        print("specmesh: note: " + note, file=sys.stderr, flush=True)
    return config


def run(a: argparse.Namespace | RunConfig, out=None) -> dict:
    """Generate as `a` says, the prompt and the text streamed to `out` (default stdout); returns the stats.
    Raises UsageError, GenerationFailed and friends. A board that stopped answering at the text's end is one line on
    stderr, as a fail-over is (the text is whole: the exit status stands)."""
    out = out if out is not None else sys.stdout
    config = a if isinstance(a, RunConfig) else check_args(a)
    printer = Printer(out, color=config.color)
    warn = printer.own_line(say_on_stderr())
    with Mesh.from_config(config, say=None if config.quiet else say_on_stderr(), warn=warn) as mesh:
        mesh.rejoins = False  # its one generation: no later one asks a board it dropped again
        printer.show([(config.prompt, False)])
        try:
            done = mesh.complete(mesh.encode(config.prompt), on_piece=lambda p: printer.show(p.segments))
        finally:
            printer.end()
    stopped = stopped_line(done.stats["boards"])
    if stopped:
        warn(stopped)
    return done.stats


def failed(command: str, e: Exception | KeyboardInterrupt) -> int:
    """The exit code of `specmesh COMMAND` that stopped on `e`, after one line on stderr, never a traceback
    (SPECMESH_DEBUG=1 re-raises): 2 for a usage error or a setup failure, 1 when generation failed, 130
    for Ctrl-C, 128 + the signal for SIGTERM or SIGHUP (host/stops.py)."""
    if isinstance(e, UsageError):
        print("specmesh %s: error: %s" % (command, e), file=sys.stderr)
        return 2
    if isinstance(e, Stopped):
        say_stopped("specmesh " + command, str(e))
        return e.status
    if isinstance(e, KeyboardInterrupt):
        say_stopped("specmesh " + command, "interrupted")
        return 130
    if os.environ.get("SPECMESH_DEBUG"):
        raise e
    print("specmesh %s: error: %s" % (command, one_line(e)), file=sys.stderr)
    if isinstance(e, OutputLost):
        stdout_to_devnull()
    return 1 if isinstance(e, (GenerationFailed, OutputLost)) else 2


def main(a: argparse.Namespace) -> int:
    # the text alone on stdout, the table on stderr; `--stats-json -`: stdout holds the JSON alone (for a pipe
    # to jq), so the text goes to stderr too
    out = sys.stderr if a.stats_json == STDOUT else sys.stdout
    try:
        stats = run(a, out)
    except BrokenPipeError:
        raise
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - every failure is one line for the user
        return failed("run", e)
    if not a.quiet:
        print(format_table(stats), file=sys.stderr)
    if a.stats_json is not None:
        try:
            write_stats_json(a.stats_json, stats)
        except STDOUTS:  # `--stats-json -` (or /dev/stdout): said as stdout's (a reader that left: quietly)
            raise
        except OSError as e:
            print("specmesh run: error: cannot write %s: %s" % (a.stats_json, e.strerror), file=sys.stderr)
            return 1  # checked writable before the run: this failed while writing (a full disk, /dev/full)
    return 0


def cli(argv: Sequence[str] | None = None) -> int:
    """Entry point for tests and tools: `specmesh run` with these arguments."""
    p = argparse.ArgumentParser(prog="specmesh run")
    add_arguments(p)
    return writing_stdout("specmesh run", lambda: main(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(cli())

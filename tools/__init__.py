"""specmesh tools: drafter distillation, export, llama2.c import, model card, test vectors, benchmarks, fuzzing."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NoReturn


def without_torch(error: ImportError, module: str) -> NoReturn:
    """A tool that needs PyTorch run as `python -m specmesh.tools.NAME` (`module` "__main__") where it is absent:
    exit 1 with one line saying how to install it. Imported (by tests, by another tool), `error` is raised."""
    if module != "__main__" or error.name != "torch":
        raise error
    from specmesh.host.backends.torch_backend import INSTALL_HINT

    sys.exit("%s: %s" % (Path(sys.argv[0]).stem, INSTALL_HINT))


def not_a_command(name: str, instead: str) -> NoReturn:
    """`python -m specmesh.tools.NAME` of a module the tools and tests import, which did nothing and exited 0: one
    line saying so and what to run instead, status 1."""
    sys.exit("%s: a module the tools and tests import, not a command: %s" % (name, instead))


# the end of a tool's flag's help that names its default (argparse fills it in)
DEFAULT = " (default: %(default)s)"


def run_tool(name: str, main: Callable[[], int | None]) -> NoReturn:
    """`python -m specmesh.tools.NAME`: exit with main()'s status; Ctrl-C, SIGTERM and SIGHUP end it with one line
    and the shell's status (130, 128 + the signal) after every `finally` on the way out ran (a half-written file's
    temporary removed), a reader of stdout that left (`| head`) quietly with 141, a write to stdout that failed
    (`> /dev/full`) with one line saying so and 1; a file it reads that is missing or corrupt, or a virtual board that
    cannot start (QEMU not installed), is one line and 1: never a traceback."""
    from specmesh.host.backends import BackendError
    from specmesh.host.cli.streams import writing_stdout
    from specmesh.host.decode.tokenizer import TokenizerError
    from specmesh.host.emulator import BoardError
    from specmesh.host.stops import stoppable
    from specmesh.shared.modelfile import ModelFileError

    try:  # stdout's failures (`| head`, `> /dev/full`) are writing_stdout's: quiet, or one line naming stdout
        status = stoppable(name, lambda: writing_stdout(name, main))
    except (OSError, ModelFileError, TokenizerError, BackendError, BoardError) as e:  # a file it reads, a board
        if os.environ.get("SPECMESH_DEBUG"):  # as specmesh's commands: the traceback, for a developer
            raise
        print("%s: %s" % (name, said(e)), file=sys.stderr)
        status = 1
    sys.exit(status)


def said(e: BaseException) -> str:
    """`e` for the user: an OSError on a file as "FILE: what the system said", not Python's "[Errno 2] No such file or
    directory: 'FILE'", a folder read as a file as the commands say it ("FILE: Is a directory" gave no way on); any
    other as its message."""
    if isinstance(e, IsADirectoryError) and e.filename is not None:  # filename2: a rename's target
        return "%s is a folder, not a file: name a file (or replace the folder with it)" % (e.filename2 or e.filename)
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        return "%s: %s" % (e.filename, e.strerror)
    return str(e)


def last_line(text: str) -> str:
    """What a failed process said last (its error, after a traceback), or "no output": one line for the user."""
    lines = text.strip().splitlines()
    return lines[-1] if lines else "no output"


def output_problem(path: str | os.PathLike, inputs: Iterable[Path] = ()) -> str | None:
    """Why a tool's output file `path` cannot be written (host/atomic.py output_problem), its folder made first
    (runs/ on a fresh clone), or why it must not be: it names one of the files the tool reads, `inputs` (atomic.py
    overwrites: `--json models/target.spm` replaced the model with the figures). Checked before the tool's minutes of
    work, not after them."""
    from specmesh.host import atomic

    with contextlib.suppress(OSError):  # a file on the way: output_problem says so
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    problem = atomic.output_problem(path)
    hit = None if problem else atomic.overwrites(path, list(inputs))
    if hit is not None:
        return "it would overwrite %s, which this tool reads: give another file" % hit.name
    return problem

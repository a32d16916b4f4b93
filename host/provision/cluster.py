"""Boards for a run: virtual boards started and flashed on demand, or a real board on a serial port.

`Cluster(transport, models)` starts, for each role asked of it, a virtual board of the class a real
one would be (drafter: classic ESP32 without PSRAM; verifier: ESP32-S3 with 8 MB PSRAM), flashes it
through the same path as a real board (host/provision/flash.py: mpy-cross, mpremote, hash check, reset), opens
its pty with pyserial and hands back the role's back-end (host/backends/board.py). Flash folders persist under
build/vboards/ (in an installed copy: ~/.cache/specmesh/vboards), so a later run copies only what
changed. With `--transport espnow` the boards talk over the virtual radio and the host reaches them
through a gateway board on its serial link.
Everything started is stopped when the cluster closes. `find` discovers a flashed real board by the role it
reports (HELLO), `connect` opens one on a known port, once its HELLO says it runs this checkout's node
(`check_firmware`). Both kinds are back-ends of each role, by name in
host/cli/registry.py's tables: `virtual` (the role's default class), `virtual:CLASS` (a virtual board of any
class of host/boardclasses.py: the unix port sized as that class, or QEMU running that class's own machine code:
the RV32 firmware for esp32c3/esp32c6, the Xtensa one for esp32/esp32s3, host/emulator/qemu.py), `pipeline` for the verifier (`--stages N` stage boards), and `PORT` for a
serial port's name (`virtual`, `pipeline` and `on_port` make their factories; a list of ports, real stage boards:
host/provision/stageports.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from specmesh.host import atomic
from specmesh.host.backends import BackendError, Boards
from specmesh.host.backends.board import BoardDrafter, BoardVerifier, role_args
from specmesh.host.backends.modelio import check_model_file
from specmesh.host.backends.pipeline import BoardStage, PipelineVerifier
from specmesh.host.boardclasses import ROLE_CLASS, VIRTUAL_TOO_SMALL, drafter_class, drafter_model
from specmesh.host.bus.links import LinkError, SerialLink
from specmesh.host.bus.proxy import Bus, HostAuth, NodeError, Proxy
from specmesh.host.layout import MODELS, ROOT, model_path
from specmesh.host.provision.flash import NODE_ID, again_args, firmware_id
from specmesh.shared import messages as m
from specmesh.shared.codec import BROADCAST, CodecError, Frame


def _vboards_dir() -> Path:
    """Where virtual boards keep their flash between runs: $SPECMESH_VBOARDS if set, build/vboards/ in a
    checkout, the user's cache folder when specmesh is installed (never inside site-packages)."""
    if os.environ.get("SPECMESH_VBOARDS"):
        return Path(os.environ["SPECMESH_VBOARDS"])
    if (ROOT / "pyproject.toml").is_file():
        return ROOT / "build" / "vboards"
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "specmesh" / "vboards"


VBOARDS = _vboards_dir()
BACKEND = {"drafter": BoardDrafter, "verifier": BoardVerifier, "stage": BoardStage}
# what to do when no REPL answers a virtual board's flash (flash.NoRepl tells a real board's owner to reset it): a
# run starts every virtual board's VM afresh
VIRTUAL_NO_REPL = "its VM stopped answering: run again (a virtual board is started afresh)"
# what to do about a virtual board's VM that hung before it was up (emulator Hung, flash NotUp): waited for once, for
# VM_START_S (host/emulator/board.py), no second flash tried
VIRTUAL_HUNG = ("run again (a virtual board is started afresh); should it hang again, free the host's CPU and memory "
                "for it")


def _host_disk_full(folder: Path, model: Path) -> str | None:
    """Why a virtual board's flash failed when the host's disk holding its folder has no room for the model (a
    write the board saw as ENOSPC: "board filesystem is full"), as one line saying what to free; else None."""
    try:
        free = shutil.disk_usage(folder).free
        need = model.stat().st_size + (1 << 20)  # the model beside the node's files
    except OSError:
        return None
    if free >= need:
        return None
    return ("the host's disk holding %s is full (%d KiB free, about %d KiB needed): free space there, or set "
            "SPECMESH_VBOARDS to a folder on another disk" % (folder, free // 1024, need // 1024))


def _last_config(path: Path) -> dict:
    """The config a virtual board was last flashed with (its flash folder's specmesh.json), or {} where there is none
    that reads as one (a hand edit, a disk that filled): the flash writes a whole one again, as it does on a real
    board whose config does not read (host/provision/flash.py `read_board_config`). One that failed to parse stopped
    every later run with the parser's words ('Expecting property name ...')."""
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):  # none yet; UnicodeDecodeError and JSONDecodeError are ValueErrors
        return {}
    return cfg if isinstance(cfg, dict) else {}


def split_layers(n_layers: int, n: int) -> list[tuple[int, int]]:
    """n contiguous slices (a, b) of n_layers layers, as even as can be; ValueError if n is not 1..n_layers
    (`specmesh run --stages` is checked before: host/cli/ranges.py)."""
    if not 1 <= n <= n_layers:
        raise ValueError("cannot split %d layers into %d stages" % (n_layers, n))
    cuts = [round(i * n_layers / n) for i in range(n + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def _open(port: str, stack: contextlib.ExitStack, faults=None, key: bytes | None = None, role: str = "ROLE") -> Bus:
    """A bus on the serial link at `port`, closed with `stack`; `faults` (host/bus/faults.py) are injected;
    with `key` every frame is signed and every reply must be (docs/security.md); `role`: the board's, named in the
    flash command of the link's lines (a key mismatch)."""
    auth = HostAuth(key) if key else None
    try:
        link = SerialLink(port, auth=auth, role=role)
    except LinkError as e:
        raise BackendError(str(e)) from None
    stack.callback(link.close)
    if faults is not None:
        from specmesh.host.bus.faults import FaultyLink

        link = FaultyLink(link, faults)
    return Bus(link, deadline=30.0, auth=auth)


def _backend(kind: str, bus: Bus, node: int, where: str, *extra, again: str | None = None):
    """The board back-end for `node` on `bus` (its HELLO opens the signed session when the bus signs); `extra`: its
    class's further arguments (a stage's layers); `again`: the flash command's arguments a wrong-role line gives."""
    return BACKEND[kind](Proxy(bus, node), where, *extra, again=again)


FIRST_HELLO_S = 2.0  # a running node answers HELLO well within this; past it the board may sit at its REPL
# Ctrl-C (stop what runs), Ctrl-B (leave the raw REPL: a soft reset there skips main.py), Ctrl-D (soft reset: main.py
# starts the node), each let land before the next; bytes a running node, which reads frames with Ctrl-C off, drops
SOFT_RESET = (b"\r\x03\x03", b"\x02", b"\x04")


def discover(bus: Bus, deadline: float = 10.0, role: str = "drafter|verifier") -> Frame:
    """The HELLO reply of the board on a serial link (HELLO to broadcast; its src says who answered). A board that does
    not answer within FIRST_HELLO_S may be sitting at its REPL (after `specmesh console`, an interrupted `specmesh
    flash`, `flash --no-reset`): it is soft-reset once, which starts its node (or shows it half-flashed), and
    asked again. `role`: the one the board is wanted for, named in the flash command a failure line gives (after
    --role: connect adds the node id, key file and model of the board's place). An emulate's board is waited for by
    the state it shows (host/emulator/board.py Shown): each HELLO's clock starts once its VM is up (up to VM_START_S),
    as a flash's does, the one its soft reset starts included (_after_reset)."""
    from specmesh.host.bus.proxy import ProxyError

    vm = _shown(bus)
    _wait_up(vm, bus.link.port)
    try:
        return bus.request(BROADCAST, m.HELLO, deadline=min(FIRST_HELLO_S, deadline))
    except ProxyError as e:
        if bus.link.error:  # diagnosed already: a key mismatch, a half-flashed board
            raise BackendError(no_node(bus.link, e, deadline, role=role)) from None
    _wait_up(vm, bus.link.port)
    before = vm.boots if vm is not None else 0
    for keys in SOFT_RESET:
        bus.link.write_raw(keys)
        time.sleep(0.2)
    try:
        return _after_reset(bus, deadline, vm, before)
    except ProxyError as e:
        raise BackendError(no_node(bus.link, e, deadline, reset=True, role=role)) from None


RESET_LOOK_S = 0.5  # the first HELLO slice after an emulate board's soft reset (_after_reset); each next one doubles


def _after_reset(bus: Bus, deadline: float, vm, before: int) -> Frame:
    """discover's HELLO after its soft reset; ProxyError where no node answers. A real board (`vm` None) gets
    `deadline`. An emulate's board (`vm`: Shown, up as boot `before` when the reset keys went) that the reset reboots
    is waited for: its next boot's VM up (up to VM_START_S), however late its old VM took the keys on a loaded host (the
    HELLO goes in slices, the state looked at after each), then `deadline` from there; where nothing reboots within
    `deadline` (a node that ignores the keys), the HELLO's is a real board's."""
    from specmesh.host.bus.proxy import ProxyError

    end, look = time.monotonic() + deadline, RESET_LOOK_S
    while vm is not None and not _rebooting(vm, before):
        try:
            return bus.request(BROADCAST, m.HELLO, deadline=max(0.05, min(look, end - time.monotonic())))
        except ProxyError as e:
            if bus.link.error or isinstance(e, NodeError) or (time.monotonic() >= end and not _rebooting(vm, before)):
                raise
        look *= 2
    _wait_up(vm, bus.link.port, after=before)
    return bus.request(BROADCAST, m.HELLO, deadline=deadline)


def _rebooting(vm, before: int) -> bool:
    """Whether the emulate's board `vm` (Shown) shows another state than boot `before` up: it is rebooting, or
    rebooted (its port closed: said by _wait_up)."""
    from specmesh.host.emulator.board import UP

    try:
        return vm.read() != (before, UP)
    except OSError:
        return True


def _shown(bus: Bus):
    """The state that the board on `bus` shows where it is an emulate's (host/emulator/board.py Shown), or None (a real
    board's port, a link that is no serial port's)."""
    from specmesh.host.bus import ports
    from specmesh.host.emulator.board import shown

    link = bus.link
    return shown(link.ser.fd) if isinstance(link, SerialLink) and ports.emulated(link.port) else None


def _wait_up(vm, port: str, after: int = 0) -> None:
    """Wait for the VM of an emulate's board `vm` (Shown; None: a real board, not waited for) to be up, one of
    another boot than `after` (0: any); BackendError in one line where it does not come up."""
    why = vm.wait_ready(after=after) if vm is not None else None
    if why is not None:
        raise BackendError(f"{port}: the virtual board is not up: {why}")


def no_node(link, e: Exception, deadline: float, reset: bool = False, role: str = "drafter|verifier") -> str:
    """Why no specmesh node answered HELLO on `link`, in one line: what the link diagnosed (a key mismatch, a
    half-flashed board), a board with no specmesh firmware, an answer that is not a node's (a traceback, another
    device's bytes), or silence. `reset`: a soft reset was tried (discover), which the line says."""
    port = link.port
    if link.error:
        return link.error
    fix = "flash the node with `specmesh flash --port %s --role %s`" % (port, role)
    text = [t.strip() for t in link.text if t.strip()]
    if reset and _bare(text):
        return ("the board on %s has no specmesh firmware (a soft reset leaves it at MicroPython's REPL): run "
                "`specmesh flash --port %s --role %s`" % (port, port, role))
    if text and _readable(text[-1]):
        return "%s answers, but not as a specmesh node%s: it printed %r (%s)" % (
            port, " even after a soft reset" if reset else "", text[-1][:100], fix)
    received, errors = link.noise()
    if received:
        kinds = ", ".join("%d %s" % (n, k) for k, n in sorted(errors.items())) or "no whole line"
        return ("%s sends %d bytes that are no specmesh frame (%s): another device, or a wrong baud rate"
                % (port, received, kinds))
    if isinstance(e, NodeError):
        return "%s: the node refused HELLO: %s" % (port, e)
    return "%s: nothing came back within %.0f s: is a board on this port, powered and running? If so, %s" % (
        port, deadline, fix)


def _bare(text: list[str]) -> bool:
    """Whether the console `text` shows a MicroPython with no specmesh firmware: after its soft reset ("MPY: soft
    reboot") the next line is its REPL's banner, nothing having run before it where the firmware's main.py starts
    the node (or prints why it cannot: a traceback, a half-flashed board)."""
    boots = [i for i, t in enumerate(text) if t.startswith("MPY: soft reboot")]
    after = text[boots[-1] + 1:] if boots else []
    return bool(after) and after[0].startswith("MicroPython v")


def _readable(line: str) -> bool:
    """Whether a console line reads as text (a REPL, a traceback) rather than noise (a wrong baud rate)."""
    return sum(c.isprintable() and c != "\ufffd" for c in line) >= 0.75 * len(line)


class StaleFirmware(BackendError):
    """Boards flashed from other files than this specmesh's (`check_firmware`), each as (port, kind, fw: what its HELLO
    says, None where it cannot be read, the flash command that makes it this specmesh's); its line names them all, so
    a run given several tells every one at once, not the next one after the first is flashed."""

    def __init__(self, boards: list[tuple[str, str, str | None, str]]):
        self.boards = boards
        super().__init__(_stale_line(boards))


class Failures(BackendError):
    """Boards to mend, several of them (a pipeline's stages): `stale`, as StaleFirmware's boards, and `others`, each
    other failure's line; its line is failures_line's, which a lane extends with its drafter's (host/cli/session.py)."""

    def __init__(self, stale: list[tuple[str, str, str | None, str]], others: list[str]):
        self.stale, self.others = stale, others
        super().__init__(failures_line(stale, others))


def _stale_line(boards: list[tuple[str, str, str | None, str]]) -> str:
    """The one line of StaleFirmware: the board, or each, with what its HELLO says and its flash command."""
    own = firmware_id()
    if len(boards) == 1:
        port, kind, fw, command = boards[0]
        said = "its HELLO is not one this specmesh reads" if fw is None else "it says %r, this specmesh's is %r" % (
            fw, own)
        return ("the %s board on %s runs a node flashed from other files than this specmesh's (%s): flashed before "
                "specmesh was updated? flash it again: %s" % (kind, port, said, command))
    said = ", ".join("%s: its HELLO is not one this specmesh reads" % port if fw is None else "%s says %r" % (port, fw)
                     for port, _, fw, _ in boards)
    return ("the boards on %s run nodes flashed from other files than this specmesh's (%s; this specmesh's is %r): "
            "flashed before specmesh was updated? flash each again: %s"
            % (", ".join("%s (%s)" % (port, kind) for port, kind, _, _ in boards), said, own,
               "; ".join(command for _, _, _, command in boards)))


def failures_line(stale: list[tuple[str, str, str | None, str]], others: list[str]) -> str:
    """One line naming every board to mend: the stale ones first (StaleFirmware's line), then each other failure, so
    that fixing one does not meet the next."""
    return "; ".join(([_stale_line(stale)] if stale else []) + others)


def check_firmware(hello: bytes, port: str, kind: str, role: str, key: bytes | None = None,
                   node: int | None = None, model: Path | None = None) -> None:
    """StaleFirmware unless the HELLO reply `hello` of the board on `port` (wanted as `kind`, flashed with `role`, the
    arguments of `specmesh flash --role`) names this checkout's node (flash.firmware_id): checked before its back-end
    is made, so a board flashed before specmesh was updated (its files, maybe its wire format, another version) is
    told to be flashed again, in one line, before any text; its fw is HELLO's first field, read in any layout this
    host can parse (a layout it cannot is another firmware too). A board flashed before the id existed says
    "specmesh-node 0.1". `node`: the board's node id (its HELLO's src), kept in the flash command where it is not the
    role's default, which a flash without --node-id would give it (a pipeline's later stages: 11, 12, ...). `model`:
    the run's file for the role, named in the command where a flash without --model would put another there (the
    next run then refused the board as running another build). A stage board wanted as the verifier (given alone) is
    told the command that keeps it a stage holding all the target's layers (`model`'s; N where none is given), what it
    must hold there (--role verifier made it a verifier, which a classic ESP32 cannot hold)."""
    try:
        fw: str | None
        fw, _, held, running = m.unpack_hello(hello)[:4]
    except (CodecError, ValueError):
        fw, held, running = None, None, ""
    if fw == firmware_id():
        return
    if held == m.ROLE_STAGE and kind == "verifier":  # a stage board given alone (a pipeline of one: stageports.py
        kind, role = "stage", "stage --layers 0:%s" % (check_model_file(model)[0].n_layers if model else "N")
    raise StaleFirmware([(port, kind, fw, "`specmesh flash --port %s --role %s`" % (
        port, _again(kind, role, node, key, model, running.rsplit("/", 1)[-1])))])


def _again(kind: str, role: str, node: int | None, key: bytes | None, model: Path | None, running: str = "") -> str:
    """The arguments after --role of the flash command that puts a `kind` board back in its place for this run:
    flash.again_args's, then --model where the run's file for it is not the one a flash without it puts there
    (_flash_model)."""
    given = _flash_model(kind, model, running)
    return again_args(kind, role, node, key is not None) + (" --model %s" % given if given else "")


def _flash_model(kind: str, model: Path | None, running: str) -> Path | None:
    """The model file a flash of a `kind` board must be given for a run that takes `model` for it (None: the one flash
    puts there without --model). A drafter's is the file its HELLO names (`running`) where it lies beside `model`, as
    the run takes it (host/cli/session.py running_file); flash without --model gives a drafter its class's drafter
    from the shipped folder, a verifier or stage that folder's target."""
    if model is None:
        return None
    if kind == "drafter":
        model = model.parent / running if running and (model.parent / running).is_file() else model
        return None if model.parent.resolve() == MODELS.resolve() else model
    return None if model.resolve() == model_path(MODELS, kind).resolve() else model


def find(kind: str, key: bytes | None = None) -> str:
    """The serial port of the flashed board that reports role `kind` (ESP32 USB ports are asked in turn); for a
    verifier where none does, the one stage board's (a pipeline of one stage: host/provision/stageports.py)."""
    from specmesh.host.bus.ports import esp_ports
    from specmesh.host.bus.proxy import ProxyError

    want = m.ROLE_DRAFTER if kind == "drafter" else m.ROLE_VERIFIER
    ports = [dev for dev, _ in esp_ports()]
    problems = []  # what boards that could be the one said: a key mismatch, a half-flashed board
    stages = []  # the ports of stage boards, which verify as a pipeline
    for port in ports:
        with contextlib.ExitStack() as stack:
            try:
                bus = _open(port, stack, key=key, role=kind)
                role = m.unpack_hello(bus.request(BROADCAST, m.HELLO, deadline=2.0).payload)[2]
            except BackendError:
                continue
            except ProxyError:
                if bus.link.error:
                    problems.append(bus.link.error)
                continue
            except (CodecError, ValueError):  # a HELLO of another layout: flashed from other files (check_firmware)
                problems.append("%s runs a node whose HELLO this specmesh cannot read: flash it again" % port)
                continue
            if role == want:
                return port
            if role == m.ROLE_STAGE and kind == "verifier":
                stages.append(port)
    if len(stages) == 1:
        return stages[0]
    if stages:
        raise BackendError("--verifier auto: no board on %s reports the verifier role; the stage boards on %s verify "
                           "as a pipeline: give their ports in layer order, --verifier %s" % (
                               ", ".join(ports), ", ".join(stages), ",".join(stages)))
    raise BackendError("--%s auto: no board on %s reports the %s role%s; flash one with `specmesh flash --port PORT "
                       "--role %s`" % (kind, ", ".join(ports) or "any ESP32 USB port", kind,
                                       "".join(" (%s)" % p for p in problems), kind))


@contextlib.contextmanager
def connect(port: str, kind: str, key: bytes | None = None, layers: tuple[int, int] | None = None,
            model: Path | None = None, node: int | None = None):
    """The back-end for a flashed board on `port` playing `kind` ("drafter", "verifier" or "stage"); `layers`: the
    layers [a, b) a stage is wanted for, `model` the run's file for it, `node` the node id its place gives it (a
    pipeline's i-th stage: NODE_ID["stage"] + i; default its kind's), named in the flash command a failure line gives
    (no node answers, another role: flash.again_args, as check_firmware's, with the key file of a keyed run)."""
    with contextlib.ExitStack() as stack:
        role = role_args(kind, layers)
        bus = _open(port, stack, key=key, role=role)
        again = _again(kind, role, node, key, model)
        hello = discover(bus, role=again)
        bus.peer = hello.src
        check_firmware(hello.payload, port, kind, role, key, hello.src, model)
        yield _backend(kind, bus, bus.peer, port, *([] if layers is None else [layers]), again="--role " + again)


class Cluster(contextlib.ExitStack):
    """Virtual boards for one run; `backend(kind)` starts and flashes what the role needs.

    serial: one board per role, each on its own pty. espnow: the drafter board (an ESP32-S3 there) is the
    gateway (its pty faces the host; config link "gateway") and the verifier board is reached over the
    virtual radio (link "espnow"), which loses and duplicates packets as `radio` says.
    """

    def __init__(self, transport: str = "serial", models: Path = MODELS, root: Path = VBOARDS,
                 radio=None, spec_ahead: int = 0, faults=None, key: bytes | None = None,
                 say: Callable[[str], None] | None = None, files: dict[str, Path] | None = None):
        """`key`: provisioned onto every board at flashing, and every frame signed with it. `files`: the
        model file of a role ("drafter", "verifier"; default: drafter.spm and target.spm in `models`)."""
        super().__init__()
        self.faults = faults  # host/bus/faults.py Faults on every host link, or None
        self.key = key
        self.buses: list[Bus] = []
        self.say = say  # feedback on booting and flashing (a tqdm bar per file on a terminal); None: silent
        self.spec_ahead = spec_ahead  # drafter config: tokens drafted ahead while a verdict is pending
        self.transport = transport
        self.models = Path(models)
        self.files = dict(files or {})
        self.root = Path(root)
        self.radio = radio
        self.boards: dict = {}
        self._bus: Bus | None = None
        self._mutex = threading.Lock()  # boards started side by side (pipeline) add to the stack and `boards`
        self._held: set[Path] = set()  # the flash folders this cluster holds (_lock)

    def model(self, kind: str, board: str | None = None) -> Path:
        """The model file a board of role `kind` (and class `board`) is flashed with: the one named in
        `files`, else a drafter board's class drafter (host/boardclasses.py: the one its memory runs
        fastest), a verifier's or stage's the target."""
        named = self.files.get("drafter" if kind == "drafter" else "verifier")
        if named is not None:
            return named
        if kind == "drafter":
            return drafter_model(self.models, board or ROLE_CLASS[kind])
        return model_path(self.models, kind)

    def start(self, kind: str, config: dict | None = None, radio=None, board: str | None = None,
              stage: tuple[int, int, int] | None = None, progress: bool = True):
        """Start and flash the virtual board for `kind`; returns it (its `port` is the serial device).

        `config`: board-config keys (link, espnow peers) written before flashing, which keeps them.
        `stage` (i, a, b): kind "stage", the i-th stage of a pipeline, holding layers a..b-1. `progress` False:
        no progress bars (boards flashed side by side would draw over each other's). Safe to call from several
        threads at once: each board has its own folder, and what the cluster keeps is added under a lock."""
        from specmesh.host.emulator import BoardError, make_board
        from specmesh.host.emulator.board import FlashDamaged, Hung
        from specmesh.host.emulator.session import board_mac
        from specmesh.host.provision.flash import (DoesNotFit, FlashError, FlashRequestError, KeyedHalfFlashed, NoRepl,
                                                   NotUp, check_request, flash_checked, summary)

        model = self.model(kind, board or ROLE_CLASS[kind])
        name, folder = self._folder(kind, board, stage, radio)
        node_id = NODE_ID[kind] + (0 if stage is None else stage[0])
        cfg_path = folder / "specmesh.json"
        cfg = self._prepare(kind, cfg_path, config)
        # a class named on serial runs its own machine code (QEMU); the radio's boards are unix-port ones
        vb = make_board(folder, board or ROLE_CLASS[kind], qemu=board is not None and radio is None,
                        name="vboard-" + name, mac=board_mac(node_id),
                        radio=radio.address if radio is not None else None,
                        mtu=radio.config.mtu if radio is not None else 250)
        say = self.say or (lambda line: None)
        what = "virtual %s board (%s)" % (name if stage is None else "stage %d (layers %d:%d)" % stage, vb.board.name)
        say("%s: booting, flashing the node and %s with mpremote..." % (what, model.name))
        try:
            try:
                vb.start()
            except FlashDamaged as e:  # a build folder, not a user's board: start it afresh
                say("%s: %s; starting it with an empty flash" % (what, e))
                shutil.rmtree(folder)
                vb.romfs_path.unlink(missing_ok=True)
                folder.mkdir(parents=True)
                atomic.write_text(cfg_path, json.dumps(cfg, sort_keys=True))
                vb.start()
            with self._mutex:
                self.callback(vb.stop)
            t0 = time.monotonic()
            layers = None if stage is None else stage[1:]
            bars = progress and self.say is not None
            request = check_request(kind, model, layers)
            try:
                report = flash_checked(vb.port, request, node_id, progress=bars, key=self.key,
                                       clear_key=self.key is None, config=cfg, board_class=vb.board.name)
            except (DoesNotFit, FlashRequestError, NotUp):  # NotUp: its VM waited for already, VM_START_S if hung
                raise
            except FlashError:  # a node busy at boot can miss the first interrupt: one more try
                report = flash_checked(vb.port, request, node_id, progress=bars, key=self.key,
                                       clear_key=self.key is None, config=cfg, board_class=vb.board.name)
        except (BoardError, FlashError, OSError) as e:  # a VM that could not restart says why better than the flash
            if not folder.is_dir():  # removed while the board booted: whatever step noticed first, one cause
                raise BackendError("virtual %s board: its flash folder %s was deleted while it booted: run again "
                                   "(it is flashed afresh)" % (kind, folder)) from None
            full = _host_disk_full(folder, model)
            if full:  # the board's "filesystem is full" is the host's disk, which a user frees, not the board
                raise BackendError("virtual %s board: %s" % (kind, full)) from None
            if isinstance(e, OSError):
                raise
            if isinstance(e, DoesNotFit):  # no build to flash on a virtual board: its class is what is chosen
                raise BackendError("virtual %s board (%s): %s: %s" % (kind, vb.board.name, e.fact,
                                                                      VIRTUAL_TOO_SMALL[kind])) from None
            if isinstance(e, (Hung, NotUp)) and not vb.failed:  # failed: its own words, below
                raise BackendError("virtual %s board: %s: %s" % (kind, e.why, VIRTUAL_HUNG)) from None
            if isinstance(e, NoRepl) and not vb.failed:  # no reset button or plug: its VM is started afresh
                raise BackendError("virtual %s board: %s: %s" % (kind, e.fact, VIRTUAL_NO_REPL)) from None
            if isinstance(e, KeyedHalfFlashed):  # its flash is a build folder: no esptool, no emulate
                raise BackendError("virtual %s board: %s: remove its flash folder %s and run again" % (kind, e.fact,
                                                                                                      folder)) from None
            raise BackendError("virtual %s board: %s" % (kind, vb.failed or e)) from None
        say("%s: %s" % (what, summary(report, time.monotonic() - t0)))
        with self._mutex:
            self.boards[name] = vb
        return vb

    def _folder(self, kind: str, board: str | None = None, stage: tuple[int, int, int] | None = None,
                radio=None) -> tuple[str, Path]:
        """The name and flash folder of the board start() starts for these arguments."""
        name = kind if stage is None else "stage%d" % stage[0]
        if board is not None:
            name += "-" + board  # its own flash folder: a named class runs on QEMU, the role's default on the unix port
        return name, self.root / (name if radio is None else name + "-espnow")

    def _prepare(self, kind: str, cfg_path: Path, config: dict | None) -> dict:
        """The folder of `cfg_path` (a board's flash) made, held and given the board config `config` adds to its last
        one (`cfg_path`), which it returns; one the host cannot write is said as such, with the way round it
        (BackendError)."""
        folder = cfg_path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            self._lock(folder)
            _erase_other_key(folder, self.key)
            cfg = _last_config(cfg_path)
            for key in ("link", "espnow"):
                cfg.pop(key, None)
            cfg["spec_ahead"] = self.spec_ahead if kind == "drafter" else 0
            cfg.update(config or {})
            atomic.write_text(cfg_path, json.dumps(cfg, sort_keys=True))
        except OSError as e:
            raise BackendError("virtual %s board: cannot write its flash folder %s (%s): make room or allow writing "
                               "there, or set SPECMESH_VBOARDS to a folder that can be written"
                               % (kind, folder, e.strerror or e)) from None
        return cfg

    def _lock(self, folder: Path) -> None:
        """Hold `folder` (a board's flash) for this cluster's life (host/emulator/board.py hold_folder): a second
        run on the same folder is refused in one line rather than flashing over this one's board (both wrote
        /models/target.spm.part)."""
        from specmesh.host.emulator.board import FolderInUse, hold_folder

        with self._mutex:
            if folder in self._held:  # held before its board started (pipeline)
                return
        try:
            fd = hold_folder(folder)
        except FolderInUse as e:
            if e.holder == os.getpid():  # a Mesh of this process not closed yet (a notebook's cell run again)
                raise BackendError("virtual board folder %s is in use by another Mesh of this process: close it first "
                                   "(mesh.close(), or `with Mesh(...) as mesh:`), or give this one its own folder "
                                   "(SPECMESH_VBOARDS=DIR)" % folder) from None
            raise BackendError("virtual board folder %s is in use by another specmesh run%s: wait for it to end, or "
                               "give this one its own folder (SPECMESH_VBOARDS=DIR)"
                               % (folder, " (pid %d)" % e.holder if e.holder is not None else "")) from None
        with self._mutex:
            self._held.add(folder)
            self.callback(os.close, fd)

    def _start_espnow(self) -> Bus:
        from specmesh.host.emulator.radio import RadioHub
        from specmesh.host.emulator.session import board_mac

        hub = self.enter_context(RadioHub(self.radio))
        drafter_mac, verifier_mac = board_mac(NODE_ID["drafter"]), board_mac(NODE_ID["verifier"])
        self.start("verifier", {"link": "espnow", "espnow": {"peers": {str(m.HOST): drafter_mac}}}, hub)
        # the gateway also relays every verifier frame: on a classic ESP32's heap next to the drafter model
        # that ran out of memory reading frames (13 KB free), so the gateway drafter is an ESP32-S3
        gateway = {"link": "gateway", "espnow": {"peers": {str(NODE_ID["verifier"]): verifier_mac}}}
        gw = self.start("drafter", gateway, hub, drafter_class("espnow"))
        self.hub = hub
        bus = _open(gw.port, self, self.faults, self.key, "drafter")
        bus.peer = NODE_ID["drafter"]  # the gateway; the verifier's frames carry addresses
        self.buses.append(bus)
        return bus

    def pipeline(self, n: int, board: str | None = None, beside: tuple[str, ...] = ()):
        """A pipeline verifier (host/backends/pipeline.py) over n virtual stage boards (classic ESP32s, or of class
        `board`), the target's layers split evenly; each on its own serial link, the host relaying activations
        between them. The boards of the roles in `beside` (their default class) boot and flash at the same time;
        `backend` then finds them started."""
        from specmesh.host.backends.modelio import check_model_file
        if self.transport != "serial":
            raise BackendError("--stages runs on --transport serial (the host relays between stages)")
        n_layers = check_model_file(self.model("stage"))[0].n_layers
        layers = split_layers(n_layers, n)
        # every folder held before any board boots: one in use by another run is refused at once (it was found after
        # the other boards had booted and flashed, up to 80 s); a folder that cannot be made: start() says why
        with contextlib.suppress(OSError):
            self.root.mkdir(parents=True, exist_ok=True)
            for folder in [self._folder("stage", board, (i, a, b))[1] for i, (a, b) in enumerate(layers)] + \
                    [self._folder(kind)[1] for kind in beside]:
                self._lock(folder)
        # the boards boot and flash at once (mpremote waits on each board's pty, not on the host's cores): a first
        # 5-stage run took 76 s one board after another
        boards = _side_by_side([lambda i=i, a=a, b=b: self.start("stage", stage=(i, a, b), board=board, progress=False)
                                for i, (a, b) in enumerate(layers)] +
                               [lambda kind=kind: self.start(kind, progress=False) for kind in beside])[:n]
        stages = []
        for i, vb in enumerate(boards):
            bus = _open(vb.port, self, self.faults, self.key, "stage")
            self.buses.append(bus)
            stages.append(_backend("stage", bus, NODE_ID["stage"] + i, "virtual:stage%d(%s)" % (i, vb.board.name)))
        return PipelineVerifier(stages, layers)

    def backend(self, kind: str, board: str | None = None):
        """The back-end of the virtual board playing `kind`, of class `board` (default: the role's class)."""
        if self.transport == "espnow":
            if board is not None:
                raise BackendError("--transport espnow runs its own board classes: drop :%s" % board)
            if self._bus is None:
                self._bus = self._start_espnow()
            bus = self._bus
            where = "virtual:%s(espnow%s)" % (kind, ", gateway" if kind == "drafter" else "")
        else:
            vb = (self.boards.get(kind) if board is None else None) or self.start(kind, board=board)  # pipeline()'s
            bus = _open(vb.port, self, self.faults, self.key, kind)
            bus.peer = NODE_ID[kind]
            self.buses.append(bus)
            where = "virtual:%s(%s)" % (kind, vb.board.name)
        return _backend(kind, bus, NODE_ID[kind], where)


def _erase_other_key(folder: Path, key: bytes | None) -> None:
    """A virtual board that holds another key than this run's (or one, for a run without) takes no Ctrl-C and no
    RESET from this run: its key file is erased before it boots, as `esptool erase_flash` would on a board (a
    build folder: nothing of the user's)."""
    path = folder / "specmesh.key"
    try:
        held = bytes.fromhex(json.loads(path.read_text())["key"])
    except FileNotFoundError:
        return
    except (OSError, ValueError, KeyError, TypeError):
        held = None
    if held != key:
        path.unlink()


def _side_by_side(calls: list[Callable[[], object]]) -> list:
    """Each call's result, the calls run at once on daemon threads; the first failure (in call order) is raised once
    all have ended. The wait is a timed one, so a Ctrl-C reaches the caller at once: the cluster then stops the
    boards started so far, and a thread still flashing dies with the process (its VM with it: PR_SET_PDEATHSIG)."""
    results: list = [None] * len(calls)
    errors: list = [None] * len(calls)

    def run(i: int) -> None:
        try:
            results[i] = calls[i]()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            errors[i] = e

    threads = [threading.Thread(target=run, args=(i,), name="specmesh-start-%d" % i, daemon=True)
               for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.1)
    for e in errors:
        if e is not None:
            raise e
    return results


def virtual(kind: str, board: str | None = None):
    def make(_model_path, *, boards: Boards, **_options):
        """`--drafter/--verifier virtual[:CLASS]`: the run's virtual board of that role, started and flashed."""
        return boards.cluster().backend(kind, board)

    return make


def pipeline(_model_path, *, boards: Boards, **_options):
    """`--stages N`: a pipeline verifier over N virtual stage boards."""
    try:
        return boards.cluster().pipeline(boards.stages, boards.stage_class, boards.beside_stages)
    except ValueError as e:
        raise BackendError(str(e)) from None


def on_port(kind: str):
    def make(model_path, *, name: str, boards: Boards, **_options):
        """A flashed board on serial port `name` (`auto`: the one among the ESP32 USB ports reporting `kind`)."""
        port = find(kind, boards.key) if name == "auto" else name
        return boards.enter_context(connect(port, kind, boards.key, model=model_path))

    return make


"""Boards for a run: virtual boards started and flashed on demand, or a real board on a serial port.

`Cluster(transport, models)` starts, for each role asked of it, a virtual board of the class a real
one would be (drafter: classic ESP32 without PSRAM; verifier: ESP32-S3 with 8 MB PSRAM), flashes it
through the same path as a real board (host/provision/flash.py: mpy-cross, mpremote, hash check, reset), opens
its pty with pyserial and hands back the role's back-end (host/backends/board.py). Flash folders persist under
build/vboards/ (in an installed copy: ~/.cache/specmesh/vboards), so a later run copies only what
changed. With `--transport espnow` the boards talk over the virtual radio and the host reaches them
through a gateway board on its serial link.
Everything started is stopped when the cluster closes. `find` discovers a flashed real board by the role it
reports (HELLO), `connect` opens one on a known port. Both kinds are registered back-ends of each role
(host/backends/__init__.py): `virtual` (the role's default class, on the unix port), `virtual:CLASS` (a virtual
board of any class of host/boardclasses.py, QEMU running that class's own machine code: the RV32 firmware for
esp32c3/esp32c6, the Xtensa one for esp32/esp32s3, host/emulator/qemu.py), `pipeline` for the verifier
(`--stages N` stage boards), and `PORT` for a serial port's name. Importing this module registers them (host/cli/registry.py does, for a run).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from specmesh.host import atomic
from specmesh.host.backends import PIPELINE, PORT, BackendError, Boards, register_drafter, register_verifier
from specmesh.host.backends.board import BoardDrafter, BoardVerifier
from specmesh.host.backends.pipeline import BoardStage, PipelineVerifier
from specmesh.host.boardclasses import BOARD_CLASSES, ROLE_CLASS, drafter_class, drafter_model
from specmesh.host.bus.links import LinkError, SerialLink
from specmesh.host.bus.proxy import Bus, HostAuth, NodeError, Proxy
from specmesh.host.layout import MODELS, ROOT, model_path
from specmesh.host.provision.flash import NODE_ID
from specmesh.shared import messages as m
from specmesh.shared.codec import BROADCAST


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


def split_layers(n_layers: int, n: int) -> list[tuple[int, int]]:
    """n contiguous slices (a, b) of n_layers layers, as even as can be; ValueError if n is not 1..n_layers
    (`specmesh run --stages` is checked before: host/cli/ranges.py)."""
    if not 1 <= n <= n_layers:
        raise ValueError("cannot split %d layers into %d stages" % (n_layers, n))
    cuts = [round(i * n_layers / n) for i in range(n + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def _open(port: str, stack: contextlib.ExitStack, faults=None, key: bytes | None = None,
          busy_s: float = 0.0) -> Bus:
    """A bus on the serial link at `port`, closed with `stack`; `faults` (host/bus/faults.py) are injected;
    with `key` every frame is signed and every reply must be (docs/security.md). A port found locked is
    tried again for `busy_s` seconds (a virtual board's new pty can fail its exclusive lock with EAGAIN
    while no process holds one)."""
    auth = HostAuth(key) if key else None
    end = time.monotonic() + busy_s
    while True:
        try:
            link = SerialLink(port, auth=auth)
            break
        except LinkError as e:
            if "exclusively lock" not in str(e) or time.monotonic() >= end:
                raise BackendError(str(e)) from None
            time.sleep(0.05)
    stack.callback(link.close)
    if faults is not None:
        from specmesh.host.bus.faults import FaultyLink  # noqa: PLC0415

        link = FaultyLink(link, faults)
    return Bus(link, deadline=30.0, auth=auth)


def _backend(kind: str, bus: Bus, node: int, where: str):
    """The board back-end for `node` on `bus`, after a signed nonce handshake when the bus signs."""
    from specmesh.host.bus.proxy import ProxyError  # noqa: PLC0415

    try:
        bus.handshake(node)
    except ProxyError as e:
        raise BackendError("%s: %s" % (where, e)) from None
    return BACKEND[kind](Proxy(bus, node), where)


def discover(bus: Bus, deadline: float = 10.0) -> int:
    """Node id of the board on a serial link (HELLO to broadcast; the reply says who answered)."""
    from specmesh.host.bus.proxy import ProxyError  # noqa: PLC0415

    try:
        return bus.request(BROADCAST, m.HELLO, deadline=deadline).src
    except ProxyError as e:
        raise BackendError(no_node(bus.link, e, deadline)) from None


def no_node(link, e: Exception, deadline: float) -> str:
    """Why no specmesh node answered HELLO on `link`, in one line: what the link diagnosed (a key mismatch, a
    half-flashed board), an answer that is not a node's (a REPL, a traceback, another device's bytes), or
    silence."""
    port = link.port
    if link.error:
        return link.error
    fix = "flash the node with `specmesh flash --port %s --role drafter|verifier`" % port
    text = [t.strip() for t in link.text if t.strip()]
    if text and _readable(text[-1]):
        return "%s answers, but not as a specmesh node: it printed %r (%s)" % (port, text[-1][:100], fix)
    received, errors = link.noise()
    if received:
        kinds = ", ".join("%d %s" % (n, k) for k, n in sorted(errors.items())) or "no whole line"
        return ("%s sends %d bytes that are no specmesh frame (%s): another device, or a wrong baud rate"
                % (port, received, kinds))
    if isinstance(e, NodeError):
        return "%s: the node refused HELLO: %s" % (port, e)
    return "%s: nothing came back within %.0f s: is a board on this port, powered and running? If so, %s" % (
        port, deadline, fix)


def _readable(line: str) -> bool:
    """Whether a console line reads as text (a REPL, a traceback) rather than noise (a wrong baud rate)."""
    return sum(c.isprintable() and c != "\ufffd" for c in line) >= 0.75 * len(line)


def find(kind: str, key: bytes | None = None) -> str:
    """The serial port of the flashed board that reports role `kind` (ESP32 USB ports are asked in turn)."""
    from specmesh.host.bus.ports import esp_ports  # noqa: PLC0415
    from specmesh.host.bus.proxy import ProxyError  # noqa: PLC0415

    want = m.ROLE_DRAFTER if kind == "drafter" else m.ROLE_VERIFIER
    ports = [dev for dev, _ in esp_ports()]
    problems = []  # what boards that could be the one said: a key mismatch, a half-flashed board
    for port in ports:
        with contextlib.ExitStack() as stack:
            try:
                bus = _open(port, stack, key=key)
                role = m.unpack_hello(bus.request(BROADCAST, m.HELLO, deadline=2.0).payload)[2]
            except BackendError:
                continue
            except ProxyError:
                if bus.link.error:
                    problems.append(bus.link.error)
                continue
            if role == want:
                return port
    raise BackendError("--%s auto: no board on %s reports the %s role%s; flash one with `specmesh flash --port PORT "
                       "--role %s`" % (kind, ", ".join(ports) or "any ESP32 USB port", kind,
                                       "".join(" (%s)" % p for p in problems), kind))


@contextlib.contextmanager
def connect(port: str, kind: str, key: bytes | None = None):
    """The back-end for a flashed board on `port` playing `kind` ("drafter" or "verifier")."""
    with contextlib.ExitStack() as stack:
        bus = _open(port, stack, key=key)
        bus.peer = discover(bus)
        yield _backend(kind, bus, bus.peer, port)


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
              stage: tuple[int, int, int] | None = None):
        """Start and flash the virtual board for `kind`; returns it (its `port` is the serial device).

        `config`: board-config keys (link, espnow peers) written before flashing, which keeps them.
        `stage` (i, a, b): kind "stage", the i-th stage of a pipeline, holding layers a..b-1."""
        from specmesh.host.emulator import BoardError, make_board  # noqa: PLC0415
        from specmesh.host.emulator.session import board_mac  # noqa: PLC0415
        from specmesh.host.provision.flash import FlashError, flash, summary  # noqa: PLC0415

        model = self.model(kind, board or ROLE_CLASS[kind])
        name = kind if stage is None else "stage%d" % stage[0]
        if board is not None:
            name += "-" + board  # its own flash folder: a named class runs on QEMU, the role's default on the unix port
        node_id = NODE_ID[kind] + (0 if stage is None else stage[0])
        folder = self.root / (name if radio is None else name + "-espnow")
        folder.mkdir(parents=True, exist_ok=True)
        cfg_path = folder / "specmesh.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        for key in ("link", "espnow"):
            cfg.pop(key, None)
        cfg["spec_ahead"] = self.spec_ahead if kind == "drafter" else 0
        cfg.update(config or {})
        atomic.write_text(cfg_path, json.dumps(cfg, sort_keys=True))
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
            self.callback(vb.stop)
            t0 = time.monotonic()
            layers = None if stage is None else stage[1:]
            try:
                report = flash(vb.port, kind, model, node_id, progress=self.say is not None, key=self.key,
                               clear_key=True, layers=layers, config=cfg, board_class=vb.board.name)
            except FlashError:  # a node busy at boot can miss the first interrupt: one more try
                report = flash(vb.port, kind, model, node_id, progress=self.say is not None, key=self.key,
                               clear_key=True, layers=layers, config=cfg, board_class=vb.board.name)
        except (BoardError, FlashError) as e:
            raise BackendError("virtual %s board: %s" % (kind, e)) from None
        say("%s: %s" % (what, summary(report, time.monotonic() - t0)))
        self.boards[name] = vb
        return vb

    def _start_espnow(self) -> Bus:
        from specmesh.host.emulator.radio import RadioHub  # noqa: PLC0415
        from specmesh.host.emulator.session import board_mac  # noqa: PLC0415

        hub = self.enter_context(RadioHub(self.radio))
        drafter_mac, verifier_mac = board_mac(NODE_ID["drafter"]), board_mac(NODE_ID["verifier"])
        self.start("verifier", {"link": "espnow", "espnow": {"peers": {str(m.HOST): drafter_mac}}}, hub)
        # the gateway also relays every verifier frame: on a classic ESP32's heap next to the drafter model
        # that ran out of memory reading frames (13 KB free), so the gateway drafter is an ESP32-S3
        gateway = {"link": "gateway", "espnow": {"peers": {str(NODE_ID["verifier"]): verifier_mac}}}
        gw = self.start("drafter", gateway, hub, drafter_class("espnow"))
        self.hub = hub
        bus = _open(gw.port, self, self.faults, self.key, busy_s=2.0)
        bus.peer = NODE_ID["drafter"]  # the gateway; the verifier's frames carry addresses
        self.buses.append(bus)
        return bus

    def pipeline(self, n: int, board: str | None = None):
        """A pipeline verifier (host/backends/pipeline.py) over n virtual stage boards (classic ESP32s, or of class
        `board`), the target's layers split evenly; each on its own serial link, the host relaying activations
        between them."""
        from specmesh.host.backends.modelio import check_model_file  # noqa: PLC0415
        if self.transport != "serial":
            raise BackendError("--stages runs on --transport serial (the host relays between stages)")
        n_layers = check_model_file(self.model("stage"))[0].n_layers
        layers = split_layers(n_layers, n)
        stages = []
        for i, (a, b) in enumerate(layers):
            vb = self.start("stage", stage=(i, a, b), board=board)
            bus = _open(vb.port, self, self.faults, self.key, busy_s=2.0)
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
            vb = self.start(kind, board=board)
            bus = _open(vb.port, self, self.faults, self.key, busy_s=2.0)
            bus.peer = NODE_ID[kind]
            self.buses.append(bus)
            where = "virtual:%s(%s)" % (kind, vb.board.name)
        return _backend(kind, bus, NODE_ID[kind], where)


def _virtual(kind: str, board: str | None = None):
    def make(_model_path, *, boards: Boards, **_options):
        """`--drafter/--verifier virtual[:CLASS]`: the run's virtual board of that role, started and flashed."""
        return boards.cluster().backend(kind, board)

    return make


def _pipeline(_model_path, *, boards: Boards, **_options):
    """`--stages N`: a pipeline verifier over N virtual stage boards."""
    try:
        return boards.cluster().pipeline(boards.stages, boards.stage_class)
    except ValueError as e:
        raise BackendError(str(e)) from None


def _on_port(kind: str):
    def make(_model_path, *, name: str, boards: Boards, **_options):
        """A flashed board on serial port `name` (`auto`: the one among the ESP32 USB ports reporting `kind`)."""
        port = find(kind, boards.key) if name == "auto" else name
        return boards.enter_context(connect(port, kind, boards.key))

    return make


for _kind, _register in (("verifier", register_verifier), ("drafter", register_drafter)):
    _register("virtual", _virtual(_kind))
    for _class in BOARD_CLASSES:
        _register("virtual:" + _class, _virtual(_kind, _class))
    _register(PORT, _on_port(_kind))
register_verifier(PIPELINE, _pipeline)

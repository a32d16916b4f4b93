"""A firmware node (firmware/main.py) in a real `micropython` process, driven over pipes (tests, benchmarks).

The process runs in its own directory (its "flash": specmesh.json lives there) with firmware/ and the
repository root on MICROPYPATH, as `shared/` sits beside the firmware files on a board. Frames travel as
`:`-base64 lines through the shared codec, as on a board's USB serial.
"""

from __future__ import annotations

import copy
import json
import os
import re
import select
import signal
import shutil
import subprocess
import time
from pathlib import Path

from specmesh.host.backends import temp_milli, top_p_q16
from specmesh.host.provision import romfs
from specmesh.host.provision.flash import build
from specmesh.shared import codec
from specmesh.shared import messages as m

ROOT = Path(__file__).resolve().parent.parent


# a node with a ROMFS: the image in one allocation first (its GC block rounding is the slack), mounted at /rom,
# then the node's main.py
BOOT_ROM = ("import os, sys, vfs\nb = bytearray(os.stat(%r)[6])\nf = open(%r, 'rb')\nf.readinto(b)\nf.close()\n"
            "vfs.mount(vfs.VfsRom(b), '/rom')\ndel b, f\nsys.path.insert(0, %r)\nimport main\nmain.main()\n")
ROM_SLACK = 64


class NodeFailure(AssertionError):
    """The node did not answer, or refused a request it should have served."""


def flash(board_dir: Path, march: str = "x64") -> None:
    """Lay the node out in `board_dir` as host/provision/flash.py lays it out on a board: main.py as source, every
    other firmware/ and shared/ module precompiled by mpy-cross (no compiler RAM needed at import)."""
    for dest, local in build(march, board_dir).items():
        if not local.is_relative_to(board_dir):  # kept as source (or the native module): copied as it is
            (board_dir / dest.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(local, board_dir / dest.lstrip("/"))


def shipped_model(name: str) -> str:
    """Path of the shipped models/<name>.spm."""
    return str(ROOT / "models" / (name + ".spm"))


def rom_image(model: Path, out: Path) -> Path:
    """A ROMFS image at `out` holding `model` (as `specmesh flash` builds it), for NodeProc(rom=...)."""
    out.write_bytes(romfs.image(model))
    return out


def seq_of(frame: bytes) -> int:
    """The seq field of a binary frame (signed or not)."""
    return codec.header(frame)[4]


def imported_heap(micropython: str, modules: str, path: str, cwd: Path | str = ".") -> int:
    """Heap bytes `modules` (comma-separated) hold once imported in this VM, with MICROPYPATH `path`, plus the qstr
    pool the VM opens next.

    The VM interns the modules' names in RAM qstr pools, which double in size as they fill (the next one is about
    7 KB on the 64-bit unix port); a board's frozen code keeps those names in flash, and the few names code interns
    at run time fit a small pool. Counting the next pool as code keeps a heap budget from flipping when one more name
    in firmware/ or shared/ crosses a pool boundary."""
    probe = ("import gc, micropython\ngc.collect()\na = gc.mem_alloc()\nimport %s\n"
             "gc.collect()\nprint(gc.mem_alloc() - a)\nmicropython.qstr_info()\nclass Q: pass\n"
             "for i in range(4096):\n    setattr(Q, '_q%%d' %% i, 0)\n    micropython.qstr_info()\n" % modules)
    out = subprocess.run([micropython, "-c", probe], cwd=cwd, capture_output=True, text=True, timeout=60,
                         env={"MICROPYPATH": path}, check=True)
    lines = out.stdout.split("\n")
    pools = [tuple(int(v) for v in re.findall(r"=(\d+)", line)) for line in lines[1:] if line.startswith("qstr pool")]
    pool0, _, data0, total0 = pools[0]
    grown = next(p for p in pools if p[0] > pool0)  # (n_pool, n_qstr, n_str_data_bytes, n_total_bytes)
    return int(lines[0]) + (grown[3] - grown[2]) - (total0 - data0)


def code_heap(micropython: str, board_dir: Path, extra: str = "") -> int:
    """Heap bytes the node's modules (and `extra`, e.g. ", stage") hold once imported from a flashed board
    directory (see flash()), with the next qstr pool (imported_heap)."""
    return imported_heap(micropython, "config, links, node, roles, engine" + extra, ".frozen:.", board_dir)


class NodeProc:
    """One node process; `request` sends a frame and returns the reply Frame with the same seq."""

    def __init__(self, micropython: str, board_dir: Path, config: dict | None = None,
                 heap: int | None = None, node_id: int = 1, flashed: bool = False, env: dict | None = None,
                 auth: codec.Auth | None = None, rom: Path | None = None):
        """`rom`: a ROMFS image (rom_image) the node finds mounted at /rom, as a board's ROMFS partition; it is
        memory-mapped flash on a board, so the VM's heap grows by its bytes."""
        board_dir.mkdir(parents=True, exist_ok=True)
        if config is not None:  # a "key" (and "ctr") go to the board's key file, as flashing puts them
            config = dict(config)
            key = {k: config.pop(k) for k in ("key", "ctr") if k in config}
            (board_dir / "specmesh.json").write_text(json.dumps(config))
            if key:
                (board_dir / "specmesh.key").write_text(json.dumps(key))
        self.dir = board_dir
        self.node_id = node_id
        self.seq = 0
        self.session = 0
        self.rto: float | None = None  # retransmit a request after this many seconds without a reply
        self.text: list[bytes] = []
        self.auth = auth  # signs requests and checks replies when the node has a key
        self.decoder = codec.StreamDecoder(auth=auth, max_line=1 << 16, on_text=self.text.append)
        self._frames: list[codec.Frame] = []
        # flashed: the board directory holds the node (see flash()); else run it from the source tree
        # A flashed node runs as a module (-m: sys.path[0] is "", as on a board; a script's is its folder's real path)
        # with its paths relative to its folder: a host path in the VM's heap made its layout, and so a budget at its
        # edge, depend on the temporary folder's name
        run = ["-m", "main"] if flashed else [str(ROOT / "firmware" / "main.py")]
        if rom is not None:  # a script beside the node (the unix port limits a -c argument to 255 bytes)
            heap = heap and heap + rom.stat().st_size + ROM_SLACK
            image = os.path.relpath(rom, board_dir)
            (board_dir / "romboot.py").write_text(BOOT_ROM % (image, image, "." if flashed else str(ROOT / "firmware")))
            run = ["-m", "romboot"]
        cmd = [micropython] + (["-X", "heapsize=%d" % heap] if heap else []) + run
        env = dict(os.environ, MICROPYPATH=".frozen" if flashed else "%s:.frozen" % ROOT) | (env or {})
        self.proc = subprocess.Popen(cmd, cwd=board_dir, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env)

    def send_raw(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def frame(self, mtype: int, payload: bytes = b"", seq: int | None = None, dst: int | None = None,
              session: int | None = None) -> bytes:
        """A request frame from the host to this node (next seq unless given)."""
        if seq is None:
            self.seq = (self.seq + 1) & 0xFF
            seq = self.seq
        return codec.encode(mtype, payload, src=m.HOST, dst=self.node_id if dst is None else dst, seq=seq,
                            session=self.session if session is None else session, auth=self.auth)

    def send(self, frame: bytes) -> None:
        self.send_raw(codec.encode_line(frame))

    def read(self, timeout: float = 30.0) -> codec.Frame | None:
        """The next frame from the node, or None after `timeout` seconds (or when it exits)."""
        end = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while not self._frames:
            left = end - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._frames.extend(self.decoder.feed(chunk))
        return self._frames.pop(0)

    def reply(self, seq: int, timeout: float = 30.0) -> codec.Frame:
        while True:
            f = self.read(timeout)
            if f is None:
                raise NodeFailure("no reply to seq %d; console: %r; stderr: %r"
                                     % (seq, self.text[-5:], self.stderr_tail()))
            if f.seq == seq and f.reply and f.src == self.node_id:
                return f

    def request(self, mtype: int, payload: bytes = b"", timeout: float = 30.0, **kw) -> codec.Frame:
        """Send a request and wait for its reply, retransmitting the same frame every `rto` seconds."""
        frame = self.frame(mtype, payload, **kw)
        seq = seq_of(frame)
        end = time.monotonic() + timeout
        while True:
            self.send(frame)
            wait = end - time.monotonic() if self.rto is None else min(self.rto, end - time.monotonic())
            try:
                return self.reply(seq, max(wait, 0.0))
            except NodeFailure:
                if time.monotonic() >= end:
                    raise

    def open(self) -> bytes:
        """A signed node: open a session (docs/security.md) with a HELLO; `auth` must be a host/bus/proxy.py
        HostAuth. Returns the HELLO payload."""
        payload, challenge = self.auth.open_request()
        body = self.auth.accept(self.node_id, challenge, self.request(m.HELLO, payload).payload)
        if body is None:
            raise NodeFailure("the node's HELLO answered no challenge of ours")
        return body

    def view(self, node_id: int) -> NodeProc:
        """The same process seen as a way to another node (a gateway's peer): own node id and seqs."""
        v = copy.copy(self)
        v.node_id = node_id
        v.seq = 0
        return v

    def call(self, mtype: int, payload: bytes = b"", expect: int | None = None, **kw) -> tuple:
        """Request and unpack the reply; fails the test on an ERROR reply or an unexpected type."""
        f = self.request(mtype, payload, **kw)
        if f.mtype == m.ERROR:
            raise NodeFailure("node refused %s: %r" % (m.NAMES[mtype], m.unpack_error(f.payload)))
        if expect is not None and f.mtype != expect:
            raise NodeFailure("node answered %s with %s, not %s" % (m.NAMES[mtype], m.NAMES[f.mtype], m.NAMES[expect]))
        return m.unpack(f.mtype, True, f.payload)

    def error(self, mtype: int, payload: bytes = b"", **kw) -> tuple[int, str]:
        """Request that must be refused: (code, message) of the ERROR reply."""
        f = self.request(mtype, payload, **kw)
        if f.mtype != m.ERROR:
            raise NodeFailure("expected an ERROR reply to %s, got %s" % (m.NAMES[mtype], m.NAMES[f.mtype]))
        return m.unpack_error(f.payload)

    def stats(self) -> dict[str, int]:
        return dict(self.call(m.STATS, expect=m.STATS)[0])

    def stderr_tail(self) -> bytes:
        if self.proc.poll() is None:
            return b"(running)"
        return self.proc.stderr.read()[-2000:]

    def close(self, interrupt: bool = False) -> int:
        """Stop the process (closing its stdin ends a node on stdio; Ctrl-C any other); its exit code."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(0.1 if interrupt else 5)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGINT)
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        for s in (self.proc.stdout, self.proc.stderr):
            s.close()
        return self.proc.returncode


# -- the host's side of a session -------------------------------------------------------------

def begin(node: NodeProc, session: int, seed: int, temp: float, prompt, draft_k=8, top_k=0, top_p=1.0, eos=-1):
    """BEGIN a session on `node` (temperature 0: greedy)."""
    node.session = session
    node.call(m.BEGIN, m.pack_begin(seed, temp_milli(temp), draft_k, top_k, top_p_q16(top_p), eos, prompt),
              expect=m.ACK)


def commit(node: NodeProc, tokens: list[int], n_new: int) -> None:
    """COMMIT `tokens`, of which the last n_new are new to the node."""
    node.call(m.COMMIT, m.pack_commit(len(tokens), tokens[len(tokens) - n_new:]), expect=m.ACK)


def generate(drafter: NodeProc, verifier: NodeProc, prompt, n: int, gamma: int, temp: float, seed: int,
             session: int, max_seq: int, draft_k: int = 8, pause: float = 0.0) -> list[int]:
    """The host's speculative loop over two nodes; gamma 0 (no drafter) is plain decoding.
    `pause` seconds after each verdict stand for a verifier slower than the drafter (which drafts ahead
    meanwhile, if configured to, not knowing the verdict yet: it learns it from the next DRAFT_REQ)."""
    tokens = list(prompt)
    nodes = [verifier] + ([drafter] if gamma else [])
    for node in nodes:
        begin(node, session, seed, temp, tokens, draft_k=draft_k)
    tail: list[int] = []  # committed tokens the drafter has not seen (the next DRAFT_REQ carries them)
    while len(tokens) < len(prompt) + n:
        L = len(tokens)
        g = min(gamma, max_seq - L - 1)
        entries = drafter.call(m.DRAFT_REQ, m.pack_draft_req(L, g, tail), expect=m.DRAFT)[1] if g else []
        acc, tok = verifier.call(m.VERIFY_REQ, m.pack_draft(L, entries), expect=m.VERDICT)  # commits itself
        new = [e[0] for e in entries[:acc]] + [tok]
        tokens += new
        tail = [tok] if g else tail + new  # the drafter holds its accepted drafts already
        time.sleep(pause)
    return tokens[:len(prompt) + n]


if __name__ == "__main__":
    from specmesh.tools import not_a_command

    not_a_command("nodeproc", "a firmware node runs on virtual boards with specmesh emulate, or in a run: specmesh run")

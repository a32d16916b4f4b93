"""Test helper: a firmware node (firmware/main.py) in a real `micropython` process, driven over pipes.

The process runs in its own directory (its "flash": specmesh.json lives there) with firmware/ and the
repository root on MICROPYPATH, as `shared/` sits beside the firmware files on a board. Frames travel as
`:`-base64 lines through the shared codec, as on a board's USB serial.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from pathlib import Path

from shared import codec
from shared import messages as m

ROOT = Path(__file__).resolve().parent.parent
HOST = 0


class NodeProc:
    """One node process; `request` sends a frame and returns the reply Frame with the same seq."""

    def __init__(self, micropython: str, board_dir: Path, config: dict | None = None,
                 heap: int | None = None, node_id: int = 1):
        board_dir.mkdir(parents=True, exist_ok=True)
        if config is not None:
            (board_dir / "specmesh.json").write_text(json.dumps(config))
        self.dir = board_dir
        self.node_id = node_id
        self.seq = 0
        self.session = 0
        self.text: list[bytes] = []
        self.decoder = codec.StreamDecoder(max_line=1 << 16, on_text=self.text.append)
        self._frames: list[codec.Frame] = []
        cmd = [micropython] + (["-X", "heapsize=%d" % heap] if heap else []) + [str(ROOT / "firmware" / "main.py")]
        env = dict(os.environ, MICROPYPATH="%s:.frozen" % ROOT)
        self.proc = subprocess.Popen(cmd, cwd=board_dir, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env)

    def send_raw(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def frame(self, mtype: int, payload: bytes = b"", seq: int | None = None, dst: int | None = None,
              session: int | None = None) -> bytes:
        """A request frame from the host to this node (next seq unless given)."""
        if seq is None:
            self.seq = (self.seq + 1) & 0xFFFF
            seq = self.seq
        return codec.encode(mtype, payload, src=HOST, dst=self.node_id if dst is None else dst, seq=seq,
                            session=self.session if session is None else session)

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
                raise AssertionError("no reply to seq %d; console: %r; stderr: %r"
                                     % (seq, self.text[-5:], self.stderr_tail()))
            if f.seq == seq and f.reply:
                return f

    def request(self, mtype: int, payload: bytes = b"", timeout: float = 30.0, **kw) -> codec.Frame:
        frame = self.frame(mtype, payload, **kw)
        self.send(frame)
        return self.reply(codec.decode(frame).seq, timeout)

    def call(self, mtype: int, payload: bytes = b"", expect: int | None = None, **kw) -> tuple:
        """Request and unpack the reply; fails the test on an ERROR reply or an unexpected type."""
        f = self.request(mtype, payload, **kw)
        if f.mtype == m.ERROR:
            raise AssertionError("node refused %s: %r" % (m.NAMES[mtype], m.unpack_error(f.payload)))
        if expect is not None:
            assert f.mtype == expect, (m.NAMES[f.mtype], m.NAMES[expect])
        return m.unpack(f.mtype, True, f.payload)

    def error(self, mtype: int, payload: bytes = b"", **kw) -> tuple[int, str]:
        """Request that must be refused: (code, message) of the ERROR reply."""
        f = self.request(mtype, payload, **kw)
        assert f.mtype == m.ERROR, "expected an ERROR reply, got %s" % m.NAMES[f.mtype]
        return m.unpack_error(f.payload)

    def stats(self) -> dict[str, int]:
        return dict(self.call(m.STATS, expect=m.STATS)[0])

    def stderr_tail(self) -> bytes:
        if self.proc.poll() is None:
            return b"(running)"
        return self.proc.stderr.read()[-2000:]

    def close(self) -> int:
        """Stop the process (closing its stdin ends the node); its exit code."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for s in (self.proc.stdout, self.proc.stderr):
            s.close()
        return self.proc.returncode

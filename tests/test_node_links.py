"""Link framing under the real `micropython` binary: lines reassembled from arbitrary UART chunks, bounded
by the line buffer, non-frame lines counted; and a node on a missing link falls back to the console."""

from __future__ import annotations

import json
import subprocess

from specmesh.shared import codec
from specmesh.shared import messages as m
from specmesh.tools.nodeproc import ROOT, NodeProc

SCRIPT = """
import json, sys
from links import LineBuffer, _Lines
from shared import codec
line = codec.encode_line(codec.encode(11, b"abc", 0, 1, 5))
chunks = [line[:3], line[3:] + b"noise\\n" + line[:10], line[10:], b"x" * 100, b"\\n", line + line]
buf = LineBuffer(64)
lines = _Lines()
got = []
for c in chunks:  # as UartLink reads them: at most room() bytes, lines taken out before reading more
    while c:
        k = buf.room()
        buf.add(c[:k])
        c = c[k:]
        while True:
            l = buf.line()
            if l is None:
                break
            f = lines._frame(l)
            got.append(None if f is None else codec.decode(f).payload.decode())
print(json.dumps({"got": got, "overflows": buf.overflows, "errors": lines.errors}))
"""


def test_uart_line_buffer_reassembles_chunks_and_bounds_lines(micropython):
    assert len(codec.encode_line(codec.encode(11, b"abc", 0, 1, 5))) < 64
    out = subprocess.run([micropython, "-c", SCRIPT], capture_output=True, text=True, timeout=30,
                         env={"MICROPYPATH": "%s:%s" % (ROOT / "firmware", ROOT)})
    assert out.returncode == 0, out.stderr + out.stdout
    res = json.loads(out.stdout)
    # a frame split over two chunks, a noise line, a frame split mid-base64, a 100-byte line that overflows
    # the 64-byte buffer (dropped up to its newline), then two frames in one chunk
    assert res["got"] == ["abc", None, "abc", "abc", "abc"]
    assert res["overflows"] == 1 and res["errors"] == {"text": 1}


def test_missing_link_falls_back_to_the_console(micropython, tmp_path):
    node = NodeProc(micropython, tmp_path / "b", {"link": "uart"})  # the unix port has no machine.UART
    try:
        assert node.call(m.HELLO)[2] == m.ROLE_IDLE
        assert any(b"uart" in line for line in node.text)
    finally:
        node.close()
    node = NodeProc(micropython, tmp_path / "c", {"link": "espnow"})  # no espnow module without the emulator
    try:
        assert node.call(m.PING, b"up") == (b"up",)
    finally:
        node.close()
    assert json.loads((tmp_path / "c" / "specmesh.json").read_text())["link"] == "espnow"  # left as configured

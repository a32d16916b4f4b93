"""Long fuzzing of the bus on both runtimes: crashes, hangs and heap drift.

    python -m specmesh.tools.fuzz [--frames 1000000] [--node-frames 10000] [--seed 0] [--json FILE]

Inputs: frames of every message type in both directions (valid bodies, bodies mutated and re-framed with
a good CRC so they reach the payload parsers, whole frames mutated, random bytes), a quarter of them
signed.

- CPython, `--frames` inputs: codec.decode without and with a key, messages.unpack of whatever decodes,
  a StreamDecoder fed the inputs as ':'-base64 lines (garbage lines mixed in, random chunking) and a
  DatagramDecoder fed them as 250-byte fragments, a tenth mutated, neighbours swapped. A crash is any
  exception other than a CodecError out of decode/unpack, or any exception out of feed(); a hang is one
  input taking over a second; heap drift is tracemalloc's traced bytes at the end minus after the first
  tenth (at least 1000 inputs, or half a shorter run, so the decoders' bounded state is full), with
  the decoders' state bounds (partials, line buffer) checked throughout.
- MicroPython, `--node-frames` inputs: the firmware node as a classic ESP32 runs it (the shipped drafter on
  its ROMFS, a classic ESP32's heap (host/boardclasses.py), the node's code frozen: the VM gets that heap plus what
  the code holds, as tests/test_firmware_budget.py models a board), fed the inputs as lines (RESET and
  CONFIGURE excluded: they end the node or move its id), with a PING every 100 inputs that must come
  back within 10 s (a hang otherwise) and STATS every 1000, each after a fresh BEGIN (the same session state at
  every sample): its heap_free after a collection, after the first 1000 inputs (reply cache and counters
  warm) against the last, is the drift.
  A crash is the node process dying or printing a traceback; an unanswered MemoryError is a frame the node
  ran out of memory on without refusing it with a reason (its console line "out of memory reading a frame").

Exit status 1 if anything crashed, hung or ran out of memory unanswered, or the drift exceeds --max-drift bytes
on either runtime, with a line on stderr saying which. `make fuzz FRAMES=N NODE_FRAMES=M SEED=S` passes the counts
through.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import tracemalloc
from pathlib import Path

from specmesh.tools import run_tool
from specmesh.host import atomic, tempdirs
from specmesh.host.cli.ranges import RangeError, in_range
from specmesh.host.boardclasses import ESP32
from specmesh.shared import codec
from specmesh.shared import messages as m
from specmesh.shared.rule import ONE
from specmesh.tools.gen_vectors import mutate
from specmesh.host.layout import micropython_binary

ROOT = Path(__file__).resolve().parent.parent
KEY = b"fuzz-key-0123456789abcdef"
HANG_S = 1.0
ESP32_HEAP = ESP32.heap_bytes

# (type, reply?, body): one valid body for every message and direction
BODIES = [
    (m.HELLO, False, b""),
    (m.HELLO, True, m.pack_hello("fw", "esp32", 1, "models/drafter.spm", 64, 64, 90000, 1, 32,
                                 "viper (no native/xtensawin.mpy)", 0x1234ABCD)),
    (m.CONFIGURE, False, m.pack_configure(1, 1, "models/drafter.spm")),
    (m.BEGIN, False, m.pack_begin(7, 800, 8, 0, 65536, -1, [1, 2, 3])),
    (m.DRAFT_REQ, False, m.pack_draft_req(3, 4, [2])),
    (m.DRAFT, True, m.pack_draft(3, [(5, [5, 9], [ONE - 3, 3]), (2, [2], [ONE])])),
    (m.VERIFY_REQ, False, m.pack_draft(3, [(5, [5, 9], [ONE - 3, 3])])),
    (m.VERIFY_REQ, False, m.pack_draft(3, [(5, [5], [ONE]), (9, [9], [ONE])])),
    (m.VERDICT, True, m.pack_verdict(1, 7)),
    (m.COMMIT, False, m.pack_commit(5, [5, 7])),
    (m.ROLLBACK, False, m.pack_rollback(4)),
    (m.STATS, False, b""),
    (m.STATS, True, m.pack_stats([("requests", 3), ("heap_free", 9000)])),
    (m.PING, False, b"ping"),
    (m.ERROR, True, m.pack_error(2, "no session: send BEGIN first")),
    (m.ACK, True, b""),
    (m.RESET, False, b""),
    (m.STAGE, False, m.pack_stage(3, 1, m.STAGE_HEAD, [(5, [5, 9], [ONE - 3, 3])], b"\x05\x00")),
    (m.STAGE, True, m.pack_stage_reply(3, 1, m.STAGE_HEAD, b"\xff\xff")),
]
NODE_EXCLUDED = (m.RESET, m.CONFIGURE)


def inputs(r: random.Random, node: bool = False):
    """Endless fuzz inputs (binary frames, mostly invalid); node=True leaves out what ends or moves a node."""
    bodies = [b for b in BODIES if not (node and b[0] in NODE_EXCLUDED)]
    auth = keyed_auth(m.HOST, 1)
    while True:
        mtype, reply, body = r.choice(bodies)
        kind = r.randrange(10)
        signed = r.random() < 0.25
        if kind < 4:  # a mutated body in a good frame: reaches the payload parsers
            body = mutate(r, body, max_ops=4)
        if kind == 9:
            yield bytes(r.randrange(256) for _ in range(r.randrange(40)))
            continue
        addr = r.random() < 0.5  # to a node id, or to the peer at the link's other end
        frame = codec.encode(mtype, body, src=(0 if not reply else 1) if addr else None,
                             dst=(1 if not reply else 0) if addr else None, seq=r.randrange(256),
                             session=r.randrange(3), reply=reply, auth=auth if signed else None)
        yield mutate(r, frame, max_ops=3) if 4 <= kind < 8 else frame


SENDERS = 3  # datagram senders the fuzzed fragments come from


def keyed_auth(me: int, peer: int) -> codec.Auth:
    """Signing state with one session open towards every node id, so signed inputs reach the parsers."""
    auth = codec.Auth(KEY, 24, 0, me, peer)
    for node in range(256):
        auth.sessions[node] = b"fuzz-session-000"
    return auth


def _crash(report: dict, where: str, data: bytes, e: BaseException) -> None:
    report["crashes"] += 1
    if len(report["examples"]) < 5:
        report["examples"].append({"where": where, "input": data.hex(), "error": "%s: %s" % (type(e).__name__, e)})


def fuzz_cpython(n: int, seed: int) -> dict:
    r = random.Random(seed)
    report = {"inputs": n, "crashes": 0, "hangs": 0, "slowest_s": 0.0, "examples": []}
    keyed = keyed_auth(1, m.HOST)
    stream = codec.StreamDecoder(max_line=4096)
    datagram = codec.DatagramDecoder()
    chunk = bytearray()
    tracemalloc.start()
    base = None
    warm = max(n // 10, min(n // 2, 1000))  # the reassembler's bounded partials fill over the first ~1000
    gen = inputs(r)
    for i in range(n):
        data = next(gen)
        t0 = time.perf_counter()
        for auth in (None, keyed):
            try:
                f = codec.decode(data, auth)
                m.unpack(f.mtype, f.reply, f.payload)
            except codec.CodecError:
                pass
            except Exception as e:  # noqa: BLE001 - what the fuzzer exists to find
                _crash(report, "decode/unpack", data, e)
        chunk += codec.encode_line(data) if r.random() < 0.9 else bytes(r.randrange(256) for _ in range(30)) + b"\n"
        try:
            if r.random() < 0.3:
                stream.feed(bytes(chunk[:len(chunk) // 2]))
                stream.feed(bytes(chunk[len(chunk) // 2:]))
                chunk.clear()
            for p in codec.fragment(data, i & 0xFFFF):
                datagram.feed(mutate(r, p) if r.random() < 0.1 else p, sender=r.randrange(SENDERS))
        except Exception as e:  # noqa: BLE001
            _crash(report, "feed", data, e)
        took = time.perf_counter() - t0
        report["slowest_s"] = max(report["slowest_s"], took)
        report["hangs"] += took > HANG_S
        if datagram.pending() > SENDERS * datagram.max_partial or stream._n > len(stream._buf):  # slots per sender
            _crash(report, "state bound", data, RuntimeError("decoder state beyond its bound"))
        if i == warm:
            base = tracemalloc.get_traced_memory()[0]
    end = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    report["heap_drift_bytes"] = end - (base if base is not None else end)
    report["frames_decoded"] = stream.frames + datagram.frames
    report["errors_counted"] = sum(stream.errors.values()) + sum(datagram.errors.values())
    return report


def fuzz_node(n: int, seed: int, micropython: str) -> dict:
    from specmesh.tools.nodeproc import NodeFailure, NodeProc, code_heap, flash, rom_image, shipped_model

    r = random.Random(seed + 1)
    report = {"inputs": n, "crashes": 0, "hangs": 0, "examples": [], "heap_free": []}
    with tempdirs.folder("fuzz") as tmp:
        board = Path(tmp)
        flash(board)
        rom = rom_image(Path(shipped_model("drafter")), Path(tmp) / "rom.img")
        node = NodeProc(micropython, board, {"role": "drafter", "model": "/rom/drafter.spm"},
                        heap=ESP32_HEAP + code_heap(micropython, board), flashed=True, rom=rom)
        gen = inputs(r, node=True)
        t0 = time.perf_counter()
        try:
            begin = m.pack_begin(7, 800, 8, 0, 65536, -1, [1, 2, 3])
            node.call(m.BEGIN, begin, expect=m.ACK)
            for i in range(n):
                node.send_raw(codec.encode_line(next(gen)) if r.random() < 0.95 else  # or a garbage line
                              bytes(r.randrange(0x20, 0x100) for _ in range(50)) + b"\n")
                if i % 100 == 99:
                    try:
                        node.request(m.PING, b"alive %d" % i, timeout=10.0)
                    except NodeFailure as e:
                        report["hangs"] += 1
                        _crash(report, "node", b"", e)
                        break
                if i % 1000 == 999 or i == 0:
                    report["heap_free"].append(_settled_heap(node, begin))
            report["heap_free"].append(_settled_heap(node, begin))
            st = node.stats()
            report["node_counts"] = {k: st[k] for k in ("requests", "errors", "bad_frames", "unsigned", "bad_tag")}
            report["memory_unanswered"] = sum(b"out of memory reading a frame" in t for t in node.text)
        finally:
            code = node.proc.poll()
            tail = node.stderr_tail() if code is not None else b""
            node.close()
        if code is not None or b"Traceback" in tail:
            report["crashes"] += 1
            report["examples"].append({"where": "node", "error": tail[-500:].decode(errors="replace")})
        report["seconds"] = time.perf_counter() - t0
    hf = report["heap_free"][1:]  # from the sample after the first 1000 inputs: the reply cache is full by then
    report["heap_drift_bytes"] = hf[0] - hf[-1] if len(hf) > 1 else 0
    return report


def _settled_heap(node, begin: bytes) -> int:
    """The node's heap_free (after a collection) in the same session state at every sample: a fresh BEGIN.
    What a fuzzed session holds (a drafter's drafts and their q-hat tables, bounded by MAX_GAMMA) is state,
    not drift; a leak survives the BEGIN."""
    node.call(m.BEGIN, begin, expect=m.ACK)
    return node.stats()["heap_free"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specmesh.tools.fuzz", description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=1_000_000,
                    help="inputs through the CPython decoders (default: %(default)s)")
    ap.add_argument("--node-frames", type=int, default=10_000,
                    help="inputs through the MicroPython node; 0: the node is not fuzzed (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the inputs (default: %(default)s)")
    ap.add_argument("--max-drift", type=int, default=4096,
                    help="heap drift over this many bytes is a failure (default: %(default)s)")
    ap.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    a = ap.parse_args(argv)
    try:  # a negative count fuzzed nothing and passed
        in_range("--frames", a.frames, 0)
        in_range("--node-frames", a.node_frames, 0, note="0: the node is not fuzzed")
        in_range("--max-drift", a.max_drift, 0)  # a negative one failed every run, saying nothing
    except RangeError as e:
        print("fuzz: %s" % e, file=sys.stderr)
        return 2
    problem = a.json is not None and atomic.output_problem(a.json)  # before the fuzzing; '' is no file, not no --json
    if problem:
        print("fuzz: --json %s cannot be written: %s" % (a.json or "''", problem), file=sys.stderr)
        return 2
    mp = micropython_binary()
    t0 = time.perf_counter()
    res = {"cpython": fuzz_cpython(a.frames, a.seed)}
    print("CPython decoders: %d inputs in %.0f s: %d crashes, %d hangs (slowest %.1f ms), heap drift %d B"
          % (a.frames, time.perf_counter() - t0, res["cpython"]["crashes"], res["cpython"]["hangs"],
             1000 * res["cpython"]["slowest_s"], res["cpython"]["heap_drift_bytes"]), flush=True)
    if a.node_frames:
        res["micropython_node"] = nd = fuzz_node(a.node_frames, a.seed, str(mp))
        print("MicroPython node (heap %d): %d inputs in %.0f s: %d crashes, %d hangs, %d out-of-memory unanswered, "
              "heap_free %s, drift %d B; %s"
              % (ESP32_HEAP, a.node_frames, nd["seconds"], nd["crashes"], nd["hangs"], nd.get("memory_unanswered", 0),
                 nd["heap_free"][:1] + nd["heap_free"][-1:], nd["heap_drift_bytes"], nd.get("node_counts")))
    for part in res.values():
        for ex in part["examples"]:
            print("  example: %s" % json.dumps(ex))
    if a.json is not None:
        try:  # the Unix way: a device or a FIFO is written to, never replaced by a file
            atomic.write_output(a.json, json.dumps(res, indent=1))
        except OSError as e:
            print("fuzz: cannot write %s: %s" % (a.json, e.strerror), file=sys.stderr)
            return 1
    failed = ["%s: %s" % (RUNTIMES[k], ", ".join(why)) for k, part in res.items()
              if (why := failures(part, a.max_drift))]
    if failed:  # the summaries give figures, not verdicts: status 1 was unexplained where only the drift was over
        print("fuzz: failed: %s" % "; ".join(failed), file=sys.stderr)
    return 1 if failed else 0


RUNTIMES = {"cpython": "CPython decoders", "micropython_node": "MicroPython node"}  # a report's parts, as said


def failures(part: dict, max_drift: int) -> list[str]:
    """What fails one runtime's report (the exit status 1), each as said: crashes, hangs, frames the node ran out of
    memory on unanswered, a heap drift over --max-drift."""
    why = ["%d %s" % (part[k], k) for k in ("crashes", "hangs") if part[k]]
    if part.get("memory_unanswered"):
        why.append("%d out-of-memory unanswered" % part["memory_unanswered"])
    if part["heap_drift_bytes"] > max_drift:
        why.append("heap drift %d B over --max-drift %d" % (part["heap_drift_bytes"], max_drift))
    return why


if __name__ == "__main__":
    run_tool("fuzz", main)

"""Node benchmark: message round trips, drafter and target tokens/s, heap per role, pipelined drafting.

    python -m specmesh.tools.bench node

Emulation figures: firmware nodes in the unix-port `micropython` VM on this machine, flashed as a board
gets them (mpy-cross, x64 viper kernels), talking over pipes with `:`-base64 lines, as on USB serial.
Rows:
- rtt: PING round trip host -> node -> host (median and p90), small and 200-byte payloads; and through a
  gateway node and the virtual ESP-NOW radio (no loss) to a node behind it, 600 bytes = 3 fragments.
- drafter: the shipped drafter (models/drafter.spm, else a random model of its shape) in a classic ESP32
  heap, its weights on a ROMFS (host/boardclasses.py, plus this VM's code overhead, see
  tests/test_firmware_budget.py), gamma 4,
  top-8 q-hat at temperature 0.8: tokens/s seen by the host (round trips included) and the node's own
  compute ms per token; heap left.
- target: the shipped target in an ESP32-S3 PSRAM heap: plain decoding tokens/s (VERIFY_REQ n = 0), and
  the compute time of verifying 4 drafts (5 positions) relative to one position, v(5), seen by the node.
- pipelined: greedy self-speculation with the drafter model on both nodes (every draft accepted) while
  the host waits 20 ms per verdict (a slower verifier): DRAFT_REQ latency without and with drafting ahead.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from specmesh.host.boardclasses import ESP32, ESP32S3
from specmesh.shared import messages as m
from specmesh.tools.nodeproc import ROOT, NodeProc, begin, code_heap, commit, flash, generate, rom_image, shipped_model

ESP32_HEAP = ESP32.heap_bytes
ESP32S3_HEAP = ESP32S3.heap_bytes


def _mp() -> str:
    import sys

    bindir = Path(sys.executable).parent
    return str(bindir / "micropython")


def _pings(node: NodeProc, sizes=(8, 200), n: int = 300) -> dict:
    out = {}
    for size in sizes:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            node.call(m.PING, bytes(size))
            times.append((time.perf_counter() - t0) * 1e6)
        times.sort()
        out["ping_%d_us" % size] = {"median": round(statistics.median(times)), "p90": round(times[int(0.9 * n)])}
    return out


def _rtt(mp: str, tmp: Path) -> dict:
    node = NodeProc(mp, tmp / "rtt")
    try:
        return _pings(node)
    finally:
        node.close()


def _rtt_radio(mp: str, tmp: Path) -> dict:
    """PING host -> gateway (stdio) -> virtual ESP-NOW radio -> node and back; 600 bytes: 3 fragments."""
    from specmesh.host.emulator.radio import RadioConfig, RadioHub

    hub = RadioHub(RadioConfig(mtu=250)).start()
    macs = {1: "02:00:00:00:00:01", 2: "02:00:00:00:00:02"}
    host, port = hub.address
    nodes = []
    try:
        for nid, cfg in ((2, {"link": "espnow", "espnow": {"peers": {"0": macs[1]}}}),
                         (1, {"link": "gateway", "espnow": {"peers": {"2": macs[2]}}})):
            env = {"MICROPYPATH": "%s:%s:.frozen" % (ROOT, ROOT / "host" / "emulator" / "mpy"),
                   "VBOARD_RADIO": "%s:%d" % (host, port), "VBOARD_MAC": macs[nid]}
            nodes.append(NodeProc(mp, tmp / ("radio%d" % nid), dict(cfg, node_id=nid), node_id=nid, env=env))
        peer = nodes[1].view(2)
        peer.rto = 1.0
        peer.call(m.PING, b"up")
        return _pings(peer, (8, 600), 100)
    finally:
        for n in nodes:
            n.close(interrupt=True)
        hub.stop()


def _drafter(mp: str, board: Path, model: str) -> dict:
    rom = rom_image(Path(model), board.parent / "drafter.romfs")  # as flash puts it on a classic ESP32
    node = NodeProc(mp, board, {"role": "drafter", "model": "/rom/" + Path(model).name, "node_id": 1},
                    heap=ESP32_HEAP + code_heap(mp, board), flashed=True, rom=rom)
    try:
        ctx = node.call(m.HELLO)[5]  # a node short of heap halves its context
        tokens = list(range(1, 17))
        begin(node, 1, 7, 0.8, tokens, draft_k=8)
        before = node.stats()
        drafted, session = 0, 1
        tail: list[int] = []
        t0 = time.perf_counter()
        while drafted < 200:
            if len(tokens) + 4 > ctx:  # a new story once the context is full
                session += 1
                tokens = list(range(1, 17))
                tail = []
                begin(node, session, 7, 0.8, tokens, draft_k=8)
            _, entries = node.call(m.DRAFT_REQ, m.pack_draft_req(len(tokens), 4, tail), expect=m.DRAFT)
            drafted += len(entries)
            tail = [(entries[3][0] + 1) % 512]  # accept 3, then a residual: committed by the next DRAFT_REQ
            tokens += [e[0] for e in entries[:3]] + tail
        wall = time.perf_counter() - t0
        st = node.stats()
        comp = st["compute_ms"] - before["compute_ms"]
        pos = st["positions"] - before["positions"]
        return {"tokens_per_s": round(drafted / wall, 1), "compute_ms_per_position": round(comp / pos, 3),
                "heap_free": st["heap_free"], "heap_min": st["heap_min"], "tokens": drafted}
    finally:
        node.close()


def _target(mp: str, board: Path, model: str) -> dict:
    node = NodeProc(mp, board, {"role": "verifier", "model": model, "node_id": 1}, heap=ESP32S3_HEAP, flashed=True)
    try:
        tokens = list(range(1, 17))
        begin(node, 1, 3, 0.8, tokens)
        commit(node, tokens, 0)
        tokens.append(node.call(m.VERIFY_REQ, m.pack_draft(len(tokens), []))[1])  # prefill the prompt
        st0 = node.stats()
        t0 = time.perf_counter()
        for _ in range(24):  # each verdict commits itself
            tokens.append(node.call(m.VERIFY_REQ, m.pack_draft(len(tokens), []), expect=m.VERDICT)[1])
        wall = time.perf_counter() - t0
        st1 = node.stats()
        one = (st1["compute_ms"] - st0["compute_ms"]) / (st1["passes"] - st0["passes"])
        for _ in range(8):  # 4 drafts each: 5 positions per pass
            entries = [(t, [t], [65536]) for t in (5, 6, 7, 8)]
            acc, tok = node.call(m.VERIFY_REQ, m.pack_draft(len(tokens), entries), expect=m.VERDICT)
            tokens += [e[0] for e in entries[:acc]] + [tok]
        st2 = node.stats()
        five = (st2["compute_ms"] - st1["compute_ms"]) / (st2["passes"] - st1["passes"])
        return {"plain_tokens_per_s": round(24 / wall, 2), "ms_per_pass_1": round(one, 1),
                "ms_per_pass_5": round(five, 1), "v5": round(five / one, 2), "heap_free": st2["heap_free"]}
    finally:
        node.close()


def _pipelined(mp: str, tmp: Path, model: str) -> dict:
    verifier = NodeProc(mp, tmp / "pv", {"role": "verifier", "model": model, "node_id": 1})
    out = {}
    try:
        for ahead in (0, 12):
            drafter = NodeProc(mp, tmp / ("pd%d" % ahead), {"role": "drafter", "model": model, "node_id": 1,
                                                           "spec_ahead": ahead})
            try:
                lat = []
                orig = drafter.call

                def timed(mtype, payload=b"", expect=None, **kw):
                    t0 = time.perf_counter()
                    r = orig(mtype, payload, expect, **kw)
                    if mtype == m.DRAFT_REQ:
                        lat.append((time.perf_counter() - t0) * 1e3)
                    return r

                drafter.call = timed
                generate(drafter, verifier, list(range(1, 9)), 60, 4, 0.0, 0, ahead + 1, 256, pause=0.02)
                st = drafter.stats()
                out["ahead_%d" % ahead] = {"draft_req_ms": round(statistics.mean(lat[1:]), 2),
                                           "draft_hits": st["draft_hits"], "drafted": st["drafted"]}
            finally:
                drafter.close()
        return out
    finally:
        verifier.close()


def run() -> dict:
    mp = _mp()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        board = tmp / "flash"
        flash(board)
        drafter_model = shipped_model("drafter")
        target_model = shipped_model("target")
        res = {"rtt": _rtt(mp, tmp), "rtt_radio": _rtt_radio(mp, tmp), "drafter": _drafter(mp, board, drafter_model),
               "target": _target(mp, board, target_model), "pipelined": _pipelined(mp, tmp, drafter_model),
               "models": {"drafter": drafter_model, "target": target_model}}
    r, dr, tg, pl = res["rtt"], res["drafter"], res["target"], res["pipelined"]
    print("%-40s %s" % ("figure (unix-port VM, this machine)", "value"))
    for size in (8, 200):
        x = r["ping_%d_us" % size]
        print("%-40s %d us median, %d us p90" % ("PING round trip, %d-byte payload" % size, x["median"], x["p90"]))
    for size in (8, 600):
        x = res["rtt_radio"]["ping_%d_us" % size]
        print("%-40s %d us median, %d us p90" % ("PING via gateway + radio, %d B" % size, x["median"], x["p90"]))
    print("%-40s %.1f tok/s (%.2f ms compute/token)" % ("drafter, ESP32 heap, gamma 4, T 0.8", dr["tokens_per_s"],
                                                         dr["compute_ms_per_position"]))
    print("%-40s %d B free, %d B low-water" % ("drafter heap left", dr["heap_free"], dr["heap_min"]))
    print("%-40s %.2f tok/s" % ("target plain decoding, ESP32-S3 heap", tg["plain_tokens_per_s"]))
    print("%-40s %.1f ms (1 pos) / %.1f ms (5 pos): v(5) = %.2f" % ("target pass", tg["ms_per_pass_1"],
                                                                   tg["ms_per_pass_5"], tg["v5"]))
    for k, v in pl.items():
        print("%-40s %.2f ms per DRAFT_REQ, %d of %d drafts ready" % ("pipelined drafting, " + k, v["draft_req_ms"],
                                                                     v["draft_hits"], v["drafted"]))
    return res

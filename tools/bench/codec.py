"""Codec benchmark: µs per frame and per verdict under CPython and MicroPython; bus bytes per token.

    python -m specmesh.tools.bench codec

Timings: tools/bench/_mp_codec.py's workload, run in this CPython process and by the `micropython`
binary (the unix port, on this machine; an ESP32 is far slower, measure it with real boards), side
by side. Rows: a VERIFY_REQ frame (γ = 4 drafts with q-hat top-k 8 or 32) packed, framed, decoded and
unpacked on each link kind; a VERDICT frame plain and signed; the acceptance rule per verdict at
vocab 512, γ = 4; the drafter's quantize_topk and the target's quantize per token.

Wire bytes (exact, from the codec): per drafted token for the DRAFT body that carries it, and per round
on the host's link to each board (host/backends/board.py: DRAFT_REQ with the folded COMMIT + DRAFT; VERIFY_REQ
with partial q-hat tables + VERDICT, and after a first rejection the rejected draft's whole table +
VERDICT), on the stream link (':' + unpadded base64 + '\\n'), as ascii85-style lines for comparison,
and on the datagram link (ESP-NOW packets, 250-byte MTU), for greedy (k = 1), k = 8 and k = 32.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from specmesh.shared import codec
from specmesh.shared import messages as m
from specmesh.shared.rule import ONE
from specmesh.tools.bench import _mp_codec
from specmesh.host.layout import micropython_binary

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(_mp_codec.__file__)
GAMMA = _mp_codec.GAMMA
BUDGET_MS = 150
TOPKS = (1, 8, 32)

ROWS = [  # (key, label)
    ("frame_verify_req_k8", "VERIFY_REQ k=8: pack+encode+decode+unpack"),
    ("frame_verify_req_k32", "VERIFY_REQ k=32: pack+encode+decode+unpack"),
    ("stream_verify_req_k8", "VERIFY_REQ k=8: encode + line + StreamDecoder"),
    ("stream_verify_req_k32", "VERIFY_REQ k=32: encode + line + StreamDecoder"),
    ("datagram_verify_req_k8", "VERIFY_REQ k=8: fragment + DatagramDecoder"),
    ("datagram_verify_req_k32", "VERIFY_REQ k=32: fragment + DatagramDecoder"),
    ("frame_verdict", "VERDICT: pack+encode+decode+unpack"),
    ("frame_verdict_signed", "VERDICT signed (HMAC + replay check)"),
    ("verify_k8", "rule.verify, vocab 512, gamma 4, k=8"),
    ("verify_k32", "rule.verify, vocab 512, gamma 4, k=32"),
    ("verify_greedy", "rule.verify_greedy, gamma 4"),
    ("quantize_topk_k8", "quantize_topk vocab 512, k=8 (drafter)"),
    ("quantize_topk_k32", "quantize_topk vocab 512, k=32 (drafter)"),
    ("quantize_512", "quantize vocab 512 (target)"),
    ("sample_512", "sample dense vocab 512"),
]


def _micropython() -> str | None:
    return micropython_binary()


def _stream_bytes(frame: bytes) -> int:
    return len(codec.encode_line(frame))


def _base85_bytes(frame: bytes) -> int:
    """The line an ascii85-style encoding would make of the frame (4 bytes in 5 digits, a last group of
    n bytes in n + 1), with the same ':' and newline: the denser printable alternative to base64."""
    n = len(frame)
    return 2 + 5 * (n // 4) + (n % 4 + 1 if n % 4 else 0)


def _datagram_bytes(frame: bytes) -> int:
    return sum(len(p) for p in codec.fragment(frame, 0))


def wire_figures(gamma: int = GAMMA) -> dict:
    """Exact bytes on each link kind, per drafted token and per round (host/backends/board.py's messages), by
    draft top-k: frames to the board at each link's end, so without addresses."""
    pos = 1000
    out: dict = {}
    plain = [codec.encode(m.VERIFY_REQ, m.pack_draft(pos, []), seq=1),
             codec.encode(m.VERDICT, m.pack_verdict(0, 5), seq=1, reply=True)]
    for k in TOPKS:
        ids = list(range(3, 3 + 40 * k, 40))  # ids 40 apart, one heavy weight: a peaked q-hat like the drafter's
        weights = [1 + 20 * j for j in range(k)]
        weights[k // 2] += ONE - sum(weights)
        entries = [(ids[k // 2], ids, weights)] * gamma
        draft = codec.encode(m.DRAFT, m.pack_draft(pos, entries), seq=1, reply=True)
        drafter = [codec.encode(m.DRAFT_REQ, m.pack_draft_req(pos, gamma, [5]), seq=1), draft]
        verify = [codec.encode(m.VERIFY_REQ, m.pack_draft(pos, entries, partial=True), seq=2),
                  codec.encode(m.VERDICT, m.pack_verdict(gamma, 5), seq=2, reply=True)]
        table = [codec.encode(m.VERIFY_REQ, m.pack_draft(pos, entries[:1]), seq=3),
                 codec.encode(m.VERDICT, m.pack_verdict(0, 5), seq=3, reply=True)] if k > 1 else []
        row = {"draft_frame_binary": len(draft)}
        for link, size in (("stream", _stream_bytes), ("base85", _base85_bytes), ("datagram", _datagram_bytes)):
            row[link + "_per_drafted_token"] = round(size(draft) / gamma, 1)
            row[link + "_drafter_round"] = sum(size(f) for f in drafter)
            row[link + "_verifier_round_all_accepted"] = sum(size(f) for f in verify)
            row[link + "_verifier_round_first_rejected"] = sum(size(f) for f in verify + table)
        out["greedy" if k == 1 else "k%d" % k] = row
    out["plain_round"] = {link: sum(size(f) for f in plain) for link, size in (
        ("stream", _stream_bytes), ("base85", _base85_bytes), ("datagram", _datagram_bytes))}
    out["signing_overhead_per_frame"] = codec.SIG_SIZE
    return out


def codec_timings() -> dict:
    res = {"cpython": _mp_codec.workload(BUDGET_MS * 1000)}
    mp = _micropython()
    if mp is None:
        res["micropython_error"] = "micropython binary not found (run `make setup`)"
        return res
    p = subprocess.run([mp, str(SCRIPT), str(BUDGET_MS)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    if p.returncode != 0:
        res["micropython_error"] = (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
    else:
        res["micropython"] = json.loads(p.stdout)
    return res


def run() -> dict:
    t = codec_timings()
    cp, mp = t["cpython"], t.get("micropython", {})
    print("codec and rule timings, µs per call (MicroPython = unix port on this host, not a board)")
    print("%-48s %10s %12s %7s" % ("operation", "CPython", "MicroPython", "ratio"))
    for key, label in ROWS:
        a, b = cp[key], mp.get(key)
        print("%-48s %10.1f %12s %7s" % (label, a, "-" if b is None else "%.1f" % b,
                                         "-" if b is None else "%.1fx" % (b / a)))
    print("mean accepted drafts per verdict in this workload: k=8 %.2f, k=32 %.2f"
          % (cp["accepted_mean_k8"], cp["accepted_mean_k32"]))
    if "micropython_error" in t:
        print("MicroPython not measured: " + t["micropython_error"])
    wire = wire_figures()
    print("\nbus bytes, gamma = %d (stream: ':' + unpadded base64 + '\\n'; base85: the same frames as ascii85-style"
          " lines; datagram: 250-byte ESP-NOW packets)" % GAMMA)
    print("%-8s %-10s %8s %10s %12s %20s %20s" % ("q-hat", "link", "DRAFT B", "B/draft", "drafter B/rd",
                                                 "verifier B/rd, all ok", "verifier B/rd, 1st no"))
    for name in ("greedy", "k8", "k32"):
        w = wire[name]
        for link in ("stream", "base85", "datagram"):
            print("%-8s %-10s %8d %10.1f %12d %20d %20d" % (
                name, link, w["draft_frame_binary"], w[link + "_per_drafted_token"], w[link + "_drafter_round"],
                w[link + "_verifier_round_all_accepted"], w[link + "_verifier_round_first_rejected"]))
    print("plain decoding: %s bytes per token" % ", ".join("%s %d" % kv for kv in wire["plain_round"].items()))
    print("a DRAFT carries whole q-hat tables, a VERIFY_REQ each draft's own weight, and the rejected draft's whole"
          " table follows a PARTIAL verdict;\nsigning adds %d bytes per frame" % codec.SIG_SIZE)
    return {"timings_us": t, "wire_bytes": wire, "gamma": GAMMA, "vocab": _mp_codec.VOCAB}

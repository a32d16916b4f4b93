"""Codec benchmark: µs per frame and per verdict under CPython and MicroPython; bus bytes per token.

    python -m tools.bench codec

Timings: tools/bench/_mp_codec.py's workload, run in this CPython process and by the `micropython`
binary (the unix port, on this machine; an ESP32 is far slower, measure it with real boards), side
by side. Rows: a VERIFY_REQ frame (γ = 4 drafts with q-hat top-k 8 or 32) packed, framed, decoded and
unpacked on each link kind; a VERDICT frame plain and signed; the acceptance rule per verdict at
vocab 512, γ = 4; the drafter's quantize_topk and the target's quantize per token.

Wire bytes (exact, from the codec): per drafted token for the DRAFT body that carries it, on the
stream link (':' + base64 + '\\n') and the datagram link (ESP-NOW packets, 250-byte MTU), for greedy
(k = 1), k = 8 and k = 32. A host-orchestrated round moves each draft twice (DRAFT reply from the
drafter, VERIFY_REQ to the verifier) plus DRAFT_REQ, VERDICT and COMMIT + ACK to both nodes
(host/boards.py); `round_bytes` counts all of them for a round emitting γ + 1 tokens.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from shared import codec
from shared import messages as m
from shared.rule import ONE
from tools.bench import _mp_codec

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
    exe = Path(sys.executable).with_name("micropython")
    return str(exe) if exe.exists() else shutil.which("micropython")


def _stream_bytes(frame: bytes) -> int:
    return len(codec.encode_line(frame))


def _datagram_bytes(frame: bytes) -> int:
    return sum(len(p) for p in codec.fragment(frame, 0))


def wire_figures(gamma: int = GAMMA) -> dict:
    """Exact bytes on each link kind, per drafted token and per round, by draft top-k."""
    out: dict = {}
    for k in TOPKS:
        ids = list(range(k))
        weights = [ONE // k] * k
        weights[0] += ONE - sum(weights)
        entries = [(0, ids, weights)] * gamma
        draft = codec.encode(m.DRAFT, m.pack_draft(1000, entries), 1, 0, 1, 1, True)
        verify_req = codec.encode(m.VERIFY_REQ, m.pack_draft(1000, entries), 0, 2, 1, 1)
        others = [codec.encode(m.DRAFT_REQ, m.pack_draft_req(1000, gamma), 0, 1, 1, 1),
                  codec.encode(m.VERDICT, m.pack_verdict(1000, gamma, 5), 2, 0, 1, 1, True)]
        for node in (1, 2):
            others.append(codec.encode(m.COMMIT, m.pack_commit(1005, [5] * (gamma + 1)), 0, node, 2, 1))
            others.append(codec.encode(m.ACK, b"", node, 0, 2, 1, True))
        row = {"draft_frame_binary": len(draft)}
        for link, size in (("stream", _stream_bytes), ("datagram", _datagram_bytes)):
            row[link + "_per_drafted_token"] = round(size(draft) / gamma, 1)
            total = size(draft) + size(verify_req) + sum(size(f) for f in others)
            row[link + "_round_bytes"] = total
            row[link + "_per_token_all_accepted"] = round(total / (gamma + 1), 1)
        out["greedy" if k == 1 else "k%d" % k] = row
    out["signing_overhead_per_frame"] = codec.SIG_SIZE
    return out


def _timings() -> dict:
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
    t = _timings()
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
    print("\nbus bytes, gamma = %d (stream: ':' + base64 + '\\n'; datagram: 250-byte ESP-NOW packets)" % GAMMA)
    print("%-8s %10s %16s %18s %14s %16s" % ("q-hat", "DRAFT B", "stream B/draft", "datagram B/draft",
                                             "stream B/round", "datagram B/round"))
    for name in ("greedy", "k8", "k32"):
        w = wire[name]
        print("%-8s %10d %16.1f %18.1f %14d %16d" % (name, w["draft_frame_binary"], w["stream_per_drafted_token"],
                                                    w["datagram_per_drafted_token"], w["stream_round_bytes"],
                                                    w["datagram_round_bytes"]))
    print("a round moves each draft twice and emits 1..gamma+1 tokens; signing adds %d bytes per frame"
          % codec.SIG_SIZE)
    return {"timings_us": t, "wire_bytes": wire, "gamma": GAMMA, "vocab": _mp_codec.VOCAB}

"""Signing benchmark: what a deployment key (`--key-file`) costs per generated token, in bytes and time.

    python -m specmesh.tools.bench signing

Side by side in one run, on the same prompts and seeds: generations through two virtual boards (the
shipped models, serial links, gamma 3, greedy and T = 0.8), unsigned and signed, twice each in the order
plain, signed, signed, plain. Rows: mean tokens/s seen by the host (emulation: the boards are VMs on
this machine, which other work shares: differences of a few tens of percent either way are noise
here), bus bytes per token, and the frames per
token, which signing reveals exactly: every frame grows by a 4-byte counter and an 8-byte tag, 16 bytes
as ':'-base64. Time per frame: one HMAC-SHA256 to sign it at the sender and one to check it at the
receiver, plus the replay-window update, from the codec benchmark's VERDICT rows (signed minus plain)
under CPython and the MicroPython unix port (a board is slower: measure with real boards).

ESP-NOW rows (the verifier one virtual radio hop behind the gateway, T = 0.8, once each): radio packets
and ESP-NOW payload bytes per token, plain and keyed. With a key the peers are also encrypted (LMK):
that adds no payload byte (the 250-byte budget is unchanged; the packets counted as encrypted carry
the same payload), while CCMP adds 16 bytes per packet on air (8-byte CCMP header, 8-byte MIC) in the
802.11 frame around it, which the last column counts. The radio's AES runs in the Wi-Fi hardware and
is not modelled in time by the emulator.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from specmesh.host.backends import SessionParams
from specmesh.host.decode.gamma import GammaController
from specmesh.host.decode.orchestrator import generate
from specmesh.host.decode.tokenizer import Tokenizer
from specmesh.host.provision.cluster import Cluster
from specmesh.shared import codec
from specmesh.tools.bench.codec import codec_timings

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
PROMPTS = ("Once upon a time", "The dog ran", "She said that")
TOKENS = 32
GAMMA = 3
KEY = bytes(range(32))
LINE_BYTES_PER_FRAME = 4 * codec.SIG_SIZE // 3  # the 12 signing bytes on a ':'-base64 line
CCMP_BYTES = 16  # per encrypted 802.11 frame: CCMP header 8 + MIC 8, outside the ESP-NOW payload


def _generations(key: bytes | None, temperature: float, prompts: list[list[int]], transport: str = "serial") -> dict:
    with tempfile.TemporaryDirectory(prefix="specmesh-bench-") as tmp, \
            Cluster(transport, MODELS, Path(tmp), key=key) as c:
        v, d = c.backend("verifier"), c.backend("drafter")
        tokens = 0
        texts = []
        t0 = time.perf_counter()
        for i, p in enumerate(prompts):
            params = SessionParams(seed=i, temperature=temperature)
            texts.append(generate(p, v, d, params, TOKENS, GammaController(fixed=GAMMA)).tokens)
            tokens += len(texts[-1])
        wall = time.perf_counter() - t0
        radio = c.hub.stats if transport == "espnow" else None
        return {"tokens": tokens, "tok_s": tokens / wall, "bytes": v.bus_bytes + d.bus_bytes, "texts": texts,
                "radio": None if radio is None else (radio.sent, radio.payload_bytes, radio.encrypted)}


def _espnow(prompts: list[list[int]]) -> dict:
    """Radio packets and payload bytes per token, plain and keyed (signed frames, encrypted peers)."""
    print("\nESP-NOW, T = 0.8: %-8s %12s %12s %12s %18s" % ("", "packets/tok", "payload B/tok", "encrypted",
                                                             "CCMP on-air B/tok"))
    out = {}
    for name, key in (("plain", None), ("keyed", KEY)):
        r = _generations(key, 0.8, prompts, "espnow")
        packets, payload, encrypted = r["radio"]
        row = {"packets_per_token": packets / r["tokens"], "payload_bytes_per_token": payload / r["tokens"],
               "encrypted_share": encrypted / packets, "ccmp_bytes_per_token": CCMP_BYTES * encrypted / r["tokens"],
               "texts": r["texts"]}
        out[name] = row
        print("                   %-8s %12.2f %12.1f %11.0f%% %18.1f" % (
            name, row["packets_per_token"], row["payload_bytes_per_token"], 100 * row["encrypted_share"],
            row["ccmp_bytes_per_token"]))
    out["same_text"] = out["plain"].pop("texts") == out["keyed"].pop("texts")
    print("same text plain and keyed: %s; the keyed payload grows by the signatures only (12 B per frame)"
          % out["same_text"])
    return out


def run() -> dict:
    tok = Tokenizer.from_llama2c(MODELS / "tokenizer.bin")
    prompts = [tok.encode(p) for p in PROMPTS]
    out: dict = {"tokens_per_prompt": TOKENS, "gamma": GAMMA}
    print("signed vs unsigned generation, virtual boards (emulation), %d prompts x %d tokens, gamma %d"
          % (len(prompts), TOKENS, GAMMA))
    print("%-6s %12s %12s %12s %12s %10s %12s" % ("T", "tok/s plain", "tok/s signed", "B/tok plain",
                                                  "B/tok signed", "frames/tok", "same text"))
    for temperature in (0.0, 0.8):
        runs: dict = {None: [], KEY: []}
        for key in (None, KEY, KEY, None):  # each mode first once: the machine's load drifts
            runs[key].append(_generations(key, temperature, prompts))
        plain, signed = runs[None][0], runs[KEY][0]
        bpt = [r["bytes"] / r["tokens"] for r in (plain, signed)]
        frames = (bpt[1] - bpt[0]) / LINE_BYTES_PER_FRAME
        row = {"tok_s_plain": sum(r["tok_s"] for r in runs[None]) / 2,
               "tok_s_signed": sum(r["tok_s"] for r in runs[KEY]) / 2, "bytes_per_token_plain": bpt[0],
               "bytes_per_token_signed": bpt[1], "frames_per_token": frames,
               "same_text": all(r["texts"] == plain["texts"] for r in runs[None] + runs[KEY])}
        out["T=%g" % temperature] = row
        print("%-6g %12.1f %12.1f %12.1f %12.1f %10.2f %12s" % (temperature, row["tok_s_plain"], row["tok_s_signed"],
                                                               bpt[0], bpt[1], frames, row["same_text"]))
    out["espnow"] = _espnow(prompts)
    t = codec_timings()
    print("\nsign + check + replay window per frame, µs (VERDICT signed minus plain; unix port, not a board)")
    for runtime in ("cpython", "micropython"):
        r = t.get(runtime)
        if r is None:
            print("%-12s not measured: %s" % (runtime, t.get("micropython_error")))
            continue
        us = r["frame_verdict_signed"] - r["frame_verdict"]
        out["sign_check_us_" + runtime] = us
        per_token = [out["T=%g" % T]["frames_per_token"] * us for T in (0.0, 0.8)]
        print("%-12s %8.1f us/frame  ->  %.0f us/token greedy, %.0f us/token T=0.8 (both ends together)"
              % (runtime, us, *per_token))
    return out

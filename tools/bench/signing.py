"""Signing benchmark: what a deployment key (`--key-file`) costs per generated token, in bytes and time.

    python -m tools.bench signing

Side by side in one run, on the same prompts and seeds: generations through two virtual boards (the
shipped models, serial links, gamma 3, greedy and T = 0.8), unsigned and signed, twice each in the order
plain, signed, signed, plain. Rows: mean tokens/s seen by the host (emulation: the boards are VMs on
this machine, which other work shares: differences of a few tens of percent either way are noise
here), bus bytes per token, and the frames per
token, which signing reveals exactly: every frame grows by a 4-byte counter and an 8-byte tag, 16 bytes
as ':'-base64. Time per frame: one HMAC-SHA256 to sign it at the sender and one to check it at the
receiver, plus the replay-window update, from the codec benchmark's VERDICT rows (signed minus plain)
under CPython and the MicroPython unix port (a board is slower: measure with real boards).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from host.backends import SessionParams
from host.cluster import Cluster
from host.gamma import GammaController
from host.orchestrator import generate
from host.tokenizer import Tokenizer
from shared import codec
from tools.bench.codec import _timings

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
PROMPTS = ("Once upon a time", "The dog ran", "She said that")
TOKENS = 32
GAMMA = 3
KEY = bytes(range(32))
LINE_BYTES_PER_FRAME = 4 * codec.SIG_SIZE // 3  # the 12 signing bytes on a ':'-base64 line


def _generations(key: bytes | None, temperature: float, prompts: list[list[int]]) -> dict:
    with tempfile.TemporaryDirectory(prefix="specmesh-bench-") as tmp, \
            Cluster("serial", MODELS, Path(tmp), key=key) as c:
        v, d = c.backend("verifier"), c.backend("drafter")
        tokens = 0
        texts = []
        t0 = time.perf_counter()
        for i, p in enumerate(prompts):
            params = SessionParams(seed=i, temperature=temperature)
            texts.append(generate(p, v, d, params, TOKENS, GammaController(fixed=GAMMA)).tokens)
            tokens += len(texts[-1])
        wall = time.perf_counter() - t0
        return {"tokens": tokens, "tok_s": tokens / wall, "bytes": v.bus_bytes + d.bus_bytes, "texts": texts}


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
    t = _timings()
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

"""Projected tokens/s of the shipped target on real boards, plain and speculative, next to esp32-llm.

    python -m specmesh.tools.bench projection

Four prompts are decoded on the host CPU back-ends (the boards' arithmetic) at gamma 4; host/projection/rounds.py
replays each run, and plain decoding of as many tokens, on host/projection/hardware.py's derived figures for a board
class over USB serial. Every step of the engine is a term (host/projection/costmodel.py: the matmuls, the non-matmul
kernels, the attention's KV-cache reads, the interpreted calls between kernels, PSRAM streaming) and the
bus is one more; the derivation table gives each term's time per plain token and its share. esp32-llm's
19.13 tok/s is stories260K in C on an ESP32-S3, measured by that project: the anchor. Only boards whose
heap holds the target are projected for it (a classic ESP32's 110 KB does not hold 276 KB of weights).
"""

from __future__ import annotations

from pathlib import Path

from specmesh.host.backends import LocalDrafter, LocalVerifier, SessionParams
from specmesh.host.decode.gamma import GammaController
from specmesh.host.layout import DRAFTER_FILE, TARGET_FILE
from specmesh.host.projection.hardware import BOARDS
from specmesh.host.decode.orchestrator import generate
from specmesh.host.projection.rounds import Projector
from specmesh.host.decode.tokenizer import Tokenizer
from specmesh.tools.bench.spec import PROMPTS
from specmesh.shared.modelfile import HEADER_SIZE, parse_header

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
ANCHOR_TOK_S = 19.13  # DaveBben/esp32-llm, stories260K in C on an ESP32-S3
NEW = 64
TARGET_BOARDS = ("esp32s3",)  # boards with PSRAM: the target's weights and KV cache fit


def run() -> dict:
    heads = [parse_header((MODELS / f).read_bytes()[:HEADER_SIZE]) for f in (TARGET_FILE, DRAFTER_FILE)]
    tok = Tokenizer.from_llama2c(MODELS / "tokenizer.bin")
    ver, dra = LocalVerifier(MODELS / TARGET_FILE), LocalDrafter(MODELS / DRAFTER_FILE)
    boards: dict[str, dict[str, float]] = {}
    derivation: dict[str, dict[str, dict[str, float]]] = {}
    for name in TARGET_BOARDS:
        proj = Projector(heads[0], heads[1], name, "serial")
        spec = plain = tokens = 0.0
        terms: dict[str, float] = {}
        for text in PROMPTS:
            prompt = tok.encode(text)
            r = generate(prompt, ver, dra, SessionParams(), NEW, GammaController(fixed=4))
            p = proj.project(r, len(prompt))
            spec += p["wall_s"]
            plain += p["plain_wall_s"]
            n = sum(x.n_committed for x in r.rounds)
            tokens += n
            for i in range(n):  # the plain run project() priced, term by term
                for t, s in proj.plain_terms(len(prompt) + i).items():
                    terms[t] = terms.get(t, 0.0) + s
        boards[BOARDS[name].name] = {"plain": tokens / plain, "speculative, gamma 4 (board drafter)": tokens / spec}
        derivation[BOARDS[name].name] = {t: {"ms_per_token": 1e3 * s / tokens, "share": s / plain}
                                         for t, s in sorted(terms.items(), key=lambda kv: -kv[1])}
    print("stories260K projected on boards (host/projection/hardware.py, derived), %d prompts x %d tokens; anchor: "
          "esp32-llm in C" % (len(PROMPTS), NEW))
    print("%-44s %8.2f tok/s (measured by esp32-llm)" % ("esp32-llm, C, ESP32-S3", ANCHOR_TOK_S))
    for board, modes in boards.items():
        for mode, value in modes.items():
            print("%-44s %8.2f tok/s (projected)" % ("%s, %s" % (board, mode), value))
    for board, rows in derivation.items():
        print("\nderivation of a plain %s token (host/projection/costmodel.py terms, mean over the runs above)" % board)
        print("%-14s %10s %7s" % ("term", "ms/token", "share"))
        for t, row in rows.items():
            print("%-14s %10.2f %6.1f%%" % (t, row["ms_per_token"], 100 * row["share"]))
        print("%-14s %10.2f %6.1f%%" % ("total", sum(r["ms_per_token"] for r in rows.values()), 100.0))
    return {"anchor_tok_s": ANCHOR_TOK_S, "boards": boards, "derivation": derivation}

"""Projected tokens/s of the shipped target on real boards, plain and speculative, next to esp32-llm.

    python -m tools.bench projection

Four prompts are decoded on the host CPU back-ends (the boards' arithmetic) at gamma 4; host/projection.py
replays each run, and plain decoding of as many tokens, on host/hardware.py's figures for a board class
over USB serial. Its derivation counts viper instructions per MAC and leaves out the non-matmul work,
KV reads and PSRAM streaming, so it is optimistic. esp32-llm's 19.13 tok/s is stories260K in C on an
ESP32-S3, measured by that project: the anchor. Only boards whose heap holds the target are projected
for it (a classic ESP32's 110 KB does not hold 276 KB of weights).
"""

from __future__ import annotations

from pathlib import Path

from host.backends import LocalDrafter, LocalVerifier, SessionParams
from host.gamma import GammaController
from host.hardware import BOARDS
from host.orchestrator import generate
from host.projection import Projector
from host.tokenizer import Tokenizer
from tools.bench.spec import PROMPTS
from shared.modelfile import HEADER_SIZE, parse_header

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
ANCHOR_TOK_S = 19.13  # DaveBben/esp32-llm, stories260K in C on an ESP32-S3
NEW = 64
TARGET_BOARDS = ("esp32s3",)  # boards with PSRAM: the target's weights and KV cache fit


def run() -> dict:
    heads = [parse_header((MODELS / f).read_bytes()[:HEADER_SIZE]) for f in ("target.spm", "drafter.spm")]
    tok = Tokenizer.from_llama2c(MODELS / "tokenizer.bin")
    ver, dra = LocalVerifier(MODELS / "target.spm"), LocalDrafter(MODELS / "drafter.spm")
    boards: dict[str, dict[str, float]] = {}
    for name in TARGET_BOARDS:
        proj = Projector(heads[0], heads[1], name, "serial")
        spec = plain = tokens = 0.0
        for text in PROMPTS:
            prompt = tok.encode(text)
            r = generate(prompt, ver, dra, SessionParams(), NEW, GammaController(fixed=4))
            p = proj.project(r, len(prompt))
            spec += p["wall_s"]
            plain += p["plain_wall_s"]
            tokens += sum(x.committed for x in r.rounds)
        boards[BOARDS[name].name] = {"plain": tokens / plain, "speculative, gamma 4 (board drafter)": tokens / spec}
    print("stories260K projected on boards (host/hardware.py), %d prompts x %d tokens; anchor: esp32-llm in C"
          % (len(PROMPTS), NEW))
    print("%-44s %8.2f tok/s (measured by esp32-llm)" % ("esp32-llm, C, ESP32-S3", ANCHOR_TOK_S))
    for board, modes in boards.items():
        for mode, value in modes.items():
            print("%-44s %8.2f tok/s (projected)" % ("%s, %s" % (board, mode), value))
    return {"anchor_tok_s": ANCHOR_TOK_S, "boards": boards}

"""Projected tokens/s of the shipped target split across N stage boards, plain and speculative.

    python -m specmesh.tools.bench pipeline

The spec bench's prompts are decoded greedily on the host CPU back-ends (the boards' arithmetic) at each
gamma (0: plain, no drafter); host/projection/pipeline.py replays every run on N = 1..5 stages (the
target's 5 layers split evenly) of classic ESP32s over 921600-baud UART and over ESP-NOW behind a gateway,
and of ESP32-S3s on their own USB-Serial-JTAG (host/projection/pipeline.py STAGE_LINKS), with the drafts
made on a drafter board or on the host CPU, next to plain decoding on one ESP32-S3 that holds the whole
target. `fits` says whether each stage of that split fits its class's heap (its layers' weights + a
128-position KV cache + 16 KB of buffers and tables + the node's 16 KB reserve <= the heap of
host/boardclasses.py): of classic ESP32s only the 5-stage split does; the others are the model's
arithmetic, not boards one can build.
"""

from __future__ import annotations

from pathlib import Path

from specmesh.host.backends import LocalDrafter, LocalVerifier, SessionParams
from specmesh.host.boardclasses import BOARD_CLASSES, ESP32, STAGE_CTX
from specmesh.host.decode.gamma import GammaController
from specmesh.host.layout import HOST_DRAFTER_FILE, TARGET_FILE
from specmesh.host.projection.hardware import HOST_DRAFT_POSITION, UART_921600
from specmesh.host.decode.orchestrator import generate
from specmesh.host.projection.pipeline import STAGE_LINKS, PipelineProjector
from specmesh.host.decode.tokenizer import Tokenizer
from specmesh.host.provision.cluster import split_layers
from specmesh.shared.modelfile import HEADER_SIZE, parse_header, stage_bytes
from specmesh.tools.bench.spec import PROMPTS

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
NEW = 64
GAMMAS = range(0, 9)
STAGE_OVERHEAD = 16_384 + 16_384  # buffers and tables, then the node's reserve (firmware/node.py)
DRAFTERS = {"board": "a classic-ESP32 drafter board (drafter-esp32.spm, on its own UART)",
            "host": "the host CPU (--drafter cpu, drafter-host.spm)"}


def fits(h, layers, cls: str = ESP32.name) -> bool:
    """Whether every stage of the split fits the heap of a board of class `cls` (the module docstring's estimate)."""
    kv = 2 * STAGE_CTX * (h.kv_dim + 1)
    heap = BOARD_CLASSES[cls].heap_bytes
    return all(stage_bytes(h, a, b) + (b - a) * kv + STAGE_OVERHEAD <= heap for a, b in layers)


def run() -> dict:
    target = parse_header((MODELS / TARGET_FILE).read_bytes()[:HEADER_SIZE])
    tok = Tokenizer.from_llama2c(MODELS / "tokenizer.bin")
    ver = LocalVerifier(MODELS / TARGET_FILE)
    files = {where: ESP32.drafter if where == "board" else HOST_DRAFTER_FILE for where in DRAFTERS}  # per class
    drafters = {where: parse_header((MODELS / f).read_bytes()[:HEADER_SIZE]) for where, f in files.items()}
    prompts = [tok.encode(t) for t in PROMPTS]

    def drafter(where: str) -> LocalDrafter:
        d = LocalDrafter(MODELS / files[where])
        if where == "board":  # the context a classic ESP32 keeps of its drafter (host/boardclasses.py)
            d.max_seq = min(d.max_seq, ESP32.drafter_ctx or d.max_seq)
        return d

    by_drafter = {where: {g: [(len(p), generate(p, ver, drafter(where) if g else None, SessionParams(), NEW,
                                                GammaController(fixed=g)))
                              for p in prompts] for g in GAMMAS} for where, f in files.items()}
    runs = by_drafter["host"]
    curve: dict = {}
    for link, cls in ((link, cls) for cls, links in STAGE_LINKS.items() for link in links):
        for where in DRAFTERS:
            rows = curve.setdefault(link, {}).setdefault(where, {})
            for n in range(1, 6):
                layers = split_layers(target.n_layers, n)
                pp = PipelineProjector(target, drafters[where], layers, link, drafter_on_host=where == "host", board=cls)
                row = {"fits": fits(target, layers, cls)}
                for g, rs in by_drafter[where].items():
                    secs = sum(pp.project(r, plen)["wall_s"] for plen, r in rs)
                    row[str(g)] = sum(sum(x.n_committed for x in r.rounds) for _, r in rs) / secs
                plain = row["0"]
                row["best_gamma"] = max(GAMMAS, key=lambda g: row[str(g)])
                row["best_speedup_vs_pipeline_plain"] = row[str(row["best_gamma"])] / plain
                rows[str(n)] = row
    single_s = 0.0  # plain decoding of the same tokens on one ESP32-S3 holding the whole target
    for plen, r in runs[0]:
        p = PipelineProjector(target, None, split_layers(target.n_layers, 1), UART_921600.name).project(r, plen)
        single_s += sum(x.n_committed for x in r.rounds) / p["single_board_plain_tokens_per_s"]
    single_tok_s = sum(sum(x.n_committed for x in r.rounds) for _, r in runs[0]) / single_s
    alpha = {g: sum(r.accepted for _, r in rs) / max(1, sum(r.tested for _, r in rs)) for g, rs in runs.items() if g}
    print("stories260K on N stages (classic ESP32s on UART or ESP-NOW, ESP32-S3s on USB), projected tok/s (host/projection/pipeline.py), greedy, "
          "%d prompts x %d tokens; one ESP32-S3 holding the whole target, plain: %.2f tok/s"
          % (len(PROMPTS), NEW, single_tok_s))
    print("alpha per gamma: %s" % ", ".join("%d: %.2f" % (g, a) for g, a in alpha.items()))
    drafted = [x for rs in runs.values() for _, r in rs for x in r.rounds[1:] if x.drafter_drafts]
    per_position = sum(x.t_draft for x in drafted) / max(1, sum(x.lag + x.gamma for x in drafted))
    print("host drafter here: %.3f ms a drafted position (the projection uses HOST_DRAFT_POSITION, %.3f ms)"
          % (1000 * per_position, 1000 * HOST_DRAFT_POSITION.value))
    for link, by_drafter in curve.items():
        for where, rows in by_drafter.items():
            print("\n%s, drafter on %s  (gamma 0 = plain on the pipeline)" % (link, DRAFTERS[where]))
            print("%-12s" % "stages" + "".join("%8s" % ("g=%d" % g) for g in GAMMAS) + "   best x plain")
            for n, row in rows.items():
                print("%-12s" % ("%s%s" % (n, "" if row["fits"] else " (no fit)"))
                      + "".join("%8.2f" % row[str(g)] for g in GAMMAS)
                      + "   %.2fx (g=%d)" % (row["best_speedup_vs_pipeline_plain"], row["best_gamma"]))
    return {"single_board_plain_tok_s": single_tok_s, "host_draft_position_s": per_position,
            "alpha": {str(g): a for g, a in alpha.items()}, "curve": curve}

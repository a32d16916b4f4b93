"""Projected tokens/s of the shipped target on real boards, plain and speculative, next to esp32-llm.

    python -m specmesh.tools.bench projection

Held-out prompts (tools/modelcard.py: stories no model was trained or chosen on, their first 16 tokens)
are decoded greedily on the host CPU back-ends (the boards' arithmetic, bit for bit) with gamma chosen as
`specmesh run --project esp32s3` chooses it: from the projected costs, with what a drafter board drafts beside
each verify (host/decode/gamma.py, host/decode/ahead.py). host/projection/rounds.py replays each run,
and plain decoding of as many tokens, on an ESP32-S3 verifier over USB serial, for each kernel set
(native: the xtensawin module, its counts as host/projection/hardware.py NATIVE_COUNTED says; viper: the
MicroPython-only engine) and each configuration:

- each shipped board drafter (models/drafter.spm, models/drafter-esp32.spm) on each place it can draft: a
  classic-ESP32 drafter board (heap or ROMFS, by what its heap holds), an ESP32-S3 drafter board, the
  host CPU; and the host's own (models/drafter-host.spm, what `--drafter cpu` runs) on the host: alpha, tokens per verification (tau), c (a drafter pass over a plain target
  step) and the speed-up over plain decoding (the model card's per-class choice);
- the 5-stage pipeline (host/projection/pipeline.py) of classic ESP32s on UART and of ESP32-S3s on their
  USB (`specmesh run --stages 5 --project esp32s3`), against one ESP32-S3 decoding plainly with the same
  kernels.

Held-out protocol (tools/heldout.py): the tables above decode the tuning set (TinyStories validation
openings, on which the model card's alphas and gamma's prior were chosen); the two headline
configurations (the classic-ESP32 drafter board, the host CPU drafting), native kernels, are also
decoded on the report set (short hand-written story starts nobody tuned on), and both sets' tables give
every prompt's alpha, tau and speed-up over plain, their mean and the worst prompt (and its rounds: plain, and
plain ones that verified drafts copied from the text instead, host/decode/lookup.py).

The derivation table gives each cost term's time per plain token and its share. esp32-llm's 19.13 tok/s
is stories260K in C on an ESP32-S3, measured by that project: the anchor.
"""

from __future__ import annotations

from specmesh.host.backends import UNSURE_MARGIN, LocalDrafter, LocalVerifier, SessionParams
from specmesh.host.boardclasses import BOARD_CLASSES, ESP32, ESP32S3, ROLE_CLASS
from specmesh.host.decode.gamma import GammaController
from specmesh.host.decode.orchestrator import Observer, generate
from specmesh.host.decode.tokenizer import Tokenizer
from specmesh.host.layout import HOST_DRAFTER_FILE, MODELS, TARGET_FILE
from specmesh.host.projection.costmodel import KERNELS
from specmesh.host.projection.hardware import BOARDS
from specmesh.host.projection.pipeline import STAGE_LINKS, PipelineProjector
from specmesh.host.projection.rounds import Projector
from specmesh.host.provision.cluster import split_layers
from specmesh.host.provision.drafters import expected_alpha
from specmesh.shared.modelfile import HEADER_SIZE, parse_header
from specmesh.tools.heldout import PROMPT_SETS, prompt_set

ANCHOR_TOK_S = 19.13  # DaveBben/esp32-llm, stories260K in C on an ESP32-S3
NEW = 64
PROMPTS = 8
VERIFIER = ROLE_CLASS["verifier"]  # the board whose heap holds the target (PSRAM)
PLACES = {"esp32 board": ESP32.name, "esp32s3 board": ESP32S3.name, "host cpu": None}
DRAFTERS = {ESP32.drafter: tuple(PLACES), ESP32S3.drafter: tuple(PLACES), HOST_DRAFTER_FILE: ("host cpu",)}  # where each drafts
HEADLINE = {"classic-ESP32 drafter board": (ESP32.drafter, "esp32 board"), "host cpu (--drafter cpu)": (
    HOST_DRAFTER_FILE, "host cpu")}  # the per-prompt tables of both held-out sets (native kernels)
HELDOUT_PROMPTS = 16  # per set in the held-out tables (the report set whole)
STAGES = 5


def drafter(name: str, stops: bool) -> LocalDrafter:
    """Drafter `name` as the run has it: `stops`, the host drafter of one verifier (`--drafter cpu`, gamma auto),
    ends a greedy block at an unsure draft (host/cli/session.py `_stop_margin`); standing for a board, or
    drafting for stages, it drafts every draft asked for."""
    return LocalDrafter(MODELS / name, stop_margin=UNSURE_MARGIN if stops else 0)


def header(name: str):
    return parse_header((MODELS / name).read_bytes()[:HEADER_SIZE])


def speculate(proj, prompts: list[list[int]], ver, dra, name: str) -> dict:
    """Greedy runs of `prompts` with gamma auto on `proj`'s projected costs, from the acceptance the model card
    gives drafter `name` (as `specmesh run` starts it); their projection summed, and each prompt's (`per_prompt`:
    the drafter's alpha, tau, speed-up over plain, plain rounds, rounds that verified copied drafts instead
    (host/decode/lookup.py); `mean_speedup` and `worst_speedup` over them)."""
    spec = plain = tokens = 0.0
    acc = tested = rounds = 0  # drafts accepted, drafts tested, rounds
    rows = []
    for p in prompts:
        c = GammaController()
        c.expect(expected_alpha(name, greedy=True))
        c.pipelined = proj.pipelined
        r = generate(p, ver, dra, SessionParams(), NEW, c, Observer(costs=proj.round_costs,
                                                                    verify_by_shape=proj.verify_by_shape))
        out = proj.project(r, len(p))
        n = sum(x.n_committed for x in r.rounds)
        one_plain = out.get("plain_wall_s", 0.0) or sum(proj.single.plain_round(len(p) + i) for i in range(n))
        spec += out["wall_s"]
        plain += one_plain
        tokens += n
        acc += r.accepted
        tested += r.tested
        rounds += len(r.rounds)
        rows.append({"alpha": r.accepted / r.tested if r.tested else None, "tau": n / len(r.rounds),
                     "speedup": one_plain / out["wall_s"], "plain_rounds": sum(1 for x in r.rounds if not x.gamma),
                     "copied_rounds": r.lookups})
    return {"tokens_per_s": tokens / spec, "plain_tokens_per_s": tokens / plain, "speedup": plain / spec,
            "alpha": acc / tested if tested else None, "tau": tokens / rounds, "tokens": tokens, "per_prompt": rows,
            "mean_speedup": sum(x["speedup"] for x in rows) / len(rows), "worst_speedup": min(x["speedup"] for x in rows)}


def heldout(target, ver, tok) -> dict:
    """Both held-out sets (tools/heldout.py) on the HEADLINE configurations, native kernels: set -> config -> row."""
    out: dict = {}
    for set_name in PROMPT_SETS:
        prompts = prompt_set(set_name, MODELS, tok, HELDOUT_PROMPTS)
        for config, (name, place) in HEADLINE.items():
            h = header(name)
            cls = PLACES[place]
            dra = drafter(name, cls is None)
            own = cls is not None and BOARD_CLASSES[cls].drafter == name and BOARD_CLASSES[cls].drafter_ctx
            dra.max_seq = min(h.max_seq, own or h.max_seq)
            proj = Projector(target, h, VERIFIER, kernels="native", drafter_on_host=cls is None,
                             drafter_board=cls or ROLE_CLASS["drafter"], drafter_table=dra.table is not None)
            out.setdefault(set_name, {})[config] = speculate(proj, prompts, ver, dra, name) | {"drafter": name}
    return out


def run() -> dict:
    target = header(TARGET_FILE)
    tok = Tokenizer.from_llama2c(MODELS / "tokenizer.bin")
    prompts = prompt_set(PROMPT_SETS[0], MODELS, tok, PROMPTS)
    ver = LocalVerifier(MODELS / TARGET_FILE)
    out: dict = {"anchor_tok_s": ANCHOR_TOK_S, "prompts": len(prompts), "new_tokens": NEW, "boards": {},
                 "derivation": {}, "drafters": {}, "pipeline": {}}
    for kernels in KERNELS:
        plain_terms: dict[str, float] = {}
        proj = Projector(target, None, VERIFIER, kernels=kernels)
        n = 0
        for p in prompts:
            for i in range(NEW):
                for t, s in proj.plain_terms(len(p) + i).items():
                    plain_terms[t] = plain_terms.get(t, 0.0) + s
                n += 1
        total = sum(plain_terms.values())
        label = "%s, %s kernels" % (BOARDS[VERIFIER].name, kernels)
        out["boards"][label] = {"plain": n / total}
        # v(k): a k-position verify pass over a one-position pass, at 40 cached positions, weight stream included
        one = proj.forward(target, 1, 40)
        out.setdefault("v", {})[label] = {k: proj.forward(target, k, 39 + k) / one for k in range(1, 9)}
        out["derivation"][label] = {t: {"ms_per_token": 1e3 * s / n, "share": s / total}
                                    for t, s in sorted(plain_terms.items(), key=lambda kv: -kv[1])}
        for name, places in DRAFTERS.items():
            h = header(name)
            for place in places:
                cls = PLACES[place]
                dra = drafter(name, cls is None)
                # a board keeps the context its class allows its own drafter (host/boardclasses.py drafter_ctx)
                own = cls is not None and BOARD_CLASSES[cls].drafter == name and BOARD_CLASSES[cls].drafter_ctx
                dra.max_seq = min(h.max_seq, own or h.max_seq)
                proj = Projector(target, h, VERIFIER, kernels=kernels, drafter_on_host=cls is None,
                                 drafter_board=cls or ROLE_CLASS["drafter"], drafter_table=dra.table is not None)
                row = speculate(proj, prompts, ver, dra, name)
                row["c"] = proj.draft_passes(40, 1)[0] / proj.forward(target, 1, 40)  # at context 40
                out["drafters"].setdefault(kernels, {}).setdefault(name, {})[place] = row
        best = out["drafters"][kernels][ESP32.drafter]["esp32 board"]
        out["boards"][label]["speculative, classic-ESP32 drafter board"] = best["tokens_per_s"]
        out["boards"][label]["speculative, host cpu drafter"] = out["drafters"][kernels][HOST_DRAFTER_FILE][
            "host cpu"]["tokens_per_s"]
        layers = split_layers(target.n_layers, STAGES)
        for cls in STAGE_LINKS:
            for place, name, on_host in (("esp32 board", ESP32.drafter, False), ("host cpu", HOST_DRAFTER_FILE, True)):
                dra = drafter(name, False)
                pp = PipelineProjector(target, header(name), layers, STAGE_LINKS[cls][0], on_host, kernels, cls,
                                       drafter_table=dra.table is not None)
                dra.max_seq = ESP32.drafter_ctx if name == ESP32.drafter else dra.max_seq
                row = speculate(pp, prompts, ver, dra, name)
                row["hardware"] = pp.label()
                out["pipeline"].setdefault(kernels, {})["%s, drafts on the %s" % (cls, place)] = row
    out["heldout"] = heldout(target, ver, tok)
    _print(out)
    return out


def _print_heldout(sets: dict) -> None:
    for set_name, configs in sets.items():
        print("\nheld-out set %s (%s), ESP32-S3 verifier, native kernels, %d greedy tokens a prompt" % (
            set_name, "tuning" if set_name == PROMPT_SETS[0] else "report: never tuned on", NEW))
        for config, row in configs.items():
            print("  %s (%s): mean speed-up %.2fx, worst prompt %.2fx, alpha %.3f, tau %.2f" % (
                config, row["drafter"], row["mean_speedup"], row["worst_speedup"], row["alpha"] or 0.0, row["tau"]))
            print("    %6s %7s %6s %8s %6s %6s" % ("prompt", "alpha", "tau", "speed-up", "plain", "copied"))
            for i, p in enumerate(row["per_prompt"]):
                print("    %6d %7.3f %6.2f %7.2fx %6d %6d" % (i, p["alpha"] or 0.0, p["tau"], p["speedup"],
                                                          p["plain_rounds"], p["copied_rounds"]))


def _print(out: dict) -> None:
    print("stories260K projected on boards (host/projection/hardware.py, derived), %d held-out prompts x %d tokens, "
          "greedy, gamma auto on the projected costs; anchor: esp32-llm in C" % (out["prompts"], out["new_tokens"]))
    print("%-58s %8.2f tok/s (measured by esp32-llm)" % ("esp32-llm, C, ESP32-S3", ANCHOR_TOK_S))
    for board, modes in out["boards"].items():
        for mode, value in modes.items():
            print("%-58s %8.2f tok/s (projected)" % ("%s, %s" % (board, mode), value))
    for board, v in out["v"].items():
        print("%s: v(k) = %s" % (board, ", ".join("v(%d) %.2f" % kv for kv in v.items())))
    for kernels, table in out["drafters"].items():
        print("\ndrafters on an ESP32-S3 verifier, %s kernels: alpha, c (drafter pass / target step), speed-up "
              "over plain" % kernels)
        for name, places in table.items():
            for place, row in places.items():
                print("  %-18s %-14s alpha %.3f  tau %.2f  c %5.2f  %6.2f tok/s  %.2fx" % (
                    name, place, row["alpha"] or 0.0, row["tau"], row["c"], row["tokens_per_s"], row["speedup"]))
    for kernels, configs in out["pipeline"].items():
        for config, row in configs.items():
            print("%s, %s kernels, drafts on the %s: %.2f tok/s, %.2fx one ESP32-S3 plain" % (
                row["hardware"], kernels, config.split("drafts on the ")[1], row["tokens_per_s"], row["speedup"]))
    _print_heldout(out["heldout"])
    for board, rows in out["derivation"].items():
        print("\nderivation of a plain %s token (host/projection/costmodel.py terms, mean over the runs above)" % board)
        print("%-14s %10s %7s" % ("term", "ms/token", "share"))
        for t, row in rows.items():
            print("%-14s %10.2f %6.1f%%" % (t, row["ms_per_token"], 100 * row["share"]))
        print("%-14s %10.2f %6.1f%%" % ("total", sum(r["ms_per_token"] for r in rows.values()), 100.0))

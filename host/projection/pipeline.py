"""Time-faithful projection of a pipeline run: the wavefront replayed as a discrete-event model of real
boards and links (host/projection/hardware.py), next to plain decoding on the same pipeline and on one board.

A run's rounds (host/decode/orchestrator.py `Round`) fix every position each stage computes: a round of gamma
drafts sends gamma + 1 positions (the first round also the prompt: priced apart as `prefill_s`, since the
single board's projection leaves its prefill out too), the last stage judges them in order,
and the host stops sending positions once the verdict is known (judged = accepted + 1, or accepted when
an end-of-stream draft was accepted). The model replays the schedule host/backends/pipeline.py runs, with the host
relaying every position (one request in flight per stage):

    stage s may take position j once the host holds stage s-1's output of j and stage s's reply to j-1;
    it then costs request + compute + reply: the request and reply on stage s's link, the compute
    `Projector.forward(h, 1, ctx, layers=(a, b), classifier=last stage)` on a board of the stages' class
    (a classic ESP32 by default, `--project esp32s3`: ESP32-S3s) plus, on the last stage, one read of the
    classifier from flash (FLASH_FILE_READ) where its heap cannot hold it (host/boardclasses.py
    `stage_keeps_classifier`; firmware/stage_engine.py streams it then);

a round ends when the host holds the verdict and every reply it still waits for. Drafting comes before
the round, as the loop runs it, except for the round's first position (the token the last verdict emitted):
the host sends it out at the verdict and relays it through every stage but the last while the drafts are
made (`lead`). The drafts are made on a drafter board (`Projector` with the drafter on the same link kind),
or, with `drafter_on_host` (`--drafter cpu`), on the host CPU at HOST_DRAFT_POSITION a position, no bus.
Links (STAGE_LINKS, per class): "uart-921600" gives each classic ESP32 its own UART to the host,
"usb-serial-jtag" each ESP32-S3 its own USB; "espnow" reaches each board through a gateway board (USB
serial, then one ESP-NOW hop), so every request and reply pays both; "<serial>+espnow-direct" keeps each
stage on its serial link but passes rows board to board over one ESP-NOW hop (projected only: the host
relays in the emulated run). Rows are packed (shared/rows.py) at their measured size, PACKED_ROW_BYTES.
The drafter board (the class rule's, a classic ESP32) is priced on the stages' link kind.

`plain` replays as many tokens one position per round; `single` is plain decoding on one board that
holds the whole target (an ESP32-S3 with PSRAM: Projector's own plain round). The curve over stages and
gamma (`python -m specmesh.tools.bench pipeline`) replays host-CPU runs of the shipped pair the same way.
"""

from __future__ import annotations

from specmesh.host.boardclasses import BOARD_CLASSES, ESP32, ESP32S3, ROLE_CLASS, classifier_bytes, stage_keeps_classifier
from specmesh.host.decode.orchestrator import Result, Round
from specmesh.host.projection.hardware import (CYCLES_PER_INSN, ESPNOW, FLASH_FILE_READ, LINKS, PACKED_ROW_BYTES,
                                               PACKED_ROW_DIM, ROW_CODEC, UART_921600, USB_SERIAL_JTAG, Link)
from specmesh.shared.rows import row_bytes
from specmesh.host.projection.rounds import (Projector, draft_entries, draft_reply_body, draft_req_body, frame_bytes,
                                             line_bytes, stage_body, stage_reply_body)
from specmesh.shared.modelfile import Header

# the links a stage board of each class reaches the host by, its own serial link first (the projection's top
# figures): a classic ESP32 through its USB-UART bridge, or behind an ESP-NOW gateway; an ESP32-S3 by its own
# USB-Serial-JTAG. Link names are unique across classes: they key the stats' `links`.
# "<serial>+espnow-direct": each stage on its own serial link to the host, rows passed board to board over one
# ESP-NOW hop instead of relayed through the host (projected only: the emulated run relays).
DIRECT = "+espnow-direct"
STAGE_LINKS = {ESP32.name: (UART_921600.name, ESPNOW.name, UART_921600.name + DIRECT),
               ESP32S3.name: (USB_SERIAL_JTAG.name, USB_SERIAL_JTAG.name + DIRECT)}


def judged(r: Round) -> int:
    """Positions the last stage judged in round r before the verdict was known."""
    return r.n_accepted + (1 if r.rejected or r.n_accepted == r.gamma else 0)


class PipelineProjector:
    """Replays rounds on stages of class `board` (default: the class rule's, a classic ESP32) holding `layers`,
    over `link` (one of STAGE_LINKS[board]), the drafts made on a drafter board or, with `drafter_on_host`,
    on the host CPU."""

    # a round's wavefront depends on what the stages judge and on when its drafts arrive: the gamma controller
    # keeps its fit of the rounds it heard (pricing full-accept rounds instead cost the 5-stage runs 2-5%)
    verify_by_shape = False

    def __init__(self, target: Header, drafter: Header | None, layers: list[tuple[int, int]], link: str,
                 drafter_on_host: bool = False, kernels: str = "native", board: str = ROLE_CLASS["stage"],
                 packed: bool = True, drafter_table: bool = False):
        if board not in STAGE_LINKS:
            raise ValueError("no pipeline of %r stages (known: %s)" % (board, ", ".join(STAGE_LINKS)))
        if link not in STAGE_LINKS[board]:
            raise ValueError("a %s stage has no link %r (known: %s)" % (board, link, ", ".join(STAGE_LINKS[board])))
        self.target, self.drafter, self.layers = target, drafter, list(layers)
        self.link_name = link
        self.drafter_on_host = drafter_on_host
        self.direct = link.endswith(DIRECT)  # rows board to board over ESP-NOW, the host link for the rest
        host = link[:-len(DIRECT)] if self.direct else link
        self.hops: tuple[Link, ...] = (USB_SERIAL_JTAG, ESPNOW) if host == ESPNOW.name else (LINKS[host],)
        self.addressed = host == ESPNOW.name  # every board is behind the gateway: frames carry src and dst
        self.boards = Projector(target, drafter, board, kernels=kernels, drafter_on_host=drafter_on_host,
                                drafter_table=drafter_table)
        self.board = self.boards.board
        self.single = Projector(target, None, ROLE_CLASS["verifier"], kernels=kernels)
        # no drafting ahead beside the wavefront (host/decode/ahead.py): a round's first position goes through the
        # stages while its drafts are made (`lead`), which hides most of a fresh block, and a plain round (a shadow
        # block's) costs a whole wavefront for one token (5 S3 stages, the bench's 8 prompts: 97.3 tok/s drafting
        # afresh, 96.5 drafting ahead without shadow blocks, 94.3 with them)
        self.pipelined = False
        # the last stage streams the classifier from its model file every pass unless its heap holds it
        self.cls_held = stage_keeps_classifier(target, BOARD_CLASSES[board], self.layers[-1])
        self.cls_read = 0.0 if self.cls_held else classifier_bytes(target) / FLASH_FILE_READ.value
        # rows between stages: packed (STAGE_PACKED) at their measured size, each end packing or unpacking it
        self.packed = packed
        self.codec = target.dim * ROW_CODEC.value * CYCLES_PER_INSN / self.board.clock_hz.value if packed else 0.0

    def row(self, b: int) -> int:
        """Bytes on the wire of a row of the residual stream leaving layers :b: packed, the measured mean of the
        shipped target's (PACKED_ROW_BYTES; another model's at their widest), else int32."""
        dim = self.target.dim
        if not self.packed:
            return 4 * dim
        return round(PACKED_ROW_BYTES[b]) if dim == PACKED_ROW_DIM and b in PACKED_ROW_BYTES else row_bytes(dim, 4)

    def _wire(self, payload: int) -> float:
        """Seconds of one frame of `payload` bytes from host to board or back (host/projection/rounds.py's sizes)."""
        t = 0.0
        for link in self.hops:
            n = (frame_bytes if link.mtu else line_bytes)(payload, self.addressed)  # radio frames are binary
            t += link.seconds(n)
        return t

    def _hop_in(self, s: int, payload: int) -> float:
        """Seconds of stage s's input: the host's request, or (board to board, after the first) nothing more
        than the previous stage's send (in its _hop_out; the host sends the last stage its drafts beforehand)."""
        return 0.0 if self.direct and s > 0 else self._wire(payload)

    def _hop_out(self, s: int, payload: int) -> float:
        """Seconds of stage s's output: its reply to the host, or (board to board, before the last) one
        ESP-NOW frame to the next stage, the sender busy until its ack (MicroPython's espnow send)."""
        if self.direct and s < len(self.layers) - 1:
            return ESPNOW.seconds(frame_bytes(payload, True))
        return self._wire(payload)

    def _stage(self, s: int, ctx: int, head: bool) -> float:
        """Compute seconds of stage s for one position at context length ctx (rows unpacked and packed in)."""
        last = s == len(self.layers) - 1
        t = self.boards.forward(self.target, 1, ctx, self.layers[s], classifier=last and head)
        return t + (self.cls_read if last and head else 0.0) + self.codec * ((s > 0) + (not (last and head)))

    def wavefront(self, pos: int, n: int, judge_from: int, cut: int, entries: list[int], lead: float = 0.0) -> float:
        """Seconds of one round: positions pos..pos+n-1 through every stage; the last stage judges from
        index judge_from on, the verdict comes with index `cut`; entries[i]: bytes of draft i's entry.
        `lead`: the first position went out that long before the round (at the last verdict, relayed through
        every stage but the last while the drafts were made: host/backends/earlyrelay.py); the round's
        seconds count from the drafts' arrival, the first position's from -lead up to the last stage, which
        needs the drafts to judge it."""
        n_st = len(self.layers)
        held: list[list[float | None]] = [[None] * n for _ in range(n_st)]  # when the host holds s's reply to j
        free = [float("-inf")] * n_st
        verdict = float("inf")
        for j in range(n):
            for s in range(n_st):
                ready = (-lead if j == 0 else 0.0) if s == 0 else held[s - 1][j]
                if ready is None:
                    break
                send = max(ready, free[s], 0.0 if s == n_st - 1 else -lead)  # the last stage needs the drafts
                if j > cut and (send >= verdict and (s == 0 or not self.direct) or self.direct and s == n_st - 1):
                    break  # the verdict is in: later positions are not sent on (board to board: not fed in,
                    # and the last stage, which found it, drops them)
                head = s == n_st - 1 and j >= judge_from
                k = j - judge_from
                a, b = self.layers[s]
                req = stage_body(entries[k] if head and k < len(entries) else 0, 2 if s == 0 else self.row(a))
                rep = stage_reply_body(2 if head else self.row(b))
                held[s][j] = send + self._hop_in(s, req) + self._stage(s, pos + j + 1, head) + self._hop_out(s, rep)
                free[s] = held[s][j]
            if j == cut:
                verdict = held[n_st - 1][j]
        return max(0.0, max(t for row in held for t in row if t is not None))

    def draft_call(self, r: Round) -> float:
        """Wire seconds of round r's DRAFT_REQ (the previous outcome folded in) and DRAFT (none on the host)."""
        if self.drafter_on_host:
            return 0.0
        return self._wire(draft_req_body(r.told)) + self._wire(draft_reply_body(r))

    def draft_seconds(self, r: Round) -> float:
        """The drafter call round r waits for before its wavefront: catch-up, drafts and the guess, and its call;
        none when its drafts were made ahead (host/decode/ahead.py)."""
        if not r.drafter_drafts or r.ready:
            return 0.0
        return (sum(self.boards.draft_passes(r.pos0 - r.base - r.lag, r.lag + r.gamma + r.guessed))
                + self.draft_call(r) + self.boards.reprime_seconds(r))

    def beside_seconds(self, r: Round) -> float:
        """The drafter's call beside round r's wavefront (host/projection/rounds.py): a plain round's shadow
        (catch-up, a pass for it and each draft of its block, its call, a re-prime), or a drafting round's drafts
        made ahead (a pass each from its guess on, and their call)."""
        wire = (lambda body: 0.0) if self.drafter_on_host else self._wire
        if r.shadow:
            return (sum(self.boards.draft_passes(r.pos0 - r.base - r.lag, r.lag + 1 + r.ahead))
                    + wire(draft_req_body(r.told)) + wire(r.shadow_body) + self.boards.reprime_seconds(r))
        if r.drafter_drafts and r.ahead:
            return (sum(self.boards.draft_passes(r.pos0 + r.gamma - r.base, r.ahead)) + wire(draft_req_body(0))
                    + wire(r.ahead_body))
        return 0.0

    def replay(self, rounds: list[Round]) -> list[tuple[float, float, float]]:
        """(draft, verify, overrun) seconds of each round: the drafter call it waited for, its wavefront, and what
        of the drafter's call beside it the wavefront did not hide (as host/projection/rounds.py's replay). The
        first round's prompt is the prefill's (`prefill_seconds`), as the single board's projection leaves it out."""
        out = []
        for i, r in enumerate(rounds):
            t_draft = self.draft_seconds(r)
            # the round's first position went to the first stage at the last verdict, while the drafts were made
            lead = t_draft if i else 0.0
            t_verify = self.wavefront(r.pos0 - 1, r.gamma + 1, 0, judged(r) - 1, draft_entries(r), lead)
            over = max(0.0, self.beside_seconds(r) - t_verify)
            out.append((t_draft + over, t_verify, over))
        return out

    def round_costs(self, r: Round) -> tuple[float, float, float]:
        """(draft, verify, commit) seconds of a round after the first: the gamma controller's cost model (the
        verify's first position sent while the drafts were made)."""
        t_draft = self.draft_seconds(r)
        t_verify = self.wavefront(r.pos0 - 1, r.gamma + 1, 0, judged(r) - 1, draft_entries(r), t_draft)
        return t_draft or (self.beside_seconds(r) if r.shadow else 0.0), t_verify, 0.0

    def prefill_seconds(self, prompt_len: int) -> float:
        """The prompt's positions but its last through every stage, none judged (the first round's catch-up)."""
        n = prompt_len - 1
        return self.wavefront(0, n, n, n, []) if n > 0 else 0.0

    def label(self) -> str:
        """What the figures are of: the stages' class and layers, their link(s), where the classifier is."""
        return "%d %s stages (layers %s), %s, classifier %s" % (
            len(self.layers), self.board.name, " ".join("%d:%d" % ab for ab in self.layers),
            "+".join(link.name for link in self.hops) + (", rows board to board over espnow" if self.direct else ""),
            "in RAM" if self.cls_held else "streamed from flash")

    def project(self, result: Result, prompt_len: int) -> dict:
        """Projected seconds and tokens/s of the decoding (the prompt's prefill apart, `prefill_s`): this run,
        plain decoding on the pipeline, plain on one board (whose projection leaves its prefill out too)."""
        costs = self.replay(result.rounds)
        spec = sum(d + v for d, v, _ in costs)
        n = sum(r.n_committed for r in result.rounds)
        plain = self.plain_seconds(prompt_len, n)
        single = sum(self.single.plain_round(prompt_len + i) for i in range(n))
        return {
            "hardware": self.label(),
            "wall_s": spec,
            "prefill_s": self.prefill_seconds(prompt_len),
            "tokens_per_s": n / spec if spec else 0.0,
            "pipeline_plain_tokens_per_s": n / plain if plain else 0.0,
            "single_board_plain_tokens_per_s": n / single if single else 0.0,
            "speedup_vs_pipeline_plain": plain / spec if spec else 0.0,
            "speedup_vs_single_board_plain": single / spec if spec else 0.0,
            "kernels": "%s (%s)" % (self.boards.kernels.name, self.boards.kernels.source),
            "pipelined_drafting": self.pipelined,
            "ahead_overrun_s": sum(w for _, _, w in costs),
        }

    def plain_seconds(self, prompt_len: int, n: int) -> float:
        """n tokens of plain decoding on the pipeline, one position per round (the prompt's prefill apart)."""
        return sum(self.wavefront(prompt_len - 1 + i, 1, 0, 0, []) for i in range(n))


class LinksReport:
    """A run projected on the pipeline's links: the stats JSON's `projection`, the figures of stages of class
    `board` on its own serial link at the top, each link's under `links` (the classic-ESP32 stages' UART and
    ESP-NOW figures always among them)."""

    def __init__(self, target: Header, drafter: Header | None, layers: list[tuple[int, int]],
                 drafter_on_host: bool = False, kernels: str = "native", board: str = ROLE_CLASS["stage"]):
        self.top = STAGE_LINKS[board][0]
        self.projectors = {link: PipelineProjector(target, drafter, layers, link, drafter_on_host, kernels, cls)
                           for cls in dict.fromkeys((board, ROLE_CLASS["stage"])) for link in STAGE_LINKS[cls]}

    def project(self, result: Result, prompt_len: int) -> dict:
        out = {link: p.project(result, prompt_len) for link, p in self.projectors.items()}
        return {**out[self.top], "links": out}

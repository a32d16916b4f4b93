"""Time-faithful projection of a pipeline run: the wavefront replayed as a discrete-event model of real
boards and links (host/projection/hardware.py), next to plain decoding on the same pipeline and on one board.

A run's rounds (host/decode/orchestrator.py `Round`) fix every position each stage computes: a round of gamma
drafts sends gamma + 1 positions (the first round also the prompt), the last stage judges them in order,
and the host stops sending positions once the verdict is known (judged = accepted + 1, or accepted when
an end-of-stream draft was accepted). The model replays the schedule host/backends/pipeline.py runs, with the host
relaying every position (one request in flight per stage):

    stage s may take position j once the host holds stage s-1's output of j and stage s's reply to j-1;
    it then costs request + compute + reply: the request and reply on stage s's link, the compute
    `Projector.forward(h, 1, ctx, layers=(a, b), classifier=last stage)` plus, on the last stage, one
    read of the classifier from flash (FLASH_FILE_READ: firmware/engine.py streams it);

a round ends when the host holds the verdict and every reply it still waits for. Drafting comes before
the round, as the loop runs it: on a drafter board (`Projector` with the drafter on the same link kind),
or, with `drafter_on_host` (`--drafter cpu`), on the host CPU at HOST_DRAFT_POSITION a position, no bus.
Links: "uart-921600" gives each board its own UART to the host; "espnow" reaches each board through a
gateway board (USB serial, then one ESP-NOW hop), so every request and reply pays both.

`plain` replays as many tokens one position per round; `single` is plain decoding on one board that
holds the whole target (an ESP32-S3 with PSRAM: Projector's own plain round). The curve over stages and
gamma (`python -m specmesh.tools.bench pipeline`) replays host-CPU runs of the shipped pair the same way.
"""

from __future__ import annotations

from specmesh.host.boardclasses import ROLE_CLASS
from specmesh.host.decode.ahead import round_draft
from specmesh.host.decode.orchestrator import Result, Round
from specmesh.host.projection.hardware import ESPNOW, FLASH_FILE_READ, LINKS, UART_921600, USB_SERIAL_JTAG, Link
from specmesh.host.projection.rounds import (Projector, draft_entries, draft_req_body, frame_bytes, line_bytes, stage_body,
                                    stage_reply_body)
from specmesh.shared.modelfile import Header

PIPELINE_LINKS = (ESPNOW.name, UART_921600.name)


def judged(r: Round) -> int:
    """Positions the last stage judged in round r before the verdict was known."""
    return r.n_accepted + (1 if r.rejected or r.n_accepted == r.gamma else 0)


class PipelineProjector:
    """Replays rounds on classic-ESP32 stages holding `layers`, over `link` ("espnow" or "uart-921600"),
    the drafts made on a drafter board or, with `drafter_on_host`, on the host CPU."""

    def __init__(self, target: Header, drafter: Header | None, layers: list[tuple[int, int]], link: str,
                 drafter_on_host: bool = False, kernels: str = "native"):
        if link not in PIPELINE_LINKS:
            raise ValueError("unknown pipeline link %r (known: %s)" % (link, ", ".join(PIPELINE_LINKS)))
        self.target, self.drafter, self.layers = target, drafter, list(layers)
        self.link_name = link
        self.drafter_on_host = drafter_on_host
        self.hops: tuple[Link, ...] = (USB_SERIAL_JTAG, ESPNOW) if link == ESPNOW.name else (LINKS[link],)
        self.addressed = link == ESPNOW.name  # every board is behind the gateway: frames carry src and dst
        self.boards = Projector(target, drafter, ROLE_CLASS["stage"], kernels=kernels, drafter_on_host=drafter_on_host)
        self.board = self.boards.board
        self.single = Projector(target, None, ROLE_CLASS["verifier"], kernels=kernels)
        # a drafter board on its own UART drafts ahead during the wavefront (host/decode/ahead.py); behind the
        # ESP-NOW gateway, which relays every stage's frames between its passes, it does not
        self.pipelined = not drafter_on_host and link == UART_921600.name
        h = target
        self.cls_read = (h.vocab * h.dim + 4 * h.vocab) / FLASH_FILE_READ.value

    def _wire(self, payload: int) -> float:
        """Seconds of one frame of `payload` bytes from host to board or back (host/projection/rounds.py's sizes)."""
        t = 0.0
        for link in self.hops:
            n = (frame_bytes if link.mtu else line_bytes)(payload, self.addressed)  # radio frames are binary
            t += link.seconds(n)
        return t

    def _stage(self, s: int, ctx: int, head: bool) -> float:
        """Compute seconds of stage s for one position at context length ctx."""
        last = s == len(self.layers) - 1
        t = self.boards.forward(self.target, 1, ctx, self.layers[s], classifier=last and head)
        return t + (self.cls_read if last and head else 0.0)

    def wavefront(self, pos: int, n: int, judge_from: int, cut: int, entries: list[int]) -> float:
        """Seconds of one round: positions pos..pos+n-1 through every stage; the last stage judges from
        index judge_from on, the verdict comes with index `cut`; entries[i]: bytes of draft i's entry."""
        n_st = len(self.layers)
        dim4 = 4 * self.target.dim
        held = [[-1.0] * n for _ in range(n_st)]  # time the host holds stage s's reply to position j
        free = [0.0] * n_st
        verdict = float("inf")
        for j in range(n):
            for s in range(n_st):
                ready = 0.0 if s == 0 else held[s - 1][j]
                if ready < 0:
                    break
                send = max(ready, free[s])
                if j > cut and send >= verdict:
                    break  # the verdict is in: later positions are not sent on
                head = s == n_st - 1 and j >= judge_from
                k = j - judge_from
                req = stage_body(entries[k] if head and k < len(entries) else 0, 2 if s == 0 else dim4)
                rep = stage_reply_body(2 if head else dim4)
                held[s][j] = send + self._wire(req) + self._stage(s, pos + j + 1, head) + self._wire(rep)
                free[s] = held[s][j]
            if j == cut:
                verdict = held[n_st - 1][j]
        return max(max(row) for row in held)

    def draft_call(self, r: Round) -> float:
        """Wire seconds of round r's DRAFT_REQ (the previous outcome folded in) and DRAFT (none on the host)."""
        if self.drafter_on_host:
            return 0.0
        return self._wire(draft_req_body(r.lag + 1)) + self._wire(r.draft_body)

    def draft_seconds(self, r: Round) -> float:
        """The drafter's share of round r without drafting ahead: catch-up and drafts, and its call."""
        if not r.gamma:
            return 0.0
        return sum(self.boards.draft_passes(r.pos0 - r.lag, r.lag + r.gamma)) + self.draft_call(r)

    def replay(self, rounds: list[Round], prompt_len: int) -> list[tuple[float, float, float]]:
        """(draft, verify, waste) seconds of each round, drafting ahead where `pipelined` (as
        host/projection/rounds.py's replay: the window is the previous round's wavefront and call)."""
        out = []
        prev: Round | None = None
        window = 0.0
        for i, r in enumerate(rounds):
            pre = prompt_len - 1 if i == 0 else 0
            t_verify = self.wavefront(r.pos0 - 1 - pre, pre + r.gamma + 1, pre, pre + judged(r) - 1, draft_entries(r))
            waste = 0.0
            if self.pipelined and r.gamma and prev is not None and prev.gamma and prev.ahead and not r.lag:
                passes = self.boards.draft_passes(prev.pos0 + prev.gamma, max(prev.ahead, r.gamma + 1))
                wait, waste = round_draft(passes, r.gamma, prev.ahead, window, prev.guess_hit)
                t_draft = wait + self.draft_call(r)
            else:
                t_draft = self.draft_seconds(r)
            out.append((t_draft, t_verify, waste))
            window = t_verify + self.draft_call(r) if r.gamma else 0.0
            prev = r
        return out

    def round_costs(self, r: Round) -> tuple[float, float, float]:
        """(draft, verify, commit) seconds of a round after the first: the gamma controller's cost model."""
        return self.draft_seconds(r), self.wavefront(r.pos0 - 1, r.gamma + 1, 0, judged(r) - 1, draft_entries(r)), 0.0

    def project(self, result: Result, prompt_len: int) -> dict:
        """Projected seconds and tokens/s: this run, plain decoding on the pipeline, plain on one board."""
        costs = self.replay(result.rounds, prompt_len)
        spec = sum(d + v for d, v, _ in costs)
        n = sum(r.n_committed for r in result.rounds)
        plain = self.plain_seconds(prompt_len, n)
        single = sum(self.single.plain_round(prompt_len + i) for i in range(n))
        return {
            "hardware": "%d esp32 stages (layers %s), %s" % (len(self.layers), " ".join(
                "%d:%d" % ab for ab in self.layers), "+".join(link.name for link in self.hops)),
            "wall_s": spec,
            "tokens_per_s": n / spec if spec else 0.0,
            "pipeline_plain_tokens_per_s": n / plain if plain else 0.0,
            "single_board_plain_tokens_per_s": n / single if single else 0.0,
            "speedup_vs_pipeline_plain": plain / spec if spec else 0.0,
            "speedup_vs_single_board_plain": single / spec if spec else 0.0,
            "kernels": "%s (%s)" % (self.boards.kernels.name, self.boards.kernels.source),
            "pipelined_drafting": self.pipelined,
            "ahead_waste_s": sum(w for _, _, w in costs),
        }

    def plain_seconds(self, prompt_len: int, n: int) -> float:
        """n tokens of plain decoding on the pipeline, one position per round (the first also the prompt)."""
        pre = prompt_len - 1
        t = self.wavefront(0, pre + 1, pre, pre, [])
        return t + sum(self.wavefront(prompt_len - 1 + i, 1, 0, 0, []) for i in range(1, n))


class LinksReport:
    """A run projected on both pipeline links: the stats JSON's `projection` (the UART figures at the top,
    each link's under `links`)."""

    def __init__(self, target: Header, drafter: Header | None, layers: list[tuple[int, int]],
                 drafter_on_host: bool = False, kernels: str = "native"):
        self.projectors = {link: PipelineProjector(target, drafter, layers, link, drafter_on_host, kernels)
                           for link in PIPELINE_LINKS}

    def project(self, result: Result, prompt_len: int) -> dict:
        out = {link: p.project(result, prompt_len) for link, p in self.projectors.items()}
        return {**out[UART_921600.name], "links": out}

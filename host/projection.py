"""Time-faithful projection: what a run's rounds would cost on real boards and links.

A run's trace (host/orchestrator.py `Round`s: gamma, accepted, committed, context length, q-hat sizes)
fully determines the work each board does and every byte on the bus, so the projection replays it in
virtual time with the constants of host/hardware.py instead of sleeping:

- a forward pass over k positions at context length L costs what host/costmodel.py counts for it (the
  matmuls by positions per weight load, every non-matmul step of the engine, the attention's reads of
  the KV cache, the interpreted calls between kernels, and one read of the weights, and of the KV
  cache, from PSRAM when the model does not fit internal SRAM), priced by host/calibration.py's
  `Rates`: derived from host/hardware.py, or measured on a board (`--calibration FILE`);
- drafting gamma tokens is gamma one-position passes, after one per token committed while the drafter
  was idle (plain rounds); its prefill of the prompt at BEGIN runs while the verifier prefills the same
  prompt in the first round, and a drafter position costs a fraction of a target's, so it adds no time;
- each call is a request and a reply whose sizes are computed with the real codec (`:`-base64 lines),
  carried by the transport's link(s): serial = each board on its own USB link; espnow = the drafter
  board is the gateway on USB (as in host/cluster.py) and the verifier is one ESP-NOW hop further;
- the COMMITs after a verdict go to both boards at once (host/boards.py), so a round pays the slower;
- pipelined drafting (`--spec-ahead`) is not credited: the projection is conservative there.

`Projector.round_costs` gives the (draft, verify, commit) seconds of a round, which is what the gamma
controller is fed under `--project`, so gamma is chosen for the projected hardware. Figures are
labelled "projected" wherever they are shown.
"""

from __future__ import annotations

from host.calibration import Rates
from host.costmodel import SRAM_BUDGET, layer_span, pass_work, weight_bytes
from host.hardware import BOARDS, ESPNOW, USB_SERIAL_JTAG, Board, Link
from host.orchestrator import Result, Round
from shared.modelfile import Header

__all__ = ["SRAM_BUDGET", "Projector", "draft_body", "line_bytes", "macs_per_position", "weight_bytes"]
FRAME_OVERHEAD = 11 + 2  # header + CRC (shared/codec.py), unsigned frames


def line_bytes(payload: int) -> int:
    """Bytes on a stream link for one frame with `payload` bytes: ':' + base64 + newline."""
    return 2 + 4 * -(-(payload + FRAME_OVERHEAD) // 3)


def macs_per_position(h: Header, ctx: int, layers: tuple[int, int] | None = None, classifier: bool = True) -> int:
    """Multiply-accumulates of one position at context length ctx (matvecs + attention) in layers
    a..b-1 when layers = (a, b) (all when None), plus the vocab x dim classifier when `classifier`."""
    a, b = layer_span(h, layers)
    hd = h.head_dim
    q_dim = h.n_heads * hd
    per_layer = h.dim * q_dim * 2 + h.dim * h.kv_dim * 2 + 3 * h.dim * h.hidden + 2 * q_dim * ctx
    return (b - a) * per_layer + (h.vocab * h.dim if classifier else 0)


def draft_body(gamma: int, q_ids: int) -> int:
    return 5 + 3 * gamma + 4 * q_ids


class Projector:
    """Replays rounds on `board`-class boards over `transport` ("serial" or "espnow")."""

    def __init__(self, target: Header, drafter: Header | None, board: str = "esp32s3", transport: str = "serial",
                 rates: Rates | None = None):
        if board not in BOARDS:
            raise ValueError("unknown board class %r (known: %s)" % (board, ", ".join(BOARDS)))
        self.board: Board = BOARDS[board]
        self.rates = rates if rates is not None else Rates.derived(self.board)
        self.target = target
        self.drafter = drafter
        self.transport = transport
        self.links: dict[str, tuple[Link, ...]] = {
            "drafter": (USB_SERIAL_JTAG,),
            "verifier": (USB_SERIAL_JTAG, ESPNOW) if transport == "espnow" else (USB_SERIAL_JTAG,),
        }

    def forward(self, h: Header, k: int, ctx: int, layers: tuple[int, int] | None = None,
                classifier: bool = True) -> float:
        """Seconds for one batched pass over k positions ending at context length ctx, through layers
        a..b-1 only when layers = (a, b) (all when None), plus the classifier when `classifier`; the
        board holds just that slice, so its weights stream from PSRAM only when the slice outgrows SRAM."""
        return sum(self.terms(h, k, ctx, layers, classifier).values())

    def terms(self, h: Header, k: int, ctx: int, layers: tuple[int, int] | None = None,
              classifier: bool = True) -> dict[str, float]:
        """forward()'s seconds by term (host/costmodel.py)."""
        return self.rates.times(pass_work(h, k, ctx, layers, classifier))

    def call(self, role: str, request: int, reply: int) -> float:
        """Bus seconds of one request/reply exchange with the `role` board, payloads of these sizes."""
        n = line_bytes(request) + line_bytes(reply)
        return sum(link.seconds(n, messages=2) for link in self.links[role])

    def round_costs(self, r: Round) -> tuple[float, float, float]:
        """(draft, verify, commit) seconds of one round on the projected hardware."""
        t_draft = 0.0
        body = draft_body(r.gamma, r.q_ids)
        if r.gamma:
            assert self.drafter is not None
            # catch-up on tokens committed in plain rounds, then one pass per draft
            t_draft = sum(self.forward(self.drafter, 1, r.pos0 - r.lag + i) for i in range(r.lag + r.gamma))
            t_draft += self.call("drafter", 5, body)
        t_verify = self.forward(self.target, r.gamma + 1, r.pos0 + r.gamma) + self.call("verifier", body, 7)
        commit = self.call("verifier", 6 + 2 * r.committed, 0)
        if r.gamma:
            commit = max(commit, self.call("drafter", 6 + 2 * r.committed, 0))
        return t_draft, t_verify, commit

    def plain_round(self, pos0: int) -> float:
        """Seconds of one round of plain decoding (one position, no drafter) at context length pos0."""
        return sum(self.plain_terms(pos0).values())

    def plain_terms(self, pos0: int) -> dict[str, float]:
        """plain_round's seconds by term: the target's pass (host/costmodel.py) and `bus` (its request,
        reply and commit)."""
        terms = self.terms(self.target, 1, pos0)
        terms["bus"] = self.call("verifier", 5, 7) + self.call("verifier", 8, 0)
        return terms

    def project(self, result: Result, prompt_len: int) -> dict:
        """Projected wall time and tokens/s of the run, and of plain decoding of as many tokens."""
        t = sum(sum(self.round_costs(r)) for r in result.rounds)
        n = sum(r.committed for r in result.rounds)
        plain = sum(self.plain_round(prompt_len + i) for i in range(n))
        bus = sum(self._round_bytes(r) for r in result.rounds)
        return {
            "hardware": "%s boards, %s" % (self.board.name, "+".join(link.name for link in self.links["verifier"])),
            "rates": self.rates.source,
            "wall_s": t,
            "tokens_per_s": n / t if t else 0.0,
            "plain_wall_s": plain,
            "plain_tokens_per_s": n / plain if plain else 0.0,
            "speedup_vs_plain": plain / t if t else 0.0,
            "bus_bytes_per_token": bus / n if n else 0.0,
        }

    def _round_bytes(self, r: Round) -> int:
        body = draft_body(r.gamma, r.q_ids)
        n = line_bytes(body) + line_bytes(7) + line_bytes(6 + 2 * r.committed) + line_bytes(0)
        if r.gamma:
            n += line_bytes(5) + line_bytes(body) + line_bytes(6 + 2 * r.committed) + line_bytes(0)
        return n

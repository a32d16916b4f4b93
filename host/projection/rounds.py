"""Time-faithful projection: what a run's rounds would cost on real boards and links.

A run's trace (host/decode/orchestrator.py `Round`s: gamma, accepted, committed, context length, q-hat sizes)
fully determines the work each board does and every byte on the bus, so the projection replays it in
virtual time with the constants of host/projection/hardware.py instead of sleeping:

- a forward pass over k positions at context length L costs what host/projection/costmodel.py counts for it (the
  matmuls by positions per weight load, every non-matmul step of the engine, the attention's reads of
  the KV cache, the interpreted calls between kernels, and one read of the weights, and of the KV
  cache, from PSRAM when the model does not fit internal SRAM), priced by host/projection/calibration.py's
  `Rates`: derived from host/projection/hardware.py, or measured on a board (`--calibration FILE`);
- drafting gamma tokens is gamma one-position passes at the drafter's own context length (its sliding
  window's, host/decode/window.py), after one per token committed while the drafter was idle (plain rounds);
  a re-primed window costs the drafter its BEGIN exchange and one pass per prefilled position (a drafter
  board's engine takes one position per pass; on the host, HOST_DRAFT_POSITION each); its prefill of the prompt at BEGIN runs while the verifier prefills the same
  prompt in the first round, and a drafter position costs a fraction of a target's, so it adds no time;
- each call is a request and a reply whose sizes are those of the real codec (`:`-base64 lines, the
  compact header: no addresses to the board at a link's end, src and dst to one behind a gateway),
  carried by the transport's link(s): serial = each board on its own console, the one its class's stock build
  has (hardware.CONSOLES: a classic ESP32's UART0 at 115200, the S3's TinyUSB CDC and the C3/C6's USB-Serial/JTAG,
  both with every reply also written to UART0 at 115200); espnow = the drafter board is the gateway on its
  console (as in host/provision/cluster.py) and the verifier is one ESP-NOW hop further; a frame that reaches a
  node on the radio waits half a FreeRTOS tick for it (hardware.FREERTOS_TICK), one on a UART console half the
  period of the node's 1 ms waker timer (hardware.CONSOLE_WAKE, firmware/main.py);
- each request costs the node's own Python besides its kernels: decoding the request line and encoding the reply
  (hardware.NODE_FRAME_INSNS, NODE_FRAME_BYTE_INSNS);
- a round is DRAFT_REQ/DRAFT and VERIFY_REQ/VERDICT (host/backends/board.py), plus, when sampling and a draft
  was rejected, a second VERIFY_REQ/VERDICT carrying that draft's whole q-hat table (the first one
  carries each draft's own weight only); the verdict commits itself on the verifier, and the drafter
  learns the outcome from the next DRAFT_REQ, whose folded COMMIT carries the emitted token and the
  tokens of plain rounds since (`lag`), nothing it proposed itself;
- drafting ahead (host/decode/ahead.py): beside a drafting round's verify the drafter drafts `Round.ahead` drafts
  after the round's guess, on its own link (a DRAFT_REQ/DRAFT and its passes); a round whose drafts were so made
  (`Round.ready`) waits for no drafter at all, and a round whose beside call outlasts its verify waits for the
  rest (the overrun, reported); `pipelined` says whether the controller plans it (a drafter board on its own
  serial link; not behind an ESP-NOW gateway, which relays the verifier's frames between its passes);
- `drafter_on_host` (`--drafter cpu`): the drafts cost HOST_DRAFT_POSITION each on the host, no bus;
- a plain round's shadow draft (`Round.shadow`, host/decode/gamma.py): the drafter's DRAFT_REQ/DRAFT for one
  draft and the `Round.ahead` after it (after its catch-up, `lag`), sent with the VERIFY_REQ and on its own link,
  so the round costs max(verify, shadow): what of the shadow the verify does not hide is the round's draft seconds
  (the decode loop collects the drafter's reply after the verdict: host/decode/orchestrator.py).

`Projector.round_costs` gives the (draft, verify, commit) seconds of a round, which is what the gamma
controller is fed under `--project`, so gamma is chosen for the projected hardware. Figures are
labelled "projected" wherever they are shown.
"""

from __future__ import annotations

from specmesh.host.boardclasses import BOARD_CLASSES, ROLE_CLASS, on_romfs
from specmesh.host.decode.orchestrator import Result, Round
from specmesh.host.projection.calibration import Rates
from specmesh.host.projection.costmodel import KERNELS, SRAM_BUDGET, layer_span, pass_work, weight_bytes
from specmesh.host.projection.hardware import (BOARDS, CONSOLES, ESPNOW, HOST_DRAFT_POSITION, NODE_FRAME_BYTE_INSNS,
                                               NODE_FRAME_INSNS, Board, Link, cpi_of, ngram_lookup_of)
from specmesh.shared.codec import line_size
from specmesh.shared.messages import pack_begin
from specmesh.shared.modelfile import Header

__all__ = ["ADDR_BYTES", "SRAM_BUDGET", "Projector", "draft_entries", "draft_req_body", "frame_bytes", "line_bytes",
           "macs_per_position", "stage_body", "stage_reply_body", "weight_bytes"]
FRAME_OVERHEAD = 2 + 2  # type/flags byte, seq, CRC-16 (shared/codec.py): an unsigned frame of session 0
ADDR_BYTES = 2  # src and dst, on frames to and from a board behind a gateway
PLAIN_BODY = 2  # VERIFY_REQ without drafts: pos0 u16
VERDICT_BODY = 3  # n_accepted u8, token i16
STAGE_HEADER = 4  # STAGE request and reply: pos u16, n u8, flags u8 (shared/messages.py)


def frame_bytes(payload: int, addressed: bool = False) -> int:
    """Binary bytes of one unsigned frame with `payload` bytes (`addressed`: to or from a board behind a
    gateway, with src and dst); what an ESP-NOW hop carries."""
    return payload + FRAME_OVERHEAD + (ADDR_BYTES if addressed else 0)


def line_bytes(payload: int, addressed: bool = False) -> int:
    """Bytes on a stream link for one frame with `payload` bytes: ':' + unpadded base64 + newline."""
    return line_size(frame_bytes(payload, addressed))


def draft_req_body(tail: int) -> int:
    """DRAFT_REQ payload: length u16, gamma u8 and the folded COMMIT's `tail` tokens (u16 each)."""
    return 3 + 2 * tail


def draft_reply_body(r: Round) -> int:
    """DRAFT payload of round r's fresh drafts: the drafts' body, and the guess's entry after them when the round
    drafted ahead."""
    return r.draft_body + r.guess_body


def begin_body(prompt: int) -> int:
    """BEGIN payload with a prompt of `prompt` tokens (a drafter's re-prime carries its window)."""
    return len(pack_begin(0, 0, 0, 0, 0, -1, [0] * prompt))


def draft_entries(r: Round) -> list[int]:
    """Bytes of each of round r's draft entries as a DRAFT body encodes them (whole q-hat tables, or
    tokens alone when greedy): the DRAFT body's after its pos0 and count byte, spread evenly."""
    if not r.gamma:
        return []
    q, extra = divmod(r.draft_body - 3, r.gamma)
    return [q + (i < extra) for i in range(r.gamma)]


def stage_body(entry: int, data: int) -> int:
    """STAGE request payload for one position: header, the count byte, its draft entry's bytes (0: none)
    and `data` bytes of input (a u16 token, or a row of the residual stream)."""
    return STAGE_HEADER + 1 + entry + data


def stage_reply_body(data: int) -> int:
    """STAGE reply payload: header and `data` bytes (an i16 result per position, or rows)."""
    return STAGE_HEADER + data


def macs_per_position(h: Header, ctx: int, layers: tuple[int, int] | None = None, classifier: bool = True) -> int:
    """Multiply-accumulates of one position at context length ctx (matvecs + attention) in layers
    a..b-1 when layers = (a, b) (all when None), plus the vocab x dim classifier when `classifier`."""
    a, b = layer_span(h, layers)
    hd = h.head_dim
    q_dim = h.n_heads * hd
    per_layer = h.dim * q_dim * 2 + h.dim * h.kv_dim * 2 + 3 * h.dim * h.hidden + 2 * q_dim * ctx
    return (b - a) * per_layer + (h.vocab * h.dim if classifier else 0)


class Projector:
    """Replays rounds on `board`-class boards over `transport` ("serial" or "espnow")."""

    # one verifier: a round's verify costs what its size and position say, whatever its drafts' outcome, so the
    # gamma controller may price each size at the stream's position (host/decode/orchestrator.py Observer)
    verify_by_shape = True

    def __init__(self, target: Header, drafter: Header | None, board: str = "esp32s3", transport: str = "serial",
                 rates: Rates | None = None, kernels: str = "native", drafter_on_host: bool = False,
                 drafter_board: str = ROLE_CLASS["drafter"], drafter_rates: Rates | None = None,
                 drafter_table: bool = False):
        if board not in BOARDS:
            raise ValueError("unknown board class %r (known: %s)" % (board, ", ".join(BOARDS)))
        self.board: Board = BOARDS[board]
        self.rates = rates if rates is not None else Rates.derived(self.board)
        self.kernels = KERNELS[kernels]
        # the drafter board is its own class (a classic ESP32 by default), priced with its derived rates or its
        # own calibration (--drafter-calibration)
        self.drafter_board: Board = BOARDS[drafter_board]
        same = drafter_board == board and rates is not None
        self.drafter_rates = drafter_rates or (rates if same else Rates.derived(self.drafter_board))
        self.target = target
        self.drafter = drafter
        self.transport = transport
        self.drafter_on_host = drafter_on_host
        b = self.drafter_board  # with a table, each draft's n-gram lookup on it (shared/ngram.py), in seconds
        self.lookup_s = ngram_lookup_of(b.name).value * cpi_of(b.name).value / b.clock_hz.value if drafter_table else 0.0
        self.pipelined = not drafter_on_host and transport == "serial"
        gateway = CONSOLES[self.drafter_board.name]  # the drafter board is the gateway on ESP-NOW
        self.links: dict[str, tuple[Link, ...]] = {
            "drafter": (gateway,),
            "verifier": (gateway, ESPNOW) if transport == "espnow" else (CONSOLES[self.board.name],),
        }

    def forward(self, h: Header, k: int, ctx: int, layers: tuple[int, int] | None = None,
                classifier: bool = True) -> float:
        """Seconds for one batched pass over k positions ending at context length ctx, through layers
        a..b-1 only when layers = (a, b) (all when None), plus the classifier when `classifier`, on a
        `board`-class board; it holds just that slice, so its weights stream from PSRAM only when the
        slice outgrows SRAM, and from its ROMFS when it is a whole model its heap cannot hold."""
        return sum(self.terms(h, k, ctx, layers, classifier).values())

    def terms(self, h: Header, k: int, ctx: int, layers: tuple[int, int] | None = None,
              classifier: bool = True, board: Board | None = None) -> dict[str, float]:
        """forward()'s seconds by term (host/projection/costmodel.py), on `board` (default: the projector's)."""
        board = board or self.board
        rates = self.rates if board is self.board else self.drafter_rates
        romfs = on_romfs(h, BOARD_CLASSES[board.name], layers)
        return rates.times(pass_work(h, k, ctx, layers, classifier, romfs, self.kernels))

    def draft_pass(self, ctx: int) -> float:
        """Seconds of one drafter pass at context length ctx on the drafter board."""
        assert self.drafter is not None
        return sum(self.terms(self.drafter, 1, ctx, board=self.drafter_board).values())

    def exchange(self, role: str, request: int, reply: int) -> int:
        """Line bytes of one request/reply exchange with the `role` board, payloads of these sizes."""
        addressed = role == "verifier" and len(self.links["verifier"]) > 1  # behind the gateway
        return line_bytes(request, addressed) + line_bytes(reply, addressed)

    def call(self, role: str, request: int, reply: int) -> float:
        """Seconds of one request/reply exchange with the `role` board, payloads of these sizes: the bus, and the
        node's own Python for the two frames."""
        addressed = role == "verifier" and len(self.links["verifier"]) > 1  # behind the gateway
        up, down = line_bytes(request, addressed), line_bytes(reply, addressed)
        board = self.board if role == "verifier" else self.drafter_board
        insns = NODE_FRAME_INSNS.value + NODE_FRAME_BYTE_INSNS.value * (frame_bytes(request, addressed)
                                                                        + frame_bytes(reply, addressed))
        return (sum(link.exchange_seconds(up, down) for link in self.links[role])
                + insns * cpi_of(board.name).value / board.clock_hz.value)

    def draft_passes(self, pos: int, n: int) -> list[float]:
        """Seconds of n one-position drafter passes from position pos on (on the host: HOST_DRAFT_POSITION)."""
        if self.drafter_on_host:
            return [HOST_DRAFT_POSITION.value] * n
        return [self.draft_pass(pos + i) + self.lookup_s for i in range(n)]

    def reprime_seconds(self, r: Round) -> float:
        """Seconds of round r's re-prime of the drafter's window (0 without one): its BEGIN exchange (the ACK is
        empty) and the prefill of all but the window's last token, one pass each."""
        if not r.reprime:
            return 0.0
        bus = 0.0 if self.drafter_on_host else self.call("drafter", begin_body(r.reprime), 0)
        return bus + sum(self.draft_passes(0, r.reprime - 1))

    def draft_call(self, r: Round) -> float:
        """Bus seconds of round r's DRAFT_REQ and DRAFT (none for a drafter on the host; the DRAFT carries the guess
        after the drafts when the round drafted ahead)."""
        return 0.0 if self.drafter_on_host else self.call("drafter", draft_req_body(r.told), draft_reply_body(r))

    def shadow_seconds(self, r: Round) -> float:
        """Seconds of round r's shadow draft (0 without one): its catch-up and a pass for the shadow and each draft
        of its block after it, its call, a re-prime."""
        if not r.shadow:
            return 0.0
        call = 0.0 if self.drafter_on_host else self.call("drafter", draft_req_body(r.told),
                                                          r.shadow_body)
        return (sum(self.draft_passes(r.pos0 - r.base - r.lag, r.lag + 1 + r.ahead)) + call
                + self.reprime_seconds(r))

    def ahead_seconds(self, r: Round) -> float:
        """Seconds of a drafting round's call beside its verify (0 without one): a DRAFT_REQ with nothing to tell
        (the drafter holds the round's drafts and guess), `Round.ahead` passes from the guess on, the DRAFT."""
        if not r.drafter_drafts or not r.ahead:
            return 0.0
        call = 0.0 if self.drafter_on_host else self.call("drafter", draft_req_body(0), r.ahead_body)
        return sum(self.draft_passes(r.pos0 + r.gamma - r.base, r.ahead)) + call

    def beside_seconds(self, r: Round) -> float:
        """Seconds of the drafter's call beside round r's verify: its shadow, or its drafts ahead."""
        return self.shadow_seconds(r) if not r.drafter_drafts else self.ahead_seconds(r)

    def verify_seconds(self, r: Round) -> float:
        t = self.forward(self.target, r.gamma + 1, r.pos0 + r.gamma) + self.call("verifier", r.verify_body,
                                                                                 VERDICT_BODY)
        if r.table_body:
            t += self.call("verifier", r.table_body, VERDICT_BODY)
        return t

    def round_costs(self, r: Round) -> tuple[float, float, float]:
        """(draft, verify, commit) seconds of one round on the projected hardware, its drafter call one after the
        verify: what the gamma controller fits (no COMMIT is sent: the verdict commits itself and the next
        DRAFT_REQ carries the drafter's): a fresh DRAFT (catch-up on tokens committed in plain rounds, a pass per
        draft and for the guess, the re-prime of the drafter's window when the round had one), or the shadow call;
        none for drafts made ahead."""
        t_draft = self.shadow_seconds(r)  # a plain round's shadow draft (the controller's draft fit hears it)
        if r.drafter_drafts:
            t_draft = 0.0 if r.ready else (sum(self.draft_passes(r.pos0 - r.base - r.lag, r.lag + r.gamma + r.guessed))
                                           + self.draft_call(r) + self.reprime_seconds(r))
        return t_draft, self.verify_seconds(r), 0.0

    def replay(self, rounds: list[Round]) -> list[tuple[float, float, float]]:
        """(draft, verify, overrun) seconds of each round: the drafter call the round waited for before its verify
        (none when its drafts were made ahead, or for a plain round), then its verify, beside which the drafter's
        shadow or its drafts ahead ran; what of that call the verify does not hide (the overrun) is part of the
        draft seconds."""
        out = []
        for r in rounds:
            t_verify = self.verify_seconds(r)
            over = max(0.0, self.beside_seconds(r) - t_verify)
            out.append(((self.round_costs(r)[0] if r.drafter_drafts else 0.0) + over, t_verify, over))
        return out

    def plain_round(self, pos0: int) -> float:
        """Seconds of one round of plain decoding (one position, no drafter) at context length pos0."""
        return sum(self.plain_terms(pos0).values())

    def plain_terms(self, pos0: int) -> dict[str, float]:
        """plain_round's seconds by term: the target's pass (host/projection/costmodel.py) and `bus` (its request and
        the verdict, which commits itself)."""
        terms = self.terms(self.target, 1, pos0)
        terms["bus"] = self.call("verifier", PLAIN_BODY, VERDICT_BODY)
        return terms

    def project(self, result: Result, prompt_len: int) -> dict:
        """Projected wall time and tokens/s of the run, and of plain decoding of as many tokens."""
        costs = self.replay(result.rounds)
        t = sum(d + v for d, v, _ in costs)
        n = sum(r.n_committed for r in result.rounds)
        plain = sum(self.plain_round(prompt_len + i) for i in range(n))
        link = {"drafter": 0, "verifier": 0}
        drafted = False  # the first draft of a stream has no earlier round's outcome to carry
        for r in result.rounds:
            for role, b in self.round_bytes(r, drafted).items():
                link[role] += b
            drafted = drafted or r.drafter_drafts > 0 or r.shadow
        return {
            "hardware": "%s boards (%s), %s" % (self.board.name, self.board.stock,
                                                "+".join(link.name for link in self.links["verifier"])),
            "rates": self.rates.source,
            "drafter_rates": None if self.drafter_on_host else self.drafter_rates.source,
            "kernels": "%s (%s)" % (self.kernels.name, self.kernels.source),
            "drafter": "host cpu" if self.drafter_on_host else "%s board" % self.drafter_board.name,
            "wall_s": t,
            "tokens_per_s": n / t if t else 0.0,
            "plain_wall_s": plain,
            "plain_tokens_per_s": n / plain if plain else 0.0,
            "speedup_vs_plain": plain / t if t else 0.0,
            "pipelined_drafting": self.pipelined,
            "ready_rounds": result.ready_rounds,
            "ahead_drafts": sum(r.ahead for r in result.rounds),
            "ahead_overrun_s": sum(w for _, _, w in costs),
            "shadow_drafts": result.shadows,
            "shadow_hits": result.shadow_hits,
            "lookup_rounds": result.lookups,
            "bus_bytes_per_token": (link["drafter"] + link["verifier"]) / n if n else 0.0,
            "verifier_bytes_per_token": link["verifier"] / n if n else 0.0,
            "drafter_bytes_per_token": link["drafter"] / n if n else 0.0,
        }

    def round_bytes(self, r: Round, drafted_before: bool = True) -> dict[str, int]:
        """Line bytes of one round on the host's link to each board (`drafted_before`: the drafter has
        proposed earlier in the stream, so the round's DRAFT_REQ carries that round's emitted token)."""
        out = {"drafter": 0, "verifier": self.exchange("verifier", r.verify_body, VERDICT_BODY)}
        if r.table_body:
            out["verifier"] += self.exchange("verifier", r.table_body, VERDICT_BODY)
        if r.drafter_drafts and not r.ready:  # (a re-primed drafter holds the stream: its DRAFT_REQ carries no tail)
            out["drafter"] = self.exchange("drafter", draft_req_body(r.told if drafted_before else r.lag),
                                           draft_reply_body(r))
        if r.drafter_drafts and r.ahead:  # the drafts made ahead beside the verify
            out["drafter"] += self.exchange("drafter", draft_req_body(0), r.ahead_body)
        if r.shadow:
            out["drafter"] = self.exchange("drafter", draft_req_body(r.told if drafted_before else r.lag),
                                           r.shadow_body)
        if r.reprime:
            out["drafter"] += self.exchange("drafter", begin_body(r.reprime), 0)
        return out

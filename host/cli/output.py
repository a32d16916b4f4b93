"""What a user sees of a run: the text streamed as it is committed, the stats table, the stats JSON.

Accepted draft tokens are shown in green and tokens the target emitted itself in the default colour,
only when the stream is a terminal (`color=None` decides from `isatty`). Token bytes go through an
incremental UTF-8 decoder, so a character split across tokens is printed once it is whole.

The stats JSON is a stable contract for scripts (docs of `specmesh run --stats-json`): it always holds
`text, tokens, alpha, tokens_per_verification, gamma, wall_s, tokens_per_s, bus_bytes_per_token,
verifier, drafter`, plus more detail (`gamma_hist`, `boards`, `projection`, ...).
"""

from __future__ import annotations

import codecs
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import IO

from specmesh.host import atomic
from specmesh.host.decode.stopstrings import StopStrings

FEW = 5  # samples below which a figure is left out of the table (with the count) rather than shown
GREEN = "\x1b[32m"
RESET = "\x1b[0m"
REQUIRED_KEYS = ("text", "tokens", "alpha", "tokens_per_verification", "gamma", "wall_s", "tokens_per_s",
                 "bus_bytes_per_token", "verifier", "drafter")


class TextStream:
    """The committed tokens as text, kept for a stream's reader; `piece(id) -> bytes` gives a token's bytes.

    `write` takes a round and returns what may be shown of it now, as segments (text, was an accepted draft).
    With `stops` (host/decode/stopstrings.py) the text ends before the first stop string, and an ending
    that could begin one is held back until the next tokens tell."""

    def __init__(self, piece: Callable[[int], bytes], stops: StopStrings | None = None):
        self.piece = piece
        self.stops = stops or StopStrings(())
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._text_so_far = ""  # the generated text (with stops: what is shown, then what is held back)
        self._green: list[tuple[int, int]] = []  # spans of it that are accepted drafts
        self._shown = 0
        self.stopped = False  # a stop string was reached: nothing more is shown

    def _text(self, ids: Sequence[int]) -> str:
        return self._utf8.decode(b"".join(self.piece(t) for t in ids))

    def write(self, accepted: Sequence[int], emitted: Sequence[int]) -> list[tuple[str, bool]]:
        """One round: drafts the target accepted, then the tokens it emitted itself; returns what to show."""
        a, e = self._text(accepted), self._text(emitted)
        if self.stopped:
            return []
        start = len(self._text_so_far)
        self._text_so_far += a + e
        if a:
            self._green.append((start, start + len(a)))
        cut = self.stops.cut(self._text_so_far)
        self.stopped = cut is not None
        return self._show(cut if cut is not None else self.stops.showable(self._text_so_far))

    def _show(self, end: int) -> list[tuple[str, bool]]:
        """The text from what was shown up to `end`, split where accepted drafts begin and end."""
        begin, text = self._shown, self._text_so_far
        if end <= begin:
            return []
        parts, at = [], begin
        for g0, g1 in self._green:
            g0, g1 = max(g0, at), min(g1, end)
            if g0 < g1:
                parts += [(text[at:g0], False), (text[g0:g1], True)]
                at = g1
        parts.append((text[at:end], False))
        self._shown = end
        return [(t, draft) for t, draft in parts if t]

    def finish(self) -> list[tuple[str, bool]]:
        """What was held back, once the stream has ended (a partial character, a possible stop string's start)."""
        if self.stopped:
            return []
        self._text_so_far += self._utf8.decode(b"", final=True)
        return self._show(len(self._text_so_far))


class TokenStream:
    """Writes committed tokens to `out` as a TextStream shows them: accepted drafts in green when colouring
    (`color=None`: when `out` is a terminal and NO_COLOR is unset), a newline at the end."""

    def __init__(self, piece: Callable[[int], bytes], out: IO[str] | None = None, color: bool | None = None,
                 stops: StopStrings | None = None):
        self.out = out if out is not None else sys.stdout
        if color is None:
            color = hasattr(self.out, "isatty") and self.out.isatty() and "NO_COLOR" not in os.environ
        self.color = color
        self.text = TextStream(piece, stops)

    @property
    def stopped(self) -> bool:
        """A stop string was reached: nothing more is shown."""
        return self.text.stopped

    def write(self, accepted: Sequence[int], emitted: Sequence[int]) -> None:
        """Show one round: drafts the target accepted, then the tokens it emitted itself."""
        self.show(self.text.write(accepted, emitted))

    def show(self, segments: Sequence[tuple[str, bool]]) -> None:
        if segments:
            self.out.write("".join(GREEN + t + RESET if draft and self.color else t for t, draft in segments))
            self.out.flush()

    def finish(self) -> None:
        self.show(self.text.finish())
        self.out.write("\n")
        self.out.flush()


def _fmt(v) -> str:
    if isinstance(v, float):
        return "%.3g" % v if abs(v) < 1000 else "%.0f" % v
    if v is None:
        return "-"
    return str(v)


def _stopped(stats: dict) -> str:
    stop = stats.get("stop")
    if stop == "context":
        return "the context: prompt and text fill its %s positions (fewer tokens than --max-tokens)" % (
            stats.get("context") or "")
    return {"eos": "end of text (the model's end token)", "max_tokens": "--max-tokens reached",
            "stop": "a --stop string (the text ends before it)"}.get(stop, str(stop))


def _alpha(stats: dict):
    n = stats.get("alpha_tested")
    if n is None or stats["alpha"] is None:
        return stats["alpha"]
    if n < FEW:
        return "left out: %d draft%s tested, fewer than %d" % (n, "" if n == 1 else "s", FEW)
    return "%s (%d drafts tested)" % (_fmt(stats["alpha"]), n)


def _estimates(est: dict) -> list[tuple[str, object]]:
    """c and v(2), v(5), each with the timed rounds behind it, or left out when fewer than FEW rounds back
    it (v(k) also when k is beyond the sizes measured that often: it would be an extrapolation)."""
    n = est.get("drafting_rounds", FEW)
    c = est.get("cost_ratio_c")
    rows: list[tuple[str, object]] = [("drafter cost c", "%s (%d drafting rounds)" % (_fmt(c), n) if n >= FEW else
                                       "left out: %d drafting round%s timed, fewer than %d" % (n, "s" * (n != 1), FEW))]
    v = est.get("verify_v") or []
    counts = {int(k): c for k, c in (est.get("verified") or {}).items()}
    sizes = sorted(k for k, c in counts.items() if c >= FEW)
    for k in (2, 5):
        if len(sizes) >= 2 and k <= sizes[-1] and len(v) >= k:
            rows.append(("verify cost v(%d)" % k, "%s (fit over %d rounds of %s positions)" % (
                _fmt(v[k - 1]), sum(counts.values()), "/".join(map(str, sorted(counts))))))
        elif len(sizes) < 2:
            rows.append(("verify cost v(%d)" % k, "left out: %s measured %d+ times; a slope needs two" % (
                "only size %d" % sizes[0] if sizes else "no size", FEW)))
        else:
            rows.append(("verify cost v(%d)" % k, "left out: sizes measured %d+ times end at %d (an extrapolation)"
                         % (FEW, sizes[-1])))
    return rows


def format_table(stats: dict) -> str:
    """The end-of-run table: one figure a line, then one line per board.

    A figure estimated from fewer than FEW samples (alpha from tested drafts; c and v(k) from timed
    rounds) is left out with the reason; the others say how many samples they rest on."""
    hist = stats.get("gamma_hist") or {}
    gamma = ", ".join("%s x%d" % (g, n) for g, n in sorted(hist.items(), key=lambda kv: int(kv[0]))) or "-"
    rows = [
        ("tokens", stats["tokens"]),
        ("stopped by", _stopped(stats)),
        ("acceptance alpha", _alpha(stats) if stats.get("drafter") else stats["alpha"]),
        ("tokens / verification", stats["tokens_per_verification"]),
        ("gamma (%s)" % (stats.get("gamma_policy", "auto") + (", %s costs" % stats["gamma_costs"]
                                                             if stats.get("gamma_policy") == "auto" else "")), gamma),
        ("wall time s", stats["wall_s"]),
        ("tokens / s", stats["tokens_per_s"]),
        ("prefill s", "%s (%d prompt tokens, %s tokens / s; up to the first round's tokens)" % (
            _fmt(stats["prefill_s"]), stats["prompt_tokens"], _fmt(stats["prefill_tokens_per_s"]))),
        ("decode tokens / s", "%s (%d tokens in %s s)" % (
            _fmt(stats["decode_tokens_per_s"]), stats["decode_tokens"], _fmt(stats["decode_s"]))),
        ("bus bytes / token", stats["bus_bytes_per_token"]),
        ("verifier", stats["verifier"]),
        ("drafter", stats["drafter"]),
    ]
    est = stats.get("estimates") or {}
    if stats.get("drafter") and est.get("cost_ratio_c") is not None:
        rows += _estimates(est)
    proj = stats.get("projection")
    if proj:
        for link, p in (proj.get("links") or {"": proj}).items():  # a pipeline's: per link
            rows.append(("projected on %s: tokens / s" % p["hardware"], p["tokens_per_s"]))
            if "speedup_vs_plain" in p:
                rows.append(("projected speed-up vs plain", p["speedup_vs_plain"]))
                rows.append(("projected plain tokens / s", p["plain_tokens_per_s"]))
                rows.append(("projection rates", p["rates"]))
                rows.append(("projected kernels", p["kernels"]))
                if p.get("pipelined_drafting"):
                    rows.append(("projected look-ahead (passes past a block)", "%d, %d hits, %.1f ms wasted"
                                 % (p["lookahead"], p["ahead_hits"], 1e3 * p["ahead_waste_s"])))
            else:
                rows.append(("  vs plain on the pipeline (%s)" % link, p["speedup_vs_pipeline_plain"]))
                rows.append(("  vs plain on one esp32s3 board", p["speedup_vs_single_board_plain"]))
    width = max(len(k) for k, _ in rows)
    lines = ["%-*s  %s" % (width, k, _fmt(v)) for k, v in rows]
    boards = stats.get("boards") or []
    if boards:
        names = ["%s (%s)" % (b["name"], b["role"]) for b in boards]
        w = max(len(n) for n in names)
        lines.append("%-*s  %10s %12s %11s %15s  %s" % (w, "board", "compute s", "heap free B", "retransmits",
                                                        "insn / token", "kernels"))
        for name, b in zip(names, boards):
            if "error" in b:
                lines.append("%-*s  stats unavailable: %s" % (w, name, b["error"]))
                continue
            insn = b.get("instructions_per_token")
            kernels = b.get("kernels") or "-"
            if b.get("kernels_note"):
                kernels += " (%s)" % b["kernels_note"]
            lines.append("%-*s  %10s %12s %11s %15s  %s" % (
                w, name, _fmt(b.get("compute_s")), _fmt(b.get("heap_free")), _fmt(b.get("retransmits")),
                "-" if insn is None else "%.0f" % insn, kernels))
    return "\n".join(lines)


def write_stats_json(path: str, stats: dict) -> None:
    """Write the stats JSON (keys REQUIRED_KEYS and more); raises OSError if the file cannot be written."""
    missing = [k for k in REQUIRED_KEYS if k not in stats]
    if missing:
        raise ValueError("stats lack %s" % missing)
    atomic.write_text(path, json.dumps(stats, indent=1, sort_keys=True) + "\n")

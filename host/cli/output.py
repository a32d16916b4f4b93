"""What a user sees of a run: the text streamed as it is committed, the stats table, the stats JSON.

Accepted draft tokens are shown in green and tokens the target emitted itself in the default colour,
only when the stream is a terminal (`color=None` decides from `isatty`). Token bytes go through an
incremental UTF-8 decoder, so a character split across tokens is printed once it is whole.

The stats JSON is a stable contract for scripts (docs of `specmesh run --stats-json`): it always holds
`text, tokens, alpha, tokens_per_verification, gamma, wall_s, tokens_per_s, bus_bytes_per_token,
verifier, drafter`, plus more detail (`gamma_hist`, `boards`, `projection`, ...).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import IO

from specmesh.host import atomic
from specmesh.host.backends import Verifier
from specmesh.host.decode.orchestrator import Costs, Observer
from specmesh.host.decode.stopstrings import StopScan

FEW = 5  # samples below which a figure is left out of the table (with the count) rather than shown
WIDTH = 100  # columns every line of the table fits in (a value or key longer is wrapped)
KEY_WIDTH = 40  # the widest key column; a longer key takes lines of its own
GREEN = "\x1b[32m"
RESET = "\x1b[0m"
REQUIRED_KEYS = ("text", "tokens", "alpha", "tokens_per_verification", "gamma", "wall_s", "tokens_per_s",
                 "bus_bytes_per_token", "verifier", "drafter")


Segments = list[tuple[str, bool]]  # text to show, in order, each part marked True where it was accepted drafts


class TextStream:
    """A stream's committed tokens as the text to show, as its `StopScan` (host/decode/stopstrings.py) decodes
    them: the text ends before the first stop string, and an ending that could begin one is held back until
    the next tokens tell. `write` and `finish` return what may be shown now, as Segments."""

    def __init__(self, scan: StopScan):
        self.scan = scan
        self._green: list[tuple[int, int]] = []  # spans of the scan's text that are accepted drafts
        self._shown = 0

    def write(self, accepted: Sequence[int], emitted: Sequence[int]) -> Segments:
        """One round: drafts the target accepted, then the tokens it emitted itself."""
        scan = self.scan
        start = len(scan.text)
        scan.feed(accepted)
        if len(scan.text) > start:
            self._green.append((start, len(scan.text)))
        scan.feed(emitted)
        return self._upto(scan.showable())

    def _upto(self, end: int) -> Segments:
        """The text from what was shown up to `end`, split where accepted drafts begin and end."""
        begin, text = self._shown, self.scan.text
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

    def finish(self) -> Segments:
        """The stream ended: what was held back (a partial character, a possible stop string's start)."""
        self.scan.finish()
        return self._upto(len(self.scan.final()))


class OutputLost(Exception):
    """The text could not be written where it goes (a full disk behind `>`, a device's error): one line naming it.
    A reader that left (`| head`) is BrokenPipeError instead, which a command ends on quietly."""


class Printer:
    """Writes Segments to `out`, accepted drafts in green when colouring (`color=None`: when `out` is a
    terminal and NO_COLOR is unset)."""

    def __init__(self, out: IO[str] | None = None, color: bool | None = None):
        self.out = out if out is not None else sys.stdout
        if color is None:
            color = hasattr(self.out, "isatty") and self.out.isatty() and "NO_COLOR" not in os.environ
        self.color = color
        self.midline = False  # text written since the last newline

    def show(self, segments: Segments) -> None:
        if segments:
            self._write("".join(GREEN + t + RESET if draft and self.color else t for t, draft in segments))

    def end(self) -> None:
        self._write("\n")

    def own_line(self, say: Callable[[str], None]) -> Callable[[str], None]:
        """`say`, its line on a line of its own where the text and stderr share a terminal: a line said mid-text (a
        fail-over's) ran into the story ("there wasspecmesh: ...") and the text went on after it. The text's open line
        is ended first (on the terminal only: a text going to a file or a pipe is left as it is)."""
        def said(line: str) -> None:
            if self.midline and sys.stderr.isatty() and getattr(self.out, "isatty", lambda: False)():
                self._write("\n")
            say(line)
        return said

    def _write(self, text: str) -> None:
        try:
            self.out.write(text)
            self.out.flush()
            self.midline = not text.endswith("\n")
        except BrokenPipeError:
            raise
        except (OSError, UnicodeEncodeError) as e:
            where = getattr(self.out, "name", "the output")
            if isinstance(e, UnicodeEncodeError):  # PYTHONIOENCODING=ascii, or a locale's: text it cannot spell
                why = "its encoding, %s, has no %r: set PYTHONIOENCODING=utf-8 (or a UTF-8 locale)" % (
                    e.encoding, e.object[e.start:e.end])
            else:
                why = e.strerror or str(e)
            raise OutputLost("cannot write the text to %s: %s" % (where.strip("<>") if isinstance(where, str)
                                                                   else where, why)) from None


class TokenStream(TextStream):
    """A TextStream written to `out` as it goes (a Printer), a newline at the end."""

    def __init__(self, scan: StopScan, out: IO[str] | None = None, color: bool | None = None):
        super().__init__(scan)
        self.printer = Printer(out, color)

    def write(self, accepted: Sequence[int], emitted: Sequence[int]) -> Segments:
        segments = super().write(accepted, emitted)
        self.printer.show(segments)
        return segments

    def finish(self) -> Segments:
        segments = super().finish()
        self.printer.show(segments)
        self.printer.end()
        return segments


class Watch(Observer):
    """generate()'s observer for a command's stream: its stop strings decided once, by `scan` (fed by the
    `stream` that shows the text, or here when nothing is shown), a projection's `costs`, and fail-over, each a
    line on stderr: a failed drafter is dropped (plain decoding goes on) whatever the verifier, a failed verifier
    replaced by `fallback()` (a factory of the replacement verifier; None: the `cpu` verifier or a pipeline has
    none, so its failure is raised)."""

    def __init__(self, scan: StopScan, stream: TextStream | None = None, costs: Costs | None = None,
                 costs_known: bool = True, fallback: Callable[[], Verifier] | None = None, verify_by_shape: bool = False):
        super().__init__(costs, costs_known, fails_over=True, verify_by_shape=verify_by_shape)
        self.scan, self.stream, self._fallback = scan, stream, fallback

    def shown(self, accepted: Sequence[int], emitted: Sequence[int]) -> None:
        if self.stream is not None:
            self.stream.write(accepted, emitted)
        else:
            self.scan.feed(accepted)
            self.scan.feed(emitted)

    def stopped(self) -> bool:
        return self.scan.stopped

    def fallback(self) -> Verifier | None:
        return self._fallback() if self._fallback else None

    def failed_over(self, line: str) -> None:
        print("\nspecmesh: " + line, file=sys.stderr, flush=True)

    def finish(self) -> str:
        """The stream ended: the rest of the text shown (and a newline), and the text returned, before the
        first stop string."""
        if self.stream is not None:
            self.stream.finish()
        else:
            self.scan.finish()
        return self.scan.final()


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


def _counted(n: int, noun: str) -> str:
    """`n` of `noun`, said as English does: "1 token", "2 tokens" (the table said "1 tokens in 0.0006 s")."""
    return "%d %s%s" % (n, noun, "" if n == 1 else "s")


def _alpha(stats: dict):
    n = stats.get("alpha_tested")
    if n is None:
        return stats["alpha"]
    if n < FEW:  # none tested too (every draft copied, or every round plain): said with its count, not "-"
        return "left out: %s tested, fewer than %d" % (_counted(n, "draft"), FEW)
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


def _took_over(stats: dict, role: str):
    """The back-end that ended the run in `role`, and the one it took over from when that failed mid-run."""
    failed = (stats.get("failed") or {}).get(role)
    if failed is None:
        return stats[role]
    if role == "drafter":
        return "none: %s failed, plain decoding from then on" % failed
    return "%s, which took over from %s (it failed)" % (stats[role], failed)


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
        *([("shadow drafts", "%d in plain rounds, %d the verifier's token" % (stats["shadow_drafts"],
                                                                           stats["shadow_hits"]))]
          if stats.get("shadow_drafts") else []),
        *([("drafts made ahead", "%d rounds verified drafts made beside the verify before (no drafter call)"
            % stats["ready_rounds"])] if stats.get("ready_rounds") else []),
        *([("copied drafts", "%d in %d plain rounds (copied from the target's table or the text), %d accepted" % (
            stats["lookup_drafts"], stats["lookup_rounds"], stats["lookup_accepted"]))]
          if stats.get("lookup_rounds") else []),
        ("wall time s", stats["wall_s"]),
        ("tokens / s", stats["tokens_per_s"]),
        ("prefill s", "%s (%s, %s tokens / s; up to the first round's tokens)" % (
            _fmt(stats["prefill_s"]), _counted(stats["prompt_tokens"], "prompt token"),
            _fmt(stats["prefill_tokens_per_s"]))),
        ("decode tokens / s", "%s (%s in %s s)" % (
            _fmt(stats["decode_tokens_per_s"]), _counted(stats["decode_tokens"], "token"), _fmt(stats["decode_s"]))),
        ("bus bytes / token", stats["bus_bytes_per_token"]),
        ("verifier", _took_over(stats, "verifier")),
        ("drafter", _took_over(stats, "drafter")),
    ]
    window = stats.get("drafter_window") or {}
    if window.get("reprimes"):
        after = window["after_first_reprime"]
        rows.append(("drafter window", "%s on the stream's last %s (context %d), from token %d on: %d of %s drafted, "
                     "%s tokens / verification" % (
                         _counted(window["reprimes"], "re-prime"), _counted(window["keep"], "token"),
                         window["context"], window["first_reprime_token"], after["drafting_rounds"],
                         _counted(after["rounds"], "round"), _fmt(after["tokens_per_verification"]))))
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
                    rows.append(("projected drafting ahead", "drafts ready for %s, %s made beside a verify, %.1f ms past it"
                                 % (_counted(p["ready_rounds"], "round"), _counted(p["ahead_drafts"], "draft"),
                                    1e3 * p["ahead_overrun_s"])))
            else:
                rows.append(("  vs plain on the pipeline (%s)" % link, p["speedup_vs_pipeline_plain"]))
                rows.append(("  vs plain on one esp32s3 board", p["speedup_vs_single_board_plain"]))
    width = min(max(len(k) for k, _ in rows), KEY_WIDTH)
    lines = [line for k, v in rows for line in _row(k, _fmt(v), width)]
    boards = stats.get("boards") or []
    if boards:
        names = ["%s (%s)" % (b["name"], b["role"]) for b in boards]
        w = max(len(n) for n in names)
        lines.append("%-*s  %10s %12s %11s %15s  %s" % (w, "board", "compute s", "heap free B", "retransmits",
                                                        "insn / token", "kernels"))
        for name, b in zip(names, boards):
            if "error" in b:
                lines += _wrapped("%-*s  " % (w, name), "stats unavailable: %s" % b["error"])
                continue
            insn = b.get("instructions_per_token")
            kernels = b.get("kernels") or "-"
            if b.get("kernels_note"):
                kernels += " (%s)" % b["kernels_note"]
            lines += _wrapped("%-*s  %10s %12s %11s %15s  " % (
                w, name, _fmt(b.get("compute_s")), _fmt(b.get("heap_free")), _fmt(b.get("retransmits")),
                "-" if insn is None else "%.0f" % insn), kernels)
    return "\n".join(lines)


def _wrapped(head: str, text: str) -> list[str]:
    """`head` then `text`, wrapped to the table's WIDTH; continuation lines indented under where `text` began (by
    KEY_WIDTH + 2 columns at most, so that a long head leaves the text room)."""
    if len(head + text) <= WIDTH:
        return [head + text]
    indent = " " * min(len(head), KEY_WIDTH + 2)
    return textwrap.wrap(head + text, WIDTH, subsequent_indent=indent, break_on_hyphens=False)


def _row(key: str, value: str, width: int) -> list[str]:
    """One figure's lines: the key padded to `width`, then the value, both wrapped to WIDTH columns; a key
    longer than `width` takes its own lines, the value then starts under the value column."""
    if len(key) <= width:
        return _wrapped("%-*s  " % (width, key), value)
    keys = textwrap.wrap(key, WIDTH, subsequent_indent="  ", break_on_hyphens=False)
    if len(keys[-1]) <= width:  # the value goes beside the key's last line
        return keys[:-1] + _wrapped("%-*s  " % (width, keys[-1]), value)
    return keys + _wrapped(" " * (width + 2), value)


def write_stats_json(path: str, stats: dict) -> None:
    """Write the stats JSON (keys REQUIRED_KEYS and more) to `path` as host/atomic.py `write_output` does (`-`:
    stdout; a device or pipe straight; a regular file replaced atomically); OSError if it cannot be written."""
    missing = [k for k in REQUIRED_KEYS if k not in stats]
    if missing:
        raise ValueError("stats lack %s" % missing)
    atomic.write_output(path, json.dumps(stats, indent=1, sort_keys=True) + "\n")

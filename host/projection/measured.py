"""Projection from executed instructions measured on virtual boards: `--project esp32c3` / `esp32c6` on their
RV32 boards, and `--project esp32` / `esp32s3` on the Xtensa classes' QEMU boards (`virtual:esp32`,
`virtual:esp32s3`; host/cli/config.py measured_projection says when).

A node on a QEMU board (host/emulator/qemu.py, `-icount shift=0`) counts the instructions each forward pass
executes (firmware/cpucount.py) and reports them in STATS by the pass's positions k: `passes_k<k>` passes took
`insn_k<k>` thousand instructions. `pass_counts` reads them; `board_summary` is what the stats JSON shows
per board. `MeasuredProjector` prices a run's rounds as host/projection/rounds.py does, except a pass's
compute: the instructions the run's own board of that role executed for a pass of k positions (the mean
over the run; a k it never ran is read off the straight line through those it did), times one stated
cycles-per-instruction figure at that board's class's clock (host/projection/hardware.py RV32_CPI for an RV32
class, CPI for an Xtensa one), plus, for a model the board reads from its ROMFS (its HELLO names /rom/...), the
exact bytes of weights the pass reads from memory-mapped flash at the class's stated rate, and, on a class with
PSRAM, the exact bytes a pass streams from there (weights of a model over the SRAM budget, its KV cache) at the
class's stated rate. Each role is priced on its own board's class (an ESP32 drafter beside an S3 verifier), or
on the host (`--drafter cpu`). The links and the node's own Python per request are priced as rounds.py prices
them (the stock consoles). What QEMU cannot say (cache misses, flash and PSRAM wait states, pipeline stalls)
lives in those figures, which stay visible.
"""

from __future__ import annotations

from specmesh.host.projection.costmodel import pass_work
from specmesh.host.provision.romfs import ROM_DIR
from specmesh.host.projection.hardware import cpi_of
from specmesh.host.projection.rounds import Projector
from specmesh.shared.modelfile import Header

MEASURED = "measured instructions (qemu)"


def pass_counts(stats: dict) -> dict[int, tuple[int, int]]:
    """{k: (passes, instructions)} from a node's STATS pairs (empty where the board does not count)."""
    out = {}
    for key, value in stats.items():
        if key.startswith("passes_k") and value:
            k = int(key[len("passes_k"):])
            out[k] = (value, 1000 * stats.get("insn_k%d" % k, 0))
    return out


def per_pass(counts: dict[int, tuple[int, int]]) -> dict[int, float]:
    """Mean instructions of a pass of k positions, by k."""
    return {k: insn / n for k, (n, insn) in sorted(counts.items())}


def board_summary(stats: dict, tokens: int) -> dict:
    """The stats JSON's instruction figures of one board: per generated token and per pass by positions."""
    counts = pass_counts(stats)
    if not counts:
        return {}
    total = sum(insn for _, insn in counts.values())
    return {"instructions": MEASURED, "instructions_per_token": total / tokens if tokens else 0.0,
            "instructions_per_pass": {str(k): round(v) for k, v in per_pass(counts).items()},
            "instructions_last_pass": stats.get("insn_last", 0)}


class Line:
    """Instructions of a pass by positions: the measured means, and elsewhere the least-squares line a + b*k, or,
    where that line's a comes out negative (a pass costs a fixed part and a part per position, neither below 0:
    sizes measured at different contexts, a prefill's and the verifies', can tilt it), the line through 0."""

    def __init__(self, means: dict[int, float]):
        if not means:
            raise ValueError("no passes measured")
        self.means = means
        n = len(means)
        mk = sum(means) / n
        mv = sum(means.values()) / n
        var = sum((k - mk) ** 2 for k in means)
        self.slope = sum((k - mk) * (v - mv) for k, v in means.items()) / var if var else 0.0
        self.intercept = mv - self.slope * mk if var else 0.0
        if self.intercept < 0 or not var:  # one size measured too: proportional to k
            self.intercept = 0.0
            self.slope = sum(k * v for k, v in means.items()) / sum(k * k for k in means)

    def __call__(self, k: int) -> float:
        if k in self.means:
            return self.means[k]
        return self.intercept + self.slope * k


class MeasuredProjector(Projector):
    """rounds.Projector with each pass's compute taken from the instructions the run's boards executed.

    `measure(role, stats, model)` gives it a board's STATS (role "verifier" or "drafter") and the model file its
    HELLO named, before `project`."""

    def __init__(self, target: Header, drafter: Header | None, board: str, transport: str = "serial",
                 drafter_board: str | None = None, drafter_on_host: bool = False, drafter_table: bool = False):
        super().__init__(target, drafter, board, transport, drafter_on_host=drafter_on_host,
                         drafter_board=drafter_board or board, drafter_table=drafter_table)
        self.lines: dict[str, Line] = {}
        self.on_rom: dict[str, bool] = {}
        self.unmeasured: dict[str, set[int]] = {}  # role -> pass sizes priced off its line, never run
        self.cpi = cpi_of(self.board.name)

    def measure(self, role: str, stats: dict, model: str = "") -> None:
        counts = pass_counts(stats)
        if counts:
            self.lines[role] = Line(per_pass(counts))
            self.on_rom[role] = model.startswith(ROM_DIR + "/")

    def terms(self, h: Header, k: int, ctx: int, layers=None, classifier: bool = True,
              board=None) -> dict[str, float]:
        """Projector.terms from the measured lines, on the class of the role's own board: `board` needs no
        pricing here, since each role's line is what that role's own board executed."""
        role = "verifier" if h is self.target else "drafter"
        own = self.board if role == "verifier" else self.drafter_board
        if role not in self.lines:
            raise ValueError("--project %s prices the instructions its boards executed: run the %s on a "
                             "virtual:%s board" % (self.board.name, role, own.name))
        if k not in self.lines[role].means:
            self.unmeasured.setdefault(role, set()).add(k)
        work = pass_work(h, k, ctx, layers, classifier, on_romfs=self.on_rom[role])
        out = {"compute": self.lines[role](k) * cpi_of(own.name).value / own.clock_hz.value,
               "weights_flash": work.get("weights_flash", 0.0) / own.flash_map_bps.value}
        if own.weight_stream_bps.value:  # a class with PSRAM: the bytes it streams from there
            for term in ("weights_psram", "kv_psram"):
                out[term] = work.get(term, 0.0) / own.weight_stream_bps.value
        return out

    def _rates(self, board) -> str:
        cpi = cpi_of(board.name)
        out = "%s x %.1f cycles/insn [%s] at %.0f MHz, flash %.0f MB/s [%s]" % (
            MEASURED, cpi.value, cpi.source, board.clock_hz.value / 1e6, board.flash_map_bps.value / 1e6,
            board.flash_map_bps.source)
        if board.weight_stream_bps.value:
            out += ", PSRAM %.0f MB/s [%s]" % (board.weight_stream_bps.value / 1e6, board.weight_stream_bps.source)
        return out

    def project(self, result, prompt_len: int) -> dict:
        out = super().project(result, prompt_len)
        out["rates"] = self._rates(self.board)
        out["drafter_rates"] = None if self.drafter_on_host else self._rates(self.drafter_board)
        out["compute"] = MEASURED
        out["kernels"] = "as the run's boards ran them: %s" % MEASURED
        out["cycles_per_insn"] = self.cpi.value
        out["flash_map_bps"] = self.board.flash_map_bps.value
        out["psram_bps"] = self.board.weight_stream_bps.value
        out["instructions_per_pass"] = {role: {str(k): round(v) for k, v in line.means.items()}
                                        for role, line in self.lines.items()}
        out["plain_terms_s"] = {t: v for t, v in self.plain_terms(prompt_len).items()}
        # what was read off a line, not run: a fixed-gamma run's plain baseline (run --plain to measure it)
        out["instructions_extrapolated"] = {role: sorted(ks) for role, ks in sorted(self.unmeasured.items())}
        return out


class LiveCosts:
    """What the gamma controller is fed during a greedy run on QEMU boards: `MeasuredProjector.round_costs`,
    its lines refreshed from the `boards`' STATS ((role, back-end) pairs) whenever a round ran a pass size
    they have not measured yet, a few STATS exchanges a run. Before a role's first passes nothing of it is
    measured: a round is then priced by `prior`, the class's cost model (rounds.Projector), which primes the
    controller (`known_beforehand`), so a run opens on the class's costs instead of probing plain and short
    rounds first (an Xtensa pair opened with 5 plain rounds and gamma 1-3: 1.36x where the cost model's
    opening gave 1.63x). Without a prior (the RV32 classes, which have no counted cost model of their own)
    the controller probes as with wall-clock times, on these prices."""

    def __init__(self, projector: MeasuredProjector, boards: list, prior: Projector | None = None):
        self.projector = projector
        self.boards = boards
        self.prior = prior
        self.board = projector.board
        self.pipelined = projector.pipelined

    @property
    def known_beforehand(self) -> bool:
        return self.prior is not None

    def round_costs(self, r) -> tuple[float, float, float]:
        drafts = (r.drafter_drafts or r.shadow) and not self.projector.drafter_on_host  # a drafter board's passes too
        need = {"verifier": r.gamma + 1, **({"drafter": 1} if drafts else {})}
        lines = self.projector.lines
        if any(role not in lines or k not in lines[role].means for role, k in need.items()):
            for role, board in self.boards:
                self.projector.measure(role, board.stats(), board.info.get("model", ""))
        if self.prior is not None and any(role not in lines for role in need):
            return self.prior.round_costs(r)
        return self.projector.round_costs(r)

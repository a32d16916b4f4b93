"""Seconds per unit of work of each cost term: derived from host/projection/hardware.py, or measured on a board.

`Rates.derived(board)` prices host/projection/costmodel.py's terms with the hardware figures (instructions at
CPI cycles each at the board's clock, kernel calls at KERNEL_CALL cycles, PSRAM and memory-mapped flash
bytes at their stream rates). `specmesh bench --port PORT` (host/projection/boardbench.py) measures the same terms on a board and writes a
calibration file; `Rates.load(path)` reads it back, and `specmesh run --project BOARD --calibration FILE`
projects with it. A term the file does not measure keeps its derived rate, and says so.

File format (JSON): {"format": "specmesh-calibration", "version": 1, "board": {...what the board
reported...}, "seconds_per_unit": {term: seconds}, "measured": {micro-benchmark: microseconds},
"check": {...a whole token measured next to its projection...}}.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from specmesh.host import atomic
from specmesh.host.projection.costmodel import TERMS, Work
from specmesh.host.projection.hardware import CPI, KERNEL_CALL, Board

FORMAT = "specmesh-calibration"
VERSION = 1
# the most seconds a unit may cost: a unit is an instruction, a kernel call or a byte, a microsecond is slow for one;
# far larger (a hand-edited 1e308) made the projection's sums infinite, and the stats JSON's NaN no parser reads
MAX_SECONDS_PER_UNIT = 1.0


class CalibrationError(ValueError):
    """A calibration file is missing or unreadable; the message is one line for the user."""


@dataclass
class Rates:
    seconds: dict[str, float]  # per unit of each term of host/projection/costmodel.py
    source: str  # shown next to a projection
    measured: set[str] = field(default_factory=set)  # the terms a board measured

    @classmethod
    def derived(cls, board: Board) -> Rates:
        clock = board.clock_hz.value
        s = {t: CPI.value / clock for t in TERMS}
        s["engine"] = KERNEL_CALL.value / clock
        stream = board.weight_stream_bps.value
        s["weights_psram"] = s["kv_psram"] = 1 / stream if stream else 0.0
        s["weights_flash"] = 1 / board.flash_map_bps.value
        return cls(s, "derived (host/projection/hardware.py)")

    @classmethod
    def load(cls, path: str | Path, board: Board, flag: str = "--calibration") -> Rates:
        """The board's derived rates with the terms the file measured replaced; `flag` named the file (run's
        --calibration or --drafter-calibration). CalibrationError."""
        what = "calibration file %s" % path
        kind = atomic.unreadable_kind(path)
        if kind:
            raise CalibrationError("%s is not a regular file (%s): give the file `specmesh bench` wrote" % (what, kind))
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise CalibrationError("%s not found: write one with `specmesh bench --port PORT --out FILE`"
                                   % what) from None
        except IsADirectoryError:  # it said "cannot be read: Is a directory", and no way on
            raise CalibrationError("%s is a folder: name the calibration file in it (the one `specmesh bench --out "
                                   "FILE` wrote)" % what) from None
        except OSError as e:  # no permission, the disk's error: nothing read, so nothing to say of JSON
            raise CalibrationError("%s cannot be read: %s" % (what, e.strerror or e)) from None
        except (UnicodeDecodeError, ValueError) as e:
            raise CalibrationError("%s is not valid JSON (%s): write it again with `specmesh bench`"
                                   % (what, type(e).__name__)) from None
        if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
            raise CalibrationError("%s is not a specmesh calibration (format %s version %d): write it "
                                   "again with `specmesh bench`" % (what, FORMAT, VERSION))
        units = data.get("seconds_per_unit")
        if not isinstance(units, dict) or not units or any(
                t not in TERMS or not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v)
                or not 0 <= v <= MAX_SECONDS_PER_UNIT for t, v in units.items()):
            raise CalibrationError("%s has no valid seconds_per_unit (terms: %s, each a number of seconds in 0..%g): "
                                   "write it again with `specmesh bench`" % (what, ", ".join(TERMS),
                                                                            MAX_SECONDS_PER_UNIT))
        measured_on = data.get("board")
        if measured_on is not None and not isinstance(measured_on, dict):  # it was read as one: "'list' object has..."
            raise CalibrationError("%s has a board that is not an object of what the board reported: write it again "
                                   "with `specmesh bench`" % what)
        _check_measured_on(measured_on, board, what, flag)
        rates = cls.derived(board)
        rates.seconds.update({t: float(v) for t, v in units.items()})
        name = (measured_on or {}).get("machine") or "a board"
        rates.source = "calibrated on %s (%s: %d of %d terms measured)" % (name, path, len(units), len(TERMS))
        rates.measured = set(units)
        return rates

    def times(self, work: Work) -> dict[str, float]:
        """Seconds of each term of `work`."""
        return {t: amount * self.seconds[t] for t, amount in work.items()}


def _check_measured_on(measured_on, board: Board, what: str, flag: str) -> None:
    """A calibration prices the board it was measured on: one from a virtual board (the unix port on the host's
    CPU, many times a 240 MHz core's speed), from another architecture than `board`'s class or, where the file
    names one (`specmesh bench` writes it), of another class (a classic ESP32 has an S3's arch, not its PSRAM)
    would project that board onto real boards of `board`'s class. CalibrationError naming both."""
    from specmesh.host.boardclasses import BOARD_CLASSES

    if not isinstance(measured_on, dict):
        return
    cls = measured_on.get("class")
    if measured_on.get("platform") != "linux" and isinstance(cls, str) and cls in BOARD_CLASSES \
            and board.name in BOARD_CLASSES and cls != board.name:
        raise CalibrationError("%s was measured on an %s board (%s), not on an %s: measure one with `specmesh bench "
                               "--port PORT` on a flashed %s, or drop %s" % (
                                   what, cls, measured_on.get("machine"), board.name, board.name, flag))
    arch = BOARD_CLASSES[board.name].mpy_arch if board.name in BOARD_CLASSES else None
    got = measured_on.get("arch")
    if measured_on.get("platform") == "linux" or (arch and got and got != arch):
        raise CalibrationError("%s was measured on %s (%s, %s), not on an %s: measure one with `specmesh bench --port "
                               "PORT` on a flashed %s, or drop %s" % (
                                   what, "a virtual board" if measured_on.get("platform") == "linux" else "another board",
                                   measured_on.get("machine") or measured_on.get("platform"), got, board.name,
                                   board.name, flag))


def write(path: str | Path, board: dict, seconds_per_unit: dict[str, float], measured: dict, check: dict) -> None:
    """The calibration file `path`, written as a shell's `>` would (host/atomic.py write_output: a device or a pipe
    written straight, a symlink followed, a regular file replaced whole); OSError if it cannot be."""
    atomic.write_output(path, json.dumps({"format": FORMAT, "version": VERSION, "board": board,
                                          "seconds_per_unit": seconds_per_unit, "measured": measured,
                                          "check": check}, indent=2, sort_keys=True) + "\n")

"""The configuration of one `specmesh run`: a typed, frozen `RunConfig`, built and checked once from the
command line's arguments (`RunConfig.from_args`), then passed to everything the run sets up instead of the
argparse Namespace. The values it derives (the parsed gamma, the calibration's rates, the deployment key)
are fields, so nothing downstream re-reads or mutates the arguments."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from specmesh.host import atomic
from specmesh.host.backends import PIPELINE, SessionParams, temp_milli, top_p_q16
from specmesh.host.cli.ranges import SEED, RangeError, in_range, probability
from specmesh.host.layout import MODEL_FILES, MODELS, TOKENIZER_FILE
from specmesh.shared import messages as m

DEFAULT_PROMPT = "Once upon a time"
GAMMA_FLAG_MAX = 16  # the largest --gamma; a round drafts at most what both back-ends' HELLO allows


class UsageError(Exception):
    """Bad input from the user: one line, exit status 2."""


@dataclass(frozen=True)
class RunConfig:
    """What a run does, as checked: sampling, back-ends, transport, projection, key and output."""

    prompt: str = DEFAULT_PROMPT
    max_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    draft_top_k: int = 8
    seed: int = 0
    drafter: str = "virtual"
    verifier: str = "virtual"
    gamma: int | None = None  # None: automatic
    transport: str = "serial"
    radio_loss: float = 0.0
    radio_dup: float = 0.0
    spec_ahead: int = 0
    plain: bool = False
    stages: int = 0
    project: str | None = None  # a board class name (host/projection/hardware.py BOARDS)
    rates: object | None = None  # host/projection/calibration.py Rates, from --calibration
    key: bytes | None = None  # the deployment key, from --key-file
    stats_json: str | None = None
    models: Path = MODELS
    color: bool | None = None  # None: when the output is a terminal
    quiet: bool = False

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> RunConfig:
        """The configuration `specmesh run`'s arguments describe; UsageError (one line) for a bad one."""
        _check_ranges(a)
        _check_models(a.models, a.plain)
        return cls(prompt=a.prompt, max_tokens=a.max_tokens, temperature=a.temperature, top_k=a.top_k,
                   top_p=a.top_p, draft_top_k=a.draft_top_k, seed=a.seed, drafter=a.drafter, verifier=a.verifier,
                   gamma=parse_gamma(a.gamma), transport=a.transport, radio_loss=a.radio_loss,
                   radio_dup=a.radio_dup, spec_ahead=a.spec_ahead, plain=a.plain, stages=a.stages,
                   project=a.project, rates=_rates(a.calibration, a.project), key=_key(a.key_file),
                   stats_json=a.stats_json, models=a.models, color=False if a.no_color else None, quiet=a.quiet)

    @property
    def backend_names(self) -> dict[str, str]:
        """role -> the back-end name asked for it (no drafter with --plain; `--stages N` verifies on the pipeline)."""
        verifier = PIPELINE if self.stages else self.verifier
        return {"verifier": verifier} if self.plain else {"verifier": verifier, "drafter": self.drafter}

    def session_params(self, eos: int) -> SessionParams:
        return SessionParams(seed=self.seed, temperature=self.temperature, draft_top_k=self.draft_top_k,
                             target_top_k=self.top_k, top_p=self.top_p, eos=eos)


def parse_gamma(text: str) -> int | None:
    if text == "auto":
        return None
    try:
        g = int(text)
    except ValueError:
        raise UsageError("--gamma must be auto or an integer, not %r" % text) from None
    try:
        return in_range("--gamma", g, 0, GAMMA_FLAG_MAX)
    except RangeError as e:
        raise UsageError(str(e)) from None


def _check_ranges(a: argparse.Namespace) -> None:
    """Every numeric flag in its range (host/cli/ranges.py; --stages against the target's layers in preflight),
    and the flags that need another: all before anything starts."""
    try:
        in_range("--max-tokens", a.max_tokens, 1)
        in_range("--top-k", a.top_k, 0, 65535, "0: off")
        in_range("--draft-top-k", a.draft_top_k, 1, 255)
        in_range("--seed", a.seed, *SEED)
        in_range("--spec-ahead", a.spec_ahead, 0, m.MAX_GAMMA)
        probability("--radio-loss", a.radio_loss)
        probability("--radio-dup", a.radio_dup)
    except RangeError as e:
        raise UsageError(str(e)) from None
    for convert, value, flag in ((temp_milli, a.temperature, "--temperature"), (top_p_q16, a.top_p, "--top-p")):
        try:
            convert(value)  # what the protocol carries; SessionParams applies exactly that everywhere
        except ValueError as e:
            raise UsageError("%s: %s" % (flag, e)) from None
    if a.stages and (a.verifier != "virtual" or a.transport != "serial"):
        raise UsageError("--stages N starts its own virtual stage boards on --transport serial: drop --verifier "
                         "and --transport")
    if (a.radio_loss or a.radio_dup) and a.transport != "espnow":
        raise UsageError("--radio-loss and --radio-dup act on the virtual radio: add --transport espnow")
    if a.calibration is not None and not a.project:
        raise UsageError("--calibration prices a projection: add --project esp32s3")
    if a.stats_json:
        problem = atomic.unwritable(a.stats_json)
        if problem:
            raise UsageError("--stats-json %s cannot be written: %s" % (a.stats_json, problem))
    check_utf8(a.prompt)


def check_utf8(prompt: str) -> None:
    """A prompt whose bytes are not UTF-8 (they arrive from argv or a file as surrogate escapes): one line
    naming the first bad byte and its offset in the prompt's bytes."""
    try:
        raw = prompt.encode("utf-8", "surrogateescape")
        raw.decode("utf-8")
    except UnicodeEncodeError:
        raise UsageError("the prompt holds characters that are not UTF-8 text") from None
    except UnicodeDecodeError as e:
        raise UsageError("the prompt is not UTF-8 text: byte 0x%02x at offset %d of its %d bytes; pass it in UTF-8"
                         % (raw[e.start], e.start, len(raw))) from None


def _rates(calibration: Path | None, project: str | None):
    if calibration is None:
        return None
    from specmesh.host.projection.calibration import CalibrationError, Rates  # noqa: PLC0415
    from specmesh.host.projection.hardware import BOARDS  # noqa: PLC0415

    try:
        return Rates.load(calibration, BOARDS[project])
    except CalibrationError as e:
        raise UsageError(str(e)) from None


def _key(key_file: Path | None) -> bytes | None:
    if key_file is None:
        return None
    from specmesh.host.provision.keys import KeyFileError, load_key  # noqa: PLC0415

    try:
        return load_key(key_file)
    except KeyFileError as e:
        raise UsageError(str(e)) from None


def _check_models(models: Path, plain: bool) -> None:
    roles = ("verifier",) if plain else ("drafter", "verifier")
    for name in [MODEL_FILES[r] for r in roles] + [TOKENIZER_FILE]:
        if not (models / name).is_file():
            raise UsageError("%s is missing from %s: run `make train` or pass --models DIR" % (name, models))

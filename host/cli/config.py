"""The configuration of one `specmesh run`: a typed, frozen `RunConfig`, built and checked once from the
command line's arguments (`RunConfig.from_args`), then passed to everything the run sets up instead of the
argparse Namespace. The values it derives (the parsed gamma, the calibration's rates, the deployment key)
are fields, so nothing downstream re-reads or mutates the arguments."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from specmesh.host import atomic
from specmesh.host.backends import HOST_BACKENDS, PIPELINE, SessionParams, is_port, port_list, temp_milli, top_p_q16
from specmesh.host.boardclasses import drafter_class
from specmesh.host.cli.ranges import SEED, RangeError, in_range, probability
from specmesh.host.layout import MODEL_FILES, MODELS, TOKENIZER_FILE, model_path, models_folder_problem, run_inputs
from specmesh.host.provision import drafters
from specmesh.host.stops import awake
from specmesh.shared import messages as m
from specmesh.shared.sampling import is_greedy

DEFAULT_PROMPT = "Once upon a time"
GAMMA_FLAG_MAX = 16  # the largest --gamma; a round drafts at most what both back-ends' HELLO allows
RV32_PROJECT = ("esp32c3", "esp32c6")  # --project classes priced from instructions measured under QEMU
XTENSA_PROJECT = ("esp32", "esp32s3")  # priced from them when the run's boards are their QEMU boards, else modelled
XTENSA_QEMU = tuple("virtual:" + c for c in XTENSA_PROJECT)  # the boards that run the Xtensa code under QEMU
BOM = "\ufeff"  # a byte order mark, which a Windows editor's file starts with: no text, dropped where text is read
PROMPT_MAX_BYTES = 16 << 20  # far past any context's worth of text; more is not read (a --prompt-file /dev/zero)


def measured_projection(project: str | None, verifier: str, stages: int) -> bool:
    """Whether --project prices each pass from the instructions the run's own boards executed under QEMU
    (host/projection/measured.py): always for an RV32 class; for an Xtensa class when its verifier is that
    class's QEMU board (`virtual:esp32s3`), while the unix-port `virtual` boards and real boards keep the cost
    model (host/projection/hardware.py). A pipeline (--stages) is priced by its own (host/projection/pipeline.py)."""
    if stages or project is None:
        return False
    return project in RV32_PROJECT or (project in XTENSA_PROJECT and verifier == "virtual:" + project)


def pipelined(stages: int, verifier: str) -> bool:
    """Whether the run verifies on a pipeline of stage boards: `--stages N` virtual ones, or the real ones of
    `--verifier PORT1,PORT2,...`."""
    return bool(stages) or port_list(verifier) is not None


class UsageError(Exception):
    """Bad input from the user: one line, exit status 2."""


@dataclass(frozen=True)
class RunConfig:
    """What a run does, as checked: sampling, back-ends, transport, projection, key and output."""

    prompt: str = DEFAULT_PROMPT  # as read: --prompt TEXT, --prompt - (stdin) or --prompt-file F
    prompt_from: str = "--prompt"  # where it came from, for a message about it
    stop: tuple[str, ...] = ()  # --stop strings: the text ends before the first
    max_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    draft_top_k: int = 8
    seed: int = 0
    drafter: str = "virtual"
    verifier: str = "virtual"
    gamma: int | None = None  # None: automatic
    draft_max: int | None = None  # the most drafts automatic gamma takes (None: the controller's own)
    transport: str = "serial"
    radio_loss: float = 0.0
    radio_dup: float = 0.0
    spec_ahead: int = 0
    plain: bool = False
    stages: int = 0
    project: str | None = None  # a board class name (host/projection/hardware.py BOARDS)
    kernels: str = "native"  # the board kernels a projection prices (host/projection/costmodel.py KERNELS)
    kernels_given: bool = False  # --kernels was given (a board found a verifier, not a stage, refuses it: session.py)
    rates: object | None = None  # host/projection/calibration.py Rates, from --calibration
    drafter_rates: object | None = None  # the drafter board's, from --drafter-calibration
    key: bytes | None = None  # the deployment key, from --key-file
    stats_json: str | None = None
    models: Path = MODELS
    target_model: Path | None = None  # --model: the target's file (None: its name in `models`)
    draft_model: Path | None = None  # --draft-model
    color: bool | None = None  # None: when the output is a terminal
    quiet: bool = False
    notes: tuple[str, ...] = ()  # one line each for a flag given that changes nothing here (said on stderr)

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> RunConfig:
        """The configuration `specmesh run`'s arguments describe; UsageError (one line) for a bad one."""
        given = a
        a = argparse.Namespace(**{**vars(a), **{k: v for k, v in UNSET_DEFAULTS.items() if getattr(a, k) is None}})
        _check_ranges(a)
        notes = _pointless(given)
        if drafters.UNREADABLE:  # gamma auto's prior
            raise UsageError(drafters.UNREADABLE)
        _check_models(a.models, a.plain, a.model, a.draft_model, a.drafter, a.transport)
        _check_stats_json_is_no_input(a)
        return cls(prompt=read_prompt(a), prompt_from=prompt_source(a), stop=tuple(a.stop), max_tokens=a.max_tokens, temperature=a.temperature,
                   top_k=a.top_k, top_p=a.top_p, draft_top_k=a.draft_top_k, seed=a.seed, drafter=a.drafter, verifier=a.verifier,
                   gamma=parse_gamma(a.gamma), draft_max=a.draft_max, transport=a.transport, radio_loss=a.radio_loss,
                   radio_dup=a.radio_dup, spec_ahead=a.spec_ahead, plain=a.plain, stages=a.stages,
                   project=a.project, kernels=a.kernels, kernels_given=given.kernels is not None,
                   rates=_rates(a.calibration, a.project, "--calibration"),
                   drafter_rates=_rates(a.drafter_calibration, drafter_class(a.transport), "--drafter-calibration"),
                   key=_key(a.key_file), stats_json=a.stats_json, models=a.models, target_model=a.model,
                   draft_model=a.draft_model, color=False if a.no_color else None, quiet=a.quiet, notes=notes)

    @property
    def backend_names(self) -> dict[str, str]:
        """role -> the back-end name asked for it (no drafter with --plain; `--stages N` verifies on the pipeline)."""
        verifier = PIPELINE if self.stages else self.verifier
        return {"verifier": verifier} if self.plain else {"verifier": verifier, "drafter": self.drafter}

    @property
    def pipeline(self) -> bool:
        """The verifier is a pipeline of stage boards, virtual (`--stages N`) or real (`--verifier PORT1,PORT2`)."""
        return pipelined(self.stages, self.verifier)

    @property
    def measured_projection(self) -> bool:
        """--project prices the instructions the run's QEMU boards executed (`measured_projection`)."""
        return measured_projection(self.project, self.verifier, self.stages)

    def named_models(self) -> dict[str, Path]:
        """The model files --model and --draft-model name (role -> path); none: each from `models`."""
        return {r: p for r, p in (("drafter", self.draft_model), ("verifier", self.target_model)) if p is not None}

    def model_file(self, role: str) -> Path:
        """The model file the host reads for `role` ("drafter", "verifier" or "stage"): the one named, else
        in `models` the drafter the --drafter back-end runs (a board's: its class's) or the target."""
        named = self.named_models().get("drafter" if role == "drafter" else "verifier")
        if named is not None:
            return named
        if role == "drafter":
            from specmesh.host.cli.preflight import drafter_file

            return self.models / drafter_file(self.drafter, self.models, self.transport)
        return model_path(self.models, role)

    @property
    def greedy(self) -> bool:
        return is_greedy(temp_milli(self.temperature))

    def session_params(self, eos: int) -> SessionParams:
        return SessionParams(seed=self.seed, temperature=self.temperature, draft_top_k=self.draft_top_k,
                             target_top_k=self.top_k, top_p=self.top_p, eos=eos)


# --kernels on a run that projects nothing (`_pointless`; a board found a verifier where it could be a stage: session.py)
KERNELS_UNPRICED = "--kernels %s chooses the kernels a projection prices: add --project esp32s3"

# flags whose parser default is None so that one given can be told from one left out (`_pointless`): their values
UNSET_DEFAULTS = {"drafter": "virtual", "kernels": "native"}
DRAFT_TOP_K = ("--draft-top-k", "draft_top_k", 8)  # a drafter's and sampling's both
DRAFTER_FLAGS = (("--drafter", "drafter", None), ("--draft-model", "draft_model", None), ("--gamma", "gamma", "auto"),
                 ("--draft-max", "draft_max", None), DRAFT_TOP_K,
                 ("--spec-ahead", "spec_ahead", 0))  # what only a drafter uses, and each one's value left out
# what only sampling uses, and each one's value left out: at --temperature 0 a run or chat decodes greedily
SAMPLING_FLAGS = (("--seed", "seed", 0), ("--top-k", "top_k", 0), ("--top-p", "top_p", 1.0), DRAFT_TOP_K)


def _pointless(a: argparse.Namespace) -> tuple[str, ...]:
    """The one checked place for flags that are legal alone but change nothing together: a refusal (UsageError)
    where the run would do work for nothing or read a value it never checks, else one note line each."""
    from specmesh.host.bus.ports import expand
    from specmesh.host.cli.preflight import unknown_backend

    if any(s == "" for s in a.stop):
        raise UsageError("--stop needs a non-empty string (an empty one would end the text before it began)")
    for i, stop in enumerate(a.stop):  # a non-UTF-8 one (argv's bytes as surrogate escapes) never matches the text
        check_utf8(stop, "--stop string %d" % (i + 1))
    # a single port's board may be a stage (a pipeline of one, which projects itself): that one is told once found
    if a.kernels is not None and not (a.project or pipelined(a.stages, a.verifier) or is_port(expand(a.verifier))):
        raise UsageError(KERNELS_UNPRICED % a.kernels + " (or --stages N)")
    if a.kernels is not None and measured_projection(a.project, a.verifier, a.stages):
        raise UsageError("--kernels %s chooses the kernels the cost model prices; --project %s on %s prices what "
                         "its boards' own kernels executed: drop --kernels" % (a.kernels, a.project, a.verifier))
    if a.transport == "espnow" and not (a.verifier == "virtual" and not a.stages):
        raise UsageError("--transport espnow puts the virtual verifier board on the radio; with --verifier %s "
                         "nothing goes over it: drop --transport espnow, or use --verifier virtual" % a.verifier)
    if a.transport == "espnow" and not a.plain and (a.drafter or "").startswith("virtual:"):
        raise UsageError("--transport espnow runs its own drafter board on the radio: give --drafter virtual (or cpu), "
                         "not %s" % a.drafter)
    notes = []
    if a.plain:
        problem = a.drafter is not None and unknown_backend("drafter", expand(a.drafter))
        if problem:
            raise UsageError(problem)
        given = [flag for flag, dest, unset in DRAFTER_FLAGS if getattr(a, dest) != unset]
        if given:
            notes.append("--plain decodes on the verifier alone: %s %s not used" % (
                ", ".join(given), "is" if len(given) == 1 else "are"))
    elif a.spec_ahead and a.drafter == "cpu":
        notes.append("--spec-ahead is how far a drafter board drafts while a verdict is pending: --drafter cpu drafts "
                     "when asked, so it is not used")
    elif a.spec_ahead and not (a.drafter or "virtual").startswith("virtual"):  # a port's board: its own config's
        notes.append("--spec-ahead is written into the config of the virtual drafter boards a run flashes: the board "
                     "on --drafter %s drafts ahead as its own config's spec_ahead says, so it is not used" % a.drafter)
    if a.temperature == 0 and getattr(a, "command", None) in ("run", "chat"):  # serve's and the API's requests sample
        radio = a.transport == "espnow" and (a.radio_loss or a.radio_dup)  # the seed draws the radio's losses then
        unused = [flag for flag, dest, unset in SAMPLING_FLAGS if getattr(a, dest) != unset
                  and not (dest == "seed" and radio) and not (dest == "draft_top_k" and a.plain)]  # (said above)
        if unused:  # the same text whatever they say, unsaid
            notes.append("--temperature 0 decodes greedily: %s %s not used (a --temperature above 0 samples)" % (
                ", ".join(unused), "is" if len(unused) == 1 else "are"))
    roles = [a.verifier] + ([] if a.plain else [a.drafter])
    if a.key_file is not None and not a.stages and all(r in HOST_BACKENDS for r in roles):
        notes.append("--key-file signs the frames of a mesh's boards: %s %s on this machine, so it is not used"
                     % (" and ".join("--%s %s" % (role, r) for role, r in zip(("verifier", "drafter"), roles)),
                        "runs" if len(roles) == 1 else "run"))
    return tuple(notes)


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


def prompt_source(a: argparse.Namespace) -> str:
    """Where the prompt came from, as the user gave it: `--prompt`, `--prompt-file F`, or stdin."""
    if a.prompt_file is not None:
        return "--prompt-file %s" % a.prompt_file
    return "stdin (--prompt -)" if a.prompt == "-" else "--prompt"


def blocking(stream) -> None:
    """Make `stream`'s descriptor blocking, as a command that reads stdin to its end needs: one a parent left
    non-blocking (node's child_process does) reads EAGAIN before its writer has written, which read() returns as
    None or the bytes so far and readline() as b"", the end of the input. A stream without one is left alone."""
    try:
        os.set_blocking(stream.fileno(), True)
    except (OSError, ValueError):  # no descriptor (a test's StringIO), or a closed one
        pass


def read_prompt(a: argparse.Namespace) -> str:
    """The text to continue: `--prompt TEXT`, `--prompt -` (stdin) or `--prompt-file F`, read as UTF-8;
    the final newlines of a file or stdin are dropped, as the shell's $(...) drops them, and a leading byte order
    mark (a Windows editor's), which is no text (the key files' reader drops it too)."""
    if a.prompt is not None and a.prompt_file is not None:
        raise UsageError("give --prompt or --prompt-file, not both")
    if a.prompt_file is None and a.prompt != "-":
        if a.prompt is None:
            return DEFAULT_PROMPT
        check_utf8(a.prompt)  # argv's bytes arrive as surrogate escapes where they are not UTF-8
        return a.prompt
    where = "stdin" if a.prompt_file is None else str(a.prompt_file)
    try:
        if a.prompt_file is None:
            blocking(sys.stdin)
            with awake():  # typed at a terminal, a Ctrl-C that came just before the read began is not lost
                data = sys.stdin.buffer.read(PROMPT_MAX_BYTES + 1)
        else:
            with open(a.prompt_file, "rb") as f:
                data = f.read(PROMPT_MAX_BYTES + 1)
    except IsADirectoryError:
        raise UsageError("--prompt-file %s: a folder: name the prompt's file in it" % where) from None
    except OSError as e:
        raise UsageError("cannot read the prompt from %s: %s" % (where, e.strerror or e)) from None
    if len(data) > PROMPT_MAX_BYTES:
        raise UsageError("the prompt in %s is over %d MiB, more than any model's context holds: shorten it"
                         % (where, PROMPT_MAX_BYTES >> 20))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError("the prompt in %s is not UTF-8 text: byte 0x%02x at offset %d of its %d bytes; save it in "
                         "UTF-8" % (where, data[e.start], e.start, len(data))) from None  # (as check_utf8 says it)
    return text.removeprefix(BOM).rstrip("\r\n")


def _check_ranges(a: argparse.Namespace) -> None:
    """Every numeric flag in its range (host/cli/ranges.py; --stages against the target's layers in preflight),
    and the flags that need another: all before anything starts."""
    try:
        in_range("--max-tokens", a.max_tokens, 1)
        in_range("--top-k", a.top_k, 0, 65535, "0: off")
        in_range("--draft-top-k", a.draft_top_k, 1, 255)
        in_range("--seed", a.seed, *SEED)
        in_range("--spec-ahead", a.spec_ahead, 0, m.MAX_GAMMA)
        if a.draft_max is not None:
            in_range("--draft-max", a.draft_max, 0, GAMMA_FLAG_MAX)
            if a.gamma != "auto":
                raise UsageError("--draft-max caps the automatic gamma: give --gamma N or --draft-max N, not both")
        probability("--radio-loss", a.radio_loss)
        probability("--radio-dup", a.radio_dup)
    except RangeError as e:
        raise UsageError(str(e)) from None
    for convert, value, flag in ((temp_milli, a.temperature, "--temperature"), (top_p_q16, a.top_p, "--top-p")):
        try:
            convert(value)  # what the protocol carries; SessionParams applies exactly that everywhere
        except ValueError as e:
            raise UsageError("%s: %s" % (flag, e)) from None
    if a.verifier == PIPELINE and not a.stages:
        raise UsageError("--verifier %s is the pipeline --stages N starts: give --stages N (e.g. --stages 5), not "
                         "--verifier" % PIPELINE)
    virtual = a.verifier == "virtual" or a.verifier.startswith("virtual:")
    if a.stages > 0 and port_list(a.verifier) is not None:
        raise UsageError("--stages N starts its own virtual stage boards; --verifier %s runs the stage boards on those "
                         "ports: give one or the other" % a.verifier)
    if a.stages > 0 and (not virtual or a.transport != "serial"):  # below 0: preflight's range
        drop = [f for f, wrong in (("--verifier (or name their class: --verifier virtual:esp32c3)", not virtual),
                                   ("--transport", a.transport != "serial")) if wrong]
        raise UsageError("--stages N starts its own virtual stage boards on --transport serial: drop %s"
                         % " and ".join(drop))
    if a.stages > 0 and virtual:  # the stages' class, looked up before their heap is (`virtual:nosuch`: a KeyError)
        from specmesh.host.cli.preflight import unknown_backend

        problem = unknown_backend("verifier", a.verifier)
        if problem:
            raise UsageError(problem)
    if (a.radio_loss or a.radio_dup) and a.transport != "espnow":
        raise UsageError("--radio-loss and --radio-dup act on the virtual radio: add --transport espnow")
    for flag, given in (("--calibration", a.calibration), ("--drafter-calibration", a.drafter_calibration)):
        if given is not None and not a.project:
            raise UsageError("%s prices a projection: add --project esp32s3" % flag)
    if a.drafter_calibration is not None and (a.plain or a.drafter == "cpu" or pipelined(a.stages, a.verifier)):
        raise UsageError("--drafter-calibration prices a drafter board: not with --plain, --drafter cpu or stage boards "
                         "(--stages, or --verifier PORT1,PORT2,...)")
    if a.calibration is not None and pipelined(a.stages, a.verifier):  # projection/pipeline.py takes no rates
        raise UsageError("--calibration prices a single verifier board: a pipeline (--stages, or --verifier "
                         "PORT1,PORT2,...) is projected from its stages' derived rates, which take no calibration: "
                         "drop --calibration")
    if a.project in RV32_PROJECT:
        want = "virtual:" + a.project
        roles = [("verifier", a.verifier)] + ([] if a.plain else [("drafter", a.drafter)])
        if any(name != want for _, name in roles) or a.calibration or a.drafter_calibration or a.stages:
            raise UsageError("--project %s prices the instructions its boards execute under QEMU: run %s on %s "
                             "(no --calibration, no --stages)" % (a.project, " and ".join("--" + r for r, _ in roles),
                                                                  want))
    _check_xtensa_project(a)
    if a.stats_json is not None:
        problem = atomic.output_problem(a.stats_json)
        if problem:
            raise UsageError("--stats-json %s cannot be written: %s" % (a.stats_json or "''", problem))


def _check_xtensa_project(a: argparse.Namespace) -> None:
    """--project esp32 / esp32s3 with a QEMU Xtensa board in a role prices what the run's boards executed, so
    every board role must be one, the verifier of the projected class (a drafter may be either class or the
    host's cpu), and nothing may replace their counts (a calibration's rates); a run with none keeps the cost
    model. A pipeline (--stages, or real stage boards) is priced by its links' model whatever its stages run."""
    if a.project not in XTENSA_PROJECT or pipelined(a.stages, a.verifier):
        return
    drafter = None if a.plain else a.drafter
    if a.verifier not in XTENSA_QEMU and drafter not in XTENSA_QEMU:
        return  # unix-port or real boards: the cost model
    want = "virtual:" + a.project
    if a.verifier != want:
        raise UsageError("--project %s prices the instructions its QEMU boards execute: run the verifier on %s, not "
                         "%s (or every role on unix-port `virtual` or real boards for the cost model)"
                         % (a.project, want, a.verifier))
    if drafter is not None and drafter not in XTENSA_QEMU + ("cpu",):
        raise UsageError("--project %s on a %s verifier prices the instructions its boards execute: run the drafter "
                         "on %s too, or --drafter cpu (not %s)" % (a.project, want, " or ".join(XTENSA_QEMU), drafter))
    if a.calibration or a.drafter_calibration:
        raise UsageError("--project %s on QEMU boards prices the instructions they executed: drop --calibration and "
                         "--drafter-calibration (they price the cost model)" % a.project)


def check_utf8(prompt: str, what: str = "the prompt") -> None:
    """A prompt (or `what` else) whose bytes are not UTF-8 (they arrive from argv or a file as surrogate escapes):
    one line naming the first bad byte and its offset in its bytes."""
    try:
        raw = prompt.encode("utf-8", "surrogateescape")
        raw.decode("utf-8")
    except UnicodeEncodeError:
        raise UsageError("%s holds characters that are not UTF-8 text" % what) from None
    except UnicodeDecodeError as e:
        raise UsageError("%s is not UTF-8 text: byte 0x%02x at offset %d of its %d bytes; pass it in UTF-8"
                         % (what, raw[e.start], e.start, len(raw))) from None


def _rates(calibration: Path | None, project: str | None, flag: str):
    if calibration is None:
        return None
    from specmesh.host.projection.calibration import CalibrationError, Rates
    from specmesh.host.projection.hardware import BOARDS

    try:
        return Rates.load(calibration, BOARDS[project], flag)
    except CalibrationError as e:
        raise UsageError(str(e)) from None


def _key(key_file: Path | None) -> bytes | None:
    if key_file is None:
        return None
    from specmesh.host.provision.keys import KeyFileError, load_key

    try:
        return load_key(key_file)
    except KeyFileError as e:
        raise UsageError(str(e)) from None


def _check_models(models: Path, plain: bool, target: Path | None, drafter: Path | None, backend: str,
                  transport: str) -> None:
    """Each model file the run reads is there: one named by --model/--draft-model, else its name in `models`, the
    drafter's the one its `--drafter` back-end runs (RunConfig.model_file: a folder of drafter-host.spm alone serves
    --drafter cpu) (a --models folder that does not exist is a typo to fix, not models to train)."""
    from specmesh.host.cli.preflight import drafter_file

    problem = models_folder_problem(models)
    if problem:
        raise UsageError(problem)
    for role, named, flag in (("drafter", drafter, "--draft-model"), ("verifier", target, "--model")):
        if role == "drafter" and plain:
            continue
        if named is not None and not named.is_file():
            raise UsageError("%s %s: %s" % (flag, named, "a folder: name the model file in it" if named.is_dir() else
                                            "not a regular file" if named.exists() else "no such file"))
        name = drafter_file(backend, models, transport) if role == "drafter" else MODEL_FILES[role]
        if named is None and not (models / name).is_file():
            raise UsageError(_missing(name, models))
    if not (models / TOKENIZER_FILE).is_file():
        raise UsageError(_missing(TOKENIZER_FILE, models))


def _check_stats_json_is_no_input(a: argparse.Namespace) -> None:
    """--stats-json naming a file the run reads (a slip of tab completion: `--stats-json models/target.spm`) replaced
    that model, tokenizer, table, prompt, key or calibration with the stats, and the next run refused the file as
    corrupt: refused here, before anything is written. So is the model card's data (gamma auto's prior), whose
    stats in its place had every later command fail on import with a KeyError's traceback."""
    stats = getattr(a, "stats_json", None)
    if not stats:
        return
    named = [a.model, a.draft_model, a.prompt_file, a.key_file, a.calibration, a.drafter_calibration, drafters.CARD]
    hit = atomic.overwrites(stats, named + run_inputs(a.models))
    if hit is not None:
        raise UsageError("--stats-json %s would overwrite %s, which this run reads: give the stats another file"
                         % (stats, hit.name))


def _missing(name: str, models: Path) -> str:
    """The line for a model file or tokenizer missing from the --models folder. (`make train` makes neither the
    target nor the tokenizer, which are shipped: it was the advice for every file.) A folder or a device under its
    name is said as one: copying the file "there" would have put it inside the folder and changed nothing."""
    there = models / name
    if there.exists():
        return ("%s is %s: remove it, then copy the file there from the shipped models (%s), or give the folder "
                "that holds it with --models" % (there, "a folder, not a file" if there.is_dir() else
                                                 "not a regular file", MODELS))
    return ("%s is missing from %s: copy it there from the shipped models (%s), or give the folder that holds it "
            "with --models" % (name, models, MODELS))

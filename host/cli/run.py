"""`specmesh run`: set up the drafter and verifier back-ends, generate, stream the text, print the stats.

The arguments become one checked, frozen `RunConfig` (host/cli/config.py) before anything starts; the rest
of the run reads that. Back-ends by name, each made through the tables of host/cli/registry.py: `cpu` (numpy engine on the host), `torch-cpu`,
`gpu`, `virtual` or `virtual:CLASS` (a virtual board started and flashed for this run,
host/provision/cluster.py), `pipeline` (`--stages N`), or a serial port of a flashed board. `--plain` decodes with the verifier alone
(the baseline). Every user error is one line on stderr and exit status 2; a failure during generation is
one line and status 1.
A verifier that fails mid-run is replaced by the `cpu` one and a drafter that fails leaves the stream
on plain decoding (host/decode/orchestrator.py): one line on stderr, the text goes on unchanged.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from specmesh.host.atomic import STDOUT
from specmesh.host.cli import registry
from specmesh.host.backends import PIPELINE, BackendError, SessionParams
from specmesh.host.cli.config import DEFAULT_PROMPT, RV32_PROJECT, RunConfig, UsageError
from specmesh.host.cli.output import TokenStream, Watch, format_table, write_stats_json
from specmesh.host.boardclasses import BOARD_CLASSES, ROLE_CLASS, drafter_class
from specmesh.host.cli.preflight import (PreflightError, check_backends, check_context, check_models, check_pair,
                                         unknown_backend)
from specmesh.host.cli.ranges import RangeError, in_range
from specmesh.host.decode.gamma import GammaController
from specmesh.host.decode.orchestrator import Result, generate
from specmesh.host.decode.stopstrings import StopScan, StopStrings
from specmesh.host.layout import MODEL_FILES, MODELS, TOKENIZER_FILE
from specmesh.host.projection.measured import board_summary
from specmesh.host.provision.drafters import expected_alpha


class GenerationFailed(Exception):
    """A back-end failed once generation had started (e.g. a board stopped answering): exit status 1."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt", default=None,
                   help="text to continue, or - to read it from stdin (default: %r)" % DEFAULT_PROMPT)
    p.add_argument("--prompt-file", metavar="F", type=Path, help="read the text to continue from file F (UTF-8)")
    p.add_argument("--stop", metavar="STRING", action="append", default=[],
                   help="end the text before this string (repeatable; the generated text only is searched)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=0, help="target top-k, 0 = off (default: %(default)s)")
    p.add_argument("--top-p", type=float, default=1.0, help="target top-p, 1 = off (default: %(default)s)")
    p.add_argument("--draft-top-k", type=int, default=8, help="size of the drafter's q-hat tables (default: 8)")
    p.add_argument("--seed", type=int, default=0, help="session seed: same seed, same text (default: 0)")
    p.add_argument("--drafter", default=None,
                   help="PORT (or mpremote's a0, u0, c0) | auto (the flashed drafter board among the ESP32 USB "
                        "ports) | virtual | virtual:CLASS (a virtual board of that class) | cpu (default: virtual)")
    p.add_argument("--verifier", default="virtual",
                   help="PORT | auto | virtual | virtual:CLASS | cpu | torch-cpu | gpu (default: virtual)")
    p.add_argument("--gamma", default="auto", help="drafts per round: auto, or a fixed K >= 0 (default: auto)")
    p.add_argument("--transport", choices=("serial", "espnow"), default="serial",
                   help="how virtual boards reach each other and the host (default: serial)")
    p.add_argument("--radio-loss", type=float, default=0.0, metavar="P",
                   help="virtual radio: probability a packet is lost (espnow transport; default 0)")
    p.add_argument("--radio-dup", type=float, default=0.0, metavar="P",
                   help="virtual radio: probability a packet arrives twice (default 0)")
    p.add_argument("--spec-ahead", type=int, default=0, metavar="N",
                   help="virtual drafter board: tokens it drafts ahead while a verdict is pending (pipelined "
                        "speculation; default 0). The virtual boards share the host's cores, so what it buys "
                        "depends on the machine's load (64 tokens at --gamma 2, median of 8 runs on 2 shared "
                        "cores: 821 tok/s without, 1087 with --spec-ahead 4)")
    p.add_argument("--plain", action="store_true", help="target-only decoding on the same verifier (baseline)")
    p.add_argument("--stages", type=int, default=0, metavar="N",
                   help="verify on a pipeline of N virtual stage boards (classic ESP32s; --verifier virtual:CLASS: of "
                        "that class), the target's layers split evenly, positions sent through as a wavefront; each "
                        "stage must fit its class's heap (the shipped target on classic ESP32s: 5) (docs/pipeline.md; "
                        "default 0: one verifier)")
    p.add_argument("--project", metavar="BOARD", choices=("esp32", "esp32s3") + RV32_PROJECT,
                   help="also project the run onto real boards of this class (host/projection/hardware.py); "
                        "gamma is then chosen for that hardware. esp32c3/esp32c6 price the instructions the run's "
                        "virtual:esp32c3/c6 boards executed under QEMU (docs/run.md)")
    p.add_argument("--kernels", choices=("native", "viper"), default=None,
                   help="with --project: the board kernels the projection prices (default native: the xtensawin "
                        "module; viper: the MicroPython-only engine)")
    p.add_argument("--calibration", metavar="FILE", type=Path,
                   help="with --project: price the projection with a board's measurements (specmesh bench "
                        "--port PORT --out FILE) instead of the derived figures")
    p.add_argument("--drafter-calibration", metavar="FILE", type=Path,
                   help="with --project: price the drafter board with its own measurements (specmesh bench on that "
                        "board: its flash read rate among them) instead of its class's derived figures")
    p.add_argument("--key-file", metavar="F", type=Path,
                   help="sign and check every frame with this deployment key (boards flashed with the same "
                        "--key-file; virtual boards get it at flashing)")
    p.add_argument("--stats-json", metavar="FILE",
                   help="write the run's figures as JSON to FILE (a device, pipe or FIFO is written straight, a "
                        "symlink followed), or - for stdout (the text and the table then go to stderr)")
    p.add_argument("--models", type=Path, default=MODELS,
                   help="folder with %s, %s and a llama2.c %s" % (MODEL_FILES["drafter"], MODEL_FILES["verifier"],
                                                                   TOKENIZER_FILE))
    p.add_argument("--model", metavar="FILE", type=Path,
                   help="the target model file (default: %s in --models)" % MODEL_FILES["verifier"])
    p.add_argument("--draft-model", metavar="FILE", type=Path,
                   help="the drafter model file (default: %s in --models; a drafter board runs the model it was "
                        "flashed with, and the host reads that one from the same folder)" % MODEL_FILES["drafter"])
    p.add_argument("--no-color", action="store_true", help="never colour the streamed text")
    p.add_argument("--quiet", action="store_true", help="do not stream the text (the table is still printed)")


def check_args(a: argparse.Namespace) -> RunConfig:
    """The run's configuration from its arguments, checked (UsageError: one line); `a` is left as it is. A flag
    given that changes nothing is said in one line on stderr."""
    config = RunConfig.from_args(a)
    for note in config.notes:
        print("specmesh: note: " + note, file=sys.stderr, flush=True)
    return config


def load_tokenizer(models: Path):
    from specmesh.host.decode.tokenizer import Tokenizer, TokenizerError

    try:
        return Tokenizer.from_llama2c(models / TOKENIZER_FILE)
    except TokenizerError as e:
        raise UsageError(str(e)) from None


class Setup(contextlib.ExitStack):
    """The back-ends of one run and everything they started (virtual boards, links), closed on exit: the
    `Boards` (host/backends/__init__.py) the board back-ends' factories take."""

    def __init__(self, config: RunConfig):
        super().__init__()
        self.config = config
        self.key = config.key
        self.stages = config.stages
        # the stages' class: `--stages N --verifier virtual:CLASS` (None: the default class)
        self.stage_class = stage_class(config) if config.verifier.startswith("virtual:") else None
        # a pipeline's default virtual drafter board is flashed at the same time as its stages
        self.beside_stages = ("drafter",) if config.stages and config.backend_names.get("drafter") == "virtual" else ()
        self._cluster = None

    def cluster(self):
        """The run's virtual boards (host/provision/cluster.py), opened on first use."""
        if self._cluster is None:
            from specmesh.host.provision.cluster import Cluster

            c = self.config
            radio = None
            if c.transport == "espnow":
                from specmesh.host.emulator.radio import RadioConfig

                radio = RadioConfig(loss=c.radio_loss, duplicate=c.radio_dup, seed=c.seed)
            say = None if c.quiet else (lambda line: print("specmesh: " + line, file=sys.stderr, flush=True))
            self._cluster = self.enter_context(Cluster(c.transport, c.models, radio=radio, spec_ahead=c.spec_ahead,
                                                       key=self.key, say=say, files=c.named_models()))
        return self._cluster

    def make(self, kind: str, name: str):
        """A drafter or verifier back-end for `--drafter NAME` / `--verifier NAME`, from the registry."""
        fac = registry.factory(kind, name)
        if fac is None:
            raise UsageError(unknown_backend(kind, name) or name)
        backend = fac(self.config.model_file(kind), name=name, boards=self)
        self.callback(backend.close)
        return backend


def build_stats(config: RunConfig, params: SessionParams, result: Result, text: str, verifier, drafter,
                controller: GammaController, prompt_len: int, projector) -> dict:
    n = len(result.tokens)
    hist = result.gamma_hist
    stats = {
        "text": text,
        "tokens": n,
        "token_ids": result.tokens,
        "failovers": result.failovers,
        "prompt_tokens": prompt_len,
        "alpha": result.alpha,
        "alpha_tested": result.tested,
        "tokens_per_verification": result.tokens_per_verification,
        "gamma": max(hist, key=lambda g: (hist[g], -g)) if hist else 0,
        "gamma_hist": {str(g): c for g, c in hist.items()},
        "gamma_policy": "plain" if drafter is None else ("auto" if controller.fixed is None else "fixed"),
        "wall_s": result.wall_s,
        "tokens_per_s": n / result.wall_s if result.wall_s > 0 else 0.0,
        # prefill: BEGIN to the first round's tokens (host/decode/orchestrator.py); decode: the rest
        "prefill_s": result.prefill_s,
        "prefill_tokens_per_s": prompt_len / result.prefill_s if result.prefill_s > 0 else 0.0,
        "decode_s": result.wall_s - result.prefill_s,
        "decode_tokens": result.decode_tokens,
        "decode_tokens_per_s": (result.decode_tokens / (result.wall_s - result.prefill_s)
                                if result.wall_s > result.prefill_s else 0.0),
        "bus_bytes_per_token": result.bus_bytes / n if n else 0.0,
        "bus_bytes_per_token_by_link": {  # the host's link to each board (0 for an in-process back-end)
            "verifier": sum(r.bytes_verify for r in result.rounds) / n if n else 0.0,
            "drafter": sum(r.bytes_draft for r in result.rounds) / n if n else 0.0},
        # the back-ends that ended the run: the cpu verifier where the one asked for failed, none for a failed drafter
        "verifier": "cpu" if "verifier" in result.failed else verifier.name,
        "drafter": None if "drafter" in result.failed else (drafter.name if drafter else None),
        "failed": dict(result.failed),  # role -> the back-end that failed mid-run (its line: failovers)
        "drafter_model": (drafter.info.get("model") if hasattr(drafter, "info") else
                          config.model_file("drafter").name) if drafter else None,
        "stop": result.stop,
        "context": verifier.max_seq,
        "seed": config.seed,
        "temperature": params.temperature,  # as applied: the nearest thousandth of --temperature
        "estimates": controller.summary(),
        "boards": board_stats(verifier.parts("verifier") + (drafter.parts("drafter") if drafter else []), n,
                              projector),
    }
    stats.update(verifier.report())
    if projector is not None:
        stats["projection"] = projector.project(result, prompt_len)
    return stats


def board_stats(parts: list, tokens: int = 0, projector=None) -> list[dict]:
    """One entry per board among the back-ends' parts (role, back-end): in-process ones report no heap. A board
    under QEMU adds the instructions it executed (per generated token, per pass), which a projector that prices
    them (host/projection/measured.py) takes too."""
    out = []
    for role, b in parts:
        try:
            s = b.stats()
        except BackendError as e:  # the text is out already; a board too short of heap to report is a note
            out.append({"name": b.name, "role": role, "error": _one_line(e)})
            continue
        if "heap_free" in s:
            out.append({"name": b.name, "role": role, "compute_s": s.get("compute_s"), "heap_free": s.get("heap_free"),
                        "errors": s.get("errors", 0), "retransmits": s.get("retransmits", 0),
                        "kernels": s.get("kernels"), "kernels_note": s.get("kernels_note", "")})
            if role == "stage":  # the firmware's own counters, next to the host's trace of the same work
                out[-1].update(positions=s.get("positions"), passes=s.get("passes"))
                if "classifier" in s:  # the last stage: the classifier in its heap, or streamed (cls_reads passes)
                    out[-1].update(classifier=s["classifier"], cls_reads=s.get("cls_reads"))
            out[-1].update(board_summary(s, tokens))
            if hasattr(projector, "measure"):
                projector.measure(role, s, getattr(b, "info", {}).get("model", ""))
    return out


def projection(config: RunConfig, heads: dict, verifier, drafter, on_host: bool, deterministic: bool):
    """(cost model, projector): what prices each round for gamma's choice, and what projects the run for the
    stats (None, None when neither is asked for). A pipeline always reports its own projection."""
    if config.stages:  # host/projection/pipeline.py, in every stats JSON
        from specmesh.host.projection.pipeline import STAGE_LINKS, LinksReport, PipelineProjector

        # stages of the class --project names (one with stages: the S3), else the class rule's classic ESP32s
        cls = config.project if config.project in STAGE_LINKS else ROLE_CLASS["stage"]
        return (PipelineProjector(heads["verifier"], heads.get("drafter"), verifier.layers, STAGE_LINKS[cls][0], on_host,
                                  config.kernels, cls),
                LinksReport(heads["verifier"], heads.get("drafter"), verifier.layers, on_host, config.kernels, cls))
    if config.project in RV32_PROJECT:  # priced from the instructions its boards execute
        from specmesh.host.projection.measured import LiveCosts, MeasuredProjector
        from specmesh.host.projection.rounds import Projector

        measured = MeasuredProjector(heads["verifier"], heads["drafter"], config.project, config.transport)
        if deterministic:  # sampling: gamma from derived costs, so that a seed gives one text
            return Projector(heads["verifier"], heads["drafter"], "esp32s3", config.transport), measured
        boards = [("verifier", verifier)] + ([("drafter", drafter)] if drafter is not None else [])
        return LiveCosts(measured, boards), measured
    virtual = virtual_classes(config, on_host)
    if config.project or deterministic or virtual:
        from specmesh.host.projection.rounds import Projector

        board, drafts_on = config.project or ROLE_CLASS["verifier"], drafter_class(config.transport)
        if virtual and not (config.project or deterministic):
            board, drafts_on = virtual
        projector = Projector(heads["verifier"], heads["drafter"], board, config.transport, config.rates,
                              config.kernels, drafter_on_host=on_host, drafter_board=drafts_on,
                              drafter_rates=config.drafter_rates)
        return projector, (projector if config.project else None)
    return None, None


def virtual_classes(config: RunConfig, on_host: bool) -> tuple[str, str] | None:
    """(verifier class, drafter board class) when gamma auto speculates on virtual boards: they stand for
    their class, and their wall clock is the host's (a scheduling hiccup read as a slow board switched
    drafting off), so gamma plans from the class's projected costs; None otherwise."""
    if config.gamma is not None or config.plain or not (on_host or _virtual(config.drafter)):
        return None
    if not _virtual(config.verifier):
        return None
    verifier = config.verifier.partition(":")[2] or ROLE_CLASS["verifier"]
    drafter = config.drafter.partition(":")[2] or drafter_class(config.transport)
    return (verifier, verifier if on_host else drafter) if {verifier, drafter} <= BOARD_CLASSES.keys() else None


def _virtual(name: str) -> bool:
    return name == "virtual" or name.startswith("virtual:")


def preflight(config: RunConfig, prompt_tokens: int) -> tuple[dict, dict]:
    """(model headers by role, back-end names by role with `auto` resolved), checked before anything starts:
    no board booted, no port held when one of these fails."""
    names = config.backend_names
    try:
        roles = sorted({*names, *(["drafter"] if config.project else [])})
        headers = check_models({r: config.model_file(r) for r in roles}, roles)
        if "drafter" in headers:
            check_pair(headers["verifier"], headers["drafter"].vocab, headers["drafter"].tokenizer_id,
                       str(config.model_file("drafter")))
        check_context(prompt_tokens, headers["verifier"], config.model_file("verifier").name, config.prompt_from)
        n_layers = headers["verifier"].n_layers
        in_range("--stages", config.stages, 0, n_layers, "0: one verifier; at most the target's %d layers" % n_layers)
        if config.stages:
            plan_stages(headers["verifier"], config.stages, stage_class(config))
        return headers, check_backends(names, config.transport, config.key)
    except (PreflightError, RangeError) as e:
        raise UsageError(str(e)) from None


def stage_class(config: RunConfig) -> str:
    """The class of a pipeline's stage boards: `--verifier virtual:CLASS`, else the stage role's (a classic ESP32)."""
    from specmesh.host.boardclasses import ROLE_CLASS

    return config.verifier.split(":", 1)[1] if config.verifier.startswith("virtual:") else ROLE_CLASS["stage"]


def plan_stages(target, n: int, cls_name: str) -> None:
    """Every stage of an n-stage split of `target` must fit the heap of a `cls_name` board, checked before any
    board is flashed (a stage short of heap was found only after flashing, by the node); PreflightError naming
    the first stage that does not fit and the fewest stages that do, or a class that holds them."""
    from specmesh.host.boardclasses import BOARD_CLASSES, stage_heap_need
    from specmesh.host.provision.cluster import split_layers

    cls = BOARD_CLASSES[cls_name]

    def first_short(k: int):
        return next(((i, ab) for i, ab in enumerate(split_layers(target.n_layers, k))
                     if stage_heap_need(target, cls, ab) > cls.heap_bytes), None)

    short = first_short(n)
    if short is None:
        return
    i, (a, b) = short
    fits = next((k for k in range(n + 1, target.n_layers + 1) if first_short(k) is None), None)
    fix = ("--stages %d, the fewest whose stages fit" % fits if fits else "no split fits it") + \
        ", or stage boards with PSRAM: --verifier virtual:esp32s3"
    raise PreflightError("--stages %d: stage %d (layers %d:%d) needs %d KiB of heap, an %s board has %d KiB: %s"
                         % (n, i, a, b, stage_heap_need(target, cls, (a, b)) // 1024, cls.name, cls.heap_bytes // 1024,
                            fix))


def run(a: argparse.Namespace | RunConfig, out=None) -> dict:
    """Generate as `a` says; returns the stats. Raises UsageError, BackendError and friends."""
    out = out if out is not None else sys.stdout
    config = a if isinstance(a, RunConfig) else check_args(a)
    tok = load_tokenizer(config.models)
    prompt = tok.encode(config.prompt)
    headers, names = preflight(config, len(prompt))
    from specmesh.host.decode.tokenizer import BOS

    params = config.session_params(eos=BOS)  # llama2.c's models end a story by starting the next one (BOS)
    with Setup(config) as setup:
        verifier = setup.make("verifier", names["verifier"])
        drafter = None if config.plain else setup.make("drafter", names["drafter"])
        if drafter is not None:
            _check_running_drafter(drafter, headers["verifier"])
        if drafter is not None and "drafter" in headers:  # price the model the drafter board runs
            headers["drafter"] = _drafter_head(drafter, config.model_file("drafter"), headers["drafter"])
        # With sampling, which positions get a draft changes the text (the accept test and the residual
        # draw replace plain decoding's draw there), so an adaptive gamma fed wall-clock times would
        # make the same seed give different texts. Sampling with --gamma auto therefore chooses gamma
        # from the projected costs (deterministic); greedy text never depends on gamma.
        deterministic = not config.greedy and config.gamma is None and drafter is not None
        on_host = names.get("drafter") == "cpu"  # the drafter back-end runs on this machine, not on a board
        costs, projector = projection(config, headers, verifier, drafter, on_host, deterministic)
        controller = gamma_controller(config, drafter)
        # a projection that credits pipelined drafting plans gamma and the look-ahead for it
        controller.pipelined = bool(drafter is not None and costs is not None and costs.pipelined)
        scan = StopScan(StopStrings(config.stop), tok.pieces.__getitem__)
        stream = None
        if not config.quiet:
            stream = TokenStream(scan, out, color=config.color)
            out.write(config.prompt)
            out.flush()
        watch = Watch(scan, stream, costs=costs.round_costs if costs else None,
                      costs_known=getattr(costs, "known_beforehand", True),
                      fallback=None if names["verifier"] in ("cpu", PIPELINE) else lambda: setup.make("verifier", "cpu"))
        try:
            result = generate(prompt, verifier, drafter, params, config.max_tokens, controller, watch)
        except (BackendError, RuntimeError) as e:
            if stream:
                out.write("\n")
            raise GenerationFailed(_one_line(e)) from None
        text = watch.finish()
        stats = build_stats(config, params, result, text, verifier, drafter, controller, len(prompt), projector)
        stats["gamma_costs"] = ("projected %s" % costs.board.name) if costs else "measured"
    return stats


def running_model(backend) -> str:
    """The file name of the model a board back-end's HELLO says it runs ("" for an in-process back-end)."""
    return getattr(backend, "info", {}).get("model", "").rsplit("/", 1)[-1]


def gamma_controller(config: RunConfig, drafter) -> GammaController:
    """--gamma N fixed, or gamma auto starting from the drafter's acceptance on the model card when it is a
    shipped drafter (the file a drafter board reports running, else the one named)."""
    if config.gamma is not None:
        return GammaController(max_gamma=config.gamma, fixed=config.gamma)
    controller = GammaController()
    if drafter is not None:
        name = running_model(drafter) or config.model_file("drafter").name
        alpha = expected_alpha(name, config.greedy)
        if alpha is not None:
            controller.expect(alpha)
    return controller


def _check_running_drafter(drafter, target) -> None:
    """A drafter board may run another model than the file the host checked (flashed before, by hand): its
    HELLO's vocabulary must be the target's, before any text (host/cli/preflight.py `check_pair`)."""
    vocab = getattr(drafter, "info", {}).get("vocab")
    if vocab is None:
        return
    try:
        check_pair(target, vocab, 0, "on %s (%s)" % (drafter.name, running_model(drafter) or "its model"))
    except PreflightError as e:
        raise UsageError(str(e)) from None


def _drafter_head(drafter, given: Path, head):
    """The header of the model a drafter board reports running (HELLO: e.g. drafter.spm on an S3 drafter board
    where its class's drafter was assumed) when that file is beside `given`; else `head`, `given`'s."""
    name = running_model(drafter)
    if not name or name == given.name or not (given.parent / name).is_file():
        return head
    try:
        return check_models({"drafter": given.parent / name}, ["drafter"])["drafter"]
    except PreflightError as e:
        raise UsageError(str(e)) from None


def main(a: argparse.Namespace) -> int:
    try:
        return _main(a)
    except BrokenPipeError:  # `specmesh run | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def failed(command: str, e: Exception | KeyboardInterrupt) -> int:
    """The exit code of `specmesh COMMAND` that stopped on `e`, after one line on stderr, never a traceback
    (SPECMESH_DEBUG=1 re-raises): 2 for a usage error or a setup failure, 1 when generation failed, 130
    for Ctrl-C."""
    if isinstance(e, UsageError):
        print("specmesh %s: error: %s" % (command, e), file=sys.stderr)
        return 2
    if isinstance(e, KeyboardInterrupt):
        print("\nspecmesh %s: interrupted" % command, file=sys.stderr)
        return 130
    if os.environ.get("SPECMESH_DEBUG"):
        raise e
    print("specmesh %s: error: %s" % (command, _one_line(e)), file=sys.stderr)
    return 1 if isinstance(e, GenerationFailed) else 2


def _main(a: argparse.Namespace) -> int:
    # `--stats-json -`: stdout holds the JSON alone (for a pipe to jq), so the text and the table go to stderr
    out = sys.stderr if a.stats_json == STDOUT else sys.stdout
    try:
        stats = run(a, out)
    except BrokenPipeError:
        raise
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - every failure is one line for the user
        return failed("run", e)
    print(format_table(stats), file=out)
    if a.stats_json is not None:
        try:
            write_stats_json(a.stats_json, stats)
        except OSError as e:
            print("specmesh run: error: cannot write %s: %s" % (a.stats_json, e.strerror), file=sys.stderr)
            return 1  # checked writable before the run: this failed while writing (a full disk, /dev/full)
    return 0


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def cli(argv: Sequence[str] | None = None) -> int:
    """Entry point for tests and tools: `specmesh run` with these arguments."""
    p = argparse.ArgumentParser(prog="specmesh run")
    add_arguments(p)
    return main(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(cli())

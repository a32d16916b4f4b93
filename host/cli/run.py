"""`specmesh run`: set up the drafter and verifier back-ends, generate, stream the text, print the stats.

Back-ends by name, each made through the registry of host/backends/__init__.py: `cpu` (numpy engine on
the host), `torch-cpu`, `gpu`, `virtual` (a virtual board started and flashed for this run,
host/provision/cluster.py), or a serial port of a flashed board. `--plain` decodes with the verifier alone
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

from host import atomic, backends
from host.backends import BackendError, SessionParams, temp_milli, top_p_q16
from host.cli.output import TokenStream, format_table, write_stats_json
from host.cli.preflight import PreflightError, check_backends, check_context, check_models, unknown_backend
from host.cli.ranges import SEED, RangeError, in_range, probability
from host.decode.gamma import GammaController
from host.decode.orchestrator import Result, generate
from shared import messages as m

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
DEFAULT_PROMPT = "Once upon a time"
GAMMA_FLAG_MAX = 16  # the largest --gamma; a round drafts at most what both back-ends' HELLO allows


class UsageError(Exception):
    """Bad input from the user: one line, exit status 2."""


class GenerationFailed(Exception):
    """A back-end failed once generation had started (e.g. a board stopped answering): exit status 1."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="text to continue (default: %(default)r)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=0, help="target top-k, 0 = off (default: %(default)s)")
    p.add_argument("--top-p", type=float, default=1.0, help="target top-p, 1 = off (default: %(default)s)")
    p.add_argument("--draft-top-k", type=int, default=8, help="size of the drafter's q-hat tables (default: 8)")
    p.add_argument("--seed", type=int, default=0, help="session seed: same seed, same text (default: 0)")
    p.add_argument("--drafter", default="virtual",
                   help="PORT | auto (the flashed drafter board among the ESP32 USB ports) | virtual | cpu "
                        "(default: virtual)")
    p.add_argument("--verifier", default="virtual",
                   help="PORT | auto | virtual | cpu | torch-cpu | gpu (default: virtual)")
    p.add_argument("--gamma", default="auto", help="drafts per round: auto, or a fixed K >= 0 (default: auto)")
    p.add_argument("--transport", choices=("serial", "espnow"), default="serial",
                   help="how virtual boards reach each other and the host (default: serial)")
    p.add_argument("--radio-loss", type=float, default=0.0, metavar="P",
                   help="virtual radio: probability a packet is lost (espnow transport; default 0)")
    p.add_argument("--radio-dup", type=float, default=0.0, metavar="P",
                   help="virtual radio: probability a packet arrives twice (default 0)")
    p.add_argument("--spec-ahead", type=int, default=0, metavar="N",
                   help="virtual drafter board: tokens it drafts ahead while a verdict is pending (pipelined "
                        "speculation). Off by default in emulation: the virtual boards share the host's cores, "
                        "so drafting ahead slows the verifier (64 tokens, gamma 2: 13.3 -> 7.9 tok/s)")
    p.add_argument("--plain", action="store_true", help="target-only decoding on the same verifier (baseline)")
    p.add_argument("--stages", type=int, default=0, metavar="N",
                   help="verify on a pipeline of N virtual stage boards (classic ESP32s), the target's layers split "
                        "evenly, positions sent through as a wavefront (docs/pipeline.md; default 0: one verifier)")
    p.add_argument("--project", metavar="BOARD", choices=("esp32s3",),
                   help="also project the run onto real boards of this class (host/projection/hardware.py); "
                        "gamma is then chosen for that hardware")
    p.add_argument("--calibration", metavar="FILE", type=Path,
                   help="with --project: price the projection with a board's measurements (specmesh bench "
                        "--port PORT --out FILE) instead of the derived figures")
    p.add_argument("--key-file", metavar="F", type=Path,
                   help="sign and check every frame with this deployment key (boards flashed with the same "
                        "--key-file; virtual boards get it at flashing)")
    p.add_argument("--stats-json", metavar="FILE", help="write the run's figures as JSON")
    p.add_argument("--models", type=Path, default=MODELS,
                   help="folder with drafter.spm, target.spm and a llama2.c tokenizer.bin")
    p.add_argument("--no-color", action="store_true", help="never colour the streamed text")
    p.add_argument("--quiet", action="store_true", help="do not stream the text (the table is still printed)")


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


def check_ranges(a: argparse.Namespace) -> None:
    """Every numeric flag in its range (host/cli/ranges.py); --stages against the target's layers later."""
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


def check_args(a: argparse.Namespace) -> None:
    check_ranges(a)
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
    if a.stats_json:
        problem = atomic.unwritable(a.stats_json)
        if problem:
            raise UsageError("--stats-json %s cannot be written: %s" % (a.stats_json, problem))
    check_utf8(a.prompt)
    if a.calibration is not None and not a.project:
        raise UsageError("--calibration prices a projection: add --project esp32s3")
    a.rates = None
    if a.calibration is not None:
        from host.projection.calibration import CalibrationError, Rates  # noqa: PLC0415
        from host.projection.hardware import BOARDS  # noqa: PLC0415

        try:
            a.rates = Rates.load(a.calibration, BOARDS[a.project])
        except CalibrationError as e:
            raise UsageError(str(e)) from None
    a.key = None
    if a.key_file is not None:
        from host.provision.keys import KeyFileError, load_key  # noqa: PLC0415

        try:
            a.key = load_key(a.key_file)
        except KeyFileError as e:
            raise UsageError(str(e)) from None
    for name in (() if a.plain else ("drafter.spm",)) + ("target.spm", "tokenizer.bin"):
        if not (a.models / name).is_file():
            raise UsageError("%s is missing from %s: run `make train` or pass --models DIR" % (name, a.models))


def load_tokenizer(models: Path):
    from host.decode.tokenizer import Tokenizer, TokenizerError  # noqa: PLC0415

    try:
        return Tokenizer.from_llama2c(models / "tokenizer.bin")
    except TokenizerError as e:
        raise UsageError(str(e)) from None


class Setup(contextlib.ExitStack):
    """The back-ends of one run and everything they started (virtual boards, links), closed on exit: the
    `Boards` (host/backends/__init__.py) the board back-ends' factories take."""

    def __init__(self, a: argparse.Namespace):
        super().__init__()
        self.a = a
        self.key = a.key
        self._cluster = None

    def cluster(self):
        """The run's virtual boards (host/provision/cluster.py), opened on first use."""
        if self._cluster is None:
            from host.provision.cluster import Cluster  # noqa: PLC0415

            radio = None
            if self.a.transport == "espnow":
                from host.emulator.radio import RadioConfig  # noqa: PLC0415

                radio = RadioConfig(loss=self.a.radio_loss, duplicate=self.a.radio_dup, seed=self.a.seed)
            say = None if self.a.quiet else (lambda line: print("specmesh: " + line, file=sys.stderr, flush=True))
            self._cluster = self.enter_context(Cluster(self.a.transport, self.a.models, radio=radio,
                                                       spec_ahead=self.a.spec_ahead, key=self.key, say=say))
        return self._cluster

    def make(self, kind: str, name: str):
        """A drafter or verifier back-end for `--drafter NAME` / `--verifier NAME`, from the registry."""
        model = self.a.models / ("drafter.spm" if kind == "drafter" else "target.spm")
        if kind == "verifier" and self.a.stages:
            backend = self.cluster().pipeline(self.a.stages)
        else:
            fac = backends.factory(kind, name)
            if fac is None:
                raise UsageError(unknown_backend(kind, name) or name)
            backend = fac(model, name=name, boards=self)
        self.callback(backend.close)
        return backend


def build_stats(a, params: SessionParams, result: Result, text: str, verifier, drafter,
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
        "bus_bytes_per_token": result.bus_bytes / n if n else 0.0,
        "bus_bytes_per_token_by_link": {  # the host's link to each board (0 for an in-process back-end)
            "verifier": sum(r.bytes_verify for r in result.rounds) / n if n else 0.0,
            "drafter": sum(r.bytes_draft for r in result.rounds) / n if n else 0.0},
        "verifier": verifier.name,
        "drafter": drafter.name if drafter else None,
        "stop": result.stop,
        "context": verifier.max_seq,
        "seed": a.seed,
        "temperature": params.temperature,  # as applied: the nearest thousandth of --temperature
        "estimates": controller.summary(),
        "boards": [],
    }
    verifiers = [("stage", st) for st in getattr(verifier, "stages", ())] or [("verifier", verifier)]
    for role, b in verifiers + [("drafter", drafter)]:
        if b is None:
            continue
        try:
            s = b.stats()
        except BackendError as e:  # the text is out already; a board too short of heap to report is a note
            stats["boards"].append({"name": b.name, "role": role, "error": _one_line(e)})
            continue
        if "heap_free" in s:
            stats["boards"].append({"name": b.name, "role": role, "compute_s": s.get("compute_s"),
                                    "heap_free": s.get("heap_free"), "errors": s.get("errors", 0),
                                    "retransmits": s.get("retransmits", 0)})
            if role == "stage":  # the firmware's own counters, next to the host's trace of the same work
                stats["boards"][-1].update(positions=s.get("positions"), passes=s.get("passes"))
    if hasattr(verifier, "trace"):
        stats["pipeline"] = verifier.trace_summary()
    if projector is not None:
        stats["projection"] = projector.project(result, prompt_len)
    return stats


def run(a: argparse.Namespace, out=None) -> dict:
    """Generate as `a` says; returns the stats. Raises UsageError, BackendError and friends."""
    out = out if out is not None else sys.stdout
    check_args(a)
    fixed = parse_gamma(a.gamma)
    tok = load_tokenizer(a.models)
    prompt = tok.encode(a.prompt)
    names = {"verifier": a.verifier} if a.plain else {"verifier": a.verifier, "drafter": a.drafter}
    try:  # before anything starts: no board booted, no port held when one of these fails
        heads = check_models(a.models, sorted({*names, *(["drafter"] if a.project else [])}))
        check_context(len(prompt), heads["verifier"])
        n_layers = heads["verifier"].n_layers
        in_range("--stages", a.stages, 0, n_layers, "0: one verifier; at most the target's %d layers" % n_layers)
        names = check_backends(names, a.transport, a.key)
    except (PreflightError, RangeError) as e:
        raise UsageError(str(e)) from None
    from host.decode.tokenizer import BOS  # noqa: PLC0415

    # llama2.c's models end a story by starting the next one (BOS), so BOS ends the stream
    params = SessionParams(seed=a.seed, temperature=a.temperature, draft_top_k=a.draft_top_k,
                           target_top_k=a.top_k, top_p=a.top_p, eos=BOS)
    with Setup(a) as setup:
        verifier = setup.make("verifier", names["verifier"])
        drafter = None if a.plain else setup.make("drafter", names["drafter"])
        projector = cost_model = None
        # With sampling, which positions get a draft changes the text (the accept test and the residual
        # draw replace plain decoding's draw there), so an adaptive gamma fed wall-clock times would
        # make the same seed give different texts. Sampling with --gamma auto therefore chooses gamma
        # from the projected costs (deterministic); greedy text never depends on gamma.
        deterministic = a.temperature > 0 and fixed is None and drafter is not None
        if a.stages:  # the pipeline's own projection (host/projection/pipeline.py), in every stats JSON
            from host.projection.pipeline import LinksReport, PipelineProjector  # noqa: PLC0415

            on_host = names.get("drafter") == "cpu"  # the drafter back-end runs on this machine, not on a board
            cost_model = PipelineProjector(heads["verifier"], heads.get("drafter"), verifier.layers, "uart-921600",
                                           on_host)
            projector = LinksReport(heads["verifier"], heads.get("drafter"), verifier.layers, on_host)
        elif a.project or deterministic:
            from host.projection.rounds import Projector  # noqa: PLC0415

            cost_model = Projector(heads["verifier"], heads["drafter"], a.project or "esp32s3", a.transport,
                                   a.rates)
            projector = cost_model if a.project else None
        controller = GammaController(fixed=fixed) if fixed is None else GammaController(max_gamma=fixed, fixed=fixed)
        stream = None
        if not a.quiet:
            stream = TokenStream(lambda t: tok.pieces[t], out, color=False if a.no_color else None)
            out.write(a.prompt)
            out.flush()
        try:
            result = generate(prompt, verifier, drafter, params, a.max_tokens, controller,
                              on_round=stream.write if stream else None,
                              costs=cost_model.round_costs if cost_model else None,
                              fallback=None if a.verifier == "cpu" or a.stages else (
                                  lambda: setup.make("verifier", "cpu")),
                              on_failover=lambda line: print("\nspecmesh: " + line, file=sys.stderr, flush=True))
        except (BackendError, RuntimeError) as e:
            if stream:
                out.write("\n")
            raise GenerationFailed(_one_line(e)) from None
        if stream:
            stream.finish()
        stats = build_stats(a, params, result, tok.decode(result.tokens), verifier, drafter, controller, len(prompt),
                            projector)
        stats["gamma_costs"] = ("projected %s" % cost_model.board.name) if cost_model else "measured"
    return stats


def main(a: argparse.Namespace) -> int:
    try:
        return _main(a)
    except BrokenPipeError:  # `specmesh run | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _main(a: argparse.Namespace) -> int:
    try:
        stats = run(a)
    except BrokenPipeError:
        raise
    except UsageError as e:
        print("specmesh run: error: %s" % e, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nspecmesh run: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - every failure is one line for the user, never a traceback
        if os.environ.get("SPECMESH_DEBUG"):
            raise
        print("specmesh run: error: %s" % _one_line(e), file=sys.stderr)
        return 1 if isinstance(e, GenerationFailed) else 2
    print(format_table(stats))
    if a.stats_json:
        try:
            write_stats_json(a.stats_json, stats)
        except OSError as e:
            print("specmesh run: error: cannot write %s: %s" % (a.stats_json, e.strerror), file=sys.stderr)
            return 2
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

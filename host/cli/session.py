"""One mesh, built once: the session object `specmesh run`, `specmesh chat`, `specmesh serve` and the Python
API (`specmesh.Mesh`) all generate through.

A `Mesh` checks its configuration (host/cli/config.py `RunConfig`, the same checks and defaults as the
command line's flags), reads the tokenizer and the model headers, resolves the back-ends (preflight: nothing
started when one is wrong), then starts them once: the virtual boards, the ports' links, the host models.
Each generation begins a new stream on them (BEGIN carries the whole prompt), so a mesh serves any number of
generations, one after another or, where its back-ends allow, side by side:

- a *lane* is one drafter and one verifier back-end serving one stream at a time;
- a mesh with a board among its back-ends has one lane: requests wait for it in a first-come, first-served
  queue (`Mesh.lane`), and a request given up while waiting (a client gone) leaves the queue;
- a mesh of host back-ends only (`cpu`, `torch-cpu`, `gpu`; no drafter or a `cpu` one) opens up to
  `streams` lanes on demand, whose models share one `Batcher` per model file (host/backends/batcher.py):
  the pending forwards of concurrent streams run as one pass. The arithmetic is the same integers
  (docs/CONTRACTS.md section 4), so a stream's text does not depend on its neighbours.

Every generation may fail over: a verifier that fails is replaced by the `cpu` one (kept by the lane for the
generations after), a drafter that fails leaves the stream on plain decoding (host/decode/orchestrator.py), and
the lane's generations after it too; a board among them that stopped answering is asked HELLO again beside the
lane's next generations, waiting for none (one whose port went away has it opened again first), and is back in the lane
once it answered (`_Rejoin`). A board that did not answer at a generation's end (its stats, END_S: its row says so,
`stopped_line`) is asked HELLO first by the next (host/backends/board.py `begin`): still silent, that generation fails
over at once, sending it no request that would wait out its deadline.
A generation ends at the end token, `max_tokens`, a full context, a stop string, or when its `cancel` event
is set (checked after each round: the boards finish the round they are in and are left with nothing
pending; the next BEGIN starts them afresh).

`Mesh.generate` returns a `Completion` (text, token ids, stats); `Mesh.stream` is the same generation as an
iterator of `Piece`s, each round's visible text with the share that was accepted drafts, then the
`Completion`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import math
import operator
import os
import queue
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from numbers import Integral, Real
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specmesh.host import backends
from specmesh.host.backends import HOST_BACKENDS, PIPELINE, BackendError, SessionParams
from specmesh.host.backends.board import END_S, STOPPED, BoardBackend, PortLost, Silent, stopped_fix
from specmesh.host.backends.pipeline import PipelineVerifier, StageStopped
from specmesh.host.boardclasses import BOARD_CLASSES, ROLE_CLASS, class_of, drafter_class, stage_context
from specmesh.host.cli import registry
from specmesh.host.cli.config import KERNELS_UNPRICED, RV32_PROJECT, RunConfig, UsageError
from specmesh.host.cli.flags import a_path, add_arguments
from specmesh.host.cli.output import Segments, TextStream, Watch
from specmesh.host.cli.preflight import (PreflightError, check_backends, check_build, check_context, check_models,
                                         check_pair, check_tables, check_tokenizer, tokenizer_id,
                                         unknown_backend)
from specmesh.host.cli.ranges import SEED, STREAMS, RangeError, in_range, shown_typed
from specmesh.host.decode.gamma import GammaController
from specmesh.host.decode.orchestrator import Result, Round, generate
from specmesh.host.decode.stopstrings import StopScan, StopStrings
from specmesh.host.decode.tokenizer import BOS, lone_surrogate
from specmesh.host.decode.window import Window
from specmesh.host.layout import TOKENIZER_FILE, ngram_table
from specmesh.host.projection.measured import board_summary
from specmesh.host.provision.cluster import Failures, StaleFirmware, failures_line
from specmesh.host.provision.drafters import expected_alpha
from specmesh.host.provision.flash import again_args
from specmesh.shared.board import ROLES
from specmesh.shared.modelfile import ModelFileError

if TYPE_CHECKING:
    from specmesh.host.backends.batcher import Batcher

Say = Callable[[str], None]


class GenerationFailed(Exception):
    """A back-end failed once generation had started (e.g. a board stopped answering): exit status 1."""


class StageSilent(GenerationFailed):
    """A pipeline's stage stopped answering (its line has a run's fix: a caller that asks the stage again itself,
    the API's next generation or serve's next request, says its own: `Mesh.failed`)."""


def one_line(e: BaseException) -> str:
    """An exception as one line for the user: its first, or for a file the system refused, the file and why (not
    Python's "[Errno 13] Permission denied: 'path'")."""
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        return "cannot open %s: %s" % (e.filename, e.strerror)
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def config_from(**flags) -> RunConfig:
    """The RunConfig of `specmesh run` given these flags by their long names (`max_tokens=16`, `verifier="cpu"`),
    with the command line's defaults and checks; TypeError for a name that is no flag, UsageError for a value
    of the wrong kind (a string is read as the command line reads it: `max_tokens="16"`)."""
    actions = flag_actions()
    # the defaults as parse_args([]) gives them (no typed flag has a string default for it to convert)
    ns = argparse.Namespace(**{name: action.default for name, action in actions.items()})
    for name, value in flags.items():
        if name not in actions:
            raise TypeError("Mesh() got an unexpected option %r (the long flags of `specmesh run` are its options, "
                            "e.g. drafter, verifier, stages, gamma, models)" % name)
        setattr(ns, name, flag_value(actions[name], name, value))
    return RunConfig.from_args(ns)


@functools.cache
def flag_actions() -> dict[str, argparse.Action]:
    """`specmesh run`'s flags by their long names (argparse's own list of them: it has no public one)."""
    p = argparse.ArgumentParser()
    add_arguments(p)
    return {a.dest: a for a in p._actions if a.dest != "help"}


def flag_value(action: argparse.Action, name: str, value):
    """`value` for the flag `action` as its command-line parse would give it (an integer for a string flag as its
    digits: `gamma=3`); UsageError naming `name`."""
    kind = action.type
    want = ("an integer" if kind is int else "a number" if kind is float else "a path" if kind is a_path else
            "a string or an integer")  # a string flag takes an integer as its digits (gamma=3)
    if isinstance(action.default, list):  # an appending flag (--stop): one string or several
        values = [value] if isinstance(value, str) else [] if value is None else value
        if isinstance(values, (list, tuple)) and all(isinstance(v, str) for v in values):
            return list(values)
        want = "a string or a list of strings"
    elif value is None:  # not given: the flag's default (verifier=None: "virtual", as on the command line)
        return action.default
    elif action.nargs == 0:  # a switch (plain, quiet)
        if isinstance(value, bool):
            return value
        want = "true or false"
    elif isinstance(value, str) or (kind is None and isinstance(value, Integral) and not isinstance(value, bool)):
        value = str(value)
        if kind in (int, float):
            with contextlib.suppress(ValueError):
                return kind(value)
        elif kind is a_path:
            if value.strip():
                return Path(value)
            want = "a path that is not empty"  # Path("") would be the current folder
        elif action.choices and value not in action.choices:
            want = "one of " + ", ".join(action.choices)
        else:
            return value
    elif kind is a_path and isinstance(value, os.PathLike):
        return Path(value)
    elif kind in (int, float) and isinstance(value, Integral if kind is int else Real) and not isinstance(value, bool):
        try:  # Python's own number: a numpy unsigned seed wrapped around in the draws, which then failed
            return operator.index(value) if kind is int else float(value)
        except OverflowError:  # an integer beyond a float's range: refused by the range check, as inf
            return math.inf if value > 0 else -math.inf
    raise UsageError("%s must be %s, not %s" % (name, want, shown_typed(value)))


def check_ids(prompt: Sequence[int], vocab: int) -> None:
    """UsageError unless `prompt` is one token id or more, each an integer in 0..vocab - 1."""
    if len(prompt) == 0:
        raise UsageError("the prompt holds no token: give it text or at least one token id")
    for t in prompt:
        if isinstance(t, bool) or not isinstance(t, Integral) or not 0 <= t < vocab:
            raise UsageError("the prompt's token ids must be integers in 0..%d, not %s" % (vocab - 1, shown_typed(t)))


def load_tokenizer(models: Path):
    """The tokenizer of the --models folder; one that does not parse is a UsageError that says what to do
    (Tokenizer.of_models)."""
    from specmesh.host.decode.tokenizer import Tokenizer, TokenizerError

    try:
        return Tokenizer.of_models(models)
    except TokenizerError as e:
        raise UsageError(str(e)) from None


class Setup(contextlib.ExitStack):
    """The back-ends of one mesh and everything they started (virtual boards, links), closed on exit: the
    `Boards` (host/backends/__init__.py) the board back-ends' factories take."""

    def __init__(self, config: RunConfig, say: Say | None = None):
        super().__init__()
        self.config = config
        self.say = say
        self._batchers: dict[str, Batcher] = {}
        self._natives: dict[str, bool] = {}
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
            self._cluster = self.enter_context(Cluster(c.transport, c.models, radio=radio, spec_ahead=c.spec_ahead,
                                                       key=self.key, say=self.say, files=c.named_models()))
        return self._cluster

    def make(self, kind: str, name: str, batched: bool = False):
        """A drafter or verifier back-end for `--drafter NAME` / `--verifier NAME`, from the registry; `batched`:
        a `cpu` one for one of several lanes, whose model is shared through a Batcher with the others' where this
        host has no engine process for it (`_native`)."""
        if batched and name == "cpu" and not self._native(kind):
            backend = self._batched(kind)
        else:
            fac = registry.factory(kind, name)
            if fac is None:
                raise UsageError(unknown_backend(kind, name) or name)
            backend = fac(self.config.model_file(kind), name=name, boards=self, stop_margin=self._stop_margin(kind),
                          copies_from=self.config.model_file("verifier"))
        self.callback(backend.close)
        if kind == "drafter" and not hasattr(backend, "table"):
            backend.table = self._board_table(backend)
            backend.copies = backends.load_ngram_table(self.config.model_file("verifier")) if backend.table else None
        return backend

    def _board_table(self, drafter):
        """The n-gram table of the model a drafter board runs (the file its HELLO names, beside the one given, else
        the one given), read on the host: `specmesh flash` put the same file beside it. A board drafter with one has
        the target's table as its `copies`, whose chains the decode loop copies into plain rounds (host/decode/
        lookup.py), as a host drafter with a table has: the verifier's model file's, whatever `--verifier` runs. None
        without one."""
        return backends.load_ngram_table(running_file(drafter, self.config.model_file("drafter")))

    def _native(self, kind: str) -> bool:
        """Whether this host runs `kind`'s model on the board's engine in a process (host/backends/pipeengine.py):
        then each lane has its own, alone faster than numpy's batches of 16 streams (`python -m specmesh.tools.bench
        serve`); else the lanes share a Batcher."""
        if kind not in self._natives:
            from specmesh.host.backends.pipeengine import PipeEngine

            engine = PipeEngine.start(self.config.model_file(kind))
            self._natives[kind] = engine is not None
            if engine is not None:
                engine.close()
        return self._natives[kind]

    def _batched(self, kind: str):
        """A `cpu` drafter or verifier on the numpy `IntModel` of its file, one Batcher per file for the mesh."""
        from specmesh.host.backends.arraymath import IntModel
        from specmesh.host.backends.batcher import Batcher, StreamEngine

        path = self.config.model_file(kind)
        if kind not in self._batchers:
            try:
                batcher = Batcher(IntModel(path))
            except (OSError, ValueError, ModelFileError) as e:
                raise BackendError("cannot load model %s: %s" % (path, e)) from None
            self.callback(batcher.close)  # after the streams' close (callbacks run last in, first out)
            self._batchers[kind] = batcher
        engine = StreamEngine(self._batchers[kind])
        self.callback(engine.close)
        stream = backends.EngineStream(None, engine=engine)
        role = backends.LocalVerifier if kind == "verifier" else backends.LocalDrafter
        return role(path, stream=stream, stop_margin=self._stop_margin(kind),
                    copies_from=self.config.model_file("verifier"))

    def _stop_margin(self, kind: str) -> int:
        """A host drafter's unsure-draft margin (host/backends LocalDrafter): under gamma auto, which plans each
        block's length, for one verifier; a fixed --gamma N drafts N, and stages (`--stages N`), whose wavefront
        prices a verified position at a fraction of a pass, get every draft (with it the bench's 5 S3 stages fell
        from 2.09x to 2.00x)."""
        c = self.config
        return backends.UNSURE_MARGIN if kind == "drafter" and c.gamma is None and not c.pipeline else 0


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
        # plain rounds' shadow drafts (host/decode/gamma.py): how many ran beside the verify, how many were the token
        "shadow_drafts": result.shadows,
        "shadow_hits": result.shadow_hits,
        # drafting rounds whose drafts the drafter had made beside the verify before (host/decode/ahead.py)
        "ready_rounds": result.ready_rounds,
        # plain rounds that verified drafts copied from the text instead (host/decode/lookup.py)
        "lookup_rounds": result.lookups,
        "lookup_drafts": result.lookup_drafts,
        "lookup_accepted": result.lookup_accepted,
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
        # role -> the back-end that failed mid-run (its line: failovers)
        "failed": {role: f.name for role, f in result.failed.items()},
        "drafter_window": window_stats(result, prompt_len, drafter.max_seq) if drafter else None,
        "drafter_model": (drafter.info.get("model") if hasattr(drafter, "info") else
                          config.model_file("drafter").name) if drafter else None,
        "stop": result.stop,
        "rounds": len(result.rounds),  # verifications: 0 for a generation cancelled before it began
        "context": verifier.max_seq,
        "seed": params.seed,
        "temperature": params.temperature,  # as applied: the nearest thousandth of --temperature
        "estimates": controller.summary(),
        "boards": board_stats(verifier.parts("verifier") + (drafter.parts("drafter") if drafter else []), n,
                              projector, set(result.failed)),
    }
    stats.update(verifier.report())
    if projector is not None:
        stats["projection"] = projector.project(result, prompt_len)
    return stats


def window_stats(result: Result, prompt_len: int, context: int) -> dict:
    """The drafter's sliding window (host/decode/window.py) over the run: its context, the tokens a re-prime
    keeps, the re-primes, the generated token at which the first came, and how the rounds from there on and those
    of the run's second half speculated."""
    first = next((i for i, r in enumerate(result.rounds) if r.reprime), None)
    half = len(result.tokens) // 2

    def share(rounds: list[Round]) -> dict:
        return {"rounds": len(rounds), "drafting_rounds": sum(1 for r in rounds if r.drafter_drafts),
                "tokens_per_verification": sum(r.n_committed for r in rounds) / len(rounds) if rounds else None}

    return {"context": context, "keep": Window(context).keep, "reprimes": sum(1 for r in result.rounds if r.reprime),
            "first_reprime_token": None if first is None else result.rounds[first].pos0 - prompt_len,
            "after_first_reprime": share(result.rounds[first:] if first is not None else []),
            "second_half": share([r for r in result.rounds if r.pos0 - prompt_len >= half])}


def board_stats(parts: list, tokens: int = 0, projector=None, failed: AbstractSet[str] = frozenset()) -> list[dict]:
    """One entry per board among the back-ends' parts (role, back-end): in-process ones report no heap. A board
    under QEMU adds the instructions it executed (per generated token, per pass), which a projector that prices
    them (host/projection/measured.py) takes too. The parts of a role in `failed` (it failed mid-run) are not
    asked: a board that hangs would hold the generation for its reply's whole deadline once more; nor is the stage
    that made a pipeline verifier fail (it stopped answering mid-run: its row says it failed, not that it stopped at
    the text's end, which `stopped_line` would say). A board is waited for END_S at most (the text is out): one silent
    that long stopped answering (its row says so; `stopped_line`)."""
    out = []
    for role, b in parts:
        if role in failed or (role == "stage" and "verifier" in failed and getattr(b, "stopped", False)):
            out.append({"name": b.name, "role": role, "error": "failed during the run, not asked"})
            continue
        try:
            s = b.generation_stats(END_S) if isinstance(b, BoardBackend) else b.stats()  # this generation's work
        except Silent as e:
            out.append({"name": b.name, "role": role, "error": "%s at the text's end: %s" % (STOPPED, e.why)})
            continue
        except BackendError as e:  # the text is out already; a board too short of heap to report is a note
            out.append({"name": b.name, "role": role, "error": one_line(e)})
            continue
        if "heap_free" in s:
            # the board's class as its HELLO tells it (host/boardclasses.py class_of: its MCU, else its heap)
            cls = class_of(s.get("board") or "", s["heap_free"]).name
            # machine: what its HELLO names the board (os.uname().machine: the core QEMU runs, on a virtual one)
            out.append({"name": b.name, "role": role, "class": cls, "machine": s.get("board") or "",
                        "compute_s": s.get("compute_s"),
                        "heap_free": s.get("heap_free"),
                        "errors": s.get("errors", 0), "retransmits": s.get("retransmits", 0),
                        "resyncs": s.get("resyncs", 0),  # times it was begun again after it lost its session
                        "kernels": s.get("kernels"), "kernels_note": s.get("kernels_note", "")})
            if role == "stage":  # the firmware's own counters, next to the host's trace of the same work
                out[-1].update(positions=s.get("positions"), passes=s.get("passes"))
                if "classifier" in s:  # the last stage: the classifier in its heap, or streamed (cls_reads passes)
                    out[-1].update(classifier=s["classifier"], cls_reads=s.get("cls_reads"))
            out[-1].update(board_summary(s, tokens))
            if hasattr(projector, "measure"):
                projector.measure(role, s, getattr(b, "info", {}).get("model", ""))
    return out


# the line of a board that a lane dropped when it stopped answering and that answered again (`Mesh._rejoin`), by role
REJOINED = {"drafter": "drafter %s answers again: it drafts again from this generation on",
            "verifier": "verifier %s answers again: it verifies again from this generation on, in the cpu verifier's "
                        "place"}
# a dropped board whose HELLO another board answered (another role or model on its port: BoardBackend.answers `other`),
# said once: the lane's back-end holds the first board's model and context, so only a new mesh takes this one
OTHER_BOARD = ("%s %s answers again, but as another board (%s): it stays out; run the command again (or make a new "
               "Mesh) to use that board")
# what a fail-over's line adds of a drafter or verifier board whose port went away (host/backends/board.py
# `PortLost`), on a mesh whose later generations ask it again (`Mesh.rejoins`: `_Rejoin`, which opens its port first)
PORT_BACK = "; its port went away: later generations open it again, and the board rejoins once its port is back"
# what the next generation of a long-lived mesh does with a board still silent when it asks it again, by its role
STILL_SILENT = {"drafter": "goes on with plain decoding", "verifier": "the cpu verifier takes over",
                "stage": "fails with its line (no board replaces a stage)"}


def stopped_line(boards: list[dict], next_one: str | None = None) -> str | None:
    """The line of the boards whose stats row says they stopped answering (`board_stats`: at the text's end, its last
    early position or its STATS unanswered), each with what to do; None when none did. `next_one`: what comes next on
    the same mesh ("turn": a chat's, "request": serve's), which asks each such board HELLO first (board.py `begin`,
    pipeline.py `_revive`) and, where it is still silent, fails over at once (`STILL_SILENT`); None: a run's end."""
    said = ["%s stopped answering at the text's end (the text is whole; its stats are missing): %s"
            % (b["name"], stopped_fix(b["name"]) if next_one is None else _asked_again(b, next_one))
            for b in boards if b.get("error", "").startswith(STOPPED)]
    return "; ".join(said) or None


def _asked_again(board: dict, next_one: str) -> str:
    """What the line of `stopped_line` says of `board` on a mesh whose `next_one` asks it again: a virtual board, which
    only a new mesh starts afresh, needs nothing done; a real one is looked at too."""
    again = "the next %s asks it again first and %s if it is still silent" % (next_one, STILL_SILENT[board["role"]])
    return again if board["name"].startswith("virtual:") else again + "; " + stopped_fix(board["name"])


def projection(config: RunConfig, heads: dict, verifier, drafter, on_host: bool, deterministic: bool):
    """(cost model, projector): what prices each round for gamma's choice, and what projects the run for the
    stats (None, None when neither is asked for). A pipeline always reports its own projection."""
    table = not on_host and ngram_table(config.model_file("drafter")) is not None  # a board drafter's n-gram table
    # the pipeline's own projection (host/projection/pipeline.py), in every stats JSON; not once the cpu verifier took
    # over from real stage boards (a long-lived mesh's next generation: it has no stages to price)
    if isinstance(verifier, PipelineVerifier):
        from specmesh.host.projection.pipeline import STAGE_LINKS, LinksReport, PipelineProjector

        # stages of the class --project names (one with stages: the S3), else the class rule's classic ESP32s
        cls = config.project if config.project in STAGE_LINKS else ROLE_CLASS["stage"]
        return (PipelineProjector(heads["verifier"], heads.get("drafter"), verifier.layers, STAGE_LINKS[cls][0], on_host,
                                  config.kernels, cls, drafter_table=table),
                LinksReport(heads["verifier"], heads.get("drafter"), verifier.layers, on_host, config.kernels, cls))
    if config.measured_projection:  # priced from the instructions its boards execute
        from specmesh.host.projection.measured import LiveCosts, MeasuredProjector
        from specmesh.host.projection.rounds import Projector

        # each role on its own board's class (an ESP32 drafter beside an S3 verifier), a cpu drafter on the host
        drafts_on = config.drafter.partition(":")[2] or config.project
        measured = MeasuredProjector(heads["verifier"], heads["drafter"], config.project, config.transport,
                                     drafts_on, on_host, table)
        derived = None if config.project in RV32_PROJECT else Projector(  # an Xtensa class's own cost model
            heads["verifier"], heads["drafter"], config.project, config.transport, drafter_on_host=on_host,
            drafter_board=drafts_on, drafter_table=table)
        if deterministic:  # sampling: gamma from derived costs, so that a seed gives one text
            if derived is None:
                return Projector(heads["verifier"], heads["drafter"], "esp32s3", config.transport), measured
            return derived, measured
        boards = [("verifier", verifier)] + ([("drafter", drafter)] if drafter is not None and not on_host else [])
        return LiveCosts(measured, boards, derived), measured
    virtual = virtual_classes(config, on_host)
    if config.project or deterministic or virtual:
        from specmesh.host.projection.rounds import Projector

        board, drafts_on = config.project or ROLE_CLASS["verifier"], drafter_class(config.transport)
        if virtual and not (config.project or deterministic):
            board, drafts_on = virtual
        projector = Projector(heads["verifier"], heads["drafter"], board, config.transport, config.rates,
                              config.kernels, drafter_on_host=on_host, drafter_board=drafts_on,
                              drafter_rates=config.drafter_rates, drafter_table=table)
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


def preflight(config: RunConfig, tok) -> tuple[dict, dict]:
    """(model headers by role, back-end names by role with `auto` resolved), checked before anything starts:
    no board booted, no port held when one of these fails; `tok` encodes the prompt (only when it may fit)."""
    names = config.backend_names
    try:
        roles = sorted({*names, *(["drafter"] if config.project else [])})
        headers = check_models({r: config.model_file(r) for r in roles}, roles)
        if "drafter" in names:
            check_tables(names["drafter"], config.model_file("drafter"), config.model_file("verifier"))
        if "drafter" in headers:
            check_pair(headers["verifier"], headers["drafter"].vocab, headers["drafter"].tokenizer_id,
                       str(config.model_file("drafter")), tok_id=tokenizer_id(tok),
                       target_path=config.model_file("verifier"))
        check_tokenizer(tok, headers["verifier"], config.models / TOKENIZER_FILE, config.model_file("verifier").name)
        least = tok.least_tokens(config.prompt)
        check_context(least if least >= headers["verifier"].max_seq else len(tok.encode(config.prompt)),
                      headers["verifier"], config.model_file("verifier").name, config.prompt_from,
                      at_least=least >= headers["verifier"].max_seq)
        n_layers = headers["verifier"].n_layers
        in_range("--stages", config.stages, 0, n_layers, "0: one verifier; at most the target's %d layers" % n_layers)
        if config.stages:
            plan_stages(headers["verifier"], config.stages, stage_class(config))
            check_stage_context(len(tok.encode(config.prompt)), headers["verifier"], stage_class(config),
                                config.prompt_from)
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


def check_stage_context(prompt_tokens: int, target, cls_name: str, source: str) -> None:
    """The prompt must leave room for a generated token in the context of a `cls_name` stage board too, which is
    shorter than the target's without PSRAM (STAGE_CTX): PreflightError before any board boots (it was found
    after booting them all, in a line without the fix)."""
    from specmesh.host.boardclasses import BOARD_CLASSES, stage_context

    ctx = stage_context(target, BOARD_CLASSES[cls_name])
    if prompt_tokens >= ctx:
        raise PreflightError("the prompt is %d tokens but an %s stage board's context holds %d: shorten the prompt "
                             "from %s, or stage boards with PSRAM: --verifier virtual:esp32s3"
                             % (prompt_tokens, cls_name, ctx, source))


def running_model(backend) -> str:
    """The file name of the model a board back-end's HELLO says it runs ("" for an in-process back-end)."""
    return getattr(backend, "info", {}).get("model", "").rsplit("/", 1)[-1]


def gamma_controller(config: RunConfig, drafter) -> GammaController:
    """--gamma N fixed, or gamma auto starting from the drafter's acceptance on the model card when it is a
    shipped drafter (the file a drafter board reports running, else the one named)."""
    if config.gamma is not None:
        return GammaController(max_gamma=config.gamma, fixed=config.gamma)
    controller = GammaController() if config.draft_max is None else GammaController(max_gamma=config.draft_max)
    if drafter is not None:
        name = running_model(drafter) or config.model_file("drafter").name
        controller.expect(expected_alpha(name, config.greedy))
    return controller


def _check_running_drafter(drafter, target, given: Path, key: bytes | None = None) -> None:
    """A drafter board may run another model than the file the host checked (flashed before, by hand): its
    HELLO's vocabulary must be the target's, before any text (host/cli/preflight.py `check_pair`). The fix on a port
    is the flash command that gives it `given`, the run's drafter file (checked against the target already): the
    run's --draft-model would not change what the board runs. `key`: the run's (its boards are flashed with it)."""
    vocab = getattr(drafter, "info", {}).get("vocab")
    if vocab is None:
        return
    fix = ("flash it with this run's drafter, made with the target's tokenizer (`specmesh flash --port %s %s --model "
           "%s`)" % (drafter.name, _flash_args(drafter, key), given)) if backends.is_port(drafter.name) else None
    try:
        check_pair(target, vocab, 0, "on %s (%s)" % (drafter.name, running_model(drafter) or "its model"), fix)
    except PreflightError as e:
        raise UsageError(str(e)) from None


def _check_found_verifier(config: RunConfig, verifier) -> None:
    """UsageError where a flag that goes by whether the verifier is a pipeline does not go with the one found: a single
    port (`--verifier PORT`, `auto`) whose board is a stage verifies as a pipeline of one (host/provision/stageports.py),
    projected from its stage's derived rates, which take no --calibration or --drafter-calibration (refused as config.py
    refuses them with a pipeline the flags name); one whose board verifies alone prices --kernels only with --project
    (config.py leaves that to the board found)."""
    if not isinstance(verifier, PipelineVerifier):
        if config.kernels_given and not (config.project or config.pipeline):
            raise UsageError(KERNELS_UNPRICED % config.kernels + " (the board on %s verifies alone, no stage board's "
                             "pipeline, which projects itself)" % verifier.name)
        return
    if config.pipeline:  # config.py has checked them
        return
    for flag, given in (("--calibration", config.rates), ("--drafter-calibration", config.drafter_rates)):
        if given is not None:
            raise UsageError("%s prices a single verifier board: the board on %s is a stage board, a pipeline of one "
                             "stage, projected from its stage's derived rates, which take no calibration: drop %s"
                             % (flag, verifier.stages[0].name, flag))


def _flash_args(board, key: bytes | None) -> str:
    """The arguments after --port of the `specmesh flash` command that flashes `board` again in its place
    (flash.again_args; `key`: the run's)."""
    return again_args(ROLES[board.role], board.flash_role(), board.proxy.node, key is not None)


def running_file(backend, given: Path) -> Path:
    """The file this host takes a back-end's model for: the one a board's HELLO names when it lies beside `given`
    (e.g. drafter.spm on an S3 drafter board where its class's drafter was assumed), else `given`."""
    name = running_model(backend)
    return given.parent / name if name and (given.parent / name).is_file() else given


def _drafter_head(path: Path, given: Path, head):
    """The header of `path`, the model file a drafter board runs (`running_file`): `head`, `given`'s, when it is
    `given`."""
    if path == given:
        return head
    try:
        return check_models({"drafter": path}, ["drafter"])["drafter"]
    except PreflightError as e:
        raise UsageError(str(e)) from None


def _wrong_builds(backend, path: Path, head, key: bytes | None = None) -> list[str]:
    """Every board of a back-end (a pipeline's stages, else the back-end itself; a host one has none) must run the
    build of `path` (header `head`), as its HELLO's model crc says: checked before any text (host/cli/preflight.py
    `check_build`); the line of each that does not, with its flash command (`_flash_args`; `key`: the run's)."""
    wrong = []
    for board in getattr(backend, "stages", [backend]):
        if not hasattr(board, "info"):
            continue
        try:
            check_build(board.info["model_crc"], path, head, ROLES[board.role], board.name, running_model(board),
                        _flash_args(board, key))
        except PreflightError as e:
            wrong.append(str(e))
    return wrong


@dataclass
class Piece:
    """One round's visible text (stop strings applied), the first `accepted` characters of which were drafts
    the verifier accepted, and the round's figures: drafts accepted, tokens it added to the text (the end token
    not counted), its seconds."""

    text: str
    accepted: int
    n_accepted: int
    n_committed: int
    round_s: float
    segments: Segments = field(default_factory=list, repr=False)  # (text, was a draft), in order


@dataclass
class Completion:
    """A finished generation: its text (prompt excluded, ending before a stop string), why it stopped
    ("eos", "max_tokens", "context", "stop" or "cancelled") and the run's stats (`specmesh run --stats-json`; one
    cancelled before it began has the same keys, of no rounds and no tokens)."""

    text: str
    token_ids: list[int]
    stop: str
    stats: dict = field(repr=False)


class Stream(Iterator[Piece | Completion], contextlib.AbstractContextManager):
    """Mesh.stream()'s iterator; `with mesh.stream(...) as items:` closes it as the block is left, however left.
    A `for` loop left by `break` does not close what it iterates: an iterator still referenced (a name, a list)
    keeps its generation running on its lane to its end (max_tokens at most), holding up the generations waiting
    for that lane; `with`, or `close()`, ends it after its round."""

    def __init__(self, items: Generator[Piece | Completion, None, None], cancel: _Cancel, idle: threading.Event):
        self._items, self._cancel = items, cancel
        self._idle = idle  # set while no generation of it runs (Mesh._pieces)

    def __next__(self) -> Piece | Completion:
        return next(self._items)

    def close(self) -> None:
        """End the generation after its current round (nothing, once it has ended): in the thread that iterates it,
        waiting for that round, its items left unread; from another (a stop button's), at once, the iterating thread
        reading the rest, the last its Completion (stop "cancelled")."""
        self._cancel.set()
        try:
            self._items.close()
        except ValueError:  # "generator already executing": another thread waits in it
            return
        self._idle.wait()

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class Lane:
    """One drafter (None: plain decoding) and one verifier serving one stream at a time."""

    verifier: object
    drafter: object | None
    # by role, each board the lane dropped because it stopped answering, asked again until it rejoins (`_Rejoin`)
    gone: dict[str, _Rejoin] = field(default_factory=dict)
    # by role, how many times in a row its board rejoined and stopped answering again before a whole generation ended
    # (`_Rejoin`'s first HELLO waits the longer: a board that answers HELLO and then hangs each request)
    relapses: dict[str, int] = field(default_factory=dict)
    cpu: object | None = None  # the cpu verifier that took over from its verifier board (`Mesh._fall_back`)

    def idle(self, idle: bool = True) -> None:
        """Mark its streams of shared models idle (a free lane) or busy: a Batcher waits only for busy ones."""
        for backend in (self.verifier, self.drafter):
            engine = getattr(getattr(backend, "stream", None), "engine", None)
            if hasattr(engine, "idle"):
                engine.idle(idle)


REJOIN_SKIP = 32  # the most generations a board that stays silent lets begin between two HELLOs (`_Rejoin`)


def _silent(board, error: BaseException | None) -> bool:
    """Whether `board`, a back-end a generation began on, failed in it by no longer answering, so that a later one may
    ask it again (`_Rejoin`): a drafter or verifier board (`Silent`), or a pipeline on real stage boards whose stage
    did (`StageStopped`: the cpu verifier took its place)."""
    return (isinstance(board, BoardBackend) and isinstance(error, Silent)
            or isinstance(board, PipelineVerifier) and isinstance(error, StageStopped))


class _Rejoin:
    """A board a lane dropped because it stopped answering (a request or a generation's first HELLO unanswered: a hang,
    a reset, a USB hub's hiccup; its port gone, host/backends/board.py `PortLost`, which `answers` opens again first;
    or a pipeline verifier whose stage did, host/backends/pipeline.py `answers`),
    asked HELLO again from a thread of its own as a later generation begins (`back`), which waits for nothing: one
    HELLO at a time, the first at the next generation's start, and after k unanswered in a row only once 2**(k-1) more
    generations began (REJOIN_SKIP at most), so a board that stays silent costs a HELLO now and then and no line. A
    board dropped again in the generation it rejoined, `relapses` times in a row (it answers HELLO, then lets each
    request wait out its deadline), is asked first after 2**relapses - 1 generations (REJOIN_SKIP at most), so such a
    board holds up a generation now and then, not every other one. Its bus carries nothing else to it meanwhile: the
    lane's generations run without it, its stats are not asked."""

    def __init__(self, board: BoardBackend | PipelineVerifier, relapses: int = 0):
        self.board = board
        self.unanswered = 0  # HELLOs in a row it left unanswered
        self.skip = min(2 ** relapses - 1, REJOIN_SKIP)  # generations to begin before the next HELLO
        self.answered = False
        self.asking: threading.Thread | None = None
        self.told = False  # that another board answered in its place (OTHER_BOARD), said once

    def back(self) -> bool:
        """At a lane's generation's start: whether the board answered a HELLO since (it rejoins the lane for this
        generation); else one is sent, where due, its answer read by a later generation's `back`."""
        if self.asking is not None:
            if self.asking.is_alive():
                return False
            self.asking = None
            if self.answered:
                return True
            self.unanswered += 1
            self.skip = min(2 ** (self.unanswered - 1), REJOIN_SKIP)
        if self.skip:
            self.skip -= 1
            return False
        self.asking = threading.Thread(target=self._ask, name="specmesh-rejoin", daemon=True)
        self.asking.start()
        return False

    def _ask(self) -> None:
        try:
            self.answered = self.board.answers(END_S)
        except Exception:  # noqa: BLE001 - (a link closed under it as the mesh closes) silent, said nowhere
            self.answered = False


# `specmesh run`'s flags of one generation, which a Mesh (many generations) takes no value for (serve refuses them too)
ONE_GENERATION = ("prompt", "prompt_file", "stats_json", "quiet")
# what the Python API's caller does about a stage that stopped answering: each generation asks it HELLO first
# (host/backends/pipeline.py REVIVE_S), so `Mesh.failed` says this in place of a run's "run again"
CALL_AGAIN = "call generate again: the next generation asks the stage again first"


class Mesh(contextlib.AbstractContextManager):
    """The session object: a mesh's back-ends, started once, and generation on them.

    `Mesh(drafter="virtual", verifier="cpu", **flags)` takes `specmesh run`'s long flags as keywords (`stages=2`,
    `gamma="3"`, `models="models"`, ...; their defaults too) and raises UsageError for a bad one; `streams`: how
    many generations may run at once when its back-ends are all on the host; `say`: where the boards' start-up
    lines go, `warn`: where a fail-over's line goes, and a generation's line for a board that stopped answering at
    its text's end (`stopped_line`; with no `warn`, its row in the stats alone says so) (default: `say`). Close it
    (or use `with`) to stop the boards it started; dropped unclosed, it stops them as it is collected."""

    # whether later generations follow: they ask a board a lane dropped again (`_Rejoin`), which a fail-over's line
    # for a lost port says (PORT_BACK); `specmesh run`'s one generation has none
    rejoins = True

    def __init__(self, drafter: str | None = None, verifier: str = "virtual", *, streams: int = 1,
                 say: Say | None = None, warn: Say | None = None, config: RunConfig | None = None, **flags):
        for name, hook in (("say", say), ("warn", warn)):  # found before any board boots, not at its first line
            if hook is not None and not callable(hook):
                raise TypeError("%s must be a function taking each line (a str), not %r" % (name, hook))
        if config is not None and not isinstance(config, RunConfig):
            raise TypeError("config must be a RunConfig (Mesh.from_config), not %r" % (config,))
        given = [f for f in ONE_GENERATION if flags.get(f) not in (None, False)]
        if given:
            raise UsageError("%s belongs to one generation, not to a Mesh: pass the prompt to generate(), and read "
                             "its Completion's stats" % given[0])
        if drafter is not None:  # left out: run's default (virtual), and no "not used" note beside plain=True
            flags["drafter"] = drafter
        self.config = config if config is not None else config_from(verifier=verifier, **flags)
        if not isinstance(streams, int) or isinstance(streams, bool):
            raise UsageError("streams must be an integer, not %r" % (streams,))
        try:
            in_range("streams", streams, *STREAMS)
        except RangeError as e:
            raise UsageError(str(e)) from None
        self.say = say
        self.warn = warn or say
        for note in self.config.notes if config is None and say is not None else ():  # (from_config: its caller's)
            say("note: " + note)  # an option given that changes nothing, as run says it on stderr
        self.tok = load_tokenizer(self.config.models)
        self.eos = BOS  # llama2.c's models end a story by starting the next one (BOS)
        self.headers, self.names = preflight(self.config, self.tok)
        self.on_host = self.names.get("drafter") == "cpu"  # the drafter runs on this machine, not on a board
        host_only = all(n in HOST_BACKENDS for n in self.names.values())
        self.streams = streams if host_only else 1
        self._setup = Setup(self.config, say)
        self._lock = threading.Lock()
        self._lanes: list[Lane] = []
        self._free: deque[Lane] = deque()
        self._waiting: deque[_Ticket] = deque()
        self._closed = False
        self._pid = os.getpid()  # its back-ends' process: a child forked from it cannot use them
        # a Mesh dropped unclosed (a notebook's cell run again) releases its back-ends as it is collected, as a file
        # closes: its virtual boards ran on, their folders held, and the next Mesh was refused as "in use by another
        # specmesh run" of this same process. Not at exit, where the boards are stopped anyway (host/emulator/board.py)
        self._drop = weakref.finalize(self, _collected, self._setup, self._pid)
        self._drop.atexit = False
        self._holders: dict[int, int] = {}  # thread ident -> lanes it holds (lane())
        self._running: dict[_Cancel, int] = {}  # each generation's own cancel event -> its thread's ident
        self._ended = threading.Condition(self._lock)  # notified as each generation ends
        try:
            self._release(self._new_lane())
            _check_found_verifier(self.config, self._lanes[0].verifier)
        except BaseException:
            self._released()
            raise

    def _released(self) -> None:
        """Its back-ends released now, in this thread, once (a collection after finds nothing to do)."""
        if self._drop.detach() is not None:
            _release_setup(self._setup, self._pid)

    @classmethod
    def from_config(cls, config: RunConfig, streams: int = 1, say: Say | None = None, warn: Say | None = None
                    ) -> Mesh:
        return cls(config=config, streams=streams, say=say, warn=warn)

    def close(self, wait_s: float = 60.0) -> None:
        """Stop the boards it started and release its back-ends. Generations running in other threads are told to
        end after their round (their stop: "cancelled") and waited for, up to `wait_s`, first: released under
        them, their boards would seem to fail and the cpu verifier take over. A Ctrl-C in that wait releases them
        at once."""
        me = threading.get_ident()
        try:
            with self._lock:
                self._closed = True
                for cancel in self._running:
                    cancel.set()
                self._ended.wait_for(lambda: all(ident == me for ident in self._running.values()), timeout=wait_s)
        finally:
            self._released()
            for lane in self._lanes:  # a HELLO of a board's `_Rejoin` still asking, ended by its closed link
                for gone in lane.gone.values():
                    if gone.asking is not None:
                        gone.asking.join(END_S)

    def __exit__(self, *exc) -> None:
        self.close()

    def __reduce__(self):
        """Refused in one line: a Mesh handed to a spawned process (multiprocessing's args) failed on Python's "Can't
        pickle local object '_BaseExitStack._create_cb_wrapper...'"; a copy would share its back-ends."""
        raise TypeError("a Mesh cannot be pickled or copied (to another process, say): its back-ends are this "
                        "process's; make a new Mesh where it is needed")

    @property
    def context(self) -> int:
        """Positions the target's context holds: prompt and text together; on a pipeline, what its stage boards keep
        of it (128 on classic ESP32s, without PSRAM), which serve's and chat's checks must take: a longer prompt
        fails in the decode loop; on real stage boards, the shortest their HELLOs give."""
        target = self.headers["verifier"]
        if self.config.stages:
            return stage_context(target, BOARD_CLASSES[stage_class(self.config)])
        if isinstance(self._lanes[0].verifier, PipelineVerifier):  # real stage boards: what their HELLOs say
            return min(target.max_seq, getattr(self._lanes[0].verifier, "max_seq", target.max_seq))
        return target.max_seq

    # -- lanes -------------------------------------------------------------------------------------

    @property
    def failed(self) -> str | None:
        """Why every generation fails at once, where each does (every lane's verifier is a pipeline whose stage stopped
        answering, and no board replaces a stage), in the Python API's words: `generate` and `stream` fail with this
        line (GenerationFailed) until a generation finds the stage answering again (its HELLO); else None."""
        line = self.stalled(again=True)
        return None if line is None else "%s; %s" % (line, CALL_AGAIN)

    def stalled(self, again: bool = False) -> str | None:
        """The line of a stage that stopped answering, where every lane's verifier is a pipeline with one (else None),
        with a run's fix ("run again": what `complete` fails with, `PipelineVerifier.stalled`); `again`: for a caller
        that asks the stage again itself (chat's next turn, serve's next request, the API's next generation, each
        saying so: `failed`), less that "run again"."""
        with self._lock:
            lines = [lane.verifier.stalled(again) if isinstance(lane.verifier, PipelineVerifier) else None
                     for lane in self._lanes]
        return lines[0] if lines and all(lines) else None

    @property
    def lanes_busy(self) -> int:
        """Lanes serving a stream (the others are free)."""
        with self._lock:
            return len(self._lanes) - len(self._free)

    def _another_lane(self) -> Lane:
        """(Under the lock.) A lane opened beside the busy ones; GenerationFailed when its back-ends cannot start (a
        model file moved or changed since the first lane loaded it), which ends this generation as a failed back-end
        would: the lanes open serve on."""
        try:
            return self._new_lane()
        except (BackendError, ModelFileError, OSError) as e:
            raise GenerationFailed("cannot open another lane for a generation at once: %s (the %d open go on; did a "
                                   "model file change since the mesh started? put it back, or start the mesh again)"
                                   % (one_line(e), len(self._lanes))) from None

    def _new_lane(self) -> Lane:
        """A verifier and a drafter for one stream. Every board to flash again is named in one line, before any text:
        each flashed from other files (cluster.py StaleFirmware), each running another build than the run's file, and
        a drafter that fails otherwise beside them (a board named alone hid the next until it was flashed), a verifier
        that fails otherwise too: a pipeline's stages (cluster.py Failures), or its one board."""
        batched = self.streams > 1
        stale: list[tuple[str, str, str | None, str]] = []
        wrong: list[str] = []
        verifier = None
        refused = None  # the verifier's failure, raised as it is where the drafter adds none
        try:
            verifier = self._setup.make("verifier", self.names["verifier"], batched)
        except BackendError as e:
            if self.config.plain or not backends.is_port(self.names.get("drafter", "")):  # no virtual board booted
                raise                                                                    # for a run that cannot go
            if isinstance(e, StaleFirmware):
                stale = list(e.boards)
            else:
                refused = e
                stale, wrong = (list(e.stale), list(e.others)) if isinstance(e, Failures) else ([], [one_line(e)])
        theirs = len(stale) + len(wrong)  # the verifier's boards to mend: the drafter's, if any, come after them
        if verifier is not None:
            wrong = _wrong_builds(verifier, self.config.model_file("verifier"), self.headers["verifier"],
                                  self.config.key)
        drafter = None
        try:
            drafter = self._drafter(batched, wrong)
        except StaleFirmware as e:
            stale += e.boards
        except (BackendError, UsageError) as e:
            if not (stale or wrong):
                raise
            wrong.append(one_line(e))
        if stale and not wrong:
            raise StaleFirmware(stale)
        if refused is not None and len(stale) + len(wrong) == theirs:
            raise refused
        if stale or wrong:
            raise UsageError(failures_line(stale, wrong))
        assert verifier is not None  # its failure left `stale` or `wrong` set
        lane = Lane(verifier, drafter)
        self._lanes.append(lane)
        return lane

    def _drafter(self, batched: bool, wrong: list[str]):
        """The lane's drafter (None: --plain), its model checked against the target's vocabulary; the line of each of
        its boards that runs another build than the run's file added to `wrong`."""
        if self.config.plain:
            return None
        drafter = self._setup.make("drafter", self.names["drafter"], batched)
        key = self.config.key
        _check_running_drafter(drafter, self.headers["verifier"], self.config.model_file("drafter"), key)
        if "drafter" in self.headers and not self._lanes:  # price the model it runs
            given = self.config.model_file("drafter")
            path = running_file(drafter, given)  # the file its HELLO names, where it lies beside `given`
            self.headers["drafter"] = _drafter_head(path, given, self.headers["drafter"])
            wrong += _wrong_builds(drafter, path, self.headers["drafter"], key)
        return drafter

    @contextlib.contextmanager
    def lane(self, cancel: threading.Event | None = None) -> Iterator[Lane | None]:
        """A lane for one stream, waited for first come, first served (a new one opened while fewer than
        `streams` exist); None when `cancel` was set before its turn came (the request left)."""
        self._check_usable()
        lane = self._turn(cancel.is_set if cancel is not None else lambda: False)
        if lane is None:
            yield None
            return
        me = threading.get_ident()
        with self._lock:
            self._holders[me] = self._holders.get(me, 0) + 1
        lane.idle(False)
        try:
            yield lane
        finally:
            with self._lock:
                self._holders[me] -= 1
                if not self._holders[me]:
                    del self._holders[me]
            self._release(lane)

    def _check_usable(self) -> None:
        """UsageError when this Mesh can run no generation: closed (its boards' links are shut: each would only fail
        over to the cpu verifier), or in a process forked from its maker, whose back-ends are the parent's (a
        board's port answered the parent's reader: 'node 1 did not answer BEGIN within 30 s')."""
        if self._closed:
            raise UsageError("this Mesh is closed (its back-ends were released): make a new one")
        if os.getpid() != self._pid:
            raise UsageError("this Mesh was made in process %d, and this process (%d) was forked from it: its "
                             "back-ends are that process's; make a new Mesh here" % (self._pid, os.getpid()))

    def _turn(self, gone: Callable[[], bool]) -> Lane | None:
        """The lane handed to a request in its turn; None once `gone()` (the request left before it began: a
        client that left while queued, or before a thread of the server took its request, costs the boards no
        BEGIN and no round)."""
        ticket = _Ticket()
        with self._lock:
            if gone():
                return None
            self._check_not_nested(threading.get_ident())
            if self._free and not self._waiting:
                ticket.hand(self._free.popleft())
            elif len(self._lanes) < self.streams:
                ticket.hand(self._another_lane())
            else:
                self._waiting.append(ticket)
        try:
            while not ticket.ready.wait(0.05) and not gone():
                pass
        except BaseException:  # a Ctrl-C in the wait: its place, or the lane handed to it, would be lost to all after
            self._leave(ticket)
            raise
        if gone():  # left while queued (or handed its lane as it left)
            self._leave(ticket)
            return None
        return ticket.lane

    def _leave(self, ticket: _Ticket) -> None:
        """`ticket` given up: out of the queue, or its lane, handed to it meanwhile, to the next in line."""
        with self._lock:
            if ticket.lane is None:
                self._waiting.remove(ticket)
                return
        self._release(ticket.lane)

    def _check_not_nested(self, asker: int) -> None:
        """(Under the lock.) UsageError when a generation that thread `asker` waits for would wait for a lane while
        `asker` holds one and none is free or can be opened: its own would never come free, a hang."""
        if asker in self._holders and not (self._free and not self._waiting) and len(self._lanes) >= self.streams:
            raise UsageError("a generation was asked for inside another of this Mesh (in its on_piece callback, or "
                             "inside mesh.lane()?), whose lane it would wait for forever: ask after that one ends")

    def _release(self, lane: Lane) -> None:
        lane.idle()
        with self._lock:
            if self._waiting:
                self._waiting.popleft().hand(lane)
            else:
                self._free.append(lane)

    # -- generation --------------------------------------------------------------------------------

    def encode(self, text: str, bos: bool = True) -> list[int]:
        """`text`'s token ids, BOS first unless `bos` is False; UsageError for what is not text."""
        return self.tok.encode(_text(text, "the text to encode"), bos=bos)

    def encode_turns(self, turns: Iterable[str]) -> list[int]:
        """A context of turns as `specmesh chat` builds it: each turn's text appended as typed, BOS first."""
        if isinstance(turns, str):  # (its characters would be turns)
            raise UsageError("turns must be a list of texts, not one text")
        ids: list[int] = []
        for turn in turns:
            ids += self.tok.encode(_text(turn, "each turn"), bos=not ids)
        return ids

    def request(self, max_tokens: int | None = None, temperature: float | None = None, top_p: float | None = None,
                top_k: int | None = None, seed: int | None = None, stop: Sequence[str] | str | None = None
                ) -> RunConfig:
        """The mesh's configuration with one generation's sampling settings (None: the mesh's), checked as the
        flags are (UsageError: one line)."""
        actions = flag_actions()
        given = {name: flag_value(actions[name], name, value) for name, value in (
            ("max_tokens", max_tokens), ("temperature", temperature), ("top_p", top_p), ("top_k", top_k),
            ("seed", seed), ("stop", stop)) if value is not None}
        if "stop" in given:
            given["stop"] = tuple(given["stop"])
            if "" in given["stop"]:
                raise UsageError("stop needs non-empty strings (an empty one would end the text before it began)")
        new = dataclasses.replace(self.config, **given)
        try:
            in_range("max_tokens", new.max_tokens, 1)
            in_range("top_k", new.top_k, 0, 65535, "0: off")
            in_range("seed", new.seed, *SEED)
            new.session_params(self.eos)
        except (RangeError, ValueError) as e:
            raise UsageError(str(e)) from None
        return new

    def generate(self, prompt: str | Sequence[int], max_tokens: int | None = None, **sampling) -> Completion:
        """Generate after `prompt` (text, or token ids as `encode` gives) and return the Completion. Keywords:
        temperature, top_p, top_k, seed, stop (a string or several); these and max_tokens, None or left out, are the
        mesh's (the options it was made with, else run's defaults: 64 tokens, greedy). The others as `complete`."""
        return self._generation(self._ids(prompt), self.request(max_tokens, **_sampling(sampling)), _rest(sampling))

    def _generation(self, ids: list[int], request: RunConfig, rest: dict) -> Completion:
        """`complete`, as the Python API's generations (`generate`, `stream`) run: a stage that stopped answering fails
        it with `failed`'s line (what its caller does: the next generation asks the stage again), not a run's; a board
        silent at its text's end is a line to `warn`, as run, chat and serve say theirs."""
        try:
            done = self.complete(ids, request, **rest)
        except StageSilent as e:
            raise GenerationFailed(self.failed or str(e)) from None
        stopped = stopped_line(done.stats["boards"], "generation")
        if stopped and self.warn is not None:
            self.warn(stopped)
        return done

    def stream(self, prompt: str | Sequence[int], max_tokens: int | None = None, **sampling) -> Stream:
        """`generate` as an iterator (a `Stream`): a Piece per round as it is committed, then the Completion. Closing
        it early (`close()`, the end of a `with` block over it, or dropping it) cancels the generation after its
        current round. A bad argument, or a mesh that cannot generate, is refused here, not at the first item."""
        if "on_piece" in sampling:
            raise TypeError("stream() takes no on_piece: its items are the pieces (on_piece is generate()'s)")
        request = self.request(max_tokens, **_sampling(sampling))
        ids, rest = self._ids(prompt), _rest(sampling)
        _check_hooks(None, rest.get("cancel"))
        self._check_prompt(ids)
        self._check_usable()
        cancel = _Cancel(rest.pop("cancel", None))
        idle = threading.Event()
        idle.set()
        return Stream(self._pieces(ids, request, cancel, rest, idle), cancel, idle)

    def _pieces(self, ids: list[int], request: RunConfig, cancel: _Cancel, rest: dict, idle: threading.Event
                ) -> Generator[Piece | Completion, None, None]:
        """stream()'s iterator: the generation runs in a thread of its own (`idle` cleared while it runs), handing
        its items over a queue; left, it sets its own `cancel`, not the caller's event, and waits for nothing (Stream.close
        waits for the round). Refused where the iterating thread holds the lane that thread would wait for."""
        with self._lock:
            self._check_not_nested(threading.get_ident())
        pieces: queue.Queue = queue.Queue()

        def work() -> None:
            try:
                pieces.put(self._generation(ids, request, dict(rest, on_piece=pieces.put, cancel=cancel)))
            except BaseException as e:  # noqa: BLE001 - handed to the iterating thread, which raises it
                pieces.put(e)
            finally:
                idle.set()

        thread = threading.Thread(target=work, name="specmesh-stream", daemon=True)
        try:
            try:
                idle.clear()
                thread.start()
            except BaseException:  # a Ctrl-C before its thread ran: nothing would set `idle`, and the stream's close()
                if not thread.is_alive():  # (the end of its `with`) waited for it forever; one launched meanwhile
                    idle.set()             # finds `cancel` set and ends before its first round
                raise
            while True:
                item = pieces.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, Completion):
                    return
        finally:  # no wait for the round here: a stream dropped unclosed is closed by the garbage collector, which
            cancel.set()  # only reports what is raised meanwhile ("Exception ignored"): a Ctrl-C in a wait was lost

    def _ids(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            # refused by its size: encoding megabytes takes seconds
            least = self.tok.least_tokens(_text(prompt, "the prompt"))
            if least >= self.context:
                raise UsageError("the prompt has at least %d tokens but the context holds %d" % (least, self.context))
            return self.tok.encode(prompt)
        try:
            if isinstance(prompt, (bytes, bytearray, Mapping, AbstractSet)):  # a dict's keys or a set: no order
                raise TypeError
            ids = list(prompt)
        except TypeError:
            raise UsageError("the prompt must be text or a list of token ids, not %r" % (prompt,)) from None
        # numpy's integers as Python's (np.array(ids, dtype=np.uint16)): the drafts' n-gram hashing (shared/ngram.py)
        # overflowed in a uint16's arithmetic, an OverflowError out of generate
        return [operator.index(t) if isinstance(t, Integral) and not isinstance(t, bool) else t for t in ids]

    def _check_prompt(self, prompt: Sequence[int]) -> None:
        """UsageError unless `prompt` is token ids of this mesh's vocabulary that leave room in its context."""
        if len(prompt) >= self.context:
            raise UsageError("the prompt has %d tokens but the context holds %d" % (len(prompt), self.context))
        check_ids(prompt, len(self.tok.pieces))

    def complete(self, prompt: str | Sequence[int], request: RunConfig | None = None,
                 on_piece: Callable[[Piece], None] | None = None, cancel: threading.Event | None = None,
                 controller: GammaController | None = None, lane: Lane | None = None) -> Completion:
        """Generate after the token ids (or text, as generate takes) `prompt` as `request` (a `request()`; None: the
        mesh's configuration) says, on `lane` or the next free one. `controller`: a gamma controller kept across
        generations (chat's turns); None: a new one. GenerationFailed when a back-end failed beyond fail-over."""
        request = request or self.config
        if not isinstance(request, RunConfig):  # (found before a lane is taken, not at its first use)
            raise TypeError("request must be what Mesh.request() gives, not %s" % shown_typed(request))
        _check_hooks(on_piece, cancel)
        prompt = self._ids(prompt)
        self._check_prompt(prompt)
        if lane is None:
            with self.lane(cancel) as lane:
                if lane is None:
                    return self._unbegun(prompt, request)
                return self.complete(prompt, request, on_piece, cancel, controller, lane)
        self._rejoin(lane)
        params = request.session_params(eos=self.eos)
        verifier, drafter = lane.verifier, lane.drafter
        # With sampling, which positions get a draft changes the text (the accept test and the residual
        # draw replace plain decoding's draw there), so an adaptive gamma fed wall-clock times would
        # make the same seed give different texts. Sampling with gamma auto therefore chooses gamma
        # from the projected costs (deterministic); greedy text never depends on gamma.
        deterministic = not request.greedy and request.gamma is None and drafter is not None
        costs, projector = projection(request, dict(self.headers), verifier, drafter, self.on_host, deterministic)
        controller = controller or gamma_controller(request, drafter)
        # a projection that prices drafting ahead (host/decode/ahead.py) plans gamma and what is drafted beside a verify
        controller.pipelined = bool(drafter is not None and costs is not None and costs.pipelined)
        scan = StopScan(StopStrings(request.stop), self.tok.pieces.__getitem__, after_bos=list(prompt) == [BOS])
        fallback = None if self.names["verifier"] in ("cpu", PIPELINE) else lambda: self._fall_back(lane)
        cancel = _Cancel(cancel)  # what close() sets: the caller's event is left as it was
        with self._lock:
            self._check_usable()
            self._running[cancel] = threading.get_ident()
        try:  # running until its stats are built: they ask the boards, which close() must not release under them
            watch = _Watch(scan, costs, fallback, on_piece, cancel, self.warn, self.rejoins)
            result = self._decode(prompt, lane, params, request.max_tokens, controller, watch)
            text = watch.finish()
            stats = build_stats(request, params, result, text, verifier, drafter, controller, len(prompt), projector)
        finally:
            with self._lock:
                del self._running[cancel]
                self._ended.notify_all()
        stats["gamma_costs"] = ("projected %s" % costs.board.name) if costs else "measured"
        stats["stop"] = "cancelled" if result.stop == "stop" and not scan.stopped else result.stop
        return Completion(text, result.tokens[:scan.kept], stats["stop"], stats)

    def _unbegun(self, prompt: Sequence[int], request: RunConfig) -> Completion:
        """The Completion of a generation cancelled before its turn came: no text, and the stats of a generation of no
        rounds (the keys of any other's, stop "cancelled", no boards asked: their lanes serve other generations)."""
        lane = self._lanes[0]  # the back-ends it would have run on, by name and context only
        verifier, drafter = _NotBegun.like(lane.verifier), _NotBegun.like(lane.drafter)
        params = request.session_params(eos=self.eos)
        stats = build_stats(request, params, Result([]), "", verifier, drafter, gamma_controller(request, drafter),
                            len(prompt), None)
        stats.update(gamma_costs=None, stop="cancelled")
        return Completion("", [], "cancelled", stats)

    def _rejoin(self, lane: Lane) -> None:
        """At a generation's start on `lane`: each board it dropped that answered a HELLO since takes its place again
        (a verifier board's from the cpu verifier), with one line to `warn`; the others are asked again where due, in
        the background (`_Rejoin`), one that another board answered for said once (OTHER_BOARD)."""
        for role, gone in list(lane.gone.items()):
            if gone.back():
                del lane.gone[role]
                lane.relapses[role] = lane.relapses.get(role, 0) + 1  # until it serves a whole generation (`_decode`)
                setattr(lane, role, gone.board)
                if self.warn is not None:
                    self.warn(REJOINED[role] % gone.board.name)
            elif gone.board.other is not None and not gone.told:
                gone.told = True
                if self.warn is not None:
                    self.warn(OTHER_BOARD % (role, gone.board.name, gone.board.other))

    def _fall_back(self, lane: Lane):
        """The `cpu` verifier taking over from the lane's failed one, kept by the lane for what follows, and for the
        next fail-over of a verifier board that rejoined it (none once the mesh is closed: its back-ends were released
        under the generation, which ends)."""
        if self._closed:
            return None
        if lane.cpu is None:
            lane.cpu = self._setup.make("verifier", "cpu")
        lane.verifier = lane.cpu
        return lane.verifier

    def _decode(self, prompt: Sequence[int], lane: Lane, params: SessionParams, max_tokens: int,
                controller: GammaController, watch: _Watch) -> Result:
        """The one call of the decode loop (host/decode/orchestrator.py) for every generation of every command."""
        began = {"verifier": lane.verifier, "drafter": lane.drafter}
        try:
            result = generate(prompt, lane.verifier, lane.drafter, params, max_tokens, controller, watch)
            if "drafter" in result.failed:  # left out of the lane's next generations too: each would begin it
                lane.drafter = None  # again and wait out its deadline (chat's next turn, serve's next request)
            for role, board in began.items():  # a board that stopped answering is asked again (_Rejoin)
                error = result.failed[role].error if role in result.failed else None
                if _silent(board, error):
                    lane.gone[role] = _Rejoin(board, lane.relapses.get(role, 0))
                elif error is None and isinstance(board, (BoardBackend, PipelineVerifier)):
                    lane.relapses.pop(role, None)  # it served the whole generation
            return result
        except _CallbackRaised as e:
            raise e.error from None
        except StageStopped as e:
            raise StageSilent(one_line(e)) from None
        except (BackendError, RuntimeError) as e:
            raise GenerationFailed(one_line(e)) from None


def _collected(setup: Setup, maker: int) -> None:
    """A Mesh dropped unclosed: its back-ends released as `_release_setup` does, from a thread of its own where the
    collection ran on another than the main one (on one of its own boards' threads, a board's stop would join the
    thread it runs on)."""
    if threading.current_thread() is threading.main_thread():
        _release_setup(setup, maker)
    else:
        threading.Thread(target=_release_setup, args=(setup, maker), name="specmesh-collected", daemon=True).start()


def _release_setup(setup: Setup, maker: int) -> None:
    """Close a Mesh's `setup` (its back-ends), in the process that made it only: a child forked from it holds the
    parent's boards and engines, which its own close or collection must leave to the parent."""
    if os.getpid() == maker:
        setup.close()


def _text(text: object, what: str) -> str:
    """`text`, or UsageError (naming it `what`) unless it is a str that UTF-8 holds: no lone surrogate, which the
    tokenizer's UTF-8 could not encode."""
    if not isinstance(text, str):
        raise UsageError("%s must be a str, not %s" % (what, shown_typed(text)))
    at = lone_surrogate(text)
    if at is not None:
        raise UsageError("%s is not Unicode text: character %d is a lone surrogate (%r), which no UTF-8 holds"
                         % (what, at, text[at]))
    return text


def _check_hooks(on_piece, cancel) -> None:
    """TypeError unless `on_piece` is None or callable and `cancel` None or an Event, found before any back-end runs."""
    if on_piece is not None and not callable(on_piece):
        raise TypeError("on_piece must be a function taking each Piece, not %r" % (on_piece,))
    if cancel is not None and not callable(getattr(cancel, "is_set", None)):
        raise TypeError("cancel must be a threading.Event (set, it ends the generation after its round), not %r"
                        % (cancel,))


class _Cancel:
    """The cancel event of a generation: set when the caller's `given` event is, or by its own `set()` (a stream's
    iteration left, the mesh closed), which leaves the caller's as it was: a caller's event kept for its next
    generations (or another Mesh's) would cancel each before it began."""

    def __init__(self, given: threading.Event | None):
        self.given, self.own = given, threading.Event()

    def is_set(self) -> bool:
        return self.own.is_set() or (self.given is not None and self.given.is_set())

    def set(self) -> None:
        self.own.set()


@dataclass
class _NotBegun:
    """A back-end as the stats of a generation cancelled before its turn name it: its name and context, no parts."""

    name: str
    max_seq: int

    @classmethod
    def like(cls, backend: Any) -> _NotBegun | None:
        return None if backend is None else cls(backend.name, backend.max_seq)

    def parts(self, role: str) -> list:
        return []

    def report(self) -> dict:
        return {}


class _CallbackRaised(Exception):
    """An `on_piece` callback raised `error`: carried through the decode loop (whose handlers read a RuntimeError
    as a back-end's failure) to the caller, as it was, with its traceback."""

    def __init__(self, error: Exception):
        super().__init__(error)
        self.error = error


class _Watch(Watch):
    """generate()'s observer for a mesh's generation (host/cli/output.py `Watch`): each round a Piece to
    `on_piece` with its seconds, the `cancel` event ending the stream after the round, a fail-over's line
    to `warn`, saying of a board whose port went away that later generations ask it again where they do (`rejoins`)."""

    def __init__(self, scan: StopScan, costs, fallback, on_piece: Callable[[Piece], None] | None,
                 cancel: _Cancel, warn: Say | None, rejoins: bool):
        super().__init__(scan, TextStream(scan), costs=costs.round_costs if costs else None,
                         costs_known=getattr(costs, "known_beforehand", True), fallback=fallback,
                         verify_by_shape=getattr(costs, "verify_by_shape", False))
        self.on_piece, self.cancel, self.warn, self.rejoins = on_piece, cancel, warn, rejoins
        self._last = time.perf_counter()

    def shown(self, accepted: Sequence[int], emitted: Sequence[int]) -> None:
        segments = self.stream.write(accepted, emitted)
        now = time.perf_counter()
        if self.on_piece is not None:
            try:
                self.on_piece(_piece(segments, len(accepted), len(accepted) + len(emitted), now - self._last))
            except Exception as e:  # the caller's, not a back-end's: _decode raises it as it was
                raise _CallbackRaised(e) from e
        self._last = now

    def stopped(self) -> bool:
        return self.scan.stopped or self.cancel.is_set()

    def failed_over(self, line: str) -> None:
        if self.warn is not None:
            self.warn(line)

    def then(self, e: BackendError) -> str:
        return PORT_BACK if self.rejoins and isinstance(e, PortLost) else ""

    def finish(self) -> str:
        tail = self.stream.finish()
        if tail and self.on_piece is not None:
            self.on_piece(_piece(tail, 0, 0, 0.0))
        return self.scan.final()


@dataclass
class _Ticket:
    """A request's place in a mesh's queue: the lane handed to it, and the event that says so."""

    lane: Lane | None = None
    ready: threading.Event = field(default_factory=threading.Event)

    def hand(self, lane: Lane) -> None:
        self.lane = lane
        self.ready.set()


def _piece(segments: Segments, n_accepted: int, n_committed: int, seconds: float) -> Piece:
    """A Piece from a round's segments (text, was a draft): drafts come first in a round, so they are a prefix."""
    accepted = sum(len(s) for s, draft in segments if draft)
    return Piece("".join(s for s, _ in segments), accepted, n_accepted, n_committed, seconds, segments)


SAMPLING = ("temperature", "top_p", "top_k", "seed", "stop")


def _sampling(kw: dict) -> dict:
    unknown = set(kw) - set(SAMPLING) - {"cancel", "controller", "on_piece"}
    if unknown:
        raise TypeError("unexpected keyword %s (sampling: %s)" % (", ".join(sorted(unknown)), ", ".join(SAMPLING)))
    return {k: v for k, v in kw.items() if k in SAMPLING}


def _rest(kw: dict) -> dict:
    return {k: v for k, v in kw.items() if k not in SAMPLING}


def say_on_stderr(command: str = "") -> Say:
    """A `say` that writes each line to stderr, prefixed with the command's name.

    One write a line, its newline included: boards started side by side (`--stages N`) say theirs from their own
    threads, and print()'s separate write of the newline let one board's line run into the next's."""
    prefix = "specmesh%s: " % (" " + command if command else "")

    def say(line: str) -> None:
        sys.stderr.write(prefix + line + "\n")
        sys.stderr.flush()
    return say

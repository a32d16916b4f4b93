"""Drafter and verifier back-ends: the interfaces the orchestrator drives, and the registry of them.

A stream is a prompt plus the tokens committed so far; the host owns it (host/decode/orchestrator.py) and
passes the whole committed list on every call, so a back-end can resynchronise from it at any time
(roll its KV cache back to the longest common prefix and feed the rest).

- `Drafter.draft(committed, gamma) -> Draft`: gamma tokens, each with the q-hat table it was sampled
  from (CONTRACTS section 1: `sampling.draft_table`, PRNG purpose DRAFT at the absolute position).
- `Verifier.verify(committed, draft) -> (n_accepted, token)`: one batched pass over gamma + 1 positions,
  then the shared rule; an empty draft is one step of plain decoding (same PRNG draws).
- `commit(committed)`: the verdict is final; roll back anything beyond it (may be lazy).
- `begin(params, prompt)`: a new stream. A drafter prefills the prompt there (a board does it while the
  host goes on, overlapping the verifier's prefill), so its first draft costs what any later one costs;
  a verifier prefills at its first verdict.

Every back-end is made by name through one table per role (host/cli/registry.py, which assembles a run
and so may import every back-end's module): `cpu` here, `torch-cpu` and `gpu` (host/backends/torch_backend.py),
`virtual`, `virtual:CLASS` (a virtual board of each board class), `pipeline` (`--stages N` stage boards) and
`PORT`, the entry of every serial-port name (`is_port`), for boards (host/provision/cluster.py), and for the
verifier `STAGE_PORTS`, a comma-separated list of ports (`port_list`: a pipeline of real stage boards,
host/provision/stageports.py). A `Factory`
takes the model path and keyword options and returns the back-end: `name`, the name as given, and `boards`,
the run's `Boards`; it ignores the options it does not use. `BackendError` carries a one-line message for the
user.
"""

from __future__ import annotations

import array
import io
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from specmesh.shared import ngram, rule, sampling
from specmesh.shared.messages import MAX_GAMMA
from specmesh.shared.modelfile import ModelFileError


class BackendError(Exception):
    """A back-end that cannot be set up or that failed; the message is one line for the user."""


TEMP_MAX_MILLI = 0xFFFF  # BEGIN's u16 temp_milli: temperatures up to 65.535


def temp_milli(temperature: float) -> int:
    """BEGIN's temp_milli for a temperature: the nearest thousandth, half up; ValueError if it is out of
    0..65.535 or positive but below 0.0005 (it would round to 0: greedy on every back-end)."""
    if not 0.0 <= temperature <= TEMP_MAX_MILLI / 1000:
        raise ValueError("temperature %r is outside 0..%g" % (temperature, TEMP_MAX_MILLI / 1000))
    m = math.floor(temperature * 1000 + 0.5)
    if m == 0 and temperature > 0.0:
        raise ValueError("temperature %r rounds to 0 (greedy) at the protocol's resolution of 0.001: "
                         "pass 0 for greedy or at least 0.0005" % temperature)
    return m


def temperature_from_milli(milli: int) -> float:
    """The temperature every back-end applies for BEGIN's temp_milli (the firmware computes the same
    `temp_milli / 1000`)."""
    return milli / 1000


def top_p_q16(top_p: float) -> int:
    """BEGIN's top_p_q16 for a top_p in (0, 1]: the nearest 1/65536, half up; ValueError if it rounds to 0."""
    if not 0.0 < top_p <= 1.0:
        raise ValueError("top_p %r is outside (0, 1]" % top_p)
    q = math.floor(top_p * 65536 + 0.5)
    if q == 0:
        raise ValueError("top_p %r rounds to 0 at the protocol's resolution of 1/65536: pass at least 0.00001, "
                         "or 1 for no top-p" % top_p)
    return q


@dataclass(frozen=True)
class SessionParams:
    """Sampling parameters of a stream, identical for every back-end (BEGIN message fields).

    The host decides them exactly, once, here: `temperature` and `top_p` are snapped to what BEGIN
    carries (thousandths, Q16: `temp_milli`, `top_p_q16`), so a host back-end applies the very floats a board
    makes of the wire values. A positive temperature or top_p that rounds to 0 is a ValueError."""

    seed: int = 0
    temperature: float = 0.0  # 0: greedy
    draft_top_k: int = 8  # size of the drafter's q-hat tables
    target_top_k: int = 0  # 0: no top-k on the target
    top_p: float = 1.0  # 1.0: no nucleus truncation
    eos: int = -1  # -1: no end-of-stream token

    def __post_init__(self) -> None:
        object.__setattr__(self, "temperature", temperature_from_milli(temp_milli(self.temperature)))
        object.__setattr__(self, "top_p", top_p_q16(self.top_p) / 65536)

    @property
    def greedy(self) -> bool:
        return sampling.is_greedy(self.temp_milli)

    @property
    def temp_milli(self) -> int:
        return temp_milli(self.temperature)

    @property
    def top_p_q16(self) -> int:
        return top_p_q16(self.top_p)


@dataclass
class Draft:
    """gamma drafted tokens from position pos0, each with its q-hat table (ids, integer weights)."""

    pos0: int
    tokens: list[int] = field(default_factory=list)
    q: list[tuple[list[int], list[int]]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)


class Pending:
    """A drafter call in flight (`Drafter.start_draft`): `result()` waits for its drafts; `seconds` is then what the
    call took, from its request to its reply (`took`: a board's reply is timed as it arrives, however late it is
    collected), or the drafting itself for a call made when collected (`later`: a drafter on the host)."""

    def __init__(self, wait: Callable[[], Draft], took: Callable[[], float] | None = None):
        self._wait, self._took = wait, took
        self._draft: Draft | None = None
        self.seconds = 0.0

    @classmethod
    def later(cls, drafter: Drafter, committed: Sequence[int], gamma: int) -> Pending:
        """The call of a drafter without `start_draft`: its `draft`, made when collected."""
        return cls(lambda: drafter.draft(committed, gamma))

    def result(self) -> Draft:
        if self._draft is None:
            t0 = time.perf_counter()
            self._draft = self._wait()
            self.seconds = self._took() if self._took is not None else time.perf_counter() - t0
        return self._draft


class Backend(Protocol):
    name: str  # what the stats show, e.g. "cpu" or "virtual:/dev/pts/4"
    max_seq: int  # longest sequence the model's context holds
    max_gamma: int  # most drafts it drafts or verifies in one call (a board's HELLO says; MAX_GAMMA on the host)
    bus_bytes: int  # bytes this back-end's link carried so far, both ways (0 for in-process ones)

    def begin(self, params: SessionParams, prompt: Sequence[int]) -> None: ...

    def commit(self, committed: Sequence[int]) -> None: ...

    def stats(self) -> dict: ...  # at least compute_s; heap_free for boards

    def close(self) -> None: ...

    def parts(self, role: str) -> list[tuple[str, Backend]]: ...  # what the stats list: itself, or its stages

    def report(self) -> dict: ...  # its own sections of the stats JSON (a pipeline's trace); {} for most


class Unit:
    """What a back-end that is one unit (one model, one board) says of itself in a run's stats."""

    def parts(self, role: str) -> list[tuple[str, Backend]]:
        return [(role, self)]

    def report(self) -> dict:
        return {}


class Drafter(Backend, Protocol):
    def draft(self, committed: Sequence[int], gamma: int) -> Draft: ...

    # optional: `start_draft(committed, gamma) -> Pending`, a call that works while the host waits for the verifier
    # (a board's DRAFT_REQ goes out at once); without it the decode loop drafts when it collects (`Pending.later`)


class Verifier(Backend, Protocol):
    def verify(self, committed: Sequence[int], draft: Draft) -> tuple[int, int]: ...


class Boards(Protocol):
    """What a board's factory takes from the run (host/cli/run.py `Setup`): its cluster of virtual boards,
    started on first use, the deployment key, the pipeline's stage count and its stages' board class (None:
    the default), the roles flashed beside the stages, and a stack that keeps what the factory opens until the run ends."""

    key: bytes | None
    stages: int
    stage_class: str | None
    beside_stages: tuple[str, ...]  # roles whose default virtual board boots and flashes beside the stages

    def cluster(self): ...

    def enter_context(self, cm): ...


Factory = Callable[..., Backend]
PIPELINE = "pipeline"  # the verifier of `--stages N`: N virtual stage boards
HOST_BACKENDS = ("cpu", "torch-cpu", "gpu")  # in-process back-ends: no board, a stream each, as many as asked
PORT = "PORT"  # the registry entry of every name `is_port` accepts: a flashed board on that serial port
STAGE_PORTS = "PORT,PORT"  # the verifier's entry of every list of ports (`port_list`): real stage boards


def is_port(name: str) -> bool:
    """Whether a `--drafter`/`--verifier` value names a serial port (or `auto`, to find one)."""
    return name == "auto" or name.startswith("/dev/") or name.startswith("COM") or "://" in name


def port_list(name: str) -> list[str] | None:
    """The names in a comma-separated `--verifier PORT1,PORT2,...` (real stage boards, in layer order), or None for a
    name without a comma; `is_port` says which of them name a port."""
    return name.split(",") if "," in name else None


class EngineStream:
    """A model's engine whose KV cache follows a token list: keeps the common prefix, feeds the rest. Its own
    engine is the board's engine and C kernels in a `micropython` process where they run (host/backends/
    pipeengine.py: 30-40x faster a position), else the numpy `Engine`: the same integers either way."""

    def __init__(self, path, engine=None):
        """`engine`: anything with Engine's `header`, `forward(tokens, start_pos)`, `rollback(n)` (torch, a
        Batcher's stream), closed by its owner; None: this stream's own, closed by `close`. Should its own
        engine's process end, the numpy engine takes over, fed the cached tokens again: the run goes on (one ended
        because a forward was broken into, by Ctrl-C, is started again instead: nothing is wrong with it)."""
        from specmesh.host.backends.pipeengine import PipeEngine

        self.path = path
        # (a file the board's engine refuses leaves the numpy one to load it, or to say why it cannot)
        self._own = None if engine is not None else PipeEngine.start(path)
        self.engine = engine or self._own or self._numpy()
        self.cached: list[int] = []  # the tokens whose keys and values the cache holds
        self.compute_s = 0.0

    def _numpy(self):
        from specmesh.host.backends.engine import Engine  # numpy engine only when a local back-end is made

        try:
            return Engine(self.path)
        except (OSError, ValueError, ModelFileError) as e:
            raise BackendError("cannot load model %s: %s" % (self.path, e)) from None

    def close(self) -> None:
        """End this stream's own engine process, if it has one."""
        if self._own is not None:
            self._own.close()

    @property
    def max_seq(self) -> int:
        return self.engine.header.max_seq

    def keep(self, tokens: Sequence[int]) -> None:
        """Roll the cache back to its longest common prefix with `tokens`."""
        n = 0
        for a, b in zip(self.cached, tokens):
            if a != b:
                break
            n += 1
        del self.cached[n:]
        self.engine.rollback(n)

    def feed(self, tokens: Sequence[int]):
        """Logits [len(tokens), vocab] of tokens appended after the cached ones."""
        from specmesh.host.backends.pipeengine import EngineGone, PipeEngine

        t0 = time.perf_counter()
        try:
            logits = self.engine.forward(tokens, len(self.cached))
        except EngineGone:
            again = self._own is not None and self._own.interrupted
            self.close()
            self._own = PipeEngine.start(self.path) if again else None
            self.engine = self._own or self._numpy()
            if self.cached:
                self.engine.forward(self.cached, 0)
            logits = self.engine.forward(tokens, len(self.cached))
        self.compute_s += time.perf_counter() - t0
        self.cached.extend(tokens)
        return logits

    def logits_after(self, tokens: Sequence[int], extra: Sequence[int] = ()):
        """Logits of the positions after tokens[-1] and after each of `extra` (cache: tokens + extra).

        Tokens the cache lacks are fed in the same pass (one call: the engine's rows are independent)."""
        self.keep(tokens[:-1])
        missing = list(tokens[len(self.cached):-1])
        return self.feed([*missing, tokens[-1], *extra])[len(missing):]


class LocalRole(Unit):
    """A model on the host CPU (its EngineStream's engine: the board's in a process, or numpy's): what the drafter
    and the verifier share."""

    max_gamma = MAX_GAMMA  # no board's limits: the protocol's

    def __init__(self, model_path, stream: EngineStream | None = None, **_options):
        """`stream`: the model's stream, when it is not this file's own (e.g. a stream of a model
        shared through a Batcher, host/backends/batcher.py `StreamEngine`)."""
        self.stream = stream or EngineStream(model_path)
        self.name = "cpu"
        self.max_seq = self.stream.max_seq
        self.bus_bytes = 0
        self.params = SessionParams()

    def begin(self, params: SessionParams, prompt: Sequence[int]) -> None:
        self.params = params
        self.stream.keep(())

    def commit(self, committed: Sequence[int]) -> None:
        self.stream.keep(committed)

    def stats(self) -> dict:
        return {"compute_s": self.stream.compute_s}

    def close(self) -> None:
        self.stream.close()


class LocalVerifier(LocalRole):
    """The target on the host CPU with the shared acceptance rule."""

    def verify(self, committed: Sequence[int], draft: Draft) -> tuple[int, int]:
        if draft.pos0 != len(committed):
            raise BackendError("draft for position %d, but the stream holds %d tokens"
                               % (draft.pos0, len(committed)))
        from specmesh.host.backends.engine import argmax, target_table  # numpy, loaded with the engine

        logits = self.stream.logits_after(committed, draft.tokens)
        p = self.params
        return rule.verdict_step(p.greedy, lambda j: argmax(logits[j]),
                                 lambda j: target_table(logits[j], p.temp_milli, p.target_top_k, p.top_p_q16),
                                 draft.tokens, draft.q, p.seed, draft.pos0, p.eos)


# the logit lead (Q16: a quarter of a logit) below which a greedy draft on the host ends its block (LocalDrafter):
# chosen on the tuning prompts only, for the host's drafter-host.spm (its 64 prompts, --drafter cpu projected on an
# S3: 0 / 1/8 / 1/4 / 1/2 / 1 logit gave mean 2.01 / 2.07 / 2.07 / 2.02 / 1.90x, worst 1.56 / 1.63 / 1.65 / 1.56 /
# 1.58x; docs/bench/hostdrafter.md); a drafter board drafts every draft asked for, where it measured no gain
UNSURE_MARGIN = 1 << 14


def check_ngram_slots(b: bytes, vocab: int) -> None:
    """NgramError unless the slots of a whole table file `b` (header included) are what tools/ngram.py writes:
    `entries` of them used, each token below `vocab` (the model's beside it), the first CHUNK - 1 again after the
    last. Random bytes under a good header would make lookups walk the table for nothing, and a table of another
    vocabulary would draft tokens no model has. The host's check: it reads a table whole, where a board reads a few
    slots at a time (its lookups end after one pass over a table: shared/ngram.py)."""
    head, size = ngram.HEADER_SIZE, ngram.SLOT_SIZE
    slots, entries = ngram.parse_header(b)[2:4]
    ngram.check_size(len(b), slots)  # a table cut short is said as one, not as slots its header counts but lacks
    fields = array.array("H", b[head:head + slots * size])  # (check, token + 1) per slot, little-endian
    if sys.byteorder == "big":
        fields.byteswap()
    tokens = fields[1::2]  # counted in C: a loop over a table's 131,072 slots took 15 ms of each run's start
    used = len(tokens) - tokens.count(0)
    beyond = [v for v in set(tokens) - {0, ngram.MARK} if v > vocab]
    if beyond:
        slot = min(tokens.index(v) for v in beyond)
        raise ngram.NgramError("slot %d holds token %d, outside the model's vocabulary of %d"
                               % (slot, tokens[slot] - 1, vocab))
    if used != entries:
        raise ngram.NgramError("%d slots used, its header says %d entries" % (used, entries))
    end, mirror = head + slots * size, (ngram.CHUNK - 1) * size
    if bytes(b[end:end + mirror]) != bytes(b[head:head + mirror]):
        raise ngram.NgramError("its last %d slots are not a copy of its first" % (ngram.CHUNK - 1))


def load_ngram_table(model_path) -> ngram.Table | None:
    """The n-gram table beside a model file (host/layout.py ngram_table), read whole and its slots checked against
    that model's vocabulary (check_ngram_slots), or None."""
    from specmesh.host.backends.modelio import header_error
    from specmesh.host.layout import ngram_table
    from specmesh.shared.modelfile import HEADER_SIZE, parse_header

    path = ngram_table(Path(model_path))
    if path is None:
        return None
    try:
        if not path.is_file():  # never opened: a FIFO would be waited for
            raise ngram.NgramError("a folder, not a file" if path.is_dir() else "not a regular file")
        data = path.read_bytes()
        with open(model_path, "rb") as f:
            head = f.read(HEADER_SIZE)
        try:  # the header's own errors name no file (`ngram_cost --model` said "not a specmesh model file", no name)
            vocab = parse_header(head).vocab
        except ModelFileError as e:
            raise header_error(model_path, e) from None
        check_ngram_slots(data, vocab)
        return ngram.Table(io.BytesIO(data))
    except (ngram.NgramError, OSError) as e:
        # copy first, as a model file's line says: rebuilding takes the target's continuations of a thousand stories,
        # and tools/ngram.py builds the shipped folder's tables only
        raise ModelFileError("n-gram table %s: %s: copy it again, rebuild it (python -m specmesh.tools.ngram) or "
                             "delete it (the model then runs without one)" % (path, e)) from None


class LocalDrafter(LocalRole):
    """The drafter model on the host CPU: q-hat = sampling.draft_table, token sampled from it (purpose DRAFT).

    `stop_margin` > 0 (Q16 logits; the CLI gives UNSURE_MARGIN under gamma auto): in a greedy session a block
    ends at its first unsure draft, one whose logit leads the runner-up's by less than that. The unsure draft is
    still sent, as the block's last (its pass has run), and the drafts after it, likely rejected, are neither
    drafted nor verified: on a compute-bound verifier each position costs about a third of a plain pass
    (docs/design.md section 3). The verifier alone decides the text, so it does not change; sampled sessions
    draft every draft asked for, as a board does. A greedy draft is the n-gram table's token where the table beside
    the model file holds the stream's last tokens (shared/ngram.py), as on a board flashed with it. Such a drafter's
    `copies` is the table of the verifier's model file `copies_from` (default: the target beside the drafter),
    whose chains the decode loop copies into plain rounds (host/decode/lookup.py), as it does for a board drafter
    with a table.
    """

    def __init__(self, model_path, stream: EngineStream | None = None, stop_margin: int = 0, copies_from=None,
                 **options):
        from specmesh.host.layout import TARGET_FILE

        super().__init__(model_path, stream, **options)
        self.stop_margin = stop_margin
        self.table = load_ngram_table(model_path)
        verifier = Path(model_path).with_name(TARGET_FILE) if copies_from is None else copies_from
        self.copies = load_ngram_table(verifier) if self.table else None

    def begin(self, params: SessionParams, prompt: Sequence[int]) -> None:
        super().begin(params, prompt)
        if len(prompt) > 1:
            self.stream.feed(prompt[:-1])  # prefill, as a drafter board does at BEGIN

    def draft(self, committed: Sequence[int], gamma: int) -> Draft:
        from specmesh.host.backends.engine import argmax, draft_table, unsure  # numpy, loaded with the engine

        p = self.params
        out = Draft(len(committed))
        row = self.stream.logits_after(committed)[0]
        stream = [*committed] if p.greedy and self.table else []
        for i in range(gamma):
            known = self.table.get(stream, len(stream)) if stream else -1  # the table's token (-1: none held)
            token, ids, weights = rule.draft(p.greedy, lambda: known if known >= 0 else argmax(row),
                                                  lambda: draft_table(row, p.temp_milli, p.draft_top_k),
                                                  p.seed, out.pos0 + i)
            if stream:
                stream.append(token)
            out.tokens.append(token)
            out.q.append((ids, weights))
            if i + 1 < gamma:
                if p.greedy and self.stop_margin and unsure(row, self.stop_margin):
                    break
                row = self.stream.feed([token])[0]
        return out

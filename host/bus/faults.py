"""Fault injection on the host's links: frames dropped, corrupted, duplicated, reordered and delayed.

`FaultyLink(link, faults)` wraps a host link (host/bus/links.py `Link`: `send(frame)`, `on_frame`)
and applies seeded faults to every frame in both directions: what the host sends reaches the board
damaged or not at all (the node's CRC check and the host's retransmission must cope), and what the
board sends reaches the proxy the same way. A corrupted frame has one bit flipped; outgoing it goes on
the wire so the node rejects it, incoming it is decoded again and must fail its CRC (a frame that would
pass is a finding, so it raises). On a signed link the replay check of the link's decoder runs after
the incoming faults, where a receiver runs it: a frame lost on the wire was never seen, and a
duplicated one is refused as a replay. Reordering holds a frame back until the next one has gone (or until
`hold_s` passed); delays run on timers, so the caller never sleeps. The radio has its own faults
(host/emulator/radio.py RadioConfig).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from specmesh.host.bus.links import Link, LinkError
from specmesh.shared.codec import OPEN_TYPE, CodecError, Frame, Replay, decode, encode


def flip_bit(data: bytes, rng: random.Random) -> bytes:
    """`data` with one bit, chosen by `rng`, flipped: line noise that a CRC must catch."""
    bit = rng.randrange(8 * len(data))
    return data[:bit // 8] + bytes([data[bit // 8] ^ (1 << bit % 8)]) + data[bit // 8 + 1:]


@dataclass
class Faults:
    """Probabilities per frame and direction; `delay_s` is the most a delayed frame waits."""

    drop: float = 0.0
    corrupt: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    delay: float = 0.0
    delay_s: float = 0.02
    hold_s: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("drop", "corrupt", "duplicate", "reorder", "delay"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError("fault probability %s must be in [0, 1), not %r" % (name, getattr(self, name)))


@dataclass
class FaultCounts:
    frames: int = 0
    dropped: int = 0
    corrupted: int = 0
    duplicated: int = 0
    reordered: int = 0
    delayed: int = 0
    by_direction: dict[str, int] = field(default_factory=lambda: {"out": 0, "in": 0})


class _TagOnly:
    """A decoder's view of the host's signing state that checks tags but leaves the replay check to later."""

    def __init__(self, auth) -> None:
        self._auth = auth

    def __getattr__(self, name: str):
        return getattr(self._auth, name)  # tags, sessions, ends: the host's own

    def check_replay(self, src: int, counter: int) -> None:
        pass


class FaultyLink:
    """A link (host/bus/links.py `Link`) that delivers frames as `faults` says; everything else is the
    wrapped link's."""

    def __init__(self, link: Link, faults: Faults):
        self.link = link
        self.faults = faults
        self.counts = FaultCounts()
        self.on_frame: Callable[[Frame], None] | None = None
        self._rng = random.Random(faults.seed)
        self._lock = threading.Lock()
        self._held: dict[str, Callable[[], None] | None] = {"out": None, "in": None}
        decoder = getattr(link, "decoder", None)
        self._auth = getattr(decoder, "auth", None)
        if self._auth is not None:
            decoder.auth = _TagOnly(self._auth)
        link.on_frame = self._receive

    @property
    def port(self) -> str:
        return self.link.port

    @property
    def text(self):
        return self.link.text

    @property
    def error(self) -> str | None:
        return self.link.error

    @property
    def lost(self) -> bool:
        return self.link.lost

    @property
    def bus_bytes(self) -> int:
        return self.link.bus_bytes

    def write_raw(self, data: bytes) -> None:
        self.link.write_raw(data)

    def watch(self, callback: Callable[[], None]) -> None:
        self.link.watch(callback)

    def noise(self) -> tuple[int, dict[str, int]]:
        return self.link.noise()

    def reopen(self) -> bool:
        return self.link.reopen()

    def close(self) -> None:
        self.link.close()

    def send(self, frame: bytes) -> None:
        self._apply("out", frame, self._corrupt_out, self.link.send)

    def _receive(self, f: Frame) -> None:
        self._apply("in", f, self._corrupt_in, self._deliver)

    def _deliver(self, f: Frame) -> None:
        if self._auth is not None:
            try:
                with self._lock:  # (timers deliver too); a HELLO passes no window (codec.OPEN_TYPE)
                    if f.mtype != OPEN_TYPE:
                        self._auth.check_replay(self._auth.peer if f.src is None else f.src, f.counter)
            except Replay:
                return
        if self.on_frame is not None:
            self.on_frame(f)

    def _apply(self, way: str, item, corrupt: Callable, deliver: Callable) -> None:
        fa, rng = self.faults, self._rng
        with self._lock:
            self.counts.frames += 1
            self.counts.by_direction[way] += 1
            roll = [rng.random() for _ in range(5)]
            if roll[0] < fa.drop:
                self.counts.dropped += 1
                return
            if roll[1] < fa.corrupt:
                self.counts.corrupted += 1
                item = corrupt(item, rng)
                if item is None:
                    return
            copies = 2 if roll[2] < fa.duplicate else 1
            self.counts.duplicated += copies - 1
            delay = rng.uniform(0.0, fa.delay_s) if roll[4] < fa.delay else 0.0
            self.counts.delayed += delay > 0
            released, self._held[way] = self._held[way], None
            send = (lambda it=item, n=copies: [deliver(it) for _ in range(n)])
            if roll[3] < fa.reorder and released is None:
                self.counts.reordered += 1
                self._held[way] = send
                threading.Timer(fa.hold_s, self._release, (way, send)).start()
                send = None
        for job in (send, released):
            if job is None:
                continue
            if delay:
                threading.Timer(delay, self._late, (job,)).start()
            else:
                job()

    @staticmethod
    def _late(job: Callable[[], None]) -> None:
        """A delayed or held frame, sent from a timer: if its link closed meanwhile, the frame is lost,
        as one in flight when a cable is pulled (the caller saw its send succeed long ago)."""
        try:
            job()
        except LinkError:
            pass

    def _release(self, way: str, job: Callable[[], None]) -> None:
        with self._lock:
            if self._held[way] is not job:
                return  # already overtaken and sent
            self._held[way] = None
        self._late(job)

    @staticmethod
    def _corrupt_out(frame: bytes, rng: random.Random) -> bytes:
        return flip_bit(frame, rng)

    @classmethod
    def _corrupt_in(cls, f: Frame, rng: random.Random) -> None:
        raw = encode(f.mtype, f.payload, src=f.src, dst=f.dst, seq=f.seq, session=f.session, reply=f.reply)
        try:
            decode(cls._corrupt_out(raw, rng))
        except CodecError:
            return None  # the receiver's CRC check drops it, as a damaged line on the wire
        raise AssertionError("a frame with one flipped bit passed its CRC check")

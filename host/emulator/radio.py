"""The virtual ESP-NOW radio: a UDP hub on loopback that boards' `espnow` stand-ins talk through.

Each board registers its MAC; a sent packet is delivered to the board with the destination MAC (or to
every other board for ff:ff:ff:ff:ff:ff), subject to seeded loss, duplication, corruption, delay and
reordering. An encrypted packet carries its sender's key material to the receiving stand-in, which
decides whether it decrypts there (host/emulator/mpy/espnow.py); broadcasts are marked as such. A sync
send is answered at once with whether the packet will be delivered (the real radio's MAC-layer ack, which
does not say whether the packet decrypted). Packets longer than the MTU are dropped (the stand-in refuses
to send them). With `raises`, a sync send is answered, at that rate, by an error the real port raises from
`ESPNow.send` instead (ports/esp32/modespnow.c espnow_send): ESP_ERR_ESPNOW_NO_MEM (the stack's buffers stayed
full through its 2 s of retries: the packet is not sent) or ETIMEDOUT (acks pending past 100 ms: the packet
may have gone). Wire format: see host/emulator/mpy/espnow.py.
"""

from __future__ import annotations

import heapq
import random
import select
import socket
import threading
import time
from dataclasses import dataclass, field

from specmesh.host.bus.faults import flip_bit

BROADCAST = b"\xff" * 6
# OSError numbers of what ESPNow.send raises: ESP-IDF's esp_now.h (ESP_ERR_ESPNOW_BASE = 0x3000 + 100), negated
# by ports/esp32/mphalport.c check_esp_err_; ETIMEDOUT is MP_ETIMEDOUT (py/mperrno.h)
ESP_ERR_ESPNOW_NO_MEM = 0x3067
ETIMEDOUT = 110
KEY_LEN = 16  # espnow.KEY_LEN: an encrypted packet carries the sender's PMK and LMK
ENCRYPTED, BROADCAST_MODE = 1, 2  # packet modes (0: plain unicast)


@dataclass
class RadioConfig:
    mtu: int = 250  # espnow.MAX_DATA_LEN: 250 on released MicroPython, 1470 with ESP-IDF >= 5.4
    loss: float = 0.0  # probability a packet is lost
    duplicate: float = 0.0  # probability a delivered packet arrives twice
    corrupt: float = 0.0  # probability a delivered packet has one bit flipped (the receiver's CRC must drop it)
    reorder: float = 0.0  # probability a packet is held back by `reorder_ms` (later ones overtake it)
    delay_ms: float = 0.0  # base one-way delay
    reorder_ms: float = 5.0
    raises: float = 0.0  # probability a sync send raises OSError on the sender (NO_MEM or ETIMEDOUT, half each)
    seed: int = 0


@dataclass
class RadioStats:
    sent: int = 0
    delivered: int = 0
    lost: int = 0
    duplicated: int = 0
    corrupted: int = 0
    oversize: int = 0
    raised: int = 0  # sync sends answered with an OSError (`raises`)
    unknown_dst: int = 0
    encrypted: int = 0  # packets sent to an encrypted peer
    payload_bytes: int = 0  # ESP-NOW payload bytes sent (what counts against MAX_DATA_LEN)
    by_board: dict[str, int] = field(default_factory=dict)


def mac_str(mac: bytes) -> str:
    return ":".join(f"{b:02x}" for b in mac)


class RadioHub:
    """Start with `start()` (or `with`); give boards `address`."""

    def __init__(self, config: RadioConfig | None = None) -> None:
        self.config = config or RadioConfig()
        self.stats = RadioStats()
        self._rng = random.Random(self.config.seed)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self._boards: dict[bytes, tuple[str, int]] = {}
        self._pending: list[tuple[float, int, tuple[str, int], bytes]] = []
        self._counter = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="radio-hub", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        return self._sock.getsockname()

    def start(self) -> RadioHub:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._sock.close()

    def __enter__(self) -> RadioHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def boards(self) -> list[str]:
        return [mac_str(m) for m in list(self._boards)]  # (list: one step, while the hub thread adds boards)

    def _serve(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            while self._pending and self._pending[0][0] <= now:
                _, _, addr, pkt = heapq.heappop(self._pending)
                self._sock.sendto(pkt, addr)
            wait = 0.05 if not self._pending else max(0.0, min(0.05, self._pending[0][0] - now))
            ready, _, _ = select.select([self._sock], [], [], wait)
            if ready:
                try:
                    pkt, addr = self._sock.recvfrom(4096)
                except OSError:
                    continue
                self._handle(pkt, addr)

    def _handle(self, pkt: bytes, addr: tuple[str, int]) -> None:
        kind = pkt[:1]
        if kind == b"R" and len(pkt) == 7:
            self._boards[pkt[1:7]] = addr
            return
        if kind != b"S" or len(pkt) < 9:
            return
        sync, dst, mode = pkt[1], pkt[2:8], pkt[8]
        keys, msg = (pkt[9:9 + 2 * KEY_LEN], pkt[9 + 2 * KEY_LEN:]) if mode == ENCRYPTED else (b"", pkt[9:])
        src = next((m for m, a in self._boards.items() if a == addr), None)
        if src is None:
            return
        self.stats.sent += 1
        self.stats.encrypted += mode == ENCRYPTED
        self.stats.payload_bytes += len(msg)
        name = mac_str(src)
        self.stats.by_board[name] = self.stats.by_board.get(name, 0) + 1
        if sync and self.config.raises and self._rng.random() < self.config.raises:
            self.stats.raised += 1
            if self._rng.random() < 0.5:  # NO_MEM: never sent
                self._sock.sendto(b"X" + ESP_ERR_ESPNOW_NO_MEM.to_bytes(2, "little"), addr)
                return
            if dst in self._boards:  # ETIMEDOUT: it went, or not, as the radio has it
                self._transmit(src, bytes([mode]) + keys, msg, self._boards[dst])
            self._sock.sendto(b"X" + ETIMEDOUT.to_bytes(2, "little"), addr)
            return
        if len(msg) > self.config.mtu:
            self.stats.oversize += 1
            delivered = False
        elif dst == BROADCAST:
            delivered = True
            for mac, to in self._boards.items():
                if mac != src:
                    self._transmit(src, bytes([BROADCAST_MODE]), msg, to)
        elif dst not in self._boards:
            self.stats.unknown_dst += 1
            delivered = False
        else:
            delivered = self._transmit(src, bytes([mode]) + keys, msg, self._boards[dst])
        if sync:
            self._sock.sendto(b"A" + (b"\x01" if delivered else b"\x00"), addr)

    def _transmit(self, src: bytes, mode: bytes, msg: bytes, to: tuple[str, int]) -> bool:
        cfg = self.config
        if self._rng.random() < cfg.loss:
            self.stats.lost += 1
            return False
        copies = 2 if self._rng.random() < cfg.duplicate else 1
        self.stats.duplicated += copies - 1
        if cfg.corrupt and self._rng.random() < cfg.corrupt:
            msg = flip_bit(msg, self._rng)
            self.stats.corrupted += 1
        for _ in range(copies):
            delay = cfg.delay_ms
            if self._rng.random() < cfg.reorder:
                delay += cfg.reorder_ms
            self._counter += 1
            heapq.heappush(self._pending, (time.monotonic() + delay / 1000, self._counter, to, b"D" + src + mode + msg))
            self.stats.delivered += 1
        return True

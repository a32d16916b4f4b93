"""Virtual board stand-in for `espnow`: the real module's API over the host's virtual radio hub.

Packets go by UDP on loopback to the hub (host/emulator/radio.py), which applies loss, duplication,
reordering and delay and forwards them to the destination board. Wire format to the hub:
b"R" + mac (register), b"S" + sync u8 + dst mac + mode u8 + [pmk + lmk] + msg (send); from the hub:
b"D" + src mac + mode u8 + [pmk + lmk] + msg (a received packet), b"A" + delivered u8 (the per-packet
answer a sync send waits for), or b"X" + errno u16 (that send raises OSError, as the real port's can).
mode: 0 plain, 1 encrypted (the 32 key bytes follow), 2 broadcast.

Errors are raised as ports/esp32 raises them (mphalport.c check_esp_err_): OSError(-code, name) for an
ESP-IDF code (esp_now.h: ESP_ERR_ESPNOW_BASE 0x3064 + 1..8), OSError(ETIMEDOUT) for acks pending past
100 ms (modespnow.c _wait_for_pending_responses); a message over MAX_DATA_LEN is ESP_ERR_ESPNOW_ARG (the
stack refuses it in esp_now_send), a peer never added ESP_ERR_ESPNOW_NOT_FOUND.

Encryption (CCMP with the PMK and the peer's LMK on a board) is modelled by the keys travelling with the
packet: the receiver keeps an encrypted packet only if it registered the sender as an encrypted peer with
the same PMK and LMK, and a plain unicast packet only if the sender is not one of its encrypted peers;
other packets are dropped after the radio acknowledged them (counted in `undecryptable`). Broadcasts are
never encrypted and always kept. At most MAX_ENCRYPT_PEER_NUM encrypted peers (ESP_ERR_ESPNOW_FULL).
Environment (set by the board supervisor): VBOARD_RADIO "host:port", VBOARD_MAC, VBOARD_MTU.
"""

import os
import select
import socket
import time

import esp32
import network

MAX_DATA_LEN = int(os.getenv("VBOARD_MTU") or "250")
MAX_TOTAL_PEER_NUM = 20
MAX_ENCRYPT_PEER_NUM = 6
KEY_LEN = 16
ADDR_LEN = 6
_BROADCAST = b"\xff" * 6
_DEFAULT_PMK = bytes(KEY_LEN)  # the stack's default when set_pmk is never called (a fixed value)
# ESP-IDF heap the modelled Wi-Fi driver needs for its dynamic buffers (ten of 1.6 KB, an assumption): with less
# free, esp_now_send keeps answering ESP_ERR_ESPNOW_NO_MEM and ESPNow.send raises it (modespnow.c espnow_send),
# on a board whose ESP-IDF heap is modelled (VBOARD_IDF_BYTES, esp32.py)
_DRIVER_BYTES = 16384


_CODES = {"ESP_ERR_ESPNOW_NOT_INIT": 0x3065, "ESP_ERR_ESPNOW_ARG": 0x3066, "ESP_ERR_ESPNOW_NO_MEM": 0x3067,
          "ESP_ERR_ESPNOW_FULL": 0x3068, "ESP_ERR_ESPNOW_NOT_FOUND": 0x3069, "ESP_ERR_ESPNOW_INTERNAL": 0x306A,
          "ESP_ERR_ESPNOW_EXIST": 0x306B, "ESP_ERR_ESPNOW_IF": 0x306C}
_ETIMEDOUT = 110


def _err(name):
    return OSError(-_CODES[name], name)


def _raised(code):
    """The OSError the hub's b"X" answer stands for."""
    if code == _ETIMEDOUT:
        return OSError(_ETIMEDOUT)
    for name, value in _CODES.items():
        if value == code:
            return _err(name)
    return OSError(-code)


class ESPNow:
    _instance = None

    def __new__(cls):  # the real ESPNow() is a singleton
        if ESPNow._instance is None:
            ESPNow._instance = object.__new__(cls)
            ESPNow._instance._init()
        return ESPNow._instance

    def _init(self):
        self._active = False
        self._sock = None
        self._poll = None
        self._peers = {}
        self._queue = []
        self._queued_bytes = 0
        self._rxbuf = 526
        self._timeout_ms = 300_000
        self._stats = [0, 0, 0, 0, 0]  # tx_pkts, tx_responses, tx_failures, rx_packets, rx_dropped
        self._hub = None
        self._pmk = _DEFAULT_PMK
        self.undecryptable = 0  # packets dropped because their encryption did not match (not in the real API)

    def __init__(self):
        pass

    # -- set-up ----------------------------------------------------------------------------------

    def active(self, flag=None):
        if flag is None:
            return self._active
        if flag and not self._active:
            radio = os.getenv("VBOARD_RADIO")
            if not radio:
                raise OSError(-_CODES["ESP_ERR_ESPNOW_INTERNAL"],
                              "ESP_ERR_ESPNOW_INTERNAL: no virtual radio on this board")
            host, port = radio.split(":")
            self._hub = socket.getaddrinfo(host, int(port))[0][-1]
            self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self._sock.bind(socket.getaddrinfo("127.0.0.1", 0)[0][-1])
            self._poll = select.poll()
            self._poll.register(self._sock, select.POLLIN)
            self._sock.sendto(b"R" + network._mac(), self._hub)
            self._active = True
        elif not flag and self._active:
            self._sock.close()
            self._sock = None
            self._active = False
            self._queue = []
            self._queued_bytes = 0
        return self._active

    def config(self, rxbuf=None, timeout_ms=None, rate=None):
        if rxbuf is not None:
            self._rxbuf = rxbuf
        if timeout_ms is not None:
            self._timeout_ms = timeout_ms

    def set_pmk(self, pmk):
        if len(pmk) != KEY_LEN:
            raise ValueError("key must be 16 bytes")
        self._pmk = bytes(pmk)

    def add_peer(self, mac, lmk=None, channel=0, ifidx=0, encrypt=None):
        mac = bytes(mac)
        if len(mac) != 6:
            raise ValueError("invalid peer MAC address")
        if lmk and len(lmk) != KEY_LEN:
            raise ValueError("key must be 16 bytes")
        if mac in self._peers:
            raise _err("ESP_ERR_ESPNOW_EXIST")
        if len(self._peers) >= MAX_TOTAL_PEER_NUM:
            raise _err("ESP_ERR_ESPNOW_FULL")
        enc = bool(lmk) if encrypt is None else bool(encrypt)
        if enc and mac == _BROADCAST:
            raise _err("ESP_ERR_ESPNOW_ARG")
        if enc and self.peer_count()[1] >= MAX_ENCRYPT_PEER_NUM:
            raise _err("ESP_ERR_ESPNOW_FULL")
        self._peers[mac] = (mac, bytes(lmk) if lmk else b"", channel, ifidx, enc)

    def peer_count(self):
        """(registered peers other than broadcast, encrypted peers)."""
        return (sum(1 for m in self._peers if m != _BROADCAST), sum(1 for p in self._peers.values() if p[4]))

    def _keys(self, mac):
        """The key material of packets to or from peer `mac` if they are encrypted, else None."""
        peer = self._peers.get(mac)
        if peer is None or not peer[4]:
            return None
        return self._pmk + (peer[1] or bytes(KEY_LEN))

    def del_peer(self, mac):
        try:
            del self._peers[bytes(mac)]
        except KeyError:
            raise _err("ESP_ERR_ESPNOW_NOT_FOUND") from None

    def get_peer(self, mac):
        try:
            return self._peers[bytes(mac)]
        except KeyError:
            raise _err("ESP_ERR_ESPNOW_NOT_FOUND") from None

    def get_peers(self):
        return tuple(self._peers.values())

    def stats(self):
        return tuple(self._stats)

    # -- sending -----------------------------------------------------------------------------------

    def send(self, mac, msg=None, sync=True):
        if msg is None:
            msg, mac = mac, None
        if not self._active:
            raise _err("ESP_ERR_ESPNOW_NOT_INIT")
        if not network.sta_active():
            raise _err("ESP_ERR_ESPNOW_IF")
        if isinstance(msg, str):
            msg = msg.encode()
        if len(msg) > MAX_DATA_LEN:
            raise _err("ESP_ERR_ESPNOW_ARG")
        if esp32._IDF and esp32.idf_heap_info(esp32.HEAP_DATA)[0][2] < _DRIVER_BYTES:
            self._stats[2] += 1
            raise _err("ESP_ERR_ESPNOW_NO_MEM")  # the GC heap grew into the driver's buffers
        targets = list(self._peers) if mac is None else [bytes(mac)]
        for dst in targets:
            if dst not in self._peers:
                raise _err("ESP_ERR_ESPNOW_NOT_FOUND")
        ok = True
        for dst in targets:
            want_ack = sync and dst != _BROADCAST
            keys = self._keys(dst)
            mode = b"\x00" if keys is None else b"\x01" + keys
            self._sock.sendto(b"S" + (b"\x01" if want_ack else b"\x00") + dst + mode + bytes(msg), self._hub)
            self._stats[0] += 1
            if want_ack:
                if self._wait_ack():
                    self._stats[1] += 1
                else:
                    self._stats[2] += 1
                    ok = False
        return ok

    def _wait_ack(self):
        deadline = time.ticks_add(time.ticks_ms(), 500)
        while True:
            left = time.ticks_diff(deadline, time.ticks_ms())
            if left <= 0:
                return False
            pkt = self._read(left)
            if pkt is not None and pkt[0] == 0x41:  # "A"
                return pkt[1] == 1
            if pkt is not None and pkt[0] == 0x58:  # "X": this send raises
                raise _raised(pkt[1] | pkt[2] << 8)

    # -- receiving -------------------------------------------------------------------------------

    def _read(self, timeout_ms):
        """One packet from the hub; data packets are queued (or dropped past rxbuf), acks returned."""
        if not self._poll.poll(timeout_ms):
            return None
        pkt = self._sock.recv(2048)
        if pkt[:1] == b"D":
            self._receive(pkt[1:7], pkt[7], pkt[8:])
            return None
        return pkt

    def _receive(self, src, mode, body):
        """Queue a packet from the hub if it decrypts here (see the module docstring)."""
        keys = self._keys(src)
        if mode == 1:
            msg = body[2 * KEY_LEN:]
            ok = keys is not None and keys == body[:2 * KEY_LEN]
        else:
            msg = body
            ok = mode == 2 or keys is None
        if not ok:
            self.undecryptable += 1
            return
        self._stats[3] += 1
        if self._queued_bytes + len(msg) > self._rxbuf:
            self._stats[4] += 1
        else:
            self._queue.append((src, msg))
            self._queued_bytes += len(msg)

    def _drain(self):
        while self._read(0) is not None or self._poll.poll(0):
            pass

    def any(self):
        if not self._active:
            return False
        self._drain()
        return bool(self._queue)

    def irecv(self, timeout_ms=None):
        if not self._active:
            raise _err("ESP_ERR_ESPNOW_NOT_INIT")
        timeout_ms = self._timeout_ms if timeout_ms is None else timeout_ms
        self._drain()
        if timeout_ms < 0:
            timeout_ms = 1 << 30
        deadline = time.ticks_add(time.ticks_ms(), timeout_ms)
        while not self._queue:
            left = time.ticks_diff(deadline, time.ticks_ms())
            if left <= 0:
                return [None, None]
            self._read(left)
        mac, msg = self._queue.pop(0)
        self._queued_bytes -= len(msg)
        return [mac, msg]

    recv = irecv

    def recvinto(self, data, timeout_ms=None):
        mac, msg = self.irecv(timeout_ms)
        if msg is None:
            return 0
        data[0] = mac
        data[1] = msg
        return len(msg)

    def __iter__(self):
        return self

    def __next__(self):
        return self.irecv()

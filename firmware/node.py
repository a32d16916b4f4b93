"""The node: reads frames from its links, routes or dispatches them, answers every request once.

One loop serves every link kind (links.py). A frame addressed to this node (or broadcast, or carrying
no addresses: from the peer at the link's other end) is a request: it gets exactly one reply with the
request's seq and the REPLY flag, addressed as the request was, sent back on the link it came from. A
request whose (src, seq, type, session, payload) equals one of the last REPLY_CACHE answered is a
retransmission: the cached reply goes out again and nothing is done twice (CONTRACTS section 2,
"Reliability"). Anything wrong with a request (malformed payload, wrong state, out of
range, out of memory, even a bug) becomes an ERROR reply and a count; the node never dies on input.
A frame that fails its CRC is only counted (its sender cannot be trusted); one with a good CRC but an
unknown type or version still gets an ERROR reply.

Gateway: with a second ("radio") link, frames for other node ids are forwarded as they are, to the
radio when it reaches that node, to the first ("host") link when they are for the host (id 0);
broadcasts from the host link are also handed to the radio.

CONFIGURE replies from the id it was addressed to, then takes the new id, role and model, and
saves them in the board config. RESET replies ACK and ends `run()`, back to the REPL.

Signing (docs/security.md, version 2): a keyed node answers a signed HELLO with a fresh nonce that, with the
host's session id, binds every later frame of the session; it keeps its counter in RAM and reserves blocks
of counters in its key file ("ctr": the first counter a later boot may use; config.KEY_PATH), one flash
write per boot and per block, and signs nothing beyond what that file reserved: not past the end of the
range, nor past a block it could not save. Frames it cannot authenticate get an
unsigned refusal (at most one per 250 ms) and cost it no counter.
"""

import gc
import struct
import sys
import time

from micropython import const

from shared import codec
from shared import messages as m
from shared.board import MAX_TRY_CTX, MIN_CTX, NODE_IDS, RESERVE, ROLES, STAGE_RESERVE, VERIFIER_RESERVE

import config
import cpucount
import kernelpick
import roles
from roles import Refused
from shared.messages import E_INTERNAL, E_KEY, E_MEMORY, E_MESSAGE, E_MODEL, E_STATE, HOST

FW_VERSION = "specmesh-node 0.1"  # HELLO's fw: specmesh flash stamps the id of the files it flashes in its place
# ESP-IDF heap a radio node leaves to Wi-Fi/ESP-NOW: its dynamic buffers come from the IDF heap that the esp32 port's GC
# heap also grows into (py/gc.c gc_try_add_heap), and without them ESPNow.send raises NO_MEM (micropython#14421:
# low IDF memory drops packets). An assumption: ten of the driver's 1.6 KB dynamic buffers; not measured on a board
_RADIO_IDF = const(16384)
SMALL_HEAP = 1 << 20  # below this heap size (no PSRAM) the node collects garbage after every request
REPLY_CACHE = 4  # replies kept for retransmitted requests (a host may have a few requests in flight)
POLL_MS = 1000  # longest a single-link node blocks in one poll (nothing depends on it waking)
_CTR_BLOCK = const(4096)  # signing counters reserved per flash write
_REFUSE_GAP_MS = const(250)  # least time between two refusals of frames not taken (docs/security.md)

STAT_KEYS = ("requests", "dup_replies", "errors", "bad_frames", "stray", "forwarded", "drafted", "ahead", "draft_hits",
             "verified", "accepted", "passes", "positions", "compute_ms", "heap_free", "heap_min",
             "committed", "kv", "uptime_ms", "dropped", "unsigned", "bad_tag", "replayed", "cls_reads")
# signed-bus refusals: unsigned frames, bad tags (forged, or another key), used counters (replays); by
# index, so their names stay constants of the tuple (no interned string: the drafter's heap is tight)
_UNSIGNED = const(20)
_BAD_TAG = const(21)
_REPLAYED = const(22)
# datagram-link events of a lossy radio, not malformed input: radio sends that raised (firmware/links.py), and an
# OSError that left a link's recv or send (the loop counts it on that link and goes on: a board never falls to
# its REPL because its radio driver ran out of buffers)
LOSSES = ("duplicate", "stale", "send_failed", "oserror")


def _caps(engine):
    """HELLO caps: viper (the loaded engine's kernels, else whether this build emits native code), ulab, espnow,
    and on a last pipeline stage whether it holds the classifier in its heap (firmware/stage_engine.py)."""
    if engine is not None:
        caps = (m.CAP_VIPER if engine.viper else 0) | (m.CAP_CLS_HELD if getattr(engine, "cls_held", 0) else 0)
    else:
        caps = m.CAP_VIPER if (getattr(sys.implementation, "_mpy", 0) >> 10) & 0x0F else 0
    for name, bit in (("ulab", m.CAP_ULAB), ("espnow", m.CAP_ESPNOW)):
        try:
            __import__(name)
            caps |= bit
        except ImportError:
            pass
    return caps


class Node:
    """A bus node: config, role, links, reply cache and counters."""

    def __init__(self, cfg, links, config_path=config.PATH, load_error=None, key=None, key_path=config.KEY_PATH):
        """`key`: (deployment key, counter floor) of the key file (config.load_key), None without one."""
        self.cfg = cfg
        self.config_path = config_path
        self.key_path = key_path
        self.links = links
        self._radio = [link for link in links if getattr(link, "radio", False)]  # links whose driver shares the heap
        self.node_id = cfg["node_id"]
        self.key = key[0] if key else None
        self.auth = codec.Auth(key[0], 24, key[1], self.node_id, HOST) if key else None
        self._floor = key[1] if key else 0  # the counter the key file lets a later boot start at
        self.spent = False  # the key's counters are used up: nothing more is signed
        self.stats = {}
        for k in STAT_KEYS:
            self.stats[k] = 0
        self.role = None
        self.role_id = m.ROLE_IDLE
        self.done = False
        self._cache = [None] * REPLY_CACHE  # (src, seq, type, session, payload, reply frame), a ring
        self._next = 0
        self._session = 0
        self._t0 = time.ticks_ms()
        self._new_id = None  # node id a CONFIGURE switches to once it has replied
        self._idle_paused = False
        self._refused_at = time.ticks_add(time.ticks_ms(), -_REFUSE_GAP_MS)  # when the last refusal went out
        self.heap_min = gc.mem_free()
        self._small_heap = gc.mem_free() + gc.mem_alloc() < SMALL_HEAP
        if load_error:
            _say(load_error)
        if self.auth is not None:
            self._reserve()
        self.why_idle = None  # why the role of the config did not start: said at boot, and to role requests
        if cfg["role"] != "idle":
            try:
                self._load(ROLES.index(cfg["role"]), cfg["model"])
            except Refused as e:
                self.why_idle = "cannot start as %s: %s" % (cfg["role"], e)
                _say(self.why_idle)
                self.stats["errors"] += 1

    # -- the loop ------------------------------------------------------------------------------

    def run(self):
        """Serve until RESET or the first link's input ends; Ctrl-C raises KeyboardInterrupt out of here.

        With one link and no background work the node blocks in that link's poll; with background work
        (drafting ahead) it polls without waiting between steps; with several links it polls them in turn."""
        links = self.links
        single = len(links) == 1
        work = False  # the role may have background work: poll without blocking, then try a step
        while not self.done:
            busy = False
            for link in links:
                raw = None
                try:
                    raw = link.recv(POLL_MS if single and not work else 0)
                    if raw is not None:
                        busy = True
                        self.on_frame(raw, link)  # signs at most two frames (a HELLO's nonce and reply)
                        if self.auth is not None and self.auth.counter + 4 > self._floor and not self.spent:
                            self._reserve()
                except MemoryError:  # a frame too large for the heap left: refuse it if it says to whom
                    self.stats["bad_frames"] += 1
                    gc.collect()
                    if not self._refuse_big(raw, getattr(link, "head", None), link):
                        _say("out of memory reading a frame: dropped (%d bytes free)" % gc.mem_free())
                except OSError:
                    errors = link.errors
                    errors["oserror"] = errors.get("oserror", 0) + 1
            if links[0].closed:
                break
            if busy:
                work = True
                continue
            work = self._idle_step()
            if not work and not single:
                time.sleep_ms(1)

    def _reserve(self):
        """Reserve the next block of signing counters in the key file (a later boot starts above it); signing
        stops at the last block saved (on_frame), and for good before the range ends."""
        auth = self.auth
        if auth.counter + 4 >= codec.LAST_COUNTER:  # the range is used up (a request signs at most 2)
            self.spent = True
            auth.counter = codec.LAST_COUNTER  # a later boot signs nothing either
            _say(m.KEY_WHY[3])
        floor = codec.LAST_COUNTER if self.spent else min(auth.counter + _CTR_BLOCK, codec.LAST_COUNTER)
        try:
            config.save_key(self.key, floor, self.key_path)
            self._floor = floor
        except (OSError, MemoryError, config.ConfigError) as e:
            _say("signing counters not saved (%s): signing stops at %d" % (e, self._floor))

    def _idle_step(self):
        """Background work of the role (pipelined drafting); paused after a MemoryError until the next request."""
        role = self.role
        if role is None or self._idle_paused:
            return False
        try:
            return role.idle_step()
        except MemoryError:  # the role's state is still consistent; drafting ahead is only an optimisation
            self._idle_paused = True
            gc.collect()
            return False

    # -- frames --------------------------------------------------------------------------------

    def on_frame(self, raw, link):
        """Route or handle one binary frame that arrived on `link`."""
        dst = codec.dst_of(raw)  # None: for this node, from the peer at the link's other end
        if dst is not None:
            if dst != self.node_id and dst != codec.BROADCAST:
                self._forward(raw, dst, link)
                return
            if dst == codec.BROADCAST and link is self.links[0] and len(self.links) > 1:
                self.links[1].send(raw)
                self.stats["forwarded"] += 1
        try:
            f = codec.decode(raw, self.auth)
        except codec.BadType as e:  # with a key: an authentic frame of type 0 (the tag is checked first)
            self.stats["bad_frames"] += 1
            self.stats["errors"] += 1
            self._refuse(raw, E_MESSAGE, str(e), link, None if self.spent else self.auth)
            return
        except codec.Replay:  # an authentic request seen before: a retransmission gets its cached reply as sent
            t, fl, src, _d, seq, session, a, b = codec.header(raw)
            if self._resend(src, seq, t, session, bytes(raw[a:b]), link, False):
                return
            self.stats["bad_frames"] += 1  # a used counter: refused, and nothing is signed for it
            self.stats[STAT_KEYS[_REPLAYED]] += 1
            return
        except codec.BadAuth:  # unsigned where a key is set, or a tag that fails: forged, or another key
            st = self.stats
            st["bad_frames"] += 1
            st[STAT_KEYS[_BAD_TAG if raw[0] & codec.FLAG_SIGNED else _UNSIGNED]] += 1
            self._refuse_key(raw, link)
            return
        except codec.CodecError:
            self.stats["bad_frames"] += 1
            return
        if f.reply:
            self.stats["stray"] += 1
            return
        if self.spent or self.auth is not None and self.auth.counter + 2 > self._floor:  # nothing left to sign with
            self._refuse(raw, E_KEY, m.KEY_WHY[3] if self.spent else "signing counters not saved", link)
            return
        self._request(f, link)

    def _refuse_key(self, raw, link):
        """Unsigned ERROR E_KEY to a frame refused for its signature, saying why (the host's key-mismatch
        diagnosis reads it before its link authenticated, and nothing after)."""
        why = (m.KEY_WHY[0] if self.auth is None else m.KEY_WHY[1] if not raw[0] & codec.FLAG_SIGNED else
               m.KEY_WHY[3] if self.spent else m.KEY_WHY[2])
        self._refuse(raw, E_KEY, why, link)

    def _refuse_big(self, raw, head, link):
        """ERROR E_MEMORY to a frame too big for the heap left, addressed from the frame (`raw`, read whole) or
        its line's first bytes (`head`: ':' and 8 base64 digits); its CRC and tag could not be checked. False
        if neither says to whom."""
        if raw is None:
            try:
                raw = codec.decode_line(head[1:9])
            except (TypeError, codec.CodecError):
                return False
        elif len(raw) < codec.MIN_FRAME:
            return False
        dst = codec.dst_of(raw)
        if dst is not None and dst != self.node_id and dst != codec.BROADCAST:
            return False
        self._refuse(raw, E_MEMORY, "frame too big for this node's free heap (%d bytes): send a shorter one "
                     "(a shorter prompt)" % gc.mem_free(), link)
        return True

    def _refuse(self, raw, code, why, link, auth=None):
        """An ERROR for a frame the node could not take, addressed from its header bytes, at most one per
        _REFUSE_GAP_MS (a flood earns few frames); never to a reply; signed only with `auth` (a frame that
        authenticated), so unauthenticated input costs no counter."""
        now = time.ticks_ms()
        fl = raw[0]
        if fl & codec.FLAG_REPLY or time.ticks_diff(now, self._refused_at) < _REFUSE_GAP_MS:
            return
        self._refused_at = now
        addr = fl & codec.FLAG_ADDR
        src = raw[1] if addr else None
        me = self.node_id if addr else None
        link.send(codec.encode(m.ERROR, m.pack_error(code, why), me, src, raw[3 if addr else 1], 0, True, auth))

    def _forward(self, raw, dst, link):
        links = self.links
        out = None
        if dst == HOST:
            out = links[0] if link is not links[0] else None
        elif len(links) > 1 and links[1].routes(dst):
            out = links[1]
        if out is None:
            self.stats["stray"] += 1
            return
        out.send(raw)
        self.stats["forwarded"] += 1

    def _resend(self, src, seq, mtype, session, payload, link, fresh=True):
        """Send the cached reply if this request was answered already; True if it was. A `fresh` request (a
        retransmission re-signed, not a byte-identical replay) in a session opened since gets it re-signed
        under that session."""
        for i in range(REPLY_CACHE):
            hit = self._cache[i]
            if (hit is not None and hit[0] == src and hit[1] == seq and hit[2] == mtype and hit[3] == session
                    and hit[4] == payload):
                self.stats["dup_replies"] += 1
                if fresh and self.auth is not None and hit[6] is not self._signing():
                    hit = hit[:5] + (codec.resign(hit[5], self.auth), self._signing())
                    self._cache[i] = hit
                link.send(hit[5])
                return True
        return False

    def _signing(self):
        """The session this node signs its replies under now (None: unkeyed, or none open)."""
        return self.auth.sessions.get(self.node_id) if self.auth is not None else None

    def _request(self, f, link):
        st = self.stats
        if self._resend(f.src, f.seq, f.mtype, f.session, f.payload, link):
            return
        st["requests"] += 1
        self._idle_paused = False
        src_id = self.node_id if f.flags & codec.FLAG_ADDR else None  # a reply is addressed as its request was
        rtype, body, keep = self._answer(f)
        if rtype == m.ERROR:
            st["errors"] += 1
        reply = None
        for _ in range(2):  # building the reply may meet a fragmented heap once
            try:
                reply = codec.encode_buffer(rtype, body, src_id, f.src, f.seq, 0, True, self.auth)
                link.send(reply)
                break
            except MemoryError:
                reply = None  # (not sent)
                gc.collect()
        if reply is None:  # a reply the heap cannot hold: a short ERROR now, where silence cost the host its timeouts
            keep = False  # (not cached: a retransmission tries the reply again)
            st["errors"] += 1
            try:
                link.send(codec.encode(m.ERROR, m.pack_error(E_MEMORY, "out of memory for a %s reply of %d bytes (%d "
                                                             "bytes free): ask for less" % (_name(f.mtype), len(body),
                                                                                            gc.mem_free())),
                                       src_id, f.src, f.seq, 0, True, self.auth))
            except MemoryError:
                pass
        if keep:
            self._cache[self._next] = (f.src, f.seq, f.mtype, f.session, f.payload, reply, self._signing())
            self._next = (self._next + 1) % REPLY_CACHE
        if self._small_heap:
            gc.collect()  # a tidy heap between requests: no fragmentation build-up, a true low-water mark
        self._heap()
        if self._new_id is not None:
            if self.auth is not None:  # the session moves with the id (frames carry ids in their tags)
                for d in (self.auth.sessions, self.auth.pending):
                    if self.node_id in d:
                        d[self._new_id] = d.pop(self.node_id)
                self.auth.me = self._new_id
            self.node_id = self._new_id
            self._new_id = None
            self._cache = [None] * REPLY_CACHE

    def _answer(self, f):
        """(reply type, payload, cacheable) for request f. Every handler is idempotent and updates the
        session only after its allocations, so one that ran out of memory is simply run again once the
        heap is collected; an out-of-memory ERROR is not cached, so a retransmission tries again."""
        for _ in range(2):
            try:
                rtype, body = self._handle(f)
                return rtype, body, True
            except Refused as e:
                return m.ERROR, m.pack_error(e.code, str(e)), True
            except codec.CodecError as e:
                return m.ERROR, m.pack_error(E_MESSAGE, "bad %s payload: %s" % (_name(f.mtype), e)), True
            except MemoryError:
                gc.collect()
            except Exception as e:  # noqa: BLE001 - a bug: report it, never die on input; the session may be inconsistent
                self._drop_session()
                return m.ERROR, m.pack_error(E_INTERNAL, "%s failed: %s: %s" % (_name(f.mtype), type(e).__name__,
                                                                               e)), True
        return m.ERROR, m.pack_error(E_MEMORY, "out of memory in %s of %d bytes (%d bytes free): send a shorter one"
                                     % (_name(f.mtype), len(f.payload), gc.mem_free())), False

    def _headroom(self):
        """Free heap the node may fill: gc.mem_free(), which on the esp32 port adds the largest free ESP-IDF block
        (py/modgc.c gc_mem_free, MICROPY_GC_SPLIT_HEAP_AUTO), less, on a radio node, the part of that block the
        radio keeps (_RADIO_IDF; esp32.idf_heap_info gives the block)."""
        free = gc.mem_free()
        if self._radio:
            try:
                import esp32
            except ImportError:  # a port without the ESP-IDF heap
                return free
            free -= min(_RADIO_IDF, max(h[2] for h in esp32.idf_heap_info(esp32.HEAP_DATA)))
        return free

    def _heap(self):
        free = gc.mem_free()
        if free < self.heap_min:
            self.heap_min = free

    def _drop_session(self):
        """After an unexpected failure the session state may be inconsistent: the host must BEGIN again."""
        if self.role is not None:
            self.role.active = False
        gc.collect()

    # -- messages ------------------------------------------------------------------------------

    def _handle(self, f):
        """(reply type, reply payload) for request `f`; raises Refused / CodecError."""
        t = f.mtype
        args = m.unpack(t, False, f.payload)
        if t == m.PING:
            return m.PING, args[0]
        if t == m.HELLO:
            return m.HELLO, self._hello() + self._open(args)
        if t == m.STATS:
            return m.STATS, m.pack_stats(self._stats())
        if t == m.CONFIGURE:
            return self._configure(*args)
        if t == m.RESET:
            self.done = True
            return m.ACK, b""
        role = self.role
        if role is None:
            raise Refused(E_STATE, "%s needs a role: this node is idle (%s)"
                          % (_name(t), self.why_idle or "send CONFIGURE"))
        if t == m.BEGIN:
            role.begin(*args)
            self._session = f.session
            return m.ACK, b""
        if f.session != self._session:
            raise Refused(E_STATE, "session %d is not the current session %d" % (f.session, self._session))
        if t == m.COMMIT:
            role.commit(*args)
            return m.ACK, b""
        if t == m.ROLLBACK:
            role.rollback(*args)
            return m.ACK, b""
        if t == m.DRAFT_REQ:
            if self.role_id != m.ROLE_DRAFTER:
                raise Refused(E_STATE, "DRAFT_REQ needs a drafter; this node is a %s" % ROLES[self.role_id])
            role.commit(args[0], args[2])  # the COMMIT folded into the request
            return m.DRAFT, m.pack_held_draft(*role.draft(args[0], args[1]))
        if t == m.VERIFY_REQ:
            if self.role_id != m.ROLE_VERIFIER:
                raise Refused(E_STATE, "VERIFY_REQ needs a verifier; this node is a %s" % ROLES[self.role_id])
            return m.VERDICT, m.pack_verdict(*role.verify(*args)[1:])  # the verdict commits itself
        if t == m.STAGE:
            if self.role_id != m.ROLE_STAGE:
                raise Refused(E_STATE, "STAGE needs a stage; this node is a %s" % ROLES[self.role_id])
            return m.STAGE, role.run(*args)
        raise Refused(E_MESSAGE, "%s is not a request" % _name(t))

    def _hello(self):
        e = self.role.engine if self.role is not None else None
        board = self.cfg.get("board") or getattr(sys.implementation, "_machine", sys.platform)
        caps = _caps(e)
        gc.collect()
        # the most drafts it takes: a drafter's chain, what a verifier's pass holds besides the last token, or
        # the positions of one STAGE request on the last stage (one draft each; an earlier stage takes none)
        r = self.role_id
        gmax = (0 if e is None else m.MAX_GAMMA if r == m.ROLE_DRAFTER else e.kmax - 1 if r == m.ROLE_VERIFIER
                else e.kmax if e.head else 0)
        return m.pack_hello(FW_VERSION, board[:64], r, self.cfg["model"][:64],
                            e.vocab if e else 0, e.n_ctx if e else 0, gc.mem_free(), caps, gmax,
                            kernelpick.describe(e.kernels if e else kernelpick.pick()[1])[:128],
                            e.crc if e else 0)  # which build of the file: the host checks its own

    def _open(self, args):
        """A keyed node's HELLO tail for the request payload `args[0]` (the host's session id, a challenge): a
        fresh nonce proposed as the session with that id (current once a request verifies under it), the
        challenge and the highest host counter taken this boot. The nonce is HMAC(key, a counter never used
        before + urandom where the port has it)."""
        auth = self.auth
        p = args[0]
        if auth is None and not p:
            return b""
        if auth is None or len(p) != 16:
            raise Refused(E_MESSAGE, "HELLO: no payload, or signed a session id and a challenge")
        try:
            import os
            rnd = os.urandom(8)
        except (ImportError, AttributeError):
            rnd = b""
        nonce = auth.derive(b"specmesh nonce" + struct.pack("<I", auth.next_counter()) + rnd)[:8]
        auth.pending[self.node_id] = nonce + p[:8]
        return p[8:] + nonce + struct.pack("<I", auth._seen.get(HOST, (0,))[0])  # messages: the HELLO tail

    def _stats(self):
        st = self.stats
        self._heap()
        gc.collect()
        # heap_free: live headroom now; heap_min: lowest free seen after a request (after a collection on a
        # small heap, so the low-water mark of live data; on a PSRAM heap uncollected garbage counts too)
        st["heap_free"] = gc.mem_free()
        st["heap_min"] = self.heap_min
        st["uptime_ms"] = time.ticks_diff(time.ticks_ms(), self._t0)
        role = self.role
        st["committed"] = role.length if role is not None and role.active else 0
        st["kv"] = role.kv if role is not None and role.active else 0
        bad = dropped = 0
        for link in self.links:
            for kind, v in link.errors.items():
                if kind in LOSSES:
                    dropped += v
                else:
                    bad += v
        st["dropped"] = dropped
        # a role's own pairs after the counters (a stage's layers: firmware/stage.py)
        return [(k, st[k] + (bad if k == "bad_frames" else 0)) for k in STAT_KEYS] + cpucount.pairs() + getattr(
            role, "pairs", [])

    def _configure(self, role_id, node_id, model):
        """Load the new role and model, save the config; the reply still comes from the old id."""
        if role_id > m.ROLE_STAGE:
            raise Refused(E_MESSAGE, "unknown role %d (0 idle, 1 drafter, 2 verifier, 3 stage)" % role_id)
        if not NODE_IDS[0] <= node_id <= NODE_IDS[1]:
            raise Refused(E_MESSAGE, "node id %d is outside %d..%d" % (node_id, NODE_IDS[0], NODE_IDS[1]))
        cfg = self.cfg
        try:
            self._load(role_id, model)
        finally:  # a role that failed to load leaves an idle node, and the config says so
            if cfg.get("model") != model or self.role is None:  # a table belongs to the model flashed with it
                cfg.pop("table", None)
            cfg["role"] = ROLES[self.role_id]
            cfg["model"] = model if self.role is not None else ""
        cfg["node_id"] = node_id
        try:
            config.save(cfg, self.config_path)
        except (OSError, config.ConfigError) as e:
            raise Refused(E_STATE, "role set, but the config file cannot be written: %s" % e)
        finally:
            self._new_id = node_id
        return m.ACK, b""

    def _load(self, role_id, model):
        """Replace the role (and engine) by `role_id` running `model`; Refused if it cannot load."""
        self.why_idle = None  # a CONFIGURE's failure is its reply's
        self.role = None
        self.role_id = m.ROLE_IDLE
        gc.collect()
        if role_id == m.ROLE_IDLE:
            return
        cfg = self.cfg
        stage = role_id == m.ROLE_STAGE  # layers [a, b) of the model (config "layers"), firmware/stage.py
        kmax = 1 if role_id == m.ROLE_DRAFTER else cfg.get("kmax", 1 if stage else m.MAX_GAMMA + 1)
        try:
            import engine

            if stage:  # imported before the engine: its code would otherwise sit amid the freed engine of a retry
                import stage as st
                import stage_engine
            n_ctx = cfg.get("n_ctx", 0)
            while True:
                try:
                    if stage:
                        eng = stage_engine.StageEngine(model, cfg.get("layers"), kmax, True, n_ctx)
                    else:
                        eng = engine.Engine(model, kmax, True, n_ctx)
                    if role_id == m.ROLE_DRAFTER:
                        self.role = roles.Drafter(eng, self.stats, cfg.get("spec_ahead", 0),
                                                  cfg.get("table") if model == cfg.get("model") else None)
                    elif stage:
                        self.role = st.Stage(eng, self.stats)
                        eng.hold_classifier(STAGE_RESERVE)  # where the heap allows: no flash read per pass
                    else:
                        self.role = roles.Verifier(eng, self.stats)
                    gc.collect()
                    reserve = STAGE_RESERVE if stage else RESERVE if role_id == m.ROLE_DRAFTER else VERIFIER_RESERVE
                    if self._headroom() >= reserve:
                        break
                    if eng.n_ctx <= MIN_CTX:  # short of its reserve even so: refused now ("does not fit"), not
                        n_ctx = eng.n_ctx  # a MemoryError mid-session
                        raise MemoryError
                    n_ctx = eng.n_ctx // 2  # too little heap left to serve requests: a shorter context (HELLO says)
                except MemoryError:  # a context whose KV cache does not fit at all: shorter, down to MIN_CTX
                    if 0 < n_ctx <= MIN_CTX:
                        raise
                    n_ctx = n_ctx // 2 if n_ctx else MAX_TRY_CTX
                self.role = eng = None
                gc.collect()
        except OSError as e:
            raise Refused(E_MODEL, "cannot open model %r: %s" % (model, e))
        except MemoryError:
            self.role = eng = None
            gc.collect()
            raise Refused(E_MEMORY, "model %r does not fit in %d bytes of free heap" % (model, gc.mem_free()))
        except Exception as e:  # noqa: BLE001 - ModelFileError and the engine's size limits
            raise Refused(E_MODEL, "cannot load model %r: %s" % (model, e))
        self.role_id = role_id
        gc.collect()


def _say(text):
    """A console line that is not a frame: the host skips it but shows it when a node stops answering."""
    print("specmesh: " + text)


def _name(mtype):
    return m.NAMES[mtype] if 0 < mtype < len(m.NAMES) else "type 0x%02x" % mtype

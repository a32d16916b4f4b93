"""`specmesh serve`: one mesh (the back-ends `specmesh run` takes: virtual boards by default, ports,
`--verifier cpu|gpu`, `--stages N`) behind an OpenAI-compatible HTTP API and a live page
(host/cli/server.py), on uvicorn, until Ctrl-C. Starlette and uvicorn are the optional `serve` extra
(`pip install 'specmesh[serve]'`). A mesh of host back-ends serves `--streams` requests at once, batched;
one with boards serves one at a time, the others waiting their turn."""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

from specmesh.host.cli.config import UsageError
from specmesh.host.cli.flags import add_arguments, hide
from specmesh.host.cli.ranges import STREAMS, RangeError, in_range
from specmesh.host.cli.run import check_args, failed
from specmesh.host.cli.session import ONE_GENERATION, Mesh, say_on_stderr
from specmesh.host.stops import SIGNALS

INSTALL_HINT = "specmesh serve needs Starlette and uvicorn: pip install 'specmesh[serve]' (in a checkout: make setup)"
# what serve has in place of each of run's flags of one generation (ONE_GENERATION), which it refuses: the line had
# "a request's body carries it" for all four, though no body carries a stats file or --quiet
INSTEAD = {"prompt": "a request's body carries the prompt", "prompt_file": "a request's body carries the prompt",
           "stats_json": "each response carries its stats, in its specmesh field",
           "quiet": "serve prints no text or stats table (its log holds its start-up lines and faults)"}
# run's --no-color, refused too: it colours the text run and chat stream to a terminal, and serve streams none there
# (it was taken and did nothing, though serve's help listed it)
NO_COLOR = ("specmesh serve: error: --no-color colours nothing here: serve writes no text to a terminal (the live page "
            "marks the accepted drafts; a client gets plain text): drop it")


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve a mesh over HTTP: an OpenAI-compatible API and a live page at /")
    add_arguments(p, seed_help="the seed of every sampled request that gives none, which then gives the same text "
                  "each time (default: a fresh seed a request, as OpenAI's API; the header x-specmesh-seed names it)")
    hide(p, ONE_GENERATION + ("no_color",))  # refused: INSTEAD says what serve has in their place, NO_COLOR why
    p.add_argument("--host", default="127.0.0.1", help="address to listen on, or a name: each of its addresses "
                   "(default: %(default)s, this machine only; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=8080, help="TCP port (default: %(default)s; 0: any free one)")
    p.add_argument("--streams", type=int, default=16, metavar="N",
                   help="requests generated at once on host back-ends, batched (default: %(default)s); a mesh "
                        "with boards serves one at a time")
    p.set_defaults(func=main)


def main(a: argparse.Namespace) -> int:
    try:
        return serve(a)
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - every failure is one line for the user
        return failed("serve", e)


def serve(a: argparse.Namespace) -> int:
    try:
        import uvicorn

        from specmesh.host.cli.server import app
    except ImportError:
        print("specmesh serve: error: " + INSTALL_HINT, file=sys.stderr)
        return 2
    given = [f for f in ONE_GENERATION if getattr(a, f) not in (None, False)]
    if given:
        print("specmesh serve: error: --%s belongs to one generation: %s (drop it)"
              % (given[0].replace("_", "-"), INSTEAD[given[0]]), file=sys.stderr)
        return 2
    if a.no_color:
        print(NO_COLOR, file=sys.stderr)
        return 2
    fixed_seed = a.seed is not None  # --seed N: every sampled request without a seed runs under N
    a.seed = a.seed if fixed_seed else 0
    config = check_args(a)
    try:
        in_range("--streams", a.streams, *STREAMS)
    except RangeError as e:
        raise UsageError(str(e)) from None
    sockets = listen(a.host, a.port)
    try:
        say = say_on_stderr("serve")
        with Mesh.from_config(config, streams=a.streams, say=say, warn=say) as mesh, \
                ThreadPoolExecutor(max_workers=4 * a.streams + 16, thread_name_prefix="specmesh-request") as threads:
            served = app(mesh, threads, fixed_seed)
            http = uvicorn.Config(served, log_level="warning", lifespan="off", timeout_graceful_shutdown=STOP_GRACE_S)
            log = logging.getLogger("uvicorn.error")  # (after the Config set its logging up)
            log.addFilter(no_upgrade_advice)
            log.addFilter(not_http_advice(url(a.host, sockets[0].getsockname()[1])))
            log.addFilter(cut_at_stop)
            server = _server_class()(http, served.state.stop)
            print("specmesh serve: %s on %s (the live page; the API under /v1), %d stream%s at once; Ctrl-C stops it"
                  % (", ".join("%s %s" % kv for kv in mesh.names.items()), url(a.host, sockets[0].getsockname()[1]),
                     mesh.streams, "s" * (mesh.streams > 1)), file=sys.stderr, flush=True)
            try:
                server.run(sockets=sockets)  # (a Ctrl-C it caught is raised again as it returns)
            finally:
                # a generation still running waits on a board that does not answer (its request was answered:
                # server.py STUCK): its boards released now, it ends at once, not at its reply's deadline (up to 30 s)
                mesh.close(wait_s=RELEASE_S)
            if server.should_exit:  # Ctrl-C: uvicorn stopped gracefully, and asyncio's runner re-raises the signal
                raise KeyboardInterrupt  # only when its cancel beats the coroutine's return: status 130 every time
    finally:
        for sock in sockets:
            sock.close()
    return 0


def no_upgrade_advice(record: logging.LogRecord) -> bool:
    """uvicorn's log without its two warnings on a request asking to upgrade its connection (`curl --http2` asks for
    h2c): served as HTTP/1.1, as it should be, it still put two lines in the log a request, the second advising the
    operator to install a WebSocket library, which nothing here uses."""
    return not record.getMessage().startswith(("Unsupported upgrade request", "No supported WebSocket library"))


def not_http_advice(address: str) -> Callable[[logging.LogRecord], bool]:
    """A filter of uvicorn's log saying, of a request its HTTP parser refused ("Invalid HTTP request received.", its
    client sent a 400), what it most often is: a client given an https:// address, whose TLS greeting is no HTTP
    (its own error, openai's "Connection error." or curl's "wrong version number", says no more)."""

    def advise(record: logging.LogRecord) -> bool:
        if record.getMessage() == "Invalid HTTP request received.":
            record.msg, record.args = ("a client sent what is not a well-formed HTTP/1.1 request (it got a 400); if it "
                                       "was given an https:// address, give it %s"), (address,)
        return True

    return advise


def cut_at_stop(record: logging.LogRecord) -> bool:
    """uvicorn's line for the connections a stop cut once its grace (STOP_GRACE_S) ran out, an ERROR "Cancel 1 running
    task(s), timeout graceful shutdown exceeded" at a Ctrl-C that went as it should (a client still sending its
    request got its 503), said as what it is: a warning naming what such a connection was, in serve's words."""
    if record.msg == "Cancel %s running task(s), timeout graceful shutdown exceeded":
        n = record.args[0] if isinstance(record.args, tuple) and record.args else "some"
        record.msg, record.args = ("the stop cut %s connection(s) still open %d s after it: a client still sending its "
                                   "request (it got a 503) or reading its reply slowly"), (n, STOP_GRACE_S)
        record.levelno, record.levelname = logging.WARNING, "WARNING"
    return True


# seconds a stopping server waits for its connections to close (a generation ends after its round once told to
# stop; a client still sending its request, or one that reads slowly, is then cut)
STOP_GRACE_S = 3
# seconds the stopped server's generations have left to end before the mesh's boards are released under them
RELEASE_S = 1.0


def _server_class():
    import uvicorn
    from uvicorn.server import HANDLED_SIGNALS

    class Server(uvicorn.Server):
        """uvicorn's server, which on SIGTERM or Ctrl-C also tells the generations to end after their round (they
        run in threads uvicorn does not know of): without it the server waited for every queued generation. A
        SIGHUP (the terminal closed) stops it as gracefully: uvicorn takes only those two, so the Stopped the
        command's handler raises (host/stops.py) broke into whatever the event loop ran, a traceback a stream."""

        def __init__(self, config, stop):
            super().__init__(config)
            self.stop = stop

        def handle_exit(self, sig, frame) -> None:
            self.stop()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn raises the signals it caught again on its way out, once the command's handlers are back
            with super().capture_signals():
                main = threading.current_thread() is threading.main_thread()  # (only it may set handlers)
                more = [s for s in SIGNALS if main and s not in HANDLED_SIGNALS
                        and signal.getsignal(s) is not signal.SIG_IGN]
                before = {s: signal.signal(s, self.handle_exit) for s in more}
                try:
                    yield
                finally:
                    for s, handler in before.items():
                        signal.signal(s, handler)

    return Server


def url(host: str, port: int) -> str:
    """The live page's address on `host` and `port` (an IPv6 address in brackets, as URLs write it)."""
    return "http://%s:%d/" % ("[%s]" % unbracketed(host) if ":" in host else host, port)


def unbracketed(host: str) -> str:
    """`host` without the brackets a URL puts around an IPv6 address (the banner's [::1])."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def listen(host: str, port: int) -> list[socket.socket]:
    """The server's listening sockets, bound before any board boots: a port in use or out of range is one line
    then (UsageError), not uvicorn's traceback after the boards were flashed. A name with several addresses
    (localhost: ::1 and 127.0.0.1 on most machines) gets a socket on each, all on one port (with port 0 the
    one the kernel chose for the first, which the banner gives); an address this machine lacks among others
    (::1 where IPv6 is off) is left out."""
    if not 0 <= port <= 65535:
        raise UsageError("--port must be in 0..65535 (0: any free one), not %d" % port)
    if not host.strip():
        raise UsageError("--host needs an address or a name (127.0.0.1: this machine only, 0.0.0.0: every interface)")
    try:
        found = socket.getaddrinfo(unbracketed(host), port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        name, _, given = host.rpartition(":")
        if given.isdigit() and name and (":" not in name or name.startswith("[")):  # 127.0.0.1:80, [::1]:80
            raise UsageError("--host %s: give the address alone, and the port with --port %s" % (host, given)) from None
        raise UsageError("--host %s: not an address of this machine (%s)" % (host, e.strerror)) from None
    addresses = list(dict.fromkeys((family, sockaddr) for family, _, _, _, sockaddr in found))
    draws = 8  # port 0: another program may take the port the first address drew on a later one; draw again
    while True:
        try:
            return bind_each(addresses, port)
        except OSError as e:
            draws -= 1
            if port or e.errno != errno.EADDRINUSE or not draws:
                raise bind_error(host, port, e) from None


def bind_each(addresses: list[tuple[int, tuple]], port: int) -> list[socket.socket]:
    """A listening socket on each (family, sockaddr) of `addresses`, on `port` (0: the one the first drew); one
    this machine lacks is left out while another binds; the first other failure closes what was bound."""
    sockets: list[socket.socket] = []
    try:
        for i, (family, sockaddr) in enumerate(addresses):
            same = sockets[0].getsockname()[1] if sockets else port
            try:
                sockets.append(socket.create_server((sockaddr[0], same, *sockaddr[2:]), family=family))
            except OSError as e:
                lacked = e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)
                if not lacked or (i == len(addresses) - 1 and not sockets):
                    raise
        return sockets
    except BaseException:
        for sock in sockets:
            sock.close()
        raise


def bind_error(host: str, port: int, e: OSError) -> UsageError:
    """What a failed bind of `host` and `port` tells the user, and what to do."""
    if e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
        return UsageError("--host %s: not an address of this machine (127.0.0.1: this machine only, 0.0.0.0: "
                          "every interface)" % host)
    if e.errno == errno.EADDRINUSE:
        return UsageError("port %d on %s is in use: stop what listens there, or give another with --port N "
                          "(0: any free one)" % (port, host))
    if e.errno == errno.EACCES:
        return UsageError("port %d needs more privileges than this user has: give one from 1024 on with --port N"
                          % port)
    return UsageError("cannot listen on %s port %d: %s" % (host, port, e.strerror or e))

"""A `specmesh serve` app (host/cli/server.py) on uvicorn in a thread of the test process, on 127.0.0.1 only, the
`openai` client that drives it, and a verifier slow enough to be caught mid-generation."""

import contextlib
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import uvicorn

from specmesh.host import backends
from specmesh.host.cli.server import app


class Slow(backends.LocalVerifier):
    """The CPU verifier taking 50 ms a verdict, as a slow board would: every round of a generation 50 ms longer."""

    def verify(self, committed, draft):
        time.sleep(0.05)
        return super().verify(committed, draft)


@contextlib.contextmanager
def serving(mesh, threads: int = 64, fixed_seed: bool = False):
    """The base URL of a server on `mesh` (http://127.0.0.1:PORT), stopped on exit; `fixed_seed`: serve --seed's."""
    with served(mesh, threads, fixed_seed) as (url, _):
        yield url


@contextlib.contextmanager
def served(mesh, threads: int = 64, fixed_seed: bool = False):
    """serving's base URL and the app behind it (its `state.stop()` is what serve's Ctrl-C calls)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    with ThreadPoolExecutor(threads) as pool:
        served_app = app(mesh, pool, fixed_seed)
        server = uvicorn.Server(uvicorn.Config(served_app, log_level="warning"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the server did not start")
            threading.Event().wait(0.02)
        try:
            yield "http://127.0.0.1:%d" % port, served_app
        finally:
            server.should_exit = True
            thread.join(10)
            sock.close()


def client(url: str):
    """The official `openai` client (the dev extra) of the server at `url`, retrying nothing."""
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)

"""A `specmesh serve` app (host/cli/server.py) on uvicorn in a thread of the test process, on 127.0.0.1 only, and the
`openai` client that drives it."""

import contextlib
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import uvicorn

from specmesh.host.cli.server import app


@contextlib.contextmanager
def serving(mesh, threads: int = 64, fixed_seed: bool = False):
    """The base URL of a server on `mesh` (http://127.0.0.1:PORT), stopped on exit; `fixed_seed`: serve --seed's."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    with ThreadPoolExecutor(threads) as pool:
        server = uvicorn.Server(uvicorn.Config(app(mesh, pool, fixed_seed), log_level="warning"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the server did not start")
            threading.Event().wait(0.02)
        try:
            yield "http://127.0.0.1:%d" % port
        finally:
            server.should_exit = True
            thread.join(10)
            sock.close()


def client(url: str):
    """The official `openai` client (the dev extra) of the server at `url`, retrying nothing."""
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)

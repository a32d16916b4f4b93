"""A headless Chromium driven over the DevTools protocol (websocket-client): what tests/test_serve_page.py
needs of a browser, no more. Chromium is Debian's `chromium` (`.ci/run` installs it); no browser is
downloaded. Runs as root, so without the sandbox; an empty profile; nothing fetched but the page asked for."""

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import websocket

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--remote-debugging-port=0",
         "--window-size=1100,900")


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    """One tab: `call` sends a DevTools command and returns its result; `js` evaluates an expression."""

    def __init__(self, ws_url: str):
        self.ws = websocket.create_connection(ws_url, suppress_origin=True, timeout=30)
        self.ids = itertools.count(1)

    def call(self, method: str, **params) -> dict:
        n = next(self.ids)
        self.ws.send(json.dumps({"id": n, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == n:
                if "error" in reply:
                    raise RuntimeError("%s: %s" % (method, reply["error"]))
                return reply["result"]

    def js(self, expression: str):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError("%s: %s" % (expression, r["exceptionDetails"]))
        return r["result"].get("value")

    def wait(self, expression: str, timeout: float = 60.0):
        """The value of `expression` once it is truthy; TimeoutError after `timeout` seconds."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.1)
        raise TimeoutError("%s stayed false for %.0f s" % (expression, timeout))

    def open(self, url: str) -> None:
        self.call("Page.enable")
        self.call("Page.navigate", url=url)
        self.wait("document.readyState === 'complete' && location.href === %s" % json.dumps(url))

    def screenshot(self, path: Path) -> None:
        import base64

        height = self.js("document.documentElement.scrollHeight")
        self.call("Emulation.setDeviceMetricsOverride", width=1100, height=min(int(height), 2000), deviceScaleFactor=1,
                  mobile=False)
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))


@contextlib.contextmanager
def browser(binary: str):
    """A headless Chromium on an empty profile; yields a Page on about:blank, stops the browser on exit: its
    whole process group (its own session), since helpers left running write into the profile while it is
    removed (under load, rmtree then met a 'Default' directory that was not empty)."""
    with tempfile.TemporaryDirectory(prefix="specmesh-chromium-") as profile:
        proc = subprocess.Popen([binary, *FLAGS, "--user-data-dir=" + profile, "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            end = time.monotonic() + 30
            while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
                if proc.poll() is not None or time.monotonic() > end:
                    raise RuntimeError("chromium did not start (exit status %s)" % proc.poll())
                time.sleep(0.05)
            port = int(port_file.read_text().split()[0])
            targets = json.load(urllib.request.urlopen("http://127.0.0.1:%d/json/list" % port, timeout=10))
            page = Page(next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"])
            try:
                yield page
            finally:
                page.ws.close()
        finally:
            _stop_group(proc)


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the browser's process group, SIGKILL to what is left of it after 10 s (or at once to
    stragglers once the browser itself has exited); returns when no process of the group remains."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    end = time.monotonic() + 10
    while time.monotonic() < end:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)

"""The live page of `specmesh serve` (host/cli/page.html) in a real headless browser (Debian's `chromium`,
tests/cdp.py): a prompt typed into the box, the text streamed back equal to the mesh's greedy text, accepted
drafts marked, and each board's role, class and kernels shown; a server stopped mid-text, or gone, said so with what
to do. SPECMESH_PAGE_SHOT=FILE keeps a screenshot (docs/serve-page.png is one)."""

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="specmesh serve needs the `serve` extra: pip install -e '.[dev]'")
pytest.importorskip("websocket", reason="the browser is driven with websocket-client (dev extra)")

from specmesh import Mesh
from tests.cdp import browser, chromium
from tests.serve_util import Slow, served, serving

PROMPT = "The little dog"


def test_the_page_streams_a_typed_prompt_s_text_with_drafts_marked_and_the_boards(tmp_path):
    binary = chromium()
    if binary is None:
        pytest.skip("chromium is not installed: apt-get install chromium (.ci/run does)")
    with Mesh(gamma="4") as mesh:  # virtual drafter and verifier boards; gamma fixed: drafts every round
        want = mesh.generate(PROMPT, max_tokens=48).text
        with serving(mesh) as url, browser(binary) as page:
            page.open(url + "/")
            page.js("const t = document.getElementById('prompt'); t.focus(); t.select(); true")
            page.call("Input.insertText", text=PROMPT)  # typed, as a keyboard would
            page.js("document.getElementById('max_tokens').value = '48'; true")
            page.js("document.getElementById('go').click(); true")
            state = page.wait("['done', 'error'].includes(document.body.dataset.state) && document.body.dataset.state")
            assert state == "done", page.js("document.getElementById('summary').textContent")
            assert page.js("document.getElementById('text').textContent") == PROMPT + want
            drafts = page.js("[...document.querySelectorAll('#text .draft')].map(s => s.textContent).join('')")
            assert drafts and len(drafts) < len(want)  # some text came from accepted drafts, not all
            rows = page.js("[...document.querySelectorAll('#boards tbody tr')].map(r => [...r.cells].map("
                           "c => c.textContent))")
            assert {(r[1], r[2]) for r in rows} == {("verifier", "esp32s3"), ("drafter", "esp32")}
            assert all(r[3].startswith("native") or r[3].startswith("viper") for r in rows)
            assert page.js("document.querySelectorAll('#rounds tbody tr').length") > 1
            summary = page.js("document.getElementById('summary').textContent")
            assert re.search(r"; acceptance \d\.\d\d of \d+ drafts tested, ", summary), summary
            page.screenshot(tmp_path / "page.png")
    assert (tmp_path / "page.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("SPECMESH_PAGE_SHOT"):
        shutil.copy(tmp_path / "page.png", Path(os.environ["SPECMESH_PAGE_SHOT"]))


def test_the_page_says_it_waits_while_another_request_holds_the_mesh(models):
    """Generate pressed while another request held the mesh's one lane (boards serve one at a time) showed the prompt
    and, below it, the figures of the page's last generation, until the other request ended. The page now says it waits
    for the mesh, and streams once its turn comes."""
    import threading

    binary = chromium()
    if binary is None:
        pytest.skip("chromium is not installed: apt-get install chromium (.ci/run does)")
    with Mesh(drafter="cpu", verifier="cpu", models=models) as mesh, serving(mesh) as url, browser(binary) as page:
        page.open(url + "/")
        held, release = threading.Event(), threading.Event()

        def other_request() -> None:
            with mesh.lane():  # the one lane, as a request generating holds it
                held.set()
                release.wait(60)

        page.js("document.getElementById('go').click(); true")  # a first generation: its figures below the text
        assert page.wait("document.body.dataset.state === 'done'")
        other = threading.Thread(target=other_request)
        other.start()
        assert held.wait(60)
        page.js("document.getElementById('go').click(); true")
        summary = "document.getElementById('summary').textContent"
        assert page.js(summary).startswith("waiting for the mesh")
        release.set()
        other.join()
        assert page.wait("document.body.dataset.state === 'done'")
        assert "tokens / verification" in page.js(summary) and page.js("document.getElementById('text').textContent")


def test_a_text_cut_before_any_draft_was_tested_says_so_not_acceptance_dash(models, monkeypatch):
    """A generation the server's stop cut after its first round, a plain one (the drafter's first guess of gamma can be
    0), had no draft tested: its acceptance is null, and the page said "acceptance -". It now says no drafts were
    tested (the server gives the count behind its acceptance), beside the cut's own line."""
    from specmesh.host.cli import registry

    binary = chromium()
    if binary is None:
        pytest.skip("chromium is not installed: apt-get install chromium (.ci/run does)")
    monkeypatch.setitem(registry.VERIFIERS, "slow", Slow)
    with Mesh(drafter="cpu", verifier="slow", models=models, gamma="0") as mesh, served(mesh) as (url, app), \
            browser(binary) as page:  # (every round plain: none tested wherever the cut falls)
        page.open(url + "/")
        page.js("document.getElementById('max_tokens').value = '100'; document.getElementById('go').click(); true")
        page.wait("document.querySelectorAll('#rounds tbody tr').length > 0")
        app.state.stop()  # what serve's Ctrl-C calls: the generation ends after its round
        assert page.wait("document.body.dataset.state !== 'streaming' && document.body.dataset.state") == "cut"
        summary = page.js("document.getElementById('summary').textContent")
        assert summary.startswith("verifier cpu, drafter cpu; no drafts tested, 1.00 tokens / verification, ") and (
            "cut short: the server stopped" in summary), summary


def test_the_page_says_so_when_the_server_stops_mid_text_and_when_it_is_gone():
    """`specmesh serve` stopped (Ctrl-C) while the page streamed a text: the page showed the text cut after the round
    in progress with its figures, as a generation that had ended; Generate pressed again, with the server gone, said
    "Failed to fetch" and no more. It now says the text was cut short, and then that the server did not answer, each
    with what to do."""
    from specmesh.host.provision.cluster import _vboards_dir

    binary = chromium()
    if binary is None:
        pytest.skip("chromium is not installed: apt-get install chromium (.ci/run does)")
    env = {**os.environ, "SPECMESH_VBOARDS": str(_vboards_dir()) + "-page"}  # (test_serve's own serve has its boards)
    served = subprocess.Popen([sys.executable, "-m", "specmesh", "serve", "--port", "0"], stderr=subprocess.PIPE,
                              text=True, cwd=Path(__file__).resolve().parent.parent, env=env)
    try:
        banner = served.stderr.readline()
        while banner and " on http" not in banner:  # (any line before the banner: a board's)
            banner = served.stderr.readline()
        with browser(binary) as page:
            page.open(banner.split(" on ")[1].split()[0])
            page.js("document.getElementById('max_tokens').value = '250'; document.getElementById('go').click(); true")
            page.wait("document.querySelectorAll('#rounds tbody tr').length > 2")  # virtual boards: seconds to go
            served.send_signal(signal.SIGINT)
            ended = "document.body.dataset.state !== 'streaming' && document.body.dataset.state"
            assert page.wait(ended) == "cut"
            summary = page.js("document.getElementById('summary').textContent")
            assert "tokens / verification" in summary and summary.endswith(
                "cut short: the server stopped; start specmesh serve again, then press Generate"), summary
            assert served.wait(30) == 130
            page.js("document.getElementById('go').click(); true")
            assert page.wait(ended) == "error"
            assert page.js("document.getElementById('summary').textContent") == (
                "the server did not answer: start specmesh serve again if it stopped, then press Generate")
    finally:
        served.kill()
        served.wait()

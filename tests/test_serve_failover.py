"""A served mesh whose board dies mid-request (docs/faults.md): the fail-over keeps the text, and the dead board is
asked nothing more, not for its stats (a board gone silent answers nothing before its 30 s deadline) nor, a dead
drafter, by the requests after it."""

import pytest

pytest.importorskip("starlette", reason="specmesh serve needs the `serve` extra: pip install -e '.[dev]'")
pytest.importorskip("openai", reason="the tests drive the server with the `openai` package (dev extra)")

from specmesh import Mesh
from tests.serve_util import client, serving

PROMPT = "Once upon a time"


def test_a_drafter_board_that_died_is_asked_nothing_more(models, monkeypatch):
    """A served mesh's drafter board died: its fail-over kept the text, but every later request asked the dead board
    again (a BEGIN, a draft), and each request's stats asked it for its own; a board gone silent answers none of
    them before its 30 s deadline, so each request took a minute. Now the request it failed in says so once, does not
    ask it for stats, and the requests after it decode plainly without it."""
    warned: list[str] = []
    with Mesh(drafter="virtual", verifier="cpu", models=models, gamma="2", say=[].append,
              warn=warned.append) as mesh, serving(mesh) as url:
        c = client(url)
        want = c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=16).choices[0].text
        (lane,) = mesh._lanes
        asked: list[str] = []
        for name in ("begin", "draft", "start_draft", "stats"):
            real = getattr(lane.drafter, name)
            monkeypatch.setattr(lane.drafter, name, lambda *a, real=real, name=name: (asked.append(name), real(*a))[1])
        mesh._setup.cluster().boards["drafter"].stop()
        failed = c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=16)
        figures = failed.model_extra["specmesh"]
        assert failed.choices[0].text == want and len(figures["failovers"]) == 1 and figures["drafter"] is None
        (board,) = [b for b in figures["boards"] if b["role"] == "drafter"]
        assert "failed during the run" in board["error"] and "stats" not in asked, asked
        before = list(asked)
        after = c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=16)
        figures = after.model_extra["specmesh"]
        assert after.choices[0].text == want and figures["failovers"] == [] and figures["drafter"] is None
        assert asked == before and len(warned) == 1, (asked, warned)


def test_a_verifier_board_that_died_is_not_asked_for_its_stats(models, monkeypatch):
    """The request a verifier board died in asked the dead board for its stats once the cpu verifier had finished
    the text: a board gone silent held the reply back by its 30 s deadline past the fail-over."""
    with Mesh(drafter="cpu", verifier="virtual", models=models, gamma="2", say=[].append,
              warn=[].append) as mesh, serving(mesh) as url:
        c = client(url)
        want = c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=16).choices[0].text
        (lane,) = mesh._lanes
        asked: list[str] = []
        real = lane.verifier.stats
        monkeypatch.setattr(lane.verifier, "stats", lambda: (asked.append("stats"), real())[1])
        mesh._setup.cluster().boards["verifier"].stop()
        failed = c.completions.create(model="specmesh", prompt=PROMPT, max_tokens=16)
        figures = failed.model_extra["specmesh"]
        assert failed.choices[0].text == want and len(figures["failovers"]) == 1 and figures["verifier"] == "cpu"
        (board,) = [b for b in figures["boards"] if b["role"] == "verifier"]
        assert "failed during the run" in board["error"] and not asked, (board, asked)

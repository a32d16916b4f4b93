"""Stock firmware runs every role: `specmesh flash` gives a drafter board its class's drafter
(host/boardclasses.py), the 40-wide one from a classic ESP32's heap even without a ROMFS partition, says which,
where and what it costs (host/provision/drafters.py), and `run` prices the model the board reports; the
text is the target's either way."""

import argparse
import io
import json
from pathlib import Path


from specmesh.host.layout import DRAFTER_FILE
from specmesh.host import cli
from specmesh.host.cli.run import add_arguments, run
from specmesh.host.provision import drafters
from specmesh.host.provision.flash import flash
from specmesh.tools import cardtable

ROOT = Path(__file__).resolve().parent.parent
CARD = json.loads((ROOT / "models" / "card.json").read_text())  # read here, not through the code under test


def test_the_model_card_renders_its_data_file():
    """models/MODEL_CARD.md's Acceptance table is what models/card.json renders, and the variants table's rows
    of the two shipped drafters hold the same figures."""
    text = (ROOT / "models" / "MODEL_CARD.md").read_text()
    assert cardtable.rendered(text, CARD) == text, "run: python -m specmesh.tools.cardtable"
    rows = [line.replace("*", "") for line in text.splitlines() if line.startswith("|")]
    for d, mark in ((drafters.WIDE, "shipped: "), (drafters.HEAP, "shipped, 40 wide")):
        figures = "| %.3f | %.2f | %.3f |" % (d.alpha_greedy, d.per_verification, d.alpha_sampled)
        assert any(mark in row and figures in row for row in rows), d.file
    assert (ROOT / "models" / drafters.HEAP.file).stat().st_size == 56_716  # the 40-wide row's file size


def said(name: str) -> str:
    """What flash says of the shipped drafter `name`'s acceptance: the card's figures."""
    d = CARD["drafters"][name]
    return "alpha %.3f greedy (%.2f tokens per verification), %.3f at T = 1" % (
        d["greedy"]["alpha"], d["greedy"]["tokens_per_verification"], d["sampled"]["alpha"])


def test_flash_onto_a_stock_classic_esp32_installs_the_heap_drafter_which_runs(virtual_board, capsys):
    vb = virtual_board(romfs_bytes=0)  # a classic ESP32 on a stock MicroPython download: no ROMFS partition
    assert cli.main(["flash", "--port", vb.port, "--role", "drafter"]) == 0
    out = capsys.readouterr().out
    assert "drafter model drafter-esp32.spm (40 wide; weights and engine in the heap): %s" % said("drafter-esp32.spm") in out
    assert "drafter.spm would give %s" % said("drafter.spm") in out
    config = json.loads((vb.flash_dir / "specmesh.json").read_text())
    assert config["model"] == "models/drafter-esp32.spm" and not (vb.flash_dir / "models" / DRAFTER_FILE).exists()

    p = argparse.ArgumentParser()
    add_arguments(p)
    common = ["--verifier", "cpu", "--max-tokens", "40", "--quiet"]
    on_board = run(p.parse_args([*common, "--drafter", vb.port, "--gamma", "3", "--project", "esp32s3"]),
                   io.StringIO())
    plain = run(p.parse_args([*common, "--plain"]), io.StringIO())
    assert on_board["text"] == plain["text"] and on_board["drafter"] == vb.port
    assert on_board["drafter_model"] == "models/drafter-esp32.spm" and on_board["alpha"] > 0.5
    assert on_board["boards"][0]["role"] == "drafter" and on_board["boards"][0]["heap_free"] > 0


def test_an_s3_gets_the_wide_drafter_in_psram(virtual_board):
    vb = virtual_board("esp32s3")
    report = flash(vb.port, "drafter", progress=False, reset=False)
    assert report.model == DRAFTER_FILE and report.note == (
        "drafter model drafter.spm (64 wide; weights in PSRAM): %s" % said("drafter.spm"))


def test_cardtable_on_a_card_not_laid_out_as_one_is_one_line_and_leaves_the_markdown(tmp_path, monkeypatch, capsys):
    markdown = tmp_path / "MODEL_CARD.md"
    markdown.write_text((ROOT / "models" / "MODEL_CARD.md").read_text())
    before = markdown.read_text()
    card = tmp_path / "card.json"
    monkeypatch.setattr(cardtable, "CARD", card)
    monkeypatch.setattr(cardtable, "MARKDOWN", markdown)
    for text in ('[]', '{"protocol": {"gamma": "x"}, "drafters": {}}', '{"protocol": {}}',
                 '{"protocol": {"gamma": 1}, "drafters": {"d": {"width": 3, "greedy": {"alpha": "x"}}}}'):
        card.write_text(text)
        assert cardtable.main([]) == 1
        err = capsys.readouterr().err
        assert err.startswith("cardtable: %s is not laid out as a model card" % card) and err.count("\n") == 1, err
    card.write_text("{garbage")
    assert cardtable.main([]) == 1
    err = capsys.readouterr().err
    assert err.startswith("cardtable: %s is not JSON" % card) and err.count("\n") == 1, err
    assert markdown.read_text() == before


def test_cardtable_help_or_a_stray_argument_writes_nothing():
    import subprocess
    import sys

    before = (ROOT / "models" / "MODEL_CARD.md").stat().st_mtime_ns
    for args, status in ((["--help"], 0), (["--out", "x.md"], 2)):
        p = subprocess.run([sys.executable, "-m", "specmesh.tools.cardtable", *args], capture_output=True, text=True)
        assert p.returncode == status and "usage:" in p.stdout + p.stderr and "wrote" not in p.stdout
    assert (ROOT / "models" / "MODEL_CARD.md").stat().st_mtime_ns == before

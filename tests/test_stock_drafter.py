"""Stock firmware runs every role: `specmesh flash` gives a drafter board the shipped drafter its firmware
runs (host/provision/drafters.py), says which and what it costs, and `run` prices the model the board
reports; the text is the target's either way."""

import io
import json
from pathlib import Path

import pytest

from specmesh.host import cli
from specmesh.host.cli.run import add_arguments, run
from specmesh.host.provision import drafters
from specmesh.host.provision.flash import flash

ROOT = Path(__file__).resolve().parent.parent


def test_each_board_gets_the_drafter_its_firmware_runs():
    assert drafters.choose(psram=True, romfs_fits=False)[0] is drafters.WIDE
    assert drafters.choose(psram=False, romfs_fits=True)[0] is drafters.WIDE
    heap, where = drafters.choose(psram=False, romfs_fits=False)  # a stock classic ESP32
    assert heap is drafters.HEAP and "no ROMFS partition" in where
    assert drafters.choose(psram=False, romfs_fits=False, no_romfs=True)[1].endswith("--no-romfs")
    assert drafters.HEAP.path().stat().st_size < 100_000 < drafters.WIDE.path().stat().st_size


def test_the_acceptance_said_at_flashing_is_the_model_cards():
    """The variants table's rows of the two shipped drafters (models/MODEL_CARD.md) hold the figures flash says."""
    rows = [line.replace("*", "") for line in (ROOT / "models" / "MODEL_CARD.md").read_text().splitlines()
            if line.startswith("|")]
    for d, mark in ((drafters.WIDE, "shipped: "), (drafters.HEAP, "`drafter-heap.spm`")):
        figures = "| %.3f | %.2f | %.3f |" % (d.alpha_greedy, d.per_verification, d.alpha_sampled)
        assert any(mark in row and figures in row for row in rows), d.file


def test_flash_onto_a_stock_classic_esp32_installs_the_heap_drafter_which_runs(virtual_board, capsys):
    vb = virtual_board(romfs_bytes=0)  # a classic ESP32 on a stock MicroPython download: no ROMFS partition
    assert cli.main(["flash", "--port", vb.port, "--role", "drafter"]) == 0
    out = capsys.readouterr().out
    assert "drafter model drafter-heap.spm (40 wide; weights and engine in the heap: this board has no ROMFS" in out
    assert "alpha 0.788 greedy" in out and "drafter.spm would give alpha 0.841 greedy" in out
    config = json.loads((vb.flash_dir / "specmesh.json").read_text())
    assert config["model"] == "models/drafter-heap.spm" and not (vb.flash_dir / "models" / "drafter.spm").exists()

    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    common = ["--verifier", "cpu", "--max-tokens", "40", "--quiet"]
    on_board = run(p.parse_args([*common, "--drafter", vb.port, "--gamma", "3", "--project", "esp32s3"]),
                   io.StringIO())
    plain = run(p.parse_args([*common, "--plain"]), io.StringIO())
    assert on_board["text"] == plain["text"] and on_board["drafter"] == vb.port
    assert on_board["drafter_model"] == "models/drafter-heap.spm" and on_board["alpha"] > 0.5
    assert on_board["boards"][0]["role"] == "drafter" and on_board["boards"][0]["heap_free"] > 0


@pytest.mark.parametrize("board, where", [("esp32", "read in place from the ROMFS partition"),
                                          ("esp32s3", "weights in PSRAM")])
def test_a_board_with_romfs_or_psram_gets_the_wide_drafter(virtual_board, board, where):
    vb = virtual_board(board)
    report = flash(vb.port, "drafter", progress=False, reset=False)
    assert report.model == "drafter.spm" and where in report.note and "drafter-heap.spm" not in report.note

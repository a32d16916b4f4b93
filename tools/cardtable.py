"""The model card's acceptance figures, rendered: models/card.json (the one home of the shipped drafters'
alpha and tokens per verification, which `specmesh flash` and gamma auto read through
host/provision/drafters.py) -> the Acceptance table of models/MODEL_CARD.md, between its two markers.

After a drafter is retrained and measured (tools/modelcard.py), edit models/card.json and run

    python -m specmesh.tools.cardtable

tests/test_stock_drafter.py fails while the markdown differs from what this renders.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specmesh.tools import run_tool, said
from specmesh.host import atomic
from specmesh.host.layout import MODELS

CARD = MODELS / "card.json"
MARKDOWN = MODELS / "MODEL_CARD.md"
BEGIN = "<!-- rendered from models/card.json by `python -m specmesh.tools.cardtable`: edit that file -->"
END = "<!-- end of the rendered table -->"
MODES = (("greedy", 0), ("sampled", 1))  # card.json's key, the temperature it was measured at


def _cell(figures: dict, key: str, fmt: str) -> str:
    return fmt % figures[key] if key in figures else "-"


def table(card: dict) -> str:
    """The Acceptance table's markdown for `card` (models/card.json's layout)."""
    gamma = card["protocol"]["gamma"]
    lines = ["| drafter | temperature | alpha | tokens per verification | alpha at draft position %s |"
             % " / ".join(str(i + 1) for i in range(gamma)), "| --- | --- | --- | --- | --- |"]
    for name, d in card["drafters"].items():
        for key, t in MODES:
            f = d[key]
            by_pos = " / ".join("%.3f" % a for a in f["alpha_by_position"]) if "alpha_by_position" in f else "-"
            lines.append("| `%s` (%d wide) | %d | %s | %s | %s |" % (
                name, d["width"], t, _cell(f, "alpha", "%.3f"), _cell(f, "tokens_per_verification", "%.2f"), by_pos))
    return "\n".join(lines)


def rendered(markdown: str, card: dict) -> str:
    """`markdown` with the text between its markers replaced by `table(card)`; ValueError without markers."""
    head, sep, rest = markdown.partition(BEGIN + "\n")
    _old, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError("%s lacks the markers of the rendered table" % MARKDOWN.name)
    return head + sep + table(card) + "\n" + sep2 + tail


def main(argv: list[str] | None = None) -> int:
    # no options: `--help` or a stray argument must not rewrite the card
    argparse.ArgumentParser(prog="python -m specmesh.tools.cardtable", description=__doc__.split("\n\n")[0]
                            ).parse_args(argv)
    try:
        card = json.loads(CARD.read_text())
        text = rendered(MARKDOWN.read_text(), card)
    except json.JSONDecodeError as e:
        print("cardtable: %s is not JSON (%s): fix it, or git checkout it" % (CARD, e), file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print("cardtable: %s" % said(e), file=sys.stderr)
        return 1
    except (KeyError, TypeError, IndexError) as e:  # JSON, but not laid out as the card is
        print("cardtable: %s is not laid out as a model card (%s: %s)" % (CARD, type(e).__name__, e), file=sys.stderr)
        return 1
    try:
        atomic.write_text(Path(MARKDOWN), text)
    except OSError as e:
        print("cardtable: cannot write %s: %s" % (MARKDOWN, e.strerror), file=sys.stderr)
        return 1
    print("wrote %s" % MARKDOWN)
    return 0


if __name__ == "__main__":
    run_tool("cardtable", main)

"""Where specmesh's files are, one home each: the root the data sits under (the repository in a checkout;
the installed copy's folder in site-packages), the shipped models folder and the file names inside a models
folder (which role reads which file), and the `micropython` binary the virtual boards and the host's engine
process run."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"
MODEL_FILES = {"drafter": "drafter.spm", "verifier": "target.spm", "stage": "target.spm"}  # role -> file
DRAFTER_FILE = MODEL_FILES["drafter"]
TARGET_FILE = MODEL_FILES["verifier"]
# the host CPU back-end's drafter (`--drafter cpu`): four of the target's layers, distilled, which the host has the
# memory for and no board does (models/MODEL_CARD.md)
HOST_DRAFTER_FILE = "drafter-host.spm"
TOKENIZER_FILE = "tokenizer.bin"  # llama2.c's tokenizer format


def model_path(models: Path, role: str) -> Path:
    """The model file `role` ("drafter", "verifier" or "stage") reads in the folder `models`."""
    return Path(models) / MODEL_FILES[role]


def models_folder_problem(models: Path) -> str | None:
    """Why `--models` `models` is no models folder (missing, or a file), as a line that names the shipped one; None
    where it is a folder (a typo to fix, not models to train)."""
    if Path(models).is_dir():
        return None
    return "--models %s: %s (the shipped models are in %s)" % (
        models, "not a folder: give the folder that holds the model files" if Path(models).exists() else
        "no such folder", MODELS)


def host_drafter_model(models: Path) -> Path:
    """The drafter the host CPU back-end runs from the folder `models`: HOST_DRAFTER_FILE, or drafter.spm in a
    folder without it (one made before it shipped, or of one drafter). Something else under its name (a folder) is
    its, so that it is refused, not passed over for drafter.spm unsaid."""
    own = Path(models) / HOST_DRAFTER_FILE
    return own if own.exists() else Path(models) / DRAFTER_FILE


def ngram_table_name(model_name: str) -> str:
    """The file name of a model's n-gram table (shared/ngram.py): its model's, ending .ngt (a drafter's, or the
    target's whose chains the host copies: tools/ngram.py)."""
    return str(Path(model_name).with_suffix(".ngt"))


def ngram_table(model: Path) -> Path | None:
    """The n-gram table beside the model file `model`, or None where it has none. Something else under its name (a
    folder) is its, so that it is refused (host/backends load_ngram_table), not passed over unsaid."""
    table = Path(model).with_name(ngram_table_name(Path(model).name))
    return table if table.exists() else None


def run_inputs(models: Path) -> list[Path]:
    """The files of the folder `models` that a run reads: its models, their n-gram tables and the tokenizer (what an
    output flag must not name: `--stats-json`, bench's `--out`)."""
    return [f for f in Path(models).iterdir() if f.suffix in (".spm", ".ngt") or f.name == TOKENIZER_FILE]


def micropython_binary() -> str | None:
    """The `micropython` binary `make setup` builds beside this interpreter (else one on PATH), or None."""
    exe = Path(sys.executable).with_name("micropython")
    return str(exe) if exe.exists() else shutil.which("micropython")

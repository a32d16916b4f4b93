"""Build the training corpus (corpus/train.txt, corpus/test.txt) from Debian packages, reproducibly.

Sources are fetched with `apt-get download` (no install, no root needed once `apt-get update` ran),
unpacked with `dpkg-deb -x`, cut into documents, lightly normalised (typographic punctuation to
ASCII), and split into train/test by a CRC-32 of each document (about 2% held out), so the split
never depends on order or on the machine. corpus/SOURCES.txt records package versions and hashes.

    python -m tools.corpus [--out corpus]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import re
import subprocess
import sys
import zlib
from pathlib import Path

# package -> licence note (copied into the model card)
PACKAGES = {
    "fortunes-min": "BSD fortune-mod data (Debian main)",
    "fortunes": "BSD fortune-mod data (Debian main)",
    "dict-devil": "public domain (The Devil's Dictionary, A. Bierce, 1911)",
    "dict-jargon": "public domain (The Jargon File 4.4.7)",
    "python3.11-doc": "PSF License 2.0 (Python 3.11 documentation sources)",
}
TEST_PER_MILLE = 20  # documents whose crc32 % 1000 < this go to the held-out split
DOC_SEP = "\n\n"
_PUNCT = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-",
                        "\u2014": "--", "\u2026": "...", "\u00a0": " ", "\t": "    "})


class CorpusError(Exception):
    """The corpus cannot be built; the message says why."""


def fetch(pkg: str, cache: Path) -> Path:
    """Download (once) and unpack a Debian package; returns the unpack directory."""
    cache.mkdir(parents=True, exist_ok=True)
    debs = sorted(cache.glob(pkg + "_*.deb"))
    if not debs:
        r = subprocess.run(["apt-get", "download", pkg], cwd=cache, capture_output=True, text=True)
        debs = sorted(cache.glob(pkg + "_*.deb"))
        if r.returncode or not debs:
            raise CorpusError("cannot download Debian package %s (run `apt-get update` first): %s"
                              % (pkg, r.stderr.strip().splitlines()[-1:] or r.returncode))
    root = cache / pkg
    if not root.exists():
        subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(root)], check=True)
    return root


def fortunes(root: Path) -> list[str]:
    """Each fortune cookie of the plain-text (non-.u8, non-.dat) files, ascii-art excluded."""
    docs = []
    for f in sorted((root / "usr/share/games/fortunes").iterdir()):
        if f.suffix or f.name == "ascii-art" or f.is_symlink():
            continue
        docs += [d.strip("\n") for d in f.read_text("latin-1").split("\n%\n")]
    return docs


_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _b64num(s: str) -> int:
    n = 0
    for c in s:
        n = n * 64 + _B64.index(c)
    return n


def dictd(root: Path) -> list[str]:
    """Each entry of a dictd database (.index + .dict.dz), via its index."""
    docs = []
    for idx in sorted((root / "usr/share/dictd").glob("*.index")):
        data = gzip.decompress(idx.with_suffix(".dict.dz").read_bytes())
        for line in idx.read_text("utf-8").splitlines():
            parts = line.split("\t")
            if len(parts) < 3 or parts[0].startswith("00-database"):
                continue
            off, n = _b64num(parts[1]), _b64num(parts[2])
            docs.append(data[off:off + n].decode("utf-8", "replace").strip("\n"))
    return docs


def rst_sources(root: Path) -> list[str]:
    """Each reStructuredText source of the Python documentation, one document per file."""
    base = next(root.glob("usr/share/doc/python3*/html/_sources"))
    return [f.read_text("utf-8") for f in sorted(base.rglob("*.rst.txt"))]


READERS = {"fortunes-min": fortunes, "fortunes": fortunes, "dict-devil": dictd, "dict-jargon": dictd,
           "python3.11-doc": rst_sources}


def normalise(doc: str) -> str:
    doc = doc.translate(_PUNCT)
    doc = re.sub(r"[ ]+\n", "\n", doc)
    return re.sub(r"\n{3,}", "\n\n", doc).strip()


def build(out: Path) -> dict[str, int]:
    """Write out/train.txt, out/test.txt, out/SOURCES.txt; returns byte counts."""
    cache = out / "debs"
    train, test, manifest = [], [], []
    for pkg, licence in PACKAGES.items():
        root = fetch(pkg, cache)
        deb = sorted(cache.glob(pkg + "_*.deb"))[-1]
        docs = [normalise(d) for d in READERS[pkg](root)]
        docs = [d for d in docs if len(d) > 1]
        nbytes = sum(len(d.encode()) for d in docs)
        manifest.append("%s\t%s\t%d docs\t%d bytes\t%s\tsha256:%s"
                        % (pkg, deb.name, len(docs), nbytes, licence, hashlib.sha256(deb.read_bytes()).hexdigest()))
        for d in docs:
            (test if zlib.crc32(d.encode()) % 1000 < TEST_PER_MILLE else train).append(d)
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.txt").write_text(DOC_SEP.join(train) + "\n", "utf-8")
    (out / "test.txt").write_text(DOC_SEP.join(test) + "\n", "utf-8")
    (out / "SOURCES.txt").write_text("\n".join(manifest) + "\n", "utf-8")
    return {"train_bytes": (out / "train.txt").stat().st_size, "test_bytes": (out / "test.txt").stat().st_size}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("corpus"))
    a = ap.parse_args(argv)
    try:
        sizes = build(a.out)
    except (CorpusError, OSError, subprocess.CalledProcessError) as e:
        print("corpus: %s" % e, file=sys.stderr)
        return 1
    print("corpus: train %(train_bytes)d bytes, test %(test_bytes)d bytes" % sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())

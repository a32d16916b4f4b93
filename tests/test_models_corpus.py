"""Corpus readers on small files laid out like the Debian packages (no download)."""

import gzip

from tools import corpus


def b64(n):
    s = ""
    while True:
        s = corpus._B64[n % 64] + s
        n //= 64
        if not n:
            return s


def test_fortunes_split_on_percent_lines(tmp_path):
    d = tmp_path / "usr/share/games/fortunes"
    d.mkdir(parents=True)
    (d / "wisdom").write_text("Be kind.\n%\nTwo\nlines.\n%\n", "latin-1")
    (d / "wisdom.dat").write_bytes(b"\0\1binary")
    (d / "wisdom.u8").write_text("Be kind.\n%\n")
    (d / "ascii-art").write_text("|_|\n%\n")
    assert [x for x in corpus.fortunes(tmp_path) if x] == ["Be kind.", "Two\nlines."]


def test_dictd_entries_come_from_the_index(tmp_path):
    d = tmp_path / "usr/share/dictd"
    d.mkdir(parents=True)
    entries = ["00-database-info\n  skip me", "Apple\n   A fruit.", "Bug\n   An insect; or a defect."]
    body = "\n".join(entries)
    idx = []
    for e, word in zip(entries, ("00-database-info", "Apple", "Bug")):
        off = len(body[:body.index(e)].encode())
        idx.append("%s\t%s\t%s" % (word, b64(off), b64(len(e.encode()))))
    (d / "x.dict.dz").write_bytes(gzip.compress(body.encode()))
    (d / "x.index").write_text("\n".join(idx) + "\n")
    assert corpus.dictd(tmp_path) == entries[1:]


def test_normalise_makes_typography_ascii():
    assert corpus.normalise("\u201cHi\u201d \u2014 it\u2019s\t1  \n\n\n\nend") == '"Hi" -- it\'s    1\n\nend'

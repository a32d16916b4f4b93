"""Helpers for the decode-loop tests: a small random target that repeats itself, and a drafter scripted to
agree with it or not, position by position."""

from specmesh.host.backends import Draft, LocalDrafter
from specmesh.host.layout import TARGET_FILE
from specmesh.tools.testmodels import random_model

VOCAB = 64


def random_target(folder) -> str:
    """The path of a random 2-layer target (vocab VOCAB, 128 positions) written into `folder`."""
    path = folder / TARGET_FILE
    random_model(path, dim=32, n_layers=2, hidden=64, vocab=VOCAB, max_seq=128, seed=11)
    return str(path)


class Scripted(LocalDrafter):
    """The target as its own drafter (it always agrees), except at stream positions where `agrees(pos)` is
    False: there its first draft is another token."""

    def __init__(self, path: str, agrees):
        super().__init__(path)
        self.agrees = agrees

    def draft(self, committed, gamma: int) -> Draft:
        d = super().draft(committed, gamma)
        if d.tokens and not self.agrees(d.pos0):
            wrong = (d.tokens[0] + 1) % VOCAB
            d.tokens[0], d.q[0] = wrong, ([wrong], d.q[0][1])
        return d

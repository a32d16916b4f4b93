"""Pipeline stages run one after the other, with the Engine interface mp_engine_runner's ops use.

Each stage (firmware/stage_engine.py, layers a..b-1) gets the previous stage's output rows as its input,
as the host relays them between stage boards (docs/pipeline.md).
"""

from stage_engine import StageEngine


class Chain:
    """Stage engines run one after the other, with an Engine's interface (what the ops use)."""

    def __init__(self, stages, *args):
        self.stages = [StageEngine(args[0], tuple(ab), *args[1:]) for ab in stages]
        last = self.stages[-1]
        self.vocab, self.viper, self.kernels, self.logits = last.vocab, last.viper, last.kernels, last.logits
        self.heap_bytes = [s.heap_bytes for s in self.stages]
        self.exp_table = last.exp_table
        self.cls_held = last.cls_held

    def hold(self, reserve):
        """The last stage holds the classifier in the heap when `reserve` bytes stay free."""
        self.cls_held = self.stages[-1].hold_classifier(reserve)

    @property
    def length(self):
        return self.stages[-1].length

    def forward(self, tokens, pos):
        k = len(tokens)
        prev = self.stages[0]
        lg = prev.forward(tokens, pos)
        for s in self.stages[1:]:
            s.x[:] = prev.x
            lg = s.forward(None, pos, k)
            prev = s
        return lg

    def argmax(self, j=0):
        return self.stages[-1].argmax(j)

    def rollback(self, n):
        for s in self.stages:
            s.rollback(n)

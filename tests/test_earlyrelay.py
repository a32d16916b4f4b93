"""host/backends/earlyrelay.py: the next round's first position relayed through a pipeline's stages but the last
while the host waits on the drafter; stopped where it is by the round that takes it; a stage's failure on its
thread raised in the round's. Stages are stand-ins whose replies the test releases one at a time."""

import threading
from types import SimpleNamespace

import pytest

from specmesh.host.backends import BackendError
from specmesh.host.backends.earlyrelay import EarlyRelay
from specmesh.shared import messages as m


class Stage:
    """A stage whose STAGE replies wait for `release` (its output row: its index, repeated)."""

    def __init__(self, i: int):
        self.i = i
        self.requests: list[bytes] = []
        self.release = threading.Event()
        self.fail: Exception | None = None
        self.proxy = SimpleNamespace(start=self._start)

    def _start(self, mtype, body):
        assert mtype == m.STAGE
        self.requests.append(body)
        return body

    def _result(self, call):
        assert self.release.wait(5)
        if self.fail is not None:
            raise self.fail
        pos = m.unpack_stage(call)[0]
        return SimpleNamespace(payload=m.pack_stage_reply(pos, 1, m.STAGE_ACT, bytes([self.i]) * 8))


def body(s, data):
    return m.pack_stage(17, 1, m.STAGE_ACT if s else 0, [], data)


def test_it_relays_through_every_stage_but_the_last():
    stages = [Stage(i) for i in range(5)]
    for s in stages:
        s.release.set()
    relay = EarlyRelay(stages, 17, 42, body)
    reply = relay.result()
    assert relay.stage == 3 and relay.messages == 4 and relay.waiter.event.is_set()
    assert m.unpack_stage_reply(reply.payload)[3].tobytes() == bytes([3]) * 8
    assert m.unpack_stage(stages[0].requests[0])[4].tobytes() == (42).to_bytes(2, "little")
    for i in (1, 2, 3):  # each stage gets the previous one's output row
        assert m.unpack_stage(stages[i].requests[0])[4].tobytes() == bytes([i - 1]) * 8
    assert stages[4].requests == []  # the last stage needs the round's drafts


def test_a_round_stops_it_where_it_is():
    stages = [Stage(i) for i in range(5)]
    stages[0].release.set()
    relay = EarlyRelay(stages, 17, 42, body)
    while relay.stage < 1:  # stage 0 answered, stage 1 is computing it
        threading.Event().wait(0.001)
    assert relay.stop() == 1 and not relay.waiter.event.is_set()
    stages[1].release.set()
    assert m.unpack_stage_reply(relay.result().payload)[3].tobytes() == bytes([1]) * 8
    assert relay.stage == 1 and stages[2].requests == []


def test_a_stage_failure_is_raised_by_result():
    stages = [Stage(i) for i in range(5)]
    for s in stages:
        s.release.set()
    stages[2].fail = BackendError("stage2: no answer")
    relay = EarlyRelay(stages, 17, 42, body)
    with pytest.raises(BackendError, match="no answer"):
        relay.result()
    assert relay.stage == 2 and stages[3].requests == []

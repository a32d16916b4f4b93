"""The next round's first position, relayed through a pipeline's stages while the drafter drafts.

At a verdict the host knows the token it emitted, which is the next round's first position, before it asks
the drafter for the next block. `EarlyRelay` sends it to the first stage at once and, on a thread of its own
(the host is waiting on the drafter meanwhile), relays it on through every stage but the last, which needs
the round's drafts to judge it. The next round (host/backends/pipeline.py) stops it after the stage it is at
and takes that stage's reply as any other: the object stands in for a proxy call there (`result`,
`waiter.event`, `sent`), and a stage's failure on the thread is raised by `result`, in the round's thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace

from specmesh.shared import messages as m

Body = Callable[[int, bytes], bytes]  # (stage, its input) -> the STAGE request's payload


class EarlyRelay:
    """Position `pos` (token `token`) on its way through stages[0 .. len - 2]; `body(s, data)` builds the
    request to stage s. `stage`: the stage computing it (or whose reply it holds once stopped)."""

    def __init__(self, stages: Sequence, pos: int, token: int, body: Body):
        self.stages, self.pos, self.token = list(stages), pos, token
        self.stage = 0
        self.messages = 1  # requests sent: stages 0 .. stage
        self.waiter = SimpleNamespace(event=threading.Event())  # set once it stopped: the reply is held
        self.sent = time.perf_counter()
        self._body = body
        self._lock = threading.Lock()
        self._stop = False
        self._reply = None
        self._error: BaseException | None = None
        self._call = stages[0].proxy.start(m.STAGE, body(0, token.to_bytes(2, "little")))
        self._thread = threading.Thread(target=self._run, name="early-relay", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = len(self.stages) - 1
        try:
            while True:
                reply = self.stages[self.stage]._result(self._call)
                with self._lock:
                    if self._stop or self.stage + 1 >= last:
                        self._reply = reply
                        return
                    data = bytes(m.unpack_stage_reply(reply.payload)[3])
                    self.stage += 1
                    self._call = self.stages[self.stage].proxy.start(m.STAGE, self._body(self.stage, data))
                    self.messages += 1
        except Exception as e:  # noqa: BLE001 - a stage's failure, raised again by result() in the round's thread
            self._error = e
        finally:
            self.waiter.event.set()

    def stop(self) -> int:
        """Relay no further than the stage computing it now; returns that stage."""
        with self._lock:
            self._stop = True
            return self.stage

    def result(self):
        """The reply of the stage it stopped at (waiting for it), or that stage's failure."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._reply

"""Helpers for the emulator tests: talk to a virtual board's pty and run mpremote against it."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from specmesh.host.bus import ports

MPREMOTE = str(Path(sys.executable).with_name("mpremote"))


def follow_flash_commands(err, want, run, capsys):
    """The `specmesh flash` commands a failed run's line `err` names are `want`, in order, and make the boards right:
    each runs, then the run (`run`: its argv) goes through."""
    from specmesh.host import cli

    commands = re.findall(r"`(specmesh flash [^`]*)`", err)
    assert commands == want, err
    for command in commands:
        assert cli.main(command.split()[1:]) == 0
    capsys.readouterr()
    assert cli.main(run) == 0, capsys.readouterr().err


def mpremote(port, *args, timeout=30):
    """Run the real mpremote CLI against `port`; returns the CompletedProcess."""
    return subprocess.run([MPREMOTE, "connect", port, *args], capture_output=True, text=True, timeout=timeout)


def read_until(ser, marker, timeout=10.0):
    """Bytes from `ser` up to and including `marker`; AssertionError with what came if it does not."""
    data = b""
    end = time.monotonic() + timeout
    while marker not in data:
        if time.monotonic() > end:
            raise AssertionError("no %r within %.0f s; got %r" % (marker, timeout, data[-400:]))
        data += ser.read(ser.in_waiting or 1)
    return data


def open_port(port, busy_s: float = 5.0):
    """The board's pty, exclusively; a refused lock is tried again for `busy_s` seconds (host/bus/ports.py
    LOCK_RETRY_S: a lock lent to a forked child)."""
    return ports.open_exclusive(port, wait_s=busy_s, baudrate=115200, timeout=0.05)


class StopsAtTheEnd:
    """A mesh's virtual board (`name`, the cluster's: "drafter", "verifier", "stage1"; default `role`'s) whose VM is
    stopped (SIGSTOP: a board hung, a USB hub's hiccup) as a generation's stats begin, its text out, when `stop_at_end`
    is set; `resume()` continues it. `board`: its back-end, the lane's `role` (a pipeline's: stage `name`'s). `sent`:
    the message types its proxy sent, a "|" where the test marks a generation's start (`mark`); `stats`: each
    generation's."""

    def __init__(self, mesh, role: str, monkeypatch, name: str | None = None):
        from specmesh.host.cli import session

        backend = getattr(mesh._lanes[0], role)
        self.board = backend.stages[int(name[len("stage"):])] if name else backend
        self.pid = mesh._setup.cluster().boards[name or role].pid
        self.sent: list = []
        self.stats: list[dict] = []
        self.stop_at_end = False
        build_stats = session.build_stats

        def at_the_end(*args):
            if self.stop_at_end:
                os.kill(self.pid, signal.SIGSTOP)
            self.stats.append(build_stats(*args))
            return self.stats[-1]

        monkeypatch.setattr(session, "build_stats", at_the_end)
        start = self.board.proxy.start
        monkeypatch.setattr(self.board.proxy, "start", lambda *a: (self.sent.append(a[0]), start(*a))[1])

    def mark(self) -> None:
        self.sent.append("|")

    def each(self) -> list[list[int]]:
        """`sent` in each generation since the first mark."""
        return [[int(t) for t in part.split()] for part in " ".join(map(str, self.sent)).split("|")[1:]]

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)


def gated_vm(folder: Path, then: str = 'exec %s "$@"') -> tuple[Path, Path, Path]:
    """A stand-in for the micropython binary, in `folder`: each board VM it starts (a boot, not a heap measure) waits,
    before it runs `then` (%s: the micropython binary), until the test creates open/N, N its number from 0: a VM start
    as slow as the test makes it, with no clock in it. Returns (the stand-in, started, open): started/N appears as VM
    N starts waiting."""
    from specmesh.host.layout import micropython_binary

    started, gate = folder / "started", folder / "open"
    started.mkdir()
    gate.mkdir()
    vm = folder / "gated-micropython"
    vm.write_text('#!/bin/sh\ncase "$VBOARD_MODE" in friendly|raw)\n n=$(ls %s | wc -l); touch %s/$n\n'
                  ' while [ ! -e %s/$n ]; do sleep 0.02; done;;\nesac\n%s\n'
                  % (started, started, gate, then % micropython_binary()))
    vm.chmod(0o755)
    return vm, started, gate


def appears(path: Path) -> None:
    """Wait for `path` to exist (30 s at most: AssertionError)."""
    for _ in range(3000):
        if path.exists():
            return
        time.sleep(0.01)
    raise AssertionError(f"{path} never appeared")

"""specmesh, installed: the one import name. Its subpackages are the repository's folders, linked from here
(src/specmesh/host -> host/, ...): `specmesh.host` (host/), `specmesh.shared` (shared/), `specmesh.tools`
(tools/), and the data a run reads beside them, `specmesh.firmware` and `specmesh.models`.
docs/architecture.md, "Installed: one import name", says why and how.

The Python API is `specmesh.Mesh` (host/cli/session.py), imported on first use so that `import specmesh`
stays cheap: `from specmesh import Mesh; mesh = Mesh(drafter="virtual", verifier="cpu")`; with its results
(`Piece`, `Completion`; `Stream`, what `Mesh.stream` returns) and its errors: `UsageError` (a bad option or
argument, in one line), `BackendError` (a back-end that cannot start: a board that does not answer, a virtual board
folder in use), `GenerationFailed` (a back-end lost beyond fail-over).
`python -m specmesh` is the `specmesh` command.

Run by the `specmesh` console script or `python -m specmesh...` (the command, a tool), this is the first of our code:
its first statement makes a Ctrl-C quiet from here on, while the modules import (host/quiet.py)."""

from specmesh.host import quiet as _quiet

_quiet.quiet_from_the_first_import()

__all__ = ["BackendError", "Completion", "GenerationFailed", "Mesh", "Piece", "Stream", "UsageError"]


def __getattr__(name: str):
    if name in __all__:
        from specmesh.host.cli import session

        return getattr(session, name)
    raise AttributeError("module 'specmesh' has no attribute %r" % name)

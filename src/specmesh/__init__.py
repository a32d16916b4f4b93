"""specmesh, installed: the one import name. Its subpackages are the repository's folders, linked from here
(src/specmesh/host -> host/, ...): `specmesh.host` (host/), `specmesh.shared` (shared/), `specmesh.tools`
(tools/), and the data a run reads beside them, `specmesh.firmware` and `specmesh.models`.
docs/architecture.md, "Installed: one import name", says why and how.

The Python API is `specmesh.Mesh` (host/cli/session.py), imported on first use so that `import specmesh`
stays cheap: `from specmesh import Mesh; mesh = Mesh(drafter="virtual", verifier="cpu")`.
`python -m specmesh` is the `specmesh` command."""

__all__ = ["Completion", "Mesh", "Piece"]


def __getattr__(name: str):
    if name in __all__:
        from specmesh.host.cli import session

        return getattr(session, name)
    raise AttributeError("module 'specmesh' has no attribute %r" % name)

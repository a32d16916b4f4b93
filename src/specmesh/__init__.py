"""specmesh, installed: the one import name. Its subpackages are the repository's folders, linked from here
(src/specmesh/host -> host/, ...): `specmesh.host` (host/), `specmesh.shared` (shared/), `specmesh.tools`
(tools/), and the data a run reads beside them, `specmesh.firmware` and `specmesh.models`.
docs/architecture.md, "Installed: one import name", says why and how."""

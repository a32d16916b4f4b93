"""The back-ends a `specmesh run` offers, by name, one explicit table per role: `cpu` (host/backends), the
boards (`virtual`, `virtual:CLASS`, `pipeline`, serial ports: host/provision/cluster.py; a verifier's list of
ports: host/provision/stageports.py) and the torch
verifiers (host/backends/torch_backend.py). The torch module is imported on first use (PyTorch takes seconds
to import, and `--verifier cpu` never needs it)."""

from __future__ import annotations

from specmesh.host.backends import PIPELINE, PORT, STAGE_PORTS, Factory, LocalDrafter, LocalVerifier, is_port, port_list
from specmesh.host.boardclasses import BOARD_CLASSES
from specmesh.host.provision import cluster, stageports


def _torch(device: str) -> Factory:
    def make(model_path, **options):
        from specmesh.host.backends.torch_backend import make_verifier  # works without torch: it says how to install it

        return make_verifier(model_path, device, **options)

    return make


def _boards(kind: str) -> dict[str, Factory]:
    """A role's board back-ends: its virtual board, one of each class, and a flashed board on a serial port."""
    return {"virtual": cluster.virtual(kind), **{"virtual:" + c: cluster.virtual(kind, c) for c in BOARD_CLASSES},
            PORT: cluster.on_port(kind)}


# a verifier's port may hold a stage board: a pipeline of that one stage (stageports.on_port)
VERIFIERS: dict[str, Factory] = {"cpu": LocalVerifier, **_boards("verifier"), PORT: stageports.on_port,
                                 PIPELINE: cluster.pipeline, STAGE_PORTS: stageports.pipeline, "torch-cpu": _torch("cpu"),
                                 "gpu": _torch("cuda")}
DRAFTERS: dict[str, Factory] = {"cpu": LocalDrafter, **_boards("drafter")}


def factory(kind: str, name: str) -> Factory | None:
    """The factory of `--verifier NAME` (kind "verifier") or `--drafter NAME`, or None (a list of ports with a name
    in it that is no port, or `auto`, which finds one board: preflight's unknown_backend says which)."""
    table = VERIFIERS if kind == "verifier" else DRAFTERS
    ports = port_list(name)
    if ports is not None:
        return table.get(STAGE_PORTS) if all(is_port(p) and p != "auto" for p in ports) else None
    return table.get(PORT if is_port(name) else name)
